//! `pterm`: terminate a running DVM. Exit status 0 only when every daemon received TERMINATE
//! and the HNP has cleaned up its session directory.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;
use dvmd::control::Client;
use dvmd::session::DvmUri;

#[derive(Parser, Debug)]
#[command(name = "pterm", about = "Terminate a running DVM")]
struct Args {
    /// The DVM: a dvm:// URI or file:PATH (default: the only persistent DVM of this user here).
    #[arg(long, value_name = "URI|file:F")]
    dvm_uri: Option<String>,
    /// Seconds to wait for the DVM to finish cleaning up.
    #[arg(long, default_value_t = 15.0)]
    timeout: f64,
}

fn main() -> ExitCode {
    dvmd::tool_main("pterm", run)
}

async fn run(args: Args) -> Result<()> {
    let uri = DvmUri::resolve(args.dvm_uri.as_deref())?;
    let mut client = Client::connect(uri.clone()).await?;
    let reply = client.terminate().await?;
    if !reply.ok {
        bail!("the DVM refused to terminate: {}", reply.message);
    }
    // The HNP removes its session directory last.
    let deadline = Instant::now() + Duration::from_secs_f64(args.timeout);
    while uri.session.exists() {
        if Instant::now() > deadline {
            bail!("the DVM acknowledged TERMINATE but {} still exists after {}s", uri.session.display(), args.timeout);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
