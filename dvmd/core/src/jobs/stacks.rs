//! HNP: the stack traces of a job's ranks, on demand (a control call) or when its `--timeout`
//! fires with `--get-stack-traces` (shown on its prun before the kill, so the user sees where
//! it hung). Each daemon hosting the job attaches a debugger to its live ranks and answers;
//! the query ends when every such daemon answered, was lost, or [`STACKS_WAIT_NS`] passed.
//!
//! Never: a query that waits for a daemon that is gone, or a timed-out job that is not killed
//! once its stacks are in (whatever the daemons answered).

use std::collections::BTreeSet;

use dvm_proto::control::{RankStack, StackTracesReply};
use dvm_proto::daemon::{daemon_cmd, StackReq, StackResp};
use dvm_rml::Rank;

use super::hnp::{JobOut, JobTable};
pub(crate) use super::records::{StackFor, StackQuery};
use super::TIMEOUT_EXIT;
use crate::timer::Timer;
use crate::Core;

/// How long a stack-trace query waits for the daemons (ns).
pub const STACKS_WAIT_NS: u64 = 30_000_000_000;

impl JobTable {
    /// A control call for a running job's stacks; Err: no such job.
    pub(crate) fn stack_traces(&mut self, r: &Core, jobid: u32, token: u64) -> Result<(), String> {
        if !self.jobs.contains_key(&jobid) {
            return Err(if self.arrays.contains_key(&jobid) {
                format!("job {jobid} is an array: its elements are jobs of their own (pps lists them)")
            } else if self.queue.iter().any(|w| w.jobid == jobid) {
                format!("job {jobid} is queued: it has no processes yet")
            } else {
                format!("no job {jobid} runs in this DVM")
            });
        }
        self.request_stacks(r, jobid, StackFor::Control(token));
        Ok(())
    }

    /// Ask every live daemon with ranks of `jobid` that have not ended for their stacks.
    pub(crate) fn request_stacks(&mut self, r: &Core, jobid: u32, asked: StackFor) {
        let Some(job) = self.jobs.get(&jobid) else { return };
        let topo = r.topology();
        let waiting: BTreeSet<Rank> = job
            .placement
            .daemons()
            .filter(|&d| topo.is_alive(d) && job.placement.procs_on(d).iter().any(|k| !job.reported.contains(&k)))
            .collect();
        self.next_stack_query += 1;
        let id = self.next_stack_query;
        for &d in &waiting {
            self.out.push(JobOut::Cmd { dst: d, body: daemon_cmd::Body::StackReq(StackReq { id, jobid }) });
        }
        self.stacks.insert(id, StackQuery { jobid, waiting, stacks: Vec::new(), errors: Vec::new(), asked });
        self.out.push(JobOut::Arm(Timer::Stacks(id), STACKS_WAIT_NS));
        self.maybe_finish_stacks(r, id);
    }

    pub(crate) fn on_stack_resp(&mut self, r: &Core, resp: StackResp) {
        let Some(q) = self.stacks.get_mut(&resp.id) else { return };
        if !q.waiting.remove(&resp.daemon) {
            return;
        }
        let node = r.host_of(resp.daemon).to_string();
        if !resp.error.is_empty() {
            q.errors.push(resp.error);
        }
        for t in resp.traces {
            q.stacks.push(RankStack { rank: t.rank, node: node.clone(), pid: t.pid, text: t.text });
        }
        self.maybe_finish_stacks(r, resp.id);
    }

    /// Daemons that did not answer in time are named; the query ends with what came.
    pub(crate) fn on_stacks_timeout(&mut self, r: &Core, id: u64) {
        let Some(q) = self.stacks.get_mut(&id) else { return };
        for d in std::mem::take(&mut q.waiting) {
            let secs = STACKS_WAIT_NS / 1_000_000_000;
            q.errors.push(format!("daemon {d} on node {} gave no stack traces within {secs} s", r.host_of(d)));
        }
        self.maybe_finish_stacks(r, id);
    }

    /// Lost daemons answer no query: named, and not waited for.
    pub(crate) fn stacks_lost(&mut self, r: &Core, failed: &BTreeSet<Rank>) {
        let ids: Vec<u64> = self.stacks.keys().copied().collect();
        for id in ids {
            let q = self.stacks.get_mut(&id).expect("listed");
            for d in failed {
                if q.waiting.remove(d) {
                    q.errors.push(format!("daemon {d} on node {} was lost before it answered", r.host_of(*d)));
                }
            }
            self.maybe_finish_stacks(r, id);
        }
    }

    fn maybe_finish_stacks(&mut self, r: &Core, id: u64) {
        if self.stacks.get(&id).is_none_or(|q| !q.waiting.is_empty()) {
            return;
        }
        let mut q = self.stacks.remove(&id).expect("checked above");
        self.out.push(JobOut::Cancel(Timer::Stacks(id)));
        q.stacks.sort_by_key(|s| s.rank);
        match q.asked {
            StackFor::Control(token) => {
                let reply = StackTracesReply { stacks: q.stacks, errors: q.errors };
                self.out.push(JobOut::Stacks { token, reply: Ok(reply) });
            }
            StackFor::Timeout(why) => {
                for s in q.stacks {
                    let text =
                        format!("stack of rank {} on node {} (pid {}):\n{}", s.rank, s.node, s.pid, s.text.trim_end());
                    self.notice(q.jobid, text);
                }
                for e in q.errors {
                    self.notice(q.jobid, e);
                }
                self.fail_job(r, q.jobid, TIMEOUT_EXIT, why);
            }
        }
    }
}
