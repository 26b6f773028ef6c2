//! The fake-node harness itself: isolation, reachability through the bridge, launch-agent
//! prefixes, silent cuts, and that nothing outlives a cluster or a guard.

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dvm_tests::{
    assert_no_leftovers, cleanup_stale, leftovers, processes_in_netns, require_netns, wait_for_line, ChildGuard,
    FakeCluster, HarnessError, TestTag,
};

const PORT: u16 = 7070;
/// Nothing listens here: a reachable node answers with RST, a cut one with silence.
const CLOSED_PORT: u16 = 7071;
const STEP: Duration = Duration::from_secs(10);

/// Accepts `n` connections and echoes each line back; returns the peers it served.
fn echo_server(listener: TcpListener, n: usize) -> JoinHandle<Vec<Ipv4Addr>> {
    std::thread::spawn(move || {
        let mut peers = Vec::new();
        for _ in 0..n {
            let (conn, peer) = listener.accept().expect("accept");
            let SocketAddr::V4(peer) = peer else { panic!("IPv6 peer {peer}") };
            peers.push(*peer.ip());
            std::thread::spawn(move || {
                let mut out = conn.try_clone().expect("clone");
                for line in BufReader::new(conn).lines() {
                    let Ok(line) = line else { break };
                    if writeln!(out, "{line}").is_err() {
                        break;
                    }
                }
            });
        }
        peers
    })
}

fn connect(addr: Ipv4Addr, port: u16, timeout: Duration) -> std::io::Result<TcpStream> {
    TcpStream::connect_timeout(&SocketAddr::from((addr, port)), timeout)
}

/// Sends one line on `s` and reads the echo.
fn roundtrip(s: &TcpStream, msg: &str) -> String {
    (&*s).write_all(format!("{msg}\n").as_bytes()).expect("write");
    s.set_read_timeout(Some(STEP)).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("read echo");
    line.trim_end().to_string()
}

fn output(argv: &[String]) -> String {
    let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    assert!(out.status.success(), "{argv:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn on_node(c: &FakeCluster, prefix: &str, i: usize, cmd: &[&str]) -> String {
    let mut argv = c.expand_prefix(prefix, i).unwrap();
    argv.extend(cmd.iter().map(|s| s.to_string()));
    output(&argv)
}

/// A skip must not hide a broken harness: as root, clusters must be buildable.
#[test]
fn harness_is_available_to_root() {
    if nix::unistd::geteuid().is_root() {
        assert_eq!(FakeCluster::availability(), Ok(()));
    } else {
        dvm_tests::skip("netns_harness::harness_is_available_to_root", "not root");
    }
}

#[test]
fn nodes_are_separate_hosts_joined_by_the_bridge() {
    require_netns!();
    let c = FakeCluster::new(4).unwrap();
    let (a0, a3, head) = (c.node_addr(0), c.node_addr(3), c.head_addr());

    // Separate network stacks: node 0 does not own node 3's address, the root does not
    // own node 0's.
    let bind_elsewhere = c.in_node(0, || TcpListener::bind((a3, 0)).map(drop)).unwrap();
    assert_eq!(bind_elsewhere.unwrap_err().kind(), ErrorKind::AddrNotAvailable);
    let err = TcpListener::bind((a0, 0)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AddrNotAvailable);

    // Node 0 and the head reach node 3; the server sees each one's own address, so the
    // traffic crossed the bridge rather than a loopback.
    let listener = c.in_node(3, || TcpListener::bind((a3, PORT))).unwrap().unwrap();
    let server = echo_server(listener, 2);
    let s = c.in_node(0, || connect(a3, PORT, STEP)).unwrap().unwrap();
    assert_eq!(roundtrip(&s, "hello from node 0"), "hello from node 0");
    let s = connect(a3, PORT, STEP).unwrap();
    assert_eq!(roundtrip(&s, "hello from the head"), "hello from the head");
    assert_eq!(server.join().unwrap(), vec![a0, head]);

    // Node 2 reaches a listener on the head address in the root namespace.
    let listener = TcpListener::bind((head, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = echo_server(listener, 1);
    let s = c.in_node(2, || connect(head, port, STEP)).unwrap().unwrap();
    assert_eq!(roundtrip(&s, "hello head"), "hello head");
    assert_eq!(server.join().unwrap(), vec![c.node_addr(2)]);
}

#[test]
fn launch_prefixes_place_processes_on_their_node() {
    require_netns!();
    let c = FakeCluster::new(4).unwrap();
    let machine = output(&["hostname".to_string()]);
    let plain = c.netns_exec_prefix();
    let named = c.exec_prefix_with_hostname();
    for i in 0..c.len() {
        let eth0 = on_node(&c, plain, i, &["ip", "-4", "-o", "addr", "show", "dev", "eth0"]);
        assert!(eth0.contains(&format!("inet {}/24", c.node_addr(i))), "node {i}: {eth0}");
        // `ip netns exec` alone keeps the machine's name; the hostname prefix renames.
        assert_eq!(on_node(&c, plain, i, &["hostname"]), machine);
        assert_eq!(on_node(&c, &named, i, &["hostname"]), c.node_name(i));
        // Node names resolve inside the nodes, from files only (no DNS to wait for).
        let nss = on_node(&c, plain, i, &["grep", "^hosts:", "/etc/nsswitch.conf"]);
        assert_eq!(nss.split_whitespace().collect::<Vec<_>>(), ["hosts:", "files"]);
        let peer = (i + 1) % c.len();
        let hosts = on_node(&c, &named, i, &["getent", "hosts", c.node_name(peer)]);
        assert_eq!(hosts.split_whitespace().next(), Some(c.node_addr(peer).to_string().as_str()));
    }
    assert_eq!(output(&["hostname".to_string()]), machine, "machine renamed");
    // The head does not route node traffic off the machine.
    let hd = &c.footprint().root_links[0];
    let fwd = std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{hd}/forwarding")).unwrap();
    assert_eq!(fwd.trim(), "0");

    let mut cmd = c.node_command(1, "hostname").unwrap();
    assert_eq!(String::from_utf8(cmd.output().unwrap().stdout).unwrap().trim(), c.node_name(1));

    let path = std::env::temp_dir().join(format!("dvm-hostfile-{}-{}", std::process::id(), c.index()));
    c.write_hostfile(&path, 2).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let expected: Vec<String> = c.node_names().iter().map(|n| format!("{n} slots=2")).collect();
    assert_eq!(text.lines().collect::<Vec<_>>(), expected);
}

fn assert_silent(result: std::io::Result<TcpStream>, what: &str) {
    match result {
        Ok(_) => panic!("{what}: connected to a cut node"),
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::HostUnreachable),
            "{what}: a cut node must be silent, got {e} ({:?})",
            e.kind()
        ),
    }
}

/// One read that waits up to `wait` in total. A timed socket read is never restarted after
/// an interruption (signal(7)), so EINTR is retried here for the remaining time.
fn read_for(s: &TcpStream, wait: Duration) -> std::io::Result<usize> {
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 64];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        match std::io::Read::read(&mut &*s, &mut buf) {
            Err(e) if e.kind() == ErrorKind::Interrupted && !left.is_zero() => continue,
            other => return other,
        }
    }
}

#[test]
fn cut_is_silent_and_restore_heals() {
    require_netns!();
    let c = FakeCluster::new(4).unwrap();
    let a3 = c.node_addr(3);
    let listener = c.in_node(3, || TcpListener::bind((a3, PORT))).unwrap().unwrap();
    let server = echo_server(listener, 2);

    // Reachable: a closed port answers with RST.
    let refused = c.in_node(0, || connect(a3, CLOSED_PORT, STEP)).unwrap();
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::ConnectionRefused);
    let s = c.in_node(0, || connect(a3, PORT, STEP)).unwrap().unwrap();
    assert_eq!(roundtrip(&s, "before"), "before");

    c.cut(3).unwrap();
    // The established connection goes quiet: no echo, no EOF, no reset.
    (&s).write_all(b"during\n").unwrap();
    let quiet = read_for(&s, Duration::from_secs(1));
    assert!(
        matches!(&quiet, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "expected silence on the cut connection, got {quiet:?}"
    );
    // New connections, even to the closed port, get no answer from node 0 or the head.
    let bound = Duration::from_millis(1500);
    assert_silent(c.in_node(0, || connect(a3, CLOSED_PORT, bound)).unwrap(), "node 0");
    assert_silent(connect(a3, CLOSED_PORT, bound), "head");

    c.restore(3).unwrap();
    // TCP retransmits the line sent during the cut; its echo arrives.
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).expect("echo after restore");
    assert_eq!(line.trim_end(), "during");
    let refused = c.in_node(0, || connect(a3, CLOSED_PORT, STEP)).unwrap();
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::ConnectionRefused);
    let s2 = c.in_node(0, || connect(a3, PORT, STEP)).unwrap().unwrap();
    assert_eq!(roundtrip(&s2, "after"), "after");
    assert_eq!(server.join().unwrap(), vec![c.node_addr(0); 2]);
}

/// Polls `cond` until it holds or `STEP` passes.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + STEP;
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn_sleeper(c: &FakeCluster, i: usize, tag: &TestTag) -> ChildGuard {
    let mut cmd = c.node_command(i, "sleep").unwrap();
    cmd.arg("300");
    tag.apply(&mut cmd);
    // Not in its own group and only adopted: the cluster, not the guard, must kill it.
    ChildGuard::adopt(cmd.spawn().unwrap(), false)
}

#[test]
fn drop_kills_and_removes_everything() {
    require_netns!();
    let tag = TestTag::new();
    let c = FakeCluster::new(2).unwrap();
    let fp = c.footprint();
    let mut sleeper = spawn_sleeper(&c, 1, &tag);
    eventually("sleeper inside node 1", || {
        processes_in_netns(c.node_name(1)).iter().any(|p| p.pid as u32 == sleeper.pid())
    });
    let everything = fp.netns.len() + fp.root_links.len() + fp.paths.len();
    assert_eq!(fp.remaining().len(), everything, "{:?}", fp.remaining());

    drop(c);
    let status = sleeper.wait_timeout(STEP).unwrap().expect("sleeper survived the cluster");
    assert_eq!(status.signal(), Some(9));
    assert_eq!(fp.remaining(), Vec::<String>::new());
    // Independently of the footprint helper: nothing with the cluster's names is listed.
    let netns = output(&["ip".into(), "netns".into(), "list".into()]);
    let links = output(&["ip".into(), "-o".into(), "link".into(), "show".into()]);
    for ns in &fp.netns {
        assert!(!netns.lines().any(|l| l.split_whitespace().next() == Some(ns)), "{ns} left: {netns}");
    }
    let prefix = format!("dvm{}", fp.k);
    assert!(
        !links
            .lines()
            .any(|l| l.split(": ").nth(1).is_some_and(
                |n| n.starts_with(&prefix) && n[prefix.len()..].starts_with(|ch: char| !ch.is_ascii_digit())
            )),
        "links left: {links}"
    );
    assert_no_leftovers("sleep", &tag);
}

#[test]
fn stale_cluster_of_a_dead_owner_is_reaped_and_live_ones_are_not() {
    require_netns!();
    let tag = TestTag::new();
    let live = FakeCluster::new(1).unwrap();
    let crashed = FakeCluster::new(2).unwrap();
    let fp = crashed.footprint();
    let mut sleeper = spawn_sleeper(&crashed, 0, &tag);
    eventually("sleeper inside node 0", || {
        processes_in_netns(crashed.node_name(0)).iter().any(|p| p.pid as u32 == sleeper.pid())
    });
    // The owner "crashes": its cluster is never dropped, and its marker names a process
    // that has exited.
    std::mem::forget(crashed);
    let mut gone = Command::new("true").spawn().unwrap();
    gone.wait().unwrap();
    std::fs::write(fp.marker.join("owner"), format!("{} 0", gone.id())).unwrap();

    // Another test process may reap it first; either way it must be gone afterwards.
    let reaped = cleanup_stale().unwrap();
    assert!(!reaped.contains(&live.index()));
    assert_eq!(fp.remaining(), Vec::<String>::new(), "k={} not reaped", fp.k);
    let status = sleeper.wait_timeout(STEP).unwrap().expect("sleeper survived the reaping");
    assert_eq!(status.signal(), Some(9));
    assert!(live.footprint().remaining().len() > 1, "live cluster damaged");
    let s = live.in_node(0, || TcpListener::bind((live.node_addr(0), 0))).unwrap();
    assert!(s.is_ok(), "live cluster's node lost its address: {s:?}");
}

#[test]
fn guard_kills_the_process_group_and_lines_arrive_in_time() {
    require_netns!();
    let tag = TestTag::new();
    let c = FakeCluster::new(3).unwrap();
    let mut cmd = c.node_command(2, "sh").unwrap();
    // The sleep is a grandchild of the guard, in its process group.
    cmd.args(["-c", "echo booting; echo \"ready on $(hostname)\"; sleep 300 & wait"]).stdout(Stdio::piped());
    tag.apply(&mut cmd);
    let mut guard = ChildGuard::spawn(&mut cmd).unwrap();

    let (line, mut lines) = wait_for_line(guard.take_stdout().unwrap(), "ready on", STEP).unwrap();
    assert_eq!(line, format!("ready on {}", c.node_name(2)));
    match lines.wait_for_line("never printed", Duration::from_millis(300)) {
        Err(HarnessError::LineTimeout { tail, .. }) => {
            assert_eq!(tail, vec!["booting".to_string(), line.clone()])
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    eventually("tagged sleep running", || leftovers("sleep", &tag).len() == 1);
    let sleep_pid = leftovers("sleep", &tag)[0].pid;
    assert!(processes_in_netns(c.node_name(2)).iter().any(|p| p.pid == sleep_pid));

    drop(guard);
    assert_no_leftovers("sleep", &tag);
    assert_eq!(lines.next_line(STEP).unwrap(), None, "stdout must close once all are dead");
    assert!(processes_in_netns(c.node_name(2)).is_empty());
}
