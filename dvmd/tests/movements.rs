//! Broadcast movements and movement agreement with real daemons on loopback: a 4 MiB
//! broadcast on scatter-allgather held byte for byte by every daemon at radix 2 and 64, a
//! daemon killed by SIGKILL during a stream of bulk broadcasts (the ops in flight degrade to
//! the whole-payload tree and every survivor still checks every op), and a daemon forced onto
//! another fence movement failing the fences by name on every participant.
//!
//! Waits are bounded guards against hangs (a passed bound fails the test with a message); no
//! assertion depends on how long something took.

mod common;

use std::time::Duration;

use common::{signal, text, until, wait_output, Dvm, Nodes};

const LOG: (&str, &str) = ("DVM_LOG", "warn,dvm_core::router::bench=info,dvm_grpcomm::xcast=debug");

fn bulk_dvm(name: &str, daemons: u32, radix: u32) -> Dvm {
    Dvm::start_with_args(name, Nodes::Local { daemons, slots: 1 }, radix, &[LOG], &["--bcast-movement", "bulk"])
}

fn check_xcast(dvm: &Dvm, count: &str, bytes: &str, daemons: u32) {
    let mut b = dvm.bench(&["--check-xcast", count, "--xcast-bytes", bytes]);
    let out = wait_output(&mut b, Duration::from_secs(300), "the checked broadcasts");
    let (o, e) = text(&out);
    assert!(out.status.success(), "broadcasts failed: {o}{e}");
    let want = format!("{count} xcasts of {bytes} bytes on {daemons} daemons");
    assert!(o.contains(&want) && o.contains("identical, correct bytes"), "{o}");
}

fn four_mib_everywhere(name: &str, radix: u32) {
    let dvm = bulk_dvm(name, 16, radix);
    check_xcast(&dvm, "5", "4194304", 16);
    // The arm under test really moved laterally.
    let log = dvm.log();
    assert!(log.contains("xcast op on scatter-allgather"), "no op took scatter-allgather:\n{log}");
    dvm.stop();
}

#[test]
fn bulk_broadcast_4mib_radix_2() {
    four_mib_everywhere("bulk4m2", 2);
}

#[test]
fn bulk_broadcast_4mib_radix_64() {
    four_mib_everywhere("bulk4m64", 64);
}

/// Kill -9 of a relay (radix 2) during back-to-back 256 KiB bulk broadcasts: the stream
/// completes, every survivor checked every op, and the survivors broadcast on.
#[test]
fn bulk_broadcast_survives_a_killed_daemon() {
    let (daemons, victim) = (16, 3);
    let dvm = bulk_dvm("bulkkill", daemons, 2);
    let mut stream = dvm.bench(&["--check-xcast", "400", "--xcast-bytes", "262144"]);
    until(Duration::from_secs(60), "the broadcast stream to start", || {
        dvm.log().matches("xcast op on scatter-allgather").count() >= 20
    });
    signal(dvm.daemon_pid(victim), libc::SIGKILL);
    let out = wait_output(&mut stream, Duration::from_secs(300), "the broadcast stream after kill -9");
    let (o, e) = text(&out);
    assert!(out.status.success(), "the stream that lost daemon {victim} failed: {o}{e}");
    until(Duration::from_secs(60), "the loss to be reported", || dvm.log().contains(&format!("daemon {victim}")));
    check_xcast(&dvm, "20", "262144", daemons - 1);
    dvm.assert_up();
    dvm.stop();
}

/// A relay frozen (SIGSTOP) for 2 s during back-to-back paced bulk broadcasts, then resumed:
/// its partners' paced steps wait for it and the stream completes, every daemon holding every
/// op byte for byte (if the freeze outlasted the heartbeat bound on a slow machine, the relay
/// is declared lost and the survivors still complete: either way nothing hangs).
#[test]
fn bulk_broadcast_survives_a_frozen_daemon() {
    let (daemons, victim) = (16, 5);
    let dvm = bulk_dvm("bulkfreeze", daemons, 2);
    let mut stream = dvm.bench(&["--check-xcast", "200", "--xcast-bytes", "1048576"]);
    until(Duration::from_secs(60), "the broadcast stream to start", || {
        dvm.log().matches("xcast op on scatter-allgather").count() >= 10
    });
    let pid = dvm.daemon_pid(victim);
    signal(pid, libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(2));
    signal(pid, libc::SIGCONT);
    let out = wait_output(&mut stream, Duration::from_secs(300), "the broadcast stream after a freeze");
    let (o, e) = text(&out);
    assert!(out.status.success(), "the stream across a frozen daemon {victim} failed: {o}{e}");
    assert!(o.contains("identical, correct bytes"), "{o}");
    dvm.assert_up();
    dvm.stop();
}

/// One daemon runs the other fence movement: every participant fails the fence with an error
/// naming both movements, nobody hangs, and the DVM stays up.
#[test]
fn forced_fence_movement_mismatch_is_named_on_every_participant() {
    for (radix, mode) in [(2, "allgather"), (64, "tree")] {
        let daemons = 8;
        let dvm = Dvm::start_with_args(
            &format!("mismatch{radix}"),
            Nodes::Local { daemons, slots: 1 },
            radix,
            &[("DVM_LOG", "warn"), ("DVMD_FAULT_OTHER_FENCE_MOVEMENT_RANK", "5")],
            &["--fence-movement", mode],
        );
        let mut b = dvm.bench(&["--check-fences", "10"]);
        let out = wait_output(&mut b, Duration::from_secs(120), "fences with a movement mismatch");
        let (o, e) = text(&out);
        assert!(!out.status.success(), "radix {radix}: fences with a mismatch succeeded: {o}");
        // Each daemon fails its first fence and reports it: one failed fence per daemon.
        assert!(
            e.contains(&format!("failed on {daemons} daemons")),
            "radix {radix}: not every participant failed: {e}"
        );
        assert!(e.contains("movement"), "radix {radix}: the error does not name the movements: {e}");
        dvm.assert_up();
        dvm.stop();
    }
}

/// The HNP measures its link once the DVM is ready when no link model is given, and logs a
/// positive latency and bandwidth; given one, it measures nothing.
#[test]
fn the_hnp_measures_its_link_unless_given_one() {
    let log = ("DVM_LOG", "warn,dvm_core::router::probe=info");
    let dvm = Dvm::start_with_args("probe", Nodes::Local { daemons: 4, slots: 1 }, 2, &[log], &[]);
    until(Duration::from_secs(60), "the link measurement", || dvm.log().contains("link measured"));
    let text = dvm.log();
    let line = text.lines().find(|l| l.contains("link measured")).unwrap();
    let field = |name: &str| -> f64 {
        let rest = line.split(&format!("{name}=")).nth(1).unwrap_or_else(|| panic!("no {name} in: {line}"));
        rest.split(|c: char| c.is_whitespace() || c == ',').next().unwrap().parse().unwrap()
    };
    let (alpha, bw) = (field("alpha_us"), field("bandwidth_mb_s"));
    assert!(alpha > 0.0 && alpha.is_finite(), "latency {alpha} µs in: {line}");
    assert!(bw > 0.0 && bw.is_finite(), "bandwidth {bw} MB/s in: {line}");
    dvm.stop();

    let pinned = ["--link-latency-us", "80", "--link-bandwidth-mbps", "500"];
    let dvm = Dvm::start_with_args("probepin", Nodes::Local { daemons: 4, slots: 1 }, 2, &[log], &pinned);
    check_xcast(&dvm, "3", "65536", 4);
    assert!(!dvm.log().contains("link measured"), "measured a pinned link:\n{}", dvm.log());
    dvm.stop();
}
