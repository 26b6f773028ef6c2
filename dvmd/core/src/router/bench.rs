//! The collective benchmarks the HNP runs on request (`dvm-bench`): fence storms (barrier,
//! modex, or both alternating, checked byte for byte on every daemon), xcasts and pings.
//!
//! A fence benchmark is one xcast (BENCH) that every daemon applies in op order; each then
//! runs `count` fences over the participant set fixed at that moment, one after the other.
//! Invariant: the first failed fence ends the benchmark on that daemon, which reports it to
//! the HNP naming the lost daemon(s); nobody starts another fence over a set that changed
//! underneath it. The HNP answers once every live daemon has reported (a daemon lost during
//! the benchmark is no longer waited for).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use dvm_grpcomm::{
    BcastMovementMode, FenceError, FenceId, FenceMovementMode, FenceRequest, FenceSignature, Participants,
};
use dvm_proto::control::{BenchKind, BenchReply};
use dvm_proto::daemon::{daemon_cmd, BenchDone, BenchStart, Ping};
use dvm_proto::Message;
use tracing::{debug, error};

use crate::{dtags, Core, Effect, FenceOwner, Rank, XcastOwner};

/// The largest per-daemon contribution or xcast payload a benchmark may ask for: every daemon
/// allocates it (several times over for a modex), so a size typed by a user must be refused,
/// not attempted.
pub const MAX_BENCH_BYTES: u64 = 64 << 20;

/// Fence timeout of a benchmark fence (a hang guard; losses end fences much sooner).
const BENCH_FENCE_TIMEOUT_NS: u64 = 60_000_000_000;

/// A fence benchmark running on one daemon.
#[derive(Debug)]
pub struct DaemonBench {
    id: u64,
    kind: BenchKind,
    count: u64,
    bytes: u64,
    next: u64,
    errors: u64,
    failed: u64,
    first_error: String,
    sig: FenceSignature,
    participants: Vec<Rank>,
    /// Each daemon's contribution pattern, built once per benchmark.
    base: BTreeMap<Rank, Bytes>,
    /// The movement its fences run on (None: the DVM's).
    fence_movement: Option<FenceMovementMode>,
}

/// The HNP's side of a benchmark.
#[derive(Debug)]
pub struct HnpBench {
    id: u64,
    kind: BenchKind,
    count: u64,
    bytes: u64,
    latencies: Vec<u64>,
    started_at: Option<u64>,
    done: BTreeSet<Rank>,
    errors: u64,
    failed: u64,
    first_error: String,
    /// The daemons alive when it started: those gone at its end were lost during it.
    live_at_start: Vec<Rank>,
    issued: u64,
    /// The daemon a ping benchmark talks to.
    ping_peer: Option<Rank>,
    /// The movement an xcast benchmark's ops take (None: the DVM's).
    bcast_movement: Option<BcastMovementMode>,
    /// Run by the HNP itself (the boot's fence calibration): its result goes there.
    internal: bool,
}

/// Incompressible bytes (xorshift) with the fence index stamped in front, so an xcast
/// benchmark moves the bytes it claims to and results of different fences never match.
pub fn bench_data(rank: Rank, i: u64, bytes: u64) -> Bytes {
    let mut x = (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v: Vec<u8> = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let n = v.len().min(8);
    v[..n].copy_from_slice(&i.to_le_bytes()[..n]);
    Bytes::from(v)
}

/// Payload of op `i` of xcast benchmark `bench`: [`bench_data`] with the benchmark id after
/// the index, so every daemon can check what it holds, byte for byte, and name the benchmark
/// when it reports a difference.
pub fn bench_xcast_payload(bench: u64, i: u64, bytes: u64) -> Bytes {
    let mut v = bench_data(0, i, bytes).to_vec();
    if v.len() >= 16 {
        v[8..16].copy_from_slice(&bench.to_le_bytes());
    }
    Bytes::from(v)
}

/// Set in the ids of the boot's fence calibration runs (the `calibrate` module).
pub const CALIBRATION_RUN: u64 = 1 << 62;

/// "benchmark N", or "fence calibration run N" for the boot's.
fn bench_name(id: u64) -> String {
    if id & CALIBRATION_RUN != 0 {
        format!("fence calibration run {}", id & !CALIBRATION_RUN)
    } else {
        format!("benchmark {id}")
    }
}

/// Whether fence `i` of a benchmark of `kind` collects data (a modex) or is a barrier.
pub fn bench_collect(kind: BenchKind, i: u64) -> bool {
    match kind {
        BenchKind::Modex => true,
        BenchKind::Alternate => i % 2 == 1,
        _ => false,
    }
}

impl DaemonBench {
    /// One line for diagnostics: id, next fence, errors.
    pub fn describe(&self) -> String {
        format!("bench {} next {} of {} errors {}", self.id, self.next, self.count, self.errors)
    }

    fn data(&mut self, rank: Rank, i: u64) -> Bytes {
        let bytes = self.bytes;
        let base = self.base.entry(rank).or_insert_with(|| bench_data(rank, 0, bytes));
        let mut v = base.to_vec();
        let n = v.len().min(8);
        v[..n].copy_from_slice(&i.to_le_bytes()[..n]);
        Bytes::from(v)
    }
}

impl Core {
    /// HNP: a benchmark was asked for.
    pub(crate) fn start_bench(
        &mut self,
        kind: BenchKind,
        count: u64,
        bytes: u64,
        fence_movement: Option<FenceMovementMode>,
        bcast_movement: Option<BcastMovementMode>,
        internal: bool,
    ) {
        let Some(hnp) = self.hnp.as_mut() else { return };
        if hnp.bench.is_some() {
            self.out.push(Effect::BenchDone(Err("a benchmark is already running".into())));
            return;
        }
        if kind == BenchKind::Unspecified || count == 0 {
            self.out.push(Effect::BenchDone(Err("benchmark needs a kind and a count of at least 1".into())));
            return;
        }
        if bytes > MAX_BENCH_BYTES {
            let why =
                format!("benchmark size {bytes} bytes is above the largest a benchmark may use ({MAX_BENCH_BYTES})");
            self.out.push(Effect::BenchDone(Err(why)));
            return;
        }
        // The boot's calibration runs number apart from the benchmarks users ask for (whose
        // numbers, from 1, they read in the log).
        let id = if internal {
            hnp.next_calibration += 1;
            CALIBRATION_RUN | hnp.next_calibration
        } else {
            hnp.next_bench += 1;
            hnp.next_bench - 1
        };
        let live_at_start = self.g.topology().live_ranks().collect();
        let Some(hnp) = self.hnp.as_mut() else { return };
        hnp.bench = Some(HnpBench {
            id,
            kind,
            count,
            bytes,
            latencies: Vec::with_capacity(count.min(1 << 20) as usize),
            started_at: None,
            done: BTreeSet::new(),
            errors: 0,
            failed: 0,
            first_error: String::new(),
            live_at_start,
            issued: 0,
            ping_peer: None,
            bcast_movement,
            internal,
        });
        match kind {
            BenchKind::Xcast => self.next_bench_xcast(),
            BenchKind::Ping => self.next_bench_ping(),
            _ => {
                let fence_movement = fence_movement.map(|m| m.name().to_string()).unwrap_or_default();
                let start = BenchStart { bench: id, kind: kind as u32, count, bytes, fence_movement };
                let xid = self.g.xcast(dtags::BENCH, Bytes::from(start.encode_to_vec()));
                self.xcast_owners.insert(xid, XcastOwner::Shell);
            }
        }
    }

    /// HNP: a fence benchmark of its own (the boot's calibration), on `mode`; its result goes
    /// to [`Core::on_calibration_run`].
    pub(crate) fn start_internal_bench(&mut self, kind: BenchKind, count: u64, bytes: u64, mode: FenceMovementMode) {
        if self.hnp.as_ref().is_some_and(|h| h.bench.is_some()) {
            return self.on_calibration_run(Err("a benchmark is already running".into()));
        }
        self.start_bench(kind, count, bytes, Some(mode), None, true);
        if self.hnp.as_ref().is_some_and(|h| h.bench.is_none()) {
            self.abandon_calibration("its benchmark did not start");
        }
    }

    /// Every daemon: BENCH delivered (in op order, after every DAEMON_DIED before it).
    pub(crate) fn on_bench_start(&mut self, payload: Bytes) {
        let b = match BenchStart::decode(payload) {
            Ok(b) => b,
            Err(e) => {
                error!("undecodable BENCH: {e}");
                return;
            }
        };
        if b.bytes > MAX_BENCH_BYTES {
            error!(bytes = b.bytes, "BENCH asks for {} bytes, above {MAX_BENCH_BYTES}: ignored", b.bytes);
            return;
        }
        let topo = self.g.topology();
        let participants: Vec<Rank> = topo.live_ranks().collect();
        let sig =
            FenceSignature::new(format!("bench-{}", b.bench).into_bytes(), Participants::Daemons(participants.clone()));
        tracing::info!(
            bench = b.bench,
            daemons = participants.len(),
            "{} started: {} fences over {} daemons",
            bench_name(b.bench),
            b.count,
            participants.len()
        );
        self.bench = Some(DaemonBench {
            id: b.bench,
            kind: BenchKind::try_from(b.kind as i32).unwrap_or(BenchKind::Barrier),
            count: b.count,
            bytes: b.bytes,
            next: 0,
            errors: 0,
            failed: 0,
            first_error: String::new(),
            sig,
            participants,
            base: BTreeMap::new(),
            // A name this daemon does not know runs the DVM's movement; the fences then fail
            // with a movement mismatch that names both, never hang.
            fence_movement: b.fence_movement.parse().ok(),
        });
        self.next_bench_fence();
    }

    fn next_bench_fence(&mut self) {
        let me = self.me;
        let now = self.now;
        let Some(b) = self.bench.as_mut() else { return };
        if b.next == b.count || b.errors > 0 {
            let done = BenchDone {
                bench: b.id,
                rank: me,
                completed: b.next,
                errors: b.errors,
                first_error: b.first_error.clone(),
                failed: b.failed,
            };
            let sig = b.sig.clone();
            self.bench = None;
            if let Some(old) = self.bench_done_sig.replace(sig) {
                self.g.forget_fence_signature(&old);
            }
            self.report_to_hnp(daemon_cmd::Body::BenchDone(done));
            return;
        }
        let i = b.next;
        b.next += 1;
        let collect = bench_collect(b.kind, i);
        let data = if collect { b.data(me, i) } else { Bytes::new() };
        // Every daemon knows the benchmark's size and its participants alike.
        let size_hint = collect.then(|| b.bytes.saturating_mul(b.participants.len() as u64));
        let req = FenceRequest { sig: b.sig.clone(), collect, data, timeout: Some(BENCH_FENCE_TIMEOUT_NS), size_hint };
        let owner = FenceOwner::Bench(b.id);
        let mode = b.fence_movement;
        if let Some(hb) = self.hnp.as_mut().and_then(|h| h.bench.as_mut()) {
            hb.started_at = Some(now);
        }
        self.start_fence(owner, req, mode);
    }

    pub(crate) fn on_bench_fence_done(&mut self, bench: u64, id: FenceId, result: Result<Bytes, FenceError>) {
        let now = self.now;
        if let Some(hb) = self.hnp.as_mut().and_then(|h| h.bench.as_mut()) {
            if let Some(t0) = hb.started_at.take() {
                hb.latencies.push(now.saturating_sub(t0));
            }
        }
        let me = self.me;
        let lost_text = match &result {
            Err(FenceError::LostConnection { lost }) => Some(format!("lost {}", self.describe(lost))),
            _ => None,
        };
        let Some(b) = self.bench.as_mut().filter(|b| b.id == bench) else {
            debug!(seq = id.seq, "benchmark fence completed after its benchmark ended");
            return;
        };
        let i = b.next - 1;
        if result.is_err() {
            b.failed += 1;
        }
        let err = match result {
            Err(e) => Some(format!(
                "daemon {me}: fence {i} of {} failed: {}",
                b.count,
                lost_text.unwrap_or_else(|| e.to_string())
            )),
            Ok(bytes) => {
                let expect: Vec<u8> = if bench_collect(b.kind, i) {
                    let ps = b.participants.clone();
                    ps.iter().flat_map(|&r| b.data(r, i)).collect()
                } else {
                    Vec::new()
                };
                (bytes[..] != expect[..]).then(|| {
                    format!(
                        "daemon {me}: fence {i} returned {} bytes that differ from the {} expected",
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

    pub(crate) fn on_bench_done(&mut self, d: BenchDone) {
        let Some(b) = self.hnp.as_mut().and_then(|h| h.bench.as_mut()) else { return };
        if d.bench != b.id {
            return;
        }
        if d.errors > 0 && b.errors == 0 {
            b.first_error = d.first_error;
        }
        b.errors += d.errors;
        b.failed += d.failed;
        b.done.insert(d.rank);
        self.check_bench_done();
    }

    /// HNP: a fence benchmark ends once every live daemon reported.
    pub(crate) fn check_bench_done(&mut self) {
        let topo = self.g.topology();
        let live: Vec<Rank> = topo.live_ranks().collect();
        let Some(b) = self.hnp.as_ref().and_then(|h| h.bench.as_ref()) else { return };
        if let Some(peer) = b.ping_peer.filter(|&p| b.kind == BenchKind::Ping && !topo.is_alive(p)) {
            let text = format!("the ping benchmark lost its peer, {}", self.describe(&[peer]));
            if let Some(h) = self.hnp.as_mut() {
                h.bench = None;
            }
            self.out.push(Effect::BenchDone(Err(text)));
            return;
        }
        if matches!(b.kind, BenchKind::Xcast | BenchKind::Ping) {
            return;
        }
        if live.iter().all(|r| b.done.contains(r)) {
            self.finish_bench();
        }
    }

    pub(crate) fn on_bench_xcast_done(&mut self, bench: u64) {
        let now = self.now;
        let Some(b) = self.hnp.as_mut().and_then(|h| h.bench.as_mut()) else { return };
        if b.kind != BenchKind::Xcast || b.id != bench {
            return;
        }
        if let Some(t0) = b.started_at.take() {
            b.latencies.push(now.saturating_sub(t0));
        }
        self.next_bench_xcast();
    }

    fn next_bench_xcast(&mut self) {
        let now = self.now;
        let Some(b) = self.hnp.as_mut().and_then(|h| h.bench.as_mut()) else { return };
        if b.issued == b.count {
            self.finish_bench();
            return;
        }
        b.issued += 1;
        let payload = bench_xcast_payload(b.id, b.issued, b.bytes);
        b.started_at = Some(now);
        let bench = b.id;
        let mode = b.bcast_movement.unwrap_or(self.g.config().bcast_movement);
        let id = self.g.xcast_with(dtags::BENCH_XCAST, payload, mode);
        self.xcast_owners.insert(id, XcastOwner::BenchXcast(bench));
    }

    /// Every daemon: an xcast benchmark op arrived; check it byte for byte and report a
    /// difference to the HNP (straight, before this daemon's ACK can complete the op).
    pub(crate) fn on_bench_xcast(&mut self, payload: Bytes) {
        if payload.len() < 16 {
            return;
        }
        let i = u64::from_le_bytes(payload[..8].try_into().unwrap_or_default());
        let bench = u64::from_le_bytes(payload[8..16].try_into().unwrap_or_default());
        if payload == bench_xcast_payload(bench, i, payload.len() as u64) {
            return;
        }
        let me = self.me;
        let first_error = format!("daemon {me}: xcast {i} of benchmark {bench} ({} bytes) differs", payload.len());
        error!("{first_error}");
        self.report_to_hnp(daemon_cmd::Body::BenchDone(BenchDone {
            bench,
            rank: me,
            completed: 0,
            errors: 1,
            first_error,
            failed: 0,
        }));
    }

    pub(crate) fn on_pong(&mut self) {
        let now = self.now;
        let Some(b) = self.hnp.as_mut().and_then(|h| h.bench.as_mut()) else { return };
        if b.kind != BenchKind::Ping {
            return;
        }
        if let Some(t0) = b.started_at.take() {
            b.latencies.push(now.saturating_sub(t0));
        }
        self.next_bench_ping();
    }

    fn next_bench_ping(&mut self) {
        let now = self.now;
        let topo = self.g.topology();
        let Some(peer) = (1..topo.size()).find(|&r| topo.is_alive(r)) else {
            if let Some(h) = self.hnp.as_mut() {
                h.bench = None;
            }
            self.out.push(Effect::BenchDone(Err("a ping benchmark needs a second live daemon".into())));
            return;
        };
        let Some(b) = self.hnp.as_mut().and_then(|h| h.bench.as_mut()) else { return };
        if b.issued == b.count {
            self.finish_bench();
            return;
        }
        b.issued += 1;
        b.ping_peer = Some(peer);
        let seq = b.issued;
        let payload = Bytes::from(vec![0u8; b.bytes as usize]);
        b.started_at = Some(now);
        self.send_cmd(peer, daemon_cmd::Body::Ping(Ping { seq, payload }));
    }

    fn finish_bench(&mut self) {
        let topo = self.g.topology();
        let (daemons, radix, depth) = (topo.live_count(), topo.radix(), topo.height());
        let Some(b) = self.hnp.as_mut().and_then(|h| h.bench.take()) else { return };
        let gone: Vec<Rank> = b.live_at_start.iter().copied().filter(|&r| !topo.is_alive(r)).collect();
        let reply = BenchReply {
            latencies_ns: b.latencies,
            errors: b.errors,
            first_error: b.first_error,
            daemons,
            radix,
            depth,
            failed: b.failed,
            lost: self.describe(&gone),
        };
        if b.internal {
            self.on_calibration_run(Ok(reply));
        } else {
            self.out.push(Effect::BenchDone(Ok(reply)));
        }
    }
}
