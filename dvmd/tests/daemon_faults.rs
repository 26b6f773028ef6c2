//! Faults a running DVM must survive, with real daemons on loopback, at radix 2 (a deep tree
//! with relays) and 64 (flat): a daemon killed during a fence storm, a daemon frozen until it
//! is declared dead and then resumed, pterm while a job runs.
//!
//! Waits are bounded guards against hangs (a passed bound fails the test with a message);
//! no assertion depends on how long something took.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{alive, procs_in_root, procs_with, session_dirs, signal, text, until, wait_output, Dvm, Nodes, PTERM};

/// Processes of a job: `sleep <marker>` under this DVM's HNP (its daemons are its children).
fn job_procs(dvm: &Dvm, marker: &str) -> usize {
    let mine: std::collections::BTreeSet<u32> = common::descendants(dvm.pids[0]).into_iter().collect();
    mine.into_iter()
        .filter(|&p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c) == format!("sleep\0{marker}\0"))
        })
        .count()
}

/// Case: `dvm-bench --check-fences` with a daemon killed by SIGKILL mid-storm ends with an
/// error naming that daemon, and the survivors then pass a clean storm.
fn storm_with_a_kill(name: &str, daemons: u32, radix: u32, victim: u32) {
    // The HNP logs when the benchmark reaches it; every daemon applies BENCH before any
    // DAEMON_DIED the kill causes (xcasts are processed in op order).
    let dvm = Dvm::start(
        name,
        Nodes::Local { daemons, slots: 1 },
        radix,
        &[("DVM_LOG", "warn,dvm_core::router::bench=info")],
    );
    dvm.storm_with_kill(name, daemons, victim, 1);
    dvm.stop();
}

#[test]
fn fence_storm_kill_leaf_radix_2() {
    storm_with_a_kill("stormleaf2", 16, 2, 15);
}

#[test]
fn fence_storm_kill_interior_radix_2() {
    // Daemon 3 relays for 7 and 11.
    storm_with_a_kill("storminner2", 16, 2, 3);
}

#[test]
fn fence_storm_kill_hnp_child_radix_2() {
    storm_with_a_kill("stormchild2", 16, 2, 1);
}

#[test]
fn fence_storm_kill_radix_4_depth_2() {
    // 16 daemons at radix 4: two levels below the HNP; 1 relays for 5, 9, 13.
    storm_with_a_kill("storm4", 16, 4, 1);
}

#[test]
fn fence_storm_kill_radix_64() {
    storm_with_a_kill("storm64", 10, 64, 6);
}

/// Case: a daemon frozen (SIGSTOP) until it is declared dead fails the job running on it,
/// naming it; resumed (SIGCONT) it is refused and exits, and every other daemon still runs
/// jobs — nobody healthy is dropped.
fn frozen_then_resumed(name: &str, radix: u32) {
    let dvm = Dvm::start(name, Nodes::Local { daemons: 8, slots: 1 }, radix, &[("DVM_LOG", "warn")]);
    // The heartbeat bound (default 1 s x 5) is what declares the frozen daemon dead.
    for round in 0..2 {
        let marker = format!("{}{round}", 7000 + radix);
        let mut job = dvm.spawn_prun(&["--map-by", "node", "-n", &(8 - round).to_string(), "sleep", &marker]);
        until(Duration::from_secs(30), "the job's procs to start", || job_procs(&dvm, &marker) == 8 - round);
        let victim = 1 + round as u32;
        let pid = dvm.daemon_pid(victim);
        signal(pid, libc::SIGSTOP);
        let out = wait_output(&mut job, Duration::from_secs(60), "the job on a frozen daemon");
        let (_, e) = text(&out);
        assert!(!out.status.success(), "{name}: the job on frozen daemon {victim} succeeded");
        assert!(e.contains(&format!("daemon {victim} on node")), "{name}: error does not name daemon {victim}: {e}");
        signal(pid, libc::SIGCONT);
        until(Duration::from_secs(30), "the resumed daemon to exit", || !alive(pid));
        // Every survivor still takes a proc: one per live daemon.
        let survivors = 7 - round;
        let out = dvm.prun(&["--map-by", "node", "-n", &survivors.to_string(), "printenv", "DVM_DAEMON"]);
        let (o, e) = text(&out);
        assert!(out.status.success(), "{name}: {e}");
        let mut got: Vec<u32> = o.lines().map(|l| l.trim().parse().unwrap()).collect();
        got.sort_unstable();
        let want: Vec<u32> = (0..8).filter(|&r| r == 0 || r > victim).collect();
        assert_eq!(got, want, "{name}: round {round}: a healthy daemon was dropped (stderr: {e})");
        // The HNP said which daemon it lost, and lost no other.
        let log = dvm.log();
        let lost: Vec<&str> =
            log.lines().filter(|l| l.starts_with("dvmd: daemon ") && l.contains(" was lost: ")).collect();
        assert!(
            lost.iter().any(|l| l.contains(&format!("daemon {victim} on host "))),
            "{name}: the HNP never named daemon {victim} as lost: {log}"
        );
        assert_eq!(lost.len(), round + 1, "{name}: round {round}: daemons declared lost: {lost:?}");
    }
    dvm.stop();
}

#[test]
fn frozen_daemon_resumed_is_refused_radix_2() {
    frozen_then_resumed("frozen2", 2);
}

#[test]
fn frozen_daemon_resumed_is_refused_radix_64() {
    frozen_then_resumed("frozen64", 64);
}

/// Case: pterm while a job runs ends the job at once with the documented status and a
/// sentence, then stops every daemon and leaves nothing behind.
fn pterm_during_job(name: &str, radix: u32) {
    let dvm = Dvm::start(name, Nodes::Local { daemons: 4, slots: 2 }, radix, &[]);
    let marker = format!("{}", 8000 + radix);
    let mut job = dvm.spawn_prun(&["-n", "8", "sleep", &marker]);
    until(Duration::from_secs(30), "the job's procs to start", || {
        if let Ok(Some(st)) = job.try_wait() {
            panic!("{name}: prun ended early ({st}): {:?}", wait_output(&mut job, Duration::from_secs(1), "prun"));
        }
        job_procs(&dvm, &marker) == 8
    });
    let st = Command::new(PTERM).arg("--dvm-uri").arg(&dvm.uri).env("DVM_TMPDIR", &dvm.root).output().unwrap();
    assert!(st.status.success(), "pterm: {}", text(&st).1);
    let out = wait_output(&mut job, Duration::from_secs(30), "prun after pterm");
    let (_, e) = text(&out);
    assert_eq!(out.status.code(), Some(125), "{name}: prun status after pterm (stderr: {e})");
    assert!(e.contains("the DVM was terminated (pterm) while job"), "{name}: {e}");
    until(Duration::from_secs(20), "every daemon to exit", || dvm.pids.iter().all(|&p| !alive(p)));
    assert_eq!(job_procs(&dvm, &marker), 0);
    assert!(procs_with(&format!("sleep {marker}")).is_empty(), "{name}: job procs outlived the DVM");
    let left = session_dirs(&dvm.root);
    assert!(left.is_empty(), "{name}: session dirs left: {left:?}");
}

#[test]
fn pterm_during_a_job_radix_2() {
    pterm_during_job("ptermjob2", 2);
}

#[test]
fn pterm_during_a_job_radix_64() {
    pterm_during_job("ptermjob64", 64);
}

/// Kills by pid whatever still runs under a test's `DVM_TMPDIR` root and removes the root, when
/// the test ends, passed or failed.
struct RootGuard(std::path::PathBuf);

impl Drop for RootGuard {
    fn drop(&mut self) {
        for p in procs_in_root(&self.0) {
            signal(p, libc::SIGKILL);
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// SIGINT or SIGTERM on the HNP at any moment of the boot ends it, promptly, with nothing left:
/// before "DVM ready" the boot is abandoned (exit 1, one sentence), after it the DVM
/// terminates in order (exit 0).
#[test]
fn a_signal_during_the_boot_leaves_nothing() {
    for (i, (sig, delay_ms)) in
        [(libc::SIGINT, 0), (libc::SIGTERM, 15), (libc::SIGINT, 60), (libc::SIGTERM, 250), (libc::SIGINT, 900)]
            .into_iter()
            .enumerate()
    {
        let root = std::env::temp_dir().join(format!("dvm-t-bootsig{i}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let _guard = RootGuard(root.clone());
        let mut hnp = Command::new(common::DVMD)
            .args(["--local", "8", "--radix", "2"])
            .env("DVM_TMPDIR", &root)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        signal(hnp.id(), sig);
        let out = wait_output(&mut hnp, Duration::from_secs(30), "dvmd after a signal during its boot");
        let (o, e) = text(&out);
        match out.status.code() {
            Some(0) => assert!(o.contains("DVM ready"), "exit 0 without a ready DVM: {o}{e}"),
            Some(1) => assert!(e.contains("start-up interrupted"), "exit 1 without saying why: {e}"),
            Some(c) => panic!("signal {sig} after {delay_ms} ms: exit status {c}: {e}"),
            None => {
                // Only a signal before `main` (held from its first instruction) kills it, and
                // then it is that very signal, not a crash.
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(out.status.signal(), Some(sig), "dvmd died of another signal: {e}");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !procs_in_root(&root).is_empty() {
            if Instant::now() > deadline {
                let left: Vec<String> = procs_in_root(&root)
                    .into_iter()
                    .map(|p| {
                        let c = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                        format!("{p}: {}", String::from_utf8_lossy(&c).replace('\0', " "))
                    })
                    .collect();
                for p in procs_in_root(&root) {
                    signal(p, libc::SIGKILL);
                }
                panic!("signal {sig} after {delay_ms} ms (status {:?}, {e}): left running: {left:?}", out.status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let left = session_dirs(&root);
        assert!(left.is_empty(), "signal {sig} after {delay_ms} ms: session dirs left: {left:?}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
