//! The movement table: how each operation travels. A plain table, no plug-ins; forcing a
//! movement (for tests) is configuration. Every participant must hold the same table: the
//! movement id travels with every fence contribution and a mismatch fails the fence by name.

/// A way of moving a collective over the tree.
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
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Movement::TreeBroadcast => "tree-broadcast",
            Movement::TreeBarrier => "tree-barrier",
            Movement::TreeGatherRelease => "tree-gather-release",
            Movement::TreeScatter => "tree-scatter",
        }
    }

    /// Name of a movement id off the wire (which may be unknown).
    pub fn name_of(id: u32) -> String {
        Movement::from_id(id).map_or_else(|| format!("unknown movement {id}"), |m| m.name().to_string())
    }
}

/// Table from operation kind to movement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovementTable {
    /// Fence without data collection (`PMIX_COLLECT_DATA` false).
    pub fence_barrier: Movement,
    /// Fence that collects data (`PMIX_COLLECT_DATA` true).
    pub fence_collect: Movement,
}

impl Default for MovementTable {
    fn default() -> Self {
        MovementTable { fence_barrier: Movement::TreeBarrier, fence_collect: Movement::TreeGatherRelease }
    }
}

impl MovementTable {
    /// The movement of a fence, decided by the collect flag alone (never by a data size).
    pub fn for_fence(&self, collect: bool) -> Movement {
        if collect {
            self.fence_collect
        } else {
            self.fence_barrier
        }
    }
}
