//! `prun`: run a job on a DVM (a running one, or a transient one started for this job with
//! `--local N`, `--hostfile F` or `--host list`, like `prterun`/`mpirun`). Exit status: 0, or
//! the first failing process's status (signal death = 128 + signo); 128 + signo when SIGINT or
//! SIGTERM reached prun before the job ended successfully; 141 when prun's stdout was closed;
//! 125 when the DVM failed under the job; 1 when prun could not run the job.
//!
//! This file chooses the DVM and runs the job on it; `prun/`: `signals` (held, caught,
//! forwarded), `head` (the DVM's head process, a lost DVM), `one_shot` (boot and stop a
//! transient DVM), `job` (the job's stream, output and exit status), `files` (each rank's
//! output in files). None imports this file.

#[path = "prun/files.rs"]
mod files;
#[path = "prun/head.rs"]
mod head;
#[path = "prun/job.rs"]
mod job;
#[path = "prun/one_shot.rs"]
mod one_shot;
#[path = "prun/signals.rs"]
mod signals;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use dvmd::prun_cli::{self, OneShot, PrunCommand};
use dvmd::session::{self, Discovery, DvmUri};

use head::{Head, LostDvm, LOST_DVM};
use job::run_job;
use one_shot::{Boot, Transient};
use signals::{hold_signals, Signals};

fn main() -> ExitCode {
    // Hold the signals prun handles until its handlers are in place: a Ctrl-C in the first
    // milliseconds is then handled like a later one instead of killing prun mid-boot.
    hold_signals();
    dvmd::init_logging();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let cmd = match prun_cli::parse(&args, &cwd, &|k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("prun: {e}");
            return ExitCode::from(1);
        }
    };
    if cmd.help {
        print!("{}", prun_cli::USAGE);
        return ExitCode::SUCCESS;
    }
    if cmd.version {
        println!("prun (dvm) {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("prun: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cmd)) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("prun: {e:#}");
            let code = if e.downcast_ref::<LostDvm>().is_some() { LOST_DVM } else { 1 };
            ExitCode::from(code as u8)
        }
    }
}

/// Where the job runs.
enum Target {
    Attach(DvmUri),
    OneShot(OneShot),
}

/// `--local` always boots a one-shot DVM; `--dvm-uri` attaches. Otherwise prun attaches to the
/// only persistent DVM of this user, boots a one-shot DVM from `--hostfile`/`--host` when none
/// runs, and refuses to guess when several run. One-shot DVMs are private to their prun and
/// never found here, so this choice never depends on another prun's job.
fn choose_dvm(cmd: &PrunCommand) -> Result<Target> {
    if let Some(one) = &cmd.one_shot {
        return Ok(Target::OneShot(one.clone()));
    }
    if cmd.dvm_uri.is_some() {
        return Ok(Target::Attach(DvmUri::resolve(cmd.dvm_uri.as_deref())?));
    }
    match session::discover() {
        Discovery::One(uri) => Ok(Target::Attach(uri)),
        Discovery::None { root } => match cmd.one_shot_candidate(dvmd::slurm::in_job()) {
            Some(one) => Ok(Target::OneShot(one)),
            None => bail!(
                "no running DVM found under {} (start one with `dvmd --local N --daemonize`, pass --dvm-uri, \
                 or give --local N for a one-shot DVM)",
                root.display()
            ),
        },
        several @ Discovery::Several { .. } => several.into_uri().map(Target::Attach),
    }
}

async fn run(cmd: PrunCommand) -> Result<i32> {
    let mut signals = Signals::install()?;
    let mut pending = Vec::new();
    match choose_dvm(&cmd)? {
        Target::Attach(uri) => {
            let head = Head { pid: uri.hnp_pid(), uri, one_shot: false };
            match run_job(&cmd, &head, &mut signals, pending).await {
                Ok(r) => Ok(r.code),
                Err(e) => {
                    if let Some(lost) = e.downcast_ref::<LostDvm>() {
                        // A head process that died cannot remove its own session directory.
                        if lost.hnp_ended && head.pid.is_some() {
                            let _ = std::fs::remove_dir_all(&head.uri.session);
                        }
                    }
                    Err(e)
                }
            }
        }
        Target::OneShot(kind) => {
            let mut t = match Transient::start(&kind, &mut signals, &mut pending).await? {
                Boot::Ready(t) => t,
                Boot::Interrupted(sig) => return Ok(128 + sig),
            };
            let head = Head { uri: t.uri.clone(), pid: Some(t.pgid), one_shot: true };
            let result = run_job(&cmd, &head, &mut signals, pending).await;
            let r = match result {
                Ok(r) => r,
                Err(mut e) => {
                    if let Some(lost) = e.downcast_mut::<LostDvm>() {
                        lost.how = t.how_it_ended().await;
                        t.kill_all();
                    } else if let Err(stop) = t.stop(&mut signals, true).await {
                        eprintln!("prun: {stop:#}");
                    }
                    return Err(e);
                }
            };
            if r.abandon {
                t.kill_all();
                return Ok(r.code);
            }
            // The job has ended: the DVM (`--one-job`) is terminating itself. Only a plan
            // (`--launch-sizes`) launched nothing, and the DVM is asked.
            match t.stop(&mut signals, cmd.launch_sizes).await {
                Ok(None) => Ok(r.code),
                Ok(Some(sig)) => Ok(if r.code == 0 { 128 + sig } else { r.code }),
                Err(e) => {
                    eprintln!("prun: {e:#}");
                    Ok(if r.code == 0 { 1 } else { r.code })
                }
            }
        }
    }
}
