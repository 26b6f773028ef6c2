//! xcast: reliable, totally ordered broadcast over the routing tree.
//!
//! - Any daemon starts one; a non-root origin relays it to the root, which assigns the next op
//!   id. Every daemon processes ops exactly once and in op-id order (ops arriving ahead of a
//!   gap are buffered).
//! - The whole payload goes to every child. Forward-first for ordinary tags; process-first for
//!   tags that change the tree (the driver confirms with `processed`, then we forward).
//! - ACK rollup: each daemon tells its parent "my subtree holds every op below `held`"
//!   (cumulative; `ack_id` numbers the acks a daemon sends). A parent re-polls a child with
//!   `is_request`. The root's subtree is the whole DVM: when it holds op k, the op is complete
//!   and the origin is told (`XcastDone`).
//! - A daemon retains an op until its own subtree holds it, so that after a repair it can
//!   re-forward to children that changed; unchanged children are re-polled. A promoted daemon
//!   does not replay its own copies: its new parent replays in order, and every op it receives
//!   (new or duplicate) goes on to each child whose last ack says it lacks it.
//! - A child that cannot be reached is left out of the rollup instead of stalling it.
//! - An op past a gap from a daemon that is not our parent (it applied a repair we have not:
//!   when the repair travels as an op, DAEMON_DIED, it may sit behind that very gap) makes us
//!   ask that daemon to replay from the gap.
//!
//! - Two movements (see [`crate::movement::BcastMovementMode`]): the whole payload to every
//!   child, or, for large payloads of bulk-capable tags, scatter-allgather (`bulk.rs`). The
//!   origin chooses and stamps the choice on its relay; the op ids, the order of delivery, the
//!   ACK rollup and retention are the same for both, and every replay is a whole forward.
//!
//! State is O(radix) per op: the op itself plus one ack level per child (a scatter-allgather
//! op in flight also holds its exchange: the member list and the chunks received).

use std::collections::BTreeMap;

use bytes::Bytes;
use dvm_proto::grpcomm::{grpcomm_msg::Body, XcastAck, XcastDone, XcastForward, XcastRelay};
use dvm_rml::topology::{Rank, RepairDelta};
use tracing::{debug, trace};

use crate::{compress, BcastMovementMode, Ctx, Effect, Movement};

mod bulk;
pub(crate) use bulk::KEEP_FINISHED_BYTES;
mod way;

use way::Way;

/// Largest payload a compressed xcast may inflate to.
const MAX_INFLATED: usize = 1 << 30;

/// Identifies an xcast started on a daemon: (origin rank, origin-local id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct XcastId {
    pub origin: Rank,
    pub local: u64,
}

#[derive(Debug, Clone)]
struct PendingStart {
    tag: u32,
    compressed: bool,
    payload: Bytes,
    /// Movement id the origin chose.
    movement: u32,
    /// The op id the root gave it, once its forward reached us.
    op_id: Option<u64>,
    /// When the relay was last sent (re-sent until the root's Done arrives).
    sent_at: u64,
}

#[derive(Debug, Clone, Default)]
struct Child {
    /// Every op below this is held by the child's subtree (its last ack); None until a child
    /// that came in a repair has answered.
    held: Option<u64>,
    /// Its last `keep` (see `XcastAck::keep`); None until it answered.
    keep: Option<u64>,
    /// Last ack id seen from this child.
    last_ack_id: u64,
    /// A send to it failed: left out of the rollup until the next repair.
    unreachable: bool,
}

#[derive(Debug)]
pub(crate) struct XcastState {
    me: Rank,
    // origin side
    next_local: u64,
    pending_starts: BTreeMap<u64, PendingStart>,
    // root side
    next_op: u64,
    relay_next: BTreeMap<Rank, u64>,
    relay_gaps: BTreeMap<(Rank, u64), XcastRelay>,
    /// Root: every op below this is complete (held by every reachable daemon).
    completed_below: u64,
    // every daemon
    next_deliver: u64,
    buffered: BTreeMap<u64, XcastForward>,
    awaiting_processed: Option<XcastForward>,
    retained: BTreeMap<u64, XcastForward>,
    children: BTreeMap<Rank, Child>,
    children_known: bool,
    /// Last `held` sent to the parent; None: the parent must hear from us again.
    acked_up: Option<(u64, u64)>,
    ack_id: u64,
    /// Scatter-allgather ops in flight here.
    bulk: bulk::BulkState,
}

impl XcastState {
    pub fn new(me: Rank) -> Self {
        XcastState {
            me,
            next_local: 0,
            pending_starts: BTreeMap::new(),
            next_op: 0,
            relay_next: BTreeMap::new(),
            relay_gaps: BTreeMap::new(),
            completed_below: 0,
            next_deliver: 0,
            buffered: BTreeMap::new(),
            awaiting_processed: None,
            retained: BTreeMap::new(),
            children: BTreeMap::new(),
            children_known: false,
            acked_up: None,
            ack_id: 0,
            bulk: bulk::BulkState::default(),
        }
    }

    pub fn next_deliver(&self) -> u64 {
        self.next_deliver
    }

    fn sync_children(&mut self, ctx: &Ctx<'_>) {
        if !self.children_known {
            self.children =
                ctx.topo.children().iter().map(|&c| (c, Child { held: Some(0), ..Child::default() })).collect();
            self.children_known = true;
        }
    }

    pub fn start(&mut self, ctx: &mut Ctx<'_>, tag: u32, payload: Bytes, mode: BcastMovementMode) -> XcastId {
        self.sync_children(ctx);
        let local = self.next_local;
        self.next_local += 1;
        let (payload, compressed) = if ctx.cfg.raw_tags.contains(&tag) {
            (payload, false)
        } else {
            compress::maybe_compress(payload, ctx.cfg.compress_threshold)
        };
        let id = XcastId { origin: self.me, local };
        let bulk_capable = ctx.cfg.bulk_tags.contains(&tag) && !ctx.cfg.process_first.contains(&tag);
        let topo = &ctx.topo;
        let movement = mode
            .for_bcast(
                bulk_capable,
                payload.len() as u64,
                topo.live_count(),
                topo.radix(),
                topo.height(),
                &ctx.cfg.link,
            )
            .id();
        if ctx.topo.is_root() {
            self.assign(ctx, self.me, local, tag, compressed, payload, movement);
        } else {
            let p = PendingStart { tag, compressed, payload, movement, op_id: None, sent_at: ctx.now };
            self.send_relay(ctx, local, &p);
            self.pending_starts.insert(local, p);
            ctx.out.push(Effect::ArmTimer { at: ctx.now.saturating_add(ctx.cfg.relay_retry_ns) });
        }
        id
    }

    fn send_relay(&self, ctx: &mut Ctx<'_>, local: u64, p: &PendingStart) {
        let Some(root) = ctx.topo.repaired().root() else {
            return;
        };
        let relay = XcastRelay {
            origin: self.me,
            origin_id: local,
            tag: p.tag,
            compressed: p.compressed,
            payload: p.payload.clone(),
            movement: p.movement,
        };
        ctx.send(root, Body::Relay(relay));
    }

    /// Root: give the next op id and process it. A process-first tag always takes the
    /// whole-payload tree, whatever its origin asked: the daemons apply it before passing it
    /// on, and a tree change must never wait on an exchange among the daemons it changes.
    #[allow(clippy::too_many_arguments)]
    fn assign(
        &mut self,
        ctx: &mut Ctx<'_>,
        origin: Rank,
        origin_id: u64,
        tag: u32,
        compressed: bool,
        payload: Bytes,
        movement: u32,
    ) {
        let op_id = self.next_op;
        self.next_op += 1;
        let movement = Way::assign(ctx, movement, tag).id();
        debug!(op_id, origin, origin_id, tag, movement = Movement::name_of(movement), "xcast op assigned");
        let fwd = XcastForward { op_id, origin, origin_id, tag, compressed, payload, movement, ..Default::default() };
        self.receive_op(ctx, fwd);
    }

    pub fn on_relay(&mut self, ctx: &mut Ctx<'_>, from: Rank, m: XcastRelay) {
        self.sync_children(ctx);
        if !ctx.topo.is_root() {
            ctx.out.push(Effect::Dropped {
                from,
                reason: format!("xcast relay from daemon {} reached non-root daemon {}", m.origin, self.me),
            });
            return;
        }
        let expected = self.relay_next.get(&m.origin).copied().unwrap_or(0);
        if m.origin_id < expected {
            // Duplicate (re-sent after a repair or a retry): answer again once complete.
            let pending = self
                .retained
                .values()
                .chain(self.buffered.values())
                .chain(self.awaiting_processed.iter())
                .find(|f| f.origin == m.origin && f.origin_id == m.origin_id)
                .map(|f| f.op_id);
            let op_id = match pending {
                Some(op) if op >= self.completed_below => return,
                Some(op) => op,
                None => u64::MAX,
            };
            ctx.send(m.origin, Body::Done(XcastDone { origin_id: m.origin_id, op_id }));
            return;
        }
        if m.origin_id > expected {
            self.relay_gaps.insert((m.origin, m.origin_id), m);
            return;
        }
        let origin = m.origin;
        let mut next = m;
        loop {
            self.relay_next.insert(origin, next.origin_id + 1);
            self.assign(ctx, next.origin, next.origin_id, next.tag, next.compressed, next.payload, next.movement);
            match self.relay_gaps.remove(&(origin, next.origin_id + 1)) {
                Some(r) => next = r,
                None => break,
            }
        }
    }

    pub fn on_forward(&mut self, ctx: &mut Ctx<'_>, from: Rank, m: XcastForward) {
        self.sync_children(ctx);
        Way::on_forward(self, ctx, from, m);
    }

    /// A whole-payload forward from the parent (or a daemon that took us as its child).
    fn on_whole_forward(&mut self, ctx: &mut Ctx<'_>, from: Rank, m: XcastForward) {
        if m.op_id > self.next_deliver && ctx.topo.parent() != Some(from) && !self.buffered.contains_key(&m.op_id) {
            // An op past a gap from a daemon that already took us as its child in a repair we
            // have not applied: the ops in between died with our old parent. When the repair
            // itself travels as an op (DAEMON_DIED), only that daemon can fill the gap: ask it
            // to replay from there (it fetches what it no longer keeps from its parent).
            debug!(from, held = self.next_deliver, op_id = m.op_id, "xcast gap: replay requested from new parent");
            ctx.send(from, Body::Ack(XcastAck { held: self.next_deliver, keep: 0, ack_id: 0, is_request: true }));
        }
        self.receive_op(ctx, m);
    }

    /// An op with its whole payload: from the parent (tree), assigned here (root), or
    /// reassembled here from a scatter-allgather (never passed on whole).
    fn receive_op(&mut self, ctx: &mut Ctx<'_>, m: XcastForward) {
        let reassembled = Way::assembled_here(&m, ctx);
        if !reassembled && m.exchange {
            // A whole copy of an exchange op: do this daemon's part of the exchange now.
            self.bulk_serve(ctx, &m);
        }
        if m.op_id < self.next_deliver || self.awaiting_processed.as_ref().is_some_and(|a| a.op_id == m.op_id) {
            // Duplicate (a replay after a repair): pass it to children that lack it.
            if !reassembled {
                self.forward_to_lacking(ctx, &m);
                self.update_rollup(ctx);
            }
            return;
        }
        if m.op_id > self.next_deliver || self.awaiting_processed.is_some() {
            trace!(op_id = m.op_id, next = self.next_deliver, "xcast op buffered");
            match self.buffered.get(&m.op_id) {
                // A whole forward replaces a reassembled copy: it must still reach the children.
                Some(b) if Way::of(b) == Way::ScatterAllgather && !reassembled => {
                    self.buffered.insert(m.op_id, m);
                }
                Some(_) => {}
                None => {
                    self.buffered.insert(m.op_id, m);
                }
            }
            return;
        }
        self.process(ctx, m);
        self.drain_buffered(ctx);
        self.update_rollup(ctx);
    }

    fn drain_buffered(&mut self, ctx: &mut Ctx<'_>) {
        while self.awaiting_processed.is_none() {
            let Some(m) = self.buffered.remove(&self.next_deliver) else {
                break;
            };
            self.process(ctx, m);
        }
        // Anything below next_deliver left in the buffer is a duplicate.
        let stale: Vec<u64> = self.buffered.range(..self.next_deliver).map(|(k, _)| *k).collect();
        for k in stale {
            self.buffered.remove(&k);
        }
    }

    /// Process op `m` (which is exactly `next_deliver`).
    fn process(&mut self, ctx: &mut Ctx<'_>, m: XcastForward) {
        self.next_deliver = m.op_id + 1;
        if m.origin == self.me {
            if let Some(p) = self.pending_starts.get_mut(&m.origin_id) {
                p.op_id = Some(m.op_id);
            }
        }
        if ctx.cfg.process_first.contains(&m.tag) {
            self.deliver(ctx, &m);
            self.awaiting_processed = Some(m);
        } else {
            let whole = Way::send_down(self, ctx, m);
            self.deliver(ctx, &whole);
            // Retained whole: every replay is a tree forward.
            self.retain(ctx, whole);
        }
    }

    pub fn processed(&mut self, ctx: &mut Ctx<'_>, op_id: u64) {
        self.sync_children(ctx);
        match self.awaiting_processed.take() {
            Some(m) if m.op_id == op_id => {
                self.forward_to_children(ctx, &m);
                self.retain(ctx, m);
                self.drain_buffered(ctx);
                self.update_rollup(ctx);
            }
            other => self.awaiting_processed = other,
        }
    }

    fn deliver(&mut self, ctx: &mut Ctx<'_>, m: &XcastForward) {
        let payload = if m.compressed {
            match compress::decompress(&m.payload, MAX_INFLATED) {
                Ok(p) => p,
                Err(reason) => {
                    ctx.out.push(Effect::Dropped {
                        from: m.origin,
                        reason: format!("xcast op {} from daemon {}: {reason}", m.op_id, m.origin),
                    });
                    return;
                }
            }
        } else {
            m.payload.clone()
        };
        ctx.out.push(Effect::Deliver { op_id: m.op_id, origin: m.origin, tag: m.tag, payload });
    }

    /// Keep an op until this daemon's subtree holds it (to re-forward after a repair). The
    /// root keeps every op until complete: it owes the origin a Done.
    fn retain(&mut self, ctx: &Ctx<'_>, m: XcastForward) {
        if !self.children.is_empty() || ctx.topo.is_root() {
            self.retained.insert(m.op_id, m);
        }
    }

    fn forward_to_children(&mut self, ctx: &mut Ctx<'_>, m: &XcastForward) {
        for (&c, st) in &self.children {
            if !st.unreachable {
                ctx.send(c, Body::Forward(m.clone()));
            }
        }
    }

    fn forward_to_lacking(&mut self, ctx: &mut Ctx<'_>, m: &XcastForward) {
        for (&c, st) in &self.children {
            if !st.unreachable && st.held.is_none_or(|h| h <= m.op_id) {
                ctx.send(c, Body::Forward(m.clone()));
            }
        }
    }

    /// (held, keep) of this daemon's subtree: every op below `held` is held by every
    /// reachable daemon of it (children that could not be reached are left out, so the rollup
    /// never stalls on them); ops below `keep` are held by all of it, unreachable children
    /// counted at their last ack, so they may be forgotten. None until every child answered
    /// since the last repair.
    fn rollup(&self) -> Option<(u64, u64)> {
        let own = if self.awaiting_processed.is_some() { self.next_deliver - 1 } else { self.next_deliver };
        let held =
            self.children.values().filter(|c| !c.unreachable).try_fold(own, |acc, c| c.held.map(|h| acc.min(h)))?;
        let keep = self.children.values().fold(own, |acc, c| acc.min(c.keep.unwrap_or(0)));
        Some((held, keep.min(held)))
    }

    fn update_rollup(&mut self, ctx: &mut Ctx<'_>) {
        let Some((held, keep)) = self.rollup() else {
            return;
        };
        if ctx.topo.is_root() && held > self.completed_below {
            // The whole (reachable) DVM holds these ops: complete them.
            let done: Vec<XcastForward> =
                self.retained.range(self.completed_below..held).map(|(_, m)| m.clone()).collect();
            self.completed_below = held;
            for m in &done {
                self.complete(ctx, m);
            }
        }
        // Keep what an unreachable child (or anyone below it) lacks until the repair.
        let drop: Vec<u64> = self.retained.range(..keep).map(|(k, _)| *k).collect();
        for k in drop {
            self.retained.remove(&k);
        }
        if let Some(parent) = ctx.topo.parent() {
            if self.acked_up.is_none_or(|(h, k)| held > h || keep > k) {
                self.send_ack(ctx, parent, held, keep);
            }
        }
    }

    fn send_ack(&mut self, ctx: &mut Ctx<'_>, parent: Rank, held: u64, keep: u64) {
        self.acked_up = Some((held, keep));
        self.ack_id += 1;
        ctx.send(parent, Body::Ack(XcastAck { held, keep, ack_id: self.ack_id, is_request: false }));
    }

    fn complete(&mut self, ctx: &mut Ctx<'_>, m: &XcastForward) {
        debug!(op_id = m.op_id, origin = m.origin, "xcast op complete");
        if m.origin == self.me {
            self.pending_starts.remove(&m.origin_id);
            ctx.out.push(Effect::XcastComplete { id: XcastId { origin: self.me, local: m.origin_id }, op_id: m.op_id });
        } else if ctx.topo.is_alive(m.origin) {
            ctx.send(m.origin, Body::Done(XcastDone { origin_id: m.origin_id, op_id: m.op_id }));
        }
    }

    pub fn on_ack(&mut self, ctx: &mut Ctx<'_>, from: Rank, m: XcastAck) {
        self.sync_children(ctx);
        if m.is_request && ctx.topo.parent() == Some(from) {
            // The parent re-polls: answer with what the subtree holds as soon as it is known.
            self.acked_up = None;
            self.update_rollup(ctx);
            return;
        }
        let Some(child) = self.children.get_mut(&from) else {
            trace!(from, "xcast ack from a daemon that is not a child (stale after repair)");
            return;
        };
        if m.is_request {
            // A child asks for a replay from `held` (it or its subtree has a gap).
            let replay: Vec<XcastForward> = self.retained.range(m.held..).map(|(_, f)| f.clone()).collect();
            for f in replay {
                ctx.send(from, Body::Forward(f));
            }
            self.fill_gap(ctx, m.held);
            return;
        }
        if m.ack_id <= child.last_ack_id {
            return;
        }
        child.last_ack_id = m.ack_id;
        let held = child.held.map_or(m.held, |h| h.max(m.held));
        child.held = Some(held);
        child.keep = Some(child.keep.map_or(m.keep, |k| k.max(m.keep)).min(held));
        self.fill_gap(ctx, held);
        self.update_rollup(ctx);
    }

    /// A child lacks op `held`. If we delivered it but no longer keep it (a child that came
    /// to us in a repair), ask our parent to replay from there.
    fn fill_gap(&mut self, ctx: &mut Ctx<'_>, held: u64) {
        let have =
            self.retained.contains_key(&held) || self.awaiting_processed.as_ref().is_some_and(|a| a.op_id == held);
        if held < self.next_deliver && !have {
            match ctx.topo.parent() {
                Some(parent) => {
                    debug!(held, parent, "xcast replay requested from parent");
                    ctx.send(parent, Body::Ack(XcastAck { held, keep: 0, ack_id: 0, is_request: true }));
                }
                None => ctx.out.push(Effect::Dropped {
                    from: self.me,
                    reason: format!("xcast op {held} requested by a child is no longer held by the root"),
                }),
            }
        }
    }

    pub fn on_done(&mut self, ctx: &mut Ctx<'_>, _from: Rank, m: XcastDone) {
        if let Some(p) = self.pending_starts.remove(&m.origin_id) {
            // A Done re-sent for a long-complete op does not carry its id; we saw it pass.
            let op_id = if m.op_id == u64::MAX { p.op_id.unwrap_or(u64::MAX) } else { m.op_id };
            ctx.out.push(Effect::XcastComplete { id: XcastId { origin: self.me, local: m.origin_id }, op_id });
        }
    }

    /// Re-send relays whose Done has not come (a relay or the Done may have died with a
    /// daemon on the way, before every hop had repaired its routes).
    pub fn tick(&mut self, ctx: &mut Ctx<'_>) {
        self.bulk_tick(ctx);
        if ctx.topo.is_root() || self.pending_starts.is_empty() {
            return;
        }
        let retry = ctx.cfg.relay_retry_ns;
        let due: Vec<u64> = self
            .pending_starts
            .iter()
            .filter(|(_, p)| ctx.now >= p.sent_at.saturating_add(retry))
            .map(|(k, _)| *k)
            .collect();
        for local in due {
            if let Some(p) = self.pending_starts.get_mut(&local) {
                p.sent_at = ctx.now;
            }
            let p = self.pending_starts[&local].clone();
            debug!(local, "xcast relay re-sent: no Done yet");
            self.send_relay(ctx, local, &p);
        }
        if let Some(next) = self.pending_starts.values().map(|p| p.sent_at.saturating_add(retry)).min() {
            ctx.out.push(Effect::ArmTimer { at: next });
        }
    }

    pub fn topology_changed(&mut self, ctx: &mut Ctx<'_>, delta: &RepairDelta) {
        self.sync_children(ctx);
        let old = std::mem::take(&mut self.children);
        for &c in ctx.topo.children() {
            let st = match old.get(&c) {
                Some(prev) if delta.children_kept.contains(&c) => Child { unreachable: false, ..prev.clone() },
                _ => Child::default(),
            };
            self.children.insert(c, st);
        }
        // Changed children: full re-forward of what we keep (what we no longer keep, a
        // changed child asks for and we fetch from our parent). Every child: re-poll.
        for &c in ctx.topo.children() {
            if delta.children_added.contains(&c) {
                for m in self.retained.values() {
                    ctx.send(c, Body::Forward(m.clone()));
                }
            }
            let poll = XcastAck { held: 0, keep: 0, ack_id: 0, is_request: true };
            ctx.send(c, Body::Ack(poll));
        }
        // Root only: ops assigned to origins that died and are still gapped are dropped.
        let failed = ctx.topo.failed().clone();
        self.relay_gaps.retain(|(o, _), _| !failed.contains(o));
        if !ctx.topo.is_root() {
            // Our relays may have died with a relaying daemon: send them again (root dedups).
            for (&local, p) in &self.pending_starts {
                self.send_relay(ctx, local, p);
            }
        }
        if delta.parent_changed.is_some() {
            // The new parent knows nothing of us yet.
            self.acked_up = None;
        }
        if ctx.topo.is_root() {
            self.bulk_degrade(ctx);
        } else {
            self.bulk_repass(ctx);
            self.bulk_resend_detours(ctx);
        }
        self.update_rollup(ctx);
    }

    pub fn peer_unreachable(&mut self, ctx: &mut Ctx<'_>, peer: Rank) {
        self.sync_children(ctx);
        // A tree neighbour's link is the repair's business (a detour would take that link).
        let neighbour = ctx.topo.parent() == Some(peer) || ctx.topo.children().contains(&peer);
        if ctx.topo.is_alive(peer) && !neighbour {
            self.bulk_detour(ctx, peer);
        }
        if let Some(c) = self.children.get_mut(&peer) {
            if !c.unreachable {
                debug!(peer, "xcast child unreachable: left out of the rollup");
                c.unreachable = true;
                self.update_rollup(ctx);
            }
        }
    }

    pub fn state_bytes(&self) -> usize {
        let op = |m: &XcastForward| m.payload.len() + 48;
        self.retained.values().map(op).sum::<usize>()
            + self.buffered.values().map(op).sum::<usize>()
            + self.awaiting_processed.iter().map(op).sum::<usize>()
            + self.pending_starts.values().map(|p| p.payload.len() + 24).sum::<usize>()
            + self.relay_gaps.values().map(|r| r.payload.len() + 32).sum::<usize>()
            + self.children.len() * std::mem::size_of::<Child>()
            + self.bulk.state_bytes()
    }

    pub fn is_quiescent(&self) -> bool {
        self.pending_starts.is_empty()
            && self.retained.is_empty()
            && self.buffered.is_empty()
            && self.awaiting_processed.is_none()
            && self.relay_gaps.is_empty()
            && self.bulk.is_quiescent()
    }
}
