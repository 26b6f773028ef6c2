//! dvmd: the DVM daemon's shell and the tools.
//!
//! Owns: booting a DVM (local daemons or through a launch agent), the per-daemon shell that
//! carries out what the sans-IO daemon (`dvm_core::Node`, re-exported as [`core`]) decides,
//! over the `rml` transport: processes and their output (`odls`), the PMIx server in a worker
//! process per daemon (`pmix`, reached by the node through `host`), prun streams and control
//! replies by token, the HNP's control API (tonic), session directories, and the tools `prun`,
//! `pterm` and `dvm-bench`.
//!
//! Where to look: an input enters in `daemon::Daemon::run` (one `select!`) and is handed to
//! the node's `handle_*`; effects leave in `daemon::Daemon::drain`, the one place the node's
//! `poll_transmit` and `poll` are drained, in order. docs/architecture.md has the table.
//!
//! Never: a decision about jobs, routing, losses or collectives (they live in `dvm_core` and
//! `grpcomm`). The actor never blocks for long: every input is an event on its loop, and PMIx
//! upcalls are answered from it, never inside libpmix's thread.
//! Traps: the DVM secret travels on a daemon's stdin, never on a command line; every daemon
//! keeps its check-in connection to the HNP open, which is how it notices the HNP is gone and
//! how its reports reach the HNP when a relay dies; deregistering PMIx clients one by one
//! raced with the next job's connections (a rank hung in PMIx_Init about 1 job in 20), so only
//! whole namespaces are deregistered.
pub use dvm_core as core;
pub use dvm_core::{dataserver, jobmap, jobs};
pub mod control;
pub mod daemon;
mod forwarder;
pub(crate) mod host;
pub mod hostfile;
pub mod hwtopo;
pub mod launch;
pub mod loopmeter;
pub mod odls;
pub mod pmix;
pub mod prun_cli;
pub mod session;
pub mod slurm;
pub mod stage;
pub mod sys;

/// Print one line to stderr, never panicking: a daemon's stderr is a pipe to its HNP, which
/// may be gone (`eprintln!` panics on a closed pipe, and a panicking daemon can hang on exit).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// stderr for log lines, swallowing write errors: when the HNP that reads a daemon's stderr
/// is gone, a failed write must not panic (tracing's fallback `eprintln!` would, inside
/// whatever task logged — a transport task that then never reports the lost HNP).
struct QuietStderr;

impl std::io::Write for QuietStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Initialise logging to stderr; `DVM_LOG` (or `RUST_LOG`) sets the filter, default `warn`.
pub fn init_logging() {
    let filter = std::env::var("DVM_LOG").or_else(|_| std::env::var("RUST_LOG")).unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(|| QuietStderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Entry point shared by the tools: parse the command line (usage errors exit 1), run `body`
/// on a single-threaded runtime, print an error as `name: message` and exit 1.
pub fn tool_main<A, F>(name: &str, body: impl FnOnce(A) -> F) -> std::process::ExitCode
where
    A: clap::Parser,
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    init_logging();
    let args = match A::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { std::process::ExitCode::from(1) } else { std::process::ExitCode::SUCCESS };
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    match rt.block_on(body(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
