//! PMIx groups and queries on one daemon (docs/dynamic-mpi.md).
//!
//! - `group` construct: a grpcomm fence over the members' daemons that collects (so it rides
//!   the allgather movement), under the signature `group-construct|<id>|<canonical members>`
//!   with its own sequence. Each daemon contributes one record: its context-id candidate and
//!   the endpoint data libpmix gathered from its local members. Every daemon ends with the
//!   same records in participant order, so every member gets the same context id (the largest
//!   candidate) and every member's endpoint data.
//! - `group` destruct: a grpcomm barrier over the same daemons, signature
//!   `group-destruct|<id>|<canonical members>`.
//! - `query`: answered from what every daemon knows (every job's maps): the DVM's running
//!   namespaces, a job's size, no process sets. Anything else: `PMIX_ERR_NOT_SUPPORTED`.
//!
//! Owns: this daemon's context-id counter. Candidates are `counter << 32 | daemon rank`: a
//! daemon never offers the same candidate twice, so the largest of a construct's candidates
//! is unique in the DVM; after each construct the counter moves past the id chosen, so ids
//! grow over time everywhere.
//!
//! Traps (libpmix 4.2.2, read in its server and checked by tests/mpi/group.c): libpmix keeps a
//! group's record, member list included, from its first construct until a destruct of that
//! id completes, and a construct naming a recorded id reuses the recorded members (the
//! members the client passes are dropped) — even a construct by a later job, which then waits
//! for the earlier job's members (so a worker left with a record is replaced when idle); it answers a construct without the host only when
//! every member is local and no context id is asked for. A query reaches the host only when
//! libpmix's own store lacks some key of it (the job-level keys of any namespace registered
//! with this server are answered there), and the upcall does not name the asking client.

use bytes::{BufMut, Bytes, BytesMut};
use dvm_core::Input as CoreInput;
use dvm_grpcomm::{FenceRequest as GFence, FenceSignature, Participants};
use pmix_shim::{find_info, key_str, sys, GroupOp, Info, InfoValue, ProcId, Query};
use tracing::{debug, info, warn};

use super::dynamic::Deferred;
use super::link::WorkerReplyHandle;
use super::{FenceWaiter, PmixHost};
use dvm_core::pmixops::may_still_come;

/// A group operation this daemon runs, waiting for its fence.
#[derive(Debug)]
pub(crate) struct GroupWait {
    pub op: GroupOp,
    pub id: String,
    /// `PMIX_GROUP_ASSIGN_CONTEXT_ID` was asked for (construct only).
    pub assign: bool,
    /// The members (a member reported dead fails the operation: [`PmixHost::member_died`]).
    pub procs: Vec<ProcId>,
    /// The operation's fence (abandoned when a member dies).
    pub sig: FenceSignature,
    pub reply: WorkerReplyHandle,
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

/// The fence signature of a group operation: the same text on every daemon of the group
/// whatever order libpmix listed the members in.
pub fn group_key(op: GroupOp, id: &str, procs: &[ProcId]) -> String {
    let what = match op {
        GroupOp::Construct => "group-construct",
        GroupOp::Destruct => "group-destruct",
    };
    dvm_core::pmixops::canonical_key(what, Some(id), &super::procs_view(procs))
}

fn flag(info: &[Info], key: &'static [u8]) -> bool {
    match find_info(info, key) {
        Some(InfoValue::Bool(b)) => *b,
        Some(v) => v.as_i64().is_some_and(|n| n != 0),
        None => false,
    }
}

impl PmixHost {
    /// The group upcall: every local member of a construct or destruct arrived.
    pub(crate) fn group(
        &mut self,
        op: GroupOp,
        id: String,
        procs: Vec<ProcId>,
        directives: Vec<Info>,
        reply: WorkerReplyHandle,
    ) {
        let what = if op == GroupOp::Construct { "construct" } else { "destruct" };
        if op == GroupOp::Construct {
            // libpmix recorded it (with its members) when its first local member arrived.
            self.group_records.insert(id.clone());
        }
        if procs.is_empty() {
            warn!("group {what} of {id:?} on daemon {} refused: it names no member", self.me);
            reply.complete(pmix_shim::ERR_BAD_PARAM);
            return;
        }
        if let Some(st) = find_info(&directives, sys::PMIX_LOCAL_COLLECTIVE_STATUS)
            .and_then(InfoValue::as_i64)
            .filter(|&s| s != i64::from(pmix_shim::SUCCESS))
        {
            warn!("group {what} of {id:?} on node {}: a local member left it (status {st})", self.host);
            reply.complete(st as pmix_shim::Status);
            return;
        }
        if let Some(p) = procs
            .iter()
            .find(|p| !self.known.contains_key(&p.nspace) && !may_still_come(&p.nspace, self.highest_learned))
        {
            warn!("group {what} of {id:?} on daemon {} refused: member {p} is of no running job of this DVM", self.me);
            reply.complete(pmix_shim::ERR_NOT_FOUND);
            return;
        }
        if let Some(p) = procs.iter().find(|p| self.is_dead(p)) {
            warn!("group {what} of {id:?} on daemon {} failed: member {p} died", self.me);
            reply.complete(pmix_shim::ERR_PROC_ABORTED);
            return;
        }
        if procs.iter().any(|p| !self.known.contains_key(&p.nspace)) {
            debug!(%id, "group {what} naming a job whose maps have not arrived yet: deferred");
            self.deferred.push(Deferred::Group { op, id, procs, directives, reply });
            return;
        }
        let daemons = match self.daemons_of(&procs) {
            Ok(d) => d,
            Err(e) => {
                warn!("group {what} of {id:?} on daemon {} refused: {e}", self.me);
                reply.complete(pmix_shim::ERR_NOT_FOUND);
                return;
            }
        };
        let key = group_key(op, &id, &procs);
        let sig = FenceSignature::new(key.into_bytes(), Participants::Daemons(daemons));
        // Forgotten with the first local job among the members that ends here.
        let local = procs.iter().find_map(|p| self.by_nspace.get(&p.nspace).copied());
        if let Some(job) = local.and_then(|j| self.jobs.get_mut(&j)) {
            job.sigs.insert(sig.clone());
        }
        let assign = op == GroupOp::Construct && flag(&directives, sys::PMIX_GROUP_ASSIGN_CONTEXT_ID);
        let (collect, data) = match op {
            GroupOp::Construct => {
                let candidate = if assign {
                    self.ctx_counter += 1;
                    self.ctx_counter << 32 | u64::from(self.me)
                } else {
                    0
                };
                let endpoints = match find_info(&directives, sys::PMIX_GROUP_ENDPT_DATA) {
                    Some(InfoValue::Bytes(b)) => b.as_slice(),
                    _ => &[],
                };
                (true, encode_record(candidate, endpoints))
            }
            GroupOp::Destruct => (false, Bytes::new()),
        };
        let timeout = find_info(&directives, sys::PMIX_TIMEOUT)
            .and_then(InfoValue::as_i64)
            .filter(|&t| t > 0)
            .map(|t| t as u64 * 1_000_000_000);
        let fkey = self.next_id;
        self.next_id += 1;
        info!(what, %id, members = procs.len(), assign, key = fkey, "PMIx group {what} -> grpcomm fence");
        let size_hint = collect.then(|| procs.len() as u64 * super::MODEX_BYTES_PER_PROC);
        self.fences.insert(fkey, FenceWaiter::Group(GroupWait { op, id, assign, procs, sig: sig.clone(), reply }));
        let fence = GFence { sig, collect, data, timeout, size_hint };
        self.out.push(CoreInput::Fence { owner: dvm_core::FenceOwner::Pmix(fkey), req: fence });
    }

    /// A group's fence completed: answer libpmix (a construct with its context id and every
    /// member's endpoint data).
    pub(crate) fn group_done(&mut self, wait: GroupWait, result: Result<Bytes, dvm_grpcomm::FenceError>) {
        let GroupWait { op, id, assign, reply, .. } = wait;
        let out = match result {
            Ok(out) => out,
            Err(e) => {
                warn!("group {op:?} of {id:?} on daemon {} failed: {e}", self.me);
                reply.complete(super::fence_status(&e));
                return;
            }
        };
        if op == GroupOp::Destruct {
            debug!(%id, "group destructed");
            self.group_records.remove(&id);
            reply.complete(pmix_shim::SUCCESS);
            return;
        }
        let (ctxid, endpoints) = match decode_records(&out) {
            Ok(r) => r,
            Err(e) => {
                warn!("group construct of {id:?} on daemon {}: malformed allgather output: {e}", self.me);
                reply.complete(pmix_shim::ERROR);
                return;
            }
        };
        let mut infos = Vec::new();
        if ctxid != 0 {
            // Later candidates of this daemon exceed every id chosen so far.
            self.ctx_counter = self.ctx_counter.max(ctxid >> 32);
            infos.push(Info::new(key_str(sys::PMIX_GROUP_CONTEXT_ID), InfoValue::Size(ctxid as usize)));
        } else if assign {
            warn!("group construct of {id:?}: a context id was asked for but no daemon offered one");
        }
        if !endpoints.is_empty() {
            infos.push(Info::new(key_str(sys::PMIX_GROUP_ENDPT_DATA), InfoValue::Bytes(endpoints)));
        }
        info!(%id, ctxid, "group constructed");
        reply.complete_with_info(pmix_shim::SUCCESS, &infos);
    }

    /// Whether `p` (a concrete rank) was reported dead by the DVM.
    fn is_dead(&self, p: &ProcId) -> bool {
        match p.rank {
            pmix_shim::Rank::Id(r) => self.dead.get(&p.nspace).is_some_and(|d| d.contains(&r)),
            // A wildcard member: the whole job, so any of its ranks.
            pmix_shim::Rank::Wildcard => self.dead.get(&p.nspace).is_some_and(|d| !d.is_empty()),
            pmix_shim::Rank::Special(_) => false,
        }
    }

    /// The DVM reported `proc` dead (its `PMIX_ERR_PROC_ABORTED`): every group operation of
    /// this daemon that names it fails now, and any later one at once. libpmix 4.2.2 never
    /// tells the host of a member that dies once it tracks a construct, and the daemon that
    /// hosted it never joins the operation's fence: it would wait for ever. The fence is
    /// abandoned, so it is retired on every daemon that joined it (members on the dead one's
    /// own daemon stay blocked in libpmix: docs/dynamic-mpi.md).
    pub(crate) fn member_died(&mut self, proc: ProcId) {
        let pmix_shim::Rank::Id(rank) = proc.rank else { return };
        if !self.known.contains_key(&proc.nspace) {
            return;
        }
        self.dead.entry(proc.nspace.clone()).or_default().insert(rank);
        let failed: Vec<u64> =
            self.fences
                .iter()
                .filter(|(_, w)| match w {
                    FenceWaiter::Group(g) => g.procs.iter().any(|p| {
                        p.nspace == proc.nspace && (p.rank == proc.rank || p.rank == pmix_shim::Rank::Wildcard)
                    }),
                    FenceWaiter::Upcall(_) => false,
                })
                .map(|(k, _)| *k)
                .collect();
        for key in failed {
            if let Some(FenceWaiter::Group(g)) = self.fences.remove(&key) {
                warn!("group {:?} of {:?} on daemon {} failed: member {proc} died", g.op, g.id, self.me);
                g.reply.complete(pmix_shim::ERR_PROC_ABORTED);
                self.out.push(CoreInput::AbandonFence(g.sig));
            }
        }
    }

    /// The query upcall: each key answered from what this daemon knows of the DVM's jobs.
    pub(crate) fn query(&mut self, queries: Vec<Query>, reply: WorkerReplyHandle) {
        let mut answers = Vec::new();
        let mut refused: Option<(pmix_shim::Status, String)> = None;
        for q in &queries {
            for key in &q.keys {
                match self.answer(key, &q.qualifiers) {
                    Ok(v) => answers.push(Info::new(key.clone(), v)),
                    Err(e) => {
                        debug!(key, "query not answered: {}", e.1);
                        refused.get_or_insert(e);
                    }
                }
            }
        }
        let status = match (&refused, answers.is_empty()) {
            (None, _) => pmix_shim::SUCCESS,
            (Some(_), false) => pmix_shim::ERR_PARTIAL_SUCCESS,
            (Some((st, why)), true) => {
                info!("query on daemon {} not answered: {why}", self.me);
                *st
            }
        };
        debug!(answers = answers.len(), status, "query answered");
        reply.complete_with_info(status, &answers);
    }

    /// One query key: its value, or the status and the sentence why not.
    fn answer(&self, key: &str, qualifiers: &[Info]) -> Result<InfoValue, (pmix_shim::Status, String)> {
        if key == key_str(sys::PMIX_QUERY_NUM_PSETS) {
            // The DVM defines no process sets.
            return Ok(InfoValue::Size(0));
        }
        if key == key_str(sys::PMIX_QUERY_NAMESPACES) {
            let mut running: Vec<(&u32, &String)> = self.known.iter().map(|(ns, k)| (&k.0, ns)).collect();
            running.sort();
            let list: Vec<&str> = running.into_iter().map(|(_, ns)| ns.as_str()).collect();
            return Ok(InfoValue::String(list.join(",")));
        }
        if key == key_str(sys::PMIX_JOB_SIZE) {
            let nspace = match (find_info(qualifiers, sys::PMIX_NSPACE), find_info(qualifiers, sys::PMIX_PROCID)) {
                (Some(InfoValue::String(ns)), _) => ns.clone(),
                (_, Some(InfoValue::Proc(p))) => p.nspace.clone(),
                _ => {
                    let why = format!("{key} needs a {} qualifier naming the job", key_str(sys::PMIX_NSPACE));
                    return Err((pmix_shim::ERR_BAD_PARAM, why));
                }
            };
            return match self.known.get(&nspace) {
                Some((_, placement, _)) => Ok(InfoValue::U32(placement.nprocs())),
                None => Err((pmix_shim::ERR_NOT_FOUND, format!("{key}: namespace {nspace} is no running job"))),
            };
        }
        Err((pmix_shim::ERR_NOT_SUPPORTED, format!("query key {key} is not supported")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmix_shim::Rank;

    /// The records of several daemons decode to the largest candidate and the endpoint data
    /// in participant order, compared with a naive construction.
    #[test]
    fn records_round_trip() {
        let parts: Vec<(u64, Vec<u8>)> = vec![(3 << 32 | 1, b"abc".to_vec()), (0, vec![]), (2 << 32 | 7, vec![9; 300])];
        let mut out = Vec::new();
        for (c, e) in &parts {
            out.extend_from_slice(&encode_record(*c, e));
        }
        let (best, endpoints) = decode_records(&out).unwrap();
        assert_eq!(best, parts.iter().map(|p| p.0).max().unwrap());
        assert_eq!(endpoints, parts.iter().flat_map(|p| p.1.clone()).collect::<Vec<u8>>());
        assert_eq!(decode_records(&[]).unwrap(), (0, vec![]));
    }

    #[test]
    fn malformed_records_are_named() {
        let rec = encode_record(5, b"hello");
        assert!(decode_records(&rec[..7]).unwrap_err().contains("truncated"));
        assert!(decode_records(&rec[..rec.len() - 1]).unwrap_err().contains("announces 5 bytes"));
    }

    #[test]
    fn group_signatures_are_member_order_free_and_split_by_op() {
        let p = |r: u32| ProcId::new("ns", Rank::Id(r));
        let a = [p(3), p(0), p(1), p(2)];
        let b = [p(0), p(1), p(2), p(3)];
        assert_eq!(group_key(GroupOp::Construct, "g", &a), group_key(GroupOp::Construct, "g", &b));
        assert_eq!(group_key(GroupOp::Construct, "g", &a), "group-construct|g|ns:0-3");
        assert_ne!(group_key(GroupOp::Construct, "g", &a), group_key(GroupOp::Destruct, "g", &a));
        assert_ne!(group_key(GroupOp::Construct, "g", &a), group_key(GroupOp::Construct, "g", &a[..3]));
    }
}
