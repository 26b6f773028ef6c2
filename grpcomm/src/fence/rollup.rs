//! Completion and error rollup: retiring a fence (remember, release down, emit to the local
//! caller), failing it in this subtree (the root releases the error, anyone else sends it up),
//! and the drop report.
//!
//! Never chooses a movement or opens a tracker. Do not break: a tracker is removed before its
//! result is emitted or forwarded, and only the root turns an error into a release, so every
//! participant reports the same outcome.

use dvm_proto::grpcomm::{grpcomm_msg::Body, FenceContrib};
use dvm_rml::topology::Rank;
use tracing::debug;

use super::record::SigRecord;
use super::tracker::{child_slots, FenceTracker, OwnSlot};
use super::types::{FenceError, FenceId, FenceResult, FenceSignature};
use super::wire;
use crate::{Ctx, Effect};

pub(super) fn emit(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, result: FenceResult) {
    debug!(rank = ctx.topo.me(), key = ?sig.key, seq, ok = result.is_ok(), "fence complete");
    ctx.out.push(Effect::FenceComplete { id: FenceId { sig: sig.clone(), seq }, result });
}

pub(super) fn dropped(ctx: &mut Ctx<'_>, from: Rank, reason: String) {
    debug!(rank = ctx.topo.me(), from, %reason, "fence message dropped");
    ctx.out.push(Effect::Dropped { from, reason });
}

/// Remove the tracker, remember the result, forward it to every child holding a participant
/// (but not back to `from`; a success only for movements that release), then emit it if this
/// daemon started the fence.
pub(super) fn retire(
    ctx: &mut Ctx<'_>,
    sig: &FenceSignature,
    seq: u64,
    rec: &mut SigRecord,
    result: FenceResult,
    from: Option<Rank>,
) {
    let mut t = rec.trackers.remove(&seq);
    // A fence still deferred here ends before it began (an error came down): its caller hears.
    let started = t.as_ref().is_some_and(FenceTracker::started) | rec.deferred.remove(&seq).is_some();
    if let (Ok(data), Some(t)) = (&result, &t) {
        if t.collect && t.started() && rec.released.is_none_or(|(s, _)| s < seq) {
            rec.released = Some((seq, data.len() as u64));
        }
    }
    let release = result.is_err() || t.as_ref().is_none_or(FenceTracker::releases_success);
    if let Some(kept) = t.take().and_then(|t| t.run.outlives_fence()) {
        if result.is_ok() {
            rec.finished = Some((seq, kept));
        }
    }
    rec.remember(seq, result.clone());
    if let Err(e) = &result {
        if !started && sig.participants.contains(ctx.topo.me()) && seq >= rec.started {
            rec.early_errors.insert(seq, e.clone());
        }
    }
    if release {
        release_down(ctx, sig, seq, &result, from);
    }
    if started {
        emit(ctx, sig, seq, result);
    }
}

/// The result to every child whose subtree holds a participant, except `from`.
pub(super) fn release_down(
    ctx: &mut Ctx<'_>,
    sig: &FenceSignature,
    seq: u64,
    result: &FenceResult,
    from: Option<Rank>,
) {
    let msg = wire::release_msg(sig, seq, result);
    for c in child_slots(ctx.topo, &sig.participants) {
        if Some(c) != from {
            ctx.send(c, Body::Release(msg.clone()));
        }
    }
}

/// Fail the fence in this subtree: the root releases the error; anyone else sends it up.
pub(super) fn fail(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, rec: &mut SigRecord, err: FenceError) {
    let Some(t) = rec.trackers.get_mut(&seq) else { return };
    if t.failed.is_some() {
        return;
    }
    debug!(rank = ctx.topo.me(), key = ?sig.key, seq, %err, "fence failed here");
    if ctx.topo.is_root() {
        retire(ctx, sig, seq, rec, Err(err), None);
        return;
    }
    if matches!(err, FenceError::Timeout { daemon, .. } if daemon == ctx.topo.me()) {
        // Give the root one more timeout to answer, then give up locally.
        let at = ctx.now.saturating_add(t.timeout_ns.max(1));
        t.deadline = Some(at);
        ctx.out.push(Effect::ArmTimer { at });
    }
    t.failed = Some(err);
    send_error_up(ctx, sig, seq, t);
}

pub(super) fn send_error_up(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, t: &FenceTracker) {
    let (Some(err), Some(parent)) = (&t.failed, ctx.topo.parent()) else { return };
    let (status, error) = wire::error_to_wire(err);
    let movement = match t.own {
        OwnSlot::Filled { movement, .. } => movement,
        _ => 0,
    };
    let m = FenceContrib {
        sig: Some(wire::sig_to_wire(sig)),
        seq,
        movement,
        topo_epoch: ctx.topo.epoch(),
        count: 0,
        entries: Vec::new(),
        status,
        error,
    };
    ctx.send(parent, Body::Contrib(m));
}
