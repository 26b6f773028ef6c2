//! The fence vocabulary every caller sees: participant sets, signatures, requests, fence ids
//! and the errors a fence reports.
//!
//! Owns no state and sends nothing. Do not break: a `FenceSignature` is canonical (sorted,
//! unique daemons) once built with `new`, and the same error is reported on every participant,
//! so a `FenceError` must stay a pure value (no daemon-local detail beyond the ranks it names).

use bytes::Bytes;
use dvm_rml::topology::Rank;

/// The daemons taking part in a fence.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Participants {
    /// Every daemon of the DVM. Once any daemon has failed, every fence over `All` fails with
    /// `LostConnection` (pending or started later); use an explicit list over the survivors.
    All,
    /// These daemons (sorted, unique).
    Daemons(Vec<Rank>),
}

impl Participants {
    pub fn contains(&self, r: Rank) -> bool {
        match self {
            Participants::All => true,
            Participants::Daemons(d) => d.binary_search(&r).is_ok(),
        }
    }

    /// Canonical (sorted, unique), non-empty and inside a DVM of `size` daemons.
    pub fn check(&self, size: u32) -> Result<(), String> {
        let Participants::Daemons(d) = self else { return Ok(()) };
        if d.is_empty() {
            return Err("fence participant list is empty".into());
        }
        if let Some(w) = d.windows(2).find(|w| w[0] >= w[1]) {
            return Err(format!("fence participants not sorted and unique ({} then {})", w[0], w[1]));
        }
        match d.last() {
            Some(&last) if last >= size => Err(format!("fence participant daemon {last} is outside the DVM of {size}")),
            _ => Ok(()),
        }
    }
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
    /// Bytes the caller expects a collecting fence to release, for `auto` to price the first
    /// one over a signature (later ones use what the previous one released). Every
    /// participant must pass the same value: derive it from what all of them hold (the procs
    /// array, a benchmark's size), never from this daemon's own data.
    pub size_hint: Option<u64>,
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
    #[error("fence abandoned by its owner on daemon {daemon}")]
    Abandoned { daemon: Rank },
}

pub(super) type FenceResult = Result<Bytes, FenceError>;
