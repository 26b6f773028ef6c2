//! HNP: the PMIx events the DVM raises about its jobs, and `prun --enable-recovery`
//! (docs/dynamic-mpi.md, "Events").
//!
//! - A rank that dies abnormally (non-zero exit, a signal, an exit without finalizing) or
//!   calls PMIx_Abort (MPI_Abort): `PMIX_ERR_PROC_ABORTED` from that rank, with its exit code
//!   and the sentence prun shows, to every rank of its job and of the jobs joined to it
//!   (connected, spawning or spawned, transitively: [`JobTable::related_jobs`]).
//! - A daemon lost: `PMIX_ERR_LOST_CONNECTION` and `PMIX_EVENT_NODE_DOWN` from the daemon
//!   (namespace `dvm-<dvm>`, its rank), with the node's name and every rank lost there, to the
//!   jobs that had ranks there and the jobs joined to them.
//!
//! Each event is one xcast, queued before anything of the failure is acted on: its order with
//! the job's kill (the next xcast) is the same on every daemon. Then a job started with
//! `--enable-recovery` goes on (one sentence on its prun; it exits with the status of the
//! first of its ranks that failed once the others are done), as does a recovering job joined
//! to a failed one; any other job fails and is killed.
//!
//! PMIx_Abort: the upcall is answered first (by the rank's daemon) and the event raised at
//! once; the job is killed once the aborting rank has exited, or after the abort grace if it
//! does not exit by itself (a plain PMIx client returns from PMIx_Abort and may go on).
//! An abort ends the job even with `--enable-recovery`.
//!
//! Never: an event for a job already being killed, or one per rank killed by the DVM itself.

use std::collections::BTreeSet;

use dvm_proto::daemon::JobAbort;
use dvm_proto::pmixworker as wire;
use dvm_rml::Rank;
use tracing::info;

use super::hnp::{JobOut, JobTable};
use super::{nspace_of, ABORT_GRACE_NS};
use crate::pmix::info::{i32_value, proc, proc_value, procs, string};
use crate::pmixdef;
use crate::timer::Timer;
use crate::{dtags, Core};

/// `origin` of an event the DVM raised (no client's server delivered it yet).
pub use crate::pmix::FROM_DVM;

impl JobTable {
    /// `jobid` and every running job joined to it by a connect or a spawn, transitively.
    pub(crate) fn related_jobs(&self, jobid: u32) -> BTreeSet<u32> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![jobid];
        while let Some(j) = todo.pop() {
            let Some(job) = self.jobs.get(&j) else { continue };
            if !seen.insert(j) {
                continue;
            }
            todo.extend(job.parent);
            todo.extend(job.children.iter().copied());
            todo.extend(self.peers.get(&j).into_iter().flatten().copied());
        }
        seen
    }

    /// One event for every rank of `jobs`, from `source`.
    fn raise_event(&mut self, r: &Core, status: i32, source: wire::Proc, jobs: &BTreeSet<u32>, info: Vec<wire::Value>) {
        let dvm = r.dvm_id();
        let targets = jobs.iter().map(|&j| proc(nspace_of(&dvm, j), pmixdef::RANK_WILDCARD)).collect();
        info!(status, source = %format!("{}:{}", source.nspace, source.rank), ?jobs, "PMIx event raised by the DVM");
        let event = wire::Notify { status, source: Some(source), range: pmixdef::RANGE_CUSTOM, info };
        let payload = crate::pmix::event_payload(FROM_DVM, event, targets);
        self.out.push(JobOut::Xcast { tag: dtags::PMIX_EVENT, payload });
    }

    /// Rank `rank` of `jobid` aborted or died (`why`, the sentence prun shows): its job and
    /// the jobs joined to it are told.
    pub(crate) fn proc_aborted_event(&mut self, r: &Core, jobid: u32, rank: u32, code: i32, why: &str) {
        let source = proc(nspace_of(&r.dvm_id(), jobid), rank);
        let info = vec![
            proc_value(pmixdef::KEY_EVENT_AFFECTED_PROC, source.clone()),
            i32_value(pmixdef::KEY_EXIT_CODE, code),
            string(pmixdef::KEY_EVENT_TEXT_MESSAGE, why),
        ];
        let jobs = self.related_jobs(jobid);
        self.raise_event(r, pmixdef::ERR_PROC_ABORTED, source, &jobs, info);
    }

    /// Daemon `daemon` was lost with `lost` (job, ranks) on it: every job that had ranks
    /// there, and every job joined to one, is told.
    pub(crate) fn daemon_lost_events(&mut self, r: &Core, daemon: Rank, lost: &[(u32, Vec<u32>)]) {
        let host = r.host_of(daemon);
        let dvm = r.dvm_id();
        let mut jobs = BTreeSet::new();
        let mut affected = Vec::new();
        for (jobid, ranks) in lost {
            jobs.extend(self.related_jobs(*jobid));
            let ns = nspace_of(&dvm, *jobid);
            affected.extend(ranks.iter().map(|&rk| proc(ns.clone(), rk)));
        }
        let source = proc(format!("dvm-{dvm}"), daemon);
        let info = vec![
            string(pmixdef::KEY_HOSTNAME, host.clone()),
            procs(pmixdef::KEY_EVENT_AFFECTED_PROCS, affected),
            string(pmixdef::KEY_EVENT_TEXT_MESSAGE, format!("daemon {daemon} on node {host} was lost")),
        ];
        self.raise_event(r, pmixdef::ERR_LOST_CONNECTION, source.clone(), &jobs, info.clone());
        self.raise_event(r, pmixdef::EVENT_NODE_DOWN, source, &jobs, info);
    }

    /// Whether `jobid` goes on when its ranks or a joined job fail (`--enable-recovery`).
    pub(crate) fn recovers(&self, jobid: u32) -> bool {
        self.jobs.get(&jobid).is_some_and(|j| j.recovery)
    }

    /// A failure of its own ranks `jobid` survives under `--enable-recovery`: its prun is
    /// told; the first one is the job's exit status when it ends.
    pub(crate) fn survive(&mut self, jobid: u32, code: i32, why: String) {
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        if job.survived.is_none() {
            job.survived = Some((code, why.clone()));
        }
        self.notice(jobid, format!("{why}; job {jobid} goes on (--enable-recovery)"));
    }

    /// A job joined to `jobid` failed and `jobid` goes on (`--enable-recovery`): its prun is
    /// told; its exit status stays its own ranks'.
    pub(crate) fn survive_joined(&mut self, jobid: u32, why: String) {
        self.notice(jobid, format!("{why}; job {jobid} goes on (--enable-recovery)"));
    }

    /// A rank called PMIx_Abort (its upcall is answered): tell the jobs concerned now; the job
    /// ends when the rank has exited, or after the abort grace.
    pub(crate) fn on_job_abort(&mut self, r: &Core, a: JobAbort) {
        let host = r.host_of(a.daemon);
        let Some(job) = self.jobs.get_mut(&a.jobid) else { return };
        job.aborts.insert(a.rank, (a.code, host.clone()));
        if job.failing() || job.reported.contains(&a.rank) {
            return;
        }
        let why = format!("rank {} on node {host} called MPI_Abort with code {}", a.rank, a.code);
        self.proc_aborted_event(r, a.jobid, a.rank, a.code, &why);
        if a.kill {
            // A PMI client waits in its abort until it is killed: the job ends now.
            return self.fail_job(r, a.jobid, a.code, why);
        }
        self.out.push(JobOut::Arm(Timer::AbortGrace { jobid: a.jobid, rank: a.rank }, ABORT_GRACE_NS));
    }

    /// The grace of an aborting rank passed: if it still runs, its job is ended now (the rank
    /// with it).
    pub(crate) fn on_abort_grace(&mut self, r: &Core, jobid: u32, rank: u32) {
        let Some(job) = self.jobs.get(&jobid) else { return };
        if job.failing() || job.reported.contains(&rank) {
            return;
        }
        let Some((code, node)) = job.aborts.get(&rank).cloned() else { return };
        let grace = std::time::Duration::from_nanos(ABORT_GRACE_NS);
        let why =
            format!("rank {rank} on node {node} called MPI_Abort with code {code} and did not exit within {grace:?}");
        self.fail_job(r, jobid, code, why);
    }
}
