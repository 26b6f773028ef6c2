//! xcast: reliable broadcast, op ids assigned at rank 0, ACK rollup.
//! (Skeleton: being written.)

use bytes::Bytes;
use dvm_proto::grpcomm::{XcastAck, XcastDone, XcastForward, XcastRelay};
use dvm_rml::topology::{Rank, RepairDelta};

use crate::Ctx;

/// Identifies an xcast started on a daemon: (origin rank, origin-local id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct XcastId {
    pub origin: Rank,
    pub local: u64,
}

#[derive(Debug)]
pub(crate) struct XcastState {
    me: Rank,
}

impl XcastState {
    pub fn new(me: Rank) -> Self {
        XcastState { me }
    }
    pub fn adopt_complete_below(&mut self, _first_op: u64) {}
    pub fn start(&mut self, _ctx: &mut Ctx<'_>, _tag: u32, _payload: Bytes) -> XcastId {
        XcastId { origin: self.me, local: 0 }
    }
    pub fn processed(&mut self, _ctx: &mut Ctx<'_>, _op_id: u64) {}
    pub fn on_relay(&mut self, _ctx: &mut Ctx<'_>, _from: Rank, _m: XcastRelay) {}
    pub fn on_forward(&mut self, _ctx: &mut Ctx<'_>, _from: Rank, _m: XcastForward) {}
    pub fn on_ack(&mut self, _ctx: &mut Ctx<'_>, _from: Rank, _m: XcastAck) {}
    pub fn on_done(&mut self, _ctx: &mut Ctx<'_>, _from: Rank, _m: XcastDone) {}
    pub fn topology_changed(&mut self, _ctx: &mut Ctx<'_>, _delta: &RepairDelta) {}
    pub fn peer_unreachable(&mut self, _ctx: &mut Ctx<'_>, _peer: Rank) {}
    pub fn state_bytes(&self) -> usize {
        0
    }
    pub fn is_quiescent(&self) -> bool {
        true
    }
    pub fn next_deliver(&self) -> u64 {
        0
    }
}
