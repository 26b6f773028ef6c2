//! The server's upcalls, answered: connect/finalize/abort/log, fence_nb (to a grpcomm fence and
//! back), direct modex (asked of the hosting daemon, and served), and dispatch to `dynamic`,
//! `group` and `events`.
//!
//! Never waits on a peer: every answer that needs another daemon goes out through the router
//! and comes back as a call. Do not break: every upcall with a reply id is answered exactly
//! once (an unknown one with `PMIX_ERR_NOT_SUPPORTED`).

use bytes::Bytes;
use dvm_grpcomm::FenceError;
use dvm_proto::daemon::{daemon_cmd, DataOp, DmodexReq, DmodexResp, JobAbort, JobLog, JobsConnected};
use dvm_proto::pmixworker::{self as wire, worker_event::Body as Ev};
use dvm_rml::Rank;
use tracing::{debug, info, warn};

use super::info::{rank_id, view, Shown};
use super::{dynamic::Deferred, fence_status, timeout_ns, FenceParts, Pmix, Waiter};
use crate::host::Host;
use crate::pmixdef as def;

impl Pmix {
    /// An upcall of the current worker.
    pub fn on_upcall(&mut self, host: &mut impl Host, ev: wire::WorkerEvent) {
        let reply = ev.reply;
        let Some(body) = ev.body else {
            // Unknown to this daemon: fail it rather than leave a client waiting.
            debug!(reply, "unknown PMIx upcall refused");
            return self.reply(reply, def::ERR_NOT_SUPPORTED);
        };
        let proc_of = |p: Option<wire::Proc>| p.unwrap_or_default();
        match body {
            Ev::ClientConnected(p) => {
                if let Some((job, r)) = self.job_rank(&p) {
                    self.jobs.get_mut(&job).expect("indexed").connected.insert(r);
                    if let Some(why) = self.refused.get(&job).cloned() {
                        let reason = format!("rank {r} on node {} {why}", self.host);
                        info!(jobid = job, rank = r, "{reason}");
                        let fail = dvm_proto::daemon::JobFail { jobid: job, code: 1, reason, daemon: self.me };
                        self.send_cmd(0, daemon_cmd::Body::JobFail(fail));
                    }
                }
                self.reply(reply, def::SUCCESS);
            }
            Ev::ClientFinalized(p) => {
                if let Some((job, r)) = self.job_rank(&p) {
                    self.jobs.get_mut(&job).expect("indexed").finalized.insert(r);
                }
                self.reply(reply, def::SUCCESS);
            }
            Ev::Abort(a) => {
                // Reply first; the job fails when the aborting rank has exited.
                self.reply(reply, def::SUCCESS);
                let p = proc_of(a.proc);
                let (Some(jobid), Some(rank)) = (self.job_of(&p.nspace), rank_id(&p)) else { return };
                let abort = JobAbort { jobid, rank, code: a.status, message: a.message, daemon: self.me, kill: false };
                self.send_cmd(0, daemon_cmd::Body::JobAbort(abort));
            }
            Ev::Log(l) => {
                self.reply(reply, def::SUCCESS);
                let client = proc_of(l.client);
                if let (Some(jobid), true) = (self.job_of(&client.nspace), l.has_text) {
                    let rank = rank_id(&client).unwrap_or(u32::MAX);
                    self.send_cmd(0, daemon_cmd::Body::JobLog(JobLog { jobid, rank, text: l.text, daemon: self.me }));
                }
            }
            Ev::Fence(f) => self.fence(host, f, reply),
            Ev::DirectModex(p) => self.direct_modex(host, p, reply),
            Ev::DmodexData(d) => {
                let Some((asker, id)) = self.serving.remove(&d.request) else { return };
                let resp = DmodexResp { id, status: d.status, data: d.data };
                if asker == self.me {
                    self.on_dmodex_resp(host, resp);
                } else {
                    self.send_cmd(asker, daemon_cmd::Body::DmodexResp(resp));
                    self.maybe_recycle(host);
                }
            }
            Ev::JobControl(_) => self.reply(reply, def::ERR_NOT_SUPPORTED),
            Ev::NspaceDeregistered(n) => {
                debug!(nspace = %n.nspace, status = n.status, "PMIx namespace deregistered");
                self.maybe_recycle(host);
            }
            Ev::Spawn(sp) => self.spawn(proc_of(sp.proc.clone()), sp, reply),
            Ev::Connect(set) => {
                let timeout = (set.timeout > 0).then_some(i64::from(set.timeout));
                self.union_fence(host, "connect", &set.procs, false, Bytes::new(), timeout, reply)
            }
            Ev::Disconnect(set) => {
                let timeout = (set.timeout > 0).then_some(i64::from(set.timeout));
                self.union_fence(host, "disconnect", &set.procs, false, Bytes::new(), timeout, reply)
            }
            Ev::Publish(p) => self.data_request(DataOp::DataPublish, proc_of(p.proc), Vec::new(), p.info, reply),
            Ev::Lookup(l) => self.data_request(DataOp::DataLookup, proc_of(l.proc), l.keys, l.info, reply),
            Ev::Unpublish(l) => self.data_request(DataOp::DataUnpublish, proc_of(l.proc), l.keys, l.info, reply),
            Ev::Query(q) => self.query(q.queries, reply),
            Ev::Group(g) => self.group(g.construct, g.id, g.procs, g.directives, reply),
            Ev::Notify(event) => self.client_event(event),
            Ev::RegisterEvents(r) => {
                // Nothing to set up: the DVM raises its events whoever listens, and libpmix
                // delivers them to the clients that registered.
                debug!(codes = ?r.codes, "a client registered for system events");
            }
        }
    }

    fn job_rank(&self, p: &wire::Proc) -> Option<(u32, u32)> {
        Some((self.job_of(&p.nspace)?, rank_id(p)?))
    }

    /// A fence for PMIx finished.
    pub fn fence_done(&mut self, host: &mut impl Host, key: u64, result: Result<Bytes, FenceError>) {
        if let (Some(jobids), true) = (self.connects.remove(&key), result.is_ok()) {
            if self.reported_connects.insert(jobids.clone()) {
                self.send_cmd(0, daemon_cmd::Body::JobsConnected(JobsConnected { jobids }));
            }
        }
        let reply = match self.fences.remove(&key) {
            Some(Waiter::Upcall(reply)) => reply,
            Some(Waiter::Group(wait)) => {
                self.group_done(wait, result);
                return self.maybe_recycle(host);
            }
            // A group operation answered when a member died, whose fence was then abandoned.
            None if matches!(result, Err(FenceError::Abandoned { .. })) => {
                return debug!(key, "an abandoned fence ended");
            }
            None => return warn!(key, "a PMIx fence completed with no upcall waiting for it"),
        };
        match result {
            Ok(data) => self.reply_with(reply, def::SUCCESS, data),
            Err(e) => {
                warn!(key, "PMIx fence failed: {e}");
                self.reply(reply, fence_status(&e));
            }
        }
        self.maybe_recycle(host);
    }

    /// A daemon command for PMIx hosting (direct modex, spawn and data server answers).
    pub fn on_cmd(&mut self, host: &mut impl Host, origin: Rank, body: daemon_cmd::Body) {
        match body {
            daemon_cmd::Body::DmodexReq(req) => self.serve_dmodex(host, origin, req),
            daemon_cmd::Body::DmodexResp(resp) => self.on_dmodex_resp(host, resp),
            daemon_cmd::Body::SpawnResp(resp) => self.on_spawn_resp(host, resp),
            daemon_cmd::Body::DataResp(resp) => self.on_data_resp(host, resp),
            other => warn!(origin, "daemon command {other:?} is not for PMIx hosting"),
        }
    }

    fn fence(&mut self, host: &mut impl Host, f: wire::Fence, reply: u64) {
        let nspace = f.procs.first().map(|p| p.nspace.clone()).unwrap_or_default();
        let local_status = f.has_local_status.then_some(f.local_status).filter(|&s| s != def::SUCCESS);
        let timeout = (f.timeout != 0).then_some(i64::from(f.timeout));
        if f.procs.iter().any(|p| p.nspace != nspace) {
            // Across jobs (Open MPI's MPI_Comm_disconnect is such a fence).
            if let Some(st) = local_status {
                warn!(status = st, node = %self.host, "a local participant left a fence across jobs (status {st})");
                return self.reply(reply, st);
            }
            return self.union_fence(host, "fence", &f.procs, f.collect, f.data, timeout, reply);
        }
        let Some(jobid) = self.job_of(&nspace) else {
            warn!(%nspace, "fence for an unknown namespace");
            return self.reply(reply, def::ERR_NOT_FOUND);
        };
        if let Some(st) = local_status {
            warn!(jobid, status = st, node = %self.host, "a local rank of job {jobid} left a fence (status {st})");
            return self.reply(reply, st);
        }
        let job = self.jobs.get_mut(&jobid).expect("indexed by by_nspace");
        let (sig, nprocs) = crate::pmixops::job_fence(&nspace, &view(&f.procs), &job.placement);
        job.sigs.insert(sig.clone());
        let collect = f.collect;
        let parts = FenceParts { sig, collect, data: f.data, timeout: timeout_ns(timeout) };
        let key = self.start_fence(Waiter::Upcall(reply), parts, nprocs);
        debug!(jobid, %nspace, collect, key, "PMIx fence upcall -> grpcomm fence");
    }

    /// A client asks for a peer's modex blob its server does not hold: asked of the daemon
    /// hosting the peer (any job of the DVM: after a connect, peers of another job too).
    pub(super) fn direct_modex(&mut self, host: &mut impl Host, proc: wire::Proc, reply: u64) {
        if self.done_here.contains(&proc.nspace) {
            // Asked by a client of a job whose ranks here are gone (libpmix still passes on
            // what the dying clients asked): nobody is left to answer.
            debug!(proc = %Shown(&proc), "direct modex for a job whose ranks here have ended: refused");
            return self.reply(reply, def::ERR_NOT_FOUND);
        }
        let owner = match (self.job_of(&proc.nspace), rank_id(&proc)) {
            (Some(jobid), Some(rank)) => self.jobs[&jobid].placement.node_of(rank).map(|o| (o, jobid, rank)),
            _ => self.host_of_proc(&proc).map(|(jobid, rank, owner)| (owner, jobid, rank)),
        };
        if owner.is_none()
            && rank_id(&proc).is_some()
            && !self.known.contains_key(&proc.nspace)
            && crate::pmixops::may_still_come(&proc.nspace, self.highest_learned)
        {
            debug!(proc = %Shown(&proc), "direct modex for a job whose maps have not arrived yet: deferred");
            return self.deferred.push(Deferred::Modex { proc, reply });
        }
        let Some((owner, jobid, rank)) = owner else { return self.reply(reply, def::ERR_NOT_FOUND) };
        self.register_foreign(host, std::slice::from_ref(&proc));
        let id = self.next_id();
        self.asked.insert(id, super::Asked { reply, owner, nspace: proc.nspace.clone() });
        info!(jobid, rank, owner, "direct modex: asking daemon {owner} for rank {rank}");
        let req = DmodexReq { id, nspace: proc.nspace, rank };
        if owner == self.me {
            self.serve_dmodex(host, self.me, req);
        } else {
            self.send_cmd(owner, daemon_cmd::Body::DmodexReq(req));
        }
    }

    /// Another daemon (or this one) asks for the modex blob of a rank hosted here.
    fn serve_dmodex(&mut self, host: &mut impl Host, asker: Rank, req: DmodexReq) {
        let requested = if self.ended || self.recycle_kib.is_none() {
            Err("no PMIx server runs here".to_string())
        } else {
            host.pmix_dmodex_request(&req.nspace, req.rank)
        };
        match requested {
            Ok(request) => {
                self.serving.insert(request, (asker, req.id));
                info!(nspace = %req.nspace, rank = req.rank, asker, "direct modex served");
            }
            Err(e) => {
                warn!(rank = req.rank, "dmodex_request failed: {e}");
                let resp = DmodexResp { id: req.id, status: def::ERROR, data: Bytes::new() };
                if asker == self.me {
                    self.on_dmodex_resp(host, resp);
                } else {
                    self.send_cmd(asker, daemon_cmd::Body::DmodexResp(resp));
                }
            }
        }
    }

    /// The answer to a direct modex this daemon asked for.
    fn on_dmodex_resp(&mut self, host: &mut impl Host, resp: DmodexResp) {
        debug!(id = resp.id, status = resp.status, bytes = resp.data.len(), "direct modex answer");
        if let Some(a) = self.asked.remove(&resp.id) {
            self.reply_with(a.reply, resp.status, resp.data);
        }
        self.maybe_recycle(host);
    }
}
