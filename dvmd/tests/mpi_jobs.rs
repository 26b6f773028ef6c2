//! Unmodified Open MPI programs (tests/mpi/*.c, built with mpicc) under dvmd's PMIx server,
//! on local DVMs at radix 2 and 64 and on network-namespace fake nodes.

mod common;

use std::process::Command;

use common::{mpi_bin, text as out, Dvm, Nodes};
use dvm_tests::{require_netns, FakeCluster};

fn check_programs(dvm: &Dvm, extra: &[&str]) {
    let run = |prog: &str, args: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend_from_slice(&["-n", "16"]);
        let bin = mpi_bin(prog);
        a.push(&bin);
        a.extend_from_slice(args);
        let o = dvm.prun(&a);
        assert!(o.status.success(), "{prog} {extra:?}: {:?}\n{}\n{}", o.status, out(&o).1, dvm.log());
        out(&o).0
    };
    let hello = run("hello", &[]);
    for r in 0..16 {
        assert!(hello.contains(&format!("hello rank {r} of 16 on")), "{hello}");
    }
    let all = run("allreduce", &[]);
    assert_eq!(all.matches("ok 120").count(), 16, "{all}");
    let ring = run("ring", &[]);
    assert!(ring.contains("ring token 240 want 240 ok"), "{ring}");
}

fn mpi_suite(radix: u32, cluster: Option<FakeCluster>) {
    let name = format!("{}r{radix}", if cluster.is_some() { "netns" } else { "local" });
    let nodes = match cluster {
        Some(cluster) => Nodes::Netns { cluster, slots: 4 },
        None => Nodes::Local { daemons: 4, slots: 4 },
    };
    let env = [
        // The core logs each fence's collect flag and sequence number when it starts.
        // grpcomm logs the movement each fence starts on.
        ("DVM_LOG", "warn,dvmd::pmix=debug,dvm_core=debug,dvm_grpcomm::fence=debug"),
        // The same MCA settings for the ranks as any launcher compared with.
        ("OMPI_MCA_pml", "ob1"),
        // All-local fences go through fence_nb too, so the path is exercised.
        ("PMIX_MCA_pmix_server_fence_localonly_opt", "0"),
    ];
    let dvm = Dvm::start(&name, nodes, radix, &env);
    // Every rank is offered the hash store only: libpmix 4.2.2 keeps the shared-memory store's
    // records of every client until the daemon exits (docs/soak.md).
    let o = dvm.prun(&["-n", "8", "printenv", "PMIX_GDS_MODULE"]);
    assert!(o.status.success(), "{}", out(&o).1);
    let stores: Vec<String> = out(&o).0.lines().map(String::from).collect();
    assert_eq!(stores, vec!["hash".to_string(); 8], "PMIX_GDS_MODULE of the ranks");
    check_programs(&dvm, &[]);
    // The servers open only the hash store (pmix::SERVER_GDS); a job that asks its ranks for
    // the shared-memory store still runs.
    let allreduce = mpi_bin("allreduce");
    let o = dvm.prun(&["-n", "8", "-x", "PMIX_GDS_MODULE=ds21", &allreduce]);
    assert!(o.status.success(), "ds21 ranks: {:?}\n{}\n{}", o.status, out(&o).1, dvm.log());
    // The MPI_Init modex collects; the two barriers do not; sequence numbers 0, 1, 2.
    let log = dvm.log();
    for (collect, seq) in [(true, 0), (false, 1), (false, 2)] {
        assert!(log.contains(&format!("collect={collect} seq={seq}")), "fence collect={collect} seq={seq} not seen");
    }
    // The DVM's default (auto): the collecting MPI_Init fence on the lateral allgather, the
    // barriers on the tree.
    let started =
        |m: &str| log.lines().any(|l| l.contains("fence started") && l.contains(&format!("movement=\"{m}\"")));
    assert!(started("allgather"), "the MPI_Init modex did not run on the allgather");
    assert!(started("tree-barrier"), "the barriers did not run on the tree");

    // Without a collecting modex: peers' data comes by direct modex from their daemons.
    check_programs(&dvm, &["-x", "OMPI_MCA_pmix_base_collect_data=0"]);
    assert!(dvm.log().contains("direct modex served"), "direct modex never used");

    // MCA parameters as mpirun takes them: shared memory and self only runs; no transport
    // at all fails in MPI_Init, so the parameter reached the ranks.
    let o = dvm.prun(&["--mca", "btl", "self,vader", "-n", "4", &allreduce]);
    assert!(o.status.success(), "--mca btl self,vader: {:?}\n{}", o.status, out(&o).1);
    let o = dvm.prun(&["--timeout", "60", "--mca", "btl", "nosuchbtl", "--mca", "pml", "ob1", "-n", "2", &allreduce]);
    assert!(!o.status.success(), "--mca btl nosuchbtl ran: {}", out(&o).0);

    // MPI_Abort(42) -> 42, naming the rank.
    let o = dvm.prun(&["-n", "8", &mpi_bin("abort"), "42"]);
    assert_eq!(o.status.code(), Some(42), "{}", out(&o).1);
    assert!(out(&o).1.contains("rank 1 on node") && out(&o).1.contains("MPI_Abort with code 42"), "{}", out(&o).1);
    // A crashing rank fails the job promptly, its node named.
    let o = dvm.prun(&["-n", "8", &mpi_bin("crash")]);
    assert_eq!(o.status.code(), Some(139), "{}", out(&o).1);
    assert!(out(&o).1.contains("rank 1 on node") && out(&o).1.contains("signal 11"), "{}", out(&o).1);

    // 20 MPI jobs in a row leave nothing behind.
    for i in 0..20 {
        let o = dvm.prun(&["-n", "8", &mpi_bin("mpinoop")]);
        assert!(o.status.success(), "job {i}: {}", out(&o).1);
    }
    let left = dvm.leftover_procs();
    assert!(
        left.is_empty(),
        "processes left: {:?} (daemons {:?})",
        Dvm::describe_procs(&left),
        Dvm::describe_procs(&dvm.pids)
    );
    dvm.stop();
}

#[test]
fn mpi_local_radix_2() {
    mpi_suite(2, None);
}

#[test]
fn mpi_local_radix_64() {
    mpi_suite(64, None);
}

#[test]
fn mpi_netns_radix_2() {
    require_netns!();
    mpi_suite(2, Some(FakeCluster::new(4).unwrap()));
}

#[test]
fn mpi_netns_radix_64() {
    require_netns!();
    mpi_suite(64, Some(FakeCluster::new(4).unwrap()));
}

/// One-shot (`prun --local`): the transient DVM starts its PMIx servers during the boot.
#[test]
fn mpi_one_shot() {
    let root = std::env::temp_dir().join(format!("dvm-mpi-oneshot-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let o = Command::new(common::PRUN)
        .args(["--local", "2", "--slots", "4", "-n", "8", &mpi_bin("allreduce")])
        .env("DVM_TMPDIR", &root)
        .env("OMPI_MCA_pml", "ob1")
        .output()
        .unwrap();
    let (so, se) = out(&o);
    assert!(o.status.success(), "{se}");
    assert_eq!(so.matches("ok 28").count(), 8, "{so}");
    let left = common::session_dirs(&root);
    let _ = std::fs::remove_dir_all(&root);
    assert!(left.is_empty(), "one-shot left session dirs: {left:?}");
}

/// An MPI job inside MPI (barriers) when a daemon is killed fails naming the daemon; when the
/// DVM is terminated, it ends with status 125 and a sentence, and the DVM stops with nothing
/// left (libpmix must not be finalized under connected clients).
fn mpi_faults(radix: u32) {
    let env = [("OMPI_MCA_pml", "ob1")];
    let dvm = Dvm::start(&format!("mpifault{radix}"), Nodes::Local { daemons: 4, slots: 2 }, radix, &env);
    let linger = mpi_bin("linger");
    let started = |child: &mut std::process::Child| {
        // prun forwards rank 0's first line once every rank is past MPI_Init; a hang fails
        // here with the lines seen instead of blocking the test.
        dvm_tests::wait_for_line(child.stdout.take().unwrap(), "linger started", std::time::Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("the MPI job never started: {e}"))
            .1
    };
    // A daemon killed under a running MPI job.
    let mut job = dvm.spawn_prun(&["--map-by", "node", "-n", "8", &linger]);
    let _out = started(&mut job);
    let victim = common::procs_with("--rank=3\0").into_iter().find(|p| dvm.pids.contains(p)).expect("daemon 3");
    // SAFETY: kill(2) on a daemon this test started.
    unsafe {
        libc::kill(victim as i32, libc::SIGKILL);
    }
    let o = common::wait_output(&mut job, std::time::Duration::from_secs(60), "an MPI job that lost a daemon");
    assert!(!o.status.success());
    assert!(out(&o).1.contains("daemon 3 on node"), "{}", out(&o).1);
    dvm.assert_up();
    // pterm under a running MPI job.
    let mut job = dvm.spawn_prun(&["-n", "6", &linger]);
    let _out2 = started(&mut job);
    let st = Command::new(common::PTERM).arg("--dvm-uri").arg(&dvm.uri).env("DVM_TMPDIR", &dvm.root).output().unwrap();
    assert!(st.status.success(), "pterm: {}", out(&st).1);
    let o = common::wait_output(&mut job, std::time::Duration::from_secs(60), "an MPI job under pterm");
    assert_eq!(o.status.code(), Some(125), "{}", out(&o).1);
    assert!(out(&o).1.contains("the DVM was terminated (pterm) while job"), "{}", out(&o).1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while dvm.pids.iter().any(|&p| common::alive(p)) {
        assert!(std::time::Instant::now() < deadline, "daemons left after pterm: {}", dvm.log());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(common::session_dirs(&dvm.root).is_empty(), "session dirs left");
}

#[test]
fn mpi_faults_radix_2() {
    mpi_faults(2);
}

#[test]
fn mpi_faults_radix_64() {
    mpi_faults(64);
}
