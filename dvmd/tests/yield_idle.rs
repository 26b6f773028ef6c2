//! Ranks on an oversubscribed machine are told to yield while they wait
//! (`OMPI_MCA_mpi_yield_when_idle=1`) and get a coarser timer slack (their short sleeps wake
//! together): a job with more procs on this machine than its cores gets both in every rank, a
//! job that fits neither, and the user's own values are kept.
//! The expectation comes from the core count this test reads itself (the daemons it starts
//! inherit its affinity), never from a timing.

mod common;

use common::{text, Dvm, Nodes};

const VAR: &str = "OMPI_MCA_mpi_yield_when_idle";

/// The cores the daemons (children of this process) may run on.
fn cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// The value of [`VAR`] every rank of the job sees ("-" when unset), one per rank.
fn yield_values(dvm: &Dvm, args: &[&str]) -> Vec<String> {
    let mut a: Vec<&str> = args.to_vec();
    // `sh -c` so an unset variable still prints one line per rank.
    a.extend_from_slice(&["sh", "-c", "echo \"${OMPI_MCA_mpi_yield_when_idle:--}\""]);
    let o = dvm.prun(&a);
    let (out, err) = text(&o);
    assert!(o.status.success(), "prun {args:?}: {:?}\n{err}\n{}", o.status, dvm.log());
    out.lines().map(|l| l.trim().to_string()).collect()
}

fn all_equal(got: &[String], n: u32, want: &str, what: &str) {
    assert_eq!(got.len(), n as usize, "{what}: one line per rank expected, got {got:?}");
    assert!(got.iter().all(|v| v == want), "{what}: every rank should see {VAR}={want}, got {got:?}");
}

#[test]
fn oversubscribed_ranks_yield() {
    let c = cores();
    let over = c + 1;
    // A one-daemon DVM with slots for the oversubscribed job.
    let dvm = Dvm::start("yield1", Nodes::Local { daemons: 1, slots: over }, 2, &[]);
    let n = over.to_string();
    all_equal(&yield_values(&dvm, &["-n", &n]), over, "1", &format!("{over} procs on {c} cores"));
    let fit = c.to_string();
    all_equal(&yield_values(&dvm, &["-n", &fit]), c, "-", &format!("{c} procs on {c} cores"));
    all_equal(&yield_values(&dvm, &["-n", "1"]), 1, "-", "1 proc");
    // The user's choice wins, either way.
    let x0 = format!("{VAR}=0");
    all_equal(&yield_values(&dvm, &["-x", &x0, "-n", &n]), over, "0", "oversubscribed with -x =0");
    let x1 = format!("{VAR}=1");
    all_equal(&yield_values(&dvm, &["-x", &x1, "-n", "1"]), 1, "1", "fitting with -x =1");
    dvm.stop();
}

/// Several daemons on one machine (`--local`): the procs that count are the job's procs on
/// every daemon, not one daemon's share.
#[test]
fn local_daemons_share_the_cores() {
    let c = cores();
    let over = c + 1;
    // Two daemons; by node, so each gets about half of the procs, fewer than the cores when
    // c >= 2, yet together they oversubscribe the machine.
    let dvm = Dvm::start("yield2", Nodes::Local { daemons: 2, slots: over }, 2, &[]);
    let n = over.to_string();
    all_equal(&yield_values(&dvm, &["--map-by", "node", "-n", &n]), over, "1", &format!("{over} procs by node"));
    let fit = c.to_string();
    all_equal(&yield_values(&dvm, &["--map-by", "node", "-n", &fit]), c, "-", &format!("{c} procs by node"));
    dvm.stop();
}

/// Every rank's timer slack in ns (`/proc/self/timerslack_ns`), one per rank.
fn slack_values(dvm: &Dvm, args: &[&str]) -> Vec<String> {
    let mut a: Vec<&str> = args.to_vec();
    a.extend_from_slice(&["cat", "/proc/self/timerslack_ns"]);
    let o = dvm.prun(&a);
    let (out, err) = text(&o);
    assert!(o.status.success(), "prun {args:?}: {:?}\n{err}\n{}", o.status, dvm.log());
    out.lines().map(|l| l.trim().to_string()).collect()
}

#[test]
fn oversubscribed_ranks_get_a_coarser_timer_slack() {
    let c = cores();
    let over = c + 1;
    // The daemons inherit this process's slack; so do ranks the DVM leaves alone.
    let own = std::fs::read_to_string("/proc/self/timerslack_ns").expect("timerslack_ns").trim().to_string();
    let chosen = (dvmd::jobs::local::OVERSUBSCRIBED_TIMER_SLACK_US * 1000).to_string();
    assert_ne!(own, chosen, "this test needs a slack other than the DVM's choice to tell them apart");
    let dvm = Dvm::start("slack1", Nodes::Local { daemons: 1, slots: over }, 2, &[]);
    let n = over.to_string();
    all_equal(&slack_values(&dvm, &["-n", &n]), over, &chosen, &format!("timer slack, {over} procs on {c} cores"));
    let fit = c.to_string();
    all_equal(&slack_values(&dvm, &["-n", &fit]), c, &own, &format!("timer slack, {c} procs on {c} cores"));
    // The user's choice wins, either way.
    all_equal(&slack_values(&dvm, &["-x", "DVM_TIMER_SLACK_US=0", "-n", &n]), over, &own, "oversubscribed, -x =0");
    all_equal(&slack_values(&dvm, &["-x", "DVM_TIMER_SLACK_US=300", "-n", "1"]), 1, "300000", "fitting, -x =300");
    // A malformed one fails the job with a sentence that names it.
    let o = dvm.prun(&["-x", "DVM_TIMER_SLACK_US=soon", "-n", "1", "true"]);
    let (_, err) = text(&o);
    assert!(!o.status.success(), "a malformed DVM_TIMER_SLACK_US must fail the job");
    assert!(
        err.contains("cannot start rank 0 of job")
            && err.contains("DVM_TIMER_SLACK_US='soon' is not a number of microseconds"),
        "stderr: {err}"
    );
    dvm.stop();
}

/// A value in the DVM's own environment (inherited by every rank) is kept too.
#[test]
fn dvm_environment_wins() {
    let over = cores() + 1;
    let dvm = Dvm::start("yield3", Nodes::Local { daemons: 1, slots: over }, 2, &[(VAR, "0")]);
    let n = over.to_string();
    all_equal(&yield_values(&dvm, &["-n", &n]), over, "0", "oversubscribed, DVM started with =0");
    dvm.stop();
}
