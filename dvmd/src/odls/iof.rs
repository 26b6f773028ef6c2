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
//!
//! Lines stay whole when several ranks' output is interleaved untagged: a chunk is sent up to
//! its last newline, and the rest waits (at most `LINE_WAIT`) for the next read. It goes as it
//! is when the writer pauses longer (a prompt), when the line reaches `CHUNK` (or the
//! window), when no credit is left, and at EOF. Those held bytes count as outstanding.

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
/// How long the end of a line waits for the rest of it before it is sent as it is: short
/// enough that a prompt shows at once, long enough for a writer between two writes.
const LINE_WAIT: std::time::Duration = std::time::Duration::from_millis(2);

pub(super) struct IofWindow {
    size: usize,
    /// Permits = window - outstanding - credit held by a pump between its readiness and its read.
    credit: Semaphore,
    outstanding: Mutex<usize>,
    /// Of `outstanding`, the bytes read and held back by the pumps (ends of lines): no ack
    /// will return those until they are sent.
    held_back: std::sync::atomic::AtomicUsize,
}

impl IofWindow {
    pub fn new(size: usize) -> IofWindow {
        assert!(size > 0, "an IOF window of 0 bytes would never let output through");
        IofWindow {
            size,
            credit: Semaphore::new(size),
            outstanding: Mutex::new(0),
            held_back: std::sync::atomic::AtomicUsize::new(0),
        }
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

    fn is_closed(&self) -> bool {
        self.credit.is_closed()
    }

    /// Every outstanding byte is held back by a pump: no ack can come, so what is held must go.
    fn starved(&self) -> bool {
        let held = self.held_back.load(std::sync::atomic::Ordering::Relaxed);
        self.credit.available_permits() == 0 && self.outstanding() <= held
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

/// The part of `carry` to send now: up to its last newline, so that the lines of ranks whose
/// output is interleaved stay whole; all of it when a line outgrows `CHUNK` (or `flush`).
fn cut_at_line(carry: &[u8], flush: bool, bound: usize) -> usize {
    match carry.iter().rposition(|&b| b == b'\n') {
        _ if flush => carry.len(),
        Some(i) => i + 1,
        None if carry.len() >= bound => carry.len(),
        None => 0,
    }
}

/// Forward one output stream until EOF: `Output` events in order, then `OutputClosed`. Bytes
/// after a chunk's last newline wait for the rest of their line while more is readable at
/// once; a writer that pauses mid-line (a prompt) has them sent as they are.
pub(super) async fn pump(
    rx: pipe::Receiver,
    stream: Stream,
    jobid: u32,
    rank: u32,
    window: Arc<IofWindow>,
    events: mpsc::UnboundedSender<OdlsEvent>,
    stamp: bool,
) {
    let mut buf = vec![0u8; CHUNK];
    // With `stamp`: when the oldest byte held in `carry` was read (µs since 1970, UTC).
    let mut since = 0u64;
    let now_us =
        || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    // Read, counted outstanding, not sent yet: the end of a line still being written.
    let mut carry: Vec<u8> = Vec::new();
    use std::sync::atomic::Ordering::Relaxed;
    // Sends what is whole; returns how many bytes went.
    let send = |carry: &mut Vec<u8>, flush: bool, since: u64| -> usize {
        let n = cut_at_line(carry, flush, CHUNK.min(window.size));
        if n > 0 {
            window.held_back.fetch_sub(n, Relaxed);
            let data = Bytes::from(carry.drain(..n).collect::<Vec<u8>>());
            let read_at_us = if stamp { since } else { 0 };
            let _ = events.send(OdlsEvent::Output { jobid, rank, stream, data, read_at_us });
        }
        n
    };
    loop {
        if !carry.is_empty() && tokio::time::timeout(LINE_WAIT, rx.readable()).await.is_err() {
            // Nothing more for a while: the writer paused mid-line (a prompt).
            let _ = send(&mut carry, true, since);
        }
        if let Err(e) = rx.readable().await {
            debug!(jobid, rank, ?stream, "output pipe failed: {e}");
            break;
        }
        if !carry.is_empty() && window.starved() {
            // The window is full of held-back line ends, which no ack will ever return.
            let _ = send(&mut carry, true, since);
        }
        // Held-back line ends are never what the window waits on for long: pumps run on
        // several threads, so `starved` may miss a moment; after `LINE_WAIT` without credit
        // they go regardless.
        let credit = if carry.is_empty() {
            window.take().await
        } else {
            match tokio::time::timeout(LINE_WAIT, window.take()).await {
                Ok(c) => c,
                Err(_) => {
                    let _ = send(&mut carry, true, since);
                    window.take().await
                }
            }
        };
        let Some(held) = credit else {
            debug!(jobid, rank, ?stream, "output window closed: the rest of the stream is discarded");
            break;
        };
        // No await between take and settle: the credit is never held across a wait.
        // What is held plus this read stays within one chunk.
        let room = held.min(CHUNK - carry.len()).max(1);
        match rx.try_read(&mut buf[..room]) {
            Ok(0) => {
                window.settle(held, 0);
                break;
            }
            Ok(n) => {
                window.settle(held, n);
                window.held_back.fetch_add(n, Relaxed);
                if stamp && carry.is_empty() {
                    since = now_us();
                }
                carry.extend_from_slice(&buf[..n]);
                if send(&mut carry, false, since) > 0 && stamp && !carry.is_empty() {
                    // What is left (a line's start) was read by this read; a line still
                    // unfinished keeps the time of its first bytes.
                    since = now_us();
                }
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
    if window.is_closed() {
        window.held_back.fetch_sub(carry.len(), Relaxed);
    } else {
        let _ = send(&mut carry, true, since);
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

    #[test]
    fn a_chunk_is_cut_after_its_last_newline_unless_its_line_outgrows_the_bound() {
        assert_eq!(cut_at_line(b"ab\ncd\nef", false, CHUNK), 6, "ef waits for the rest of its line");
        assert_eq!(cut_at_line(b"ab\n", false, CHUNK), 3);
        assert_eq!(cut_at_line(b"no newline yet", false, CHUNK), 0);
        assert_eq!(cut_at_line(b"no newline yet", true, CHUNK), 14, "flushed when the writer pauses");
        assert_eq!(cut_at_line(b"0123456789", false, 10), 10, "a line as long as the bound goes as it is");
        assert_eq!(cut_at_line(b"012345678\n9", false, 10), 10, "a full chunk is still cut at its line");
        assert_eq!(cut_at_line(b"", false, CHUNK), 0);
    }

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
