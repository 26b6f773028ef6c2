//! Placement on this machine's real cores, through real daemons at radix 2 and 64: what
//! `--bind-to` asks is what the kernel reports for each rank (`Cpus_allowed_list`), what
//! `--report-bindings` prints, what an Open MPI program sees (its binding through hwloc, its
//! core and package peers through the locality the daemon published), slots defaulting to the
//! node's cores, and refusals that launch nothing.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use common::{mpi_bin, text, Dvm, Nodes, PRUN};
use dvm_core::jobmap::Level;

/// Each rank's `Cpus_allowed_list` (printed by the rank) and its `--report-bindings` line.
fn bindings(dvm: &Dvm, args: &[&str]) -> BTreeMap<u32, (String, String)> {
    let script = "echo \"$DVM_RANK $(grep Cpus_allowed_list: /proc/self/status | cut -f2)\"";
    let mut a = vec!["--report-bindings"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["sh", "-c", script]);
    let o = dvm.prun(&a);
    let (out, err) = text(&o);
    assert!(o.status.success(), "prun {args:?}: {err}\n{}", dvm.log());
    let mut by_rank = BTreeMap::new();
    for line in out.lines() {
        let (rank, cpus) = line.split_once(' ').unwrap_or_else(|| panic!("{line}"));
        let rank: u32 = rank.parse().unwrap();
        let report = err
            .lines()
            .map(|l| l.trim_start_matches("prun: "))
            .find(|l| l.starts_with('[') && l.contains(&format!(":{rank}] ")))
            .unwrap_or_else(|| panic!("no binding report for rank {rank} in:\n{err}"))
            .to_string();
        by_rank.insert(rank, (cpus.to_string(), report));
    }
    by_rank
}

/// The cpus a report names: "(cpus 0-1)".
fn reported(line: &str) -> Option<&str> {
    line.rsplit_once("(cpus ").map(|(_, c)| c.trim_end_matches(')'))
}

fn cores_here() -> u32 {
    dvmd::hwtopo::discover().expect("hwloc reads this machine").count(Level::Core)
}

fn suite(radix: u32) {
    let cores = cores_here();
    let dvm = Dvm::start(&format!("place{radix}"), Nodes::Local { daemons: 2, slots: cores }, radix, &[]);
    let n = cores.to_string();

    // One core each: distinct, and what the report says is what the kernel has.
    let got = bindings(&dvm, &["--bind-to", "core", "-n", &n]);
    assert_eq!(got.len() as u32, cores);
    for (rank, (kernel, report)) in &got {
        assert_eq!(reported(report), Some(kernel.as_str()), "rank {rank}: {report}");
        assert!(report.contains("bound to") && report.contains("[core:"), "{report}");
    }
    let all: std::collections::BTreeSet<&String> = got.values().map(|(k, _)| k).collect();
    assert_eq!(all.len() as u32, cores, "one core each: {got:?}");

    // Unbound: every cpu of the daemon's, and said so.
    let free = bindings(&dvm, &["--bind-to", "none", "-n", "1"]);
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    let own = own.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
    assert_eq!(free[&0].0, own);
    assert!(free[&0].1.contains("is not bound"), "{}", free[&0].1);

    // PE: one rank with every core of the node.
    let pe = format!("core:PE={cores}");
    let wide = bindings(&dvm, &["--map-by", &pe, "-n", "1"]);
    assert_eq!(reported(&wide[&0].1), Some(wide[&0].0.as_str()));
    assert_eq!(wide[&0].0, own, "{cores} cores for one rank: all of them");

    // An Open MPI program sees its binding and its peers' locality.
    let o = dvm.prun(&["--bind-to", "core", "-n", "2", &mpi_bin("binding")]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}\n{}", dvm.log());
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    let mut cpus = Vec::new();
    for l in &lines {
        // Two ranks on the node's first daemon, each alone on its core, both in its package.
        assert!(l.contains(" shared 2 core 1 package 2 cpus "), "{l}");
        cpus.push(l.rsplit_once(' ').unwrap().1);
    }
    assert_ne!(cpus[0], cpus[1], "{out}");
    let o = dvm.prun(&["--bind-to", "none", "-n", "2", &mpi_bin("binding")]);
    let (out, _) = text(&o);
    // Unbound ranks publish no locality: Open MPI cannot tell they share a package.
    assert_eq!(out.matches(" package 1 ").count(), 2, "{out}");

    // A rankfile: rank 0 on the second daemon's last core, rank 1 on the first's first.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    let rf = dvm.root.join("rankfile");
    let last = cores - 1;
    std::fs::write(&rf, format!("# two ranks\nrank 0={host}-1 slot={last}\nrank 1={host}-0 slot=0\n")).unwrap();
    let rf_arg = rf.to_str().unwrap();
    let script = "echo \"$DVM_RANK $DVM_DAEMON $(grep Cpus_allowed_list: /proc/self/status | cut -f2)\"";
    let o = dvm.prun(&["--rankfile", rf_arg, "sh", "-c", script]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}\n{}", dvm.log());
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(lines, [format!("0 1 {last}"), "1 0 0".to_string()], "{out}");

    // Ranks interleaved over the daemons (0 and 3 on daemon 0, 1 and 2 on daemon 1): each rank
    // where its line says, and an Open MPI ring over them completes.
    let rf4 = dvm.root.join("rankfile4");
    let lines4 = format!(
        "rank 0={host}-0 slot=0\nrank 1={host}-1 slot=0\nrank 2={host}-1 slot={last}\nrank 3={host}-0 slot={last}\n"
    );
    std::fs::write(&rf4, lines4).unwrap();
    let rf4_arg = rf4.to_str().unwrap();
    let o = dvm.prun(&["--oversubscribe", "--display", "map", "--rankfile", rf4_arg, "sh", "-c", script]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}\n{}", dvm.log());
    assert!(err.contains(&format!("prun:   {host}-0 (daemon 0): 2 ranks: 0,3\n")), "{err}");
    assert!(err.contains(&format!("prun:   {host}-1 (daemon 1): 2 ranks: 1-2\n")), "{err}");
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    let want = ["0 0 0".to_string(), "1 1 0".to_string(), format!("2 1 {last}"), format!("3 0 {last}")];
    assert_eq!(lines, want, "{out}");
    let o = dvm.prun(&["--oversubscribe", "--rankfile", rf4_arg, &mpi_bin("ring")]);
    let (out, err) = text(&o);
    assert!(o.status.success() && out.contains("ring token 12 want 12 ok"), "{out}{err}\n{}", dvm.log());

    // Ranks dealt over the packages of both daemons: one package each here, so rank r on
    // daemon r mod 2; the same ranks by package without span fill daemon 0 first.
    let where_ = "echo \"$DVM_RANK $DVM_DAEMON\"";
    for (rank_by, want) in [("package:span", ["0 0", "1 1", "2 0", "3 1"]), ("package", ["0 0", "1 0", "2 1", "3 1"])] {
        let o = dvm.prun(&["--oversubscribe", "--rank-by", rank_by, "-n", "4", "--map-by", "slot", "sh", "-c", where_]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{rank_by}: {err}\n{}", dvm.log());
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort();
        if cores >= 2 || rank_by.ends_with("span") {
            assert_eq!(lines, want, "--rank-by {rank_by}: {out}");
        }
    }

    // Refusals: one sentence naming what was wrong, nothing started.
    std::fs::write(dvm.root.join("rf-bad"), format!("rank 0={host}-0 slot=0\nrank one={host}-0 slot=0\n")).unwrap();
    std::fs::write(dvm.root.join("rf-host"), "rank 0=elsewhere slot=0\n").unwrap();
    let (bad, stray) = (dvm.root.join("rf-bad"), dvm.root.join("rf-host"));
    let marker = dvm.root.join("started");
    let touch = ["touch", marker.to_str().unwrap()];
    let over = (2 * cores + 1).to_string();
    for (args, want) in [
        (vec!["--bind-to", "core", "--oversubscribe", "-n", &over], "cannot bind"),
        (vec!["--map-by", "ppr:0:core"], "--map-by 'ppr:0:core': N in ppr:0:core must be a positive integer"),
        (vec!["--bind-to", "board"], "--bind-to 'board': unknown object 'board'"),
        (vec!["--map-by", "core:PE=64", "-n", "1"], "cpus per rank"),
        (vec!["--rankfile", bad.to_str().unwrap()], "rf-bad: line 2: 'one' is not a rank number"),
        (vec!["--rankfile", stray.to_str().unwrap()], "rf-host:1: host 'elsewhere' is not a node of the DVM"),
    ] {
        let mut a = args.clone();
        a.extend_from_slice(&touch);
        let o = dvm.prun(&a);
        let err = text(&o).1;
        assert!(!o.status.success(), "{args:?} was accepted");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!marker.exists(), "{args:?} started a process");
    }
    dvm.stop();
}

#[test]
fn placement_on_real_cores_at_radix_2() {
    suite(2);
}

#[test]
fn placement_on_real_cores_at_radix_64() {
    suite(64);
}

#[test]
fn slots_default_to_the_nodes_cores() {
    // No -n: the job fills the slots, one proc per core of each of the 2 daemons.
    let root = std::env::temp_dir().join(format!("dvm-t-slots-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let o = Command::new(PRUN)
        .args(["--local", "2", "sh", "-c", "echo $DVM_SIZE"])
        .env("DVM_TMPDIR", &root)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&root);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let want = 2 * cores_here();
    assert_eq!(out.lines().count() as u32, want, "{out}");
    assert!(out.lines().all(|l| l == want.to_string()), "{out}");
}

#[test]
fn timestamps_are_taken_when_each_line_is_read() {
    let root = std::env::temp_dir().join(format!("dvm-t-stamp-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let before = now();
    let o = Command::new(PRUN)
        .args([
            "--local",
            "2",
            "--output",
            "timestamp,tag",
            "-n",
            "2",
            "sh",
            "-c",
            "echo first; sleep 0.3; echo second",
        ])
        .env("DVM_TMPDIR", &root)
        .output()
        .unwrap();
    let after = now();
    let _ = std::fs::remove_dir_all(&root);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    // [2026-12-06T01:33:25.194673Z] [1,0]<stdout>: first
    let mut stamps: BTreeMap<(String, String), String> = BTreeMap::new();
    for l in out.lines() {
        let (stamp, rest) = l.strip_prefix('[').and_then(|l| l.split_once("] ")).unwrap_or_else(|| panic!("{l}"));
        let (tag, word) = rest.split_once(": ").unwrap();
        assert_eq!(stamp.len(), 27, "{stamp}");
        stamps.insert((tag.to_string(), word.to_string()), stamp.to_string());
    }
    assert_eq!(stamps.len(), 4, "{out}");
    let day = |secs: u64| {
        let d = secs / 86_400;
        (d, secs % 86_400)
    };
    for rank in 0..2 {
        let tag = format!("[1,{rank}]<stdout>");
        let (a, b) = (&stamps[&(tag.clone(), "first".into())], &stamps[&(tag, "second".into())]);
        assert!(a < b, "rank {rank}: {a} then {b}");
        // Within the run: same hour-minute-second window as the clock read around it.
        let hms = |s: &str| -> u64 {
            let t = &s[11..19];
            let p: Vec<u64> = t.split(':').map(|x| x.parse().unwrap()).collect();
            p[0] * 3600 + p[1] * 60 + p[2]
        };
        let (lo, hi) = (day(before).1, day(after).1);
        if lo <= hi {
            assert!((lo..=hi).contains(&hms(a)), "{a} outside the run ({lo}..={hi} s of the day)");
        }
    }
}
