//! PMIx groups and queries on one daemon (docs/dynamic-mpi.md).
//!
//! - construct: a grpcomm fence over the members' daemons that collects (so it rides the
//!   allgather movement), under `group-construct|<id>|<canonical members>`. Each daemon
//!   contributes one record: its context-id candidate and the endpoint data libpmix gathered
//!   from its local members. Every daemon ends with the same records in participant order, so
//!   every member gets the same context id (the largest candidate) and every member's data.
//! - destruct: a grpcomm barrier over the same daemons, `group-destruct|<id>|<members>`.
//! - query: answered from what every daemon knows (every job's maps): the DVM's running
//!   namespaces, a job's size, no process sets. Anything else: `PMIX_ERR_NOT_SUPPORTED`.
//!
//! Owns: this daemon's context-id counter. Candidates are `counter << 32 | daemon rank`: a
//! daemon never offers the same candidate twice, so the largest of a construct's candidates
//! is unique in the DVM; after each construct the counter moves past the id chosen.
//!
//! Traps (libpmix 4.2.2, checked by tests/mpi/group.c): libpmix keeps a group's record,
//! member list included, from its first construct until a destruct of that id completes, and
//! a construct naming a recorded id reuses the recorded members, even a construct by a later
//! job (so a worker left with a record is replaced when idle). A query reaches the host only
//! when libpmix's own store lacks some key of it, and the upcall does not name the client.

use bytes::{BufMut, Bytes, BytesMut};
use dvm_grpcomm::{FenceError, FenceSignature, Participants};
use dvm_proto::pmixworker as wire;
use dvm_proto::Message;
use tracing::{debug, info, warn};

use super::info::{self, rank_id, view, Shown};
use super::{dynamic::Deferred, fence_status, timeout_ns, FenceParts, Pmix, Waiter};
use crate::pmixdef::{self as def, key, Status, RANK_WILDCARD};
use crate::Input;

/// A group operation this daemon runs, waiting for its fence.
#[derive(Debug)]
pub(super) struct GroupWait {
    construct: bool,
    id: String,
    /// `PMIX_GROUP_ASSIGN_CONTEXT_ID` was asked for (construct only).
    assign: bool,
    /// The members (a member reported dead fails the operation: [`Pmix::member_died`]).
    procs: Vec<wire::Proc>,
    /// The operation's fence (abandoned when a member dies).
    sig: FenceSignature,
    reply: u64,
}

/// One daemon's record in a construct's allgather: `u64 candidate | u32 len | endpoint data`
/// (big-endian). Candidate 0: this daemon was not asked for a context id.
pub fn encode_record(candidate: u64, endpoints: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(12 + endpoints.len());
    b.put_u64(candidate);
    b.put_u32(endpoints.len() as u32);
    b.put_slice(endpoints);
    b.freeze()
}

/// What a construct's allgather output says: the largest candidate and the endpoint data of
/// every daemon, concatenated in participant order (what libpmix unpacks one after another).
/// An error names what is malformed (the bytes come from the network).
pub fn decode_records(mut out: &[u8]) -> Result<(u64, Vec<u8>), String> {
    let (mut best, mut endpoints, mut n) = (0u64, Vec::new(), 0usize);
    while !out.is_empty() {
        if out.len() < 12 {
            return Err(format!("record {n} is truncated ({} bytes left of its 12-byte header)", out.len()));
        }
        let candidate = u64::from_be_bytes(out[..8].try_into().expect("8 bytes"));
        let len = u32::from_be_bytes(out[8..12].try_into().expect("4 bytes")) as usize;
        let Some(data) = out.get(12..12 + len) else {
            return Err(format!("record {n} announces {len} bytes of endpoint data, {} remain", out.len() - 12));
        };
        best = best.max(candidate);
        endpoints.extend_from_slice(data);
        out = &out[12 + len..];
        n += 1;
    }
    Ok((best, endpoints))
}

/// The fence signature text of a group operation: the same on every daemon of the group
/// whatever order libpmix listed the members in.
pub fn group_key(construct: bool, id: &str, procs: &[wire::Proc]) -> String {
    let what = if construct { "group-construct" } else { "group-destruct" };
    crate::pmixops::canonical_key(what, Some(id), &view(procs))
}

impl Pmix {
    /// The group upcall: every local member of a construct or destruct arrived.
    pub(super) fn group(
        &mut self,
        construct: bool,
        id: String,
        procs: Vec<wire::Proc>,
        directives: Vec<wire::Value>,
        reply: u64,
    ) {
        let what = if construct { "construct" } else { "destruct" };
        if construct {
            // libpmix recorded it (with its members) when its first local member arrived.
            self.group_records.insert(id.clone());
        }
        if procs.is_empty() {
            warn!("group {what} of {id:?} on daemon {} refused: it names no member", self.me);
            return self.reply(reply, def::ERR_BAD_PARAM);
        }
        if let Some(st) = info::num(&directives, key::LOCAL_COLLECTIVE_STATUS).filter(|&s| s != 0) {
            warn!("group {what} of {id:?} on node {}: a local member left it (status {st})", self.host);
            return self.reply(reply, Status::try_from(st).unwrap_or(def::ERROR));
        }
        if let Some(p) = self.names_no_job(&procs) {
            let p = Shown(p);
            warn!("group {what} of {id:?} on daemon {} refused: member {p} is of no running job of this DVM", self.me);
            return self.reply(reply, def::ERR_NOT_FOUND);
        }
        if let Some(p) = procs.iter().find(|p| self.is_dead(p)) {
            warn!("group {what} of {id:?} on daemon {} failed: member {} died", self.me, Shown(p));
            return self.reply(reply, def::ERR_PROC_ABORTED);
        }
        if procs.iter().any(|p| !self.known.contains_key(&p.nspace)) {
            debug!(%id, "group {what} naming a job whose maps have not arrived yet: deferred");
            return self.deferred.push(Deferred::Group { construct, id, procs, directives, reply });
        }
        let daemons = match self.daemons_of(&procs) {
            Ok(d) => d,
            Err(e) => {
                warn!("group {what} of {id:?} on daemon {} refused: {e}", self.me);
                return self.reply(reply, def::ERR_NOT_FOUND);
            }
        };
        let sig = FenceSignature::new(group_key(construct, &id, &procs).into_bytes(), Participants::Daemons(daemons));
        // Forgotten with the first local job among the members that ends here.
        let local = procs.iter().find_map(|p| self.job_of(&p.nspace));
        if let Some(job) = local.and_then(|j| self.jobs.get_mut(&j)) {
            job.sigs.insert(sig.clone());
        }
        let assign = construct && info::flag(&directives, key::GROUP_ASSIGN_CONTEXT_ID);
        let (collect, data) = if construct {
            let candidate = if assign {
                self.ctx_counter += 1;
                self.ctx_counter << 32 | u64::from(self.me)
            } else {
                0
            };
            let endpoints = info::find(&directives, key::GROUP_ENDPT_DATA)
                .filter(|v| v.kind == crate::pmixdef::kind::BYTES)
                .map_or(&[][..], |v| &v.bytes[..]);
            (true, encode_record(candidate, endpoints))
        } else {
            (false, Bytes::new())
        };
        let timeout = timeout_ns(info::num(&directives, key::TIMEOUT));
        info!(what, %id, members = procs.len(), assign, "PMIx group {what} -> grpcomm fence");
        let nprocs = procs.len() as u64;
        let wait = GroupWait { construct, id, assign, procs, sig: sig.clone(), reply };
        self.start_fence(Waiter::Group(wait), FenceParts { sig, collect, data, timeout }, nprocs);
    }

    /// A group's fence completed: answer libpmix (a construct with its context id and every
    /// member's endpoint data).
    pub(super) fn group_done(&mut self, wait: GroupWait, result: Result<Bytes, FenceError>) {
        let GroupWait { construct, id, assign, reply, .. } = wait;
        let out = match result {
            Ok(out) => out,
            Err(e) => {
                warn!(
                    "group {} of {id:?} on daemon {} failed: {e}",
                    if construct { "construct" } else { "destruct" },
                    self.me
                );
                return self.reply(reply, fence_status(&e));
            }
        };
        if !construct {
            debug!(%id, "group destructed");
            self.group_records.remove(&id);
            return self.reply(reply, def::SUCCESS);
        }
        let (ctxid, endpoints) = match decode_records(&out) {
            Ok(r) => r,
            Err(e) => {
                warn!("group construct of {id:?} on daemon {}: malformed allgather output: {e}", self.me);
                return self.reply(reply, def::ERROR);
            }
        };
        let mut infos = Vec::new();
        if ctxid != 0 {
            // Later candidates of this daemon exceed every id chosen so far.
            self.ctx_counter = self.ctx_counter.max(ctxid >> 32);
            infos.push(info::size(key::GROUP_CONTEXT_ID, ctxid));
        } else if assign {
            warn!("group construct of {id:?}: a context id was asked for but no daemon offered one");
        }
        if !endpoints.is_empty() {
            infos.push(info::bytes(key::GROUP_ENDPT_DATA, endpoints));
        }
        info!(%id, ctxid, "group constructed");
        self.reply_with(reply, def::SUCCESS, wire::InfoResult { infos }.encode_to_vec());
    }

    /// Whether `p` (a rank, or a whole job) was reported dead by the DVM.
    fn is_dead(&self, p: &wire::Proc) -> bool {
        let dead = self.dead.get(&p.nspace);
        match rank_id(p) {
            Some(r) => dead.is_some_and(|d| d.contains(&r)),
            // A wildcard member: the whole job, so any of its ranks.
            None if p.rank == RANK_WILDCARD => dead.is_some_and(|d| !d.is_empty()),
            None => false,
        }
    }

    /// The DVM reported `proc` dead (`PMIX_ERR_PROC_ABORTED`): every group operation of this
    /// daemon that names it fails now, and any later one at once. libpmix 4.2.2 never tells
    /// the host of a member that dies once it tracks a construct, and the daemon that hosted it
    /// never joins the operation's fence: it would wait for ever. The fence is abandoned, so it
    /// is retired on every daemon that joined it.
    pub(super) fn member_died(&mut self, proc: &wire::Proc) {
        let Some(rank) = rank_id(proc) else { return };
        if !self.known.contains_key(&proc.nspace) {
            return;
        }
        self.dead.entry(proc.nspace.clone()).or_default().insert(rank);
        let names = |p: &wire::Proc| p.nspace == proc.nspace && (p.rank == rank || p.rank == RANK_WILDCARD);
        let failed: Vec<u64> = self
            .fences
            .iter()
            .filter(|(_, w)| matches!(w, Waiter::Group(g) if g.procs.iter().any(names)))
            .map(|(k, _)| *k)
            .collect();
        for key in failed {
            if let Some(Waiter::Group(g)) = self.fences.remove(&key) {
                warn!("group {:?} on daemon {} failed: member {} died", g.id, self.me, Shown(proc));
                self.reply(g.reply, def::ERR_PROC_ABORTED);
                self.ask(Input::AbandonFence(g.sig));
            }
        }
    }

    /// The query upcall: each key answered from what this daemon knows of the DVM's jobs.
    pub(super) fn query(&mut self, queries: Vec<wire::Query>, reply: u64) {
        let mut answers = Vec::new();
        let mut refused: Option<(Status, String)> = None;
        for q in &queries {
            for k in &q.keys {
                match self.answer(k, &q.qualifiers) {
                    Ok(v) => answers.push(v),
                    Err(e) => {
                        debug!(key = %k, "query not answered: {}", e.1);
                        refused.get_or_insert(e);
                    }
                }
            }
        }
        let status = match (&refused, answers.is_empty()) {
            (None, _) => def::SUCCESS,
            (Some(_), false) => def::ERR_PARTIAL_SUCCESS,
            (Some((st, why)), true) => {
                info!("query on daemon {} not answered: {why}", self.me);
                *st
            }
        };
        debug!(answers = answers.len(), status, "query answered");
        self.reply_with(reply, status, wire::InfoResult { infos: answers }.encode_to_vec());
    }

    /// One query key: its value, or the status and the sentence why not.
    fn answer(&self, k: &str, qualifiers: &[wire::Value]) -> Result<wire::Value, (Status, String)> {
        match k {
            // The DVM defines no process sets.
            key::QUERY_NUM_PSETS => Ok(info::size(k, 0)),
            key::QUERY_NAMESPACES => {
                let mut running: Vec<(&u32, &String)> = self.known.iter().map(|(ns, j)| (&j.0, ns)).collect();
                running.sort();
                let list: Vec<&str> = running.into_iter().map(|(_, ns)| ns.as_str()).collect();
                Ok(info::string(k, list.join(",")))
            }
            key::JOB_SIZE => {
                let named = info::find(qualifiers, key::NSPACE).and_then(info::as_str).map(str::to_owned);
                let of_proc = || {
                    info::find(qualifiers, key::PROCID)
                        .filter(|v| v.kind == crate::pmixdef::kind::PROC)
                        .and_then(|v| v.procs.first())
                        .map(|p| p.nspace.clone())
                };
                let Some(nspace) = named.or_else(of_proc) else {
                    return Err((def::ERR_BAD_PARAM, format!("{k} needs a {} qualifier naming the job", key::NSPACE)));
                };
                match self.known.get(&nspace) {
                    Some((_, placement, _)) => Ok(info::u32_value(k, placement.nprocs())),
                    None => Err((def::ERR_NOT_FOUND, format!("{k}: namespace {nspace} is no running job"))),
                }
            }
            _ => Err((def::ERR_NOT_SUPPORTED, format!("query key {k} is not supported"))),
        }
    }
}
