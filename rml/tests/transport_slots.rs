//! Handshake slots: idle strangers filling a listener's handshake slots never keep a real peer
//! out; the oldest stranger gives way (issue 29).
#![cfg(feature = "net")]

mod transport_support;

use std::time::Duration;

use dvm_rml::DvmSecret;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use transport_support::*;

#[tokio::test]
async fn a_peer_gets_in_while_strangers_hold_every_handshake_slot() {
    let (log, _guard) = LogCapture::install();
    let secret = DvmSecret::generate();
    let mut cfg = config(1, &secret);
    cfg.max_pending_handshakes = 4;
    let (b, mut brx) = start(cfg).await;
    // Ten strangers connect and never speak: all four slots are held, and the first six were
    // closed as later ones came.
    let mut strangers = Vec::new();
    for _ in 0..10 {
        strangers.push(TcpStream::connect(b.local_addr()).await.unwrap());
    }
    log.wait_for(&["still in their handshake", "closing the oldest", "rank=1"]).await;

    let (a, _arx) = start(config(0, &secret)).await;
    wire(&[&a, &b]);
    a.send(1, frame(0, 1, 7, pattern(0, 7, 100))).unwrap();
    let (from, f) = next_frame(&mut brx).await;
    assert_eq!((from, f.header.seq), (0, 7));

    // The oldest strangers were closed (EOF after the listener's hello), the newest are held.
    let mut closed = 0;
    for s in strangers.iter_mut() {
        let mut buf = [0u8; 1024];
        let end = tokio::time::timeout(Duration::from_millis(200), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return true,
                    Ok(_) => {}
                }
            }
        })
        .await;
        closed += usize::from(end == Ok(true));
    }
    assert!(closed >= 7, "6 strangers give way to newer ones and 1 to the peer: {closed} closed");
    a.shutdown().await;
    b.shutdown().await;
}
