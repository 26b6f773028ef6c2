//! Job mapping against a slow, obviously-correct oracle: per-proc placement for every policy,
//! the wire round trip, decoding on every daemon, and the scattered residuals reassembled.

use std::collections::BTreeMap;

use dvm_proto::job::{AppContext, JobMap, JobSpec, MapBy, Residual};
use dvm_proto::Message;
use dvmd::jobmap::{encode, local_procs, map_job, Layout, MapError, NodeSlots, Placement};
use proptest::prelude::*;

/// What the oracle says about one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Expect {
    daemon: u32,
    local: u32,
    app: u32,
}

/// Error kinds the oracle can predict.
fn kind(e: &MapError) -> &'static str {
    match e {
        MapError::UnknownHost { .. } => "unknown host",
        MapError::ZeroPpr => "ppr 0",
        MapError::NoSlots { .. } => "no slots",
        MapError::NotEnoughSlots { .. } | MapError::NodeOverfull { .. } => "oversubscribed",
        MapError::PprExceeded { .. } => "ppr exceeded",
        _ => "other",
    }
}

/// The naive mapping: one proc at a time, per the written semantics.
fn oracle(spec: &JobSpec, nodes: &[NodeSlots]) -> Result<Vec<Expect>, &'static str> {
    for h in &spec.hosts {
        if !nodes.iter().any(|n| &n.host == h) {
            return Err("unknown host");
        }
    }
    let policy = MapBy::try_from(spec.map_by).unwrap();
    if policy == MapBy::Ppr && spec.ppr == 0 {
        return Err("ppr 0");
    }
    let mut usable = Vec::new();
    for n in nodes {
        if n.slots > 0 && (spec.hosts.is_empty() || spec.hosts.contains(&n.host)) {
            usable.push(n.clone());
        }
    }
    if usable.is_empty() {
        return Err("no slots");
    }
    let mut total = 0;
    for n in &usable {
        total += n.slots as usize;
    }
    let fill = if policy == MapBy::Ppr { spec.ppr as usize * usable.len() } else { total };
    let mut app_of = Vec::new();
    for (i, a) in spec.apps.iter().enumerate() {
        let np = if a.np == 0 { fill } else { a.np as usize };
        for _ in 0..np {
            app_of.push(i as u32);
        }
    }
    let np = app_of.len();
    let n = usable.len();
    let mut owner: Vec<usize> = Vec::new();
    match policy {
        // Mapping by an object fills the nodes' slots as by slot; objects are per node.
        MapBy::Slot | MapBy::Object => {
            if np <= total {
                for (node, u) in usable.iter().enumerate() {
                    for _ in 0..u.slots {
                        if owner.len() < np {
                            owner.push(node);
                        }
                    }
                }
            } else {
                if !spec.oversubscribe {
                    return Err("oversubscribed");
                }
                let mut counts: Vec<usize> = usable.iter().map(|u| u.slots as usize).collect();
                for e in 0..np - total {
                    counts[e % n] += 1;
                }
                for (node, &c) in counts.iter().enumerate() {
                    for _ in 0..c {
                        owner.push(node);
                    }
                }
            }
        }
        MapBy::Node => {
            let k = n.min(np);
            for r in 0..np {
                owner.push(r % k);
            }
        }
        MapBy::Ppr => {
            if np > spec.ppr as usize * n {
                return Err("ppr exceeded");
            }
            for node in 0..n {
                for _ in 0..spec.ppr {
                    if owner.len() < np {
                        owner.push(node);
                    }
                }
            }
        }
    }
    let mut on_node = vec![0u32; n];
    let mut out = Vec::new();
    for r in 0..np {
        let node = owner[r];
        if on_node[node] == usable[node].slots && !spec.oversubscribe {
            return Err("oversubscribed");
        }
        out.push(Expect { daemon: usable[node].daemon, local: on_node[node], app: app_of[r] });
        on_node[node] += 1;
    }
    Ok(out)
}

fn spec(apps: &[u32], map_by: MapBy, ppr: u32, oversubscribe: bool, hosts: &[&str]) -> JobSpec {
    JobSpec {
        apps: apps.iter().map(|&np| AppContext { argv: vec!["./a.out".into()], np, ..Default::default() }).collect(),
        map_by: map_by as i32,
        ppr,
        oversubscribe,
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        ..Default::default()
    }
}

fn nodes(slots: &[u32]) -> Vec<NodeSlots> {
    slots.iter().enumerate().map(|(i, &s)| NodeSlots::new(i as u32, format!("n{i}"), s)).collect()
}

/// Mapping, encoding, decoding on every daemon and the residuals, all against the oracle.
/// Returns the placement (None when mapping is refused, with the same error as the oracle).
fn check(spec: &JobSpec, nodes: &[NodeSlots]) -> Option<Placement> {
    let want = oracle(spec, nodes);
    let got = map_job(spec, nodes);
    let (want, placement) = match (want, got) {
        (Err(w), Err(g)) => {
            assert_eq!(w, kind(&g), "error kind for {spec:?} on {nodes:?}: {g}");
            return None;
        }
        (Ok(w), Ok(p)) => (w, p),
        (w, g) => panic!("oracle {w:?} but mapper {g:?} for {spec:?} on {nodes:?}"),
    };

    // The placement, queried per proc and iterated.
    assert_eq!(placement.nprocs() as usize, want.len());
    let procs: Vec<_> = placement.procs().collect();
    assert_eq!(procs.len(), want.len());
    for (r, (p, w)) in procs.iter().zip(&want).enumerate() {
        let r = r as u32;
        assert_eq!((p.rank, p.daemon, p.local_rank, p.node_rank, p.app), (r, w.daemon, w.local, w.local, w.app));
        assert_eq!(placement.node_of(r), Some(w.daemon));
        assert_eq!(placement.local_rank(r), Some(w.local));
        assert_eq!(placement.app_of(r), Some(w.app));
    }
    assert_eq!(placement.node_of(want.len() as u32), None);

    // Regular policies encode in a constant-size layout.
    match MapBy::try_from(spec.map_by).unwrap() {
        MapBy::Node => assert_eq!(placement.layout(), &Layout::RoundRobin),
        MapBy::Ppr => assert!(matches!(placement.layout(), Layout::Block { .. })),
        MapBy::Slot | MapBy::Object => {}
    }

    // Over the wire: bytes in, same placement out.
    let (map, residuals) = encode(7, spec, &placement);
    let map = JobMap::decode(&map.encode_to_vec()[..]).unwrap();
    assert_eq!(Placement::from_job_map(&map).unwrap(), placement);
    let residuals: BTreeMap<u32, Residual> =
        residuals.into_iter().map(|(d, r)| (d, Residual::decode(&r.encode_to_vec()[..]).unwrap())).collect();

    // Scattered residuals, reassembled: every rank exactly once, on the oracle's daemon.
    let mut union: Vec<(u32, u32)> = Vec::new();
    for (&d, res) in &residuals {
        for rr in &res.ranks {
            for i in 0..rr.count {
                union.push((rr.first + i * rr.stride.max(1), d));
            }
        }
    }
    union.sort();
    let oracle_union: Vec<(u32, u32)> = want.iter().enumerate().map(|(r, w)| (r as u32, w.daemon)).collect();
    assert_eq!(union, oracle_union);

    // Each daemon of the DVM (and one outside it) decodes its own procs.
    let outsider = nodes.iter().map(|n| n.daemon).max().unwrap_or(0) + 1;
    for d in nodes.iter().map(|n| n.daemon).chain([outsider]) {
        let res = residuals.get(&d).cloned().unwrap_or(Residual { jobid: 7, ranks: vec![], cpus: vec![] });
        let mine = local_procs(&map, &res, d).unwrap();
        let expect: Vec<(u32, u32, u32)> =
            want.iter().enumerate().filter(|(_, w)| w.daemon == d).map(|(r, w)| (r as u32, w.app, w.local)).collect();
        let got: Vec<(u32, u32, u32)> = mine.iter().map(|p| (p.rank, p.app, p.local_rank)).collect();
        assert_eq!(got, expect, "daemon {d}");
        assert!(mine.iter().all(|p| p.node_rank == p.local_rank));
        assert_eq!(placement.procs_on(d).len() as usize, expect.len());
    }
    Some(placement)
}

#[test]
fn slot_fills_nodes_in_order() {
    let p = check(&spec(&[6], MapBy::Slot, 0, false, &[]), &nodes(&[4, 4, 4])).unwrap();
    assert_eq!(p.num_nodes(), 2);
    check(&spec(&[0], MapBy::Slot, 0, false, &[]), &nodes(&[4, 4, 4])).unwrap();
}

#[test]
fn slot_uneven_slots_and_zero_slot_nodes() {
    check(&spec(&[0], MapBy::Slot, 0, false, &[]), &nodes(&[2, 0, 5, 1, 3])).unwrap();
    check(&spec(&[7], MapBy::Slot, 0, false, &[]), &nodes(&[2, 0, 5, 1, 3])).unwrap();
}

#[test]
fn slot_oversubscribed_spreads_extras_keeping_ranks_contiguous() {
    // Worked by hand: slots 2,1,3 = 6; 3 extra procs dealt one each -> counts 3,2,4.
    let p = check(&spec(&[9], MapBy::Slot, 0, true, &[]), &nodes(&[2, 1, 3])).unwrap();
    let on: Vec<Vec<u32>> = (0..3).map(|d| p.procs_on(d).iter().collect()).collect();
    assert_eq!(on, vec![vec![0, 1, 2], vec![3, 4], vec![5, 6, 7, 8]]);
    check(&spec(&[50], MapBy::Slot, 0, true, &[]), &nodes(&[2, 0, 5, 1])).unwrap();
}

#[test]
fn slot_refused_without_oversubscribe() {
    assert!(check(&spec(&[10], MapBy::Slot, 0, false, &[]), &nodes(&[2, 2, 2, 2])).is_none());
}

#[test]
fn node_round_robin() {
    // Worked by hand: 5 procs over 3 nodes -> 0,3 | 1,4 | 2.
    let p = check(&spec(&[5], MapBy::Node, 0, false, &[]), &nodes(&[2, 2, 2])).unwrap();
    let on: Vec<Vec<u32>> = (0..3).map(|d| p.procs_on(d).iter().collect()).collect();
    assert_eq!(on, vec![vec![0, 3], vec![1, 4], vec![2]]);
    check(&spec(&[2], MapBy::Node, 0, false, &[]), &nodes(&[2, 2, 2])).unwrap();
    check(&spec(&[0], MapBy::Node, 0, false, &[]), &nodes(&[3, 3, 3])).unwrap();
    check(&spec(&[20], MapBy::Node, 0, true, &[]), &nodes(&[1, 4, 2])).unwrap();
    // Enough slots in total, but the round-robin overfills the 1-slot node.
    assert!(check(&spec(&[4], MapBy::Node, 0, false, &[]), &nodes(&[1, 4])).is_none());
}

#[test]
fn ppr_per_node() {
    check(&spec(&[0], MapBy::Ppr, 2, false, &[]), &nodes(&[4, 4, 4])).unwrap();
    check(&spec(&[5], MapBy::Ppr, 2, false, &[]), &nodes(&[4, 4, 4])).unwrap();
    check(&spec(&[0], MapBy::Ppr, 3, true, &[]), &nodes(&[1, 1])).unwrap();
    assert!(check(&spec(&[0], MapBy::Ppr, 3, false, &[]), &nodes(&[4, 1])).is_none());
    assert!(check(&spec(&[7], MapBy::Ppr, 2, true, &[]), &nodes(&[4, 4, 4])).is_none());
}

#[test]
fn mpmd_apps_take_consecutive_ranks() {
    for map_by in [MapBy::Slot, MapBy::Node, MapBy::Ppr] {
        let p = check(&spec(&[3, 1, 4], map_by, 4, false, &[]), &nodes(&[4, 4, 4])).unwrap();
        assert_eq!(p.app_ranks(1), Some(3..4));
    }
    check(&spec(&[2, 0], MapBy::Slot, 0, true, &[]), &nodes(&[2, 3])).unwrap();
}

#[test]
fn hosts_subset_keeps_daemon_order() {
    let n = nodes(&[2, 2, 2, 2, 2]);
    let p = check(&spec(&[0], MapBy::Slot, 0, false, &["n3", "n1", "n4"]), &n).unwrap();
    assert_eq!(p.daemons().collect::<Vec<_>>(), vec![1, 3, 4]);
    assert_eq!(p.node_ranges(), &[(1, 1), (3, 2)]);
    check(&spec(&[3], MapBy::Node, 0, false, &["n0", "n2"]), &n).unwrap();
    assert!(check(&spec(&[3], MapBy::Node, 0, false, &["n9"]), &n).is_none());
}

fn arb_case() -> impl Strategy<Value = (JobSpec, Vec<NodeSlots>)> {
    let nodes = prop::collection::vec((0u32..3, 0u32..6, 0usize..8), 1..12).prop_map(|v| {
        let mut d = 0;
        v.into_iter()
            .map(|(gap, slots, host)| {
                d += gap;
                let n = NodeSlots::new(d, format!("h{host}"), slots);
                d += 1;
                n
            })
            .collect::<Vec<_>>()
    });
    let hosts = prop_oneof![
        3 => Just(vec![]),
        2 => prop::collection::vec(0usize..8, 1..4),
        1 => prop::collection::vec(0usize..9, 1..3), // h8 is never a DVM host
    ];
    let apps = prop::collection::vec(prop_oneof![1 => Just(0u32), 4 => 1u32..24], 1..4);
    (nodes, hosts, apps, 0i32..3, 0u32..5, any::<bool>()).prop_map(|(nodes, hosts, apps, map_by, ppr, over)| {
        let hosts: Vec<String> = hosts.iter().map(|h| format!("h{h}")).collect();
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        (spec(&apps, MapBy::try_from(map_by).unwrap(), ppr, over, &hosts), nodes)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn mapping_matches_oracle((spec, nodes) in arb_case()) {
        check(&spec, &nodes);
    }
}
