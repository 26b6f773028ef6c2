//! The daemon as a "simple PMI" server, decided: the PMI-1 and PMI-2 wire the MPICH family
//! (MPICH, Intel MPI, MVAPICH) speaks over an inherited fd (`PMI_FD`), beside the PMIx server.
//!
//! Inputs: a job's local ranks before they start ([`Pmi::job_start`]), the bytes each rank
//! writes and the close of its fd ([`Pmi::on_data`], [`Pmi::on_closed`]), its exit
//! ([`Pmi::proc_exit`]), the job's barrier fences finished ([`Pmi::fence_done`]) and its end
//! here ([`Pmi::job_done`]). Outputs, in order, in `out`: the answers to write to a rank's fd,
//! the fence each barrier becomes, and a job's failure told to the HNP.
//!
//! A barrier (`barrier_in`, `kvs-fence`) is one collecting fence of the job over the daemons
//! that host it: a daemon contributes once every local rank entered, with the puts its ranks
//! made since the last one; the fence's bytes (every daemon's puts, in daemon order) become
//! what every `get` on every daemon answers from, and then every local rank is released.
//!
//! Never: a socket, a process or a wait: a rank's fd is its (job, rank); the shell moves bytes.
//! Invariants: every request that expects an answer gets exactly one, unless its rank's job
//! failed; anything a rank sends that is not the protocol fails its job (naming the rank, its
//! node and the fault), never the daemon or another job.

mod serve;
mod spawn;
#[cfg(test)]
mod tests;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use dvm_grpcomm::{FenceError, FenceRequest, FenceSignature, Participants};
use dvm_proto::daemon::{daemon_cmd, JobFail};
use dvm_rml::Rank;
use tracing::{debug, warn};

use crate::jobmap::{Layout, Placement};
use crate::jobs::ProcCmd;
use crate::{FenceOwner, Input};

/// The fd number a rank finds its PMI connection on (`PMI_FD`).
pub const PMI_CHILD_FD: i32 = 3;

/// The top bit of every id this server gives a data server request or a spawn: its answer
/// comes back to the node among PMIx hosting's, and this bit routes it here.
pub const ID_BIT: u64 = 1 << 63;

/// What `auto` prices a barrier's release with, per proc (MPICH's business card and a few
/// keys of its own per rank).
pub const PUT_BYTES_PER_PROC: u64 = 160;

/// What the PMI server asks of the node, in order.
#[derive(Debug)]
pub(crate) enum PmiOut {
    Router(Input),
    Proc(ProcCmd),
}

/// A job's facts its ranks ask for, known before they start.
#[derive(Debug, Clone)]
pub struct PmiJobStart {
    pub jobid: u32,
    /// The job's key-value space name (`PMI_JOBID`, `get_my_kvsname`).
    pub kvsname: String,
    pub placement: Placement,
    /// `get_universe_size`.
    pub universe: u32,
    /// The job was started by a spawn (`PMI_SPAWNED`).
    pub spawned: bool,
    /// The job asked for another interface: a rank that sends `init` fails it, for this.
    pub refuse: Option<String>,
    /// The interface it asked for (its spawns' children get the same).
    pub mpi: dvm_proto::job::MpiInterface,
    /// Where its spawns' children run unless they say (its first app's directory).
    pub cwd: String,
    /// Each app's `-x` variables, which a spawn's children inherit from their spawning rank's
    /// app (as Hydra's children inherit mpiexec's environment).
    pub app_env: Vec<Vec<String>>,
    /// Keys its kvs holds from the start: a spawn's pre-put pairs ("key=value").
    pub preput: Vec<String>,
}

/// Where a rank's connection is.
#[derive(Debug, Default)]
struct Conn {
    dec: wire::Decoder,
    /// It sent `init` (or `fullinit`).
    inited: bool,
    /// It sent the PMI-1 `init` line (a PMI-2 client does so before its `fullinit`).
    greeted: bool,
    finalized: bool,
    /// Its fd closed.
    closed: bool,
    /// The form of its last barrier request, while it waits in one.
    waiting: Option<wire::Form>,
    /// Node-attribute gets waiting for a put of their key: (key, form).
    node_waits: Vec<(String, wire::Form)>,
    /// The PMI-1 blocks of a spawn-multiple read so far.
    spawn_blocks: Vec<wire::Request>,
}

struct Job {
    start: PmiJobStart,
    sig: FenceSignature,
    conns: BTreeMap<u32, Conn>,
    /// What every get answers from: the puts of every rank up to the last barrier, this
    /// daemon's own since, and the job's own keys.
    kvs: BTreeMap<String, String>,
    /// Puts of local ranks since the last barrier, to contribute at the next.
    pending: Vec<(String, String)>,
    /// Node attributes (PMI-2), this daemon's ranks only.
    node_attrs: BTreeMap<String, String>,
    /// The barrier fence in flight (its key).
    in_fence: Option<u64>,
    /// The job was failed from here: nothing more of it is served.
    failed: bool,
}

/// This daemon's PMI server.
pub struct Pmi {
    me: Rank,
    host: String,
    jobs: BTreeMap<u32, Job>,
    /// Barrier fences in flight: key -> job.
    fences: BTreeMap<u64, u32>,
    next_key: u64,
    /// Name service requests asked of the HNP's data server: id -> who asked.
    names: BTreeMap<u64, serve::NameAsk>,
    /// Spawns asked of the HNP: id -> who asked.
    spawns: BTreeMap<u64, spawn::SpawnAsk>,
    pub(crate) out: Vec<PmiOut>,
}

impl Pmi {
    pub fn new(me: Rank, host: String) -> Pmi {
        Pmi {
            me,
            host,
            jobs: BTreeMap::new(),
            fences: BTreeMap::new(),
            next_key: 1,
            names: BTreeMap::new(),
            spawns: BTreeMap::new(),
            out: Vec::new(),
        }
    }

    /// Jobs served here, and barriers in flight.
    pub fn load(&self) -> (usize, usize) {
        (self.jobs.len(), self.fences.len())
    }

    /// Keys a job's gets answer from here (None: no such job).
    pub fn kvs_len(&self, jobid: u32) -> Option<usize> {
        self.jobs.get(&jobid).map(|j| j.kvs.len())
    }

    /// What a job's gets answer from here, read-only (None: no such job).
    pub fn kvs(&self, jobid: u32) -> Option<&BTreeMap<String, String>> {
        self.jobs.get(&jobid).map(|j| &j.kvs)
    }

    /// A job's local ranks are about to start with a PMI fd each: its kvs gets its own keys
    /// (`PMI_process_mapping`).
    pub fn job_start(&mut self, start: PmiJobStart) {
        let local: BTreeSet<u32> = start.placement.procs_on(self.me).iter().collect();
        let daemons: Vec<Rank> = start.placement.daemons().collect();
        let sig = FenceSignature::new(format!("pmi:{}", start.kvsname).into_bytes(), Participants::Daemons(daemons));
        let mut kvs: BTreeMap<String, String> =
            start.preput.iter().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect();
        match process_mapping(&start.placement) {
            Some(m) => {
                kvs.insert("PMI_process_mapping".to_owned(), m);
            }
            None => debug!(jobid = start.jobid, "no PMI_process_mapping: longer than a PMI value"),
        }
        let conns = local.iter().map(|&r| (r, Conn::default())).collect();
        let job = Job {
            start,
            sig,
            conns,
            kvs,
            pending: Vec::new(),
            node_attrs: BTreeMap::new(),
            in_fence: None,
            failed: false,
        };
        self.jobs.insert(job.start.jobid, job);
    }

    /// The environment a local rank finds its connection by.
    pub fn proc_env(&self, jobid: u32, rank: u32) -> Vec<(String, String)> {
        let Some(job) = self.jobs.get(&jobid) else { return Vec::new() };
        vec![
            ("PMI_FD".into(), PMI_CHILD_FD.to_string()),
            ("PMI_RANK".into(), rank.to_string()),
            ("PMI_SIZE".into(), job.start.placement.nprocs().to_string()),
            ("PMI_JOBID".into(), job.start.kvsname.clone()),
            ("PMI_SPAWNED".into(), u8::from(job.start.spawned).to_string()),
        ]
    }

    /// Bytes a local rank wrote on its PMI fd.
    pub fn on_data(&mut self, jobid: u32, rank: u32, data: &[u8]) {
        let Some(conn) = self.conn(jobid, rank) else { return };
        conn.dec.push(data);
        loop {
            let Some(conn) = self.conn(jobid, rank) else { return };
            match conn.dec.next_request() {
                Ok(Some(req)) => self.serve(jobid, rank, req),
                Ok(None) => return,
                Err(e) => return self.fault(jobid, rank, &format!("sent {e}")),
            }
        }
    }

    /// A local rank's PMI fd closed (it ended, or closed it).
    pub fn on_closed(&mut self, jobid: u32, rank: u32) {
        let Some(conn) = self.conn(jobid, rank) else { return };
        conn.closed = true;
        if conn.waiting.is_some() {
            // Its peers would wait for it in this barrier for ever.
            self.fault(jobid, rank, "closed its PMI connection in a barrier");
        }
    }

    /// A local rank ended: the sentence if it was a PMI rank that ended cleanly without
    /// finalizing, or that never connected while its peers here did.
    pub fn proc_exit(&mut self, jobid: u32, rank: u32) -> Option<String> {
        let job = self.jobs.get(&jobid)?;
        let conn = job.conns.get(&rank)?;
        // Ranks of the same app here that spoke PMI: a rank of a non-MPI app beside an MPI
        // one is not judged by them.
        let app = job.start.placement.app_of(rank);
        let peers_used = job.conns.iter().any(|(&r, c)| r != rank && c.inited && job.start.placement.app_of(r) == app);
        if conn.inited && !conn.finalized {
            Some(format!("rank {rank} on node {} exited without calling PMI finalize (MPI_Finalize)", self.host))
        } else if !conn.inited && peers_used {
            Some(format!(
                "rank {rank} on node {} exited without ever connecting to PMI while its peers did (it ran as a singleton)",
                self.host
            ))
        } else {
            None
        }
    }

    /// Every local rank of the job is gone: its barrier fences are abandoned and forgotten.
    pub fn job_done(&mut self, jobid: u32) {
        let Some(job) = self.jobs.remove(&jobid) else { return };
        self.fences.retain(|_, j| *j != jobid);
        self.names.retain(|_, a| a.jobid != jobid);
        self.spawns.retain(|_, a| a.jobid != jobid);
        self.out.push(PmiOut::Router(Input::AbandonFence(job.sig.clone())));
        self.out.push(PmiOut::Router(Input::ForgetFence(job.sig)));
    }

    /// A barrier fence of a job ended: every local rank waiting in it goes on.
    pub fn fence_done(&mut self, key: u64, result: Result<Bytes, FenceError>) {
        let Some(jobid) = self.fences.remove(&key) else { return };
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        job.in_fence = None;
        let rc = match result.map(decode_puts) {
            Ok(Ok(puts)) => {
                job.kvs.extend(puts);
                "0"
            }
            Ok(Err(e)) => {
                warn!(jobid, "a PMI barrier's result is undecodable: {e}");
                "-1"
            }
            Err(e) => {
                warn!(jobid, "a PMI barrier failed: {e}");
                "-1"
            }
        };
        let released: Vec<(u32, wire::Form)> =
            job.conns.iter_mut().filter_map(|(&r, c)| c.waiting.take().map(|f| (r, f))).collect();
        for (rank, form) in released {
            match form {
                wire::Form::V1 => self.answer(jobid, rank, form, "barrier_out", &[("rc", rc)]),
                wire::Form::V2 => self.answer(jobid, rank, form, "kvs-fence-response", &[("rc", rc)]),
            }
        }
    }

    /// A local rank entered a barrier: once all have, this daemon contributes its puts.
    fn enter_barrier(&mut self, jobid: u32, rank: u32, form: wire::Form) {
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        let Some(conn) = job.conns.get_mut(&rank) else { return };
        if conn.waiting.is_some() {
            return self.fault(jobid, rank, "entered a PMI barrier twice");
        }
        if conn.finalized {
            return self.fault(jobid, rank, "entered a PMI barrier after PMI finalize");
        }
        conn.waiting = Some(form);
        if job.in_fence.is_some() || job.conns.values().any(|c| c.waiting.is_none()) {
            return;
        }
        let key = self.next_key;
        self.next_key += 1;
        job.in_fence = Some(key);
        self.fences.insert(key, jobid);
        let data = encode_puts(&std::mem::take(&mut job.pending));
        let size_hint = Some(u64::from(job.start.placement.nprocs()) * PUT_BYTES_PER_PROC);
        let req = FenceRequest { sig: job.sig.clone(), collect: true, data, timeout: None, size_hint };
        debug!(jobid, key, "PMI barrier: every local rank entered");
        self.out.push(PmiOut::Router(Input::Fence { owner: FenceOwner::Pmi(key), req }));
    }

    /// Write an answer to a rank's fd, unless that fd closed: a barrier's end, a node attribute
    /// or a name service answer can come after its rank was killed or its job failed here.
    fn answer(&mut self, jobid: u32, rank: u32, form: wire::Form, cmd: &str, args: &[(&str, &str)]) {
        if self.jobs.get(&jobid).and_then(|j| j.conns.get(&rank)).is_some_and(|c| c.closed) {
            return debug!(jobid, rank, cmd, "PMI answer dropped: the rank's fd closed");
        }
        let data = Bytes::from(wire::encode(form, cmd, args));
        self.out.push(PmiOut::Proc(ProcCmd::PmiWrite { jobid, rank, data }));
    }

    /// What a rank sent fails its job (never the daemon): told to the HNP with the rank and
    /// node, its connection closed, nothing more of the job served here.
    fn fault(&mut self, jobid: u32, rank: u32, what: &str) {
        let Some(job) = self.jobs.get_mut(&jobid) else { return };
        let first = !job.failed;
        job.failed = true;
        if let Some(c) = job.conns.get_mut(&rank) {
            c.closed = true;
        }
        self.out.push(PmiOut::Proc(ProcCmd::PmiClose { jobid, rank }));
        if first {
            let reason = format!("rank {rank} on node {} {what}", self.host);
            tracing::info!(jobid, rank, "{reason}");
            let fail = JobFail { jobid, code: 1, reason, daemon: self.me };
            self.out.push(PmiOut::Router(Input::Cmd { dst: 0, body: daemon_cmd::Body::JobFail(fail) }));
        }
    }

    fn conn(&mut self, jobid: u32, rank: u32) -> Option<&mut Conn> {
        let job = self.jobs.get_mut(&jobid).filter(|j| !j.failed)?;
        job.conns.get_mut(&rank).filter(|c| !c.closed)
    }
}

/// MPICH's `PMI_process_mapping`: `(vector,(node,count,per_node),…)`, blocks of consecutive
/// ranks on consecutive nodes, repeated over the ranks; None when it would not fit a value.
pub fn process_mapping(p: &Placement) -> Option<String> {
    let k = p.num_nodes();
    let blocks: Vec<(u32, u32, u32)> = match p.layout() {
        Layout::Block { each } => vec![(0, k, *each)],
        Layout::RoundRobin => vec![(0, k, 1)],
        Layout::PerNode { first_rank } => {
            first_rank.windows(2).enumerate().map(|(i, w)| (i as u32, 1, w[1] - w[0])).collect()
        }
        Layout::Explicit { node_of } => {
            let mut runs: Vec<(u32, u32, u32)> = Vec::new();
            for &n in node_of {
                match runs.last_mut() {
                    Some(last) if last.0 == n => last.2 += 1,
                    _ => runs.push((n, 1, 1)),
                }
            }
            runs
        }
    };
    let mut s = String::from("(vector");
    for (node, count, each) in blocks {
        s.push_str(&format!(",({node},{count},{each})"));
    }
    s.push(')');
    (s.len() <= wire::VALLEN_MAX).then_some(s)
}

/// A daemon's puts as its contribution: `u32 key length, key, u32 value length, value`, so
/// that the daemons' contributions concatenated are one list.
fn encode_puts(puts: &[(String, String)]) -> Bytes {
    let mut b = BytesMut::new();
    for (k, v) in puts {
        b.put_u32(k.len() as u32);
        b.put_slice(k.as_bytes());
        b.put_u32(v.len() as u32);
        b.put_slice(v.as_bytes());
    }
    b.freeze()
}

fn decode_puts(mut b: Bytes) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let field = |b: &mut Bytes| -> Result<String, String> {
        if b.remaining() < 4 {
            return Err("truncated length".into());
        }
        let n = b.get_u32() as usize;
        if b.remaining() < n {
            return Err(format!("a field of {n} bytes with {} left", b.remaining()));
        }
        String::from_utf8(b.split_to(n).to_vec()).map_err(|_| "a field that is not text".to_string())
    };
    while b.has_remaining() {
        let k = field(&mut b)?;
        let v = field(&mut b)?;
        out.push((k, v));
    }
    Ok(out)
}
