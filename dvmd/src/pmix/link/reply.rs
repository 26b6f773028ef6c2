//! Reply handles: an upcall waiting in a worker for the daemon's answer.
//!
//! Never blocks the actor: a completion is posted, not answered. Do not break: a handle
//! completes at most once, and dropped uncompleted it fails its upcall (`PMIX_ERROR`), so no
//! client is left blocked; a reply for a worker that is gone is a no-op.

use std::sync::Arc;

use bytes::Bytes;
use dvm_proto::pmixworker::{self as wire, worker_cmd::Body as Cmd};
use pmix_shim::Status;
use tracing::{debug, warn};

use super::protocol::WorkerLink;

/// An upcall waiting for the daemon's answer, in a worker.
#[must_use = "an uncompleted reply leaves a client blocked until it is dropped (then it fails)"]
#[derive(Debug)]
pub(crate) struct WorkerReplyHandle {
    pub(super) id: u64,
    pub(super) link: Option<Arc<WorkerLink>>,
}

impl WorkerReplyHandle {
    /// Complete with a status.
    pub fn complete(self, status: Status) {
        self.complete_with(status, Bytes::new());
    }

    /// Complete with a status and infos (a query's answers, a group's context id).
    pub fn complete_with_info(self, status: Status, infos: &[pmix_shim::Info]) {
        use dvm_proto::Message;
        let result = wire::InfoResult { infos: crate::pmix::value::infos_to_wire(infos) };
        self.complete_with(status, result.encode_to_vec());
    }

    /// Complete with a status and data (a fence's result, a peer's modex blob). The bytes are
    /// handed on as they are, not copied: a fence's result may be tens of MiB.
    pub fn complete_with(mut self, status: Status, data: impl Into<Bytes>) {
        self.send(status, data.into());
    }

    fn send(&mut self, status: Status, data: Bytes) {
        let Some(link) = self.link.take() else { return };
        if self.id == 0 {
            return;
        }
        let cmd = Cmd::Complete(wire::Complete { reply: self.id, status, data });
        if let Err(e) = link.post(cmd) {
            debug!(reply = self.id, "PMIx reply not delivered: {e}");
        }
    }
}

impl Drop for WorkerReplyHandle {
    fn drop(&mut self) {
        if self.link.is_some() {
            warn!(reply = self.id, "PMIx reply dropped without completion; completing with PMIX_ERROR");
            self.send(pmix_shim::ERROR, Bytes::new());
        }
    }
}
