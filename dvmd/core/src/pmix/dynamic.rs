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
//! proc of both jobs listed one by one. libpmix completes a connect without the host when
//! every participant is local and known; otherwise it calls `connect` once all local
//! participants arrived. A participant of an nspace the server does not know makes the
//! operation non-local but never stalls it.

use bytes::Bytes;
use dvm_proto::daemon::{daemon_cmd, DataOp, DataReq, DataResp, JobLog, SpawnReq, SpawnResp};
use dvm_proto::job::{AppContext, MapBy};
use dvm_proto::pmixworker as wire;
use dvm_proto::Message;
use dvm_rml::Rank;
use tracing::{debug, info, warn};

use super::info::{self, rank_id, view, Shown};
use super::{timeout_ns, FenceParts, Pmix, Waiter, PER_DAEMON_VARS};
use crate::host::Host;
use crate::pmixdef::{self as def, key};

/// A request waiting for the maps of a job it names.
#[derive(Debug)]
pub(super) enum Deferred {
    Fence { what: &'static str, procs: Vec<wire::Proc>, collect: bool, data: Bytes, timeout: Option<i64>, reply: u64 },
    Modex { proc: wire::Proc, reply: u64 },
    Group { construct: bool, id: String, procs: Vec<wire::Proc>, directives: Vec<wire::Value>, reply: u64 },
}

impl Deferred {
    pub(super) fn procs(&self) -> &[wire::Proc] {
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
fn is_directive(k: &str) -> bool {
    [key::RANGE, key::PERSISTENCE, key::USERID, key::GRPID, key::TIMEOUT, key::WAIT].contains(&k)
}

impl Pmix {
    /// The daemon hosting `proc` (a concrete rank of any job of the DVM): (job, rank, daemon).
    pub(super) fn host_of_proc(&self, proc: &wire::Proc) -> Option<(u32, u32, Rank)> {
        let (jobid, placement, _) = self.known.get(&proc.nspace)?;
        let rank = rank_id(proc)?;
        Some((*jobid, rank, placement.node_of(rank)?))
    }

    /// The daemons hosting any of `procs` (a wildcard: every daemon of that job); an error
    /// names the first proc of a job this daemon does not know.
    pub(super) fn daemons_of(&self, procs: &[wire::Proc]) -> Result<Vec<Rank>, String> {
        crate::pmixops::daemons_of(&view(procs), |ns| self.known.get(ns).map(|(_, p, _)| p))
    }

    /// A request names a namespace that is no job of this DVM, known or still to come.
    pub(super) fn names_no_job<'a>(&self, procs: &'a [wire::Proc]) -> Option<&'a wire::Proc> {
        procs.iter().find(|p| {
            !self.known.contains_key(&p.nspace) && !crate::pmixops::may_still_come(&p.nspace, self.highest_learned)
        })
    }

    /// A collective over procs of several jobs (connect, disconnect, a fence across jobs): a
    /// grpcomm barrier (or modex) over their daemons under `what` + the canonical set.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn union_fence(
        &mut self,
        host: &mut impl Host,
        what: &'static str,
        procs: &[wire::Proc],
        collect: bool,
        data: Bytes,
        timeout: Option<i64>,
        reply: u64,
    ) {
        if let Some(p) = self.names_no_job(procs) {
            // A client may name any nspace: one that is no job still to come fails now.
            warn!(
                "{what} on daemon {} refused: it names namespace {}, which is no running job of this DVM",
                self.me, p.nspace
            );
            return self.reply(reply, def::ERR_NOT_FOUND);
        }
        if procs.iter().any(|p| !self.known.contains_key(&p.nspace)) {
            // A job of this DVM whose maps have not come yet (a spawn's answer can overtake
            // its child's maps broadcast): they come, in job order, before its cleanup.
            debug!(what, "{what} naming a job whose maps have not arrived yet: deferred");
            let procs = procs.to_vec();
            return self.deferred.push(Deferred::Fence { what, procs, collect, data, timeout, reply });
        }
        let daemons = match self.daemons_of(procs) {
            Ok(d) => d,
            Err(e) => {
                warn!("{what} on daemon {} refused: {e}", self.me);
                return self.reply(reply, def::ERR_NOT_FOUND);
            }
        };
        self.register_foreign(host, procs);
        let sig = crate::pmixops::union_fence(what, None, &view(procs), daemons);
        // Forgotten with the first local job among the participants that ends here.
        let local = procs.iter().find_map(|p| self.by_nspace.get(&p.nspace).copied());
        if let Some(job) = local.and_then(|j| self.jobs.get_mut(&j)) {
            job.sigs.insert(sig.clone());
        }
        let parts = FenceParts { sig, collect, data, timeout: timeout_ns(timeout) };
        let key = self.start_fence(Waiter::Upcall(reply), parts, procs.len() as u64);
        if what == "connect" {
            let mut jobids: Vec<u32> = procs.iter().filter_map(|p| self.known.get(&p.nspace).map(|k| k.0)).collect();
            jobids.sort_unstable();
            jobids.dedup();
            self.connects.insert(key, jobids);
        }
        info!(what, procs = procs.len(), key, "PMIx {what} -> grpcomm barrier over the participants' daemons");
    }

    /// Tell the requesting job's prun why a dynamic request failed (one sentence).
    fn say(&mut self, proc: &wire::Proc, text: String) {
        warn!("{text}");
        if let (Some(jobid), Some(rank)) = (self.job_of(&proc.nspace), rank_id(proc)) {
            self.send_cmd(0, daemon_cmd::Body::JobLog(JobLog { jobid, rank, text, daemon: self.me }));
        }
    }

    /// PMIx_Spawn from a local rank: asked of the HNP.
    pub(super) fn spawn(&mut self, proc: wire::Proc, spawn: wire::Spawn, reply: u64) {
        let (Some(jobid), Some(rank)) = (self.job_of(&proc.nspace), rank_id(&proc)) else {
            return self.reply(reply, def::ERR_NOT_FOUND);
        };
        let mut mapping = SpawnMapping { map_by: MapBy::Slot, ppr: 0, oversubscribe: false };
        let mut apps = Vec::new();
        let mut refuse = None;
        for (i, a) in spawn.apps.iter().enumerate() {
            // Open MPI puts map_by among the job's directives; an app's own wins.
            let map_by = info::find(&a.info, key::MAPBY).or_else(|| info::find(&spawn.job_info, key::MAPBY));
            if let Some(m) = map_by.and_then(info::as_str) {
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
            let wdir =
                info::find(&a.info, key::WDIR).and_then(info::as_str).map_or_else(|| a.cwd.clone(), str::to_owned);
            let env = a
                .env
                .iter()
                .filter(|kv| !PER_DAEMON_VARS.iter().any(|v| kv.split_once('=').is_some_and(|(k, _)| k == *v)))
                .cloned()
                .collect();
            apps.push(AppContext { argv, np: a.maxprocs.max(0) as u32, env, wdir, preload_binary: false });
        }
        if apps.is_empty() {
            refuse = Some("no application".into());
        }
        if let Some(why) = refuse {
            self.say(&proc, format!("spawn by rank {rank} of job {jobid} refused: {why}"));
            return self.reply(reply, def::ERR_BAD_PARAM);
        }
        let id = self.next_id();
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
            ..Default::default()
        };
        self.send_cmd(0, daemon_cmd::Body::SpawnReq(req));
    }

    /// The HNP's answer to a spawn this daemon asked for.
    pub(super) fn on_spawn_resp(&mut self, host: &mut impl Host, resp: SpawnResp) {
        let Some(reply) = self.spawns.remove(&resp.id) else { return };
        if resp.status == def::SUCCESS {
            debug!(nspace = %resp.nspace, "spawn done");
            self.reply_with(reply, def::SUCCESS, resp.nspace.into_bytes());
        } else {
            warn!(status = resp.status, "spawn failed: {}", resp.error);
            self.reply(reply, resp.status);
        }
        self.maybe_recycle(host);
    }

    /// PMIx_Publish / PMIx_Lookup / PMIx_Unpublish from a local rank: asked of the HNP.
    pub(super) fn data_request(
        &mut self,
        op: DataOp,
        proc: wire::Proc,
        keys: Vec<String>,
        infos: Vec<wire::Value>,
        reply: u64,
    ) {
        let Some(jobid) = self.job_of(&proc.nspace) else { return self.reply(reply, def::ERR_NOT_FOUND) };
        let num = |k: &str| info::num(&infos, k);
        let range = num(key::RANGE).unwrap_or(0).clamp(0, 255) as u32;
        let persistence = num(key::PERSISTENCE).unwrap_or(0).clamp(0, 255) as u32;
        let wait = info::flag(&infos, key::WAIT);
        let timeout_s = num(key::TIMEOUT).unwrap_or(0).clamp(0, u32::MAX as i64) as u32;
        let mut values = Vec::new();
        if op == DataOp::DataPublish {
            for v in infos.into_iter().filter(|v| !is_directive(&v.key)) {
                if v.kind == 0 || v.kind > crate::pmixdef::kind::PROCS {
                    let text =
                        format!("publish of key {:?} by {} refused: its value has no wire form", v.key, Shown(&proc));
                    self.say(&proc, text);
                    return self.reply(reply, def::ERR_BAD_PARAM);
                }
                values.push(v);
            }
        }
        let id = self.next_id();
        self.data.insert(id, (op, reply));
        let req =
            DataReq { id, op: op as i32, jobid, proc: Some(proc), values, keys, range, persistence, wait, timeout_s };
        debug!(?op, jobid, "data server request");
        self.send_cmd(0, daemon_cmd::Body::DataReq(req));
    }

    /// The data server's answer.
    pub(super) fn on_data_resp(&mut self, host: &mut impl Host, resp: DataResp) {
        let Some((op, reply)) = self.data.remove(&resp.id) else { return };
        if op == DataOp::DataLookup && resp.status == def::SUCCESS {
            let result = wire::LookupResult { found: resp.found };
            self.reply_with(reply, resp.status, result.encode_to_vec());
        } else {
            self.reply(reply, resp.status);
        }
        self.maybe_recycle(host);
    }
}
