//! The worker's process: one started by exec or forked at the daemon's start (the prefork,
//! with its `Init` possibly sent ahead), killing and reaping it.
//!
//! Never talks the command protocol beyond writing a preforked worker's `Init`. Do not break:
//! [`prefork`] runs only while the process is single-threaded, and nothing this daemon forks
//! is left unreaped (a preforked worker nobody took is ended by [`discard_preforked`]).

use std::os::fd::AsRawFd;
use std::os::fd::IntoRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::sync::Mutex;

use dvm_proto::pmixworker::{self as wire, worker_cmd::Body as Cmd, WorkerCmd};
use nix::sys::signal::Signal;
use pmix_shim::ServerConfig;
use tracing::{debug, warn};

use crate::pmix::frame::write_frame;

/// A worker's process: started by exec (`dvmd --pmix-worker`), or forked at the daemon's
/// start ([`prefork`]).
pub(super) enum WorkerProc {
    Spawned(Child),
    Forked { pid: u32, status: Option<ExitStatus> },
}

impl WorkerProc {
    pub(super) fn id(&self) -> u32 {
        match self {
            WorkerProc::Spawned(c) => c.id(),
            WorkerProc::Forked { pid, .. } => *pid,
        }
    }

    pub(super) fn kill(&mut self) {
        match self {
            WorkerProc::Spawned(c) => {
                let _ = c.kill();
            }
            // Never after it was reaped: the pid may be someone else's by then.
            WorkerProc::Forked { pid, status: None } => {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid as i32), Signal::SIGKILL);
            }
            WorkerProc::Forked { .. } => {}
        }
    }

    pub(super) fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        match self {
            WorkerProc::Spawned(c) => c.try_wait(),
            WorkerProc::Forked { pid, status } => {
                if status.is_none() {
                    *status = reap(*pid, false)?;
                }
                Ok(*status)
            }
        }
    }

    pub(super) fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            WorkerProc::Spawned(c) => c.wait(),
            WorkerProc::Forked { pid, status } => {
                if status.is_none() {
                    *status = reap(*pid, true)?;
                }
                status.ok_or_else(|| std::io::Error::other("waitpid returned no status"))
            }
        }
    }
}

/// `waitpid` on one child of this process (blocking or not); its status once it has ended.
pub(super) fn reap(pid: u32, block: bool) -> std::io::Result<Option<ExitStatus>> {
    let mut raw = 0;
    loop {
        // SAFETY: waitpid on a pid this process forked and has not reaped yet.
        let r = unsafe { libc::waitpid(pid as i32, &mut raw, if block { 0 } else { libc::WNOHANG }) };
        match r {
            0 => return Ok(None),
            r if r > 0 => return Ok(Some(ExitStatus::from_raw(raw))),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// The worker forked at the daemon's start, not yet taken by [`super::Worker::spawn`].
pub(super) struct Preforked {
    pub(super) pid: u32,
    pub(super) cmd: UnixStream,
    pub(super) ev: UnixStream,
    /// The server directory of the `Init` already sent ([`init_preforked`]), if one was.
    pub(super) init: Option<PathBuf>,
}

static PREFORKED: Mutex<Option<Preforked>> = Mutex::new(None);

/// Fork the daemon's first PMIx worker now, while the process has a single thread, so that
/// worker costs a fork instead of an exec of dvmd (loading its libraries and starting it
/// again: about half of what a worker's start costs). It runs [`crate::pmix::worker::run`] on its
/// ends of two socket pairs and waits for its `Init`; `Worker::spawn` takes it. Call before
/// any thread exists (the tokio runtime, a reader thread), with SIGINT/SIGTERM still blocked
/// (the worker keeps them blocked, as one started by exec does).
pub fn prefork() -> std::io::Result<()> {
    let (cmd_ours, cmd_theirs) = UnixStream::pair()?;
    let (ev_ours, ev_theirs) = UnixStream::pair()?;
    // SAFETY: single-threaded (the caller's contract), so the child may run any code.
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        nix::unistd::ForkResult::Child => {
            drop((cmd_ours, ev_ours));
            // What the exec'd worker gets: no stdin, no stdout (the daemon's may be the pipe
            // the secret came on, or srun's); stderr shared with the daemon.
            if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
                let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
                let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
            }
            let code = crate::pmix::worker::run(cmd_theirs.into_raw_fd(), ev_theirs.into_raw_fd());
            std::process::exit(code.into())
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop((cmd_theirs, ev_theirs));
            let pid = child.as_raw() as u32;
            debug!(pid, "PMIx worker forked ahead");
            *PREFORKED.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(Preforked { pid, cmd: cmd_ours, ev: ev_ours, init: None });
            Ok(())
        }
    }
}

/// Send the preforked worker its `Init` now, so that its server starts while the daemon still
/// waits for something else (its secret, which Slurm's srun passes on only once every task of
/// the step has started). [`super::Worker::spawn`] with the same configuration then takes the worker
/// with its server starting or up and reads the `Init` reply as if it had sent it. Nothing
/// happens if no worker was forked ahead; a worker that cannot take the command is ended (the
/// first job then starts one by exec).
pub fn init_preforked(cfg: &ServerConfig) {
    let mut slot = PREFORKED.lock().unwrap_or_else(|e| e.into_inner());
    let Some(p) = slot.as_mut() else { return };
    if p.init.is_some() {
        return;
    }
    match write_frame(&mut &p.cmd, &WorkerCmd { body: Some(init_cmd(cfg)) }) {
        Ok(()) => {
            debug!(pid = p.pid, tmpdir = %cfg.tmpdir.display(), "PMIx worker told to start its server ahead");
            p.init = Some(cfg.tmpdir.clone());
        }
        Err(e) => {
            warn!(pid = p.pid, "cannot start the preforked PMIx worker's server ahead: {e}; ending it");
            drop(slot);
            discard_preforked();
        }
    }
}

/// The preforked worker for a server configured as `cfg`, if one is waiting and still alive
/// (one that ended is reaped here, one started ahead for another directory is ended).
pub(super) fn take_preforked(cfg: &ServerConfig) -> Option<Preforked> {
    let p = PREFORKED.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    if p.init.as_ref().is_some_and(|dir| *dir != cfg.tmpdir) {
        warn!(pid = p.pid, "the preforked PMIx worker was started for another directory; starting another");
        p.end();
        return None;
    }
    match reap(p.pid, false) {
        Ok(None) => Some(p),
        Ok(Some(st)) => {
            warn!(pid = p.pid, "the preforked PMIx worker ended before its first job ({st}); starting another");
            None
        }
        Err(e) => {
            warn!(pid = p.pid, "cannot check the preforked PMIx worker: {e}; starting another");
            None
        }
    }
}

/// End a preforked worker nobody took (the daemon ends without having needed a server, or
/// failed before it could): killed and reaped here, not left to whoever adopts it.
pub fn discard_preforked() {
    if let Some(p) = PREFORKED.lock().unwrap_or_else(|e| e.into_inner()).take() {
        p.end();
    }
}

impl Preforked {
    /// Kill and reap it.
    pub(super) fn end(self) {
        drop((self.cmd, self.ev));
        let mut proc = WorkerProc::Forked { pid: self.pid, status: None };
        proc.kill();
        let _ = proc.wait();
    }
}

/// The command that starts a worker's server as `cfg` says.
pub(super) fn init_cmd(cfg: &ServerConfig) -> Cmd {
    Cmd::Init(wire::Init {
        tmpdir: cfg.tmpdir.display().to_string(),
        hostname: cfg.hostname.clone().unwrap_or_default(),
        share_topology: cfg.share_topology,
        op_timeout_ms: cfg.op_timeout.as_millis() as u64,
    })
}
