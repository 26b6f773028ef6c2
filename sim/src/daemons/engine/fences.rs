//! The engine's fence workload: each job's chain of fences on its member daemons, called one
//! step after another, and the job's end once every live member finished its chain.
//!
//! Owns: the `JobStep` events and the fence calls' records in the trace.
//! Never: checks a result (`check.rs` does, from the trace).

use bytes::Bytes;
use dvm_core::{FenceOwner, Input};
use dvm_grpcomm::{FenceRequest, Rank};
use rand::Rng;

use super::{CoreEngine, Kind, State};
use crate::daemons::trace::FenceCall;

fn key_of(job: usize, step: usize) -> u64 {
    ((job as u64) << 32) | step as u64
}

impl CoreEngine<'_> {
    pub(super) fn job_step(&mut self, job: usize, daemon: Rank, step: usize) {
        match self.nodes[daemon as usize].state {
            State::Dead { .. } => return,
            State::Stopped => {
                self.nodes[daemon as usize].deferred.push(Kind::JobStep { job, daemon, step });
                return;
            }
            State::Running => {}
        }
        let plan = &self.sc.jobs[job];
        let data = plan.contribution(job, step, daemon);
        let req = FenceRequest {
            sig: plan.sig.clone(),
            collect: plan.steps[step],
            data: data.clone(),
            timeout: None,
            size_hint: None,
        };
        let key = key_of(job, step);
        self.pending.insert((daemon, key), self.trace.fence_calls.len());
        self.trace.fence_calls.push(FenceCall { daemon, job, step, data, at: self.q.now(), done: None });
        self.q.note(|| format!("d{daemon} FENCE job {job} step {step}"));
        self.drive(daemon, Input::Fence { owner: FenceOwner::Driver(key), req });
    }

    pub(super) fn fence_done(&mut self, daemon: Rank, key: u64, result: Result<Bytes, dvm_grpcomm::FenceError>) {
        let Some(idx) = self.pending.remove(&(daemon, key)) else {
            self.trace.engine_errors.push(format!("daemon {daemon}: FenceDone for key {key:#x} with no fence pending"));
            return;
        };
        let ok = result.is_ok();
        let call = &mut self.trace.fence_calls[idx];
        call.done = Some((self.q.now(), result));
        let (job, next) = (call.job, call.step + 1);
        if ok && next < self.sc.jobs[job].steps.len() {
            let think = self.rng.gen_range(0..=self.sc.think_ns);
            self.q.push(self.q.now() + think, Kind::JobStep { job, daemon, step: next });
        } else {
            self.job_finished[job].insert(daemon);
            self.maybe_end_jobs();
        }
    }

    /// A job ends once every member still alive finished its chain: the HNP announces it and
    /// every daemon forgets the job's signature.
    pub(super) fn maybe_end_jobs(&mut self) {
        if !self.running(0) {
            return;
        }
        for j in 0..self.sc.jobs.len() {
            if self.job_ended[j] {
                continue;
            }
            let done = self.sc.jobs[j].members.iter().all(|&m| {
                self.job_finished[j].contains(&m)
                    || matches!(self.nodes[m as usize].state, State::Dead { .. })
                    || !self.nodes[0].node.router().topology().is_alive(m)
            });
            if done {
                self.job_ended[j] = true;
                self.q.push(self.q.now(), Kind::JobEnd { job: j });
            }
        }
    }
}
