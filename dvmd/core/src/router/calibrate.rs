//! The HNP's measurement of what each fence movement costs on this DVM, for `auto`'s fence
//! choice: after the link probe and before the DVM is ready, a few fences over every daemon on
//! each movement — a barrier, and collecting fences of [`SMALL_TOTAL`] and [`LARGE_TOTAL`]
//! bytes in all — timed at the HNP (the median of [`ROUNDS`] after a first one that also
//! opens the lateral links). Fitting the two models to those times gives α, and β below and
//! above the small size, per movement ([`FenceCosts::fit`]); the HNP broadcasts them with the
//! link model (`dtags::LINK_MODEL`), so every daemon prices every fence with the same values.
//!
//! Why not the probe's α and β alone: a ping to one child measures a link at rest. A fence
//! step on a DVM whose daemons share cores, or whose links are shaped, costs several times
//! that, and not the same for both movements, nor the same per byte for small and large
//! transfers (measured on 16 rate-limited netns nodes: a tree hop 0.3–0.5 ms, an allgather
//! round 0.5 ms, against a 0.1 ms ping; β 5–8 ns/B through the tree's busiest daemon, 45–75
//! ns/B per byte taken in on the allgather). docs/movements.md.
//!
//! Owns: the four calibration runs (each an ordinary benchmark, so checked byte for byte) and
//! the fit. Never: holds the DVM back for good — a failed run (a daemon lost) ends the
//! calibration with the probe's model for both movements.

use dvm_grpcomm::{FenceCosts, FenceMovementMode, FenceShape, LinkModel};
use dvm_proto::control::{BenchKind, BenchReply};
use tracing::{info, warn};

use crate::Core;

/// Fences per calibration run after the first (the median of their times at the HNP is
/// taken; the first also opens connections and is left out).
const ROUNDS: u64 = 3;

/// Bytes the small and the large sized runs' fences release in all (spread over the daemons).
const SMALL_TOTAL: u64 = 64 * 1024;
const LARGE_TOTAL: u64 = 512 * 1024;

/// Smallest per-daemon contribution of the sized run.
const MIN_SIZED: u64 = 64;

/// Per-byte costs at or below this are noise.
const MIN_BETA_NS_PER_BYTE: f64 = 0.001;

/// The runs, in order: (kind, movement, total bytes released).
const RUNS: [(BenchKind, FenceMovementMode, u64); 6] = [
    (BenchKind::Barrier, FenceMovementMode::Tree, 0),
    (BenchKind::Barrier, FenceMovementMode::Allgather, 0),
    (BenchKind::Modex, FenceMovementMode::Tree, SMALL_TOTAL),
    (BenchKind::Modex, FenceMovementMode::Allgather, SMALL_TOTAL),
    (BenchKind::Modex, FenceMovementMode::Tree, LARGE_TOTAL),
    (BenchKind::Modex, FenceMovementMode::Allgather, LARGE_TOTAL),
];

/// A calibration in progress at the HNP.
#[derive(Debug)]
pub(crate) struct Calibration {
    link: LinkModel,
    /// Daemons taking part.
    live: u64,
    /// Median fence time (ns) of each run done so far.
    times: Vec<f64>,
}

/// Per-daemon contribution of a run releasing about `total` bytes over `live` daemons.
fn per_daemon(total: u64, live: u64) -> u64 {
    (total / live.max(1)).max(MIN_SIZED)
}

impl Core {
    /// HNP: the link probe measured `link`; measure the fence movements next (with at least
    /// two daemons), then broadcast both.
    pub(crate) fn start_calibration(&mut self, link: LinkModel) {
        let live = u64::from(self.g.topology().live_count());
        if live < 2 {
            return self.broadcast_link_model(link, None);
        }
        if let Some(h) = self.hnp.as_mut() {
            h.calibration = Some(Calibration { link, live, times: Vec::new() });
        }
        self.next_calibration_run();
    }

    fn next_calibration_run(&mut self) {
        let Some(c) = self.hnp.as_ref().and_then(|h| h.calibration.as_ref()) else { return };
        let Some(&(kind, mode, total)) = RUNS.get(c.times.len()) else { return };
        let bytes = if total > 0 { per_daemon(total, c.live) } else { 0 };
        self.start_internal_bench(kind, ROUNDS + 1, bytes, mode);
    }

    /// HNP: a calibration run ended.
    pub(crate) fn on_calibration_run(&mut self, result: Result<BenchReply, String>) {
        let topo = self.g.topology();
        let (live, radix, depth) = (u64::from(topo.live_count()), topo.radix(), topo.height());
        let Some(mut c) = self.hnp.as_mut().and_then(|h| h.calibration.take()) else { return };
        let median = match &result {
            Ok(r) if r.errors == 0 && r.latencies_ns.len() > 1 => {
                let mut v = r.latencies_ns[1..].to_vec();
                v.sort_unstable();
                v[v.len() / 2] as f64
            }
            Ok(r) => {
                warn!(errors = r.errors, first = %r.first_error, "fence calibration failed: fences priced by the link probe alone");
                return self.broadcast_link_model(c.link, None);
            }
            Err(e) => {
                warn!(error = %e, "fence calibration failed: fences priced by the link probe alone");
                return self.broadcast_link_model(c.link, None);
            }
        };
        c.times.push(median);
        if c.times.len() < RUNS.len() {
            if let Some(h) = self.hnp.as_mut() {
                h.calibration = Some(c);
            }
            return self.next_calibration_run();
        }
        let shape = |total: u64| FenceShape { participants: live, depth, radix, bytes: per_daemon(total, live) * live };
        let t = &c.times;
        let costs = FenceCosts::fit(
            &shape(SMALL_TOTAL),
            &shape(LARGE_TOTAL),
            (t[0], t[2], t[4]),
            (t[1], t[3], t[5]),
            MIN_BETA_NS_PER_BYTE,
        );
        info!(
            daemons = live,
            tree_alpha_us = costs.tree.alpha_ns / 1e3,
            tree_beta_ns_per_byte = costs.tree.beta_ns_per_byte,
            tree_beta_above = costs.tree_beta_above,
            allgather_alpha_us = costs.allgather.alpha_ns / 1e3,
            allgather_beta_ns_per_byte = costs.allgather.beta_ns_per_byte,
            allgather_beta_above = costs.allgather_beta_above,
            knee_bytes = costs.knee_bytes,
            times_us = ?t.iter().map(|t| (t / 1e3).round()).collect::<Vec<_>>(),
            "fence costs measured (barrier, {SMALL_TOTAL} and {LARGE_TOTAL} bytes, tree then allgather; median of {ROUNDS} fences each); broadcast to every daemon"
        );
        self.broadcast_link_model(c.link, Some(costs));
    }

    /// A calibration in progress ends (a daemon was lost, or it could not start): the probe's
    /// model stands for both movements.
    pub(crate) fn abandon_calibration(&mut self, why: &str) {
        let Some(c) = self.hnp.as_mut().and_then(|h| h.calibration.take()) else { return };
        warn!("fence calibration ended early ({why}): fences priced by the link probe alone");
        self.broadcast_link_model(c.link, None);
    }

    /// HNP: every daemon gets the link model (and the fence costs); `Ready` follows once all
    /// hold them.
    pub(crate) fn broadcast_link_model(&mut self, link: LinkModel, costs: Option<FenceCosts>) {
        let id = self.g.xcast(crate::dtags::LINK_MODEL, crate::probe::encode_link(&link, costs.as_ref()));
        self.xcast_owners.insert(id, crate::XcastOwner::Core);
        if let Some(h) = self.hnp.as_mut() {
            h.link_xcast = Some(id);
        }
    }
}
