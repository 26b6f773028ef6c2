//! Fence: barrier and modex over a participant set. This file is the framing; the movements
//! are `tree.rs` (rollup and release) and `allgather.rs` (lateral exchange, no release).
//! The framing is split by concept: `types.rs` (what callers see), `record.rs` (per-signature
//! bookkeeping), `rollup.rs` (retire, fail, release down) and here `FenceState`'s entry points.
//!
//! Framing owns: the per-signature sequence counters, one `tracker::FenceTracker` per fence in flight
//! (signature, seq), the stash of contributions from a newer topology epoch, the list of
//! daemons each repair failed, and a short memory of results per signature (to answer
//! contributions re-sent after a repair).
//!
//! It also owns the choice of movement (the configured mode, the collect flag and the
//! participant count: inputs every participant holds alike), the deadline, the error rollup
//! (errors of every movement go up the tree and come down as the root's release), the lost
//! participants, `forget`, and the movement check on every contribution and block.
//!
//! How a tree fence travels: every daemon whose subtree holds a participant keeps a tracker with a
//! slot per such child plus its own slot when it participates. A full tracker sends ONE merged
//! contribution to its parent; the topology root produces the result and releases it down to
//! every child whose subtree holds a participant. Errors (timeout, movement mismatch, bad
//! input, a participant lost while pending) go up as an error contribution and come down as
//! the root's error release, so every participant reports the same outcome. A fence that lost
//! a participant before it started here fails at once, with the lost list every daemon
//! derives alike (the first repair that hit the set).
//!
//! Invariants:
//! - The k-th local start over a signature is fence k; counters never go back.
//! - A tracker is removed before its result is emitted or forwarded.
//! - A filled slot is never filled again in the same topology epoch (duplicates are dropped);
//!   a repair resets child slots and every pending daemon re-sends, tagged with the new epoch.
//! - Per-fence bookkeeping is O(radix); no array is sized by the DVM.
//!
//! Traps: the movement is judged only once every slot is in (majority by participant count, so
//! the odd daemon is named); releases carry no epoch and are accepted whenever they arrive; a
//! daemon that missed a release (its relay died) is answered from the result memory, so the
//! last success per signature is kept until the next one.
mod allgather;
mod record;
mod rollup;
mod run;
mod start;
mod tracker;
mod tree;
mod types;
mod wire;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use dvm_proto::grpcomm::{grpcomm_msg::Body, FenceBlock, FenceContrib, FenceRelease};
use dvm_proto::Message;
use dvm_rml::topology::{Rank, RepairDelta};
use tracing::debug;

use crate::{Ctx, FenceMovementMode};
use record::SigRecord;
use rollup::{dropped, emit, fail, release_down, retire, send_error_up};
use run::Run;
use tracker::{child_slots, lost, FenceTracker};
pub use types::{FenceError, FenceId, FenceRequest, FenceSignature, Participants};

/// Allgather blocks are held for fences at most this many ahead of this daemon's next start
/// (a peer runs ahead by the fences it started without waiting for the previous ones, and by
/// fences that failed before this daemon started them); anything further is dropped by name.
const HOLD_AHEAD: u64 = 1024;

/// Forgotten signatures remembered (see `FenceState::forgotten`).
const FORGOTTEN_KEPT: usize = 16;

impl FenceState {
    /// The owner of `sig` no longer wants its fences in flight (its job failed, a member of
    /// its group died): every fence over it held here — started, waiting for this daemon's
    /// start, deferred, or relayed — fails with `Abandoned`, and the error goes the way of
    /// every fence error (up to the root, released to every daemon holding it), so each
    /// participant and relay retires it and its local caller hears. The sequence counters are
    /// untouched: the next fence over `sig` is fence `started` everywhere and runs as usual.
    /// Returns how many fences were abandoned here.
    pub fn abandon(&mut self, ctx: &mut Ctx<'_>, sig: &FenceSignature) -> usize {
        let me = ctx.topo.me();
        let Some(rec) = self.sigs.get_mut(sig) else { return 0 };
        let seqs: Vec<u64> = rec.trackers.keys().copied().collect();
        for &seq in &seqs {
            debug!(rank = me, key = ?sig.key, seq, "fence abandoned by its owner");
            fail(ctx, sig, seq, rec, FenceError::Abandoned { daemon: me });
        }
        seqs.len()
    }

    /// Forget a signature that will never be used again (its job ended): its counters and
    /// the results kept for repairs. Refused (false) while a fence over it is in flight.
    pub fn forget(&mut self, sig: &FenceSignature) -> bool {
        match self.sigs.get(sig) {
            Some(rec) if !rec.trackers.is_empty() => false,
            Some(_) => {
                self.sigs.remove(sig);
                if self.forgotten.len() == FORGOTTEN_KEPT {
                    self.forgotten.pop_front();
                }
                self.forgotten.push_back(sig.clone());
                true
            }
            None => true,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct FenceState {
    sigs: BTreeMap<FenceSignature, SigRecord>,
    /// Contributions from a newer topology epoch than ours, replayed when we catch up.
    stash: Vec<(Rank, FenceContrib)>,
    /// The last signatures forgotten: an allgather block re-sent late (after a lateral loss),
    /// or a contribution sent before its sender heard the fence was abandoned, for one of them
    /// is dropped instead of opening a tracker nobody will ever start.
    forgotten: VecDeque<FenceSignature>,
    /// Daemons newly failed by each repair, in the order applied (identical on every daemon):
    /// the source of a deterministic `LostConnection` list.
    repairs: Vec<Vec<Rank>>,
    /// Daemons whose lateral link from here was lost: every later exchange sends them its
    /// blocks along the tree from the start. A block sent straight to such a partner is lost
    /// until the loss is noticed again, and by then this daemon may have finished, and
    /// forgotten, the exchange that owed it.
    lateral_lost: BTreeSet<Rank>,
}

impl FenceState {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn start(&mut self, ctx: &mut Ctx<'_>, req: FenceRequest, mode: FenceMovementMode) -> FenceId {
        let mut req = req;
        req.sig = FenceSignature::new(req.sig.key, req.sig.participants);
        let sig = req.sig.clone();
        let me = ctx.topo.me();
        let current = self.sigs.get(&sig).map_or(0, |r| r.started);
        let refused = match sig.participants.check(ctx.topo.size()) {
            Err(reason) => Some(FenceError::Protocol(format!("daemon {me}: {reason}"))),
            Ok(()) if !sig.participants.contains(me) => Some(FenceError::NotParticipant { daemon: me }),
            Ok(()) => None,
        };
        if let Some(err) = refused {
            emit(ctx, &sig, current, Err(err));
            return FenceId { sig, seq: current };
        }
        // A forgotten signature is never used again; if it is anyway, it is live from now on.
        self.forgotten.retain(|f| f != &sig);
        let rec = self.sigs.entry(sig.clone()).or_default();
        let seq = rec.started;
        rec.started += 1;
        let id = FenceId { sig: sig.clone(), seq };
        // Decided at the start (below). A tracker that early blocks or children's contributions
        // opened for this sequence is retired with the error, which also passes it to those
        // children: left, it would wait for a start that has passed (an allgather has no
        // release to end it), and a child whose contribution it holds would never hear.
        if let Some(err) = rec.early_errors.remove(&seq) {
            if rec.trackers.contains_key(&seq) {
                retire(ctx, &sig, seq, rec, Err(err.clone()), None);
            }
            emit(ctx, &sig, seq, Err(err));
            return id;
        }
        // A participant already failed: this fence can never succeed anywhere.
        let lost = lost(ctx.topo, &self.repairs, &sig.participants);
        if !lost.is_empty() {
            // Every daemon derives the same list, and no success can have been released for a
            // fence this participant had not started: passing the error down is safe here.
            let result = Err(FenceError::LostConnection { lost });
            if rec.trackers.contains_key(&seq) {
                retire(ctx, &sig, seq, rec, result.clone(), None);
            } else {
                rec.remember(seq, result.clone());
            }
            emit(ctx, &sig, seq, result);
            return id;
        }
        start::begin_or_defer(ctx, &sig, seq, rec, req, mode, &self.lateral_lost);
        id
    }

    pub fn on_contrib(&mut self, ctx: &mut Ctx<'_>, from: Rank, m: FenceContrib) {
        let sig = match wire::sig_from_wire(m.sig.as_ref(), ctx.topo.size()) {
            Ok(s) => s,
            Err(reason) => return dropped(ctx, from, format!("fence contribution (seq {}): {reason}", m.seq)),
        };
        let (me, epoch, seq) = (ctx.topo.me(), ctx.topo.epoch(), m.seq);
        if m.topo_epoch < epoch {
            debug!(rank = me, from, seq, their = m.topo_epoch, epoch, "stale-epoch fence contribution dropped");
            return;
        }
        if m.topo_epoch > epoch {
            self.stash.push((from, m));
            return;
        }
        if m.status == 0 && !lost(ctx.topo, &self.repairs, &sig.participants).is_empty() {
            debug!(rank = me, from, seq, "contribution to a fence that lost a participant dropped");
            return;
        }
        let participant = sig.participants.contains(me);
        let tracked = self.sigs.get(&sig).is_some_and(|r| r.trackers.contains_key(&seq));
        if !self.sigs.contains_key(&sig) && self.forgotten.contains(&sig) {
            // Its job ended here (the fence was abandoned, the signature forgotten): the fence
            // can never complete. The sender's subtree is released with that, instead of a
            // tracker here waiting for ever for contributions that will not come.
            debug!(rank = me, from, seq, "contribution for a forgotten signature: released as abandoned");
            let abandoned = Err(FenceError::Abandoned { daemon: me });
            ctx.send(from, Body::Release(wire::release_msg(&sig, seq, &abandoned)));
            return;
        }
        if !tracked {
            if let Some(rec) = self.sigs.get(&sig).filter(|r| r.is_retired(seq, participant)) {
                // A re-sent contribution (after a repair) to a fence already done here: answer
                // with the result, or, if no longer held, with the lost participants (every
                // daemon derives the same list; a fence that lost one cannot have succeeded
                // after the last success kept here).
                let lost = lost(ctx.topo, &self.repairs, &sig.participants);
                let result =
                    rec.result_of(seq).or_else(|| (!lost.is_empty()).then(|| Err(FenceError::LostConnection { lost })));
                if let Some(result) = result {
                    ctx.send(from, Body::Release(wire::release_msg(&sig, seq, &result)));
                }
                debug!(rank = me, from, seq, "contribution to a retired fence");
                return;
            }
            let slots = child_slots(ctx.topo, &sig.participants);
            if !slots.contains(&from) {
                let reason = format!(
                    "fence {:?}#{seq}: daemon {from} is not a child whose subtree holds a participant",
                    sig.key
                );
                return dropped(ctx, from, reason);
            }
            let rec = self.sigs.entry(sig.clone()).or_default();
            rec.trackers.insert(seq, FenceTracker::new(participant, slots));
        }
        let Some(rec) = self.sigs.get_mut(&sig) else { return };
        let Some(t) = rec.trackers.get_mut(&seq) else { return };
        if t.slot_mut(from).is_none() {
            let reason = format!("fence {:?}#{seq}: daemon {from} holds no slot here", sig.key);
            return dropped(ctx, from, reason);
        }
        if m.status != 0 {
            let err = wire::error_from_wire(m.status, &m.error);
            return fail(ctx, &sig, seq, rec, err);
        }
        if t.failed.is_some() {
            debug!(rank = me, from, seq, "contribution to a fence that already failed here");
            return;
        }
        if let Err(err) = Run::on_contrib(ctx, &sig, seq, rec, from, m) {
            fail(ctx, &sig, seq, rec, err);
        }
    }

    /// An allgather block sent straight to this daemon by another participant.
    pub fn on_block(&mut self, ctx: &mut Ctx<'_>, from: Rank, m: FenceBlock) {
        let sig = match wire::sig_from_wire(m.sig.as_ref(), ctx.topo.size()) {
            Ok(s) => s,
            Err(reason) => return dropped(ctx, from, format!("allgather block (seq {}): {reason}", m.seq)),
        };
        // `from` sent the frame; the block names the participant whose blocks it carries.
        let (me, seq, sender) = (ctx.topo.me(), m.seq, m.sender);
        if !sig.participants.contains(me) || !sig.participants.contains(sender) || sender == me {
            let reason = format!(
                "allgather block for fence {:?}#{seq} from {sender} to {me}: not two distinct participants",
                sig.key
            );
            return dropped(ctx, from, reason);
        }
        if !lost(ctx.topo, &self.repairs, &sig.participants).is_empty() {
            debug!(rank = me, sender, seq, "allgather block for a fence that lost a participant dropped");
            return;
        }
        if !self.sigs.contains_key(&sig) && self.forgotten.contains(&sig) {
            debug!(rank = me, sender, seq, "allgather block for a forgotten signature dropped");
            return;
        }
        let rec = self.sigs.entry(sig.clone()).or_default();
        if !rec.trackers.contains_key(&seq) {
            if rec.is_retired(seq, true) {
                debug!(rank = me, sender, seq, "allgather block for a retired fence");
                return;
            }
            if seq >= rec.started.saturating_add(HOLD_AHEAD) {
                let reason = format!(
                    "allgather block for fence {:?}#{seq}, more than {HOLD_AHEAD} ahead of this daemon's next ({})",
                    sig.key, rec.started
                );
                return dropped(ctx, from, reason);
            }
            rec.trackers.insert(seq, FenceTracker::new(true, child_slots(ctx.topo, &sig.participants)));
        }
        Run::on_block(ctx, &sig, seq, rec, sender, m);
    }

    pub fn on_release(&mut self, ctx: &mut Ctx<'_>, from: Rank, m: FenceRelease) {
        let sig = match wire::sig_from_wire(m.sig.as_ref(), ctx.topo.size()) {
            Ok(s) => s,
            Err(reason) => return dropped(ctx, from, format!("fence release (seq {}): {reason}", m.seq)),
        };
        let (me, seq) = (ctx.topo.me(), m.seq);
        let participant = sig.participants.contains(me);
        let result = if m.status != 0 { Err(wire::error_from_wire(m.status, &m.error)) } else { Ok(m.data) };
        if !self.sigs.contains_key(&sig) && self.forgotten.contains(&sig) {
            // A result pushed again after a repair, for a job that ended here: keeping a record
            // of it would make the signature live again, and a contribution re-sent by a new
            // child would then open a tracker that waits for ever.
            debug!(rank = me, from, seq, "release for a forgotten signature dropped");
            return;
        }
        let rec = self.sigs.entry(sig.clone()).or_default();
        if !rec.trackers.contains_key(&seq) {
            if rec.is_retired(seq, participant) {
                // A participant that finished an allgather on its own still passes another
                // participant's failure down, so every daemon below hears it.
                if result.is_err() && matches!(rec.result_of(seq), Some(Ok(_))) {
                    release_down(ctx, &sig, seq, &result, Some(from));
                }
                debug!(rank = me, from, seq, "duplicate fence release");
                return;
            }
            if participant && result.is_ok() {
                let reason =
                    format!("fence {:?}#{seq}: success release for a fence daemon {me} has not started", sig.key);
                return dropped(ctx, from, reason);
            }
        }
        // A running allgather finishes by its own exchange: taking a success release (results
        // pushed to a new child after a repair) would end it before it sent the blocks its
        // partners still wait for. Errors still end it; so does a success once it failed here.
        if result.is_ok() && rec.trackers.get(&seq).is_some_and(|t| t.failed.is_none() && t.run.finishes_on_its_own()) {
            debug!(rank = me, from, seq, "success release for a running allgather ignored");
            return;
        }
        retire(ctx, &sig, seq, rec, result, Some(from));
    }

    /// The topology in `ctx` is already repaired. Every pending fence resets its child slots
    /// and re-sends: a fence that lost a participant sends `LostConnection` up instead, so the
    /// root decides (an ancestor that already released the fence answers with its result).
    /// Recent results go to new neighbours, who may have missed the release.
    pub fn topology_changed(&mut self, ctx: &mut Ctx<'_>, delta: &RepairDelta) {
        if !delta.newly_failed.is_empty() {
            self.repairs.push(delta.newly_failed.clone());
        }
        let newly = &delta.newly_failed;
        for (sig, rec) in self.sigs.iter_mut() {
            let hit = match &sig.participants {
                Participants::All => !newly.is_empty(),
                Participants::Daemons(d) => newly.iter().any(|r| d.binary_search(r).is_ok()),
            };
            let lost_err = || FenceError::LostConnection { lost: lost(ctx.topo, &self.repairs, &sig.participants) };
            let slots = child_slots(ctx.topo, &sig.participants);
            let seqs: Vec<u64> = rec.trackers.keys().copied().collect();
            for seq in seqs {
                let Some(t) = rec.trackers.get_mut(&seq) else { continue };
                if !t.participant() && slots.is_empty() {
                    rec.trackers.remove(&seq);
                    continue;
                }
                t.reset_children(slots.clone());
                if hit && t.failed.is_none() {
                    if t.run.ends_at_a_loss() {
                        // Every survivor derives the same lost list: end the exchange here.
                        retire(ctx, sig, seq, rec, Err(lost_err()), None);
                        continue;
                    }
                    t.failed = Some(lost_err());
                }
                match t.failed.clone() {
                    Some(err) if ctx.topo.is_root() => retire(ctx, sig, seq, rec, Err(err), None),
                    Some(_) => send_error_up(ctx, sig, seq, t),
                    None => {
                        Run::repaired(ctx, sig, seq, rec);
                        Run::progress(ctx, sig, seq, rec);
                    }
                }
            }
            if let Some((seq, kept)) = &rec.finished {
                kept.finished_repaired(ctx, sig, *seq);
            }
            let new_parent = delta.parent_changed.and_then(|(_, p)| p);
            let added: Vec<Rank> = delta.children_added.iter().copied().filter(|c| slots.contains(c)).collect();
            for (seq, result) in &rec.held_results() {
                let msg = wire::release_msg(sig, *seq, result);
                for to in new_parent.iter().chain(&added) {
                    ctx.send(*to, Body::Release(msg.clone()));
                }
            }
        }
        let epoch = ctx.topo.epoch();
        for (from, m) in std::mem::take(&mut self.stash) {
            if m.topo_epoch > epoch {
                self.stash.push((from, m));
            } else {
                self.on_contrib(ctx, from, m);
            }
        }
    }

    /// A send to `peer` failed or its link was lost. Tree fences wait for the repair; an
    /// allgather whose partner is still alive in the topology (a lateral link lost, not a
    /// daemon) sends that partner's blocks along the tree instead. Never a repair.
    pub fn peer_unreachable(&mut self, ctx: &mut Ctx<'_>, peer: Rank) {
        let topo = ctx.topo;
        let neighbour = topo.parent() == Some(peer) || topo.children().contains(&peer);
        // A tree neighbour's link is the repair's business (a detour would take the same link).
        if peer >= topo.size() || !topo.is_alive(peer) || peer == topo.me() || neighbour {
            return;
        }
        self.lateral_lost.insert(peer);
        for (sig, rec) in self.sigs.iter_mut() {
            if !sig.participants.contains(peer) {
                continue;
            }
            let seqs: Vec<u64> = rec.trackers.keys().copied().collect();
            for seq in seqs {
                Run::peer_unreachable(ctx, sig, seq, rec, peer);
            }
            // Blocks sent just before this daemon finished may have been lost with the link.
            if let Some((seq, kept)) = rec.finished.as_mut() {
                kept.finished_peer_unreachable(ctx, sig, *seq, peer);
            }
        }
    }

    pub fn tick(&mut self, ctx: &mut Ctx<'_>) {
        let me = ctx.topo.me();
        for (sig, rec) in self.sigs.iter_mut() {
            let expired: Vec<u64> = rec
                .trackers
                .iter()
                .filter(|(_, t)| t.deadline.is_some_and(|d| d <= ctx.now))
                .map(|(&s, _)| s)
                .collect();
            for seq in expired {
                let Some(t) = rec.trackers.get_mut(&seq) else { continue };
                t.deadline = None;
                match t.failed.clone() {
                    // The root never answered our error: give up here, with that error.
                    Some(err) => retire(ctx, sig, seq, rec, Err(err), None),
                    None => {
                        let err = FenceError::Timeout { timeout_ns: t.timeout_ns, daemon: me };
                        fail(ctx, sig, seq, rec, err);
                    }
                }
            }
        }
    }

    pub fn state_bytes(&self) -> usize {
        let trackers: usize = self
            .sigs
            .values()
            .map(|r| {
                r.trackers.values().map(FenceTracker::state_bytes).sum::<usize>()
                    + r.early_errors.len() * std::mem::size_of::<(u64, FenceError)>()
                    + r.finished.as_ref().map_or(0, |(_, kept)| kept.state_bytes())
            })
            .sum();
        let stash: usize = self.stash.iter().map(|(_, m)| m.encoded_len()).sum();
        trackers + stash
    }

    /// Bytes of retired fences' results still held (to answer a contribution re-sent after a
    /// repair): at most the last success per signature, and errors, which carry none.
    pub fn held_bytes(&self) -> usize {
        self.sigs.values().map(SigRecord::held_bytes).sum()
    }

    pub fn is_quiescent(&self) -> bool {
        self.stash.is_empty() && self.sigs.values().all(|r| r.trackers.is_empty())
    }

    /// Fences this daemon holds a tracker for (started, relayed, or waiting for its start).
    pub fn in_flight(&self) -> usize {
        self.sigs.values().map(|r| r.trackers.len()).sum()
    }
}

#[cfg(test)]
mod tests;
