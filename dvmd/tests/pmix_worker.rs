//! Each daemon hosts libpmix's server in a worker process it replaces when idle (libpmix 4.2.2
//! keeps something of every client it served until the server is finalized): MPI jobs keep
//! running across replacements, a worker that dies or freezes under a job fails that job
//! naming the node and never the DVM, and nothing is left behind.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{alive, comm, mpi_bin, signal, text as out, until, wait_output, Dvm, Nodes, DVMD};

const ENV: [(&str, &str); 1] = [("OMPI_MCA_pml", "ob1")];

fn allreduce_ok(dvm: &Dvm, np: u32) {
    let o = dvm.prun(&["--map-by", "node", "-n", &np.to_string(), &mpi_bin("allreduce")]);
    let (so, se) = out(&o);
    assert!(o.status.success(), "allreduce: {se}\n{}", dvm.log());
    let want = np * (np - 1) / 2;
    assert_eq!(so.matches(&format!("ok {want}")).count(), np as usize, "{so}");
}

fn started(child: &mut std::process::Child) {
    dvm_tests::wait_for_line(child.stdout.take().unwrap(), "linger started", Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("the MPI job never started: {e}"));
}

/// The command line of a process (NULs as spaces).
fn cmdline(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()).replace('\0', " ")
}

/// `--pmix-start eager`: each daemon's first worker is forked at the daemon's start (its
/// command line is the daemon's), not exec'd as `dvmd --pmix-worker`; the HNP, which forks
/// nothing ahead, exec's its own. Those forked workers serve MPI jobs, a replacement after a
/// job is exec'd, and all of them end with the DVM. A lazy DVM forks none ahead.
#[test]
fn a_daemons_first_worker_is_forked_at_its_start() {
    let daemons = 3usize;
    let dvm = Dvm::start_with_args(
        "pmixprefork",
        Nodes::Local { daemons: daemons as u32, slots: 2 },
        2,
        &ENV,
        &["--pmix-start", "eager", "--pmix-recycle-kib", "0"],
    );
    until(Duration::from_secs(30), "every daemon running its first PMIx worker", || {
        (0..daemons).all(|r| dvm.pmix_worker_of(r).is_some())
    });
    let first: Vec<u32> = (0..daemons).map(|r| dvm.pmix_worker_of(r).expect("worker")).collect();
    assert!(cmdline(first[0]).contains("--pmix-worker"), "the HNP's worker: {}", cmdline(first[0]));
    for (r, &w) in first.iter().enumerate().skip(1) {
        let cmd = cmdline(w);
        assert!(
            cmd.contains("--daemon") && !cmd.contains("--pmix-worker"),
            "daemon {r}'s first worker was not forked: {cmd}"
        );
        assert_eq!(comm(w).as_deref(), Some("pmix-worker"));
    }
    allreduce_ok(&dvm, 2 * daemons as u32);
    // Recycled after the job: the next worker of every daemon is exec'd, and serves as well.
    until(Duration::from_secs(30), "every daemon replacing its first PMIx worker", || {
        (0..daemons).all(|r| dvm.pmix_worker_of(r).is_some_and(|w| !first.contains(&w)))
    });
    for r in 1..daemons {
        let w = dvm.pmix_worker_of(r).expect("worker");
        assert!(cmdline(w).contains("--pmix-worker"), "daemon {r}'s second worker: {}", cmdline(w));
    }
    allreduce_ok(&dvm, 2 * daemons as u32);
    until(Duration::from_secs(10), "the forked workers to end", || first.iter().all(|&p| !alive(p)));
    assert!(dvm.leftover_procs().is_empty(), "left: {:?}", dvm.leftover_procs());
    dvm.stop();

    let lazy = Dvm::start("pmixlazy", Nodes::Local { daemons: daemons as u32, slots: 2 }, 2, &ENV);
    assert!(lazy.pmix_workers().is_empty(), "a lazy DVM started workers: {:?}", lazy.pmix_workers());
    allreduce_ok(&lazy, 2 * daemons as u32);
    lazy.stop();
}

/// A daemon killed outright (SIGKILL: no shutdown of its own) takes the worker it forked at
/// its start with it: the worker's command stream ends and it exits.
#[test]
fn a_killed_daemons_forked_worker_ends() {
    let dvm = Dvm::start_with_args(
        "pmixforkkill",
        Nodes::Local { daemons: 2, slots: 1 },
        2,
        &ENV,
        &["--pmix-start", "eager"],
    );
    until(Duration::from_secs(30), "daemon 1 running its first PMIx worker", || dvm.pmix_worker_of(1).is_some());
    let w = dvm.pmix_worker_of(1).expect("worker");
    assert!(!cmdline(w).contains("--pmix-worker"), "daemon 1's worker was not forked: {}", cmdline(w));
    signal(dvm.pids[1], libc::SIGKILL);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while alive(w) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let lingered = alive(w);
    if lingered {
        // Adopted elsewhere once its daemon died: the test ends it itself.
        signal(w, libc::SIGKILL);
    }
    assert!(!lingered, "the killed daemon's forked worker {w} was still running 30 s later");
}

/// A daemon that fails before it needs a server (here: a malformed secret) ends the worker it
/// forked at its start, killed and reaped, instead of leaving it to be adopted (a zombie under
/// an init that does not reap). This process is made the subreaper: a worker the daemon left
/// would be this process's child the moment the daemon has exited.
#[test]
fn a_daemon_failing_at_start_leaves_no_forked_worker() {
    // SAFETY: prctl on this process only.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) }, 0);
    let o = std::process::Command::new(DVMD)
        .args(["--daemon", "--rank", "1", "--size", "2", "--hnp", "127.0.0.1:1", "--slots", "1"])
        .args(["--pmix-start", "eager"])
        .env("DVM_SECRET", "zz")
        .env("DVM_LOG", "dvmd=debug")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let (_, err) = out(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("DVM_SECRET"), "{err}");
    assert!(!left_its_forked_worker(&err), "the daemon left its forked worker behind: {err}");
}

/// Whether the daemon whose debug log is `err` left the worker it forked ahead (it logged
/// the pid) to this process, the subreaper: then the worker is ended and reaped here.
fn left_its_forked_worker(err: &str) -> bool {
    let forked: i32 = err
        .lines()
        .find(|l| l.contains("PMIx worker forked ahead"))
        .and_then(|l| l.split("pid=").nth(1))
        .and_then(|p| p.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the daemon forked no worker ahead: {err}"));
    // Our child now (alive or a zombie) only if the daemon left it.
    // SAFETY: waitpid/kill on a pid that is this process's child when the call succeeds.
    let adopted = unsafe { libc::waitpid(forked, std::ptr::null_mut(), libc::WNOHANG) } != -1;
    if adopted {
        unsafe {
            libc::kill(forked, libc::SIGKILL);
            libc::waitpid(forked, std::ptr::null_mut(), 0);
        }
    }
    adopted
}

/// `--pmix-recycle-kib 0`: every daemon replaces its worker after every job. Each job must
/// then run on fresh workers (all new pids), and succeed.
fn replaced_after_every_job(radix: u32) {
    let daemons = 4;
    let dvm = Dvm::start_with_args(
        &format!("pmixrecycle{radix}"),
        Nodes::Local { daemons, slots: 2 },
        radix,
        &ENV,
        &["--pmix-recycle-kib", "0"],
    );
    let mut seen: BTreeSet<u32> = BTreeSet::new();
    for job in 0..4 {
        allreduce_ok(&dvm, 2 * daemons);
        // The job's namespace is released on every daemon, then its worker is replaced: every
        // daemon runs a worker no earlier job used.
        until(Duration::from_secs(30), &format!("every daemon replacing its PMIx worker after job {job}"), || {
            let now: Vec<u32> = (0..daemons as usize).filter_map(|r| dvm.pmix_worker_of(r)).collect();
            now.len() == daemons as usize && now.iter().all(|p| !seen.contains(p))
        });
        for p in dvm.pmix_workers() {
            seen.insert(p);
        }
    }
    // Every replaced worker is gone (reaped), not merely replaced.
    let running: BTreeSet<u32> = dvm.pmix_workers().into_iter().collect();
    until(Duration::from_secs(10), "replaced PMIx workers to end", || {
        seen.iter().filter(|p| !running.contains(p)).all(|&p| !alive(p))
    });
    assert!(dvm.leftover_procs().is_empty(), "left: {:?}", dvm.leftover_procs());
    dvm.stop();
}

#[test]
fn workers_replaced_after_every_job_radix_2() {
    replaced_after_every_job(2);
}

#[test]
fn workers_replaced_after_every_job_radix_64() {
    replaced_after_every_job(64);
}

/// A worker killed under a running MPI job: the job fails naming the daemon and node, the
/// daemon survives, and the next MPI job runs on a new worker; a worker killed while idle is
/// replaced for the next job the same way.
fn worker_killed_mid_job(radix: u32) {
    let dvm = Dvm::start(&format!("pmixkill{radix}"), Nodes::Local { daemons: 4, slots: 2 }, radix, &ENV);
    let mut job = dvm.spawn_prun(&["--map-by", "node", "-n", "8", &mpi_bin("linger")]);
    started(&mut job);
    let victim = dvm.pmix_worker_of(2).expect("daemon 2 runs a PMIx worker during an MPI job");
    signal(victim, libc::SIGKILL);
    let o = wait_output(&mut job, Duration::from_secs(60), "an MPI job whose daemon lost its PMIx server");
    let (_, se) = out(&o);
    assert!(!o.status.success(), "the job reported success: {se}");
    assert!(se.contains("the PMIx server of daemon 2 on node"), "the failure does not name daemon 2: {se}");
    assert!(dvm.pids.iter().all(|&p| alive(p)), "a daemon died with its worker: {}", dvm.log());
    allreduce_ok(&dvm, 8);
    let second = dvm.pmix_worker_of(2).expect("daemon 2 started a new PMIx worker for the next job");
    // A worker that dies while no job uses it: the next job still runs, on a new one.
    signal(second, libc::SIGKILL);
    until(Duration::from_secs(10), "the idle worker to be gone", || !alive(second));
    allreduce_ok(&dvm, 8);
    assert!(dvm.pmix_worker_of(2).is_some_and(|p| p != second), "daemon 2 runs no new PMIx worker");
    assert!(dvm.pids.iter().all(|&p| alive(p)), "a daemon died with its idle worker: {}", dvm.log());
    dvm.stop();
}

#[test]
fn worker_killed_mid_job_radix_2() {
    worker_killed_mid_job(2);
}

#[test]
fn worker_killed_mid_job_radix_64() {
    worker_killed_mid_job(64);
}

/// A worker frozen (SIGSTOP) under a running MPI job, then `pterm`: the DVM still ends, the
/// frozen worker is killed after its grace, and nothing is left.
#[test]
fn frozen_worker_does_not_hold_pterm() {
    let dvm = Dvm::start("pmixfrozen", Nodes::Local { daemons: 3, slots: 2 }, 2, &ENV);
    let mut job = dvm.spawn_prun(&["--map-by", "node", "-n", "6", &mpi_bin("linger")]);
    started(&mut job);
    let frozen = dvm.pmix_worker_of(1).expect("daemon 1 runs a PMIx worker during an MPI job");
    signal(frozen, libc::SIGSTOP);
    let workers = dvm.pmix_workers();
    let st = std::process::Command::new(common::PTERM)
        .arg("--dvm-uri")
        .arg(&dvm.uri)
        .env("DVM_TMPDIR", &dvm.root)
        .output()
        .unwrap();
    assert!(st.status.success(), "pterm: {}", out(&st).1);
    let o = wait_output(&mut job, Duration::from_secs(90), "an MPI job under pterm with a frozen PMIx worker");
    assert!(!o.status.success(), "{}", out(&o).1);
    until(Duration::from_secs(60), "daemons and PMIx workers to end after pterm", || {
        dvm.pids.iter().chain(&workers).all(|&p| !alive(p))
    });
    assert!(common::session_dirs(&dvm.root).is_empty(), "session dirs left: {}", dvm.log());
}

/// A daemon that exits with its worker's reply unread (as a one-shot DVM's HNP does) resets
/// the worker's command stream: the worker ends quietly, exit status 0, and prints nothing on
/// the terminal the daemon shared with the user (it used to print "command stream broken"
/// after every one-shot `prun`).
#[test]
fn a_worker_whose_daemon_vanished_ends_quietly() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    use dvm_proto::pmixworker::{worker_cmd::Body, DeregisterNspace, WorkerCmd};
    use prost::Message;

    let (mut cmd_ours, cmd_theirs) = UnixStream::pair().unwrap();
    let (ev_ours, ev_theirs) = UnixStream::pair().unwrap();
    let mut c =
        dvmd::pmix::worker::command(std::path::Path::new(common::DVMD), cmd_theirs.as_raw_fd(), ev_theirs.as_raw_fd());
    c.env("DVM_NO_TOPO_CACHE", "1").env_remove("DVM_LOG").env_remove("RUST_LOG");
    c.stderr(std::process::Stdio::piped());
    let mut worker = c.spawn().unwrap();
    drop((cmd_theirs, ev_theirs));

    // A command the worker answers (with an error: it has no server yet).
    let cmd = WorkerCmd { body: Some(Body::DeregisterNspace(DeregisterNspace { nspace: "x".into() })) };
    let body = cmd.encode_to_vec();
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    cmd_ours.write_all(&frame).unwrap();
    // Its reply has arrived once the socket polls readable; it stays unread.
    let mut pfd = libc::pollfd { fd: cmd_ours.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll on one valid descriptor; the timeout only guards against a hang.
    let ready = unsafe { libc::poll(&mut pfd, 1, 60_000) };
    assert_eq!(ready, 1, "the worker answered nothing");
    // The daemon is gone, the reply unread: the worker's next read fails with ECONNRESET.
    drop((cmd_ours, ev_ours));

    let done = until_exit(&mut worker, Duration::from_secs(60));
    let mut err = String::new();
    worker.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(done.code(), Some(0), "worker exit: {done:?}; stderr:\n{err}");
    assert!(err.trim().is_empty(), "the worker printed on the daemon's terminal:\n{err}");
}

/// Wait for `child` to exit; the bound only guards against a hang (then it is killed).
fn until_exit(child: &mut std::process::Child, guard: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + guard;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the worker did not end within {guard:?} of its daemon's end");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A daemon of an srun step gets its secret on stdin only once every task of the step has
/// started; meanwhile its forked worker starts the PMIx server (the `Init` goes ahead of the
/// secret). If the secret never comes (the HNP is gone: stdin closes), the daemon exits naming
/// it, its worker — by then a running server — is killed and reaped before the session
/// directory goes, and nothing is left. This process is the subreaper, as above.
#[test]
fn a_daemon_waiting_for_its_secret_has_its_server_up_and_leaves_nothing_when_it_never_comes() {
    // SAFETY: prctl on this process only.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) }, 0);
    let root = std::env::temp_dir().join(format!("dvm-secretwait-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let log = root.join("daemon.log");
    let mut daemon = std::process::Command::new(DVMD)
        .args(["--daemon", "--rank", "1", "--size", "2", "--hnp", "127.0.0.1:1", "--slots", "1"])
        .args(["--pmix-start", "eager"])
        .env("DVM_TMPDIR", &root)
        .env("DVM_LOG", "dvmd=debug")
        .env_remove("DVM_SECRET")
        .stdin(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    // The server comes up while stdin stays silent.
    until(Duration::from_secs(60), "the forked worker's PMIx server to start before the secret", || {
        logged().contains("PMIx worker up")
    });
    assert!(daemon.try_wait().unwrap().is_none(), "the daemon ended before its secret came: {}", logged());
    assert_eq!(common::session_dirs(&root).len(), 1, "the daemon's session directory while it waits");
    // The HNP is gone: stdin closes without a secret.
    drop(daemon.stdin.take());
    let st = daemon.wait().unwrap();
    let err = logged();
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(
        err.contains("dvmd: daemon 1 on host ")
            && err.contains("stdin closed before the DVM secret came: the HNP that started this daemon is gone"),
        "the failure names the daemon and the missing secret: {err}"
    );
    let adopted = left_its_forked_worker(&err);
    let left = common::session_dirs(&root);
    let _ = std::fs::remove_dir_all(&root);
    assert!(!adopted, "the daemon left its worker (a running server) behind: {err}");
    assert!(left.is_empty(), "session directories left behind: {left:?}");
}
