//! What a daemon's process layer (dvmd's odls) and the core say to each other: a proc to
//! start, and what happened to a proc. Plain data; the core never starts a process.

use std::path::PathBuf;

use bytes::Bytes;

/// One proc to start.
#[derive(Debug, Clone)]
pub struct ProcSpec {
    pub jobid: u32,
    pub rank: u32,
    /// `argv[0]`: a path (relative paths are relative to `wdir`) or a name looked up in the PATH
    /// of `env`.
    pub argv: Vec<String>,
    /// The proc's whole environment, exactly (later duplicates win).
    pub env: Vec<(String, String)>,
    pub wdir: PathBuf,
    /// A pipe fed by `write_stdin`; otherwise stdin is /dev/null.
    pub stdin: bool,
    /// The proc's timer slack in microseconds (`PR_SET_TIMERSLACK`: how late the kernel may
    /// end its sleeps, to wake it together with other timers); 0 keeps the kernel's default.
    /// [`TIMER_SLACK_VAR`] in `env` wins.
    pub timer_slack_us: u64,
    /// The CPUs (OS indices) the proc is bound to before it runs; `None`: unbound (it keeps
    /// the daemon's affinity).
    pub cpus: Option<Vec<u32>>,
    /// Stamp its output with the time it is read (`--output timestamp`).
    pub timestamp: bool,
    /// Give it a PMI connection on this fd number (`PMI_FD`, already in `env`): one end of a
    /// socket pair, whose bytes come back as [`ProcEvent::PmiData`].
    pub pmi_fd: Option<i32>,
}

/// A proc's timer slack in microseconds, set in its environment (`-x DVM_TIMER_SLACK_US=0`):
/// overrides what the daemon chose ([`ProcSpec::timer_slack_us`]); 0 keeps the kernel's default.
pub const TIMER_SLACK_VAR: &str = "DVM_TIMER_SLACK_US";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    /// The number used on the wire (`IofChunk.stream`).
    pub fn wire(self) -> u32 {
        match self {
            Stream::Stdout => 1,
            Stream::Stderr => 2,
        }
    }
}

/// How a proc ended (the 128+signo convention is the caller's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    Code(i32),
    Signal(i32),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcEvent {
    Started {
        jobid: u32,
        rank: u32,
        pid: u32,
    },
    /// At most `IOF_CHUNK` bytes, binary-safe; counts against the job's window until acked.
    Output {
        jobid: u32,
        rank: u32,
        stream: Stream,
        data: Bytes,
        /// When it was read (µs since 1970, UTC), for a proc started with `timestamp`; else 0.
        read_at_us: u64,
    },
    OutputClosed {
        jobid: u32,
        rank: u32,
        stream: Stream,
    },
    /// The proc's last event (after both `OutputClosed`).
    Exited {
        jobid: u32,
        rank: u32,
        pid: u32,
        status: ExitKind,
    },
    /// The proc never ran; one sentence naming the node, job, rank and the offending path.
    LaunchFailed {
        jobid: u32,
        rank: u32,
        error: String,
    },
    /// Bytes the proc wrote on its PMI connection.
    PmiData {
        jobid: u32,
        rank: u32,
        data: Bytes,
    },
    /// Its PMI connection closed (EOF or an error), or could not be read.
    PmiClosed {
        jobid: u32,
        rank: u32,
    },
    /// The answer to [`ProcCmd::DumpStacks`]: (rank, pid, trace) of each live proc, or why
    /// there are none (the debugger is missing), naming the node.
    Stacks {
        id: u64,
        jobid: u32,
        traces: Vec<(u32, u32, String)>,
        error: Option<String>,
    },
}

/// What a daemon asks of its process layer (odls), in order.
#[derive(Debug)]
pub enum ProcCmd {
    /// Start a proc.
    Spawn(ProcSpec),
    /// TERM every proc of a job, KILL after `grace_ms`.
    KillJob {
        jobid: u32,
        grace_ms: u32,
    },
    SignalJob {
        jobid: u32,
        signal: i32,
    },
    WriteStdin {
        jobid: u32,
        rank: u32,
        data: Bytes,
    },
    CloseStdin {
        jobid: u32,
        rank: u32,
    },
    /// The HNP took `bytes` of a job's output: the readers may go on.
    AckOutput {
        jobid: u32,
        bytes: u64,
    },
    /// A job ended everywhere: its process records go.
    ForgetJob(u32),
    /// Write an answer on a proc's PMI connection (in order; dropped once it is closed).
    PmiWrite {
        jobid: u32,
        rank: u32,
        data: Bytes,
    },
    /// Close our end of a proc's PMI connection (its job failed for what it sent).
    PmiClose {
        jobid: u32,
        rank: u32,
    },
    /// The stack traces of a job's live procs here (query `id`): answered by
    /// [`ProcEvent::Stacks`].
    DumpStacks {
        id: u64,
        jobid: u32,
    },
    /// The DVM ends: every local proc goes now.
    KillAll,
}
