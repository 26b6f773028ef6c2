//! The operations a daemon owns on grpcomm: starting fences for an owner, TERMINATE, encoding
//! grpcomm's messages once for many children, and carrying grpcomm's effects out (`pump`):
//! deliveries by tag, completions back to the owner recorded when the operation started.
//!
//! Never: a completion routed by guessing its owner.

use bytes::Bytes;
use dvm_grpcomm::{tags, Effect as G, FenceError, FenceId, FenceMovementMode, FenceRequest, Via, XcastId};
use dvm_proto::grpcomm::GrpcommMsg;
use dvm_proto::rml::Tag;
use dvm_proto::Payload;
use tracing::{debug, info, warn};

use super::{dtags, Core, Effect, FenceOwner, Rank, XcastOwner};

impl Core {
    // ------------------------------------------------------------------ operations

    pub(super) fn start_fence(&mut self, owner: FenceOwner, req: FenceRequest, mode: Option<FenceMovementMode>) {
        let now = self.now;
        let collect = req.collect;
        let mode = mode.unwrap_or(self.g.config().fence_movement);
        let id = self.g.fence_with(req, now, mode);
        debug!(?owner, collect, seq = id.seq, "fence started");
        self.fence_owners.insert(id, owner);
    }

    pub(super) fn terminate(&mut self) {
        let Some(hnp) = self.hnp.as_mut() else { return };
        if hnp.terminate.is_some() {
            return;
        }
        let id = self.g.xcast(tags::TERMINATE, Bytes::new());
        self.xcast_owners.insert(id, XcastOwner::Core);
        if let Some(h) = self.hnp.as_mut() {
            h.terminate = Some(id);
        }
    }

    /// `msg` encoded once for the children it goes to in one pump; its large fields are shared
    /// with the frame they arrived in, not copied (`Payload::encode`).
    pub(super) fn encode_grpcomm(&mut self, msg: GrpcommMsg) -> Payload {
        if let Some((last, bytes)) = &self.last_encoded {
            if *last == msg {
                return bytes.clone();
            }
        }
        let bytes = Payload::encode(&msg);
        self.last_encoded = Some((msg, bytes.clone()));
        bytes
    }

    /// Carry out grpcomm's effects: sends become frames, completions go to their owners.
    pub(super) fn pump(&mut self) {
        loop {
            let effects: Vec<G> = self.g.drain().collect();
            if effects.is_empty() {
                // The cache serves the sends of one pump; kept longer it would pin the last
                // large payload in memory.
                self.last_encoded = None;
                return;
            }
            for e in effects {
                match e {
                    // A lateral send (allgather blocks) goes straight to its destination over
                    // that daemon's own link; its loss is never a tree loss (see on_peer_lost).
                    G::Send { to, msg, via: Via::Direct } => {
                        self.transmit_direct(to, Tag::Grpcomm, Payload::encode(&msg));
                    }
                    G::Send { to, msg, .. } if self.answering == Some(to) => {
                        self.transmit_direct(to, Tag::Grpcomm, Payload::encode(&msg));
                    }
                    G::Send { to, msg, .. } => {
                        let payload = self.encode_grpcomm(msg);
                        let header = self.header(to, Tag::Grpcomm);
                        self.route(header, payload);
                    }
                    G::Deliver { op_id, origin, tag, payload } => self.on_deliver(op_id, origin, tag, payload),
                    G::XcastComplete { id, .. } => self.on_xcast_complete(id),
                    G::FenceComplete { id, result } => self.on_fence_complete(id, result),
                    G::ScatterDeliver { tag, data, .. } => self.out.push(Effect::ScatterDeliver { tag, data }),
                    G::ArmTimer { at } => {
                        self.deadlines.insert(at);
                    }
                    G::Dropped { from, reason } => warn!(from, "grpcomm dropped a message: {reason}"),
                }
            }
        }
    }

    pub(super) fn on_deliver(&mut self, op_id: u64, origin: Rank, tag: u32, payload: Bytes) {
        debug!(op_id, origin, tag, len = payload.len(), "xcast delivered");
        match tag {
            tags::WIREUP => {
                self.apply_wireup(&payload);
                self.g.xcast_processed(op_id);
            }
            tags::DAEMON_DIED => {
                self.apply_daemon_died(payload);
                self.g.xcast_processed(op_id);
            }
            tags::TERMINATE => {
                info!("DVM terminating");
                self.terminating = true;
                self.out.push(Effect::Deliver { tag, payload });
            }
            dtags::BENCH => self.on_bench_start(payload),
            dtags::LINK_MODEL => self.on_link_model(&payload),
            dtags::BENCH_XCAST => self.on_bench_xcast(payload),
            _ => self.out.push(Effect::Deliver { tag, payload }),
        }
    }

    pub(super) fn on_xcast_complete(&mut self, id: XcastId) {
        let owner = self.xcast_owners.remove(&id);
        if let Some(XcastOwner::Keyed(key)) = owner {
            return self.out.push(Effect::XcastHeld { key });
        }
        let Some(hnp) = self.hnp.as_mut() else { return };
        if hnp.wireup == Some(id) && !hnp.ready {
            // The link is measured, and its model held everywhere, before the DVM takes jobs.
            if !self.start_link_probe() {
                self.declare_ready();
            }
            return;
        }
        if hnp.link_xcast == Some(id) {
            hnp.link_xcast = None;
            self.declare_ready();
            return;
        }
        if hnp.terminate == Some(id) {
            self.out.push(Effect::Terminated);
            return;
        }
        if let Some(XcastOwner::BenchXcast(b)) = owner {
            self.on_bench_xcast_done(b);
        }
    }

    /// HNP: every daemon holds the contact table (and the link model): the DVM takes jobs.
    pub(crate) fn declare_ready(&mut self) {
        let Some(hnp) = self.hnp.as_mut() else { return };
        if !hnp.ready {
            hnp.ready = true;
            self.out.push(Effect::Ready);
        }
    }

    pub(super) fn on_fence_complete(&mut self, id: FenceId, result: Result<Bytes, FenceError>) {
        match self.fence_owners.remove(&id) {
            Some(FenceOwner::Pmix(key)) => self.out.push(Effect::FenceDone { key, result }),
            Some(FenceOwner::Driver(key)) => self.out.push(Effect::DriverFenceDone { key, result }),
            Some(FenceOwner::Pmi(key)) => self.out.push(Effect::PmiFenceDone { key, result }),
            Some(FenceOwner::Bench(b)) => self.on_bench_fence_done(b, id, result),
            None => warn!(seq = id.seq, "a fence nobody owns completed"),
        }
    }
}
