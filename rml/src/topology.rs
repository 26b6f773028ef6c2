//! Radix routing tree: pure math, no I/O.
//!
//! Level `d` holds `R^d` ranks starting at `L_d = (R^d - 1) / (R - 1)`. The children of a rank
//! `r` at depth `d` are `r + j * R^d` for `j = 1..=R` (strided), so the subtree of `r` is every
//! rank `x` at depth `>= d` with `(x - L_depth(x)) % R^d == offset(r)`: one modulo test.
//!
//! Repair: every daemon computes the same repaired tree from `(radix, size, failed set)`.
//! A dead rank's *slot* is occupied by the first (lowest) live rank of its own subtree; a live
//! rank therefore occupies a chain of slots from its own up to the highest dead ancestor it
//! replaced. Its parent is the occupant of the slot above that chain; its children are the
//! occupants of the child slots hanging off the chain. Nothing here is ever sent on the wire.

use std::collections::BTreeSet;

/// Daemon rank. 0 is the head node (HNP).
pub type Rank = u32;

/// Largest DVM the tree math supports.
pub const MAX_DAEMONS: u32 = 1 << 24;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("radix {0} is invalid: a routing tree needs a radix of at least 2")]
    InvalidRadix(u32),
    #[error("a DVM needs at least one daemon (size 0 given)")]
    Empty,
    #[error("{size} daemons exceed the supported maximum of {max}")]
    TooLarge { size: u32, max: u32 },
    #[error("rank {rank} is outside the DVM of {size} daemons")]
    RankOutOfRange { rank: Rank, size: u32 },
    #[error("rank {rank} is marked failed and has no place in the tree")]
    RankFailed { rank: Rank },
}

/// Next hop toward a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The destination is this daemon.
    Local,
    /// Send to the parent.
    Up(Rank),
    /// Send to this child (its subtree holds the destination).
    Down(Rank),
    /// The destination is failed (or out of range): no route.
    Unreachable,
}

impl Route {
    /// The next-hop rank, if any.
    pub fn next_hop(self) -> Option<Rank> {
        match self {
            Route::Up(r) | Route::Down(r) => Some(r),
            Route::Local | Route::Unreachable => None,
        }
    }
}

/// The geometry of a failure-free radix tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tree {
    radix: u32,
    size: u32,
}

impl Tree {
    pub fn new(radix: u32, size: u32) -> Result<Self, TopologyError> {
        if radix < 2 {
            return Err(TopologyError::InvalidRadix(radix));
        }
        if size == 0 {
            return Err(TopologyError::Empty);
        }
        if size > MAX_DAEMONS {
            return Err(TopologyError::TooLarge { size, max: MAX_DAEMONS });
        }
        Ok(Tree { radix, size })
    }

    pub fn radix(&self) -> u32 {
        self.radix
    }

    pub fn size(&self) -> u32 {
        self.size
    }

    /// `R^d`, saturating (any value above `size` behaves the same).
    fn pow(&self, d: u32) -> u64 {
        (self.radix as u64).saturating_pow(d).min(1 << 40)
    }

    /// First rank of level `d`.
    fn level_start(&self, d: u32) -> u64 {
        // (R^d - 1) / (R - 1), computed incrementally to stay exact.
        let mut start = 0u64;
        let mut width = 1u64;
        for _ in 0..d {
            start += width;
            width = width.saturating_mul(self.radix as u64).min(1 << 40);
        }
        start
    }

    /// Depth of a rank (0 for the root).
    pub fn depth(&self, r: Rank) -> u32 {
        let r = r as u64;
        let mut d = 0;
        let mut start = 0u64;
        let mut width = 1u64;
        while r >= start + width {
            start += width;
            width = width.saturating_mul(self.radix as u64).min(1 << 40);
            d += 1;
        }
        d
    }

    fn offset(&self, r: Rank) -> u64 {
        r as u64 - self.level_start(self.depth(r))
    }

    /// Parent slot in the failure-free tree.
    pub fn parent(&self, r: Rank) -> Option<Rank> {
        let d = self.depth(r);
        if d == 0 {
            return None;
        }
        let off = self.offset(r) % self.pow(d - 1);
        Some((self.level_start(d - 1) + off) as Rank)
    }

    /// Child slots in the failure-free tree (only those `< size`).
    pub fn children(&self, r: Rank) -> impl Iterator<Item = Rank> + '_ {
        let stride = self.pow(self.depth(r));
        let size = self.size as u64;
        (1..=self.radix as u64).map(move |j| r as u64 + j * stride).take_while(move |&c| c < size).map(|c| c as Rank)
    }

    /// Whether `x` is in the subtree rooted at slot `root` (inclusive).
    pub fn in_subtree(&self, root: Rank, x: Rank) -> bool {
        let (dr, dx) = (self.depth(root), self.depth(x));
        dx >= dr && self.offset(x) % self.pow(dr) == self.offset(root)
    }

    /// The child slot of `s` whose subtree holds `x` (requires `x` strictly below `s`).
    fn child_toward(&self, s: Rank, x: Rank) -> Rank {
        let d = self.depth(s);
        let off = self.offset(x) % self.pow(d + 1);
        (self.level_start(d + 1) + off) as Rank
    }

    /// Ranks of the subtree of `s` in increasing order.
    fn subtree_ascending(&self, s: Rank) -> impl Iterator<Item = Rank> + '_ {
        let d = self.depth(s);
        let stride = self.pow(d);
        let off = self.offset(s);
        let size = self.size as u64;
        (0u32..)
            .map(move |k| (self.level_start(d + k) + off, self.pow(k)))
            .take_while(move |&(first, _)| first < size)
            .flat_map(move |(first, count)| (0..count).map(move |m| first + m * stride).take_while(move |&x| x < size))
            .map(|x| x as Rank)
    }

    /// Route from `me` to `dst` in the failure-free tree.
    pub fn route(&self, me: Rank, dst: Rank) -> Route {
        if dst >= self.size {
            Route::Unreachable
        } else if dst == me {
            Route::Local
        } else if !self.in_subtree(me, dst) {
            Route::Up(self.parent(me).expect("only the root holds every rank"))
        } else {
            Route::Down(self.child_toward(me, dst))
        }
    }
}

/// The tree after repair: geometry plus the set of failed ranks. Every daemon that holds the
/// same `(radix, size, failed)` computes the same tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairedTree {
    tree: Tree,
    failed: BTreeSet<Rank>,
}

impl RepairedTree {
    pub fn new(tree: Tree, failed: BTreeSet<Rank>) -> Self {
        RepairedTree { tree, failed }
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    pub fn failed(&self) -> &BTreeSet<Rank> {
        &self.failed
    }

    pub fn is_alive(&self, r: Rank) -> bool {
        r < self.tree.size && !self.failed.contains(&r)
    }

    /// The live rank occupying slot `s`: `s` itself, or the lowest live rank of its subtree.
    pub fn occupant(&self, s: Rank) -> Option<Rank> {
        if self.is_alive(s) {
            return Some(s);
        }
        self.tree.subtree_ascending(s).find(|x| !self.failed.contains(x))
    }

    /// The slots a live rank occupies, from its own slot upward (the last is the highest).
    pub fn chain(&self, me: Rank) -> Vec<Rank> {
        let mut chain = vec![me];
        let mut s = me;
        while let Some(p) = self.tree.parent(s) {
            if self.occupant(p) == Some(me) {
                chain.push(p);
                s = p;
            } else {
                break;
            }
        }
        chain
    }

    /// The root of the repaired tree (occupant of slot 0).
    pub fn root(&self) -> Option<Rank> {
        self.occupant(0)
    }

    /// Parent of a live rank (None for the root).
    pub fn parent_of(&self, me: Rank) -> Option<Rank> {
        let chain = self.chain(me);
        let top = *chain.last().expect("chain is never empty");
        self.tree.parent(top).and_then(|p| self.occupant(p))
    }

    /// Children of a live rank, in slot order.
    pub fn children_of(&self, me: Rank) -> Vec<Rank> {
        let chain = self.chain(me);
        let mut out = Vec::new();
        for (i, &s) in chain.iter().enumerate() {
            let below = if i == 0 { None } else { Some(chain[i - 1]) };
            for c in self.tree.children(s) {
                if Some(c) == below {
                    continue;
                }
                if let Some(o) = self.occupant(c) {
                    out.push(o);
                }
            }
        }
        out
    }

    /// Whether live rank `x` lies in the repaired subtree of live rank `me`.
    pub fn in_subtree_of(&self, me: Rank, x: Rank) -> bool {
        let top = *self.chain(me).last().expect("chain is never empty");
        self.is_alive(x) && self.tree.in_subtree(top, x)
    }

    /// Next hop from live rank `me` toward `dst` in the repaired tree.
    pub fn route(&self, me: Rank, dst: Rank) -> Route {
        if !self.is_alive(dst) {
            return Route::Unreachable;
        }
        if dst == me {
            return Route::Local;
        }
        let chain = self.chain(me);
        let Some(&s) = chain.iter().find(|&&s| self.tree.in_subtree(s, dst)) else {
            return match self.parent_of(me) {
                Some(p) => Route::Up(p),
                None => Route::Unreachable,
            };
        };
        let c = self.tree.child_toward(s, dst);
        match self.occupant(c) {
            Some(o) => Route::Down(o),
            None => Route::Unreachable,
        }
    }
}

/// What a repair changed for one daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairDelta {
    /// The parent changed (old, new).
    pub parent_changed: Option<(Option<Rank>, Option<Rank>)>,
    /// Children present now that were not before.
    pub children_added: Vec<Rank>,
    /// Children present before that are not now.
    pub children_removed: Vec<Rank>,
    /// Children present both before and after.
    pub children_kept: Vec<Rank>,
    /// This daemon took over at least one slot it did not hold before.
    pub promoted: bool,
    /// Ranks newly marked failed by this repair.
    pub newly_failed: Vec<Rank>,
}

impl RepairDelta {
    pub fn is_empty(&self) -> bool {
        self.parent_changed.is_none()
            && self.children_added.is_empty()
            && self.children_removed.is_empty()
            && !self.promoted
            && self.newly_failed.is_empty()
    }
}

/// One daemon's view of the routing tree: its rank, the repaired tree and cached neighbours.
/// The single source of truth for parent, children, route and subtree questions.
#[derive(Debug, Clone)]
pub struct Topology {
    me: Rank,
    repaired: RepairedTree,
    /// Number of repairs applied; every daemon applying the same failures in the same order
    /// reaches the same epoch.
    epoch: u64,
    parent: Option<Rank>,
    children: Vec<Rank>,
    top_slot: Rank,
}

impl Topology {
    pub fn new(me: Rank, radix: u32, size: u32) -> Result<Self, TopologyError> {
        let tree = Tree::new(radix, size)?;
        if me >= size {
            return Err(TopologyError::RankOutOfRange { rank: me, size });
        }
        Ok(Self::build(me, RepairedTree::new(tree, BTreeSet::new()), 0))
    }

    fn build(me: Rank, repaired: RepairedTree, epoch: u64) -> Self {
        let chain = repaired.chain(me);
        let top_slot = *chain.last().expect("chain is never empty");
        let parent = repaired.parent_of(me);
        let children = repaired.children_of(me);
        Topology { me, repaired, epoch, parent, children, top_slot }
    }

    pub fn me(&self) -> Rank {
        self.me
    }
    pub fn radix(&self) -> u32 {
        self.repaired.tree.radix
    }
    pub fn size(&self) -> u32 {
        self.repaired.tree.size
    }
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    pub fn parent(&self) -> Option<Rank> {
        self.parent
    }
    pub fn children(&self) -> &[Rank] {
        &self.children
    }
    pub fn is_root(&self) -> bool {
        self.parent.is_none()
    }
    pub fn is_alive(&self, r: Rank) -> bool {
        self.repaired.is_alive(r)
    }
    pub fn failed(&self) -> &BTreeSet<Rank> {
        &self.repaired.failed
    }
    pub fn live_count(&self) -> u32 {
        self.size() - self.repaired.failed.len() as u32
    }
    /// Every live daemon, in rank order (identical on every daemon that applied the same
    /// repairs).
    pub fn live_ranks(&self) -> impl Iterator<Item = Rank> + '_ {
        (0..self.size()).filter(|&r| self.is_alive(r))
    }
    pub fn repaired(&self) -> &RepairedTree {
        &self.repaired
    }
    /// Depth of this daemon's slot in the failure-free tree.
    pub fn depth(&self) -> u32 {
        self.repaired.tree.depth(self.top_slot)
    }
    /// Height of the failure-free tree (depth of the deepest rank).
    pub fn height(&self) -> u32 {
        self.repaired.tree.depth(self.size() - 1)
    }

    /// Next hop toward `dst`.
    pub fn route_to(&self, dst: Rank) -> Route {
        if dst == self.me && self.is_alive(dst) {
            return Route::Local;
        }
        if self.is_alive(dst) && !self.repaired.tree.in_subtree(self.top_slot, dst) {
            return match self.parent {
                Some(p) => Route::Up(p),
                None => Route::Unreachable,
            };
        }
        self.repaired.route(self.me, dst)
    }

    /// Whether live rank `x` is in this daemon's (repaired) subtree, itself included.
    pub fn in_subtree(&self, x: Rank) -> bool {
        self.is_alive(x) && self.repaired.tree.in_subtree(self.top_slot, x)
    }

    /// Apply a repair: `failed` is the complete failed set (it only grows). Returns what
    /// changed for this daemon.
    pub fn repair(&mut self, failed: &BTreeSet<Rank>) -> Result<RepairDelta, TopologyError> {
        if failed.contains(&self.me) {
            return Err(TopologyError::RankFailed { rank: self.me });
        }
        if let Some(&bad) = failed.iter().find(|&&r| r >= self.size()) {
            return Err(TopologyError::RankOutOfRange { rank: bad, size: self.size() });
        }
        let mut all = self.repaired.failed.clone();
        let newly_failed: Vec<Rank> = failed.difference(&all).copied().collect();
        all.extend(failed.iter().copied());
        let next = Self::build(
            self.me,
            RepairedTree::new(self.repaired.tree, all),
            self.epoch + u64::from(!newly_failed.is_empty()),
        );
        let old_children: BTreeSet<Rank> = self.children.iter().copied().collect();
        let new_children: BTreeSet<Rank> = next.children.iter().copied().collect();
        let delta = RepairDelta {
            parent_changed: (self.parent != next.parent).then_some((self.parent, next.parent)),
            children_added: next.children.iter().filter(|c| !old_children.contains(c)).copied().collect(),
            children_removed: self.children.iter().filter(|c| !new_children.contains(c)).copied().collect(),
            children_kept: next.children.iter().filter(|c| old_children.contains(c)).copied().collect(),
            promoted: next.top_slot != self.top_slot,
            newly_failed,
        };
        *self = next;
        Ok(delta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn radix_below_two_is_an_error() {
        assert_eq!(Tree::new(1, 4), Err(TopologyError::InvalidRadix(1)));
        assert_eq!(Tree::new(0, 4), Err(TopologyError::InvalidRadix(0)));
        assert_eq!(Tree::new(2, 0), Err(TopologyError::Empty));
        assert!(Topology::new(4, 2, 4).is_err());
    }

    #[test]
    fn strided_children_radix_two() {
        let t = Tree::new(2, 15).unwrap();
        assert_eq!(t.children(0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(t.children(1).collect::<Vec<_>>(), vec![3, 5]);
        assert_eq!(t.children(2).collect::<Vec<_>>(), vec![4, 6]);
        assert_eq!(t.children(3).collect::<Vec<_>>(), vec![7, 11]);
        assert_eq!(t.parent(11), Some(3));
        assert_eq!(t.parent(6), Some(2));
        assert!(t.in_subtree(1, 13));
        assert!(!t.in_subtree(2, 13));
    }

    #[test]
    fn large_dvm_is_cheap() {
        let t = Topology::new(1_000_000, 2, 1 << 20).unwrap();
        assert_eq!(t.height(), 20);
        let p = t.parent().unwrap();
        assert!(Topology::new(p, 2, 1 << 20).unwrap().children().contains(&1_000_000));
    }

    #[test]
    fn dead_slot_goes_to_lowest_live_rank_of_its_subtree() {
        // radix 2, 15 ranks: subtree of 1 = {1,3,5,7,9,11,13}
        let mut failed = BTreeSet::new();
        failed.insert(1);
        let rt = RepairedTree::new(Tree::new(2, 15).unwrap(), failed.clone());
        assert_eq!(rt.occupant(1), Some(3));
        assert_eq!(rt.parent_of(3), Some(0));
        assert_eq!(rt.children_of(3), vec![7, 11, 5]);
        assert_eq!(rt.parent_of(5), Some(3));
        let mut t3 = Topology::new(3, 2, 15).unwrap();
        let d = t3.repair(&failed).unwrap();
        assert_eq!(d.parent_changed, Some((Some(1), Some(0))));
        assert!(d.promoted);
        assert_eq!(d.children_added, vec![5]);
        let mut t0 = Topology::new(0, 2, 15).unwrap();
        let d0 = t0.repair(&failed).unwrap();
        assert_eq!(d0.children_added, vec![3]);
        assert_eq!(d0.children_removed, vec![1]);
        assert_eq!(d0.children_kept, vec![2]);
        assert!(!d0.promoted);
    }
}
