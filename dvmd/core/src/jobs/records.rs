//! HNP: what the job table keeps beside its running jobs: submissions waiting for slots,
//! arrays' progress, stack-trace queries, and the records (with kept output) of ended jobs.
//!
//! Never imports the table: the table's parts (`hnp`, `queue`, `stacks`, `tools`) import these,
//! so none of them imports another that imports it back.

use std::collections::{BTreeSet, VecDeque};

use dvm_proto::control::{job_event, JobEvent, JobInfo, JobNotice, RankStack};
use dvm_proto::job::JobSpec;
use dvm_rml::Rank;

use super::ClientId;

/// The output a detached job keeps for a later `--attach` (bytes, oldest dropped first).
pub const KEPT_OUTPUT_BYTES: usize = 1 << 20;

/// A submission waiting for slots.
#[derive(Debug)]
pub(crate) struct Waiting {
    /// The job's id (an array's own id; its elements get theirs when they start).
    pub jobid: u32,
    pub spec: JobSpec,
    pub client: ClientId,
    /// When it was submitted (ns).
    pub since: u64,
    /// An array: the next index to start and the last.
    pub next: Option<(u32, u32)>,
    /// A detached job with a prun attached (as `client`) while it waits.
    pub attached: bool,
}

impl Waiting {
    /// Jobs this entry still stands for.
    pub fn count(&self) -> u64 {
        self.next.map_or(1, |(n, last)| u64::from(last - n) + 1)
    }
}

/// An array's progress, for its prun's summary.
#[derive(Debug, Clone)]
pub(crate) struct ArrayState {
    pub client: ClientId,
    pub total: u64,
    pub ended: u64,
    pub failed: u64,
    /// Elements that never started (cancelled, terminated, no longer fitting).
    pub unrun: u64,
    /// The first element that failed: (index, status, why).
    pub first_failure: Option<(u32, i32, String)>,
    pub spec: JobSpec,
}

/// Who asked.
#[derive(Debug, Clone)]
pub(crate) enum StackFor {
    /// A control call, answered by its token.
    Control(u64),
    /// The job's `--timeout`: shown on its prun, then the job is killed with this sentence.
    Timeout(String),
}

#[derive(Debug)]
pub(crate) struct StackQuery {
    pub jobid: u32,
    pub waiting: BTreeSet<Rank>,
    pub stacks: Vec<RankStack>,
    pub errors: Vec<String>,
    pub asked: StackFor,
}

/// The output and notices of a detached job, oldest first, bounded.
#[derive(Debug, Default, Clone)]
pub struct Kept {
    events: VecDeque<JobEvent>,
    bytes: usize,
    dropped: u64,
}

/// What the bound counts for each kept event besides its bytes (its record).
const EVENT_COST: usize = 64;
/// Consecutive output of one rank and stream is kept as one chunk up to this size.
const MERGE_UP_TO: usize = 64 << 10;

impl Kept {
    fn size(e: &JobEvent) -> usize {
        EVENT_COST
            + match &e.event {
                Some(job_event::Event::Output(o)) => o.data.len(),
                Some(job_event::Event::Notice(n)) => n.text.len(),
                _ => 0,
            }
    }

    /// Keep `e`: output is copied (never a view into a larger read buffer) and joined to the
    /// previous chunk of the same rank and stream while that stays small.
    pub fn push(&mut self, mut e: JobEvent) {
        if let Some(job_event::Event::Output(o)) = e.event.as_mut() {
            if let Some(job_event::Event::Output(last)) = self.events.back_mut().and_then(|l| l.event.as_mut()) {
                if last.rank == o.rank && last.stream == o.stream && last.data.len() + o.data.len() <= MERGE_UP_TO {
                    let mut joined = Vec::with_capacity(last.data.len() + o.data.len());
                    joined.extend_from_slice(&last.data);
                    joined.extend_from_slice(&o.data);
                    last.data = joined.into();
                    self.bytes += o.data.len();
                    return self.trim();
                }
            }
            o.data = bytes::Bytes::copy_from_slice(&o.data);
        }
        self.bytes += Self::size(&e);
        self.events.push_back(e);
        self.trim();
    }

    fn trim(&mut self) {
        while self.bytes > KEPT_OUTPUT_BYTES && self.events.len() > 1 {
            let old = self.events.pop_front().expect("non-empty");
            let n = Self::size(&old);
            self.bytes -= n;
            self.dropped += (n - EVENT_COST) as u64;
        }
    }

    /// What an attaching prun is sent first.
    pub(crate) fn replay(&self) -> Vec<JobEvent> {
        let mut out = Vec::with_capacity(self.events.len() + 1);
        if self.dropped > 0 {
            let text =
                format!("{} bytes of earlier output were dropped (a job keeps {KEPT_OUTPUT_BYTES})", self.dropped);
            out.push(JobEvent { event: Some(job_event::Event::Notice(JobNotice { text })) });
        }
        out.extend(self.events.iter().cloned());
        out
    }
}

/// An ended job, as listed.
#[derive(Debug, Clone)]
pub(crate) struct EndedJob {
    pub info: JobInfo,
    pub kept: Option<Kept>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(rank: u32, n: usize) -> JobEvent {
        let data = bytes::Bytes::from(vec![b'x'; n]);
        JobEvent {
            event: Some(job_event::Event::Output(dvm_proto::control::JobOutput {
                rank,
                stream: 1,
                data,
                jobid: 1,
                read_at_us: 0,
            })),
        }
    }

    #[test]
    fn kept_output_is_bounded_by_bytes_and_records_and_small_chunks_are_joined() {
        let mut k = Kept::default();
        for _ in 0..(4 * KEPT_OUTPUT_BYTES) {
            k.push(out(0, 1));
        }
        assert!(k.bytes <= KEPT_OUTPUT_BYTES);
        assert!(k.events.len() <= KEPT_OUTPUT_BYTES / MERGE_UP_TO + 2, "{} events kept", k.events.len());
        assert_eq!(k.dropped as usize + k.bytes - k.events.len() * EVENT_COST, 4 * KEPT_OUTPUT_BYTES);
        // Two ranks interleaved are not joined, and their order is kept.
        let mut k = Kept::default();
        for i in 0..4 {
            k.push(out(i % 2, 10));
        }
        assert_eq!(k.events.len(), 4);
    }
}
