//! The shared DVM's rules on the in-memory harness: one set of slot books, the FIFO queue,
//! cancel, detach/attach and arrays.

use dvm_proto::control::{job_event, CancelRequest, StackTracesReply};
use dvm_proto::job::{ArraySpec, JobSpec};
use dvm_proto::pmixworker::{self as wire, worker_event::Body as Ev};

use super::{Control, Reply};
use crate::harness::{job, Net, Program};
use crate::jobs::queue::{ARRAY_INDEX_VAR, MAX_ARRAY};
use crate::jobs::tools::CANCELLED_EXIT;
use crate::jobs::ClientId;

const MS: u64 = 1_000_000;

fn exit(code: i32, ms: u64) -> Vec<String> {
    Program::Exit { code, after_ns: ms * MS }.argv()
}

fn hang() -> Vec<String> {
    Program::Hang.argv()
}

/// The position and reason a prun was told when its job was queued.
fn queued(net: &Net, c: ClientId) -> Option<(u32, String)> {
    net.shells[0].events(c).into_iter().find_map(|e| match e {
        job_event::Event::Queued(q) => Some((q.position, q.reason)),
        _ => None,
    })
}

/// Procs ever started for `jobid`, on every daemon.
fn started(net: &Net, jobid: u32) -> usize {
    net.shells.iter().map(|s| s.started.iter().filter(|(j, _)| *j == jobid).count()).sum()
}

fn peak(net: &Net) -> usize {
    net.shells.iter().map(|s| s.peak).max().unwrap_or(0)
}

fn cancel(net: &mut Net, jobids: Vec<u32>, all: bool, uid: u32) -> (Vec<u32>, Vec<String>) {
    let t = net.control(Control::Cancel(CancelRequest { jobids, all, uid }));
    net.run();
    net.shells[0]
        .replies
        .iter()
        .find_map(|(tok, r)| match r {
            Reply::Cancel(c) if *tok == t => Some((c.cancelled.clone(), c.errors.clone())),
            _ => None,
        })
        .expect("a cancel reply")
}

#[test]
fn a_job_that_does_not_fit_waits_and_starts_when_slots_free_never_sharing_one() {
    let mut net = Net::boot(2, 2, 1);
    let a = net.launch(job(2, exit(0, 50)));
    let b = net.launch(job(2, exit(0, 50)));
    net.run_for(10 * MS);
    let (pos, why) = queued(&net, b).expect("the second job waits");
    assert_eq!(pos, 1);
    assert_eq!(why, "it needs 2 slots; the DVM has 2 slots, 2 in use (job 1: 2)");
    assert_eq!(started(&net, 2), 0, "nothing of the queued job runs");
    net.run();
    assert_eq!(net.ended(a), Some((0, String::new())));
    assert_eq!(net.ended(b), Some((0, String::new())));
    assert_eq!(started(&net, 2), 2, "it ran once the first ended");
    assert_eq!(peak(&net), 1, "no daemon ever ran two procs on its one slot");
}

#[test]
fn the_queue_is_fifo_a_small_job_never_passes_a_blocked_larger_one() {
    let mut net = Net::boot(2, 2, 1);
    let a = net.launch(job(1, hang()));
    let b = net.launch(job(2, exit(0, 5)));
    let c = net.launch(job(1, exit(0, 5)));
    net.run_for(10 * MS);
    assert_eq!(queued(&net, b).map(|q| q.0), Some(1));
    assert_eq!(queued(&net, c).map(|q| q.0), Some(2), "it would fit the free slot, but waits its turn");
    assert_eq!(started(&net, 3), 0);
    assert_eq!(cancel(&mut net, vec![1], false, 0), (vec![1], vec![]));
    assert_eq!(net.ended(a).map(|e| e.0), Some(CANCELLED_EXIT));
    assert_eq!(net.ended(b), Some((0, String::new())));
    assert_eq!(net.ended(c), Some((0, String::new())));
    // Job 3 started only once job 2 had ended: never two procs on a slot.
    assert_eq!(peak(&net), 1);
}

#[test]
fn a_job_that_can_never_fit_or_may_not_wait_is_refused_at_once_naming_the_slots() {
    let mut net = Net::boot(2, 2, 2);
    let big = net.launch(job(5, exit(0, 1)));
    net.run_for(MS);
    let (code, why) = net.ended(big).expect("refused at once");
    assert_eq!(code, 1);
    assert!(why.contains("only 4 slots on 2 nodes"), "{why}");
    let _a = net.launch(job(3, hang()));
    let nq = net.launch(JobSpec { no_queue: true, ..job(2, exit(0, 1)) });
    net.run_for(MS);
    let (code, why) = net.ended(nq).expect("refused at once");
    assert_eq!(code, 1);
    assert_eq!(
        why,
        "job 3 does not fit now and --no-queue was given: it needs 2 slots; the DVM has 4 slots, 3 in use (job 2: 3)"
    );
    assert_eq!(started(&net, 3), 0);
}

#[test]
fn an_oversubscribed_job_shares_busy_slots_without_waiting() {
    let mut net = Net::boot(2, 2, 1);
    let _a = net.launch(job(2, hang()));
    let b = net.launch(JobSpec { oversubscribe: true, ..job(2, exit(0, 1)) });
    net.run();
    assert_eq!(net.ended(b), Some((0, String::new())));
    assert_eq!(queued(&net, b), None);
    assert_eq!(peak(&net), 2);
}

#[test]
fn a_queued_job_whose_prun_goes_away_leaves_the_queue_and_never_runs() {
    let mut net = Net::boot(2, 2, 1);
    let a = net.launch(job(2, exit(0, 50)));
    let b = net.launch(job(2, exit(0, 1)));
    net.run_for(MS);
    net.with(0, |n, now| n.handle_prun(now, super::PrunEvent::Gone(b)));
    net.run();
    assert_eq!(net.ended(a), Some((0, String::new())));
    assert_eq!(started(&net, 2), 0);
    assert_eq!(net.node(0).jobs().map(|j| j.queued()), Some(0));
}

#[test]
fn cancel_names_unknown_ended_and_other_users_jobs_and_all_cancels_only_ones_own() {
    let mut net = Net::boot(2, 2, 1);
    let a = net.launch(JobSpec { uid: 1000, ..job(1, hang()) });
    let b = net.launch(JobSpec { uid: 1001, ..job(1, hang()) });
    let c = net.launch(JobSpec { uid: 1000, ..job(2, hang()) });
    net.run_for(10 * MS);
    let (done, errs) = cancel(&mut net, vec![2, 9], false, 1000);
    assert!(done.is_empty());
    assert_eq!(errs, vec!["job 2 belongs to user 1001, not to user 1000".to_string(), "no job 9 in this DVM".into()]);
    let (done, errs) = cancel(&mut net, vec![], true, 1000);
    assert_eq!((done, errs), (vec![3, 1], vec![]));
    assert_eq!(net.ended(c).map(|e| e.0), Some(CANCELLED_EXIT), "the queued one left the queue");
    assert_eq!(net.ended(a), Some((CANCELLED_EXIT, "job 1 was cancelled (by user 1000)".into())));
    assert_eq!(net.ended(b), None, "another user's job runs on");
    assert_eq!(started(&net, 3), 0);
    let (_, errs) = cancel(&mut net, vec![1], false, 1000);
    assert_eq!(errs, vec!["job 1 has already ended".to_string()]);
}

#[test]
fn a_detached_job_outlives_its_prun_keeps_its_output_and_can_be_attached() {
    let mut net = Net::boot(2, 2, 1);
    let print = Program::Print { text: "hello".into(), after_ns: 50 * MS }.argv();
    let d = net.launch(JobSpec { detach: true, ..job(2, print) });
    net.run_for(MS);
    net.with(0, |n, now| n.handle_prun(now, super::PrunEvent::Gone(d)));
    net.run_for(10 * MS);
    assert_eq!(net.live_procs(), 2, "the job runs on without its prun");
    let at = ClientId(900);
    net.with(0, |n, now| n.handle_control(now, 0, Control::Attach(1, 0, at)));
    net.run();
    let outs: Vec<_> = net.shells[0]
        .events(at)
        .into_iter()
        .filter_map(|e| match e {
            job_event::Event::Output(o) => Some(o.data),
            _ => None,
        })
        .collect();
    assert_eq!(outs.len(), 2, "both ranks' kept output replayed");
    assert_eq!(net.ended(at), Some((0, String::new())));
    // Ended: attaching again replays it and the end.
    let again = ClientId(901);
    net.with(0, |n, now| n.handle_control(now, 0, Control::Attach(1, 0, again)));
    net.run();
    assert_eq!(net.ended(again), Some((0, String::new())));
    let nope = ClientId(902);
    net.with(0, |n, now| n.handle_control(now, 0, Control::Attach(7, 0, nope)));
    assert_eq!(net.ended(nope), Some((1, "no job 7 in this DVM".into())));
}

#[test]
fn an_array_runs_every_index_once_in_order_and_ends_with_a_summary() {
    let mut net = Net::boot(2, 2, 1);
    for sh in &mut net.shells {
        sh.keep_specs = true;
    }
    let a = net.launch(JobSpec { array: Some(ArraySpec { first: 0, last: 9 }), ..job(1, exit(0, 3)) });
    net.run();
    assert_eq!(net.ended(a), Some((0, String::new())));
    let mut idx: Vec<u32> = Vec::new();
    for e in net.shells[0].events(a) {
        if let job_event::Event::Started(s) = e {
            assert_eq!(s.array, 1, "each element names its array");
            idx.push(s.index);
        }
    }
    assert_eq!(idx, (0..10).collect::<Vec<_>>(), "every index once, in order");
    // Each element's proc has its own index in its environment.
    let mut seen: Vec<u32> = net
        .shells
        .iter()
        .flat_map(|s| s.specs.iter())
        .filter_map(|p| p.env.iter().find(|(k, _)| k == ARRAY_INDEX_VAR).map(|(_, v)| v.parse().unwrap()))
        .collect();
    seen.sort();
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    assert_eq!(peak(&net), 1);
    assert_eq!(net.node(0).jobs().map(|j| j.len()), Some(0));
}

#[test]
fn an_array_sums_up_its_failures_and_a_too_large_or_reversed_one_is_refused() {
    let mut net = Net::boot(1, 2, 4);
    let a = net.launch(JobSpec { array: Some(ArraySpec { first: 5, last: 7 }), ..job(1, exit(3, 1)) });
    net.run();
    let (code, why) = net.ended(a).expect("ended");
    assert_eq!(code, 3);
    assert!(why.starts_with("array 1: 3 of 3 jobs failed; the first, index 5: rank 0 on node n0"), "{why}");
    let big = net.launch(JobSpec { array: Some(ArraySpec { first: 0, last: MAX_ARRAY as u32 }), ..job(1, exit(0, 1)) });
    let rev = net.launch(JobSpec { array: Some(ArraySpec { first: 3, last: 2 }), ..job(1, exit(0, 1)) });
    net.run();
    assert!(net.ended(big).unwrap().1.contains("more than the 100000 an array may hold"));
    assert_eq!(net.ended(rev).unwrap().1, "--array 3-2: the first index is above the last");
}

#[test]
fn spawned_and_prun_jobs_share_the_books_and_a_refused_spawn_names_the_holders() {
    let mut net = Net::boot(2, 2, 1);
    let a = net.launch(job(1, hang()));
    net.run();
    let argv = exit(0, 50);
    let app = wire::SpawnApp { cmd: argv[0].clone(), argv, maxprocs: 1, ..Default::default() };
    let spawn = wire::Spawn { proc: Some(net.proc(1, 0)), job_info: Vec::new(), apps: vec![app] };
    net.upcall(0, 7, Ev::Spawn(spawn.clone()));
    net.run_for(10 * MS);
    // The spawned job holds the other slot: a prun job waits for it.
    let b = net.launch(job(1, exit(0, 1)));
    net.run_for(MS);
    assert_eq!(queued(&net, b).map(|q| q.0), Some(1));
    // A second spawn finds no slot, and says who holds them.
    net.upcall(0, 8, Ev::Spawn(spawn));
    net.run_for(MS);
    let notices = net.shells[0].notices(a);
    assert!(notices.iter().any(|n| n.ends_with("(the DVM has 2 slots, 2 in use (job 1: 1, job 2: 1))")), "{notices:?}");
    net.run_for(100 * MS);
    assert_eq!(net.ended(b), Some((0, String::new())), "it ran once the spawned job ended");
    assert_eq!(peak(&net), 1);
}

fn stacks_reply(net: &Net, token: u64) -> Option<Result<StackTracesReply, String>> {
    net.shells[0].replies.iter().find_map(|(t, r)| match r {
        Reply::StackTraces(s) if *t == token => Some(s.clone()),
        _ => None,
    })
}

#[test]
fn stack_traces_come_from_every_rank_in_order_and_a_lost_daemon_is_named() {
    let mut net = Net::boot(4, 2, 1);
    let _c = net.launch(job(4, hang()));
    net.run_for(10 * MS);
    let t = net.control(Control::StackTraces(1, 0));
    net.run_for(10 * MS);
    let reply = stacks_reply(&net, t).expect("answered").expect("a running job");
    let ranks: Vec<(u32, String)> = reply.stacks.iter().map(|s| (s.rank, s.node.clone())).collect();
    assert_eq!(ranks, vec![(0, "n0".into()), (1, "n1".into()), (2, "n2".into()), (3, "n3".into())]);
    assert!(reply.stacks.iter().all(|s| s.text.starts_with("#0 ")));
    // A daemon that cannot answer: the query ends naming it, with the others' stacks.
    net.silence(3);
    let t = net.control(Control::StackTraces(1, 0));
    net.run_for(100 * MS);
    assert_eq!(stacks_reply(&net, t), None, "still waiting for daemon 3");
    net.run();
    let reply = stacks_reply(&net, t).expect("answered").expect("ok");
    assert_eq!(reply.stacks.len(), 3);
    assert_eq!(reply.errors.len(), 1);
    assert!(reply.errors[0].starts_with("daemon 3 on node n3 "), "{:?}", reply.errors);
    let t = net.control(Control::StackTraces(77, 0));
    assert_eq!(stacks_reply(&net, t), Some(Err("no job 77 in this DVM".into())));
}

#[test]
fn a_timeout_with_get_stack_traces_shows_every_rank_then_kills() {
    let mut net = Net::boot(2, 2, 1);
    let c = net.launch(JobSpec { timeout_s: 0.5, get_stack_traces: true, ..job(2, hang()) });
    net.run();
    assert_eq!(net.ended(c), Some((124, "job 1 exceeded its --timeout of 0.5 s and was killed".into())));
    let notices = net.shells[0].notices(c);
    assert_eq!(notices[0], "job 1 exceeded its --timeout of 0.5 s: its ranks' stack traces follow");
    assert!(notices[1].starts_with("stack of rank 0 on node n0 (pid "), "{notices:?}");
    assert!(notices[2].starts_with("stack of rank 1 on node n1 (pid "), "{notices:?}");
    assert_eq!(net.live_procs(), 0);
}

#[test]
fn a_job_behind_a_head_that_leaves_the_queue_starts_at_once() {
    // Cancelled head, then a head whose prun went away: what waited behind starts without
    // waiting for a running job to end.
    for gone in [false, true] {
        let mut net = Net::boot(2, 2, 1);
        let _a = net.launch(job(1, hang()));
        let b = net.launch(job(2, exit(0, 5)));
        let _c = net.launch(job(1, exit(0, 5)));
        net.run_for(10 * MS);
        assert_eq!(started(&net, 3), 0);
        if gone {
            net.with(0, |n, now| n.handle_prun(now, super::PrunEvent::Gone(b)));
        } else {
            assert_eq!(cancel(&mut net, vec![2], false, 0), (vec![2], vec![]));
        }
        net.run_for(10 * MS);
        assert_eq!(started(&net, 3), 1, "gone={gone}");
        assert_eq!(peak(&net), 1);
    }
}

#[test]
fn an_array_cancelled_midway_ends_once_and_starts_nothing_more() {
    let mut net = Net::boot(2, 2, 1);
    let a = net.launch(JobSpec { array: Some(ArraySpec { first: 0, last: 99 }), ..job(1, exit(0, 20)) });
    net.run_for(50 * MS);
    let before: usize = net.shells.iter().map(|s| s.started.len()).sum();
    assert!((2..100).contains(&before), "{before} started before the cancel");
    assert_eq!(cancel(&mut net, vec![1], false, 0), (vec![1], vec![]));
    net.run();
    let after: usize = net.shells.iter().map(|s| s.started.len()).sum();
    assert_eq!(before, after, "nothing of the array started after its cancel");
    let (code, why) = net.ended(a).expect("the array ended");
    assert_eq!(code, CANCELLED_EXIT);
    assert!(why.starts_with("array 1: ") && why.contains("was cancelled"), "{why}");
    let ends = net.shells[0].events(a).iter().filter(|e| matches!(e, job_event::Event::Ended(x) if !x.element)).count();
    assert_eq!(ends, 1, "the array's end is heard once");
    assert_eq!(net.live_procs(), 0);
}

#[test]
fn terminate_ends_queued_jobs_unrun_and_a_lost_daemon_refuses_a_head_that_no_longer_fits() {
    let mut net = Net::boot(3, 2, 1);
    let _a = net.launch(job(1, hang()));
    let big = net.launch(job(3, exit(0, 1)));
    let small = net.launch(job(1, exit(0, 1)));
    net.run_for(10 * MS);
    net.kill(2);
    net.run();
    let (code, why) = net.ended(big).expect("refused");
    assert_eq!(code, 1);
    assert!(why.contains("only 2 slots on 2 nodes"), "{why}");
    assert_eq!(net.ended(small), Some((0, String::new())), "the next one ran");

    let mut net = Net::boot(2, 2, 1);
    let _a = net.launch(job(2, hang()));
    let q = net.launch(job(2, exit(0, 1)));
    net.run_for(10 * MS);
    net.control(Control::Terminate);
    net.run();
    let (code, why) = net.ended(q).expect("ended");
    assert_eq!((code, why.as_str()), (125, "the DVM was terminated (pterm) while the job was queued"));
    assert_eq!(started(&net, 2), 0);
}

#[test]
fn an_oversubscribed_job_does_not_wait_behind_the_queue() {
    let mut net = Net::boot(2, 2, 1);
    let _a = net.launch(job(2, hang()));
    let _b = net.launch(job(2, exit(0, 1)));
    let c = net.launch(JobSpec { oversubscribe: true, ..job(1, exit(0, 1)) });
    net.run_for(10 * MS);
    assert_eq!(queued(&net, c), None);
    assert_eq!(net.ended(c), Some((0, String::new())));
}

#[test]
fn a_queued_detached_job_can_be_attached_and_is_followed_from_its_start() {
    let mut net = Net::boot(2, 2, 1);
    let a = net.launch(job(2, exit(0, 30)));
    let print = Program::Print { text: "late".into(), after_ns: MS }.argv();
    let d = net.launch(JobSpec { detach: true, ..job(2, print) });
    net.run_for(MS);
    net.with(0, |n, now| n.handle_prun(now, super::PrunEvent::Gone(d)));
    let at = ClientId(900);
    net.with(0, |n, now| n.handle_control(now, 0, Control::Attach(2, 0, at)));
    net.run();
    assert_eq!(net.ended(a), Some((0, String::new())));
    let items = net.shells[0].clients.get(&at).cloned().unwrap_or_default();
    let outs = items.iter().filter(|f| matches!(f, crate::jobs::Forward::Output { .. })).count();
    assert_eq!(outs, 2);
    assert_eq!(net.ended(at), Some((0, String::new())));
}

#[test]
fn another_users_job_cannot_be_signalled_attached_or_traced() {
    let mut net = Net::boot(2, 2, 1);
    let _a = net.launch(JobSpec { uid: 1000, detach: true, ..job(1, hang()) });
    net.run_for(10 * MS);
    let t = net.control(Control::Signal(dvm_proto::control::SignalRequest { jobid: 1, signal: 15, uid: 1001 }));
    net.run_for(MS);
    let refused = net.shells[0].replies.iter().any(|(tok, r)| {
        *tok == t && matches!(r, Reply::Signal(s) if !s.ok && s.error == "job 1 belongs to user 1000, not to user 1001")
    });
    assert!(refused);
    let at = ClientId(900);
    net.with(0, |n, now| n.handle_control(now, 0, Control::Attach(1, 1001, at)));
    assert_eq!(net.ended(at), Some((1, "job 1 belongs to user 1000, not to user 1001".into())));
    let t = net.control(Control::StackTraces(1, 1001));
    assert_eq!(stacks_reply(&net, t), Some(Err("job 1 belongs to user 1000, not to user 1001".into())));
    assert_eq!(net.live_procs(), 1, "the job runs on");
}

#[test]
fn ranks_are_told_of_oversubscription_by_the_processes_of_every_job_on_their_node() {
    use crate::jobs::local::OVERSUBSCRIBED_TIMER_SLACK_US;
    let mut net = Net::boot_on(1, 2, 2, 2);
    net.shells[0].keep_specs = true;
    let _a = net.launch(job(2, hang()));
    net.run_for(10 * MS);
    let _b = net.launch(JobSpec { oversubscribe: true, ..job(2, hang()) });
    net.run_for(10 * MS);
    let slack: Vec<(u32, u64)> = net.shells[0].specs.iter().map(|p| (p.jobid, p.timer_slack_us)).collect();
    // Job 1 alone fits the 2 cores; job 2's ranks join 2 running ones on 2 cores.
    assert_eq!(slack, vec![(1, 0), (1, 0), (2, OVERSUBSCRIBED_TIMER_SLACK_US), (2, OVERSUBSCRIBED_TIMER_SLACK_US)]);
}

#[test]
fn display_shows_the_allocation_the_map_and_the_bindings_when_the_job_starts() {
    let mut net = Net::boot(2, 2, 2);
    let spec = JobSpec { display_map: true, display_allocation: true, report_bindings: true, ..job(3, exit(0, 1)) };
    let c = net.launch(JobSpec { map_by: dvm_proto::job::MapBy::Node as i32, ..spec });
    net.run();
    let n = net.shells[0].notices(c);
    assert_eq!(n[0], "the DVM's allocation:\n  n0 (daemon 0): 2 slots, 2 in use\n  n1 (daemon 1): 2 slots, 1 in use");
    assert_eq!(n[1], "job 1 map: 3 processes on 2 nodes\n  n0 (daemon 0): 2 ranks: 0,2\n  n1 (daemon 1): 1 rank: 1");
    // Each daemon reports its own ranks (these nodes reported no hardware: nothing is bound).
    let mut bound: Vec<&str> = n[2..].iter().flat_map(|t| t.lines()).collect();
    bound.sort();
    assert_eq!(
        bound,
        [
            "[n0:0] is not bound (any cpu of the node)",
            "[n0:2] is not bound (any cpu of the node)",
            "[n1:1] is not bound (any cpu of the node)"
        ]
    );
    assert_eq!(net.ended(c), Some((0, String::new())));
}
