//! PMIx groups and queries hosted by the DVM (docs/dynamic-mpi.md), with plain PMIx test
//! clients (tests/pmix/group.c, query.c) on 4-daemon DVMs at radix 2 and 64, local and on
//! netns fake nodes (root).
//!
//! Groups: 8 ranks, 2 on each daemon, construct and destruct three groups per round (the same
//! id every round, a new id every round, and one id whose members change every round), 20
//! rounds per job. Checked against what the program's own member rule predicts: every member
//! of every construct reported, all with one context id, no id ever given twice, and each
//! rank found every member's endpoint data without a direct modex.
//! Queries: the namespaces listed are exactly the jobs running (the query job and a sleeping
//! job started first; an earlier job that ended is not listed), each job's size is what it
//! was started with, process sets: 0, anything else refused.
//!
//! `DVM_GRP_REPEAT=20` runs each job 20 times in a row (the acceptance runs).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{pmix_bin, text as out, Dvm, Nodes};
use dvm_tests::{require_netns, FakeCluster};

/// Only guards against a hang; never what decides pass or fail.
const GUARD: Duration = Duration::from_secs(180);

/// Ranks of the group job, and rounds of constructs inside it.
const RANKS: u32 = 8;
const ROUNDS: u32 = 20;

fn run(dvm: &Dvm, args: &[&str], what: &str) -> std::process::Output {
    let mut child = dvm.spawn_prun(args);
    common::wait_output(&mut child, GUARD, what)
}

fn repeat() -> u32 {
    std::env::var("DVM_GRP_REPEAT").ok().and_then(|v| v.parse().ok()).unwrap_or(1)
}

/// The members of construct `kind` in `round`, by the rule tests/pmix/group.c states.
fn members(kind: &str, round: u32) -> BTreeSet<u32> {
    match kind {
        "same" | "named" => (0..RANKS).collect(),
        "sub" => match round % 3 {
            0 => (0..RANKS).filter(|r| r % 2 == 0).collect(),
            1 => (0..RANKS).filter(|r| r % 2 == 1).collect(),
            _ => (1..RANKS).collect(),
        },
        _ => panic!("unknown kind {kind}"),
    }
}

/// What members reported for one construct: (rank, context id, member count) each.
type Reports = Vec<(u32, u64, usize)>;

/// Parse every "GRP <round> <kind> rank <r> ctx <id> members <n>" line and check it.
fn check_groups(stdout: &str, used: &mut BTreeSet<u64>) {
    let mut seen: BTreeMap<(u32, String), Reports> = BTreeMap::new();
    for l in stdout.lines().filter(|l| l.starts_with("GRP ")) {
        let w: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(w.len(), 9, "malformed line {l:?}");
        let (round, rank, ctx, n) =
            (w[1].parse().unwrap(), w[4].parse().unwrap(), w[6].parse().unwrap(), w[8].parse().unwrap());
        seen.entry((round, w[2].to_string())).or_default().push((rank, ctx, n));
    }
    for round in 0..ROUNDS {
        for kind in ["same", "named", "sub"] {
            let want = members(kind, round);
            let got = seen.remove(&(round, kind.to_string())).unwrap_or_default();
            let ranks: BTreeSet<u32> = got.iter().map(|g| g.0).collect();
            assert_eq!(ranks, want, "members reporting {kind} in round {round}:\n{stdout}");
            assert_eq!(got.len(), want.len(), "a member reported {kind} twice in round {round}:\n{stdout}");
            let ids: BTreeSet<u64> = got.iter().map(|g| g.1).collect();
            assert_eq!(ids.len(), 1, "context ids of {kind} in round {round} differ: {ids:?}");
            assert!(got.iter().all(|g| g.2 == want.len()), "member counts of {kind} in round {round}: {got:?}");
            let id = *ids.first().unwrap();
            assert!(used.insert(id), "context id {id} ({kind}, round {round}) was given before");
        }
    }
    assert!(seen.is_empty(), "constructs nobody asked for: {seen:?}");
    let ep = stdout
        .lines()
        .filter(|l| l.starts_with("GRPEP ") && l.ends_with(&format!("saw {RANKS} members' endpoint data")));
    assert_eq!(ep.count(), RANKS as usize, "endpoint data checks:\n{stdout}");
}

/// `salt`: distinct per test, so the sleeping job of each (found by its argument) is its own
/// when the tests run at once (they share one process id).
fn group_suite(name: &str, nodes: Nodes, radix: u32, salt: u32) {
    let env = [("DVM_LOG", "warn,dvmd::pmix=info")];
    let dvm = Dvm::start(name, nodes, radix, &env);
    let group = pmix_bin("group");
    let mut used = BTreeSet::new();
    for i in 0..repeat() {
        let o = run(&dvm, &["-n", &RANKS.to_string(), "--map-by", "node", &group, &ROUNDS.to_string()], "group job");
        let (stdout, stderr) = out(&o);
        assert!(o.status.success(), "run {i}: {:?}\n{stdout}\n{stderr}\n{}", o.status, dvm.log());
        check_groups(&stdout, &mut used);
    }
    query_check(&dvm, salt);
    dvm.assert_up();
    let left = dvm.leftover_procs();
    assert!(left.is_empty(), "processes left: {:?}", Dvm::describe_procs(&left));
    dvm.stop();
}

/// The query client's lines, by their first word after "QRY".
fn qry<'a>(stdout: &'a str, what: &str) -> Vec<Vec<&'a str>> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("QRY "))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.first() == Some(&what))
        .map(|w| w[1..].to_vec())
        .collect()
}

fn query_check(dvm: &Dvm, salt: u32) {
    // A job that ends before: it must not be listed.
    let o = run(dvm, &["-n", "2", "/bin/true"], "a job that ends");
    assert!(o.status.success(), "{:?}", out(&o));
    // A job that runs while the query job asks (a unique argument finds its processes).
    let nap = format!("{}.{}{salt}", 600, std::process::id() % 1000);
    let mut sleeper = dvm.spawn_prun(&["-n", "3", "--map-by", "node", "/bin/sleep", &nap]);
    // Its prun's command line holds the argument too.
    let prun_pid = sleeper.id();
    let sleeping = || common::procs_with(&nap).into_iter().filter(|&p| p != prun_pid).count();
    common::until(GUARD, "the sleeping job's 3 processes", || sleeping() == 3);
    let query = pmix_bin("query");
    let rounds = repeat();
    let o = run(dvm, &["-n", "2", "--map-by", "node", &query, &rounds.to_string()], "query job");
    let (stdout, stderr) = out(&o);
    assert!(o.status.success(), "{:?}\n{stdout}\n{stderr}\n{}", o.status, dvm.log());
    let me = qry(&stdout, "me");
    assert_eq!(me.len(), 1, "{stdout}");
    let (own, own_size) = (me[0][0].to_string(), me[0][1]);
    assert_eq!(own_size, "2", "{stdout}");
    let lists = qry(&stdout, "namespaces");
    assert_eq!(lists.len(), rounds as usize, "{stdout}");
    for list in &lists {
        let listed: Vec<&str> = list[0].split(',').collect();
        assert_eq!(listed.len(), 2, "running jobs: the query job and the sleeping one, got {listed:?}");
        assert!(listed.contains(&own.as_str()), "own namespace {own} not listed: {listed:?}");
    }
    let other: String = lists[0][0].split(',').find(|ns| *ns != own).unwrap().to_string();
    let sizes = qry(&stdout, "size");
    assert_eq!(sizes.len(), 2 * rounds as usize, "{stdout}");
    for s in &sizes {
        let want = if s[0] == own { "2" } else { "3" };
        assert!(s[0] == own || s[0] == other, "{s:?}");
        assert_eq!(s[1], want, "size of {}: {stdout}", s[0]);
    }
    for (what, want) in [("psets", "0"), ("ownsize", "2")] {
        let got = qry(&stdout, what);
        assert_eq!(got.len(), rounds as usize, "{stdout}");
        assert!(got.iter().all(|w| w[0] == want), "{what}: {got:?}");
    }
    let bogus = qry(&stdout, "bogus");
    assert!(bogus.iter().all(|w| w.join(" ") == "NOT-FOUND"), "{bogus:?}");
    let unsupported = qry(&stdout, "unsupported");
    assert!(unsupported.iter().all(|w| w.join(" ") == "NOT-SUPPORTED"), "{unsupported:?}");
    // The sleeping job is ended by its prun.
    common::signal(sleeper.id(), libc::SIGTERM);
    let _ = common::wait_output(&mut sleeper, GUARD, "the sleeping job's prun");
    common::until(GUARD, "the sleeping job's processes to end", || common::procs_with(&nap).is_empty());
}

#[test]
fn pmix_groups_local_radix_2() {
    group_suite("grpr2", Nodes::Local { daemons: 4, slots: 4 }, 2, 1);
}

#[test]
fn pmix_groups_local_radix_64() {
    group_suite("grpr64", Nodes::Local { daemons: 4, slots: 4 }, 64, 2);
}

#[test]
fn pmix_groups_netns_radix_2() {
    require_netns!();
    group_suite("grpnetr2", Nodes::Netns { cluster: FakeCluster::new(4).unwrap(), slots: 4 }, 2, 3);
}

#[test]
fn pmix_groups_netns_radix_64() {
    require_netns!();
    group_suite("grpnetr64", Nodes::Netns { cluster: FakeCluster::new(4).unwrap(), slots: 4 }, 64, 4);
}

/// A job fails while its other ranks wait in a fence its failed rank never joined: once the
/// job has ended, no daemon holds any state for that fence (each daemon whose ranks are gone
/// abandons its job's fences, and the error retires them on every participant and relay), and
/// the next job's fences run. Fails without abandoning: the waiting ranks' daemons, and the
/// relays between them, keep the fence's tracker for ever.
fn abandoned_fence_leaves_nothing(name: &str, radix: u32) {
    let dvm = Dvm::start(name, Nodes::Local { daemons: 4, slots: 2 }, radix, &[]);
    let prog = pmix_bin("fencefail");
    // Eight ranks, two per daemon: the last (on daemon 3) never joins the fence.
    let o = run(&dvm, &["-n", "8", "--map-by", "node", &prog], "the failing job");
    let (stdout, stderr) = out(&o);
    assert_eq!(o.status.code(), Some(3), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(stdout.matches("FENCING rank").count(), 7, "{stdout}");
    // Rank 3 shares the failed rank's daemon: libpmix there ends its fence with an error
    // (the local participant left); no fence may succeed.
    assert!(
        stdout.lines().filter(|l| l.starts_with("FENCED")).all(|l| !l.ends_with(" rc 0")),
        "a fence succeeded without the last rank: {stdout}"
    );
    let mut held = Vec::new();
    common::until(Duration::from_secs(30), "every daemon to let go of the abandoned fence", || {
        held = dvm.fences_in_flight();
        held.iter().all(|&(_, n)| n == 0)
    });
    assert_eq!(held.len(), 4, "{held:?}");
    let group = pmix_bin("group");
    let o = run(&dvm, &["-n", "8", "--map-by", "node", &group, "1"], "a group job after it");
    assert!(o.status.success(), "{:?}", out(&o));
    assert!(dvm.fences_in_flight().iter().all(|&(_, n)| n == 0));
    dvm.stop();
}

#[test]
fn an_abandoned_fence_leaves_nothing_radix_2() {
    abandoned_fence_leaves_nothing("abandon2", 2);
}

#[test]
fn an_abandoned_fence_leaves_nothing_radix_64() {
    abandoned_fence_leaves_nothing("abandon64", 64);
}
