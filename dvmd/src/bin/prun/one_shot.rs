//! The one-shot DVM: booting a transient DVM private to this prun (`--local`, `--hostfile`,
//! `--host`, Slurm), stopping it after the job, and killing its process group when it fails.
//!
//! Never runs the job itself (that is `job`). Do not break: nothing of the transient DVM
//! outlives prun: an orderly stop is bounded by [`STOP_WAIT`], then the group is killed, and
//! dropping a `Transient` kills it too.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dvmd::control::Client;
use dvmd::prun_cli::OneShot;
use dvmd::session::{self, DvmUri};
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::signals::{ends_job, Signals};

/// How long an orderly stop of a one-shot DVM may take before it is killed.
pub(super) const STOP_WAIT: Duration = Duration::from_secs(15);

/// A one-shot DVM being booted.
pub(super) enum Boot {
    Ready(Box<Transient>),
    /// SIGINT/SIGTERM came during the boot; the DVM is gone.
    Interrupted(i32),
}

/// A DVM started for this job only (`dvmd --private`: no other command discovers it). It runs
/// in its own process group, so a Ctrl-C at the terminal reaches prun alone and prun decides how
/// the job and the DVM end; the kernel kills its head process if prun dies first (its daemons
/// follow when they lose it). Until stopped in order, dropping it kills every process of it.
pub(super) struct Transient {
    pub(super) child: tokio::process::Child,
    /// The head process's pid, which is also the process group of every daemon it started here.
    pub(super) pgid: u32,
    pub(super) uri: DvmUri,
    pub(super) ended: bool,
}

impl Transient {
    pub(super) async fn start(kind: &OneShot, signals: &mut Signals, pending: &mut Vec<i32>) -> Result<Boot> {
        let exe = std::env::current_exe().context("cannot find prun's own path")?;
        let dvmd = exe.with_file_name("dvmd");
        let mut cmd = tokio::process::Command::new(&dvmd);
        match kind {
            OneShot::Local { daemons, slots } => {
                cmd.arg("--local").arg(daemons.to_string());
                if let Some(s) = slots {
                    cmd.arg("--slots").arg(s.to_string());
                }
            }
            OneShot::Hostfile(f) => {
                cmd.arg("--hostfile").arg(f);
            }
            OneShot::Hosts(h) => {
                cmd.arg("--host").arg(h);
            }
            // dvmd reads the allocation from the environment it inherits.
            OneShot::Slurm => {}
        }
        // A job is coming at once: PMIx servers start during the boot, not with the job. The
        // DVM ends itself when that job has ended.
        cmd.arg("--pmix-start").arg("eager").arg("--private").arg("--one-job");
        // Nor should a link probe share the links with the job.
        cmd.arg("--no-link-probe");
        // Extra dvmd options for one-shot DVMs (e.g. "--radix 2 --launch-agent ...").
        if let Ok(extra) = std::env::var("PRUN_DVMD_ARGS") {
            cmd.args(shell_words(&extra));
        }
        cmd.arg("--report-uri").arg("-").stdin(Stdio::null()).stdout(Stdio::piped()).kill_on_drop(true);
        cmd.process_group(0);
        let prun_pid = nix::unistd::getpid();
        // SAFETY: prctl and getppid are async-signal-safe; called between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if nix::unistd::getppid() != prun_pid {
                    return Err(std::io::Error::other("prun ended while starting dvmd"));
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().with_context(|| format!("cannot start {}", dvmd.display()))?;
        let Some(pgid) = child.id() else { bail!("{} ended as soon as it started", dvmd.display()) };
        let stdout = child.stdout.take().context("dvmd's stdout")?;
        let placeholder = DvmUri { control: ([127, 0, 0, 1], 0).into(), session: PathBuf::new() };
        let mut t = Transient { child, pgid, uri: placeholder, ended: false };
        let mut lines = BufReader::new(stdout).lines();
        let mut uri = None;
        loop {
            tokio::select! {
                line = lines.next_line() => match line.context("cannot read from the transient DVM")? {
                    Some(l) if l.starts_with("dvm://") => uri = Some(DvmUri::parse(&l)?),
                    Some(l) if l == "DVM ready" => break,
                    Some(_) => {}
                    None => {
                        let st = t.child.wait().await?;
                        t.ended = true;
                        t.kill_all();
                        bail!("the transient DVM failed to start ({st})");
                    }
                },
                sig = signals.next() => {
                    if ends_job(sig) {
                        t.kill_all();
                        return Ok(Boot::Interrupted(sig));
                    }
                    pending.push(sig);
                }
            }
        }
        let Some(uri) = uri else { bail!("the transient DVM said it was ready without reporting its URI") };
        t.uri = uri;
        // Keep draining dvmd's stdout.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Boot::Ready(Box::new(t)))
    }

    /// Wait until the DVM has ended in order: asked to terminate, like pterm (`ask`), or
    /// terminating itself because its job ended. A SIGINT/SIGTERM meanwhile, or a DVM that has
    /// not stopped within [`STOP_WAIT`], kills it instead. Returns the signal that came, if any.
    pub(super) async fn stop(&mut self, signals: &mut Signals, ask: bool) -> Result<Option<i32>> {
        enum Stop {
            Done(std::result::Result<Result<std::process::ExitStatus>, tokio::time::error::Elapsed>),
            Signal(i32),
        }
        let stop = {
            let uri = self.uri.clone();
            let child = &mut self.child;
            let orderly = async move {
                if ask {
                    let mut client = Client::connect(uri).await?;
                    client.terminate().await?;
                }
                Ok(child.wait().await?)
            };
            tokio::select! {
                r = tokio::time::timeout(STOP_WAIT, orderly) => Stop::Done(r),
                sig = signals.next_ending() => Stop::Signal(sig),
            }
        };
        match stop {
            Stop::Done(Ok(Ok(st))) => {
                self.ended = true;
                if !st.success() {
                    bail!("the transient DVM ended with {st}");
                }
                Ok(signals.ending_now().await)
            }
            Stop::Done(Ok(Err(e))) => {
                self.kill_all();
                Err(e.context("cannot stop the transient DVM in order; killed it"))
            }
            Stop::Done(Err(_)) => {
                self.kill_all();
                bail!("the transient DVM did not stop within {} s; killed it", STOP_WAIT.as_secs())
            }
            Stop::Signal(sig) => {
                self.kill_all();
                Ok(Some(sig))
            }
        }
    }

    /// How the head process ended, if it has (waiting up to 2 s: its main thread shows as a
    /// zombie while its other threads still exit).
    pub(super) async fn how_it_ended(&mut self) -> Option<String> {
        let st = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await.ok()?.ok()?;
        Some(match (st.code(), st.signal()) {
            (Some(c), _) => format!("exit status {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "ended".to_string(),
        })
    }

    /// Kill every process of the DVM on this machine (its process group), wait until they are
    /// gone (at most 5 s), and remove the session directories they left.
    pub(super) fn kill_all(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.pgid as i32);
        let _ = nix::sys::signal::killpg(group, Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !group_members(self.pgid).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.try_wait();
        self.ended = true;
        session::sweep_stale();
    }
}

impl Drop for Transient {
    fn drop(&mut self) {
        if !self.ended {
            self.kill_all();
        }
    }
}

/// Live (not zombie) processes in process group `pgid`.
pub(super) fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
            let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
            fields.first().is_some_and(|state| *state != "Z") && fields.get(2) == Some(&pgid.to_string().as_str())
        })
        .collect()
}

pub(super) fn shell_words(s: &str) -> Vec<String> {
    // Simple quoting: 'single' and "double" quoted words, else whitespace-separated.
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (None, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}
