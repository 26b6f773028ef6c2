//! Projection of file staging (`pbcast`) at scale: the daemon cores boot, the HNP stages one
//! file to every daemon in segments on the bulk broadcast with its window in flight, and the
//! run reports when the transfer was committed everywhere and the most any daemon held,
//! against the model. The disks count bytes and keep none (what they verify is the cores'
//! tests' business), so N daemons cost the simulator the segments in flight, not N files.

use bytes::Bytes;
use dvm_grpcomm::Topology;

use super::scenario::{CoreScenario, StageRun};
use crate::net::NetModel;

/// A run staging a file larger than this keeps no bytes on its disks (projections).
pub const COUNT_ONLY_ABOVE: usize = 4 << 20;

/// A staged file's fingerprint for the end-of-run checks.
pub fn fingerprint(b: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

/// One projected transfer.
#[derive(Debug, Clone)]
pub struct StageRow {
    pub n: u32,
    pub radix: u32,
    pub depth: u32,
    pub bytes: u64,
    pub segment: u64,
    pub window: usize,
    /// From the request at the HNP to its answer (every daemon committed).
    pub sim_ns: u64,
    pub model_ns: f64,
    /// The most bytes the grpcomm state of any daemon measured held (the HNP, daemon 1, N/2
    /// and N−1), and the HNP's.
    pub peak_state: usize,
    pub peak_state_hnp: usize,
    /// The most bytes any daemon's disk held unnamed.
    pub peak_unnamed: usize,
    pub frames: u64,
    pub wire_bytes: u64,
    pub events: u64,
    /// Violations of the run, or the transfer's failure.
    pub problems: Vec<String>,
}

impl StageRow {
    /// The columns of a row, named as in the CSV header; both formats print these.
    const COLUMNS: [&'static str; 15] = [
        "n",
        "radix",
        "depth",
        "bytes",
        "segment",
        "window",
        "sim_ms",
        "model_ms",
        "ratio",
        "peak_state_mib",
        "peak_state_hnp_mib",
        "window_mib",
        "frames",
        "wire_bytes_per_daemon",
        "events",
    ];

    fn cells(&self) -> [String; 15] {
        [
            self.n.to_string(),
            self.radix.to_string(),
            self.depth.to_string(),
            self.bytes.to_string(),
            self.segment.to_string(),
            self.window.to_string(),
            format!("{:.2}", self.sim_ns as f64 / 1e6),
            format!("{:.2}", self.model_ns / 1e6),
            format!("{:.3}", self.ratio()),
            format!("{:.2}", mib(self.peak_state)),
            format!("{:.2}", mib(self.peak_state_hnp)),
            format!("{:.2}", mib(self.segment as usize * self.window)),
            self.frames.to_string(),
            (self.wire_bytes / u64::from(self.n.max(1))).to_string(),
            self.events.to_string(),
        ]
    }

    pub fn csv_header() -> String {
        Self::COLUMNS.join(",")
    }

    pub fn csv(&self) -> String {
        self.cells().join(",")
    }

    pub fn markdown_header() -> String {
        let rule = vec!["---:"; Self::COLUMNS.len()].join("|");
        format!("| {} |\n|{rule}|", Self::COLUMNS.join(" | "))
    }

    pub fn markdown(&self) -> String {
        format!("| {} |", self.cells().join(" | "))
    }

    pub fn ratio(&self) -> f64 {
        self.sim_ns as f64 / self.model_ns
    }
}

fn mib(b: usize) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// The model of a stream of `bytes` in `segment`s on scatter-allgather, each daemon's inbound
/// link the bottleneck once the pipe is full: the first segment's latency (the scatter down
/// `depth` levels, then ⌈log₂(N−1)⌉ allgather steps, and the segment once at link rate), then
/// the file at link rate: `(depth + ⌈log₂(N−1)⌉)·α + (S + F)·β`.
pub fn stage_model_ns(bytes: u64, segment: u64, n: u32, depth: u32, net: &NetModel) -> f64 {
    let members = n.saturating_sub(1).max(1);
    let steps = f64::from(32 - (members - 1).leading_zeros());
    let beta = net.beta_ps_per_byte as f64 / 1e3;
    (f64::from(depth) + steps) * net.alpha_ns as f64 + (segment.min(bytes) + bytes) as f64 * beta
}

/// Stage one file of `bytes` to every daemon of a fault-free DVM of `n` at `radix` on `net`.
/// `keep` bounds the finished exchanges each daemon keeps for detours (`None`: the daemon's
/// default); it changes nothing on a fault-free run but memory, the simulator's and the
/// daemons'.
pub fn project_stage(
    n: u32,
    radix: u32,
    net: &NetModel,
    bytes: u64,
    segment: u64,
    window: usize,
    keep: Option<usize>,
) -> StageRow {
    let mut sc = CoreScenario::quiet(n, radix, net.clone());
    if let Some(k) = keep {
        sc.cfg.keep_finished_bytes = k;
    }
    let payload: Vec<u8> = (0..bytes).map(|i| (i * 131 % 251) as u8).collect();
    sc.stages.push(StageRun { at: 0, bytes: Bytes::from(payload), segment, window });
    // The HNP, a relay of the first level, and two leaves (at radix ≥ N−1, every daemon but
    // the HNP is a leaf).
    sc.sample_state = vec![0, 1, n / 2, n - 1];
    // Each segment costs every daemon a few frames and their events.
    let segs = bytes.div_ceil(segment.max(1)).max(1);
    sc.max_events = 5_000_000 + segs * u64::from(n) * 64;
    let depth = Topology::new(0, radix, n).expect("valid geometry").height();
    let out = super::run(&sc);
    let mut row = StageRow {
        n,
        radix,
        depth,
        bytes,
        segment,
        window,
        sim_ns: 0,
        model_ns: stage_model_ns(bytes, segment, n, depth, net),
        peak_state: 0,
        peak_state_hnp: 0,
        peak_unnamed: 0,
        frames: 0,
        wire_bytes: 0,
        events: 0,
        problems: out.violations,
    };
    let Some(t) = out.trace else { return row };
    row.peak_state = t.peak_state.iter().copied().max().unwrap_or(0);
    row.peak_state_hnp = t.peak_state.first().copied().unwrap_or(0);
    row.peak_unnamed = t.peak_unnamed.iter().copied().max().unwrap_or(0);
    row.frames = t.stats.frames;
    row.wire_bytes = t.stats.bytes;
    row.events = t.stats.events;
    match (t.stage_starts.first().copied().flatten(), t.stage_dones.first().cloned().flatten()) {
        (Some(t0), Some((t1, rep))) => {
            row.sim_ns = t1 - t0;
            if !rep.ok {
                row.problems.push(format!("the transfer failed: {}", rep.error));
            } else if rep.nodes != n {
                row.problems.push(format!("the transfer reached {} of {n} daemons", rep.nodes));
            }
        }
        _ => row.problems.push("the transfer never ended".into()),
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_reaches_every_daemon_and_no_daemon_holds_it_all() {
        let net = NetModel::projection_default();
        let (file, seg) = (48u64 << 20, 1u64 << 20);
        let row = project_stage(16, 4, &net, file, seg, 3, None);
        assert!(row.problems.is_empty(), "{:?}", row.problems);
        // Every daemon held the whole file (unnamed) before the commit.
        assert_eq!(row.peak_unnamed as u64, file);
        // Its collective state: the window's segments and the finished exchanges it keeps
        // for detours (16 MiB), not the file.
        assert!(
            row.peak_state as u64 <= (16 << 20) + 4 * seg,
            "peak state {} B (HNP {})",
            row.peak_state,
            row.peak_state_hnp
        );
        // Pipelined: well under one segment's scatter then allgather for each segment in turn.
        let serial = (file / seg) as f64 * (2.0 * seg as f64 + 8.0 * 50_000.0);
        assert!((row.sim_ns as f64) < serial, "{} ns against {serial} ns one segment at a time", row.sim_ns);
        assert!(row.ratio() >= 1.0, "faster than the model: {}", row.ratio());
    }
}
