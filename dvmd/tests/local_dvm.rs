//! Real DVMs on this machine: `dvmd --local N` daemons as processes on loopback addresses,
//! driven through the authenticated control API, stopped with `pterm`. Every test runs in its
//! own session root and checks that no process and no session directory is left.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;

use common::{alive, session_dirs};
use dvm_proto::control::{BenchKind, BenchRequest};
use dvm_tests::LineReader;
use dvmd::control::Client;
use dvmd::session::DvmUri;

const DVMD: &str = env!("CARGO_BIN_EXE_dvmd");
const PTERM: &str = env!("CARGO_BIN_EXE_pterm");

/// Only guards against a hung dvmd; never what decides pass or fail.
const BOOT_GUARD: Duration = Duration::from_secs(120);
const EXIT_GUARD: Duration = Duration::from_secs(30);

/// A DVM started by a test; everything is killed by PID and removed on drop.
struct TestDvm {
    hnp: Child,
    root: PathBuf,
    uri_file: PathBuf,
    /// Every line the HNP printed on stdout so far (all of it once `pterm` returned).
    stdout_lines: Vec<String>,
    out: LineReader,
    pids: Vec<u32>,
}

fn test_root(name: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("dvm-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    root
}

/// Echoes a child's stderr as it comes; the whole of it arrives on the channel at its end.
fn tee_stderr(err: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut all = String::new();
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("{l}");
            all.push_str(&l);
            all.push('\n');
        }
        let _ = tx.send(all);
    });
    rx
}

impl TestDvm {
    fn start(name: &str, extra: &[&str], env: &[(&str, &str)]) -> Result<TestDvm, (i32, String)> {
        let root = test_root(name);
        let uri_file = root.join("uri.txt");
        let mut cmd = Command::new(DVMD);
        cmd.args(extra)
            .arg("--report-uri")
            .arg(&uri_file)
            .env("DVM_TMPDIR", &root)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut hnp = cmd.spawn().expect("start dvmd");
        // Both pipes are read on threads, so dvmd never blocks on them and no wait here is
        // unbounded.
        let mut out = LineReader::new(hnp.stdout.take().unwrap());
        let err = tee_stderr(hnp.stderr.take().unwrap());
        let mut stdout_lines = Vec::new();
        let deadline = Instant::now() + BOOT_GUARD;
        loop {
            match out.next_line(deadline.saturating_duration_since(Instant::now())) {
                Ok(Some(line)) => {
                    let ready = line == "DVM ready";
                    stdout_lines.push(line);
                    if ready {
                        break;
                    }
                }
                Ok(None) => {
                    // dvmd ended before it was ready.
                    let code = wait_exit(&mut hnp, EXIT_GUARD).unwrap_or_else(|| {
                        let _ = hnp.kill();
                        let _ = hnp.wait();
                        panic!("dvmd closed its stdout before `DVM ready` but did not exit")
                    });
                    let err = err.recv_timeout(EXIT_GUARD).expect("stderr of the exited dvmd did not end");
                    let _ = std::fs::remove_dir_all(&root);
                    return Err((code, err));
                }
                Err(e) => {
                    let _ = hnp.kill();
                    let _ = hnp.wait();
                    let _ = std::fs::remove_dir_all(&root);
                    panic!("dvmd {extra:?} was not ready within {BOOT_GUARD:?}: {e}");
                }
            }
        }
        Ok(TestDvm { hnp, root, uri_file, stdout_lines, out, pids: Vec::new() })
    }

    fn uri(&self) -> DvmUri {
        DvmUri::parse(&std::fs::read_to_string(&self.uri_file).unwrap()).unwrap()
    }

    async fn client(&self) -> Client {
        Client::connect(self.uri()).await.expect("control client")
    }

    /// Record every daemon PID (for the leftover check).
    async fn learn_pids(&mut self) {
        let st = self.client().await.status().await.unwrap();
        self.pids = st.daemons.iter().map(|d| d.pid).collect();
    }

    fn pterm(&mut self) {
        let st =
            Command::new(PTERM).arg("--dvm-uri").arg(format!("file:{}", self.uri_file.display())).status().unwrap();
        assert!(st.success(), "pterm failed: {st}");
        let code = wait_exit(&mut self.hnp, EXIT_GUARD).expect("dvmd did not exit after pterm");
        assert_eq!(code, 0, "dvmd exit status after pterm");
        // The rest of its stdout, to its end.
        while let Some(line) = self.out.next_line(EXIT_GUARD).expect("stdout of the exited dvmd did not end") {
            self.stdout_lines.push(line);
        }
    }

    /// Nothing left: no daemon process, no session directory.
    fn assert_clean(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left: Vec<u32> = self.pids.iter().copied().filter(|&p| alive(p)).collect();
        assert!(left.is_empty(), "daemon processes left running: {left:?}");
        let sessions = session_dirs(&self.root);
        assert!(sessions.is_empty(), "session directories left behind: {sessions:?}");
    }
}

impl Drop for TestDvm {
    fn drop(&mut self) {
        let _ = self.hnp.kill();
        let _ = self.hnp.wait();
        for &p in &self.pids {
            unsafe {
                libc::kill(p as i32, libc::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st.code().unwrap_or(-1));
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Children of slot r in the failure-free radix tree, by the layout formula
/// (level d starts at (R^d-1)/(R-1); children of r at depth d are r + j·R^d).
fn expected_children(r: u32, radix: u32, n: u32) -> Vec<u32> {
    let (mut depth, mut start, mut width) = (0u32, 0u64, 1u64);
    while r as u64 >= start + width {
        start += width;
        width *= radix as u64;
        depth += 1;
    }
    let stride = (radix as u64).pow(depth);
    (1..=radix as u64).map(|j| r as u64 + j * stride).filter(|&c| c < n as u64).map(|c| c as u32).collect()
}

async fn boot_and_exercise(radix: u32) {
    let n = 16;
    let mut dvm = TestDvm::start(&format!("boot{radix}"), &["--local", "16", "--radix", &radix.to_string()], &[])
        .unwrap_or_else(|(code, err)| panic!("dvmd failed ({code}): {err}"));
    dvm.learn_pids().await;
    let mut c = dvm.client().await;

    // Every daemon's own view of the tree matches the HNP's and the layout formula.
    let status = c.status().await.unwrap();
    assert_eq!(status.num_daemons, n);
    let views = c.tree_views().await.unwrap().views;
    assert_eq!(views.len(), n as usize);
    for v in &views {
        let hnp_view = &status.daemons[v.rank as usize];
        assert_eq!(v.parent, hnp_view.parent, "daemon {} parent", v.rank);
        assert_eq!(v.children, hnp_view.children, "daemon {} children", v.rank);
        assert_eq!(v.children, expected_children(v.rank, radix, n), "daemon {} children vs formula", v.rank);
        // Each daemon measures its loop: it has taken steps (check-in, wireup), and its
        // timer lateness figures are ordered.
        assert!(v.longest_step_us > 0, "daemon {}: no step measured: {v:?}", v.rank);
        assert!(v.late_p50_us <= v.late_p99_us && v.late_p99_us <= v.late_max_us, "daemon {}: {v:?}", v.rank);
        for &ch in &v.children {
            assert_eq!(views[ch as usize].parent, v.rank);
        }
    }

    // The depth the matrix is here for: radix 2 and 4 over 16 daemons are multi-level trees
    // (every relay path exercised), radix 64 is flat.
    let depth_of = |mut r: u32| {
        let mut d = 0;
        while views[r as usize].parent != u32::MAX {
            r = views[r as usize].parent;
            d += 1;
            assert!(d <= n, "parent cycle through daemon {r}");
        }
        d
    };
    let height = (0..n).map(depth_of).max().unwrap();
    let want_height = match radix {
        2 => 4,
        4 => 2,
        _ => 1,
    };
    assert_eq!(height, want_height, "tree height at radix {radix} over {n} daemons");

    // A 1 MiB xcast completes (every daemon holds it).
    let x = c
        .bench(BenchRequest { kind: BenchKind::Xcast as i32, count: 1, bytes: 1 << 20, ..Default::default() })
        .await
        .unwrap();
    assert_eq!((x.latencies_ns.len(), x.errors), (1, 0));

    // 1,000 back-to-back fences alternating barrier and modex: every daemon checks every result.
    let count = if radix < n { 1000 } else { 200 };
    let f = c
        .bench(BenchRequest { kind: BenchKind::Alternate as i32, count, bytes: 64, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(f.errors, 0, "{}", f.first_error);
    assert_eq!(f.latencies_ns.len() as u64, count);

    dvm.pterm();
    // Over the DVM's whole life (boot, collectives, teardown) the HNP announced it once.
    let ready = dvm.stdout_lines.iter().filter(|l| *l == "DVM ready").count();
    assert_eq!(ready, 1, "`DVM ready` printed {ready} times; stdout: {:?}", dvm.stdout_lines);
    dvm.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_daemons_radix_2() {
    boot_and_exercise(2).await;
}

/// Two levels below the HNP: 1 + 4 + 11 daemons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_daemons_radix_4() {
    boot_and_exercise(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_daemons_radix_64() {
    boot_and_exercise(64).await;
}

#[test]
fn wrong_secret_fails_the_boot_by_name() {
    let err = match TestDvm::start(
        "secret",
        &["--local", "4", "--radix", "2", "--startup-timeout", "20"],
        &[("DVMD_FAULT_WRONG_SECRET_RANK", "2")],
    ) {
        Ok(_) => panic!("a DVM with a daemon holding the wrong secret came up"),
        Err((code, err)) => {
            assert_eq!(code, 1);
            err
        }
    };
    assert!(err.contains("daemon 2 on host"), "boot failure does not name the daemon: {err}");
    assert!(err.to_lowercase().contains("auth") || err.contains("secret") || err.contains("refused"), "{err}");
    // The refusal is logged by the HNP with the peer's address.
    assert!(
        err.contains("refused RML connection") && err.contains("addr=127.0.0."),
        "refusal not logged with the address: {err}"
    );
    let root = std::env::temp_dir().join(format!("dvm-test-secret-{}", std::process::id()));
    assert!(session_dirs(&root).is_empty());
    let _ = std::fs::remove_dir_all(root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_a_daemon_port_is_harmless() {
    let mut dvm =
        TestDvm::start("garbage", &["--local", "4", "--radix", "2"], &[]).unwrap_or_else(|(c, e)| panic!("{c}: {e}"));
    dvm.learn_pids().await;
    let mut c = dvm.client().await;
    let st = c.status().await.unwrap();
    for d in &st.daemons {
        for attempt in 0..3u8 {
            let Ok(mut s) = std::net::TcpStream::connect(&d.addr) else { continue };
            let junk: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> (attempt + 3)) as u8).collect();
            let _ = s.write_all(&junk);
            // A length prefix far above the limit.
            let _ = s.write_all(&u32::MAX.to_be_bytes());
        }
    }
    // The DVM still works and nobody died.
    let f = c
        .bench(BenchRequest { kind: BenchKind::Alternate as i32, count: 20, bytes: 8, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(f.errors, 0);
    assert!(dvm.pids.iter().all(|&p| alive(p)));
    dvm.pterm();
    dvm.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_hnp_ends_every_daemon() {
    let mut dvm =
        TestDvm::start("hnpkill", &["--local", "8", "--radix", "2"], &[]).unwrap_or_else(|(c, e)| panic!("{c}: {e}"));
    dvm.learn_pids().await;
    let t0 = Instant::now();
    unsafe {
        libc::kill(dvm.hnp.id() as i32, libc::SIGKILL);
    }
    let _ = dvm.hnp.wait();
    let daemons: Vec<u32> = dvm.pids[1..].to_vec();
    let deadline = Instant::now() + Duration::from_secs(30);
    while daemons.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("all daemons gone {:?} after the HNP was killed", t0.elapsed());
    let left: Vec<u32> = daemons.iter().copied().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "daemons outlived the HNP: {left:?}");
    // Daemons removed their own session directories; the HNP's (killed) is the only one left.
    let left_dirs: Vec<PathBuf> = session_dirs(&dvm.root)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("dvmd-")))
        .collect();
    assert!(left_dirs.is_empty(), "{left_dirs:?}");
}

#[test]
fn bad_command_lines_are_refused_by_name() {
    let cases: &[(&[&str], &str)] = &[
        (&["--local", "4", "--radix", "1"], "--radix 1"),
        (&["--local", "0"], "--local 0"),
        (&["--hostfile", "/nonexistent/hostfile"], "/nonexistent/hostfile"),
        (&["--host", "a,,b"], "--host"),
        (&["--local", "2", "--bogus"], "--bogus"),
        (&[], "--local N"),
    ];
    for (args, needle) in cases {
        let out = Command::new(DVMD).args(*args).env("DVM_TMPDIR", std::env::temp_dir()).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: stderr does not name {needle}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_daemon_is_named_and_the_tree_repairs() {
    let mut dvm = TestDvm::start("daemonloss", &["--local", "8", "--radix", "2"], &[])
        .unwrap_or_else(|(c, e)| panic!("{c}: {e}"));
    dvm.learn_pids().await;
    let mut c = dvm.client().await;
    // Daemon 1 relays for 3, 5 and 7 at radix 2.
    let victim = dvm.pids[1];
    unsafe {
        libc::kill(victim as i32, libc::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let st = c.status().await.unwrap();
        if !st.daemons[1].alive {
            break st;
        }
        assert!(Instant::now() < deadline, "daemon 1 never marked lost");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Survivors agree with the HNP on the repaired tree and it spans every live daemon.
    let views = c.tree_views().await.unwrap().views;
    assert_eq!(views.len(), 7);
    for v in &views {
        let hnp_view = &status.daemons[v.rank as usize];
        assert_eq!((v.parent, &v.children), (hnp_view.parent, &hnp_view.children), "daemon {}", v.rank);
        assert!(!v.children.contains(&1) && v.parent != 1);
    }
    // Collectives still work over the survivors, results checked on every daemon.
    let f = c
        .bench(BenchRequest { kind: BenchKind::Alternate as i32, count: 100, bytes: 32, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(f.errors, 0, "{}", f.first_error);
    let x = c
        .bench(BenchRequest { kind: BenchKind::Xcast as i32, count: 5, bytes: 4096, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(x.errors, 0);
    dvm.pids.retain(|&p| p != victim);
    dvm.pterm();
    dvm.assert_clean();
}

/// `dvmd --one-job` (what a one-shot prun starts) ends itself, in order and leaving nothing,
/// once its one job has ended — and once a launch was refused; a DVM without it keeps running.
#[tokio::test]
async fn a_one_job_dvm_ends_itself_after_its_job() {
    let prun = |uri: &std::path::Path, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_prun"))
            .arg("--dvm-uri")
            .arg(format!("file:{}", uri.display()))
            .args(args)
            .output()
            .unwrap()
    };
    // A job that ran: the DVM exits 0 by itself (the guard only bounds a hang).
    let mut dvm = TestDvm::start("onejob1", &["--local", "3", "--one-job"], &[]).expect("boot");
    dvm.learn_pids().await;
    let out = prun(&dvm.uri_file, &["-n", "3", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(wait_exit(&mut dvm.hnp, EXIT_GUARD), Some(0), "the one-job DVM did not end after its job");
    dvm.assert_clean();

    // A launch refused (it does not map): the same.
    let mut dvm = TestDvm::start("onejob2", &["--local", "2", "--one-job"], &[]).expect("boot");
    dvm.learn_pids().await;
    let out = prun(&dvm.uri_file, &["-n", "100", "true"]);
    assert!(!out.status.success());
    assert_eq!(wait_exit(&mut dvm.hnp, EXIT_GUARD), Some(0), "the one-job DVM did not end after a refused launch");
    dvm.assert_clean();

    // Without it, the DVM outlives its jobs.
    let mut dvm = TestDvm::start("onejob3", &["--local", "2"], &[]).expect("boot");
    dvm.learn_pids().await;
    let out = prun(&dvm.uri_file, &["-n", "2", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = prun(&dvm.uri_file, &["-n", "2", "true"]);
    assert!(out.status.success(), "a second job on a DVM without --one-job: {}", String::from_utf8_lossy(&out.stderr));
    dvm.pterm();
    dvm.assert_clean();
}
