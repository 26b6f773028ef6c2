//! Staging on the in-memory harness: whole files everywhere or nothing anywhere.

use bytes::Bytes;
use dvm_proto::control::StageReply;
use dvm_proto::job::PreloadFile;

use super::{segments, SourceFile, StagePlan, MIN_SEGMENT};
use crate::harness::{job, Net, Program};
use crate::node::{Control, Reply};

fn blob(n: usize) -> Bytes {
    Bytes::from((0..n).map(|i| (i * 7 + i / 251) as u8).collect::<Vec<u8>>())
}

fn plan(size: u64, dest: &str) -> StagePlan {
    let files = vec![SourceFile { src: "/src/a".into(), dest: dest.into(), size, mode: 0o644 }];
    StagePlan { files, hosts: Vec::new(), compress: false, segment: MIN_SEGMENT, window: 0, uid: 0 }
}

fn stage_reply(net: &Net, token: u64) -> Option<StageReply> {
    net.shells[0].replies.iter().find_map(|(t, r)| match r {
        Reply::Stage(s) if *t == token => Some(s.clone()),
        _ => None,
    })
}

/// A DVM of `n` daemons (radix 2) copying a file of `segments` segments to every one of them,
/// `steps` events into the copy and not yet answered; the control call's token.
fn pbcast_under_way(n: u32, segments: usize, steps: usize) -> (Net, u64) {
    let mut net = Net::boot(n, 2, 1);
    let data = blob(segments * MIN_SEGMENT as usize);
    net.shells[0].disk.sources.insert("/src/a".into(), data.clone());
    let token = net.control(Control::Stage(plan(data.len() as u64, "/dst/%n/a")));
    for _ in 0..steps {
        net.step();
    }
    assert!(stage_reply(&net, token).is_none(), "still moving");
    (net, token)
}

fn named_anywhere(net: &Net) -> usize {
    net.shells.iter().map(|s| s.disk.files.len()).sum()
}

#[test]
fn segments_cover_a_file_once_and_end_with_last() {
    assert_eq!(segments(0, 10).collect::<Vec<_>>(), vec![(0, 0, true)]);
    assert_eq!(segments(25, 10).collect::<Vec<_>>(), vec![(0, 10, false), (10, 10, false), (20, 5, true)]);
    assert_eq!(segments(20, 10).count(), 2);
}

#[test]
fn a_file_arrives_whole_on_every_daemon_at_radix_2_and_64_and_nothing_is_held_after() {
    for radix in [2, 64] {
        let mut net = Net::boot(9, radix, 1);
        let data = blob(20 * MIN_SEGMENT as usize + 123);
        net.shells[0].disk.sources.insert("/src/a".into(), data.clone());
        let token = net.control(Control::Stage(plan(data.len() as u64, "/dst/%n/a")));
        net.run();
        let rep = stage_reply(&net, token).expect("answered");
        assert!(rep.ok, "{}", rep.error);
        assert_eq!((rep.nodes, rep.segments), (9, 21));
        for (r, s) in net.shells.iter().enumerate() {
            assert_eq!(s.disk.files.get(&format!("/dst/{r}/a")).map(|b| b.as_slice()), Some(&data[..]), "daemon {r}");
        }
        for (r, n) in net.nodes.iter().enumerate() {
            let n = n.as_ref().unwrap();
            assert!(n.router().grpcomm().is_quiescent(), "daemon {r} holds no op");
            assert_eq!(n.stage_held(), (0, 0), "daemon {r} forgot the finished transfer");
        }
    }
}

#[test]
fn a_full_disk_on_one_node_fails_the_transfer_by_name_and_nothing_is_left_anywhere() {
    let mut net = Net::boot(6, 2, 1);
    let data = blob(8 * MIN_SEGMENT as usize);
    net.shells[0].disk.sources.insert("/src/a".into(), data.clone());
    net.shells[4].disk.full.insert("/dst/4/a".into());
    let token = net.control(Control::Stage(plan(data.len() as u64, "/dst/%n/a")));
    net.run();
    let rep = stage_reply(&net, token).expect("answered");
    assert!(!rep.ok);
    assert!(rep.error.contains("daemon 4") && rep.error.contains("/dst/4/a: no space"), "{}", rep.error);
    assert_eq!(named_anywhere(&net), 0);
}

#[test]
fn a_target_lost_mid_transfer_fails_it_naming_the_daemon_and_survivors_keep_nothing() {
    let (mut net, token) = pbcast_under_way(6, 40, 40);
    net.kill(5);
    net.run();
    let rep = stage_reply(&net, token).expect("answered");
    assert!(!rep.ok && rep.error.contains("daemon 5") && rep.error.contains("lost"), "{}", rep.error);
    assert_eq!(named_anywhere(&net), 0);
}

#[test]
fn a_host_nobody_runs_on_is_refused_before_anything_moves() {
    let mut net = Net::boot(3, 2, 1);
    let mut p = plan(10, "/dst/a");
    p.hosts = vec!["nowhere".into()];
    let token = net.control(Control::Stage(p));
    net.run();
    let rep = stage_reply(&net, token).expect("answered");
    assert!(!rep.ok && rep.error.contains("host nowhere"), "{}", rep.error);
}

#[test]
fn a_preloading_job_starts_after_its_files_are_in_place_and_removes_them_when_it_ends() {
    let mut net = Net::boot(4, 2, 1);
    net.shells[0].disk.sources.insert("/src/a".into(), blob(1000));
    let mut spec = job(4, Program::Exit { code: 0, after_ns: 1_000_000 }.argv());
    spec.preload = vec![PreloadFile { src: "/src/a".into(), dest: "/w/%n/%j/a".into(), size: 1000, mode: 0o600 }];
    let c = net.launch(spec.clone());
    // Until the files are named everywhere, nothing runs.
    while named_anywhere(&net) < 4 {
        assert!(net.shells.iter().all(|s| s.started.is_empty()), "a proc started before its files");
        assert!(net.step(), "the files never arrived");
    }
    net.run();
    assert_eq!(net.ended(c), Some((0, String::new())));
    assert_eq!(net.shells.iter().map(|s| s.started.len()).sum::<usize>(), 4);
    assert_eq!(named_anywhere(&net), 0, "removed at the job's end");
    // Kept when asked.
    spec.preload_keep = true;
    let c = net.launch(spec.clone());
    net.run();
    assert_eq!(net.ended(c), Some((0, String::new())));
    assert_eq!(named_anywhere(&net), 4);
    // A copy that fails: the job never starts and says why.
    spec.preload[0].src = "/src/missing".into();
    let before: usize = net.shells.iter().map(|s| s.started.len()).sum();
    let c = net.launch(spec);
    net.run();
    let (code, why) = net.ended(c).expect("ended");
    assert_eq!(code, 1);
    assert!(why.contains("preload") && why.contains("/src/missing"), "{why}");
    assert_eq!(net.shells.iter().map(|s| s.started.len()).sum::<usize>(), before);
    assert!(net.node(0).jobs().unwrap().is_empty());
}

/// A job of `n` procs that exit 0 after `after_ns`, preloading a 3000-byte file the HNP's
/// node holds.
fn preloading(net: &mut Net, n: u32, after_ns: u64) -> dvm_proto::job::JobSpec {
    net.shells[0].disk.sources.insert("/src/a".into(), blob(3000));
    let mut spec = job(n, Program::Exit { code: 0, after_ns }.argv());
    spec.preload = vec![PreloadFile { src: "/src/a".into(), dest: "/w/%n/%j/a".into(), size: 3000, mode: 0o600 }];
    spec
}

/// Files of any transfer on any node: named, or unnamed and being received.
fn held_anywhere(net: &Net) -> usize {
    net.shells.iter().map(|s| s.disk.files.len() + s.disk.receiving()).sum()
}

#[test]
fn a_failed_transfer_is_answered_only_once_every_target_discarded_it() {
    let mut net = Net::boot(6, 2, 1);
    let data = blob(8 * MIN_SEGMENT as usize);
    net.shells[0].disk.sources.insert("/src/a".into(), data.clone());
    net.shells[5].disk.full.insert("/dst/5/a".into());
    let token = net.control(Control::Stage(plan(data.len() as u64, "/dst/%n/a")));
    while stage_reply(&net, token).is_none() {
        assert!(net.step(), "never answered");
    }
    assert_eq!(held_anywhere(&net), 0, "the failure was answered while a node still held part of it");
    net.run();
    assert!(net.nodes.iter().all(|n| n.as_ref().unwrap().stage_held() == (0, 0)), "every side forgot it");
}

#[test]
fn a_preloading_jobs_end_is_told_only_once_its_files_are_gone_everywhere() {
    let mut net = Net::boot(5, 2, 1);
    let spec = preloading(&mut net, 5, 1_000_000);
    let c = net.launch(spec);
    while net.ended(c).is_none() {
        assert!(net.step(), "the job never ended");
    }
    assert_eq!(held_anywhere(&net), 0, "prun was told the job ended while a node still held its files");
}

#[test]
fn a_preloading_job_that_loses_a_node_ends_and_its_survivors_remove_the_files() {
    let mut net = Net::boot(5, 2, 1);
    let spec = preloading(&mut net, 5, 50_000_000);
    let c = net.launch(spec);
    while net.shells.iter().map(|s| s.started.len()).sum::<usize>() < 5 {
        assert!(net.step(), "the job never started");
    }
    net.kill(4);
    while net.ended(c).is_none() {
        assert!(net.step(), "the job never ended: its end waited for the lost node's removal");
    }
    let (code, why) = net.ended(c).unwrap();
    assert_ne!(code, 0, "{why}");
    let left: usize = net.shells[..4].iter().map(|s| s.disk.files.len() + s.disk.receiving()).sum();
    assert_eq!(left, 0, "a survivor kept the job's files");
}

#[test]
fn pterm_while_an_ended_jobs_files_are_being_removed_waits_for_them_and_tells_its_prun() {
    let mut net = Net::boot(5, 2, 1);
    let spec = preloading(&mut net, 5, 1_000_000);
    let c = net.launch(spec);
    // The job left the table; its prun waits for the files to go.
    while !(net.node(0).jobs().unwrap().is_empty() && named_anywhere(&net) > 0) {
        assert!(net.step(), "the job never ended with its files still in place");
    }
    assert_eq!(net.ended(c), None);
    // TERMINATE follows the removal on every daemon (broadcasts keep their order), and each
    // daemon's REMOVED reaches the HNP before its TERMINATE acknowledgement.
    net.control(Control::Terminate);
    net.run();
    assert_eq!(net.ended(c), Some((0, String::new())), "the DVM ended before telling the job's prun");
    assert_eq!(held_anywhere(&net), 0);
}

#[test]
fn a_stray_removed_report_from_a_target_neither_fails_nor_ends_a_moving_transfer() {
    use dvm_proto::daemon::{daemon_cmd, StagePhase, StageReport};
    let (mut net, token) = pbcast_under_way(5, 20, 10);
    // Daemon 3 (a target) says REMOVED for a transfer nobody ended, with an error text.
    let rep = StageReport { id: 1, phase: StagePhase::Removed as i32, error: "junk".into() };
    net.with(3, |n, now| n.handle_input(now, crate::Input::Cmd { dst: 0, body: daemon_cmd::Body::StageReport(rep) }));
    net.run();
    let rep = stage_reply(&net, token).expect("answered");
    assert!(rep.ok, "a stray report failed the transfer: {}", rep.error);
    assert_eq!(named_anywhere(&net), 5);
}
