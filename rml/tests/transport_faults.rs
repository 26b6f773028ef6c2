//! Bad input, dead peers and silent peers: each ends one connection with a named event and
//! never takes the listener down.
#![cfg(feature = "net")]

mod transport_support;

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use dvm_proto::rml::Tag;
use dvm_rml::auth::Role;
use dvm_rml::{DvmSecret, LinkError, LinkSecurity, Rank, TransportEvent};
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Decoder;
use transport_support::*;

fn expect_lost(ev: TransportEvent, want_peer: Rank) -> LinkError {
    match ev {
        TransportEvent::PeerLost { peer, reason } if peer == want_peer => reason,
        other => panic!("expected PeerLost for {want_peer}, got {other:?}"),
    }
}

/// A frame above the receiver's limit: the receiver logs the sender's rank and the size and
/// closes; the sender learns it lost the peer. The receiver keeps serving others.
#[tokio::test]
async fn frame_over_the_limit_closes_that_connection() {
    let (log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    let (a, mut arx) = start(config(0, &secret)).await;
    let mut small = config(1, &secret);
    small.max_frame = 64 * 1024;
    let (b, mut brx) = start(small).await;
    wire(&[&a, &b]);

    let big = frame(0, 1, 0, pattern(0, 0, 1 << 20));
    let size = big.body_len();
    a.send(1, big).unwrap();
    assert!(matches!(expect_lost(next_event(&mut brx).await, 0), LinkError::FrameTooLarge { max: 65536, .. }));
    let reason = expect_lost(next_event(&mut arx).await, 1);
    assert!(matches!(reason, LinkError::Eof | LinkError::Io(_)), "{reason}");
    log.wait_for(&["above the max message size", "rank=1", "peer=0", &format!("size={size}"), "max=65536"]).await;

    // The next send reconnects, and frames within the limit flow.
    a.send(1, frame(0, 1, 1, pattern(0, 1, 1000))).unwrap();
    let (from, f) = next_frame(&mut brx).await;
    assert_eq!((from, f.header.seq), (0, 1));
    assert_eq!(f.payload, pattern(0, 1, 1000));
    a.shutdown().await;
    b.shutdown().await;
}

/// Random bytes from raw sockets (closed right away, or left hanging) are refused and logged
/// with their address; a good peer still connects afterwards.
#[tokio::test]
async fn garbage_does_not_hurt_the_listener() {
    let (log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    let mut cfg = config(0, &secret);
    cfg.handshake_timeout = Duration::from_millis(500);
    let (t, mut rx) = start(cfg).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut hanging = Vec::new();
    for i in 0..24 {
        let mut s = TcpStream::connect(t.local_addr()).await.unwrap();
        let me = s.local_addr().unwrap();
        let len = rng.gen_range(1..4096);
        let mut junk: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        if i % 3 == 0 && junk.len() >= 4 {
            // A plausible small length prefix, so the listener waits for a body that is junk.
            junk[..4].copy_from_slice(&(rng.gen_range(0..64u32)).to_be_bytes());
        }
        let _ = s.write_all(&junk).await;
        if i % 2 == 0 {
            drop(s);
        } else {
            hanging.push(s);
        }
        log.wait_for(&["refused RML connection: authentication failed", &format!("addr={me}")]).await;
    }
    drop(hanging);
    let (good, _grx) = start(config(1, &secret)).await;
    good.set_contact(0, t.local_addr());
    good.send(0, frame(1, 0, 0, pattern(1, 0, 16))).unwrap();
    let (from, f) = next_frame(&mut rx).await;
    assert_eq!((from, f.payload), (1, pattern(1, 0, 16).into()));
    good.shutdown().await;
    t.shutdown().await;
}

/// An authenticated peer that sends a malformed frame loses its connection (PeerLost for its
/// rank, with the reason); the listener goes on.
#[tokio::test]
async fn malformed_frame_after_handshake_closes_only_that_connection() {
    let (log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    // Plain frames, so the test can write a malformed one (sealed frames fail verification
    // before their contents are parsed).
    let mut cfg = config(0, &secret);
    cfg.link_security = LinkSecurity::None;
    let (t, mut rx) = start(cfg).await;
    let mut s = raw_peer(t.local_addr(), &secret, 7, LinkSecurity::None).await.stream;
    let mut bad = BytesMut::new();
    bad.put_u32(3);
    bad.put_slice(&[40, 1, 2]); // header length 40 in a 3-byte frame
    s.write_all(&bad).await.unwrap();
    assert!(matches!(expect_lost(next_event(&mut rx).await, 7), LinkError::Malformed(_)));
    log.wait_for(&["malformed frame", "peer=7"]).await;
    let mut rest = Vec::new();
    tokio::time::timeout(BOUND, s.read_to_end(&mut rest)).await.expect("listener hangs up").ok();

    let mut s = raw_peer(t.local_addr(), &secret, 8, LinkSecurity::None).await;
    let f = frame(8, 0, 0, Bytes::from_static(b"fine"));
    s.send(&f).await;
    let (from, got) = next_frame(&mut rx).await;
    assert_eq!((from, got), (8, f));
    t.shutdown().await;
}

/// Nobody listens at the contact address: after the bounded retries, ConnectFailed.
#[tokio::test]
async fn connect_to_a_closed_port_fails() {
    let (_log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    let (t, mut rx) = start(config(0, &secret)).await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    t.set_contact(3, closed);
    t.send(3, frame(0, 3, 0, Bytes::new())).unwrap();
    match next_event(&mut rx).await {
        TransportEvent::ConnectFailed { peer: 3, reason: LinkError::GaveUp { addr, attempts, .. } } => {
            assert_eq!(addr, closed);
            assert_eq!(attempts, 3);
        }
        other => panic!("expected ConnectFailed for 3, got {other:?}"),
    }
    t.shutdown().await;
}

/// Whichever side goes away, the other reports PeerLost for it: the dialer (its outbound link
/// breaks) and the listener (its only connection with the peer breaks).
#[tokio::test]
async fn dropping_one_side_is_noticed_by_the_other() {
    let (_log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    for stop_receiver in [true, false] {
        let (a, mut arx) = start(config(0, &secret)).await;
        let (b, mut brx) = start(config(1, &secret)).await;
        wire(&[&a, &b]);
        a.send(1, frame(0, 1, 0, pattern(0, 0, 32))).unwrap();
        next_frame(&mut brx).await;
        if stop_receiver {
            b.shutdown().await;
            expect_lost(next_event(&mut arx).await, 1);
            a.shutdown().await;
        } else {
            a.shutdown().await;
            expect_lost(next_event(&mut brx).await, 0);
            b.shutdown().await;
        }
    }
}

/// `disconnect` closes the links with a peer quietly on this side; the peer sees PeerLost and
/// a later send reconnects.
#[tokio::test]
async fn disconnect_then_reconnect() {
    let (_log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    let (a, _arx) = start(config(0, &secret)).await;
    let (b, mut brx) = start(config(1, &secret)).await;
    wire(&[&a, &b]);
    a.send(1, frame(0, 1, 0, Bytes::new())).unwrap();
    next_frame(&mut brx).await;
    a.disconnect(1);
    expect_lost(next_event(&mut brx).await, 0);
    a.send(1, frame(0, 1, 1, Bytes::new())).unwrap();
    let (from, f) = next_frame(&mut brx).await;
    assert_eq!((from, f.header.seq), (0, 1));
    a.shutdown().await;
    b.shutdown().await;
}

/// A peer that completes the handshake and then neither reads nor writes (as after a pulled
/// cable) is reported lost through the heartbeat read-idle bound.
#[tokio::test]
async fn silent_peer_is_lost_by_heartbeat() {
    let (log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    let mut cfg = config(0, &secret);
    cfg.heartbeat = Duration::from_millis(50);
    cfg.heartbeat_misses = 3;
    let (t, mut rx) = start(cfg).await;
    let silent = raw_peer(t.local_addr(), &secret, 9, LinkSecurity::DEFAULT).await;
    let reason = expect_lost(next_event(&mut rx).await, 9);
    assert_eq!(reason, LinkError::ReadIdle(Duration::from_millis(150)));
    log.wait_for(&["silent past the heartbeat bound", "peer=9"]).await;
    drop(silent);
    t.shutdown().await;
}

/// The same silence on the dialing side: the transport opened the link, the far end
/// authenticates and then goes quiet.
#[tokio::test]
async fn silent_listener_is_lost_by_heartbeat() {
    let (_log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    let mut cfg = config(0, &secret);
    cfg.heartbeat = Duration::from_millis(50);
    let (t, mut rx) = start(cfg).await;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    t.set_contact(4, l.local_addr().unwrap());
    t.send(4, frame(0, 4, 0, Bytes::new())).unwrap();
    let (s, _) = l.accept().await.unwrap();
    let s = raw_handshake(s, &secret, Role::Responder, 4, LinkSecurity::DEFAULT).await;
    assert!(matches!(expect_lost(next_event(&mut rx).await, 4), LinkError::ReadIdle(_)));
    drop(s);
    t.shutdown().await;
}

/// With heartbeats on, an idle connection carries TAG_HEARTBEAT frames from the transport
/// (and they are never delivered as frames on the receiving side).
#[tokio::test]
async fn idle_links_carry_heartbeats() {
    let (_log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    let mut cfg = config(0, &secret);
    cfg.heartbeat = Duration::from_millis(20);
    // The read-idle bound is only a safety net here: a slow test thread must not lose the link.
    cfg.heartbeat_misses = 1000;
    let (t, mut rx) = start(cfg).await;
    let mut s = raw_peer(t.local_addr(), &secret, 6, LinkSecurity::DEFAULT).await;
    let mut buf = BytesMut::new();
    let mut beats = 0;
    while beats < 3 {
        match s.opener.decode(&mut buf).unwrap() {
            Some(f) => {
                assert_eq!(f.header.tag, Tag::Heartbeat as u32);
                assert_eq!((f.header.origin, f.header.dst), (0, 6));
                assert!(f.payload.is_empty());
                beats += 1;
                // Answer with a heartbeat so the transport keeps the link.
                s.send(&dvm_rml::Frame::heartbeat(6, 0, 1)).await;
            }
            None => {
                let n = tokio::time::timeout(BOUND, s.stream.read_buf(&mut buf)).await.expect("heartbeat").unwrap();
                assert!(n > 0, "transport closed an answering link");
            }
        }
    }
    // Heartbeats never surface as frames: the first event is this real one.
    let f = frame(6, 0, 1, Bytes::from_static(b"x"));
    s.send(&f).await;
    let (from, got) = next_frame(&mut rx).await;
    assert_eq!((from, got), (6, f));
    t.shutdown().await;
}
