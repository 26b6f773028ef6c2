//! Dynamic processes on one daemon: the spawn, connect/disconnect and publish/lookup/unpublish
//! upcalls (docs/dynamic-mpi.md). A spawn and the data server's requests go to the HNP, which
//! owns jobs and the published data; connect and disconnect are grpcomm barriers over the
//! union of the participants' daemons, under a signature of their own.
//!
//! Owns: the table of every job of the DVM (`known`: each daemon receives every job's maps,
//! whether or not it hosts procs of it), so a participant or a direct modex target in another
//! job's namespace is found without asking anyone. Never: decides where a spawned job runs or
//! what a lookup finds (the HNP's).
//!
//! Traps (libpmix 4.2.2, Open MPI 4.1): MPI_Comm_spawn is a spawn, then a publish + a waiting
//! lookup by each side's root (`<port>:connect` / `<port>:accept`), then a connect over every
//! proc of both jobs listed one by one; the child finds the port in `OMPI_PARENT_PORT` of the
//! app's environment. libpmix completes a connect without the host when every participant is
//! local and known; otherwise it calls `connect` once all local participants arrived. A
//! participant of an nspace the server does not know makes the operation non-local but never
//! stalls it.

use std::collections::BTreeSet;

use bytes::Bytes;
use dvm_core::Input as CoreInput;
use dvm_grpcomm::FenceRequest as GFence;
use dvm_proto::daemon::{daemon_cmd, DataOp, DataReq, DataResp, JobLog, SpawnReq, SpawnResp};
use dvm_proto::job::{AppContext, MapBy};
use dvm_proto::pmixworker as wire;
use dvm_proto::Message;
use dvm_rml::Rank;
use pmix_shim::{find_info, key_str, sys, Info, InfoValue, ProcId};
use tracing::{debug, info, warn};

use super::link::WorkerReplyHandle;
use super::{proc_rank, PmixHost};
use crate::jobmap::Placement;

/// A request waiting for the maps of a job it names.
pub(crate) enum Deferred {
    Fence {
        what: &'static str,
        procs: Vec<ProcId>,
        collect: bool,
        data: Bytes,
        timeout: Option<i32>,
        reply: WorkerReplyHandle,
    },
    Modex {
        proc: ProcId,
        reply: WorkerReplyHandle,
    },
    Group {
        op: pmix_shim::GroupOp,
        id: String,
        procs: Vec<ProcId>,
        directives: Vec<Info>,
        reply: WorkerReplyHandle,
    },
}

impl Deferred {
    fn procs(&self) -> &[ProcId] {
        match self {
            Deferred::Fence { procs, .. } | Deferred::Group { procs, .. } => procs,
            Deferred::Modex { proc, .. } => std::slice::from_ref(proc),
        }
    }
}

/// How a spawn asks to be mapped: Open MPI's `map_by` info key (`PMIX_MAPBY`), e.g. `node`,
/// `slot:oversubscribe`, `ppr:2:node`. Unknown policies are refused by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnMapping {
    pub map_by: MapBy,
    pub ppr: u32,
    pub oversubscribe: bool,
}

/// Parse `PMIX_MAPBY`'s value.
pub fn parse_map_by(s: &str) -> Result<SpawnMapping, String> {
    let mut parts = s.split(':');
    let policy = parts.next().unwrap_or_default().to_ascii_lowercase();
    let mut m = SpawnMapping { map_by: MapBy::Slot, ppr: 0, oversubscribe: false };
    match policy.as_str() {
        "" | "slot" | "core" => {}
        "node" => m.map_by = MapBy::Node,
        "ppr" => {
            let n = parts.next().and_then(|n| n.parse::<u32>().ok()).filter(|&n| n > 0);
            let obj = parts.next().map(str::to_ascii_lowercase);
            match (n, obj.as_deref()) {
                (Some(n), Some("node")) => (m.map_by, m.ppr) = (MapBy::Ppr, n),
                _ => return Err(format!("map_by {s:?}: only ppr:N:node is supported")),
            }
        }
        other => return Err(format!("map_by {s:?}: unknown policy {other:?} (slot, node or ppr:N:node)")),
    }
    for modifier in parts {
        match modifier.to_ascii_lowercase().as_str() {
            "oversubscribe" => m.oversubscribe = true,
            "nooversubscribe" => m.oversubscribe = false,
            "" => {}
            other => return Err(format!("map_by {s:?}: unknown modifier {other:?}")),
        }
    }
    Ok(m)
}

/// The keys libpmix or Open MPI add to a publish or lookup as directives, never as data.
fn is_directive(key: &str) -> bool {
    let directives: [&'static [u8]; 6] =
        [sys::PMIX_RANGE, sys::PMIX_PERSISTENCE, sys::PMIX_USERID, sys::PMIX_GRPID, sys::PMIX_TIMEOUT, sys::PMIX_WAIT];
    directives.iter().any(|k| key_str(k) == key)
}

impl PmixHost {
    /// Every daemon learns every job's placement (and its daemons' hosts, in placement order)
    /// from its maps broadcast.
    pub(crate) fn learn_job(&mut self, jobid: u32, nspace: String, placement: Placement, hosts: Vec<String>) {
        self.known.insert(nspace, (jobid, placement, hosts));
        self.highest_learned = self.highest_learned.max(Some(jobid));
        let waiting = std::mem::take(&mut self.deferred);
        for d in waiting {
            if d.procs().iter().any(|p| !self.known.contains_key(&p.nspace)) {
                self.deferred.push(d);
                continue;
            }
            match d {
                Deferred::Fence { what, procs, collect, data, timeout, reply } => {
                    self.union_fence(what, &procs, collect, data, timeout, reply)
                }
                Deferred::Modex { proc, reply } => self.direct_modex(proc, reply),
                Deferred::Group { op, id, procs, directives, reply } => self.group(op, id, procs, directives, reply),
            }
        }
    }

    /// A job's cleanup reached this daemon: a namespace registered for it without local procs
    /// is deregistered.
    pub(crate) fn forget_job(&mut self, jobid: u32) {
        self.reported_connects.retain(|jobs| !jobs.contains(&jobid));
        let gone: Vec<String> = self.known.iter().filter(|(_, k)| k.0 == jobid).map(|(n, _)| n.clone()).collect();
        for nspace in gone {
            self.known.remove(&nspace);
            self.dead.remove(&nspace);
            if self.foreign.remove(&nspace) {
                if let Some(w) = self.worker.as_ref() {
                    if let Err(e) = w.deregister_nspace_nb(&nspace) {
                        warn!(%nspace, "deregister_nspace: {e}");
                    }
                }
            }
        }
    }

    /// Register with this daemon's server the namespaces of `procs` it does not host
    /// (with no local procs). libpmix 4.2.2 answers a client's request for a proc of an
    /// nspace it never registered by asking the host, but a direct-modex answer stored for
    /// such an nspace never releases the waiting clients: registered, it does.
    pub(crate) fn register_foreign(&mut self, procs: &[ProcId]) {
        let wanted: BTreeSet<&str> = procs
            .iter()
            .map(|p| p.nspace.as_str())
            .filter(|ns| !self.by_nspace.contains_key(*ns) && !self.foreign.contains(*ns))
            .collect();
        for nspace in wanted {
            let Some((jobid, placement, hosts)) = self.known.get(nspace) else { continue };
            let Some(w) = self.worker.as_ref() else { return };
            let info = super::job_info(nspace, placement, hosts, placement.nprocs());
            match w.register_nspace(nspace, 0, &info, &[]) {
                Ok(()) => {
                    debug!(jobid, nspace, "namespace of another daemon's job registered");
                    self.foreign.insert(nspace.to_owned());
                }
                Err(e) => warn!(jobid, nspace, "cannot register the namespace of job {jobid}: {e}"),
            }
        }
    }

    /// The daemon hosting `proc` (a concrete rank of any job of the DVM).
    pub(crate) fn host_of_proc(&self, proc: &ProcId) -> Option<(u32, u32, Rank)> {
        let (jobid, placement, _) = self.known.get(&proc.nspace)?;
        let rank = proc_rank(proc)?;
        Some((*jobid, rank, placement.node_of(rank)?))
    }

    /// The daemons hosting any of `procs` (a wildcard: every daemon of that job); an error
    /// names the first proc of a job this daemon does not know.
    pub(crate) fn daemons_of(&self, procs: &[ProcId]) -> Result<Vec<Rank>, String> {
        dvm_core::pmixops::daemons_of(&super::procs_view(procs), |ns| self.known.get(ns).map(|(_, p, _)| p))
    }

    /// A collective over procs of several jobs (connect, disconnect, a fence across jobs): a
    /// grpcomm barrier (or modex) over their daemons under `prefix` + the canonical set.
    pub(crate) fn union_fence(
        &mut self,
        what: &'static str,
        procs: &[ProcId],
        collect: bool,
        data: Bytes,
        timeout: Option<i32>,
        reply: WorkerReplyHandle,
    ) {
        if let Some(p) = procs.iter().find(|p| {
            !self.known.contains_key(&p.nspace) && !dvm_core::pmixops::may_still_come(&p.nspace, self.highest_learned)
        }) {
            // A client may name any nspace: one that is no job still to come fails now.
            warn!(
                "{what} on daemon {} refused: it names namespace {}, which is no running job of this DVM",
                self.me, p.nspace
            );
            reply.complete(pmix_shim::ERR_NOT_FOUND);
            return;
        }
        if procs.iter().any(|p| !self.known.contains_key(&p.nspace)) {
            // A job of this DVM whose maps have not come yet (a spawn's answer can overtake
            // its child's maps broadcast): they come, in job order, before its cleanup.
            debug!(what, "{what} naming a job whose maps have not arrived yet: deferred");
            let procs = procs.to_vec();
            self.deferred.push(Deferred::Fence { what, procs, collect, data, timeout, reply });
            return;
        }
        let daemons = match self.daemons_of(procs) {
            Ok(d) => d,
            Err(e) => {
                warn!("{what} on daemon {} refused: {e}", self.me);
                reply.complete(pmix_shim::ERR_NOT_FOUND);
                return;
            }
        };
        self.register_foreign(procs);
        let sig = dvm_core::pmixops::union_fence(what, None, &super::procs_view(procs), daemons.clone());
        // Forgotten with the first local job among the participants that ends here.
        let local: Vec<u32> = procs.iter().filter_map(|p| self.by_nspace.get(&p.nspace).copied()).collect();
        if let Some(job) = local.first().and_then(|j| self.jobs.get_mut(j)) {
            job.sigs.insert(sig.clone());
        }
        let key = self.next_id;
        self.next_id += 1;
        self.fences.insert(key, super::FenceWaiter::Upcall(reply));
        if what == "connect" {
            let mut jobids: Vec<u32> = procs.iter().filter_map(|p| self.known.get(&p.nspace).map(|k| k.0)).collect();
            jobids.sort_unstable();
            jobids.dedup();
            self.connects.insert(key, jobids);
        }
        info!(what, procs = procs.len(), key, "PMIx {what} -> grpcomm barrier over the participants' daemons");
        let timeout = timeout.filter(|&t| t > 0).map(|t| t as u64 * 1_000_000_000);
        let size_hint = collect.then(|| procs.len() as u64 * super::MODEX_BYTES_PER_PROC);
        let fence = GFence { sig, collect, data, timeout, size_hint };
        self.out.push(CoreInput::Fence { owner: dvm_core::FenceOwner::Pmix(key), req: fence });
    }

    /// Tell the requesting job's prun why a dynamic request failed (one sentence).
    fn say(&mut self, proc: &ProcId, text: String) {
        warn!("{text}");
        if let (Some(&jobid), Some(rank)) = (self.by_nspace.get(&proc.nspace), proc_rank(proc)) {
            self.send_cmd(0, daemon_cmd::Body::JobLog(JobLog { jobid, rank, text, daemon: self.me }));
        }
    }

    /// PMIx_Spawn from a local rank: asked of the HNP.
    pub(crate) fn spawn(&mut self, proc: ProcId, spawn: wire::Spawn, reply: WorkerReplyHandle) {
        let (Some(&jobid), Some(rank)) = (self.by_nspace.get(&proc.nspace), proc_rank(&proc)) else {
            reply.complete(pmix_shim::ERR_NOT_FOUND);
            return;
        };
        let job_info = super::value::infos_from_wire(&spawn.job_info);
        let mut mapping = SpawnMapping { map_by: MapBy::Slot, ppr: 0, oversubscribe: false };
        let mut apps = Vec::new();
        let mut refuse = None;
        for (i, a) in spawn.apps.iter().enumerate() {
            let info = super::value::infos_from_wire(&a.info);
            // Open MPI puts map_by among the job's directives; an app's own wins.
            let map_by = find_info(&info, sys::PMIX_MAPBY).or_else(|| find_info(&job_info, sys::PMIX_MAPBY));
            if let Some(InfoValue::String(m)) = map_by {
                match parse_map_by(m) {
                    Ok(m) => mapping = m,
                    Err(e) => refuse = Some(e),
                }
            }
            if a.maxprocs <= 0 {
                refuse = Some(format!("app {i} ({}) asks for {} procs", a.cmd, a.maxprocs));
            }
            let mut argv = a.argv.clone();
            match argv.first_mut() {
                Some(first) if !a.cmd.is_empty() => *first = a.cmd.clone(),
                None if !a.cmd.is_empty() => argv.push(a.cmd.clone()),
                _ => {}
            }
            if argv.is_empty() {
                refuse = Some(format!("app {i} names no executable"));
            }
            let wdir = match find_info(&info, sys::PMIX_WDIR) {
                Some(InfoValue::String(w)) => w.clone(),
                _ => a.cwd.clone(),
            };
            let env = a
                .env
                .iter()
                .filter(|kv| !super::PER_DAEMON_VARS.iter().any(|v| kv.split_once('=').is_some_and(|(k, _)| k == *v)))
                .cloned()
                .collect();
            apps.push(AppContext { argv, np: a.maxprocs.max(0) as u32, env, wdir, preload_binary: false });
        }
        if apps.is_empty() {
            refuse = Some("no application".into());
        }
        if let Some(why) = refuse {
            self.say(&proc, format!("spawn by rank {rank} of job {jobid} refused: {why}"));
            reply.complete(pmix_shim::ERR_BAD_PARAM);
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.spawns.insert(id, reply);
        info!(jobid, rank, apps = apps.len(), "spawn asked of the HNP");
        let req = SpawnReq {
            id,
            jobid,
            rank,
            apps,
            map_by: mapping.map_by as i32,
            oversubscribe: mapping.oversubscribe,
            ppr: mapping.ppr,
        };
        self.send_cmd(0, daemon_cmd::Body::SpawnReq(req));
    }

    /// The HNP's answer to a spawn this daemon asked for.
    pub(crate) fn on_spawn_resp(&mut self, resp: SpawnResp) {
        let Some(reply) = self.spawns.remove(&resp.id) else { return };
        if resp.status == pmix_shim::SUCCESS {
            debug!(nspace = %resp.nspace, "spawn done");
            reply.complete_with(pmix_shim::SUCCESS, resp.nspace.into_bytes());
        } else {
            warn!(status = resp.status, "spawn failed: {}", resp.error);
            reply.complete(resp.status);
        }
        self.maybe_recycle();
    }

    /// PMIx_Publish / PMIx_Lookup / PMIx_Unpublish from a local rank: asked of the HNP.
    pub(crate) fn data_request(
        &mut self,
        op: DataOp,
        proc: ProcId,
        keys: Vec<String>,
        info: Vec<Info>,
        reply: WorkerReplyHandle,
    ) {
        let Some(&jobid) = self.by_nspace.get(&proc.nspace) else {
            reply.complete(pmix_shim::ERR_NOT_FOUND);
            return;
        };
        let num = |k: &'static [u8]| find_info(&info, k).and_then(|v| v.as_i64());
        let range = num(sys::PMIX_RANGE).unwrap_or(0).clamp(0, 255) as u32;
        let persistence = num(sys::PMIX_PERSISTENCE).unwrap_or(0).clamp(0, 255) as u32;
        let wait = match find_info(&info, sys::PMIX_WAIT) {
            Some(InfoValue::Bool(b)) => *b,
            Some(v) => v.as_i64().is_some_and(|n| n != 0),
            None => false,
        };
        let timeout_s = num(sys::PMIX_TIMEOUT).unwrap_or(0).clamp(0, u32::MAX as i64) as u32;
        let mut values = Vec::new();
        if op == DataOp::DataPublish {
            for i in info.iter().filter(|i| !is_directive(&i.key)) {
                match super::value::to_wire(i) {
                    Some(v) => values.push(v),
                    None => {
                        let text = format!("publish of key {:?} by {proc} refused: its value has no wire form", i.key);
                        self.say(&proc, text);
                        reply.complete(pmix_shim::ERR_BAD_PARAM);
                        return;
                    }
                }
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.data.insert(id, (op, reply));
        let wproc = wire::Proc { nspace: proc.nspace.clone(), rank: proc.rank.to_raw() };
        let req =
            DataReq { id, op: op as i32, jobid, proc: Some(wproc), values, keys, range, persistence, wait, timeout_s };
        debug!(?op, jobid, "data server request");
        self.send_cmd(0, daemon_cmd::Body::DataReq(req));
    }

    /// The data server's answer.
    pub(crate) fn on_data_resp(&mut self, resp: DataResp) {
        let Some((op, reply)) = self.data.remove(&resp.id) else { return };
        if op == DataOp::DataLookup && resp.status == pmix_shim::SUCCESS {
            let result = wire::LookupResult { found: resp.found };
            reply.complete_with(resp.status, result.encode_to_vec());
        } else {
            reply.complete(resp.status);
        }
        self.maybe_recycle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_by_values() {
        let m = parse_map_by("node:OVERSUBSCRIBE").unwrap();
        assert_eq!((m.map_by, m.oversubscribe), (MapBy::Node, true));
        let m = parse_map_by("ppr:2:node").unwrap();
        assert_eq!((m.map_by, m.ppr, m.oversubscribe), (MapBy::Ppr, 2, false));
        assert_eq!(parse_map_by("slot").unwrap().map_by, MapBy::Slot);
        assert!(parse_map_by("socket").unwrap_err().contains("unknown policy"));
        assert!(parse_map_by("ppr:0:node").is_err());
        assert!(parse_map_by("node:pe=2").unwrap_err().contains("modifier"));
    }
}
