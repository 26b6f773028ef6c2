//! Starting daemons: locally (one loopback address per daemon) or through a launch agent
//! (`ssh`, `ip netns exec {host}`, `docker exec {host}`, ...). The DVM secret goes to the
//! daemon on its stdin, never on a command line. Each daemon's output is kept (last lines) so
//! a failed boot can say what the agent printed.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Context, Result};
use dvm_rml::Rank;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tracing::warn;

/// How the HNP starts the other daemons.
#[derive(Debug, Clone)]
pub enum Agent {
    /// Same machine, daemon r bound to 127.0.0.1 + r.
    Local,
    /// Command prefix; `{host}` is replaced by the host name (appended if absent).
    Prefix(String),
    /// Inside a Slurm allocation: one `srun` step starts every daemon but the HNP.
    Srun,
}

impl Agent {
    /// The argv that runs `program args...` on `host`.
    pub fn argv(&self, host: &str, program: &str, args: &[String]) -> Result<Vec<String>> {
        let mut argv = Vec::new();
        if matches!(self, Agent::Srun) {
            return Err(anyhow!("daemons under Slurm start in one srun step, not one by one (host {host})"));
        }
        if let Agent::Prefix(template) = self {
            let words: Vec<&str> = template.split_whitespace().collect();
            if words.is_empty() {
                return Err(anyhow!("--launch-agent is empty"));
            }
            let mut substituted = false;
            for w in words {
                if w.contains("{host}") {
                    substituted = true;
                }
                argv.push(w.replace("{host}", host));
            }
            if !substituted {
                argv.push(host.to_string());
            }
        }
        argv.push(program.to_string());
        argv.extend(args.iter().cloned());
        Ok(argv)
    }
}

/// Loopback address of daemon `r` in a local DVM.
pub fn local_addr(r: Rank) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 0, 0, 1)) + r)
}

/// The last lines a daemon printed.
#[derive(Debug, Default, Clone)]
pub struct OutputTail(Arc<Mutex<VecDeque<String>>>);

impl OutputTail {
    const KEEP: usize = 20;
    fn push(&self, line: String) {
        let mut q = self.0.lock().expect("output tail");
        if q.len() == Self::KEEP {
            q.pop_front();
        }
        q.push_back(line);
    }
    pub fn text(&self) -> String {
        let q = self.0.lock().expect("output tail");
        if q.is_empty() {
            "(nothing)".to_string()
        } else {
            q.iter().cloned().collect::<Vec<_>>().join(" | ")
        }
    }
}

/// What a process the HNP started runs: one daemon (through `--launch-agent`), or the one
/// `srun` step that runs every daemon but the HNP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    Daemon(Rank),
    Step,
}

impl std::fmt::Display for Started {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Started::Daemon(r) => write!(f, "daemon {r}"),
            Started::Step => write!(f, "srun"),
        }
    }
}

/// A started daemon process (or launch step).
#[derive(Debug)]
pub struct Launched {
    pub host: String,
    pub pid: Option<u32>,
    pub output: OutputTail,
}

/// Spawn one daemon (or the step that starts them all; `host` labels its output); its exit is
/// reported on `exits` as (what, description). The secret goes to its stdin, which `srun`
/// forwards to every task.
pub async fn spawn_daemon(
    started: Started,
    host: &str,
    argv: Vec<String>,
    secret_hex: String,
    exits: mpsc::UnboundedSender<(Started, String)>,
) -> Result<Launched> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(false);
    // The launch agent (or the daemon itself) starts with no signal blocked, whatever the
    // HNP's spawning thread held.
    // SAFETY: sigemptyset and pthread_sigmask are async-signal-safe and allocate nothing.
    unsafe {
        cmd.pre_exec(|| {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    let mut child: Child =
        cmd.spawn().with_context(|| format!("cannot start {started} on host {host}: '{}'", argv.join(" ")))?;
    let pid = child.id();
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(format!("{secret_hex}\n").as_bytes()).await;
        let _ = stdin.shutdown().await;
    }
    let output = OutputTail::default();
    if let Some(out) = child.stdout.take() {
        tail_into(out, output.clone(), started, host.to_string());
    }
    if let Some(err) = child.stderr.take() {
        tail_into(err, output.clone(), started, host.to_string());
    }
    tokio::spawn(async move {
        let how = match child.wait().await {
            Ok(st) => match (st.code(), std::os::unix::process::ExitStatusExt::signal(&st)) {
                (Some(c), _) => format!("exited with status {c}"),
                (None, Some(s)) => format!("was killed by signal {s}"),
                _ => "ended".to_string(),
            },
            Err(e) => format!("could not be waited for: {e}"),
        };
        let _ = exits.send((started, how));
    });
    Ok(Launched { host: host.to_string(), pid, output })
}

fn tail_into(
    stream: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    tail: OutputTail,
    started: Started,
    host: String,
) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            // Daemons log through tracing to stderr; pass it on, tagged.
            match started {
                Started::Daemon(rank) => crate::say!("[dvmd {rank}@{host}] {line}"),
                Started::Step => crate::say!("[{host}] {line}"),
            }
            tail.push(line);
        }
    });
}

/// Kill a daemon process by PID (best effort).
pub fn kill(pid: u32) {
    if let Err(e) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL) {
        if e != nix::errno::Errno::ESRCH {
            warn!(pid, "cannot kill daemon: {e}");
        }
    }
}

/// The local address this machine uses to reach `peer` (no packet is sent).
pub fn source_addr_toward(peer: SocketAddr) -> Option<std::net::IpAddr> {
    let sock = std::net::UdpSocket::bind(SocketAddr::new(
        if peer.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { std::net::Ipv6Addr::UNSPECIFIED.into() },
        0,
    ))
    .ok()?;
    sock.connect(peer).ok()?;
    sock.local_addr().ok().map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_argv() {
        let a = Agent::Prefix("ip netns exec {host}".into());
        assert_eq!(
            a.argv("n1", "/bin/dvmd", &["--x".into()]).unwrap(),
            vec!["ip", "netns", "exec", "n1", "/bin/dvmd", "--x"]
        );
        let s = Agent::Prefix("ssh -o BatchMode=yes".into());
        assert_eq!(s.argv("h", "dvmd", &[]).unwrap(), vec!["ssh", "-o", "BatchMode=yes", "h", "dvmd"]);
        assert!(Agent::Prefix("  ".into()).argv("h", "d", &[]).is_err());
        assert_eq!(local_addr(0), Ipv4Addr::new(127, 0, 0, 1));
        assert_eq!(local_addr(300), Ipv4Addr::new(127, 0, 1, 45));
    }
}
