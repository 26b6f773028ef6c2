//! What a run observed, recorded by the engine and judged by `check`.

use std::collections::BTreeMap;

use bytes::Bytes;
use dvm_grpcomm::{FenceError, FenceId, Rank, XcastId};

#[derive(Debug, Clone)]
pub struct Delivery {
    pub op_id: u64,
    pub origin: Rank,
    pub tag: u32,
    pub payload: Bytes,
    pub at: u64,
}

#[derive(Debug, Clone)]
pub struct XcastStart {
    pub daemon: Rank,
    pub id: XcastId,
    pub tag: u32,
    pub payload: Bytes,
    pub at: u64,
}

#[derive(Debug, Clone)]
pub struct FenceCall {
    pub daemon: Rank,
    pub chain: usize,
    pub step: usize,
    pub id: FenceId,
    pub collect: bool,
    pub data: Bytes,
    pub at: u64,
    /// `(time, result)` once the fence completed on this daemon.
    pub done: Option<(u64, Result<Bytes, FenceError>)>,
}

#[derive(Debug, Clone)]
pub struct ScatterStart {
    pub daemon: Rank,
    pub scatter_id: u64,
    pub tag: u32,
    pub slices: Vec<(Rank, Bytes)>,
    pub at: u64,
}

#[derive(Debug, Clone)]
pub struct ScatterGot {
    pub daemon: Rank,
    pub origin: Rank,
    pub scatter_id: u64,
    pub tag: u32,
    pub data: Bytes,
    pub at: u64,
}

/// Counters of the carrier.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Hop-level transmissions (a relayed message counts once per hop).
    pub messages: u64,
    pub bytes: u64,
    /// Sends over lateral links (each one hop, counted in `messages` as well).
    pub direct: u64,
    pub events: u64,
    /// Sends refused because the next hop had crashed.
    pub refused: u64,
    /// Sends with no route (destination already known failed by the sender or a relay).
    pub unroutable: u64,
    /// Messages that exceeded the hop limit (routing loop during a repair).
    pub looped: u64,
    /// Frames a receiver dropped because it holds their last hop or origin failed.
    pub stale: u64,
    /// Largest `state_bytes()` seen on any daemon.
    pub peak_state_bytes: usize,
}

/// Everything observed in one run.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// `(rank, time)` of every crash, in order.
    pub crashes: Vec<(Rank, u64)>,
    /// Failed set of each repair epoch, in the order every daemon applies them.
    pub epochs: Vec<(u64, std::collections::BTreeSet<Rank>)>,
    /// `(daemon, epoch) -> time` each survivor applied a repair.
    pub repairs_applied: BTreeMap<(Rank, usize), u64>,
    /// Per daemon, in order.
    pub deliveries: Vec<Vec<Delivery>>,
    pub xcast_starts: Vec<XcastStart>,
    /// `(daemon, id, op_id, time)`.
    pub xcast_completes: Vec<(Rank, XcastId, u64, u64)>,
    pub fence_calls: Vec<FenceCall>,
    pub scatter_starts: Vec<ScatterStart>,
    pub scatter_got: Vec<ScatterGot>,
    /// `(daemon, from, reason)` of every `Effect::Dropped`.
    pub dropped: Vec<(Rank, Rank, String)>,
    /// Problems the engine itself saw (a panic, a failed repair, a stray completion).
    pub engine_errors: Vec<String>,
    pub stats: Stats,
    /// Virtual time when the run stopped.
    pub end_ns: u64,
    /// Per daemon at the end: alive, quiescent, next xcast op to deliver.
    pub final_alive: Vec<bool>,
    pub final_quiescent: Vec<bool>,
    pub final_next_op: Vec<u64>,
    /// Next op id each daemon expected at the start.
    pub initial_next_op: Vec<u64>,
}

impl Trace {
    pub fn crash_time(&self, r: Rank) -> Option<u64> {
        self.crashes.iter().find(|c| c.0 == r).map(|c| c.1)
    }
}
