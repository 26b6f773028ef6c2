//! A persistent DVM shared by many jobs, on real local DVMs (radix 2 and 64): overlapping
//! submissions never share a slot, the queue is FIFO, queued and running jobs are cancelled,
//! detach and attach, arrays, spawn on the same books, and bad input to the job tools. Every
//! process started is stopped by PID.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Output};
use std::time::Duration;

use common::{mpi_bin, text, until, wait_output, Dvm, Nodes};

const PPS: &str = env!("CARGO_BIN_EXE_pps");
const PCANCEL: &str = env!("CARGO_BIN_EXE_pcancel");
/// Only guards against a hang; never what decides pass or fail.
const GUARD: Duration = Duration::from_secs(120);

fn tool(dvm: &Dvm, bin: &str, args: &[&str]) -> Output {
    Command::new(bin).arg("--dvm-uri").arg(&dvm.uri).args(args).env("DVM_TMPDIR", &dvm.root).output().unwrap()
}

/// Jobs waiting in the DVM's queue (array elements counted), from `pps --json`.
fn queued(dvm: &Dvm) -> u64 {
    let o = tool(dvm, PPS, &["--json"]);
    assert!(o.status.success(), "pps: {}", text(&o).1);
    let out = text(&o).0;
    let at = out.find("\"queued_jobs\":").expect("queued_jobs in pps --json") + "\"queued_jobs\":".len();
    out[at..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap()
}

/// Submit in the background and wait until the DVM has queued it (so submissions arrive in
/// the order this test makes them).
fn submit_queued(dvm: &Dvm, args: &[&str]) -> Child {
    let before = queued(dvm);
    let child = dvm.spawn_prun(args);
    until(GUARD, "the job is queued", || queued(dvm) > before);
    child
}

/// `S|E daemon slot ns` lines: each proc's slot interval, (daemon, slot) -> [(start, end)].
fn intervals(outs: &[String]) -> BTreeMap<(u32, u32), Vec<(u128, u128)>> {
    let mut starts: BTreeMap<(String, u32, u32), u128> = BTreeMap::new();
    let mut map: BTreeMap<(u32, u32), Vec<(u128, u128)>> = BTreeMap::new();
    for (job, out) in outs.iter().enumerate() {
        for l in out.lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            let [what, rank, daemon, slot, ns] = w[..] else { panic!("unexpected line {l:?}") };
            let (d, s, t): (u32, u32, u128) = (daemon.parse().unwrap(), slot.parse().unwrap(), ns.parse().unwrap());
            let key = (format!("{job}/{rank}"), d, s);
            match what {
                "S" => {
                    starts.insert(key, t);
                }
                _ => map.entry((d, s)).or_default().push((starts[&key], t)),
            }
        }
    }
    map
}

fn first_start(out: &str) -> u128 {
    out.lines().filter_map(|l| l.split_whitespace().nth(4)?.parse().ok()).min().expect("a start line")
}

const SHOW: &str = "echo S $DVM_RANK $DVM_DAEMON $DVM_SLOT $(date +%s%N); sleep 0.2; \
                    echo E $DVM_RANK $DVM_DAEMON $DVM_SLOT $(date +%s%N)";

fn run_suite(radix: u32, array: u32) {
    let dvm = Dvm::start(&format!("share{radix}"), Nodes::Local { daemons: 3, slots: 2 }, radix, &[]);

    // Overlapping submissions: 8 jobs of 2 procs on 6 slots. No (daemon, slot) ever holds two
    // procs at once, no slot index exceeds the node's slots, and every job succeeds.
    let mut kids: Vec<Child> = (0..8).map(|_| dvm.spawn_prun(&["-n", "2", "sh", "-c", SHOW])).collect();
    let outs: Vec<Output> = kids.iter_mut().map(|k| wait_output(k, GUARD, "overlapping prun")).collect();
    for o in &outs {
        assert!(o.status.success(), "{}", text(o).1);
    }
    let texts: Vec<String> = outs.iter().map(|o| text(o).0).collect();
    let iv = intervals(&texts);
    assert_eq!(iv.values().map(Vec::len).sum::<usize>(), 16, "every proc ran once");
    // Each node's process count over time, whatever slot each proc was told: at most 2.
    for d in 0..3 {
        let mut edges: Vec<(u128, i32)> = Vec::new();
        for (_, list) in iv.iter().filter(|((n, _), _)| *n == d) {
            for &(a, b) in list {
                edges.extend([(a, 1), (b, -1)]);
            }
        }
        // An end and a start at the same instant: the end first.
        edges.sort();
        let (mut now, mut most) = (0, 0);
        for (_, e) in edges {
            now += e;
            most = most.max(now);
        }
        assert!(most <= 2, "daemon {d} ran {most} procs at once on its 2 slots");
    }
    for ((d, s), mut list) in iv {
        assert!(s < 2, "daemon {d} gave slot {s} on a 2-slot node");
        list.sort();
        for w in list.windows(2) {
            assert!(w[0].1 <= w[1].0, "daemon {d} slot {s} held by two procs at once: {w:?}");
        }
    }

    // FIFO: with 4 of 6 slots held, a 6-slot job waits, and a 1-slot job behind it waits too
    // although it would fit; both run in order once the holder is cancelled.
    let mut holder = dvm.spawn_prun(&["-n", "4", "sleep", "100"]);
    until(GUARD, "the holder runs", || tool(&dvm, PPS, &[]).stdout.windows(7).any(|w| w == b"running"));
    let mut big = submit_queued(&dvm, &["-n", "6", "sh", "-c", SHOW]);
    let mut small = submit_queued(&dvm, &["-n", "1", "sh", "-c", SHOW]);
    let listing = text(&tool(&dvm, PPS, &[])).0;
    assert!(listing.contains("queued(1)") && listing.contains("queued(2)"), "{listing}");
    let o = tool(&dvm, PCANCEL, &["1000"]);
    assert_eq!(
        text(&o).1.trim(),
        "pcancel: no job 1000 in this DVM\npcancel: 1 of the jobs named could not be cancelled"
    );
    assert!(!o.status.success());
    let holder_id = listing.lines().find(|l| l.contains("sleep 100")).unwrap().split_whitespace().next().unwrap();
    let o = tool(&dvm, PCANCEL, &[holder_id]);
    assert!(o.status.success(), "{}", text(&o).1);
    let h = wait_output(&mut holder, GUARD, "holder");
    assert_eq!(h.status.code(), Some(143), "a cancelled job ends by SIGTERM: {}", text(&h).1);
    assert!(text(&h).1.contains(&format!("job {holder_id} was cancelled")), "{}", text(&h).1);
    let (b, s) = (wait_output(&mut big, GUARD, "big"), wait_output(&mut small, GUARD, "small"));
    assert!(b.status.success() && s.status.success(), "{} {}", text(&b).1, text(&s).1);
    assert!(first_start(&text(&b).0) < first_start(&text(&s).0), "the small job passed the big one");

    // A queued job cancelled never runs; its prun says why.
    let mut holder = dvm.spawn_prun(&["-n", "6", "sleep", "100"]);
    until(GUARD, "the holder runs", || tool(&dvm, PPS, &[]).stdout.windows(7).any(|w| w == b"running"));
    let mut waiting = submit_queued(&dvm, &["-n", "1", "echo", "ran"]);
    let o = tool(&dvm, PCANCEL, &["--all"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let w = wait_output(&mut waiting, GUARD, "queued job");
    assert_eq!(w.status.code(), Some(143));
    assert!(text(&w).0.is_empty(), "a cancelled queued job ran");
    assert!(text(&w).1.contains("was cancelled"), "{}", text(&w).1);
    let _ = wait_output(&mut holder, GUARD, "holder");

    // The queue's bound: an array that fills it is queued; the next job is refused by name.
    let mut holder = dvm.spawn_prun(&["-n", "6", "sleep", "100"]);
    until(GUARD, "the holder runs", || tool(&dvm, PPS, &[]).stdout.windows(7).any(|w| w == b"running"));
    let mut filler = submit_queued(&dvm, &["--array", "0-99999", "true"]);
    let o = dvm.prun(&["-n", "1", "true"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).1.contains("the queue holds 100000 jobs and this job would take it past its bound of 100000"),
        "{}",
        text(&o).1
    );
    assert!(tool(&dvm, PCANCEL, &["--all"]).status.success());
    let f = wait_output(&mut filler, GUARD, "filler array");
    assert_eq!(f.status.code(), Some(143), "{}", text(&f).1);
    let _ = wait_output(&mut holder, GUARD, "holder");
    assert_eq!(queued(&dvm), 0);

    // Detach, then attach: the job runs on without its prun; attach replays and follows it.
    let o = dvm.prun(&["--detach", "-n", "2", "sh", "-c", "echo one; sleep 0.5; echo two"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let id = text(&o).0.trim().to_string();
    assert!(id.parse::<u32>().is_ok(), "prun --detach printed {id:?}");
    assert!(text(&tool(&dvm, PPS, &[])).0.contains("[detached]"));
    let a = dvm.prun(&["--attach", &id]);
    assert!(a.status.success(), "{}", text(&a).1);
    assert_eq!(text(&a).0.matches("one").count(), 2);
    assert_eq!(text(&a).0.matches("two").count(), 2);
    // A detached job that reads stdin reads /dev/null (its prun is gone), so it ends.
    let o = dvm.prun(&["--detach", "-n", "1", "cat"]);
    let id = text(&o).0.trim().to_string();
    let a = dvm.prun(&["--attach", &id]);
    assert!(a.status.success(), "{}", text(&a).1);
    let o = dvm.prun(&["--attach", "4242"]);
    assert_eq!((o.status.code(), text(&o).1.trim()), (Some(1), "prun: --attach: no job 4242 in this DVM"));

    // An array: every index once, each with its own index.
    let last = (array - 1).to_string();
    let o = dvm.prun(&["--array", &format!("0-{last}"), "sh", "-c", "echo $DVM_ARRAY_INDEX"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let seen: Vec<u32> = text(&o).0.lines().map(|l| l.parse().unwrap()).collect();
    let set: BTreeSet<u32> = seen.iter().copied().collect();
    assert_eq!((seen.len(), set.len()), (array as usize, array as usize), "every index exactly once");
    assert_eq!(set, (0..array).collect());
    assert!(text(&o).1.contains(&format!("{array} of {array} jobs ran, 0 failed")), "{}", text(&o).1);

    // Bad array specs are refused before anything is submitted.
    for (spec, why) in [("5-2", "the first index 5 is above the last 2"), ("x", "'x' is not an index")] {
        let o = dvm.prun(&["--array", spec, "true"]);
        assert_eq!(o.status.code(), Some(1));
        assert!(text(&o).1.contains(why), "{}", text(&o).1);
    }
    let o = dvm.prun(&["--array", "0-200000", "true"]);
    assert!(text(&o).1.contains("200001 jobs, more than the 100000 an array may hold"), "{}", text(&o).1);

    // A job that can never fit is refused at once, naming the DVM's slots.
    let o = dvm.prun(&["-n", "7", "true"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("only 6 slots on 3 nodes"), "{}", text(&o).1);
    // --no-queue: refused at once while another job holds the slots.
    let mut holder = dvm.spawn_prun(&["-n", "6", "sleep", "100"]);
    until(GUARD, "the holder runs", || tool(&dvm, PPS, &[]).stdout.windows(7).any(|w| w == b"running"));
    let o = dvm.prun(&["--no-queue", "-n", "1", "true"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("does not fit now and --no-queue was given"), "{}", text(&o).1);
    assert!(tool(&dvm, PCANCEL, &["--all"]).status.success());
    let _ = wait_output(&mut holder, GUARD, "holder");

    // A reader that went away before the listing (`pps -a | head -0`): a quiet end.
    for args in [&["-a"][..], &["--nodes"], &["--json"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = Command::new(PPS)
            .arg("--dvm-uri")
            .arg(&dvm.uri)
            .args(args)
            .env("DVM_TMPDIR", &dvm.root)
            .stdout(writer)
            .output()
            .unwrap();
        assert!(o.status.success() && o.stderr.is_empty(), "pps {args:?}: {}", text(&o).1);
    }
    let nodes = text(&tool(&dvm, PPS, &["--nodes"])).0;
    assert_eq!(nodes.lines().filter(|l| l.contains(" up ")).count(), 3, "{nodes}");
    dvm.stop();
}

#[test]
fn a_shared_dvm_at_radix_2() {
    run_suite(2, 10_000);
}

#[test]
fn a_shared_dvm_at_radix_64() {
    run_suite(64, 1_000);
}

/// An MPI job's spawn counts the slots a prun job holds, and its refusal names the holders.
#[test]
fn a_spawn_and_a_prun_job_share_the_slot_books() {
    let dvm = Dvm::start("sharespawn", Nodes::Local { daemons: 2, slots: 2 }, 2, &[]);
    let spawn = mpi_bin("spawn");
    let mut holder = dvm.spawn_prun(&["-n", "2", "sleep", "100"]);
    until(GUARD, "the holder runs", || tool(&dvm, PPS, &[]).stdout.windows(7).any(|w| w == b"running"));
    let o = dvm.prun(&["--timeout", "60", "-n", "2", &spawn, "2", "1"]);
    assert!(!o.status.success());
    assert!(text(&o).1.contains("the DVM has 4 slots, 4 in use (job 1: 2, job 2: 2)"), "{}", text(&o).1);
    assert!(tool(&dvm, PCANCEL, &["--all"]).status.success());
    let _ = wait_output(&mut holder, GUARD, "holder");
    dvm.stop();
}

/// Every rank's stack on demand and at `--timeout --get-stack-traces`; a node without the
/// debugger says so.
#[test]
fn stack_traces_of_a_stuck_job_on_demand_and_at_its_timeout() {
    let dvm = Dvm::start("stacks", Nodes::Local { daemons: 2, slots: 1 }, 2, &[]);
    let mut stuck = dvm.spawn_prun(&["-n", "2", "sleep", "100"]);
    until(GUARD, "the job runs", || tool(&dvm, PPS, &[]).stdout.windows(7).any(|w| w == b"running"));
    let o = tool(&dvm, PPS, &["--stacks", "1"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let out = text(&o).0;
    assert!(out.contains("rank 0 on node vm-0 (pid ") && out.contains("rank 1 on node vm-1 (pid "), "{out}");
    assert!(out.contains("#0 ") && out.contains("nanosleep"), "{out}");
    let o = tool(&dvm, PPS, &["--stacks", "9"]);
    assert_eq!((o.status.code(), text(&o).1.trim()), (Some(1), "pps: no job 9 in this DVM"));
    assert!(tool(&dvm, PCANCEL, &["1"]).status.success());
    let _ = wait_output(&mut stuck, GUARD, "stuck job");

    let o = dvm.prun(&["--timeout", "1", "--get-stack-traces", "-n", "2", "sleep", "100"]);
    assert_eq!(o.status.code(), Some(124));
    let err = text(&o).1;
    assert!(err.contains("its ranks' stack traces follow"), "{err}");
    assert!(err.contains("prun: stack of rank 0 on node vm-0") && err.contains("prun: stack of rank 1 on node vm-1"));
    assert!(err.contains("nanosleep") && err.trim_end().ends_with("was killed"), "{err}");
    dvm.stop();

    // Without a debugger on the daemons' PATH: one sentence naming each node.
    let dvm = Dvm::start("nogdb", Nodes::Local { daemons: 2, slots: 1 }, 2, &[("PATH", "/nonexistent")]);
    let mut stuck = dvm.spawn_prun(&["-n", "2", "/bin/sleep", "100"]);
    until(GUARD, "the job runs", || tool(&dvm, PPS, &[]).stdout.windows(7).any(|w| w == b"running"));
    let o = tool(&dvm, PPS, &["--stacks", "1"]);
    assert!(!o.status.success());
    let err = text(&o).1;
    assert!(err.contains("pps: node vm-0: no stack traces: gdb is not installed there"), "{err}");
    assert!(err.contains("pps: node vm-1: no stack traces: gdb is not installed there"), "{err}");
    assert!(tool(&dvm, PCANCEL, &["--all"]).status.success());
    let _ = wait_output(&mut stuck, GUARD, "stuck job");
    dvm.stop();
}

/// Ctrl-C at any early moment of `prun --detach`: either prun printed the id and the job runs
/// on (the signal came after the submission returned), or prun ends by the signal and no job
/// of it is left running. Which one happens depends on when the signal lands; both are checked.
#[test]
fn a_signal_in_the_first_milliseconds_of_a_detached_submission_leaves_no_job_behind() {
    use std::os::unix::process::ExitStatusExt;
    let dvm = Dvm::start("detachsig", Nodes::Local { daemons: 2, slots: 2 }, 2, &[]);
    let running = |dvm: &Dvm| text(&tool(dvm, PPS, &[])).0.lines().filter(|l| l.contains(" running ")).count();
    for delay in [0u64, 1, 2, 3, 5, 10, 20, 40] {
        let mut prun = dvm.spawn_prun(&["--detach", "-n", "1", "sleep", "100"]);
        std::thread::sleep(Duration::from_millis(delay));
        // SAFETY: plain kill(2) on the prun this test started.
        unsafe {
            libc::kill(prun.id() as i32, libc::SIGINT);
        }
        let o = wait_output(&mut prun, GUARD, "detached prun");
        let id = text(&o).0.trim().to_string();
        if o.status.success() {
            assert!(id.parse::<u32>().is_ok(), "after {delay} ms: exit 0 without a job id: {id:?}");
            assert!(tool(&dvm, PCANCEL, &[&id]).status.success());
        } else {
            let by_sig = o.status.code() == Some(130) || o.status.signal() == Some(libc::SIGINT);
            assert!(by_sig, "after {delay} ms: prun ended with {}: {}", o.status, text(&o).1);
            assert!(id.is_empty(), "after {delay} ms: an id printed by a prun that failed: {id}");
        }
        until(GUARD, "no job left running", || running(&dvm) == 0);
    }
    dvm.stop();
}
