//! The stack traces of a job's live procs on this node: a debugger (Debian's `gdb`) attached
//! to each, in parallel, off the daemon's loop; the answer comes back as one
//! [`OdlsEvent::Stacks`].
//!
//! Never blocks the actor; a debugger that hangs is killed after [`GDB_LIMIT`]. Do not break:
//! the answer is sent exactly once per query, also when there is no proc or no debugger.

use std::process::Stdio;
use std::time::Duration;

use tokio::sync::mpsc;

use super::OdlsEvent;

/// How long one debugger may take to attach and print.
pub const GDB_LIMIT: Duration = Duration::from_secs(20);

/// Dump the stacks of `procs` (rank, pid) and send the answer to `events`.
pub fn dump(node: String, id: u64, jobid: u32, procs: Vec<(u32, u32)>, events: mpsc::UnboundedSender<OdlsEvent>) {
    tokio::spawn(async move {
        let mut runs = tokio::task::JoinSet::new();
        for (rank, pid) in procs {
            runs.spawn(async move { (rank, pid, trace(pid).await) });
        }
        let mut traces = Vec::new();
        let mut error = None;
        while let Some(Ok((rank, pid, r))) = runs.join_next().await {
            match r {
                Ok(text) => traces.push((rank, pid, text)),
                Err(Missing) => {
                    error = Some(format!(
                        "node {node}: no stack traces: gdb is not installed there (Debian: apt-get install gdb)"
                    ))
                }
            }
        }
        let _ = events.send(OdlsEvent::Stacks { id, jobid, traces, error });
    });
}

struct Missing;

/// One proc's stacks (every thread), the debugger's noise left out; what went wrong otherwise.
async fn trace(pid: u32) -> Result<String, Missing> {
    let child = tokio::process::Command::new("gdb")
        .args(["-p", &pid.to_string(), "-batch", "-nx", "-q"])
        .args(["-ex", "set pagination off", "-ex", "thread apply all bt"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Missing),
        Err(e) => return Ok(format!("(cannot start gdb: {e})")),
    };
    let out = match tokio::time::timeout(GDB_LIMIT, child.wait_with_output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return Ok(format!("(gdb failed: {e})")),
        Err(_) => return Ok(format!("(gdb did not answer within {} s)", GDB_LIMIT.as_secs())),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let frames: Vec<&str> =
        text.lines().filter(|l| l.starts_with('#') || l.starts_with("Thread ") || l.is_empty()).collect();
    let frames = frames.join("\n").trim().to_string();
    if frames.is_empty() {
        // Attaching failed (the process ended, ptrace refused): what gdb said.
        let err = String::from_utf8_lossy(&out.stderr);
        let why = err.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("no frames").to_string();
        return Ok(format!("(no stack: {why})"));
    }
    Ok(frames)
}
