//! File staging on real DVMs: `pbcast` and `prun --preload-binary/--preload-files`, whole
//! files (sha256) on every node or nothing anywhere; local daemons at radix 2 and 64, and 16
//! network-namespace nodes (as root) at radix 2 and 64.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{signal, text, until, wait_output, Dvm, Nodes};
use dvm_tests::FakeCluster;
use sha2::{Digest, Sha256};

const PBCAST: &str = env!("CARGO_BIN_EXE_pbcast");

fn pbcast(dvm: &Dvm, args: &[&str]) -> Output {
    let mut c = Command::new(PBCAST)
        .arg("--dvm-uri")
        .arg(&dvm.uri)
        .args(args)
        .env("DVM_TMPDIR", &dvm.root)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_output(&mut c, Duration::from_secs(300), "pbcast")
}

/// `n` bytes that do not repeat (a fixed xorshift stream), written to `path`.
fn random_file(path: &Path, n: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ n as u64;
    let mut data = Vec::with_capacity(n);
    while data.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(n);
    std::fs::write(path, &data).unwrap();
    hex(&data)
}

fn hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

fn sha_of(path: &Path) -> Option<String> {
    std::fs::read(path).ok().map(|d| hex(&d))
}

/// Files under `dir`, hidden ones included (a temporary left behind shows here).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// A working directory beside the DVM's (never inside it: that holds only session
/// directories), removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("dvm-stage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pbcast_suite(radix: u32) {
    let n = 6;
    let dvm = Dvm::start(
        &format!("stage{radix}"),
        Nodes::Local { daemons: n, slots: 2 },
        radix,
        &[("DVM_LOG", "warn,dvm_core::stage=info")],
    );
    let scratch = Scratch::new(&format!("r{radix}"));
    let work = scratch.0.clone();
    let src = work.join("blob");
    let sum = random_file(&src, 24 << 20);
    let dest = work.join("out/%n/blob");
    let dest = dest.to_str().unwrap();

    // A file to every daemon, byte-exact; then again compressed in small segments.
    for extra in [&[][..], &["--compress", "--segment-kib", "64", "--window", "8"][..]] {
        let _ = std::fs::remove_dir_all(work.join("out"));
        let mut args = extra.to_vec();
        args.extend([src.to_str().unwrap(), dest]);
        let out = pbcast(&dvm, &args);
        let (_, se) = text(&out);
        assert!(out.status.success(), "radix {radix} {extra:?}: {se}");
        assert!(se.contains(&format!("on {n} nodes")), "{se}");
        for r in 0..n {
            assert_eq!(sha_of(&work.join(format!("out/{r}/blob"))).as_deref(), Some(sum.as_str()), "daemon {r}");
        }
        assert_eq!(files_under(&work.join("out")).len(), n as usize, "no temporary is left");
    }

    // A directory tree, modes kept; only on the hosts named.
    let tree = work.join("tree");
    std::fs::create_dir_all(tree.join("sub/deeper")).unwrap();
    std::fs::write(tree.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(tree.join("sub/deeper/run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(tree.join("sub/deeper/run.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
    let tdest = work.join("tout/%h");
    let out = pbcast(&dvm, &["-H", "vm-1,vm-3", tree.to_str().unwrap(), tdest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out).1);
    let got: Vec<String> = std::fs::read_dir(work.join("tout"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut got = got;
    got.sort();
    assert_eq!(got, ["vm-1", "vm-3"]);
    let run = work.join("tout/vm-3/sub/deeper/run.sh");
    assert_eq!(std::fs::read_to_string(&run).unwrap(), "#!/bin/sh\necho hi\n");
    assert_eq!(std::fs::metadata(&run).unwrap().permissions().mode() & 0o7777, 0o750);
    assert_eq!(std::fs::read_to_string(work.join("tout/vm-1/a.txt")).unwrap(), "alpha\n");

    // Bad input: one sentence each, non-zero, nothing written.
    let bad = work.join("bad");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![work.join("missing").display().to_string(), format!("{}/x", bad.display())], "no such file or directory"),
        (vec!["/dev/null".into(), format!("{}/x", bad.display())], "/dev/null is not a regular file"),
        (vec![src.display().to_string(), "relative/x".into()], "must be an absolute path"),
        (vec![src.display().to_string(), "/proc/dvm-stage-test/x".into()], "cannot create /proc/dvm-stage-test"),
        (vec![src.display().to_string(), format!("{}/%q", bad.display())], "unknown '%q'"),
        (
            vec!["-H".into(), "nowhere".into(), src.display().to_string(), format!("{}/x", bad.display())],
            "no live daemon of the DVM runs on host nowhere",
        ),
        (
            vec!["--segment-kib".into(), "1".into(), src.display().to_string(), format!("{}/x", bad.display())],
            "outside 64..=65536 KiB",
        ),
        (
            vec![
                "--segment-kib".into(),
                "65536".into(),
                "--window".into(),
                "8".into(),
                src.display().to_string(),
                format!("{}/x", bad.display()),
            ],
            "8 segments of 65536 KiB in flight would hold 512 MiB on every node, above 256 MiB",
        ),
    ];
    for (args, want) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = pbcast(&dvm, &args);
        let se = text(&out).1;
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(se.starts_with("pbcast: ") && se.contains(want) && se.lines().count() == 1, "{args:?}: {se}");
    }
    // A destination under /proc is refused on the daemon, naming it.
    let out = pbcast(&dvm, &[src.to_str().unwrap(), "/proc/dvm-stage-test/x"]);
    assert!(text(&out).1.contains("daemon 0 on host vm-0"), "{}", text(&out).1);
    assert!(files_under(&bad).is_empty());

    // A daemon lost mid-transfer: frozen so the transfer cannot finish, then killed. The copy
    // fails naming it, and no node keeps anything (not even an unnamed file).
    let victim = dvm.daemon_pid(4);
    let started_before = dvm.log().matches("transfer started").count();
    signal(victim, libc::SIGSTOP);
    let kdest = work.join("kout/%n/blob");
    let mut child = Command::new(PBCAST)
        .args(["--dvm-uri", &dvm.uri, src.to_str().unwrap(), kdest.to_str().unwrap()])
        .env("DVM_TMPDIR", &dvm.root)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    until(Duration::from_secs(60), "the transfer to start", || {
        dvm.log().matches("transfer started").count() > started_before
    });
    signal(victim, libc::SIGKILL);
    let out = wait_output(&mut child, Duration::from_secs(120), "pbcast with a lost daemon");
    let se = text(&out).1;
    assert!(!out.status.success(), "the transfer that lost daemon 4 succeeded");
    assert!(se.contains("daemon 4 on host vm-4 was lost during the transfer"), "{se}");
    assert!(files_under(&work.join("kout")).is_empty(), "{:?}", files_under(&work.join("kout")));
    // The survivors go on.
    let out = pbcast(&dvm, &[src.to_str().unwrap(), dest]);
    assert!(out.status.success(), "{}", text(&out).1);
    assert!(text(&out).1.contains(&format!("on {} nodes", n - 1)), "{}", text(&out).1);
    dvm.stop();
}

#[test]
fn pbcast_radix_2() {
    pbcast_suite(2);
}

#[test]
fn pbcast_radix_64() {
    pbcast_suite(64);
}

#[test]
fn prun_preloads_a_binary_and_files_and_removes_them_when_the_job_ends() {
    let dvm = Dvm::start("preload", Nodes::Local { daemons: 4, slots: 2 }, 2, &[]);
    let scratch = Scratch::new("preload");
    let work = scratch.0.clone();
    std::fs::create_dir_all(work.join("bin")).unwrap();
    let prog = work.join("bin/where");
    std::fs::write(&prog, "#!/bin/sh\necho \"$DVM_RANK $0\"\nsha256sum \"$1\"\n").unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = work.join("input.dat");
    let sum = random_file(&data, 3 << 20);
    let dd = work.join("dest");
    let staged = dd.join("input.dat");
    let staged_s = staged.to_str().unwrap();
    let out = dvm.prun(&[
        "-n",
        "8",
        "--map-by",
        "node",
        "--preload-binary",
        "--preload-files",
        data.to_str().unwrap(),
        "--preload-files-dest-dir",
        dd.to_str().unwrap(),
        prog.to_str().unwrap(),
        staged_s,
    ]);
    let (so, se) = text(&out);
    assert!(out.status.success(), "{se}");
    for r in 0..8 {
        let line = so.lines().find(|l| l.starts_with(&format!("{r} "))).unwrap_or_else(|| panic!("rank {r}: {so}"));
        let path = line.split_whitespace().nth(1).unwrap();
        assert!(path.contains("/preload/") && path.ends_with("/where") && path != prog.to_str().unwrap(), "{line}");
        // prun hears of the job's end only once every node removed its files.
        assert!(!Path::new(path).exists(), "the staged binary {path} outlived its job");
    }
    assert_eq!(so.matches(&format!("{sum}  {staged_s}")).count(), 8, "{so}");
    assert!(!staged.exists(), "the preloaded file outlived its job");
    // `data` preloaded into `dd` for a job of `n` procs running `rest`.
    let preloading = |n: &str, rest: &[&str]| {
        let mut args = vec!["-n", n, "--preload-files", data.to_str().unwrap(), "--preload-files-dest-dir"];
        args.push(dd.to_str().unwrap());
        args.extend_from_slice(rest);
        dvm.prun(&args)
    };
    // A job that fails still removes its files before prun returns.
    let out = preloading("4", &["sh", "-c", "test -f \"$0\" && exit 3", staged_s]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out).1);
    assert!(!staged.exists(), "the preloaded file outlived its failed job");
    // Kept when asked.
    let out = preloading("2", &["--preload-keep", "true"]);
    assert!(out.status.success(), "{}", text(&out).1);
    assert_eq!(sha_of(&staged).as_deref(), Some(sum.as_str()));
    // Bad input: the job is refused with one sentence and nothing starts.
    for (arg, want) in [
        (work.join("nope").display().to_string(), "no such file or directory"),
        (work.join("bin").display().to_string(), "is a directory, not a file"),
    ] {
        let out = dvm.prun(&["-n", "2", "--preload-files", &arg, "sh", "-c", "echo RAN"]);
        let (so, se) = text(&out);
        assert!(!out.status.success() && !so.contains("RAN"), "{so}{se}");
        assert!(se.contains(&arg) && se.contains(want), "{se}");
    }
    let out = dvm.prun(&["-n", "2", "--preload-binary", "no-such-program-anywhere"]);
    assert!(!out.status.success());
    assert!(
        text(&out).1.contains("no-such-program-anywhere") && text(&out).1.contains("not found"),
        "{}",
        text(&out).1
    );
    dvm.stop();
}

/// Unmounts a filesystem mounted for a test, when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_on_one_node_fails_the_copy_naming_node_and_path_and_leaves_nothing() {
    if !nix::unistd::geteuid().is_root() {
        dvm_tests::skip("staging::a_full_disk_on_one_node", "needs root to mount a small tmpfs");
        return;
    }
    let dvm = Dvm::start("stagefull", Nodes::Local { daemons: 4, slots: 1 }, 2, &[]);
    let scratch = Scratch::new("full");
    let work = scratch.0.clone();
    let src = work.join("blob");
    random_file(&src, 3 << 20);
    // Daemon 2's destination is on a 1 MiB filesystem; every other one has room.
    let small = work.join("out/2");
    std::fs::create_dir_all(&small).unwrap();
    let st = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "dvm-stage-full"]).arg(&small).status();
    assert!(st.is_ok_and(|s| s.success()), "cannot mount a tmpfs on {}", small.display());
    let _mounted = Mounted(small.clone());
    let out = pbcast(&dvm, &[src.to_str().unwrap(), work.join("out/%n/blob").to_str().unwrap()]);
    let se = text(&out).1;
    assert!(!out.status.success(), "{se}");
    let path = small.join("blob");
    assert!(
        se.contains("daemon 2 on host vm-2") && se.contains(path.to_str().unwrap()) && se.contains("no room"),
        "{se}"
    );
    assert_eq!(files_under(&work.join("out")), Vec::<PathBuf>::new(), "a copy was left behind");
    // The DVM goes on: the same copy where there is room.
    let out = pbcast(&dvm, &[src.to_str().unwrap(), work.join("ok/%n/blob").to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out).1);
    dvm.stop();
}

fn netns_200mib(radix: u32) {
    dvm_tests::require_netns!();
    let cluster = FakeCluster::new(16).unwrap();
    let dvm = Dvm::start(&format!("stagenet{radix}"), Nodes::Netns { cluster, slots: 1 }, radix, &[]);
    let scratch = Scratch::new(&format!("net{radix}"));
    let work = scratch.0.clone();
    let src = work.join("blob");
    let sum = random_file(&src, 200 << 20);
    let dest = work.join("out/%n/blob");
    let out = pbcast(&dvm, &[src.to_str().unwrap(), dest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out).1);
    assert!(text(&out).1.contains("on 17 nodes"), "{}", text(&out).1);
    for r in 0..17 {
        let got = work.join(format!("out/{r}/blob"));
        assert_eq!(sha_of(&got).as_deref(), Some(sum.as_str()), "daemon {r}");
        // One copy at a time on the disk of the machine that fakes every node.
        std::fs::remove_file(got).unwrap();
    }
    dvm.stop();
}

#[test]
fn netns_16_nodes_200_mib_radix_2() {
    netns_200mib(2);
}

#[test]
fn netns_16_nodes_200_mib_radix_64() {
    netns_200mib(64);
}
