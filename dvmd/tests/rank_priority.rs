//! Ranks give way to their daemon by default, so that it gets the cpu at once when they spin on
//! every core (docs/liveness.md): each job's ranks in a cpu group of their own under the
//! daemon's idle group where the daemon can make groups (root here), else under SCHED_IDLE. A
//! job chooses otherwise with `-x DVM_RANK_PRIORITY=idle|same|nice:N`, a DVM with
//! `dvmd --rank-priority`, and a malformed value fails the launch naming it. Read from each
//! rank's own /proc/self/stat (policy and nice) and /proc/self/cgroup; the groups are gone
//! once their job ended and once their daemon stopped, and so is what a job left running
//! outside its process groups.

mod common;

use common::{text, Dvm, Nodes};

/// SCHED_OTHER and SCHED_IDLE as /proc/PID/stat field 41 gives them.
const OTHER: u32 = 0;
const IDLE: u32 = 5;

/// What a rank waits for before it reports: the daemon changes a proc's priority or cpu
/// group once it has exec'd, so a rank that expects a change waits for it (up to 10 s)
/// instead of racing the daemon; one that expects none reads at once.
#[derive(Clone, Copy, PartialEq)]
enum Expect {
    Nothing,
    /// Its policy or nice value changed.
    Policy,
    /// It is in a DVM's cpu group.
    Group,
}

/// (policy, nice) of every rank of a job run with `args`, in rank order.
fn policies(dvm: &Dvm, args: &[&str], expect: Expect) -> Vec<(u32, i32)> {
    placed(dvm, args, expect).into_iter().map(|(p, n, _)| (p, n)).collect()
}

/// As [`policies`], with each rank's cpu cgroup (the path in the cpu hierarchy).
fn placed(dvm: &Dvm, args: &[&str], expect: Expect) -> Vec<(u32, i32, Group)> {
    let mut a = args.to_vec();
    // Fields 19 (nice) and 41 (policy) of the shell's own stat (its name has no space).
    let read = format!("s=$(cut -d' ' -f19,41 /proc/$$/stat); {GROUP}");
    let unchanged = match expect {
        Expect::Nothing => "false",
        Expect::Policy => "[ \"$s\" = \"$1\" ]",
        Expect::Group => "case \"$g\" in /dvm-*) false;; *) true;; esac",
    };
    let script = format!(
        "{read}; i=0; while {unchanged} && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); {read}; done; echo $DVM_RANK $s $g $idle"
    );
    let initial = format!("{} 0", own_nice());
    let mount = groups_mount().map(|m| m.display().to_string()).unwrap_or_default();
    a.extend_from_slice(&["sh", "-c", &script, "sh", &initial, &mount]);
    let o = dvm.prun(&a);
    let (out, err) = text(&o);
    assert!(o.status.success(), "prun {args:?}: {err}\n{}", dvm.log());
    let mut rows: Vec<(u32, u32, i32, (&str, &str))> = out
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 5, "{l}");
            let group = (f[3], f[4]);
            (f[0].parse().unwrap(), f[2].parse().unwrap(), f[1].parse().unwrap(), group)
        })
        .collect();
    rows.sort();
    rows.into_iter()
        .map(|(_, p, n, (g, i))| (p, n, Group { path: g.to_string(), parent_idle: i.to_string() }))
        .collect()
}

/// A rank's cpu cgroup, as it saw it while it ran: its path in the cpu hierarchy and its
/// parent's `cpu.idle` ("-" if unreadable).
#[derive(Debug)]
struct Group {
    path: String,
    parent_idle: String,
}

/// Sets `g` to the shell's path in the cpu hierarchy (a v1 hierarchy with the cpu controller,
/// else v2's "0::PATH") and `idle` to its parent group's cpu.idle under the mount in `$2`.
const GROUP: &str = "g=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3; exit}' /proc/$$/cgroup); \
    [ -n \"$g\" ] || g=$(awk -F: '$1 == \"0\" {print $3; exit}' /proc/$$/cgroup); \
    idle=$(cat \"$2$(dirname \"$g\")/cpu.idle\" 2>/dev/null || echo -)";

/// Where the cpu hierarchy is mounted, when this test runs as root and the daemon can make
/// groups there (a v1 hierarchy with cpu.idle, or a v2 one with the cpu controller).
/// A test of the groups themselves where there are none: recorded as a skip (a failure as root).
fn no_groups(test: &str) {
    dvm_tests::skip(test, "needs root and a cpu cgroup hierarchy with cpu.idle (Linux 5.15 or later)");
}

fn groups_mount() -> Option<std::path::PathBuf> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let v1 = std::path::Path::new("/sys/fs/cgroup/cpu");
    if v1.join("cpu.idle").exists() {
        return Some(v1.to_path_buf());
    }
    let v2 = std::path::Path::new("/sys/fs/cgroup");
    let controllers = std::fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
    controllers.split_whitespace().any(|c| c == "cpu").then(|| v2.to_path_buf())
}

fn own_nice() -> i32 {
    // SAFETY: reads this process's nice value.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
}

fn suite(name: &str, radix: u32) {
    let dvm = Dvm::start(name, Nodes::Local { daemons: 2, slots: 2 }, radix, &[]);
    let base = own_nice();
    let mount = groups_mount();
    let expect = if mount.is_some() { Expect::Group } else { Expect::Policy };
    let default = placed(&dvm, &["--map-by", "node", "-n", "2"], expect);
    let mut dvm_group = None;
    for (rank, (policy, nice, group)) in default.iter().enumerate() {
        assert_eq!(*nice, base, "rank {rank}");
        match &mount {
            // Its job's group under the DVM's idle group, its own policy unchanged.
            Some(_) => {
                assert_eq!(*policy, OTHER, "rank {rank}");
                let (parent, job) = group.path.rsplit_once('/').unwrap_or_default();
                assert!(parent.starts_with("/dvm-") && job == "job-1", "rank {rank} in {group:?}");
                assert_eq!(group.parent_idle, "1", "rank {rank} in {group:?}");
                // The daemons of one DVM on one machine share the job's group.
                assert_eq!(dvm_group.get_or_insert(group.path.clone()), &group.path, "rank {rank}");
            }
            None => assert_eq!(*policy, IDLE, "rank {rank}"),
        }
    }
    let dvm_dir = mount.as_ref().zip(dvm_group.as_ref()).map(|(m, g)| m.join(&g[1..]));
    if let Some(job_dir) = &dvm_dir {
        // The job's group goes once the job has ended on every daemon.
        common::until(std::time::Duration::from_secs(10), "the job's cpu group removed", || !job_dir.exists());
    }
    assert_eq!(policies(&dvm, &["-x", "DVM_RANK_PRIORITY=idle", "-n", "2"], Expect::Policy), vec![(IDLE, base); 2]);
    let same = policies(&dvm, &["-x", "DVM_RANK_PRIORITY=same", "-n", "2"], Expect::Nothing);
    assert_eq!(same, vec![(OTHER, base); 2]);
    let nicer = policies(&dvm, &["-x", "DVM_RANK_PRIORITY=nice:7", "-n", "2"], Expect::Policy);
    assert_eq!(nicer, vec![(OTHER, (base + 7).min(19)); 2]);
    // A malformed value: the launch fails naming it, and nothing runs.
    let marker = dvm.root.join("started");
    let o = dvm.prun(&["-x", "DVM_RANK_PRIORITY=fast", "-n", "1", "touch", marker.to_str().unwrap()]);
    let err = text(&o).1;
    assert_eq!(o.status.code(), Some(127), "{err}");
    assert!(err.contains("DVM_RANK_PRIORITY: 'fast' is not a rank priority"), "{err}");
    assert!(!marker.exists());
    let mut dvm = dvm;
    dvm.keep_cpu_groups = true;
    dvm.stop();
    if let Some(job_dir) = dvm_dir {
        // Removed by the DVM's daemons themselves (the harness's clean-up was held back).
        let dvm_dir = job_dir.parent().unwrap();
        let left = dvm_dir.exists();
        common::remove_cpu_groups();
        assert!(!left, "{} is still there after the DVM stopped", dvm_dir.display());
    }
}

#[test]
fn ranks_give_way_to_their_daemon_at_radix_2() {
    suite("prio2", 2);
}

#[test]
fn ranks_give_way_to_their_daemon_at_radix_64() {
    suite("prio64", 64);
}

#[test]
fn a_dvm_may_choose_another_policy() {
    let dvm = Dvm::start_with_args(
        "prio-same",
        Nodes::Local { daemons: 2, slots: 1 },
        2,
        &[],
        &["--rank-priority", "nice:3"],
    );
    let base = own_nice();
    assert_eq!(policies(&dvm, &["--map-by", "node", "-n", "2"], Expect::Policy), vec![(OTHER, (base + 3).min(19)); 2]);
    assert_eq!(policies(&dvm, &["-x", "DVM_RANK_PRIORITY=idle", "-n", "1"], Expect::Policy), vec![(IDLE, base)]);
    dvm.stop();
}

/// What a DVM killed with SIGKILL leaves behind (its group, with an empty job group in it) is
/// removed by the next DVM's daemon as it makes its own groups. (The harness also removes empty
/// groups when a test's DVM is dropped; a concurrent test's clean-up can only make this pass
/// early, never fail.)
#[test]
fn groups_left_by_a_killed_dvm_are_removed_by_the_next() {
    let Some(mount) = groups_mount() else { return no_groups("groups_left_by_a_killed_dvm_are_removed_by_the_next") };
    let stale = mount.join(format!("dvm-killed.test_{}", std::process::id()));
    std::fs::create_dir_all(stale.join("job-9")).unwrap();
    let dvm = Dvm::start("prio-stale", Nodes::Local { daemons: 1, slots: 1 }, 2, &[]);
    let placed = placed(&dvm, &["-n", "1"], Expect::Group);
    assert!(placed[0].2.path.starts_with("/dvm-"), "{:?}", placed[0].2);
    assert!(!stale.exists(), "{} is still there after a DVM made its groups", stale.display());
    dvm.stop();
}

/// A rank that leaves a process running in a session of its own (outside the job's process
/// groups, which is all the daemon signals): the job ends, and that process is killed with the
/// rest of the job's cpu group.
#[test]
fn what_a_job_left_running_in_its_group_is_killed_at_its_end() {
    if groups_mount().is_none() {
        return no_groups("what_a_job_left_running_in_its_group_is_killed_at_its_end");
    }
    let dvm = Dvm::start("prio-stray", Nodes::Local { daemons: 2, slots: 1 }, 2, &[]);
    let pidfile = dvm.root.join("stray.pid");
    // The rank forks once it is in its job's group (the daemon moves it in just after exec).
    let script = format!(
        "i=0; while [ $i -lt 200 ]; do {GROUP}; case \"$g\" in /dvm-*) break;; esac; sleep 0.05; i=$((i+1)); done; \
         setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > {}",
        pidfile.display()
    );
    let o = dvm.prun(&["-n", "1", "sh", "-c", &script]);
    assert!(o.status.success(), "{}", text(&o).1);
    let pid: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    // Killed here if the DVM did not: a test leaves nothing running.
    struct Reap(i32);
    impl Drop for Reap {
        fn drop(&mut self) {
            // SAFETY: kill(2) has no memory effects.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
    let _reap = Reap(pid);
    let alive = || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
    common::until(std::time::Duration::from_secs(10), "the stray killed at the job's end", || !alive());
    dvm.stop();
}
