//! Simulated MPI ranks that speak PMI-1 or PMI-2 on their fd (`sim-mpi K pmi1|pmi2|pmi12`),
//! as an MPICH-family client does: `init` (PMI-2: `fullinit` next), the kvs name, then K
//! times a put of a per-rank value, a barrier and gets of other ranks' keys, then `finalize`
//! and exit 0. A failed barrier (rc != 0) or a fd the daemon closed makes a rank exit 1. Every
//! request waits for its one answer before the next (PMI is synchronous); a rank's bytes reach
//! its daemon as `ProcEvent::PmiData` and the answers come back from `SimShell::pmi`. When a
//! rank's process ends, its fd closes (`PmiClosed`), just before or just after its exit.
//!
//! Judged here, as the run goes and at its end:
//! - every answer is the one its request expects, and comes once: an answer while nothing is
//!   asked is a violation, as is any byte written after the daemon heard the fd close (a write
//!   after the daemon's own close is `SimShell`'s error);
//! - a get after barrier k of a key put before barrier k' <= k returns the putter's value (the
//!   oracle: [`value`]); a key of a rank on another daemon, put for barrier k+1, is not found;
//! - every daemon releases barrier k of a job holding the same kvs, and that kvs is every
//!   rank's puts up to barrier k (the job's own keys aside);
//! - at the end, a rank still alive on a running daemon is answered, and a daemon with no job
//!   left holds no PMI state (`Pmi::load`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use dvm_core::jobs::ProcEvent;
use dvm_core::pmi::wire::{encode, Decoder, Form, Request};
use dvm_grpcomm::Rank;
use rand::Rng;

use super::{CoreEngine, Kind, State};
use crate::daemons::scenario::MpiWire;

/// What one rank sends, in order.
#[derive(Debug, Clone)]
enum Req {
    Init,
    FullInit,
    KvsName,
    Put {
        k: u32,
    },
    Barrier {
        k: u32,
    },
    /// A get of rank `of`'s key of barrier `k`: found with its value when the asker has passed
    /// barrier k, not found when `k` is the next barrier and `of` lives on another daemon.
    Get {
        of: u32,
        k: u32,
    },
    Finalize,
}

struct PmiRank {
    form: Form,
    nprocs: u32,
    kvsname: String,
    plan: VecDeque<Req>,
    /// The request sent and not yet answered, with the value a get must return (None: not
    /// found).
    asked: Option<(Req, Option<String>)>,
    /// Barriers this rank passed.
    passed: u32,
    dec: Decoder,
    /// It decided to exit: it sends nothing more.
    done: bool,
    /// Its process ended (or is ending): its fd closes.
    fd_closed: bool,
}

#[derive(Default)]
pub(super) struct PmiRanks {
    /// By (daemon, job, rank).
    ranks: BTreeMap<(Rank, u32, u32), PmiRank>,
    /// The daemon each PMI rank started on, by (job, rank).
    homes: BTreeMap<(u32, u32), Rank>,
    /// The first daemon's kvs when it released barrier k of a job, by (job, k).
    released: BTreeMap<(u32, u32), (Rank, BTreeMap<String, String>)>,
    /// (daemon, job, k) whose release was judged.
    judged: BTreeSet<(Rank, u32, u32)>,
    /// (daemon, job, rank): the daemon heard that rank's fd close.
    told_closed: BTreeSet<(Rank, u32, u32)>,
    /// Per daemon, how many closes of its own it had made when last looked at.
    closes_seen: BTreeMap<Rank, usize>,
}

/// What rank `rank` of job `job` puts for barrier `k`: distinct, of varying length (one in
/// sixteen close to the longest value PMI allows), with a `;` and a `=` that PMI-2 escapes and
/// PMI-1 keeps.
pub fn value(job: u32, rank: u32, k: u32) -> String {
    let h = (job as usize) * 131 + (rank as usize) * 31 + (k as usize) * 7;
    let pad = if h.is_multiple_of(16) { 600 + h % 400 } else { h % 40 };
    let mut s = format!("v{job}.{rank}.{k};=");
    s.extend(std::iter::repeat_n((b'a' + (h % 26) as u8) as char, pad));
    s
}

fn key(rank: u32, k: u32) -> String {
    format!("r{rank}b{k}")
}

impl CoreEngine<'_> {
    /// A PMI rank started on `r`: it connects, unless it was given no fd (`--mpi none`): then
    /// it runs as a singleton.
    pub(super) fn pmi_rank_started(&mut self, r: Rank, job: u32, rank: u32, wire: MpiWire, barriers: u32) {
        let Some(p) = self.nodes[r as usize].shell.procs.get(&(job, rank)) else { return };
        let env = |k: &str| p.spec.env.iter().rev().find(|(ek, _)| ek == k).map(|(_, v)| v.clone());
        let (Some(_), Some(size), Some(kvsname)) = (p.spec.pmi_fd, env("PMI_SIZE"), env("PMI_JOBID")) else {
            return self.rank_exit(r, job, rank, 0);
        };
        if env("PMI_RANK") != Some(rank.to_string()) {
            self.trace
                .pmi_errors
                .push(format!("daemon {r}: rank {rank} of job {job} got PMI_RANK {:?}", env("PMI_RANK")));
        }
        let nprocs: u32 = size.parse().unwrap_or(0);
        let v2 = wire.pmi2(rank).unwrap_or(false);
        let mut plan = VecDeque::from([Req::Init]);
        if v2 {
            plan.push_back(Req::FullInit);
        }
        plan.push_back(Req::KvsName);
        for k in 1..=barriers {
            plan.push_back(Req::Put { k });
            plan.push_back(Req::Barrier { k });
            for _ in 0..self.rng.gen_range(1..=3) {
                let of = self.rng.gen_range(0..nprocs.max(1));
                plan.push_back(Req::Get { of, k: self.rng.gen_range(1..=k) });
            }
            if k < barriers && self.rng.gen_bool(0.5) {
                plan.push_back(Req::Get { of: self.rng.gen_range(0..nprocs.max(1)), k: k + 1 });
            }
        }
        plan.push_back(Req::Finalize);
        let form = if v2 { Form::V2 } else { Form::V1 };
        let pr = PmiRank {
            form,
            nprocs,
            kvsname,
            plan,
            asked: None,
            passed: 0,
            dec: Decoder::default(),
            done: false,
            fd_closed: false,
        };
        self.pmi.homes.insert((job, rank), r);
        self.pmi.ranks.insert((r, job, rank), pr);
        self.pmi_next(r, job, rank);
    }

    /// The rank's next request, or its exit once it has none left.
    fn pmi_next(&mut self, r: Rank, job: u32, rank: u32) {
        let Some(pr) = self.pmi.ranks.get_mut(&(r, job, rank)) else { return };
        let Some(req) = pr.plan.pop_front() else {
            pr.done = true;
            return self.rank_exit(r, job, rank, 0);
        };
        let f = pr.form;
        let (v1, n) = (f == Form::V1, rank.to_string());
        let mut want = None;
        let bytes = match &req {
            Req::Init => {
                let version = if v1 { "1" } else { "2" };
                let sub = if v1 { "1" } else { "0" };
                encode(Form::V1, "init", &[("pmi_version", version), ("pmi_subversion", sub)])
            }
            Req::FullInit => encode(f, "fullinit", &[("pmirank", &n), ("pmijobid", ""), ("threaded", "FALSE")]),
            Req::KvsName if v1 => encode(f, "get_my_kvsname", &[]),
            Req::KvsName => encode(f, "job-getid", &[]),
            Req::Put { k } => {
                let (key, v) = (key(rank, *k), value(job, rank, *k));
                if v1 {
                    encode(f, "put", &[("kvsname", &pr.kvsname), ("key", &key), ("value", &v)])
                } else {
                    encode(f, "kvs-put", &[("key", &key), ("value", &v)])
                }
            }
            Req::Barrier { .. } if v1 => encode(f, "barrier_in", &[]),
            Req::Barrier { .. } => encode(f, "kvs-fence", &[]),
            &Req::Get { of, k } => {
                if k <= pr.passed {
                    want = Some(value(job, of, k));
                } else if self.pmi.homes.get(&(job, of)).is_none_or(|&h| h == r) {
                    // Its put for the next barrier may be here already: nothing to judge.
                    return self.pmi_next(r, job, rank);
                }
                let key = key(of, k);
                if v1 {
                    encode(f, "get", &[("kvsname", &pr.kvsname), ("key", &key)])
                } else {
                    encode(f, "kvs-get", &[("jobid", ""), ("srcid", "-1"), ("key", &key)])
                }
            }
            Req::Finalize => encode(f, "finalize", &[]),
        };
        pr.asked = Some((req, want));
        self.trace.pmi_requests += 1;
        let think = self.rng.gen_range(0..=self.sc.think_ns);
        let ev = ProcEvent::PmiData { jobid: job, rank, data: Bytes::from(bytes) };
        self.q.push(self.q.now() + think, Kind::Proc { daemon: r, ev });
    }

    /// A PMI event of a rank is due on `r`: false when it must not reach the daemon (bytes of
    /// a rank whose process has ended).
    pub(super) fn pmi_event_due(&mut self, r: Rank, ev: &ProcEvent) -> bool {
        match *ev {
            ProcEvent::PmiData { jobid, rank, .. } => {
                self.pmi.ranks.get(&(r, jobid, rank)).is_some_and(|p| !p.fd_closed)
                    && self.nodes[r as usize].shell.procs.contains_key(&(jobid, rank))
            }
            _ => true,
        }
    }

    /// The daemon `r` heard a rank's fd close.
    pub(super) fn pmi_told_closed(&mut self, r: Rank, ev: &ProcEvent) {
        if let ProcEvent::PmiClosed { jobid, rank } = *ev {
            self.pmi.told_closed.insert((r, jobid, rank));
        }
    }

    /// A PMI rank's process ends: its fd closes, just before its exit is seen or just after.
    /// True when the exit is put off (the close goes first).
    pub(super) fn pmi_exit_closes(&mut self, r: Rank, ev: &ProcEvent) -> bool {
        let ProcEvent::Exited { jobid, rank, .. } = *ev else { return false };
        if !self.nodes[r as usize].shell.procs.contains_key(&(jobid, rank)) {
            return false;
        }
        let Some(pr) = self.pmi.ranks.get_mut(&(r, jobid, rank)).filter(|p| !p.fd_closed) else { return false };
        pr.fd_closed = true;
        pr.done = true;
        let now = self.q.now();
        let gap = self.rng.gen_range(0..=self.sc.think_ns);
        let close = ProcEvent::PmiClosed { jobid, rank };
        if self.rng.gen_bool(0.5) {
            self.q.push(now, Kind::Proc { daemon: r, ev: close });
            self.q.push(now + gap, Kind::Proc { daemon: r, ev: ev.clone() });
            true
        } else {
            self.q.push(now + gap, Kind::Proc { daemon: r, ev: close });
            false
        }
    }

    /// After a step of `r`: what it wrote on its ranks' fds, and the fds it closed.
    pub(super) fn after_pmi(&mut self, r: Rank) {
        let written = std::mem::take(&mut self.nodes[r as usize].shell.pmi);
        for ((job, rank), bytes) in written {
            if self.pmi.told_closed.contains(&(r, job, rank)) {
                self.trace.pmi_errors.push(format!(
                    "daemon {r}: wrote {} bytes on the PMI fd of rank {rank} of job {job} after it heard the fd close",
                    bytes.len()
                ));
                continue;
            }
            let Some(pr) = self.pmi.ranks.get_mut(&(r, job, rank)) else { continue };
            pr.dec.push(&bytes);
            while let Some(pr) = self.pmi.ranks.get_mut(&(r, job, rank)) {
                match pr.dec.next_request() {
                    Ok(Some(answer)) => self.pmi_answer(r, job, rank, answer),
                    Ok(None) => break,
                    Err(e) => {
                        self.pmi_fail(r, job, rank, &format!("an answer it cannot read: {e}"));
                        break;
                    }
                }
            }
        }
        let closed = self.nodes[r as usize].shell.pmi_closed.len();
        if self.pmi.closes_seen.insert(r, closed) != Some(closed) {
            let shut: Vec<(u32, u32)> = self.nodes[r as usize].shell.pmi_closed.iter().copied().collect();
            for (job, rank) in shut {
                if let Some(pr) = self.pmi.ranks.get_mut(&(r, job, rank)).filter(|p| !p.done) {
                    // Its daemon closed the fd (the job failed): the PMI library aborts.
                    pr.done = true;
                    self.rank_exit(r, job, rank, 1);
                }
            }
        }
    }

    /// A violation by the daemon serving this rank: recorded, and the rank gives up.
    fn pmi_fail(&mut self, r: Rank, job: u32, rank: u32, what: &str) {
        let Some(pr) = self.pmi.ranks.get_mut(&(r, job, rank)) else { return };
        let v = if pr.form == Form::V1 { 1 } else { 2 };
        self.trace.pmi_errors.push(format!("daemon {r}: rank {rank} of job {job} (PMI-{v}) got {what}"));
        if !pr.done {
            pr.done = true;
            self.rank_exit(r, job, rank, 1);
        }
    }

    fn pmi_answer(&mut self, r: Rank, job: u32, rank: u32, a: Request) {
        let ns = self.nspace(job);
        let Some(pr) = self.pmi.ranks.get_mut(&(r, job, rank)) else { return };
        let Some((req, want)) = pr.asked.take() else {
            return self.pmi_fail(r, job, rank, &format!("an answer '{}' it did not ask for (or a second one)", a.cmd));
        };
        let (v1, nprocs) = (pr.form == Form::V1, pr.nprocs);
        let rc = a.get("rc").unwrap_or("");
        let expect = match (&req, v1) {
            (Req::Init, _) => "response_to_init",
            (Req::FullInit, _) => "fullinit-response",
            (Req::KvsName, true) => "my_kvsname",
            (Req::KvsName, false) => "job-getid-response",
            (Req::Put { .. }, true) => "put_result",
            (Req::Put { .. }, false) => "kvs-put-response",
            (Req::Barrier { .. }, true) => "barrier_out",
            (Req::Barrier { .. }, false) => "kvs-fence-response",
            (Req::Get { .. }, true) => "get_result",
            (Req::Get { .. }, false) => "kvs-get-response",
            (Req::Finalize, true) => "finalize_ack",
            (Req::Finalize, false) => "finalize-response",
        };
        if a.cmd != expect {
            return self.pmi_fail(r, job, rank, &format!("'{}' to its {req:?} (expected '{expect}')", a.cmd));
        }
        let wrong = match &req {
            Req::Barrier { k } => {
                if rc != "0" {
                    // The barrier failed (a daemon of the job was lost): MPI aborts.
                    pr.done = true;
                    return self.rank_exit(r, job, rank, 1);
                }
                pr.passed = *k;
                self.trace.pmi_barriers += 1;
                self.pmi_judge_release(r, job, *k, nprocs);
                None
            }
            Req::Get { of, k } => {
                let found = if v1 { rc == "0" } else { a.get("found") == Some("TRUE") };
                let got = found.then(|| a.get("value").unwrap_or("").to_owned());
                (got != want).then(|| {
                    format!(
                        "{got:?} for the key of rank {of} for barrier {k} after barrier {}, not {want:?}",
                        pr.passed
                    )
                })
            }
            _ if rc != "0" => Some(format!("rc={rc} to its {req:?}")),
            Req::Init => {
                let version = if v1 { "1" } else { "2" };
                (a.get("pmi_version") != Some(version)).then(|| format!("{a:?} to its init"))
            }
            Req::FullInit => (a.get("rank") != Some(&rank.to_string()) || a.get("size") != Some(&nprocs.to_string()))
                .then(|| format!("{a:?} to its fullinit (rank {rank} of {nprocs})")),
            Req::KvsName => {
                let got = a.get(if v1 { "kvsname" } else { "jobid" });
                (got != Some(ns.as_str()) || pr.kvsname != ns).then(|| format!("kvs name {got:?}, not {ns}"))
            }
            Req::Put { .. } | Req::Finalize => None,
        };
        match wrong {
            Some(what) => self.pmi_fail(r, job, rank, &what),
            None => self.pmi_next(r, job, rank),
        }
    }

    /// Daemon `r` released barrier `k` of `job` (it is still in the step that did): its kvs
    /// must be every rank's puts up to barrier k, and the same as every other daemon's.
    fn pmi_judge_release(&mut self, r: Rank, job: u32, k: u32, nprocs: u32) {
        if !self.pmi.judged.insert((r, job, k)) {
            return;
        }
        let Some(kvs) = self.nodes[r as usize].node.pmi().kvs(job) else {
            let e = format!("daemon {r}: released barrier {k} of job {job} holding no kvs for it");
            return self.trace.pmi_errors.push(e);
        };
        let puts: BTreeMap<String, String> =
            (0..nprocs).flat_map(|x| (1..=k).map(move |b| (key(x, b), value(job, x, b)))).collect();
        let mut own = kvs.clone();
        own.remove("PMI_process_mapping");
        if own != puts {
            let missing = puts.keys().filter(|key| !own.contains_key(*key)).count();
            let wrong = own.iter().filter(|(key, v)| puts.get(*key) != Some(v)).count();
            self.trace.pmi_errors.push(format!(
                "daemon {r}: released barrier {k} of job {job} with {} keys, {missing} of the {} puts missing and \
                 {wrong} keys wrong or extra",
                kvs.len(),
                puts.len()
            ));
        }
        match self.pmi.released.get(&(job, k)) {
            Some((first, other)) if other != kvs => self.trace.pmi_errors.push(format!(
                "barrier {k} of job {job}: daemon {r} released it with {} keys, daemon {first} with {} (or other values)",
                kvs.len(),
                other.len()
            )),
            Some(_) => {}
            None => drop(self.pmi.released.insert((job, k), (r, kvs.clone()))),
        }
    }

    /// Daemon `r` died: its ranks with it.
    pub(super) fn pmi_ranks_died(&mut self, r: Rank) {
        self.pmi.ranks.retain(|(d, _, _), _| *d != r);
        self.pmi.told_closed.retain(|(d, _, _)| *d != r);
        self.pmi.closes_seen.remove(&r);
    }

    /// At the end of the run: requests left unanswered where their rank still runs, and PMI
    /// state kept by a daemon whose jobs all ended.
    pub(super) fn finish_pmi(&mut self) {
        self.trace.pmi_ranks = self.pmi.homes.len() as u64;
        for (&(r, job, rank), pr) in &self.pmi.ranks {
            let n = &self.nodes[r as usize];
            if let Some((req, _)) = &pr.asked {
                if n.state == State::Running && n.shell.procs.contains_key(&(job, rank)) && !pr.fd_closed {
                    self.trace.pmi_errors.push(format!(
                        "daemon {r}: rank {rank} of job {job} still waits for the answer to its {req:?}"
                    ));
                }
            }
        }
        for (r, n) in self.nodes.iter().enumerate() {
            let load = n.node.pmi().load();
            if n.state == State::Running && n.node.local_jobs().is_empty() && load != (0, 0) {
                self.trace.pmi_errors.push(format!(
                    "daemon {r}: holds PMI state for {} job(s) and {} barrier(s) after its jobs ended",
                    load.0, load.1
                ));
            }
        }
    }
}
