//! What the core asks of the process it runs in, synchronously and in order: the PMIx server
//! the daemon hosts (in the spirit of raft-rs's `Storage`: the shell implements it with its
//! PMIx worker; the simulator with a model) and the daemon's own memory figures. What each
//! upcall becomes is decided in [`crate::pmix`]; the server only carries it out.
//!
//! Never: a decision. The order of the calls is the core's and must not change: a job's maps
//! are learned before its namespace is registered, which comes before any of its ranks'
//! environments.

use bytes::Bytes;
use dvm_proto::job::JobMap;
use dvm_proto::pmixworker as wire;
use dvm_rml::Rank;

use crate::jobmap::Placement;

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
    /// The job's map as launched: its apps' argv and wdir, its mapping and binding policy.
    pub map: &'a JobMap,
}

/// A namespace as the server is told it: the job's maps (libpmix derives the rest).
#[derive(Debug)]
pub struct Namespace<'a> {
    pub nspace: &'a str,
    pub placement: &'a Placement,
    /// Host of each daemon of `placement`, in `placement.daemons()` order.
    pub hosts: &'a [String],
    pub nprocs: u32,
    /// Its procs on this daemon (0: a job of another daemon, for a connect or direct modex).
    pub nlocal: u32,
    /// Where each bound local rank runs, as in [`JobStart::bound`].
    pub bound: &'a [(u32, String, String)],
    /// The job's map, as in [`JobStart::map`] (None: a job of other daemons, known by its
    /// placement only).
    pub map: Option<&'a JobMap>,
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
    /// The PMIx server is up (its worker started now if none runs); Err: why none can run.
    fn pmix_ready(&mut self) -> Result<(), String>;
    /// Register a namespace with the server (`nlocal` 0: a job with no proc here).
    fn pmix_register_nspace(&mut self, ns: &Namespace<'_>) -> Result<(), String>;
    /// Register these local ranks of a namespace as clients, all at once.
    fn pmix_register_clients(&mut self, nspace: &str, ranks: Vec<u32>) -> Result<(), String>;
    /// The server's environment for one local rank (`registered`: its client is registered).
    fn pmix_prepare_client(
        &mut self,
        nspace: &str,
        rank: u32,
        registered: bool,
    ) -> Result<Vec<(String, String)>, String>;
    /// Let go of a namespace (the server says when with a `NspaceDeregistered` upcall).
    fn pmix_deregister_nspace(&mut self, nspace: &str) -> Result<(), String>;
    /// Ask the server for a local rank's modex blob: the request's id, answered by a
    /// `DmodexData` upcall.
    fn pmix_dmodex_request(&mut self, nspace: &str, rank: u32) -> Result<u64, String>;
    /// Hand an event to the server for its clients.
    fn pmix_notify(&mut self, event: wire::Notify) -> Result<(), String>;
    /// How much the running worker grew since it was first idle after a job (KiB); None when
    /// none runs.
    fn pmix_growth_kib(&mut self) -> Option<u64>;
    /// A broadcast with a tag the daemon itself does not use (the simulator's workloads).
    fn deliver(&mut self, tag: u32, payload: Bytes);
}
