//! What happens in one simulated run: the network model, fence chains, xcasts, scatters and
//! crashes. Everything is derived from `(seed, n, radix, profile)`, so a schedule is
//! reproduced exactly from its one-line replay command.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use dvm_grpcomm::{tags, Config, FenceSignature, Participants, Rank, Topology};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::net::NetModel;

/// One step of a fence chain: the same on every member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceStep {
    /// `PMIX_COLLECT_DATA`: modex when true, barrier when false.
    pub collect: bool,
    pub timeout: Option<u64>,
}

/// Back-to-back fences over one participant set: each member starts step `k + 1` as soon as
/// (plus a think time) step `k` completed on it, as MPI ranks calling fence in a loop do.
#[derive(Debug, Clone)]
pub struct FenceChain {
    pub sig: FenceSignature,
    /// Daemons that call `fence` (every daemon for `Participants::All`).
    pub members: Vec<Rank>,
    pub steps: Vec<FenceStep>,
    /// When each member (same order as `members`) starts step 0.
    pub first_start: Vec<u64>,
    /// Modex contributions of exactly this many bytes (projections); varied when `None`.
    pub contrib_len: Option<usize>,
}

impl FenceChain {
    /// The contribution of `daemon` to step `step` of chain `chain`: distinct per daemon and
    /// step, of varying length (sometimes empty), so a misplaced or duplicated entry shows.
    /// A barrier still carries bytes (a real barrier arrives with 8), which must be ignored.
    pub fn contribution(&self, chain: usize, step: usize, daemon: Rank) -> Bytes {
        if !self.steps[step].collect {
            return Bytes::from_static(b"barrier!");
        }
        if let Some(len) = self.contrib_len {
            return Bytes::from(vec![(daemon % 251) as u8; len]);
        }
        let pad = (daemon as usize * 31 + step * 7 + chain) % 19;
        if pad == 0 {
            return Bytes::new();
        }
        let mut s = format!("<c{chain}s{step}d{daemon}:");
        s.extend(std::iter::repeat_n('x', pad));
        s.push('>');
        Bytes::from(s)
    }
}

/// An xcast of `payload` with `tag` from `origin` at `at` (in the core engine: after ready).
#[derive(Debug, Clone)]
pub struct XcastPlan {
    pub at: u64,
    pub origin: Rank,
    pub tag: u32,
    pub payload: Bytes,
}

#[derive(Debug, Clone)]
pub struct ScatterPlan {
    pub at: u64,
    pub origin: Rank,
    pub tag: u32,
    pub slices: Vec<(Rank, Bytes)>,
}

#[derive(Debug, Clone)]
pub struct CrashPlan {
    pub at: u64,
    pub rank: Rank,
    /// Time from the crash until the failure detector declares it (the repair starts).
    pub detect_after: u64,
}

/// Families of generated schedules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// Xcasts, barrier/modex chains over every daemon and over a subset, scatters, 1..=3
    /// crashes at random points, random jitter and detection delays.
    Crash,
    /// The same mix without crashes.
    Clean,
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Profile::Crash => "crash",
            Profile::Clean => "clean",
        })
    }
}

impl FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "crash" => Ok(Profile::Crash),
            "clean" => Ok(Profile::Clean),
            _ => Err(format!("unknown profile '{s}' (known: crash, clean)")),
        }
    }
}

/// A complete, reproducible schedule.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub n: u32,
    pub radix: u32,
    /// Seeds the run-time randomness (jitter, think times, repair stagger).
    pub seed: u64,
    pub net: NetModel,
    pub cfg: Config,
    pub chains: Vec<FenceChain>,
    pub xcasts: Vec<XcastPlan>,
    pub scatters: Vec<ScatterPlan>,
    pub crashes: Vec<CrashPlan>,
    /// Largest extra delay before one survivor applies a repair.
    pub repair_stagger_ns: u64,
    /// Largest pause between a fence completing and the member starting the next one.
    pub think_ns: u64,
    /// Every operation must be complete by this virtual time (generous, from the model).
    pub bound_ns: u64,
}

impl Scenario {
    /// An empty schedule on `n` daemons (used by the projections and focused tests).
    pub fn empty(n: u32, radix: u32, seed: u64, net: NetModel) -> Self {
        Scenario {
            n,
            radix,
            seed,
            net,
            cfg: Config::default(),
            chains: Vec::new(),
            xcasts: Vec::new(),
            scatters: Vec::new(),
            crashes: Vec::new(),
            repair_stagger_ns: 0,
            think_ns: 0,
            bound_ns: u64::MAX / 4,
        }
    }

    /// Height of the failure-free tree.
    pub fn height(&self) -> u32 {
        Topology::new(0, self.radix, self.n).expect("scenario geometry is valid").height()
    }

    /// The generated schedule for `(seed, n, radix, profile)`.
    pub fn generate(seed: u64, n: u32, radix: u32, profile: Profile) -> Self {
        assert!(n >= 2, "a generated schedule needs at least 2 daemons (n = {n})");
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_0f5c_4ed0_1e00);
        let net = NetModel::generated(&mut rng);
        let alpha = net.alpha_ns;
        let mut sc = Scenario::empty(n, radix, seed, net);
        let h = sc.height() as u64;
        let round = sc.net.round_ns(h, radix as u64);
        sc.think_ns = rng.gen_range(0..=2 * alpha);

        // Chain over every daemon: barrier and modex back to back.
        let steps_all = rng.gen_range(4..=10);
        let steps: Vec<FenceStep> =
            (0..steps_all).map(|_| FenceStep { collect: rng.gen_bool(0.5), timeout: None }).collect();
        let members: Vec<Rank> = (0..n).collect();
        let first_start = members.iter().map(|_| rng.gen_range(0..=2 * alpha)).collect();
        sc.chains.push(FenceChain {
            sig: FenceSignature::new(Bytes::from_static(b"job1:*"), Participants::All),
            members,
            steps,
            first_start,
            contrib_len: None,
        });

        let window = (steps_all as u64 + 2) * (round + sc.think_ns);
        // Xcasts from random origins at random times.
        for i in 0..rng.gen_range(3..=8) {
            let origin = rng.gen_range(0..n);
            let roll: f64 = rng.gen();
            let tag = if roll < 0.1 {
                tags::DAEMON_DIED
            } else if roll < 0.2 {
                tags::WIREUP
            } else {
                tags::USER + rng.gen_range(0..4)
            };
            let payload = if rng.gen_bool(0.1) {
                // Above the compression threshold and compressible.
                let mut s = format!("xcast {i} from {origin}: ");
                while s.len() < 20_000 {
                    s.push_str("0123456789abcdef");
                }
                Bytes::from(s)
            } else {
                let len = rng.gen_range(0..200);
                let mut s = format!("xcast {i} from {origin}|");
                s.extend((0..len).map(|k| (b'a' + (k % 26) as u8) as char));
                Bytes::from(s)
            };
            sc.xcasts.push(XcastPlan { at: rng.gen_range(0..=window), origin, tag, payload });
        }

        // Scatters with random maps.
        for i in 0..rng.gen_range(0..=2) {
            let origin = rng.gen_range(0..n);
            let mut slices = Vec::new();
            for dst in 0..n {
                if rng.gen_bool(0.6) {
                    let len = rng.gen_range(0..64);
                    let mut s = format!("scatter {i} to {dst}|");
                    s.extend((0..len).map(|k| (b'A' + (k % 26) as u8) as char));
                    slices.push((dst, Bytes::from(s)));
                }
            }
            slices.shuffle(&mut rng);
            sc.scatters.push(ScatterPlan {
                at: rng.gen_range(0..=window),
                origin,
                tag: tags::LAUNCH_RESIDUALS,
                slices,
            });
        }

        let mut detect_max = 0;
        if profile == Profile::Crash {
            let max_crashes = (n - 2).clamp(1, 3);
            let count = rng.gen_range(1..=max_crashes);
            let mut victims: Vec<Rank> = (1..n).collect();
            victims.shuffle(&mut rng);
            for &rank in &victims[..count as usize] {
                let detect_after = rng.gen_range(2 * alpha..=40 * alpha);
                detect_max = detect_max.max(detect_after);
                sc.crashes.push(CrashPlan { at: rng.gen_range(0..=window), rank, detect_after });
            }
            sc.repair_stagger_ns = rng.gen_range(0..=10 * alpha);
        }

        // Chain over a subset, leaving non-participant relays in the tree. Half the time the
        // subset avoids every crash victim: those fences lose nobody and must all succeed,
        // re-converging after each repair of a relay.
        if rng.gen_bool(0.8) {
            let victims: Vec<Rank> = sc.crashes.iter().map(|c| c.rank).collect();
            let mut pool: Vec<Rank> =
                if rng.gen_bool(0.5) { (0..n).filter(|r| !victims.contains(r)).collect() } else { (0..n).collect() };
            pool.shuffle(&mut rng);
            let max = (pool.len() as u32).min(n - 1).max(1);
            let size = if rng.gen_bool(0.1) { 1 } else { rng.gen_range(1..=max) };
            let mut members: Vec<Rank> = pool[..size as usize].to_vec();
            members.sort_unstable();
            let steps =
                (0..rng.gen_range(2..=8)).map(|_| FenceStep { collect: rng.gen_bool(0.5), timeout: None }).collect();
            let first_start = members.iter().map(|_| rng.gen_range(0..=4 * alpha)).collect();
            sc.chains.push(FenceChain {
                sig: FenceSignature::new(Bytes::from_static(b"job2:sub"), Participants::Daemons(members.clone())),
                members,
                steps,
                first_start,
                contrib_len: None,
            });
        }

        // Generous: every op one after the other, each slowed by every repair.
        let ops = (steps_all + 8 + sc.xcasts.len() + sc.scatters.len()) as u64;
        let repairs = sc.crashes.len() as u64 * (detect_max + sc.repair_stagger_ns + 4 * round);
        // An origin re-sends a relay lost with a crashed hop once every hop has had time to
        // repair; each crash can cost an origin a few such retries.
        sc.cfg.relay_retry_ns = 4 * round + detect_max + sc.repair_stagger_ns;
        let retries = sc.crashes.len() as u64 * 3 * sc.cfg.relay_retry_ns;
        sc.bound_ns = 2 * window + 4 * ops * (round + sc.think_ns) + 2 * repairs + retries + 20 * alpha;
        sc
    }
}
