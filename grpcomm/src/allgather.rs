//! Allgather: the lateral movement of a collecting fence. Every participant contributes one
//! block; every participant ends with all blocks, concatenated in participant order, after
//! O(log P) exchanges over lateral links and with no release broadcast.
//!
//! Owns: [`schedule`], the pure partner schedules (XOR-paired recursive doubling for a
//! power-of-two participant count, Bruck otherwise) and the final concatenation, and
//! [`exchange`], one participant's run of a schedule (what to send, what arrived, what is
//! held for a later step). The fence movement that drives it is `fence/allgather.rs`.
//!
//! Never: chooses a schedule from anything a single participant holds alone (its payload
//! size, its arrival order, its rank's place in the tree); relay-only daemons take no part.

pub mod exchange;
pub mod schedule;
