//! I/O forwarding of one proc: its stdout/stderr pumps under the job's output window, and its
//! stdin writer.
//!
//! Window accounting (per job, shared by every stream of every local proc of the job):
//! `outstanding` = bytes emitted as `Output` events and not yet acknowledged by `ack_output`.
//! A pump waits until its pipe is readable, then takes credit for at most
//! min(64 KiB, window - outstanding) bytes, reads at most that much with one non-blocking
//! read, and keeps exactly the bytes read as outstanding (the unused credit goes back before
//! the next await). So `outstanding <= window` at all times, and the daemon holds no output
//! of its own: with the window full the pumps stop reading and the procs block on their full
//! pipes. Credit is never held while waiting for a pipe, so an idle stream cannot starve a
//! busy one; waiting pumps are served in FIFO order. Acks beyond `outstanding` are ignored. A closed window
//! (`kill_job` after its grace, `forget_job`) ends the streams and discards what is unread.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::{OdlsEvent, Stream};

/// Largest single read (and `Output` event).
pub const CHUNK: usize = 64 * 1024;

pub(super) struct IofWindow {
    size: usize,
    /// Permits = window - outstanding - credit held by a pump between its readiness and its read.
    credit: Semaphore,
    outstanding: Mutex<usize>,
}

impl IofWindow {
    pub fn new(size: usize) -> IofWindow {
        assert!(size > 0, "an IOF window of 0 bytes would never let output through");
        IofWindow { size, credit: Semaphore::new(size), outstanding: Mutex::new(0) }
    }

    pub fn outstanding(&self) -> usize {
        *self.outstanding.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Return credit for `bytes` forwarded bytes; clamped to what is outstanding. Returns the
    /// credit actually returned.
    pub fn ack(&self, bytes: usize) -> usize {
        let mut out = self.outstanding.lock().unwrap_or_else(|p| p.into_inner());
        let k = bytes.min(*out);
        *out -= k;
        self.credit.add_permits(k);
        k
    }

    /// Stop forwarding: pumps waiting for credit (or asking later) end their stream, and the
    /// output still in the pipes is discarded. For a job being killed whose consumer stopped
    /// acking: otherwise its procs could never be seen to finish.
    pub fn close(&self) {
        self.credit.close();
    }

    /// Wait for at least one byte of credit, then take as much as is free, up to `CHUNK`.
    /// The caller must `settle` before its next await. None once the window is closed.
    async fn take(&self) -> Option<usize> {
        let first = self.credit.acquire().await.ok()?;
        first.forget();
        let more = self.credit.available_permits().min(CHUNK - 1);
        match self.credit.try_acquire_many(more as u32) {
            Ok(p) if more > 0 => {
                p.forget();
                Some(1 + more)
            }
            _ => Some(1),
        }
    }

    /// Of `held` credit, `used` bytes were emitted: they stay outstanding; the rest goes back.
    fn settle(&self, held: usize, used: usize) {
        debug_assert!(used <= held && held <= self.size);
        if used > 0 {
            *self.outstanding.lock().unwrap_or_else(|p| p.into_inner()) += used;
        }
        self.credit.add_permits(held - used);
    }
}

/// Forward one output stream until EOF: `Output` events in order, then `OutputClosed`.
pub(super) async fn pump(
    rx: pipe::Receiver,
    stream: Stream,
    jobid: u32,
    rank: u32,
    window: Arc<IofWindow>,
    events: mpsc::UnboundedSender<OdlsEvent>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        if let Err(e) = rx.readable().await {
            debug!(jobid, rank, ?stream, "output pipe failed: {e}");
            break;
        }
        let Some(held) = window.take().await else {
            debug!(jobid, rank, ?stream, "output window closed: the rest of the stream is discarded");
            break;
        };
        // No await between take and settle: the credit is never held across a wait.
        match rx.try_read(&mut buf[..held]) {
            Ok(0) => {
                window.settle(held, 0);
                break;
            }
            Ok(n) => {
                window.settle(held, n);
                let data = Bytes::copy_from_slice(&buf[..n]);
                let _ = events.send(OdlsEvent::Output { jobid, rank, stream, data });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => window.settle(held, 0),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => window.settle(held, 0),
            Err(e) => {
                window.settle(held, 0);
                debug!(jobid, rank, ?stream, "reading output failed: {e}");
                break;
            }
        }
    }
    let _ = events.send(OdlsEvent::OutputClosed { jobid, rank, stream });
}

/// Write queued stdin bytes in order; EOF when the queue's sender is dropped (`close_stdin`).
/// Stops quietly (dropping what is queued) when the proc is reaped or stops reading.
pub(super) async fn feed_stdin(
    mut tx: pipe::Sender,
    mut queue: mpsc::UnboundedReceiver<Bytes>,
    reaped: CancellationToken,
    jobid: u32,
    rank: u32,
) {
    loop {
        let data = tokio::select! {
            biased;
            _ = reaped.cancelled() => return,
            next = queue.recv() => match next {
                Some(d) => d,
                None => return, // close_stdin: dropping `tx` gives the proc EOF
            },
        };
        tokio::select! {
            biased;
            _ = reaped.cancelled() => return,
            r = tx.write_all(&data) => if let Err(e) = r {
                debug!(jobid, rank, "stdin dropped: {e}");
                return;
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Credit conservation: free + held + outstanding == size, and acks cannot widen the window.
    #[tokio::test]
    async fn window_conserves_credit_and_clamps_acks() {
        let w = IofWindow::new(100);
        let held = w.take().await.unwrap();
        assert_eq!(held, 100);
        w.settle(held, 60);
        assert_eq!((w.outstanding(), w.credit.available_permits()), (60, 40));
        assert_eq!(w.ack(1000), 60, "an over-ack only returns what is outstanding");
        assert_eq!((w.outstanding(), w.credit.available_permits()), (0, 100));
        let held = w.take().await.unwrap();
        w.settle(held, 100);
        assert_eq!(w.credit.available_permits(), 0);
        assert!(w.credit.try_acquire().is_err(), "a full window gives no credit");
        w.ack(1);
        assert_eq!(w.take().await, Some(1));
        w.close();
        assert_eq!(w.take().await, None);
    }
}
