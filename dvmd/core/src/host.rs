//! What the core asks of the process it runs in, synchronously and in order: the PMIx server
//! the daemon hosts (in the spirit of raft-rs's `Storage`: the shell implements it with its
//! PMIx worker; the simulator with a model) and the daemon's own memory figures.
//!
//! Never: a decision. The order of the calls is the core's and must not change: a job's maps
//! are learned before its namespace is registered, which comes before any of its ranks'
//! environments.

use bytes::Bytes;
use dvm_grpcomm::FenceError;
use dvm_proto::daemon::daemon_cmd;
use dvm_rml::Rank;

use crate::jobmap::Placement;
use crate::Input;

/// What a daemon knows of a job when it starts its local procs.
#[derive(Debug)]
pub struct JobStart<'a> {
    pub jobid: u32,
    pub nspace: String,
    pub placement: Placement,
    /// Host of each daemon of `placement`, in `placement.daemons()` order.
    pub hosts: &'a [String],
    pub nprocs: u32,
    pub nlocal: u32,
    /// Where each bound local rank runs: (rank, its PUs' OS indices as a list "0-3", its
    /// locality "SK0:CR0-1:HT0-3:NM0:"), published to its peers through PMIx.
    pub bound: Vec<(u32, String, String)>,
}

/// How well the daemon's loop keeps time (µs), as its shell measures it: how late its timers
/// fire and the longest single step. Zero where nothing measures (the simulator).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopStats {
    pub late_p50_us: u64,
    pub late_p99_us: u64,
    pub late_max_us: u64,
    pub longest_step_us: u64,
    pub samples: u64,
}

/// The daemon's process as the core sees it.
pub trait Host {
    /// Resident memory of the daemon and what it runs for the DVM (its PMIx worker), KiB.
    fn rss_kib(&mut self) -> u64;
    /// How its loop keeps time.
    fn loop_stats(&mut self) -> LoopStats {
        LoopStats::default()
    }
    /// HNP: the host a daemon was started on and what its process printed (its last lines),
    /// if the boot started it.
    fn launched(&mut self, daemon: Rank) -> Option<(String, String)>;
    /// The daemon went idle: give freed memory back to the system.
    fn trim_heap(&mut self);
    /// A job's maps reached this daemon (hosted here or not).
    fn pmix_learn_job(&mut self, jobid: u32, nspace: String, placement: Placement, hosts: Vec<String>);
    /// Register a job's namespace and its local clients before its first local rank starts;
    /// false: the job runs without PMIx.
    fn pmix_job_start(&mut self, start: JobStart<'_>) -> bool;
    /// The PMIx environment of one local rank.
    fn pmix_proc_env(
        &mut self,
        jobid: u32,
        rank: u32,
        session: Option<String>,
        loopback: bool,
        yield_idle: bool,
    ) -> Vec<(String, String)>;
    /// A local rank ended: the sentence if it was an MPI rank that never finalized.
    fn pmix_proc_exit(&mut self, jobid: u32, rank: u32) -> Option<String>;
    /// Every local rank of a job is gone.
    fn pmix_job_done(&mut self, jobid: u32);
    /// The job ended everywhere.
    fn pmix_forget_job(&mut self, jobid: u32);
    /// A fence started for PMIx finished.
    fn pmix_fence_done(&mut self, key: u64, result: Result<Bytes, FenceError>);
    /// A PMIx event broadcast by another daemon or the HNP.
    fn pmix_deliver_event(&mut self, payload: Bytes);
    /// A daemon command for PMIx hosting (direct modex, spawn and data server answers).
    fn pmix_cmd(&mut self, origin: Rank, body: daemon_cmd::Body);
    /// A broadcast with a tag the daemon itself does not use (the simulator's workloads).
    fn deliver(&mut self, tag: u32, payload: Bytes);
    /// The DVM ends: the PMIx server goes now.
    fn pmix_end_now(&mut self);
    /// What PMIx hosting asks of the router (fences, commands, broadcasts), in order.
    fn pmix_requests(&mut self) -> Vec<Input>;
}
