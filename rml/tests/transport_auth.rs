//! Only holders of the DVM secret get a frame through; impostors are refused and logged with
//! their address, in both directions.
#![cfg(feature = "net")]

mod transport_support;

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use dvm_proto::rml::{AuthHello, AuthProof};
use dvm_rml::auth::{self, Local, Role};
use dvm_rml::{DvmSecret, Frame, LinkError, LinkSecurity, TransportEvent, TOOL_RANK};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use transport_support::*;

fn handshake_msg(msg: &impl Message) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_u32(msg.encoded_len() as u32);
    msg.encode(&mut b).unwrap();
    b
}

async fn read_handshake_msg<M: Message + Default>(s: &mut TcpStream) -> M {
    let n = s.read_u32().await.unwrap() as usize;
    let mut buf = vec![0; n];
    s.read_exact(&mut buf).await.unwrap();
    M::decode(&buf[..]).unwrap()
}

/// A good frame from a good peer is the first thing `rx` reports: whatever the refused peer
/// sent before was not delivered.
async fn first_event_is_good_frame(
    secret: &DvmSecret,
    target: &dvm_rml::Transport,
    rx: &mut tokio::sync::mpsc::Receiver<TransportEvent>,
) {
    let (good, _grx) = start(config(50, secret)).await;
    good.set_contact(target.rank(), target.local_addr());
    good.send(target.rank(), frame(50, target.rank(), 0, pattern(50, 0, 8))).unwrap();
    let (from, f) = next_frame(rx).await;
    assert_eq!((from, f.header.seq), (50, 0));
    assert_eq!(f.payload, pattern(50, 0, 8));
    good.shutdown().await;
}

/// Two daemons with different secrets: each direction ends in `ConnectFailed` for the dialer
/// with an authentication reason, a refusal logged by the listener naming the dialer's
/// address, and no frame delivered.
#[tokio::test]
async fn wrong_secret_is_refused_both_ways() {
    let (log, _guard) = LogCapture::install();
    let good = DvmSecret::generate();
    let (a, mut arx) = start(config(0, &good)).await;
    let (b, mut brx) = start(config(1, &DvmSecret::generate())).await;
    wire(&[&a, &b]);

    for (from, to, rx_from) in [(&a, &b, &mut arx), (&b, &a, &mut brx)] {
        from.send(to.rank(), frame(from.rank(), to.rank(), 0, pattern(0, 0, 64))).unwrap();
        match next_event(rx_from).await {
            TransportEvent::ConnectFailed { peer, reason: LinkError::Auth { addr, .. } } => {
                assert_eq!(peer, to.rank());
                assert_eq!(addr, to.local_addr());
            }
            other => panic!("expected ConnectFailed with an auth reason, got {other:?}"),
        }
        // The listener's refusal names the address the dialer came from.
        let line = log
            .wait_for(&[
                "refused RML connection: authentication failed",
                &format!("rank={}", to.rank()),
                &format!("claiming rank {}", from.rank()),
            ])
            .await;
        assert!(line.contains("addr=127.0.0.1:"), "{line}");
        // The dialer logged its own refusal of the listener, naming the listener's address.
        log.wait_for(&[
            "dialed peer failed authentication",
            &format!("rank={}", from.rank()),
            &format!("addr={}", to.local_addr()),
        ])
        .await;
    }
    // Nothing reached either side; a good peer still gets through to the good-secret daemon.
    assert!(brx.try_recv().is_err() && arx.try_recv().is_err());
    first_event_is_good_frame(&good, &a, &mut arx).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// An impostor that pipelines hello, a forged proof and a valid-looking frame without waiting
/// is refused; its frame is never delivered and its address is logged.
#[tokio::test]
async fn forged_proof_with_pipelined_frame_delivers_nothing() {
    let (log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    let (t, mut rx) = start(config(0, &secret)).await;

    let mut s = TcpStream::connect(t.local_addr()).await.unwrap();
    let me = s.local_addr().unwrap();
    let mut out = handshake_msg(&AuthHello { nonce: vec![7u8; 32].into(), rank: 3, epoch: 1, link_security: 3 });
    out.extend_from_slice(&handshake_msg(&AuthProof { mac: vec![0u8; 32].into() }));
    let f = frame(3, 0, 0, pattern(3, 0, 100));
    out.extend_from_slice(&f.encode_prefix());
    out.extend_from_slice(&f.payload.clone().into_bytes());
    s.write_all(&out).await.unwrap();

    let line = log.wait_for(&["authentication failed", &format!("addr={me}")]).await;
    assert!(line.contains("claiming rank 3"), "{line}");
    // The listener hung up on the impostor.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(BOUND, s.read_to_end(&mut rest)).await.expect("listener closes the impostor");
    first_event_is_good_frame(&secret, &t, &mut rx).await;
    t.shutdown().await;
}

/// A listener that does not hold the secret: the dialing transport refuses it, logs its
/// address and never writes a frame byte to it.
#[tokio::test]
async fn dialer_refuses_an_impostor_listener() {
    let (log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    let (t, mut rx) = start(config(0, &secret)).await;
    let impostor = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = impostor.local_addr().unwrap();
    t.set_contact(5, addr);
    t.send(5, frame(0, 5, 0, pattern(0, 0, 100))).unwrap();

    let (mut s, _) = impostor.accept().await.unwrap();
    let hello: AuthHello = read_handshake_msg(&mut s).await;
    assert_eq!(hello.rank, 0);
    s.write_all(&handshake_msg(&AuthHello { nonce: vec![9u8; 32].into(), rank: 5, epoch: 1, link_security: 3 }))
        .await
        .unwrap();
    s.write_all(&handshake_msg(&AuthProof { mac: vec![1u8; 32].into() })).await.unwrap();
    let _proof: AuthProof = read_handshake_msg(&mut s).await;

    match next_event(&mut rx).await {
        TransportEvent::ConnectFailed { peer: 5, reason: LinkError::Auth { addr: a, .. } } => assert_eq!(a, addr),
        other => panic!("expected ConnectFailed(Auth) for peer 5, got {other:?}"),
    }
    log.wait_for(&["dialed peer failed authentication", &format!("addr={addr}"), "peer=5"]).await;
    // After its proof the dialer sent nothing: the queued frame never left.
    let mut rest = Vec::new();
    tokio::time::timeout(BOUND, s.read_to_end(&mut rest)).await.expect("dialer hangs up").unwrap();
    assert!(rest.is_empty(), "{} bytes leaked to an unauthenticated listener", rest.len());
    t.shutdown().await;
}

/// A tool holding the secret passes the handshake but a daemon's RML listener does not take
/// tool connections; the refusal is logged and the tool's stream is closed.
#[tokio::test]
async fn tool_role_authenticates_but_is_not_an_rml_peer() {
    let (log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    let (t, mut rx) = start(config(0, &secret)).await;
    let mut s = TcpStream::connect(t.local_addr()).await.unwrap();
    let me = s.local_addr().unwrap();
    let tool = Local { secret: &secret, role: Role::Initiator, rank: TOOL_RANK, epoch: 0, mode: LinkSecurity::DEFAULT };
    let id = auth::handshake(&mut s, tool, Duration::from_secs(5)).await.unwrap().peer;
    assert_eq!((id.rank, id.epoch), (0, 1));
    log.wait_for(&["not a peer daemon", &format!("addr={me}"), &format!("claimed={TOOL_RANK}")]).await;
    let mut rest = Vec::new();
    tokio::time::timeout(BOUND, s.read_to_end(&mut rest)).await.expect("daemon hangs up").unwrap();
    first_event_is_good_frame(&secret, &t, &mut rx).await;
    t.shutdown().await;
}

/// The handshake alone, both roles, over a real socket.
#[tokio::test]
async fn handshake_roles_over_tcp() {
    let (_log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let s2 = secret.clone();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let me = Local { secret: &s2, role: Role::Responder, rank: 2, epoch: 20, mode: LinkSecurity::Mac };
        auth::handshake(&mut s, me, Duration::from_secs(5)).await.map(|e| e.peer)
    });
    let mut c = TcpStream::connect(addr).await.unwrap();
    let me = Local { secret: &secret, role: Role::Initiator, rank: 1, epoch: 10, mode: LinkSecurity::Mac };
    let peer = auth::handshake(&mut c, me, Duration::from_secs(5)).await.unwrap().peer;
    assert_eq!((peer.rank, peer.epoch), (2, 20));
    let other = server.await.unwrap().unwrap();
    assert_eq!((other.rank, other.epoch), (1, 10));
    let _ = Frame::heartbeat(1, 2, 10);
}
