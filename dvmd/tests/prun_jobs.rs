//! Jobs through `prun` on real local DVMs (radix 2 and 64): placement against an independent
//! computation, tagged output, exit statuses, launch errors, timeout, IOF, stdin, signals,
//! many jobs in a row, one-shot mode. Every process started is stopped by PID.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{procs_with, text, Dvm, Nodes, PRUN};

/// rank -> daemon from `echo $DVM_RANK $DVM_DAEMON` output.
fn placement(o: &Output) -> BTreeMap<u32, u32> {
    text(o)
        .0
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

/// Independent placement: per-daemon counts, then consecutive ranks (block) or r mod k.
fn expected(policy: &str, np: u32, daemons: u32, slots: u32) -> BTreeMap<u32, u32> {
    let mut m = BTreeMap::new();
    match policy {
        "slot" => {
            for r in 0..np {
                m.insert(r, r / slots);
            }
        }
        "node" => {
            for r in 0..np {
                m.insert(r, r % daemons);
            }
        }
        ppr => {
            let n: u32 = ppr.split(':').nth(1).unwrap().parse().unwrap();
            for r in 0..np {
                m.insert(r, r / n);
            }
        }
    }
    m
}

fn run_suite(radix: u32) {
    let dvm = Dvm::start(&format!("suite{radix}"), Nodes::Local { daemons: 8, slots: 8 }, radix, &[]);
    let show = ["sh", "-c", "echo $DVM_RANK $DVM_DAEMON"];

    // Placement for each policy against an independent computation.
    for (policy, np) in [("slot", 20u32), ("node", 20), ("ppr:2:node", 16)] {
        let np_s = np.to_string();
        let mut args = vec!["--map-by", policy, "-n", &np_s];
        args.extend_from_slice(&show);
        let out = dvm.prun(&args);
        assert!(out.status.success(), "{policy}: {}", text(&out).1);
        assert_eq!(placement(&out), expected(policy, np, 8, 8), "--map-by {policy}");
    }
    let out = dvm.prun(&["-N", "3", "sh", "-c", "echo $DVM_RANK $DVM_DAEMON"]);
    assert_eq!(placement(&out), expected("ppr:3:node", 24, 8, 8), "-N 3 fills every node");

    // 64 procs over 8 daemons, tagged: every line present and right.
    let out = dvm.prun(&["-n", "64", "--output", "tag", "sh", "-c", "echo host=$DVM_NODE rank=$DVM_RANK"]);
    assert!(out.status.success());
    let (so, _) = text(&out);
    let mut lines: Vec<&str> = so.lines().collect();
    lines.sort();
    let mut want: Vec<String> = (0..64)
        .map(|r| {
            let jobid: String = lines[0].trim_start_matches('[').split(',').next().unwrap().to_string();
            format!("[{jobid},{r}]<stdout>: host={}-{} rank={r}", hostname(), r / 8)
        })
        .collect();
    want.sort();
    assert_eq!(lines, want);

    // Exit statuses.
    assert_eq!(dvm.prun(&["-n", "2", "sh", "-c", "exit 3"]).status.code(), Some(3));
    let out = dvm.prun(&["-n", "1", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(143));
    assert!(text(&out).1.contains("killed by signal 15"), "{}", text(&out).1);
    // A failing rank kills the rest of the job (not the DVM), named by rank, node and pid.
    let out = dvm.prun(&["-n", "4", "sh", "-c", "if [ $DVM_RANK = 2 ]; then exit 5; fi; sleep 100"]);
    assert_eq!(out.status.code(), Some(5));
    let err = text(&out).1;
    assert!(err.contains("rank 2 on node") && err.contains("(pid ") && err.contains("status 5"), "{err}");

    // Launch errors: one sentence each, the DVM stays up.
    let out = dvm.prun(&["-n", "2", "/no/such/exe"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(text(&out).1.contains("'/no/such/exe' not found"), "{}", text(&out).1);
    let out = dvm.prun(&["-n", "1", "--wdir", "/no/such/dir", "true"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out).1.contains("/no/such/dir"), "{}", text(&out).1);
    let out = dvm.prun(&["-n", "65", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).1.contains("only 64 slots"), "{}", text(&out).1);
    let out = dvm.prun(&["-n", "65", "--map-by", "slot:oversubscribe", "true"]);
    assert!(out.status.success(), "{}", text(&out).1);
    let out = dvm.prun(&["--bogus", "true"]);
    assert_eq!(out.status.code(), Some(1));
    dvm.assert_up();

    // --timeout kills and says so.
    let out = dvm.prun(&["-n", "2", "--timeout", "1", "sleep", "100"]);
    assert_eq!(out.status.code(), Some(124));
    assert!(text(&out).1.contains("--timeout"), "{}", text(&out).1);

    // 10 MiB from a proc on another daemon arrives byte-exact.
    let blob = std::env::temp_dir().join(format!("dvm-blob-{}-{radix}", std::process::id()));
    let data: Vec<u8> = (0..10u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::write(&blob, &data).unwrap();
    let host = format!("{}-5", hostname());
    let out = dvm.prun(&["-n", "1", "--host", &host, "cat", blob.to_str().unwrap()]);
    let _ = std::fs::remove_file(&blob);
    assert!(out.status.success());
    assert!(out.stdout == data, "10 MiB output differs ({} bytes received)", out.stdout.len());

    // stdin to rank 0 by default, to everyone with --stdin all.
    let out = dvm.prun_with_stdin(&["-n", "2", "sh", "-c", "read x; echo $DVM_RANK:$x"], Some(b"hello\n"));
    let (so, _) = text(&out);
    assert!(so.contains("0:hello") && so.contains("1:"), "{so}");
    assert!(!so.contains("1:hello"), "{so}");
    let out =
        dvm.prun_with_stdin(&["-n", "3", "--stdin", "all", "sh", "-c", "read x; echo $DVM_RANK:$x"], Some(b"hi\n"));
    let (so, _) = text(&out);
    for r in 0..3 {
        assert!(so.contains(&format!("{r}:hi")), "rank {r} missed stdin: {so}");
    }
    // Round-robin placement gives each daemon a strided set of ranks (r, r+8): all get stdin.
    let out = dvm.prun_with_stdin(
        &["-n", "16", "--map-by", "node", "--stdin", "all", "--timeout", "30", "sh", "-c", "read x; echo $DVM_RANK:$x"],
        Some(b"hi\n"),
    );
    let (so, se) = text(&out);
    assert!(out.status.success(), "{se}");
    for r in 0..16 {
        assert!(so.lines().any(|l| l == format!("{r}:hi")), "rank {r} missed stdin: {so}");
    }

    // Launch sizes without launching: a few bytes per proc, nothing started.
    // The marker is this test's own: the other radix's prun may be running at the same moment.
    let sizes_marker = format!("1000.{}{radix}5", std::process::id());
    let out = dvm.prun(&["--launch-sizes", "--map-by", "slot:oversubscribe", "-n", "8000", "sleep", &sizes_marker]);
    assert!(out.status.success(), "{}", text(&out).1);
    let so = text(&out).0;
    let per_proc: f64 = so
        .lines()
        .find_map(|l| l.trim().strip_prefix("per proc: "))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no per-proc figure in: {so}"));
    assert!(per_proc < 1.0, "{so}");
    assert!(procs_with(&sizes_marker).is_empty(), "--launch-sizes started processes");
    // A plan that does not map is the DVM's one sentence, not an RPC status.
    let out = dvm.prun(&["--launch-sizes", "-n", "100000", "true"]);
    let se = text(&out).1;
    assert!(!out.status.success(), "an unmappable plan must fail");
    assert!(se.starts_with("prun: cannot map 100000 processes") && !se.contains("status"), "{se}");

    // MPMD.
    let out = dvm.prun(&["-n", "1", "sh", "-c", "echo A$DVM_APPNUM", ":", "-n", "2", "sh", "-c", "echo B$DVM_APPNUM"]);
    let (so, _) = text(&out);
    assert_eq!((so.matches("A0").count(), so.matches("B1").count()), (1, 2), "{so}");

    // Ctrl-C on prun ends the job and leaves nothing.
    let marker = format!("100.{}{radix}", std::process::id());
    let mut prun = Command::new(PRUN)
        .args(["--dvm-uri", &dvm.uri, "-n", "4", "sleep", &marker])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while procs_with(&marker).len() < 5 {
        assert!(Instant::now() < deadline, "prun and its 4 procs never all ran: {:?}", procs_with(&marker));
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe {
        libc::kill(prun.id() as i32, libc::SIGINT);
    }
    let st = prun.wait().unwrap();
    assert_eq!(st.code(), Some(130), "prun exit after Ctrl-C");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !procs_with(&marker).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(procs_with(&marker).is_empty(), "procs outlived Ctrl-C");
    let mut e = String::new();
    prun.stderr.take().unwrap().read_to_string(&mut e).unwrap();

    // SIGUSR1 on prun reaches every proc; merge-stderr-to-stdout merges.
    let marker = format!("101.{}{radix}", std::process::id());
    let script = format!("trap 'echo got-usr1 $DVM_RANK >&2; exit 0' USR1; sleep {marker} & wait");
    let prun = Command::new(PRUN)
        .args(["--dvm-uri", &dvm.uri, "-n", "2", "--output", "merge-stderr-to-stdout", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    // The sleeps themselves (argv "sleep", marker), not the shells whose script names them:
    // once a shell has started its sleep, its trap is installed.
    while procs_with(&format!("sleep\0{marker}\0")).len() < 2 {
        assert!(Instant::now() < deadline, "the 2 procs never started their sleep");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on the prun this test started.
    unsafe {
        libc::kill(prun.id() as i32, libc::SIGUSR1);
    }
    let o = prun.wait_with_output().unwrap();
    for p in procs_with(&format!("sleep\0{marker}\0")) {
        // SAFETY: the orphaned sleeps of this test.
        unsafe {
            libc::kill(p as i32, libc::SIGKILL);
        }
    }
    assert!(o.status.success(), "{}", text(&o).1);
    let so = text(&o).0;
    assert!(so.contains("got-usr1 0") && so.contains("got-usr1 1"), "USR1 not delivered to both ranks: {so}");

    // Each rank's output in its own files (mpirun's naming), also on the terminal unless
    // :nocopy; binary-safe and in order.
    let out_dir = dvm.root.join("rank-output");
    let spec = format!("dir={}:nocopy", out_dir.display());
    let o = dvm.prun(&["--output", &spec, "-n", "3", "sh", "-c", "seq 1 2000; echo err $DVM_RANK >&2"]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(text(&o).0.is_empty(), "nocopy: nothing on the terminal");
    let job = std::fs::read_dir(&out_dir).unwrap().next().unwrap().unwrap().path();
    let want: String = (1..=2000).map(|k| format!("{k}\n")).collect();
    for r in 0..3 {
        let rank = job.join(format!("rank.{r}"));
        assert_eq!(std::fs::read_to_string(rank.join("stdout")).unwrap(), want, "rank {r}'s stdout");
        assert_eq!(std::fs::read_to_string(rank.join("stderr")).unwrap(), format!("err {r}\n"));
    }
    let o = dvm.prun(&["--output-filename", &out_dir.display().to_string(), "-n", "2", "echo", "copied"]);
    assert_eq!(text(&o).0.matches("copied").count(), 2, "without nocopy: on the terminal too");
    std::fs::remove_dir_all(&out_dir).unwrap();
    // file=PREFIX: both streams of rank N in PREFIX.N, byte-exact.
    let prefix = dvm.root.join("per-rank").join("out");
    let spec = format!("file={}:nocopy", prefix.display());
    let o = dvm.prun(&["--output", &spec, "-n", "2", "sh", "-c", "seq 1 2000; echo err $DVM_RANK >&2"]);
    assert!(o.status.success(), "{}", text(&o).1);
    assert!(text(&o).0.is_empty(), "nocopy: nothing on the terminal");
    for r in 0..2 {
        let got = std::fs::read_to_string(format!("{}.{r}", prefix.display())).unwrap();
        // The streams are read apart: stdout in order, stderr's line somewhere among it.
        let err = format!("err {r}\n");
        assert_eq!(got.matches(&err).count(), 1, "rank {r}'s file: {got}");
        assert_eq!(got.replacen(&err, "", 1), want, "rank {r}'s file");
    }
    std::fs::remove_dir_all(dvm.root.join("per-rank")).unwrap();

    // 50 jobs in a row: nothing left behind.
    for i in 0..50 {
        let out = dvm.prun(&["-n", "4", "true"]);
        assert!(out.status.success(), "job {i}: {}", text(&out).1);
    }
    let leftovers = dvm.leftover_procs();
    assert!(leftovers.is_empty(), "processes left under the daemons: {leftovers:?}");
    dvm.stop();
}

fn hostname() -> String {
    nix::unistd::gethostname().unwrap().to_string_lossy().into_owned()
}

#[test]
fn jobs_radix_2() {
    run_suite(2);
}

#[test]
fn jobs_radix_64() {
    run_suite(64);
}

#[test]
fn one_shot_runs_a_job_and_tears_down() {
    let root = std::env::temp_dir().join(format!("dvm-oneshot-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let out = Command::new(PRUN)
        .args(["--local", "4", "-n", "4", "sh", "-c", "echo r$DVM_RANK"])
        .env("DVM_TMPDIR", &root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches('r').count(), 4);
    let out = Command::new(PRUN)
        .args(["--local", "2", "-n", "1", "sh", "-c", "exit 7"])
        .env("DVM_TMPDIR", &root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    let left = common::session_dirs(&root);
    assert!(left.is_empty(), "one-shot left session dirs: {left:?}");
    let _ = std::fs::remove_dir_all(&root);
}
