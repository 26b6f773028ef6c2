//! Liveness of one proc: noticing its exit, reaping it, and signalling its process group
//! without ever hitting a recycled pid.
//!
//! The exit is noticed through a pidfd (waitid with WNOWAIT confirms it) and the proc is left a
//! zombie until its output streams are closed. While the zombie exists the kernel cannot reuse
//! its pid, so its process-group id still names only our group: a `kill_job` in that window
//! still reaches any grandchild holding the output pipes open. Signals and the reap take the
//! same lock, and no signal is sent once the proc is reaped.
//! Trap: the reap never blocks (`WNOHANG`, retried from the task). A blocking `waitpid` held
//! that lock, and a tokio worker, until the proc could be reaped; a proc seen ended by its
//! pidfd and `waitid(WNOWAIT)` could still take tens of seconds to become reapable on a
//! loaded machine, and the daemon's loop then waited in `kill_job` for the lock (steps of
//! 8-10 s, heartbeats missed, the daemon declared lost).

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

    /// Reap the proc once it has ended and report how it ended. From here on it is never
    /// signalled. Never blocks a thread: the proc is reaped with `WNOHANG`, the lock held only
    /// for that call, and while it cannot be reaped yet the task waits (a proc noticed ended
    /// may still take a while to become reapable: its other threads are still exiting, and on
    /// a busy machine a SCHED_IDLE proc's exit can take seconds).
    pub async fn reap(&self) -> ExitKind {
        self.exited().await;
        let mut pause = REAP_POLL_MIN;
        loop {
            if let Some(kind) = self.try_reap() {
                return kind;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(REAP_POLL_MAX);
        }
    }

    /// Reap the proc if it can be reaped now (`WNOHANG`); None while it still runs.
    pub fn try_reap(&self) -> Option<ExitKind> {
        let mut reaped = self.reaped.lock().unwrap_or_else(|p| p.into_inner());
        assert!(!*reaped, "proc {} reaped twice", self.pid);
        let kind = loop {
            match waitpid(Pid::from_raw(self.pid), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => break ExitKind::Code(code),
                Ok(WaitStatus::Signaled(_, sig, _)) => break ExitKind::Signal(sig as i32),
                // Not reapable yet (StillAlive; no other state is asked for).
                Ok(_) => return None,
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
        Some(kind)
    }
}

/// How often a proc noticed ended but not yet reapable is tried again: from this...
const REAP_POLL_MIN: std::time::Duration = std::time::Duration::from_millis(1);
/// ...doubling up to this.
const REAP_POLL_MAX: std::time::Duration = std::time::Duration::from_millis(100);

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

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    use super::{ExitKind, Life};

    /// A child in its own process group, as odls starts procs. `Life` reaps it (the tests
    /// check that), so the `Child` handle is never waited on.
    fn child(cmd: &str, args: &[&str]) -> std::process::Child {
        Command::new(cmd).args(args).stdin(Stdio::piped()).process_group(0).spawn().expect("spawn")
    }

    /// The reap never waits for a proc that still runs (a blocking one held the lock that
    /// `kill_job` needs, and a runtime thread, for as long as the proc took to end).
    #[tokio::test]
    #[allow(clippy::zombie_processes)]
    async fn reaping_a_running_proc_answers_at_once_and_signals_still_reach_it() {
        // `cat` ends only when its stdin closes or it is killed: alive for as long as we say.
        let mut c = child("cat", &[]);
        let life = std::sync::Arc::new(Life::new(c.id() as i32));
        assert!(life.try_reap().is_none(), "a running proc is not reaped");
        assert!(life.is_live());
        let reaper = {
            let life = life.clone();
            tokio::spawn(async move { life.reap().await })
        };
        tokio::task::yield_now().await;
        // With the reap pending, a signal is still delivered (it takes the same lock).
        assert!(life.signal_group(libc::SIGKILL), "the signal reached the running proc");
        assert_eq!(reaper.await.unwrap(), ExitKind::Signal(libc::SIGKILL));
        assert!(!life.is_live());
        assert!(!life.signal_group(libc::SIGKILL), "never signalled once reaped");
        drop(c.stdin.take());
    }

    #[tokio::test]
    #[allow(clippy::zombie_processes)]
    async fn a_proc_that_ends_by_itself_is_reaped_with_its_code() {
        let mut c = child("sh", &["-c", "read x; exit 7"]);
        let life = Life::new(c.id() as i32);
        assert!(life.try_reap().is_none());
        drop(c.stdin.take());
        assert_eq!(life.reap().await, ExitKind::Code(7));
    }
}
