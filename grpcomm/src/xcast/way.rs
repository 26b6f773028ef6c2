//! The broadcast movements as one closed enum with its behaviour: how one op travels, as its
//! origin asked and the root stamped it on the op. The framing (`xcast.rs`: op ids, order,
//! ACK rollup, retention) calls these entry points and never compares movement ids; each
//! movement's rules live in its own place (the whole-payload forward in `xcast.rs`,
//! scatter-allgather in `bulk.rs`). A new movement is its file, one variant with one arm per
//! entry point here, and one row in `movement.rs`.

use dvm_proto::grpcomm::XcastForward;
use dvm_rml::topology::Rank;

use super::XcastState;
use crate::{Ctx, Movement};

/// How one xcast op travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Way {
    /// The whole payload to every child.
    Whole,
    /// Chunks down the tree, then a lateral allgather of the chunks (`bulk.rs`).
    ScatterAllgather,
}

impl Way {
    /// The movement stamped on `m` (anything else travels whole).
    pub fn of(m: &XcastForward) -> Way {
        if m.movement == Movement::ScatterAllgather.id() {
            Way::ScatterAllgather
        } else {
            Way::Whole
        }
    }

    /// The root's stamp on a new op: what its origin asked for (`asked`, a movement id), but
    /// process-first tags and a DVM of one live daemon always travel whole.
    pub fn assign(ctx: &Ctx<'_>, asked: u32, tag: u32) -> Way {
        let lateral = asked == Movement::ScatterAllgather.id()
            && !ctx.cfg.process_first.contains(&tag)
            && ctx.topo.live_count() > 1;
        if lateral {
            Way::ScatterAllgather
        } else {
            Way::Whole
        }
    }

    pub fn id(self) -> u32 {
        match self {
            Way::Whole => Movement::TreeBroadcast.id(),
            Way::ScatterAllgather => Movement::ScatterAllgather.id(),
        }
    }

    /// A forward from the parent arrived: whole forwards go to the framing's order and
    /// rollup; chunk forwards to the exchange, which hands the op back once assembled.
    pub fn on_forward(x: &mut XcastState, ctx: &mut Ctx<'_>, from: Rank, m: XcastForward) {
        match Way::of(&m) {
            Way::Whole => x.on_whole_forward(ctx, from, m),
            Way::ScatterAllgather => x.on_bulk_forward(ctx, from, m),
        }
    }

    /// `m`, handed to the framing, was assembled on this daemon rather than received whole:
    /// its children have their chunks already, so it is never passed on as it is.
    pub fn assembled_here(m: &XcastForward, ctx: &Ctx<'_>) -> bool {
        Way::of(m) == Way::ScatterAllgather && !ctx.topo.is_root()
    }

    /// Op `m` is processed here (in order): send it on down its movement and return the op as
    /// it is delivered and retained (whole: every replay after a repair is a whole forward).
    pub fn send_down(x: &mut XcastState, ctx: &mut Ctx<'_>, m: XcastForward) -> XcastForward {
        match Way::of(&m) {
            Way::Whole => {
                x.forward_to_children(ctx, &m);
                m
            }
            Way::ScatterAllgather if ctx.topo.is_root() => x.bulk_root_start(ctx, &m),
            // Assembled here: the children had their chunks long ago.
            Way::ScatterAllgather => XcastForward { movement: Way::Whole.id(), ..m },
        }
    }
}
