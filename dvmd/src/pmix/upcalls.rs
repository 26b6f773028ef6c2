//! Answering the worker's upcalls from the actor loop: connect/finalize/abort/log, fence_nb
//! (to a grpcomm fence and back), direct modex (asked of the hosting daemon and served), and
//! dispatch to `dynamic`, `group` and `events`.
//!
//! Never blocks on a peer: every answer that needs another daemon goes out through the core and
//! comes back as a call. Do not break: an event from a replaced worker is dropped (its replies
//! cannot reach a client), and every upcall's reply handle is completed or dropped (failing it).

use bytes::Bytes;
use dvm_core::Input as CoreInput;
use dvm_grpcomm::{FenceError, FenceRequest as GFence};
use dvm_proto::daemon::{daemon_cmd, DmodexReq, DmodexResp, JobAbort, JobLog};
use dvm_rml::Rank;
use pmix_shim::ProcId;
use tracing::{debug, info, warn};

use super::link::{FenceUpcall, HostEvent, WorkerReplyHandle};

use super::{dynamic, fence_status, proc_rank, FenceWaiter, PmixHost, PmixJob, MODEX_BYTES_PER_PROC};

impl PmixHost {
    pub(crate) fn fence_done(&mut self, key: u64, result: Result<Bytes, FenceError>) {
        if let (Some(jobids), true) = (self.connects.remove(&key), result.is_ok()) {
            if self.reported_connects.insert(jobids.clone()) {
                self.send_cmd(0, daemon_cmd::Body::JobsConnected(dvm_proto::daemon::JobsConnected { jobids }));
            }
        }
        let reply = match self.fences.remove(&key) {
            Some(FenceWaiter::Upcall(reply)) => reply,
            Some(FenceWaiter::Group(wait)) => {
                self.group_done(wait, result);
                self.maybe_recycle();
                return;
            }
            // A group operation answered when a member died, whose fence was then abandoned.
            None if matches!(result, Err(FenceError::Abandoned { .. })) => {
                debug!(key, "an abandoned fence ended");
                return;
            }
            None => {
                warn!(key, "a PMIx fence completed with no upcall waiting for it");
                return;
            }
        };
        match result {
            Ok(data) => reply.complete_with(pmix_shim::SUCCESS, data),
            Err(e) => {
                warn!(key, "PMIx fence failed: {e}");
                reply.complete(fence_status(&e));
            }
        }
        self.maybe_recycle();
    }

    /// An event from worker generation `gen`.
    pub(crate) fn on_event(&mut self, gen: u64, ev: HostEvent) {
        debug!(kind = ev.kind(), gen, "PMIx upcall");
        if self.worker.as_ref().map(|w| w.gen) != Some(gen) {
            // From a worker already replaced or lost: its replies cannot reach a client any
            // more (dropping them is a no-op on a closed link).
            debug!(kind = ev.kind(), gen, "event from a former PMIx worker dropped");
            return;
        }
        match ev {
            HostEvent::ClientConnected { proc, reply } => {
                if let Some((j, r)) = self.job_rank_mut(&proc) {
                    j.connected.insert(r);
                }
                reply.complete(pmix_shim::SUCCESS);
            }
            HostEvent::ClientFinalized { proc, reply } => {
                if let Some((j, r)) = self.job_rank_mut(&proc) {
                    j.finalized.insert(r);
                }
                reply.complete(pmix_shim::SUCCESS);
            }
            HostEvent::Abort { proc, status, message, reply } => {
                // Reply first; the job fails when the aborting rank has exited.
                reply.complete(pmix_shim::SUCCESS);
                let (Some(jobid), Some(rank)) = (self.job_of(&proc.nspace), proc_rank(&proc)) else { return };
                let abort = JobAbort { jobid, rank, code: status, message, daemon: self.me };
                self.send_cmd(0, daemon_cmd::Body::JobAbort(abort));
            }
            HostEvent::Log { client, text, reply } => {
                reply.complete(pmix_shim::SUCCESS);
                if let (Some(jobid), Some(text)) = (self.job_of(&client.nspace), text) {
                    let rank = proc_rank(&client).unwrap_or(u32::MAX);
                    self.send_cmd(0, daemon_cmd::Body::JobLog(JobLog { jobid, rank, text, daemon: self.me }));
                }
            }
            HostEvent::FenceNb(req) => self.fence(req),
            HostEvent::DirectModex { proc, reply } => self.direct_modex(proc, reply),
            HostEvent::DmodexData { request, status, data } => {
                let Some((asker, id)) = self.serving.remove(&request) else { return };
                let resp = DmodexResp { id, status, data };
                if asker == self.me {
                    self.on_dmodex_resp(resp);
                } else {
                    self.send_cmd(asker, daemon_cmd::Body::DmodexResp(resp));
                    self.maybe_recycle();
                }
            }
            HostEvent::JobControl { reply } => reply.complete(pmix_shim::ERR_NOT_SUPPORTED),
            HostEvent::NspaceDeregistered { nspace, status } => {
                debug!(%nspace, status, "PMIx namespace deregistered");
                self.maybe_recycle();
            }
            HostEvent::Spawn { proc, spawn, reply } => self.spawn(proc, spawn, reply),
            HostEvent::Connect { connect, procs, timeout, reply } => {
                let what = if connect { "connect" } else { "disconnect" };
                self.union_fence(what, &procs, false, Bytes::new(), timeout, reply)
            }
            HostEvent::Data { op, proc, keys, info, reply } => self.data_request(op, proc, keys, info, reply),
            HostEvent::Query { queries, reply } => self.query(queries, reply),
            HostEvent::Group { op, id, procs, directives, reply } => self.group(op, id, procs, directives, reply),
            HostEvent::Notify { event } => self.client_event(event),
            HostEvent::RegisterEvents { codes } => {
                // Nothing to set up: the DVM raises its events whoever listens, and libpmix
                // delivers them to the clients that registered.
                debug!(?codes, "a client registered for system events");
            }
            HostEvent::Ended { how } => self.worker_lost(&how),
        }
    }

    pub(super) fn job_of(&self, nspace: &str) -> Option<u32> {
        self.by_nspace.get(nspace).copied()
    }

    pub(super) fn job_rank_mut(&mut self, proc: &ProcId) -> Option<(&mut PmixJob, u32)> {
        let rank = proc_rank(proc)?;
        let job = self.job_of(&proc.nspace)?;
        Some((self.jobs.get_mut(&job)?, rank))
    }

    pub(super) fn fence(&mut self, req: FenceUpcall) {
        let nspace = req.procs.first().map(|p| p.nspace.clone()).unwrap_or_default();
        if req.procs.iter().any(|p| p.nspace != nspace) {
            // Across jobs (Open MPI's MPI_Comm_disconnect is such a fence).
            if let Some(st) = req.local_status.filter(|&s| s != pmix_shim::SUCCESS) {
                warn!(status = st, node = %self.host, "a local participant left a fence across jobs (status {st})");
                req.reply.complete(st);
                return;
            }
            let FenceUpcall { procs, collect, timeout, data, reply, .. } = req;
            self.union_fence("fence", &procs, collect, data, timeout, reply);
            return;
        }
        let Some(jobid) = self.job_of(&nspace) else {
            warn!(%nspace, "fence for an unknown namespace");
            req.reply.complete(pmix_shim::ERR_NOT_FOUND);
            return;
        };
        if let Some(st) = req.local_status.filter(|&s| s != pmix_shim::SUCCESS) {
            warn!(jobid, status = st, node = %self.host, "a local rank of job {jobid} left a fence (status {st})");
            req.reply.complete(st);
            return;
        }
        let job = self.jobs.get_mut(&jobid).expect("indexed by by_nspace");
        let (sig, nprocs) = dvm_core::pmixops::job_fence(&nspace, &super::procs_view(&req.procs), &job.placement);
        job.sigs.insert(sig.clone());
        let timeout = req.timeout.filter(|&t| t > 0).map(|t| t as u64 * 1_000_000_000);
        let key = self.next_id;
        self.next_id += 1;
        self.fences.insert(key, FenceWaiter::Upcall(req.reply));
        debug!(jobid, %nspace, collect = req.collect, key, "PMIx fence upcall -> grpcomm fence");
        let size_hint = req.collect.then(|| nprocs * MODEX_BYTES_PER_PROC);
        let fence = GFence { sig, collect: req.collect, data: req.data, timeout, size_hint };
        self.out.push(CoreInput::Fence { owner: dvm_core::FenceOwner::Pmix(key), req: fence });
    }

    pub(super) fn direct_modex(&mut self, proc: ProcId, reply: WorkerReplyHandle) {
        // Any job of the DVM: after a connect, peers of another job are asked for too.
        let owner = match (self.job_of(&proc.nspace), proc_rank(&proc)) {
            (Some(jobid), Some(rank)) => self.jobs[&jobid].placement.node_of(rank).map(|o| (o, jobid, rank)),
            _ => self.host_of_proc(&proc).map(|(jobid, rank, owner)| (owner, jobid, rank)),
        };
        if owner.is_none()
            && proc_rank(&proc).is_some()
            && !self.known.contains_key(&proc.nspace)
            && dvm_core::pmixops::may_still_come(&proc.nspace, self.highest_learned)
        {
            debug!(%proc, "direct modex for a job whose maps have not arrived yet: deferred");
            self.deferred.push(dynamic::Deferred::Modex { proc, reply });
            return;
        }
        if owner.is_some() {
            self.register_foreign(std::slice::from_ref(&proc));
        }
        let Some((owner, jobid, rank)) = owner else {
            reply.complete(pmix_shim::ERR_NOT_FOUND);
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        self.asked.insert(id, reply);
        info!(jobid, rank, owner, "direct modex: asking daemon {owner} for rank {rank}");
        let req = DmodexReq { id, nspace: proc.nspace, rank };
        if owner == self.me {
            self.serve_dmodex(self.me, req);
        } else {
            self.send_cmd(owner, daemon_cmd::Body::DmodexReq(req));
        }
    }

    /// Another daemon (or this one) asks for the modex blob of a rank hosted here.
    pub(crate) fn serve_dmodex(&mut self, asker: Rank, req: DmodexReq) {
        let requested = match self.worker.as_ref() {
            Some(w) => w.dmodex_request(&req.nspace, req.rank).map_err(|e| e.to_string()),
            None => Err("no PMIx server runs here".to_string()),
        };
        match requested {
            Ok(request) => {
                self.serving.insert(request, (asker, req.id));
                info!(nspace = %req.nspace, rank = req.rank, asker, "direct modex served");
            }
            Err(e) => {
                warn!(rank = req.rank, "dmodex_request failed: {e}");
                let resp = DmodexResp { id: req.id, status: pmix_shim::ERROR, data: Bytes::new() };
                if asker == self.me {
                    self.on_dmodex_resp(resp);
                } else {
                    self.send_cmd(asker, daemon_cmd::Body::DmodexResp(resp));
                }
            }
        }
    }

    /// The answer to a direct modex this daemon asked for.
    pub(crate) fn on_dmodex_resp(&mut self, resp: DmodexResp) {
        debug!(id = resp.id, status = resp.status, bytes = resp.data.len(), "direct modex answer");
        if let Some(reply) = self.asked.remove(&resp.id) {
            reply.complete_with(resp.status, resp.data);
        }
        self.maybe_recycle();
    }
}
