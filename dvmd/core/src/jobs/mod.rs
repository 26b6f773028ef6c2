//! Jobs: the HNP's job table ([`hnp`], with spawn and the data server in `spawn` and the
//! events and `--enable-recovery` in `recovery`) and each daemon's local part ([`local`]:
//! maps + residuals in, process specs out).
//!
//! Never: a process, a stream or a clock. A job's prun is a [`ClientId`]; a proc is a
//! [`ProcSpec`] out and a [`ProcEvent`] in.

pub mod display;
pub mod hnp;
pub mod local;
pub mod mpi;
pub mod preload;
pub mod proc;
pub mod queue;
mod records;
mod recovery;
mod spawn;
pub mod stacks;
mod streams;
pub mod tools;

use dvm_proto::control::{job_event, JobEvent};
use dvm_proto::job::{IofChunk, ProcStatus};
use dvm_rml::Rank;

pub use proc::{ExitKind, ProcCmd, ProcEvent, ProcSpec, Stream, TIMER_SLACK_VAR};

/// Output bytes a daemon may have in flight to the HNP per job before it stops reading.
pub const IOF_WINDOW: u32 = 1 << 20;
/// Grace between SIGTERM and SIGKILL when a job is killed (ns).
pub const KILL_GRACE_NS: u64 = 2_000_000_000;
/// How long a rank that called PMIx_Abort has to exit by itself before its job is killed (ns).
pub const ABORT_GRACE_NS: u64 = 2_000_000_000;
/// Grace the HNP gives running jobs to end when the DVM is terminated, before it stops the
/// daemons regardless (ns).
pub const TERMINATE_GRACE_NS: u64 = KILL_GRACE_NS + 2_000_000_000;
/// Exit status of a job ended by `--timeout`.
pub const TIMEOUT_EXIT: i32 = 124;
/// Exit status of a job that lost a node (its daemon died or was declared lost) with ranks
/// still running there.
pub const LOST_EXIT: i32 = 123;
/// Exit status of a job the DVM ended under: terminated (`pterm`) while it ran, or (in prun)
/// the head process lost.
pub const TERMINATED_EXIT: i32 = 125;

/// A job's prun (its event stream), as the shell numbers it. A spawned job's is its parent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientId(pub u64);

/// What goes to a prun, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Forward {
    /// Output of a rank, read on `daemon`: once prun took it, the shell reports
    /// [`crate::node::PrunEvent::Delivered`] so the daemon gets its credit back.
    Output { daemon: Rank, chunk: IofChunk },
    /// A job event (started, a notice, ended: the stream's last).
    Event(JobEvent),
    /// The launch was refused before any job existed (the DVM is terminating): the stream's
    /// only and last item.
    Refused(String),
    /// Nothing more goes to this prun, which went away (its jobs are detached): the shell
    /// forgets its stream.
    Close,
}

pub(crate) fn event(e: job_event::Event) -> Forward {
    Forward::Event(JobEvent { event: Some(e) })
}

/// Namespace of a job: unique per DVM (HNP host and pid), so two DVMs on one host never share
/// one (Open MPI derives its job id and session paths from it).
pub fn nspace_of(dvm: &str, jobid: u32) -> String {
    format!("dvm-{dvm}-job{jobid}")
}

/// A proc's end as prun tells it: (exit status, the words after "rank N on node H (pid P)"),
/// None for a clean exit.
pub fn describe_exit(st: &ProcStatus) -> Option<(i32, String)> {
    if !st.error.is_empty() {
        return Some((if st.exit_code != 0 { st.exit_code } else { 127 }, st.error.clone()));
    }
    if st.signal != 0 {
        return Some((128 + st.signal, format!("was killed by signal {} ({})", st.signal, signal_name(st.signal))));
    }
    (st.exit_code != 0).then(|| (st.exit_code, format!("exited with status {}", st.exit_code)))
}

/// The name Linux gives a signal number.
pub fn signal_name(sig: i32) -> &'static str {
    const NAMES: [&str; 32] = [
        "unknown signal",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    usize::try_from(sig).ok().and_then(|i| NAMES.get(i)).copied().unwrap_or("unknown signal")
}
