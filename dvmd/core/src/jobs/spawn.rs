//! HNP side of dynamic processes (docs/dynamic-mpi.md): spawned jobs, jobs joined by a
//! connect, and the data server.
//!
//! Spawn: a rank's PMIx_Spawn reaches the HNP as a `SpawnReq`. The child job is mapped by the
//! same mapper onto the DVM's free slots (the slots of each node minus the procs of the jobs
//! running there; oversubscribed only when the spawn asked for it), then started by the same
//! maps broadcast and residual scatter as any job, its map asking every hosting daemon for a
//! `LaunchReport`. The spawn is answered once every hosting daemon reported its procs
//! started, or fails at the first proc that could not start (one sentence on the parent's
//! prun, `PMIX_ERR_JOB_FAILED_TO_LAUNCH` to the rank). A spawned job shares its parent's prun:
//! its output goes there, its failure is its parent's (which is killed with it, so no rank
//! waits for a peer that is gone), and the parent ends for prun only when all its spawned jobs
//! have ended.
//!
//! Never: a spawn's answer before its procs exist (a rank would wait in its rendezvous for
//! peers that will never come).

use std::collections::BTreeMap;

use dvm_proto::daemon::{daemon_cmd, DataReq, LaunchReport, SpawnReq, SpawnResp};
use dvm_proto::job::{JobSpec, MapBy, StdinTarget};
use dvm_rml::Rank;
use tracing::{info, warn};

use super::hnp::{HnpJob, JobOut, JobTable, PendingSpawn};
use super::nspace_of;
use crate::jobmap::{self, NodeSlots};
use crate::pmixdef;
use crate::timer::Timer;
use crate::Core;

/// The free slots of each node: its slots minus the procs of running jobs there. A node
/// with none left is not a candidate, unless `oversubscribe` (then every node is, with its
/// slots as they are, and the mapper overfills them).
pub fn free_slots(nodes: &[NodeSlots], used: &BTreeMap<u32, u32>, oversubscribe: bool) -> Vec<NodeSlots> {
    let free = super::queue::free_nodes(nodes, used);
    if free.is_empty() && oversubscribe {
        return nodes.to_vec();
    }
    free
}

impl JobTable {
    fn spawn_answer(&mut self, daemon: Rank, resp: SpawnResp) {
        self.out.push(JobOut::Cmd { dst: daemon, body: daemon_cmd::Body::SpawnResp(resp) });
    }

    pub(crate) fn on_spawn_req(&mut self, r: &Core, origin: Rank, req: SpawnReq) {
        let refuse = |status, error: String| SpawnResp { id: req.id, status, nspace: String::new(), error };
        let Some(client) = self.jobs.get(&req.jobid).map(|j| j.client) else {
            let e = format!("spawn by rank {} of job {}: the job has ended", req.rank, req.jobid);
            self.spawn_answer(origin, refuse(pmixdef::ERR_NOT_FOUND, e));
            return;
        };
        // A spawned job recovers as its parent does, and belongs to its parent's user.
        let enable_recovery = self.recovers(req.jobid);
        let uid = self.jobs.get(&req.jobid).map_or(0, |j| j.uid);
        let command = req.apps.iter().map(|a| a.argv.join(" ")).collect::<Vec<_>>().join(" : ");
        let spec = JobSpec {
            enable_recovery,
            uid,
            command: format!("[spawned by job {}] {command}", req.jobid),
            apps: req.apps.clone(),
            map_by: req.map_by,
            ppr: req.ppr,
            oversubscribe: req.oversubscribe,
            stdin_target: StdinTarget::None as i32,
            mpi: req.mpi,
            pmi_preput: req.pmi_preput.clone(),
            ..Default::default()
        };
        let nodes = free_slots(&Self::candidate_nodes(r), &self.used_slots(), req.oversubscribe);
        let placement = match jobmap::map_job(&spec, &nodes) {
            Ok(p) => p,
            Err(e) => {
                let held = self.holders(r);
                let e = if nodes.is_empty() {
                    // No node has a free slot: who holds them says more than the mapper can.
                    "no free slot in the DVM; spawn with oversubscription allowed, or fewer processes".to_string()
                } else {
                    e.to_string()
                };
                let why = format!("MPI_Comm_spawn by rank {} of job {} failed: {e} ({held})", req.rank, req.jobid);
                self.notice(req.jobid, why.clone());
                self.spawn_answer(origin, refuse(pmixdef::ERR_JOB_FAILED_TO_MAP, why));
                return;
            }
        };
        let policy = MapBy::try_from(req.map_by).map(|m| m.as_str_name()).unwrap_or("?");
        let mut spec = spec;
        super::queue::no_implicit_binding_on_shared_machines(r, &mut spec, &placement);
        self.note_universe(r);
        let child = self.start_job(&spec, placement, client, Some(req.jobid));
        info!(parent = req.jobid, rank = req.rank, child, policy, oversubscribe = req.oversubscribe, "spawned job");
        if let Some(p) = self.jobs.get_mut(&req.jobid) {
            p.children.insert(child);
        }
        if let Some(c) = self.jobs.get_mut(&child) {
            c.spawn = Some(PendingSpawn { daemon: origin, id: req.id, parent: req.jobid, rank: req.rank, started: 0 });
        }
    }

    pub(crate) fn on_launch_report(&mut self, r: &Core, rep: LaunchReport) {
        if !rep.error.is_empty() {
            self.spawn_failed(r, rep.jobid, &rep.error);
            return;
        }
        let nspace = nspace_of(&r.dvm_id(), rep.jobid);
        let Some(job) = self.jobs.get_mut(&rep.jobid) else { return };
        let nodes = job.placement.num_nodes();
        let Some(sp) = job.spawn.as_mut() else { return };
        sp.started += 1;
        if sp.started < nodes {
            return;
        }
        let sp = job.spawn.take().expect("present");
        info!(child = rep.jobid, parent = sp.parent, "spawned job started");
        self.spawn_answer(sp.daemon, SpawnResp { id: sp.id, status: 0, nspace, error: String::new() });
    }

    /// A spawn in progress cannot complete: the spawning rank gets an error, its prun one
    /// sentence, and what did start of the child job is killed.
    pub(crate) fn spawn_failed(&mut self, r: &Core, child: u32, error: &str) {
        let Some(job) = self.jobs.get_mut(&child) else { return };
        let Some(sp) = job.spawn.take() else { return };
        job.spawn_failed = true;
        let why = format!("MPI_Comm_spawn by rank {} of job {} failed: {error}", sp.rank, sp.parent);
        warn!("{why}");
        let resp = SpawnResp {
            id: sp.id,
            status: pmixdef::ERR_JOB_FAILED_TO_LAUNCH,
            nspace: String::new(),
            error: why.clone(),
        };
        self.spawn_answer(sp.daemon, resp);
        self.fail_job(r, child, 127, why);
    }

    /// A job left the table: its published data goes, a spawned job's parent may end now.
    pub(crate) fn job_left(&mut self, r: &Core, jobid: u32, job: &HnpJob) {
        if let Some(peers) = self.peers.remove(&jobid) {
            for p in peers {
                if let Some(set) = self.peers.get_mut(&p) {
                    set.remove(&jobid);
                }
            }
        }
        for a in self.data.job_ended(jobid) {
            self.out.push(JobOut::Cmd { dst: a.daemon, body: daemon_cmd::Body::DataResp(a.resp) });
        }
        if let Some(sp) = &job.spawn {
            // Ended before every daemon reported (all its procs failed at once).
            let resp = SpawnResp {
                id: sp.id,
                status: pmixdef::ERR_JOB_FAILED_TO_LAUNCH,
                nspace: String::new(),
                error: format!("spawned job {jobid} ended before it started"),
            };
            self.spawn_answer(sp.daemon, resp);
        }
        if let Some(p) = job.parent {
            if let Some(pj) = self.jobs.get_mut(&p) {
                pj.children.remove(&jobid);
            }
            self.maybe_end(r, p);
        }
    }

    /// A connect joined these jobs: each is told when another one fails.
    pub(crate) fn on_jobs_connected(&mut self, jobids: Vec<u32>) {
        let live: Vec<u32> = jobids.into_iter().filter(|j| self.jobs.contains_key(j)).collect();
        for &a in &live {
            for &b in live.iter().filter(|&&b| b != a) {
                self.peers.entry(a).or_default().insert(b);
            }
        }
        info!(jobs = ?live, "jobs connected");
    }

    /// Job `failed` just failed: each job connected to it (accept/connect) that is not
    /// failing already (its spawn family is) fails too, with a sentence naming the peer, so
    /// none of its ranks waits for a peer that is gone — unless it was started with
    /// `--enable-recovery`: its ranks were told (`PMIX_ERR_PROC_ABORTED`) and it goes on.
    pub(crate) fn fail_peers(&mut self, r: &Core, failed: u32, code: i32, why: &str) {
        let peers: Vec<u32> = self.peers.get(&failed).map(|p| p.iter().copied().collect()).unwrap_or_default();
        for p in peers {
            if self.jobs.get(&p).is_some_and(|j| !j.failing()) {
                if self.recovers(p) {
                    self.survive_joined(p, format!("job {p} was connected to job {failed}, which failed ({why})"));
                    continue;
                }
                let text = format!("job {p} was connected to job {failed}, which failed ({why}): job {p} is ended too");
                self.fail_job(r, p, code, text);
            }
        }
    }

    pub(crate) fn on_data_req(&mut self, origin: Rank, req: DataReq) {
        let out = self.data.handle(origin, req);
        for (a, b) in out.joined {
            self.on_jobs_connected(vec![a, b]);
        }
        for a in out.answers {
            self.out.push(JobOut::Cmd { dst: a.daemon, body: daemon_cmd::Body::DataResp(a.resp) });
        }
        if let Some((token, secs)) = out.timer {
            self.out.push(JobOut::Arm(Timer::Lookup(token), u64::from(secs) * 1_000_000_000));
        }
    }

    pub(crate) fn on_lookup_timeout(&mut self, token: u64) {
        if let Some(a) = self.data.on_timeout(token) {
            self.out.push(JobOut::Cmd { dst: a.daemon, body: daemon_cmd::Body::DataResp(a.resp) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(d: u32, slots: u32) -> NodeSlots {
        NodeSlots::new(d, format!("n{d}"), slots)
    }

    #[test]
    fn free_slots_subtract_running_procs() {
        let nodes = vec![node(0, 4), node(1, 4), node(2, 4)];
        let used = BTreeMap::from([(0, 4), (1, 1)]);
        assert_eq!(free_slots(&nodes, &used, false), vec![node(1, 3), node(2, 4)]);
        let full = BTreeMap::from([(0, 4), (1, 4), (2, 9)]);
        assert!(free_slots(&nodes, &full, false).is_empty());
        assert_eq!(free_slots(&nodes, &full, true), nodes, "oversubscribe: every node, as it is");
    }
}
