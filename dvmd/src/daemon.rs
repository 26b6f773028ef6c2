//! The daemon actor: one task per daemon owns all protocol state (grpcomm, topology, the
//! contact table, HNP bookkeeping) and drives the pure state machines; the transport only
//! moves bytes. Nothing here blocks: every input is an event on the actor's loop.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dvm_grpcomm::{tags, Config, Effect, FenceRequest, FenceSignature, Grpcomm, Participants, Topology, XcastId};
use dvm_proto::control::{BenchKind, BenchReply, DaemonStatus, StatusReply, TerminateReply, TreeViewsReply};
use dvm_proto::daemon::{daemon_cmd, BenchDone, BenchStart, DaemonCmd, DaemonDied, DaemonLost, Ping, TreeView};
use dvm_proto::grpcomm::GrpcommMsg;
use dvm_proto::rml::{Checkin, Contact, FrameHeader, Tag, Wireup};
use dvm_proto::Message;
use dvm_rml::{Frame, Rank, Route, Transport, TransportEvent};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use crate::control::ControlCmd;

/// xcast tags used by the daemon itself (beyond `grpcomm::tags`).
pub mod dtags {
    pub const TREE_QUERY: u32 = super::tags::USER + 1;
    pub const BENCH: u32 = super::tags::USER + 2;
    pub const BENCH_XCAST: u32 = super::tags::USER + 3;
}

/// Why the actor loop ended.
#[derive(Debug)]
pub enum Exit {
    /// Orderly: the DVM was terminated.
    Terminated,
    /// The HNP is gone; this daemon ends too.
    LostHnp(String),
    /// The boot failed (HNP only): the message names the daemon and host.
    BootFailed(String),
}

/// Inputs of the actor besides transport events.
#[derive(Debug)]
pub enum Input {
    /// A daemon process started by the HNP ended (rank, how).
    ChildExited(Rank, String),
    /// The boot deadline passed.
    StartupTimeout,
    /// HNP: a job's --timeout expired.
    JobTimeout(u32),
    /// HNP: the prun of a job went away.
    JobClientGone(u32),
    /// HNP: prun took `bytes` of a daemon's output (its credit can be returned).
    IofDelivered { jobid: u32, daemon: Rank, bytes: u64 },
}

type TreeViewsTx = oneshot::Sender<Result<TreeViewsReply, String>>;

/// HNP-only state.
pub struct Hnp {
    pub expected: u32,
    pub contacts: BTreeMap<Rank, Contact>,
    pub wireup: Option<XcastId>,
    pub ready: Option<oneshot::Sender<()>>,
    pub launched_hosts: BTreeMap<Rank, (String, crate::launch::OutputTail)>,
    pub started: Instant,
    pub session_dir: String,
    terminate: Option<(XcastId, oneshot::Sender<TerminateReply>)>,
    tree_query: Option<(u64, Vec<TreeView>, TreeViewsTx)>,
    bench: Option<HnpBench>,
    next_query: u64,
}

impl Hnp {
    pub fn new(expected: u32, own: Contact, session_dir: String) -> Hnp {
        let mut contacts = BTreeMap::new();
        contacts.insert(0, own);
        Hnp {
            expected,
            contacts,
            wireup: None,
            ready: None,
            launched_hosts: BTreeMap::new(),
            started: Instant::now(),
            session_dir,
            terminate: None,
            tree_query: None,
            bench: None,
            next_query: 1,
        }
    }
}

struct HnpBench {
    id: u64,
    kind: BenchKind,
    count: u64,
    bytes: u64,
    latencies: Vec<u64>,
    started_at: Option<Instant>,
    done: BTreeSet<Rank>,
    errors: u64,
    first_error: String,
    reply: oneshot::Sender<Result<BenchReply, String>>,
    issued: u64,
}

/// A fence benchmark running on one daemon.
struct FenceBench {
    id: u64,
    kind: i32,
    count: u64,
    bytes: u64,
    next: u64,
    errors: u64,
    first_error: String,
    /// Each daemon's contribution pattern, built once per benchmark.
    base: BTreeMap<Rank, Bytes>,
}

impl FenceBench {
    /// Daemon `rank`'s contribution to fence `i`: its pattern with `i` stamped in front.
    fn data(&mut self, rank: Rank, i: u64) -> Bytes {
        let bytes = self.bytes;
        let base = self.base.entry(rank).or_insert_with(|| bench_data(rank, 0, bytes));
        let mut v = base.to_vec();
        let n = v.len().min(8);
        v[..n].copy_from_slice(&i.to_le_bytes()[..n]);
        Bytes::from(v)
    }
}

pub struct Daemon {
    pub me: Rank,
    pub host: String,
    g: Grpcomm,
    t: Transport,
    epoch: u64,
    seq: u64,
    start: Instant,
    pub hnp: Option<Hnp>,
    contacts_known: bool,
    terminating: bool,
    timer: Option<u64>,
    bench: Option<FenceBench>,
    last_encoded: Option<(GrpcommMsg, Bytes)>,
    exit: Option<Exit>,
    pub(crate) jobs: crate::jobs::Jobs,
    odls: crate::odls::Odls,
    odls_rx: Option<mpsc::UnboundedReceiver<crate::odls::OdlsEvent>>,
    input_tx: mpsc::UnboundedSender<Input>,
    input_rx: Option<mpsc::UnboundedReceiver<Input>>,
    pmix: Option<crate::pmix::PmixHost>,
    pmix_rx: Option<mpsc::UnboundedReceiver<pmix_shim::PmixEvent>>,
    pub(crate) pmix_tx: mpsc::UnboundedSender<pmix_shim::PmixEvent>,
    /// Where the PMIx server will run, once the first job needs it; None after a failed start.
    pub(crate) pmix_dir: Option<std::path::PathBuf>,
    /// A PMIx server being started on a helper thread (eager start), claimed by the first job.
    pub(crate) pmix_pending: Option<std::sync::mpsc::Receiver<Result<pmix_shim::PmixServer, pmix_shim::PmixError>>>,
    /// Host name of every daemon (from WIREUP).
    hosts: BTreeMap<Rank, String>,
    session_dir: Option<String>,
    /// The HNP's pid (from WIREUP).
    hnp_pid: Option<u32>,
}

fn bench_data(rank: Rank, i: u64, bytes: u64) -> Bytes {
    // Incompressible (xorshift), so an xcast benchmark moves the bytes it claims to; the
    // fence index is stamped in front so results of different fences never match.
    let mut x = (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v: Vec<u8> = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let stamp = i.to_le_bytes();
    let n = v.len().min(8);
    v[..n].copy_from_slice(&stamp[..n]);
    Bytes::from(v)
}

fn bench_collect(kind: i32, i: u64) -> bool {
    match BenchKind::try_from(kind) {
        Ok(BenchKind::Modex) => true,
        Ok(BenchKind::Alternate) => i % 2 == 1,
        _ => false,
    }
}

impl Daemon {
    pub fn new(me: Rank, host: String, topo: Topology, t: Transport, epoch: u64, hnp: Option<Hnp>) -> Daemon {
        let (odls_tx, odls_rx) = mpsc::unbounded_channel();
        let (input_tx, input_rx) = mpsc::unbounded_channel();
        let host_for_odls = host.clone();
        let (pmix_tx, pmix_rx) = mpsc::unbounded_channel();
        Daemon {
            me,
            host,
            g: Grpcomm::new(topo, Config::default()),
            t,
            epoch,
            seq: 0,
            start: Instant::now(),
            hnp,
            contacts_known: false,
            terminating: false,
            timer: None,
            bench: None,
            last_encoded: None,
            exit: None,
            jobs: Default::default(),
            odls: crate::odls::Odls::new(host_for_odls, odls_tx, crate::jobs::IOF_WINDOW as usize),
            odls_rx: Some(odls_rx),
            input_tx,
            input_rx: Some(input_rx),
            pmix: None,
            pmix_rx: Some(pmix_rx),
            pmix_tx,
            pmix_dir: None,
            pmix_pending: None,
            hosts: BTreeMap::new(),
            session_dir: None,
            hnp_pid: None,
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    pub fn topology(&self) -> &Topology {
        self.g.topology()
    }

    fn frame(&mut self, dst: Rank, tag: Tag, payload: Bytes) -> Frame {
        self.seq += 1;
        Frame::new(FrameHeader { origin: self.me, dst, tag: tag as u32, epoch: self.epoch, seq: self.seq }, payload)
    }

    /// Send a frame toward its destination: along the tree once contacts are known, else
    /// directly (check-in and HNP lifeline messages).
    fn route(&mut self, frame: Frame) {
        let dst = frame.header.dst;
        let next = if self.contacts_known {
            match self.g.topology().route_to(dst) {
                Route::Up(n) | Route::Down(n) => n,
                Route::Local => {
                    warn!(dst, "frame for this daemon routed to itself");
                    return;
                }
                Route::Unreachable => {
                    warn!(dst, tag = frame.header.tag, "no route to daemon {dst} (failed): frame dropped");
                    return;
                }
            }
        } else {
            dst
        };
        if let Err(e) = self.t.send(next, frame) {
            warn!(next, dst, "send failed: {e}");
            self.g.peer_unreachable(next);
            self.run_effects();
        }
    }

    fn send_cmd(&mut self, dst: Rank, body: daemon_cmd::Body) {
        let payload = Bytes::from(DaemonCmd { body: Some(body) }.encode_to_vec());
        if dst == self.me {
            self.on_cmd(self.me, payload);
            return;
        }
        let f = self.frame(dst, Tag::DaemonCmd, payload);
        self.route(f);
    }

    /// Daemon side of the boot: report to the HNP.
    pub fn check_in(&mut self, own: Contact) {
        let payload = Bytes::from(Checkin { contacts: vec![own] }.encode_to_vec());
        let f = self.frame(0, Tag::Checkin, payload);
        if let Err(e) = self.t.send(0, f) {
            error!("cannot send check-in to the HNP: {e}");
        }
    }

    /// Run until the DVM ends for this daemon.
    pub async fn run(
        &mut self,
        mut events: mpsc::Receiver<TransportEvent>,
        mut control: mpsc::Receiver<ControlCmd>,
        mut inputs: mpsc::UnboundedReceiver<Input>,
    ) -> Exit {
        let mut own_inputs = self.input_rx.take().expect("run is called once");
        let mut odls_rx = self.odls_rx.take().expect("run is called once");
        let mut pmix_rx = self.pmix_rx.take().expect("run is called once");
        let exit = loop {
            let sleep = match self.timer {
                Some(at) => Duration::from_nanos(at.saturating_sub(self.now())),
                None => Duration::from_secs(3600),
            };
            let exit = tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) => self.on_transport(ev),
                    None => Some(Exit::LostHnp("transport closed".into())),
                },
                Some(cmd) = control.recv() => { self.on_control(cmd); None }
                Some(inp) = inputs.recv() => self.on_input(inp),
                Some(inp) = own_inputs.recv() => self.on_input(inp),
                Some(ev) = odls_rx.recv() => { self.on_odls(ev); None }
                Some(ev) = pmix_rx.recv() => { self.on_pmix(ev); None }
                _ = tokio::time::sleep(sleep), if self.timer.is_some() => {
                    self.timer = None;
                    let now = self.now();
                    self.g.tick(now);
                    self.run_effects();
                    None
                }
            };
            if let Some(exit) = exit {
                break exit;
            }
            if let Some(exit) = self.finished() {
                break exit;
            }
        };
        // Nothing this daemon started outlives it.
        self.odls.kill_all();
        if let Some(px) = self.pmix.take() {
            drop(px);
        }
        exit
    }

    fn finished(&mut self) -> Option<Exit> {
        self.exit.take()
    }

    fn on_input(&mut self, inp: Input) -> Option<Exit> {
        match inp {
            Input::JobTimeout(j) => {
                self.on_job_timeout(j);
                None
            }
            Input::JobClientGone(j) => {
                self.on_client_gone(j);
                None
            }
            Input::IofDelivered { jobid, daemon, bytes } => {
                self.on_iof_delivered(jobid, daemon, bytes);
                None
            }
            Input::ChildExited(rank, how) => {
                let hnp = self.hnp.as_ref()?;
                let (host, out) = hnp.launched_hosts.get(&rank).cloned().unwrap_or_default();
                if hnp.ready.is_some() {
                    return Some(Exit::BootFailed(format!(
                        "daemon {rank} on host {host} {how} before the DVM was ready; it printed: {}",
                        out.text()
                    )));
                }
                if !self.terminating {
                    warn!(rank, %host, "daemon process {how}");
                }
                None
            }
            Input::StartupTimeout => {
                let hnp = self.hnp.as_ref()?;
                hnp.ready.as_ref()?;
                let missing: Vec<String> = (1..hnp.expected)
                    .filter(|r| !hnp.contacts.contains_key(r))
                    .map(|r| {
                        let (host, out) = hnp.launched_hosts.get(&r).cloned().unwrap_or_default();
                        format!("daemon {r} on host {host} (it printed: {})", out.text())
                    })
                    .collect();
                let what = if missing.is_empty() {
                    "the WIREUP broadcast did not complete".to_string()
                } else {
                    format!("{} daemon(s) did not check in: {}", missing.len(), missing.join("; "))
                };
                Some(Exit::BootFailed(format!("DVM start-up timed out: {what}")))
            }
        }
    }

    fn on_transport(&mut self, ev: TransportEvent) -> Option<Exit> {
        match ev {
            TransportEvent::Frame { from_peer, frame } => {
                if frame.header.dst != self.me {
                    // Relay along the tree.
                    self.route(frame);
                    return None;
                }
                match Tag::try_from(frame.header.tag as i32) {
                    Ok(Tag::Grpcomm) => match GrpcommMsg::decode(frame.payload) {
                        Ok(msg) => {
                            self.g.handle(frame.header.origin, msg);
                            self.run_effects();
                        }
                        Err(e) => warn!(from_peer, origin = frame.header.origin, "undecodable grpcomm message: {e}"),
                    },
                    Ok(Tag::Checkin) => self.on_checkin(from_peer, frame.payload),
                    Ok(Tag::DaemonCmd) => self.on_cmd(frame.header.origin, frame.payload),
                    Ok(Tag::Heartbeat) => {}
                    _ => warn!(from_peer, tag = frame.header.tag, "frame with unknown tag dropped"),
                }
                None
            }
            TransportEvent::PeerLost { peer, reason } | TransportEvent::ConnectFailed { peer, reason } => {
                self.on_peer_lost(peer, reason.to_string())
            }
        }
    }

    fn on_peer_lost(&mut self, peer: Rank, reason: String) -> Option<Exit> {
        if peer == 0 && self.me != 0 {
            return Some(if self.terminating {
                Exit::Terminated
            } else {
                Exit::LostHnp(format!("lost the connection to the HNP: {reason}"))
            });
        }
        if self.terminating || !self.g.topology().is_alive(peer) {
            return None;
        }
        let topo = self.g.topology();
        let neighbour = topo.parent() == Some(peer) || topo.children().contains(&peer);
        if !neighbour {
            debug!(peer, "lost a non-tree connection: {reason}");
            return None;
        }
        warn!(peer, "lost tree neighbour daemon {peer}: {reason}");
        self.g.peer_unreachable(peer);
        self.run_effects();
        let lost = DaemonLost { lost: peer, reason };
        if self.me == 0 {
            self.on_daemon_lost(lost);
        } else {
            // Straight to the HNP: the tree may be broken at this very link.
            let payload = Bytes::from(DaemonCmd { body: Some(daemon_cmd::Body::DaemonLost(lost)) }.encode_to_vec());
            let f = self.frame(0, Tag::DaemonCmd, payload);
            if let Err(e) = self.t.send(0, f) {
                return Some(Exit::LostHnp(format!("cannot report a lost daemon to the HNP: {e}")));
            }
        }
        None
    }

    /// HNP: a daemon is gone. Mark it failed everywhere (DAEMON_DIED, processed first).
    fn on_daemon_lost(&mut self, lost: DaemonLost) {
        let Some(hnp) = self.hnp.as_ref() else { return };
        if self.terminating || !self.g.topology().is_alive(lost.lost) || lost.lost == 0 {
            return;
        }
        let host = hnp.contacts.get(&lost.lost).map(|c| c.host.clone()).unwrap_or_default();
        eprintln!("dvmd: daemon {} on host {host} was lost: {}", lost.lost, lost.reason);
        let mut failed: Vec<Rank> = self.g.topology().failed().iter().copied().collect();
        failed.push(lost.lost);
        let payload = Bytes::from(DaemonDied { failed }.encode_to_vec());
        self.g.xcast(tags::DAEMON_DIED, payload);
        self.run_effects();
    }

    fn on_checkin(&mut self, from_peer: Rank, payload: Bytes) {
        let Some(hnp) = self.hnp.as_mut() else {
            warn!(from_peer, "check-in received by a daemon that is not the HNP");
            return;
        };
        let Ok(ci) = Checkin::decode(payload) else {
            warn!(from_peer, "undecodable check-in");
            return;
        };
        for c in ci.contacts {
            if c.rank == 0 || c.rank >= hnp.expected {
                warn!(from_peer, rank = c.rank, "check-in for a rank outside the DVM");
                continue;
            }
            debug!(rank = c.rank, host = %c.host, addr = %c.addr, "daemon checked in");
            hnp.contacts.insert(c.rank, c);
        }
        self.maybe_wireup();
    }

    /// HNP: once every daemon checked in, broadcast the contact table (WIREUP).
    pub fn maybe_wireup(&mut self) {
        let Some(hnp) = self.hnp.as_mut() else { return };
        if hnp.contacts.len() as u32 == hnp.expected && hnp.wireup.is_none() {
            let w = Wireup { contacts: hnp.contacts.values().cloned().collect(), radix: self.g.topology().radix() };
            let payload = Bytes::from(w.encode_to_vec());
            let id = self.g.xcast(tags::WIREUP, payload);
            if let Some(h) = self.hnp.as_mut() {
                h.wireup = Some(id);
            }
            self.run_effects();
        }
    }

    fn apply_wireup(&mut self, payload: &[u8]) {
        match Wireup::decode(payload) {
            Ok(w) => {
                let mut table = Vec::new();
                for c in &w.contacts {
                    self.hosts.insert(c.rank, c.host.clone());
                    if c.rank == 0 {
                        self.hnp_pid = Some(c.pid);
                    }
                    match c.addr.parse::<SocketAddr>() {
                        Ok(a) if c.rank != self.me => table.push((c.rank, a)),
                        Ok(_) => {}
                        Err(_) => warn!(rank = c.rank, addr = %c.addr, "bad address in the contact table"),
                    }
                }
                self.t.set_contacts(table);
                self.contacts_known = true;
                info!(daemons = w.contacts.len(), "wired up");
            }
            Err(e) => error!("undecodable WIREUP: {e}"),
        }
    }

    fn run_effects(&mut self) {
        loop {
            let effects: Vec<Effect> = self.g.drain().collect();
            if effects.is_empty() {
                return;
            }
            for e in effects {
                self.on_effect(e);
            }
        }
    }

    fn encode_grpcomm(&mut self, msg: GrpcommMsg) -> Bytes {
        // Forwards of one op to many children: encode once.
        if let Some((last, bytes)) = &self.last_encoded {
            if *last == msg {
                return bytes.clone();
            }
        }
        let bytes = Bytes::from(msg.encode_to_vec());
        self.last_encoded = Some((msg, bytes.clone()));
        bytes
    }

    fn on_effect(&mut self, e: Effect) {
        match e {
            Effect::Send { to, msg } => {
                let payload = self.encode_grpcomm(msg);
                let f = self.frame(to, Tag::Grpcomm, payload);
                self.route(f);
            }
            Effect::Deliver { op_id, origin, tag, payload } => self.on_deliver(op_id, origin, tag, payload),
            Effect::XcastComplete { id, .. } => self.on_xcast_complete(id),
            Effect::FenceComplete { id, result } => {
                if !self.pmix_fence_done(&id, &result) {
                    self.on_fence_complete(id.seq, result)
                }
            }
            Effect::ScatterDeliver { tag, data, .. } => {
                if tag == tags::LAUNCH_RESIDUALS {
                    self.on_launch_residual(data);
                }
            }
            Effect::ArmTimer { at } => {
                self.timer = Some(self.timer.map_or(at, |t| t.min(at)));
            }
            Effect::Dropped { from, reason } => warn!(from, "grpcomm dropped a message: {reason}"),
        }
    }

    fn on_deliver(&mut self, op_id: u64, origin: Rank, tag: u32, payload: Bytes) {
        debug!(op_id, origin, tag, len = payload.len(), "xcast delivered");
        match tag {
            tags::WIREUP => {
                self.apply_wireup(&payload);
                self.g.xcast_processed(op_id);
            }
            tags::DAEMON_DIED => {
                match DaemonDied::decode(payload) {
                    Ok(d) => {
                        let failed: BTreeSet<Rank> = d.failed.into_iter().filter(|&r| r != self.me).collect();
                        if let Err(e) = self.g.topology_changed(&failed) {
                            error!("cannot repair the tree: {e}");
                        }
                        if self.hnp.is_some() {
                            self.jobs_lost_daemons(&failed);
                        }
                    }
                    Err(e) => error!("undecodable DAEMON_DIED: {e}"),
                }
                self.g.xcast_processed(op_id);
            }
            tags::LAUNCH => self.on_launch_map(payload),
            tags::JOB_CONTROL => self.on_job_control_xcast(payload),
            tags::TERMINATE => {
                info!("DVM terminating");
                self.terminating = true;
            }
            dtags::TREE_QUERY => {
                let query = u64::from_le_bytes(payload.get(..8).and_then(|b| b.try_into().ok()).unwrap_or_default());
                let topo = self.g.topology();
                let view = TreeView {
                    query,
                    rank: self.me,
                    parent: topo.parent().unwrap_or(u32::MAX),
                    children: topo.children().to_vec(),
                    // The name the node itself reports (the label is in the HNP's status).
                    host: nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default(),
                    pid: std::process::id(),
                    rss_kib: rss_kib(),
                };
                self.send_cmd(0, daemon_cmd::Body::TreeView(view));
            }
            dtags::BENCH => match BenchStart::decode(payload) {
                Ok(b) => {
                    self.bench = Some(FenceBench {
                        id: b.bench,
                        kind: b.kind as i32,
                        count: b.count,
                        bytes: b.bytes,
                        next: 0,
                        errors: 0,
                        first_error: String::new(),
                        base: BTreeMap::new(),
                    });
                    self.next_bench_fence();
                }
                Err(e) => error!("undecodable BENCH: {e}"),
            },
            _ => {}
        }
    }

    fn next_bench_fence(&mut self) {
        let Some(b) = self.bench.as_mut() else { return };
        if b.next == b.count {
            let topo = self.g.topology();
            let live: Vec<Rank> = (0..topo.size()).filter(|&r| topo.is_alive(r)).collect();
            let sig = FenceSignature::new(format!("bench-{}", b.id).into_bytes(), Participants::Daemons(live));
            let done = BenchDone {
                bench: b.id,
                rank: self.me,
                completed: b.count,
                errors: b.errors,
                first_error: b.first_error.clone(),
            };
            self.bench = None;
            self.g.forget_fence_signature(&sig);
            self.send_cmd(0, daemon_cmd::Body::BenchDone(done));
            return;
        }
        let i = b.next;
        b.next += 1;
        let collect = bench_collect(b.kind, i);
        let me = self.me;
        let data = if collect { b.data(me, i) } else { Bytes::new() };
        // Every live daemon, as this daemon's topology says (identical everywhere: repairs are
        // xcasts, processed in op order before the benchmark's own start).
        let topo = self.g.topology();
        let live: Vec<Rank> = (0..topo.size()).filter(|&r| topo.is_alive(r)).collect();
        let sig = FenceSignature::new(format!("bench-{}", b.id).into_bytes(), Participants::Daemons(live));
        if let Some(h) = self.hnp.as_mut() {
            if let Some(hb) = h.bench.as_mut() {
                hb.started_at = Some(Instant::now());
            }
        }
        let now = self.now();
        self.g.fence(FenceRequest { sig, collect, data, timeout: Some(60_000_000_000) }, now);
        self.run_effects();
    }

    fn on_fence_complete(&mut self, seq: u64, result: Result<Bytes, dvm_grpcomm::FenceError>) {
        // Time first: the check below is not part of the fence.
        if let Some(hb) = self.hnp.as_mut().and_then(|h| h.bench.as_mut()) {
            if let Some(t0) = hb.started_at.take() {
                hb.latencies.push(t0.elapsed().as_nanos() as u64);
            }
        }
        let live: Vec<Rank> = (0..self.g.topology().size()).filter(|&r| self.g.topology().is_alive(r)).collect();
        let Some(b) = self.bench.as_mut() else {
            debug!(seq, "fence completed with no benchmark running");
            return;
        };
        let i = b.next - 1;
        let err = match result {
            Err(e) => Some(format!("daemon {}: fence {i} failed: {e}", self.me)),
            Ok(bytes) => {
                let expect: Vec<u8> = if bench_collect(b.kind, i) {
                    live.iter().flat_map(|&r| b.data(r, i)).collect()
                } else {
                    Vec::new()
                };
                (bytes[..] != expect[..]).then(|| {
                    format!(
                        "daemon {}: fence {i} returned {} bytes that differ from the {} expected",
                        self.me,
                        bytes.len(),
                        expect.len()
                    )
                })
            }
        };
        if let Some(e) = err {
            if b.errors == 0 {
                b.first_error = e;
            }
            b.errors += 1;
        }
        self.next_bench_fence();
    }

    fn on_xcast_complete(&mut self, id: XcastId) {
        let Some(hnp) = self.hnp.as_mut() else { return };
        if hnp.wireup == Some(id) {
            if let Some(tx) = hnp.ready.take() {
                let _ = tx.send(());
            }
            return;
        }
        if let Some((tid, _)) = &hnp.terminate {
            if *tid == id {
                let (_, tx) = hnp.terminate.take().expect("checked above");
                let _ = tx.send(TerminateReply { ok: true, message: "every daemon received TERMINATE".into() });
                self.exit = Some(Exit::Terminated);
                return;
            }
        }
        if let Some(b) = hnp.bench.as_mut() {
            if b.kind == BenchKind::Xcast {
                if let Some(t0) = b.started_at.take() {
                    b.latencies.push(t0.elapsed().as_nanos() as u64);
                }
                self.next_bench_xcast();
            }
        }
    }

    fn next_bench_xcast(&mut self) {
        let Some(b) = self.hnp.as_mut().and_then(|h| h.bench.as_mut()) else { return };
        if b.issued == b.count {
            self.finish_bench();
            return;
        }
        b.issued += 1;
        let payload = bench_data(0, b.issued, b.bytes);
        b.started_at = Some(Instant::now());
        self.g.xcast(dtags::BENCH_XCAST, payload);
        self.run_effects();
    }

    fn next_bench_ping(&mut self) {
        let Some(b) = self.hnp.as_mut().and_then(|h| h.bench.as_mut()) else { return };
        if b.issued == b.count {
            self.finish_bench();
            return;
        }
        b.issued += 1;
        let seq = b.issued;
        let payload = Bytes::from(vec![0u8; b.bytes as usize]);
        b.started_at = Some(Instant::now());
        let peer = if self.g.topology().size() > 1 { 1 } else { 0 };
        self.send_cmd(peer, daemon_cmd::Body::Ping(Ping { seq, payload }));
    }

    fn finish_bench(&mut self) {
        let topo = self.g.topology();
        let (daemons, radix, depth) = (topo.live_count(), topo.radix(), topo.height());
        let Some(b) = self.hnp.as_mut().and_then(|h| h.bench.take()) else { return };
        let _ = b.reply.send(Ok(BenchReply {
            latencies_ns: b.latencies,
            errors: b.errors,
            first_error: b.first_error,
            daemons,
            radix,
            depth,
        }));
    }

    fn on_cmd(&mut self, origin: Rank, payload: Bytes) {
        let cmd = match DaemonCmd::decode(payload) {
            Ok(DaemonCmd { body: Some(b) }) => b,
            _ => {
                warn!(origin, "undecodable daemon command");
                return;
            }
        };
        match cmd {
            daemon_cmd::Body::Ping(p) => self.send_cmd(origin, daemon_cmd::Body::Pong(p)),
            daemon_cmd::Body::Pong(_) => {
                if let Some(b) = self.hnp.as_mut().and_then(|h| h.bench.as_mut()) {
                    if let Some(t0) = b.started_at.take() {
                        b.latencies.push(t0.elapsed().as_nanos() as u64);
                    }
                }
                self.next_bench_ping();
            }
            daemon_cmd::Body::TreeView(v) => {
                let Some(hnp) = self.hnp.as_mut() else { return };
                let Some((q, views, _)) = hnp.tree_query.as_mut() else { return };
                if v.query != *q {
                    return;
                }
                views.push(v);
                if views.len() as u32 == self.g.topology().live_count() {
                    let (_, mut views, tx) = hnp.tree_query.take().expect("checked above");
                    views.sort_by_key(|v| v.rank);
                    let views = views
                        .into_iter()
                        .map(|v| dvm_proto::control::TreeView {
                            rank: v.rank,
                            parent: v.parent,
                            children: v.children,
                            host: v.host,
                            pid: v.pid,
                            rss_kib: v.rss_kib,
                        })
                        .collect();
                    let _ = tx.send(Ok(TreeViewsReply { views }));
                }
            }
            daemon_cmd::Body::BenchDone(d) => {
                let live = self.g.topology().live_count();
                let Some(b) = self.hnp.as_mut().and_then(|h| h.bench.as_mut()) else { return };
                if d.bench != b.id {
                    return;
                }
                if d.errors > 0 && b.errors == 0 {
                    b.first_error = d.first_error;
                }
                b.errors += d.errors;
                b.done.insert(d.rank);
                if b.done.len() as u32 == live {
                    self.finish_bench();
                }
            }
            daemon_cmd::Body::DaemonLost(l) => self.on_daemon_lost(l),
            other => self.on_job_cmd(origin, other),
        }
    }

    fn on_control(&mut self, cmd: ControlCmd) {
        let size = self.g.topology().size();
        match cmd {
            ControlCmd::Launch(..) | ControlCmd::LaunchPlan(..) | ControlCmd::Stdin(..) | ControlCmd::Signal(..) => {
                self.on_job_control(cmd)
            }
            ControlCmd::Status(tx) => {
                let Some(hnp) = self.hnp.as_ref() else { return };
                let repaired = self.g.topology().repaired();
                let daemons = (0..size)
                    .map(|r| {
                        let c = hnp.contacts.get(&r).cloned().unwrap_or_default();
                        let alive = repaired.is_alive(r);
                        DaemonStatus {
                            rank: r,
                            host: c.host,
                            addr: c.addr,
                            pid: c.pid,
                            parent: if alive { repaired.parent_of(r).unwrap_or(u32::MAX) } else { u32::MAX },
                            children: if alive { repaired.children_of(r) } else { Vec::new() },
                            slots: c.slots,
                            alive,
                        }
                    })
                    .collect();
                let _ = tx.send(StatusReply {
                    num_daemons: size,
                    radix: self.g.topology().radix(),
                    uptime_ms: hnp.started.elapsed().as_millis() as u64,
                    daemons,
                    session_dir: hnp.session_dir.clone(),
                });
            }
            ControlCmd::Terminate(tx) => {
                if self.terminating {
                    let _ = tx.send(TerminateReply { ok: true, message: "already terminating".into() });
                    return;
                }
                let id = self.g.xcast(tags::TERMINATE, Bytes::new());
                if let Some(h) = self.hnp.as_mut() {
                    h.terminate = Some((id, tx));
                }
                self.run_effects();
            }
            ControlCmd::TreeViews(tx) => {
                let Some(hnp) = self.hnp.as_mut() else { return };
                if hnp.tree_query.is_some() {
                    let _ = tx.send(Err("a tree query is already running".into()));
                    return;
                }
                let q = hnp.next_query;
                hnp.next_query += 1;
                hnp.tree_query = Some((q, Vec::new(), tx));
                self.g.xcast(dtags::TREE_QUERY, Bytes::copy_from_slice(&q.to_le_bytes()));
                self.run_effects();
            }
            ControlCmd::Bench(req, tx) => {
                let Some(hnp) = self.hnp.as_mut() else { return };
                if hnp.bench.is_some() {
                    let _ = tx.send(Err("a benchmark is already running".into()));
                    return;
                }
                let kind = req.kind();
                if kind == BenchKind::Unspecified || req.count == 0 {
                    let _ = tx.send(Err("benchmark needs a kind and a count of at least 1".into()));
                    return;
                }
                let id = hnp.next_query;
                hnp.next_query += 1;
                hnp.bench = Some(HnpBench {
                    id,
                    kind,
                    count: req.count,
                    bytes: req.bytes,
                    latencies: Vec::with_capacity(req.count as usize),
                    started_at: None,
                    done: BTreeSet::new(),
                    errors: 0,
                    first_error: String::new(),
                    reply: tx,
                    issued: 0,
                });
                match kind {
                    BenchKind::Xcast => self.next_bench_xcast(),
                    BenchKind::Ping => self.next_bench_ping(),
                    _ => {
                        let b = self.hnp.as_ref().and_then(|h| h.bench.as_ref()).expect("set above");
                        let start = BenchStart { bench: b.id, kind: b.kind as u32, count: b.count, bytes: b.bytes };
                        self.g.xcast(dtags::BENCH, Bytes::from(start.encode_to_vec()));
                        self.run_effects();
                    }
                }
            }
        }
    }

    pub(crate) fn input_tx(&self) -> mpsc::UnboundedSender<Input> {
        self.input_tx.clone()
    }
    pub(crate) fn grpcomm_mut(&mut self) -> &mut Grpcomm {
        &mut self.g
    }
    /// Carry out every effect the state machines produced.
    pub(crate) fn pump(&mut self) {
        self.run_effects();
    }
    pub(crate) fn odls(&self) -> &crate::odls::Odls {
        &self.odls
    }
    pub(crate) fn odls_mut(&mut self) -> &mut crate::odls::Odls {
        &mut self.odls
    }
    pub(crate) fn send_job_cmd(&mut self, dst: Rank, body: daemon_cmd::Body) {
        self.send_cmd(dst, body);
    }
    /// Host name of a daemon (from WIREUP, or the HNP's check-in table).
    pub(crate) fn host_of(&self, rank: Rank) -> String {
        if let Some(h) = self.hosts.get(&rank) {
            return h.clone();
        }
        self.hnp
            .as_ref()
            .and_then(|h| h.contacts.get(&rank))
            .map_or_else(|| format!("daemon-{rank}"), |c| c.host.clone())
    }
    pub(crate) fn set_pmix(&mut self, host: crate::pmix::PmixHost) {
        self.pmix = Some(host);
    }
    pub(crate) fn pmix_mut(&mut self) -> Option<&mut crate::pmix::PmixHost> {
        self.pmix.as_mut()
    }
    pub(crate) fn pmix_ref(&self) -> Option<&crate::pmix::PmixHost> {
        self.pmix.as_ref()
    }
    /// This daemon's session directory (per-daemon scratch for its ranks).
    pub fn set_session_dir(&mut self, dir: &std::path::Path) {
        self.session_dir = Some(dir.display().to_string());
    }
    pub(crate) fn session_dir(&self) -> Option<String> {
        self.session_dir.clone()
    }
    /// This DVM's identity (the HNP's host and pid), the same on every daemon after WIREUP.
    pub(crate) fn dvm_id(&self) -> String {
        let pid = self.hnp.as_ref().and_then(|h| h.contacts.get(&0)).map(|c| c.pid).or(self.hnp_pid).unwrap_or(0);
        format!("{}-{pid}", self.host_of(0))
    }
    pub(crate) fn now_ns(&self) -> u64 {
        self.now()
    }
    /// Whether this daemon listens on a loopback address (a DVM on one host).
    pub(crate) fn on_loopback(&self) -> bool {
        self.t.local_addr().ip().is_loopback()
    }

    /// A one-daemon DVM: nothing to wait for.
    pub fn wire_single(&mut self) {
        self.maybe_wireup();
    }

    pub fn into_transport(self) -> Transport {
        self.t
    }
}

/// Resident set size of this process in KiB (Linux).
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
