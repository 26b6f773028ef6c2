//! The tree movement of a fence: every daemon whose subtree holds a participant merges its
//! slots and sends ONE contribution to its parent; the topology root produces the result and
//! the framing releases it down. A barrier rolls up counts only; a collecting fence rolls up
//! entries (per-daemon data) sorted by daemon and releases their concatenation.
//!
//! Owns: what converged means here (every slot in, movements agreed by weighted majority),
//! what goes up (the merge), what the root answers, and the check of a child's entries.

use bytes::Bytes;
use dvm_proto::grpcomm::{grpcomm_msg::Body, FenceContrib};
use dvm_rml::topology::{Rank, Route};
use tracing::debug;

use super::record::SigRecord;
use super::rollup::{fail, retire};
use super::run::Run;
use super::tracker::{self, Agreement, OwnSlot, SubtreeContrib};
use super::types::{FenceError, FenceResult, FenceSignature};
use super::wire;
use crate::{Ctx, Movement};

/// This daemon starts fence `seq` on tree movement `m` (barrier or gather) with `data`
/// (empty for a barrier). Allgather blocks that came early say a participant runs another
/// movement: the fence fails by name.
pub(super) fn start(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, rec: &mut SigRecord, m: Movement, data: Bytes) {
    let Some(t) = rec.trackers.get_mut(&seq) else { return };
    t.own = OwnSlot::Filled { movement: m.id(), data };
    if let Run::Pending { early } = std::mem::replace(&mut t.run, Run::Tree) {
        if let Some((from, b)) = early.first() {
            let err = FenceError::MovementMismatch {
                expected: m.name().into(),
                got: Movement::name_of(b.movement),
                daemon: *from,
            };
            return fail(ctx, sig, seq, rec, err);
        }
    }
    progress(ctx, sig, seq, rec);
}

/// Child `from`'s contribution (its slot exists, the fence has not failed here): checked,
/// put in its slot once, then the fence progresses.
pub(super) fn on_contrib(
    ctx: &mut Ctx<'_>,
    sig: &FenceSignature,
    seq: u64,
    rec: &mut SigRecord,
    from: Rank,
    m: FenceContrib,
) {
    let me = ctx.topo.me();
    if let Err(reason) = check_entries(ctx, sig, from, &m) {
        return fail(ctx, sig, seq, rec, FenceError::Protocol(format!("daemon {me}, fence {seq}: {reason}")));
    }
    let Some(slot) = rec.trackers.get_mut(&seq).and_then(|t| t.slot_mut(from)) else { return };
    if slot.filled {
        debug!(rank = me, from, seq, "duplicate fence contribution dropped");
        return;
    }
    slot.filled = true;
    slot.movement = m.movement;
    slot.contrib = Some(SubtreeContrib { count: m.count, entries: m.entries });
    progress(ctx, sig, seq, rec);
}

/// If every slot is in: the root completes the fence, anyone else sends the merge up once.
pub(super) fn progress(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, rec: &mut SigRecord) {
    let me = ctx.topo.me();
    let Some(t) = rec.trackers.get_mut(&seq) else { return };
    if t.failed.is_some() || t.sent_up || !t.ready() {
        return;
    }
    let movement = match t.agreement(me) {
        Agreement::Agreed(m) => m,
        Agreement::Mismatch { expected, got, daemon } => {
            let err = FenceError::MovementMismatch {
                expected: Movement::name_of(expected),
                got: Movement::name_of(got),
                daemon,
            };
            return fail(ctx, sig, seq, rec, err);
        }
    };
    let gather = movement == Movement::TreeGatherRelease.id();
    let merged = match t.merge(me, gather) {
        Ok(m) => m,
        Err(e) => return fail(ctx, sig, seq, rec, FenceError::Protocol(format!("daemon {me}, fence {seq}: {e}"))),
    };
    if ctx.topo.is_root() {
        let result = root_result(ctx, sig, seq, movement, merged);
        retire(ctx, sig, seq, rec, result, None);
        return;
    }
    t.sent_up = true;
    let m = FenceContrib {
        sig: Some(wire::sig_to_wire(sig)),
        seq,
        movement,
        topo_epoch: ctx.topo.epoch(),
        count: merged.count,
        entries: merged.entries,
        status: 0,
        error: String::new(),
    };
    if let Some(parent) = ctx.topo.parent() {
        ctx.send(parent, Body::Contrib(m));
    }
}

fn root_result(ctx: &Ctx<'_>, sig: &FenceSignature, seq: u64, movement: u32, merged: SubtreeContrib) -> FenceResult {
    let expected = tracker::participant_count(ctx.topo, &sig.participants);
    if u64::from(merged.count) != expected {
        return Err(FenceError::Protocol(format!(
            "root daemon {} counted {} participants in fence {seq}, expected {expected}",
            ctx.topo.me(),
            merged.count
        )));
    }
    match Movement::from_id(movement) {
        Some(Movement::TreeBarrier) => Ok(Bytes::new()),
        Some(Movement::TreeGatherRelease) => Ok(tracker::concat(&merged.entries)),
        _ => Err(FenceError::Protocol(format!(
            "every participant chose {}, which cannot carry a fence",
            Movement::name_of(movement)
        ))),
    }
}

/// A gather contribution must hold one entry per counted participant of the sender's subtree.
fn check_entries(ctx: &Ctx<'_>, sig: &FenceSignature, from: Rank, m: &FenceContrib) -> Result<(), String> {
    if m.count == 0 {
        return Err(format!("child {from} contributed zero participants"));
    }
    if m.movement != Movement::TreeGatherRelease.id() {
        return Ok(());
    }
    if m.entries.len() != m.count as usize {
        return Err(format!("child {from} counted {} participants but sent {} entries", m.count, m.entries.len()));
    }
    let mut prev = None;
    for e in &m.entries {
        if prev.is_some_and(|p| p >= e.daemon) {
            return Err(format!("child {from} sent entries out of daemon order at {}", e.daemon));
        }
        prev = Some(e.daemon);
        if !sig.participants.contains(e.daemon) || ctx.topo.route_to(e.daemon) != Route::Down(from) {
            return Err(format!(
                "child {from} sent an entry for daemon {}, not a participant of its subtree",
                e.daemon
            ));
        }
    }
    Ok(())
}
