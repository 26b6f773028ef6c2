//! HNP: the PMIx events the DVM raises about its jobs, and `prun --enable-recovery`
//! (docs/dynamic-mpi.md, "Events").
//!
//! - A rank that dies abnormally (non-zero exit, a signal, an exit without finalizing) or
//!   calls PMIx_Abort (MPI_Abort): `PMIX_ERR_PROC_ABORTED` from that rank, with its exit code
//!   and the sentence prun shows, to every rank of its job and of the jobs joined to it
//!   (connected, spawning or spawned, transitively: `Daemon::related_jobs`).
//! - A daemon lost: `PMIX_ERR_LOST_CONNECTION` and `PMIX_EVENT_NODE_DOWN` from the daemon
//!   (namespace `dvm-<dvm>`, its rank), with the node's name and every rank lost there
//!   (`PMIX_EVENT_AFFECTED_PROCS`), to the jobs that had ranks there and the jobs joined to
//!   them.
//!
//! Each event is one xcast, started before anything of the failure is acted on: its order
//! with the job's kill (the next xcast) is the same on every daemon. Then a job started with
//! `--enable-recovery` goes on (one sentence on its prun; it exits with the status of the
//! first of its ranks that failed once the others are done), as does a recovering job joined
//! to a failed one (its status stays its own ranks'); any other job fails and is killed as
//! before.
//!
//! PMIx_Abort: the upcall is answered first and the event raised at once; the job is killed
//! once the aborting rank has exited (the order that keeps libpmix healthy), or after
//! [`ABORT_GRACE`] if it does not exit by itself: a plain PMIx client returns from PMIx_Abort
//! and may go on running, and the host, not the client, must end it (waiting for its exit hung
//! such a job for ever). An abort ends the job even with `--enable-recovery`.
//!
//! Never: an event for a job already being killed (its ranks are ending anyway), or one per
//! rank killed by the DVM itself.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use dvm_core::{dtags, Input as CoreInput};
use dvm_proto::daemon::JobAbort;
use dvm_rml::Rank;
use pmix_shim::{key_str, sys, Info, InfoValue, ProcId, Rank as PRank};
use tracing::info;

use crate::daemon::{Daemon, Input};

/// How long a rank that called PMIx_Abort has to exit by itself before its job is killed.
pub const ABORT_GRACE: Duration = Duration::from_secs(2);

impl Daemon {
    /// `jobid` and every running job joined to it by a connect or a spawn, transitively.
    pub(crate) fn related_jobs(&self, jobid: u32) -> BTreeSet<u32> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![jobid];
        while let Some(j) = todo.pop() {
            let Some(job) = self.jobs.hnp.get(&j) else { continue };
            if !seen.insert(j) {
                continue;
            }
            todo.extend(job.parent);
            todo.extend(job.children.iter().copied());
            todo.extend(self.jobs.peers.get(&j).into_iter().flatten().copied());
        }
        seen
    }

    fn job_nspace(&self, jobid: u32) -> String {
        crate::pmix::nspace_of(&self.dvm_id(), jobid)
    }

    /// One event for every rank of `jobs`, from `source`.
    fn raise_event(&mut self, status: pmix_shim::Status, source: &ProcId, jobs: &BTreeSet<u32>, info: &[Info]) {
        let targets: Vec<ProcId> = jobs.iter().map(|&j| ProcId::new(self.job_nspace(j), PRank::Wildcard)).collect();
        info!(status, %source, ?jobs, "PMIx event raised by the DVM");
        let payload: Bytes =
            crate::pmix::event_payload(crate::pmix::FROM_DVM, status, source, sys::PMIX_RANGE_CUSTOM, &targets, info);
        self.submit(CoreInput::Xcast { tag: dtags::PMIX_EVENT, payload });
    }

    /// Rank `rank` of `jobid` aborted or died (`why`, the sentence prun shows): its job and
    /// the jobs joined to it are told.
    pub(crate) fn proc_aborted_event(&mut self, jobid: u32, rank: u32, code: i32, why: &str) {
        let source = ProcId::new(self.job_nspace(jobid), PRank::Id(rank));
        let info = [
            Info::new(key_str(sys::PMIX_EVENT_AFFECTED_PROC), InfoValue::Proc(source.clone())),
            Info::new(key_str(sys::PMIX_EXIT_CODE), InfoValue::I32(code)),
            Info::new(key_str(sys::PMIX_EVENT_TEXT_MESSAGE), InfoValue::String(why.to_string())),
        ];
        let jobs = self.related_jobs(jobid);
        self.raise_event(pmix_shim::ERR_PROC_ABORTED, &source, &jobs, &info);
    }

    /// Daemon `daemon` was lost with `lost` (job, ranks) on it: every job that had ranks
    /// there, and every job joined to one, is told.
    pub(crate) fn daemon_lost_events(&mut self, daemon: Rank, lost: &[(u32, Vec<u32>)]) {
        let host = self.host_of(daemon);
        let mut jobs = BTreeSet::new();
        let mut affected = Vec::new();
        for (jobid, ranks) in lost {
            jobs.extend(self.related_jobs(*jobid));
            let ns = self.job_nspace(*jobid);
            affected.extend(ranks.iter().map(|&r| ProcId::new(ns.clone(), PRank::Id(r))));
        }
        let source = ProcId::new(format!("dvm-{}", self.dvm_id()), PRank::Id(daemon));
        let info = [
            Info::new(key_str(sys::PMIX_HOSTNAME), InfoValue::String(host.clone())),
            Info::new(key_str(sys::PMIX_EVENT_AFFECTED_PROCS), InfoValue::Procs(affected)),
            Info::new(
                key_str(sys::PMIX_EVENT_TEXT_MESSAGE),
                InfoValue::String(format!("daemon {daemon} on node {host} was lost")),
            ),
        ];
        self.raise_event(pmix_shim::ERR_LOST_CONNECTION, &source, &jobs, &info);
        self.raise_event(pmix_shim::EVENT_NODE_DOWN, &source, &jobs, &info);
    }

    /// Whether `jobid` goes on when its ranks or a joined job fail (`--enable-recovery`).
    pub(crate) fn recovers(&self, jobid: u32) -> bool {
        self.jobs.hnp.get(&jobid).is_some_and(|j| j.recovery)
    }

    /// A failure of its own ranks `jobid` survives under `--enable-recovery`: its prun is
    /// told; the first one is the job's exit status when it ends.
    pub(crate) fn survive(&mut self, jobid: u32, code: i32, why: String) {
        let Some(job) = self.jobs.hnp.get_mut(&jobid) else { return };
        if job.survived.is_none() {
            job.survived = Some((code, why.clone()));
        }
        self.notice(jobid, format!("{why}; job {jobid} goes on (--enable-recovery)"));
    }

    /// A job joined to `jobid` failed and `jobid` goes on (`--enable-recovery`): its prun is
    /// told; its exit status stays its own ranks' (whether it still runs when the other job's
    /// failure is final depends on how fast its ranks react to the event).
    pub(crate) fn survive_joined(&mut self, jobid: u32, why: String) {
        self.notice(jobid, format!("{why}; job {jobid} goes on (--enable-recovery)"));
    }

    /// A rank called PMIx_Abort (its upcall is answered): tell the jobs concerned now; the job
    /// ends when the rank has exited, or after [`ABORT_GRACE`].
    pub(crate) fn on_job_abort(&mut self, a: JobAbort) {
        let host = self.host_of(a.daemon);
        let Some(job) = self.jobs.hnp.get_mut(&a.jobid) else { return };
        job.aborts.insert(a.rank, (a.code, host.clone()));
        if job.failing() || job.reported.contains(&a.rank) {
            return;
        }
        let why = format!("rank {} on node {host} called MPI_Abort with code {}", a.rank, a.code);
        self.proc_aborted_event(a.jobid, a.rank, a.code, &why);
        let itx = self.input_tx();
        let (jobid, rank) = (a.jobid, a.rank);
        tokio::spawn(async move {
            tokio::time::sleep(ABORT_GRACE).await;
            let _ = itx.send(Input::AbortGrace { jobid, rank });
        });
    }

    /// The grace of an aborting rank passed: if it still runs, its job is ended now (the rank
    /// with it).
    pub(crate) fn on_abort_grace(&mut self, jobid: u32, rank: u32) {
        let Some(job) = self.jobs.hnp.get(&jobid) else { return };
        if job.failing() || job.reported.contains(&rank) {
            return;
        }
        let Some((code, node)) = job.aborts.get(&rank).cloned() else { return };
        let why = format!(
            "rank {rank} on node {node} called MPI_Abort with code {code} and did not exit within {ABORT_GRACE:?}"
        );
        self.fail_job(jobid, code, why);
    }
}
