//! Per-job cpu groups: the procs of each job on this machine in a cgroup of their own, under
//! one group of the DVM's that the kernel schedules as idle (`cpu.idle`).
//!
//! Owns: `<cpu hierarchy>/dvm-<HNP address>/job-<id>`, shared by the daemons of one DVM that
//! run on one machine (fake nodes, `--local`), so that a job is one group per machine whatever
//! the number of daemons there; and the removal of those directories (at job end, at daemon
//! exit, and, for a daemon that died without removing its own, at the next daemon's start).
//! Never: moves a proc before it has exec'd (the daemon's thread waits for that exec, and a
//! child already in the idle group on busy cpus would hold the daemon's loop with it: the proc
//! is moved by pid once it runs, as SCHED_IDLE is set), or fails a launch: a daemon that cannot
//! make groups (no privilege, a read-only hierarchy, a kernel without `cpu.idle`) says why
//! once and its procs run under SCHED_IDLE instead; so does a proc that cannot be moved.
//! Why groups rather than SCHED_IDLE alone: both let a waking daemon preempt a spinning rank at
//! once, but SCHED_IDLE procs share the cpus as equals, so a job of 4 short procs next to a job
//! of 16 spinning ones gets 4/20 of the node; jobs in sibling groups get equal halves.
//! A job's group also contains what its procs started and left running outside their process
//! groups (`setsid`, a daemonizing helper): when the job is forgotten (it ended on every
//! daemon), whatever is still in its group is killed, as a batch system's job containment does.
//! Traps: a group can be removed only once no process is in it; a job's last procs may still
//! be dying when the job is forgotten, so removal is retried (`sweep`: at the next job's
//! launch or end here, and at exit). Another daemon of the machine (of another DVM, starting)
//! may remove an empty group this one still means to use: a group that is gone is made again.
//! On cgroup v2 the groups sit at the hierarchy's root, outside the daemon's own cgroup (a
//! systemd unit, a batch system's step): a site that must keep ranks inside it runs
//! `--rank-priority idle`.

use std::collections::HashMap;
use std::fs;
use std::io::{self, ErrorKind, Write};
use std::path::{Path, PathBuf};

/// The prefix of each DVM's group, followed by its HNP's address.
const DVM_PREFIX: &str = "dvm-";

/// How many times a step that another daemon of the machine can undo (by pruning an empty
/// group) is tried.
const TRIES: usize = 3;

/// This daemon's job groups.
pub(super) struct CpuGroups {
    /// `<cpu hierarchy>/dvm-<HNP address>`, marked idle.
    root: PathBuf,
    /// cgroup v2 (its children need the cpu controller enabled).
    v2: bool,
    /// `cgroup.procs` of each live job's group, open for writing.
    jobs: HashMap<u32, fs::File>,
    /// Groups of forgotten jobs not yet removable (procs still dying).
    stale: Vec<PathBuf>,
}

impl CpuGroups {
    /// The DVM's group under the cpu hierarchy (`dvm` names the DVM: its HNP's address), or
    /// why there is none. Removes the empty groups of other DVMs (what daemons that died left).
    pub(super) fn create(dvm: &str) -> Result<CpuGroups, String> {
        let (mount, v2) = cpu_hierarchy()?;
        let name: String = dvm.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' }).collect();
        let root = mount.join(format!("{DVM_PREFIX}{name}"));
        prune_empty(&mount, &root);
        if v2 {
            enable_cpu(&mount)?;
        }
        let made = CpuGroups { root, v2, jobs: HashMap::new(), stale: Vec::new() };
        retry(|| made.make_root())?;
        Ok(made)
    }

    /// The DVM's group, idle (made again if another daemon removed it while empty).
    fn make_root(&self) -> Result<(), String> {
        make_dir(&self.root)?;
        let idle = self.root.join("cpu.idle");
        fs::write(&idle, "1").map_err(|e| format!("cannot write 1 to {}: {e}", idle.display()))?;
        if self.v2 {
            enable_cpu(&self.root)?;
        }
        Ok(())
    }

    /// Move `pid` (a proc of `job` that has exec'd) into the job's group, made on first use,
    /// or made again if another daemon of the machine removed it while it was empty.
    pub(super) fn join(&mut self, job: u32, pid: i32) -> Result<(), String> {
        self.sweep();
        let mut why = String::new();
        for _ in 0..TRIES {
            if !self.jobs.contains_key(&job) {
                if let Err(e) = self.open_job(job) {
                    why = e;
                    continue;
                }
            }
            let Some(mut procs) = self.jobs.get(&job) else { continue };
            match procs.write_all(pid.to_string().as_bytes()) {
                Ok(()) => return Ok(()),
                // Removed under the open fd (ENODEV): made again on the next try.
                Err(e) => why = format!("cannot move pid {pid} into {}: {e}", self.job_dir(job).display()),
            }
            self.jobs.remove(&job);
        }
        Err(why)
    }

    /// Make the job's group (and the DVM's, if it is gone) and open its `cgroup.procs`.
    fn open_job(&mut self, job: u32) -> Result<(), String> {
        if !self.root.join("cpu.idle").exists() {
            self.make_root()?;
        }
        let dir = self.job_dir(job);
        make_dir(&dir)?;
        let procs = dir.join("cgroup.procs");
        let file = fs::OpenOptions::new()
            .write(true)
            .open(&procs)
            .map_err(|e| format!("cannot open {}: {e}", procs.display()))?;
        self.jobs.insert(job, file);
        Ok(())
    }

    /// The job is over (on every daemon): whatever is still in its group is killed, and the
    /// group goes once its procs are gone.
    pub(super) fn forget(&mut self, job: u32) {
        if self.jobs.remove(&job).is_some() {
            let dir = self.job_dir(job);
            let killed = kill_members(&dir);
            if !killed.is_empty() {
                tracing::debug!(job, ?killed, "killed what was left in the job's cpu group");
            }
            self.stale.push(dir);
        }
        self.sweep();
    }

    /// Remove what can be removed of the forgotten jobs' groups.
    fn sweep(&mut self) {
        self.stale.retain(|dir| match fs::remove_dir(dir) {
            Ok(()) => false,
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(_) => true,
        });
    }

    fn job_dir(&self, job: u32) -> PathBuf {
        self.root.join(format!("job-{job}"))
    }
}

/// SIGKILL every process in the group at `dir` (a few rounds, for what forks meanwhile); the
/// pids signalled. The job's own procs, already killed by process group, may be among them.
fn kill_members(dir: &Path) -> Vec<i32> {
    let mut killed = Vec::new();
    for _ in 0..TRIES {
        let Ok(list) = fs::read_to_string(dir.join("cgroup.procs")) else { break };
        let pids: Vec<i32> = list.lines().filter_map(|l| l.trim().parse().ok()).filter(|&p| p > 0).collect();
        let fresh: Vec<i32> = pids.into_iter().filter(|p| !killed.contains(p)).collect();
        if fresh.is_empty() {
            break;
        }
        for pid in fresh {
            // SAFETY: kill(2) with a positive pid and a valid signal has no memory effects.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed.push(pid);
            }
        }
    }
    killed
}

/// `step` until it succeeds, at most [`TRIES`] times; its last error.
fn retry(mut step: impl FnMut() -> Result<(), String>) -> Result<(), String> {
    let mut last = Ok(());
    for _ in 0..TRIES {
        last = step();
        if last.is_ok() {
            break;
        }
    }
    last
}

impl Drop for CpuGroups {
    /// Daemon exit (its procs were killed first): wait briefly for them to be gone, then
    /// remove its jobs' groups, and the DVM's unless another daemon here still uses it.
    fn drop(&mut self) {
        let dirs: Vec<u32> = self.jobs.drain().map(|(j, _)| j).collect();
        for j in dirs {
            self.stale.push(self.job_dir(j));
        }
        for _ in 0..100 {
            self.sweep();
            if self.stale.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        for (job, dir) in self.stale.iter().map(|d| (d.file_name(), d)) {
            // Another daemon's procs of the job (this machine's daemons share it), or its own
            // still dying: removed by that daemon, or by the next one to start here.
            tracing::debug!(?job, "the cpu group {} is still in use", dir.display());
        }
        let _ = fs::remove_dir(&self.root);
    }
}

fn make_dir(dir: &Path) -> Result<(), String> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("cannot create {}: {e}", dir.display())),
    }
}

/// Where the cpu controller is mounted, and whether it is cgroup v2: a v1 hierarchy with the
/// `cpu` option, else a v2 mount whose controllers include `cpu` (a hybrid machine binds the
/// controller to v1). Needs `cpu.idle` (Linux 5.15).
fn cpu_hierarchy() -> Result<(PathBuf, bool), String> {
    let info =
        fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let (v1, v2s) = cgroup_mounts(&info);
    let has_cpu = |m: &PathBuf| {
        let controllers = fs::read_to_string(m.join("cgroup.controllers")).unwrap_or_default();
        controllers.split_whitespace().any(|c| c == "cpu")
    };
    match (v1, v2s.into_iter().find(has_cpu)) {
        (Some(m), _) => Ok((m, false)),
        (None, Some(m)) => Ok((m, true)),
        (None, None) => Err("no cgroup hierarchy with the cpu controller is mounted".into()),
    }
}

/// From /proc/self/mountinfo: the v1 hierarchy with the `cpu` controller, and the v2 mounts.
fn cgroup_mounts(mountinfo: &str) -> (Option<PathBuf>, Vec<PathBuf>) {
    let (mut v1, mut v2) = (None, Vec::new());
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS [TAGS...] - FSTYPE SOURCE SUPER-OPTIONS
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let Some(point) = left.split(' ').nth(4) else { continue };
        let mut right = right.split(' ');
        let (fstype, opts) = (right.next(), right.nth(1).unwrap_or(""));
        match fstype {
            Some("cgroup") if opts.split(',').any(|o| o == "cpu") => v1 = Some(PathBuf::from(point)),
            Some("cgroup2") => v2.push(PathBuf::from(point)),
            _ => {}
        }
    }
    (v1, v2)
}

/// cgroup v2: let the children of `dir` have the cpu controller.
fn enable_cpu(dir: &Path) -> Result<(), String> {
    let control = dir.join("cgroup.subtree_control");
    let now = fs::read_to_string(&control).unwrap_or_default();
    if now.split_whitespace().any(|c| c == "cpu") {
        return Ok(());
    }
    fs::write(&control, "+cpu").map_err(|e| format!("cannot write +cpu to {}: {e}", control.display()))
}

/// Remove the other DVMs' groups with no process in them: what a daemon killed with SIGKILL
/// left. Another live DVM's group that is empty at this moment goes too; its daemons make it
/// again when they need it.
fn prune_empty(mount: &Path, own: &Path) {
    let Ok(entries) = fs::read_dir(mount) else { return };
    for entry in entries.flatten() {
        if entry.path() != own && entry.file_name().to_str().is_some_and(|n| n.starts_with(DVM_PREFIX)) {
            let _ = remove_group(&entry.path());
        }
    }
}

/// Remove a DVM's group and its job groups (each must be empty of processes).
fn remove_group(dir: &Path) -> io::Result<()> {
    for entry in fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            fs::remove_dir(entry.path())?;
        }
    }
    fs::remove_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_hierarchy_is_found_in_mountinfo() {
        let hybrid = "\
35 25 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
40 35 0:35 / /sys/fs/cgroup/cpuset rw,relatime shared:14 - cgroup cgroup rw,cpuset
41 35 0:36 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
42 35 0:37 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct";
        let (v1, v2) = cgroup_mounts(hybrid);
        assert_eq!(v1, Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")));
        assert_eq!(v2, vec![PathBuf::from("/sys/fs/cgroup/unified")]);
        let unified =
            "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate";
        assert_eq!(cgroup_mounts(unified), (None, vec![PathBuf::from("/sys/fs/cgroup")]));
        // No cgroup at all (inside `ip netns exec`, which mounts a fresh /sys), or garbage.
        assert_eq!(cgroup_mounts("22 1 0:21 / /sys rw - sysfs sysfs rw\nnot a mount line"), (None, vec![]));
    }
}
