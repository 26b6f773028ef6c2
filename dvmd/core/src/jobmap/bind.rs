//! A node's share of a job on its hardware: which object each local proc is mapped to, the
//! local rank order (`--rank-by OBJ`) and the PUs each is bound to (`--bind-to`, `:PE=n`).
//! The HNP runs it with no busy PUs to refuse a binding before launch; each daemon runs it
//! again with the PUs other jobs' procs hold there, so a shared node fills its free cpus first.
//!
//! Never: node-level counts (the mapper's) or I/O.
//! Invariants: pure and deterministic; busy PUs only reorder choices, so a plan the HNP
//! accepted is never refused on a daemon; procs are placed in mapping order and only then
//! ranked, so `--rank-by` never changes where a proc runs, only which rank runs there.

use std::collections::{BTreeMap, BTreeSet};

use dvm_proto::job::{BindTo, LocalPlan};

use super::topo::{Level, NodeTopo};

/// What to bind to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bind {
    /// Open MPI's default: the mapped object, core with PE, core for jobs of up to 2 procs,
    /// else package; nothing on a node with more procs than cpus.
    Default,
    None,
    To(Level),
}

/// How a node places its procs, decoded from [`LocalPlan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Procs go round-robin over these objects (`None`: over the node's cpus in order).
    pub map_obj: Option<Level>,
    /// ppr: this many procs on each object in turn (0: one at a time, round-robin).
    pub per_obj: u32,
    /// Local ranks round-robin over these objects (`None`: in mapping order).
    pub rank_obj: Option<Level>,
    pub bind: Bind,
    /// Cpus per proc (>= 1).
    pub pe: u32,
    /// A cpu is a hardware thread (else a core).
    pub hwthread_cpus: bool,
    pub overload_allowed: bool,
    pub if_supported: bool,
    /// The job's procs on all nodes (the default binding depends on it).
    pub job_procs: u32,
}

impl Default for Plan {
    fn default() -> Plan {
        Plan {
            map_obj: None,
            per_obj: 0,
            rank_obj: None,
            bind: Bind::None,
            pe: 1,
            hwthread_cpus: false,
            overload_allowed: false,
            if_supported: false,
            job_procs: 0,
        }
    }
}

impl Plan {
    /// `nprocs`: the job's (the map says it).
    pub fn from_wire(p: &LocalPlan, nprocs: u32) -> Plan {
        let bind = match BindTo::try_from(p.bind_to) {
            Ok(BindTo::None) => Bind::None,
            Ok(BindTo::Obj) => Level::from_wire(p.bind_obj).map_or(Bind::None, Bind::To),
            _ => Bind::Default,
        };
        Plan {
            map_obj: Level::from_wire(p.map_obj).filter(|&l| l != Level::Node),
            per_obj: p.per_obj,
            rank_obj: Level::from_wire(p.rank_obj),
            bind,
            pe: p.cpus_per_rank.max(1),
            hwthread_cpus: p.hwthread_cpus,
            overload_allowed: p.overload_allowed,
            if_supported: p.if_supported,
            job_procs: nprocs,
        }
    }

    pub fn to_wire(&self) -> LocalPlan {
        let none = dvm_proto::job::HwObj::None as i32;
        let (bind_to, bind_obj) = match self.bind {
            Bind::Default => (BindTo::Default as i32, none),
            Bind::None => (BindTo::None as i32, none),
            Bind::To(l) => (BindTo::Obj as i32, l.wire() as i32),
        };
        LocalPlan {
            map_obj: self.map_obj.map_or(none, |l| l.wire() as i32),
            per_obj: self.per_obj,
            rank_obj: self.rank_obj.map_or(none, |l| l.wire() as i32),
            bind_to,
            bind_obj,
            cpus_per_rank: if self.pe > 1 { self.pe } else { 0 },
            hwthread_cpus: self.hwthread_cpus,
            overload_allowed: self.overload_allowed,
            if_supported: self.if_supported,
        }
    }

    /// The unit a cpu is on a node: hwthread when asked or when the node reports no cores.
    pub fn unit(&self, topo: &NodeTopo) -> Level {
        if self.hwthread_cpus || topo.count(Level::Core) == 0 {
            Level::Hwthread
        } else {
            Level::Core
        }
    }
}

/// Where one local proc runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// The object it was mapped to (`None`: the node as a whole).
    pub obj: Option<(Level, u32)>,
    /// The level it is bound to, and its PUs (logical positions, sorted); `None`: unbound.
    pub bound: Option<(Level, Vec<u32>)>,
}

/// Why a node cannot place its share; each names the node and the numbers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    #[error("cannot map by {level}: node {host} has no {level} objects (it has {has})", level = .level.name())]
    NoObject { host: String, level: Level, has: String },
    #[error("cannot bind to {level}: node {host} has no {level} objects (it has {has}); add :if-supported to --bind-to to run unbound there", level = .level.name())]
    NoBindObject { host: String, level: Level, has: String },
    #[error("cannot give {pe} cpus to each process: {} has only {cpus} {unit}s", where_(*.level, .host), unit = .unit.name())]
    PeTooLarge { host: String, pe: u32, level: Level, cpus: u32, unit: Level },
    #[error("cannot bind {procs} processes to {level} on node {host}: {level} {obj} would hold {held} of them with {cpus} {unit}s; add :overload-allowed to --bind-to or use fewer processes", level = .level.name(), unit = .unit.name())]
    Overload { host: String, procs: u32, level: Level, obj: String, held: u32, cpus: u32, unit: Level },
    #[error("cannot map {procs} processes with ppr:{per}:{level} on node {host}: it has {objs} {level} objects", level = .level.name())]
    PprOverflow { host: String, procs: u32, per: u32, level: Level, objs: u32 },
}

/// "node n1", or "a numa on node n1".
fn where_(level: Level, host: &str) -> String {
    match level {
        Level::Node => format!("node {host}"),
        l => format!("a {} on node {host}", l.name()),
    }
}

/// Candidates in order with busy ones (any PU in `busy`) moved last.
fn free_first(topo: &NodeTopo, level: Level, objs: Vec<u32>, busy: &BTreeSet<u32>) -> Vec<u32> {
    if busy.is_empty() {
        return objs;
    }
    let is_busy = |o: &u32| topo.pus_of(level, *o).iter().any(|&p| busy.contains(&topo.os_index(p)));
    let (free, held): (Vec<u32>, Vec<u32>) = objs.into_iter().partition(|o| !is_busy(o));
    free.into_iter().chain(held).collect()
}

/// Place `nlocal` procs of a job on node `host`. `busy`: OS indices of PUs other jobs' procs
/// are bound to here. The result is in local rank order.
pub fn place_node(
    topo: &NodeTopo,
    plan: &Plan,
    nlocal: u32,
    busy: &BTreeSet<u32>,
    host: &str,
) -> Result<Vec<Placed>, BindError> {
    let has = || topo.describe();
    let unit = plan.unit(topo);
    let pe = plan.pe.max(1);
    // 1. Mapping: each proc's container object, in mapping order.
    let containers: Vec<Option<(Level, u32)>> = match plan.map_obj {
        None => vec![None; nlocal as usize],
        Some(m) => {
            let k = topo.count(m);
            if k == 0 {
                return Err(BindError::NoObject { host: host.into(), level: m, has: has() });
            }
            if plan.per_obj > 0 && nlocal as u64 > plan.per_obj as u64 * k as u64 {
                let (procs, per, objs) = (nlocal, plan.per_obj, k);
                return Err(BindError::PprOverflow { host: host.into(), procs, per, level: m, objs });
            }
            (0..nlocal).map(|j| Some((m, j.checked_div(plan.per_obj).unwrap_or(j % k)))).collect()
        }
    };
    // 2. Binding level.
    let oversubscribed = nlocal as u64 * pe as u64 > topo.count(unit) as u64;
    let level = match plan.bind {
        Bind::None => None,
        Bind::To(b) if topo.count(b) == 0 => {
            if plan.if_supported {
                None
            } else {
                return Err(BindError::NoBindObject { host: host.into(), level: b, has: has() });
            }
        }
        Bind::To(b) => Some(b),
        // PE asks for cpus: bound to them even on a full node (where they may not exist).
        Bind::Default if pe > 1 => Some(unit),
        Bind::Default if oversubscribed => None,
        Bind::Default => match plan.map_obj {
            Some(m) => Some(m),
            None if plan.job_procs <= 2 => Some(unit),
            None => [Level::Package, Level::Numa].into_iter().find(|&l| topo.count(l) > 0),
        },
    };
    // 3. Binding, in mapping order: cursors per container.
    let mut cursor: BTreeMap<Option<(Level, u32)>, usize> = BTreeMap::new();
    // The candidates inside each container, computed once: (container, level) -> objects.
    let mut cands: BTreeMap<(Level, u32, Level), Vec<u32>> = BTreeMap::new();
    let mut candidates = |outer: Level, idx: u32, inner: Level| -> Vec<u32> {
        cands
            .entry((outer, idx, inner))
            .or_insert_with(|| free_first(topo, inner, topo.objects_within(outer, idx, inner), busy))
            .clone()
    };
    let mut bound: Vec<Option<(Level, Vec<u32>)>> = Vec::with_capacity(nlocal as usize);
    for c in &containers {
        let Some(b) = level else {
            bound.push(None);
            continue;
        };
        // The object that holds the choice: the container when it is coarser than what is
        // chosen inside it, else the whole node.
        let (outer, idx) = match c {
            Some((m, i)) if *m > if pe > 1 { unit } else { b } => (*m, *i),
            _ => (Level::Node, 0),
        };
        let at = cursor.entry(if outer == Level::Node { None } else { Some((outer, idx)) }).or_insert(0);
        let pus = if pe > 1 {
            let units = candidates(outer, idx, unit);
            if (units.len() as u32) < pe {
                return Err(BindError::PeTooLarge {
                    host: host.into(),
                    pe,
                    level: outer,
                    cpus: units.len() as u32,
                    unit,
                });
            }
            let mut pus: Vec<u32> =
                (0..pe as usize).flat_map(|k| topo.pus_of(unit, units[(*at + k) % units.len()])).collect();
            *at += pe as usize;
            if b > unit {
                // Bound wider than the cpus: every b-object they touch.
                let objs: BTreeSet<u32> = pus.iter().filter_map(|&p| topo.object_of(p, b)).collect();
                pus = objs.into_iter().flat_map(|o| topo.pus_of(b, o)).collect();
            }
            pus
        } else if matches!(c, Some((m, _)) if *m <= b) || c.is_none() && outer == Level::Node && b == Level::Node {
            // Bound to the object of level b holding the container (or the whole node).
            let first = c.map_or(0, |(m, i)| topo.pus_of(m, i)[0]);
            let o = topo.object_of(first, b).expect("count(b) > 0");
            topo.pus_of(b, o)
        } else {
            let objs = candidates(outer, idx, b);
            let o = objs[*at % objs.len()];
            *at += 1;
            topo.pus_of(b, o)
        };
        let mut pus = pus;
        pus.sort_unstable();
        pus.dedup();
        bound.push(Some((b, pus)));
    }
    // 4. Overload: procs bound to one set of PUs, times their cpus, against the cpus it has.
    // Bound to cpus (a unit, or PE of them): no cpu may be held twice, whichever sets hold it.
    if !plan.overload_allowed && plan.bind != Bind::Default && level.is_some_and(|b| b <= unit || pe > 1) {
        let mut per_unit: BTreeMap<u32, u32> = BTreeMap::new();
        for (_, pus) in bound.iter().flatten() {
            let units: BTreeSet<u32> = pus.iter().filter_map(|&p| topo.object_of(p, unit)).collect();
            for u in units {
                let n = per_unit.entry(u).or_insert(0);
                *n += 1;
                if *n > 1 {
                    let b = level.expect("bound");
                    let o = topo.pus_of(unit, u).first().and_then(|&p| topo.object_of(p, b)).unwrap_or(0);
                    let units_in = |o: u32| {
                        topo.pus_of(b, o).iter().filter_map(|&p| topo.object_of(p, unit)).collect::<BTreeSet<_>>()
                    };
                    let cpus = units_in(o).len() as u32;
                    let (level, obj, held) = (b, o.to_string(), *n);
                    return Err(BindError::Overload { host: host.into(), procs: nlocal, level, obj, held, cpus, unit });
                }
            }
        }
    }
    if !plan.overload_allowed && plan.bind != Bind::Default {
        let mut held: BTreeMap<&[u32], u64> = BTreeMap::new();
        for (_, pus) in bound.iter().flatten() {
            *held.entry(pus.as_slice()).or_insert(0) += pe as u64;
        }
        for (pus, n) in held {
            let cpus = pus.iter().filter_map(|&p| topo.object_of(p, unit)).collect::<BTreeSet<_>>().len() as u32;
            if n > cpus as u64 {
                let b = level.expect("bound");
                let objs: BTreeSet<u32> = pus.iter().filter_map(|&p| topo.object_of(p, b)).collect();
                let obj = super::topo::list_text(&objs.into_iter().collect::<Vec<_>>());
                return Err(BindError::Overload {
                    host: host.into(),
                    procs: nlocal,
                    level: b,
                    obj,
                    held: (n / pe as u64) as u32,
                    cpus,
                    unit,
                });
            }
        }
    }
    // 5. Ranking: local rank i takes the i-th proc in rank order.
    let placed: Vec<Placed> = containers.into_iter().zip(bound).map(|(obj, bound)| Placed { obj, bound }).collect();
    let Some(groups) = rank_groups(topo, plan, &placed) else { return Ok(placed) };
    let mut order = Vec::with_capacity(placed.len());
    for round in 0.. {
        let before = order.len();
        order.extend(groups.iter().filter_map(|g| g.get(round).copied()));
        if order.len() == before {
            break;
        }
    }
    let mut slots: Vec<Option<Placed>> = placed.into_iter().map(Some).collect();
    Ok(order.into_iter().map(|j| slots[j].take().expect("each proc once")).collect())
}

/// How many of a node's `nlocal` procs each round of `--rank-by OBJ` ranks (one per object
/// that has procs left): the node's share of each pass of `:span`, which deals ranks over the
/// objects of all nodes. Without a rank object, one proc per round.
pub fn rank_rounds(topo: &NodeTopo, plan: &Plan, nlocal: u32, host: &str) -> Result<Vec<u32>, BindError> {
    let placed = place_node(topo, plan, nlocal, &BTreeSet::new(), host)?;
    let Some(groups) = rank_groups(topo, plan, &placed) else { return Ok(vec![1; nlocal as usize]) };
    let longest = groups.iter().map(Vec::len).max().unwrap_or(0);
    Ok((0..longest).map(|round| groups.iter().filter(|g| g.len() > round).count() as u32).collect())
}

/// The procs (in mapping order) grouped by the object of the rank level each sits on, objects
/// in order; `None` when the plan ranks by no object (or the node has none).
fn rank_groups(topo: &NodeTopo, plan: &Plan, placed: &[Placed]) -> Option<Vec<Vec<usize>>> {
    let r = plan.rank_obj.filter(|&r| r != Level::Node && topo.count(r) > 0)?;
    let unit = plan.unit(topo);
    // Where a proc sits, as finely as known: its mapped object when that is within an object of
    // `r`, else its bound cpus, else the node's cpus in mapping order.
    let key = |j: usize, p: &Placed| -> u32 {
        let first = match (&p.bound, p.obj) {
            (_, Some((m, i))) if m <= r => topo.pus_of(m, i)[0],
            (Some((_, pus)), _) if !pus.is_empty() => pus[0],
            (_, Some((m, i))) => topo.pus_of(m, i)[0],
            _ => {
                let k = topo.count(unit).max(1);
                topo.pus_of(unit, j as u32 % k).first().copied().unwrap_or(0)
            }
        };
        topo.object_of(first, r).unwrap_or(0)
    };
    let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (j, p) in placed.iter().enumerate() {
        groups.entry(key(j, p)).or_default().push(j);
    }
    Some(groups.into_values().collect())
}
