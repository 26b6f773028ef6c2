//! Liveness of one proc: noticing its exit, reaping it, and signalling its process group
//! without ever hitting a recycled pid.
//!
//! The exit is noticed through a pidfd (waitid with WNOWAIT confirms it) and the proc is left a
//! zombie until its output streams are closed. While the zombie exists the kernel cannot reuse
//! its pid, so its process-group id still names only our group: a `kill_job` in that window
//! still reaches any grandchild holding the output pipes open. Signals and the reap take the
//! same lock, and no signal is sent once the proc is reaped.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Mutex;

use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error};

use super::ExitKind;

pub(super) struct Life {
    pub pid: i32,
    reaped: Mutex<bool>,
    /// Cancelled once the proc is reaped.
    pub done: CancellationToken,
}

impl Life {
    pub fn new(pid: i32) -> Life {
        Life { pid, reaped: Mutex::new(false), done: CancellationToken::new() }
    }

    pub fn is_live(&self) -> bool {
        !*self.reaped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Send `sig` to the proc's process group unless it was reaped. True if sent.
    pub fn signal_group(&self, sig: i32) -> bool {
        let reaped = self.reaped.lock().unwrap_or_else(|p| p.into_inner());
        if *reaped {
            return false;
        }
        // SAFETY: killpg on the group we created; the pid is ours until we reap it (held above).
        let rc = unsafe { libc::killpg(self.pid, sig) };
        if rc != 0 {
            // ESRCH: only the zombie leader is left. Nothing to do.
            debug!(pid = self.pid, sig, err = %io::Error::last_os_error(), "killpg failed");
        }
        rc == 0
    }

    /// Wait (without reaping) until the proc has exited.
    pub async fn exited(&self) {
        let pid = Pid::from_raw(self.pid);
        // SAFETY: the OwnedFd moves into the AsyncFd, stays open and is the fd it reports.
        let watch =
            pidfd_open(self.pid).and_then(|fd| unsafe { Ok(AsyncFd::register_with_interest(fd, Interest::READABLE)?) });
        match watch {
            Ok(fd) => {
                // A pidfd polls readable once the process has exited.
                while !has_exited(pid) {
                    match fd.readable().await {
                        Ok(mut guard) => guard.clear_ready(),
                        Err(e) => {
                            error!(pid = self.pid, "pidfd poll failed: {e}");
                            return self.exited_by_sigchld().await;
                        }
                    }
                }
            }
            Err(e) => {
                debug!(pid = self.pid, "no pidfd ({e}); watching SIGCHLD");
                self.exited_by_sigchld().await
            }
        }
    }

    /// Fallback for kernels without pidfd_open (< 5.3): recheck on every SIGCHLD.
    async fn exited_by_sigchld(&self) {
        let pid = Pid::from_raw(self.pid);
        let mut sigchld = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
            Ok(s) => s,
            Err(e) => {
                error!(pid = self.pid, "cannot watch SIGCHLD: {e}; polling");
                while !has_exited(pid) {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                return;
            }
        };
        while !has_exited(pid) {
            sigchld.recv().await;
        }
    }

    /// Reap the (exited) proc and report how it ended. From here on it is never signalled.
    pub fn reap(&self) -> ExitKind {
        let mut reaped = self.reaped.lock().unwrap_or_else(|p| p.into_inner());
        assert!(!*reaped, "proc {} reaped twice", self.pid);
        let kind = loop {
            match waitpid(Pid::from_raw(self.pid), None) {
                Ok(WaitStatus::Exited(_, code)) => break ExitKind::Code(code),
                Ok(WaitStatus::Signaled(_, sig, _)) => break ExitKind::Signal(sig as i32),
                Ok(_) => continue,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    // Someone else reaped our child (SIGCHLD ignored, or a waitpid(-1) elsewhere).
                    error!(pid = self.pid, "cannot reap proc: {e}; reporting exit code 255");
                    break ExitKind::Code(255);
                }
            }
        };
        *reaped = true;
        drop(reaped);
        self.done.cancel();
        kind
    }
}

/// True once `pid` has exited; leaves it a zombie (WNOWAIT).
fn has_exited(pid: Pid) -> bool {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(pid), flags) {
        Ok(WaitStatus::StillAlive) => false,
        Ok(_) => true,
        Err(nix::errno::Errno::EINTR) => false,
        // ECHILD: it is gone already; reap() reports that.
        Err(_) => true,
    }
}

fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd we then own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor returned by the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
