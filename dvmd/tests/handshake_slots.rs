//! Strangers holding a daemon's handshake slots cannot get a healthy daemon dropped (issue 29):
//! with more idle TCP connections held on every RML port than a listener lets sit in their
//! handshake (256), reopened whenever a daemon closes one, `kill -9` of daemon 1 of an
//! 8-daemon DVM at radix 2 loses exactly daemon 1. The repair has the HNP and the survivors
//! open new connections to ports full of strangers; those connections must get in.
//!
//! Waits are bounded guards against hangs, and the one sleep gives a wrong give-up time to
//! happen; pass or fail is decided by who was declared lost and whether a job runs.

mod common;

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{alive, signal, text, until, Dvm, Nodes};

const DAEMONS: u32 = 8;
/// Idle connections held on each RML port: above the listener's 256 handshake slots.
const HOLD: usize = 300;

/// TCP ports `pid` listens on (from its descriptors and its /proc/net/tcp).
fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    l.to_str().and_then(|s| s.strip_prefix("socket:[")?.strip_suffix(']')).map(String::from)
                })
                .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // local_address, st (0A: LISTEN), inode
            let listen = f.get(3) == Some(&"0A") && f.get(9).is_some_and(|i| inodes.iter().any(|x| x == i));
            let port = f.get(1)?.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok())?;
            listen.then_some(port)
        })
        .collect()
}

/// The RML listener of every process of the DVM: each listening port but the control API's.
fn rml_ports(dvm: &Dvm) -> Vec<SocketAddr> {
    let uri = std::fs::read_to_string(dvm.uri.trim_start_matches("file:")).unwrap();
    let control: SocketAddr = uri
        .trim()
        .trim_start_matches("dvm://")
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .expect("control address");
    let mut out = Vec::new();
    for rank in 0..DAEMONS {
        let pid = dvm.daemon_pid(rank);
        let ip = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::LOCALHOST) + rank);
        for port in listening_ports(pid) {
            let a = SocketAddr::from((ip, port));
            if a != control && !(rank == 0 && port == control.port()) {
                out.push(a);
            }
        }
    }
    out
}

/// Strangers: `per_port` idle connections on each address, each one reopened when the daemon
/// closes it, until dropped.
struct Strangers {
    stop: Arc<AtomicBool>,
    open: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Strangers {
    fn hold(addrs: Vec<SocketAddr>, per_port: usize) -> Strangers {
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let (s, o) = (stop.clone(), open.clone());
        let thread = std::thread::spawn(move || {
            let connect = |a: &SocketAddr| {
                let c = TcpStream::connect_timeout(a, Duration::from_secs(1)).ok()?;
                c.set_nonblocking(true).ok()?;
                Some(c)
            };
            let mut conns: Vec<(SocketAddr, Option<TcpStream>)> =
                addrs.iter().flat_map(|a| (0..per_port).map(move |_| (*a, None))).collect();
            let mut buf = [0u8; 4096];
            while !s.load(Ordering::Relaxed) {
                for (a, c) in conns.iter_mut() {
                    let closed = match c {
                        None => true,
                        Some(c) => match c.read(&mut buf) {
                            Ok(0) => true,
                            Ok(_) => false,
                            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                        },
                    };
                    if closed {
                        *c = connect(a);
                    }
                }
                o.store(conns.iter().filter(|(_, c)| c.is_some()).count(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Strangers { stop, open, thread: Some(thread) }
    }
}

impl Drop for Strangers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Enough descriptors for the strangers (the soft limit up to the hard one).
fn raise_fd_limit(need: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on this process with a valid struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < need {
            lim.rlim_cur = lim.rlim_max.min(need.max(lim.rlim_cur));
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    assert!(lim.rlim_cur >= need, "this test holds {need} sockets; RLIMIT_NOFILE allows {}", lim.rlim_cur);
}

/// Ranks the HNP declared lost, in order.
fn losses(dvm: &Dvm) -> Vec<u32> {
    dvm.log()
        .lines()
        .filter(|l| l.contains(" was lost"))
        .filter_map(|l| l.strip_prefix("dvmd: daemon ")?.split(' ').next()?.parse().ok())
        .collect()
}

#[test]
fn strangers_holding_every_rml_port_cost_only_the_killed_daemon() {
    raise_fd_limit((DAEMONS as usize * HOLD + 512) as u64);
    let dvm = Dvm::start("slots", Nodes::Local { daemons: DAEMONS, slots: 1 }, 2, &[("DVM_LOG", "warn")]);
    let ports = rml_ports(&dvm);
    assert_eq!(ports.len(), DAEMONS as usize, "one RML listener per daemon: {ports:?}");
    let pids: Vec<u32> = (0..DAEMONS).map(|r| dvm.daemon_pid(r)).collect();

    let strangers = Strangers::hold(ports, HOLD);
    until(Duration::from_secs(60), "the strangers to hold their connections", || {
        strangers.open.load(Ordering::Relaxed) >= DAEMONS as usize * HOLD * 9 / 10
    });
    until(Duration::from_secs(30), "every listener to be full", || {
        dvm.log().matches("still in their handshake").count() >= DAEMONS as usize
    });

    // Daemon 1 relays for 3, 5 and 7: the repair reconnects them to the HNP and to each other.
    signal(pids[1], libc::SIGKILL);
    until(Duration::from_secs(30), "daemon 1 to be declared lost", || losses(&dvm).contains(&1));
    // A repair that cannot reach a survivor gives up within a few seconds (5 attempts).
    std::thread::sleep(Duration::from_secs(8));
    let out = dvm.prun(&["--map-by", "node", "-n", &(DAEMONS - 1).to_string(), "hostname"]);
    let lost = losses(&dvm);
    assert_eq!(lost, vec![1], "only the killed daemon may be lost\nlog:\n{}", dvm.log());
    assert!(out.status.success(), "a job on the {} survivors failed: {}", DAEMONS - 1, text(&out).1);
    for (rank, &pid) in pids.iter().enumerate().skip(2) {
        assert!(alive(pid), "daemon {rank} is gone");
    }
    drop(strangers);
    dvm.stop();
}
