//! RML: the routing layer of the DVM.
//!
//! Owns: the radix routing tree math (`topology`, pure: no clock, no socket).
//! Later: TCP transport, framing, relay, authentication and failure detection on tokio.
//! Never: collective logic (that is `grpcomm`) or job logic (that is `dvmd`).
pub mod topology;

pub use topology::{Rank, RepairDelta, Route, Topology, TopologyError, Tree};
