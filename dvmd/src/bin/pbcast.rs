//! `pbcast`: copy a file or a directory tree from the HNP's node to a path on every node of a
//! running DVM (or on the nodes of a hostfile or host list), on the DVM's bulk broadcast. In
//! the line of Slurm's `sbcast`. All or nothing: a failure on any node removes the copy
//! everywhere and names the node and path.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use dvm_proto::control::{StageFile, StageRequest};
use dvmd::control::Client;
use dvmd::session::DvmUri;

#[derive(Parser, Debug)]
#[command(
    name = "pbcast",
    about = "Copy a file or directory tree to every node of a running DVM",
    after_help = "DEST is an absolute path on each node; in it %n stands for the daemon's rank and %h for \
its host (useful when nodes share a filesystem). A directory SOURCE is copied with its tree under \
DEST (its regular files; empty directories and links are left out). SOURCE is read on the HNP's node."
)]
struct Args {
    /// The file or directory to copy (on the HNP's node).
    source: PathBuf,
    /// Where it lands on each node (absolute).
    dest: String,
    /// Only the nodes on these hosts (comma-separated).
    #[arg(short = 'H', long = "host", value_name = "a,b,c")]
    host: Option<String>,
    /// Only the nodes listed in this hostfile (lines 'name [slots=N]').
    #[arg(long, value_name = "FILE", conflicts_with = "host")]
    hostfile: Option<PathBuf>,
    /// Deflate each segment on the way (worth it for text, not for binaries).
    #[arg(short = 'C', long)]
    compress: bool,
    /// Segment size in KiB (64 to 65536; default 1024).
    #[arg(long, value_name = "KIB")]
    segment_kib: Option<u32>,
    /// Segments in flight at once (1 to 64, at most 256 MiB with the segments; default 8).
    #[arg(long, value_name = "N")]
    window: Option<u32>,
    /// The DVM: a dvm:// URI or file:PATH (default: the only persistent DVM of this user here).
    #[arg(long, value_name = "URI|file:F")]
    dvm_uri: Option<String>,
    /// Print nothing on success.
    #[arg(short, long)]
    quiet: bool,
}

fn main() -> ExitCode {
    dvmd::tool_main("pbcast", run)
}

/// Every regular file under `dir`, with its path relative to it, in a stable order.
fn tree(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let here = dir.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&here)
            .with_context(|| format!("cannot read the directory {}", here.display()))?
            .collect::<std::io::Result<_>>()
            .with_context(|| format!("cannot read the directory {}", here.display()))?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let ty = e.file_type()?;
            let r = rel.join(e.file_name());
            if ty.is_dir() {
                stack.push(r);
            } else if ty.is_file() {
                out.push(r);
            }
        }
    }
    out.sort();
    Ok(out)
}

async fn run(args: Args) -> Result<()> {
    let cwd = std::env::current_dir().context("cannot read the working directory")?;
    let source = cwd.join(&args.source);
    if !args.dest.starts_with('/') {
        bail!("DEST '{}' must be an absolute path (it is a path on every node)", args.dest);
    }
    let meta = match std::fs::metadata(&source) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("{}: no such file or directory", source.display()),
        Err(e) => bail!("{}: {e}", source.display()),
    };
    let text = |p: &Path| p.to_str().map(str::to_string).with_context(|| format!("{} is not UTF-8", p.display()));
    let files: Vec<StageFile> = if meta.is_dir() {
        let dest = args.dest.trim_end_matches('/');
        let list = tree(&source)?;
        if list.is_empty() {
            bail!("{} holds no regular file to copy", source.display());
        }
        list.iter()
            .map(|r| Ok(StageFile { src: text(&source.join(r))?, dest: format!("{dest}/{}", text(r)?) }))
            .collect::<Result<_>>()?
    } else {
        // A destination ending in '/' is a directory: the file keeps its name there.
        let dest = match (args.dest.ends_with('/'), source.file_name()) {
            (true, Some(name)) => format!("{}{}", args.dest, name.to_string_lossy()),
            _ => args.dest.clone(),
        };
        vec![StageFile { src: text(&source)?, dest }]
    };
    let hosts = match (&args.host, &args.hostfile) {
        (Some(h), _) => {
            h.split(',').filter(|s| !s.is_empty()).map(|s| s.split(':').next().unwrap_or(s).to_string()).collect()
        }
        (None, Some(f)) => dvmd::hostfile::read(&cwd.join(f))?.into_iter().map(|h| h.name).collect(),
        (None, None) => Vec::new(),
    };
    let uri = DvmUri::resolve(args.dvm_uri.as_deref())?;
    let mut client = Client::connect(uri).await?;
    let n = files.len();
    let req = StageRequest {
        files,
        hosts,
        compress: args.compress,
        segment_kib: args.segment_kib.unwrap_or(0),
        window: args.window.unwrap_or(0),
        uid: dvmd::control::uid(),
    };
    let reply = client.stage(req).await?;
    if !reply.ok {
        bail!("{}", reply.error);
    }
    if !args.quiet {
        let secs = reply.elapsed_us as f64 / 1e6;
        let mib = reply.bytes as f64 / (1 << 20) as f64;
        let rate = if secs > 0.0 { format!(", {:.1} MiB/s to each node", mib / secs) } else { String::new() };
        let wire = if reply.wire_bytes != reply.bytes {
            format!(" ({:.1} MiB on the wire)", reply.wire_bytes as f64 / (1 << 20) as f64)
        } else {
            String::new()
        };
        eprintln!(
            "pbcast: {n} file{} ({mib:.1} MiB{wire}) on {} node{} in {secs:.2} s{rate}",
            if n == 1 { "" } else { "s" },
            reply.nodes,
            if reply.nodes == 1 { "" } else { "s" },
        );
    }
    Ok(())
}
