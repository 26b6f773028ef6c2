//! The shell's side of [`dvm_core::Host`]: the PMIx worker (through `pmix::PmixHost`), the
//! daemon's memory figures, and what the boot's processes printed.

use std::collections::BTreeMap;

use bytes::Bytes;
use dvm_core::jobmap::Placement;
use dvm_core::{Host, Input, JobStart};
use dvm_grpcomm::FenceError;
use dvm_proto::daemon::daemon_cmd;
use dvm_rml::Rank;
use tracing::warn;

use crate::launch::OutputTail;
use crate::pmix::PmixHost;

/// What the node calls synchronously.
pub struct ShellHost {
    pub pmix: PmixHost,
    /// How the daemon's loop keeps time (fed by `Daemon::run`).
    pub meter: crate::loopmeter::LoopMeter,
    /// HNP: the daemons the boot started (host, what they print).
    pub launched: BTreeMap<Rank, (String, OutputTail)>,
    /// HNP: the step that started every other daemon (its description, what it prints).
    pub launch_step: Option<(String, OutputTail)>,
}

impl ShellHost {
    pub fn new(pmix: PmixHost) -> ShellHost {
        ShellHost { pmix, meter: Default::default(), launched: BTreeMap::new(), launch_step: None }
    }
}

impl Host for ShellHost {
    fn rss_kib(&mut self) -> u64 {
        // The daemon and its PMIx worker: what the node pays for this daemon.
        crate::sys::rss_kib() + self.pmix.worker_rss_kib()
    }
    fn loop_stats(&mut self) -> dvm_core::LoopStats {
        self.meter.stats()
    }
    fn launched(&mut self, daemon: Rank) -> Option<(String, String)> {
        self.launched.get(&daemon).map(|(h, out)| (h.clone(), out.text()))
    }
    fn trim_heap(&mut self) {
        crate::sys::trim_heap();
    }
    fn pmix_learn_job(&mut self, jobid: u32, nspace: String, placement: Placement, hosts: Vec<String>) {
        self.pmix.learn_job(jobid, nspace, placement, hosts);
    }
    fn pmix_job_start(&mut self, start: JobStart<'_>) -> bool {
        self.pmix.job_start(start)
    }
    fn pmix_proc_env(
        &mut self,
        jobid: u32,
        rank: u32,
        session: Option<String>,
        loopback: bool,
        yield_idle: bool,
    ) -> Vec<(String, String)> {
        self.pmix.proc_env(jobid, rank, session, loopback, yield_idle)
    }
    fn pmix_proc_exit(&mut self, jobid: u32, rank: u32) -> Option<String> {
        self.pmix.proc_exit(jobid, rank)
    }
    fn pmix_job_done(&mut self, jobid: u32) {
        self.pmix.job_done(jobid);
    }
    fn pmix_forget_job(&mut self, jobid: u32) {
        self.pmix.forget_job(jobid);
    }
    fn pmix_fence_done(&mut self, key: u64, result: Result<Bytes, FenceError>) {
        self.pmix.fence_done(key, result);
    }
    fn pmix_deliver_event(&mut self, payload: Bytes) {
        self.pmix.deliver_event(payload);
    }
    fn pmix_cmd(&mut self, origin: Rank, body: daemon_cmd::Body) {
        match body {
            daemon_cmd::Body::DmodexReq(req) => self.pmix.serve_dmodex(origin, req),
            daemon_cmd::Body::DmodexResp(resp) => self.pmix.on_dmodex_resp(resp),
            daemon_cmd::Body::SpawnResp(resp) => self.pmix.on_spawn_resp(resp),
            daemon_cmd::Body::DataResp(resp) => self.pmix.on_data_resp(resp),
            other => warn!(origin, "unexpected daemon command for PMIx {other:?}"),
        }
    }
    fn deliver(&mut self, tag: u32, _payload: Bytes) {
        warn!(tag, "a broadcast with a tag no daemon uses");
    }
    fn pmix_end_now(&mut self) {
        self.pmix.end_now();
    }
    fn pmix_requests(&mut self) -> Vec<Input> {
        self.pmix.drain().collect()
    }
}
