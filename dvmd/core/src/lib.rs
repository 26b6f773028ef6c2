//! dvm-core: everything a daemon decides, as a sans-IO state machine.
//!
//! **Where things are.** [`Node`] is the whole daemon: every input enters by one of its
//! `handle_*` methods (each with `now`, ns, monotonic), and everything it decides leaves by
//! [`Node::poll_transmit`], [`Node::poll`] and [`Node::poll_timeout`], which the shell
//! (`dvmd::daemon`) drains in one place, in order. Inside, one struct per concern:
//!
//! | input | entry | decided in | leaves as |
//! |---|---|---|---|
//! | a frame, a lost link | `handle_frame`, `handle_link` | `router` ([`Core`]), grpcomm | `Transmit` |
//! | a control call (prun, pterm, dvm-bench) | `handle_control` | `node::control`, [`jobs::hnp`] | `Effect::Reply`, `Effect::ToClient` |
//! | a proc started, wrote, ended | `handle_proc` | [`jobs::local`] | a command to the HNP |
//! | the HNP hears of a proc, a spawn, a lookup | (a frame) | [`jobs::hnp`] and its spawn and recovery parts | `Effect::ToClient`, broadcasts |
//! | maps and residuals | (a frame) | [`jobs::local`] | `Effect::Proc(Spawn)`, PMIx calls by [`Host`] |
//! | bytes on a rank's PMI fd | `handle_proc` | [`pmi`] (PMI-1/PMI-2: puts, gets, barriers as fences, abort) | `ProcCmd::PmiWrite`, fences, commands |
//! | a PMIx upcall, the worker lost | `handle_pmix`, `handle_pmix_lost` | [`pmix`] (namespaces, fences, direct modex, deferral, groups, events, recycling) | `Effect::Pmix` (a reply by id, replace or end the worker), fences, commands |
//! | a prun stream took output, went away, closed | `handle_prun` | [`jobs::hnp`], `node::control` | credit (`IofAck`) |
//! | a boot process ended | `handle_boot` | `node::control` | `Effect::Exit` |
//! | time | `handle_timeout` | [`timer`] table, grpcomm deadlines | whatever the timer's owner decides |
//!
//! Never: a socket, a clock, a thread, a process or a channel. The PMIx server the daemon
//! hosts is called through [`Host`] (synchronously, in the order the core needs).
//!
//! Invariants: see each module; the router's are the DVM's (a frame from a failed daemon or a
//! stale incarnation changes nothing; the HNP decides every loss).

pub mod dataserver;
pub mod harness;
pub mod host;
pub mod jobmap;
pub mod jobs;
pub mod node;
pub mod pmi;
pub mod pmix;
pub mod pmixdef;
pub mod pmixops;
mod router;
pub mod stage;
pub mod timer;

pub use host::{Host, JobStart, LoopStats, Namespace};
pub use node::Node;
pub use router::{bench, dtags, probe, Core, CoreConfig, Effect, Exit, FenceOwner, Input, XcastOwner};
pub use router::{Rank, Route, Topology};
