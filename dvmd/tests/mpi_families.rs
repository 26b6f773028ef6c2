//! Every MPI family a cluster runs, unmodified, under prun's default interface: MPICH 4.0.2
//! (Debian) and MPICH 5 (PyPI) over PMI-1, Intel MPI 2021 (PyPI) over PMI-1 and, told so,
//! over PMIx, Open MPI 5 (PyPI) over PMIx, on local DVMs at radix 2 and 64 and on
//! network-namespace nodes; and the singleton trap closed: a job whose interface is forced
//! wrong fails by name, never exits 0 as singletons.
//!
//! The PyPI MPIs live in venvs under `$DVM_MPI_ROOT` (default `/opt/dvm-mpis`: `mpich`,
//! `impi`, `ompi5`), which `scripts/prereqs.sh test` installs; Debian's MPICH is called by
//! name (`mpicc.mpich`). Each family builds `tests/mpi-families/families.c` with its own mpicc.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{text as out, Dvm, Nodes};
use dvm_tests::{require_netns, skip, FakeCluster};

/// One MPI family: how to build with it and what its ranks need.
struct Family {
    name: &'static str,
    mpicc: PathBuf,
    cc_env: Vec<(&'static str, String)>,
    /// `-x` settings of its jobs (none are needed to wire up; these only make its errors
    /// readable or its spawns possible, as under its own launcher).
    run_env: Vec<String>,
    /// Its MPI_Comm_spawn works at all (Debian's MPICH 4.0.2 fails it inside the library,
    /// before any PMI request, under any launcher).
    spawn: bool,
}

fn root() -> PathBuf {
    std::env::var_os("DVM_MPI_ROOT").map_or_else(|| PathBuf::from("/opt/dvm-mpis"), PathBuf::from)
}

fn families() -> Vec<Family> {
    let r = root();
    vec![
        Family {
            name: "mpich-debian",
            mpicc: PathBuf::from("/usr/bin/mpicc.mpich"),
            cc_env: vec![],
            run_env: vec![],
            spawn: false,
        },
        Family { name: "mpich5", mpicc: r.join("mpich/bin/mpicc"), cc_env: vec![], run_env: vec![], spawn: true },
        Family {
            name: "intel",
            mpicc: r.join("impi/bin/mpicc"),
            cc_env: vec![("I_MPI_ROOT", r.join("impi").display().to_string())],
            // Intel MPI disables spawn support on one node unless asked, under its own launcher too.
            run_env: vec!["I_MPI_SPAWN=1".into()],
            spawn: true,
        },
        Family {
            name: "openmpi5",
            mpicc: r.join("ompi5/bin/mpicc"),
            cc_env: vec![],
            run_env: vec![format!("OPAL_PREFIX={}", r.join("ompi5").display())],
            spawn: true,
        },
    ]
}

/// `families.c` built with `f`'s compiler, once per test process; None (after recording the
/// skip) when the family is not installed here.
fn build(test: &str, f: &Family) -> Option<String> {
    if !f.mpicc.exists() {
        skip(
            test,
            &format!(
                "{} is not installed ({} missing; scripts/prereqs.sh test installs it)",
                f.name,
                f.mpicc.display()
            ),
        );
        return None;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/mpi-families/families.c");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("families-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join(f.name);
    // Tests run side by side: one builds while the others wait (a binary being written cannot
    // be executed), and it appears whole, by a rename.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    if !bin.exists() {
        let tmp = dir.join(format!("{}.tmp", f.name));
        let mut cmd = Command::new(&f.mpicc);
        cmd.args(["-O1", "-o"]).arg(&tmp).arg(&src).envs(f.cc_env.iter().map(|(k, v)| (k, v)));
        let o = cmd.output().expect("run mpicc");
        assert!(o.status.success(), "{}: {} failed: {}", f.name, f.mpicc.display(), out(&o).1);
        std::fs::rename(&tmp, &bin).unwrap();
    }
    Some(bin.display().to_string())
}

/// prun with the family's settings; its stdout, checked to have succeeded.
fn run_ok(dvm: &Dvm, f: &Family, args: &[&str]) -> String {
    let o = run(dvm, f, args);
    assert!(o.status.success(), "{} {args:?}: {:?}\n{}\n{}", f.name, o.status, out(&o).1, dvm.log());
    out(&o).0
}

fn run(dvm: &Dvm, f: &Family, args: &[&str]) -> std::process::Output {
    let mut a: Vec<String> = vec!["--timeout".into(), "120".into()];
    for e in &f.run_env {
        a.push("-x".into());
        a.push(e.clone());
    }
    a.extend(args.iter().map(|s| s.to_string()));
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    dvm.prun(&a)
}

/// Each family's programs on one DVM: every rank wired into one job of the right size.
fn suite(dvm: &Dvm, test: &str, np: u32) {
    for f in families() {
        let Some(bin) = build(test, &f) else { continue };
        let n = np.to_string();
        let hello = run_ok(dvm, &f, &["-n", &n, &bin, "hello"]);
        let want = np * (np - 1) / 2;
        for r in 0..np {
            assert!(hello.contains(&format!("HELLO rank {r} of {np} sum {want} ")), "{}: rank {r}:\n{hello}", f.name);
        }
        assert!(!hello.contains("WRONG"), "{}:\n{hello}", f.name);

        // MPMD: each app its own MPI_APPNUM.
        let apps = run_ok(dvm, &f, &["-n", "2", &bin, "appnum", ":", "-n", "2", &bin, "appnum"]);
        for (r, app) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
            assert!(apps.contains(&format!("APPNUM rank {r} appnum {app} ")), "{}: rank {r}:\n{apps}", f.name);
        }

        // MPI_Abort's code is prun's status, and the job ends at once.
        let o = run(dvm, &f, &["-n", "4", &bin, "abort"]);
        assert_eq!(o.status.code(), Some(7), "{}: MPI_Abort(7):\n{}", f.name, out(&o).1);
        assert!(out(&o).1.contains("rank 1 on node") && out(&o).1.contains("MPI_Abort"), "{}", out(&o).1);

        let names = run_ok(dvm, &f, &["-n", "3", &bin, "pubname"]);
        assert_eq!(names.matches("found 'port-of-dvm-families' ok").count(), 3, "{}:\n{names}", f.name);

        if f.spawn {
            let sp = run_ok(dvm, &f, &["-n", "2", &bin, "spawn"]);
            assert_eq!(sp.matches("children 2 ok").count(), 2, "{}:\n{sp}", f.name);
            assert_eq!(sp.matches("parents 2").count(), 2, "{}:\n{sp}", f.name);
        }
    }
}

/// The interface forced wrong: a named failure, never singletons that exit 0.
fn wrong_interface(dvm: &Dvm, test: &str) {
    let fams = families();
    let mpich = &fams[0];
    if let Some(bin) = build(test, mpich) {
        let o = run(dvm, mpich, &["--mpi", "pmix", "-n", "4", &bin, "hello"]);
        assert!(!o.status.success(), "MPICH under --mpi pmix succeeded:\n{}", out(&o).0);
        let err = out(&o).1;
        assert!(err.contains("speaks PMI") && err.contains("--mpi pmix") && err.contains("rank "), "{err}");
    }
    let ompi = &fams[3];
    if let Some(bin) = build(test, ompi) {
        let o = run(dvm, ompi, &["--mpi", "pmi1", "-n", "4", &bin, "hello"]);
        assert!(!o.status.success(), "Open MPI 5 under --mpi pmi1 succeeded:\n{}", out(&o).0);
        let err = out(&o).1;
        assert!(err.contains("speaks PMIx") && err.contains("--mpi pmi1"), "{err}");
    }
    // Intel MPI told to use PMIx (--mpi pmix) runs over it.
    let intel = &fams[2];
    if let Some(bin) = build(test, intel) {
        let hello = run_ok(dvm, intel, &["--mpi", "pmix", "-n", "4", &bin, "hello"]);
        assert_eq!(hello.matches(" of 4 sum 6 ").count(), 4, "{hello}");
    }
}

/// Removes, when dropped, the shared-memory segments the MPICH family's ranks created in
/// /dev/shm during a test and left there (a rank killed after `MPI_Abort` never unlinks its
/// segments; MPICH names them `mpich_shm_*`, UCX `ucx_shm_*`, Open MPI 5 `open_mpi.*`).
struct ShmGuard(std::collections::BTreeSet<std::ffi::OsString>);

impl ShmGuard {
    fn names() -> std::collections::BTreeSet<std::ffi::OsString> {
        let Ok(dir) = std::fs::read_dir("/dev/shm") else { return Default::default() };
        dir.filter_map(Result::ok)
            .map(|e| e.file_name())
            .filter(|n| ["mpich_", "ucx_", "open_mpi"].iter().any(|p| n.to_string_lossy().starts_with(p)))
            .collect()
    }

    fn new() -> ShmGuard {
        ShmGuard(Self::names())
    }
}

/// The /dev/shm files some process still maps or holds open (another test's live ranks).
fn shm_in_use() -> std::collections::BTreeSet<String> {
    let mut used = std::collections::BTreeSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return used };
    for p in procs.filter_map(Result::ok) {
        let dir = p.path();
        if let Ok(maps) = std::fs::read_to_string(dir.join("maps")) {
            used.extend(maps.lines().filter_map(|l| l.find("/dev/shm/").map(|i| l[i..].to_string())));
        }
        if let Ok(fds) = std::fs::read_dir(dir.join("fd")) {
            for fd in fds.filter_map(Result::ok) {
                if let Ok(t) = std::fs::read_link(fd.path()) {
                    let t = t.display().to_string();
                    if t.starts_with("/dev/shm/") {
                        used.insert(t);
                    }
                }
            }
        }
    }
    used
}

impl Drop for ShmGuard {
    fn drop(&mut self) {
        // Only what nobody uses any more: tests run side by side, and another's ranks may be
        // using theirs right now.
        let fresh: Vec<_> = Self::names().difference(&self.0).cloned().collect();
        let used = shm_in_use();
        for n in &fresh {
            let path = Path::new("/dev/shm").join(n);
            if !used.contains(&path.display().to_string()) {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// prun killed in the first milliseconds of an MPICH job (ranks starting, in their first PMI
/// requests, in a barrier, asleep after it): no rank of the job is left, and the DVM runs the
/// next MPICH job.
fn early_signal(dvm: &Dvm, test: &str) {
    let fams = families();
    let Some(bin) = build(test, &fams[0]) else { return };
    for delay_ms in [0u64, 20, 100, 400, 2000] {
        // Ranks that would live 120 s: only the kill can end them within the guard.
        let mut prun = dvm.spawn_prun(&["-n", "4", &bin, "sleep"]);
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(prun.id() as i32, libc::SIGTERM) };
        prun.wait().unwrap();
        let left = || {
            std::fs::read_dir("/proc")
                .unwrap()
                .filter_map(Result::ok)
                .any(|p| std::fs::read_link(p.path().join("exe")).is_ok_and(|e| e.display().to_string() == bin))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while left() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(!left(), "a rank of the job prun left at {delay_ms} ms still runs");
    }
    let hello = run_ok(dvm, &fams[0], &["-n", "4", &bin, "hello"]);
    assert_eq!(hello.matches(" of 4 sum 6 ").count(), 4, "{hello}");
}

fn local(radix: u32) {
    let _shm = ShmGuard::new();
    let test = format!("mpi_families::local_radix_{radix}");
    // One slot per daemon: every job of 2 or more ranks spans daemons (at radix 2, a relay).
    let dvm = Dvm::start(&format!("families-r{radix}"), Nodes::Local { daemons: 4, slots: 1 }, radix, &[]);
    suite(&dvm, &test, 4);
    wrong_interface(&dvm, &test);
    early_signal(&dvm, &test);
    dvm.assert_up();
}

#[test]
fn local_radix_2() {
    local(2);
}

#[test]
fn local_radix_64() {
    local(64);
}

/// Intel's own benchmark on 4 nodes: PingPong between 2 of them, Allreduce over all 4, each
/// reporting the process count it ran with (singletons would say 1).
#[test]
fn intel_imb_on_four_network_namespace_nodes() {
    let test = "mpi_families::intel_imb_on_four_network_namespace_nodes";
    require_netns!();
    let _shm = ShmGuard::new();
    let imb = root().join("impi/bin/IMB-MPI1");
    if !imb.exists() {
        return skip(test, &format!("Intel MPI is not installed ({} missing)", imb.display()));
    }
    let cluster = FakeCluster::new(4).expect("fake cluster");
    let dvm = Dvm::start("families-imb", Nodes::Netns { cluster, slots: 1 }, 2, &[]);
    let lib = format!("LD_LIBRARY_PATH={}", root().join("impi/lib").display());
    let imb = imb.display().to_string();
    let base = ["--timeout", "300", "-x", &lib, "--map-by", "node"];
    let ping = dvm.prun(&[&base[..], &["-n", "2", &imb, "PingPong", "-msglog", "0:12", "-iter", "100"]].concat());
    let (o, e) = out(&ping);
    assert!(ping.status.success(), "PingPong: {:?}\n{o}\n{e}", ping.status);
    assert!(o.contains("Benchmarking PingPong") && o.contains("#processes = 2"), "{o}");
    assert!(!o.contains("invalid for 1 processes"), "{o}");
    let all = dvm
        .prun(&[&base[..], &["-n", "4", &imb, "Allreduce", "-npmin", "4", "-msglog", "0:12", "-iter", "100"]].concat());
    let (o, e) = out(&all);
    assert!(all.status.success(), "Allreduce: {:?}\n{o}\n{e}", all.status);
    assert!(o.contains("Benchmarking Allreduce") && o.contains("#processes = 4"), "{o}");
}
