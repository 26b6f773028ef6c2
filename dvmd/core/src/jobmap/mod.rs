//! Mapping a job onto the DVM's nodes, and the compact launch message.
//!
//! Owns: the mapping and ranking policies (`--map-by`, `--rank-by`, `-N`, rankfiles,
//! `--host` subsets, MPMD apps), the placement they produce, its wire form (`JobMap`, broadcast
//! to every daemon, plus one `Residual` per hosting daemon, scattered) and the decoding every
//! daemon runs to find its procs.
//! Never: I/O, clocks or tokio. Pure functions of their inputs, so every daemon derives the
//! same placement from the same bytes.
//! Invariants: a regular [`Placement`] is O(nodes) — ranges of daemons plus a layout (uniform
//! block, per-node block counts, or round-robin); only an order none of those can say
//! (`--rank-by OBJ:span`, rank-by node over uneven nodes, an interleaving rankfile) carries a
//! node per rank. Every node in a placement hosts at least one proc; ranks of an app are
//! contiguous; local rank = node rank = index among the procs on that node in rank order.
//! Traps: `JobMap` and `Residual` come from the network. [`Placement::from_job_map`] and
//! [`local_procs`] validate them (no panic, no allocation sized by an unchecked count); the
//! mapper's [`Placement`] goes through the same validation, so the HNP and the daemons agree.

pub mod bind;
mod mapper;
mod placement;
mod rankfile;
pub mod topo;
mod wire;

pub use bind::{place_node, rank_rounds, Bind, BindError, Placed, Plan};
pub use mapper::{map_job, plan_of};
pub use placement::{Layout, NodeSlots, Placement, ProcInfo, Ranks};
pub use rankfile::rankfile_cpus;
pub use topo::{Level, NodeTopo};
pub use wire::{encode, launch_sizes, local_procs, LaunchSizes, LocalProc, MAX_LOCAL_PROCS};

/// Why a job cannot be mapped. Each message is one sentence naming the value that was wrong;
/// it goes back to `prun` as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("cannot map the job: it has no apps")]
    NoApps,
    #[error("cannot map the job: unknown --map-by policy value {0}")]
    UnknownPolicy(i32),
    #[error("cannot map the job: ppr 0 per node asks for no processes; use ppr:N:node with N >= 1")]
    ZeroPpr,
    #[error("cannot map the job: unknown host '{host}' (the DVM's hosts are {known})")]
    UnknownHost { host: String, known: String },
    #[error("cannot map the job: daemon {daemon} (host {host}) is listed twice among the DVM's nodes")]
    DuplicateDaemon { daemon: u32, host: String },
    #[error("cannot map {}: no slots on {hosts}", np_text(*np))]
    NoSlots { np: u64, hosts: String },
    #[error("cannot map {np} processes: ranks are 32-bit, at most {} processes per job", u32::MAX)]
    TooManyProcs { np: u64 },
    #[error(
        "cannot map {np} processes: only {} on {} (hosts {hosts}); add :oversubscribe to --map-by or use fewer processes",
        plural(*slots, "slot"),
        plural(*nodes, "node")
    )]
    NotEnoughSlots { np: u64, slots: u64, nodes: u64, hosts: String },
    #[error(
        "cannot map {np} processes {policy}: host {host} (daemon {daemon}) would get {procs} but has only {}; add :oversubscribe to --map-by or use fewer processes",
        plural(*slots, "slot")
    )]
    NodeOverfull { np: u64, policy: String, host: String, daemon: u32, procs: u32, slots: u32 },
    #[error("cannot map {np} processes with ppr:{ppr}:{obj}: {} hold at most {cap}", plural(*nodes, "node"))]
    PprExceeded { np: u64, ppr: u32, obj: String, nodes: u64, cap: u64 },
    #[error("cannot map the job: {pe} cpus per rank, but no node has that many slots (the most is {most})")]
    PeExceedsSlots { pe: u32, most: u32 },
    #[error("cannot map the job with {what}: host {host} (daemon {daemon}) did not report its hardware")]
    NoHardware { host: String, daemon: u32, what: String },
    #[error("{0}")]
    Bind(#[from] BindError),
    #[error("cannot map the job: rankfile {file}{}: {why}", if *.line > 0 { format!(":{line}") } else { String::new() })]
    Rankfile { file: String, line: u32, why: String },
}

/// Why a daemon cannot launch its part of a job from what it received. These come from the
/// network: each names the daemon, the job, and the rank or value that was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error("job {job}: invalid job map: {reason}")]
    BadMap { job: u32, reason: String },
    #[error("daemon {daemon}: residual is for job {residual_job} but the job map is for job {job}")]
    WrongJob { daemon: u32, job: u32, residual_job: u32 },
    #[error("daemon {daemon}: job {job} places {procs} procs on this daemon, more than the {max} a daemon can fork")]
    TooManyLocal { daemon: u32, job: u32, procs: u32, max: u32 },
    #[error("daemon {daemon}: residual of job {job} is malformed: {reason}")]
    BadResidual { daemon: u32, job: u32, reason: String },
    #[error("daemon {daemon}: residual of job {job} lists rank {rank}, which the job map {placed}")]
    ForeignRank { daemon: u32, job: u32, rank: u32, placed: String },
    #[error("daemon {daemon}: residual of job {job} omits rank {rank}, which the job map places on this daemon")]
    MissingRank { daemon: u32, job: u32, rank: u32 },
}

fn plural(n: impl Into<u64>, what: &str) -> String {
    let n = n.into();
    match n {
        1 => format!("1 {what}"),
        _ if what.ends_with('s') => format!("{n} {what}es"),
        _ => format!("{n} {what}s"),
    }
}

fn np_text(np: u64) -> String {
    if np == 0 {
        "np 0 (fill the slots)".into()
    } else {
        plural(np, "process")
    }
}

#[cfg(test)]
mod bind_tests;
