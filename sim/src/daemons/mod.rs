//! The daemon-core engine: N `dvm_core::Core`s — the daemon's own decisions, not bare
//! grpcomm — booted (check-in, WIREUP, Ready) and driven through jobs, benchmarks, xcasts
//! and faults: kills (with or without closed sockets, or in the middle of a step's effects),
//! freezes that outlast the heartbeat bound (or not), link cuts (some lossy), and the loss
//! of the HNP.
//!
//! Owns: the shell's part for each simulated daemon (carry effects out in order, feed
//! frames, losses, ticks and workload inputs), the loss model (see [`engine`]), the schedule
//! generator ([`scenario`]) and the invariants ([`check`]).
//!
//! Never: a decision of the daemon's (who is lost, what a frame means, when a fence ends): the
//! engine only reports what the carrier would (a closed socket, a silent neighbour, a refused
//! send) and records what the cores do.

pub mod check;
pub mod engine;
pub mod scenario;
pub mod stage;
pub mod trace;

use dvm_grpcomm::FenceMovementMode;
pub use scenario::{CoreProfile, CoreScenario};
pub use trace::CoreTrace;

/// The result of one run.
#[derive(Debug)]
pub struct CoreOutcome {
    /// Absent when a core (or the engine) panicked.
    pub trace: Option<CoreTrace>,
    pub violations: Vec<String>,
}

/// Run one scenario and check every invariant. A panic is reported as a violation.
pub fn run(sc: &CoreScenario) -> CoreOutcome {
    let (res, msg) = crate::guarded(|| engine::CoreEngine::new(sc).run());
    match res {
        Some(trace) => {
            let violations = check::check(sc, &trace);
            CoreOutcome { trace: Some(trace), violations }
        }
        None => CoreOutcome { trace: None, violations: vec![format!("panic: {msg}")] },
    }
}

/// The command that reruns one generated core schedule and prints its violations.
pub fn replay_command(seed: u64, n: u32, radix: u32, profile: CoreProfile) -> String {
    format!("cargo run -p dvm-sim --release -- replay --engine core --seed {seed} --n {n} --radix {radix} --profile {profile}")
}

impl crate::ReplayProfile for CoreProfile {
    fn replay_command(self, seed: u64, n: u32, radix: u32) -> String {
        replay_command(seed, n, radix, self)
    }
}

/// A generated core schedule that violated an invariant.
pub type CoreFailure = crate::Failure<CoreProfile>;

/// Summary of a campaign.
#[derive(Debug, Default)]
pub struct CoreCampaignReport {
    pub runs: u64,
    /// Faults by kind: kill, kill in a step, freeze, cut, HNP loss.
    pub kills: u64,
    pub step_kills: u64,
    pub stops: u64,
    pub cuts: u64,
    pub hnp_losses: u64,
    pub fences: u64,
    pub benches: u64,
    pub xcasts: u64,
    /// Jobs pruns submitted, and how many of them failed (a rank, a daemon, a timeout).
    pub jobs: u64,
    pub failed_jobs: u64,
    /// PMIx upcalls the simulated MPI ranks' servers made (fences, direct modex, spawns).
    pub pmix_upcalls: u64,
    /// Simulated ranks that spoke PMI, their requests, and the barriers they passed.
    pub pmi_ranks: u64,
    pub pmi_requests: u64,
    pub pmi_barriers: u64,
    /// Daemons evicted, and frames from declared-dead daemons that survivors dropped.
    pub evictions: u64,
    pub dead_frames: u64,
    pub failures: Vec<CoreFailure>,
}

impl CoreCampaignReport {
    pub fn merge(&mut self, o: CoreCampaignReport) {
        self.runs += o.runs;
        self.kills += o.kills;
        self.step_kills += o.step_kills;
        self.stops += o.stops;
        self.cuts += o.cuts;
        self.hnp_losses += o.hnp_losses;
        self.fences += o.fences;
        self.benches += o.benches;
        self.xcasts += o.xcasts;
        self.jobs += o.jobs;
        self.failed_jobs += o.failed_jobs;
        self.pmix_upcalls += o.pmix_upcalls;
        self.pmi_ranks += o.pmi_ranks;
        self.pmi_requests += o.pmi_requests;
        self.pmi_barriers += o.pmi_barriers;
        self.evictions += o.evictions;
        self.dead_frames += o.dead_frames;
        self.failures.extend(o.failures);
    }
}

/// Run the generated core schedules `seeds` at `(n, radix, profile)` with the default movements.
pub fn campaign(seeds: std::ops::Range<u64>, n: u32, radix: u32, profile: CoreProfile) -> CoreCampaignReport {
    campaign_with(seeds, n, radix, profile, FenceMovementMode::default())
}

/// Run the generated core schedules `seeds` at `(n, radix, profile)`, every daemon configured
/// with fence movement `mode`.
pub fn campaign_with(
    seeds: std::ops::Range<u64>,
    n: u32,
    radix: u32,
    profile: CoreProfile,
    mode: impl Into<crate::Movements>,
) -> CoreCampaignReport {
    use scenario::FaultKind;
    let mode = mode.into();
    let mut rep = CoreCampaignReport::default();
    for seed in seeds {
        let mut sc = CoreScenario::generate(seed, n, radix, profile);
        mode.apply(&mut sc.cfg);
        let out = run(&sc);
        rep.runs += 1;
        for f in &sc.faults {
            match f.kind {
                FaultKind::Kill { rank: 0, .. } => rep.hnp_losses += 1,
                FaultKind::Kill { .. } => rep.kills += 1,
                FaultKind::KillAtStep { .. } => rep.step_kills += 1,
                FaultKind::Stop { .. } => rep.stops += 1,
                FaultKind::Cut { .. } => rep.cuts += 1,
            }
        }
        if let Some(t) = &out.trace {
            rep.fences += t.fence_calls.len() as u64;
            rep.benches += t.bench_starts.len() as u64;
            rep.xcasts += t.xcast_starts.len() as u64;
            rep.dead_frames += t.stats.dead_frames;
            rep.jobs += t.launched_at.iter().flatten().count() as u64;
            rep.failed_jobs += t.launch_ends.iter().flatten().filter(|e| e.1 != 0).count() as u64;
            rep.pmix_upcalls += t.pmix_upcalls + t.spawns_asked.iter().flatten().count() as u64;
            rep.pmi_ranks += t.pmi_ranks;
            rep.pmi_requests += t.pmi_requests;
            rep.pmi_barriers += t.pmi_barriers;
            rep.evictions +=
                t.ends.iter().filter(|e| matches!(e, trace::End::Exited(_, dvm_core::Exit::Evicted(_)))).count() as u64;
        }
        if !out.violations.is_empty() {
            rep.failures.push(CoreFailure { seed, n, radix, profile, movements: mode, violations: out.violations });
        }
    }
    rep
}
