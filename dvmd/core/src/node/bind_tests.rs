//! Placement on the hardware through whole daemons: each node reports its hardware at
//! check-in, the HNP refuses what cannot be bound before launch, each daemon binds its procs
//! (free cpus first on a shared node) and reports the bindings when asked.

use dvm_proto::job::{BindTo, HwObj, JobSpec, MapBy};

use crate::harness::{job, Net, Program};
use crate::jobmap::NodeTopo;

const MS: u64 = 1_000_000;

fn hang() -> Vec<String> {
    Program::Hang.argv()
}

fn exit_after(ms: u64) -> Vec<String> {
    Program::Exit { code: 0, after_ns: ms * MS }.argv()
}

/// The cpus each live proc of `jobid` was given, by rank: (daemon, cpus).
fn cpus(net: &Net, jobid: u32) -> Vec<(u32, u32, Option<Vec<u32>>)> {
    let mut v: Vec<(u32, u32, Option<Vec<u32>>)> = net
        .shells
        .iter()
        .enumerate()
        .flat_map(|(d, s)| {
            s.procs.iter().filter(|((j, _), _)| *j == jobid).map(move |((_, r), p)| (*r, d as u32, p.spec.cpus.clone()))
        })
        .collect();
    v.sort();
    v
}

fn bind_to(obj: HwObj) -> JobSpec {
    JobSpec { bind_to: BindTo::Obj as i32, bind_obj: obj as i32, ..Default::default() }
}

#[test]
fn each_daemon_binds_its_procs_as_asked_and_reports_it() {
    let hw = NodeTopo::synthetic("package:2 core:2 pu:2").unwrap();
    let mut net = Net::boot_with_hardware(2, 2, 4, &hw);
    let spec = JobSpec {
        map_by: MapBy::Object as i32,
        map_obj: HwObj::Package as i32,
        report_bindings: true,
        ..JobSpec { apps: job(6, hang()).apps, ..bind_to(HwObj::Core) }
    };
    let c = net.launch(spec);
    net.run();
    let got = cpus(&net, 1);
    // Node 0 holds ranks 0-3 (4 slots), alternating packages, each on the next core there.
    let want = [
        (0, 0, Some(vec![0, 1])),
        (1, 0, Some(vec![4, 5])),
        (2, 0, Some(vec![2, 3])),
        (3, 0, Some(vec![6, 7])),
        (4, 1, Some(vec![0, 1])),
        (5, 1, Some(vec![4, 5])),
    ];
    assert_eq!(got, want);
    let mut lines: Vec<String> =
        net.shells[0].notices(c).iter().flat_map(|n| n.lines().map(String::from).collect::<Vec<_>>()).collect();
    lines.sort();
    assert_eq!(lines[0], "[n0:0] bound to package[0][core:0] (cpus 0-1)");
    assert_eq!(lines[5], "[n1:5] bound to package[1][core:2] (cpus 4-5)");
}

#[test]
fn a_binding_no_node_can_honour_is_refused_before_anything_starts() {
    let hw = NodeTopo::synthetic("package:1 core:2").unwrap();
    let mut net = Net::boot_with_hardware(2, 2, 4, &hw);
    let c = net.launch(JobSpec { apps: job(6, hang()).apps, ..bind_to(HwObj::Core) });
    net.run();
    let (code, why) = net.ended(c).expect("refused");
    assert_ne!(code, 0);
    assert!(why.contains("cannot bind 4 processes to core on node n0: core 0 would hold 2 of them"), "{why}");
    assert!(net.shells.iter().all(|s| s.started.is_empty()), "nothing started");
    let c = net.launch(JobSpec {
        apps: job(1, hang()).apps,
        map_by: MapBy::Object as i32,
        map_obj: HwObj::L3 as i32,
        ..Default::default()
    });
    net.run();
    let (_, why) = net.ended(c).expect("refused");
    assert!(why.contains("cannot map by l3cache: node n0 has no l3cache objects"), "{why}");
}

#[test]
fn a_second_job_on_a_shared_node_gets_the_cpus_the_first_one_left_free() {
    let hw = NodeTopo::synthetic("package:1 core:4").unwrap();
    let mut net = Net::boot_with_hardware(1, 2, 4, &hw);
    let first = net.launch(JobSpec { apps: job(2, hang()).apps, ..bind_to(HwObj::Core) });
    net.run();
    let second = net.launch(JobSpec { apps: job(2, exit_after(5)).apps, ..bind_to(HwObj::Core) });
    net.run_for(MS);
    assert_eq!(cpus(&net, 1), [(0, 0, Some(vec![0])), (1, 0, Some(vec![1]))]);
    assert_eq!(cpus(&net, 2), [(0, 0, Some(vec![2])), (1, 0, Some(vec![3]))]);
    net.run();
    assert_eq!(net.ended(second), Some((0, String::new())));
    assert_eq!(net.ended(first), None, "the first job still runs");
}

#[test]
fn default_binding_follows_the_job_size_and_leaves_an_oversubscribed_node_unbound() {
    let hw = NodeTopo::synthetic("package:2 core:2").unwrap();
    let mut net = Net::boot_with_hardware(1, 2, 8, &hw);
    net.launch(job(2, hang()));
    net.launch(job(3, hang()));
    net.run();
    assert_eq!(cpus(&net, 1), [(0, 0, Some(vec![0])), (1, 0, Some(vec![1]))], "np <= 2: a core each");
    assert_eq!(
        cpus(&net, 2),
        [(0, 0, Some(vec![2, 3])), (1, 0, Some(vec![0, 1])), (2, 0, Some(vec![2, 3]))],
        "np > 2: a package each"
    );
    let c = net.launch(JobSpec { oversubscribe: true, ..job(5, hang()) });
    net.run();
    assert!(net.ended(c).is_none());
    assert!(cpus(&net, 3).iter().all(|(_, _, c)| c.is_none()), "5 procs on 4 cores: unbound");
}

#[test]
fn daemons_sharing_one_machine_bind_nothing_by_default_but_what_is_asked() {
    // Fake nodes of one machine report the same machine: the implicit binding would put each
    // node's first process on the same core.
    let mut hw = NodeTopo::synthetic("package:1 core:4").unwrap();
    hw.machine = 7;
    let mut net = Net::boot_with_hardware(2, 2, 4, &hw);
    net.launch(JobSpec { map_by: MapBy::Node as i32, ..job(2, hang()) });
    net.launch(JobSpec { apps: job(2, hang()).apps, ..bind_to(HwObj::Core) });
    net.run();
    assert_eq!(cpus(&net, 1), [(0, 0, None), (1, 1, None)]);
    assert_eq!(cpus(&net, 2), [(0, 0, Some(vec![0])), (1, 0, Some(vec![1]))]);
}
