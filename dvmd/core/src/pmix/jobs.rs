//! A job's namespace on this daemon's server: every job's maps learned, the namespace of a job
//! with local ranks registered (and its local clients) before the first rank starts, each
//! rank's PMIx environment, and the namespace dropped when the job's local ranks are gone.
//!
//! Never starts or ends a worker itself. Do not break: every local client is registered
//! before the first one starts (libpmix 4.2.2 drops a group construct otherwise), and a job's
//! fence signatures are abandoned then forgotten at its end.

use std::collections::BTreeSet;

use tracing::{debug, warn};

use super::{dynamic::Deferred, Pmix, PmixJob, CLIENT_GDS};
use crate::host::{Host, JobStart, Namespace};
use crate::jobmap::Placement;
use crate::jobs::local::YIELD_VAR;
use crate::Input;

/// PMIx hosting's decisions with the server they call: what the local jobs ask of it, in the
/// core's order (a job's maps are learned before its namespace is registered, which comes
/// before any of its ranks' environments).
pub struct With<'a, H> {
    pub pmix: &'a mut Pmix,
    pub host: &'a mut H,
    /// The simple-PMI server beside it (the MPICH family's wire).
    pub pmi: &'a mut crate::pmi::Pmi,
}

impl<H: Host> With<'_, H> {
    /// A job's maps reached this daemon (hosted here or not).
    pub fn pmix_learn_job(&mut self, jobid: u32, nspace: String, placement: Placement, hosts: Vec<String>) {
        self.pmix.learn_job(self.host, jobid, nspace, placement, hosts)
    }
    /// Register a job's namespace and its local clients before its first local rank starts;
    /// false: the job runs without PMIx.
    pub fn pmix_job_start(&mut self, start: JobStart<'_>) -> bool {
        self.pmix.job_start(self.host, start)
    }
    /// The PMIx environment of one local rank.
    pub fn pmix_proc_env(
        &mut self,
        jobid: u32,
        rank: u32,
        session: Option<String>,
        loopback: bool,
        yield_idle: bool,
    ) -> Vec<(String, String)> {
        self.pmix.proc_env(self.host, jobid, rank, session, loopback, yield_idle)
    }
    /// A local rank ended: the sentence if it was an MPI rank that never finalized.
    pub fn pmix_proc_exit(&mut self, jobid: u32, rank: u32) -> Option<String> {
        self.pmix.proc_exit(jobid, rank)
    }
    /// Every local rank of a job is gone.
    pub fn pmix_job_done(&mut self, jobid: u32) {
        self.pmix.job_done(self.host, jobid)
    }
    /// The job ended everywhere.
    pub fn pmix_forget_job(&mut self, jobid: u32) {
        self.pmix.forget_job(self.host, jobid)
    }
}

impl Pmix {
    /// Register a job's namespace before its first local rank starts. False if the daemon
    /// hosts no PMIx server (the job runs without PMIx), or if its server cannot start or
    /// refuses the namespace (then the job fails, naming this node).
    pub fn job_start(&mut self, host: &mut impl Host, job: JobStart<'_>) -> bool {
        match self.ready(host) {
            Ok(true) => {}
            Ok(false) => return false,
            Err(e) => {
                // Its MPI ranks here would start as singletons and the job's other ranks wait
                // for them in their first fence for ever: the job fails, naming this node.
                self.fail_job(job.jobid, &format!("is unavailable: {e}"));
                return false;
            }
        }
        let JobStart { jobid, nspace, placement, hosts, nprocs, nlocal, bound, map } = job;
        let ns =
            Namespace { nspace: &nspace, placement: &placement, hosts, nprocs, nlocal, bound: &bound, map: Some(map) };
        let registered = match host.pmix_register_nspace(&ns) {
            Ok(()) => {
                debug!(jobid, %nspace, "PMIx namespace registered");
                true
            }
            Err(e) => {
                // Its ranks here would start as singletons and the others wait for them in
                // their first fence for ever: the job fails, naming this node.
                warn!(jobid, %nspace, "cannot register the PMIx namespace: {e}");
                self.fail_job(jobid, &format!("could not register job {jobid}: {e}"));
                false
            }
        };
        // Every local client is registered before the first one starts: libpmix 4.2.2 drops
        // a group construct that a fast client sends while another local client of its
        // namespace is still unregistered, and the construct then never completes.
        let clients_registered = registered
            && match host.pmix_register_clients(&nspace, placement.procs_on(self.me).iter().collect()) {
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

    /// The PMIx environment of one local rank: the server's (register_client + setup_fork),
    /// then Open MPI's settings for running under a launcher that is not its own. `session`:
    /// the daemon's scratch directory; `yield_idle`: the rank's machine is oversubscribed, so
    /// it is told to yield while it waits.
    pub fn proc_env(
        &mut self,
        host: &mut impl Host,
        jobid: u32,
        rank: u32,
        session: Option<String>,
        loopback: bool,
        yield_idle: bool,
    ) -> Vec<(String, String)> {
        let Some(job) = self.jobs.get(&jobid).filter(|j| j.registered && !self.ended) else { return Vec::new() };
        let mut env = match host.pmix_prepare_client(&job.nspace, rank, job.clients_registered) {
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
        // sees a Slurm job (SLURM_JOB_ID) but no srun step (no SLURM_STEP_ID).
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
    pub fn proc_exit(&self, jobid: u32, rank: u32) -> Option<String> {
        let job = self.jobs.get(&jobid)?;
        (job.connected.contains(&rank) && !job.finalized.contains(&rank))
            .then(|| format!("rank {rank} on node {} exited without calling MPI_Finalize", self.host))
    }

    /// Every local rank of a job is gone: drop its namespace and fence signatures.
    pub fn job_done(&mut self, host: &mut impl Host, jobid: u32) {
        self.refused.remove(&jobid);
        let Some(job) = self.jobs.remove(&jobid) else { return };
        self.by_nspace.remove(&job.nspace);
        if self.known.contains_key(&job.nspace) {
            self.done_here.insert(job.nspace.clone());
        }
        // The worker may be replaced once libpmix has let go of the namespace (it says so
        // with an upcall), or now if it never held it.
        let mut recycle_now = true;
        if job.registered && !self.ended {
            match host.pmix_deregister_nspace(&job.nspace) {
                Ok(()) => recycle_now = false,
                Err(e) => warn!(jobid, "deregister_nspace: {e}"),
            }
        }
        // A fence still in flight over one of them can never complete (this daemon's ranks are
        // gone): abandon it on every daemon that holds it, then forget the signature.
        for sig in job.sigs {
            self.ask(Input::AbandonFence(sig.clone()));
            self.ask(Input::ForgetFence(sig));
        }
        if recycle_now {
            self.maybe_recycle(host);
        }
    }

    /// Every daemon learns every job's placement (and its daemons' hosts, in placement order)
    /// from its maps broadcast; requests that waited for it go on.
    pub fn learn_job(
        &mut self,
        host: &mut impl Host,
        jobid: u32,
        nspace: String,
        placement: Placement,
        hosts: Vec<String>,
    ) {
        self.known.insert(nspace, (jobid, placement, hosts));
        self.highest_learned = self.highest_learned.max(Some(jobid));
        let waiting = std::mem::take(&mut self.deferred);
        for d in waiting {
            if d.procs().iter().any(|p| !self.known.contains_key(&p.nspace)) {
                self.deferred.push(d);
                continue;
            }
            match d {
                Deferred::Fence { what, procs, collect, data, timeout, reply } => {
                    self.union_fence(host, what, &procs, collect, data, timeout, reply)
                }
                Deferred::Modex { proc, reply } => self.direct_modex(host, proc, reply),
                Deferred::Group { construct, id, procs, directives, reply } => {
                    self.group(construct, id, procs, directives, reply)
                }
            }
        }
    }

    /// A job's cleanup reached this daemon: a namespace registered for it without local procs
    /// is deregistered.
    pub fn forget_job(&mut self, host: &mut impl Host, jobid: u32) {
        self.reported_connects.retain(|jobs| !jobs.contains(&jobid));
        let gone: Vec<String> = self.known.iter().filter(|(_, k)| k.0 == jobid).map(|(n, _)| n.clone()).collect();
        for nspace in gone {
            self.done_here.remove(&nspace);
            // A direct modex of one of its ranks can no longer be answered.
            let stale: Vec<u64> = self.asked.iter().filter(|(_, a)| a.nspace == nspace).map(|(id, _)| *id).collect();
            for id in stale {
                let a = self.asked.remove(&id).expect("listed");
                self.reply(a.reply, crate::pmixdef::ERR_NOT_FOUND);
            }
            self.known.remove(&nspace);
            self.dead.remove(&nspace);
            if self.foreign.remove(&nspace) && !self.ended {
                if let Err(e) = host.pmix_deregister_nspace(&nspace) {
                    warn!(%nspace, "deregister_nspace: {e}");
                }
            }
        }
    }

    /// Register with this daemon's server the namespaces of `procs` it does not host (with no
    /// local procs). libpmix 4.2.2 answers a client's request for a proc of an nspace it never
    /// registered by asking the host, but a direct-modex answer stored for such an nspace
    /// never releases the waiting clients: registered, it does.
    pub(super) fn register_foreign(&mut self, host: &mut impl Host, procs: &[dvm_proto::pmixworker::Proc]) {
        let wanted: BTreeSet<&str> = procs
            .iter()
            .map(|p| p.nspace.as_str())
            .filter(|ns| {
                !self.by_nspace.contains_key(*ns) && !self.foreign.contains(*ns) && !self.done_here.contains(*ns)
            })
            .collect();
        let mut added = Vec::new();
        for nspace in wanted {
            let Some((jobid, placement, hosts)) = self.known.get(nspace) else { continue };
            if self.ended || self.recycle_kib.is_none() {
                return;
            }
            let ns =
                Namespace { nspace, placement, hosts, nprocs: placement.nprocs(), nlocal: 0, bound: &[], map: None };
            match host.pmix_register_nspace(&ns) {
                Ok(()) => {
                    debug!(jobid, nspace, "namespace of another daemon's job registered");
                    added.push(nspace.to_owned());
                }
                Err(e) => warn!(jobid, nspace, "cannot register the namespace of job {jobid}: {e}"),
            }
        }
        self.foreign.extend(added);
    }
}
