//! Ranks run under SCHED_IDLE by default, so that their daemon gets the cpu at once when they
//! spin on every core (docs/liveness.md); a job chooses otherwise with
//! `-x DVM_RANK_PRIORITY=same|nice:N`, a DVM with `dvmd --rank-priority`, and a malformed value
//! fails the launch naming it. Read from each rank's own /proc/self/stat (policy and nice).

mod common;

use common::{text, Dvm, Nodes};

/// SCHED_OTHER and SCHED_IDLE as /proc/PID/stat field 41 gives them.
const OTHER: u32 = 0;
const IDLE: u32 = 5;

/// (policy, nice) of every rank of a job run with `args`, in rank order. The daemon lowers a
/// proc's priority once it has exec'd, so a rank that expects a change waits for it (up to
/// 10 s) instead of racing the daemon; one that expects none reads at once.
fn policies(dvm: &Dvm, args: &[&str], expect_change: bool) -> Vec<(u32, i32)> {
    let mut a = args.to_vec();
    // Fields 19 (nice) and 41 (policy) of the shell's own stat (its name has no space).
    let read = "s=$(cut -d' ' -f19,41 /proc/$$/stat)";
    let script = if expect_change {
        format!("{read}; i=0; while [ \"$s\" = \"$1\" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); {read}; done; echo $DVM_RANK $s")
    } else {
        format!("{read}; echo $DVM_RANK $s")
    };
    let initial = format!("{} 0", own_nice());
    a.extend_from_slice(&["sh", "-c", &script, "sh", &initial]);
    let o = dvm.prun(&a);
    let (out, err) = text(&o);
    assert!(o.status.success(), "prun {args:?}: {err}\n{}", dvm.log());
    let mut rows: Vec<(u32, u32, i32)> = out
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].parse().unwrap(), f[2].parse().unwrap(), f[1].parse().unwrap())
        })
        .collect();
    rows.sort();
    rows.into_iter().map(|(_, p, n)| (p, n)).collect()
}

fn own_nice() -> i32 {
    // SAFETY: reads this process's nice value.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
}

fn suite(name: &str, radix: u32) {
    let dvm = Dvm::start(name, Nodes::Local { daemons: 2, slots: 2 }, radix, &[]);
    let base = own_nice();
    assert_eq!(policies(&dvm, &["--map-by", "node", "-n", "2"], true), vec![(IDLE, base); 2], "the default");
    let same = policies(&dvm, &["-x", "DVM_RANK_PRIORITY=same", "-n", "2"], false);
    assert_eq!(same, vec![(OTHER, base); 2]);
    let nicer = policies(&dvm, &["-x", "DVM_RANK_PRIORITY=nice:7", "-n", "2"], true);
    assert_eq!(nicer, vec![(OTHER, (base + 7).min(19)); 2]);
    // A malformed value: the launch fails naming it, and nothing runs.
    let marker = dvm.root.join("started");
    let o = dvm.prun(&["-x", "DVM_RANK_PRIORITY=fast", "-n", "1", "touch", marker.to_str().unwrap()]);
    let err = text(&o).1;
    assert_eq!(o.status.code(), Some(127), "{err}");
    assert!(err.contains("DVM_RANK_PRIORITY: 'fast' is not a rank priority"), "{err}");
    assert!(!marker.exists());
    dvm.stop();
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
    assert_eq!(policies(&dvm, &["--map-by", "node", "-n", "2"], true), vec![(OTHER, (base + 3).min(19)); 2]);
    assert_eq!(policies(&dvm, &["-x", "DVM_RANK_PRIORITY=idle", "-n", "1"], true), vec![(IDLE, base)]);
    dvm.stop();
}
