//! Projections: one collective at a time on a fault-free DVM of N daemons, measured in
//! virtual time and compared with the α-β model of the movement that carried it.
//! Tree (`d` depth, `r` radix): broadcast `d·α + d·r·M·β`, gather and release
//! `2·d·α + (1 + d·r)·D·β` with `D` the gathered total, barrier the same with `D = 0`.
//! Lateral allgather (recursive doubling, or Bruck for other counts) of `D` bytes per daemon:
//! `⌈log₂N⌉·α + (N−1)·D·β`; a barrier on it is `⌈log₂N⌉·α`.
//! Scatter-allgather broadcast of `M` bytes: chunks down the tree (`d·α + M·β` at the root's
//! egress), then the allgather of one `M/(N−1)` chunk per daemon other than the root:
//! `(d + ⌈log₂N⌉)·α + 2·M·β`.

use bytes::Bytes;
use dvm_grpcomm::{tags, FenceMovementMode, FenceShape, FenceSignature, LinkModel, Movement, Participants, Rank};

use crate::net::NetModel;
use crate::scenario::{FenceChain, FenceStep, Scenario, XcastPlan};
use crate::Movements;

/// A collective to project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Rank 0 broadcasts this many bytes.
    Xcast(usize),
    /// Every daemon joins a barrier.
    Barrier,
    /// Every daemon contributes this many bytes to a modex.
    Modex(usize),
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Xcast(_) => "xcast",
            Op::Barrier => "barrier",
            Op::Modex(_) => "modex",
        }
    }
    pub fn bytes(self) -> usize {
        match self {
            Op::Xcast(b) | Op::Modex(b) => b,
            Op::Barrier => 0,
        }
    }
}

/// One row of the projection table.
#[derive(Debug, Clone)]
pub struct Row {
    pub op: Op,
    pub n: u32,
    pub radix: u32,
    /// The movement that carried it.
    pub movement: Movement,
    pub depth: u32,
    /// Last daemon holds the broadcast / last participant's fence completed.
    pub sim_ns: u64,
    pub model_ns: f64,
    pub messages: u64,
    pub peak_state_bytes: usize,
    /// The origin's XcastComplete (ACK rollup included); equals `sim_ns` for fences.
    pub complete_ns: u64,
    pub violations: Vec<String>,
}

impl Row {
    pub fn ratio(&self) -> f64 {
        self.sim_ns as f64 / self.model_ns
    }
    pub const CSV_HEADER: &'static str =
        "op,n,radix,bytes,sim_time_us,model_time_us,ratio,messages,peak_state_bytes,depth,complete_us,movement";
    pub fn csv(&self) -> String {
        format!(
            "{},{},{},{},{:.1},{:.1},{:.3},{},{},{},{:.1},{}",
            self.op.name(),
            self.n,
            self.radix,
            self.op.bytes(),
            self.sim_ns as f64 / 1e3,
            self.model_ns / 1e3,
            self.ratio(),
            self.messages,
            self.peak_state_bytes,
            self.depth,
            self.complete_ns as f64 / 1e3,
            self.movement.name()
        )
    }
}

/// The α-β model of `op` on `movement`, in nanoseconds.
pub fn model_ns(op: Op, movement: Movement, n: u32, radix: u32, depth: u32, net: &NetModel) -> f64 {
    let (d, r) = (depth as f64, radix as f64);
    let a = net.alpha_ns as f64;
    let beta = net.beta_ps_per_byte as f64 / 1e3;
    let steps = if n <= 1 { 0.0 } else { f64::from(32 - (n - 1).leading_zeros()) };
    if movement == Movement::Allgather {
        return steps * a + f64::from(n.saturating_sub(1)) * op.bytes() as f64 * beta;
    }
    if movement == Movement::ScatterAllgather {
        return (d + steps) * a + 2.0 * op.bytes() as f64 * beta;
    }
    match op {
        Op::Xcast(m) => d * a + d * r * m as f64 * beta,
        Op::Barrier => 2.0 * d * a,
        Op::Modex(per_rank) => 2.0 * d * a + (1.0 + d * r) * (per_rank as f64 * n as f64) * beta,
    }
}

/// Simulate `op` once on `n` daemons at `radix` with the default movements.
/// The chunked, pipelined tree broadcast, as a model only (it is not built): the payload cut
/// into `k` segments, each relayed down as soon as it has arrived, so the last daemon holds
/// the last segment after `(d + k − 1)·(α + f·(M/k)·β)`, where `f = min(r, N−1)` is the
/// busiest daemon's fan-out. Returns the best `k` (1 is the whole-payload tree) and its time.
pub fn pipelined_tree_model(m: usize, n: u32, radix: u32, depth: u32, net: &NetModel) -> (u32, f64) {
    let (d, a) = (f64::from(depth.max(1)), net.alpha_ns as f64);
    let f = f64::from(radix.min(n.saturating_sub(1)).max(1));
    let beta = net.beta_ps_per_byte as f64 / 1e3;
    let time = |k: u32| (d + f64::from(k) - 1.0) * (a + f * (m as f64 / f64::from(k)) * beta);
    let most = u32::try_from(m.clamp(1, 65_536)).unwrap_or(65_536);
    (1..=most).map(|k| (k, time(k))).min_by(|x, y| x.1.total_cmp(&y.1)).unwrap_or((1, time(1)))
}

pub fn project(op: Op, n: u32, radix: u32, net: &NetModel) -> Row {
    project_with(op, n, radix, net, FenceMovementMode::default())
}

/// The broadcast choice's link model, from the simulated network's own α and β.
pub fn link_model(net: &NetModel) -> LinkModel {
    LinkModel { alpha_ns: net.alpha_ns as f64, beta_ns_per_byte: net.beta_ps_per_byte as f64 / 1e3 }
}

/// Simulate `op` once on `n` daemons at `radix`, moved as `mode` chooses (a fence movement
/// alone keeps broadcasts on the tree).
pub fn project_with(op: Op, n: u32, radix: u32, net: &NetModel, mode: impl Into<Movements>) -> Row {
    let mode = mode.into();
    let mut sc = Scenario::empty(n, radix, 1, net.clone());
    mode.apply(&mut sc.cfg);
    sc.cfg.link = link_model(net);
    let movement = match op {
        Op::Xcast(m) => mode.bcast.for_bcast(true, m as u64, n, radix, sc.height(), &sc.cfg.link),
        Op::Barrier | Op::Modex(_) => {
            let collect = matches!(op, Op::Modex(_));
            let shape = FenceShape {
                participants: u64::from(n),
                depth: sc.height(),
                radix,
                bytes: op.bytes() as u64 * u64::from(n),
            };
            mode.fence.for_fence(collect, &shape, &sc.cfg.fence_costs())
        }
    };
    // Compression would make the payload size depend on its content; the model counts bytes.
    sc.cfg.compress_threshold = usize::MAX;
    let depth = sc.height();
    match op {
        Op::Xcast(m) => {
            let payload: Vec<u8> = (0..m).map(|i| (i * 131 % 251) as u8).collect();
            sc.xcasts.push(XcastPlan { at: 0, origin: 0, tag: tags::USER, payload: Bytes::from(payload) });
        }
        Op::Barrier | Op::Modex(_) => {
            let collect = matches!(op, Op::Modex(_));
            sc.chains.push(FenceChain {
                sig: FenceSignature::new(Bytes::from_static(b"proj:*"), Participants::All),
                members: (0..n).collect(),
                steps: vec![FenceStep { collect, timeout: None }],
                first_start: vec![0; n as usize],
                contrib_len: Some(op.bytes()),
            });
        }
    }
    let out = crate::run(&sc);
    let (mut sim_ns, mut complete_ns, mut messages, mut peak) = (0, 0, 0, 0);
    if let Some(t) = &out.trace {
        messages = t.stats.messages;
        peak = t.stats.peak_state_bytes;
        match op {
            Op::Xcast(_) => {
                sim_ns = t.deliveries.iter().filter_map(|d| d.last().map(|x| x.at)).max().unwrap_or(0);
                complete_ns = t.xcast_completes.iter().map(|c| c.3).max().unwrap_or(0);
            }
            Op::Barrier | Op::Modex(_) => {
                sim_ns = t.fence_calls.iter().filter_map(|c| c.done.as_ref().map(|d| d.0)).max().unwrap_or(0);
                complete_ns = sim_ns;
            }
        }
    }
    Row {
        op,
        n,
        radix,
        movement,
        depth,
        sim_ns,
        model_ns: model_ns(op, movement, n, radix, depth, net),
        messages,
        peak_state_bytes: peak,
        complete_ns,
        violations: out.violations,
    }
}

/// Depth of the failure-free tree.
pub fn depth(n: u32, radix: u32) -> u32 {
    dvm_grpcomm::Topology::new(0 as Rank, radix, n).expect("valid geometry").height()
}
