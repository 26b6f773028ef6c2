//! Process helpers for tests that run real daemons: a child that dies with its guard, a
//! line reader with a deadline, and `/proc` scans for leftovers.

use std::collections::VecDeque;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdout, Command, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::cmd::netns_pids;
use crate::{io_err, HarnessError, Result};

/// A child process that is SIGKILLed (with its whole process group, if it leads one) and
/// reaped when the guard drops, so a failing test leaves nothing running.
///
/// Reap it only through the guard ([`ChildGuard::wait_timeout`]): the guard signals the
/// group while the leader is still a zombie, when its PID cannot have been reused.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    own_group: bool,
    status: Option<ExitStatus>,
}

impl ChildGuard {
    /// Spawns `cmd` as the leader of a new process group, so that dropping the guard also
    /// kills whatever the child started.
    pub fn spawn(cmd: &mut Command) -> Result<ChildGuard> {
        let child = cmd.process_group(0).spawn().map_err(io_err(format!("spawning {cmd:?}")))?;
        Ok(ChildGuard { child, own_group: true, status: None })
    }

    /// Guards a child spawned elsewhere. Set `own_group` only if it was spawned with
    /// `process_group(0)`; otherwise only the child itself is killed.
    pub fn adopt(child: Child, own_group: bool) -> ChildGuard {
        ChildGuard { child, own_group, status: None }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's stdout, if it was piped and not taken yet.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// The underlying child, for its stdin/stderr. Do not wait on it directly.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Waits up to `timeout` for the child to exit; `None` if it is still running. When it
    /// has exited, the rest of its process group (if it leads one) is killed before reaping.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_reap()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn try_reap(&mut self) -> Result<Option<ExitStatus>> {
        if self.status.is_some() {
            return Ok(self.status);
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let peek = waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT);
        match peek {
            Ok(WaitStatus::StillAlive) => return Ok(None),
            Ok(_) => {
                // Exited but not reaped: the PID (and group id) are still ours.
                if self.own_group {
                    let _ = killpg(pid, Signal::SIGKILL);
                }
            }
            Err(e) => return Err(HarnessError::Io { context: format!("waitid on child {pid}"), source: e.into() }),
        }
        self.status = self.child.try_wait().map_err(io_err(format!("reaping child {pid}")))?;
        Ok(self.status)
    }

    /// Kills the child (and its group) now and reaps it; returns its exit status.
    pub fn kill(&mut self) -> Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        if self.own_group {
            let _ = killpg(pid, Signal::SIGKILL);
        }
        let _ = kill(pid, Signal::SIGKILL);
        let status = self.child.wait().map_err(io_err(format!("reaping child {pid}")))?;
        self.status = Some(status);
        Ok(status)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Err(e) = self.kill() {
            eprintln!("dvm-tests: killing child {}: {e}", self.child.id());
        }
    }
}

/// Lines of a child's output, read on a background thread so that waiting can time out and
/// the child never blocks on a full pipe.
#[derive(Debug)]
pub struct LineReader {
    lines: Receiver<String>,
    tail: VecDeque<String>,
    ended: bool,
}

const TAIL_LINES: usize = 20;

impl LineReader {
    pub fn new<R: Read + Send + 'static>(reader: R) -> LineReader {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(reader);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf);
                        if tx.send(line.trim_end_matches(['\n', '\r']).to_string()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        LineReader { lines: rx, tail: VecDeque::new(), ended: false }
    }

    /// The next line, or `None` at end of stream; an error if none arrives within `timeout`.
    pub fn next_line(&mut self, timeout: Duration) -> Result<Option<String>> {
        self.wait_for(|_| true, "<any line>", timeout).map(Some).or_else(|e| match e {
            HarnessError::LineEof { .. } => Ok(None),
            e => Err(e),
        })
    }

    /// Reads until a line containing `pattern` arrives and returns that line. Fails when
    /// `timeout` passes or the stream ends first; the error carries the last lines seen.
    pub fn wait_for_line(&mut self, pattern: &str, timeout: Duration) -> Result<String> {
        self.wait_for(|l| l.contains(pattern), pattern, timeout)
    }

    fn wait_for(&mut self, matches: impl Fn(&str) -> bool, pattern: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let received = if self.ended { Err(RecvTimeoutError::Disconnected) } else { self.lines.recv_timeout(left) };
            match received {
                Ok(line) => {
                    if self.tail.len() == TAIL_LINES {
                        self.tail.pop_front();
                    }
                    self.tail.push_back(line.clone());
                    if matches(&line) {
                        return Ok(line);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(HarnessError::LineTimeout {
                        pattern: pattern.to_string(),
                        timeout,
                        tail: self.tail.iter().cloned().collect(),
                    })
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.ended = true;
                    return Err(HarnessError::LineEof {
                        pattern: pattern.to_string(),
                        tail: self.tail.iter().cloned().collect(),
                    });
                }
            }
        }
    }
}

/// Starts reading `reader` by lines and waits for one containing `pattern`. Returns the line
/// and the reader, which keeps draining the stream for later waits.
pub fn wait_for_line<R: Read + Send + 'static>(
    reader: R,
    pattern: &str,
    timeout: Duration,
) -> Result<(String, LineReader)> {
    let mut lines = LineReader::new(reader);
    let line = lines.wait_for_line(pattern, timeout)?;
    Ok((line, lines))
}

/// A live process seen in `/proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    /// Executable file name (from `/proc/<pid>/exe`, else `comm`).
    pub name: String,
    pub cmdline: String,
}

fn proc_info(pid: i32) -> Option<ProcInfo> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat[stat.rfind(')')? + 1..].split_whitespace().next()?;
    if state == "Z" || state == "X" {
        return None; // exited, only waiting to be reaped
    }
    let name = fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().trim_end_matches(" (deleted)").to_string()))
        .or_else(|| fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|c| c.trim().to_string()))?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    Some(ProcInfo { pid, name, cmdline })
}

fn all_pids() -> Vec<i32> {
    fs::read_dir("/proc")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// Every live process whose executable is named `name` (e.g. "dvmd"), machine-wide. Other
/// users of the machine may run the same program; narrow with [`TestTag`] or
/// [`processes_in_netns`] before asserting.
pub fn processes_named(name: &str) -> Vec<ProcInfo> {
    all_pids().into_iter().filter_map(proc_info).filter(|p| p.name == name).collect()
}

/// Every live process inside network namespace `netns` (a node name).
pub fn processes_in_netns(netns: &str) -> Vec<ProcInfo> {
    netns_pids(netns).unwrap_or_default().into_iter().filter_map(proc_info).collect()
}

/// A unique environment mark for the processes of one test. Everything started with
/// [`TestTag::apply`] and all their descendants (environment is inherited, even through
/// `ip netns exec` and daemon re-parenting) can be found again with [`leftovers`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestTag(String);

const TAG_VAR: &str = "DVM_TEST_TAG";

impl TestTag {
    pub fn new() -> TestTag {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        TestTag(format!("{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)))
    }

    pub fn apply<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        cmd.env(TAG_VAR, &self.0)
    }

    fn marks(&self, pid: i32) -> bool {
        let want = format!("{TAG_VAR}={}", self.0);
        fs::read(format!("/proc/{pid}/environ"))
            .map(|env| env.split(|&c| c == 0).any(|v| v == want.as_bytes()))
            .unwrap_or(false)
    }
}

impl Default for TestTag {
    fn default() -> Self {
        TestTag::new()
    }
}

/// Live processes named `name` that carry `tag`.
pub fn leftovers(name: &str, tag: &TestTag) -> Vec<ProcInfo> {
    processes_named(name).into_iter().filter(|p| tag.marks(p.pid)).collect()
}

/// Panics, listing them, if processes named `name` carrying `tag` are still alive after a
/// short grace period (a SIGKILLed process takes a moment to leave `/proc`).
pub fn assert_no_leftovers(name: &str, tag: &TestTag) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = leftovers(name, tag);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} `{name}` process(es) tagged {} still running: {left:?}",
            left.len(),
            tag.0
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
