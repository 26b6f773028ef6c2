//! The one in-memory network of `Grpcomm` daemons that grpcomm's tests and the simulator's
//! grpcomm engine both run on.
//!
//! Owns: N daemons and the carrier rules a daemon applies around its grpcomm machine
//! (`dvm_core` in `dvmd`): a `Via::Tree` send is routed hop by hop, each hop with its own
//! `Topology::route_to`; a `Via::Direct` send takes one lateral link straight to its
//! destination; an answer to a frame that came straight from its origin goes back on that
//! link (a neighbour that repaired before us is not on our route yet); a frame whose last hop
//! or origin the receiver holds failed is dropped as stale; grpcomm sees the *origin* of a
//! frame, never the relay that handed it on. Also checks the driver's rules on process-first
//! tags (a daemon forwards such an op only once its driver confirmed it, and delivers nothing
//! while one awaits confirmation).
//!
//! Two halves: [`Net`] decides what leaves a daemon and where it goes, and reports it as
//! [`Event`]s; *when* a frame arrives is the carrier's choice. [`Links`] is the carrier of the
//! unit and property tests (FIFO per link, a seeded choice of which link moves next); the
//! simulator's timed carrier (α-β links, serialized NICs, jitter) is the other.
//!
//! Never: a clock, a thread, a `HashMap`. Everything here is deterministic given the order
//! of calls (and, for [`Links`], the seed).

mod describe;
mod links;
mod net;

pub use describe::{describe, kind};
pub use links::{members, Links, Outcome, XorShift};
pub use net::{Event, Frame, Net, NetStats};
