//! odls: exit status, launch failures, and what the child is started with (argv resolution,
//! env, cwd, fds, process group, PDEATHSIG). Real processes; each test stops what it starts.

mod odls_common;

use dvmd::odls::{ExitKind, Odls, OdlsEvent};
use odls_common::{sh, spec, Harness, TempDir};

#[tokio::test]
async fn exit_code_propagates() {
    let mut h = Harness::new(4096);
    assert_eq!(h.exit_of(sh(1, 0, "exit 3")).await, ExitKind::Code(3));
    assert_eq!(h.exit_of(sh(1, 1, "true")).await, ExitKind::Code(0));
    assert_eq!(h.odls.live(1), 0);
}

#[tokio::test]
async fn signal_death_is_reported_as_the_signal() {
    let mut h = Harness::new(4096);
    assert_eq!(h.exit_of(sh(1, 0, "kill -TERM $$")).await, ExitKind::Signal(libc::SIGTERM));
    assert_eq!(h.exit_of(sh(1, 1, "kill -KILL $$")).await, ExitKind::Signal(libc::SIGKILL));
}

#[tokio::test]
async fn missing_executable_is_one_sentence_naming_node_and_path() {
    let mut h = Harness::new(4096);
    let e = h.launch_error(spec(7, 2, &["./a.out"])).await;
    assert_eq!(e, "node n3: cannot start rank 2 of job 7: executable './a.out' not found (relative to '/')");
    let e = h.launch_error(spec(7, 3, &["/no/such/prog"])).await;
    assert_eq!(e, "node n3: cannot start rank 3 of job 7: executable '/no/such/prog' not found");
    let e = h.launch_error(spec(7, 4, &["no-such-prog-odls"])).await;
    assert_eq!(
        e,
        "node n3: cannot start rank 4 of job 7: executable 'no-such-prog-odls' not found in PATH '/usr/bin:/bin'"
    );
    let e = h.launch_error(spec(7, 5, &[])).await;
    assert_eq!(e, "node n3: cannot start rank 5 of job 7: the command line is empty");
    assert_eq!(h.odls.live(7), 0);
}

#[tokio::test]
async fn bad_wdir_is_one_sentence_naming_node_and_wdir() {
    let mut h = Harness::new(4096);
    let tmp = TempDir::new("wdir");
    let mut s = spec(7, 2, &["true"]);
    s.wdir = "/nope-odls".into();
    let e = h.launch_error(s).await;
    assert_eq!(e, "node n3: cannot start rank 2 of job 7: working directory '/nope-odls' does not exist");

    let file = tmp.file("plain", b"", 0o644);
    let mut s = spec(7, 3, &["true"]);
    s.wdir = file.clone();
    let e = h.launch_error(s).await;
    assert_eq!(
        e,
        format!("node n3: cannot start rank 3 of job 7: working directory '{}' is not a directory", file.display())
    );
    for e in h.procs.values().filter_map(|p| p.failed.as_ref()) {
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
}

#[tokio::test]
async fn not_executable_is_a_launch_failure() {
    let mut h = Harness::new(4096);
    let tmp = TempDir::new("noexec");
    let plain = tmp.file("data.txt", b"hello\n", 0o644);
    let mut s = spec(1, 0, &["./data.txt"]);
    s.wdir = tmp.path().into();
    let e = h.launch_error(s).await;
    assert_eq!(
        e,
        format!(
            "node n3: cannot start rank 0 of job 1: executable './data.txt' ({}) is not executable (permission denied)",
            plain.display()
        )
    );
    // Executable bits but no #!: like execvp (and shells), it runs under /bin/sh.
    let script = tmp.file("no-shebang", b"echo no-shebang $1\n", 0o755);
    let p = h.run(spec(1, 1, &[script.to_str().unwrap(), "ok"])).await;
    assert_eq!((p.stdout(), p.status), ("no-shebang ok\n".into(), Some(ExitKind::Code(0))));
    // A file in PATH without exec permission: named with where it was found.
    let mut s = spec(1, 2, &["data.txt"]);
    s.env = vec![("PATH".into(), tmp.path().display().to_string())];
    let e = h.launch_error(s).await;
    assert_eq!(
        e,
        format!(
            "node n3: cannot start rank 2 of job 1: executable 'data.txt' found in PATH at '{}' is not executable",
            plain.display()
        )
    );
}

#[tokio::test]
async fn argv0_is_resolved_against_wdir_and_the_procs_own_path() {
    let mut h = Harness::new(4096);
    let tmp = TempDir::new("argv0");
    tmp.file("probe.sh", b"#!/bin/sh\necho \"probe $*\"\n", 0o755);
    tmp.file("bin/odls-probe", b"#!/bin/sh\necho \"path-probe $*\"\n", 0o755);

    let mut s = spec(1, 0, &["./probe.sh", "a", "b c"]);
    s.wdir = tmp.path().into();
    let p = h.run(s).await;
    assert_eq!((p.stdout(), p.status), ("probe a b c\n".into(), Some(ExitKind::Code(0))));

    // Found only through the PATH given in the proc's env, not the daemon's.
    let mut s = spec(1, 1, &["odls-probe", "x"]);
    s.env = vec![("PATH".into(), format!("{}/bin:/usr/bin:/bin", tmp.path().display()))];
    let p = h.run(s).await;
    assert_eq!((p.stdout(), p.status), ("path-probe x\n".into(), Some(ExitKind::Code(0))));

    // argv[0] is passed through as given.
    let p = h.run(sh(1, 2, "echo \"$0\"")).await;
    assert_eq!(p.stdout(), "sh\n");
}

#[tokio::test]
async fn env_and_cwd_are_exactly_what_was_asked() {
    let mut h = Harness::new(4096);
    let tmp = TempDir::new("env");
    let env: Vec<(String, String)> = [
        ("PATH", "/usr/bin:/bin"),
        ("DUP", "first"),
        ("SPACES", "a b  c"),
        ("EQ", "x=y=z"),
        ("EMPTY", ""),
        ("DUP", "second"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    // Leak probes: variables of this (the forking) process that the proc was not given. The
    // process needs one for the check to mean anything; the libtest harness and cargo set
    // several.
    let asked: std::collections::BTreeSet<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    let probes: Vec<String> = std::env::vars().map(|(k, _)| k).filter(|k| !asked.contains(k.as_str())).collect();
    assert!(!probes.is_empty(), "this process has no variable outside the proc's env to probe a leak with");

    let mut s = spec(1, 0, &["/usr/bin/env"]);
    s.env = env.clone();
    s.wdir = tmp.path().into();
    let p = h.run(s).await;
    let mut got: Vec<String> = p.stdout().lines().map(String::from).collect();
    got.sort();
    // Oracle: the last setting of each name, as a map.
    let want: std::collections::BTreeMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let want: Vec<String> = want.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let leaked: Vec<&String> =
        probes.iter().filter(|k| got.iter().any(|l| l.split_once('=').is_some_and(|(n, _)| n == k.as_str()))).collect();
    assert!(leaked.is_empty(), "the forking process's variables leaked into the proc: {leaked:?}");
    assert_eq!(got, want);

    let mut s = spec(1, 1, &["pwd", "-P"]);
    s.wdir = tmp.path().into();
    let p = h.run(s).await;
    assert_eq!(p.stdout(), format!("{}\n", tmp.path().display()));
}

#[tokio::test]
async fn fds_above_stderr_are_closed_and_the_proc_leads_its_own_group() {
    let mut h = Harness::new(4096);
    // An inheritable fd (dup sets no CLOEXEC): without close_range the child would see it.
    let leaked = unsafe { libc::dup(2) };
    assert!(leaked > 2);
    let p = h.run(sh(1, 0, "ls /proc/$$/fd; echo pgid=$(cut -d' ' -f5 /proc/$$/stat) pid=$$")).await;
    let out = p.stdout();
    unsafe { libc::close(leaked) };
    let mut lines = out.lines();
    let fds: Vec<&str> = lines.by_ref().take(3).collect();
    assert_eq!(fds, ["0", "1", "2"], "child fds: {out}");
    let ids = lines.next().unwrap_or_default();
    let pid = p.pid.unwrap();
    assert_eq!(ids, format!("pgid={pid} pid={pid}"), "{out}");
    assert_eq!(lines.next(), None, "extra output: {out}");
}

/// A proc starts with no signal blocked, ignored or caught, whatever the starting thread had:
/// here it blocks SIGUSR2, ignores SIGPIPE (as every Rust program does) and SIGHUP, and catches
/// SIGUSR1 while the proc is started (the child runs in the daemon's memory until exec, so a
/// handler left in place could run there). `cat` itself installs no handler.
#[tokio::test(flavor = "current_thread")]
async fn a_proc_starts_with_default_signal_dispositions_and_nothing_blocked() {
    extern "C" fn on_usr1(_: libc::c_int) {}
    let mut h = Harness::new(4096);
    // SAFETY: signal dispositions and this thread's mask, restored below.
    let (old_mask, old_hup, old_usr1) = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR2);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        let hup = libc::signal(libc::SIGHUP, libc::SIG_IGN);
        let usr1 = libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t);
        (old, hup, usr1)
    };
    let p = h.run(spec(1, 0, &["cat", "/proc/self/status"])).await;
    // SAFETY: restoring what was saved above.
    unsafe {
        libc::signal(libc::SIGHUP, old_hup);
        libc::signal(libc::SIGUSR1, old_usr1);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut());
    }
    let out = p.stdout();
    let sig: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("SigBlk:") || l.starts_with("SigIgn:") || l.starts_with("SigCgt:"))
        .collect();
    let zero = "0000000000000000";
    assert_eq!(
        sig,
        [format!("SigBlk:\t{zero}"), format!("SigIgn:\t{zero}"), format!("SigCgt:\t{zero}")],
        "the proc's signal state"
    );
}
/// PR_SET_PDEATHSIG: the proc is killed when the thread that forked it exits. No kill_all and
/// no drop here (the Odls is leaked), so only the kernel can deliver that SIGKILL.
#[test]
fn pdeathsig_kills_the_proc_when_its_forking_thread_exits() {
    let pid = std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let mut odls = Odls::new("n0".into(), tx, 4096);
            odls.spawn(spec(1, 0, &["sleep", "60"]));
            let ev = rx.recv().await.unwrap();
            std::mem::forget(odls);
            match ev {
                OdlsEvent::Started { pid, .. } => pid,
                other => panic!("{other:?}"),
            }
        })
    })
    .join()
    .unwrap();
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    let status = nix::sys::wait::waitpid(pid, None).unwrap();
    assert_eq!(status, nix::sys::wait::WaitStatus::Signaled(pid, nix::sys::signal::Signal::SIGKILL, false));
}

/// The proc's timer slack: the kernel's default (inherited) unless the daemon chose one; the
/// proc's own `DVM_TIMER_SLACK_US` wins either way, and a malformed one is a launch failure
/// that names it.
#[tokio::test]
async fn timer_slack_is_what_the_daemon_chose_unless_the_proc_env_says_otherwise() {
    let mut h = Harness::new(4096);
    let inherited = std::fs::read_to_string("/proc/self/timerslack_ns").expect("timerslack_ns").trim().to_string();
    let slack = |rank: u32, us: u64, env: Option<&str>| {
        let mut s = spec(1, rank, &["cat", "/proc/self/timerslack_ns"]);
        s.timer_slack_us = us;
        if let Some(v) = env {
            s.env.push(("DVM_TIMER_SLACK_US".into(), v.into()));
        }
        s
    };
    let s = slack(0, 0, None);
    assert_eq!(h.run(s).await.stdout().trim(), inherited, "no slack chosen: the daemon's own");
    let s = slack(1, 2_000, None);
    assert_eq!(h.run(s).await.stdout().trim(), "2000000", "2000 us chosen by the daemon");
    let s = slack(2, 2_000, Some("0"));
    assert_eq!(h.run(s).await.stdout().trim(), inherited, "the proc's DVM_TIMER_SLACK_US=0 wins");
    let s = slack(3, 0, Some("750"));
    assert_eq!(h.run(s).await.stdout().trim(), "750000", "the proc's DVM_TIMER_SLACK_US=750 wins");
    for (rank, bad) in [(4, "fast"), (5, "-1"), (6, "2000000")] {
        let s = slack(rank, 0, Some(bad));
        assert_eq!(
            h.launch_error(s).await,
            format!(
                "node n3: cannot start rank {rank} of job 1: DVM_TIMER_SLACK_US='{bad}' is not a number of microseconds from 0 to 1000000"
            )
        );
    }
}

/// A proc given a PMI connection has it at the fd asked (and no other fd past stderr); what it
/// writes there comes back as `PmiData`, what the daemon writes reaches it, and its end closes
/// the connection (`PmiClosed`) before its exit is reported.
#[tokio::test]
async fn a_pmi_fd_is_the_one_fd_past_stderr_and_carries_bytes_both_ways() {
    let mut h = Harness::new(4096);
    let script = "ls /proc/$$/fd | tr '\\n' ' ' >&2; printf 'cmd=init\\n' >&3; read -r line <&3; echo \"got $line\"";
    let mut s = sh(1, 0, script);
    s.pmi_fd = Some(3);
    h.odls.spawn(s);
    let (mut out, mut err, mut asked, mut closed) = (String::new(), String::new(), String::new(), false);
    loop {
        match h.next_raw().await {
            OdlsEvent::PmiData { data, .. } => {
                asked.push_str(&String::from_utf8_lossy(&data));
                if asked.ends_with('\n') {
                    h.odls.pmi_write(1, 0, bytes::Bytes::from_static(b"cmd=ok\n"));
                }
            }
            OdlsEvent::PmiClosed { .. } => closed = true,
            OdlsEvent::Output { stream, data, .. } => {
                h.odls.ack_output(1, data.len());
                let text = String::from_utf8_lossy(&data).into_owned();
                match stream {
                    dvmd::odls::Stream::Stdout => out.push_str(&text),
                    dvmd::odls::Stream::Stderr => err.push_str(&text),
                }
            }
            OdlsEvent::Exited { status, .. } => {
                assert_eq!(status, dvmd::odls::ExitKind::Code(0), "{err}");
                break;
            }
            OdlsEvent::LaunchFailed { error, .. } => panic!("{error}"),
            _ => {}
        }
    }
    assert_eq!(err.trim(), "0 1 2 3", "the child's fds");
    assert_eq!(asked, "cmd=init\n");
    assert_eq!(out, "got cmd=ok\n");
    assert!(closed, "its end closed the connection");
}
