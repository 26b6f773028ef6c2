//! Per-signature bookkeeping: the local start counter, the trackers in flight, early errors,
//! the bounded memory of retired results, and what `auto` prices the next fence with.
//!
//! Never sends or emits anything (that is `rollup.rs`). Do not break: the last success per
//! signature is kept until the next one, whatever failures come after it (a participant that
//! missed its release is answered from here).

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use super::run::Run;
use super::start;
use super::tracker::FenceTracker;
use super::types::{FenceError, FenceResult};

/// Results kept per signature after retirement, to answer contributions re-sent after a repair
/// (plus the last success, which later failures cannot push out).
const RECENT_PER_SIGNATURE: usize = 8;

/// Everything this daemon holds about one signature.
#[derive(Debug, Default)]
pub(super) struct SigRecord {
    /// Local starts so far: the next local start is fence `started`.
    pub(super) started: u64,
    pub(super) trackers: BTreeMap<u64, FenceTracker>,
    /// Error releases of fences this daemon participates in but has not started yet.
    pub(super) early_errors: BTreeMap<u64, FenceError>,
    /// Most recent retired results (bounded).
    pub(super) recent: VecDeque<(u64, FenceResult)>,
    /// The last fence that succeeded. A participant still waiting for it holds up every later
    /// fence over the signature, so those can only fail; this must outlive their errors.
    pub(super) last_ok: Option<(u64, Bytes)>,
    /// The last allgather this daemon finished, kept until the next one finishes: a partner
    /// whose lateral link was lost may still wait for blocks sent just before the end (it is
    /// at most one fence behind, since this daemon cannot finish the next without it).
    pub(super) finished: Option<(u64, Run)>,
    /// (seq, bytes) of the last collecting fence that succeeded here: what `auto` prices the
    /// next collecting fence with. Identical on every participant once that fence is retired
    /// everywhere, which is why a priced fence waits in `deferred` until then.
    pub(super) released: Option<(u64, u64)>,
    /// Collecting fences started locally under a byte-pricing mode while an earlier
    /// collecting fence over the signature was still in flight here: their movement is chosen
    /// once it retires. Each has a tracker (own slot waiting), so what comes early is held.
    pub(super) deferred: BTreeMap<u64, start::Deferred>,
}

impl SigRecord {
    pub(super) fn is_retired(&self, seq: u64, participant: bool) -> bool {
        self.result_of(seq).is_some()
            || self.early_errors.contains_key(&seq)
            || (participant && seq < self.started && !self.trackers.contains_key(&seq))
    }

    pub(super) fn result_of(&self, seq: u64) -> Option<FenceResult> {
        match self.recent.iter().find(|(s, _)| *s == seq) {
            Some((_, r)) => Some(r.clone()),
            None => self.last_ok.as_ref().filter(|(s, _)| *s == seq).map(|(_, d)| Ok(d.clone())),
        }
    }

    pub(super) fn remember(&mut self, seq: u64, result: FenceResult) {
        if let Ok(data) = &result {
            self.last_ok = Some((seq, data.clone()));
        }
        if self.recent.len() == RECENT_PER_SIGNATURE {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, result));
    }

    /// Every result still held, for pushing to new neighbours after a repair.
    pub(super) fn held_results(&self) -> Vec<(u64, FenceResult)> {
        let mut out: Vec<(u64, FenceResult)> = self.recent.iter().cloned().collect();
        if let Some((seq, data)) = &self.last_ok {
            if !out.iter().any(|(s, _)| s == seq) {
                out.push((*seq, Ok(data.clone())));
            }
        }
        out
    }
}
