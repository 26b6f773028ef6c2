//! The movement table: how each operation travels. A plain table, no plug-ins; forcing a
//! movement (for tests and A/B runs) is configuration. Every participant must hold the same
//! table: the movement id travels with every fence contribution and block, and a mismatch
//! fails the fence by name.
//!
//! A fence's movement is chosen from inputs every participant holds identically: the
//! configured [`FenceMovementMode`], the collect flag, and a [`FenceShape`] (participant count
//! and tree depth from the signature, an estimate of the bytes released that every
//! participant derives alike) priced with the DVM's one [`LinkModel`] — never a payload size
//! of this daemon's own, which differs per rank.

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
    /// Broadcast: one chunk per daemon down the tree (each child gets its subtree's chunks),
    /// then a lateral allgather of the chunks; ACK rollup as for the tree broadcast.
    ScatterAllgather = 6,
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
            6 => Some(Movement::ScatterAllgather),
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
            Movement::ScatterAllgather => "scatter-allgather",
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
    /// Each fence on the movement its [`FenceShape`] prices cheaper under the [`LinkModel`].
    Auto,
    /// Everything on the tree: barrier rollup, or gather and release.
    #[default]
    Tree,
    /// Everything on the allgather (a barrier exchanges empty blocks).
    Allgather,
}

/// What an `auto` fence is priced from. Every field is one every participant of the fence
/// holds alike: the count and the depth come from the signature and the failure-free tree,
/// the byte estimate from what the fence's owner released before (or the caller's hint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceShape {
    /// Participating daemons.
    pub participants: u64,
    /// Depth, in the failure-free tree, of the deepest participant (a tree fence rolls up to
    /// the root and releases down from it).
    pub depth: u32,
    /// The tree's radix.
    pub radix: u32,
    /// Bytes the fence is expected to release (0 for a barrier).
    pub bytes: u64,
}

impl FenceShape {
    /// ⌈log₂ P⌉: the allgather's rounds.
    fn rounds(&self) -> f64 {
        f64::from(self.participants.max(1).next_power_of_two().trailing_zeros())
    }

    /// Busiest daemon's fan-out in a tree release: `min(radix, P − 1)`, at least 1.
    fn fan_out(&self) -> f64 {
        self.participants.saturating_sub(1).clamp(1, u64::from(self.radix.max(1))) as f64
    }
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

    /// The movement of one fence. `collect` is `PMIX_COLLECT_DATA`. A fence of one participant
    /// needs no exchange at all, and the tree answers it locally. Under `auto` the cheaper of
    /// the two models wins, each priced with its own costs; a tie stays on the tree.
    pub fn for_fence(self, collect: bool, shape: &FenceShape, costs: &FenceCosts) -> Movement {
        let tree = if collect { Movement::TreeGatherRelease } else { Movement::TreeBarrier };
        match self {
            FenceMovementMode::Tree => tree,
            FenceMovementMode::Allgather => Movement::Allgather,
            FenceMovementMode::Auto if shape.participants <= 1 => tree,
            FenceMovementMode::Auto => {
                let shape = FenceShape { bytes: if collect { shape.bytes } else { 0 }, ..*shape };
                if costs.allgather_ns(&shape) < costs.tree_ns(&shape) {
                    Movement::Allgather
                } else {
                    tree
                }
            }
        }
    }

    /// Whether this mode's choice for a collecting fence depends on a byte estimate (the
    /// framing then keeps a participant's collecting fences over one signature in order, so
    /// that every participant prices fence k after fence k − 1 has released everywhere).
    pub fn prices_bytes(self) -> bool {
        self == FenceMovementMode::Auto
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

/// An unknown `bcast_movement` setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown broadcast movement '{0}' (known: auto, tree, bulk)")]
pub struct UnknownBcastMovement(pub String);

/// The link costs the broadcast choice is computed from: α, the latency of one message, and
/// β, the time per byte on one daemon's link (egress and ingress are each serialized).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkModel {
    pub alpha_ns: f64,
    pub beta_ns_per_byte: f64,
}

impl Default for LinkModel {
    /// 50 µs and 1 GB/s: a cluster's Ethernet seen through TCP and a daemon's event loop.
    fn default() -> Self {
        LinkModel { alpha_ns: 50_000.0, beta_ns_per_byte: 1.0 }
    }
}

impl LinkModel {
    /// Modelled time of a tree fence: the contributions roll up `depth` levels (the root's
    /// link takes in all `M` released bytes), the result goes down `depth` levels, each
    /// daemon sending it to each of its children in turn.
    ///
    /// `T_tree = 2·depth·α + (1 + depth·min(radix, P − 1))·M·β`
    pub fn tree_fence_ns(&self, s: &FenceShape) -> f64 {
        let d = f64::from(s.depth.max(1));
        2.0 * d * self.alpha_ns + (1.0 + d * s.fan_out()) * s.bytes as f64 * self.beta_ns_per_byte
    }

    /// Modelled time of an allgather fence over P participants: ⌈log₂ P⌉ rounds, and every
    /// participant takes in everything but its own share.
    ///
    /// `T_allgather = ⌈log₂ P⌉·α + M·(P − 1)/P·β`
    pub fn allgather_fence_ns(&self, s: &FenceShape) -> f64 {
        let p = s.participants.max(1) as f64;
        s.rounds() * self.alpha_ns + s.bytes as f64 * (p - 1.0) / p * self.beta_ns_per_byte
    }

    /// Modelled time of a whole-payload tree broadcast of `bytes` over `live` daemons on a
    /// tree of `radix` and `depth` levels: at each level a daemon sends the payload to each
    /// of its children in turn, so the last child of a level starts one fan-out later.
    ///
    /// `T_tree = depth · (α + min(radix, live − 1) · M · β)`
    pub fn tree_whole_ns(&self, bytes: u64, live: u32, radix: u32, depth: u32) -> f64 {
        let fan = f64::from(radix.min(live.saturating_sub(1)).max(1));
        f64::from(depth.max(1)) * (self.alpha_ns + fan * bytes as f64 * self.beta_ns_per_byte)
    }

    /// Modelled time of a scatter-allgather of `bytes` over `live` daemons: the chunks travel
    /// down the tree (a daemon's egress carries at most the payload once), then an allgather
    /// of one chunk per daemon (⌈log₂ live⌉ steps, each daemon sends and receives all but its
    /// own chunk).
    ///
    /// `T_bulk = (depth + ⌈log₂ live⌉) · α + 2 · M · β`
    pub fn scatter_allgather_ns(&self, bytes: u64, live: u32, depth: u32) -> f64 {
        let steps = f64::from(live.max(1).next_power_of_two().trailing_zeros());
        (f64::from(depth.max(1)) + steps) * self.alpha_ns + 2.0 * bytes as f64 * self.beta_ns_per_byte
    }
}

/// What each fence movement's model is priced with: α and β per movement, and a second β
/// for the bytes above a knee. On a DVM whose daemons share machines (or whose links are
/// shaped) the two movements pay different costs per step and per byte, and a byte costs
/// less while a transfer fits the buffers on its way than once it does not; `dvmd` measures
/// both movements at boot (`dvm_core`'s calibration) and hands every daemon the same values.
/// Without a measurement both are the DVM's [`LinkModel`], with no knee.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FenceCosts {
    /// α per hop and β per byte through the busiest daemon, for the tree movements.
    pub tree: LinkModel,
    /// α per round and β per byte each participant takes in, for the allgather.
    pub allgather: LinkModel,
    /// Released bytes up to which `beta_ns_per_byte` applies; above it, the `*_beta_above`.
    pub knee_bytes: u64,
    pub tree_beta_above: f64,
    pub allgather_beta_above: f64,
}

impl FenceCosts {
    /// Both movements priced with one link model.
    pub fn uniform(link: LinkModel) -> FenceCosts {
        FenceCosts {
            tree: link,
            allgather: link,
            knee_bytes: u64::MAX,
            tree_beta_above: link.beta_ns_per_byte,
            allgather_beta_above: link.beta_ns_per_byte,
        }
    }

    /// `f` of `shape` with `model`, the bytes above the knee priced at `above`.
    fn priced(&self, model: &LinkModel, above: f64, s: &FenceShape, f: fn(&LinkModel, &FenceShape) -> f64) -> f64 {
        let below = FenceShape { bytes: s.bytes.min(self.knee_bytes), ..*s };
        let rest = FenceShape { bytes: s.bytes.saturating_sub(self.knee_bytes), ..*s };
        let steps = LinkModel { alpha_ns: 0.0, beta_ns_per_byte: above };
        f(model, &below) + f(&steps, &rest)
    }

    /// The tree movement's modelled time for `s`.
    pub fn tree_ns(&self, s: &FenceShape) -> f64 {
        self.priced(&self.tree, self.tree_beta_above, s, LinkModel::tree_fence_ns)
    }

    /// The allgather's modelled time for `s`.
    pub fn allgather_ns(&self, s: &FenceShape) -> f64 {
        self.priced(&self.allgather, self.allgather_beta_above, s, LinkModel::allgather_fence_ns)
    }

    /// The costs under which each movement's model gives the times (ns) measured for it over
    /// the same participants: a barrier, a collecting fence of `small.bytes` in all and one of
    /// `large.bytes` (`(t0, t_small, t_large)` per movement). The knee is `small.bytes`. The
    /// inverse of [`FenceCosts::tree_ns`] and [`FenceCosts::allgather_ns`]; a per-byte cost at
    /// or below zero (noise) becomes `min_beta`.
    pub fn fit(
        small: &FenceShape,
        large: &FenceShape,
        tree: (f64, f64, f64),
        allgather: (f64, f64, f64),
        min_beta: f64,
    ) -> FenceCosts {
        let p = small.participants.max(2) as f64;
        let d = f64::from(small.depth.max(1));
        let (m1, m2) = (small.bytes.max(1) as f64, large.bytes.max(small.bytes + 1) as f64);
        let tree_bytes = |m: f64| (1.0 + d * small.fan_out()) * m;
        let ag_bytes = |m: f64| m * (p - 1.0) / p;
        let per_byte = |ta: f64, tb: f64, bytes: f64| ((tb - ta) / bytes).max(min_beta);
        FenceCosts {
            tree: LinkModel {
                alpha_ns: (tree.0 / (2.0 * d)).max(0.0),
                beta_ns_per_byte: per_byte(tree.0, tree.1, tree_bytes(m1)),
            },
            allgather: LinkModel {
                alpha_ns: (allgather.0 / small.rounds().max(1.0)).max(0.0),
                beta_ns_per_byte: per_byte(allgather.0, allgather.1, ag_bytes(m1)),
            },
            knee_bytes: small.bytes,
            tree_beta_above: per_byte(tree.1, tree.2, tree_bytes(m2 - m1)),
            allgather_beta_above: per_byte(allgather.1, allgather.2, ag_bytes(m2 - m1)),
        }
    }
}

/// Which movement a broadcast uses (`bcast_movement` in [`crate::Config`], `dvmd
/// --bcast-movement`). The origin decides and stamps the choice on the op, so the daemons
/// never have to agree on anything but the wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum BcastMovementMode {
    /// Bulk-capable tags take scatter-allgather when the [`LinkModel`] says it is cheaper.
    #[default]
    Auto,
    /// Every broadcast on the tree, whole payload to every child.
    Tree,
    /// Every bulk-capable broadcast on scatter-allgather, whatever its size.
    Bulk,
}

impl BcastMovementMode {
    pub const ALL: [BcastMovementMode; 3] = [BcastMovementMode::Tree, BcastMovementMode::Bulk, BcastMovementMode::Auto];

    pub fn name(self) -> &'static str {
        match self {
            BcastMovementMode::Auto => "auto",
            BcastMovementMode::Tree => "tree",
            BcastMovementMode::Bulk => "bulk",
        }
    }

    /// The movement of one broadcast, decided by its origin. `bulk_capable` is false for
    /// every tag whose delivery order or processing matters to the tree itself (WIREUP,
    /// DAEMON_DIED, ...): those always take the whole-payload tree. `bytes` is the payload
    /// as it goes on the wire (after compression), `live` the live daemon count.
    pub fn for_bcast(
        self,
        bulk_capable: bool,
        bytes: u64,
        live: u32,
        radix: u32,
        depth: u32,
        link: &LinkModel,
    ) -> Movement {
        if !bulk_capable || live < 2 {
            return Movement::TreeBroadcast;
        }
        match self {
            BcastMovementMode::Tree => Movement::TreeBroadcast,
            BcastMovementMode::Bulk => Movement::ScatterAllgather,
            BcastMovementMode::Auto => {
                if link.scatter_allgather_ns(bytes, live, depth) < link.tree_whole_ns(bytes, live, radix, depth) {
                    Movement::ScatterAllgather
                } else {
                    Movement::TreeBroadcast
                }
            }
        }
    }
}

impl fmt::Display for BcastMovementMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BcastMovementMode {
    type Err = UnknownBcastMovement;
    fn from_str(s: &str) -> Result<Self, UnknownBcastMovement> {
        match s {
            "auto" => Ok(BcastMovementMode::Auto),
            "tree" => Ok(BcastMovementMode::Tree),
            "bulk" => Ok(BcastMovementMode::Bulk),
            other => Err(UnknownBcastMovement(other.to_string())),
        }
    }
}

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
    fn broadcast_choice_keeps_tree_tags_and_small_payloads_on_the_tree() {
        use BcastMovementMode::*;
        let link = LinkModel::default();
        for m in BcastMovementMode::ALL {
            assert_eq!(m.name().parse::<BcastMovementMode>(), Ok(m));
            // Ordering-critical tags never leave the tree, whatever the size or the mode.
            assert_eq!(m.for_bcast(false, 1 << 30, 4096, 64, 2, &link), Movement::TreeBroadcast);
            // One daemon: nothing to move.
            assert_eq!(m.for_bcast(true, 1 << 20, 1, 64, 1, &link), Movement::TreeBroadcast);
        }
        assert!("Bulk".parse::<BcastMovementMode>().is_err());
        assert_eq!(Bulk.for_bcast(true, 1, 16, 64, 1, &link), Movement::ScatterAllgather);
        assert_eq!(Tree.for_bcast(true, 1 << 30, 16, 64, 1, &link), Movement::TreeBroadcast);
        // A launch map for a regular placement (tens of bytes) stays on the tree; a 1 MiB
        // payload over 16 daemons on a flat tree goes bulk; at radix 2 over 4 daemons the
        // whole payload goes to at most two children and the tree keeps up to the crossover.
        assert_eq!(Auto.for_bcast(true, 42, 16_000, 64, 3, &link), Movement::TreeBroadcast);
        assert_eq!(Auto.for_bcast(true, 1 << 20, 16, 64, 1, &link), Movement::ScatterAllgather);
        assert_eq!(Auto.for_bcast(true, 1 << 10, 4, 2, 2, &link), Movement::TreeBroadcast);
        // The crossover grows with α: on a link where a message costs a second, no payload of
        // a few KiB is worth the extra allgather steps.
        let slow = LinkModel { alpha_ns: 1e9, beta_ns_per_byte: 1.0 };
        assert_eq!(Auto.for_bcast(true, 4096, 16, 64, 1, &slow), Movement::TreeBroadcast);
    }

    #[test]
    fn forced_modes_ignore_the_shape_and_one_participant_stays_local() {
        use FenceMovementMode::*;
        let link = FenceCosts::uniform(LinkModel::default());
        for p in 1..=64u64 {
            for bytes in [0, 64, 1 << 20] {
                let s = FenceShape { participants: p, depth: 2, radix: 4, bytes };
                assert_eq!(Tree.for_fence(true, &s, &link), Movement::TreeGatherRelease);
                assert_eq!(Tree.for_fence(false, &s, &link), Movement::TreeBarrier);
                assert_eq!(Allgather.for_fence(true, &s, &link), Movement::Allgather);
                assert_eq!(Allgather.for_fence(false, &s, &link), Movement::Allgather);
            }
        }
        let one = FenceShape { participants: 1, depth: 0, radix: 64, bytes: 1 << 30 };
        assert_eq!(Auto.for_fence(true, &one, &link), Movement::TreeGatherRelease);
        assert_eq!(Auto.for_fence(false, &one, &link), Movement::TreeBarrier);
    }

    #[test]
    fn fitting_measured_times_recovers_each_movements_costs() {
        let truth = |knee: u64| FenceCosts {
            tree: LinkModel { alpha_ns: 300_000.0, beta_ns_per_byte: 5.5 },
            allgather: LinkModel { alpha_ns: 510_000.0, beta_ns_per_byte: 74.0 },
            knee_bytes: knee,
            tree_beta_above: 8.0,
            allgather_beta_above: 45.0,
        };
        for (p, depth, radix) in [(17u64, 1, 64), (17, 2, 4), (4096, 2, 64), (100, 6, 2)] {
            let barrier = FenceShape { participants: p, depth, radix, bytes: 0 };
            let small = FenceShape { bytes: 64 << 10, ..barrier };
            let large = FenceShape { bytes: 512 << 10, ..barrier };
            let want = truth(small.bytes);
            let t = |f: fn(&FenceCosts, &FenceShape) -> f64| (f(&want, &barrier), f(&want, &small), f(&want, &large));
            let fit = FenceCosts::fit(&small, &large, t(FenceCosts::tree_ns), t(FenceCosts::allgather_ns), 0.001);
            let close = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-9;
            assert_eq!(fit.knee_bytes, want.knee_bytes);
            for (got, w) in [(fit.tree, want.tree), (fit.allgather, want.allgather)] {
                assert!(
                    close(got.alpha_ns, w.alpha_ns) && close(got.beta_ns_per_byte, w.beta_ns_per_byte),
                    "{p}: {fit:?}"
                );
            }
            assert!(close(fit.tree_beta_above, 8.0) && close(fit.allgather_beta_above, 45.0), "{p}: {fit:?}");
            // Priced past the knee: the second slope.
            let big = FenceShape { bytes: 4 << 20, ..barrier };
            assert!(close(fit.allgather_ns(&big), want.allgather_ns(&big)));
        }
        // Noise that makes a sized fence look cheaper than a smaller one is not a negative cost.
        let s = FenceShape { participants: 17, depth: 1, radix: 64, bytes: 17_000 };
        let l = FenceShape { bytes: 170_000, ..s };
        let fit = FenceCosts::fit(&s, &l, (1e6, 0.9e6, 0.8e6), (2e6, 1.5e6, 1.4e6), 0.001);
        assert_eq!((fit.tree.beta_ns_per_byte, fit.allgather.beta_ns_per_byte), (0.001, 0.001));
        assert_eq!((fit.tree_beta_above, fit.allgather_beta_above), (0.001, 0.001));
        // Uniform costs are the link model's formulas exactly.
        let link = LinkModel::default();
        let u = FenceCosts::uniform(link);
        assert_eq!(u.tree_ns(&l), link.tree_fence_ns(&l));
        assert_eq!(u.allgather_ns(&l), link.allgather_fence_ns(&l));
    }

    #[test]
    fn auto_takes_the_cheaper_model_by_size_and_depth() {
        use FenceMovementMode::*;
        let link = LinkModel::default(); // 50 µs, 1 ns/B
        let costs = FenceCosts::uniform(link);
        let shape =
            |participants: u64, depth: u32, radix: u32, bytes: u64| FenceShape { participants, depth, radix, bytes };
        // A flat tree over 17 daemons: two hops against five rounds keep small fences on the
        // tree; 64 KiB per daemon puts 17 · 1.1 MiB on the root's link and goes lateral.
        assert_eq!(Auto.for_fence(false, &shape(17, 1, 64, 0), &costs), Movement::TreeBarrier);
        assert_eq!(Auto.for_fence(true, &shape(17, 1, 64, 17 * 64), &costs), Movement::TreeGatherRelease);
        assert_eq!(Auto.for_fence(true, &shape(17, 1, 64, 17 << 16), &costs), Movement::Allgather);
        // A barrier's estimate is ignored: no bytes move.
        assert_eq!(Auto.for_fence(false, &shape(17, 1, 64, 17 << 16), &costs), Movement::TreeBarrier);
        // A binary tree of depth 4 over 16: eight hops against four rounds.
        assert_eq!(Auto.for_fence(false, &shape(16, 4, 2, 0), &costs), Movement::Allgather);
        // 4096 daemons on a radix-64 tree: 64 B each is 256 KiB through the root 129 times.
        assert_eq!(Auto.for_fence(true, &shape(4096, 2, 64, 4096 * 64), &costs), Movement::Allgather);
        assert_eq!(Auto.for_fence(false, &shape(4096, 2, 64, 0), &costs), Movement::TreeBarrier);
        // The choice is exactly the cheaper model, at every size.
        for p in [2u64, 3, 5, 16, 17, 64, 100, 4096] {
            for (depth, radix) in [(1, 64), (2, 4), (4, 2), (12, 2)] {
                for bytes in [0u64, 1, 64, 1024, 8192, 65_536, 1 << 20].map(|b| b * p) {
                    let s = shape(p, depth, radix, bytes);
                    let lateral = link.allgather_fence_ns(&s) < link.tree_fence_ns(&s);
                    let want = if lateral { Movement::Allgather } else { Movement::TreeGatherRelease };
                    assert_eq!(Auto.for_fence(true, &s, &costs), want, "{s:?}");
                }
            }
        }
    }
}
