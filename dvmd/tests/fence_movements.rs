//! Fences on the lateral allgather with real daemons on loopback (`dvmd --fence-movement
//! allgather`), at radix 2 (a deep tree: relays take no part in the exchange) and 64 (flat):
//! back-to-back alternating barrier/modex fences checked on every daemon, and a participant
//! killed by SIGKILL mid-exchange ending the storm with an error naming it while the survivors
//! fence on.
//!
//! Waits are bounded guards against hangs (a passed bound fails the test with a message); no
//! assertion depends on how long something took.

mod common;

use std::time::Duration;

use common::{text, wait_output, Dvm, Nodes};

/// Every daemon was started with the allgather (the arm is really the one under test).
fn assert_allgather_everywhere(dvm: &Dvm, daemons: u32) {
    for r in 1..daemons {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", dvm.daemon_pid(r))).unwrap();
        assert!(
            String::from_utf8_lossy(&cmdline).contains("--fence-movement=allgather\0"),
            "daemon {r} was not started with --fence-movement=allgather"
        );
    }
}

fn storm_then_kill(name: &str, daemons: u32, radix: u32, victim: u32, fences: &str) {
    let dvm = Dvm::start_with_args(
        name,
        Nodes::Local { daemons, slots: 1 },
        radix,
        &[("DVM_LOG", "warn,dvm_core::router::bench=info")],
        &["--fence-movement", "allgather"],
    );
    assert_allgather_everywhere(&dvm, daemons);
    let mut clean = dvm.bench(&["--check-fences", fences]);
    let out = wait_output(&mut clean, Duration::from_secs(600), "the clean fence storm");
    let (o, e) = text(&out);
    assert!(out.status.success(), "{name}: the clean storm failed: {o}{e}");
    assert!(o.contains(&format!("{fences} alternating barrier/modex fences on {daemons} daemons")), "{name}: {o}");

    dvm.storm_with_kill(name, daemons, victim, 2);
    dvm.stop();
}

#[test]
fn allgather_storm_and_kill_radix_2() {
    // Daemon 3 relays for 7 and 11 on the tree, and is an allgather partner of everyone.
    storm_then_kill("agstorm2", 16, 2, 3, "10000");
}

#[test]
fn allgather_storm_and_kill_radix_64() {
    storm_then_kill("agstorm64", 16, 64, 6, "2000");
}
