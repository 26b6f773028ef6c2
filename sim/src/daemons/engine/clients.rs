//! Simulated MPI ranks (`sim-mpi K`) as their daemon's PMIx server presents them (ranks that
//! speak PMI on their fd instead, `sim-mpi K pmi1|pmi2|pmi12`, are `pmi_ranks.rs`'s; a rank
//! offered no interface it speaks runs as a singleton and exits 0): once every
//! local rank of a job has started, the server makes a fence upcall over the whole job (libpmix
//! gathers its local ranks into one); each success starts the next, up to K; after the first,
//! it asks for the modex of a rank on another daemon (a direct modex, which the owner's server
//! answers from its clients' data). After the K-th the ranks exit 0; a failed fence makes them
//! exit 1 (an MPI abort).
//!
//! Judged here, as the run goes and at its end: every upcall is answered at most once, and a
//! reply never names an upcall that was not made; every fence gives every daemon the same
//! bytes; a direct modex gets the owner's data; at the end, an upcall of a daemon still running
//! whose ranks still run was answered, and a daemon with no job left holds no request.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use dvm_core::harness::Program;
use dvm_core::jobs::{ExitKind, ProcEvent};
use dvm_core::pmix::PmixEffect;
use dvm_core::pmixdef::{RANK_WILDCARD, SUCCESS};
use dvm_grpcomm::Rank;
use dvm_proto::pmixworker::{self as wire, worker_event::Body as Ev};
use rand::Rng;

use super::{CoreEngine, Kind, State};
use crate::daemons::scenario::MpiWire;

/// Reply ids of the simulated clients' upcalls start here (spawns use the launch index + 1).
pub(super) const CLIENT_REPLY_BASE: u64 = 1 << 40;

/// What an upcall asked.
#[derive(Debug, Clone, Copy)]
enum Ask {
    Fence { job: u32, k: u32, of: u32 },
    Modex { job: u32, rank: u32 },
}

#[derive(Default)]
pub(super) struct Clients {
    /// Local MPI ranks started, by (daemon, job), and the fences each job runs.
    started: BTreeMap<(Rank, u32), (BTreeSet<u32>, u32)>,
    /// Jobs whose fence chain began on a daemon.
    began: BTreeSet<(Rank, u32)>,
    outstanding: BTreeMap<(Rank, u64), Ask>,
    next_reply: u64,
    /// The first daemon's result of each fence (job, k).
    results: BTreeMap<(u32, u32), (Rank, Bytes)>,
    pub upcalls: u64,
    /// Deaths of each daemon: an upcall of a server that died with its daemon never reaches
    /// the daemon's next incarnation.
    deaths: BTreeMap<Rank, u32>,
}

/// What a rank's server holds as its modex (what a direct modex of it must return).
fn blob(nspace: &str, rank: u32) -> Bytes {
    Bytes::from(format!("modex of {nspace}:{rank}"))
}

impl CoreEngine<'_> {
    pub(super) fn nspace(&self, job: u32) -> String {
        dvm_core::jobs::nspace_of(&self.nodes[0].node.router().dvm_id(), job)
    }

    /// A proc started on `r`: an MPI rank joins its job's local ranks; once all have, the
    /// server's first fence upcall comes.
    pub(super) fn client_started(&mut self, r: Rank, job: u32, rank: u32) {
        let Some(p) = self.nodes[r as usize].shell.procs.get(&(job, rank)) else { return };
        let Program::Mpi { fences } = Program::of(&p.spec.argv) else { return };
        match MpiWire::of(&p.spec.argv) {
            Some((MpiWire::Pmix, _)) => {}
            Some((wire, _)) => return self.pmi_rank_started(r, job, rank, wire, fences),
            None => return,
        }
        if !p.spec.env.iter().any(|(k, _)| k == "PMIX_NAMESPACE") {
            // Offered no PMIx server (`--mpi pmi1` or `none`): it runs as a singleton.
            return self.rank_exit(r, job, rank, 0);
        }
        let ns = self.nspace(job);
        let nlocal = self.nodes[r as usize].node.host().namespaces.get(&ns).map_or(0, |n| n.0);
        let entry = self.clients.started.entry((r, job)).or_insert_with(|| (BTreeSet::new(), fences));
        entry.0.insert(rank);
        if entry.0.len() as u32 >= nlocal && nlocal > 0 && self.clients.began.insert((r, job)) {
            self.fence_upcall(r, job, 1, fences);
        }
    }

    fn upcall(&mut self, r: Rank, ask: Option<Ask>, body: Ev) {
        let reply = match ask {
            Some(a) => {
                self.clients.next_reply += 1;
                let id = CLIENT_REPLY_BASE + self.clients.next_reply;
                self.clients.outstanding.insert((r, id), a);
                id
            }
            None => 0,
        };
        self.clients.upcalls += 1;
        let think = self.rng.gen_range(0..=self.sc.think_ns);
        let ev = wire::WorkerEvent { reply, body: Some(body) };
        let life = self.clients.deaths.get(&r).copied().unwrap_or(0);
        self.q.push(self.q.now() + think, Kind::Upcall { daemon: r, life, ev });
    }

    fn fence_upcall(&mut self, r: Rank, job: u32, k: u32, of: u32) {
        let procs = vec![wire::Proc { nspace: self.nspace(job), rank: RANK_WILDCARD }];
        let data = Bytes::from(format!("d{r}j{job}k{k};"));
        let f = wire::Fence { procs, collect: k % 2 == 1, data, ..Default::default() };
        self.q.note(|| format!("d{r} PMIX FENCE job {job} {k}/{of}"));
        self.upcall(r, Some(Ask::Fence { job, k, of }), Ev::Fence(f));
    }

    /// An upcall reaches daemon `r`'s node (a frozen daemon's server waits with it).
    pub(super) fn deliver_upcall(&mut self, r: Rank, life: u32, ev: wire::WorkerEvent) {
        if self.clients.deaths.get(&r).copied().unwrap_or(0) != life {
            return;
        }
        match self.nodes[r as usize].state {
            State::Running => self.drive_in(r, super::shell::In::Pmix(ev)),
            State::Stopped => self.nodes[r as usize].deferred.push(Kind::Upcall { daemon: r, life, ev }),
            State::Dead { .. } => {}
        }
    }

    /// After a step of `r`: its answers to upcalls, and what its server was asked to serve.
    pub(super) fn after_pmix(&mut self, r: Rank) {
        let requests = std::mem::take(&mut self.nodes[r as usize].node.host_mut().dmodex);
        for (request, (nspace, rank)) in requests {
            let d = wire::DmodexData { request, status: SUCCESS, data: blob(&nspace, rank), proc: None };
            self.upcall(r, None, Ev::DmodexData(d));
        }
        for e in std::mem::take(&mut self.nodes[r as usize].shell.pmix) {
            let PmixEffect::Reply { reply, status, data } = e else { continue };
            if reply < CLIENT_REPLY_BASE {
                if r != 0 {
                    self.trace.pmix_errors.push(format!("daemon {r}: a reply {reply} to an upcall never made there"));
                } else if let Some(a) = self.trace.spawn_answers.get_mut((reply - 1) as usize) {
                    a.push(status);
                }
                continue;
            }
            self.on_reply(r, reply, status, data);
        }
    }

    fn on_reply(&mut self, r: Rank, reply: u64, status: i32, data: Bytes) {
        let Some(ask) = self.clients.outstanding.remove(&(r, reply)) else {
            self.trace.pmix_errors.push(format!("daemon {r}: upcall {reply} answered twice, or never made"));
            return;
        };
        self.q.note(|| format!("d{r} PMIX REPLY {ask:?} status {status}"));
        match ask {
            Ask::Fence { job, k, of } => {
                if status != SUCCESS {
                    return self.ranks_exit(r, job, 1);
                }
                match self.clients.results.get(&(job, k)) {
                    Some((first, bytes)) if *bytes != data => self.trace.pmix_errors.push(format!(
                        "fence {k} of job {job}: daemon {r} got {} bytes, daemon {first} {}",
                        data.len(),
                        bytes.len()
                    )),
                    Some(_) => {}
                    None => drop(self.clients.results.insert((job, k), (r, data))),
                }
                if k == 1 {
                    self.modex_upcall(r, job);
                }
                if k < of {
                    self.fence_upcall(r, job, k + 1, of);
                } else {
                    self.ranks_exit(r, job, 0);
                }
            }
            Ask::Modex { job, rank } => {
                let want = blob(&self.nspace(job), rank);
                if status == SUCCESS && data != want {
                    self.trace
                        .pmix_errors
                        .push(format!("daemon {r}: the direct modex of rank {rank} of job {job} got {data:?}"));
                }
            }
        }
    }

    /// Ask for the modex of the job's first rank not on `r`.
    fn modex_upcall(&mut self, r: Rank, job: u32) {
        let ns = self.nspace(job);
        let nprocs = self.nodes[r as usize].node.host().namespaces.get(&ns).map_or(0, |n| n.1);
        let local = self.clients.started.get(&(r, job)).map(|s| s.0.clone()).unwrap_or_default();
        let Some(rank) = (0..nprocs).find(|x| !local.contains(x)) else { return };
        self.upcall(r, Some(Ask::Modex { job, rank }), Ev::DirectModex(wire::Proc { nspace: ns, rank }));
    }

    /// The job's local ranks on `r` exit with `code`.
    fn ranks_exit(&mut self, r: Rank, job: u32, code: i32) {
        let now = self.q.now();
        let think = self.rng.gen_range(0..=self.sc.think_ns);
        let mut due = Vec::new();
        for ((j, rank), p) in self.nodes[r as usize].shell.procs.iter_mut() {
            if *j == job && !p.ending {
                p.ending = true;
                due.push(ProcEvent::Exited { jobid: job, rank: *rank, pid: p.pid, status: ExitKind::Code(code) });
            }
        }
        for ev in due {
            self.q.push(now + think, Kind::Proc { daemon: r, ev });
        }
    }

    /// One rank of a job on `r` exits with `code`.
    pub(super) fn rank_exit(&mut self, r: Rank, job: u32, rank: u32, code: i32) {
        let think = self.rng.gen_range(0..=self.sc.think_ns);
        let Some(p) = self.nodes[r as usize].shell.procs.get_mut(&(job, rank)).filter(|p| !p.ending) else { return };
        p.ending = true;
        let ev = ProcEvent::Exited { jobid: job, rank, pid: p.pid, status: ExitKind::Code(code) };
        self.q.push(self.q.now() + think, Kind::Proc { daemon: r, ev });
    }

    /// Daemon `r` died: its clients and their upcalls with it.
    pub(super) fn clients_died(&mut self, r: Rank) {
        *self.clients.deaths.entry(r).or_default() += 1;
        self.clients.outstanding.retain(|(d, _), _| *d != r);
        self.clients.started.retain(|(d, _), _| *d != r);
        self.clients.began.retain(|(d, _)| *d != r);
        self.pmi_ranks_died(r);
    }

    /// At the end of the run: upcalls left unanswered where their ranks still run, and
    /// requests kept by a daemon whose jobs all ended.
    pub(super) fn finish_clients(&mut self) {
        self.trace.pmix_upcalls = self.clients.upcalls;
        for (&(r, id), ask) in &self.clients.outstanding {
            let n = &self.nodes[r as usize];
            let job = match *ask {
                Ask::Fence { job, .. } | Ask::Modex { job, .. } => job,
            };
            if n.state == State::Running && n.shell.procs.keys().any(|&(j, _)| j == job) {
                self.trace.pmix_errors.push(format!("daemon {r}: upcall {id} ({ask:?}) never answered"));
            }
        }
        for (r, n) in self.nodes.iter().enumerate() {
            if n.state == State::Running && n.node.local_jobs().is_empty() && n.node.pmix().waiting() > 0 {
                let waiting = n.node.pmix().waiting();
                self.trace
                    .pmix_errors
                    .push(format!("daemon {r}: holds {waiting} PMIx request(s) after its jobs ended"));
            }
        }
    }
}
