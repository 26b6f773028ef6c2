//! dvm-sim: replay a generated schedule, run a campaign, print α-β projections as CSV, or
//! the sizes at which `auto` moves a fence from the tree to the allgather.
//! `--engine grpcomm` (default) runs bare grpcomm state machines; `--engine core` runs the
//! daemon cores (`dvm-core`) with their faults and workloads.

mod replay;

use replay::{campaign_verdict, replay_core, replay_verdict};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use dvm_grpcomm::Movement;
use dvm_sim::crossover::{crossover, hierarchical, Crossover};
use dvm_sim::daemons::stage::{project_stage, StageRow};
use dvm_sim::daemons::{self, CoreProfile};
use dvm_sim::project::{link_model, model_ns, project_with, Op, Row};
use dvm_sim::{campaign_with, run, BcastMovementMode, FenceMovementMode, Movements, NetModel, Profile, Scenario};

#[derive(Parser)]
#[command(name = "dvm-sim", about = "Deterministic simulator of the DVM's collectives")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Which state machines a schedule runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum EngineKind {
    /// Bare grpcomm (profiles crash, clean).
    Grpcomm,
    /// The daemon core (profiles faults, clean, hnp).
    Core,
}

/// The simulated network of a projection.
#[derive(clap::Args, Debug, Clone, Copy)]
struct NetArgs {
    /// α in microseconds.
    #[arg(long, default_value_t = 50.0)]
    alpha_us: f64,
    /// Link bandwidth in GB/s (β = 1/bandwidth).
    #[arg(long, default_value_t = 1.0)]
    bandwidth_gbs: f64,
    /// Receive handling per message at every daemon, in nanoseconds.
    #[arg(long, default_value_t = 100)]
    cpu_ns: u64,
    /// Do not serialize the receiver's inbound link.
    #[arg(long)]
    no_ingress: bool,
}

impl NetArgs {
    fn model(self) -> Result<NetModel> {
        let NetArgs { alpha_us, bandwidth_gbs, cpu_ns, no_ingress } = self;
        if bandwidth_gbs <= 0.0 || alpha_us < 0.0 {
            bail!("bandwidth must be positive and alpha non-negative (got {bandwidth_gbs} GB/s, {alpha_us} us)");
        }
        Ok(NetModel {
            alpha_ns: (alpha_us * 1e3).round() as u64,
            beta_ps_per_byte: (1e3 / bandwidth_gbs).round() as u64,
            cpu_ns,
            jitter_ns: 0,
            ingress_serialized: !no_ingress,
        })
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Rerun one generated schedule exactly and print its violations (exit 1 if any).
    Replay {
        #[arg(long, value_enum, default_value_t = EngineKind::Grpcomm)]
        engine: EngineKind,
        #[arg(long)]
        seed: u64,
        #[arg(long)]
        n: u32,
        #[arg(long)]
        radix: u32,
        /// Default: crash (grpcomm), faults (core).
        #[arg(long)]
        profile: Option<String>,
        /// Also print the schedule and the trace summary.
        #[arg(long)]
        verbose: bool,
        /// Print every event (messages, repairs, deliveries, completions).
        #[arg(long)]
        log: bool,
        /// Fence movement of every daemon: tree, allgather or auto.
        #[arg(long, default_value = "tree")]
        fence_movement: FenceMovementMode,
        /// Broadcast movement of every daemon: tree, bulk or auto.
        #[arg(long, default_value = "tree")]
        bcast_movement: BcastMovementMode,
    },
    /// Run seeds `first..first+count` and print one replay line per failing seed.
    Campaign {
        #[arg(long, value_enum, default_value_t = EngineKind::Grpcomm)]
        engine: EngineKind,
        #[arg(long, default_value_t = 0)]
        first: u64,
        #[arg(long, default_value_t = 100)]
        count: u64,
        #[arg(long)]
        n: u32,
        #[arg(long)]
        radix: u32,
        /// Default: crash (grpcomm), faults (core).
        #[arg(long)]
        profile: Option<String>,
        /// Print every violation of a failing seed, not only the first.
        #[arg(long)]
        verbose: bool,
        /// Fence movement of every daemon: tree, allgather or auto.
        #[arg(long, default_value = "tree")]
        fence_movement: FenceMovementMode,
        /// Broadcast movement of every daemon: tree, bulk or auto.
        #[arg(long, default_value = "tree")]
        bcast_movement: BcastMovementMode,
    },
    /// Print the projection table as CSV (or markdown).
    Project {
        #[arg(long, value_delimiter = ',', default_value = "64,1024,4096,16384")]
        n: Vec<u32>,
        #[arg(long, value_delimiter = ',', default_value = "2,8,64")]
        radix: Vec<u32>,
        /// xcast payload sizes M in bytes.
        #[arg(long, value_delimiter = ',', default_value = "1024,1048576")]
        xcast_bytes: Vec<usize>,
        /// modex contribution per daemon D in bytes.
        #[arg(long, value_delimiter = ',', default_value = "64")]
        modex_bytes: Vec<usize>,
        #[command(flatten)]
        net: NetArgs,
        /// Print a markdown table instead of CSV.
        #[arg(long)]
        markdown: bool,
        /// Fence movements to project side by side.
        #[arg(long, value_delimiter = ',', default_value = "tree,allgather")]
        fence_movement: Vec<FenceMovementMode>,
        /// Broadcast movements to project side by side.
        #[arg(long, value_delimiter = ',', default_value = "tree,bulk")]
        bcast_movement: Vec<BcastMovementMode>,
    },
    /// Project file staging (`pbcast`) on the daemon cores: one file to every daemon in
    /// segments on the bulk broadcast, its time and each daemon's memory against the model
    /// (CSV, or markdown).
    Stage {
        #[arg(long, value_delimiter = ',', default_value = "256,1024,4096")]
        n: Vec<u32>,
        #[arg(long, default_value_t = 64)]
        radix: u32,
        /// File size in MiB.
        #[arg(long, value_delimiter = ',', default_value = "64")]
        mib: Vec<u64>,
        /// Segment sizes in KiB (default: the daemon's).
        #[arg(long, value_delimiter = ',', default_values_t = [dvm_core::stage::DEFAULT_SEGMENT >> 10])]
        segment_kib: Vec<u64>,
        /// Segments in flight (default: the daemon's).
        #[arg(long, default_value_t = dvm_core::stage::WINDOW)]
        window: usize,
        /// MiB of finished exchanges each daemon keeps for detours (default: the daemon's).
        /// Lower it to fit large N in memory: it changes nothing else on a fault-free run.
        #[arg(long)]
        keep_mib: Option<usize>,
        #[command(flatten)]
        net: NetArgs,
        /// Print a markdown table instead of CSV.
        #[arg(long)]
        markdown: bool,
    },
    /// Print, per N and radix, the smallest modex contribution per daemon at which `auto`
    /// moves a fence of every daemon on the allgather, and whether a barrier goes lateral (CSV:
    /// n,radix,depth,barrier_movement,crossover_bytes_per_daemon; or markdown).
    Crossovers {
        #[arg(long, value_delimiter = ',', default_value = "4,16,64,256,1024,4096,16384")]
        n: Vec<u32>,
        #[arg(long, value_delimiter = ',', default_value = "2,4,16,64")]
        radix: Vec<u32>,
        /// α in microseconds.
        #[arg(long, default_value_t = 50.0)]
        alpha_us: f64,
        /// Link bandwidth in MB/s (β = 1/bandwidth).
        #[arg(long, default_value_t = 1000.0)]
        bandwidth_mbps: f64,
        /// Print a markdown table instead of CSV.
        #[arg(long)]
        markdown: bool,
        /// Instead, price a hierarchical fence (model only, not built) at these contributions
        /// per daemon against the better of the tree and the allgather.
        #[arg(long, value_delimiter = ',')]
        hierarchical: Vec<u64>,
    },
}

fn main() -> Result<()> {
    // A filter's manners: a reader that went away (`dvm-sim ... | head`) ends us quietly, as
    // it ends `cat`, instead of a panic in println!.
    // SAFETY: called before any thread exists; SIG_DFL is a valid disposition for SIGPIPE.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    match Cli::parse().cmd {
        Cmd::Replay {
            engine: EngineKind::Core,
            seed,
            n,
            radix,
            profile,
            verbose,
            log,
            fence_movement,
            bcast_movement,
        } => {
            let profile: CoreProfile = profile.as_deref().unwrap_or("faults").parse().map_err(anyhow::Error::msg)?;
            replay_core(seed, n, radix, profile, verbose, log, Movements::new(fence_movement, bcast_movement))?;
        }
        Cmd::Campaign {
            engine: EngineKind::Core,
            first,
            count,
            n,
            radix,
            profile,
            verbose,
            fence_movement,
            bcast_movement,
        } => {
            let profile: CoreProfile = profile.as_deref().unwrap_or("faults").parse().map_err(anyhow::Error::msg)?;
            let mode = Movements::new(fence_movement, bcast_movement);
            let rep = daemons::campaign_with(first..first + count, n, radix, profile, mode);
            let summary = format!(
                "{} runs, faults: {} kills, {} kills mid-step, {} freezes, {} cuts, {} HNP losses; {} fence calls, {} benchmarks, {} xcasts, {} jobs ({} failed), {} PMIx upcalls, {} PMI ranks ({} requests, {} barriers passed), {} evictions, {} frames from dead daemons dropped: {} failing",
                rep.runs,
                rep.kills,
                rep.step_kills,
                rep.stops,
                rep.cuts,
                rep.hnp_losses,
                rep.fences,
                rep.benches,
                rep.xcasts,
                rep.jobs,
                rep.failed_jobs,
                rep.pmix_upcalls,
                rep.pmi_ranks,
                rep.pmi_requests,
                rep.pmi_barriers,
                rep.evictions,
                rep.dead_frames,
                rep.failures.len()
            );
            campaign_verdict(&rep.failures, &summary, verbose)?;
        }
        Cmd::Replay {
            engine: EngineKind::Grpcomm,
            seed,
            n,
            radix,
            profile,
            verbose,
            log,
            fence_movement,
            bcast_movement,
        } => {
            let profile: Profile = profile.as_deref().unwrap_or("crash").parse().map_err(anyhow::Error::msg)?;
            let mut sc = Scenario::generate(seed, n, radix, profile);
            Movements::new(fence_movement, bcast_movement).apply(&mut sc.cfg);
            if verbose {
                println!("{sc:#?}");
            }
            if log {
                let (_, lines) = dvm_sim::engine::Engine::new(&sc).with_log().run_logged();
                for l in lines {
                    println!("{l}");
                }
            }
            let out = run(&sc);
            if let Some(t) = &out.trace {
                println!(
                    "seed {seed} n {n} radix {radix} profile {profile}: {} crashes {:?}, {} xcasts, {} fence calls, {} messages, ended t={} ns (bound {} ns)",
                    t.crashes.len(),
                    t.crashes,
                    t.xcast_starts.len(),
                    t.fence_calls.len(),
                    t.stats.messages,
                    t.end_ns,
                    sc.bound_ns
                );
                if verbose {
                    println!("stats: {:?}\nepochs: {:?}\ndropped: {:?}", t.stats, t.epochs, t.dropped);
                }
            }
            replay_verdict(&out.violations)?;
        }
        Cmd::Campaign {
            engine: EngineKind::Grpcomm,
            first,
            count,
            n,
            radix,
            profile,
            verbose,
            fence_movement,
            bcast_movement,
        } => {
            let profile: Profile = profile.as_deref().unwrap_or("crash").parse().map_err(anyhow::Error::msg)?;
            let mode = Movements::new(fence_movement, bcast_movement);
            let rep = campaign_with(first..first + count, n, radix, profile, mode);
            let summary = format!(
                "{} runs, {} crashes, {} xcasts, {} fence calls: {} failing",
                rep.runs,
                rep.crashes,
                rep.xcasts,
                rep.fences,
                rep.failures.len()
            );
            campaign_verdict(&rep.failures, &summary, verbose)?;
        }
        Cmd::Project { n, radix, xcast_bytes, modex_bytes, net, markdown, fence_movement, bcast_movement } => {
            let net = net.model()?;
            let mut ops: Vec<Op> = xcast_bytes.iter().map(|&m| Op::Xcast(m)).collect();
            ops.push(Op::Barrier);
            ops.extend(modex_bytes.iter().map(|&d| Op::Modex(d)));
            if markdown {
                println!(
                    "| op | movement | n | radix | bytes | sim µs | model µs | sim/model | messages | peak state B |"
                );
                println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
            } else {
                println!("{}", Row::CSV_HEADER);
            }
            let mut bad = Vec::new();
            for &n in &n {
                for &r in &radix {
                    for &op in &ops {
                        // A broadcast is projected once per broadcast mode, a fence once per
                        // fence mode.
                        let modes: Vec<Movements> = if matches!(op, Op::Xcast(_)) {
                            bcast_movement.iter().map(|&b| Movements::new(FenceMovementMode::Tree, b)).collect()
                        } else {
                            fence_movement.iter().map(|&f| Movements::from(f)).collect()
                        };
                        for mode in modes {
                            let row = project_with(op, n, r, &net, mode);
                            if markdown {
                                println!(
                                    "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.3} | {} | {} |",
                                    op.name(),
                                    row.movement.name(),
                                    n,
                                    r,
                                    op.bytes(),
                                    row.sim_ns as f64 / 1e3,
                                    row.model_ns / 1e3,
                                    row.ratio(),
                                    row.messages,
                                    row.peak_state_bytes
                                );
                            } else {
                                println!("{}", row.csv());
                            }
                            if !row.violations.is_empty() {
                                bad.push(format!(
                                    "{} ({mode}) n={n} radix={r}: {}",
                                    op.name(),
                                    row.violations.join("; ")
                                ));
                            }
                        }
                    }
                }
            }
            // The cheaper alternative to scatter-allgather for large payloads, as a model only.
            let sizes: Vec<usize> = xcast_bytes.iter().copied().filter(|&m| m > 0).collect();
            if markdown && !sizes.is_empty() {
                println!();
                println!("Pipelined tree broadcast (model only, not built): best segment count k and its time");
                println!();
                println!("| n | radix | bytes | k | pipelined µs | tree model µs | scatter-allgather model µs |");
                println!("|---:|---:|---:|---:|---:|---:|---:|");
                for &n in &n {
                    for &r in &radix {
                        let depth = dvm_sim::scenario::Scenario::empty(n, r, 1, net.clone()).height();
                        for &m in &sizes {
                            let (k, t) = dvm_sim::project::pipelined_tree_model(m, n, r, depth, &net);
                            let tree = model_ns(Op::Xcast(m), Movement::TreeBroadcast, n, r, depth, &net);
                            let bulk = model_ns(Op::Xcast(m), Movement::ScatterAllgather, n, r, depth, &net);
                            println!(
                                "| {n} | {r} | {m} | {k} | {:.1} | {:.1} | {:.1} |",
                                t / 1e3,
                                tree / 1e3,
                                bulk / 1e3
                            );
                        }
                    }
                }
            }
            for b in &bad {
                eprintln!("VIOLATION: {b}");
            }
            if !bad.is_empty() {
                return Err(anyhow::anyhow!("{} projection run(s) violated invariants", bad.len()))
                    .context("projection");
            }
        }
        Cmd::Stage { n, radix, mib, segment_kib, window, keep_mib, net, markdown } => {
            if window == 0 || segment_kib.contains(&0) || n.iter().any(|&x| x < 2) {
                bail!("--window and --segment-kib must be at least 1, --n at least 2");
            }
            let net = net.model()?;
            println!("{}", if markdown { StageRow::markdown_header() } else { StageRow::csv_header() });
            let mut bad = Vec::new();
            for &n in &n {
                for &m in &mib {
                    for &seg in &segment_kib {
                        let row = project_stage(n, radix, &net, m << 20, seg << 10, window, keep_mib.map(|k| k << 20));
                        println!("{}", if markdown { row.markdown() } else { row.csv() });
                        if !row.problems.is_empty() {
                            bad.push(format!("n={n} {m} MiB segment {seg} KiB: {}", row.problems.join("; ")));
                        }
                    }
                }
            }
            if !bad.is_empty() {
                bail!("{}", bad.join("\n"));
            }
        }
        Cmd::Crossovers { n, radix, alpha_us, bandwidth_mbps, markdown, hierarchical: sizes } => {
            if bandwidth_mbps <= 0.0 || alpha_us < 0.0 {
                bail!("bandwidth must be positive and alpha non-negative (got {bandwidth_mbps} MB/s, {alpha_us} us)");
            }
            // The simulator's own network, so that the rule is priced as `project` prices it.
            let net = NetModel {
                alpha_ns: (alpha_us * 1e3).round() as u64,
                beta_ps_per_byte: (1e6 / bandwidth_mbps).round() as u64,
                ..NetModel::projection_default()
            };
            let link = link_model(&net);
            if sizes.is_empty() {
                print_crossovers(&n, &radix, &link, markdown)?;
            } else {
                print_hierarchical(&n, &radix, &sizes, &link, markdown)?;
            }
        }
    }
    Ok(())
}

/// The crossover table, one row per (N, radix).
fn print_crossovers(ns: &[u32], radixes: &[u32], link: &dvm_grpcomm::LinkModel, markdown: bool) -> Result<()> {
    if markdown {
        println!("| N | radix | depth | barrier | crossover bytes per daemon | modex at the crossover, bytes |");
        println!("|---:|---:|---:|---|---:|---:|");
    } else {
        println!("{}", Crossover::CSV_HEADER);
    }
    for &n in ns {
        for &r in radixes {
            let c = crossover(n, r, link).with_context(|| format!("n {n} radix {r}"))?;
            println!("{}", if markdown { c.markdown() } else { c.csv() });
        }
    }
    Ok(())
}

/// The hierarchical model against min(tree, allgather) per (N, radix, size), and the best
/// ratio found.
fn print_hierarchical(
    ns: &[u32],
    radixes: &[u32],
    sizes: &[u64],
    link: &dvm_grpcomm::LinkModel,
    markdown: bool,
) -> Result<()> {
    if markdown {
        println!("| N | radix | depth | bytes per daemon | best ℓ | hierarchical µs | tree µs | allgather µs | hierarchical / min |");
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    } else {
        println!("n,radix,depth,bytes_per_daemon,level,hierarchical_us,tree_us,allgather_us,ratio");
    }
    let mut best: Option<(f64, String)> = None;
    for &n in ns {
        for &r in radixes {
            for &per in sizes {
                let h = hierarchical(n, r, per, link).with_context(|| format!("n {n} radix {r}"))?;
                let (level, hier, ratio) = match (h.level, h.hierarchical_ns, h.ratio()) {
                    (Some(l), Some(t), Some(q)) => (l.to_string(), format!("{:.1}", t / 1e3), format!("{q:.3}")),
                    _ => ("—".to_string(), "—".to_string(), "—".to_string()),
                };
                let (tree, ag) = (format!("{:.1}", h.tree_ns / 1e3), format!("{:.1}", h.allgather_ns / 1e3));
                if markdown {
                    println!("| {n} | {r} | {} | {per} | {level} | {hier} | {tree} | {ag} | {ratio} |", h.depth);
                } else {
                    println!("{n},{r},{},{per},{level},{hier},{tree},{ag},{ratio}", h.depth);
                }
                if let (Some(q), Some(l)) = (h.ratio(), h.level) {
                    if best.as_ref().is_none_or(|b| q < b.0) {
                        best = Some((q, format!("N {n}, radix {r}, {per} B per daemon, split at level {l}")));
                    }
                }
            }
        }
    }
    match best {
        Some((q, at)) => eprintln!("best hierarchical / min(tree, allgather): {q:.3} at {at}"),
        None => eprintln!("no tree of two or more levels below the root: no hierarchical split"),
    }
    Ok(())
}
