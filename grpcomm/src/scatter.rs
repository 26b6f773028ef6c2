//! Scatter: per-destination payloads in one operation. At every hop the slices are split by
//! next hop (`route_to`), so a child receives exactly the slices of its own subtree and every
//! destination receives exactly its slice. Stateless between hops.
//!
//! Trap: a scatter is not ordered with the xcasts, so it can reach a daemon from a neighbour
//! that applied a repair this daemon has not (its DAEMON_DIED waits behind a gap here). A
//! slice follows this daemon's tree only where that tree agrees with the way the slice came:
//! started here, up from a child, or down from the parent and on down. Anything else was
//! routed by a newer tree, and this daemon's next hop may be the failed daemon that tree
//! replaced: the slice goes straight to its destination instead of being lost there.

use std::collections::BTreeMap;

use bytes::Bytes;
use dvm_proto::grpcomm::{grpcomm_msg::Body, Scatter, ScatterSlice};
use dvm_rml::topology::{Rank, Route};

use crate::{Ctx, Effect};

#[derive(Debug, Default)]
pub(crate) struct ScatterState {
    next_id: u64,
}

impl ScatterState {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn start(&mut self, ctx: &mut Ctx<'_>, tag: u32, slices: Vec<(Rank, Bytes)>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let msg = Scatter {
            origin: ctx.topo.me(),
            scatter_id: id,
            tag,
            slices: slices.into_iter().map(|(dst, data)| ScatterSlice { dst, data }).collect(),
        };
        Self::split(ctx, ctx.topo.me(), msg);
        id
    }

    pub fn on_scatter(&mut self, ctx: &mut Ctx<'_>, from: Rank, msg: Scatter) {
        Self::split(ctx, from, msg);
    }

    fn split(ctx: &mut Ctx<'_>, from: Rank, msg: Scatter) {
        let from_below = from == ctx.topo.me() || ctx.topo.children().contains(&from);
        let from_parent = ctx.topo.parent() == Some(from);
        let mut by_hop: BTreeMap<Rank, Vec<ScatterSlice>> = BTreeMap::new();
        let mut straight = Vec::new();
        for slice in msg.slices {
            match ctx.topo.route_to(slice.dst) {
                Route::Local => ctx.out.push(Effect::ScatterDeliver {
                    origin: msg.origin,
                    scatter_id: msg.scatter_id,
                    tag: msg.tag,
                    data: slice.data,
                }),
                Route::Up(next) if from_below => by_hop.entry(next).or_default().push(slice),
                Route::Down(next) if from_below || from_parent => by_hop.entry(next).or_default().push(slice),
                Route::Up(_) | Route::Down(_) => straight.push(slice),
                Route::Unreachable => ctx.out.push(Effect::Dropped {
                    from,
                    reason: format!(
                        "scatter {}:{} slice for daemon {} has no route (failed or out of range)",
                        msg.origin, msg.scatter_id, slice.dst
                    ),
                }),
            }
        }
        for (next, slices) in by_hop {
            let m = Scatter { origin: msg.origin, scatter_id: msg.scatter_id, tag: msg.tag, slices };
            ctx.send(next, Body::Scatter(m));
        }
        for slice in straight {
            let dst = slice.dst;
            let m = Scatter { origin: msg.origin, scatter_id: msg.scatter_id, tag: msg.tag, slices: vec![slice] };
            ctx.send_direct(dst, Body::Scatter(m));
        }
    }

    pub fn state_bytes(&self) -> usize {
        0
    }

    pub fn is_quiescent(&self) -> bool {
        true
    }
}
