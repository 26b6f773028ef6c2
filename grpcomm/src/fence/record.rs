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
    /// Most recent retired fences (bounded), with their results while held: a success's data
    /// is let go (`None`) once a later fence over the signature succeeds.
    pub(super) recent: VecDeque<(u64, Option<FenceResult>)>,
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
        self.recent.iter().any(|(s, _)| *s == seq)
            || self.last_ok.as_ref().is_some_and(|(s, _)| *s == seq)
            || self.early_errors.contains_key(&seq)
            || (participant && seq < self.started && !self.trackers.contains_key(&seq))
    }

    pub(super) fn result_of(&self, seq: u64) -> Option<FenceResult> {
        match self.recent.iter().find(|(s, _)| *s == seq) {
            Some((_, r)) => r.clone(),
            None => self.last_ok.as_ref().filter(|(s, _)| *s == seq).map(|(_, d)| Ok(d.clone())),
        }
    }

    /// Record a retired fence. A success lets go of the data of every earlier success: fence
    /// `seq` succeeded only once every participant's daemon contributed to it, and a daemon
    /// contributes only when all its procs entered it, so after they had left every earlier
    /// fence over the signature: no daemon can still be waiting for an earlier result. (Kept,
    /// six 8..48 MiB results of one job held 168 MiB in every daemon until the job ended.)
    pub(super) fn remember(&mut self, seq: u64, result: FenceResult) {
        if let Ok(data) = &result {
            self.last_ok = Some((seq, data.clone()));
            for (s, r) in self.recent.iter_mut() {
                if *s < seq && matches!(r, Some(Ok(_))) {
                    *r = None;
                }
            }
        }
        if self.recent.len() == RECENT_PER_SIGNATURE {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, Some(result)));
    }

    /// Bytes of the results still held.
    pub(super) fn held_bytes(&self) -> usize {
        self.held_results().iter().map(|(_, r)| r.as_ref().map_or(0, Bytes::len)).sum()
    }

    /// Every result still held, for pushing to new neighbours after a repair.
    pub(super) fn held_results(&self) -> Vec<(u64, FenceResult)> {
        let mut out: Vec<(u64, FenceResult)> =
            self.recent.iter().filter_map(|(s, r)| r.clone().map(|r| (*s, r))).collect();
        if let Some((seq, data)) = &self.last_ok {
            if !out.iter().any(|(s, _)| s == seq) {
                out.push((*seq, Ok(data.clone())));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_lets_go_of_earlier_successes_but_they_stay_retired() {
        let mut rec = SigRecord::default();
        let (a, b) = (Bytes::from_static(b"first"), Bytes::from_static(b"second"));
        rec.remember(0, Ok(a.clone()));
        rec.remember(1, Err(FenceError::Abandoned { daemon: 3 }));
        assert_eq!(rec.result_of(0), Some(Ok(a)), "held until a later success");
        assert_eq!(rec.held_bytes(), 5);
        rec.remember(2, Ok(b.clone()));
        assert_eq!(rec.result_of(0), None, "let go");
        assert!(rec.is_retired(0, false), "still known as done, so a late contribution starts nothing");
        assert_eq!(rec.result_of(1), Some(Err(FenceError::Abandoned { daemon: 3 })), "errors carry no data and stay");
        assert_eq!(rec.held_results(), vec![(1, Err(FenceError::Abandoned { daemon: 3 })), (2, Ok(b))]);
        assert_eq!(rec.held_bytes(), 6);
    }
}
