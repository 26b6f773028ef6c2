//! Running `ip` and friends with their stderr carried into the error.

use std::process::Command;

use crate::{io_err, HarnessError, Result};

/// Runs `program args...`, returning stdout; a non-zero exit is an error naming the command.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String> {
    let line = || format!("{program} {}", args.join(" "));
    let out = Command::new(program).args(args).output().map_err(io_err(format!("spawning `{}`", line())))?;
    if !out.status.success() {
        return Err(HarnessError::Command {
            cmd: line(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn ip(args: &[&str]) -> Result<String> {
    run("ip", args)
}

/// Names from `ip netns list` (`name (id: 3)` lines).
pub(crate) fn netns_list() -> Result<Vec<String>> {
    Ok(ip(&["netns", "list"])?.lines().filter_map(|l| l.split_whitespace().next().map(str::to_string)).collect())
}

/// Interface names in the root namespace (`3: name@peer: <...>` lines).
pub(crate) fn link_names() -> Result<Vec<String>> {
    Ok(ip(&["-o", "link", "show"])?
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .collect())
}

/// PIDs of the processes whose network namespace is `ns` (`ip netns pids`).
pub(crate) fn netns_pids(ns: &str) -> Result<Vec<i32>> {
    Ok(ip(&["netns", "pids", ns])?.split_whitespace().filter_map(|p| p.parse().ok()).collect())
}
