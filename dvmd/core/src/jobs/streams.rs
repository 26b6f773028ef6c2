//! HNP: a job and its prun. What goes to a prun (events, notices, output: kept for a detached
//! job, passed on while a prun follows it), what comes from it (stdin, signals, its going
//! away), and the output credit: a daemon's bytes are acknowledged once prun took them (or at
//! once when nobody follows the job), so no daemon waits on a prun that is gone.
//!
//! Never: a stream. A prun is a [`ClientId`]; what it is told leaves as `JobOut::Client`.

use bytes::Bytes;
use dvm_proto::control::{job_event, JobNotice};
use dvm_proto::daemon::daemon_cmd;
use dvm_proto::job::{IofAck, IofChunk, JobControl, StdinChunk};
use dvm_rml::Rank;
use tracing::warn;

use super::hnp::{JobOut, JobTable};
use super::{event, ClientId, Forward};
use crate::Core;

impl JobTable {
    pub(crate) fn tell(&mut self, client: ClientId, item: Forward) {
        self.out.push(JobOut::Client { client, item });
    }

    /// What goes to a job's prun: a detached job keeps it, and passes it on only while a prun
    /// is attached.
    pub(crate) fn tell_job(&mut self, jobid: u32, item: Forward) {
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        if let (Some(kept), Forward::Event(e)) = (job.kept.as_mut(), &item) {
            kept.push(e.clone());
        }
        if job.kept.is_none() || job.attached {
            let client = job.client;
            self.tell(client, item);
        }
    }

    /// Show a sentence on a job's prun.
    pub(crate) fn notice(&mut self, jobid: u32, text: String) {
        self.tell_job(jobid, event(job_event::Event::Notice(JobNotice { text })));
    }

    /// The prun of `client` went away: its job must not outlive it.
    pub(crate) fn on_client_gone(&mut self, r: &Core, client: ClientId) {
        self.drop_queued_of(client);
        for job in self.jobs.values_mut().filter(|j| j.client == client && j.kept.is_some()) {
            // A detached job goes on; whoever attached has left.
            job.attached = false;
        }
        let gone: Vec<u32> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.client == client && j.parent.is_none() && j.kept.is_none())
            .map(|(id, _)| *id)
            .collect();
        for jobid in gone {
            warn!(jobid, "prun went away: killing its job");
            self.fail_job(r, jobid, 1, format!("job {jobid}: prun went away"));
        }
        let follows = self.jobs.values().any(|j| j.client == client && (j.kept.is_none() || j.attached))
            || self.arrays.values().any(|a| a.client == client)
            || self.queue.iter().any(|w| w.client == client && w.attached);
        if !follows {
            self.tell(client, Forward::Close);
        }
        // The head of the queue may have left: what waited behind it may fit now.
        self.drain_queue(r);
    }

    /// prun signalled its job: TERM and INT kill it (naming the signal), others are passed on.
    /// Err: no such job, or another user's.
    pub(crate) fn signal(&mut self, r: &Core, jobid: u32, signal: i32, uid: u32) -> Result<(), String> {
        const SIGINT: i32 = 2;
        const SIGTERM: i32 = 15;
        let ends = signal == SIGINT || signal == SIGTERM;
        self.check_owner(jobid, uid, false)?;
        if !self.jobs.contains_key(&jobid) {
            // Queued, or an array: TERM and INT end it (its waiting part and running elements).
            let known = self.arrays.contains_key(&jobid) || self.queue.iter().any(|w| w.jobid == jobid);
            if known && ends {
                let why = format!("prun received signal {signal}: job {jobid} ended");
                if let Some(w) = self.take_queued(jobid) {
                    self.end_waiting(w, 128 + signal, why.clone());
                }
                for id in self.array_elements(jobid) {
                    self.fail_job(r, id, 128 + signal, why.clone());
                }
                self.drain_queue(r);
            }
            return Ok(());
        }
        if ends {
            self.fail_job(r, jobid, 128 + signal, format!("prun received signal {signal}: job killed"));
        } else {
            self.job_control(JobControl { jobid, signal, ..Default::default() });
        }
        Ok(())
    }

    /// prun's stdin for a job: to the daemon of its stdin rank, or of every rank.
    pub(crate) fn route_stdin(&mut self, jobid: u32, data: Bytes, eof: bool) {
        let Some(job) = self.jobs.get(&jobid) else { return };
        let chunk = StdinChunk { jobid, data, eof };
        let targets: Vec<Rank> = match job.stdin {
            Some(Some(rank)) => job.placement.node_of(rank).into_iter().collect(),
            Some(None) => job.placement.daemons().collect(),
            None => Vec::new(),
        };
        for d in targets {
            self.cmd(d, daemon_cmd::Body::Stdin(chunk.clone()));
        }
    }

    /// Output a daemon sent: to prun (acked once prun took it).
    pub(crate) fn on_iof(&mut self, daemon: Rank, chunk: IofChunk) {
        let follow = self.jobs.get(&chunk.jobid).map(|j| (j.client, j.kept.is_some(), j.attached));
        match follow {
            Some((client, false, _)) => self.tell(client, Forward::Output { daemon, chunk }),
            Some((client, true, attached)) => {
                // Detached: kept, and passed on to an attached prun (which acks it).
                self.keep_output(chunk.jobid, &chunk);
                if attached {
                    self.tell(client, Forward::Output { daemon, chunk });
                } else {
                    let ack = IofAck { jobid: chunk.jobid, bytes: chunk.data.len() as u64 };
                    self.cmd(daemon, daemon_cmd::Body::IofAck(ack));
                }
            }
            None => {
                // Job already ended (or unknown): ack so the daemon never stalls.
                let ack = IofAck { jobid: chunk.jobid, bytes: chunk.data.len() as u64 };
                self.cmd(daemon, daemon_cmd::Body::IofAck(ack));
            }
        }
    }

    /// prun took `bytes` of `daemon`'s output of `jobid`: the daemon gets its credit back.
    pub(crate) fn on_delivered(&mut self, jobid: u32, daemon: Rank, bytes: u64) {
        self.cmd(daemon, daemon_cmd::Body::IofAck(IofAck { jobid, bytes }));
    }

    /// A rank's log line (PMIx_Log) for its prun.
    pub(crate) fn on_log(&mut self, r: &Core, daemon: Rank, jobid: u32, rank: u32, text: &str) {
        let text = format!("rank {rank} on node {}: {}", r.host_of(daemon), text.trim_end());
        self.notice(jobid, text);
    }
}
