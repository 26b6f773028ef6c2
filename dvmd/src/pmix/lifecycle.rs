//! The worker's life: starting one (in the background or when a job needs it), replacing it
//! when the node says so (idle, grown or keeping group records), ending it at termination, and
//! letting go of one that ended by itself.
//!
//! Never answers an upcall or decides when to replace. Do not break: no server starts after
//! `end_now`.

use pmix_shim::ServerConfig;
use tracing::{debug, error, info};

use super::link::Worker;

use super::{server_config, share_topology, PmixHost, PmixSettings};

impl PmixHost {
    /// Resident set size of the worker process (KiB; 0 when none runs).
    pub(crate) fn worker_rss_kib(&self) -> u64 {
        self.worker.as_ref().and_then(Worker::rss_kib).unwrap_or(0)
    }

    pub(super) fn config(&self, settings: &PmixSettings, gen: u64) -> ServerConfig {
        server_config(settings, &self.host, gen)
    }

    /// Start a worker now without waiting for its server, so it is ready (or nearly) when a
    /// job arrives. Nothing happens if one runs or PMIx is not configured.
    pub(crate) fn start_background(&mut self) {
        if self.worker.is_some() {
            return;
        }
        let Some(settings) = self.settings.clone() else { return };
        self.gen += 1;
        let cfg = self.config(&settings, self.gen);
        match Worker::spawn(&cfg, self.gen, self.events.clone()) {
            Ok(w) => {
                debug!(pid = w.pid(), gen = self.gen, "PMIx worker started");
                self.worker = Some(w);
            }
            Err(e) => error!("daemon {} on host {}: {e}; MPI ranks will fail", self.me, self.host),
        }
    }

    /// A server ready for a job: the running worker once its server is up, else a new worker.
    /// Err (logged): why there is none (the node fails the job).
    pub(crate) fn ready(&mut self) -> Result<(), String> {
        self.start_background();
        let Some(w) = self.worker.as_mut() else {
            return Err("its worker process could not be started (see the daemon's log)".into());
        };
        match w.ready() {
            Ok(Some(version)) => {
                info!(%version, pid = w.pid(), topology_shared = share_topology(), "PMIx server up");
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => {
                error!("daemon {} on host {}: PMIx server unavailable: {e}", self.me, self.host);
                self.retire_worker();
                Err(e.to_string())
            }
        }
    }

    /// End the current worker in the background.
    pub(super) fn retire_worker(&mut self) {
        if let Some(w) = self.worker.take() {
            self.retiring.retain(|h| !h.is_finished());
            self.retiring.push(w.retire(self.hurry.clone()));
        }
    }

    /// Replace the worker (the node found it idle and grown, or keeping a group record):
    /// ending it frees what libpmix kept of past clients, and a fresh one is started for the
    /// next job.
    pub(crate) fn replace(&mut self) {
        if let Some(w) = self.worker.as_ref() {
            info!(pid = w.pid(), gen = w.gen, "replacing the idle PMIx worker");
        }
        self.retire_worker();
        self.start_background();
    }

    /// The DVM is terminating: the worker is killed now, without waiting for it (its exit
    /// overlaps the rest of the termination; [`PmixHost::shutdown`] reaps it). No server is
    /// started after this.
    pub(crate) fn end_now(&mut self) {
        self.hurry.store(true, std::sync::atomic::Ordering::Relaxed);
        self.settings = None;
        super::link::discard_preforked();
        self.retire_worker();
    }

    /// The daemon ends: every worker is killed at once and reaped, its directory removed (the
    /// session directory goes next; the HNP kills a daemon that lingers).
    pub(crate) fn shutdown(&mut self) {
        self.end_now();
        for h in self.retiring.drain(..) {
            let _ = h.join();
        }
    }

    /// The current worker ended by itself (crashed, killed): let it go; its pid, for the node
    /// (which fails the jobs that used it). The next job gets a new worker.
    pub(crate) fn lost(&mut self) -> u32 {
        let pid = self.worker.as_ref().map_or(0, Worker::pid);
        self.retire_worker();
        pid
    }
}
