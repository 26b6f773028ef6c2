//! Mapping, ranking and binding on synthetic hardware, against the rules Open MPI documents.

use std::collections::BTreeSet;
use std::sync::Arc;

use dvm_proto::job::{AppContext, BindTo, HwObj, JobSpec, MapBy, RankBy};
use proptest::prelude::*;

use super::bind::{place_node, Bind, BindError, Placed, Plan};
use super::topo::{Level, NodeTopo};
use super::{map_job, plan_of, Layout, MapError, NodeSlots};

fn topo(desc: &str) -> NodeTopo {
    NodeTopo::synthetic(desc).unwrap()
}

fn plan(map_obj: Option<Level>, bind: Bind) -> Plan {
    Plan { map_obj, bind, job_procs: 16, ..Plan::default() }
}

/// Each proc's bound PUs as a cpu list, in local rank order.
fn cpus(placed: &[Placed]) -> Vec<String> {
    placed.iter().map(|p| p.bound.as_ref().map_or("-".into(), |(_, pus)| super::topo::list_text(pus))).collect()
}

fn place(t: &NodeTopo, p: &Plan, n: u32) -> Result<Vec<Placed>, BindError> {
    place_node(t, p, n, &BTreeSet::new(), "n1")
}

#[test]
fn map_by_core_bind_to_core_gives_each_proc_its_own_core() {
    let t = topo("package:2 core:4 pu:2");
    let got = place(&t, &plan(Some(Level::Core), Bind::To(Level::Core)), 3).unwrap();
    assert_eq!(cpus(&got), ["0-1", "2-3", "4-5"]);
    let hwt = Plan { hwthread_cpus: true, ..plan(Some(Level::Hwthread), Bind::To(Level::Hwthread)) };
    assert_eq!(cpus(&place(&t, &hwt, 3).unwrap()), ["0", "1", "2"]);
}

#[test]
fn map_by_package_alternates_packages_and_binds_to_them_by_default() {
    let t = topo("package:2 core:2 pu:1");
    let got = place(&t, &plan(Some(Level::Package), Bind::Default), 4).unwrap();
    assert_eq!(cpus(&got), ["0-1", "2-3", "0-1", "2-3"]);
    // Bound to core inside the package: the next core of the package each time.
    let got = place(&t, &plan(Some(Level::Package), Bind::To(Level::Core)), 4).unwrap();
    assert_eq!(cpus(&got), ["0", "2", "1", "3"]);
}

#[test]
fn ppr_fills_each_object_in_turn() {
    let t = topo("package:2 core:4 pu:1");
    let p = Plan { per_obj: 2, ..plan(Some(Level::Package), Bind::To(Level::Core)) };
    assert_eq!(cpus(&place(&t, &p, 4).unwrap()), ["0", "1", "4", "5"]);
    let e = place(&t, &p, 5).unwrap_err();
    assert_eq!(e.to_string(), "cannot map 5 processes with ppr:2:package on node n1: it has 2 package objects");
}

#[test]
fn pe_gives_consecutive_cpus_inside_the_mapped_object() {
    let t = topo("package:2 numa:2 core:4 pu:1");
    let by_core = Plan { pe: 2, ..plan(Some(Level::Core), Bind::Default) };
    assert_eq!(cpus(&place(&t, &by_core, 3).unwrap()), ["0-1", "2-3", "4-5"]);
    let by_numa = Plan { pe: 2, ..plan(Some(Level::Numa), Bind::Default) };
    assert_eq!(cpus(&place(&t, &by_numa, 5).unwrap()), ["0-1", "4-5", "8-9", "12-13", "2-3"]);
    let whole_node = Plan { pe: 32, ..plan(Some(Level::Core), Bind::Default) };
    assert_eq!(
        place(&t, &whole_node, 1).unwrap_err().to_string(),
        "cannot give 32 cpus to each process: node n1 has only 16 cores"
    );
    let too_big = Plan { pe: 8, ..plan(Some(Level::Numa), Bind::Default) };
    assert_eq!(
        place(&t, &too_big, 1).unwrap_err().to_string(),
        "cannot give 8 cpus to each process: a numa on node n1 has only 4 cores"
    );
}

#[test]
fn overload_is_refused_unless_allowed() {
    let t = topo("package:1 core:2 pu:1");
    let p = plan(None, Bind::To(Level::Core));
    assert_eq!(
        place(&t, &p, 3).unwrap_err().to_string(),
        "cannot bind 3 processes to core on node n1: core 0 would hold 2 of them with 1 cores; add :overload-allowed to --bind-to or use fewer processes"
    );
    let ok = Plan { overload_allowed: true, ..p };
    assert_eq!(cpus(&place(&t, &ok, 3).unwrap()), ["0", "1", "0"]);
    // The default binding never refuses: an oversubscribed node runs its procs unbound.
    assert_eq!(cpus(&place(&t, &plan(None, Bind::Default), 3).unwrap()), ["-", "-", "-"]);
}

#[test]
fn pe_sets_that_wrap_onto_a_held_cpu_are_an_overload() {
    let t = topo("package:1 core:3 pu:1");
    let p = Plan { pe: 2, ..plan(Some(Level::Core), Bind::To(Level::Core)) };
    let e = place(&t, &p, 2).unwrap_err();
    assert!(matches!(e, BindError::Overload { held: 2, .. }), "{e}");
    assert_eq!(cpus(&place(&t, &Plan { overload_allowed: true, ..p }, 2).unwrap()), ["0-1", "0,2"]);
}

#[test]
fn rank_by_an_object_uses_the_mapped_object_within_it() {
    let t = topo("package:1 numa:2 core:2 pu:1");
    // Bound to the package: ranks still dealt over the NUMA nodes of the mapped cores.
    let p = Plan { rank_obj: Some(Level::Numa), ..plan(Some(Level::Core), Bind::To(Level::Package)) };
    let got = place(&t, &p, 4).unwrap();
    let objs: Vec<Option<(Level, u32)>> = got.iter().map(|p| p.obj).collect();
    assert_eq!(objs, [Some((Level::Core, 0)), Some((Level::Core, 2)), Some((Level::Core, 1)), Some((Level::Core, 3))]);
}

#[test]
fn missing_objects_are_named_or_skipped_if_supported() {
    let t = topo("package:1 core:2 pu:1");
    let e = place(&t, &plan(Some(Level::L3), Bind::Default), 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot map by l3cache: node n1 has no l3cache objects (it has 1 package, 1 numa, 2 core, 2 hwthread)"
    );
    let e = place(&t, &plan(None, Bind::To(Level::L3)), 1).unwrap_err();
    assert!(e.to_string().starts_with("cannot bind to l3cache: node n1 has no l3cache objects"), "{e}");
    let soft = Plan { if_supported: true, ..plan(None, Bind::To(Level::L3)) };
    assert_eq!(cpus(&place(&t, &soft, 2).unwrap()), ["-", "-"]);
}

#[test]
fn default_binding_follows_open_mpi() {
    let t = topo("package:2 core:2 pu:2");
    let two = Plan { job_procs: 2, ..plan(None, Bind::Default) };
    assert_eq!(cpus(&place(&t, &two, 2).unwrap()), ["0-1", "2-3"]);
    let many = Plan { job_procs: 4, ..plan(None, Bind::Default) };
    assert_eq!(cpus(&place(&t, &many, 4).unwrap()), ["0-3", "4-7", "0-3", "4-7"]);
    assert_eq!(cpus(&place(&t, &many, 5).unwrap()), ["-"; 5]);
}

#[test]
fn rank_by_object_deals_local_ranks_over_the_objects() {
    let t = topo("package:2 core:2 pu:1");
    let p = Plan { rank_obj: Some(Level::Package), ..plan(Some(Level::Core), Bind::To(Level::Core)) };
    // Mapped to cores 0,1,2,3 in order; ranked alternating packages.
    assert_eq!(cpus(&place(&t, &p, 4).unwrap()), ["0", "2", "1", "3"]);
}

#[test]
fn pus_other_jobs_hold_are_chosen_last() {
    let t = topo("package:1 core:4 pu:1");
    let busy: BTreeSet<u32> = [0, 1].into();
    let got = place_node(&t, &plan(None, Bind::To(Level::Core)), 2, &busy, "n1").unwrap();
    assert_eq!(cpus(&got), ["2", "3"]);
}

fn node(daemon: u32, slots: u32, hw: &str) -> NodeSlots {
    NodeSlots { topo: Some(Arc::new(topo(hw))), ..NodeSlots::new(daemon, format!("n{daemon}"), slots) }
}

fn spec(np: u32) -> JobSpec {
    JobSpec { apps: vec![AppContext { np, argv: vec!["a".into()], ..Default::default() }], ..Default::default() }
}

#[test]
fn ppr_per_object_counts_follow_each_nodes_hardware() {
    let nodes = [node(0, 8, "package:2 core:4"), node(1, 8, "package:1 core:8"), node(2, 8, "package:2 core:4")];
    let s = JobSpec { map_by: MapBy::Ppr as i32, ppr: 2, map_obj: HwObj::Package as i32, ..spec(7) };
    let p = map_job(&s, &nodes).unwrap();
    let counts: Vec<u32> = (0..p.num_nodes()).map(|i| p.ranks_at(i).len()).collect();
    assert_eq!(counts, [4, 2, 1]);
    let e = map_job(&JobSpec { apps: spec(11).apps, ..s }, &nodes).unwrap_err();
    assert_eq!(e.to_string(), "cannot map 11 processes with ppr:2:package: 3 nodes hold at most 10");
}

#[test]
fn mapper_refuses_what_a_node_cannot_bind_before_launch() {
    let nodes = [node(0, 4, "package:1 core:2"), node(1, 4, "package:1 core:2")];
    let s = JobSpec { bind_to: BindTo::Obj as i32, bind_obj: HwObj::Core as i32, ..spec(6) };
    let e = map_job(&s, &nodes).unwrap_err();
    assert!(matches!(e, MapError::Bind(BindError::Overload { .. })), "{e}");
    assert!(e.to_string().contains("on node n0"), "{e}");
    let pe = JobSpec { cpus_per_rank: 8, ..spec(1) };
    assert_eq!(
        map_job(&pe, &nodes).unwrap_err().to_string(),
        "cannot map the job: 8 cpus per rank, but no node has that many slots (the most is 4)"
    );
    let blind = [NodeSlots::new(0, "n0", 4)];
    let s = JobSpec { map_by: MapBy::Object as i32, map_obj: HwObj::Numa as i32, ..spec(2) };
    assert_eq!(
        map_job(&s, &blind).unwrap_err().to_string(),
        "cannot map the job with --map-by numa: host n0 (daemon 0) did not report its hardware"
    );
}

fn nodes_of(p: &crate::jobmap::Placement) -> Vec<u32> {
    (0..p.nprocs()).map(|r| p.node_of(r).unwrap()).collect()
}

#[test]
fn rank_by_node_deals_ranks_skipping_full_nodes() {
    let nodes = [node(0, 2, "core:2"), node(1, 2, "core:2")];
    let s = JobSpec { rank_by: RankBy::Node as i32, ..spec(4) };
    let p = map_job(&s, &nodes).unwrap();
    assert_eq!(p.node_of(1), Some(1));
    assert_eq!(p.layout(), &Layout::RoundRobin);
    let p = map_job(&JobSpec { apps: spec(3).apps, ..s.clone() }, &[node(0, 2, "core:2"), node(1, 1, "core:1")]);
    assert_eq!(p.unwrap().layout(), &Layout::RoundRobin, "2+1 is a dealt shape");
    // 1 + 3 slots, 4 procs: node 0 is full after the first pass, node 1 takes the rest.
    let p = map_job(&JobSpec { apps: spec(4).apps, ..s }, &[node(0, 1, "core:1"), node(1, 3, "core:3")]).unwrap();
    assert_eq!(nodes_of(&p), [0, 1, 1, 1]);
    let odd = [node(0, 3, "core:3"), node(1, 1, "core:1"), node(2, 3, "core:3")];
    let s = JobSpec { rank_by: RankBy::Node as i32, ..spec(7) };
    let p = map_job(&s, &odd).unwrap();
    assert_eq!(nodes_of(&p), [0, 1, 2, 0, 2, 0, 2]);
    assert!(matches!(p.layout(), Layout::Explicit { .. }));
    assert_eq!((p.local_rank(5), p.procs_on(2).iter().collect::<Vec<_>>()), (Some(2), vec![2, 4, 6]));
    // map-by node, rank-by slot: the dealt counts, ranks contiguous per node.
    let s = JobSpec { map_by: MapBy::Node as i32, rank_by: RankBy::Slot as i32, ..spec(3) };
    let p = map_job(&s, &nodes).unwrap();
    assert_eq!((p.node_of(0), p.node_of(1), p.node_of(2)), (Some(0), Some(0), Some(1)));
}

/// `--rank-by OBJ:span`: pass after pass, each node ranks one proc per object that has procs
/// left, nodes in order (ranks 0..3 on the four packages of the DVM, then again).
#[test]
fn rank_by_object_span_deals_over_the_objects_of_all_nodes() {
    let nodes = [node(0, 4, "package:2 core:2"), node(1, 4, "package:2 core:2")];
    let s = JobSpec {
        rank_by: RankBy::Obj as i32,
        rank_obj: HwObj::Package as i32,
        rank_span: true,
        bind_to: BindTo::Obj as i32,
        bind_obj: HwObj::Core as i32,
        ..spec(8)
    };
    let p = map_job(&s, &nodes).unwrap();
    assert_eq!(nodes_of(&p), [0, 0, 1, 1, 0, 0, 1, 1]);
    // Each node ranks its procs over its packages: local ranks 0..3 on packages 0,1,0,1, so
    // ranks 0 and 4 share node 0's package 0, ranks 2 and 6 node 1's.
    let plan = plan_of(&s, 8);
    let placed = place_node(nodes[0].topo.as_ref().unwrap(), &plan, 4, &BTreeSet::new(), "n0").unwrap();
    let pkg = |pl: &Placed| nodes[0].topo.as_ref().unwrap().object_of(pl.bound.as_ref().unwrap().1[0], Level::Package);
    let pkgs: Vec<_> = placed.iter().map(pkg).collect();
    assert_eq!(pkgs, [Some(0), Some(1), Some(0), Some(1)]);
    // Without span, ranks fill node by node.
    let p = map_job(&JobSpec { rank_span: false, ..s.clone() }, &nodes).unwrap();
    assert_eq!(nodes_of(&p), [0, 0, 0, 0, 1, 1, 1, 1]);
    // Uneven hardware: node 1 has one package, so it takes one rank per pass.
    let nodes = [node(0, 4, "package:2 core:2"), node(1, 4, "package:1 core:4")];
    let p = map_job(&s, &nodes).unwrap();
    assert_eq!(nodes_of(&p), [0, 0, 1, 0, 0, 1, 1, 1]);
    // The launch carries the node of each rank, and every daemon decodes the same placement.
    let (map, residuals) = crate::jobmap::encode(7, &s, &p);
    let back = crate::jobmap::Placement::from_job_map(&map).unwrap();
    assert_eq!(back, p);
    for (d, r) in &residuals {
        let mine: Vec<u32> = back.local_procs(7, r, *d).unwrap().iter().map(|l| l.rank).collect();
        assert_eq!(mine, p.procs_on(*d).iter().collect::<Vec<_>>());
    }
    // A node that did not report its hardware cannot be ranked by its objects.
    let blind = [node(0, 4, "package:2 core:2"), NodeSlots::new(1, "n1", 4)];
    let s = JobSpec { bind_to: BindTo::None as i32, ..s };
    let e = map_job(&s, &blind).unwrap_err().to_string();
    assert_eq!(e, "cannot map the job with --rank-by package:span: host n1 (daemon 1) did not report its hardware");
}

#[test]
fn span_spreads_over_the_objects_of_all_nodes() {
    let nodes = [node(0, 8, "package:2 core:4"), node(1, 8, "package:1 core:4"), node(2, 8, "package:1 core:4")];
    let s = JobSpec { map_by: MapBy::Object as i32, map_obj: HwObj::Package as i32, map_span: true, ..spec(6) };
    let p = map_job(&s, &nodes).unwrap();
    let counts: Vec<u32> = (0..p.num_nodes()).map(|i| p.ranks_at(i).len()).collect();
    assert_eq!(counts, [4, 1, 1], "4 packages: 2, 2, 1, 1 procs");
}

/// Objects to map or rank by. (Mapping by hwthread and binding to core puts the hwthreads of
/// one core's procs on it: an overload, refused, as it should be.)
fn level() -> impl Strategy<Value = Option<Level>> {
    prop_oneof![Just(None), Just(Some(Level::Core)), Just(Some(Level::Numa)), Just(Some(Level::Package)),]
}

proptest! {
    /// Every proc placed once; bound to core without overload, no two procs share a PU;
    /// ranked by an object, the first ranks visit distinct objects.
    #[test]
    fn placements_hold_their_rules(
        pk in 1u32..4, nm in 1u32..3, cr in 1u32..5, pu in 1u32..3,
        map_obj in level(), rank_obj in level(), fill in 0u32..100,
    ) {
        let t = topo(&format!("package:{pk} numa:{nm} core:{cr} pu:{pu}"));
        let cores = pk * nm * cr;
        let n = 1 + fill % cores;
        let p = Plan { rank_obj, ..plan(map_obj, Bind::To(Level::Core)) };
        let got = place(&t, &p, n).unwrap();
        prop_assert_eq!(got.len() as u32, n);
        let mut seen = BTreeSet::new();
        for pl in &got {
            let (_, pus) = pl.bound.as_ref().expect("bound");
            prop_assert_eq!(pus.len() as u32, pu, "one core's PUs");
            for &x in pus {
                prop_assert!(seen.insert(x), "PU {} bound twice", x);
            }
        }
        if let Some(r) = rank_obj {
            let of = |pl: &Placed| t.object_of(pl.bound.as_ref().unwrap().1[0], r).unwrap();
            let used: BTreeSet<u32> = got.iter().map(of).collect();
            let firsts: Vec<u32> = got.iter().take(used.len()).map(of).collect();
            let distinct: BTreeSet<u32> = firsts.iter().copied().collect();
            prop_assert_eq!(distinct.len(), firsts.len(), "ranks 0..{} on {:?}", firsts.len(), firsts);
        }
    }
}
