//! Fence: barrier and modex over a participant set.
//! (Skeleton: public types are fixed; the state machine is being written.)

use bytes::Bytes;
use dvm_proto::grpcomm::{FenceContrib, FenceRelease};
use dvm_rml::topology::{Rank, RepairDelta};

use crate::Ctx;

/// The daemons taking part in a fence.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Participants {
    /// Every daemon of the DVM (as of the fence's start; failed daemons are lost ones).
    All,
    /// These daemons (sorted, unique).
    Daemons(Vec<Rank>),
}

/// Canonical participant set: an opaque key (nspace + ranks, or nspace + wildcard) plus the
/// participating daemons. The k-th fence over one signature is fence k on every daemon.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FenceSignature {
    pub key: Bytes,
    pub participants: Participants,
}

impl FenceSignature {
    /// Canonicalizes the daemon list (sorted, duplicates removed).
    pub fn new(key: impl Into<Bytes>, participants: Participants) -> Self {
        let participants = match participants {
            Participants::All => Participants::All,
            Participants::Daemons(mut d) => {
                d.sort_unstable();
                d.dedup();
                Participants::Daemons(d)
            }
        };
        FenceSignature { key: key.into(), participants }
    }
}

/// One daemon's part in a fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRequest {
    pub sig: FenceSignature,
    /// `PMIX_COLLECT_DATA`: true selects the modex movement, false the barrier.
    pub collect: bool,
    /// This daemon's contribution (ignored by a barrier).
    pub data: Bytes,
    /// Fail with `Timeout` if not complete after this many nanoseconds.
    pub timeout: Option<u64>,
}

/// Identifies one fence: signature and sequence number.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FenceId {
    pub sig: FenceSignature,
    pub seq: u64,
}

/// Why a fence failed. The same error is reported on every participant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FenceError {
    #[error("fence timed out after {timeout_ns} ns (detected by daemon {daemon})")]
    Timeout { timeout_ns: u64, daemon: Rank },
    #[error("fence lost participant daemon(s) {lost:?}")]
    LostConnection { lost: Vec<Rank> },
    #[error("fence movement mismatch: daemon {daemon} used {got} where {expected} was expected")]
    MovementMismatch { expected: String, got: String, daemon: Rank },
    #[error("daemon {daemon} is not a participant of this fence")]
    NotParticipant { daemon: Rank },
    #[error("fence protocol error: {0}")]
    Protocol(String),
}

#[derive(Debug, Default)]
pub(crate) struct FenceState {}

impl FenceState {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn start(&mut self, _ctx: &mut Ctx<'_>, _req: FenceRequest) -> FenceId {
        todo!()
    }
    pub fn on_contrib(&mut self, _ctx: &mut Ctx<'_>, _from: Rank, _m: FenceContrib) {
        todo!()
    }
    pub fn on_release(&mut self, _ctx: &mut Ctx<'_>, _from: Rank, _m: FenceRelease) {
        todo!()
    }
    pub fn topology_changed(&mut self, _ctx: &mut Ctx<'_>, _delta: &RepairDelta) {}
    pub fn peer_unreachable(&mut self, _ctx: &mut Ctx<'_>, _peer: Rank) {}
    pub fn tick(&mut self, _ctx: &mut Ctx<'_>) {}
    pub fn state_bytes(&self) -> usize {
        0
    }
    pub fn is_quiescent(&self) -> bool {
        true
    }
}
