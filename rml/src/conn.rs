//! The life of one authenticated connection: a read loop and a write loop polled together
//! in one task, so neither can starve the other and both end together.
//!
//! Traps: the read-idle bound restarts on every received *byte*, not every frame, so a large
//! frame arriving slowly is not mistaken for silence; whether silence means loss is the rule of
//! [`crate::liveness`] (a daemon that was itself stopped gives its peers a fresh bound).
//! Writers send the encoded prefix and then the shared payload through a buffered writer: small
//! frames are batched into few syscalls, large payloads go to the socket without a copy (with
//! `--link-security aead` the payload is encrypted into a per-connection buffer first). Every frame read, heartbeats included, is
//! verified by the connection's [`Opener`] before anything looks at it; one that fails ends
//! the connection.

use std::net::SocketAddr;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::codec::Decoder;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::frame::{Frame, FrameError};
use crate::link::{OpenError, Opener, Sealer};
use crate::liveness::{ReadIdle, Wake};
use crate::topology::Rank;
use crate::transport::{LinkError, Shared, TransportEvent};

const WRITE_BUFFER: usize = 64 * 1024;
const READ_CHUNK: usize = 64 * 1024;

/// How a connection ended.
pub(crate) enum ConnEnd {
    /// This daemon closed it (disconnect, shutdown, owner gone): not reported.
    Closed,
    /// It broke; reported as `PeerLost`.
    Lost(LinkError),
}

/// Run the connection until it ends. `queue` is the outbound link's frames for a connection
/// this daemon opened, `None` for an accepted one (which only carries heartbeats back).
pub(crate) async fn run(
    shared: &Shared,
    stream: TcpStream,
    peer: Rank,
    addr: SocketAddr,
    queue: Option<mpsc::UnboundedReceiver<Frame>>,
    link: (Sealer, Opener),
    token: CancellationToken,
) -> ConnEnd {
    let (r, w) = stream.into_split();
    let (sealer, opener) = link;
    tokio::select! {
        _ = token.cancelled() => ConnEnd::Closed,
        end = read_loop(shared, r, peer, addr, opener) => end,
        end = write_loop(shared, w, peer, queue, sealer) => end,
    }
}

async fn read_loop(shared: &Shared, mut r: OwnedReadHalf, peer: Rank, addr: SocketAddr, mut codec: Opener) -> ConnEnd {
    let me = shared.cfg.rank;
    let mut idle = shared.cfg.read_idle().map(|_| {
        let cfg = &shared.cfg;
        ReadIdle::new(cfg.heartbeat, cfg.heartbeat_misses, Instant::now().into_std())
    });
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) if frame.is_heartbeat() => {}
                Ok(Some(frame)) => {
                    let ev = TransportEvent::Frame { from_peer: peer, frame };
                    if shared.events.send(ev).await.is_err() {
                        return ConnEnd::Closed;
                    }
                }
                Ok(None) => break,
                Err(OpenError::Verification { seq }) => {
                    let mode = shared.cfg.link_security;
                    error!(rank = me, peer, %addr, seq, %mode, "RML frame from peer failed verification (altered, replayed, dropped or reordered in flight); closing connection");
                    return ConnEnd::Lost(LinkError::Verification { seq });
                }
                Err(OpenError::Frame(FrameError::TooLarge { size, max })) => {
                    warn!(rank = me, peer, %addr, size, max, "refusing frame above the max message size; closing connection");
                    return ConnEnd::Lost(LinkError::FrameTooLarge { size, max });
                }
                Err(e) => {
                    warn!(rank = me, peer, %addr, error = %e, "malformed frame; closing connection");
                    return ConnEnd::Lost(LinkError::Malformed(e.to_string()));
                }
            }
        }
        // A frame partly in has its room already (the decoder reserved it): add none, or the
        // buffer holding most of a large frame would be doubled.
        let (free, missing) = (buf.capacity() - buf.len(), codec.missing(&buf));
        if if missing > 0 { free < missing } else { free < READ_CHUNK / 4 } {
            buf.reserve(READ_CHUNK);
        }
        let n = match idle.as_mut() {
            Some(idle) => loop {
                let wake = Instant::from_std(idle.next_wake());
                match tokio::time::timeout_at(wake, r.read_buf(&mut buf)).await {
                    Ok(n) => {
                        idle.heard(Instant::now().into_std());
                        break n;
                    }
                    // `read_buf` is cancel-safe: nothing read is lost by waking the rule.
                    Err(_) => match idle.wake(Instant::now().into_std()) {
                        Wake::Quiet => {}
                        Wake::Stalled { late } => {
                            info!(rank = me, peer, %addr, ?late, bound = ?idle.bound(),
                                "this daemon's timers ran late (stopped, paused or starved); the peer gets a fresh read-idle bound");
                        }
                        Wake::Silent(s) => {
                            warn!(rank = me, peer, %addr, bound = ?s.bound, silent = ?s.for_,
                                "peer silent past the heartbeat bound; closing connection");
                            return ConnEnd::Lost(LinkError::ReadIdle(s.bound));
                        }
                    },
                }
            },
            None => r.read_buf(&mut buf).await,
        };
        match n {
            Ok(0) => {
                debug!(rank = me, peer, %addr, pending = buf.len(), "RML connection closed by peer");
                return ConnEnd::Lost(LinkError::Eof);
            }
            Ok(_) => {}
            Err(e) => {
                debug!(rank = me, peer, %addr, error = %e, "RML read failed");
                return ConnEnd::Lost(LinkError::Io(e.to_string()));
            }
        }
    }
}

async fn write_loop(
    shared: &Shared,
    w: OwnedWriteHalf,
    peer: Rank,
    mut queue: Option<mpsc::UnboundedReceiver<Frame>>,
    mut sealer: Sealer,
) -> ConnEnd {
    let cfg = &shared.cfg;
    let mut w = BufWriter::with_capacity(WRITE_BUFFER, w);
    let heartbeat = (!cfg.heartbeat.is_zero()).then_some(cfg.heartbeat);
    let mut next_beat = Instant::now() + cfg.heartbeat;
    loop {
        let res = tokio::select! {
            frame = next_frame(&mut queue) => match frame {
                // The link was removed (disconnect): close quietly.
                None => return ConnEnd::Closed,
                Some(frame) => write_batch(&mut w, &mut sealer, frame, queue.as_mut()).await,
            },
            _ = tokio::time::sleep_until(next_beat), if heartbeat.is_some() => {
                let beat = Frame::heartbeat(cfg.rank, peer, cfg.epoch);
                write_batch(&mut w, &mut sealer, beat, None).await
            }
        };
        if let Err(e) = res {
            debug!(rank = cfg.rank, peer, error = %e, "RML write failed");
            return ConnEnd::Lost(LinkError::Io(e.to_string()));
        }
        if let Some(h) = heartbeat {
            next_beat = Instant::now() + h;
        }
    }
}

async fn next_frame(queue: &mut Option<mpsc::UnboundedReceiver<Frame>>) -> Option<Frame> {
    match queue {
        Some(q) => q.recv().await,
        None => std::future::pending().await,
    }
}

/// Write `first` and whatever else is already queued, then flush once.
async fn write_batch<W: AsyncWrite + Unpin>(
    w: &mut BufWriter<W>,
    sealer: &mut Sealer,
    first: Frame,
    queue: Option<&mut mpsc::UnboundedReceiver<Frame>>,
) -> std::io::Result<()> {
    sealer.write(w, &first).await?;
    if let Some(q) = queue {
        while let Ok(frame) = q.try_recv() {
            sealer.write(w, &frame).await?;
        }
    }
    w.flush().await
}
