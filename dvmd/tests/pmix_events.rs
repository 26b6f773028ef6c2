//! PMIx events hosted by the DVM (docs/dynamic-mpi.md, "Events"), with the plain PMIx test
//! client tests/pmix/events.c on 4-daemon DVMs (4 slots each) at radix 2 and 64, local and on
//! netns fake nodes (root). Jobs run with `--map-by node`, so the rank on each daemon is known
//! from the rank number alone.
//!
//! - custom: the last rank of an 8-rank job notifies a user event (range namespace) in each
//!   of 5 rounds; every rank (those on the other three daemons through the DVM) must get each
//!   round's event exactly once, from that rank.
//! - own job: under `--enable-recovery` the last rank dies (`_exit(7)`, SIGKILL); every other
//!   rank must get `PMIX_ERR_PROC_ABORTED` from it with its exit status, finalize, and the job
//!   end with the dead rank's status and one sentence saying it went on. Without the flag the
//!   job is ended as before.
//! - connected job: two jobs meet (publish/lookup, PMIx_Connect); the last rank of one of them
//!   calls PMIx_Abort and exits, calls PMIx_Abort and stays (the DVM must end it: this hung
//!   before), or is SIGKILLed (its job also under `--enable-recovery`: its own ranks are told
//!   too). Every rank of the other job (`--enable-recovery`) must get `PMIX_ERR_PROC_ABORTED`
//!   from it, and that job must end with status 0.
//! - group: a recovering 4-rank job (one rank per daemon) whose last rank dies while the
//!   others construct a group of every rank: each construct must fail with
//!   `PMIX_ERR_PROC_ABORTED` (libpmix never tells the host of the dead member; the DVM's event
//!   does), not wait for ever.
//! - lost daemon: daemon 1 (a relay at radix 2) is killed with SIGKILL under an 8-rank job
//!   (`--enable-recovery`); every rank elsewhere must get `PMIX_ERR_LOST_CONNECTION` and
//!   `PMIX_EVENT_NODE_DOWN` (a system event: its registration goes through the host) naming
//!   the node and the two ranks lost there. Everything daemon 1 ran must be gone. A fresh DVM
//!   per round.
//!
//! Pass/fail is decided by what each rank printed and each prun's status, never by a time;
//! `GUARD` only keeps a hang from blocking the suite. `DVM_EV_REPEAT=20` runs each scenario 20
//! times in a row (the acceptance runs).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{pmix_bin, text as out, Dvm, Nodes};
use dvm_tests::{require_netns, FakeCluster, LineReader};

/// Only guards against a hang; never what decides pass or fail.
const GUARD: Duration = Duration::from_secs(180);

const RANKS: u32 = 8;
const DAEMONS: u32 = 4;
const ROUNDS: u32 = 5;

fn repeat() -> u32 {
    std::env::var("DVM_EV_REPEAT").ok().and_then(|v| v.parse().ok()).unwrap_or(1)
}

/// Where the DVM runs, rebuilt for each DVM (a netns cluster belongs to one DVM).
#[derive(Clone, Copy)]
enum Place {
    Local,
    Netns,
}

impl Place {
    fn nodes(self) -> Nodes {
        match self {
            Place::Local => Nodes::Local { daemons: DAEMONS, slots: 4 },
            Place::Netns => Nodes::Netns { cluster: FakeCluster::new(DAEMONS as usize).unwrap(), slots: 4 },
        }
    }

    /// The first daemon with slots: the HNP of a netns DVM has none (the nodes come from a
    /// hostfile), so `--map-by node` puts rank r on daemon `first + r % 4`.
    fn first_daemon(self) -> u32 {
        match self {
            Place::Local => 0,
            Place::Netns => 1,
        }
    }

    fn ranks_on(self, daemon: u32, nranks: u32) -> BTreeSet<u32> {
        (0..nranks).filter(|r| self.first_daemon() + r % DAEMONS == daemon).collect()
    }

    /// The node name of `daemon` as the DVM was told it.
    fn host_of(self, dvm: &Dvm, daemon: u32) -> String {
        match self {
            Place::Local => format!("{}-{daemon}", nix::unistd::gethostname().unwrap().to_string_lossy()),
            Place::Netns => dvm.cluster.as_ref().unwrap().node_name(daemon as usize - 1).to_string(),
        }
    }
}

fn start(name: &str, place: Place, radix: u32) -> Dvm {
    let env = [("DVM_LOG", "warn,dvmd::pmix=debug,dvm_core::jobs=debug")];
    Dvm::start(name, place.nodes(), radix, &env)
}

fn run(dvm: &Dvm, args: &[&str], what: &str) -> std::process::Output {
    let mut child = dvm.spawn_prun(args);
    finish(dvm, &mut child, what)
}

/// Wait for a prun (at most [`GUARD`]). A prun still running then fails the test with what
/// it printed, the processes the daemons still run, and the DVM's log (every daemon's
/// tracing, tagged): what a hang is diagnosed from.
fn finish(dvm: &Dvm, child: &mut std::process::Child, what: &str) -> std::process::Output {
    let deadline = std::time::Instant::now() + GUARD;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let procs = Dvm::describe_procs(&dvm.leftover_procs());
            let log = dvm.log();
            common::signal(child.id(), libc::SIGTERM);
            let o = common::wait_output(child, GUARD, what);
            let (so, se) = out(&o);
            panic!("{what} did not end within {GUARD:?}\nstdout:\n{so}\nstderr:\n{se}\nprocesses: {procs:#?}\nDVM log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    common::wait_output(child, GUARD, what)
}

/// The lines starting with `tag`, split into words (the tag dropped).
fn lines<'a>(stdout: &'a str, tag: &str) -> Vec<Vec<&'a str>> {
    stdout.lines().filter_map(|l| l.strip_prefix(tag)).map(|l| l.split_whitespace().collect()).collect()
}

/// "EVA rank <r> <own|peer> source <s> code <c>" lines: rank -> (kind, source, code).
fn aborted(stdout: &str) -> BTreeMap<u32, (String, u32, i32)> {
    let mut got = BTreeMap::new();
    for w in lines(stdout, "EVA ") {
        assert_eq!(w.len(), 7, "malformed EVA line {w:?}");
        let r: u32 = w[1].parse().unwrap();
        let prev = got.insert(r, (w[2].to_string(), w[4].parse().unwrap(), w[6].parse().unwrap()));
        assert!(prev.is_none(), "rank {r} reported PROC_ABORTED twice:\n{stdout}");
    }
    got
}

fn custom(dvm: &Dvm, i: u32) {
    let events = pmix_bin("events");
    let o = run(
        dvm,
        &["-n", &RANKS.to_string(), "--map-by", "node", &events, "custom", &ROUNDS.to_string()],
        "custom event job",
    );
    let (stdout, stderr) = out(&o);
    assert!(o.status.success(), "run {i}: {:?}\n{stdout}\n{stderr}\n{}", o.status, dvm.log());
    let mut seen: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
    for w in lines(&stdout, "EVC ") {
        assert_eq!(w.len(), 5, "malformed EVC line {w:?}");
        seen.entry((w[0].parse().unwrap(), w[2].parse().unwrap())).or_default().push(w[4].parse().unwrap());
    }
    for round in 0..ROUNDS {
        for rank in 0..RANKS {
            let from = seen.remove(&(round, rank)).unwrap_or_default();
            assert_eq!(from, vec![RANKS - 1], "run {i}: rank {rank}, round {round}: events from {from:?}:\n{stdout}");
        }
    }
    assert!(seen.is_empty(), "run {i}: events nobody sent: {seen:?}");
}

/// The last rank of the job dies; under `--enable-recovery` every other rank is told and
/// the job ends with the dead rank's status.
fn own_job(dvm: &Dvm, i: u32) {
    let events = pmix_bin("events");
    let n = RANKS.to_string();
    for (how, status) in [("exit", 7), ("kill", 128 + libc::SIGKILL)] {
        let o = run(
            dvm,
            &["--enable-recovery", "-n", &n, "--map-by", "node", &events, "self", how],
            "a recovering job losing a rank",
        );
        let (stdout, stderr) = out(&o);
        assert_eq!(o.status.code(), Some(status), "run {i}, {how}:\n{stdout}\n{stderr}\n{}", dvm.log());
        let got = aborted(&stdout);
        let want: BTreeMap<u32, (String, u32, i32)> =
            (0..RANKS - 1).map(|r| (r, ("own".into(), RANKS - 1, status))).collect();
        assert_eq!(got, want, "run {i}, {how}: PROC_ABORTED seen by the survivors:\n{stdout}\n{stderr}");
        let said: Vec<&str> = stderr.lines().filter(|l| l.contains("goes on (--enable-recovery)")).collect();
        assert_eq!(said.len(), 1, "run {i}, {how}: {stderr}");
        assert!(said[0].contains(&format!("rank {}", RANKS - 1)), "run {i}, {how}: {stderr}");
    }
    // Without the flag the job is ended as before (the event comes first, best effort).
    let o = run(dvm, &["-n", &n, "--map-by", "node", &events, "self", "exit"], "a job losing a rank");
    let (stdout, stderr) = out(&o);
    assert_eq!(o.status.code(), Some(7), "run {i}:\n{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!("rank {} on node", RANKS - 1)) && stderr.contains("exited with status 7"),
        "{stderr}"
    );
    assert!(!stderr.contains("goes on"), "run {i}: {stderr}");
}

/// A job joined by PMIx_Connect to one whose last rank dies is told, under
/// `--enable-recovery`, and ends with status 0.
fn connected_job(dvm: &Dvm, name: &str, i: u32) {
    let events = pmix_bin("events");
    const N: u32 = 4;
    let n = N.to_string();
    // (how the peer's rank dies, the peer's flags, its exit status, the sentence on its prun)
    let cases: [(&str, &[&str], i32, &str); 3] = [
        ("abort", &[], 3, "called MPI_Abort with code 3"),
        ("abort-stay", &[], 3, "called MPI_Abort with code 3 and did not exit within"),
        ("kill", &["--enable-recovery"], 128 + libc::SIGKILL, "was killed by signal 9"),
    ];
    for (how, flags, status, sentence) in cases {
        let token = format!("{name}-{i}-{how}");
        let mut waiting =
            dvm.spawn_prun(&["--enable-recovery", "-n", &n, "--map-by", "node", &events, "peer-wait", &token]);
        let mut args: Vec<&str> = flags.to_vec();
        args.extend(["-n", &n, "--map-by", "node", &events, "peer-die", &token, how]);
        let mut dying = dvm.spawn_prun(&args);
        let d = finish(dvm, &mut dying, &format!("the job whose rank dies ({how}, run {i})"));
        let w = finish(dvm, &mut waiting, &format!("the job connected to it ({how}, run {i})"));
        let ((wo, we), (dout, derr)) = (out(&w), out(&d));
        let all = format!("waiting job:\n{wo}\n{we}\ndying job:\n{dout}\n{derr}");
        assert_eq!(w.status.code(), Some(0), "run {i}, {how}: {all}\n{}", dvm.log());
        assert_eq!(d.status.code(), Some(status), "run {i}, {how}: {all}");
        assert!(derr.contains(&format!("rank {} on node", N - 1)) && derr.contains(sentence), "run {i}, {how}: {all}");
        let want: BTreeMap<u32, (String, u32, i32)> = (0..N).map(|r| (r, ("peer".into(), N - 1, status))).collect();
        assert_eq!(aborted(&wo), want, "run {i}, {how}: PROC_ABORTED seen by the connected job: {all}");
        if flags.contains(&"--enable-recovery") {
            // The dying job went on too: its own ranks were told.
            let want: BTreeMap<u32, (String, u32, i32)> =
                (0..N - 1).map(|r| (r, ("own".into(), N - 1, status))).collect();
            assert_eq!(aborted(&dout), want, "run {i}, {how}: {all}");
        }
    }
}

/// A group construct over every rank of a recovering job whose last rank dies: the others'
/// constructs fail instead of waiting for it (each member is alone on its daemon).
fn group_member_dies(dvm: &Dvm, i: u32) {
    let events = pmix_bin("events");
    const N: u32 = DAEMONS;
    let o = run(
        dvm,
        &["--enable-recovery", "-n", &N.to_string(), "--map-by", "node", &events, "group"],
        "a group construct whose member died",
    );
    let (stdout, stderr) = out(&o);
    assert_eq!(o.status.code(), Some(9), "run {i}:\n{stdout}\n{stderr}\n{}", dvm.log());
    let mut got = BTreeMap::new();
    for w in lines(&stdout, "EVG ") {
        got.insert(w[1].parse::<u32>().unwrap(), w[3].to_string());
    }
    let want: BTreeMap<u32, String> = (0..N - 1).map(|r| (r, "PROC-ABORTED".to_string())).collect();
    assert_eq!(got, want, "run {i}: constructs:\n{stdout}\n{stderr}");
}

fn events_suite(name: &str, place: Place, radix: u32) {
    let dvm = start(name, place, radix);
    for i in 0..repeat() {
        custom(&dvm, i);
        own_job(&dvm, i);
        connected_job(&dvm, name, i);
        group_member_dies(&dvm, i);
    }
    dvm.assert_up();
    let left = dvm.leftover_procs();
    assert!(left.is_empty(), "processes left: {:?}", Dvm::describe_procs(&left));
    dvm.stop();
}

/// Daemon 1 is killed under a recovering job: every rank elsewhere is told.
fn lost_daemon(name: &str, place: Place, radix: u32) {
    const VICTIM: u32 = 1;
    let events = pmix_bin("events");
    for i in 0..repeat() {
        let dvm = start(&format!("{name}{i}"), place, radix);
        let host = place.host_of(&dvm, VICTIM);
        let lost = place.ranks_on(VICTIM, RANKS);
        let mut job =
            dvm.spawn_prun(&["--enable-recovery", "-n", &RANKS.to_string(), "--map-by", "node", &events, "lost"]);
        let mut stdout = LineReader::new(job.stdout.take().unwrap());
        let stderr = LineReader::new(job.stderr.take().unwrap());
        let mut seen = Vec::new();
        while seen.iter().filter(|l: &&String| l.starts_with("EVREADY ")).count() < RANKS as usize {
            match stdout.next_line(GUARD) {
                Ok(Some(l)) => seen.push(l),
                other => panic!("run {i}: the job ended or hung before every rank was ready ({other:?}): {seen:?}"),
            }
        }
        let pid = dvm.daemon_pid(VICTIM);
        let doomed = common::descendants(pid);
        assert!(!doomed.is_empty(), "run {i}: daemon {VICTIM} runs nothing");
        common::signal(pid, libc::SIGKILL);
        while let Some(l) = stdout.next_line(GUARD).unwrap_or_else(|e| panic!("run {i}: {e}: {seen:?}")) {
            seen.push(l);
        }
        let status = job.wait().unwrap();
        let errs = drain(stderr);
        let stdout = seen.join("\n");
        let all = format!("{stdout}\n{}", errs.join("\n"));
        // A lost node is a failure of its own (not "could not run the job").
        assert_eq!(status.code(), Some(dvmd::jobs::LOST_EXIT), "run {i}: {all}\n{}", dvm.log());
        let affected = lost.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let survivors: BTreeSet<u32> = (0..RANKS).filter(|r| !lost.contains(r)).collect();
        let mut told: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for w in lines(&stdout, "EVL ") {
            told.entry(w[1].parse().unwrap()).or_default().push(w[2..].join(" "));
        }
        let want: Vec<String> = vec![format!("lost host {host} affected {affected}"), format!("nodedown host {host}")];
        assert_eq!(told.keys().copied().collect::<BTreeSet<u32>>(), survivors, "run {i}: ranks told: {all}");
        for (r, got) in &told {
            assert_eq!(got, &want, "run {i}: rank {r}: {all}");
        }
        let said: Vec<&String> = errs.iter().filter(|l| l.contains("goes on (--enable-recovery)")).collect();
        assert_eq!(said.len(), 1, "run {i}: {all}");
        assert!(said[0].contains(&format!("daemon {VICTIM} on node {host} was lost")), "run {i}: {all}");
        // Everything the lost daemon ran (its ranks, its PMIx worker) ended with it.
        common::until(GUARD, "the lost daemon's processes to end", || doomed.iter().all(|&p| !common::alive(p)));
        dvm.assert_up();
        let left = dvm.leftover_procs();
        assert!(left.is_empty(), "processes left: {:?}", Dvm::describe_procs(&left));
        dvm.stop();
    }
}

/// Every line a reader still gets, to its end.
fn drain(mut r: LineReader) -> Vec<String> {
    let mut v = Vec::new();
    while let Ok(Some(l)) = r.next_line(GUARD) {
        v.push(l);
    }
    v
}

#[test]
fn pmix_events_local_radix_2() {
    events_suite("evr2", Place::Local, 2);
}

#[test]
fn pmix_events_local_radix_64() {
    events_suite("evr64", Place::Local, 64);
}

#[test]
fn pmix_events_lost_daemon_local_radix_2() {
    lost_daemon("evlostr2-", Place::Local, 2);
}

#[test]
fn pmix_events_lost_daemon_local_radix_64() {
    lost_daemon("evlostr64-", Place::Local, 64);
}

#[test]
fn pmix_events_netns_radix_2() {
    require_netns!();
    events_suite("evnetr2", Place::Netns, 2);
}

#[test]
fn pmix_events_netns_radix_64() {
    require_netns!();
    events_suite("evnetr64", Place::Netns, 64);
}

#[test]
fn pmix_events_lost_daemon_netns_radix_2() {
    require_netns!();
    lost_daemon("evlostnetr2-", Place::Netns, 2);
}

#[test]
fn pmix_events_lost_daemon_netns_radix_64() {
    require_netns!();
    lost_daemon("evlostnetr64-", Place::Netns, 64);
}
