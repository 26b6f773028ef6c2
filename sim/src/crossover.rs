//! Crossovers of the fence choice: for a DVM of N daemons on a radix-r tree, the smallest
//! modex contribution per daemon at which `auto` (grpcomm's `FenceMovementMode::Auto`,
//! priced with one link model) moves a collecting fence on the allgather rather than the
//! tree, and whether a barrier goes lateral. Found with the real choice function, not a copy
//! of its formulas.
//!
//! Also the α-β model of a movement that is not built, for comparison only: a hierarchical
//! fence (gather within the subtrees rooted at level ℓ, allgather among the daemons at depth
//! ≤ ℓ, release down the subtrees), priced by [`hierarchical_fence_ns`].

use dvm_grpcomm::{FenceCosts, FenceMovementMode, FenceShape, LinkModel, Movement};
use dvm_rml::topology::{TopologyError, Tree};

/// Largest contribution per daemon searched (1 TiB): a crossover above it is reported as none.
pub const MAX_BYTES_PER_DAEMON: u64 = 1 << 40;

/// One row of the crossover table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crossover {
    pub n: u32,
    pub radix: u32,
    /// Depth of the deepest daemon in the failure-free tree.
    pub depth: u32,
    /// What `auto` takes for a barrier (`tree-barrier` or `allgather`).
    pub barrier: Movement,
    /// The smallest contribution per daemon that `auto` moves on the allgather (0 when even
    /// an empty modex goes lateral); `None` if none up to [`MAX_BYTES_PER_DAEMON`].
    pub bytes_per_daemon: Option<u64>,
}

impl Crossover {
    pub const CSV_HEADER: &'static str = "n,radix,depth,barrier_movement,crossover_bytes_per_daemon";

    pub fn csv(&self) -> String {
        let bytes = self.bytes_per_daemon.map_or_else(String::new, |b| b.to_string());
        format!("{},{},{},{},{}", self.n, self.radix, self.depth, self.barrier.name(), bytes)
    }

    pub fn markdown(&self) -> String {
        let bytes = self.bytes_per_daemon.map_or_else(|| "none".to_string(), |b| b.to_string());
        let total = self.bytes_per_daemon.map_or_else(|| "—".to_string(), |b| (b * u64::from(self.n)).to_string());
        format!("| {} | {} | {} | {} | {} | {} |", self.n, self.radix, self.depth, self.barrier.name(), bytes, total)
    }
}

/// Depth of the deepest of `n` daemons in the failure-free tree of `radix`.
pub fn depth(n: u32, radix: u32) -> Result<u32, TopologyError> {
    Ok(Tree::new(radix, n)?.depth(n - 1))
}

/// The shape `auto` prices a fence of all `n` daemons with, each contributing `per_daemon`
/// bytes.
pub fn shape(n: u32, radix: u32, depth: u32, per_daemon: u64) -> FenceShape {
    FenceShape { participants: u64::from(n), depth, radix, bytes: per_daemon.saturating_mul(u64::from(n)) }
}

/// The crossover of a fence of all `n` daemons on a radix-`radix` tree under `link`.
///
/// Binary search on the contribution per daemon: with one link model for both movements the
/// tree's per-byte cost `(1 + d·min(r, N − 1))·β` is above the allgather's `(N − 1)/N·β`, so
/// once the allgather is the cheaper it stays so at every larger size.
pub fn crossover(n: u32, radix: u32, link: &LinkModel) -> Result<Crossover, TopologyError> {
    let depth = depth(n, radix)?;
    let costs = FenceCosts::uniform(*link);
    let lateral =
        |b: u64| FenceMovementMode::Auto.for_fence(true, &shape(n, radix, depth, b), &costs) == Movement::Allgather;
    let barrier = FenceMovementMode::Auto.for_fence(false, &shape(n, radix, depth, 0), &costs);
    let bytes_per_daemon = if lateral(0) {
        Some(0)
    } else if !lateral(MAX_BYTES_PER_DAEMON) {
        None
    } else {
        // Invariant: tree at `lo`, allgather at `hi`.
        let (mut lo, mut hi) = (0u64, MAX_BYTES_PER_DAEMON);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if lateral(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(hi)
    };
    Ok(Crossover { n, radix, depth, barrier, bytes_per_daemon })
}

/// Daemons at depth ≤ `level` in the failure-free tree of `n` daemons at `radix`.
fn ranks_to_level(n: u32, radix: u32, level: u32) -> u64 {
    let (mut total, mut width) = (0u64, 1u64);
    for _ in 0..=level {
        total = total.saturating_add(width);
        width = width.saturating_mul(u64::from(radix));
        if total >= u64::from(n) {
            return u64::from(n);
        }
    }
    total
}

/// Model of a hierarchical fence (not built) that splits at `level` (1 ≤ ℓ ≤ d − 1) over all
/// `n` daemons releasing `bytes` in all (`M`): every daemon below level ℓ gathers up to its
/// ancestor at depth ℓ (`d − ℓ` hops), the `P_ℓ` daemons at depth ≤ ℓ allgather (each
/// ends holding all of `M`), and the result is released down the `d − ℓ` levels below, each
/// daemon sending it to each of its children in turn:
///
/// `T_hier(ℓ) = (2·(d − ℓ) + ⌈log₂ P_ℓ⌉)·α + ((N − 1)/N + (d − ℓ)·min(r, N − 1))·M·β`
///
/// The byte term is a lower bound (each daemon at depth ≤ ℓ takes in all but its own share
/// once, gather and allgather together, as if they overlapped perfectly), so the model
/// favours the movement. ℓ = 0 is the tree and ℓ = d the allgather, up to the lower bound.
pub fn hierarchical_fence_ns(link: &LinkModel, n: u32, radix: u32, depth: u32, level: u32, bytes: u64) -> f64 {
    let p = ranks_to_level(n, radix, level).max(1);
    let rounds = f64::from(p.next_power_of_two().trailing_zeros());
    let below = f64::from(depth.saturating_sub(level));
    let fan = f64::from(radix.min(n.saturating_sub(1)).max(1));
    let share = (f64::from(n) - 1.0) / f64::from(n.max(1));
    (2.0 * below + rounds) * link.alpha_ns + (share + below * fan) * bytes as f64 * link.beta_ns_per_byte
}

/// The hierarchical model against the better of the two built movements, for one fence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HierarchicalRow {
    pub n: u32,
    pub radix: u32,
    pub depth: u32,
    pub bytes_per_daemon: u64,
    /// The best split level (None when the tree has fewer than two levels below the root,
    /// so there is no level strictly between the tree and the allgather).
    pub level: Option<u32>,
    pub hierarchical_ns: Option<f64>,
    pub tree_ns: f64,
    pub allgather_ns: f64,
}

impl HierarchicalRow {
    /// hierarchical / min(tree, allgather).
    pub fn ratio(&self) -> Option<f64> {
        self.hierarchical_ns.map(|h| h / self.tree_ns.min(self.allgather_ns))
    }
}

/// Price a fence of all `n` daemons, `per_daemon` bytes each, on the tree, the allgather and
/// the hierarchical movement at its best split level.
pub fn hierarchical(n: u32, radix: u32, per_daemon: u64, link: &LinkModel) -> Result<HierarchicalRow, TopologyError> {
    let depth = depth(n, radix)?;
    let s = shape(n, radix, depth, per_daemon);
    let best = (1..depth)
        .map(|l| (l, hierarchical_fence_ns(link, n, radix, depth, l, s.bytes)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    Ok(HierarchicalRow {
        n,
        radix,
        depth,
        bytes_per_daemon: per_daemon,
        level: best.map(|b| b.0),
        hierarchical_ns: best.map(|b| b.1),
        tree_ns: link.tree_fence_ns(&s),
        allgather_ns: link.allgather_fence_ns(&s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two fence models, written out again from their stated formulas.
    fn tree_ns(a: f64, b: f64, n: u64, d: u32, r: u32, m: u64) -> f64 {
        let fan = (n - 1).clamp(1, u64::from(r)) as f64;
        2.0 * f64::from(d) * a + (1.0 + f64::from(d) * fan) * m as f64 * b
    }

    fn allgather_ns(a: f64, b: f64, n: u64, m: u64) -> f64 {
        let rounds = (n as f64).log2().ceil();
        rounds * a + m as f64 * (n as f64 - 1.0) / n as f64 * b
    }

    #[test]
    fn crossover_is_where_auto_leaves_the_tree() {
        let links = [
            LinkModel::default(),
            LinkModel { alpha_ns: 5_000.0, beta_ns_per_byte: 0.1 },
            LinkModel { alpha_ns: 500_000.0, beta_ns_per_byte: 8.0 },
        ];
        let costs = |l: &LinkModel| FenceCosts::uniform(*l);
        for link in &links {
            let (a, b) = (link.alpha_ns, link.beta_ns_per_byte);
            for n in [2u32, 3, 4, 5, 16, 17, 65, 100, 256, 1000, 4096, 4161, 16384] {
                for r in [2u32, 4, 16, 64] {
                    let c = crossover(n, r, link).unwrap();
                    // The depth of the deepest daemon, counted level by level.
                    let (mut d, mut seen, mut width) = (0u32, 1u64, 1u64);
                    while seen < u64::from(n) {
                        width *= u64::from(r);
                        seen += width;
                        d += 1;
                    }
                    assert_eq!(c.depth, d, "n {n} r {r}");
                    let n64 = u64::from(n);
                    let lateral = |per: u64| allgather_ns(a, b, n64, per * n64) < tree_ns(a, b, n64, d, r, per * n64);
                    // A barrier: 2·d hops against ⌈log₂ N⌉ rounds.
                    let barrier_lateral = allgather_ns(a, b, n64, 0) < tree_ns(a, b, n64, d, r, 0);
                    assert_eq!(c.barrier == Movement::Allgather, barrier_lateral, "n {n} r {r}");
                    let x = c.bytes_per_daemon.expect("every fence goes lateral at some size");
                    let auto = |per: u64| FenceMovementMode::Auto.for_fence(true, &shape(n, r, d, per), &costs(link));
                    assert!(lateral(x), "n {n} r {r}: the models put {x} B on the tree");
                    assert_eq!(auto(x), Movement::Allgather, "n {n} r {r} at {x} B");
                    if x == 0 {
                        assert!(barrier_lateral, "n {n} r {r}");
                    } else {
                        assert!(!lateral(x - 1), "n {n} r {r}: the models put {} B on the allgather", x - 1);
                        assert_eq!(auto(x - 1), Movement::TreeGatherRelease, "n {n} r {r} at {} B", x - 1);
                    }
                    // Above the crossover the choice stays lateral.
                    for per in [x + 1, 2 * x + 1, x + 4096, 1 << 20] {
                        assert_eq!(auto(per), Movement::Allgather, "n {n} r {r} at {per} B");
                    }
                }
            }
        }
    }

    #[test]
    fn crossover_at_the_default_link() {
        let link = LinkModel::default();
        // N = 256, radix 64 (depth 2): 200 µs + 129·256·D ns against 400 µs + 255·D ns.
        let c = crossover(256, 64, &link).unwrap();
        assert_eq!((c.depth, c.barrier, c.bytes_per_daemon), (2, Movement::TreeBarrier, Some(7)));
        // A binary tree of depth 4 over 16: eight hops against four rounds, lateral at once.
        let c = crossover(16, 2, &link).unwrap();
        assert_eq!((c.depth, c.barrier, c.bytes_per_daemon), (4, Movement::Allgather, Some(0)));
        assert_eq!(c.csv(), "16,2,4,allgather,0");
        assert!(crossover(1, 2, &link).unwrap().bytes_per_daemon.is_none());
        assert!(crossover(16, 1, &link).is_err());
    }

    #[test]
    fn hierarchical_model_meets_the_built_movements_at_its_ends() {
        let link = LinkModel::default();
        for (n, r) in [(4096u32, 64u32), (4096, 2), (1000, 16), (65, 4)] {
            let d = depth(n, r).unwrap();
            for per in [0u64, 64, 65_536] {
                let s = shape(n, r, d, per);
                // ℓ = d: no gather, no release, an allgather over everyone.
                let top = hierarchical_fence_ns(&link, n, r, d, d, s.bytes);
                assert!((top - link.allgather_fence_ns(&s)).abs() < 1e-6, "n {n} r {r} {per}");
                // ℓ = 0: no allgather rounds, the tree's hops and release (its gather bound
                // is lower by M/N·β).
                let root = hierarchical_fence_ns(&link, n, r, d, 0, s.bytes);
                let tree = link.tree_fence_ns(&s);
                assert!(root <= tree && tree - root <= s.bytes as f64 / f64::from(n) + 1e-6, "n {n} r {r} {per}");
            }
        }
        // N = 4096, radix 64: ℓ = 1 is 9 α and 65 M β, against 4 α + 129 M β and 12 α + M β.
        let row = hierarchical(4096, 64, 1, &link).unwrap();
        assert_eq!(row.level, Some(1));
        let m = 4096.0;
        let want = 9.0 * 50_000.0 + (4095.0 / 4096.0 + 64.0) * m;
        assert!((row.hierarchical_ns.unwrap() - want).abs() < 1e-6);
        assert!(hierarchical(65, 64, 64, &link).unwrap().level.is_none());
    }
}
