//! A job's preload (`prun --preload-binary`, `--preload-files`): its files are copied to its
//! nodes before its launch is broadcast, and removed when it ends.
//!
//! Owns: holding a job's launch until the copy is verdicted, ending a job whose copy failed
//! (or that ended before its copy did) without any proc to wait for, and holding the news of
//! a job's end from its prun until its files are gone from every node.
//! Never: moves a byte (the node's staging does, [`crate::stage`]).

use std::collections::BTreeSet;

use bytes::Bytes;
use dvm_grpcomm::tags;
use dvm_proto::control::StageReply;
use dvm_proto::job::JobSpec;
use dvm_rml::Rank;
use tracing::info;

use super::hnp::{JobOut, JobTable};
use crate::stage::{SourceFile, StagePlan};
use crate::Core;

/// Where a job's preloaded executable lands on each node: `session` is that daemon's session
/// directory.
pub fn binary_path(session: &str, jobid: u32, argv0: &str) -> String {
    let name = argv0.rsplit('/').next().unwrap_or(argv0);
    format!("{session}/preload/{jobid}/{name}")
}

impl JobTable {
    /// Hold the launch of `jobid` (just entered) while its preload files are copied; false
    /// when it has none.
    pub(crate) fn preload(&mut self, jobid: u32, spec: &JobSpec, map: Bytes, slices: &[(Rank, Bytes)]) -> bool {
        if spec.preload.is_empty() {
            return false;
        }
        let Some(job) = self.jobs.get_mut(&jobid) else { return false };
        let targets: BTreeSet<Rank> = job.placement.daemons().collect();
        let files = spec
            .preload
            .iter()
            .map(|p| SourceFile {
                src: p.src.clone(),
                dest: p.dest.replace("%j", &jobid.to_string()),
                size: p.size,
                mode: p.mode,
            })
            .collect();
        job.pending_launch = Some((map, slices.to_vec()));
        job.preload = Some(spec.preload_keep);
        let plan = StagePlan {
            files,
            hosts: Vec::new(),
            compress: spec.preload_compress,
            segment: 0,
            window: 0,
            uid: spec.uid,
        };
        info!(jobid, files = spec.preload.len(), nodes = targets.len(), "preloading the job's files");
        self.out.push(JobOut::Stage { jobid, plan, targets });
        true
    }

    /// The copy of a job's preload files ended: launch it, or fail it naming why.
    pub(crate) fn staged(&mut self, r: &Core, jobid: u32, reply: StageReply) {
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        if reply.ok {
            if let Some((map, slices)) = job.pending_launch.take() {
                self.out.push(JobOut::Xcast { tag: tags::LAUNCH, payload: map });
                self.out.push(JobOut::Scatter { tag: tags::LAUNCH_RESIDUALS, slices });
            }
            return;
        }
        // Nothing of it ran: it ends with the copy's failure (its files are discarded).
        job.preload = None;
        let why = format!("job {jobid} was not started: copying its preload files failed: {}", reply.error);
        self.fail_job(r, jobid, 1, why);
    }

    /// The job's launch is still held (its files are being copied): ending it waits for no
    /// proc, and its copy stops.
    pub(crate) fn never_launched(&mut self, jobid: u32) -> bool {
        let Some(job) = self.jobs.get_mut(&jobid) else { return false };
        if job.pending_launch.take().is_none() {
            return false;
        }
        job.reported = (0..job.placement.nprocs()).collect();
        // Files of a job that never ran are not kept; its end removes them.
        if job.preload.is_some() {
            job.preload = Some(false);
        }
        true
    }

    /// A job's preloaded files are gone from its nodes (or kept): its prun, held until now,
    /// is told it ended.
    pub(crate) fn unstaged(&mut self, jobid: u32) {
        if let Some((client, ended)) = self.unstaging.remove(&jobid) {
            self.tell(client, ended);
        }
    }
}
