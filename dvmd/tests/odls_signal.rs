//! odls: signals to jobs (process groups), kill_job's escalation, kill_all, and liveness.

mod odls_common;

use std::time::Duration;

use dvmd::odls::{ExitKind, OdlsEvent};
use odls_common::{proc_state, sh, spec, Harness};

/// A proc ignoring SIGTERM is SIGKILLed after the grace; its job-mate dies of the SIGTERM.
#[tokio::test]
async fn kill_job_terms_then_kills_what_ignores_term() {
    let mut h = Harness::new(4096);
    h.odls.spawn(sh(1, 0, "trap '' TERM; echo ready; exec sleep 100"));
    h.odls.spawn(sh(1, 1, "echo ready; exec sleep 100"));
    h.odls.spawn(sh(1, 2, "true"));
    h.wait_stdout((1, 0), "ready").await;
    h.wait_stdout((1, 1), "ready").await;
    h.wait_done(&[(1, 2)]).await;
    assert_eq!(h.odls.live(1), 2, "rank 2 was reaped");
    h.odls.kill_job(1, Duration::from_millis(300));
    h.wait_done(&[(1, 0), (1, 1)]).await;
    assert_eq!(h.procs[&(1, 0)].status, Some(ExitKind::Signal(libc::SIGKILL)));
    assert_eq!(h.procs[&(1, 1)].status, Some(ExitKind::Signal(libc::SIGTERM)));
    assert_eq!(h.odls.live(1), 0);
    // Nothing left to signal: a no-op.
    h.odls.kill_job(1, Duration::ZERO);
    h.odls.signal_job(1, libc::SIGKILL);
}

/// SIGUSR1 reaches every process of the job's process groups (the shell and its background
/// subshells), and no process of another job. The subshells spin on a builtin rather than run
/// `sleep`: a signal landing between a fork and its exec would be swallowed by the forked
/// shell's inherited trap, a race of the script, not of odls.
#[tokio::test]
async fn signal_job_reaches_the_whole_group_and_only_that_job() {
    let mut h = Harness::new(4096);
    let script = r#"
        trap 'echo got-p' USR1
        for n in a b; do
            ( trap "echo got-$n; exit 0" USR1; echo ready-$n; while :; do :; done ) &
        done
        echo ready-p
        wait; wait
    "#;
    h.odls.spawn(sh(1, 0, script));
    h.odls.spawn(sh(2, 0, "echo ready; exec sleep 100"));
    for r in ["ready-a", "ready-b", "ready-p"] {
        h.wait_stdout((1, 0), r).await;
    }
    h.wait_stdout((2, 0), "ready").await;
    h.odls.signal_job(1, libc::SIGUSR1);
    h.wait_done(&[(1, 0)]).await;
    let mut lines: Vec<String> =
        h.procs[&(1, 0)].stdout().lines().filter(|l| l.starts_with("got")).map(String::from).collect();
    lines.sort();
    assert_eq!(lines, ["got-a", "got-b", "got-p"], "{}", h.procs[&(1, 0)].stdout());
    assert_eq!(h.procs[&(1, 0)].status, Some(ExitKind::Code(0)));
    // Job 2 did not get SIGUSR1 (it would have died of it): it dies of our SIGTERM.
    assert_eq!(h.odls.live(2), 1);
    h.odls.kill_job(2, Duration::from_secs(60));
    h.wait_done(&[(2, 0)]).await;
    assert_eq!(h.procs[&(2, 0)].status, Some(ExitKind::Signal(libc::SIGTERM)));
}

/// The leader exited but a background child keeps stdout open: the proc stays live (a zombie,
/// not reaped), no Exited yet, and kill_job still reaches the child through the group.
#[tokio::test]
async fn an_exited_leader_with_a_child_holding_stdout_stays_killable() {
    let mut h = Harness::new(4096);
    h.odls.spawn(sh(1, 0, "sleep 100 & echo started"));
    h.wait_stdout((1, 0), "started").await;
    let pid = h.procs[&(1, 0)].pid.unwrap();
    // Wait until the leader is a zombie (the bound only guards against a hang).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while proc_state(pid) != Some('Z') {
        assert!(std::time::Instant::now() < deadline, "leader {pid} never became a zombie: {:?}", proc_state(pid));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(h.odls.live(1), 1);
    assert!(h.procs[&(1, 0)].status.is_none());
    h.odls.kill_job(1, Duration::from_secs(60));
    assert_eq!(h.run_to_end((1, 0)).await, ExitKind::Code(0));
    assert_eq!(proc_state(pid), None, "reaped");
    assert_eq!(h.odls.live(1), 0);
}

#[tokio::test]
async fn kill_all_stops_every_job() {
    let mut h = Harness::new(4096);
    h.odls.spawn(spec(1, 0, &["sleep", "100"]));
    h.odls.spawn(spec(1, 1, &["sleep", "100"]));
    h.odls.spawn(spec(2, 0, &["sleep", "100"]));
    assert_eq!((h.odls.live(1), h.odls.live(2), h.odls.live(3)), (2, 1, 0));
    h.odls.kill_all();
    h.wait_done(&[(1, 0), (1, 1), (2, 0)]).await;
    for p in h.procs.values() {
        assert_eq!(p.status, Some(ExitKind::Signal(libc::SIGKILL)));
    }
    assert_eq!((h.odls.live(1), h.odls.live(2)), (0, 0));
}

/// A rank cannot be started twice while it runs; forget_job kills what is left.
#[tokio::test]
async fn duplicate_rank_is_refused_and_forget_job_kills_leftovers() {
    let mut h = Harness::new(4096);
    h.odls.spawn(spec(1, 0, &["sleep", "100"]));
    let started = h.next_raw().await;
    assert!(matches!(started, OdlsEvent::Started { jobid: 1, rank: 0, .. }), "{started:?}");
    h.odls.spawn(spec(1, 0, &["sleep", "100"]));
    // A caller bug, refused without touching the running proc (read raw: the ordering check
    // would reject a LaunchFailed after Started).
    match h.next_raw().await {
        OdlsEvent::LaunchFailed { jobid: 1, rank: 0, error } => {
            assert_eq!(error, "node n3: cannot start rank 0 of job 1: that rank is already running here")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.odls.live(1), 1);
    h.odls.forget_job(1);
    assert_eq!(h.odls.live(1), 0);
    loop {
        if let OdlsEvent::Exited { status, .. } = h.next_raw().await {
            assert_eq!(status, ExitKind::Signal(libc::SIGKILL));
            break;
        }
    }
}
