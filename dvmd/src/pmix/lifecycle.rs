//! The worker's life as the host sees it: starting one (in the background or when a job needs
//! it), replacing an idle one that grew or keeps group records, ending it at termination, and
//! what happens to the jobs when it is lost.
//!
//! Never answers an upcall. Do not break: a worker is replaced only when idle (no namespace,
//! no fence, no direct modex, spawn or data request in flight), never under a running job; no
//! server starts after `end_now`.

use dvm_proto::daemon::{daemon_cmd, JobFail};
use pmix_shim::ServerConfig;
use tracing::{debug, error, info};

use super::link::Worker;

use super::{server_config, share_topology, PmixHost, PmixSettings};

impl PmixHost {
    /// Resident set size of the worker process (KiB; 0 when none runs).
    pub(crate) fn worker_rss_kib(&self) -> u64 {
        self.worker.as_ref().and_then(Worker::rss_kib).unwrap_or(0)
    }

    /// Nothing of any job is left in the worker, and nobody waits on it.
    pub(super) fn idle(&self) -> bool {
        self.jobs.is_empty()
            && self.fences.is_empty()
            && self.asked.is_empty()
            && self.serving.is_empty()
            && self.spawns.is_empty()
            && self.data.is_empty()
            && self.deferred.is_empty()
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
    /// False (logged) if there is none: MPI ranks then fail at MPI_Init, other jobs run.
    pub(super) fn ensure(&mut self) -> bool {
        self.start_background();
        let Some(w) = self.worker.as_mut() else { return false };
        match w.ready() {
            Ok(Some(version)) => {
                info!(%version, pid = w.pid(), topology_shared = share_topology(), "PMIx server up");
                true
            }
            Ok(None) => true,
            Err(e) => {
                error!("daemon {} on host {}: PMIx server unavailable, MPI ranks will fail: {e}", self.me, self.host);
                self.retire_worker();
                false
            }
        }
    }

    /// End the current worker in the background.
    pub(super) fn retire_worker(&mut self) {
        self.foreign.clear();
        self.group_records.clear();
        if let Some(w) = self.worker.take() {
            self.retiring.retain(|h| !h.is_finished());
            self.retiring.push(w.retire(self.hurry.clone()));
        }
    }

    /// Replace an idle worker that has grown past the limit, or that keeps a group record a
    /// later job could trip on: ending it frees what libpmix kept of past clients, and a fresh
    /// one is started for the next job.
    pub(super) fn maybe_recycle(&mut self) {
        let Some(limit) = self.settings.as_ref().map(|s| s.recycle_kib) else { return };
        if !self.idle() {
            return;
        }
        let Some(w) = self.worker.as_mut() else { return };
        let grown = w.idle_growth_kib();
        if grown < limit && self.group_records.is_empty() {
            return;
        }
        info!(
            pid = w.pid(),
            gen = w.gen,
            grown_kib = grown,
            group_records = ?self.group_records,
            "replacing the idle PMIx worker"
        );
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

    /// The current worker ended by itself (crashed, killed): every job with ranks here loses
    /// its PMIx server, so each fails naming this node; the next job gets a new worker.
    pub(super) fn worker_lost(&mut self, how: &str) {
        let pid = self.worker.as_ref().map_or(0, Worker::pid);
        error!("daemon {} on host {}: its PMIx server process (pid {pid}) ended: {how}", self.me, self.host);
        let jobs: Vec<u32> = self.jobs.keys().copied().collect();
        for jobid in jobs {
            let reason = format!(
                "the PMIx server of daemon {} on node {} (pid {pid}) ended while job {jobid} ran: {how}",
                self.me, self.host
            );
            self.send_cmd(0, daemon_cmd::Body::JobFail(JobFail { jobid, code: 1, reason, daemon: self.me }));
        }
        // What the lost worker held is gone with it; the jobs keep their entries until their
        // procs end (exits still need `proc_exit`), but no reply can be answered any more.
        for job in self.jobs.values_mut() {
            job.registered = false;
        }
        self.fences.clear();
        self.asked.clear();
        self.serving.clear();
        self.spawns.clear();
        self.data.clear();
        self.deferred.clear();
        self.retire_worker();
    }
}
