//! Link security end to end, with real daemons on loopback: a proxy between the HNP and
//! daemon 1 (`DVM_TEST_DIAL_VIA`) alters or replays one frame of a job's launch after the
//! handshake; the link is closed and logged, the job fails naming the daemon, and nothing of
//! it runs. A replayed control call is refused, and so is a proof made for another call.
//!
//! Waits are bounded guards against hangs; no assertion depends on how long something took.

mod common;
#[path = "../../rml/tests/transport_support/proxy.rs"]
mod proxy;

use common::{text, Dvm, Nodes};
use proxy::{Proxy, Tamper};

fn hostname() -> String {
    nix::unistd::gethostname().unwrap().to_string_lossy().into_owned()
}

/// A 2-daemon DVM (radix 2, heartbeats off so the link is quiet until the job) whose HNP dials
/// daemon 1 through `proxy`.
fn dvm_via(name: &str, proxy: &Proxy, mode: &str) -> Dvm {
    let via = format!("1@{}", proxy.addr);
    Dvm::start_with_args(
        name,
        Nodes::Local { daemons: 2, slots: 1 },
        2,
        &[("DVM_TEST_DIAL_VIA", &via)],
        // No link probe: the proxy's next frame after the boot must be the launch.
        &["--heartbeat-ms", "0", "--link-security", mode, "--no-link-probe"],
    )
}

/// Arm `t`, run a job on daemon 1 that would leave a marker: it must fail naming daemon 1,
/// leave no marker, and the log must name the failed verification and the peer.
fn tampered_job(name: &str, mode: &str, t: Tamper) {
    let proxy = Proxy::start();
    let dvm = dvm_via(name, &proxy, mode);
    assert!(proxy.frames() > 0, "the boot (WIREUP) went through the proxy");
    let marker = dvm.root.join("ran");
    proxy.arm(t);
    let host = format!("{}-1", hostname());
    let script = format!("touch {}", marker.display());
    let out = dvm.prun(&["-n", "1", "--host", &host, "sh", "-c", &script]);
    let (_, err) = text(&out);
    eprintln!("{name}: prun said: {err}");
    assert_eq!(proxy.fired(), 1, "the proxy tampered with the launch");
    assert!(!out.status.success(), "a job whose launch was tampered with succeeded: {err}");
    assert!(err.contains("daemon 1"), "the error names the daemon: {err}");
    assert!(!marker.exists(), "the tampered job ran");
    let log = dvm.log();
    assert!(
        log.lines().any(|l| l.contains("failed verification") && l.contains("rank=1") && l.contains("peer=0")),
        "daemon 1 logs the frame from the HNP that failed verification:\n{log}"
    );
    // The DVM goes on with the daemons it has left.
    dvm.assert_up();
    assert!(!marker.exists(), "the tampered job ran later");
    dvm.stop();
}

#[test]
fn flipped_byte_in_a_launch_fails_the_job_aead() {
    tampered_job("flipaead", "aead", Tamper::Flip);
}

#[test]
fn flipped_byte_in_a_launch_fails_the_job_mac() {
    tampered_job("flipmac", "mac", Tamper::Flip);
}

#[test]
fn replayed_frame_in_a_launch_fails_the_job() {
    tampered_job("replay", "aead", Tamper::Replay);
}

/// The same path untouched: the job runs (so the tests above fail for the tampering alone).
#[test]
fn untouched_proxy_runs_the_job() {
    let proxy = Proxy::start();
    let dvm = dvm_via("passthru", &proxy, "aead");
    let host = format!("{}-1", hostname());
    let out = dvm.prun(&["-n", "1", "--host", &host, "sh", "-c", "echo $DVM_DAEMON"]);
    assert!(out.status.success(), "{}", text(&out).1);
    assert_eq!(text(&out).0.trim(), "1");
    dvm.stop();
}

/// A recorded control call replayed is refused, and a proof made for `status` does not
/// authorize `terminate`; the DVM keeps running.
#[test]
fn replayed_control_call_is_refused() {
    let dvm = Dvm::start("ctlreplay", Nodes::Local { daemons: 1, slots: 1 }, 2, &[]);
    let uri = dvmd::session::DvmUri::resolve(Some(&dvm.uri)).unwrap();
    let secret = dvm_rml::DvmSecret::read_file(&uri.secret_path()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        use dvm_proto::control::control_client::ControlClient;
        use dvm_proto::control::{ChallengeRequest, StatusRequest, TerminateRequest};
        let mut c = ControlClient::connect(format!("http://{}", uri.control)).await.unwrap();
        let with = |proof: &str| {
            let mut r = tonic::Request::new(StatusRequest {});
            r.metadata_mut().insert("dvm-auth", proof.parse().unwrap());
            r
        };
        let nonce = c.challenge(ChallengeRequest {}).await.unwrap().into_inner().nonce;
        let proof = dvmd::control::proof(&secret, "status", &nonce);
        c.status(with(&proof)).await.expect("a fresh proof is accepted");
        let replay = c.status(with(&proof)).await.expect_err("a replayed call is refused");
        assert_eq!(replay.code(), tonic::Code::Unauthenticated);
        assert!(replay.message().contains("already used"), "{}", replay.message());

        let nonce = c.challenge(ChallengeRequest {}).await.unwrap().into_inner().nonce;
        let proof = dvmd::control::proof(&secret, "status", &nonce);
        let mut r = tonic::Request::new(TerminateRequest {});
        r.metadata_mut().insert("dvm-auth", proof.parse().unwrap());
        let other = c.terminate(r).await.expect_err("a proof for status does not terminate");
        assert_eq!(other.code(), tonic::Code::Unauthenticated);
    });
    assert!(dvm.log().contains("control call refused"), "{}", dvm.log());
    dvm.assert_up();
    dvm.stop();
}

/// The TCP ports `pid` listens on (its socket inodes matched against /proc/net/tcp).
fn listening_addrs(pid: u32) -> Vec<std::net::SocketAddr> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(str::to_string))
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // local_address (hex ip:port, ip little-endian), st == 0A (LISTEN), inode.
            if f.get(3) != Some(&"0A") || !inodes.iter().any(|i| Some(&i.as_str()) == f.get(9)) {
                return None;
            }
            let (ip, port) = f[1].split_once(':')?;
            let ip = u32::from_str_radix(ip, 16).ok()?.to_le_bytes();
            Some(std::net::SocketAddr::from((ip, u16::from_str_radix(port, 16).ok()?)))
        })
        .collect()
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix(" kB")?.parse().ok()).unwrap()
}

/// 1,000 idle connections, then 1,000 sending garbage, on every port of the HNP (RML and
/// control): the DVM keeps running jobs on both daemons, nobody is declared lost (heartbeats
/// kept flowing), and the HNP's RSS stays within a bound.
#[test]
fn idle_and_garbage_connection_floods_leave_the_dvm_serving() {
    use std::io::Write;
    let dvm = Dvm::start_with_args(
        "flood",
        Nodes::Local { daemons: 2, slots: 1 },
        2,
        &[],
        &["--heartbeat-ms", "200", "--heartbeat-misses", "5"],
    );
    let hnp = dvm.pids[0];
    let ports = listening_addrs(hnp);
    assert!(ports.len() >= 2, "the HNP listens for RML and control: {ports:?}");
    let before = rss_kib(hnp);
    let mut idle = Vec::new();
    for i in 0..1000 {
        let a = ports[i % ports.len()];
        idle.push(std::net::TcpStream::connect(a).unwrap());
    }
    let out = dvm.prun(&["-n", "2", "--map-by", "node", "true"]);
    assert!(out.status.success(), "with 1,000 idle connections open: {}", text(&out).1);
    let mut junk = Vec::new();
    for i in 0..1000 {
        let Ok(mut s) = std::net::TcpStream::connect(ports[i % ports.len()]) else { continue };
        let bytes: Vec<u8> = (0..512).map(|_| rand::random::<u8>()).collect();
        let _ = s.write_all(&bytes);
        junk.push(s);
    }
    let out = dvm.prun(&["-n", "2", "--map-by", "node", "true"]);
    assert!(out.status.success(), "with a garbage flood: {}", text(&out).1);
    let after = rss_kib(hnp);
    assert!(after < before + 64 * 1024, "HNP RSS grew from {before} KiB to {after} KiB");
    drop(idle);
    drop(junk);
    let log = dvm.log();
    assert!(
        !log.contains("lost tree neighbour") && !log.contains("was lost"),
        "a daemon was lost under the flood:\n{log}"
    );
    dvm.assert_up();
    dvm.stop();
}
