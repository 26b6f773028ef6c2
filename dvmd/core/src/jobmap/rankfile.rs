//! A rankfile's placement: each rank on the host and cpus its line names. Blocks per host (in
//! any host order) or ranks dealt round-robin keep the launch message a compact layout; any
//! other order carries a node per rank. The cpus travel in each daemon's residual.
//!
//! Never: I/O. Every refusal names the file and the line.

use std::collections::BTreeMap;

use dvm_proto::job::{JobSpec, RankfileEntry};

use super::placement::{layout_of, NodeSlots, Placement};
use super::topo::{parse_list, Level, NodeTopo};
use super::MapError;

fn refuse(spec: &JobSpec, line: u32, why: String) -> MapError {
    MapError::Rankfile { file: spec.rankfile_name.clone(), line, why }
}

/// The rank of each entry and the node it names, checked: every rank of the job once, every
/// host a node of the DVM.
fn entries<'a>(
    spec: &'a JobSpec,
    nodes: &'a [NodeSlots],
    np: u32,
) -> Result<Vec<(&'a RankfileEntry, &'a NodeSlots)>, MapError> {
    // One line per rank: checked before anything is sized by `np` (a user's -n).
    if np as usize != spec.rankfile.len() {
        let why = format!("it places {} ranks, but the job has {np} processes", spec.rankfile.len());
        return Err(refuse(spec, 0, why));
    }
    let by_host: std::collections::HashMap<&str, &NodeSlots> = nodes.iter().map(|n| (n.host.as_str(), n)).collect();
    let mut by_rank: Vec<Option<(&RankfileEntry, &NodeSlots)>> = vec![None; np as usize];
    for e in &spec.rankfile {
        let Some(slot) = by_rank.get_mut(e.rank as usize) else {
            return Err(refuse(spec, e.line, format!("rank {} is beyond the job's {np} processes", e.rank)));
        };
        let node = by_host.get(e.host.as_str()).copied().ok_or_else(|| {
            let known: Vec<&str> = nodes.iter().take(8).map(|n| n.host.as_str()).collect();
            refuse(spec, e.line, format!("host '{}' is not a node of the DVM (its nodes: {})", e.host, known.join(",")))
        })?;
        *slot = Some((e, node));
    }
    by_rank
        .into_iter()
        .enumerate()
        .map(|(r, x)| x.ok_or_else(|| refuse(spec, 0, format!("it does not place rank {r} of the job's {np}"))))
        .collect()
}

/// The placement of a rankfile job of `np` ranks (`np` 0: as many as the file names).
pub fn map_rankfile(
    spec: &JobSpec,
    nodes: &[NodeSlots],
    app_first_rank: Vec<u32>,
    np: u32,
) -> Result<Placement, MapError> {
    let placed = entries(spec, nodes, np)?;
    // Nodes in order of their first rank; each node's count.
    let mut order: Vec<u32> = Vec::new();
    let mut count: BTreeMap<u32, u32> = BTreeMap::new();
    for (_, n) in &placed {
        if !count.contains_key(&n.daemon) {
            order.push(n.daemon);
        }
        *count.entry(n.daemon).or_insert(0) += 1;
    }
    let node_idx: BTreeMap<u32, u32> = order.iter().enumerate().map(|(i, &d)| (d, i as u32)).collect();
    let idx: Vec<u32> = placed.iter().map(|(_, n)| node_idx[&n.daemon]).collect();
    let counts: Vec<u32> = order.iter().map(|d| count[d]).collect();
    let layout = layout_of(idx, &counts);
    let ranges = order.iter().map(|&d| (d, 1)).collect();
    Placement::new(np, app_first_rank, ranges, layout).map_err(|why| refuse(spec, 0, why))
}

/// Each rank's cpus (PU OS indices) from its line's `slot=`, on its node's hardware.
pub fn rankfile_cpus(spec: &JobSpec, nodes: &[NodeSlots], np: u32) -> Result<Vec<Vec<u32>>, MapError> {
    let mut out = Vec::with_capacity(np as usize);
    for (e, n) in entries(spec, nodes, np)? {
        let Some(topo) = n.topo.as_ref() else {
            let why = format!("host {} did not report its hardware, so slot={} cannot be placed", n.host, e.slot);
            return Err(refuse(spec, e.line, why));
        };
        let cpus = slot_cpus(topo, &e.slot, spec.use_hwthread_cpus)
            .map_err(|why| refuse(spec, e.line, format!("slot={} on host {}: {why}", e.slot, n.host)))?;
        out.push(cpus);
    }
    Ok(out)
}

/// `P:C`, `C` or `*` on a node: the OS indices of the PUs named.
fn slot_cpus(topo: &NodeTopo, slot: &str, hwthreads: bool) -> Result<Vec<u32>, String> {
    let unit = if hwthreads { Level::Hwthread } else { Level::Core };
    if slot == "*" {
        return Ok(topo.os_set(&(0..topo.num_pus()).collect::<Vec<_>>()));
    }
    let (package, list) = match slot.split_once(':') {
        Some((p, c)) => (Some(p.parse::<u32>().map_err(|_| format!("'{p}' is not a package number"))?), c),
        None => (None, slot),
    };
    let wanted = parse_list(list).ok_or_else(|| format!("'{list}' is not a list of {}s like 0-3,6", unit.name()))?;
    // The units to index: the package's own (numbered from 0 inside it), or the node's.
    let units: Vec<u32> = match package {
        Some(p) if p >= topo.count(Level::Package) => {
            return Err(format!("package {p} does not exist (the node has {})", topo.count(Level::Package)))
        }
        Some(p) => topo.objects_within(Level::Package, p, unit),
        None => (0..topo.count(unit)).collect(),
    };
    let mut pus = Vec::new();
    for c in wanted {
        let u = units.get(c as usize).ok_or_else(|| {
            let within = package.map_or("the node".to_string(), |p| format!("package {p}"));
            format!("{} {c} does not exist ({within} has {})", unit.name(), units.len())
        })?;
        pus.extend(topo.pus_of(unit, *u));
    }
    Ok(topo.os_set(&pus))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use dvm_proto::job::AppContext;

    use super::*;
    use crate::jobmap::{map_job, Layout};

    fn spec(lines: &[(u32, &str, &str)]) -> JobSpec {
        let rankfile = lines
            .iter()
            .enumerate()
            .map(|(i, &(rank, host, slot))| RankfileEntry {
                rank,
                host: host.into(),
                slot: slot.into(),
                line: i as u32 + 1,
                cpus: String::new(),
            })
            .collect();
        JobSpec {
            apps: vec![AppContext { argv: vec!["a".into()], ..Default::default() }],
            rankfile,
            rankfile_name: "rf".into(),
            ..Default::default()
        }
    }

    fn nodes() -> Vec<NodeSlots> {
        let t = Arc::new(NodeTopo::synthetic("package:2 core:2 pu:2").unwrap());
        (0..3).map(|d| NodeSlots { topo: Some(t.clone()), ..NodeSlots::new(d, format!("n{d}"), 4) }).collect()
    }

    #[test]
    fn blocks_in_any_node_order_and_dealt_ranks_are_placed() {
        let s = spec(&[(0, "n2", "0:0"), (1, "n2", "1:1"), (2, "n0", "*"), (3, "n1", "3")]);
        let p = map_job(&s, &nodes()).unwrap();
        assert_eq!((p.node_of(0), p.node_of(1), p.node_of(2), p.node_of(3)), (Some(2), Some(2), Some(0), Some(1)));
        let cpus = rankfile_cpus(&s, &nodes(), 4).unwrap();
        assert_eq!(cpus, vec![vec![0, 1], vec![6, 7], (0..8).collect(), vec![6, 7]]);
        let dealt = spec(&[(0, "n0", "0"), (1, "n1", "0"), (2, "n0", "1"), (3, "n1", "1")]);
        assert_eq!(map_job(&dealt, &nodes()).unwrap().layout(), &Layout::RoundRobin);
        // Any other order: a node per rank, each node's ranks in rank order.
        let mixed = spec(&[(0, "n0", "0"), (1, "n1", "0"), (2, "n1", "1"), (3, "n0", "1"), (4, "n2", "0")]);
        let p = map_job(&mixed, &nodes()).unwrap();
        assert!(matches!(p.layout(), Layout::Explicit { .. }));
        assert_eq!(p.procs_on(0).iter().collect::<Vec<_>>(), [0, 3]);
        assert_eq!((p.local_rank(3), p.local_rank(2), p.node_of(4)), (Some(1), Some(1), Some(2)));
        let (map, residuals) = crate::jobmap::encode(3, &mixed, &p);
        assert_eq!(residuals[0].1.ranks.len(), 1, "ranks 0 and 3: one run of stride 3");
        for (d, r) in &residuals {
            let mine: Vec<u32> = crate::jobmap::local_procs(&map, r, *d).unwrap().iter().map(|l| l.rank).collect();
            assert_eq!(mine, p.procs_on(*d).iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn bad_lines_are_named() {
        for (lines, want) in [
            (vec![(0, "n0", "0"), (1, "zz", "0")], "rf:2: host 'zz' is not a node of the DVM (its nodes: n0,n1,n2)"),
            (vec![(0, "n0", "0:5")], "rf:1: slot=0:5 on host n0: core 5 does not exist (package 0 has 2)"),
            (vec![(0, "n0", "4:0")], "rf:1: slot=4:0 on host n0: package 4 does not exist (the node has 2)"),
            (vec![(0, "n0", "x")], "rf:1: slot=x on host n0: 'x' is not a list of cores like 0-3,6"),
            (vec![(1, "n0", "0")], "rf:1: rank 1 is beyond the job's 1 processes"),
        ] {
            let e = map_job(&spec(&lines), &nodes()).unwrap_err().to_string();
            assert!(e.starts_with(&format!("cannot map the job: rankfile {want}")), "{lines:?}: {e}");
        }
        // -n is never what sizes the check: a file of 1 line against -n 4000000000.
        let mut s = spec(&[(0, "n0", "0")]);
        s.apps[0].np = 4_000_000_000;
        let e = map_job(&s, &nodes()).unwrap_err().to_string();
        assert!(e.contains("rankfile rf: it places 1 ranks, but the job has 4000000000 processes"), "{e}");
    }
}
