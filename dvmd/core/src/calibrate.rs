//! The HNP's measurement of what each fence movement costs on this DVM, for `auto`'s fence
//! choice: after the link probe and before the DVM is ready, a few fences over every daemon on
//! each movement, a barrier and a collecting fence of [`SIZED_TOTAL`] bytes in all, timed at
//! the HNP (the median of [`ROUNDS`]). Fitting the two models to those times gives α and β per
//! movement ([`FenceCosts::fit`]); the HNP broadcasts them with the link model
//! (`dtags::LINK_MODEL`), so every daemon prices every fence with the same values.
//!
//! Why not the probe's α and β alone: a ping to one child measures a link at rest. A fence
//! step on a DVM whose daemons share cores, or whose links are shaped, costs several times
//! that, and not the same for both movements (measured on 16 rate-limited netns nodes: a tree
//! hop 0.3–0.5 ms, an allgather round 0.5 ms, against a 0.1 ms ping; β 5–8 ns/B through the
//! tree's busiest daemon, ~45 ns/B per byte taken in on the allgather). docs/movements.md.
//!
//! Owns: the four calibration runs (each an ordinary benchmark, so checked byte for byte) and
//! the fit. Never: holds the DVM back for good — a failed run (a daemon lost) ends the
//! calibration with the probe's model for both movements.

use dvm_grpcomm::{FenceCosts, FenceMovementMode, FenceShape, LinkModel};
use dvm_proto::control::{BenchKind, BenchReply};
use tracing::{info, warn};

use crate::Core;

/// Fences per calibration run (the median of their times at the HNP is taken).
const ROUNDS: u64 = 5;

/// Bytes the sized run's fences release in all (spread over the daemons).
const SIZED_TOTAL: u64 = 256 * 1024;

/// Smallest per-daemon contribution of the sized run.
const MIN_SIZED: u64 = 64;

/// Per-byte costs at or below this are noise.
const MIN_BETA_NS_PER_BYTE: f64 = 0.001;

/// The runs, in order: (kind, movement).
const RUNS: [(BenchKind, FenceMovementMode); 4] = [
    (BenchKind::Barrier, FenceMovementMode::Tree),
    (BenchKind::Barrier, FenceMovementMode::Allgather),
    (BenchKind::Modex, FenceMovementMode::Tree),
    (BenchKind::Modex, FenceMovementMode::Allgather),
];

/// A calibration in progress at the HNP.
#[derive(Debug)]
pub(crate) struct Calibration {
    link: LinkModel,
    /// Per-daemon bytes of the sized runs.
    bytes: u64,
    /// Median fence time (ns) of each run done so far.
    times: Vec<f64>,
}

impl Core {
    /// HNP: the link probe measured `link`; measure the fence movements next (with at least
    /// two daemons), then broadcast both.
    pub(crate) fn start_calibration(&mut self, link: LinkModel) {
        let live = u64::from(self.g.topology().live_count());
        if live < 2 {
            return self.broadcast_link_model(link, None);
        }
        let bytes = (SIZED_TOTAL / live).max(MIN_SIZED);
        if let Some(h) = self.hnp.as_mut() {
            h.calibration = Some(Calibration { link, bytes, times: Vec::new() });
        }
        self.next_calibration_run();
    }

    fn next_calibration_run(&mut self) {
        let Some(c) = self.hnp.as_ref().and_then(|h| h.calibration.as_ref()) else { return };
        let Some(&(kind, mode)) = RUNS.get(c.times.len()) else { return };
        let bytes = if kind == BenchKind::Modex { c.bytes } else { 0 };
        self.start_internal_bench(kind, ROUNDS, bytes, mode);
    }

    /// HNP: a calibration run ended.
    pub(crate) fn on_calibration_run(&mut self, result: Result<BenchReply, String>) {
        let topo = self.g.topology();
        let (live, radix, depth) = (u64::from(topo.live_count()), topo.radix(), topo.height());
        let Some(mut c) = self.hnp.as_mut().and_then(|h| h.calibration.take()) else { return };
        let median = match &result {
            Ok(r) if r.errors == 0 && !r.latencies_ns.is_empty() => {
                let mut v = r.latencies_ns.clone();
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
        let sized = FenceShape { participants: live, depth, radix, bytes: c.bytes * live };
        let t = &c.times;
        let costs = FenceCosts::fit(&sized, (t[0], t[2]), (t[1], t[3]), MIN_BETA_NS_PER_BYTE);
        info!(
            daemons = live,
            tree_alpha_us = costs.tree.alpha_ns / 1e3,
            tree_beta_ns_per_byte = costs.tree.beta_ns_per_byte,
            allgather_alpha_us = costs.allgather.alpha_ns / 1e3,
            allgather_beta_ns_per_byte = costs.allgather.beta_ns_per_byte,
            barrier_tree_us = t[0] / 1e3,
            barrier_allgather_us = t[1] / 1e3,
            sized_tree_us = t[2] / 1e3,
            sized_allgather_us = t[3] / 1e3,
            bytes_per_daemon = c.bytes,
            "fence costs measured (median of {ROUNDS} fences per run); broadcast to every daemon"
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
