//! The movement table: how each operation travels. A plain table, no plug-ins; forcing a
//! movement (for tests and A/B runs) is configuration. Every participant must hold the same
//! table: the movement id travels with every fence contribution and block, and a mismatch
//! fails the fence by name.
//!
//! Selection uses only inputs every participant of an operation holds identically: the
//! configured [`FenceMovementMode`], the collect flag and the participant count (both from
//! the request and its signature) — never a payload size, which differs per rank.

use std::fmt;
use std::str::FromStr;

/// A way of moving a collective. The ids are wire values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
pub enum Movement {
    /// Whole payload to every child, ACK rollup (xcast).
    TreeBroadcast = 1,
    /// Count rollup to the root, zero-byte release down (fence without data).
    TreeBarrier = 2,
    /// Gather of per-daemon data to the root, release of the concatenation down (modex).
    TreeGatherRelease = 3,
    /// Per-destination slices split at every hop (scatter).
    TreeScatter = 4,
    /// Lateral allgather among the participants (recursive doubling or Bruck), no release.
    Allgather = 5,
}

impl Movement {
    pub fn id(self) -> u32 {
        self as u32
    }

    pub fn from_id(id: u32) -> Option<Movement> {
        match id {
            1 => Some(Movement::TreeBroadcast),
            2 => Some(Movement::TreeBarrier),
            3 => Some(Movement::TreeGatherRelease),
            4 => Some(Movement::TreeScatter),
            5 => Some(Movement::Allgather),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Movement::TreeBroadcast => "tree-broadcast",
            Movement::TreeBarrier => "tree-barrier",
            Movement::TreeGatherRelease => "tree-gather-release",
            Movement::TreeScatter => "tree-scatter",
            Movement::Allgather => "allgather",
        }
    }

    /// Name of a movement id off the wire (which may be unknown).
    pub fn name_of(id: u32) -> String {
        Movement::from_id(id).map_or_else(|| format!("unknown movement {id}"), |m| m.name().to_string())
    }
}

/// Which movement fences use (`fence_movement` in [`crate::Config`], `dvmd --fence-movement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum FenceMovementMode {
    /// Barrier on the tree (zero bytes: a high-radix tree beats a dissemination exchange),
    /// collecting fence on the allgather.
    Auto,
    /// Everything on the tree: barrier rollup, or gather and release.
    #[default]
    Tree,
    /// Everything on the allgather (a barrier exchanges empty blocks).
    Allgather,
}

impl FenceMovementMode {
    pub const ALL: [FenceMovementMode; 3] =
        [FenceMovementMode::Tree, FenceMovementMode::Allgather, FenceMovementMode::Auto];

    pub fn name(self) -> &'static str {
        match self {
            FenceMovementMode::Auto => "auto",
            FenceMovementMode::Tree => "tree",
            FenceMovementMode::Allgather => "allgather",
        }
    }

    /// The movement of one fence. `collect` is `PMIX_COLLECT_DATA`; `participants` is the
    /// participant count read from the signature (every participant reads the same). A
    /// fence of one participant needs no exchange at all, and the tree answers it locally.
    pub fn for_fence(self, collect: bool, participants: u64) -> Movement {
        let tree = if collect { Movement::TreeGatherRelease } else { Movement::TreeBarrier };
        match self {
            FenceMovementMode::Tree => tree,
            FenceMovementMode::Allgather => Movement::Allgather,
            FenceMovementMode::Auto if collect && participants > 1 => Movement::Allgather,
            FenceMovementMode::Auto => tree,
        }
    }
}

impl fmt::Display for FenceMovementMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown `fence_movement` setting (never silently replaced by a default).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fence movement '{0}' (known: auto, tree, allgather)")]
pub struct UnknownMovement(pub String);

impl FromStr for FenceMovementMode {
    type Err = UnknownMovement;
    fn from_str(s: &str) -> Result<Self, UnknownMovement> {
        match s {
            "auto" => Ok(FenceMovementMode::Auto),
            "tree" => Ok(FenceMovementMode::Tree),
            "allgather" => Ok(FenceMovementMode::Allgather),
            other => Err(UnknownMovement(other.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_errors() {
        for m in FenceMovementMode::ALL {
            assert_eq!(m.name().parse::<FenceMovementMode>(), Ok(m));
        }
        assert_eq!("Tree".parse::<FenceMovementMode>(), Err(UnknownMovement("Tree".into())));
        for id in 0..8 {
            if let Some(m) = Movement::from_id(id) {
                assert_eq!(m.id(), id);
            }
        }
    }

    #[test]
    fn selection_depends_on_the_shared_inputs_only() {
        use FenceMovementMode::*;
        for p in 1..=64u64 {
            assert_eq!(Tree.for_fence(true, p), Movement::TreeGatherRelease);
            assert_eq!(Tree.for_fence(false, p), Movement::TreeBarrier);
            assert_eq!(Allgather.for_fence(true, p), Movement::Allgather);
            assert_eq!(Allgather.for_fence(false, p), Movement::Allgather);
            assert_eq!(Auto.for_fence(false, p), Movement::TreeBarrier);
            let want = if p > 1 { Movement::Allgather } else { Movement::TreeGatherRelease };
            assert_eq!(Auto.for_fence(true, p), want);
        }
    }
}
