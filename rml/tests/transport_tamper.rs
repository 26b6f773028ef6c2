//! Frames altered, replayed or dropped in flight (a proxy between two transports, after the
//! handshake): the receiver never delivers them, logs the peer and closes the link; both ends
//! report the peer lost. With link security off the same alteration goes through, which shows
//! the proxy really changed the frame.
#![cfg(feature = "net")]

#[path = "transport_support/proxy.rs"]
mod proxy;
mod transport_support;

use dvm_rml::{DvmSecret, LinkError, LinkSecurity, Rank, Transport, TransportEvent};
use proxy::{Proxy, Tamper};
use tokio::sync::mpsc;
use transport_support::*;

type Rx = mpsc::Receiver<TransportEvent>;

/// Transport 0 dials transport 1 through a fresh proxy; both in `mode`.
async fn pair_via_proxy(mode: LinkSecurity) -> (Transport, Rx, Transport, Rx, Proxy) {
    let secret = DvmSecret::generate();
    let proxy = Proxy::start();
    let mut ca = config(0, &secret);
    ca.link_security = mode;
    ca.dial_via = Some((1, proxy.addr));
    let mut cb = config(1, &secret);
    cb.link_security = mode;
    let (a, arx) = start(ca).await;
    let (b, brx) = start(cb).await;
    wire(&[&a, &b]);
    (a, arx, b, brx, proxy)
}

fn lost(ev: TransportEvent, want: Rank) -> LinkError {
    match ev {
        TransportEvent::PeerLost { peer, reason } if peer == want => reason,
        other => panic!("expected PeerLost for {want}, got {other:?}"),
    }
}

/// Send frames 0 and 1 through, arm `t`, send frames 2 and 3: returns what rank 1 received
/// before it lost rank 0, and why it lost it.
async fn tampered_run(mode: LinkSecurity, t: Tamper) -> (Vec<u64>, LinkError, Transport, Transport) {
    let (a, mut arx, b, mut brx, proxy) = pair_via_proxy(mode).await;
    let mut got = Vec::new();
    for seq in 0..2 {
        a.send(1, frame(0, 1, seq, pattern(0, seq, 5000))).unwrap();
        let (from, f) = next_frame(&mut brx).await;
        assert_eq!((from, f.header.seq, f.payload), (0, seq, pattern(0, seq, 5000).into()));
        got.push(seq);
    }
    proxy.arm(t);
    for seq in 2..4 {
        a.send(1, frame(0, 1, seq, pattern(0, seq, 5000))).unwrap();
    }
    let reason = loop {
        match next_event(&mut brx).await {
            TransportEvent::Frame { frame, .. } => {
                assert_eq!(frame.payload, pattern(0, frame.header.seq, 5000), "an altered frame was delivered");
                got.push(frame.header.seq);
            }
            ev => break lost(ev, 0),
        }
    };
    assert_eq!(proxy.fired(), 1);
    // The dialer learns the link is gone (the receiver hung up).
    let mine = lost(next_event(&mut arx).await, 1);
    assert!(matches!(mine, LinkError::Eof | LinkError::Io(_)), "{mine}");
    (got, reason, a, b)
}

#[tokio::test]
async fn flipped_byte_closes_the_link_and_is_logged() {
    for mode in [LinkSecurity::Mac, LinkSecurity::Aead] {
        let (log, _guard) = LogCapture::install();
        let (got, reason, a, b) = tampered_run(mode, Tamper::Flip).await;
        assert_eq!(got, vec![0, 1], "{mode}: nothing after the altered frame is delivered");
        assert_eq!(reason, LinkError::Verification { seq: 2 }, "{mode}");
        log.wait_for(&["ERROR", "failed verification", "rank=1", "peer=0", &format!("mode={mode}")]).await;
        a.shutdown().await;
        b.shutdown().await;
    }
}

#[tokio::test]
async fn replayed_frame_closes_the_link() {
    for mode in [LinkSecurity::Mac, LinkSecurity::Aead] {
        let (log, _guard) = LogCapture::install();
        let (got, reason, a, b) = tampered_run(mode, Tamper::Replay).await;
        // Frame 2 itself is genuine; its copy is refused as frame 3.
        assert_eq!(got, vec![0, 1, 2], "{mode}");
        assert_eq!(reason, LinkError::Verification { seq: 3 }, "{mode}");
        log.wait_for(&["failed verification", "peer=0"]).await;
        a.shutdown().await;
        b.shutdown().await;
    }
}

#[tokio::test]
async fn dropped_frame_is_detected_at_the_next_one() {
    let (_log, _guard) = LogCapture::install();
    let (got, reason, a, b) = tampered_run(LinkSecurity::Aead, Tamper::Drop).await;
    assert_eq!(got, vec![0, 1]);
    assert_eq!(reason, LinkError::Verification { seq: 2 });
    a.shutdown().await;
    b.shutdown().await;
}

/// The control arm: without link security the flipped frame is delivered, altered.
#[tokio::test]
async fn without_link_security_the_alteration_goes_through() {
    let (_log, _guard) = LogCapture::install();
    let (a, _arx, b, mut brx, proxy) = pair_via_proxy(LinkSecurity::None).await;
    proxy.arm(Tamper::Flip);
    a.send(1, frame(0, 1, 7, pattern(0, 7, 5000))).unwrap();
    let (_, f) = next_frame(&mut brx).await;
    assert_eq!(proxy.fired(), 1);
    assert_ne!(f.payload, pattern(0, 7, 5000), "the proxy flipped a payload bit");
    a.shutdown().await;
    b.shutdown().await;
}
