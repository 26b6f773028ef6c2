//! Every daemon's side of staging: what of a transfer it writes and what it tells the HNP.
//!
//! Owns: the transfers this daemon is a target of, until their end (commit, discard, remove),
//! and the report that a discarded or removed transfer left nothing here.
//! Never: touches a file (asks the shell, [`StageIo`]) or decides a transfer's fate (the HNP
//! does, from the reports).
//! Invariants: one failure report per transfer, after which nothing more of it is written;
//! a STAGE message that does not decode is dropped with a warning, never a panic.

use std::collections::BTreeMap;

use bytes::Bytes;
use dvm_proto::daemon::{stage_msg, StageAction, StageMsg, StagePhase, StageReport};
use dvm_rml::Rank;
use prost::Message;
use tracing::warn;

use super::{StageDone, StageIo};

/// What the sink asks of the node, in order.
#[derive(Debug)]
pub enum SinkOut {
    Io(StageIo),
    /// To the HNP.
    Report(StageReport),
}

#[derive(Debug, Default)]
struct Incoming {
    failed: bool,
    committing: bool,
    /// The HNP ended it (discard or remove): its removal is under way.
    ending: bool,
}

/// The transfers this daemon receives.
#[derive(Debug, Default)]
pub struct Sink {
    open: BTreeMap<u64, Incoming>,
    pub(crate) out: Vec<SinkOut>,
}

impl Sink {
    /// Transfers held here (receiving, committed for a job, or failed and not yet discarded).
    pub fn len(&self) -> usize {
        self.open.len()
    }
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// A STAGE broadcast arrived (every daemon sees every one, in op order).
    pub fn on_msg(&mut self, me: Rank, payload: Bytes) {
        let body = match StageMsg::decode(payload) {
            Ok(StageMsg { body: Some(b) }) => b,
            Ok(_) | Err(_) => return warn!("a STAGE broadcast that does not decode was dropped"),
        };
        match body {
            stage_msg::Body::Open(o) => {
                if o.targets.contains(&me) && !self.open.contains_key(&o.id) {
                    self.open.insert(o.id, Incoming::default());
                    self.out.push(SinkOut::Io(StageIo::Open { id: o.id, files: o.files, uid: o.uid }));
                }
            }
            stage_msg::Body::Segment(seg) => {
                if self.open.get(&seg.id).is_some_and(|t| !t.failed && !t.committing) {
                    self.out.push(SinkOut::Io(StageIo::Write { id: seg.id, seg }));
                }
            }
            stage_msg::Body::End(e) => match StageAction::try_from(e.action) {
                Ok(StageAction::Commit) => {
                    if let Some(t) = self.open.get_mut(&e.id).filter(|t| !t.failed && !t.committing) {
                        t.committing = true;
                        self.out.push(SinkOut::Io(StageIo::Commit { id: e.id }));
                    }
                }
                Ok(StageAction::Discard | StageAction::Remove) => {
                    if let Some(t) = self.open.get_mut(&e.id).filter(|t| !t.ending) {
                        t.ending = true;
                        self.out.push(SinkOut::Io(StageIo::Remove { id: e.id }));
                    }
                }
                Ok(StageAction::Keep) => {
                    if self.open.remove(&e.id).is_some() {
                        self.out.push(SinkOut::Io(StageIo::Keep { id: e.id }));
                    }
                }
                _ => warn!(id = e.id, action = e.action, "a STAGE end with an unknown action was dropped"),
            },
        }
    }

    /// The shell finished disk work of a transfer.
    pub fn on_done(&mut self, done: StageDone) {
        let (id, result) = match done {
            StageDone::Sink { id, result } => (id, result),
            StageDone::Removed { id, result } => {
                if self.open.remove(&id).is_some() {
                    let error = result.err().unwrap_or_default();
                    self.out.push(SinkOut::Report(StageReport { id, phase: StagePhase::Removed as i32, error }));
                }
                return;
            }
            StageDone::Read { .. } => return,
        };
        let Some(t) = self.open.get_mut(&id) else { return };
        if t.failed || t.ending {
            return;
        }
        let phase = match result {
            Err(error) => {
                t.failed = true;
                self.out.push(SinkOut::Io(StageIo::Discard { id }));
                self.out.push(SinkOut::Report(StageReport { id, phase: StagePhase::Failed as i32, error }));
                return;
            }
            Ok(_) if t.committing => StagePhase::Committed,
            Ok(true) => StagePhase::Verified,
            Ok(false) => return,
        };
        self.out.push(SinkOut::Report(StageReport { id, phase: phase as i32, error: String::new() }));
    }
}
