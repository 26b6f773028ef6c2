//! The allgather movement of a fence: the participants exchange blocks over lateral links
//! (`Via::Direct`) on the schedule [`crate::allgather::schedule`] picks from the participant
//! count, and each one completes on its own once it holds every block: no rollup, no release.
//! Relay-only daemons take no part (a block sent to one is dropped by name).
//!
//! Owns: what converged means here (every block held), what to send (each step's blocks, once,
//! when the step begins), what arrives (checked against the schedule; held for its step when
//! early), and the movement check on every block.
//!
//! The framing still owns everything else: the sequence number in the signature keeps
//! back-to-back fences apart (a block for fence N+1 that comes before this daemon started N+1
//! waits in that fence's tracker); errors (timeout, mismatch, a malformed block) go up the tree
//! and come down as the root's error release to every participant; a repair that loses a
//! participant ends the exchange here at once with the `LostConnection` every survivor derives
//! alike.
//!
//! Lateral loss: a lost link to a partner that is still alive (`peer_unreachable`) is never a
//! tree loss and never repairs anything. The exchange sends that partner's blocks again, and
//! every later one, along the tree (`FenceBlock.sender` names the participant, the hop is a
//! relay); the last exchange finished per signature is kept to do the same for blocks sent
//! just before it finished (a partner is at most one fence behind); blocks on a detour go
//! again after every repair. Receivers drop what they already hold.
//!
//! Traps: a participant that completed may see an error release for the same fence later
//! (another participant timed out first); it keeps its result and forwards the error down. A
//! running exchange ignores success releases (a new parent pushes its results after a
//! repair): finishing early would leave its partners without its blocks. When a participant
//! is lost mid-exchange, survivors that already held every block keep their bytes and the
//! others fail with the `LostConnection` every survivor derives alike — there is no release to
//! make them agree, and the simulator's checks say so.

use std::collections::BTreeSet;

use bytes::Bytes;
use dvm_proto::grpcomm::{grpcomm_msg::Body, FenceBlock};
use dvm_rml::topology::Rank;
use tracing::debug;

use super::record::SigRecord;
use super::rollup::{fail, retire};
use super::run::Run;
use super::tracker::{OwnSlot, MAX_EARLY_BLOCKS};
use super::types::{FenceError, FenceSignature, Participants};
use super::wire;
use crate::allgather::exchange::{Exchange, Outgoing, Received};
use crate::{Ctx, Effect, Movement};

const ALLGATHER: u32 = Movement::Allgather as u32;

/// The canonical participant list (every daemon for `Participants::All`).
fn members(ctx: &Ctx<'_>, p: &Participants) -> Vec<Rank> {
    match p {
        Participants::All => (0..ctx.topo.size()).collect(),
        Participants::Daemons(d) => d.clone(),
    }
}

fn mismatch(expected: u32, got: u32, daemon: Rank) -> FenceError {
    FenceError::MovementMismatch { expected: Movement::name_of(expected), got: Movement::name_of(got), daemon }
}

/// This daemon starts fence `seq` on the allgather with its own block `data`; blocks for a
/// partner in `lateral_lost` take the tree from the start.
pub(super) fn start(
    ctx: &mut Ctx<'_>,
    sig: &FenceSignature,
    seq: u64,
    rec: &mut SigRecord,
    data: Bytes,
    lateral_lost: &BTreeSet<Rank>,
) {
    let me = ctx.topo.me();
    let list = members(ctx, &sig.participants);
    let Some(t) = rec.trackers.get_mut(&seq) else { return };
    t.own = OwnSlot::Filled { movement: ALLGATHER, data: Bytes::new() };
    // A child whose subtree rolled a tree contribution up runs another movement.
    if let Some(s) = t.children.iter().find(|s| s.filled) {
        let err = mismatch(ALLGATHER, s.movement, s.child);
        return fail(ctx, sig, seq, rec, err);
    }
    let ex = match Exchange::new(list, me, data) {
        Ok(mut ex) => {
            lateral_lost.iter().for_each(|&p| {
                ex.detour(p);
            });
            ex
        }
        Err(e) => return fail(ctx, sig, seq, rec, FenceError::Protocol(format!("daemon {me}, fence {seq}: {e}"))),
    };
    debug!(rank = me, seq, schedule = ex.schedule().kind().name(), steps = ex.schedule().steps(), "allgather started");
    let early = match std::mem::replace(&mut t.run, Run::Allgather(Box::new(ex))) {
        Run::Pending { early } => early,
        _ => Vec::new(),
    };
    for (from, m) in early {
        on_block(ctx, from, m, sig, seq, rec);
    }
    drive(ctx, sig, seq, rec);
}

/// A block message from `from` for fence `seq`, whose tracker exists.
pub(super) fn on_block(
    ctx: &mut Ctx<'_>,
    from: Rank,
    m: FenceBlock,
    sig: &FenceSignature,
    seq: u64,
    rec: &mut SigRecord,
) {
    let me = ctx.topo.me();
    let Some(t) = rec.trackers.get_mut(&seq) else { return };
    if t.failed.is_some() {
        debug!(rank = me, from, seq, "allgather block for a fence that already failed here");
        return;
    }
    let own = match &t.own {
        OwnSlot::Filled { movement, .. } => Some(*movement),
        _ => None,
    };
    match &mut t.run {
        Run::Pending { early } => {
            if early.iter().any(|(f, b)| *f == from && b.step == m.step) {
                debug!(rank = me, from, seq, step = m.step, "duplicate early allgather block");
            } else if early.len() >= MAX_EARLY_BLOCKS {
                let reason = format!("fence {:?}#{seq}: more than {MAX_EARLY_BLOCKS} early allgather blocks", sig.key);
                ctx.out.push(Effect::Dropped { from, reason });
            } else {
                early.push((from, m));
            }
        }
        Run::Tree => {
            let err = mismatch(own.unwrap_or(0), m.movement, from);
            fail(ctx, sig, seq, rec, err);
        }
        Run::Allgather(_) if m.movement != ALLGATHER => fail(ctx, sig, seq, rec, mismatch(ALLGATHER, m.movement, from)),
        Run::Allgather(ex) => match ex.receive(from, m.step, m.first, m.blocks) {
            Ok(Received::Accepted) => drive(ctx, sig, seq, rec),
            Ok(Received::Duplicate) => debug!(rank = me, from, seq, step = m.step, "duplicate allgather block"),
            Err(e) => fail(ctx, sig, seq, rec, FenceError::Protocol(format!("daemon {me}, fence {seq}: {e}"))),
        },
    }
}

/// Put blocks on the wire: straight to the partner, or along the tree when its lateral link
/// was lost (`detour`).
fn send(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, out: Vec<(Outgoing, bool)>) {
    let me = ctx.topo.me();
    let wire_sig = (!out.is_empty()).then(|| wire::sig_to_wire(sig));
    for (o, detour) in out {
        let m = FenceBlock {
            sig: wire_sig.clone(),
            seq,
            movement: ALLGATHER,
            step: o.step,
            first: o.first,
            blocks: o.blocks,
            sender: me,
        };
        if detour {
            ctx.send(o.to, Body::Block(m));
        } else {
            ctx.send_direct(o.to, Body::Block(m));
        }
    }
}

/// The lateral link to `peer` (alive in the topology) was lost: everything already sent to it
/// goes again along the tree, and so does everything later. Once per peer and fence.
pub(super) fn detour(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, rec: &mut SigRecord, peer: Rank) {
    let Some(t) = rec.trackers.get_mut(&seq) else { return };
    let Run::Allgather(ex) = &mut t.run else { return };
    if t.failed.is_some() || !ex.detour(peer) {
        return;
    }
    debug!(rank = ctx.topo.me(), peer, seq, "lateral link lost: allgather blocks take the tree");
    let out = ex.sent_to(peer).into_iter().map(|o| (o, true)).collect();
    send(ctx, sig, seq, out);
}

/// Send everything a finished exchange sent to `peer` again, along the tree.
pub(super) fn send_again(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, ex: &Exchange, peer: Rank) {
    debug!(rank = ctx.topo.me(), peer, seq, "lateral link lost after the fence finished here: blocks take the tree");
    let out = ex.sent_to(peer).into_iter().map(|o| (o, true)).collect();
    send(ctx, sig, seq, out);
}

/// After a repair that lost no participant: blocks on a detour may have died with a relay;
/// send them again (receivers drop what they already hold).
pub(super) fn resend_detours(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, rec: &mut SigRecord) {
    let Some(t) = rec.trackers.get(&seq) else { return };
    let Run::Allgather(ex) = &t.run else { return };
    if t.failed.is_some() {
        return;
    }
    let out: Vec<(Outgoing, bool)> = ex.detours().flat_map(|p| ex.sent_to(p)).map(|o| (o, true)).collect();
    send(ctx, sig, seq, out);
}

/// Send what the exchange can send now; complete the fence once every block is held.
pub(super) fn drive(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, rec: &mut SigRecord) {
    let me = ctx.topo.me();
    let Some(t) = rec.trackers.get_mut(&seq) else { return };
    if t.failed.is_some() {
        return;
    }
    let Run::Allgather(ex) = &mut t.run else { return };
    let mut out = Vec::new();
    let advanced = ex.advance(&mut out);
    let out: Vec<(Outgoing, bool)> = out.into_iter().map(|o| (ex.detoured(o.to), o)).map(|(d, o)| (o, d)).collect();
    send(ctx, sig, seq, out);
    if let Err(e) = advanced {
        return fail(ctx, sig, seq, rec, FenceError::Protocol(format!("daemon {me}, fence {seq}: {e}")));
    }
    if ex.is_complete() {
        let result = ex.output().map_err(|e| FenceError::Protocol(format!("daemon {me}, fence {seq}: {e}")));
        if let Ok(whole) = &result {
            // The exchange is kept until the next one finishes; its blocks become slices of
            // the result (held too) instead of a second copy of the fence's data.
            ex.share_blocks_with(whole);
        }
        retire(ctx, sig, seq, rec, result, None);
    }
}
