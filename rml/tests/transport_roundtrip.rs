//! Frames travel between real transports on 127.0.0.1 intact and in order.
#![cfg(feature = "net")]

mod transport_support;

use std::collections::HashMap;

use bytes::Bytes;
use dvm_rml::{DvmSecret, Rank, TransportError, DEFAULT_MAX_FRAME};
use transport_support::*;

const SMALL: u64 = 2000;
const BIG: usize = 1 << 20;

/// Three daemons, each sends every other one a 1 MiB frame and then SMALL small frames; the
/// 1 MiB payload is one `Bytes` shared by both sends. Every receiver must get exactly the
/// frames the sender made, from the right peer, in send order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_daemons_all_to_all_in_order() {
    let secret = DvmSecret::generate();
    let mut ts = Vec::new();
    for rank in 0..3 {
        ts.push(start(config(rank, &secret)).await);
    }
    wire(&ts.iter().map(|(t, _)| t).collect::<Vec<_>>());

    for (t, _) in &ts {
        let me = t.rank();
        let peers: Vec<Rank> = (0..3).filter(|&r| r != me).collect();
        let big = pattern(me, 0, BIG);
        for &p in &peers {
            t.send(p, frame(me, p, 0, big.clone())).unwrap();
        }
        for seq in 1..=SMALL {
            for &p in &peers {
                t.send(p, frame(me, p, seq, pattern(me, seq, (seq % 97) as usize))).unwrap();
            }
        }
    }

    for (t, rx) in &mut ts {
        let me = t.rank();
        let mut next_seq: HashMap<Rank, u64> = HashMap::new();
        for _ in 0..2 * (SMALL + 1) {
            let (from, f) = next_frame(rx).await;
            assert_ne!(from, me);
            assert_eq!(f.header.origin, from, "the transport reports the connection's peer");
            assert_eq!(f.header.dst, me);
            let want = next_seq.entry(from).or_insert(0);
            assert_eq!(f.header.seq, *want, "frames from {from} to {me} out of order");
            *want += 1;
            let len = if f.header.seq == 0 { BIG } else { (f.header.seq % 97) as usize };
            assert!(
                f.payload == pattern(from, f.header.seq, len),
                "payload of seq {} from {from} differs",
                f.header.seq
            );
        }
        assert_eq!(next_seq.len(), 2);
        assert!(rx.try_recv().is_err(), "no frame beyond those sent");
    }
    for (t, _) in ts {
        t.shutdown().await;
    }
}

/// Both directions of a pair work, and replies use their own connection.
#[tokio::test]
async fn request_and_reply_between_two() {
    let secret = DvmSecret::generate();
    let (a, mut arx) = start(config(0, &secret)).await;
    let (b, mut brx) = start(config(1, &secret)).await;
    wire(&[&a, &b]);
    for seq in 0..100 {
        a.send(1, frame(0, 1, seq, pattern(0, seq, 10))).unwrap();
        let (from, f) = next_frame(&mut brx).await;
        assert_eq!((from, f.header.seq), (0, seq));
        b.send(0, frame(1, 0, seq, f.payload.clone().into_bytes())).unwrap();
        let (from, back) = next_frame(&mut arx).await;
        assert_eq!((from, back.header.seq), (1, seq));
        assert_eq!(back.payload, pattern(0, seq, 10));
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// What can be known at `send` time is an error right away, naming rank and peer.
#[tokio::test]
async fn send_refuses_self_unknown_peer_and_oversized_frames() {
    let secret = DvmSecret::generate();
    let mut cfg = config(4, &secret);
    cfg.max_frame = 1024;
    let (t, _rx) = start(cfg).await;
    assert!(matches!(t.send(4, frame(4, 4, 0, Bytes::new())), Err(TransportError::SelfSend { rank: 4 })));
    let e = t.send(9, frame(4, 9, 0, Bytes::new())).unwrap_err();
    assert!(matches!(e, TransportError::NoContact { rank: 4, peer: 9 }), "{e}");
    t.set_contact(9, "127.0.0.1:9".parse().unwrap());
    let e = t.send(9, frame(4, 9, 0, pattern(4, 0, 2000))).unwrap_err();
    assert!(matches!(e, TransportError::FrameTooLarge { rank: 4, peer: 9, max: 1024, .. }), "{e}");
    t.shutdown().await;
}

#[tokio::test]
async fn invalid_config_is_an_error() {
    let secret = DvmSecret::generate();
    let mut cfg = config(0, &secret);
    cfg.max_frame = DEFAULT_MAX_FRAME * 64; // above u32::MAX
    assert!(matches!(dvm_rml::Transport::bind(cfg).await, Err(TransportError::Config { .. })));
    let mut cfg = config(0, &secret);
    cfg.heartbeat = std::time::Duration::from_millis(10);
    cfg.heartbeat_misses = 0;
    assert!(matches!(dvm_rml::Transport::bind(cfg).await, Err(TransportError::Config { .. })));
}
