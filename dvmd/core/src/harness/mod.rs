//! The in-memory stand-ins for what surrounds a [`crate::Node`]: a PMIx host ([`SimHost`]), a shell
//! that carries out a node's effects on simulated processes and prun streams ([`SimShell`]),
//! and a small network of nodes for the core's unit tests ([`Net`]). The simulator (`dvm-sim`)
//! drives its nodes through the same [`SimShell`], so the drain is written once.
//!
//! A simulated proc does what its argv says ([`Program`]): `sim-exit CODE US` exits with CODE
//! after US µs, `sim-hang` runs until killed, `sim-signal SIG US` dies by SIG after US µs,
//! `sim-print TEXT US` writes TEXT to stdout then exits 0 after US µs, `sim-mpi K` runs K
//! PMIx fences through its daemon's server (driven by the simulator). Anything else exits 0 at
//! once.
//!
//! Never: a socket, a thread or a clock.

mod disk;
mod net;

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use dvm_proto::control::job_event;
use dvm_proto::pmixworker as wire;
use dvm_rml::Rank;

use crate::host::{Host, Namespace};
use crate::jobs::{ClientId, ExitKind, Forward, ProcCmd, ProcEvent, ProcSpec, Stream};
use crate::node::{Effect, Reply, Transmit};
use crate::Exit;

pub use disk::SimDisk;
pub use net::{contact, job, Net, LATENCY_NS};

/// A PMIx server as the node sees it: it registers what it is told, serves direct-modex
/// requests by id (the driver answers each with a `DmodexData` upcall), keeps the events it is
/// handed, and says how much its worker grew.
#[derive(Debug, Default)]
pub struct SimHost {
    /// No server can start (`pmix_ready` fails).
    pub broken: bool,
    /// The server refuses to register namespaces, with this error.
    pub refuse_register: Option<String>,
    /// Namespaces registered and not let go: (local procs, procs of the job).
    pub namespaces: BTreeMap<String, (u32, u32)>,
    /// Namespaces let go, in order.
    pub deregistered: Vec<String>,
    /// Direct-modex requests asked of the server and not answered: id -> (nspace, rank).
    pub dmodex: BTreeMap<u64, (String, u32)>,
    next_request: u64,
    /// Events handed to the server, in order.
    pub events: Vec<wire::Notify>,
    /// Broadcasts of tags the node does not use, in order.
    pub delivered: Vec<(u32, Bytes)>,
    /// What the worker grew by since it was first idle (KiB).
    pub growth_kib: u64,
    pub trims: u64,
}

impl Host for SimHost {
    fn rss_kib(&mut self) -> u64 {
        0
    }
    fn launched(&mut self, _daemon: Rank) -> Option<(String, String)> {
        None
    }
    fn trim_heap(&mut self) {
        self.trims += 1;
    }
    fn pmix_ready(&mut self) -> Result<(), String> {
        match self.broken {
            true => Err("its worker exited at once".into()),
            false => Ok(()),
        }
    }
    fn pmix_register_nspace(&mut self, ns: &Namespace<'_>) -> Result<(), String> {
        if let Some(e) = &self.refuse_register {
            return Err(e.clone());
        }
        self.namespaces.insert(ns.nspace.to_owned(), (ns.nlocal, ns.nprocs));
        Ok(())
    }
    fn pmix_register_clients(&mut self, nspace: &str, _ranks: Vec<u32>) -> Result<(), String> {
        match self.namespaces.contains_key(nspace) {
            true => Ok(()),
            false => Err(format!("namespace {nspace} is not registered")),
        }
    }
    fn pmix_prepare_client(&mut self, nspace: &str, rank: u32, _: bool) -> Result<Vec<(String, String)>, String> {
        Ok(vec![("PMIX_RANK".into(), rank.to_string()), ("PMIX_NAMESPACE".into(), nspace.to_owned())])
    }
    fn pmix_deregister_nspace(&mut self, nspace: &str) -> Result<(), String> {
        self.namespaces.remove(nspace);
        self.deregistered.push(nspace.to_owned());
        Ok(())
    }
    fn pmix_dmodex_request(&mut self, nspace: &str, rank: u32) -> Result<u64, String> {
        self.next_request += 1;
        self.dmodex.insert(self.next_request, (nspace.to_owned(), rank));
        Ok(self.next_request)
    }
    fn pmix_notify(&mut self, event: wire::Notify) -> Result<(), String> {
        self.events.push(event);
        Ok(())
    }
    fn pmix_growth_kib(&mut self) -> Option<u64> {
        Some(self.growth_kib)
    }
    fn deliver(&mut self, tag: u32, payload: Bytes) {
        self.delivered.push((tag, payload));
    }
}

/// What a simulated proc does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    Exit {
        code: i32,
        after_ns: u64,
    },
    Signal {
        signal: i32,
        after_ns: u64,
    },
    Print {
        text: String,
        after_ns: u64,
    },
    Hang,
    /// An MPI rank: it runs `fences` PMIx fences (and a direct modex) through its daemon's
    /// server, then exits 0; the simulator's clients drive it (`sim/src/daemons/engine/clients.rs`).
    Mpi {
        fences: u32,
    },
}

impl Program {
    /// From a proc's argv (see the module docs).
    pub fn of(argv: &[String]) -> Program {
        let num = |i: usize| argv.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        match argv.first().map(String::as_str) {
            Some("sim-exit") => Program::Exit { code: num(1) as i32, after_ns: num(2) * 1_000 },
            Some("sim-signal") => Program::Signal { signal: num(1) as i32, after_ns: num(2) * 1_000 },
            Some("sim-print") => {
                Program::Print { text: argv.get(1).cloned().unwrap_or_default(), after_ns: num(2) * 1_000 }
            }
            Some("sim-hang") => Program::Hang,
            Some("sim-mpi") => Program::Mpi { fences: num(1) as u32 },
            _ => Program::Exit { code: 0, after_ns: 0 },
        }
    }

    /// The argv that runs this program.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Program::Exit { code, after_ns } => {
                vec!["sim-exit".into(), code.to_string(), (after_ns / 1_000).to_string()]
            }
            Program::Signal { signal, after_ns } => {
                vec!["sim-signal".into(), signal.to_string(), (after_ns / 1_000).to_string()]
            }
            Program::Print { text, after_ns } => {
                vec!["sim-print".into(), text.clone(), (after_ns / 1_000).to_string()]
            }
            Program::Hang => vec!["sim-hang".into()],
            Program::Mpi { fences } => vec!["sim-mpi".into(), fences.to_string()],
        }
    }
}

/// A proc event due at a time (the caller's clock).
#[derive(Debug, Clone, PartialEq)]
pub struct Due {
    pub at: u64,
    pub ev: ProcEvent,
}

/// A simulated proc.
#[derive(Debug, Clone)]
pub struct SimProc {
    pub spec: ProcSpec,
    pub pid: u32,
    /// Its exit is scheduled (it was killed or its program ends).
    pub ending: bool,
}

/// One daemon's shell: simulated processes, prun streams and control replies, carrying out a
/// node's effects in order.
#[derive(Debug, Default)]
pub struct SimShell {
    /// Live procs by (job, rank).
    pub procs: BTreeMap<(u32, u32), SimProc>,
    /// Every proc ever started here: (job, rank).
    pub started: Vec<(u32, u32)>,
    /// Jobs this daemon was told to kill or forget (nothing of theirs may start after).
    pub ended_jobs: BTreeSet<u32>,
    /// What each prun received, in order.
    pub clients: BTreeMap<ClientId, Vec<Forward>>,
    pub replies: Vec<(u64, Reply)>,
    /// Fences the driver started that ended: (key, result), in order.
    pub fences_done: Vec<(u64, Result<Bytes, dvm_grpcomm::FenceError>)>,
    /// What the node asked of its PMIx worker (upcall answers, replace, end), in order.
    pub pmix: Vec<crate::pmix::PmixEffect>,
    /// What the node wrote on its ranks' PMI fds, by (job, rank), in order.
    pub pmi: BTreeMap<(u32, u32), Vec<u8>>,
    /// PMI connections the node closed.
    pub pmi_closed: BTreeSet<(u32, u32)>,
    pub said: Vec<String>,
    pub ready: bool,
    pub exit: Option<Exit>,
    /// Violations of the shell's rules seen (a proc started for a job already ended here).
    pub errors: Vec<String>,
    /// The most procs that were alive here at once (the slot books' check).
    pub peak: usize,
    /// With `keep_specs`, the spec of every proc started here, in order.
    pub keep_specs: bool,
    pub specs: Vec<ProcSpec>,
    /// Staging's disk (answers collected in `disk.answers` for the driver to hand back).
    pub disk: SimDisk,
    next_pid: u32,
}

impl SimShell {
    /// Carry out one effect at `now`; the proc events it causes are returned with their time.
    pub fn apply(&mut self, me: Rank, now: u64, e: Effect) -> Vec<Due> {
        let mut due = Vec::new();
        match e {
            Effect::Proc(ProcCmd::Spawn(spec)) => {
                let (jobid, rank) = (spec.jobid, spec.rank);
                if self.ended_jobs.contains(&jobid) {
                    self.errors
                        .push(format!("daemon {me}: rank {rank} of job {jobid} started after its job was ended here"));
                }
                self.next_pid += 1;
                let pid = 10_000 * (me + 1) + self.next_pid;
                due.push(Due { at: now, ev: ProcEvent::Started { jobid, rank, pid } });
                let program = Program::of(&spec.argv);
                let end = match program {
                    Program::Exit { code, after_ns } => Some((now + after_ns, ExitKind::Code(code))),
                    Program::Signal { signal, after_ns } => Some((now + after_ns, ExitKind::Signal(signal))),
                    Program::Print { text, after_ns } => {
                        let data = Bytes::from(format!("{text}\n"));
                        due.push(Due {
                            at: now,
                            ev: ProcEvent::Output { jobid, rank, stream: Stream::Stdout, data, read_at_us: 0 },
                        });
                        Some((now + after_ns, ExitKind::Code(0)))
                    }
                    Program::Hang | Program::Mpi { .. } => None,
                };
                if let Some((at, status)) = end {
                    due.push(Due { at, ev: ProcEvent::Exited { jobid, rank, pid, status } });
                }
                self.started.push((jobid, rank));
                if self.keep_specs {
                    self.specs.push(spec.clone());
                }
                self.procs.insert((jobid, rank), SimProc { spec, pid, ending: end.is_some() });
                self.peak = self.peak.max(self.procs.len());
            }
            Effect::Proc(ProcCmd::KillJob { jobid, grace_ms: _ }) => {
                self.ended_jobs.insert(jobid);
                for ((j, rank), p) in self.procs.iter_mut().filter(|((j, _), _)| *j == jobid) {
                    if !p.ending {
                        p.ending = true;
                        due.push(Due {
                            at: now,
                            ev: ProcEvent::Exited { jobid: *j, rank: *rank, pid: p.pid, status: ExitKind::Signal(15) },
                        });
                    }
                }
            }
            Effect::Proc(
                ProcCmd::SignalJob { .. }
                | ProcCmd::WriteStdin { .. }
                | ProcCmd::CloseStdin { .. }
                | ProcCmd::AckOutput { .. },
            ) => {}
            Effect::Proc(ProcCmd::DumpStacks { id, jobid }) => {
                let traces = self
                    .procs
                    .iter()
                    .filter(|((j, _), p)| *j == jobid && !p.ending)
                    .map(|((_, rank), p)| (*rank, p.pid, format!("#0 sim_wait () in rank {rank}")))
                    .collect();
                due.push(Due { at: now, ev: ProcEvent::Stacks { id, jobid, traces, error: None } });
            }
            Effect::Proc(ProcCmd::PmiWrite { jobid, rank, data }) => {
                if self.pmi_closed.contains(&(jobid, rank)) {
                    self.errors.push(format!("daemon {me}: PMI write to rank {rank} of job {jobid} after its close"));
                }
                self.pmi.entry((jobid, rank)).or_default().extend_from_slice(&data);
            }
            Effect::Proc(ProcCmd::PmiClose { jobid, rank }) => {
                self.pmi_closed.insert((jobid, rank));
            }
            Effect::Proc(ProcCmd::ForgetJob(jobid)) => {
                self.ended_jobs.insert(jobid);
            }
            Effect::Proc(ProcCmd::KillAll) => self.procs.clear(),
            Effect::ToClient { client, item } => self.clients.entry(client).or_default().push(item),
            Effect::Reply { token, reply } => self.replies.push((token, reply)),
            Effect::Ready => self.ready = true,
            Effect::Say(text) => self.said.push(text),
            Effect::Stage(io) => self.disk.apply(me, io),
            Effect::Pmix(e) => self.pmix.push(e),
            Effect::FenceDone { key, result } => self.fences_done.push((key, result)),
            Effect::Exit(e) => {
                self.exit.get_or_insert(e);
                self.procs.clear();
            }
        }
        due
    }

    /// A proc event is about to be handed to the node: false if its proc is gone (killed with
    /// the daemon, or already reported).
    pub fn take(&mut self, ev: &ProcEvent) -> bool {
        match ev {
            ProcEvent::Exited { jobid, rank, .. } => self.procs.remove(&(*jobid, *rank)).is_some(),
            ProcEvent::Started { jobid, rank, .. } | ProcEvent::Output { jobid, rank, .. } => {
                self.procs.contains_key(&(*jobid, *rank))
            }
            _ => true,
        }
    }

    /// The prun of `client` heard its job (or array) end: (exit status, message).
    pub fn ended(&self, client: ClientId) -> Option<(i32, String)> {
        self.clients.get(&client)?.iter().find_map(|f| match f {
            Forward::Event(ev) => match &ev.event {
                Some(job_event::Event::Ended(e)) if !e.element => Some((e.exit_code, e.message.clone())),
                _ => None,
            },
            Forward::Refused(why) => Some((1, why.clone())),
            _ => None,
        })
    }

    /// The job events a prun received, in order.
    pub fn events(&self, client: ClientId) -> Vec<job_event::Event> {
        let items = self.clients.get(&client).map(Vec::as_slice).unwrap_or_default();
        items
            .iter()
            .filter_map(|f| match f {
                Forward::Event(ev) => ev.event.clone(),
                _ => None,
            })
            .collect()
    }

    /// The notices a prun was shown, in order.
    pub fn notices(&self, client: ClientId) -> Vec<String> {
        let items = self.clients.get(&client).map(Vec::as_slice).unwrap_or_default();
        items
            .iter()
            .filter_map(|f| match f {
                Forward::Event(ev) => match &ev.event {
                    Some(job_event::Event::Notice(n)) => Some(n.text.clone()),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }
}

/// A node on a [`SimHost`], hosting PMIx as a daemon with a PMIx server does (its worker is
/// replaced when idle once it grew by 512 KiB).
pub fn sim_node(cfg: crate::node::NodeConfig) -> crate::Node<SimHost> {
    let mut node = crate::Node::new(cfg, SimHost::default()).expect("a valid geometry");
    node.configure_pmix(512);
    node
}

/// Everything a node put out after an input, in order.
pub fn drain<H: Host>(node: &mut crate::Node<H>) -> (Vec<Transmit>, Vec<Effect>) {
    let mut t = Vec::new();
    while let Some(x) = node.poll_transmit() {
        t.push(x);
    }
    let mut e = Vec::new();
    while let Some(x) = node.poll() {
        e.push(x);
    }
    (t, e)
}
