//! Unmodified Open MPI programs (tests/mpi/*.c, built with mpicc) under dvmd's PMIx server,
//! on local DVMs at radix 2 and 64 and on network-namespace fake nodes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use dvm_tests::{require_netns, FakeCluster};

const DVMD: &str = env!("CARGO_BIN_EXE_dvmd");
const PRUN: &str = env!("CARGO_BIN_EXE_prun");
const PTERM: &str = env!("CARGO_BIN_EXE_pterm");

/// The MPI programs, built once per test binary.
fn mpi_bin(name: &str) -> String {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/mpi");
        let out = std::env::temp_dir().join(format!("dvm-mpi-bin-{}", std::process::id()));
        let st = Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(&src)
            .arg(format!("OUT={}", out.display()))
            .status()
            .expect("make (and mpicc from Debian's libopenmpi-dev) are needed to build tests/mpi");
        assert!(st.success(), "building tests/mpi with mpicc failed");
        out
    });
    dir.join(name).display().to_string()
}

struct Dvm {
    hnp: Child,
    root: PathBuf,
    uri: String,
    log: PathBuf,
    pids: Vec<u32>,
    cluster: Option<FakeCluster>,
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

fn descendants(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(c) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{c}/stat")) {
                let f: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
                if f.get(1).and_then(|x| x.parse::<u32>().ok()) == Some(p) && alive(c) {
                    all.push(c);
                    frontier.push(c);
                }
            }
        }
    }
    all
}

impl Dvm {
    fn start(name: &str, radix: u32, cluster: Option<FakeCluster>) -> Dvm {
        let root = std::env::temp_dir().join(format!("dvm-mpi-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let uri_file = root.join("uri");
        let log = root.join("dvmd.log");
        let mut cmd = Command::new(DVMD);
        match &cluster {
            None => {
                cmd.args(["--local", "4", "--slots", "4"]);
            }
            Some(c) => {
                let hf = root.join("hosts");
                c.write_hostfile(&hf, 4).unwrap();
                cmd.arg("--hostfile").arg(&hf);
                cmd.arg("--launch-agent").arg(c.exec_prefix_with_hostname());
                cmd.arg("--bind-address").arg(c.head_addr().to_string());
            }
        }
        cmd.args(["--radix", &radix.to_string()])
            .arg("--report-uri")
            .arg(&uri_file)
            .env("DVM_TMPDIR", &root)
            .env("DVM_LOG", "warn,dvmd::pmix=debug")
            // The same MCA settings for the ranks as any launcher compared with.
            .env("OMPI_MCA_pml", "ob1")
            // All-local fences go through fence_nb too, so the path is exercised.
            .env("PMIX_MCA_pmix_server_fence_localonly_opt", "0")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut hnp = cmd.spawn().unwrap();
        let mut lines = BufReader::new(hnp.stdout.take().unwrap()).lines();
        loop {
            match lines.next() {
                Some(Ok(l)) if l == "DVM ready" => break,
                Some(Ok(_)) => {}
                _ => panic!("dvmd did not start: {}", std::fs::read_to_string(&log).unwrap_or_default()),
            }
        }
        std::thread::spawn(move || for _ in lines {});
        let pids = std::iter::once(hnp.id()).chain(descendants(hnp.id())).collect();
        Dvm { hnp, root, uri: format!("file:{}", uri_file.display()), log, pids, cluster }
    }

    fn prun(&self, args: &[&str]) -> Output {
        Command::new(PRUN).arg("--dvm-uri").arg(&self.uri).args(args).stdin(Stdio::null()).output().unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(mut self) {
        assert!(Command::new(PTERM).arg("--dvm-uri").arg(&self.uri).status().unwrap().success());
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.hnp.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "dvmd did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(self.pids.iter().all(|&p| !alive(p)), "daemons left running");
        let mut left = Vec::new();
        for u in std::fs::read_dir(&self.root).unwrap().flatten().filter(|e| e.path().is_dir()) {
            left.extend(std::fs::read_dir(u.path()).unwrap().flatten().map(|e| e.path()));
        }
        assert!(left.is_empty(), "session dirs left: {left:?}");
        self.pids.clear();
    }
}

impl Drop for Dvm {
    fn drop(&mut self) {
        let _ = self.hnp.kill();
        let _ = self.hnp.wait();
        for &p in &self.pids {
            unsafe {
                libc::kill(p as i32, libc::SIGKILL);
            }
        }
        if let Some(c) = &self.cluster {
            c.kill_all_in_netns();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn out(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn check_programs(dvm: &Dvm, extra: &[&str]) {
    let run = |prog: &str, args: &[&str]| {
        let mut a: Vec<&str> = extra.to_vec();
        a.extend_from_slice(&["-n", "16"]);
        let bin = mpi_bin(prog);
        a.push(&bin);
        a.extend_from_slice(args);
        let o = dvm.prun(&a);
        assert!(o.status.success(), "{prog} {extra:?}: {:?}\n{}\n{}", o.status, out(&o).1, dvm.log());
        out(&o).0
    };
    let hello = run("hello", &[]);
    for r in 0..16 {
        assert!(hello.contains(&format!("hello rank {r} of 16 on")), "{hello}");
    }
    let all = run("allreduce", &[]);
    assert_eq!(all.matches("ok 120").count(), 16, "{all}");
    let ring = run("ring", &[]);
    assert!(ring.contains("ring token 240 want 240 ok"), "{ring}");
}

fn mpi_suite(radix: u32, cluster: Option<FakeCluster>) {
    let name = format!("{}r{radix}", if cluster.is_some() { "netns" } else { "local" });
    let dvm = Dvm::start(&name, radix, cluster);
    check_programs(&dvm, &[]);
    // The MPI_Init modex collects; the two barriers do not; sequence numbers 0, 1, 2.
    let log = dvm.log();
    for (collect, seq) in [(true, 0), (false, 1), (false, 2)] {
        assert!(log.contains(&format!("collect={collect} seq={seq}")), "fence collect={collect} seq={seq} not seen");
    }

    // Without a collecting modex: peers' data comes by direct modex from their daemons.
    check_programs(&dvm, &["-x", "OMPI_MCA_pmix_base_collect_data=0"]);
    assert!(dvm.log().contains("direct modex served"), "direct modex never used");

    // MPI_Abort(42) -> 42, naming the rank.
    let o = dvm.prun(&["-n", "8", &mpi_bin("abort"), "42"]);
    assert_eq!(o.status.code(), Some(42), "{}", out(&o).1);
    assert!(out(&o).1.contains("rank 1 on node") && out(&o).1.contains("MPI_Abort with code 42"), "{}", out(&o).1);
    // A crashing rank fails the job promptly, its node named.
    let o = dvm.prun(&["-n", "8", &mpi_bin("crash")]);
    assert_eq!(o.status.code(), Some(139), "{}", out(&o).1);
    assert!(out(&o).1.contains("rank 1 on node") && out(&o).1.contains("signal 11"), "{}", out(&o).1);

    // 20 MPI jobs in a row leave nothing behind.
    for i in 0..20 {
        let o = dvm.prun(&["-n", "8", &mpi_bin("mpinoop")]);
        assert!(o.status.success(), "job {i}: {}", out(&o).1);
    }
    let left: Vec<u32> = dvm.pids.iter().flat_map(|&d| descendants(d)).filter(|p| !dvm.pids.contains(p)).collect();
    assert!(left.is_empty(), "processes left: {left:?}");
    dvm.stop();
}

#[test]
fn mpi_local_radix_2() {
    mpi_suite(2, None);
}

#[test]
fn mpi_local_radix_64() {
    mpi_suite(64, None);
}

#[test]
fn mpi_netns_radix_2() {
    require_netns!();
    mpi_suite(2, Some(FakeCluster::new(4).unwrap()));
}

#[test]
fn mpi_netns_radix_64() {
    require_netns!();
    mpi_suite(64, Some(FakeCluster::new(4).unwrap()));
}
