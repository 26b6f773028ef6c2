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
        &["--heartbeat-ms", "0", "--link-security", mode],
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
