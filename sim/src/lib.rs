//! dvm-sim: a deterministic discrete-event simulator that runs, in one process, either N
//! instances of the real `grpcomm::Grpcomm` state machines over `rml::topology` ([`engine`]),
//! or N daemon cores (`dvm_core::Core`: routing, check-in and WIREUP, epochs, loss reports and
//! DAEMON_DIED, eviction, fence and xcast owners, benchmarks) booted and driven through jobs
//! and faults — kills, freezes, link cuts, HNP loss ([`daemons`], `--engine core`).
//!
//! Owns: virtual time (u64 ns) and the one event queue both engines run on; the carrier model
//! (α + bytes·β per hop, the sender's egress and the receiver's ingress serialized, a
//! per-message receive CPU cost, seeded jitter that keeps every link FIFO); hop-by-hop routing
//! with each hop's own `Topology::route_to`; crashes, detection delay and repairs staggered per
//! daemon (same failed sets, same order everywhere); generated schedules, invariant checks
//! against independent oracles, replay of a failing seed, and the α-β projections.
//!
//! Never: a socket, a thread per daemon, a wall clock or a `HashMap` whose order could steer a
//! run; never a protocol decision of its own (it only carries effects out, and acknowledges
//! process-first deliveries right after recording them); the grpcomm engine never crashes
//! rank 0 (the HNP) — the core engine does, and then every daemon must exit.
//!
//! Invariants: `(scenario, seed)` fixes the whole trace; a failing schedule prints the
//! one-line `replay` command that reruns it exactly. Traps: a daemon's `state_bytes()` is
//! sampled after each input, not continuously; peer_unreachable is fed only while the sender
//! still believes the peer alive.

pub mod check;
pub mod crossover;
pub mod daemons;
pub mod engine;
pub mod net;
pub mod project;
mod queue;
pub mod scenario;
pub mod trace;

use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

pub use dvm_grpcomm::{BcastMovementMode, FenceMovementMode};

/// The movements every daemon of a run is configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Movements {
    pub fence: FenceMovementMode,
    pub bcast: BcastMovementMode,
}

impl Movements {
    pub fn new(fence: FenceMovementMode, bcast: BcastMovementMode) -> Self {
        Movements { fence, bcast }
    }

    /// Configure `cfg` with these movements. The simulator's own broadcast tags (USER and
    /// up, as its schedules use them) become bulk-capable, like LAUNCH.
    pub fn apply(self, cfg: &mut dvm_grpcomm::Config) {
        cfg.fence_movement = self.fence;
        cfg.bcast_movement = self.bcast;
        cfg.bulk_tags.extend(dvm_grpcomm::tags::USER..dvm_grpcomm::tags::USER + 64);
    }

    /// The replay flags that select these movements (empty for the defaults of `replay`).
    pub fn flags(self) -> String {
        let mut f = String::new();
        if self.fence != FenceMovementMode::Tree {
            f += &format!(" --fence-movement {}", self.fence);
        }
        if self.bcast != BcastMovementMode::Tree {
            f += &format!(" --bcast-movement {}", self.bcast);
        }
        f
    }
}

impl From<FenceMovementMode> for Movements {
    /// Fences as `fence` says, broadcasts on the tree.
    fn from(fence: FenceMovementMode) -> Self {
        Movements { fence, bcast: BcastMovementMode::Tree }
    }
}

impl std::fmt::Display for Movements {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fence {}, bcast {}", self.fence, self.bcast)
    }
}
pub use net::NetModel;
pub use scenario::{Profile, Scenario};
pub use trace::Trace;

/// The result of one run.
#[derive(Debug)]
pub struct Outcome {
    /// Absent when grpcomm (or the engine) panicked.
    pub trace: Option<Trace>,
    pub violations: Vec<String>,
}

thread_local! {
    static QUIET: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Panics inside a guarded run are captured into the violation list instead of printed.
fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let captured = QUIET.with(|q| {
                let mut q = q.borrow_mut();
                match q.as_mut() {
                    Some(slot) => {
                        *slot = info.to_string();
                        true
                    }
                    None => false,
                }
            });
            if !captured {
                default(info);
            }
        }));
    });
}

/// Run `f`, capturing a panic (and its message) instead of printing it.
pub(crate) fn guarded<T>(f: impl FnOnce() -> T) -> (Option<T>, String) {
    install_quiet_hook();
    QUIET.with(|q| *q.borrow_mut() = Some(String::new()));
    let res = panic::catch_unwind(AssertUnwindSafe(f));
    let msg = QUIET.with(|q| q.borrow_mut().take()).unwrap_or_default();
    (res.ok(), msg)
}

/// Run one scenario and check every invariant. A panic is reported as a violation.
pub fn run(sc: &Scenario) -> Outcome {
    match guarded(|| engine::Engine::new(sc).run()) {
        (Some(trace), _) => {
            let violations = check::check(sc, &trace);
            Outcome { trace: Some(trace), violations }
        }
        (None, msg) => Outcome { trace: None, violations: vec![format!("panic: {msg}")] },
    }
}

/// The command that reruns one generated schedule and prints its violations.
pub fn replay_command(seed: u64, n: u32, radix: u32, profile: Profile) -> String {
    format!("cargo run -p dvm-sim --release -- replay --seed {seed} --n {n} --radix {radix} --profile {profile}")
}

/// A profile of generated schedules: it knows the command that replays one of them.
pub trait ReplayProfile: Copy + std::fmt::Display {
    fn replay_command(self, seed: u64, n: u32, radix: u32) -> String;
}

impl ReplayProfile for Profile {
    fn replay_command(self, seed: u64, n: u32, radix: u32) -> String {
        replay_command(seed, n, radix, self)
    }
}

/// A generated schedule that violated an invariant (of either engine: `P` is its profile).
#[derive(Debug)]
pub struct Failure<P = Profile> {
    pub seed: u64,
    pub n: u32,
    pub radix: u32,
    pub profile: P,
    /// The movements every daemon of the run was configured with.
    pub movements: Movements,
    pub violations: Vec<String>,
}

impl<P: ReplayProfile> Failure<P> {
    /// The one-line command that reruns this schedule.
    pub fn replay(&self) -> String {
        let cmd = self.profile.replay_command(self.seed, self.n, self.radix);
        format!("{cmd}{}", self.movements.flags())
    }
}

/// Summary of a campaign.
#[derive(Debug, Default)]
pub struct CampaignReport {
    pub runs: u64,
    pub crashes: u64,
    pub xcasts: u64,
    pub fences: u64,
    pub failures: Vec<Failure>,
}

/// Run the generated schedules `seeds` at `(n, radix, profile)` with the default movements.
pub fn campaign(seeds: std::ops::Range<u64>, n: u32, radix: u32, profile: Profile) -> CampaignReport {
    campaign_with(seeds, n, radix, profile, FenceMovementMode::default())
}

/// Run the generated schedules `seeds` at `(n, radix, profile)`, every daemon configured with
/// the movements `mode` (a fence movement alone keeps broadcasts on the tree).
pub fn campaign_with(
    seeds: std::ops::Range<u64>,
    n: u32,
    radix: u32,
    profile: Profile,
    mode: impl Into<Movements>,
) -> CampaignReport {
    let mode = mode.into();
    let mut rep = CampaignReport::default();
    for seed in seeds {
        let mut sc = Scenario::generate(seed, n, radix, profile);
        mode.apply(&mut sc.cfg);
        let out = run(&sc);
        rep.runs += 1;
        if let Some(t) = &out.trace {
            rep.crashes += t.crashes.len() as u64;
            rep.xcasts += t.xcast_starts.len() as u64;
            rep.fences += t.fence_calls.len() as u64;
        }
        if !out.violations.is_empty() {
            rep.failures.push(Failure { seed, n, radix, profile, movements: mode, violations: out.violations });
        }
    }
    rep
}
