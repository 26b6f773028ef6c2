//! The shell's side of [`dvm_core::Host`]: the PMIx worker (through `pmix::PmixHost`), the
//! daemon's memory figures, and what the boot's processes printed.

use std::collections::BTreeMap;

use bytes::Bytes;
use dvm_core::{Host, Namespace};
use dvm_proto::pmixworker as wire;
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
    fn pmix_ready(&mut self) -> Result<(), String> {
        timed("ready", || self.pmix.ready())
    }
    fn pmix_register_nspace(&mut self, ns: &Namespace<'_>) -> Result<(), String> {
        timed("register_nspace", || self.pmix.register_nspace(ns))
    }
    fn pmix_register_clients(&mut self, nspace: &str, ranks: Vec<u32>) -> Result<(), String> {
        timed("register_clients", || self.pmix.register_clients(nspace, ranks))
    }
    fn pmix_prepare_client(
        &mut self,
        nspace: &str,
        rank: u32,
        registered: bool,
    ) -> Result<Vec<(String, String)>, String> {
        timed("prepare_client", || self.pmix.prepare_client(nspace, rank, registered))
    }
    fn pmix_deregister_nspace(&mut self, nspace: &str) -> Result<(), String> {
        timed("deregister_nspace", || self.pmix.deregister_nspace(nspace))
    }
    fn pmix_dmodex_request(&mut self, nspace: &str, rank: u32) -> Result<u64, String> {
        timed("dmodex_request", || self.pmix.dmodex_request(nspace, rank))
    }
    fn pmix_notify(&mut self, event: wire::Notify) -> Result<(), String> {
        timed("notify", || self.pmix.notify(event))
    }
    fn pmix_growth_kib(&mut self) -> Option<u64> {
        timed("growth_kib", || self.pmix.growth_kib())
    }
    fn deliver(&mut self, tag: u32, _payload: Bytes) {
        warn!(tag, "a broadcast with a tag no daemon uses");
    }
}

/// A call to the PMIx worker that took longer than this is named in a warning: each holds the
/// daemon's loop for as long as it takes (a 10 s worker timeout would show here by name).
const SLOW_CALL: std::time::Duration = std::time::Duration::from_millis(100);

/// Run one synchronous call to the PMIx worker, warning when it held the loop past [`SLOW_CALL`].
fn timed<T>(call: &'static str, f: impl FnOnce() -> T) -> T {
    let t0 = std::time::Instant::now();
    let out = f();
    let took = t0.elapsed();
    if took >= SLOW_CALL {
        warn!(call, ms = took.as_millis() as u64, "a call to the PMIx worker held the daemon's loop");
    }
    out
}
