//! The launch on the wire: sizes (bytes per proc, bytes per daemon vs DVM size), refusal
//! sentences, and malformed network input to the decoders (errors, never panics).

use dvm_proto::job::{proc_map, AppContext, JobMap, JobSpec, MapBy, NodeRange, RankRange, Residual};
use dvm_proto::Message;
use dvmd::jobmap::{encode, launch_sizes, local_procs, map_job, LaunchError, LaunchSizes, NodeSlots, Placement};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn spec(np: u32, map_by: MapBy, ppr: u32) -> JobSpec {
    JobSpec {
        apps: vec![AppContext { argv: vec!["./a.out".into()], np, ..Default::default() }],
        map_by: map_by as i32,
        ppr,
        ..Default::default()
    }
}

fn dvm(n: u32, slots: u32) -> Vec<NodeSlots> {
    (0..n).map(|i| NodeSlots::new(i, format!("node{i:04}"), slots)).collect()
}

fn sizes(spec: &JobSpec, nodes: &[NodeSlots]) -> (JobMap, Vec<(u32, Residual)>, LaunchSizes) {
    let p = map_job(spec, nodes).unwrap();
    let (map, res) = encode(1, spec, &p);
    let s = launch_sizes(&map, &res, nodes.len() as u32);
    (map, res, s)
}

fn show(what: &str, s: &LaunchSizes) {
    println!(
        "{what:<28} nprocs {:>7}  map {:>5} B  residuals {:>6} B (scatter-framed {:>6})  per proc {:.4} B  \
         wire per proc {:.4} B  per daemon {}..{} B",
        s.nprocs,
        s.map_bytes,
        s.residual_bytes,
        s.scatter_bytes,
        s.bytes_per_proc(),
        s.wire_bytes_per_proc(),
        s.per_daemon_min,
        s.per_daemon_max
    );
}

#[test]
fn block_map_of_1000_nodes_x_128_is_under_a_byte_per_proc() {
    let nodes = dvm(1000, 128);
    let (map, res, s) = sizes(&spec(0, MapBy::Slot, 0), &nodes);
    show("slot 1000x128", &s);
    assert_eq!(s.nprocs, 128_000);
    assert_eq!(res.len(), 1000);
    assert!(s.bytes_per_proc() <= 1.0, "{} B/proc", s.bytes_per_proc());
    assert!(s.wire_bytes_per_proc() <= 1.0, "{} B/proc on the wire", s.wire_bytes_per_proc());
    // Every daemon finds its 128 procs from what it received.
    for (d, r) in &res {
        assert_eq!(local_procs(&map, r, *d).unwrap().len(), 128);
    }
    for (what, spec) in [("node 1000x128", spec(0, MapBy::Node, 0)), ("ppr:64 1000 nodes", spec(0, MapBy::Ppr, 64))] {
        let (_, _, s) = sizes(&spec, &nodes);
        show(what, &s);
        assert!(s.bytes_per_proc() <= 1.0);
    }
    // The honest negative: uneven slots need a count per node (still O(nodes)).
    let uneven: Vec<NodeSlots> = (0..1000).map(|i| NodeSlots::new(i, format!("node{i:04}"), 64 + i % 65)).collect();
    let (map, _, s) = sizes(&spec(0, MapBy::Slot, 0), &uneven);
    show("slot 1000 uneven 64..128", &s);
    assert!(matches!(map.map.unwrap().layout, Some(proc_map::Layout::PerNode(_))));
    assert!(s.map_bytes <= 100 + 2 * 1000, "{} B for 1000 per-node counts", s.map_bytes);
}

#[test]
fn bytes_received_per_daemon_flat_in_dvm_size() {
    for (policy, spec) in
        [("slot", spec(0, MapBy::Slot, 0)), ("node", spec(0, MapBy::Node, 0)), ("ppr:16", spec(0, MapBy::Ppr, 16))]
    {
        let mut per_daemon = Vec::new();
        for n in [10, 30, 100, 300, 1000] {
            let (_, _, s) = sizes(&spec, &dvm(n, 128));
            show(&format!("{policy} {n}x128"), &s);
            per_daemon.push((s.per_daemon_min, s.per_daemon_max));
        }
        // Flat: from 10 to 1000 nodes only varint widths grow, one byte each for nprocs, the
        // app's np, the node count, and a residual's first rank and stride (round-robin).
        let spread = |v: Vec<usize>| v.iter().max().unwrap() - v.iter().min().unwrap();
        let (min_spread, max_spread) =
            (spread(per_daemon.iter().map(|p| p.0).collect()), spread(per_daemon.iter().map(|p| p.1).collect()));
        assert!(min_spread <= 5 && max_spread <= 5, "{policy}: per-daemon bytes {per_daemon:?} from 10 to 1000 nodes");
        // 300 and 1000 nodes fall in the same varint widths: identical.
        assert_eq!(per_daemon[3], per_daemon[4], "{policy}: per-daemon bytes at 300 vs 1000 nodes");
    }
}

#[test]
fn oversubscription_refusal_is_one_sentence_with_the_slots() {
    let nodes: Vec<NodeSlots> =
        ["a", "b", "c", "d"].iter().enumerate().map(|(i, h)| NodeSlots::new(i as u32, h.to_string(), 2)).collect();
    let e = map_job(&spec(10, MapBy::Slot, 0), &nodes).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot map 10 processes: only 8 slots on 4 nodes (hosts a,b,c,d); add :oversubscribe to --map-by or use fewer processes"
    );
    let mut uneven = nodes.clone();
    uneven[1].slots = 1;
    let e = map_job(&spec(7, MapBy::Node, 0), &uneven).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot map 7 processes by node: host b (daemon 1) would get 2 but has only 1 slot; add :oversubscribe to --map-by or use fewer processes"
    );
    let e = map_job(&spec(9, MapBy::Ppr, 2), &nodes).unwrap_err();
    assert_eq!(e.to_string(), "cannot map 9 processes with ppr:2:node: 4 nodes hold at most 8");
}

#[test]
fn unknown_host_ppr_0_and_no_slots_are_named() {
    let nodes = dvm(3, 2);
    let mut s = spec(2, MapBy::Slot, 0);
    s.hosts = vec!["node0001".into(), "gpu7".into()];
    let e = map_job(&s, &nodes).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot map the job: unknown host 'gpu7' (the DVM's hosts are node0000,node0001,node0002)"
    );
    let e = map_job(&spec(4, MapBy::Ppr, 0), &nodes).unwrap_err();
    assert!(e.to_string().contains("ppr 0"), "{e}");
    let e = map_job(&spec(0, MapBy::Slot, 0), &dvm(2, 0)).unwrap_err();
    assert_eq!(e.to_string(), "cannot map np 0 (fill the slots): no slots on any node of the DVM (node0000,node0001)");
}

/// A valid 4-node block launch to corrupt.
fn launch() -> (JobMap, Vec<(u32, Residual)>) {
    let p = map_job(&spec(0, MapBy::Slot, 0), &dvm(4, 3)).unwrap();
    encode(5, &spec(0, MapBy::Slot, 0), &p)
}

fn bad_map(edit: impl FnOnce(&mut JobMap)) -> String {
    let (mut map, res) = launch();
    edit(&mut map);
    let e = local_procs(&map, &res[0].1, 0).unwrap_err();
    assert!(matches!(e, LaunchError::BadMap { job: 5, .. }), "{e}");
    e.to_string()
}

#[test]
fn malformed_job_maps_are_errors() {
    bad_map(|m| m.map = None);
    bad_map(|m| m.map.as_mut().unwrap().layout = None);
    bad_map(|m| m.map.as_mut().unwrap().nodes.clear());
    bad_map(|m| m.nprocs = 0);
    bad_map(|m| m.nprocs = 13);
    bad_map(|m| m.map.as_mut().unwrap().layout = Some(proc_map::Layout::Block(proc_map::Block { each: 0 })));
    bad_map(|m| m.map.as_mut().unwrap().layout = Some(proc_map::Layout::Block(proc_map::Block { each: 2 })));
    bad_map(|m| {
        m.map.as_mut().unwrap().layout = Some(proc_map::Layout::PerNode(proc_map::PerNode { count: vec![3, 3, 3, 2] }))
    });
    bad_map(|m| {
        m.map.as_mut().unwrap().layout =
            Some(proc_map::Layout::PerNode(proc_map::PerNode { count: vec![u32::MAX, u32::MAX, 3, 3] }))
    });
    bad_map(|m| {
        m.map.as_mut().unwrap().nodes = vec![NodeRange { first: 0, count: 3 }, NodeRange { first: 2, count: 1 }]
    });
    bad_map(|m| m.map.as_mut().unwrap().nodes = vec![NodeRange { first: u32::MAX, count: 4 }]);
    bad_map(|m| m.map.as_mut().unwrap().nodes = vec![NodeRange { first: 0, count: u32::MAX }]);
    bad_map(|m| m.app_first_rank = vec![1]);
    bad_map(|m| m.app_first_rank.clear());
    bad_map(|m| m.apps[0].np = 11);
    let e = bad_map(|m| m.map.as_mut().unwrap().nodes[0].count = 0);
    assert_eq!(e, "job 5: invalid job map: node range 0 (from daemon 0) is empty");
}

#[test]
fn malformed_residuals_name_the_daemon_and_rank() {
    let (map, res) = launch();
    let r = |ranks: Vec<RankRange>| Residual { jobid: 5, ranks, cpus: vec![] };
    let rr = |first, count, stride| RankRange { first, count, stride };
    // Daemon 1 holds ranks 3..6.
    assert_eq!(local_procs(&map, &res[1].1, 1).unwrap().len(), 3);
    let err = |res: Residual| local_procs(&map, &res, 1).unwrap_err().to_string();
    assert_eq!(
        err(Residual { jobid: 4, ranks: vec![rr(3, 3, 0)], cpus: vec![] }),
        "daemon 1: residual is for job 4 but the job map is for job 5"
    );
    assert_eq!(
        err(r(vec![rr(3, 4, 0)])),
        "daemon 1: residual of job 5 lists rank 6, which the job map places on daemon 2"
    );
    assert_eq!(
        err(r(vec![rr(3, 1, 0), rr(5, 1, 0)])),
        "daemon 1: residual of job 5 omits rank 4, which the job map places on this daemon"
    );
    assert_eq!(
        err(r(vec![rr(3, 3, 0), rr(4, 1, 0)])),
        "daemon 1: residual of job 5 is malformed: rank 4 is listed twice"
    );
    assert_eq!(
        err(r(vec![rr(12, 1, 0)])),
        "daemon 1: residual of job 5 lists rank 12, which the job map does not have (it has 12 procs)"
    );
    assert!(err(r(vec![rr(3, 1_000_000, 1)])).contains("lists rank 6"));
    assert!(err(r(vec![rr(3, u32::MAX, 1)])).contains("overflows"));
    assert!(err(r(vec![rr(u32::MAX - 1, 3, 7)])).contains("overflows"));
    assert!(err(r(vec![rr(3, 0, 0)])).contains("empty"));
    assert!(err(r(vec![])).contains("omits rank 3"));
    // Split and reordered ranges listing the same ranks are fine.
    assert_eq!(
        local_procs(&map, &r(vec![rr(5, 1, 0), rr(3, 2, 1)]), 1).unwrap(),
        local_procs(&map, &res[1].1, 1).unwrap()
    );
    // A daemon hosting nothing accepts only an empty residual.
    assert!(local_procs(&map, &r(vec![]), 9).unwrap().is_empty());
    assert!(local_procs(&map, &r(vec![rr(0, 1, 0)]), 9).unwrap_err().to_string().contains("daemon 9"));
}

/// What a daemon may do with a launch from the network: refuse it with a `LaunchError` that
/// names the job (a map that does not decode to a placement) or this daemon (anything else),
/// or accept it as exactly the procs the placement puts on this daemon, in order.
fn refused_by_name_or_exact(map: &JobMap, res: &Residual, me: u32) -> Result<(), TestCaseError> {
    let placement = Placement::from_job_map(map);
    match local_procs(map, res, me) {
        Ok(procs) => {
            let Ok(p) = placement else {
                return Err(TestCaseError::fail(format!("accepted a map its placement refuses: {map:?}")));
            };
            prop_assert_eq!(res.jobid, map.jobid, "accepted a residual of another job");
            prop_assert!(
                procs.iter().map(|l| l.rank).eq(p.procs_on(me).iter()),
                "daemon {}: accepted ranks differ from the placement's: residual {:?}",
                me,
                res
            );
            for (i, l) in procs.iter().enumerate() {
                prop_assert_eq!((l.local_rank, Some(l.app)), (i as u32, p.app_of(l.rank)));
            }
            // ... and the residual lists exactly those ranks, each once.
            let listed: u64 = res.ranks.iter().map(|r| r.count as u64).sum();
            prop_assert_eq!(listed, procs.len() as u64, "daemon {}: accepted {:?} for {} procs", me, res, procs.len());
            let mut ranks: Vec<u64> = res
                .ranks
                .iter()
                .flat_map(|r| (0..r.count as u64).map(move |k| r.first as u64 + k * r.stride.max(1) as u64))
                .collect();
            ranks.sort_unstable();
            prop_assert!(
                ranks.iter().copied().eq(procs.iter().map(|l| l.rank as u64)),
                "daemon {}: accepted {:?}",
                me,
                res
            );
        }
        Err(LaunchError::BadMap { job, reason }) => {
            prop_assert!(placement.is_err(), "BadMap ({}) for a map that decodes", reason);
            prop_assert_eq!(job, map.jobid);
        }
        Err(e) => {
            prop_assert!(placement.is_ok(), "{} for a map that does not decode", e);
            let text = e.to_string();
            prop_assert!(text.starts_with(&format!("daemon {me}: ")), "error does not name daemon {}: {}", me, text);
            prop_assert!(text.contains(&format!("job {}", map.jobid)), "error does not name the job: {}", text);
        }
    }
    Ok(())
}

/// `bytes` with each (position, value) edit applied (positions wrap; empty stays empty).
fn edited(mut bytes: Vec<u8>, edits: &[(usize, u8)]) -> Vec<u8> {
    let n = bytes.len();
    for &(at, v) in edits.iter().filter(|_| n > 0) {
        bytes[at % n] = v;
    }
    bytes
}

proptest! {
    // Fuzz targets too: scripts/fuzz.sh runs millions of inputs through `dvm_tests::fuzz`.
    #![proptest_config(dvm_tests::fuzz::config(256))]

    /// Arbitrary bytes as a JobMap or a Residual, real launch messages with bytes
    /// overwritten, and residuals of small rank ranges: every one that decodes is refused by name or accepted exactly (see
    /// `refused_by_name_or_exact`). Never a panic.
    #[test]
    fn garbage_never_panics(
        bytes in prop::collection::vec(any::<u8>(), 0..64),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        ranges in prop::collection::vec((0u32..14, 0u32..5, 0u32..3), 0..4),
        me in 0u32..8,
    ) {
        let (map, res) = launch();
        let own = res.iter().find(|(d, _)| *d == me).map(|(_, r)| r.clone()).unwrap_or(Residual { jobid: map.jobid, ..Default::default() });
        // The genuine launch is accepted: the oracle holds for it.
        prop_assert!(local_procs(&map, &own, me).is_ok());
        refused_by_name_or_exact(&map, &own, me)?;
        if let Ok(garbage) = JobMap::decode(&bytes[..]) {
            refused_by_name_or_exact(&garbage, &Residual { jobid: garbage.jobid, ..Default::default() }, me)?;
            refused_by_name_or_exact(&garbage, &own, me)?;
        }
        if let Ok(garbage) = Residual::decode(&bytes[..]) {
            refused_by_name_or_exact(&map, &garbage, me)?;
        }
        if let Ok(m) = JobMap::decode(&edited(map.encode_to_vec(), &edits)[..]) {
            refused_by_name_or_exact(&m, &own, me)?;
        }
        if let Ok(r) = Residual::decode(&edited(own.encode_to_vec(), &edits)[..]) {
            refused_by_name_or_exact(&map, &r, me)?;
        }
        // Well-formed residuals listing small, often wrong, rank ranges.
        let ranks = ranges.iter().map(|&(first, count, stride)| RankRange { first, count, stride }).collect();
        refused_by_name_or_exact(&map, &Residual { jobid: map.jobid, ranks, cpus: vec![] }, me)?;
    }

    /// Field-level corruption of a valid launch (small and huge values): errors or a placement
    /// that is self-consistent, never a panic.
    #[test]
    fn corrupted_fields_never_panic(
        nprocs in prop_oneof![0u32..16, Just(u32::MAX)],
        first in prop_oneof![0u32..6, Just(u32::MAX)],
        count in prop_oneof![0u32..6, Just(u32::MAX)],
        each in prop_oneof![0u32..6, Just(u32::MAX)],
        layout in 0u8..4,
        counts in prop::collection::vec(prop_oneof![0u32..6, Just(u32::MAX)], 0..5),
        afr in prop::collection::vec(prop_oneof![0u32..8, Just(u32::MAX)], 0..3),
        me in 0u32..8,
    ) {
        let (mut map, res) = launch();
        map.nprocs = nprocs;
        map.app_first_rank = afr;
        let pm = map.map.as_mut().unwrap();
        pm.nodes = vec![NodeRange { first, count }];
        pm.layout = Some(match layout {
            0 => proc_map::Layout::Block(proc_map::Block { each }),
            1 => proc_map::Layout::PerNode(proc_map::PerNode { count: counts }),
            2 => proc_map::Layout::RoundRobin(proc_map::RoundRobin {}),
            // An explicit layout: the same values read as a node per rank.
            _ => proc_map::Layout::Explicit(proc_map::Explicit { node: counts }),
        });
        if let Ok(p) = Placement::from_job_map(&map) {
            // Self-consistency: each node's ranks map back to it, and they partition the job.
            let mut total = 0u64;
            for d in p.daemons().take(16) {
                let on = p.procs_on(d);
                total += on.len() as u64;
                for (i, r) in on.iter().take(16).enumerate() {
                    prop_assert_eq!(p.node_of(r), Some(d));
                    prop_assert_eq!(p.local_rank(r), Some(i as u32));
                }
            }
            if p.num_nodes() <= 16 {
                prop_assert_eq!(total, p.nprocs() as u64);
            }
        }
        for (_, r) in res.iter().take(1) {
            let _ = local_procs(&map, r, me);
        }
    }
}
