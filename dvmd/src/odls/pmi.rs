//! A proc's PMI connection: our end of the socket pair whose other end the proc has at
//! `PMI_FD`. One task reads what the proc writes (`PmiData`, then one `PmiClosed`) and writes
//! what the daemon answers, in order.
//!
//! Never: a decision or a parse; the bytes go to the core as they come. The connection closes
//! when the proc closes it (or ends), or when the daemon drops the writer queue (`pmi_close`),
//! after the queued answers are written.

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tracing::debug;

use super::OdlsEvent;

/// The most read at once.
const READ: usize = 16 * 1024;

pub(super) struct Conn(UnixStream);

impl Conn {
    pub fn new(s: std::os::unix::net::UnixStream) -> std::io::Result<Conn> {
        s.set_nonblocking(true)?;
        Ok(Conn(UnixStream::from_std(s)?))
    }

    /// Serve the connection in a task; the queue its answers are written from.
    pub fn run(self, jobid: u32, rank: u32, events: mpsc::UnboundedSender<OdlsEvent>) -> mpsc::UnboundedSender<Bytes> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Bytes>();
        let (mut rd, mut wr) = self.0.into_split();
        tokio::spawn(async move {
            let mut buf = vec![0u8; READ];
            let mut reading = true;
            loop {
                tokio::select! {
                    n = rd.read(&mut buf), if reading => match n {
                        Ok(0) | Err(_) => {
                            reading = false;
                            let _ = events.send(OdlsEvent::PmiClosed { jobid, rank });
                        }
                        Ok(n) => {
                            let data = Bytes::copy_from_slice(&buf[..n]);
                            let _ = events.send(OdlsEvent::PmiData { jobid, rank, data });
                        }
                    },
                    out = rx.recv() => match out {
                        Some(data) => {
                            if let Err(e) = wr.write_all(&data).await {
                                debug!(jobid, rank, "PMI answer not written: {e}");
                            }
                        }
                        // The daemon closed it (or forgot the proc).
                        None => break,
                    },
                }
            }
            if reading {
                let _ = events.send(OdlsEvent::PmiClosed { jobid, rank });
            }
        });
        tx
    }
}
