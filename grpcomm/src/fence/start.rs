//! A participant's own start of a fence: choosing its movement from inputs every participant
//! holds alike ([`FenceShape`]), and holding back a collecting fence priced by bytes until the
//! previous collecting fence over its signature has retired here.
//!
//! Owns: the shape a fence is priced with, the deferred starts, and when they begin.
//! Never: prices with anything a participant holds alone (its own data, the repaired tree).
//! Invariant: a deferred start has its tracker (own slot waiting, so what comes early is held)
//! and, with a timeout, its deadline; a deferred fence that fails or times out is retired like
//! any other and its caller hears (`retire` treats it as started).

use std::collections::BTreeSet;

use bytes::Bytes;
use dvm_rml::topology::Rank;
use tracing::debug;

use super::record::SigRecord;
use super::run::Run;
use super::tracker::{self, child_slots, FenceTracker};
use super::types::{FenceRequest, FenceSignature, Participants};
use super::FenceState;
use crate::movement::FenceShape;
use crate::{Ctx, Effect, FenceMovementMode};

/// A local start whose movement waits for the previous collecting fence.
#[derive(Debug)]
pub(super) struct Deferred {
    req: FenceRequest,
    mode: FenceMovementMode,
}

/// Start fence `seq` here now, or, if it is priced by the bytes of an earlier collecting fence
/// still in flight here, once that one has retired. The tracker exists afterwards either way.
pub(super) fn begin_or_defer(
    ctx: &mut Ctx<'_>,
    sig: &FenceSignature,
    seq: u64,
    rec: &mut SigRecord,
    req: FenceRequest,
    mode: FenceMovementMode,
    lateral_lost: &BTreeSet<Rank>,
) {
    let t =
        rec.trackers.entry(seq).or_insert_with(|| FenceTracker::new(true, child_slots(ctx.topo, &sig.participants)));
    // The deadline runs from the request, deferred or not.
    if let Some(timeout) = req.timeout {
        let at = ctx.now.saturating_add(timeout);
        t.deadline = Some(at);
        t.timeout_ns = timeout;
        ctx.out.push(Effect::ArmTimer { at });
    }
    let earlier_in_flight =
        rec.trackers.range(..seq).any(|(_, t)| t.collect && t.started()) || rec.deferred.range(..seq).next().is_some();
    if req.collect && mode.prices_bytes() && earlier_in_flight {
        debug!(rank = ctx.topo.me(), key = ?sig.key, seq, "collecting fence waits for the previous one to price it");
        rec.deferred.insert(seq, Deferred { req, mode });
        return;
    }
    begin(ctx, sig, seq, rec, req, mode, lateral_lost);
}

impl FenceState {
    /// Begin every deferred start whose earlier collecting fences have all retired here, in
    /// sequence order (called after every input). One whose fence already failed here (a
    /// timeout, an abandon) waits for its retirement instead.
    pub(crate) fn after_input(&mut self, ctx: &mut Ctx<'_>) {
        for (sig, rec) in self.sigs.iter_mut().filter(|(_, r)| !r.deferred.is_empty()) {
            while let Some((&seq, _)) = rec.deferred.first_key_value() {
                let blocked = rec.trackers.range(..seq).any(|(_, t)| t.collect && t.started())
                    || rec.trackers.get(&seq).is_none_or(|t| t.failed.is_some());
                if blocked {
                    break;
                }
                let Some(d) = rec.deferred.remove(&seq) else { break };
                begin(ctx, sig, seq, rec, d.req, d.mode, &self.lateral_lost);
            }
        }
    }
}

/// This daemon's own start of fence `seq` (its tracker exists, with its deadline): choose the
/// movement and put its part in.
fn begin(
    ctx: &mut Ctx<'_>,
    sig: &FenceSignature,
    seq: u64,
    rec: &mut SigRecord,
    req: FenceRequest,
    mode: FenceMovementMode,
    lateral_lost: &BTreeSet<Rank>,
) {
    let shape = shape_of(ctx, sig, rec, &req);
    let movement = mode.for_fence(req.collect, &shape, &ctx.cfg.fence_costs());
    if let Some(t) = rec.trackers.get_mut(&seq) {
        t.collect = req.collect;
    }
    debug!(rank = ctx.topo.me(), key = ?sig.key, seq, movement = movement.name(), est = shape.bytes, "fence started");
    // A barrier carries no data on any movement (a real one arrives with 8 bytes).
    let data = if req.collect { req.data } else { Bytes::new() };
    Run::begin(movement, ctx, sig, seq, rec, data, lateral_lost);
}

/// What `auto` prices fence `req` with: the participant count and the deepest participant's
/// depth in the failure-free tree (never the repaired one, which daemons learn at different
/// moments), and the bytes the previous collecting fence over the signature released here —
/// or, for the first, the caller's hint.
fn shape_of(ctx: &Ctx<'_>, sig: &FenceSignature, rec: &SigRecord, req: &FenceRequest) -> FenceShape {
    let tree = ctx.topo.repaired().tree();
    let deepest = match &sig.participants {
        Participants::All => tree.size().saturating_sub(1),
        Participants::Daemons(d) => d.last().copied().unwrap_or(0),
    };
    let bytes = if req.collect { rec.released.map(|(_, b)| b).or(req.size_hint).unwrap_or(0) } else { 0 };
    FenceShape {
        participants: tracker::participant_count(ctx.topo, &sig.participants),
        depth: tree.depth(deepest),
        radix: tree.radix(),
        bytes,
    }
}
