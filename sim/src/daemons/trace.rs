//! What a run of the daemon-core engine observed, judged by [`super::check`].

use std::collections::BTreeSet;

use bytes::Bytes;
use dvm_core::Exit;
use dvm_grpcomm::{FenceError, Rank};
use dvm_proto::control::BenchReply;

/// One `Input::Fence` of a PMIx-like owner.
#[derive(Debug, Clone)]
pub struct FenceCall {
    pub daemon: Rank,
    pub job: usize,
    pub step: usize,
    pub data: Bytes,
    pub at: u64,
    pub done: Option<(u64, Result<Bytes, FenceError>)>,
}

/// How a daemon's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Still running at the end of the run.
    Running,
    /// Killed by the schedule at this time.
    Killed(u64),
    /// Its core asked to exit.
    Exited(u64, Exit),
}

#[derive(Debug, Clone, Default)]
pub struct CoreStats {
    pub frames: u64,
    pub bytes: u64,
    pub events: u64,
    /// Frames lost with a dead daemon or a cut link.
    pub lost_frames: u64,
    /// Frames duplicated or delayed on a lossy cut link.
    pub duplicated: u64,
    pub delayed: u64,
    /// Frames handed to a survivor from a daemon it had already declared dead.
    pub dead_frames: u64,
    pub peer_lost: u64,
    pub send_failed: u64,
}

#[derive(Debug, Clone, Default)]
pub struct CoreTrace {
    pub ready_at: Option<u64>,
    /// Absolute time of the last fault (ready time when there is none).
    pub last_fault_at: u64,
    pub fence_calls: Vec<FenceCall>,
    /// `(time)` of each benchmark asked for, and each answer.
    pub bench_starts: Vec<u64>,
    pub bench_dones: Vec<(u64, Result<BenchReply, String>)>,
    /// `(daemon, tag, payload, time)` of each xcast a workload started.
    pub xcast_starts: Vec<(Rank, u32, Bytes, u64)>,
    /// Per daemon, the workload xcasts delivered, in order.
    pub deliveries: Vec<Vec<(u32, Bytes)>>,
    /// Per daemon, how its run ended.
    pub ends: Vec<End>,
    /// Daemons frozen by the schedule: `(rank, from, until)`.
    pub stops: Vec<(Rank, u64, u64)>,
    /// Cut links `(a, b, time)`.
    pub cuts: Vec<(Rank, Rank, u64)>,
    /// Per daemon at the end: its failed set, owned operations, grpcomm quiescence.
    pub final_failed: Vec<BTreeSet<Rank>>,
    pub final_owned: Vec<usize>,
    pub final_quiescent: Vec<bool>,
    /// Per daemon at the end: staging transfers it holds (as origin, as target), and its
    /// named files with their fingerprints.
    pub final_stage_held: Vec<(usize, usize)>,
    pub final_files: Vec<std::collections::BTreeMap<String, u64>>,
    /// Violations seen while running (a frame from a dead daemon admitted, a stray effect).
    pub engine_errors: Vec<String>,
    pub stats: CoreStats,
    pub end_ns: u64,
    /// Per staged file: when it was asked for, and the HNP's answer (time, reply).
    pub stage_starts: Vec<Option<u64>>,
    pub stage_dones: Vec<Option<(u64, dvm_proto::control::StageReply)>>,
    /// Per daemon, the most bytes its grpcomm state held (0 unless the scenario samples it).
    pub peak_state: Vec<usize>,
    /// Per daemon, the most bytes its disk held unnamed (staging).
    pub peak_unnamed: Vec<usize>,
    /// Per launch: when the HNP took it, and how its prun heard it end (time, status, why).
    pub launched_at: Vec<Option<u64>>,
    pub launch_ends: Vec<Option<(u64, i32, String)>>,
    /// Procs still alive at the end on a running daemon: (daemon, job, rank).
    pub leftover_procs: Vec<(Rank, u32, u32)>,
    /// Jobs still in the HNP's table at the end (HNP running).
    pub hnp_jobs_left: usize,
    /// A daemon started a proc of a job it had already ended.
    pub shell_errors: Vec<String>,
    /// Per daemon (each has one slot, and no job oversubscribes): the most procs of any
    /// jobs it ran at once.
    pub peak_procs: Vec<usize>,
    /// When pterm was asked (the HNP running).
    pub terminate_asked: Option<u64>,
    /// A daemon's new incarnation: when it started, and how it ended.
    pub restarted: Option<(Rank, u64)>,
    pub restart_end: Option<(u64, dvm_core::Exit)>,
    /// Per launch with a spawn: when it was asked, and the answers rank 0's daemon got
    /// (status), in order.
    pub spawns_asked: Vec<Option<u64>>,
    pub spawn_answers: Vec<Vec<i32>>,
    /// PMIx upcalls the simulated clients made, and what broke the PMIx rules.
    pub pmix_upcalls: u64,
    pub pmix_errors: Vec<String>,
    /// Simulated ranks that spoke PMI on their fd, the requests they sent, the barriers they
    /// passed, and what broke the PMI rules.
    pub pmi_ranks: u64,
    pub pmi_requests: u64,
    pub pmi_barriers: u64,
    pub pmi_errors: Vec<String>,
}

impl CoreTrace {
    pub fn killed(&self, r: Rank) -> bool {
        matches!(self.ends[r as usize], End::Killed(_))
    }
    pub fn running(&self, r: Rank) -> bool {
        self.ends[r as usize] == End::Running
    }
    pub fn exit_of(&self, r: Rank) -> Option<&Exit> {
        match &self.ends[r as usize] {
            End::Exited(_, e) => Some(e),
            _ => None,
        }
    }
}
