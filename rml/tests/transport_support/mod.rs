//! Helpers shared by the transport tests: configs on 127.0.0.1, events with a safety bound,
//! frames with checkable contents, and a capture of the transport's log lines.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use dvm_proto::rml::{FrameHeader, Tag};
use dvm_rml::auth::{self, Local, Role};
use dvm_rml::link::{Opener, Sealer};
use dvm_rml::{DvmSecret, Frame, LinkSecurity, Rank, Transport, TransportConfig, TransportEvent};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Safety bound for anything a test waits for; never a pass/fail criterion by itself.
pub const BOUND: Duration = Duration::from_secs(30);

pub fn config(rank: Rank, secret: &DvmSecret) -> TransportConfig {
    let mut cfg = TransportConfig::new(rank, 1, "127.0.0.1:0".parse().unwrap(), secret.clone());
    cfg.connect_attempts = 3;
    cfg.connect_backoff = Duration::from_millis(20);
    cfg.handshake_timeout = Duration::from_secs(5);
    cfg
}

/// A peer the test drives by hand: its socket and the keys of its side after the handshake.
pub struct RawPeer {
    pub stream: TcpStream,
    pub sealer: Sealer,
    pub opener: Opener,
}

impl RawPeer {
    /// Seal `f` as this peer's next frame and write it.
    pub async fn send(&mut self, f: &Frame) {
        use tokio::io::AsyncWriteExt;
        let mut out = Vec::new();
        self.sealer.write(&mut out, f).await.unwrap();
        self.stream.write_all(&out).await.unwrap();
    }
}

/// Run the handshake on `stream` as daemon `rank` (epoch 1) holding `secret`, in `mode`.
pub async fn raw_handshake(
    mut stream: TcpStream,
    secret: &DvmSecret,
    role: Role,
    rank: Rank,
    mode: LinkSecurity,
) -> RawPeer {
    let local = Local { secret, role, rank, epoch: 1, mode };
    let est = auth::handshake(&mut stream, local, Duration::from_secs(5)).await.unwrap();
    let (sealer, opener) = est.link(secret, dvm_rml::DEFAULT_MAX_FRAME);
    RawPeer { stream, sealer, opener }
}

/// Connect to `addr` as daemon `rank` holding `secret`, with a raw socket the test drives.
pub async fn raw_peer(addr: SocketAddr, secret: &DvmSecret, rank: Rank, mode: LinkSecurity) -> RawPeer {
    raw_handshake(TcpStream::connect(addr).await.unwrap(), secret, Role::Initiator, rank, mode).await
}

pub async fn start(cfg: TransportConfig) -> (Transport, mpsc::Receiver<TransportEvent>) {
    Transport::bind(cfg).await.expect("bind on 127.0.0.1:0")
}

/// Every transport learns every other's address.
pub fn wire(all: &[&Transport]) {
    let table: Vec<(Rank, SocketAddr)> = all.iter().map(|t| (t.rank(), t.local_addr())).collect();
    for t in all {
        t.set_contacts(table.iter().copied().filter(|(r, _)| *r != t.rank()));
    }
}

pub async fn next_event(rx: &mut mpsc::Receiver<TransportEvent>) -> TransportEvent {
    match tokio::time::timeout(BOUND, rx.recv()).await {
        Ok(Some(ev)) => ev,
        Ok(None) => panic!("event channel closed"),
        Err(_) => panic!("no transport event within {BOUND:?}"),
    }
}

pub async fn next_frame(rx: &mut mpsc::Receiver<TransportEvent>) -> (Rank, Frame) {
    match next_event(rx).await {
        TransportEvent::Frame { from_peer, frame } => (from_peer, frame),
        other => panic!("expected a frame, got {other:?}"),
    }
}

pub fn header(origin: Rank, dst: Rank, seq: u64) -> FrameHeader {
    FrameHeader { origin, dst, tag: Tag::DaemonCmd as u32, epoch: 1, seq }
}

pub fn frame(origin: Rank, dst: Rank, seq: u64, payload: Bytes) -> Frame {
    Frame::new(header(origin, dst, seq), payload)
}

/// Deterministic payload of `len` bytes, a function of `(origin, seq)` only, so a receiver can
/// rebuild what it should have got without looking at what it got.
pub fn pattern(origin: Rank, seq: u64, len: usize) -> Bytes {
    let mut x = (origin as u64) << 32 ^ seq ^ 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

/// Log lines of the current thread's tracing output (use with a current-thread runtime, so
/// every transport task logs here).
///
/// Trap: in a test binary that checks logs, every test must install one. tracing caches
/// whether a log site is enabled; a test thread without a subscriber that reaches a site first
/// can switch it off for the tests that wait for that line.
#[derive(Clone, Default)]
pub struct LogCapture(Arc<Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn install() -> (LogCapture, tracing::subscriber::DefaultGuard) {
        let cap = LogCapture::default();
        let writer = cap.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (cap, tracing::subscriber::set_default(subscriber))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Lines holding every one of `needles`.
    pub fn lines_with(&self, needles: &[&str]) -> Vec<String> {
        self.text().lines().filter(|l| needles.iter().all(|n| l.contains(n))).map(str::to_owned).collect()
    }

    /// Wait (bounded) until a line holding every one of `needles` was logged.
    pub async fn wait_for(&self, needles: &[&str]) -> String {
        let deadline = tokio::time::Instant::now() + BOUND;
        loop {
            if let Some(l) = self.lines_with(needles).into_iter().next() {
                return l;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no log line with {needles:?} within {BOUND:?}; log:\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
