//! The system-wide registry of fake clusters: one marker directory per cluster index `k`
//! under [`REGISTRY_DIR`], holding the owner's identity.
//!
//! Claiming `k` is `mkdir` of its marker under a global `flock`, and the owner is written
//! before the lock is released, so a marker without a live owner is always a crashed run.
//! An owner is a PID plus its start time from `/proc/<pid>/stat`, so a recycled PID does not
//! keep a dead run's leftovers alive.

use std::fs::{self, OpenOptions};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::{io_err, netns, HarnessError, Result};

/// Where cluster markers live (tmpfs: gone after a reboot, like the namespaces).
pub const REGISTRY_DIR: &str = "/run/dvm-tests";

/// Cluster indices handed out: the third octet of 10.231.k.0/24.
const K_FIRST: u32 = 20;
const K_COUNT: u32 = 230;

const OWNER_FILE: &str = "owner";

pub(crate) struct Claim {
    pub k: u8,
    pub dir: PathBuf,
}

fn with_lock<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    fs::create_dir_all(REGISTRY_DIR).map_err(io_err(format!("creating {REGISTRY_DIR}")))?;
    let path = Path::new(REGISTRY_DIR).join(".lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err(format!("opening {}", path.display())))?;
    let _lock = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| HarnessError::Io {
        context: format!("locking {}", path.display()),
        source: errno.into(),
    })?;
    f()
}

/// The start time (clock ticks since boot) of `pid`, field 22 of `/proc/<pid>/stat`.
fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name start at field 3 (state).
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

fn own_token() -> String {
    let pid = std::process::id() as i32;
    format!("{pid} {}", start_time(pid).unwrap_or(0))
}

/// Whether the owner recorded in `token` ("pid starttime") is still the same live process.
fn owner_alive(token: &str) -> bool {
    let mut it = token.split_whitespace();
    let (Some(pid), Some(start)) = (it.next(), it.next()) else {
        return false;
    };
    match (pid.parse::<i32>(), start.parse::<u64>()) {
        (Ok(pid), Ok(start)) => start_time(pid) == Some(start),
        _ => false,
    }
}

/// Claims a free cluster index, trying candidates from `seed` on. `is_free(k)` checks the
/// system for names and addresses of that index and says why it refuses one.
pub(crate) fn claim(seed: u32, is_free: impl Fn(u8) -> std::result::Result<(), String>) -> Result<Claim> {
    with_lock(|| {
        let mut last = String::from("none tried");
        for t in 0..K_COUNT {
            let k = (K_FIRST + (seed.wrapping_add(t)) % K_COUNT) as u8;
            let dir = Path::new(REGISTRY_DIR).join(format!("k{k}"));
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    last = format!("k={k}: marker {} exists", dir.display());
                    continue;
                }
                Err(e) => return Err(io_err(format!("creating {}", dir.display()))(e)),
            }
            if let Err(why) = is_free(k) {
                let _ = fs::remove_dir(&dir);
                last = format!("k={k}: {why}");
                continue;
            }
            let owner = dir.join(OWNER_FILE);
            if let Err(e) = fs::write(&owner, own_token()) {
                let _ = fs::remove_dir_all(&dir);
                return Err(io_err(format!("writing {}", owner.display()))(e));
            }
            return Ok(Claim { k, dir });
        }
        Err(HarnessError::NoFreeSubnet { tries: K_COUNT as usize, last })
    })
}

/// Removes every fake cluster whose owning process is gone (a crashed or killed earlier
/// run): kills the processes left in its namespaces, deletes namespaces and links, and drops
/// its marker. Clusters of live processes, this one included, are never touched. Returns the
/// indices reaped.
pub fn cleanup_stale() -> Result<Vec<u8>> {
    with_lock(|| {
        let entries = match fs::read_dir(REGISTRY_DIR) {
            Ok(e) => e,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(format!("listing {REGISTRY_DIR}"))(e)),
        };
        let mut reaped = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(k) = name.strip_prefix('k').and_then(|k| k.parse::<u8>().ok()) else {
                continue;
            };
            let token = fs::read_to_string(entry.path().join(OWNER_FILE)).unwrap_or_default();
            if owner_alive(&token) {
                continue;
            }
            for problem in netns::teardown(k) {
                eprintln!("dvm-tests: reaping stale cluster k={k} (owner {token:?}): {problem}");
            }
            let _ = fs::remove_dir_all(entry.path());
            reaped.push(k);
        }
        Ok(reaped)
    })
}
