//! The request/reply protocol on a worker's command socket: [`WorkerLink`] (a call and its
//! answer, a posted command, an answer read later) and the errors of the link.
//!
//! Commands are written by the link's own writer thread, in the order they are given: posting
//! a completion (a fence's result can be tens of MB) never waits for the worker to take it,
//! so the actor's loop is not held by a busy worker (a step of the loop took 1.6-2.0 s when it
//! wrote 96 MB fence results itself; docs/liveness.md). A call still waits for its answer,
//! which the worker gives after every command before it.
//! Never interprets a command or a reply beyond its error field. Do not break: the reader lock
//! is held across a command and its answer (answers come in order), and any stream failure
//! closes the link for good (a half-written or half-read frame cannot be resynchronized): the
//! writer shuts the socket down, so a reader waiting for an answer sees the end at once.

use std::io::{BufReader, BufWriter};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{channel, Sender};
use std::sync::Mutex;

use dvm_proto::pmixworker::{worker_cmd::Body as Cmd, WorkerCmd, WorkerReply};

use crate::pmix::frame::{read_frame, write_frame};

/// Errors of the link to a worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot start the PMIx worker process: {0}")]
    Spawn(std::io::Error),
    #[error("the PMIx worker (pid {pid}) stopped answering: {source}")]
    Link { pid: u32, source: std::io::Error },
    #[error("the PMIx worker (pid {pid}) is gone")]
    Gone { pid: u32 },
    #[error("{0}")]
    Pmix(String),
}

/// The command socket of one worker, shared by the actor and the reply handles.
#[derive(Debug)]
pub(crate) struct WorkerLink {
    pub(super) pid: u32,
    /// Commands to the writer thread (`None` once the link is closed).
    writer: Mutex<Option<Sender<WorkerCmd>>>,
    reader: Mutex<Option<BufReader<UnixStream>>>,
}

impl WorkerLink {
    /// The link over `stream` (its write timeout bounds how long the worker may leave a
    /// command untaken), with its writer thread.
    pub(super) fn new(pid: u32, reader: UnixStream, stream: UnixStream) -> std::io::Result<WorkerLink> {
        let (tx, rx) = channel::<WorkerCmd>();
        std::thread::Builder::new().name(format!("pmix-cmd-{pid}")).spawn(move || {
            let mut w = BufWriter::new(&stream);
            while let Ok(cmd) = rx.recv() {
                if let Err(e) = write_frame(&mut w, &cmd) {
                    tracing::debug!(pid, "PMIx worker command not written: {e}");
                    // Whoever waits for an answer sees the end now, not after a timeout.
                    let _ = stream.shutdown(Shutdown::Both);
                    return;
                }
            }
        })?;
        Ok(WorkerLink { pid, writer: Mutex::new(Some(tx)), reader: Mutex::new(Some(BufReader::new(reader))) })
    }

    /// One command and its answer (the lock held across both: answers come in order).
    pub(super) fn call(&self, body: Cmd) -> Result<WorkerReply, WorkerError> {
        self.exchange(Some(body), true)?.ok_or(WorkerError::Gone { pid: self.pid })
    }

    /// Write a command without reading anything: a `Complete` (which the worker never
    /// answers), or `Init`, whose answer [`WorkerLink::finish`] reads later.
    pub(super) fn post(&self, body: Cmd) -> Result<(), WorkerError> {
        self.exchange(Some(body), false).map(drop)
    }

    /// Read the answer to a command posted earlier.
    pub(super) fn finish(&self) -> Result<WorkerReply, WorkerError> {
        self.exchange(None, true)?.ok_or(WorkerError::Gone { pid: self.pid })
    }

    /// Hand `cmd` (if any) to the writer, then read one answer (if `answer`). Any failure of
    /// the stream closes the link for good: a half-written or half-read frame cannot be
    /// resynchronized.
    pub(super) fn exchange(&self, cmd: Option<Cmd>, answer: bool) -> Result<Option<WorkerReply>, WorkerError> {
        let mut reader = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        let Some(r) = reader.as_mut() else { return Err(WorkerError::Gone { pid: self.pid }) };
        if let Some(body) = cmd {
            let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            let sent = writer.as_ref().is_some_and(|w| w.send(WorkerCmd { body: Some(body) }).is_ok());
            if !sent {
                // The writer stopped: the stream failed.
                *reader = None;
                return Err(WorkerError::Gone { pid: self.pid });
            }
        }
        if !answer {
            return Ok(None);
        }
        match read_frame::<WorkerReply>(r) {
            Ok(Some(reply)) if !reply.error.is_empty() => Err(WorkerError::Pmix(reply.error)),
            Ok(Some(reply)) => Ok(Some(reply)),
            Ok(None) => {
                // The worker closed its end between frames (it exited), or the writer shut
                // the socket down after a failed write.
                *reader = None;
                Err(WorkerError::Gone { pid: self.pid })
            }
            Err(source) => {
                *reader = None;
                Err(WorkerError::Link { pid: self.pid, source })
            }
        }
    }

    /// No more commands (those already handed over are still written) and no more answers.
    pub(super) fn close(&self) {
        *self.writer.lock().unwrap_or_else(|e| e.into_inner()) = None;
        *self.reader.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}
