//! The placement of a job's procs on daemons, held in O(nodes): node ranges plus a layout.
//! The HNP builds it by mapping; every daemon rebuilds the same value from the `JobMap`. All
//! queries answer from the compact form (O(1) or O(log nodes)); nothing lists procs.

use std::ops::Range;
use std::sync::Arc;

use super::topo::NodeTopo;

/// A set of ranks in increasing order: `first`, `first + stride`, ... (`count` of them), or
/// a list (a node's ranks under an explicit layout, shared with the placement).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranks(Repr);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    /// `stride` is always >= 1 (1: a contiguous range).
    Strided { first: u32, count: u32, stride: u32 },
    /// Sorted, distinct.
    Listed(Arc<[u32]>),
}

impl Ranks {
    pub const EMPTY: Ranks = Ranks(Repr::Strided { first: 0, count: 0, stride: 1 });

    /// `first`, `first + stride`, ...: `count` ranks (a stride of 0 is taken as 1).
    pub fn strided(first: u32, count: u32, stride: u32) -> Ranks {
        Ranks(Repr::Strided { first, count, stride: stride.max(1) })
    }

    fn listed(ranks: Arc<[u32]>) -> Ranks {
        Ranks(Repr::Listed(ranks))
    }

    pub fn len(&self) -> u32 {
        match &self.0 {
            Repr::Strided { count, .. } => *count,
            Repr::Listed(l) => l.len() as u32,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th rank of the set.
    pub fn get(&self, i: u32) -> Option<u32> {
        match &self.0 {
            Repr::Strided { first, count, stride } => (i < *count).then(|| first + i * stride),
            Repr::Listed(l) => l.get(i as usize).copied(),
        }
    }

    /// Position of `rank` in the set: for a node's ranks, its local rank.
    pub fn index_of(&self, rank: u32) -> Option<u32> {
        match &self.0 {
            Repr::Strided { first, count, stride } => {
                let off = rank.checked_sub(*first)?;
                let i = off / stride;
                (off % stride == 0 && i < *count).then_some(i)
            }
            Repr::Listed(l) => l.binary_search(&rank).ok().map(|i| i as u32),
        }
    }

    pub fn contains(&self, rank: u32) -> bool {
        self.index_of(rank).is_some()
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.len()).map(move |i| self.get(i).expect("index below len"))
    }

    /// The set as maximal runs of evenly spaced ranks `(first, count, stride)`: one run for a
    /// strided set, as few as a greedy split finds for a list.
    pub fn runs(&self) -> Vec<(u32, u32, u32)> {
        match &self.0 {
            Repr::Strided { first, count, stride } => vec![(*first, *count, *stride)],
            Repr::Listed(l) => {
                let mut out: Vec<(u32, u32, u32)> = Vec::new();
                for &r in l.iter() {
                    match out.last_mut() {
                        Some((f, c, s)) if *c == 1 => {
                            *s = r - *f;
                            *c = 2;
                        }
                        Some((f, c, s)) if *f as u64 + *c as u64 * *s as u64 == r as u64 => *c += 1,
                        _ => out.push((r, 1, 1)),
                    }
                }
                out
            }
        }
    }
}

/// How ranks are laid out over the nodes of a placement (node index `0..k` in node order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Node `i` holds ranks `[i*each, (i+1)*each)`; the last node holds the rest (1..=each).
    Block { each: u32 },
    /// Node `i` holds ranks `[first_rank[i], first_rank[i+1])`; `first_rank` has k+1 entries,
    /// from 0 to nprocs, strictly increasing.
    PerNode { first_rank: Vec<u32> },
    /// Rank `r` on node `r mod k`.
    RoundRobin,
    /// Rank `r` on node `node_of[r]` (nprocs entries): any order the others cannot say.
    Explicit { node_of: Vec<u32> },
}

/// An explicit layout's answers, derived once: each node's ranks and each rank's local rank.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listed {
    per_node: Vec<Arc<[u32]>>,
    local: Vec<u32>,
}

/// Everything a daemon knows about one proc, derived from the placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcInfo {
    pub rank: u32,
    /// Daemon rank hosting the proc.
    pub daemon: u32,
    /// Index of that daemon among the job's nodes (node order).
    pub node: u32,
    /// Index among the procs on that node, in rank order.
    pub local_rank: u32,
    /// Same as `local_rank`: one job per placement, so no other job's procs precede.
    pub node_rank: u32,
    pub app: u32,
}

/// The daemons of a job, in node order, as ranges of daemon ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Nodes {
    /// `(first daemon, count)` in node order.
    ranges: Vec<(u32, u32)>,
    /// Node index at which each range starts.
    start: Vec<u32>,
    /// Indices into `ranges`, sorted by first daemon (ranges never overlap).
    by_daemon: Vec<usize>,
    k: u32,
}

impl Nodes {
    fn new(ranges: Vec<(u32, u32)>, nprocs: u32) -> Result<Nodes, String> {
        if ranges.is_empty() {
            return Err("no nodes".into());
        }
        let mut start = Vec::with_capacity(ranges.len());
        let mut k: u64 = 0;
        for (i, &(first, count)) in ranges.iter().enumerate() {
            if count == 0 {
                return Err(format!("node range {i} (from daemon {first}) is empty"));
            }
            // The end must fit a u32 (`first..first + count`); u32::MAX is no daemon's rank
            // (it is the tools' rank). Found by scripts/fuzz.sh.
            if first as u64 + count as u64 > u32::MAX as u64 {
                return Err(format!(
                    "node range {i} (daemon {first}, {count} daemons) runs past daemon rank {}",
                    u32::MAX - 1
                ));
            }
            start.push(k as u32);
            k += count as u64;
            if k > nprocs as u64 {
                return Err(format!("more nodes ({k} so far) than procs ({nprocs}); every node must host a proc"));
            }
        }
        let mut by_daemon: Vec<usize> = (0..ranges.len()).collect();
        by_daemon.sort_by_key(|&i| ranges[i].0);
        for w in by_daemon.windows(2) {
            let (a, b) = (ranges[w[0]], ranges[w[1]]);
            if a.0 as u64 + a.1 as u64 > b.0 as u64 {
                return Err(format!("daemon {} is listed twice among the nodes", b.0));
            }
        }
        Ok(Nodes { ranges, start, by_daemon, k: k as u32 })
    }

    fn daemon_at(&self, node: u32) -> Option<u32> {
        if node >= self.k {
            return None;
        }
        let j = self.start.partition_point(|&s| s <= node) - 1;
        Some(self.ranges[j].0 + (node - self.start[j]))
    }

    fn index_of(&self, daemon: u32) -> Option<u32> {
        let j = self.by_daemon.partition_point(|&i| self.ranges[i].0 <= daemon);
        let i = self.by_daemon[j.checked_sub(1)?];
        let (first, count) = self.ranges[i];
        (daemon - first < count).then(|| self.start[i] + (daemon - first))
    }
}

/// The placement of a job: node ranges + layout + app boundaries. Same value on the HNP (from
/// [`crate::jobmap::map_job`]) and on every daemon (from [`Placement::from_job_map`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    nprocs: u32,
    app_first_rank: Vec<u32>,
    nodes: Nodes,
    layout: Layout,
    listed: Option<Listed>,
}

impl Placement {
    /// Checks every invariant; the only constructor, used for mapped and received placements.
    pub(crate) fn new(
        nprocs: u32,
        app_first_rank: Vec<u32>,
        node_ranges: Vec<(u32, u32)>,
        layout: Layout,
    ) -> Result<Placement, String> {
        if nprocs == 0 {
            return Err("nprocs is 0".into());
        }
        match app_first_rank.first() {
            None => return Err("no apps".into()),
            Some(&f) if f != 0 => return Err(format!("app 0 starts at rank {f}, not 0")),
            _ => {}
        }
        for (i, w) in app_first_rank.windows(2).enumerate() {
            if w[1] <= w[0] {
                return Err(format!("app {} starts at rank {}, not after app {i} (rank {})", i + 1, w[1], w[0]));
            }
        }
        let last = *app_first_rank.last().unwrap();
        if last >= nprocs {
            return Err(format!(
                "app {} starts at rank {last}, beyond the job's {nprocs} procs",
                app_first_rank.len() - 1
            ));
        }
        let nodes = Nodes::new(node_ranges, nprocs)?;
        let k = nodes.k as u64;
        match &layout {
            Layout::Block { each } => {
                let each = *each as u64;
                if each == 0 || (k - 1) * each >= nprocs as u64 || nprocs as u64 > k * each {
                    return Err(format!("block of {each} per node does not fit {nprocs} procs on {k} nodes"));
                }
            }
            Layout::PerNode { first_rank } => {
                if first_rank.len() as u64 != k + 1 {
                    return Err(format!("{} per-node counts for {k} nodes", first_rank.len().saturating_sub(1)));
                }
                if first_rank[0] != 0 || first_rank[k as usize] != nprocs {
                    return Err(format!(
                        "per-node counts sum to {}, not {nprocs}",
                        first_rank[k as usize] - first_rank[0]
                    ));
                }
                if let Some(i) = first_rank.windows(2).position(|w| w[1] <= w[0]) {
                    return Err(format!("node {i} (daemon {}) has no procs", nodes.daemon_at(i as u32).unwrap()));
                }
            }
            Layout::RoundRobin => {}
            Layout::Explicit { node_of } => {
                if node_of.len() as u64 != nprocs as u64 {
                    return Err(format!("{} per-rank nodes for {nprocs} procs", node_of.len()));
                }
                let mut per_node: Vec<Vec<u32>> = vec![Vec::new(); k as usize];
                let mut local = Vec::with_capacity(node_of.len());
                for (r, &n) in node_of.iter().enumerate() {
                    let Some(on) = per_node.get_mut(n as usize) else {
                        return Err(format!("rank {r} is on node {n}, but the job has {k} nodes"));
                    };
                    local.push(on.len() as u32);
                    on.push(r as u32);
                }
                if let Some(i) = per_node.iter().position(Vec::is_empty) {
                    return Err(format!("node {i} (daemon {}) has no procs", nodes.daemon_at(i as u32).unwrap()));
                }
                let per_node = per_node.into_iter().map(Arc::from).collect();
                let listed = Some(Listed { per_node, local });
                return Ok(Placement { nprocs, app_first_rank, nodes, layout, listed });
            }
        }
        Ok(Placement { nprocs, app_first_rank, nodes, layout, listed: None })
    }

    pub fn nprocs(&self) -> u32 {
        self.nprocs
    }

    /// Number of nodes (daemons) hosting procs.
    pub fn num_nodes(&self) -> u32 {
        self.nodes.k
    }

    pub fn num_apps(&self) -> u32 {
        self.app_first_rank.len() as u32
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// `(first daemon, count)` ranges of the job's daemons, in node order.
    pub fn node_ranges(&self) -> &[(u32, u32)] {
        &self.nodes.ranges
    }

    /// First rank of each app.
    pub fn app_first_rank(&self) -> &[u32] {
        &self.app_first_rank
    }

    /// Ranks of app `app`.
    pub fn app_ranks(&self, app: u32) -> Option<Range<u32>> {
        let a = app as usize;
        let start = *self.app_first_rank.get(a)?;
        let end = self.app_first_rank.get(a + 1).copied().unwrap_or(self.nprocs);
        Some(start..end)
    }

    /// The job's daemons in node order.
    pub fn daemons(&self) -> impl Iterator<Item = u32> + '_ {
        self.nodes.ranges.iter().flat_map(|&(first, count)| first..first + count)
    }

    /// Daemon at node index `node`.
    pub fn daemon_at(&self, node: u32) -> Option<u32> {
        self.nodes.daemon_at(node)
    }

    /// Node index of `daemon`, if it hosts procs of this job.
    pub fn node_index_of(&self, daemon: u32) -> Option<u32> {
        self.nodes.index_of(daemon)
    }

    /// Ranks on node index `node` (empty if out of range).
    pub fn ranks_at(&self, node: u32) -> Ranks {
        let k = self.nodes.k;
        if node >= k {
            return Ranks::EMPTY;
        }
        match &self.layout {
            Layout::Block { each } => {
                let first = node * each;
                Ranks::strided(first, (*each).min(self.nprocs - first), 1)
            }
            Layout::PerNode { first_rank } => {
                let (a, b) = (first_rank[node as usize], first_rank[node as usize + 1]);
                Ranks::strided(a, b - a, 1)
            }
            Layout::RoundRobin => {
                let count = self.nprocs / k + u32::from(node < self.nprocs % k);
                Ranks::strided(node, count, k)
            }
            Layout::Explicit { .. } => Ranks::listed(self.listed().per_node[node as usize].clone()),
        }
    }

    /// Ranks hosted by `daemon`, in rank order (empty if it hosts none).
    pub fn procs_on(&self, daemon: u32) -> Ranks {
        self.node_index_of(daemon).map_or(Ranks::EMPTY, |n| self.ranks_at(n))
    }

    /// Node index hosting `rank`.
    fn node_index_of_rank(&self, rank: u32) -> Option<u32> {
        if rank >= self.nprocs {
            return None;
        }
        Some(match &self.layout {
            Layout::Block { each } => rank / each,
            Layout::PerNode { first_rank } => (first_rank.partition_point(|&f| f <= rank) - 1) as u32,
            Layout::RoundRobin => rank % self.nodes.k,
            Layout::Explicit { node_of } => node_of[rank as usize],
        })
    }

    fn listed(&self) -> &Listed {
        self.listed.as_ref().expect("an explicit layout has its lists")
    }

    /// Daemon hosting `rank`.
    pub fn node_of(&self, rank: u32) -> Option<u32> {
        self.node_index_of_rank(rank).and_then(|n| self.daemon_at(n))
    }

    /// Index of `rank` among the procs on its node, in rank order.
    pub fn local_rank(&self, rank: u32) -> Option<u32> {
        let n = self.node_index_of_rank(rank)?;
        Some(match &self.layout {
            Layout::Block { each } => rank % each,
            Layout::PerNode { first_rank } => rank - first_rank[n as usize],
            Layout::RoundRobin => rank / self.nodes.k,
            Layout::Explicit { .. } => self.listed().local[rank as usize],
        })
    }

    /// Node rank of `rank`: equal to the local rank (one job per placement).
    pub fn node_rank(&self, rank: u32) -> Option<u32> {
        self.local_rank(rank)
    }

    /// App index of `rank`.
    pub fn app_of(&self, rank: u32) -> Option<u32> {
        (rank < self.nprocs).then(|| (self.app_first_rank.partition_point(|&f| f <= rank) - 1) as u32)
    }

    /// Everything about `rank`.
    pub fn proc(&self, rank: u32) -> Option<ProcInfo> {
        let node = self.node_index_of_rank(rank)?;
        let local_rank = self.local_rank(rank)?;
        Some(ProcInfo {
            rank,
            daemon: self.daemon_at(node)?,
            node,
            local_rank,
            node_rank: local_rank,
            app: self.app_of(rank)?,
        })
    }

    /// All procs in rank order, computed one at a time.
    pub fn procs(&self) -> impl Iterator<Item = ProcInfo> + '_ {
        (0..self.nprocs).filter_map(|r| self.proc(r))
    }
}

/// A candidate node of the DVM: the daemon on it, its host name, its slots and its hardware
/// (when it reported it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSlots {
    pub daemon: u32,
    pub host: String,
    pub slots: u32,
    pub topo: Option<Arc<NodeTopo>>,
}

impl NodeSlots {
    pub fn new(daemon: u32, host: impl Into<String>, slots: u32) -> NodeSlots {
        NodeSlots { daemon, host: host.into(), slots, topo: None }
    }
}

/// The most compact layout giving node `node_of[r]` to rank `r` (`counts`: procs per node):
/// round-robin when dealt one by one, blocks when ranks never go back to an earlier node, else
/// the explicit list.
pub(super) fn layout_of(node_of: Vec<u32>, counts: &[u32]) -> Layout {
    let k = counts.len() as u32;
    if node_of.iter().enumerate().all(|(r, &i)| i == r as u32 % k) {
        Layout::RoundRobin
    } else if node_of.windows(2).all(|w| w[1] >= w[0]) {
        block_layout(counts)
    } else {
        Layout::Explicit { node_of }
    }
}

/// Blocks of `counts`: uniform when every node but the last holds the same count and the last
/// no more, else per node.
pub(super) fn block_layout(counts: &[u32]) -> Layout {
    let each = counts[0];
    let (last, body) = counts.split_last().expect("at least one node");
    if body.iter().all(|&c| c == each) && *last <= each {
        Layout::Block { each }
    } else {
        let mut first_rank = Vec::with_capacity(counts.len() + 1);
        let mut r = 0;
        first_rank.push(0);
        for &c in counts {
            r += c;
            first_rank.push(r);
        }
        Layout::PerNode { first_rank }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_index_of_inverts_get() {
        for (first, count, stride) in [(0, 0, 1), (3, 5, 1), (2, 4, 7), (0, 1, 1000)] {
            let r = Ranks::strided(first, count, stride);
            let listed: Vec<u32> = r.iter().collect();
            assert_eq!(listed.len() as u32, r.len());
            for rank in 0..first + count * stride + 2 {
                let naive = listed.iter().position(|&x| x == rank).map(|i| i as u32);
                assert_eq!(r.index_of(rank), naive, "{r:?} rank {rank}");
                assert_eq!(naive.and_then(|i| r.get(i)), naive.map(|_| rank));
            }
        }
    }

    #[test]
    fn daemon_ranges_in_node_order_need_not_be_sorted() {
        let p = Placement::new(5, vec![0], vec![(7, 2), (1, 3)], Layout::RoundRobin).unwrap();
        assert_eq!(p.daemons().collect::<Vec<_>>(), vec![7, 8, 1, 2, 3]);
        for (node, d) in p.daemons().enumerate() {
            assert_eq!(p.node_index_of(d), Some(node as u32));
            assert_eq!(p.daemon_at(node as u32), Some(d));
        }
        assert_eq!(p.node_index_of(0), None);
        assert_eq!(p.node_index_of(4), None);
        assert_eq!(p.node_index_of(9), None);
        assert!(Placement::new(5, vec![0], vec![(1, 2), (2, 3)], Layout::RoundRobin).is_err());
    }
}
