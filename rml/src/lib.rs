//! RML: the routing layer of the DVM.
//!
//! Owns: the radix routing tree math (`topology`: pure, no clock, no socket, always built), the
//! rule for when a silent connection means a lost peer (`liveness`: pure, `now` passed in,
//! always built) and, behind the default cargo feature `net`, the tokio side: wire frames and
//! their codec (`frame`), the DVM secret and the HMAC handshake (`auth`), the per-frame
//! integrity and encryption keyed by each handshake (`link`), and the TCP transport that opens,
//! authenticates, heartbeats and watches connections to named peers (`transport`).
//! Never: collective logic (`grpcomm`), job logic (`dvmd`), or routing decisions in the
//! transport: the daemon actor asks its `Topology` for the next hop and the transport only
//! sends to the peer it is given. `grpcomm` and `sim` depend on this crate without `net` and
//! so never pull in tokio.
//! Invariants: nothing an unauthenticated connection sends is acted on, nor any frame that
//! failed verification; a bad connection is
//! closed alone and never takes the listener down; every event names the peer rank.
pub mod topology;

#[cfg(feature = "net")]
pub mod admission;
#[cfg(feature = "net")]
pub mod auth;
#[cfg(feature = "net")]
mod conn;
#[cfg(feature = "net")]
pub mod frame;
#[cfg(feature = "net")]
pub mod link;
pub mod liveness;
#[cfg(feature = "net")]
pub mod transport;

pub use topology::{Rank, RepairDelta, Route, Topology, TopologyError, Tree};

#[cfg(feature = "net")]
pub use auth::{AuthError, DvmSecret, PeerIdentity, Role, SecretError, TOOL_RANK};
#[cfg(feature = "net")]
pub use frame::{Frame, FrameCodec, FrameError, DEFAULT_MAX_FRAME};
#[cfg(feature = "net")]
pub use link::LinkSecurity;
#[cfg(feature = "net")]
pub use transport::{LinkError, Transport, TransportConfig, TransportError, TransportEvent};
