//! `pps`: list the jobs of a running DVM (queued, running, ending; `--all` also the recently
//! ended ones), or with `--nodes` its daemons and their slots, or with `--stacks ID` every
//! rank's stack trace of a running job. `--json` prints one JSON document for scripts.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use dvm_proto::control::{JobInfo, JobsReply, NodeInfo};
use dvmd::control::Client;
use dvmd::session::DvmUri;
use serde_json::json;

#[derive(Parser, Debug)]
#[command(name = "pps", about = "List the jobs (or nodes) of a running DVM")]
struct Args {
    /// Also the recently ended jobs (the DVM keeps the last 1024).
    #[arg(short, long)]
    all: bool,
    /// The nodes instead: daemon, host, slots total and in use, state, jobs, RSS.
    #[arg(long)]
    nodes: bool,
    /// Every rank's stack trace of running job JOBID instead (a debugger attached on each node).
    #[arg(long, value_name = "JOBID")]
    stacks: Option<u32>,
    /// One JSON document instead of a table.
    #[arg(long)]
    json: bool,
    /// The DVM: a dvm:// URI or file:PATH (default: the only persistent DVM of this user here).
    #[arg(long, value_name = "URI|file:F")]
    dvm_uri: Option<String>,
}

fn main() -> ExitCode {
    dvmd::tool_main("pps", run)
}

async fn run(args: Args) -> Result<()> {
    let uri = DvmUri::resolve(args.dvm_uri.as_deref())?;
    let mut client = Client::connect(uri).await?;
    let mut out = String::new();
    if let Some(jobid) = args.stacks {
        let reply = client.stack_traces(jobid).await?;
        if args.json {
            let list: Vec<_> = reply
                .stacks
                .iter()
                .map(|s| json!({ "rank": s.rank, "node": s.node, "pid": s.pid, "text": s.text }))
                .collect();
            let _ = writeln!(out, "{}", json!({ "jobid": jobid, "stacks": list, "errors": reply.errors }));
        } else {
            for s in &reply.stacks {
                let _ = writeln!(out, "rank {} on node {} (pid {}):\n{}\n", s.rank, s.node, s.pid, s.text.trim_end());
            }
            for e in &reply.errors {
                eprintln!("pps: {e}");
            }
        }
        if reply.stacks.is_empty() {
            if reply.errors.is_empty() {
                anyhow::bail!("no stack traces of job {jobid}: no process of it runs any more");
            }
            anyhow::bail!("no stack traces of job {jobid}");
        }
        emit(&out);
        return Ok(());
    }
    let reply = client.jobs(args.nodes).await?;
    if args.nodes {
        // Each daemon's RSS, as it reports it up the tree.
        let views = client.tree_views().await.map(|v| v.views).unwrap_or_default();
        let rss = |rank: u32| views.iter().find(|v| v.rank == rank).map(|v| v.rss_kib);
        print_nodes(&mut out, &reply.nodes, &rss, args.json);
    } else {
        print_jobs(&mut out, &reply, args.all, args.json);
    }
    emit(&out);
    Ok(())
}

/// Write the listing; a reader that went away (`pps | head -1`) ends it quietly, as for any
/// filter.
fn emit(text: &str) {
    use std::io::Write;
    let mut s = std::io::stdout().lock();
    let _ = s.write_all(text.as_bytes()).and_then(|()| s.flush());
}

fn state(j: &JobInfo) -> String {
    match j.state.as_str() {
        "ended" if j.cancelled => "cancelled".into(),
        "ended" if j.exit_code == 0 => "done".into(),
        "ended" => format!("failed({})", j.exit_code),
        "queued" => format!("queued({})", j.queue_position),
        s => s.into(),
    }
}

/// A user's name (its uid when the system has none for it).
fn user(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name)
}

fn elapsed(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{}.{:01}s", s, (ms % 1000) / 100),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn print_jobs(out: &mut String, reply: &JobsReply, all: bool, as_json: bool) {
    let jobs: Vec<&JobInfo> = reply.jobs.iter().filter(|j| all || j.state != "ended").collect();
    if as_json {
        let list: Vec<_> = jobs
            .iter()
            .map(|j| {
                json!({
                    "jobid": j.jobid, "state": j.state, "exit_code": j.exit_code, "message": j.message,
                    "nprocs": j.nprocs, "nodes": j.nodes, "elapsed_ms": j.elapsed_ms, "wait_ms": j.wait_ms,
                    "command": j.command, "uid": j.uid, "user": user(j.uid), "queue_position": j.queue_position,
                    "detached": j.detached, "array_left": j.array_left, "array": j.array, "index": j.index,
                    "cancelled": j.cancelled,
                })
            })
            .collect();
        let doc = json!({ "jobs": list, "queued_jobs": reply.queued_jobs, "max_queued": reply.max_queued });
        let _ = writeln!(out, "{doc}");
        return;
    }
    let _ = writeln!(
        out,
        "{:>6}  {:<12} {:>6}  {:<16} {:>8}  {:>8}  COMMAND",
        "JOBID", "STATE", "PROCS", "NODES", "TIME", "USER"
    );
    for j in jobs {
        let mut nodes = j.nodes.join(",");
        if nodes.len() > 16 {
            nodes = format!("{} nodes", j.nodes.len());
        }
        let mut cmd = j.command.clone();
        if j.array_left > 0 {
            cmd = format!("[array, {} left] {cmd}", j.array_left);
        }
        if j.array != 0 {
            cmd = format!("[array {} index {}] {cmd}", j.array, j.index);
        }
        if j.detached {
            cmd = format!("[detached] {cmd}");
        }
        let _ = writeln!(
            out,
            "{:>6}  {:<12} {:>6}  {:<16} {:>8}  {:>8}  {cmd}",
            j.jobid,
            state(j),
            j.nprocs,
            if nodes.is_empty() { "-".into() } else { nodes },
            elapsed(j.elapsed_ms),
            user(j.uid)
        );
    }
}

fn print_nodes(out: &mut String, nodes: &[NodeInfo], rss: &dyn Fn(u32) -> Option<u64>, as_json: bool) {
    if as_json {
        let list: Vec<_> = nodes
            .iter()
            .map(|n| {
                json!({
                    "rank": n.rank, "host": n.host, "slots": n.slots, "used": n.used,
                    "state": if n.alive { "up" } else { "lost" }, "jobs": n.jobs, "rss_kib": rss(n.rank),
                })
            })
            .collect();
        let _ = writeln!(out, "{}", json!({ "nodes": list }));
        return;
    }
    let _ = writeln!(
        out,
        "{:>6}  {:<20} {:>5} {:>5}  {:<5} {:>9}  JOBS",
        "DAEMON", "HOST", "SLOTS", "USED", "STATE", "RSS"
    );
    for n in nodes {
        let jobs: Vec<String> = n.jobs.iter().map(u32::to_string).collect();
        let rss = rss(n.rank).map_or("-".into(), |k| format!("{:.1}M", k as f64 / 1024.0));
        let _ = writeln!(
            out,
            "{:>6}  {:<20} {:>5} {:>5}  {:<5} {:>9}  {}",
            n.rank,
            n.host,
            n.slots,
            n.used,
            if n.alive { "up" } else { "lost" },
            rss,
            if jobs.is_empty() { "-".into() } else { jobs.join(",") }
        );
    }
}
