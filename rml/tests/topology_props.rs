//! Property tests for `rml::topology` against an independent construction.
//!
//! The oracle builds the failure-free tree straight from docs/architecture.md, "The routing tree" (level `d` holds `R^d`
//! ranks; the children of `r` at depth `d` are `r + j * R^d`, `j = 1..=R`), derives parents
//! from those children lists, and answers subtree questions by walking parents. The repaired
//! oracle gives each dead slot the lowest live rank of its subtree, computed bottom-up as a
//! minimum over children. Every daemon's `Topology` is checked against these, pairwise
//! against its neighbours, and by following routes hop by hop using each hop's own view.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use dvm_rml::topology::MAX_DAEMONS;
use dvm_rml::{Rank, RepairDelta, Route, Topology, TopologyError, Tree};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------------
// Independent construction
// ---------------------------------------------------------------------------------------------

/// The failure-free tree built from the DESIGN formula, with parents derived from children.
struct Oracle {
    n: u32,
    depth: Vec<u32>,
    parent: Vec<Option<Rank>>,
    children: Vec<Vec<Rank>>,
}

impl Oracle {
    fn new(radix: u32, n: u32) -> Self {
        let (r64, n64) = (u64::from(radix), u64::from(n));
        let mut depth = vec![0u32; n as usize];
        let mut width_of_depth = Vec::new();
        let (mut start, mut width, mut d) = (0u64, 1u64, 0u32);
        while start < n64 {
            for x in start..(start + width).min(n64) {
                depth[x as usize] = d;
            }
            width_of_depth.push(width);
            start += width;
            width *= r64;
            d += 1;
        }
        let mut parent = vec![None; n as usize];
        let mut children = vec![Vec::new(); n as usize];
        for x in 0..n {
            let stride = width_of_depth[depth[x as usize] as usize];
            for j in 1..=r64 {
                let c = u64::from(x) + j * stride;
                if c >= n64 {
                    break;
                }
                let c = c as Rank;
                assert_eq!(parent[c as usize], None, "oracle: rank {c} got two parents");
                parent[c as usize] = Some(x);
                children[x as usize].push(c);
            }
        }
        Oracle { n, depth, parent, children }
    }

    fn height(&self) -> u32 {
        self.depth[self.n as usize - 1]
    }

    /// `x` is in the subtree of `root` iff walking parents from `x` reaches `root`.
    fn in_subtree(&self, root: Rank, x: Rank) -> bool {
        let mut cur = Some(x);
        while let Some(c) = cur {
            if c == root {
                return true;
            }
            cur = self.parent[c as usize];
        }
        false
    }
}

/// The repaired tree by the documented rule, computed without the library.
struct RepairOracle {
    alive: Vec<bool>,
    /// Occupant of every slot: itself if alive, else the lowest live rank of its subtree.
    occupant: Vec<Option<Rank>>,
    /// Repaired parent of every live rank.
    parent: Vec<Option<Rank>>,
    /// Highest slot occupied by every live rank.
    top: Vec<Rank>,
}

impl RepairOracle {
    fn new(o: &Oracle, failed: &BTreeSet<Rank>) -> Self {
        let n = o.n as usize;
        let alive: Vec<bool> = (0..o.n).map(|x| !failed.contains(&x)).collect();
        let mut occupant = vec![None; n];
        // Children have larger ranks than their parent: fill from the bottom up.
        for s in (0..n).rev() {
            occupant[s] = if alive[s] {
                Some(s as Rank)
            } else {
                o.children[s].iter().filter_map(|&c| occupant[c as usize]).min()
            };
        }
        let mut parent = vec![None; n];
        let mut top = (0..o.n).collect::<Vec<_>>();
        for x in (0..o.n).filter(|&x| alive[x as usize]) {
            let mut s = x;
            while let Some(p) = o.parent[s as usize] {
                if occupant[p as usize] == Some(x) {
                    s = p;
                } else {
                    break;
                }
            }
            top[x as usize] = s;
            parent[x as usize] = o.parent[s as usize].map(|p| occupant[p as usize].unwrap());
        }
        RepairOracle { alive, occupant, parent, top }
    }

    /// `x` is in the repaired subtree of `me` iff walking repaired parents from `x` reaches `me`.
    fn in_subtree(&self, me: Rank, x: Rank) -> bool {
        if !self.alive.get(x as usize).copied().unwrap_or(false) {
            return false;
        }
        let mut cur = Some(x);
        let mut steps = 0;
        while let Some(c) = cur {
            if c == me {
                return true;
            }
            steps += 1;
            assert!(steps <= self.alive.len(), "repaired oracle: cycle above rank {x}");
            cur = self.parent[c as usize];
        }
        false
    }
}

/// Deterministic sampling (splitmix64) so a failing case replays exactly.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u32) -> u32 {
        (self.next() % u64::from(n)) as u32
    }
}

/// Every pair when small, else `samples` random pairs drawn from `ranks`.
fn sample_pairs(ranks: &[Rank], samples: usize, mix: &mut Mix) -> Vec<(Rank, Rank)> {
    if ranks.len() * ranks.len() <= samples {
        return ranks.iter().flat_map(|&a| ranks.iter().map(move |&b| (a, b))).collect();
    }
    (0..samples)
        .map(|_| {
            let a = ranks[mix.below(ranks.len() as u32) as usize];
            let b = ranks[mix.below(ranks.len() as u32) as usize];
            (a, b)
        })
        .collect()
}

/// Every rank when small, else `samples` random ranks plus the first and last.
fn sample_ranks(ranks: &[Rank], samples: usize, mix: &mut Mix) -> Vec<Rank> {
    if ranks.len() <= samples {
        return ranks.to_vec();
    }
    let mut out = vec![ranks[0], ranks[ranks.len() - 1]];
    out.extend((0..samples).map(|_| ranks[mix.below(ranks.len() as u32) as usize]));
    out
}

/// Follow `route_to` from `src` to `dst`, asking each hop's own `Topology`. Every hop must be
/// live and travel a tree edge of the current daemon; `dst` is reached within `2·height+2`.
fn follow_route(view: &dyn Fn(Rank) -> Topology, src: Rank, dst: Rank, ctx: &str) -> usize {
    let mut cur = view(src);
    let limit = 2 * cur.height() as usize + 2;
    for hops in 0..=limit {
        let next = match cur.route_to(dst) {
            Route::Local => {
                assert_eq!(cur.me(), dst, "{ctx}: Local at {} for dst {dst}", cur.me());
                return hops;
            }
            Route::Up(p) => {
                assert_eq!(
                    cur.parent(),
                    Some(p),
                    "{ctx}: rank {} routes {src}->{dst} up to {p}, not its parent",
                    cur.me()
                );
                p
            }
            Route::Down(c) => {
                assert!(
                    cur.children().contains(&c),
                    "{ctx}: rank {} routes {src}->{dst} down to {c}, not a child {:?}",
                    cur.me(),
                    cur.children()
                );
                c
            }
            Route::Unreachable => panic!("{ctx}: rank {} finds live {dst} unreachable", cur.me()),
        };
        assert!(cur.is_alive(next), "{ctx}: route {src}->{dst} hops to failed rank {next}");
        cur = view(next);
    }
    panic!("{ctx}: route {src}->{dst} exceeds {limit} hops");
}

// ---------------------------------------------------------------------------------------------
// Failure-free tree
// ---------------------------------------------------------------------------------------------

/// Radix 2..=64 (small radices more often: they make the deep trees) × N 1..=4096.
fn geometry() -> impl Strategy<Value = (u32, u32)> {
    (prop_oneof![2u32..=4, 2u32..=64], prop_oneof![1u32..=80, 1u32..=4096])
}

fn check_failure_free(radix: u32, n: u32, seed: u64) {
    let ctx = format!("radix {radix} N {n}");
    let o = Oracle::new(radix, n);
    let tree = Tree::new(radix, n).unwrap();
    let mut mix = Mix(seed);
    assert_eq!((tree.radix(), tree.size()), (radix, n));

    // One parent each: parent, depth and children agree with the DESIGN construction, and each
    // non-root rank appears in exactly one children list, its parent's.
    let mut listed_under: Vec<Vec<Rank>> = vec![Vec::new(); n as usize];
    for x in 0..n {
        assert_eq!(tree.depth(x), o.depth[x as usize], "{ctx}: depth of {x}");
        assert_eq!(tree.parent(x), o.parent[x as usize], "{ctx}: parent of {x}");
        let kids: Vec<Rank> = tree.children(x).collect();
        assert_eq!(kids, o.children[x as usize], "{ctx}: children of {x}");
        assert!(kids.len() <= radix as usize, "{ctx}: {x} has more than R children");
        for c in kids {
            listed_under[c as usize].push(x);
        }
    }
    for x in 0..n {
        let expected: Vec<Rank> = tree.parent(x).into_iter().collect();
        assert_eq!(listed_under[x as usize], expected, "{ctx}: {x} listed under {:?}", listed_under[x as usize]);
    }
    assert_eq!(tree.parent(0), None, "{ctx}: root has a parent");

    // BFS from the root over the library's children spans every rank exactly once.
    let mut seen = vec![false; n as usize];
    let mut queue = VecDeque::from([0 as Rank]);
    seen[0] = true;
    let mut visited = 0;
    while let Some(x) = queue.pop_front() {
        visited += 1;
        for c in tree.children(x) {
            assert!(!seen[c as usize], "{ctx}: BFS meets {c} twice");
            seen[c as usize] = true;
            queue.push_back(c);
        }
    }
    assert_eq!(visited, n, "{ctx}: BFS from the root does not span the tree");

    // The one-modulo subtree test agrees with the naive parent walk.
    let all: Vec<Rank> = (0..n).collect();
    let roots = sample_ranks(&all, 12, &mut mix);
    for &r in &roots {
        let topo = Topology::new(r, radix, n).unwrap();
        for x in 0..n {
            let naive = o.in_subtree(r, x);
            assert_eq!(tree.in_subtree(r, x), naive, "{ctx}: Tree::in_subtree({r}, {x})");
            assert_eq!(topo.in_subtree(x), naive, "{ctx}: Topology({r}).in_subtree({x})");
        }
        assert!(!topo.in_subtree(n), "{ctx}: out-of-range rank in subtree of {r}");
    }

    // Each daemon's view equals the tree.
    let topos: Vec<Topology> = (0..n).map(|x| Topology::new(x, radix, n).unwrap()).collect();
    for t in &topos {
        let x = t.me();
        assert_eq!(t.parent(), o.parent[x as usize], "{ctx}: Topology({x}).parent");
        assert_eq!(t.children(), &o.children[x as usize][..], "{ctx}: Topology({x}).children");
        assert_eq!(t.is_root(), x == 0, "{ctx}: Topology({x}).is_root");
        assert_eq!(t.depth(), o.depth[x as usize], "{ctx}: Topology({x}).depth");
        assert_eq!(t.height(), o.height(), "{ctx}: Topology({x}).height");
        assert_eq!((t.epoch(), t.live_count()), (0, n), "{ctx}: Topology({x}) fresh state");
        assert_eq!(t.route_to(n), Route::Unreachable, "{ctx}: {x} routes to out-of-range {n}");
    }

    // Every rank reachable by following routes, each hop asking its own Topology.
    let view = |x: Rank| topos[x as usize].clone();
    for (src, dst) in sample_pairs(&all, 256, &mut mix) {
        let hops = follow_route(&view, src, dst, &ctx);
        // In a failure-free tree the route is the unique tree path.
        let mut lca = src;
        while !o.in_subtree(lca, dst) {
            lca = o.parent[lca as usize].unwrap();
        }
        let lca_depth = o.depth[lca as usize];
        let path = (o.depth[src as usize] - lca_depth) + (o.depth[dst as usize] - lca_depth);
        assert_eq!(hops, path as usize, "{ctx}: route {src}->{dst} is not the tree path");
        assert_eq!(tree.route(src, dst), topos[src as usize].route_to(dst), "{ctx}: Tree::route {src}->{dst}");
    }
}

// ---------------------------------------------------------------------------------------------
// Repair
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Scenario {
    radix: u32,
    n: u32,
    /// Cumulative failed sets, one per batch; the last is the complete set.
    batches: Vec<BTreeSet<Rank>>,
    seed: u64,
}

impl Scenario {
    fn failed(&self) -> &BTreeSet<Rank> {
        self.batches.last().unwrap()
    }
}

/// Random failed sets over radix 2..=64 × N 1..=4096: scattered ranks, optionally a run of the
/// lowest ranks (long replacement chains) and a whole failure-free subtree (a slot nobody can
/// occupy), split into one to three batches. `zero` decides whether rank 0 may fail.
fn scenario(zero: bool) -> impl Strategy<Value = Scenario> {
    geometry()
        .prop_flat_map(move |(radix, n)| {
            let scattered = prop::collection::btree_set(0..n, 0..=(n as usize / 3).clamp(1, 48));
            let prefix = 0..=n.min(40);
            let subtree = prop::option::weighted(0.3, 1..n.max(2));
            let batches = 1usize..=3;
            (Just((radix, n)), scattered, prefix, subtree, batches, any::<u64>(), any::<bool>())
        })
        .prop_map(move |((radix, n), scattered, prefix, subtree, batches, seed, kill_zero)| {
            let o = Oracle::new(radix, n);
            let mut failed = scattered;
            failed.extend(0..prefix);
            if let Some(s) = subtree.filter(|&s| s < n) {
                failed.extend((0..n).filter(|&x| o.in_subtree(s, x)));
            }
            if zero && kill_zero {
                failed.insert(0);
            }
            if !zero || !kill_zero {
                failed.remove(&0);
            }
            if failed.len() == n as usize {
                // Keep someone alive: the last rank (or rank 0 when it may not fail).
                failed.remove(&(n - 1));
            }
            let mut mix = Mix(seed);
            let mut cumulative = vec![BTreeSet::new(); batches];
            for &x in &failed {
                let b = mix.below(batches as u32) as usize;
                for set in &mut cumulative[b..] {
                    set.insert(x);
                }
            }
            Scenario { radix, n, batches: cumulative, seed }
        })
}

/// Every live daemon's view after applying `failed` in one repair from a fresh tree.
fn views_all_at_once(radix: u32, n: u32, failed: &BTreeSet<Rank>) -> BTreeMap<Rank, Topology> {
    (0..n)
        .filter(|x| !failed.contains(x))
        .map(|x| {
            let mut t = Topology::new(x, radix, n).unwrap();
            let before = t.clone();
            let delta = t.repair(failed).unwrap();
            check_delta(&before, &t, &delta, failed);
            (x, t)
        })
        .collect()
}

/// The delta is exactly the difference between the views before and after the repair.
fn check_delta(before: &Topology, after: &Topology, d: &RepairDelta, failed: &BTreeSet<Rank>) {
    let me = after.me();
    let ctx = format!("radix {} N {} rank {me} failed {failed:?}", after.radix(), after.size());
    let expected_parent = (before.parent() != after.parent()).then_some((before.parent(), after.parent()));
    assert_eq!(d.parent_changed, expected_parent, "{ctx}: parent_changed");
    let old: BTreeSet<Rank> = before.children().iter().copied().collect();
    let new: BTreeSet<Rank> = after.children().iter().copied().collect();
    let added: Vec<Rank> = after.children().iter().copied().filter(|c| !old.contains(c)).collect();
    let removed: Vec<Rank> = before.children().iter().copied().filter(|c| !new.contains(c)).collect();
    let kept: Vec<Rank> = after.children().iter().copied().filter(|c| old.contains(c)).collect();
    assert_eq!(d.children_added, added, "{ctx}: children_added");
    assert_eq!(d.children_removed, removed, "{ctx}: children_removed");
    assert_eq!(d.children_kept, kept, "{ctx}: children_kept");
    assert_eq!(d.children_kept.len() + d.children_added.len(), after.children().len(), "{ctx}");
    assert_eq!(d.children_kept.len() + d.children_removed.len(), before.children().len(), "{ctx}");
    // Promotion means taking a higher slot; slots are only ever gained.
    assert!(after.depth() <= before.depth(), "{ctx}: repair demoted the daemon");
    assert_eq!(d.promoted, after.depth() < before.depth(), "{ctx}: promoted");
    let newly: Vec<Rank> = failed.difference(before.failed()).copied().collect();
    assert_eq!(d.newly_failed, newly, "{ctx}: newly_failed");
    assert_eq!(after.epoch(), before.epoch() + u64::from(!newly.is_empty()), "{ctx}: epoch");
    assert_eq!(
        d.is_empty(),
        expected_parent.is_none() && added.is_empty() && removed.is_empty() && !d.promoted && newly.is_empty(),
        "{ctx}: is_empty"
    );
}

/// The repaired views form one spanning tree of the live ranks, agree with each other and with
/// the oracle, and route between live ranks through live ranks only.
fn check_repaired(radix: u32, n: u32, failed: &BTreeSet<Rank>, views: &BTreeMap<Rank, Topology>, seed: u64) {
    let ctx = format!("radix {radix} N {n} failed {failed:?}");
    let o = Oracle::new(radix, n);
    let ro = RepairOracle::new(&o, failed);
    let live: Vec<Rank> = views.keys().copied().collect();
    assert_eq!(live.len(), n as usize - failed.len(), "{ctx}: live set");
    let mut mix = Mix(seed);

    // Identical on every daemon: same repaired tree, and parents/children agree pairwise.
    let first = views.values().next().unwrap().repaired().clone();
    let mut roots = Vec::new();
    for (&x, t) in views {
        assert_eq!(t.repaired(), &first, "{ctx}: daemon {x} computed a different tree");
        assert_eq!(t.failed(), failed, "{ctx}: daemon {x} failed set");
        assert_eq!(t.live_count() as usize, live.len(), "{ctx}: daemon {x} live_count");
        assert_eq!(t.parent(), ro.parent[x as usize], "{ctx}: parent of {x} vs oracle");
        assert_eq!(t.depth(), o.depth[ro.top[x as usize] as usize], "{ctx}: depth of {x} (top slot)");
        match t.parent() {
            None => roots.push(x),
            Some(p) => {
                let pv = views.get(&p).unwrap_or_else(|| panic!("{ctx}: {x} has failed parent {p}"));
                let listed = pv.children().iter().filter(|&&c| c == x).count();
                assert_eq!(listed, 1, "{ctx}: {x} listed {listed} times under its parent {p}");
            }
        }
        for &c in t.children() {
            let cv = views.get(&c).unwrap_or_else(|| panic!("{ctx}: {x} has failed child {c}"));
            assert_eq!(cv.parent(), Some(x), "{ctx}: child {c} of {x} names parent {:?}", cv.parent());
        }
        let expected: BTreeSet<Rank> = live.iter().copied().filter(|&c| ro.parent[c as usize] == Some(x)).collect();
        let got: BTreeSet<Rank> = t.children().iter().copied().collect();
        assert_eq!(got.len(), t.children().len(), "{ctx}: duplicate children at {x}");
        assert_eq!(got, expected, "{ctx}: children of {x} vs oracle");
    }
    let min_live = live[0];
    assert_eq!(roots, vec![min_live], "{ctx}: roots {roots:?}, expected the lowest live rank");
    assert_eq!(first.root(), Some(min_live), "{ctx}: RepairedTree::root");
    assert_eq!(views[&min_live].depth(), 0, "{ctx}: root occupies slot 0");

    // Every live rank reaches the root by parents without a cycle.
    for &x in &live {
        let mut cur = x;
        let mut steps = 0;
        while let Some(p) = views[&cur].parent() {
            cur = p;
            steps += 1;
            assert!(steps <= live.len(), "{ctx}: cycle above {x}");
        }
        assert_eq!(cur, min_live, "{ctx}: {x} climbs to {cur}, not the root");
    }

    // Dead slots go to a live rank of their own failure-free subtree: the lowest one.
    for &s in failed {
        let occ = first.occupant(s);
        assert_eq!(occ, ro.occupant[s as usize], "{ctx}: occupant of dead slot {s}");
        if let Some(x) = occ {
            assert!(views.contains_key(&x) && o.in_subtree(s, x), "{ctx}: slot {s} to {x}");
            assert!(first.chain(x).contains(&s), "{ctx}: chain of {x} misses slot {s}");
        }
    }
    for &x in &live {
        assert_eq!(first.occupant(x), Some(x), "{ctx}: live {x} does not occupy its own slot");
        let chain = first.chain(x);
        assert_eq!(chain[0], x, "{ctx}: chain of {x}");
        assert_eq!(*chain.last().unwrap(), ro.top[x as usize], "{ctx}: top slot of {x}");
        for w in chain.windows(2) {
            assert_eq!(o.parent[w[0] as usize], Some(w[1]), "{ctx}: chain of {x} is not a path");
            assert!(failed.contains(&w[1]), "{ctx}: {x} occupies live slot {}", w[1]);
        }
    }

    // The subtree test agrees with a naive walk over the repaired parents.
    let probes = sample_ranks(&live, 6, &mut mix);
    let xs = sample_ranks(&(0..n).collect::<Vec<_>>(), 600, &mut mix);
    for &me in &probes {
        let t = &views[&me];
        for &x in &xs {
            assert_eq!(t.in_subtree(x), ro.in_subtree(me, x), "{ctx}: {me}.in_subtree({x})");
            assert_eq!(first.in_subtree_of(me, x), ro.in_subtree(me, x), "{ctx}: in_subtree_of({me}, {x})");
        }
    }

    // Routes between live ranks reach their destination through live ranks only; failed or
    // out-of-range destinations are unreachable.
    let view = |x: Rank| views[&x].clone();
    for (src, dst) in sample_pairs(&live, 128, &mut mix) {
        follow_route(&view, src, dst, &ctx);
        assert_eq!(first.route(src, dst), views[&src].route_to(dst), "{ctx}: RepairedTree::route {src}->{dst}");
    }
    for (&src, &dead) in sample_ranks(&live, 8, &mut mix).iter().zip(failed.iter().chain([&n])) {
        assert_eq!(views[&src].route_to(dead), Route::Unreachable, "{ctx}: {src} routes to dead {dead}");
    }
}

fn check_repair(s: &Scenario) {
    let (radix, n, failed) = (s.radix, s.n, s.failed());
    let all_at_once = views_all_at_once(radix, n, failed);
    check_repaired(radix, n, failed, &all_at_once, s.seed);

    // The same failures in batches reach the same tree, step by step.
    let mut views: BTreeMap<Rank, Topology> = (0..n).map(|x| (x, Topology::new(x, radix, n).unwrap())).collect();
    let mut epochs = 0;
    let mut prev = BTreeSet::new();
    for batch in &s.batches {
        let ctx = format!("radix {radix} N {n} batch {batch:?}");
        epochs += u64::from(batch.len() > prev.len());
        let reference = views_all_at_once(radix, n, batch);
        let mut next = BTreeMap::new();
        for (x, mut t) in views {
            let before = t.clone();
            match t.repair(batch) {
                Err(e) => {
                    assert!(batch.contains(&x), "{ctx}: live {x} refused repair: {e}");
                    assert_eq!(e, TopologyError::RankFailed { rank: x }, "{ctx}");
                }
                Ok(delta) => {
                    assert!(!batch.contains(&x), "{ctx}: failed {x} accepted repair");
                    check_delta(&before, &t, &delta, batch);
                    let r = &reference[&x];
                    assert_eq!(t.parent(), r.parent(), "{ctx}: stepwise parent of {x}");
                    assert_eq!(t.children(), r.children(), "{ctx}: stepwise children of {x}");
                    assert_eq!(t.repaired(), r.repaired(), "{ctx}: stepwise tree at {x}");
                    assert_eq!(t.depth(), r.depth(), "{ctx}: stepwise depth of {x}");
                    assert_eq!(t.epoch(), epochs, "{ctx}: epoch of {x}");
                    next.insert(x, t);
                }
            }
        }
        views = next;
        prev = batch.clone();
    }
    check_repaired(radix, n, failed, &views, s.seed ^ 1);

    // Repeating the complete set is a no-op.
    if let Some(t) = views.values_mut().next() {
        let before = t.clone();
        let d = t.repair(failed).unwrap();
        assert!(d.is_empty(), "radix {radix} N {n}: repeated repair changed {}: {d:?}", t.me());
        assert_eq!(t.epoch(), before.epoch());
    }
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn failure_free_tree_matches_design((radix, n) in geometry(), seed in any::<u64>()) {
        check_failure_free(radix, n, seed);
    }

    #[test]
    fn repair_keeps_one_spanning_tree_with_root_alive(s in scenario(false)) {
        check_repair(&s);
    }

    #[test]
    fn repair_keeps_one_spanning_tree_when_root_fails(s in scenario(true)) {
        check_repair(&s);
    }

    #[test]
    fn radix_below_two_is_a_typed_error(radix in 0u32..2, n in 0u32..=4096, me in 0u32..4096) {
        prop_assert_eq!(Tree::new(radix, n), Err(TopologyError::InvalidRadix(radix)));
        prop_assert_eq!(Topology::new(me, radix, n).err(), Some(TopologyError::InvalidRadix(radix)));
    }
}

#[test]
fn invalid_geometry_and_repairs_are_typed_errors() {
    assert_eq!(Tree::new(2, 0), Err(TopologyError::Empty));
    assert_eq!(Tree::new(2, MAX_DAEMONS + 1), Err(TopologyError::TooLarge { size: MAX_DAEMONS + 1, max: MAX_DAEMONS }));
    assert!(Tree::new(64, MAX_DAEMONS).is_ok());
    assert_eq!(Topology::new(7, 4, 7).err(), Some(TopologyError::RankOutOfRange { rank: 7, size: 7 }));
    let mut t = Topology::new(3, 4, 20).unwrap();
    assert_eq!(t.repair(&BTreeSet::from([3])), Err(TopologyError::RankFailed { rank: 3 }));
    assert_eq!(t.repair(&BTreeSet::from([20])), Err(TopologyError::RankOutOfRange { rank: 20, size: 20 }));
    // A refused repair leaves the view untouched.
    assert!(t.failed().is_empty());
    assert_eq!(t.epoch(), 0);
}

/// DESIGN §3 parent of `x`, computed with our own level arithmetic (no oracle arrays: N is big).
fn design_parent(radix: u32, x: Rank) -> Option<Rank> {
    let (r, x) = (u64::from(radix), u64::from(x));
    let (mut start, mut width, mut prev_start, mut prev_width) = (0u64, 1u64, 0u64, 0u64);
    while x >= start + width {
        (prev_start, prev_width) = (start, width);
        start += width;
        width *= r;
    }
    (x > 0).then(|| (prev_start + (x - start) % prev_width) as Rank)
}

#[test]
fn big_dvm_spot_checks() {
    let n: u32 = 1 << 20;
    for radix in [2u32, 3, 64] {
        let mut mix = Mix(u64::from(radix));
        let ctx = format!("radix {radix} N {n}");
        let fresh = |x: Rank| Topology::new(x, radix, n).unwrap();
        let mut probes: Vec<Rank> = (0..24).map(|_| mix.below(n)).collect();
        probes.extend([0, 1, n - 1, n / 2]);
        for &x in &probes {
            let t = fresh(x);
            assert_eq!(t.parent(), design_parent(radix, x), "{ctx}: parent of {x}");
            if let Some(p) = t.parent() {
                let listed = fresh(p).children().iter().filter(|&&c| c == x).count();
                assert_eq!(listed, 1, "{ctx}: {x} listed {listed} times under {p}");
            }
            for &c in t.children() {
                assert_eq!(design_parent(radix, c), Some(x), "{ctx}: child {c} of {x}");
            }
            // Ancestors by the naive walk are exactly the subtrees holding x.
            let mut a = Some(x);
            while let Some(y) = a {
                assert!(fresh(y).in_subtree(x), "{ctx}: ancestor {y} lacks {x}");
                a = design_parent(radix, y);
            }
            let other = mix.below(n);
            let mut a = Some(other);
            let mut naive = false;
            while let Some(y) = a {
                naive |= y == x;
                a = design_parent(radix, y);
            }
            assert_eq!(t.in_subtree(other), naive, "{ctx}: {x}.in_subtree({other})");
        }
        let pairs: Vec<(Rank, Rank)> = (0..16).map(|_| (mix.below(n), mix.below(n))).collect();
        for &(src, dst) in &pairs {
            follow_route(&fresh, src, dst, &ctx);
        }

        // Repair at scale: the root, a run of low ranks and scattered ranks fail.
        let mut failed: BTreeSet<Rank> = (0..5).collect();
        failed.extend((0..40).map(|_| mix.below(n)));
        let repaired = |x: Rank| {
            let mut t = fresh(x);
            t.repair(&failed).unwrap();
            t
        };
        let root = (0..n).find(|x| !failed.contains(x)).unwrap();
        let live = |mix: &mut Mix| loop {
            let x = mix.below(n);
            if !failed.contains(&x) {
                break x;
            }
        };
        for _ in 0..16 {
            let (src, dst) = (live(&mut mix), live(&mut mix));
            follow_route(&repaired, src, dst, &ctx);
            let mut cur = repaired(src);
            let mut steps = 0;
            while let Some(p) = cur.parent() {
                let pv = repaired(p);
                assert!(pv.children().contains(&cur.me()), "{ctx}: {} not under {p}", cur.me());
                cur = pv;
                steps += 1;
                assert!(steps <= cur.height() as usize + 1, "{ctx}: climb from {src} too long");
            }
            assert_eq!(cur.me(), root, "{ctx}: {src} climbs to {}", cur.me());
        }
    }
}
