//! The node's staging: what the origin (HNP) and the sink (every daemon) ask of each other and
//! of the shell, carried in order.
//!
//! Owns: the routing of STAGE broadcasts, reports, window completions and disk answers to
//! [`crate::stage::origin::Origin`] and [`crate::stage::sink::Sink`].
//! Never: decides a transfer (they do) or touches a disk.

use std::collections::BTreeSet;

use dvm_proto::control::StageReply;
use dvm_proto::daemon::{daemon_cmd, StageReport};
use dvm_rml::Rank;

use super::{Effect, Node, Reply};
use crate::host::Host;
use crate::stage::origin::{Origin, OriginOut, Owner};
use crate::stage::sink::SinkOut;
use crate::stage::{StageDone, StagePlan};
use crate::{dtags, Input};

impl<H: Host> Node<H> {
    /// The shell's answer to a [`crate::stage::StageIo`].
    pub fn handle_stage(&mut self, now: u64, done: StageDone) {
        self.tick(now);
        if !self.exited {
            match done {
                StageDone::Read { .. } => {
                    if let Some(o) = self.stage_out.as_mut() {
                        o.on_done(self.now, done);
                    }
                }
                StageDone::Sink { .. } | StageDone::Removed { .. } => self.stage_in.on_done(done),
            }
        }
        self.run(now);
    }

    /// Transfers this node holds: (as their origin, as a target).
    pub fn stage_held(&self) -> (usize, usize) {
        (self.stage_out.as_ref().map_or(0, Origin::len), self.stage_in.len())
    }

    /// HNP: the broadcast tool's request.
    pub(super) fn on_stage_control(&mut self, token: u64, plan: StagePlan) {
        let Some(origin) = self.stage_out.as_mut() else { return };
        match Origin::targets(&self.router, &plan.hosts) {
            Ok(targets) => drop(origin.start(self.now, Owner::Control(token), plan, targets)),
            Err(error) => self.reply(token, Reply::Stage(StageReply { error, ..Default::default() })),
        }
    }

    pub(super) fn on_stage_report(&mut self, from: Rank, rep: StageReport) {
        if let Some(o) = self.stage_out.as_mut() {
            o.on_report(&self.router, self.now, from, rep);
        }
    }

    pub(super) fn stage_lost(&mut self, failed: &BTreeSet<Rank>) {
        if let Some(o) = self.stage_out.as_mut() {
            o.lost(&self.router, self.now, failed);
        }
    }

    /// Move what staging asked for to the router's inbox and the shell's queue; true if
    /// anything moved.
    pub(super) fn carry_stage(&mut self) -> bool {
        let mut moved = false;
        for o in std::mem::take(&mut self.stage_in.out) {
            moved = true;
            match o {
                SinkOut::Io(io) => self.effects.push_back(Effect::Stage(io)),
                SinkOut::Report(rep) => {
                    self.inbox.push_back(Input::Cmd { dst: 0, body: daemon_cmd::Body::StageReport(rep) })
                }
            }
        }
        let Some(origin) = self.stage_out.as_mut() else { return moved };
        for o in std::mem::take(&mut origin.out) {
            moved = true;
            match o {
                OriginOut::Io(io) => self.effects.push_back(Effect::Stage(io)),
                OriginOut::Xcast(payload) => self.inbox.push_back(Input::Xcast { tag: dtags::STAGE, payload }),
                OriginOut::Segment { key, payload } => {
                    self.inbox.push_back(Input::XcastKeyed { tag: dtags::STAGE, payload, key })
                }
                OriginOut::Done { owner: Owner::Control(token), reply } => self.reply(token, Reply::Stage(reply)),
                OriginOut::Done { owner: Owner::Job(jobid), reply } => {
                    if let Some(jobs) = self.jobs.as_mut() {
                        jobs.staged(&self.router, jobid, reply);
                    }
                }
                OriginOut::Released { jobid } => {
                    if let Some(jobs) = self.jobs.as_mut() {
                        jobs.unstaged(jobid);
                    }
                }
            }
        }
        moved
    }
}
