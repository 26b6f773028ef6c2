//! The job, recovery, spawn and termination rules on the in-memory harness
//! (`crate::harness::Net`): real nodes, simulated processes and prun streams.

use dvm_proto::job::{AppContext, JobSpec};
use dvm_proto::pmixworker::{self as wire, worker_event::Body as Ev};

use super::{Control, Reply};
use crate::harness::{job, Net, Program};
use crate::jobs::{LOST_EXIT, TERMINATED_EXIT, TIMEOUT_EXIT};
use crate::{pmixdef, Exit, Input};

const S: u64 = 1_000_000_000;

fn exit(code: i32, ms: u64) -> Vec<String> {
    Program::Exit { code, after_ns: ms * 1_000_000 }.argv()
}

fn hang() -> Vec<String> {
    Program::Hang.argv()
}

/// Nothing of any job is left anywhere: no proc, no local job, no namespace, no table entry.
fn assert_clean(net: &Net) {
    assert_eq!(net.live_procs(), 0, "no proc is left");
    for (r, n) in net.nodes.iter().enumerate() {
        let Some(n) = n else { continue };
        assert!(n.local_jobs().is_empty(), "daemon {r} holds no local job");
        assert!(n.host().namespaces.is_empty(), "daemon {r} holds no PMIx namespace");
        assert!(n.jobs().is_none_or(|j| j.is_empty()), "the HNP's table is empty");
    }
    for s in &net.shells {
        assert!(s.errors.is_empty(), "{:?}", s.errors);
    }
}

#[test]
fn a_job_runs_on_every_daemon_and_ends_with_status_0_at_radix_2_and_64() {
    for radix in [2, 64] {
        let mut net = Net::boot(7, radix, 1);
        let c = net.launch(job(7, exit(0, 5)));
        net.run();
        assert_eq!(net.ended(c), Some((0, String::new())));
        let started: usize = net.shells.iter().map(|s| s.started.len()).sum();
        assert_eq!(started, 7, "one proc per daemon");
        assert_clean(&net);
    }
}

#[test]
fn the_first_failing_rank_is_named_and_the_rest_of_its_job_is_killed() {
    let mut net = Net::boot(4, 2, 2);
    let spec = JobSpec {
        apps: vec![
            AppContext { argv: hang(), np: 5, ..Default::default() },
            AppContext { argv: exit(3, 20), np: 1, ..Default::default() },
        ],
        ..Default::default()
    };
    let c = net.launch(spec);
    net.run();
    let (code, why) = net.ended(c).expect("the job ended");
    assert_eq!(code, 3);
    assert!(why.starts_with("rank 5 on node n2 (pid "), "{why}");
    assert!(why.ends_with(") exited with status 3"), "{why}");
    assert_clean(&net);
}

#[test]
fn a_lost_daemon_fails_its_jobs_naming_daemon_node_and_ranks_and_spares_other_jobs() {
    let mut net = Net::boot(7, 2, 1);
    let c = net.launch(job(7, hang()));
    net.run();
    assert_eq!(net.live_procs(), 7);
    net.kill(3);
    net.run();
    let (code, why) = net.ended(c).expect("the job ended");
    assert_eq!(code, LOST_EXIT);
    assert_eq!(why, "daemon 3 on node n3 was lost with ranks [3] of job 1");
    assert!(net.shells[0].said.iter().any(|s| s.starts_with("dvmd: daemon 3 on host n3 was lost")));
    // The DVM goes on: the next job runs on the survivors.
    let c2 = net.launch(job(6, exit(0, 1)));
    net.run();
    assert_eq!(net.ended(c2), Some((0, String::new())));
    assert_clean(&net);
}

/// Two daemons killed together: the job's one sentence names both, each with its node and
/// ranks, never only the first.
#[test]
fn daemons_lost_together_are_all_named() {
    let mut net = Net::boot(7, 2, 1);
    let c = net.launch(job(7, hang()));
    net.run();
    net.kill(2);
    net.kill(5);
    net.run();
    let (code, why) = net.ended(c).expect("the job ended");
    assert_eq!(code, LOST_EXIT);
    let told = format!("{why}\n{}", net.shells[0].notices(c).join("\n"));
    for (d, host, rank) in [(2, "n2", 2), (5, "n5", 5)] {
        assert!(
            told.contains(&format!("{d} on node {host} (ranks [{rank}])"))
                || told.contains(&format!("daemon {d} on node {host} was lost with ranks [{rank}]")),
            "daemon {d} unnamed: {told}"
        );
    }
    assert_clean(&net);
}

#[test]
fn a_timeout_kills_the_job_with_status_124_and_says_so() {
    let mut net = Net::boot(3, 2, 1);
    let c = net.launch(JobSpec { timeout_s: 0.5, ..job(3, hang()) });
    net.run_for(S / 4);
    assert_eq!(net.ended(c), None, "still running before its timeout");
    net.run();
    assert_eq!(net.ended(c), Some((TIMEOUT_EXIT, "job 1 exceeded its --timeout of 0.5 s and was killed".into())));
    assert_clean(&net);
}

#[test]
fn a_job_whose_prun_went_away_is_killed() {
    let mut net = Net::boot(3, 2, 1);
    let c = net.launch(job(3, hang()));
    net.run();
    net.with(0, |n, now| n.handle_prun(now, super::PrunEvent::Gone(c)));
    net.run();
    assert_eq!(net.ended(c), Some((1, "job 1: prun went away".into())));
    assert_clean(&net);
}

#[test]
fn terminate_ends_running_jobs_first_then_every_daemon() {
    let mut net = Net::boot(5, 2, 1);
    let c = net.launch(job(5, hang()));
    net.run();
    let t = net.control(Control::Terminate);
    net.run();
    let (code, why) = net.ended(c).expect("the job ended");
    assert_eq!((code, why.as_str()), (TERMINATED_EXIT, "the DVM was terminated (pterm) while job 1 ran"));
    // The job was ended first (its prun told why, its procs killed), then the daemons.
    assert_eq!(net.shells[0].notices(c), vec![why.clone()]);
    assert!(net.shells[0].replies.iter().any(|(tok, r)| *tok == t && matches!(r, Reply::Terminate(x) if x.ok)));
    for (r, s) in net.shells.iter().enumerate() {
        assert_eq!(s.exit, Some(Exit::Terminated), "daemon {r}");
    }
    assert_eq!(net.live_procs(), 0);
    assert!(net.nodes.iter().all(Option::is_none), "every daemon ended");
}

#[test]
fn a_recovering_job_goes_on_after_a_rank_fails_and_exits_with_that_rank_status() {
    let mut net = Net::boot(3, 2, 1);
    let spec = JobSpec {
        enable_recovery: true,
        apps: vec![
            AppContext { argv: exit(7, 1), np: 1, ..Default::default() },
            AppContext { argv: exit(0, 50), np: 2, ..Default::default() },
        ],
        ..Default::default()
    };
    let c = net.launch(spec);
    net.run_for(S / 100);
    assert_eq!(net.ended(c), None, "it goes on");
    let notices = net.shells[0].notices(c);
    assert!(notices.iter().any(|n| n.ends_with("job 1 goes on (--enable-recovery)")), "{notices:?}");
    net.run();
    let (code, why) = net.ended(c).expect("ended");
    assert_eq!(code, 7);
    assert!(why.starts_with("rank 0 on node n0"), "{why}");
    // Every rank still running was told: one PMIx event reached the server of each daemon
    // hosting one (daemon 0's only rank had ended), naming rank 0.
    for d in [1, 2] {
        let events = &net.node(d).host().events;
        assert_eq!(events.len(), 1, "daemon {d}");
        assert_eq!((events[0].status, events[0].source.as_ref().map(|p| p.rank)), (pmixdef::ERR_PROC_ABORTED, Some(0)));
    }
    assert!(net.node(0).host().events.is_empty(), "no rank of the job is left on daemon 0");
    assert_clean(&net);
}

#[test]
fn an_aborting_rank_that_does_not_exit_fails_its_job_after_the_grace() {
    let mut net = Net::boot(3, 2, 1);
    let c = net.launch(job(3, hang()));
    net.run();
    let abort = wire::Abort { proc: Some(net.proc(1, 2)), status: 9, message: String::new() };
    net.upcall(2, 5, Ev::Abort(abort));
    assert_eq!(net.pmix_replies(2), vec![(5, 0, bytes::Bytes::new())], "answered at once");
    net.run_for(S);
    assert_eq!(net.ended(c), None, "within its grace");
    net.run();
    let (code, why) = net.ended(c).expect("ended");
    assert_eq!(code, 9);
    assert!(why.starts_with("rank 2 on node n2 called MPI_Abort with code 9 and did not exit within"), "{why}");
    assert_clean(&net);
}

/// A spawn upcall by rank 0 of job 1 for `np` hanging procs.
fn spawn_upcall(net: &Net, np: i32) -> Ev {
    let argv = hang();
    let app = wire::SpawnApp { cmd: argv[0].clone(), argv, maxprocs: np, ..Default::default() };
    Ev::Spawn(wire::Spawn { proc: Some(net.proc(1, 0)), job_info: Vec::new(), apps: vec![app] })
}

/// Daemon `daemon`'s answer to upcall `reply`: (status, data as text).
fn answer(net: &Net, daemon: u32, reply: u64) -> Option<(i32, String)> {
    let replies = net.pmix_replies(daemon);
    replies.into_iter().find(|r| r.0 == reply).map(|(_, st, data)| (st, String::from_utf8_lossy(&data).into_owned()))
}

#[test]
fn a_spawn_takes_free_slots_answers_once_started_and_ends_with_its_parent() {
    let mut net = Net::boot(4, 2, 2);
    let c = net.launch(job(4, hang()));
    net.run();
    net.upcall(1, 7, spawn_upcall(&net, 4));
    net.run();
    let child = net.proc(2, 0).nspace;
    assert_eq!(answer(&net, 1, 7), Some((0, child)), "answered with the child's namespace after its procs started");
    assert_eq!(net.live_procs(), 8);
    // No slot is left: the next spawn is refused by name, and nothing starts.
    net.upcall(1, 8, spawn_upcall(&net, 1));
    net.run();
    assert_eq!(answer(&net, 1, 8).map(|a| a.0), Some(pmixdef::ERR_JOB_FAILED_TO_MAP));
    let notices = net.shells[0].notices(c);
    assert!(notices.iter().any(|n| n.starts_with("MPI_Comm_spawn by rank 0 of job 1 failed: ")), "{notices:?}");
    assert_eq!(net.live_procs(), 8);
    // The parent's failure takes the spawned job with it; prun hears one end.
    net.kill(3);
    net.run();
    assert_eq!(net.ended(c).map(|e| e.0), Some(LOST_EXIT));
    assert_eq!(net.live_procs(), 0);
    assert_clean(&net);
}

#[test]
fn a_refused_launch_names_the_slots_and_starts_nothing() {
    let mut net = Net::boot(2, 2, 1);
    let c = net.launch(job(5, hang()));
    net.run();
    let (code, why) = net.ended(c).expect("refused");
    assert_eq!(code, 1);
    assert!(why.contains("slots"), "{why}");
    assert_eq!(net.shells.iter().map(|s| s.started.len()).sum::<usize>(), 0);
}

#[test]
fn a_job_whose_launch_lost_a_relay_still_ends_and_starts_nothing_after_its_kill() {
    for victim in [1, 2] {
        let mut net = Net::boot(7, 2, 1);
        let c = net.launch(job(7, exit(0, 50)));
        // The relay dies before the launch passes through it: its subtree hears the maps again
        // after the repair, and its residuals only if the HNP sends them again.
        net.kill(victim);
        net.run();
        let (code, why) = net.ended(c).expect("the job ended");
        assert_eq!(code, LOST_EXIT);
        assert!(why.starts_with(&format!("daemon {victim} on node n{victim} was lost")), "{why}");
        assert_clean(&net);
    }
}

#[test]
fn a_daemon_started_again_is_told_it_cannot_rejoin_before_and_after_its_loss_is_noticed() {
    for noticed in [false, true] {
        let mut net = Net::boot(5, 2, 1);
        net.kill(3);
        if noticed {
            net.run();
            assert!(!net.node(0).router().topology().is_alive(3), "the HNP declared daemon 3 dead");
        }
        net.restart(3, 424_242);
        net.run();
        assert!(!net.alive(3), "the new incarnation ended");
        let why = match &net.shells[3].exit {
            Some(Exit::Evicted(why)) => why.clone(),
            other => panic!("daemon 3 ended {other:?}"),
        };
        assert!(why.contains("cannot rejoin"), "{why}");
        // The DVM goes on without it.
        let c = net.launch(job(4, exit(0, 1)));
        net.run();
        assert_eq!(net.ended(c), Some((0, String::new())));
    }
}

#[test]
fn a_launch_while_the_dvm_terminates_is_refused_and_starts_nothing() {
    let mut net = Net::boot(3, 2, 1);
    let c = net.launch(job(3, hang()));
    net.run_for(S / 1000);
    // Its job's kill is under way when the next prun comes.
    net.control(Control::Terminate);
    let late = net.launch(job(1, exit(0, 1)));
    net.run();
    assert_eq!(net.ended(late), Some((1, "the DVM is terminating".into())));
    assert_eq!(net.ended(c).map(|e| e.0), Some(TERMINATED_EXIT));
    let started: usize = net.shells.iter().map(|s| s.started.len()).sum();
    assert_eq!(started, 3, "only the first job's procs ever started");
}

#[test]
fn pterm_ends_the_hnp_after_its_deadline_when_termination_cannot_reach_a_daemon() {
    let mut net = Net::boot(5, 2, 1);
    // Daemon 4 is cut off without a trace: TERMINATE never reaches it, and no loss is noticed.
    net.silence(4);
    let t = net.control(Control::Terminate);
    net.run();
    assert_eq!(net.shells[0].exit, Some(Exit::Terminated), "the HNP ended");
    assert!(net.shells[0].said.iter().any(|s| s.contains("TERMINATE was not acknowledged by every daemon")));
    let reply = net.shells[0].replies.iter().find(|(tok, _)| *tok == t).map(|(_, r)| r);
    assert!(matches!(reply, Some(Reply::Terminate(r)) if !r.ok), "{reply:?}");
    for r in 1..4 {
        assert_eq!(net.shells[r].exit, Some(Exit::Terminated), "daemon {r} got TERMINATE");
    }
}

#[test]
fn a_daemon_declared_dead_that_never_hears_it_loses_the_hnp_and_ends() {
    let mut net = Net::boot(5, 2, 1);
    // Its parent wrongly reports it lost, and the HNP's notice never reaches it (a new
    // connection that cannot be made); its old connection to the HNP is still up.
    net.drop_frames(0, 3);
    net.report_lost(1, 3);
    net.run();
    assert!(!net.node(0).router().topology().is_alive(3), "the HNP declared daemon 3 dead");
    assert!(!net.alive(3), "daemon 3 ended instead of running on outside the DVM");
    assert!(matches!(net.shells[3].exit, Some(Exit::LostHnp(_))), "{:?}", net.shells[3].exit);
    let c = net.launch(job(4, exit(0, 1)));
    net.run();
    assert_eq!(net.ended(c), Some((0, String::new())));
}

#[test]
fn a_job_launched_while_a_relay_lags_a_repair_runs_on_every_survivor() {
    // 16 daemons at radix 2: 4 (children 8, 12) is a child of 2 (children 4, 6). Once 2 and 4
    // are lost, 6 takes 2's place and 8 takes 4's, with 12 below it. Daemon 8 missed the op
    // before the loss (its parent 4 never passed it on), so its DAEMON_DIED waits behind a gap
    // while the new job's residuals reach it from 6.
    let mut net = Net::boot(16, 2, 1);
    net.drop_frames(4, 8);
    let payload = bytes::Bytes::from_static(b"never reaches daemon 8 through 4");
    net.with(0, |n, now| n.handle_input(now, Input::Xcast { tag: dvm_grpcomm::tags::USER, payload }));
    net.run_for(S / 1000);
    net.kill(2);
    net.kill(4);
    while [2, 4].iter().any(|&r| net.node(0).router().topology().is_alive(r)) {
        assert!(net.step(), "the HNP declares daemons 2 and 4 dead");
    }
    assert_eq!(net.node(8).router().topology().parent(), Some(4), "daemon 8 has not applied the loss");
    let c = net.launch(job(14, exit(0, 5)));
    net.run();
    assert_eq!(net.ended(c), Some((0, String::new())), "the job ended");
    let started: usize = net.shells.iter().map(|s| s.started.len()).sum();
    assert_eq!(started, 14, "one proc on each survivor");
    assert_clean(&net);
}
