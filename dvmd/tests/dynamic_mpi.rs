//! Dynamic MPI under the DVM (docs/dynamic-mpi.md): unmodified Open MPI 4.1 programs
//! (tests/mpi/spawn.c, spawn_missing.c, accept.c, connect.c) calling MPI_Comm_spawn (2 and 8
//! children, across nodes, nested, oversubscribed, of a missing executable, a child that
//! fails) and MPI_Publish_name / MPI_Lookup_name / MPI_Comm_accept / MPI_Comm_connect between
//! two separately launched jobs (and the end of a job connected to one that fails), on local
//! DVMs at radix 2 and 64 and on netns fake nodes.
//! Every check compares with what the program's own arithmetic predicts (each side of an
//! intercommunicator receives the other side's sum), never with output copied from a run.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{mpi_bin, text as out, Dvm, Nodes};
use dvm_tests::{require_netns, FakeCluster};

/// Only guards against a hang; never what decides pass or fail.
const GUARD: Duration = Duration::from_secs(180);

fn run(dvm: &Dvm, args: &[&str], what: &str) -> std::process::Output {
    let mut child = dvm.spawn_prun(args);
    common::wait_output(&mut child, GUARD, what)
}

/// The lines `spawn` prints for level `level` in `role` ("parent" or "child"): (rank, size,
/// remote, sum, node).
fn levels(stdout: &str, level: u32, role: &str) -> Vec<(u32, u32, u32, i64, String)> {
    let prefix = format!("level {level} rank ");
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|l| {
            // "<r> of <size>: intercomm ok remote <n> sum <s> as <role> node <host>"
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() < 12 || w[3] != "intercomm" || w[4] != "ok" || w[10] != role {
                return None;
            }
            Some((
                w[0].parse().ok()?,
                w[2].trim_end_matches(':').parse().ok()?,
                w[6].parse().ok()?,
                w[8].parse().ok()?,
                w[12..].join(" "),
            ))
        })
        .collect()
}

/// Each parent receives the children's sum (rank+1 each), each child the parents' (1000+rank).
fn check_spawn(stdout: &str, level: u32, parents: u32, children: u32) -> BTreeSet<String> {
    let up = levels(stdout, level, "parent");
    let down = levels(stdout, level + 1, "child");
    let kids_sum: i64 = (1..=children as i64).sum();
    let parents_sum: i64 = (0..parents as i64).map(|r| 1000 + r).sum();
    let ranks = |v: &[(u32, u32, u32, i64, String)]| v.iter().map(|l| l.0).collect::<BTreeSet<_>>();
    assert_eq!(ranks(&up), (0..parents).collect(), "parents at level {level}: {stdout}");
    assert_eq!(ranks(&down), (0..children).collect(), "children at level {}: {stdout}", level + 1);
    for l in &up {
        assert_eq!((l.1, l.2, l.3), (parents, children, kids_sum), "a parent's view: {l:?}\n{stdout}");
    }
    for l in &down {
        assert_eq!((l.1, l.2, l.3), (children, parents, parents_sum), "a child's view: {l:?}\n{stdout}");
    }
    down.into_iter().map(|l| l.4).collect()
}

fn dynamic_suite(name: &str, nodes: Nodes, radix: u32) {
    let env = [
        ("DVM_LOG", "warn,dvmd::pmix=info,dvm_core::jobs=info"),
        ("OMPI_MCA_pml", "ob1"),
        // All-local connects and fences go through the host too, so that path is exercised.
        ("PMIX_MCA_pmix_server_fence_localonly_opt", "0"),
    ];
    let dvm = Dvm::start(name, nodes, radix, &env);
    // `DVM_DYN_REPEAT=20` for the acceptance runs (each program 20 times in a row).
    let rounds: u32 = std::env::var("DVM_DYN_REPEAT").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    for round in 0..rounds {
        dynamic_round(&dvm, &format!("{name}-{round}"));
    }
    // Nothing is left: no process, and the DVM still runs jobs.
    dvm.assert_up();
    let left = dvm.leftover_procs();
    assert!(left.is_empty(), "processes left: {:?}", Dvm::describe_procs(&left));
    dvm.stop();
}

fn dynamic_round(dvm: &Dvm, name: &str) {
    let spawn = mpi_bin("spawn");

    // 2 ranks spawn 2 children (room on the first node: they join their parents there).
    for i in 0..3 {
        let o = run(dvm, &["-n", "2", &spawn, "2", "1"], "spawn of 2");
        assert!(o.status.success(), "spawn of 2 (#{i}): {:?}\n{}\n{}", o.status, out(&o).1, dvm.log());
        check_spawn(&out(&o).0, 0, 2, 2);
        assert_eq!(out(&o).0.matches("spawn level 1 done").count(), 1);
    }

    // 8 children mapped by node: across every node of the DVM.
    let o = run(dvm, &["-n", "2", &spawn, "8", "1", "node"], "spawn of 8 by node");
    assert!(o.status.success(), "spawn of 8: {:?}\n{}\n{}", o.status, out(&o).1, dvm.log());
    let hosts = check_spawn(&out(&o).0, 0, 2, 8);
    assert!(hosts.len() >= 4, "8 children mapped by node on 4 nodes ran on {hosts:?}");

    // More children than free slots: refused in one sentence unless oversubscribe is asked.
    let o = run(dvm, &["-n", "2", &spawn, "20", "1"], "spawn beyond the free slots");
    assert!(!o.status.success());
    let err = out(&o).1;
    assert_eq!(err.matches("MPI_Comm_spawn by rank 0 of job").count(), 1, "{err}");
    assert!(err.contains("cannot map 20 processes"), "{err}");
    let o = run(dvm, &["-n", "2", &spawn, "20", "1", "slot:oversubscribe"], "oversubscribed spawn");
    assert!(o.status.success(), "oversubscribed spawn: {:?}\n{}", o.status, out(&o).1);
    check_spawn(&out(&o).0, 0, 2, 20);

    // Nested: a child job spawns its own children.
    let o = run(dvm, &["-n", "1", &spawn, "2", "2"], "nested spawn");
    assert!(o.status.success(), "nested spawn: {:?}\n{}\n{}", o.status, out(&o).1, dvm.log());
    check_spawn(&out(&o).0, 0, 1, 2);
    check_spawn(&out(&o).0, 1, 2, 2);
    for l in 0..3 {
        assert_eq!(out(&o).0.matches(&format!("spawn level {l} done")).count(), 1, "{}", out(&o).0);
    }

    // A missing executable: MPI_Comm_spawn returns an error, one sentence names it.
    let o = run(dvm, &["-n", "1", &mpi_bin("spawn_missing")], "spawn of a missing executable");
    assert!(o.status.success(), "{:?}\n{}\n{}", o.status, out(&o).0, out(&o).1);
    assert!(out(&o).0.contains("spawn failed as expected: MPI_ERR_SPAWN"), "{}", out(&o).0);
    let err = out(&o).1;
    let sentences: Vec<&str> = err.lines().filter(|l| l.contains("MPI_Comm_spawn by rank 0 of job")).collect();
    assert_eq!(sentences.len(), 1, "{err}");
    assert!(sentences[0].contains("/nonexistent/dvm-no-such-program") && sentences[0].contains("not found"), "{err}");

    // A child that fails (the only failure: its parents end normally): its status reaches the
    // parent's prun, which names it, and waits for it.
    let o = run(dvm, &["-n", "2", &spawn, "1", "1", "slot", "0", "fail"], "a failing child");
    assert_eq!(o.status.code(), Some(7), "{}\n{}", out(&o).1, dvm.log());
    assert!(out(&o).1.contains("rank 0 on node") && out(&o).1.contains("exited with status 7"), "{}", out(&o).1);

    // Publish/lookup + accept/connect between two separately launched jobs.
    for i in 0..3 {
        let service = format!("dvm-test-{name}-{i}");
        let mut server = dvm.spawn_prun(&["-n", "2", &mpi_bin("accept"), &service]);
        // The client starts once the service is published (never on a timing).
        let (_, mut lines) = dvm_tests::wait_for_line(server.stdout.take().unwrap(), "published", GUARD)
            .unwrap_or_else(|e| panic!("the accepting job never published: {e}\n{}", dvm.log()));
        let client = run(dvm, &["-n", "3", &mpi_bin("connect"), &service], "the connecting job");
        let server = common::wait_output(&mut server, GUARD, "the accepting job");
        assert!(client.status.success(), "connect: {:?}\n{}\n{}", client.status, out(&client).1, dvm.log());
        assert!(server.status.success(), "accept: {:?}\n{}", server.status, out(&server).1);
        let c = out(&client).0;
        for r in 0..3 {
            assert!(c.contains(&format!("connect rank {r} of 3: remote 2 sum 2001 ok")), "{c}");
        }
        let mut s = String::new();
        while let Ok(Some(l)) = lines.next_line(GUARD) {
            s.push_str(&l);
            s.push('\n');
        }
        for r in 0..2 {
            assert!(s.contains(&format!("accept rank {r} of 2: remote 3 sum 6 ok")), "{s}");
        }
    }

    // A job connected to one that fails is ended too, in one sentence naming the peer, instead
    // of waiting for it (its ranks wait for a message nobody sends).
    let service = format!("dvm-test-{name}-abort");
    let mut server = dvm.spawn_prun(&["-n", "2", &mpi_bin("accept"), &service, "wait"]);
    let (_, _lines) = dvm_tests::wait_for_line(server.stdout.take().unwrap(), "published", GUARD)
        .unwrap_or_else(|e| panic!("the accepting job never published: {e}\n{}", dvm.log()));
    let client = run(dvm, &["-n", "3", &mpi_bin("connect"), &service, "abort"], "the aborting connected job");
    assert_eq!(client.status.code(), Some(3), "{}", out(&client).1);
    let server = common::wait_output(&mut server, GUARD, "the job connected to an aborted one");
    assert_eq!(server.status.code(), Some(3), "{}\n{}", out(&server).1, dvm.log());
    let err = out(&server).1;
    let said: Vec<&str> = err.lines().filter(|l| l.contains("was connected to job")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(said[0].contains("called MPI_Abort with code 3") && said[0].contains("is ended too"), "{err}");
}

#[test]
fn dynamic_local_radix_2() {
    dynamic_suite("dynr2", Nodes::Local { daemons: 4, slots: 4 }, 2);
}

#[test]
fn dynamic_local_radix_64() {
    dynamic_suite("dynr64", Nodes::Local { daemons: 4, slots: 4 }, 64);
}

#[test]
fn dynamic_netns_radix_2() {
    require_netns!();
    dynamic_suite("dynnetr2", Nodes::Netns { cluster: FakeCluster::new(4).unwrap(), slots: 4 }, 2);
}

#[test]
fn dynamic_netns_radix_64() {
    require_netns!();
    dynamic_suite("dynnetr64", Nodes::Netns { cluster: FakeCluster::new(4).unwrap(), slots: 4 }, 64);
}

/// The Python acceptance: a process pool built on MPI_Comm_spawn (Debian's
/// python3-mpi4py, `mpi4py.futures.MPIPoolExecutor`) maps a function over 100 inputs under
/// `prun -n 1`; tests/mpi/pool.py checks every result against its own computation.
#[test]
fn mpi4py_pool_local_radix_2() {
    const PYTHON: &str = "/usr/bin/python3";
    let have = std::process::Command::new(PYTHON).args(["-c", "import mpi4py.futures"]).status();
    assert!(
        have.is_ok_and(|s| s.success()),
        "{PYTHON} cannot import mpi4py.futures: install python3-mpi4py (scripts/prereqs.sh test)"
    );
    let env = [("OMPI_MCA_pml", "ob1")];
    let dvm = Dvm::start("dynpool", Nodes::Local { daemons: 4, slots: 4 }, 2, &env);
    let pool = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/mpi/pool.py");
    let pool = pool.display().to_string();
    for workers in ["1", "3", "8"] {
        let o = run(&dvm, &["-n", "1", PYTHON, &pool, workers], "the mpi4py pool");
        assert!(o.status.success(), "pool of {workers}: {:?}\n{}\n{}", o.status, out(&o).1, dvm.log());
        assert!(out(&o).0.contains(&format!("pool of {workers} mapped 100 inputs: ok")), "{}", out(&o).0);
    }
    let left = dvm.leftover_procs();
    assert!(left.is_empty(), "processes left: {:?}", Dvm::describe_procs(&left));
    dvm.stop();
}
