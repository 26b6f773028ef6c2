//! What happens in one run of the daemon-core engine: boot, then PMIx-like jobs (fence
//! chains over fixed participant sets), fence benchmarks at the HNP, xcasts, and faults.
//! Everything is derived from `(seed, n, radix, profile)`; workload and fault times are
//! offsets from the moment the HNP reports the DVM ready.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use dvm_grpcomm::{tags, Config, FenceSignature, Participants, Rank, Topology};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::net::NetModel;
pub use crate::scenario::XcastPlan;

/// xcast tag of the "job ended" announcement: every daemon forgets the job's signature.
pub const JOB_END: u32 = tags::USER + 40;
/// xcast tags of plain user broadcasts start here.
pub const USER_XCAST: u32 = tags::USER + 50;

/// A PMIx-like job: its daemons call fence over the job's signature, one after the other.
#[derive(Debug, Clone)]
pub struct JobPlan {
    pub sig: FenceSignature,
    /// Participating daemons (sorted).
    pub members: Vec<Rank>,
    /// `PMIX_COLLECT_DATA` of each fence.
    pub steps: Vec<bool>,
    /// Offset after ready at which each member (same order) calls fence 0.
    pub first_start: Vec<u64>,
}

impl JobPlan {
    /// Contribution of `daemon` to fence `step` of job `job`: distinct, of varying length.
    pub fn contribution(&self, job: usize, step: usize, daemon: Rank) -> Bytes {
        if !self.steps[step] {
            return Bytes::from_static(b"barrier!");
        }
        let pad = (daemon as usize * 13 + step * 5 + job) % 11;
        let mut s = format!("<j{job}s{step}d{daemon}:");
        s.extend(std::iter::repeat_n('y', pad));
        s.push('>');
        Bytes::from(s)
    }
}

/// A job a prun submits to the HNP: simulated procs (`dvm_core::harness::Program`) started
/// by the daemons, which the DVM must end — succeeded, or failed with the rank or daemon
/// named — whatever the faults.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    pub at: u64,
    pub spec: dvm_proto::job::JobSpec,
    /// How long its longest proc runs (or its timeout, for one that hangs).
    pub runs_ns: u64,
    /// Rank 0 of the job (on the HNP's daemon) spawns a job this long after the launch.
    pub spawn: Option<SpawnPlan>,
}

/// A `PMIx_Spawn` by rank 0 of a job.
#[derive(Debug, Clone)]
pub struct SpawnPlan {
    pub after: u64,
    pub np: u32,
    pub program: dvm_core::harness::Program,
}

/// A file staged from the HNP's node to every daemon (as `pbcast` asks): small ones in
/// generated schedules, large ones in projections.
#[derive(Debug, Clone)]
pub struct StageRun {
    pub at: u64,
    pub bytes: Bytes,
    /// Bytes per segment and segments in flight (0: the daemon's defaults).
    pub segment: u64,
    pub window: usize,
}

/// A fence benchmark asked of the HNP.
#[derive(Debug, Clone)]
pub struct BenchPlan {
    pub at: u64,
    pub count: u64,
    pub bytes: u64,
}

/// What goes wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// The daemon stops forever. `rst`: its sockets are closed (every connected peer hears at
    /// once); otherwise only heartbeats and failed sends notice.
    Kill { rank: Rank, rst: bool },
    /// Killed right after its `step`-th input after ready, with only the first `carried`
    /// effects of that step carried out (a crash in the middle of draining).
    KillAtStep { rank: Rank, step: u64, carried: usize },
    /// Frozen for `for_ns`: frames to it queue; it resumes and works through its queue.
    Stop { rank: Rank, for_ns: u64 },
    /// The link between `a` and `b` is cut for good. `lossy`: frames on it shortly before the
    /// cut are dropped, duplicated or delayed past the cut's detection.
    Cut { a: Rank, b: Rank, lossy: bool },
}

#[derive(Debug, Clone)]
pub struct FaultPlan {
    pub at: u64,
    pub kind: FaultKind,
}

/// Families of generated schedules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreProfile {
    /// Jobs, benchmarks and xcasts, no fault.
    Clean,
    /// The same mix with 1..=3 faults: kills (with and without RST, at a step), freezes
    /// (short and long), link cuts (some lossy).
    Faults,
    /// The mix, some faults, and the HNP killed at a random point.
    HnpLoss,
}

impl fmt::Display for CoreProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CoreProfile::Clean => "clean",
            CoreProfile::Faults => "faults",
            CoreProfile::HnpLoss => "hnp",
        })
    }
}

impl FromStr for CoreProfile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "clean" => Ok(CoreProfile::Clean),
            "faults" => Ok(CoreProfile::Faults),
            "hnp" => Ok(CoreProfile::HnpLoss),
            _ => Err(format!("unknown core profile '{s}' (known: clean, faults, hnp)")),
        }
    }
}

/// A complete, reproducible schedule for the daemon-core engine.
#[derive(Debug, Clone)]
pub struct CoreScenario {
    pub n: u32,
    pub radix: u32,
    pub seed: u64,
    pub profile: CoreProfile,
    pub net: NetModel,
    pub cfg: Config,
    /// Largest delay before a daemon checks in.
    pub boot_stagger_ns: u64,
    /// Heartbeat bound: a silent tree neighbour is reported lost after this (plus jitter).
    pub heartbeat_ns: u64,
    /// Largest extra delay of one loss detection.
    pub detect_jitter_ns: u64,
    /// Largest pause between a fence completing and the next one of its job.
    pub think_ns: u64,
    pub jobs: Vec<JobPlan>,
    pub benches: Vec<BenchPlan>,
    pub xcasts: Vec<XcastPlan>,
    pub faults: Vec<FaultPlan>,
    /// Jobs submitted by pruns.
    pub launches: Vec<LaunchPlan>,
    /// `pterm` at this offset after ready: running jobs end first, then every daemon.
    pub terminate_at: Option<u64>,
    /// A daemon killed at this offset and started again (a new incarnation) `after` later:
    /// it must be told it cannot rejoin, and change nothing.
    pub restart: Option<RestartPlan>,
    /// The run must be quiet this long after ready plus the last fault.
    pub bound_ns: u64,
    /// Files staged to every daemon; their disks count bytes and keep none.
    pub stages: Vec<StageRun>,
    /// The run stops (a violation) after this many events.
    pub max_events: u64,
    /// Daemons whose grpcomm state is measured after every step of theirs (the peaks are in
    /// the trace; measuring is O(state), so a projection at scale picks a few).
    pub sample_state: Vec<Rank>,
}

impl CoreScenario {
    pub fn height(&self) -> u32 {
        Topology::new(0, self.radix, self.n).expect("scenario geometry is valid").height()
    }

    /// The generated schedule for `(seed, n, radix, profile)`.
    pub fn generate(seed: u64, n: u32, radix: u32, profile: CoreProfile) -> Self {
        assert!(n >= 3, "a generated core schedule needs at least 3 daemons (n = {n})");
        let mut rng = StdRng::seed_from_u64(seed ^ 0xc0de_da3e_0000_0009);
        let net = NetModel::generated(&mut rng);
        let alpha = net.alpha_ns;
        let h = Topology::new(0, radix, n).expect("scenario geometry is valid").height() as u64;
        let round = net.round_ns(h, radix.min(n) as u64);
        let heartbeat_ns = rng.gen_range(4 * alpha..=20 * alpha);
        let detect_jitter_ns = rng.gen_range(0..=4 * alpha);
        let think_ns = rng.gen_range(0..=2 * alpha);
        let cfg = Config { relay_retry_ns: 4 * round + heartbeat_ns + detect_jitter_ns, ..Config::default() };

        // Jobs over fixed participant sets, several at once.
        let mut jobs = Vec::new();
        let mut longest = 0;
        for j in 0..rng.gen_range(1..=3) {
            let mut pool: Vec<Rank> = (0..n).collect();
            pool.shuffle(&mut rng);
            let size = if rng.gen_bool(0.3) { n } else { rng.gen_range(1..=n) };
            let mut members = pool[..size as usize].to_vec();
            members.sort_unstable();
            let steps: Vec<bool> = (0..rng.gen_range(2..=6)).map(|_| rng.gen_bool(0.5)).collect();
            longest = longest.max(steps.len());
            let first_start = members.iter().map(|_| rng.gen_range(0..=6 * alpha)).collect();
            let sig = FenceSignature::new(format!("job{j}:").into_bytes(), Participants::Daemons(members.clone()));
            jobs.push(JobPlan { sig, members, steps, first_start });
        }
        let window = (longest as u64 + 2) * (round + think_ns);

        let mut benches = Vec::new();
        for _ in 0..rng.gen_range(0..=2) {
            benches.push(BenchPlan {
                at: rng.gen_range(0..=window),
                count: rng.gen_range(1..=6),
                bytes: rng.gen_range(0..=48),
            });
        }
        let mut xcasts = Vec::new();
        for i in 0..rng.gen_range(1..=5) {
            let origin = rng.gen_range(0..n);
            let len = rng.gen_range(0..64);
            let mut s = format!("xcast {i} from {origin}|");
            s.extend((0..len).map(|k| (b'a' + (k % 26) as u8) as char));
            xcasts.push(XcastPlan {
                at: rng.gen_range(0..=window),
                origin,
                tag: USER_XCAST + rng.gen_range(0..4),
                payload: Bytes::from(s),
            });
        }

        let mut faults = Vec::new();
        if profile != CoreProfile::Clean {
            let count = if profile == CoreProfile::HnpLoss { rng.gen_range(0..=1) } else { rng.gen_range(1..=3) };
            let mut victims: Vec<Rank> = (1..n).collect();
            victims.shuffle(&mut rng);
            for &rank in victims.iter().take(count) {
                let at = rng.gen_range(0..=window);
                let roll: f64 = rng.gen();
                let kind = if roll < 0.3 {
                    FaultKind::Kill { rank, rst: rng.gen_bool(0.5) }
                } else if roll < 0.45 {
                    FaultKind::KillAtStep { rank, step: rng.gen_range(0..40), carried: rng.gen_range(0..4) }
                } else if roll < 0.7 {
                    // Long freezes outlast every detection; short ones stay under the bound.
                    let for_ns = if rng.gen_bool(0.75) {
                        heartbeat_ns + detect_jitter_ns + rng.gen_range(10 * alpha..=40 * alpha)
                    } else {
                        rng.gen_range(0..heartbeat_ns / 2)
                    };
                    FaultKind::Stop { rank, for_ns }
                } else {
                    let mut b = rng.gen_range(0..n - 1);
                    if b >= rank {
                        b += 1;
                    }
                    FaultKind::Cut { a: rank.min(b), b: rank.max(b), lossy: rng.gen_bool(0.5) }
                };
                faults.push(FaultPlan { at, kind });
            }
            if profile == CoreProfile::HnpLoss {
                faults.push(FaultPlan {
                    at: rng.gen_range(0..=window),
                    kind: FaultKind::Kill { rank: 0, rst: rng.gen_bool(0.5) },
                });
            }
            faults.sort_by_key(|f| f.at);
        }

        // From their own stream: the rest of a seed's schedule is what it was before launches.
        let (launches, terminate_at, restart) = launches(seed, n, alpha, window, profile, heartbeat_ns);
        let runs = launches.iter().map(|l| l.at + l.runs_ns).max().unwrap_or(0);
        // A restart of a daemon the schedule also faults would test the schedule, not the DVM.
        let restart = restart.filter(|rp| {
            !faults.iter().any(|f| match f.kind {
                FaultKind::Kill { rank, .. } | FaultKind::KillAtStep { rank, .. } | FaultKind::Stop { rank, .. } => {
                    rank == rp.rank
                }
                FaultKind::Cut { a, b, .. } => a == rp.rank || b == rp.rank,
            })
        });
        let stages = stage_runs(seed, window);
        let ops = (longest + 8 + xcasts.len() + 8 * benches.len() + 8 * launches.len() + 12 * stages.len()) as u64;
        let losses = faults.len() as u64 * (2 * heartbeat_ns + 2 * detect_jitter_ns + 60 * alpha + 8 * round);
        let bound_ns = 2 * window
            + runs
            + 6 * ops * (round + think_ns)
            + 2 * losses
            + 3 * faults.len() as u64 * cfg.relay_retry_ns
            + 40 * alpha;
        CoreScenario {
            n,
            radix,
            seed,
            profile,
            net,
            cfg,
            boot_stagger_ns: rng.gen_range(0..=4 * alpha),
            heartbeat_ns,
            detect_jitter_ns,
            think_ns,
            jobs,
            benches,
            xcasts,
            faults,
            launches,
            terminate_at,
            restart,
            bound_ns,
            stages,
            max_events: 5_000_000,
            sample_state: Vec::new(),
        }
    }

    /// This schedule as it was generated before ranks spoke PMI: every MPI job on PMIx under
    /// the default interface, every job without `--mpi` (the rest is drawn from other streams,
    /// so the seeds found then replay what they found).
    pub fn pmix_only(mut self) -> Self {
        for l in &mut self.launches {
            l.spec.mpi = dvm_proto::job::MpiInterface::MpiDefault as i32;
            for a in &mut l.spec.apps {
                if let Some((_, k)) = MpiWire::of(&a.argv) {
                    a.argv = MpiWire::Pmix.argv(k);
                }
            }
        }
        self
    }

    /// A fault-free DVM on `net` with no workload, whose heartbeat bound is never reached:
    /// the base of a projection, which adds its workload.
    pub fn quiet(n: u32, radix: u32, net: NetModel) -> Self {
        let cfg =
            Config { relay_retry_ns: 3_600_000_000_000, link: crate::project::link_model(&net), ..Config::default() };
        CoreScenario {
            n,
            radix,
            seed: 0,
            profile: CoreProfile::Clean,
            net,
            cfg,
            boot_stagger_ns: 0,
            heartbeat_ns: 3_600_000_000_000,
            detect_jitter_ns: 0,
            think_ns: 0,
            jobs: Vec::new(),
            benches: Vec::new(),
            xcasts: Vec::new(),
            faults: Vec::new(),
            launches: Vec::new(),
            terminate_at: None,
            restart: None,
            bound_ns: 3_600_000_000_000,
            stages: Vec::new(),
            max_events: 5_000_000,
            sample_state: Vec::new(),
        }
    }
}

/// 0 to 3 jobs of 1 to `n` procs (one slot per daemon): most exit 0, some fail, some hang
/// until their `--timeout`; some have two apps, some spawn a job while they run; two in five
/// are MPI jobs (1 to 3 PMIx fences and a direct modex, or 1 to 3 PMI barriers with puts and
/// gets: [`MpiWire`]), each with a `prun --mpi` value; some other jobs carry one too. A quarter of
/// the schedules without HNP loss end with `pterm`.
/// Small files `pbcast` to every daemon while the rest runs (faults included), each in a few
/// segments: from their own stream, so the rest of a seed's schedule is what it was before.
fn stage_runs(seed: u64, window: u64) -> Vec<StageRun> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x57a9_e000_0000_0028);
    (0..rng.gen_range(0..=2))
        .map(|i| {
            let len = rng.gen_range(0..=(200usize << 10));
            StageRun {
                at: rng.gen_range(0..=window),
                bytes: Bytes::from((0..len).map(|k| (k * 7 + i * 13 + k / 509) as u8).collect::<Vec<u8>>()),
                segment: 64 << 10,
                window: rng.gen_range(1..=4),
            }
        })
        .collect()
}

fn launches(
    seed: u64,
    n: u32,
    alpha: u64,
    window: u64,
    profile: CoreProfile,
    heartbeat_ns: u64,
) -> (Vec<LaunchPlan>, Option<u64>, Option<RestartPlan>) {
    use dvm_core::harness::Program;
    use dvm_proto::job::{AppContext, JobSpec, MpiInterface};
    let mut rng = StdRng::seed_from_u64(seed ^ 0x1a07_c4e5_0000_0025);
    // Which jobs are MPI jobs comes from a stream of its own: the rest is what it was before.
    let mut mpi = StdRng::seed_from_u64(seed ^ 0x3b1f_0d6a_0000_0025);
    // Which wire they speak and which `--mpi` each job asks for: from a stream of its own too.
    let mut wires = StdRng::seed_from_u64(seed ^ 0x9d1e_77a3_0000_0042);
    let mut out = Vec::new();
    for _ in 0..rng.gen_range(0..=3) {
        let np = rng.gen_range(1..=n);
        let mut runs_ns = 0;
        let mut timeout_s = 0.0;
        let mut program = |rng: &mut StdRng| {
            let after_ns = rng.gen_range(0..=20 * alpha) / 1_000 * 1_000;
            runs_ns = runs_ns.max(after_ns);
            let roll: f64 = rng.gen();
            if roll < 0.7 {
                Program::Exit { code: 0, after_ns }
            } else if roll < 0.8 {
                Program::Exit { code: rng.gen_range(1..=3), after_ns }
            } else if roll < 0.85 {
                Program::Signal { signal: 9, after_ns }
            } else {
                let t = rng.gen_range(5 * alpha..=30 * alpha);
                timeout_s = t as f64 / 1e9;
                runs_ns = runs_ns.max(t);
                Program::Hang
            }
        };
        let apps = if np > 1 && rng.gen_bool(0.3) {
            let first = rng.gen_range(1..np);
            vec![
                AppContext { argv: program(&mut rng).argv(), np: first, ..Default::default() },
                AppContext { argv: program(&mut rng).argv(), np: np - first, ..Default::default() },
            ]
        } else {
            vec![AppContext { argv: program(&mut rng).argv(), np, ..Default::default() }]
        };
        let mut apps = apps;
        let mut iface = MpiInterface::MpiDefault;
        if mpi.gen_bool(0.4) {
            // MPI ranks: fences (a direct modex) through their daemons' PMIx servers, or
            // barriers (puts and gets) on their PMI fds.
            let fences = mpi.gen_range(1..=3);
            let wire = MpiWire::pick(&mut wires);
            for a in &mut apps {
                a.argv = wire.argv(fences);
            }
            iface = wire.interface(&mut wires);
            runs_ns = runs_ns.max(u64::from(fences + 1) * 20 * alpha);
        } else if wires.gen_bool(0.3) {
            // A job that is no MPI program, run with `prun --mpi` all the same.
            iface = *[MpiInterface::MpiBoth, MpiInterface::MpiPmix, MpiInterface::MpiPmi1, MpiInterface::MpiNone]
                .choose(&mut wires)
                .expect("non-empty");
        }
        let spec = JobSpec { apps, timeout_s, mpi: iface as i32, ..Default::default() };
        let spawn = rng.gen_bool(0.3).then(|| SpawnPlan {
            after: rng.gen_range(0..=4 * alpha),
            np: rng.gen_range(1..=n),
            program: Program::Exit { code: 0, after_ns: rng.gen_range(0..=10 * alpha) / 1_000 * 1_000 },
        });
        out.push(LaunchPlan { at: rng.gen_range(0..=window), spec, runs_ns, spawn });
    }
    let terminate = profile != CoreProfile::HnpLoss && rng.gen_bool(0.25);
    let terminate_at = terminate.then(|| rng.gen_range(0..=2 * window));
    let restart = (profile == CoreProfile::Faults && rng.gen_bool(0.15)).then(|| RestartPlan {
        rank: rng.gen_range(1..n),
        at: rng.gen_range(0..=window),
        // Before its loss is noticed, or after.
        after: rng.gen_range(0..=2 * heartbeat_ns),
        epoch: rng.gen::<u64>() | 1,
    });
    (out, terminate_at, restart)
}

/// A daemon killed and started again.
#[derive(Debug, Clone)]
pub struct RestartPlan {
    pub rank: Rank,
    pub at: u64,
    pub after: u64,
    pub epoch: u64,
}

/// The wire a simulated MPI job's ranks speak: `sim-mpi K` (PMIx: the harness's
/// `Program::Mpi`), or `sim-mpi K pmi1|pmi2|pmi12` (PMI on the rank's fd: K barriers, each
/// after a put, followed by gets of other ranks' keys). The harness reads only K; the
/// simulator's clients read the wire (`engine/clients.rs`, `engine/pmi_ranks.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpiWire {
    Pmix,
    Pmi1,
    Pmi2,
    /// PMI-1 on even ranks, PMI-2 on odd ones, in one job.
    Pmi12,
}

impl MpiWire {
    /// An MPI rank's wire and its count of fences or barriers; None for any other program.
    pub fn of(argv: &[String]) -> Option<(MpiWire, u32)> {
        if argv.first().map(String::as_str) != Some("sim-mpi") {
            return None;
        }
        let k = argv.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let wire = match argv.get(2).map(String::as_str) {
            None => MpiWire::Pmix,
            Some("pmi1") => MpiWire::Pmi1,
            Some("pmi2") => MpiWire::Pmi2,
            Some("pmi12") => MpiWire::Pmi12,
            Some(_) => return None,
        };
        Some((wire, k))
    }

    pub fn argv(self, k: u32) -> Vec<String> {
        let mut argv = dvm_core::harness::Program::Mpi { fences: k }.argv();
        match self {
            MpiWire::Pmix => {}
            MpiWire::Pmi1 => argv.push("pmi1".into()),
            MpiWire::Pmi2 => argv.push("pmi2".into()),
            MpiWire::Pmi12 => argv.push("pmi12".into()),
        }
        argv
    }

    /// Whether rank `rank` speaks PMI-2 (None: it speaks PMIx).
    pub fn pmi2(self, rank: u32) -> Option<bool> {
        match self {
            MpiWire::Pmix => None,
            MpiWire::Pmi1 => Some(false),
            MpiWire::Pmi2 => Some(true),
            MpiWire::Pmi12 => Some(rank % 2 == 1),
        }
    }

    fn pick(rng: &mut StdRng) -> MpiWire {
        let roll: f64 = rng.gen();
        if roll < 0.4 {
            MpiWire::Pmix
        } else if roll < 0.65 {
            MpiWire::Pmi1
        } else if roll < 0.8 {
            MpiWire::Pmi2
        } else {
            MpiWire::Pmi12
        }
    }

    /// The `prun --mpi` a job of this wire asks for: mostly one that serves it; some ask for
    /// the other interface (a PMI rank under `pmix` fails its job by name; a rank offered
    /// nothing it speaks runs as a singleton) or for none.
    fn interface(self, rng: &mut StdRng) -> dvm_proto::job::MpiInterface {
        use dvm_proto::job::MpiInterface as M;
        let roll: f64 = rng.gen();
        let (served, other): (&[M], &[M]) = match self {
            MpiWire::Pmix => (&[M::MpiDefault, M::MpiDefault, M::MpiBoth, M::MpiPmix], &[M::MpiPmi1, M::MpiNone]),
            _ => (&[M::MpiDefault, M::MpiDefault, M::MpiBoth, M::MpiPmi1, M::MpiPmi2], &[M::MpiPmix, M::MpiNone]),
        };
        let from = if roll < 0.85 { served } else { other };
        *from.choose(rng).expect("non-empty")
    }
}
