//! `pcancel`: cancel jobs of a running DVM. A queued job leaves the queue; a running one gets
//! SIGTERM, then SIGKILL after a grace; an array goes with its running elements. Exit status 0
//! only when every job named was cancelled.

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Parser;
use dvm_proto::control::CancelRequest;
use dvmd::control::Client;
use dvmd::session::DvmUri;

#[derive(Parser, Debug)]
#[command(name = "pcancel", about = "Cancel jobs of a running DVM (queued or running)")]
struct Args {
    /// Job ids (as prun, pps or prun --detach print them).
    #[arg(value_name = "JOBID")]
    jobids: Vec<u32>,
    /// Every job of yours, queued or running.
    #[arg(long)]
    all: bool,
    /// The DVM: a dvm:// URI or file:PATH (default: the only persistent DVM of this user here).
    #[arg(long, value_name = "URI|file:F")]
    dvm_uri: Option<String>,
}

fn main() -> ExitCode {
    dvmd::tool_main("pcancel", run)
}

async fn run(args: Args) -> Result<()> {
    if args.jobids.is_empty() && !args.all {
        bail!("name the jobs to cancel (pcancel JOBID...), or give --all for every job of yours");
    }
    let uri = DvmUri::resolve(args.dvm_uri.as_deref())?;
    let mut client = Client::connect(uri).await?;
    let uid = dvmd::control::uid();
    let reply = client.cancel(CancelRequest { jobids: args.jobids, all: args.all, uid }).await?;
    for e in &reply.errors {
        eprintln!("pcancel: {e}");
    }
    if !reply.errors.is_empty() {
        bail!("{} of the jobs named could not be cancelled", reply.errors.len());
    }
    Ok(())
}
