//! The fence movements as one closed enum with its behaviour: which movement runs one fence on
//! this daemon, that movement's state, and every entry point the framing (`fence.rs`) calls.
//! The framing never looks at a variant; each movement's rules live in its own file
//! (`tree.rs`, `allgather.rs`). A new movement is its file, one variant with one arm per
//! entry point here, and one row in `movement.rs`.
//!
//! Never: decides a movement (the framing does, from inputs every participant holds), or
//! keeps anything a movement does not need after its fence (only `outlives_fence` state).

use std::collections::BTreeSet;

use bytes::Bytes;
use dvm_proto::grpcomm::{FenceBlock, FenceContrib};
use dvm_rml::topology::Rank;

use super::record::SigRecord;
use super::types::{FenceError, FenceSignature};
use super::{allgather, tree};
use crate::allgather::exchange::Exchange;
use crate::{Ctx, Movement};

/// Which movement runs this fence here, with that movement's own state.
#[derive(Debug)]
pub(super) enum Run {
    /// Not started here (a relay, or a participant that has not called the fence yet): the
    /// movement is not chosen yet. Allgather blocks that came early wait here; tree
    /// contributions wait in the tracker's slots.
    Pending { early: Vec<(Rank, FenceBlock)> },
    /// The tree rollup and release; its state is the tracker's slots.
    Tree,
    /// The lateral allgather.
    Allgather(Box<Exchange>),
}

impl Run {
    /// This daemon's own start of fence `seq` on `movement` with its contribution `data`
    /// (empty for a barrier); blocks for partners in `lateral_lost` take the tree at once.
    pub fn begin(
        movement: Movement,
        ctx: &mut Ctx<'_>,
        sig: &FenceSignature,
        seq: u64,
        rec: &mut SigRecord,
        data: Bytes,
        lateral_lost: &BTreeSet<Rank>,
    ) {
        match movement {
            Movement::Allgather => allgather::start(ctx, sig, seq, rec, data, lateral_lost),
            m => tree::start(ctx, sig, seq, rec, m, data),
        }
    }

    /// Let the fence's movement act on what it holds now.
    pub fn progress(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, rec: &mut SigRecord) {
        match rec.trackers.get(&seq).map(|t| &t.run) {
            Some(Run::Allgather(_)) => allgather::drive(ctx, sig, seq, rec),
            Some(Run::Tree | Run::Pending { .. }) => tree::progress(ctx, sig, seq, rec),
            None => {}
        }
    }

    /// A tree contribution from child `from`, whose slot exists and whose fence has not failed
    /// here. Err: the movement running here takes none (the framing fails the fence by it).
    pub fn on_contrib(
        ctx: &mut Ctx<'_>,
        sig: &FenceSignature,
        seq: u64,
        rec: &mut SigRecord,
        from: Rank,
        m: FenceContrib,
    ) -> Result<(), FenceError> {
        match rec.trackers.get(&seq).map(|t| &t.run) {
            Some(Run::Allgather(_)) => Err(FenceError::MovementMismatch {
                expected: Movement::Allgather.name().into(),
                got: Movement::name_of(m.movement),
                daemon: from,
            }),
            Some(Run::Tree | Run::Pending { .. }) => {
                tree::on_contrib(ctx, sig, seq, rec, from, m);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// An allgather block from participant `from` for fence `seq`, whose tracker exists.
    pub fn on_block(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, rec: &mut SigRecord, from: Rank, m: FenceBlock) {
        allgather::on_block(ctx, from, m, sig, seq, rec);
    }

    /// A participant was lost (every survivor derives the same list). True: the movement has
    /// no release to make the survivors agree, so it ends here at once with that error; false:
    /// the error goes up the tree and the root's release ends it.
    pub fn ends_at_a_loss(&self) -> bool {
        matches!(self, Run::Allgather(_))
    }

    /// A repair that lost no participant of this fence: send again what may have died with a
    /// relay.
    pub fn repaired(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, rec: &mut SigRecord) {
        if let Some(Run::Allgather(_)) = rec.trackers.get(&seq).map(|t| &t.run) {
            allgather::resend_detours(ctx, sig, seq, rec);
        }
    }

    /// The lateral link to `peer` (alive in the topology) was lost.
    pub fn peer_unreachable(ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, rec: &mut SigRecord, peer: Rank) {
        if let Some(Run::Allgather(_)) = rec.trackers.get(&seq).map(|t| &t.run) {
            allgather::detour(ctx, sig, seq, rec, peer);
        }
    }

    /// Success releases go down the tree (not for a movement whose participants each finish
    /// on their own).
    pub fn releases_success(&self) -> bool {
        !matches!(self, Run::Allgather(_))
    }

    /// A running movement that finishes by its own exchange ignores success releases (results
    /// pushed to a new child after a repair): finishing early would leave its partners waiting.
    pub fn finishes_on_its_own(&self) -> bool {
        matches!(self, Run::Allgather(_))
    }

    /// What of a finished fence must outlive it (see `SigRecord::finished`), if anything.
    pub fn outlives_fence(self) -> Option<Run> {
        matches!(self, Run::Allgather(_)).then_some(self)
    }

    /// A finished fence's kept state, after a repair: send again what went on a detour.
    pub fn finished_repaired(&self, ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64) {
        if let Run::Allgather(ex) = self {
            for peer in ex.detours().collect::<Vec<_>>() {
                allgather::send_again(ctx, sig, seq, ex, peer);
            }
        }
    }

    /// A finished fence's kept state, after the lateral link to `peer` was lost: what was sent
    /// just before the end may have been lost with it.
    pub fn finished_peer_unreachable(&mut self, ctx: &mut Ctx<'_>, sig: &FenceSignature, seq: u64, peer: Rank) {
        if let Run::Allgather(ex) = self {
            if ex.detour(peer) {
                allgather::send_again(ctx, sig, seq, ex, peer);
            }
        }
    }

    pub fn state_bytes(&self) -> usize {
        match self {
            Run::Pending { early } => early.iter().map(|(_, b)| b.blocks.iter().map(Bytes::len).sum::<usize>()).sum(),
            Run::Tree => 0,
            Run::Allgather(ex) => ex.state_bytes(),
        }
    }
}
