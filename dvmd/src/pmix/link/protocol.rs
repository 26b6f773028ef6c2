//! The request/reply protocol on a worker's command socket: [`WorkerLink`] (a call and its
//! answer, a posted command, an answer read later) and the errors of the link.
//!
//! Never interprets a command or a reply beyond its error field. Do not break: the lock is held
//! across a command and its answer (answers come in order), and any stream failure closes the
//! link for good (a half-written or half-read frame cannot be resynchronized).

use std::io::{BufReader, BufWriter};
use std::os::unix::net::UnixStream;
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
    pub(super) io: Mutex<Option<(BufReader<UnixStream>, BufWriter<UnixStream>)>>,
}

impl WorkerLink {
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

    /// Write `cmd` (if any), then read one answer (if `answer`). Any failure of the stream
    /// closes the link for good: a half-written or half-read frame cannot be resynchronized.
    pub(super) fn exchange(&self, cmd: Option<Cmd>, answer: bool) -> Result<Option<WorkerReply>, WorkerError> {
        let mut io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        let Some((r, w)) = io.as_mut() else { return Err(WorkerError::Gone { pid: self.pid }) };
        let mut got = cmd.map_or(Ok(()), |body| write_frame(w, &WorkerCmd { body: Some(body) })).map(|()| None);
        if answer {
            got = got.and_then(|_| read_frame::<WorkerReply>(r));
        }
        match got {
            Ok(Some(reply)) if !reply.error.is_empty() => Err(WorkerError::Pmix(reply.error)),
            Ok(Some(reply)) => Ok(Some(reply)),
            Ok(None) if !answer => Ok(None),
            Ok(None) => {
                // The worker closed its end between frames: it exited.
                *io = None;
                Err(WorkerError::Gone { pid: self.pid })
            }
            Err(source) => {
                *io = None;
                Err(WorkerError::Link { pid: self.pid, source })
            }
        }
    }

    pub(super) fn close(&self) {
        *self.io.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}
