//! `dvm-bench`: time the DVM's collectives on a running DVM and compare them with the α-β
//! model, α and β measured in the same run (RML round trips between the HNP and daemon 1).

use std::io::Write;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use dvm_proto::control::{BenchKind, BenchReply, BenchRequest};
use dvmd::control::Client;
use dvmd::session::DvmUri;
use hdrhistogram::Histogram;

#[derive(Parser, Debug)]
#[command(name = "dvm-bench", about = "Time barriers, modex fences and xcasts on a running DVM")]
struct Args {
    /// The DVM: a dvm:// URI or file:PATH (default: the only persistent DVM of this user here).
    #[arg(long, value_name = "URI|file:F")]
    dvm_uri: Option<String>,
    /// Operations per measurement.
    #[arg(long, default_value_t = 200)]
    count: u64,
    /// Modex bytes per daemon (comma-separated).
    #[arg(long, default_value = "0,64,8192,65536,1048576", value_delimiter = ',')]
    modex_bytes: Vec<u64>,
    /// xcast payload sizes (comma-separated).
    #[arg(long, default_value = "64,65536,1048576", value_delimiter = ',')]
    xcast_bytes: Vec<u64>,
    /// Also write the rows as CSV to this file.
    #[arg(long)]
    csv: Option<String>,
    /// Run N alternating barrier/modex fences and check every result (no timing table).
    #[arg(long, value_name = "N")]
    check_fences: Option<u64>,
    /// With --check-fences or --check-xcast: the movement to force (fences: auto|tree|allgather,
    /// xcasts: auto|tree|bulk; default: the DVM's).
    #[arg(long, value_name = "M")]
    movement: Option<String>,
    /// Run N xcasts of --xcast-bytes' first size and check them on every daemon (no timing).
    #[arg(long, value_name = "N", conflicts_with = "check_fences")]
    check_xcast: Option<u64>,
    /// A/B the movements instead: each size runs tree and lateral movement alternately in
    /// ABBA order on this DVM, REPS times, and the table gives paired ratios (lateral/tree).
    #[arg(long, value_name = "REPS")]
    compare_movements: Option<u32>,
    /// Print the routing tree instead: each daemon's parent, memory, fences in flight and how
    /// its loop keeps time (timer lateness p50/p99/max, the longest single step).
    #[arg(long, conflicts_with_all = ["check_fences", "check_xcast", "compare_movements"])]
    tree: bool,
}

fn main() -> ExitCode {
    dvmd::tool_main("dvm-bench", run)
}

struct Row {
    op: String,
    bytes: u64,
    p50_us: f64,
    p99_us: f64,
    model_us: f64,
}

fn hist(r: &BenchReply) -> Histogram<u64> {
    let mut h = Histogram::<u64>::new(3).expect("histogram");
    for &ns in &r.latencies_ns {
        let _ = h.record(ns.max(1));
    }
    h
}

async fn bench(c: &mut Client, kind: BenchKind, count: u64, bytes: u64) -> Result<BenchReply> {
    bench_on(c, kind, count, bytes, "").await
}

/// A benchmark with its movement forced (`""`: the DVM's).
async fn bench_on(c: &mut Client, kind: BenchKind, count: u64, bytes: u64, movement: &str) -> Result<BenchReply> {
    let (fence_movement, bcast_movement) = match kind {
        BenchKind::Xcast => (String::new(), movement.to_string()),
        _ => (movement.to_string(), String::new()),
    };
    let r = c
        .bench(BenchRequest { kind: kind as i32, count, bytes, fence_movement, bcast_movement })
        .await
        .with_context(|| format!("{} benchmark ({bytes} bytes)", kind_name(kind)))?;
    if r.errors > 0 {
        bail!("{}", failure_text(kind, &r));
    }
    Ok(r)
}

/// The tree views as a table, one daemon per line, in rank order.
fn tree_text(views: &[dvm_proto::control::TreeView]) -> String {
    let ms = |us: u64| format!("{:.2}", us as f64 / 1000.0);
    let mut t = String::from(
        "rank parent host                 pid      rss_mib fences late_p50_ms late_p99_ms late_max_ms longest_step_ms\n",
    );
    for v in views {
        let parent = if v.parent == u32::MAX { "-".to_string() } else { v.parent.to_string() };
        t.push_str(&format!(
            "{:<4} {:<6} {:<20} {:<8} {:<7.1} {:<6} {:<11} {:<11} {:<11} {}\n",
            v.rank,
            parent,
            v.host,
            v.pid,
            v.rss_kib as f64 / 1024.0,
            v.fences_in_flight,
            ms(v.late_p50_us),
            ms(v.late_p99_us),
            ms(v.late_max_us),
            ms(v.longest_step_us)
        ));
    }
    t
}

/// What a benchmark of `kind` runs, for a person.
fn kind_name(kind: BenchKind) -> &'static str {
    match kind {
        BenchKind::Barrier => "barrier",
        BenchKind::Modex => "modex",
        BenchKind::Alternate => "alternating barrier/modex",
        BenchKind::Xcast => "xcast",
        BenchKind::Ping => "ping",
        BenchKind::Unspecified => "unspecified",
    }
}

/// "alternating barrier/modex benchmark failed: failed on 14 daemons (daemons lost: daemon 1 on
/// host vm-1, daemon 2 on host vm-2); first: ...": failures and wrong results told apart.
fn failure_text(kind: BenchKind, r: &BenchReply) -> String {
    let wrong = r.errors.saturating_sub(r.failed);
    let mut parts = Vec::new();
    if r.failed > 0 {
        // Each daemon stops at its first failed fence: one per daemon that saw one.
        let s = if r.failed == 1 { "" } else { "s" };
        parts.push(format!("failed on {} daemon{s}", r.failed));
    }
    if wrong > 0 {
        let s = if wrong == 1 { "" } else { "s" };
        parts.push(format!("{wrong} wrong result{s}"));
    }
    let lost = if r.lost.is_empty() { String::new() } else { format!(" (daemons lost: {})", r.lost) };
    format!("{} benchmark failed: {}{lost}; first: {}", kind_name(kind), parts.join(", "), r.first_error)
}

async fn run(args: Args) -> Result<()> {
    if args.count == 0 {
        bail!("--count 0: need at least one operation");
    }
    if args.movement.is_some() && args.check_fences.is_none() && args.check_xcast.is_none() {
        bail!("--movement goes with --check-fences or --check-xcast (--compare-movements runs both movements itself)");
    }
    let uri = DvmUri::resolve(args.dvm_uri.as_deref())?;
    let mut c = Client::connect(uri).await?;
    if args.tree {
        print!("{}", tree_text(&c.tree_views().await?.views));
        return Ok(());
    }
    let forced = args.movement.clone().unwrap_or_default();
    let check = match (args.check_fences, args.check_xcast) {
        (Some(n), _) => Some((BenchKind::Alternate, n, 64, "alternating barrier/modex fences".to_string())),
        (None, Some(n)) => {
            let b = args.xcast_bytes.first().copied().unwrap_or(64);
            Some((BenchKind::Xcast, n, b, format!("xcasts of {b} bytes")))
        }
        (None, None) => None,
    };
    if let Some((kind, n, bytes, what)) = check {
        let r = bench_on(&mut c, kind, n, bytes, &forced).await?;
        let held = if kind == BenchKind::Xcast {
            "every daemon held identical, correct bytes"
        } else {
            "all results identical and correct"
        };
        let movement = if forced.is_empty() { "the DVM's" } else { &forced };
        println!("{} {what} on {} daemons ({movement} movement): {held}", r.latencies_ns.len(), r.daemons);
        return Ok(());
    }
    if let Some(reps) = args.compare_movements {
        return compare_movements(&mut c, &args, reps.max(1)).await;
    }
    // α from small round trips, β from 1 MiB round trips, both HNP <-> daemon 1.
    let ping = bench(&mut c, BenchKind::Ping, args.count.max(50), 0).await?;
    let big = bench(&mut c, BenchKind::Ping, 20, 1 << 20).await?;
    let alpha_ns = hist(&ping).value_at_quantile(0.5) as f64 / 2.0;
    let beta_ns_per_byte = ((hist(&big).value_at_quantile(0.5) as f64 / 2.0 - alpha_ns) / (1 << 20) as f64).max(0.0);
    let (n, r, d) = (ping.daemons, ping.radix.min(ping.daemons.saturating_sub(1)).max(1), ping.depth as f64);
    println!(
        "# DVM: {n} daemons, radix {}, depth {d}; measured alpha = {:.1} us, beta = {:.3} ns/B",
        ping.radix,
        alpha_ns / 1e3,
        beta_ns_per_byte
    );
    let r = r as f64;
    let mut rows = vec![Row {
        op: "ping".into(),
        bytes: 0,
        p50_us: hist(&ping).value_at_quantile(0.5) as f64 / 1e3,
        p99_us: hist(&ping).value_at_quantile(0.99) as f64 / 1e3,
        model_us: 2.0 * alpha_ns / 1e3,
    }];
    let barrier = bench(&mut c, BenchKind::Barrier, args.count, 0).await?;
    rows.push(Row {
        op: "barrier".into(),
        bytes: 0,
        p50_us: hist(&barrier).value_at_quantile(0.5) as f64 / 1e3,
        p99_us: hist(&barrier).value_at_quantile(0.99) as f64 / 1e3,
        model_us: 2.0 * d * alpha_ns / 1e3,
    });
    for &b in &args.modex_bytes {
        let m = bench(&mut c, BenchKind::Modex, args.count, b).await?;
        rows.push(Row {
            op: "modex".into(),
            bytes: b,
            p50_us: hist(&m).value_at_quantile(0.5) as f64 / 1e3,
            p99_us: hist(&m).value_at_quantile(0.99) as f64 / 1e3,
            // Tree allgather: 2·d·α + (1 + d·r)·D·β, D = total bytes gathered.
            model_us: (2.0 * d * alpha_ns + (1.0 + d * r) * (b as f64 * n as f64) * beta_ns_per_byte) / 1e3,
        });
    }
    for &b in &args.xcast_bytes {
        let x = bench(&mut c, BenchKind::Xcast, args.count.min(100), b).await?;
        rows.push(Row {
            op: "xcast".into(),
            bytes: b,
            p50_us: hist(&x).value_at_quantile(0.5) as f64 / 1e3,
            p99_us: hist(&x).value_at_quantile(0.99) as f64 / 1e3,
            // Completion at the origin: down d·α + d·r·M·β, then the ACK rollup d·α.
            model_us: (2.0 * d * alpha_ns + d * r * b as f64 * beta_ns_per_byte) / 1e3,
        });
    }
    println!("{:<8} {:>9} {:>11} {:>11} {:>11} {:>7}", "op", "bytes", "p50_us", "p99_us", "model_us", "ratio");
    for row in &rows {
        println!(
            "{:<8} {:>9} {:>11.1} {:>11.1} {:>11.1} {:>7.2}",
            row.op,
            row.bytes,
            row.p50_us,
            row.p99_us,
            row.model_us,
            row.p50_us / row.model_us
        );
    }
    let barrier_p50 = rows[1].p50_us;
    if let Some(m64) = rows.iter().find(|r| r.op == "modex" && r.bytes == 64) {
        println!("# modex 64 B / barrier (p50) = {:.2}", m64.p50_us / barrier_p50);
    }
    if let Some(path) = args.csv {
        let mut f = std::fs::File::create(&path).with_context(|| format!("--csv {path}"))?;
        writeln!(f, "op,bytes,daemons,radix,depth,alpha_us,beta_ns_per_byte,p50_us,p99_us,model_us,ratio")?;
        for row in &rows {
            writeln!(
                f,
                "{},{},{},{},{},{:.2},{:.4},{:.1},{:.1},{:.1},{:.3}",
                row.op,
                row.bytes,
                n,
                ping.radix,
                d,
                alpha_ns / 1e3,
                beta_ns_per_byte,
                row.p50_us,
                row.p99_us,
                row.model_us,
                row.p50_us / row.model_us
            )?;
        }
    }
    Ok(())
}

/// One line of the A/B table: p50 per run of each arm, and the paired ratio per ABBA group.
struct Pair {
    op: &'static str,
    bytes: u64,
    tree: &'static str,
    lateral: &'static str,
    tree_us: Vec<f64>,
    lateral_us: Vec<f64>,
    auto_us: Vec<f64>,
    /// lateral / tree, per group.
    ratios: Vec<f64>,
    /// auto / the faster of tree and lateral, per group.
    auto_ratios: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn p50_us(r: &BenchReply) -> f64 {
    hist(r).value_at_quantile(0.5) as f64 / 1e3
}

/// `--compare-movements`: for the barrier, each modex size and each xcast size, run the tree
/// movement (A), the lateral one (B) and `auto` (C) as A B C C B A, `reps` times, on the same
/// DVM; print each arm's median p50, the median (min–max) of the paired ratios B/A, and of
/// auto over the faster of A and B in the same group.
async fn compare_movements(c: &mut Client, args: &Args, reps: u32) -> Result<()> {
    let mut cases: Vec<(&'static str, BenchKind, u64, &'static str, &'static str)> =
        vec![("barrier", BenchKind::Barrier, 0, "tree", "allgather")];
    cases.extend(args.modex_bytes.iter().map(|&b| ("modex", BenchKind::Modex, b, "tree", "allgather")));
    cases.extend(args.xcast_bytes.iter().map(|&b| ("xcast", BenchKind::Xcast, b, "tree", "bulk")));
    let mut pairs = Vec::new();
    let mut daemons = 0;
    for (op, kind, bytes, tree, lateral) in cases {
        let count = if kind == BenchKind::Xcast { args.count.min(100) } else { args.count };
        let mut p = Pair {
            op,
            bytes,
            tree,
            lateral,
            tree_us: Vec::new(),
            lateral_us: Vec::new(),
            auto_us: Vec::new(),
            ratios: Vec::new(),
            auto_ratios: Vec::new(),
        };
        for _ in 0..reps {
            let (mut t, mut l, mut a) = (0.0, 0.0, 0.0);
            for arm in [tree, lateral, "auto", "auto", lateral, tree] {
                let r = bench_on(c, kind, count, bytes, arm).await?;
                daemons = r.daemons;
                let us = p50_us(&r);
                match arm {
                    "auto" => {
                        p.auto_us.push(us);
                        a += us;
                    }
                    x if x == tree => {
                        p.tree_us.push(us);
                        t += us;
                    }
                    _ => {
                        p.lateral_us.push(us);
                        l += us;
                    }
                }
            }
            p.ratios.push(l / t);
            p.auto_ratios.push(a / t.min(l));
        }
        pairs.push(p);
    }
    let span = |v: &[f64]| {
        let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(a, b), &r| (a.min(r), b.max(r)));
        format!("{lo:.2}-{hi:.2}")
    };
    println!(
        "# {daemons} daemons; {reps} ABCCBA groups per row; ratio = lateral / tree, auto/best = auto / the faster of \
         the two, paired per group"
    );
    println!(
        "{:<8} {:>9} {:>10} {:>12} {:>10} {:>12} {:>12} {:>8} {:>11} {:>9} {:>11}",
        "op",
        "bytes",
        "tree",
        "tree_p50_us",
        "lateral",
        "lat_p50_us",
        "auto_p50_us",
        "ratio",
        "ratio_range",
        "auto/best",
        "auto_range"
    );
    for p in &pairs {
        println!(
            "{:<8} {:>9} {:>10} {:>12.1} {:>10} {:>12.1} {:>12.1} {:>8.2} {:>11} {:>9.2} {:>11}",
            p.op,
            p.bytes,
            p.tree,
            median(&p.tree_us),
            p.lateral,
            median(&p.lateral_us),
            median(&p.auto_us),
            median(&p.ratios),
            span(&p.ratios),
            median(&p.auto_ratios),
            span(&p.auto_ratios),
        );
    }
    if let Some(path) = &args.csv {
        let mut f = std::fs::File::create(path).with_context(|| format!("--csv {path}"))?;
        writeln!(f, "op,bytes,daemons,group,tree,tree_p50_us,lateral,lateral_p50_us,ratio,auto_p50_us,auto_vs_best")?;
        for p in &pairs {
            for (g, r) in p.ratios.iter().enumerate() {
                let t = (p.tree_us[2 * g] + p.tree_us[2 * g + 1]) / 2.0;
                let l = (p.lateral_us[2 * g] + p.lateral_us[2 * g + 1]) / 2.0;
                let a = (p.auto_us[2 * g] + p.auto_us[2 * g + 1]) / 2.0;
                let ab = p.auto_ratios[g];
                writeln!(
                    f,
                    "{},{},{daemons},{g},{},{t:.1},{},{l:.1},{r:.3},{a:.1},{ab:.3}",
                    p.op, p.bytes, p.tree, p.lateral
                )?;
            }
        }
    }
    Ok(())
}
