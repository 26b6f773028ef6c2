//! `prun` at the edges of a job, with real processes: SIGINT/SIGTERM at any moment of a one-shot
//! job (from the first milliseconds of the boot on), a closed stdout, the DVM's head process
//! killed during a job, and concurrent one-shot DVMs that must stay private to their prun.
//!
//! Every test runs in its own session root (`DVM_TMPDIR`), waits for conditions (never for a
//! time) before acting, and checks that no dvmd, no job process and no session directory is
//! left; whatever is left is killed by PID when the test ends.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{
    alive, children_of, descendants, procs_in_root, procs_with, session_dirs, signal, text, wait_output, Dvm, Nodes,
    DVMD, PRUN, PTERM,
};

/// A session root for one test. Every process that carries it in `DVM_TMPDIR` (prun, dvmd and
/// its daemons) or whose command line holds one of the markers (the job's processes) is killed
/// by PID on drop, and the root is removed.
struct Scratch {
    root: PathBuf,
    markers: Vec<String>,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let root = std::env::temp_dir().join(format!("dvm-edge-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        Scratch { root, markers: Vec::new() }
    }

    /// A path unique to this test, to put on a job's command line.
    fn marker(&mut self, what: &str) -> String {
        let m = format!("{}/{what}", self.root.display());
        self.markers.push(m.clone());
        m
    }

    /// A `sleep` duration of about 300 s unique to this test (`n` unique in this file), so the
    /// job's processes can be found by command line.
    fn sleep_marker(&mut self, n: u32) -> String {
        let m = format!("300.{}{n:02}", std::process::id());
        self.markers.push(m.clone());
        m
    }

    fn prun(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(PRUN);
        cmd.args(args).env("DVM_TMPDIR", &self.root).env_remove("PRUN_DVMD_ARGS").stdin(Stdio::null());
        cmd
    }

    /// Processes of this test: dvmd and prun by environment, job processes by marker.
    fn processes(&self) -> Vec<u32> {
        let mut pids = procs_in_root(&self.root);
        for m in &self.markers {
            pids.extend(procs_with(m));
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Wait (at most 20 s) until no process of this test and no session directory is left;
    /// panic naming what is left.
    fn assert_clean(&self, when: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (procs, dirs) = (self.processes(), session_dirs(&self.root));
            if procs.is_empty() && dirs.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                let what: Vec<String> = procs.iter().map(|&p| format!("{p}: {}", cmdline(p))).collect();
                panic!("{when}: left behind: processes {what:?}, session dirs {dirs:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for p in self.processes() {
            signal(p, libc::SIGKILL);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " ").trim().to_string())
        .unwrap_or_default()
}

/// Signal a process group this test started (as a terminal does on Ctrl-C).
fn kill_group(pgid: u32, sig: i32) {
    // SAFETY: kill(2) on the process group of a prun this test started in its own group.
    unsafe {
        libc::kill(-(pgid as i32), sig);
    }
}

/// Wait (at most `secs`) for `cond`; false if it never held.
fn wait_until(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// How long a prun (or dvmd) may take to end before the test fails (a hang guard).
const END_GUARD: Duration = Duration::from_secs(60);

/// The job's processes: command lines that hold `marker`, without prun and without a shell's
/// short-lived forks (a child that still carries its parent's command line).
fn job_procs(marker: &str) -> Vec<u32> {
    let all = procs_with(marker);
    all.iter()
        .copied()
        .filter(|&p| !cmdline(p).starts_with(PRUN) && !parent_of(p).is_some_and(|pp| all.contains(&pp)))
        .collect()
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()
}

/// The one-shot dvmd (HNP) that `prun` started.
fn hnp_of(prun: u32) -> Option<u32> {
    children_of(prun).into_iter().find(|&c| cmdline(c).starts_with(DVMD))
}

// ------------------------------------------------------------------ case 3: early signals

/// A SIGINT (to prun's whole process group, as a terminal's Ctrl-C) or a SIGTERM (to prun alone)
/// at any moment of a one-shot job — during dvmd's start, its boot, the launch, or the job —
/// gives 128 + signo and leaves nothing running. Only the exit status and the leftovers are
/// asserted: which phase a delay lands in does not matter. A signal that lands before prun's
/// `main` runs kills prun by that signal, which a shell reports as the same 128 + signo.
#[test]
fn a_signal_at_any_early_moment_gives_128_plus_signo_and_leaves_nothing() {
    let mut s = Scratch::new("early");
    let marker = s.sleep_marker(1);
    let cases: Vec<(u64, i32, bool)> = [0u64, 5, 10, 20, 35, 50, 80, 150, 300, 600]
        .iter()
        .map(|&d| (d, libc::SIGINT, true))
        .chain([10u64, 50, 300].iter().map(|&d| (d, libc::SIGTERM, false)))
        .collect();
    for (delay, sig, group) in cases {
        let what = format!("signal {sig} {}after {delay} ms", if group { "to the process group " } else { "" });
        let mut prun = s
            .prun(&["--local", "4", "-n", "4", "sleep", &marker])
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        if group {
            kill_group(prun.id(), sig);
        } else {
            signal(prun.id(), sig);
        }
        let o = wait_output(&mut prun, END_GUARD, &what);
        let (st, err) = (o.status, text(&o).1);
        assert!(
            st.code() == Some(128 + sig) || (st.code().is_none() && st.signal() == Some(sig)),
            "{what}: prun ended with {st}, want status {}; stderr: {err}",
            128 + sig
        );
        s.assert_clean(&what);
    }
}

/// The common case, with the job's processes known to run: Ctrl-C gives 130, nothing is left.
#[test]
fn ctrl_c_during_a_one_shot_job_gives_130_and_leaves_nothing() {
    let mut s = Scratch::new("ctrlc");
    let marker = s.sleep_marker(2);
    let mut prun = s
        .prun(&["--local", "4", "--slots", "2", "-n", "8", "sleep", &marker])
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_until(60, || job_procs(&marker).len() == 8), "the job's 8 processes never ran");
    kill_group(prun.id(), libc::SIGINT);
    let o = wait_output(&mut prun, END_GUARD, "Ctrl-C");
    let st = o.status;
    assert_eq!(st.code(), Some(130), "{}", text(&o).1);
    s.assert_clean("Ctrl-C during the job");
}

// ------------------------------------------------------------------ case 4: closed stdout

/// Read two lines of a job's endless output, then close the pipe (as `prun ... | head -2`):
/// prun ends the job and exits 141 without any complaint about a signal.
fn read_two_lines_then_close(mut prun: Child, what: &str) -> (ExitStatus, String) {
    let mut out = BufReader::new(prun.stdout.take().unwrap());
    for _ in 0..2 {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "{what}: the job printed nothing");
    }
    drop(out);
    let o = wait_output(&mut prun, END_GUARD, what);
    (o.status, text(&o).1)
}

fn assert_quiet(what: &str, st: ExitStatus, err: &str) {
    assert_eq!(st.code(), Some(141), "{what}: want the SIGPIPE status 141; stderr: {err}");
    // Not a word from prun, nor about a signal nobody sent. (Lines the daemons log through
    // tracing are theirs, not prun's.)
    assert!(!err.lines().any(|l| l.starts_with("prun:")), "{what}: stderr: {err}");
    assert!(!err.contains("signal") && !err.contains("killed"), "{what}: stderr: {err}");
}

#[test]
fn a_closed_stdout_ends_a_one_shot_job_quietly_with_status_141() {
    let mut s = Scratch::new("pipe1");
    let marker = s.marker("pipe1");
    let script = format!("while :; do echo line-$DVM_RANK; done # {marker}");
    for tag in [false, true] {
        let mut args = vec!["--local", "2", "-n", "2"];
        if tag {
            args.extend(["--output", "tag"]);
        }
        args.extend(["sh", "-c", &script]);
        let prun = s.prun(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let what = format!("one-shot, tagged output {tag}");
        let (st, err) = read_two_lines_then_close(prun, &what);
        assert_quiet(&what, st, &err);
        s.assert_clean(&what);
    }
}

/// A one-shot DVM ends itself when its job ends, but not before its prun has read everything:
/// a prun whose reader stalls past the job's end (and past the 5 s the head process gives its
/// control server to finish at exit) still gets every byte and the job's status. The stall is
/// the scenario, not a measured quantity: nothing here passes or fails on a time.
#[test]
fn a_one_shot_dvm_waits_for_a_stalled_reader_before_it_ends() {
    let mut s = Scratch::new("stall1");
    let marker = s.marker("stall1");
    // 8 ranks x 900,000 bytes: each within its daemon's output window, so the job ends while
    // prun, blocked on its full stdout pipe, has megabytes still to take — more than the
    // loopback socket buffers hold.
    let script = format!("head -c 900000 /dev/zero | tr '\\0' x # {marker}");
    let prun = s.prun(&["--local", "8", "-n", "8", "sh", "-c", &script]).stdout(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_secs(9));
    let out = prun.wait_with_output().unwrap();
    assert_eq!(out.stdout.len(), 7_200_000, "prun lost output of a job whose DVM ended itself");
    assert!(out.stdout.iter().all(|&b| b == b'x'));
    assert!(out.status.success(), "the job's status: {:?}", out.status);
    s.assert_clean("after a stalled reader");
}

#[test]
fn a_closed_stdout_ends_a_job_on_a_persistent_dvm_quietly_with_status_141() {
    let dvm = Dvm::start("edge-pipe", Nodes::Local { daemons: 3, slots: 2 }, 2, &[]);
    let marker = format!("{}/pipe2", dvm.root.display());
    let script = format!("while :; do echo line-$DVM_RANK; done # {marker}");
    let prun = Command::new(PRUN)
        .args(["--dvm-uri", &dvm.uri, "-n", "4", "sh", "-c", &script])
        .env("DVM_TMPDIR", &dvm.root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (st, err) = read_two_lines_then_close(prun, "persistent DVM");
    assert_quiet("persistent DVM", st, &err);
    assert!(wait_until(20, || job_procs(&marker).is_empty()), "the job outlived prun");
    dvm.assert_up();
    assert!(dvm.leftover_procs().is_empty(), "processes left under the daemons: {:?}", dvm.leftover_procs());
    dvm.stop();
}

// ------------------------------------------------------------------ case 6: HNP killed

/// prun's whole stderr is one sentence saying the head process ended, naming its pid and URI;
/// no transport text.
fn assert_names_the_head(err: &str, hnp: u32, st: ExitStatus) {
    assert_eq!(st.code(), Some(125), "want the lost-DVM status 125; stderr: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("prun:")).collect();
    assert_eq!(lines.len(), 1, "want one line from prun: {err}");
    let line = lines[0];
    assert!(line.contains("head process ended during the job"), "{line}");
    assert!(line.contains(&format!("pid {hnp}")) && line.contains("dvm://"), "{line}");
    for raw in ["h2", "status:", "Unknown", "transport", "message:"] {
        assert!(!line.contains(raw), "transport text '{raw}' in: {line}");
    }
}

/// A URI kept from a DVM that has since ended (a `--report-uri` file reused): prun and pterm
/// say no DVM runs there, in one sentence naming the URI, and exit 1; also when the head
/// process was killed and left its session directory.
#[test]
fn a_uri_of_a_dvm_that_ended_is_refused_in_one_sentence() {
    let dvm = Dvm::start("edge-gone", Nodes::Local { daemons: 2, slots: 1 }, 2, &[]);
    // In the test's root: removed with it, even when an assertion fails.
    let kept = dvm.root.join("kept.uri");
    std::fs::copy(dvm.uri.trim_start_matches("file:"), &kept).unwrap();
    let uri = format!("file:{}", kept.display());
    let refused = |what: &str, cmd: &mut Command| -> String {
        let o = cmd.env("DVM_TMPDIR", &dvm.root).stdin(Stdio::null()).output().unwrap();
        let err = text(&o).1;
        assert_eq!(o.status.code(), Some(1), "{what}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{what}: one sentence expected: {err}");
        assert!(err.contains("no DVM runs at dvm://"), "{what}: {err}");
        err
    };
    let hnp = dvm.pids[0];
    // The head process killed: its session directory is still there.
    signal(hnp, libc::SIGKILL);
    assert!(wait_until(20, || !alive(hnp)), "the HNP did not die");
    let err = refused("prun, head killed", Command::new(PRUN).args(["--dvm-uri", &uri, "-n", "1", "true"]));
    assert!(err.contains(&format!("head process (dvmd, pid {hnp}) has ended")), "{err}");
    // Once its session directory is gone too (as after pterm).
    assert!(wait_until(20, || dvm.pids.iter().all(|&p| !alive(p))), "daemons outlived the HNP");
    for d in session_dirs(&dvm.root) {
        let _ = std::fs::remove_dir_all(d);
    }
    let err = refused("prun, session gone", Command::new(PRUN).args(["--dvm-uri", &uri, "-n", "1", "true"]));
    assert!(err.contains("session directory") && err.contains("is gone"), "{err}");
    refused("pterm, session gone", Command::new(PTERM).args(["--dvm-uri", &uri]));
}

#[test]
fn the_head_process_killed_during_a_job_on_a_persistent_dvm_is_named_in_one_sentence() {
    let dvm = Dvm::start("edge-hnp", Nodes::Local { daemons: 3, slots: 2 }, 2, &[]);
    let marker = format!("300.{}03", std::process::id());
    let mut prun = Command::new(PRUN)
        .args(["--dvm-uri", &dvm.uri, "-n", "6", "sleep", &marker])
        .env("DVM_TMPDIR", &dvm.root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_until(60, || job_procs(&marker).len() == 6), "the job's processes never ran");
    let hnp = dvm.pids[0];
    signal(hnp, libc::SIGKILL);
    let o = wait_output(&mut prun, END_GUARD, "HNP killed");
    let (st, err) = (o.status, text(&o).1);
    assert_names_the_head(&err, hnp, st);
    // Daemons and ranks end with the head; the head's session directory does not stay behind.
    assert!(wait_until(20, || dvm.pids.iter().all(|&p| !alive(p))), "daemons outlived the HNP");
    assert!(wait_until(20, || job_procs(&marker).is_empty()), "the job outlived the HNP");
    assert!(wait_until(20, || session_dirs(&dvm.root).is_empty()), "left: {:?}", session_dirs(&dvm.root));
}

#[test]
fn the_head_process_of_a_one_shot_dvm_killed_during_a_job_is_named_in_one_sentence() {
    let mut s = Scratch::new("hnp2");
    let marker = s.sleep_marker(4);
    let mut prun = s
        .prun(&["--local", "3", "-n", "3", "sleep", &marker])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_until(60, || job_procs(&marker).len() == 3), "the job's processes never ran");
    let hnp = hnp_of(prun.id()).expect("prun's dvmd");
    signal(hnp, libc::SIGKILL);
    let o = wait_output(&mut prun, END_GUARD, "one-shot HNP killed");
    let (st, err) = (o.status, text(&o).1);
    assert_names_the_head(&err, hnp, st);
    assert!(err.contains("killed by signal 9"), "{err}");
    s.assert_clean("one-shot HNP killed");
}

// ------------------------------------------------------------------ case 8: private one-shots

/// A job of `n` processes that runs until `flag` exists.
fn until_flag(flag: &str) -> String {
    format!("while [ ! -e {flag} ]; do sleep 0.02; done")
}

/// Start a one-shot prun running `n` processes until `flag` exists; return once they all run.
fn start_waiting_job(s: &Scratch, dvm_args: &[&str], n: u32, flag: &str, env: &[(&str, &str)]) -> Child {
    let script = until_flag(flag);
    let n_s = n.to_string();
    let mut args: Vec<&str> = dvm_args.to_vec();
    args.extend(["-n", &n_s, "sh", "-c", &script]);
    let prun = s.prun(&args).envs(env.iter().copied()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    assert!(wait_until(60, || job_procs(flag).len() == n as usize), "the job on {dvm_args:?} never ran");
    prun
}

/// Two concurrent one-shot pruns: the second boots its own DVM (its processes are not under the
/// first one's dvmd), survives the first one's end, and both exit 0.
fn two_one_shots_at_once(s: &mut Scratch, dvm_args: &[&str], env: &[(&str, &str)]) {
    let (flag_a, flag_b) = (s.marker("flag-a"), s.marker("flag-b"));
    let mut a = start_waiting_job(s, dvm_args, 4, &flag_a, env);
    let mut b = start_waiting_job(s, dvm_args, 4, &flag_b, env);
    let hnp_a = hnp_of(a.id()).expect("the first prun's dvmd");
    let hnp_b = hnp_of(b.id()).expect("the second prun started no dvmd of its own");
    let under_a = descendants(hnp_a);
    assert!(job_procs(&flag_b).iter().all(|p| !under_a.contains(p)), "the second job runs on the first one's DVM");
    assert!(descendants(hnp_b).iter().any(|p| job_procs(&flag_b).contains(p)), "the second job is not on its own DVM");

    std::fs::write(&flag_a, "").unwrap();
    let o = wait_output(&mut a, END_GUARD, "first one-shot");
    let st = o.status;
    assert!(st.success(), "first one-shot: {st}; {}", text(&o).1);
    // The first DVM is gone (its prun waited for it); the second job still runs.
    assert!(!alive(hnp_a), "the first DVM outlived its prun");
    assert_eq!(job_procs(&flag_b).len(), 4, "the first one-shot's end killed the second job");
    std::fs::write(&flag_b, "").unwrap();
    let o = wait_output(&mut b, END_GUARD, "second one-shot");
    let st = o.status;
    assert!(st.success(), "second one-shot: {st}; {}", text(&o).1);
    s.assert_clean("two one-shots");
}

/// Three fake hosts whose daemons run here through a launch agent that only tags the command.
fn fake_hosts(s: &Scratch) -> (PathBuf, String) {
    let hf = s.root.join("hosts");
    std::fs::write(&hf, "h1 slots=2\nh2 slots=2\nh3 slots=2\n").unwrap();
    (hf, "--launch-agent 'env DVM_TEST_NODE={host}' --bind-address 127.0.0.1 --radix 2".to_string())
}

#[test]
fn two_hostfile_one_shots_at_once_each_get_their_own_dvm() {
    let mut s = Scratch::new("two-hf");
    let (hf, dvmd_args) = fake_hosts(&s);
    let hf = hf.display().to_string();
    two_one_shots_at_once(&mut s, &["--hostfile", &hf], &[("PRUN_DVMD_ARGS", &dvmd_args)]);
}

#[test]
fn two_local_one_shots_at_once_each_get_their_own_dvm() {
    let mut s = Scratch::new("two-local");
    two_one_shots_at_once(&mut s, &["--local", "2", "--slots", "2"], &[]);
}

/// A persistent DVM in the scratch root, for discovery; stopped with pterm by URI.
struct Persistent {
    hnp: Child,
    uri: String,
}

impl Persistent {
    fn start(s: &Scratch, name: &str) -> Persistent {
        let uri_file = s.root.join(format!("{name}.uri"));
        let mut hnp = Command::new(DVMD)
            .args(["--local", "2", "--report-uri"])
            .arg(&uri_file)
            .env("DVM_TMPDIR", &s.root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        dvm_tests::wait_for_line(hnp.stdout.take().unwrap(), "DVM ready", Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("persistent DVM {name} did not start: {e}"));
        let uri = std::fs::read_to_string(&uri_file).unwrap().trim().to_string();
        Persistent { hnp, uri }
    }

    fn stop(mut self, s: &Scratch) {
        let out = Command::new(PTERM).args(["--dvm-uri", &self.uri]).env("DVM_TMPDIR", &s.root).output().unwrap();
        assert!(out.status.success(), "pterm {}: {}", self.uri, text(&out).1);
        let o = wait_output(&mut self.hnp, END_GUARD, "persistent dvmd after pterm");
        let st = o.status;
        assert!(st.success(), "persistent dvmd: {st}");
    }
}

/// No other command finds a one-shot DVM; a persistent one is found when it is the only one;
/// with several, tools refuse to choose and name them all.
#[test]
fn one_shot_dvms_are_never_discovered_and_several_persistent_dvms_are_named() {
    let mut s = Scratch::new("discover");
    let flag = s.marker("flag");
    let mut one_shot = start_waiting_job(&s, &["--local", "2"], 2, &flag, &[]);
    let (hf, dvmd_args) = fake_hosts(&s);
    let hf = hf.display().to_string();

    // Only the one-shot runs: nothing to attach to, nothing for pterm to stop.
    let out = Command::new(PTERM).env("DVM_TMPDIR", &s.root).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "pterm found the one-shot DVM");
    assert!(text(&out).1.contains("no running DVM"), "{}", text(&out).1);
    let out = s.prun(&["-n", "1", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "prun attached to the one-shot DVM");
    assert!(text(&out).1.contains("no running DVM"), "{}", text(&out).1);

    // One persistent DVM: prun without options runs there (rank 0 sits on its HNP).
    let p1 = Persistent::start(&s, "p1");
    let out = s.prun(&["-n", "1", "sh", "-c", "echo $PPID"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out).1);
    assert_eq!(text(&out).0.trim(), p1.hnp.id().to_string(), "the job did not run on the persistent DVM");

    // Two: prun --hostfile and pterm refuse in one sentence naming both, and start nothing.
    let p2 = Persistent::start(&s, "p2");
    let before = procs_in_root(&s.root).len();
    let out = s.prun(&["--hostfile", &hf, "-n", "1", "true"]).env("PRUN_DVMD_ARGS", &dvmd_args).output().unwrap();
    let err = text(&out).1;
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(&p1.uri) && err.contains(&p2.uri) && err.contains("--dvm-uri"), "{err}");
    let out = Command::new(PTERM).env("DVM_TMPDIR", &s.root).output().unwrap();
    let err = text(&out).1;
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&p1.uri) && err.contains(&p2.uri), "{err}");
    assert_eq!(procs_in_root(&s.root).len(), before, "a refused command started or stopped something");

    p1.stop(&s);
    p2.stop(&s);
    std::fs::write(&flag, "").unwrap();
    let o = wait_output(&mut one_shot, END_GUARD, "one-shot");
    let st = o.status;
    assert!(st.success(), "one-shot: {st}; {}", text(&o).1);
    s.assert_clean("discovery");
}
