//! HNP: what the job tools ask of the table (listing jobs and nodes, cancel, attach) and
//! what it keeps for them: the output of detached jobs, and the records of ended jobs.
//!
//! A detached job runs on without its prun. Its output is acknowledged to its daemons at
//! once and kept, at most [`KEPT_OUTPUT_BYTES`] per job (the oldest dropped first, with a
//! line saying how much), for `prun --attach`, which replays it and then follows the job
//! live; an attached prun that goes away leaves the job running. The last [`ENDED_KEPT`]
//! ended jobs are listed, and the kept output of the last [`ENDED_OUTPUT_KEPT`] detached
//! ones can still be attached to: the HNP's memory does not grow with the jobs it ran.
//!
//! Never: a job cancelled by another user (root excepted), or attached to while its own
//! prun follows it.

use dvm_proto::control::{job_event, CancelReply, JobEnded, JobEvent, JobInfo, JobOutput, JobsReply, NodeInfo};
use dvm_proto::job::IofChunk;

use super::hnp::JobTable;
use super::queue::MAX_QUEUED;
use super::records::Waiting;
pub use super::records::KEPT_OUTPUT_BYTES;
pub(crate) use super::records::{EndedJob, Kept};
use super::{event, ClientId, Forward};
use crate::Core;

/// Ended jobs listed.
pub const ENDED_KEPT: usize = 1024;
/// Ended detached jobs whose kept output can still be attached to.
pub const ENDED_OUTPUT_KEPT: usize = 64;
/// Exit status of a cancelled job (SIGTERM's).
pub const CANCELLED_EXIT: i32 = 143;

impl JobTable {
    /// Output of a detached job: kept (and, while a prun is attached, forwarded by the caller).
    pub(crate) fn keep_output(&mut self, jobid: u32, chunk: &IofChunk) {
        if let Some(kept) = self.jobs.get_mut(&jobid).and_then(|j| j.kept.as_mut()) {
            let out = JobOutput {
                rank: chunk.rank,
                stream: chunk.stream,
                data: chunk.data.clone(),
                jobid,
                read_at_us: chunk.read_at_us,
            };
            kept.push(JobEvent { event: Some(job_event::Event::Output(out)) });
        }
    }

    /// Remember an ended job for listings (and its kept output, if detached).
    pub(crate) fn remember(&mut self, info: JobInfo, kept: Option<Kept>) {
        self.ended.push_back(EndedJob { info, kept });
        while self.ended.len() > ENDED_KEPT {
            self.ended.pop_front();
        }
        let mut with_output = 0;
        for e in self.ended.iter_mut().rev() {
            if e.kept.is_some() {
                with_output += 1;
                if with_output > ENDED_OUTPUT_KEPT {
                    e.kept = None;
                }
            }
        }
    }

    /// A queued job that never ran, remembered as ended.
    pub(crate) fn remember_queued_end(&mut self, w: &Waiting, exit_code: i32) {
        let info = JobInfo {
            jobid: w.jobid,
            state: "ended".into(),
            exit_code,
            command: w.spec.command.clone(),
            uid: w.spec.uid,
            wait_ms: self.now.saturating_sub(w.since) / 1_000_000,
            ..Default::default()
        };
        self.remember(info, None);
    }

    /// Every job (queued, running, recently ended) and, when asked, every node.
    pub(crate) fn list(&self, r: &Core, nodes: bool) -> JobsReply {
        let mut jobs = Vec::new();
        for e in &self.ended {
            jobs.push(e.info.clone());
        }
        for (&jobid, job) in &self.jobs {
            let state =
                if job.reported.len() as u32 >= job.placement.nprocs() || job.failing() { "ending" } else { "running" };
            let hosts = job.placement.daemons().map(|d| r.host_of(d).to_string()).collect();
            jobs.push(JobInfo {
                jobid,
                state: state.into(),
                nprocs: job.placement.nprocs(),
                nodes: hosts,
                elapsed_ms: self.now.saturating_sub(job.started_ns) / 1_000_000,
                command: job.command.clone(),
                uid: job.uid,
                detached: job.kept.is_some(),
                wait_ms: job.wait_ns / 1_000_000,
                array: job.array.map_or(0, |a| a.0),
                index: job.array.map_or(0, |a| a.1),
                ..Default::default()
            });
        }
        for (i, w) in self.queue.iter().enumerate() {
            jobs.push(JobInfo {
                jobid: w.jobid,
                state: "queued".into(),
                nprocs: w.spec.apps.iter().map(|a| a.np).sum(),
                elapsed_ms: self.now.saturating_sub(w.since) / 1_000_000,
                command: w.spec.command.clone(),
                uid: w.spec.uid,
                queue_position: i as u32 + 1,
                detached: w.spec.detach,
                array_left: if w.next.is_some() { w.count() as u32 } else { 0 },
                ..Default::default()
            });
        }
        let mut node_infos = Vec::new();
        if nodes {
            let used = self.used_slots();
            let topo = r.topology();
            for c in r.contacts().map(|c| c.values().cloned().collect::<Vec<_>>()).unwrap_or_default() {
                let on: Vec<u32> = self
                    .jobs
                    .iter()
                    .filter(|(_, j)| !j.placement.procs_on(c.rank).is_empty())
                    .map(|(id, _)| *id)
                    .collect();
                node_infos.push(NodeInfo {
                    rank: c.rank,
                    host: c.host.clone(),
                    slots: c.slots,
                    used: used.get(&c.rank).copied().unwrap_or(0),
                    alive: topo.is_alive(c.rank),
                    jobs: on,
                });
            }
        }
        JobsReply { jobs, nodes: node_infos, queued_jobs: self.queued() as u32, max_queued: MAX_QUEUED as u32 }
    }

    /// Who owns `jobid` (queued, running, or an array): None if the DVM has no such job.
    pub(crate) fn owner_of(&self, jobid: u32) -> Option<u32> {
        self.queue
            .iter()
            .find(|w| w.jobid == jobid)
            .map(|w| w.spec.uid)
            .or_else(|| self.jobs.get(&jobid).map(|j| j.uid))
            .or_else(|| self.arrays.get(&jobid).map(|a| a.spec.uid))
    }

    /// `uid` may act on `jobid` (its owner, or root); else the sentence why not. An ended job
    /// counts only when `ended_too` (attaching to what it left).
    pub(crate) fn check_owner(&self, jobid: u32, uid: u32, ended_too: bool) -> Result<(), String> {
        let ended = self.ended.iter().find(|e| e.info.jobid == jobid).map(|e| e.info.uid);
        match self.owner_of(jobid).or(ended.filter(|_| ended_too)) {
            None if ended.is_some() => Err(format!("job {jobid} has already ended")),
            None => Err(format!("no job {jobid} in this DVM")),
            Some(owner) if owner != uid && uid != 0 => {
                Err(format!("job {jobid} belongs to user {owner}, not to user {uid}"))
            }
            Some(_) => Ok(()),
        }
    }

    /// Cancel `jobids` (or, with `all`, every job of `uid`) on behalf of `uid`.
    pub(crate) fn cancel(&mut self, r: &Core, jobids: &[u32], all: bool, uid: u32) -> CancelReply {
        let mut reply = CancelReply::default();
        let mut targets: Vec<u32> = jobids.to_vec();
        if all {
            targets.extend(self.queue.iter().filter(|w| w.spec.uid == uid).map(|w| w.jobid));
            targets.extend(
                self.jobs.iter().filter(|(_, j)| j.uid == uid && j.parent.is_none() && !j.failing()).map(|(id, _)| *id),
            );
        }
        for jobid in targets {
            if let Err(e) = self.check_owner(jobid, uid, false) {
                reply.errors.push(e);
                continue;
            }
            let why = format!("job {jobid} was cancelled (by user {uid})");
            if let Some(w) = self.take_queued(jobid) {
                self.end_waiting(w, CANCELLED_EXIT, why.clone());
            }
            // An array's running elements go with it.
            for id in self.array_elements(jobid).into_iter().chain(self.jobs.contains_key(&jobid).then_some(jobid)) {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.cancelled = true;
                }
                self.fail_job(r, id, CANCELLED_EXIT, format!("job {id} was cancelled (by user {uid})"));
            }
            reply.cancelled.push(jobid);
        }
        // What waited behind a cancelled head may fit now.
        self.drain_queue(r);
        reply
    }

    /// A prun attaches to `jobid`: what it is sent first, or why it cannot.
    pub(crate) fn attach(&mut self, jobid: u32, client: ClientId) -> Result<(), String> {
        if let Some(job) = self.jobs.get_mut(&jobid) {
            let Some(kept) = job.kept.as_ref() else {
                return Err(format!(
                    "job {jobid} is followed by its own prun; only a detached job (prun --detach) can be attached"
                ));
            };
            if job.attached {
                return Err(format!("job {jobid} already has a prun attached"));
            }
            let replay = kept.replay();
            job.attached = true;
            job.client = client;
            for e in replay {
                self.tell(client, Forward::Event(e));
            }
            return Ok(());
        }
        if self.arrays.contains_key(&jobid) {
            return Err(format!("job {jobid} is an array: its elements are jobs of their own (pps lists them)"));
        }
        if let Some(w) = self.queue.iter_mut().find(|w| w.jobid == jobid) {
            // Queued: followed from its start.
            if !w.spec.detach {
                return Err(format!("job {jobid} is followed by its own prun; only a detached job can be attached"));
            }
            if w.attached {
                return Err(format!("job {jobid} already has a prun attached"));
            }
            w.client = client;
            w.attached = true;
            return Ok(());
        }
        match self.ended.iter().find(|e| e.info.jobid == jobid) {
            Some(EndedJob { info, kept: Some(kept) }) => {
                let (code, message) = (info.exit_code, info.message.clone());
                for e in kept.replay() {
                    self.tell(client, Forward::Event(e));
                }
                let ended = JobEnded { exit_code: code, message, jobid, ..Default::default() };
                self.tell(client, event(job_event::Event::Ended(ended)));
                Ok(())
            }
            Some(_) => Err(format!("job {jobid} has ended and its output is no longer kept")),
            None => Err(format!("no job {jobid} in this DVM")),
        }
    }
}
