//! The scatter-allgather movement of an xcast: for a large payload, the root cuts the (maybe
//! compressed) payload into one chunk per member — the live daemons other than itself when it
//! assigns the op — and sends each child only the chunks of that child's subtree; each member passes on its
//! children's chunks at once and then gathers every other chunk over lateral links
//! (`Via::Direct`), on the allgather schedule of [`crate::allgather`].
//!
//! Owns: the member list and chunk layout (from the op alone, so every member derives the
//! same), the split of a chunk forward by next hop, one [`Exchange`] per op in flight, the
//! blocks that came before their op's forward, and the degrade to the whole-payload tree.
//!
//! The xcast framing still owns the rest: op ids and the order of delivery (an op assembled
//! early waits in `buffered` for its predecessors), the ACK rollup (a daemon delivers, and so
//! counts an op as held, only once it holds the whole payload; its children ACK theirs), and
//! retention (a daemon retains the assembled whole, so every replay after a repair is a
//! whole-payload tree forward).
//!
//! Faults: the root holds the whole payload from the start, delivers at once and is no member
//! of the exchange, so it never waits on it and DAEMON_DIED (queued behind a stuck bulk op everywhere else) is
//! always processed at the root. When a repair reaches the root, every bulk op not yet
//! complete degrades: the root forwards its whole payload to every child whose subtree lacks
//! it, each daemon that lacks it processes it as a tree op (forward to all children, deliver)
//! and drops its exchange, and each daemon that holds it passes it to children that lack it.
//! A lateral link lost to a live partner (`peer_unreachable`) is never a tree loss: that
//! partner's blocks go again along the tree (`XcastBlock.sender` names the member), and so do
//! later ones, including those of every later op; finished exchanges are kept for
//! [`FINISHED_KEEP_NS`] (far longer than a lost link takes to notice), as long as they hold no
//! more than `Config::keep_finished_bytes` (default [`KEEP_FINISHED_BYTES`]) together, to do the same (they hold the chunks: an idle
//! daemon keeps none).
//!
//! Traps:
//! - The member list is the root's view at assignment, carried as the failed ranks
//!   (`excluded`), never each daemon's own view: a daemon that already applied a later repair
//!   would otherwise derive other positions.
//! - A chunk forward never replays: a duplicate is dropped; whatever a changed child lacks
//!   reaches it as a whole forward.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use dvm_proto::grpcomm::{grpcomm_msg::Body, XcastBlock, XcastChunk, XcastForward};
use dvm_rml::topology::{Rank, Route};
use tracing::debug;

use super::{XcastState, MAX_INFLATED};
use crate::allgather::exchange::{Exchange, Outgoing, Received};
use crate::{Ctx, Effect, Movement};

/// Finished exchanges are kept (to re-send blocks along the tree to a partner whose lateral
/// link was lost before this daemon finished) up to this many bytes of blocks together, and
/// at least the last [`KEEP_FINISHED_MIN`]. A count alone was too few: a stream of small ops
/// finishes dozens here before a silent link is noticed, and the partner of one forgotten
/// waited forever (simulator, faults profile, seed 2001176 at n 10 radix 2). 64 MiB was the
/// largest part of a daemon's memory while a file streamed through in 4 MiB segments: a
/// windowed stream cannot finish more than its window past an op a partner still lacks (that
/// partner's ACK holds the window), so a few segments' worth is what a detour can need.
pub(crate) const KEEP_FINISHED_BYTES: usize = 16 << 20;

/// Finished exchanges always kept, whatever their size.
pub(super) const KEEP_FINISHED_MIN: usize = 4;

/// How long a finished exchange is kept for detours (a partner still missing blocks after
/// this has lost more than a lateral link, and the repair's degrade delivers to it).
pub(super) const FINISHED_KEEP_NS: u64 = 30_000_000_000;

/// Early block messages held per op: one block message and one ready per schedule step, and
/// a schedule has at most 32 steps.
const MAX_EARLY_PER_OP: usize = 64;

/// An exchange step is paced (sent once its receiver awaits it) when its message is longer on
/// the wire than this many link latencies. Simulated at N = 4096, radix 64 (1 MiB–4 MiB,
/// docs/movements.md): 0.5 to 8 all bring 4 MiB from 1.36× to ~1.05× the model; 2 costs the
/// least at 1 MiB (1.08×, against 1.03× unpaced).
const PACE_LATENCIES: f64 = 2.0;

/// Ops ahead of this daemon's forwards whose blocks may wait here.
const MAX_EARLY_OPS: usize = 64;

/// One op in flight on this daemon.
#[derive(Debug)]
pub(super) struct BulkOp {
    /// The op without chunks (movement, total length, members).
    meta: XcastForward,
    ex: Exchange,
    /// The chunks of the rest of this daemon's subtree, kept until the op is reassembled here:
    /// a repair may give it children it could not reach before (the root may have lost a
    /// daemon, and cut it out of the members, before this daemon took the repair).
    passed: Vec<XcastChunk>,
}

#[derive(Debug, Default)]
pub(super) struct BulkState {
    ops: BTreeMap<u64, BulkOp>,
    early: BTreeMap<u64, Vec<XcastBlock>>,
    /// (op, exchange, when it finished).
    finished: VecDeque<(u64, Exchange, u64)>,
    /// Partners whose lateral link from here was lost: every later exchange sends them its
    /// blocks along the tree from the start. Sent straight, a block is lost until the loss is
    /// noticed again, and by then the exchange that owed it may be finished and forgotten
    /// here, leaving the partner waiting with no repair to degrade the op.
    lateral_lost: BTreeSet<Rank>,
}

impl BulkState {
    pub fn state_bytes(&self) -> usize {
        let ex = |e: &Exchange| e.state_bytes();
        self.ops.values().map(|o| ex(&o.ex) + 64).sum::<usize>()
            + self.finished.iter().map(|(_, e, _)| ex(e)).sum::<usize>()
            + self.early.values().flatten().map(|b| b.blocks.iter().map(Bytes::len).sum::<usize>() + 32).sum::<usize>()
    }

    /// A new exchange, sending along the tree to every partner whose lateral link was lost.
    fn with_detours(&self, mut ex: Exchange) -> Exchange {
        for &p in &self.lateral_lost {
            ex.detour(p);
        }
        ex
    }

    /// Nothing in flight (finished exchanges are history, kept only to answer detours).
    pub fn is_quiescent(&self) -> bool {
        self.ops.is_empty() && self.early.is_empty()
    }
}

/// The members of a bulk op: every rank below the DVM size that the root did not exclude (the
/// ranks it had lost, and itself).
fn members(size: u32, excluded: &[u32]) -> Vec<Rank> {
    (0..size).filter(|r| excluded.binary_search(r).is_err()).collect()
}

/// Byte range of the chunk at `pos` of `count` members for a payload of `total` bytes: equal
/// chunks of ⌈total / count⌉, the last ones shorter or empty.
fn chunk_range(total: u64, count: usize, pos: usize) -> (usize, usize) {
    let total = total as usize;
    let c = total.div_ceil(count.max(1));
    let start = (pos * c).min(total);
    (start, (start + c).min(total))
}

impl XcastState {
    /// Root: send op `m` (whole payload) down as chunks and serve its exchange from the whole
    /// payload. Returns the op as it is retained and replayed: whole, marked as an exchange op.
    pub(super) fn bulk_root_start(&mut self, ctx: &mut Ctx<'_>, m: &XcastForward) -> XcastForward {
        // The root takes no part: it holds the payload already, and its link carries the
        // scatter (serving the exchange too would double its egress, on everyone's path).
        let mut excluded: Vec<u32> = ctx.topo.failed().iter().copied().chain([ctx.topo.me()]).collect();
        excluded.sort_unstable();
        excluded.dedup();
        let list = members(ctx.topo.size(), &excluded);
        let whole = XcastForward {
            movement: Movement::TreeBroadcast.id(),
            total_len: m.payload.len() as u64,
            excluded,
            exchange: true,
            chunks: Vec::new(),
            ..m.clone()
        };
        // Pace the steps whose message is longer on the wire than PACE_LATENCIES latencies:
        // below that, waiting for a ready (up to one latency) costs more than the contention
        // it avoids.
        let chunk = chunk_range(whole.total_len, list.len(), 0).1 as f64;
        let link = ctx.cfg.link;
        let pace_blocks = if chunk > 0.0 && link.beta_ns_per_byte > 0.0 {
            (PACE_LATENCIES * link.alpha_ns / link.beta_ns_per_byte / chunk).ceil().clamp(1.0, f64::from(u32::MAX))
                as u32
        } else {
            0
        };
        let whole = XcastForward { pace_blocks, ..whole };
        let chunks = list
            .iter()
            .enumerate()
            .map(|(p, &owner)| {
                let (a, b) = chunk_range(whole.total_len, list.len(), p);
                XcastChunk { owner, data: m.payload.slice(a..b) }
            })
            .collect();
        debug!(op_id = m.op_id, bytes = m.payload.len(), members = list.len(), "xcast op on scatter-allgather");
        let meta =
            XcastForward { payload: Bytes::new(), movement: super::way::Way::ScatterAllgather.id(), ..whole.clone() };
        self.bulk_pass_chunks(ctx, &meta, chunks);
        self.bulk_serve(ctx, &whole);
        whole
    }

    /// A chunk forward from the parent.
    pub(super) fn on_bulk_forward(&mut self, ctx: &mut Ctx<'_>, from: Rank, mut m: XcastForward) {
        let op = m.op_id;
        // Held whole already (a replay came first): this daemon served the exchange from it
        // and passed the whole payload to every child.
        if let Some(b) = self.bulk.ops.get(&op) {
            // Chunks again (from a new parent after a repair): pass on those not passed yet.
            let me = ctx.topo.me();
            let new: Vec<XcastChunk> = std::mem::take(&mut m.chunks)
                .into_iter()
                .filter(|c| c.owner != me && !b.passed.iter().any(|p| p.owner == c.owner))
                .collect();
            let meta = b.meta.clone();
            self.bulk_pass_chunks(ctx, &meta, new.clone());
            if let Some(b) = self.bulk.ops.get_mut(&op) {
                b.passed.extend(new);
            }
            return;
        }
        let known = op < self.next_deliver
            || self.awaiting_processed.as_ref().is_some_and(|a| a.op_id == op)
            || self.buffered.contains_key(&op)
            || self.bulk.finished.iter().any(|(o, _, _)| *o == op);
        if known {
            debug!(op_id = op, from, "scatter-allgather chunks for an op held here dropped");
            return;
        }
        if ctx.topo.is_root() || m.total_len > MAX_INFLATED as u64 || !m.excluded.is_sorted() {
            let reason = format!("xcast op {op}: malformed scatter-allgather forward from daemon {from}");
            return ctx.out.push(Effect::Dropped { from, reason });
        }
        let (me, list) = (ctx.topo.me(), members(ctx.topo.size(), &m.excluded));
        let chunks = std::mem::take(&mut m.chunks);
        let passed: Vec<XcastChunk> = chunks.iter().filter(|c| c.owner != me).cloned().collect();
        let own = self.bulk_pass_chunks(ctx, &m, chunks);
        let want = list.binary_search(&me).map(|p| chunk_range(m.total_len, list.len(), p));
        let own = match (own, want) {
            (Some(d), Ok((a, b))) if d.len() == b - a => d,
            _ => {
                let reason = format!("xcast op {op}: scatter-allgather forward without this daemon's chunk");
                return ctx.out.push(Effect::Dropped { from, reason });
            }
        };
        let ex = match Exchange::new(list, me, own) {
            Ok(ex) => self.bulk.with_detours(ex.paced(m.pace_blocks)),
            Err(e) => return ctx.out.push(Effect::Dropped { from, reason: format!("xcast op {op}: {e}") }),
        };
        self.bulk.ops.insert(op, BulkOp { meta: m, ex, passed });
        for b in self.bulk.early.remove(&op).unwrap_or_default() {
            self.bulk_receive(ctx, b);
        }
        self.bulk_drive(ctx, op);
    }

    /// Pass every chunk but this daemon's own toward its owner (to the child whose subtree
    /// holds it); returns this daemon's chunk.
    fn bulk_pass_chunks(&mut self, ctx: &mut Ctx<'_>, meta: &XcastForward, chunks: Vec<XcastChunk>) -> Option<Bytes> {
        let mut own = None;
        let mut by_child: BTreeMap<Rank, Vec<XcastChunk>> = BTreeMap::new();
        for c in chunks {
            match ctx.topo.route_to(c.owner) {
                Route::Local => own = Some(c.data),
                Route::Down(child) => by_child.entry(child).or_default().push(c),
                // Not below us in our view (a repair in flight): the degrade delivers it.
                Route::Up(_) | Route::Unreachable => {
                    debug!(op_id = meta.op_id, owner = c.owner, "scatter-allgather chunk with no route down dropped")
                }
            }
        }
        for (child, chunks) in by_child {
            if self.children.get(&child).is_some_and(|s| !s.unreachable) {
                ctx.send(child, Body::Forward(XcastForward { chunks, ..meta.clone() }));
            }
        }
        own
    }

    /// This daemon holds the whole payload of exchange op `m`: send every block its partners
    /// still expect from it, at once, whatever it received so far. A daemon that got the
    /// whole payload by a replay instead of its chunks must still do its part, or partners
    /// that got chunks would wait for it forever. Once per op.
    pub(super) fn bulk_serve(&mut self, ctx: &mut Ctx<'_>, m: &XcastForward) {
        let (me, op) = (ctx.topo.me(), m.op_id);
        if !m.exchange || m.payload.len() as u64 != m.total_len {
            return;
        }
        let list = members(ctx.topo.size(), &m.excluded);
        let Ok(pos) = list.binary_search(&me) else { return };
        let blocks = || -> Vec<Bytes> {
            (0..list.len())
                .map(|p| {
                    let (a, b) = chunk_range(m.total_len, list.len(), p);
                    m.payload.slice(a..b)
                })
                .collect()
        };
        // Finished here: only paced messages it still owes are left to send (at once: a
        // repair is under way, and a ready may never come).
        if let Some(i) = self.bulk.finished.iter().position(|(o, _, _)| *o == op) {
            let ex = &mut self.bulk.finished[i].1;
            if ex.owes_sends() {
                let mut out = Vec::new();
                if let Err(e) = ex.serve(blocks(), &mut out) {
                    ctx.out.push(Effect::Dropped { from: m.origin, reason: format!("xcast op {op}: {e}") });
                }
                Self::bulk_send(ctx, op, ex, out);
            }
            return;
        }
        let blocks = blocks();
        let ex = match self.bulk.ops.remove(&op) {
            Some(b) => Ok(b.ex),
            None => Exchange::new(list, me, blocks[pos].clone()).map(|ex| self.bulk.with_detours(ex)),
        };
        self.bulk.early.remove(&op);
        let mut ex = match ex {
            Ok(ex) => ex,
            Err(e) => return ctx.out.push(Effect::Dropped { from: m.origin, reason: format!("xcast op {op}: {e}") }),
        };
        let mut out = Vec::new();
        if let Err(e) = ex.serve(blocks, &mut out) {
            ctx.out.push(Effect::Dropped { from: m.origin, reason: format!("xcast op {op}: {e}") });
        }
        Self::bulk_send(ctx, op, &ex, out);
        self.bulk_finished(ctx, op, ex);
    }

    /// A block message (direct, or along the tree on a detour).
    pub fn on_block(&mut self, ctx: &mut Ctx<'_>, from: Rank, m: XcastBlock) {
        self.sync_children(ctx);
        let op = m.op_id;
        if self.bulk.ops.contains_key(&op) {
            self.bulk_receive(ctx, m);
            return self.bulk_drive(ctx, op);
        }
        // A ready for an exchange complete here that still owes that step's message.
        if m.ready {
            if let Some(i) = self.bulk.finished.iter().position(|(o, _, _)| *o == op) {
                let ex = &mut self.bulk.finished[i].1;
                if let Err(e) = ex.receive_ready(m.sender, m.step) {
                    let reason = format!("xcast op {op}: {e}");
                    return ctx.out.push(Effect::Dropped { from: m.sender, reason });
                }
                let mut out = Vec::new();
                let advanced = ex.advance(&mut out);
                Self::bulk_send(ctx, op, ex, out);
                if let Err(e) = advanced {
                    ctx.out.push(Effect::Dropped { from: ctx.topo.me(), reason: format!("xcast op {op}: {e}") });
                }
                return;
            }
        }
        let late = op < self.next_deliver
            || self.buffered.contains_key(&op)
            || self.awaiting_processed.as_ref().is_some_and(|a| a.op_id == op)
            || self.bulk.finished.iter().any(|(o, _, _)| *o == op);
        if late {
            return debug!(op_id = op, sender = m.sender, "scatter-allgather block for an op held here");
        }
        // Its forward has not come yet: hold it (at most one per sender and step).
        if !self.bulk.early.contains_key(&op) && self.bulk.early.len() >= MAX_EARLY_OPS {
            let reason = format!("xcast op {op}: blocks for more than {MAX_EARLY_OPS} ops ahead of their forwards");
            return ctx.out.push(Effect::Dropped { from, reason });
        }
        let early = self.bulk.early.entry(op).or_default();
        let dup = early.iter().any(|b| b.sender == m.sender && b.step == m.step && b.ready == m.ready);
        if !dup && early.len() < MAX_EARLY_PER_OP {
            early.push(m);
        }
    }

    fn bulk_receive(&mut self, ctx: &mut Ctx<'_>, m: XcastBlock) {
        let Some(b) = self.bulk.ops.get_mut(&m.op_id) else { return };
        let got = if m.ready {
            b.ex.receive_ready(m.sender, m.step)
        } else {
            b.ex.receive(m.sender, m.step, m.first, m.blocks)
        };
        match got {
            Ok(Received::Accepted) => {}
            Ok(Received::Duplicate) => debug!(op_id = m.op_id, sender = m.sender, "duplicate scatter-allgather block"),
            Err(e) => {
                let reason = format!("xcast op {}: {e}", m.op_id);
                ctx.out.push(Effect::Dropped { from: m.sender, reason });
            }
        }
    }

    fn bulk_send(ctx: &mut Ctx<'_>, op: u64, ex: &Exchange, out: Vec<Outgoing>) {
        let me = ctx.topo.me();
        for o in out {
            let detour = ex.detoured(o.to);
            let m =
                XcastBlock { op_id: op, step: o.step, first: o.first, blocks: o.blocks, sender: me, ready: o.ready };
            if detour {
                ctx.send(o.to, Body::Xblock(m));
            } else {
                ctx.send_direct(o.to, Body::Xblock(m));
            }
        }
    }

    /// Send what op `op`'s exchange can send now; once it holds every chunk, hand the whole
    /// payload to the framing (delivered in op-id order).
    fn bulk_drive(&mut self, ctx: &mut Ctx<'_>, op: u64) {
        let Some(b) = self.bulk.ops.get_mut(&op) else { return };
        let mut out = Vec::new();
        let advanced = b.ex.advance(&mut out);
        Self::bulk_send(ctx, op, &b.ex, out);
        if let Err(e) = advanced {
            return ctx.out.push(Effect::Dropped { from: ctx.topo.me(), reason: format!("xcast op {op}: {e}") });
        }
        if !b.ex.is_complete() {
            return;
        }
        let Some(BulkOp { meta, ex, .. }) = self.bulk.ops.remove(&op) else { return };
        let whole = ex.output();
        self.bulk_finished(ctx, op, ex);
        match whole {
            Ok(payload) if payload.len() as u64 == meta.total_len => {
                debug!(op_id = op, bytes = payload.len(), "scatter-allgather op reassembled");
                self.receive_op(ctx, XcastForward { payload, exchange: true, ..meta });
            }
            Ok(p) => {
                let reason =
                    format!("xcast op {op}: chunks reassemble to {} bytes, the op says {}", p.len(), meta.total_len);
                ctx.out.push(Effect::Dropped { from: meta.origin, reason });
            }
            Err(e) => ctx.out.push(Effect::Dropped { from: meta.origin, reason: format!("xcast op {op}: {e}") }),
        }
    }

    fn bulk_finished(&mut self, ctx: &mut Ctx<'_>, op: u64, ex: Exchange) {
        // Past the bound, forget the oldest exchange that owes nothing: one that still owes a
        // paced step's message stays until a ready takes it (or for FINISHED_KEEP_NS, after
        // which its partner has had the whole payload from a repair's degrade).
        let mut held: usize =
            ex.state_bytes() + self.bulk.finished.iter().map(|(_, e, _)| e.state_bytes()).sum::<usize>();
        while held > ctx.cfg.keep_finished_bytes && self.bulk.finished.len() >= KEEP_FINISHED_MIN {
            let Some(i) = self.bulk.finished.iter().position(|(_, e, _)| !e.owes_sends()) else { break };
            if let Some((_, e, _)) = self.bulk.finished.remove(i) {
                held -= e.state_bytes();
            }
        }
        self.bulk.finished.push_back((op, ex, ctx.now));
        ctx.out.push(Effect::ArmTimer { at: ctx.now.saturating_add(FINISHED_KEEP_NS) });
    }

    /// Forget finished exchanges older than [`FINISHED_KEEP_NS`].
    pub(super) fn bulk_tick(&mut self, ctx: &mut Ctx<'_>) {
        while self.bulk.finished.front().is_some_and(|(_, _, at)| ctx.now >= at.saturating_add(FINISHED_KEEP_NS)) {
            self.bulk.finished.pop_front();
        }
        if let Some((_, _, at)) = self.bulk.finished.front() {
            ctx.out.push(Effect::ArmTimer { at: at.saturating_add(FINISHED_KEEP_NS) });
        }
    }

    /// Root: a repair came; every bulk op not yet complete degrades to the whole-payload
    /// tree, sent to each child whose subtree lacks it.
    /// (The root retains every op until it is complete, so the incomplete exchange ops are
    /// exactly its retained ones marked `exchange` from `completed_below` on.)
    pub(super) fn bulk_degrade(&mut self, ctx: &mut Ctx<'_>) {
        let ops: Vec<XcastForward> =
            self.retained.range(self.completed_below..).map(|(_, m)| m).filter(|m| m.exchange).cloned().collect();
        for m in ops {
            debug!(op_id = m.op_id, "repair during a scatter-allgather op: degraded to the whole-payload tree");
            self.forward_to_lacking(ctx, &m);
        }
    }

    /// A repair reached this (non-root) daemon: pass the subtree chunks of every op still in
    /// flight here again, by the new routes (receivers pass on only what they lack).
    pub(super) fn bulk_repass(&mut self, ctx: &mut Ctx<'_>) {
        let ops: Vec<(XcastForward, Vec<XcastChunk>)> =
            self.bulk.ops.values().map(|b| (b.meta.clone(), b.passed.clone())).collect();
        for (meta, chunks) in ops {
            debug!(op_id = meta.op_id, chunks = chunks.len(), "repair: scatter-allgather chunks passed again");
            self.bulk_pass_chunks(ctx, &meta, chunks);
        }
    }

    /// A repair reached this (non-root) daemon: blocks on a detour may have died with a relay
    /// (or gone to a parent that was already dead); send them again by the new routes, for
    /// running and finished exchanges alike (receivers drop what they hold).
    pub(super) fn bulk_resend_detours(&mut self, ctx: &mut Ctx<'_>) {
        let running = self.bulk.ops.iter().map(|(op, b)| (*op, &b.ex));
        let finished = self.bulk.finished.iter().map(|(op, ex, _)| (*op, ex));
        for (op, ex) in running.chain(finished) {
            for peer in ex.detours().filter(|&p| ctx.topo.is_alive(p)).collect::<Vec<_>>() {
                let mut out = ex.sent_to(peer);
                out.extend(ex.ready_sent_to(peer));
                if !out.is_empty() {
                    debug!(op_id = op, peer, "repair: scatter-allgather blocks on a detour sent again");
                }
                Self::bulk_send(ctx, op, ex, out);
            }
        }
    }

    /// The lateral link to `peer` was lost: its blocks, sent and to come, take the tree.
    pub(super) fn bulk_detour(&mut self, ctx: &mut Ctx<'_>, peer: Rank) {
        self.bulk.lateral_lost.insert(peer);
        let running = self.bulk.ops.iter_mut().map(|(op, b)| (*op, &mut b.ex));
        let finished = self.bulk.finished.iter_mut().map(|(op, ex, _)| (*op, ex));
        for (op, ex) in running.chain(finished) {
            if ex.detour(peer) {
                debug!(op_id = op, peer, "lateral link lost: scatter-allgather blocks take the tree");
                let mut out = ex.sent_to(peer);
                out.extend(ex.ready_sent_to(peer));
                Self::bulk_send(ctx, op, ex, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_payload_once_in_member_order() {
        for total in [0u64, 1, 2, 7, 64, 1000, 4097] {
            for count in 1..=40usize {
                let mut next = 0usize;
                for p in 0..count {
                    let (a, b) = chunk_range(total, count, p);
                    assert_eq!(a, next, "total {total} count {count} pos {p}");
                    assert!(b >= a);
                    next = b;
                }
                assert_eq!(next as u64, total);
            }
        }
        assert_eq!(members(6, &[1, 4]), vec![0, 2, 3, 5]);
    }
}
