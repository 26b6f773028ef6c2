//! A job's namespace on this daemon's server: registering it (and its local clients) before
//! the first rank starts, each rank's PMIx environment, and dropping it when the job's local
//! ranks are gone.
//!
//! Never starts or ends a worker except through `ensure`/`maybe_recycle`. Do not break: every
//! local client is registered before the first one starts (libpmix 4.2.2 drops a group
//! construct otherwise), and a job's fence signatures are abandoned then forgotten at its end.

use std::collections::BTreeSet;

use dvm_core::Input as CoreInput;
use tracing::{debug, warn};

use super::{job_info, JobStart, PmixHost, PmixJob, CLIENT_GDS, YIELD_VAR};

impl PmixHost {
    /// Register a job's namespace before its first local rank starts. Returns false (the job
    /// runs without PMIx) if there is no server or it refuses the namespace.
    pub(crate) fn job_start(&mut self, job: JobStart<'_>) -> bool {
        if !self.ensure() {
            return false;
        }
        let JobStart { jobid, nspace, placement, hosts, nprocs, nlocal, bound } = job;
        let info = job_info(&nspace, &placement, hosts, nprocs);
        let w = self.worker.as_ref().expect("ensured above");
        let registered = match w.register_nspace(&nspace, nlocal, &info, &bound) {
            Ok(()) => {
                debug!(jobid, %nspace, "PMIx namespace registered");
                true
            }
            Err(e) => {
                warn!(jobid, %nspace, "cannot register the PMIx namespace: {e}");
                false
            }
        };
        // Every local client is registered before the first one starts: libpmix 4.2.2 drops
        // a group construct that a fast client sends while another local client of its
        // namespace is still unregistered (its re-check of pending collectives knows fences
        // and connects only), and the construct then never completes.
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let clients_registered = registered
            && match w.register_clients(&nspace, placement.procs_on(self.me).iter().collect(), uid, gid) {
                Ok(()) => true,
                Err(e) => {
                    warn!(jobid, %nspace, "cannot register the local PMIx clients at once: {e}");
                    false
                }
            };
        self.by_nspace.insert(nspace.clone(), jobid);
        let job = PmixJob {
            nspace,
            placement,
            registered,
            clients_registered,
            connected: BTreeSet::new(),
            finalized: BTreeSet::new(),
            sigs: BTreeSet::new(),
        };
        self.jobs.insert(jobid, job);
        registered
    }

    /// The PMIx environment of one local rank (register_client + setup_fork + Open MPI's
    /// settings for running under a non-mpirun launcher). `session`: the daemon's scratch
    /// directory; `yield_idle`: the rank's machine is oversubscribed (see [`oversubscribed`]),
    /// so it is told to yield while it waits.
    pub(crate) fn proc_env(
        &mut self,
        jobid: u32,
        rank: u32,
        session: Option<String>,
        loopback: bool,
        yield_idle: bool,
    ) -> Vec<(String, String)> {
        let (Some(w), Some(job)) = (self.worker.as_ref(), self.jobs.get(&jobid).filter(|j| j.registered)) else {
            return Vec::new();
        };
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        let mut env = match w.prepare_client(&job.nspace, rank, uid, gid, job.clients_registered) {
            Ok(env) => env,
            Err(e) => {
                warn!(jobid, rank, "cannot prepare the PMIx client: {e}");
                return Vec::new();
            }
        };
        // setup_fork offers every store libpmix has (the client picks the first): offer one.
        env.retain(|(k, _)| k != "PMIX_GDS_MODULE");
        env.push(("PMIX_GDS_MODULE".into(), CLIENT_GDS.into()));
        // Open MPI 4.1 treats a rank it did not start as a singleton without this: its `orte`
        // component wants its own mpirun, and its `slurm` component forces a singleton when it
        // sees a Slurm job (SLURM_JOB_ID) but no srun step (no SLURM_STEP_ID), as in a batch
        // script.
        env.push(("OMPI_MCA_schizo".into(), "^orte,slurm".into()));
        if let Some(dir) = session {
            // Several daemons per host: shared-memory segments and Open MPI's session
            // directories must not collide.
            env.push(("OMPI_MCA_btl_vader_backing_directory".into(), dir.clone()));
            env.push(("OMPI_MCA_orte_tmpdir_base".into(), dir));
        }
        if loopback {
            env.push(("OMPI_MCA_btl_tcp_if_include".into(), "lo".into()));
            env.push(("OMPI_MCA_oob_tcp_if_include".into(), "lo".into()));
        }
        if yield_idle {
            env.push((YIELD_VAR.into(), "1".into()));
        }
        env
    }

    /// A local rank ended: was it an MPI rank that never finalized?
    pub(crate) fn proc_exit(&self, jobid: u32, rank: u32) -> Option<String> {
        let job = self.jobs.get(&jobid)?;
        (job.connected.contains(&rank) && !job.finalized.contains(&rank))
            .then(|| format!("rank {rank} on node {} exited without calling MPI_Finalize", self.host))
    }

    /// Every local rank of a job is gone: drop its namespace and fence signatures.
    pub(crate) fn job_done(&mut self, jobid: u32) {
        let Some(job) = self.jobs.remove(&jobid) else { return };
        self.by_nspace.remove(&job.nspace);
        // The worker may be replaced once libpmix has let go of the namespace
        // (NspaceDeregistered), or now if it never held it.
        let mut recycle_now = true;
        if let (true, Some(w)) = (job.registered, self.worker.as_ref()) {
            match w.deregister_nspace_nb(&job.nspace) {
                Ok(()) => recycle_now = false,
                Err(e) => warn!(jobid, "deregister_nspace: {e}"),
            }
        }
        // A fence still in flight over one of them can never complete (this daemon's ranks are
        // gone): abandon it on every daemon that holds it, then forget the signature.
        for sig in job.sigs {
            self.out.push(CoreInput::AbandonFence(sig.clone()));
            self.out.push(CoreInput::ForgetFence(sig));
        }
        if recycle_now {
            self.maybe_recycle();
        }
    }
}
