//! A DVM paused as a whole and resumed carries on (issue 29): every process of a 16-daemon DVM
//! at radix 2 stopped together (SIGSTOP), as `docker pause` of a cluster, a VM pause or Ctrl-Z
//! of the process group would, for 3x the heartbeat bound, then resumed (SIGCONT). Nobody was
//! silent relative to anybody else, so nobody may be declared lost. A loss during the pause
//! must still be named after the resume: a daemon killed during it (its sockets were closed by
//! the kernel), and a daemon left frozen when the others resume (one bound later).
//!
//! The sleeps below make the scenario (the pause is 3x the bound); waits are bounded guards
//! against hangs; pass or fail is decided by what survived and what was said, never by a time.

mod common;

use std::time::Duration;

use common::{alive, signal, text, until, Dvm, Nodes};

const DAEMONS: u32 = 16;
const HEARTBEAT_MS: u64 = 500;
const MISSES: u32 = 3;

fn bound() -> Duration {
    Duration::from_millis(HEARTBEAT_MS) * MISSES
}

/// Stop every listed process, hold them for 3x the bound, resume them.
fn pause_all(pids: &[u32], resume: &[u32]) {
    for &p in pids {
        signal(p, libc::SIGSTOP);
    }
    std::thread::sleep(bound() * 3);
    for &p in resume {
        signal(p, libc::SIGCONT);
    }
}

/// Lines of the HNP's log that declare a daemon lost.
fn losses(dvm: &Dvm) -> Vec<String> {
    dvm.log().lines().filter(|l| l.starts_with("dvmd: daemon ") && l.contains(" was lost")).map(String::from).collect()
}

/// A job with one proc on each of `nodes` nodes runs (1 slot per node: it needs them all).
fn job_on_every_node(dvm: &Dvm, nodes: u32, when: &str) {
    let out = dvm.prun(&["--map-by", "node", "-n", &nodes.to_string(), "hostname"]);
    let (o, e) = text(&out);
    assert!(out.status.success(), "{when}: a job on {nodes} nodes failed: {e}\nlog:\n{}", dvm.log());
    assert_eq!(o.lines().count(), nodes as usize, "{when}: {o}");
}

#[test]
fn whole_dvm_paused_and_resumed_carries_on() {
    let hb = HEARTBEAT_MS.to_string();
    let misses = MISSES.to_string();
    let dvm = Dvm::start_with_args(
        "pauseall",
        Nodes::Local { daemons: DAEMONS, slots: 1 },
        2,
        &[("DVM_LOG", "warn")],
        &["--heartbeat-ms", &hb, "--heartbeat-misses", &misses],
    );
    let pids = dvm.pids.clone();
    assert_eq!(pids.len(), DAEMONS as usize, "the HNP and its daemons: {pids:?}");

    // 1. The whole DVM paused and resumed: nobody is lost, and a job runs on every node.
    for round in 0..2 {
        pause_all(&pids, &pids);
        // Past the bound after the resume: any read-idle timer that blamed the pause has fired.
        std::thread::sleep(bound() * 2);
        let dead: Vec<u32> = pids.iter().copied().filter(|&p| !alive(p)).collect();
        assert!(dead.is_empty(), "round {round}: daemons gone after the resume: {dead:?}\nlog:\n{}", dvm.log());
        assert_eq!(losses(&dvm), Vec::<String>::new(), "round {round}: a daemon was declared lost");
        job_on_every_node(&dvm, DAEMONS, &format!("round {round}, after the resume"));
    }

    // 2. A daemon killed during the pause (an interior one: 3 relays for 7 and 11) is named
    //    after the resume, and nobody else is.
    let victim = 3;
    let victim_pid = dvm.daemon_pid(victim);
    for &p in &pids {
        signal(p, libc::SIGSTOP);
    }
    signal(victim_pid, libc::SIGKILL);
    std::thread::sleep(bound() * 3);
    let rest: Vec<u32> = pids.iter().copied().filter(|&p| p != victim_pid).collect();
    for &p in &rest {
        signal(p, libc::SIGCONT);
    }
    let named = format!("dvmd: daemon {victim} on host ");
    until(Duration::from_secs(30), "the daemon killed during the pause to be named", || {
        losses(&dvm).iter().any(|l| l.starts_with(&named))
    });
    std::thread::sleep(bound() * 2);
    assert_eq!(losses(&dvm).len(), 1, "only daemon {victim} may be lost: {:?}", losses(&dvm));
    job_on_every_node(&dvm, DAEMONS - 1, "after a kill during the pause");

    // 3. A daemon left frozen when the others resume is named one bound later; resumed, it is
    //    told it is out and exits.
    let frozen = 6;
    let frozen_pid = dvm.daemon_pid(frozen);
    let others: Vec<u32> = rest.iter().copied().filter(|&p| p != frozen_pid).collect();
    pause_all(&rest, &others);
    let named = format!("dvmd: daemon {frozen} on host ");
    until(Duration::from_secs(30), "the daemon left frozen to be named", || {
        losses(&dvm).iter().any(|l| l.starts_with(&named))
    });
    signal(frozen_pid, libc::SIGCONT);
    until(Duration::from_secs(30), "the frozen daemon to exit once resumed", || !alive(frozen_pid));
    assert_eq!(losses(&dvm).len(), 2, "only daemons {victim} and {frozen} may be lost: {:?}", losses(&dvm));
    job_on_every_node(&dvm, DAEMONS - 2, "after a daemon stayed frozen");

    dvm.stop();
}
