//! The HNP's side of staging: transfers it started, their reads, window and verdicts.
//!
//! Owns: the transfer table (one entry per transfer in progress or committed for a job).
//! Never: reads a file (asks the shell, [`StageIo::Read`]) or waits: a segment is read only
//! when fewer than [`WINDOW`] are in flight.
//! Invariants: a failed transfer is answered once, after every live target discarded it;
//! reports and completions of a transfer that is gone (or ending) change nothing.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use dvm_proto::control::StageReply;
use dvm_proto::daemon::{stage_msg, StageAction, StageDest, StageEnd, StageMsg, StageOpen, StagePhase, StageReport};
use dvm_rml::Rank;
use prost::Message;
use tracing::{info, warn};

use super::{segments, SourceFile, StageDone, StageIo, StagePlan, StageSegment, DEFAULT_SEGMENT, WINDOW};
use crate::Core;

/// Who a transfer answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// A control call (the broadcast tool): its reply token.
    Control(u64),
    /// A job's preload: the job starts once it is in place, and removes it when it ends.
    Job(u32),
}

/// What the origin asks of the node, in order.
#[derive(Debug)]
pub enum OriginOut {
    Io(StageIo),
    /// A STAGE broadcast whose completion nobody waits for (open, commit, discard).
    Xcast(Bytes),
    /// A segment: its completion ([`Origin::on_held`] with `key`) frees a window place.
    Segment {
        key: u64,
        payload: Bytes,
    },
    /// The transfer's verdict (a failure's once every live target discarded it).
    Done {
        owner: Owner,
        reply: StageReply,
    },
    /// A job's files are gone from every live target (or kept, when it asked).
    Released {
        jobid: u32,
    },
}

/// What a transfer being removed answers once every live target reported its files gone.
#[derive(Debug)]
enum Ending {
    /// A failure: its verdict.
    Verdict(Owner, StageReply),
    /// A job's end: its files are gone.
    Release(u32),
}

#[derive(Debug)]
struct Transfer {
    owner: Owner,
    files: Vec<SourceFile>,
    targets: BTreeSet<Rank>,
    compress: bool,
    window: usize,
    /// The next segment to read: (file, offset, len, last).
    queue: std::collections::VecDeque<(u32, u64, u64, bool)>,
    reading: bool,
    in_flight: usize,
    verified: BTreeSet<Rank>,
    committed: BTreeSet<Rank>,
    committing: bool,
    /// Committed and kept until its job ends.
    held: bool,
    /// Discarded or removed: what to answer once `removing` is empty.
    ending: Option<Ending>,
    /// Live targets that have not yet reported the transfer gone.
    removing: BTreeSet<Rank>,
    started: u64,
    wire: u64,
    segments: u32,
}

/// The HNP's transfers.
#[derive(Debug, Default)]
pub struct Origin {
    transfers: BTreeMap<u64, Transfer>,
    next_id: u64,
    pub(crate) out: Vec<OriginOut>,
}

fn msg(body: stage_msg::Body) -> Bytes {
    Bytes::from(StageMsg { body: Some(body) }.encode_to_vec())
}

fn end(id: u64, action: StageAction) -> OriginOut {
    OriginOut::Xcast(msg(stage_msg::Body::End(StageEnd { id, action: action as i32 })))
}

impl Origin {
    /// Transfers in progress or held for a job.
    pub fn len(&self) -> usize {
        self.transfers.len()
    }
    pub fn is_empty(&self) -> bool {
        self.transfers.is_empty()
    }

    /// The live daemons on `hosts` (every live daemon when empty), or the host nobody runs on.
    pub fn targets(r: &Core, hosts: &[String]) -> Result<BTreeSet<Rank>, String> {
        let topo = r.topology();
        let live: Vec<Rank> = (0..topo.size()).filter(|&d| topo.is_alive(d)).collect();
        if hosts.is_empty() {
            return Ok(live.into_iter().collect());
        }
        let mut out = BTreeSet::new();
        for h in hosts {
            let on: Vec<Rank> = live.iter().copied().filter(|&d| r.host_of(d) == *h).collect();
            if on.is_empty() {
                return Err(format!("no live daemon of the DVM runs on host {h}"));
            }
            out.extend(on);
        }
        Ok(out)
    }

    /// Start a transfer of `plan` to `targets`; returns its id.
    pub fn start(&mut self, now: u64, owner: Owner, plan: StagePlan, targets: BTreeSet<Rank>) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let seg = if plan.segment == 0 { DEFAULT_SEGMENT } else { plan.segment };
        let queue = plan
            .files
            .iter()
            .enumerate()
            .flat_map(|(i, f)| segments(f.size, seg).map(move |(off, len, last)| (i as u32, off, len, last)))
            .collect();
        let files: Vec<StageDest> =
            plan.files.iter().map(|f| StageDest { path: f.dest.clone(), size: f.size, mode: f.mode }).collect();
        let bytes: u64 = plan.files.iter().map(|f| f.size).sum();
        info!(id, ?owner, files = files.len(), bytes, nodes = targets.len(), "transfer started");
        let open = StageOpen { id, files, targets: targets.iter().copied().collect(), uid: plan.uid };
        self.out.push(OriginOut::Xcast(msg(stage_msg::Body::Open(open))));
        self.transfers.insert(
            id,
            Transfer {
                owner,
                files: plan.files,
                targets,
                compress: plan.compress,
                window: if plan.window == 0 { WINDOW } else { plan.window.min(super::MAX_WINDOW) },
                queue,
                reading: false,
                in_flight: 0,
                verified: BTreeSet::new(),
                committed: BTreeSet::new(),
                committing: false,
                held: false,
                ending: None,
                removing: BTreeSet::new(),
                started: now,
                wire: 0,
                segments: 0,
            },
        );
        self.pump(id);
        id
    }

    /// Ask for the next read while the window has room.
    fn pump(&mut self, id: u64) {
        let Some(t) = self.transfers.get_mut(&id) else { return };
        if t.reading || t.in_flight >= t.window || t.ending.is_some() {
            return;
        }
        let Some(&(file, offset, len, last)) = t.queue.front() else { return };
        t.reading = true;
        let path = t.files[file as usize].src.clone();
        self.out.push(OriginOut::Io(StageIo::Read { id, file, path, offset, len, last, compress: t.compress }));
    }

    /// The shell read a segment (or could not).
    pub fn on_read(&mut self, now: u64, id: u64, result: Result<StageSegment, String>) {
        let Some(t) = self.transfers.get_mut(&id).filter(|t| t.ending.is_none()) else { return };
        t.reading = false;
        match result {
            Err(why) => self.fail(now, id, why),
            Ok(mut seg) => {
                t.queue.pop_front();
                seg.id = id;
                t.wire += seg.data.len() as u64;
                t.segments += 1;
                t.in_flight += 1;
                if t.queue.is_empty() {
                    self.out.push(OriginOut::Io(StageIo::ReadEnd { id }));
                }
                self.out.push(OriginOut::Segment { key: id, payload: msg(stage_msg::Body::Segment(seg)) });
                self.pump(id);
            }
        }
    }

    /// Every live daemon holds a segment of transfer `key`.
    pub fn on_held(&mut self, key: u64) {
        if let Some(t) = self.transfers.get_mut(&key) {
            t.in_flight = t.in_flight.saturating_sub(1);
            self.pump(key);
        }
    }

    /// A target's report.
    pub fn on_report(&mut self, r: &Core, now: u64, from: Rank, rep: StageReport) {
        let Some(t) = self.transfers.get_mut(&rep.id) else { return };
        if !t.targets.contains(&from) {
            return;
        }
        if t.ending.is_some() {
            if rep.phase == StagePhase::Removed as i32 {
                if !rep.error.is_empty() {
                    warn!(id = rep.id, daemon = from, host = r.host_of(from), "a staged file stays: {}", rep.error);
                }
                t.removing.remove(&from);
                self.finish(rep.id);
            }
            return;
        }
        match StagePhase::try_from(rep.phase) {
            Ok(StagePhase::Verified) => {
                t.verified.insert(from);
            }
            Ok(StagePhase::Committed) => {
                t.committed.insert(from);
            }
            // A removal report for a transfer still moving was never asked for: dropped.
            Ok(StagePhase::Removed) => return warn!(id = rep.id, daemon = from, "a stray REMOVED report was dropped"),
            _ => {
                let why = format!("daemon {from} on host {}: {}", r.host_of(from), rep.error);
                return self.fail(now, rep.id, why);
            }
        }
        self.advance(now, rep.id);
    }

    fn advance(&mut self, now: u64, id: u64) {
        let Some(t) = self.transfers.get_mut(&id) else { return };
        if !t.committing && t.queue.is_empty() && t.verified.is_superset(&t.targets) {
            t.committing = true;
            self.out.push(end(id, StageAction::Commit));
        } else if t.committing && !t.held && t.committed.is_superset(&t.targets) {
            let reply = reply_of(now, t, Ok(()));
            let owner = t.owner;
            info!(id, elapsed_us = reply.elapsed_us, segments = reply.segments, "transfer in place on every target");
            match owner {
                Owner::Job(_) => t.held = true,
                Owner::Control(_) => {
                    // The files stay; every target forgets the transfer.
                    self.transfers.remove(&id);
                    self.out.push(end(id, StageAction::Keep));
                }
            }
            self.out.push(OriginOut::Done { owner, reply });
        }
    }

    /// Daemons were lost: a transfer that has one of them as a target fails, naming it (its
    /// survivors discard what they hold). A job's files already in place stay until the job
    /// ends (the job fails on its own). A lost target is waited for no more.
    pub fn lost(&mut self, r: &Core, now: u64, failed: &BTreeSet<Rank>) {
        let hit: Vec<(u64, Rank)> = self
            .transfers
            .iter()
            .filter(|(_, t)| !t.held && t.ending.is_none())
            .filter_map(|(&id, t)| t.targets.intersection(failed).next().map(|&d| (id, d)))
            .collect();
        for (id, d) in hit {
            let why = format!("daemon {d} on host {} was lost during the transfer", r.host_of(d));
            self.fail(now, id, why);
        }
        let ids: Vec<u64> = self.transfers.keys().copied().collect();
        for id in ids {
            let t = self.transfers.get_mut(&id).expect("listed");
            t.targets.retain(|d| !failed.contains(d));
            t.removing.retain(|d| !failed.contains(d));
            self.finish(id);
        }
    }

    /// The transfer fails: nothing of it may stay anywhere, and it is answered with `why` once
    /// every live target reported its part gone.
    pub fn fail(&mut self, now: u64, id: u64, why: String) {
        let Some(t) = self.transfers.get_mut(&id).filter(|t| t.ending.is_none()) else { return };
        info!(id, "transfer failed: {why}");
        if !t.queue.is_empty() {
            t.queue.clear();
            self.out.push(OriginOut::Io(StageIo::ReadEnd { id }));
        }
        let (owner, reply) = (t.owner, reply_of(now, t, Err(why)));
        self.end(id, StageAction::Discard, Ending::Verdict(owner, reply));
    }

    /// Tell the targets to discard or remove transfer `id`; `ending` is answered once they all
    /// report it gone.
    fn end(&mut self, id: u64, action: StageAction, ending: Ending) {
        let Some(t) = self.transfers.get_mut(&id) else { return };
        t.removing = t.targets.clone();
        t.ending = Some(ending);
        self.out.push(end(id, action));
        self.finish(id);
    }

    /// A transfer being removed that no live target still holds is answered and forgotten.
    fn finish(&mut self, id: u64) {
        if !self.transfers.get(&id).is_some_and(|t| t.ending.is_some() && t.removing.is_empty()) {
            return;
        }
        let t = self.transfers.remove(&id).expect("checked");
        self.out.push(match t.ending.expect("checked") {
            Ending::Verdict(owner, reply) => OriginOut::Done { owner, reply },
            Ending::Release(jobid) => {
                info!(id, jobid, "the job's files are gone from every node");
                OriginOut::Released { jobid }
            }
        });
    }

    /// A job ended (or failed before it started): its preloaded files are removed, or left
    /// in place when it asked to `keep` them. [`OriginOut::Released`] follows once they are
    /// gone everywhere (at once when there is nothing to remove).
    pub fn release_job(&mut self, jobid: u32, keep: bool) {
        let ids: Vec<u64> =
            self.transfers.iter().filter(|(_, t)| t.owner == Owner::Job(jobid)).map(|(&id, _)| id).collect();
        if ids.is_empty() {
            self.out.push(OriginOut::Released { jobid });
        }
        for id in ids {
            let t = self.transfers.get_mut(&id).expect("listed");
            if t.ending.is_some() {
                // Already being discarded: its verdict is not wanted any more.
                t.ending = Some(Ending::Release(jobid));
            } else if t.held && keep {
                self.transfers.remove(&id);
                self.out.push(end(id, StageAction::Keep));
                self.out.push(OriginOut::Released { jobid });
            } else if t.held {
                self.end(id, StageAction::Remove, Ending::Release(jobid));
            } else {
                // Still moving: it is discarded like a failure, without a verdict.
                if !t.queue.is_empty() {
                    t.queue.clear();
                    self.out.push(OriginOut::Io(StageIo::ReadEnd { id }));
                }
                self.end(id, StageAction::Discard, Ending::Release(jobid));
            }
        }
    }

    /// The shell's answer to a read.
    pub fn on_done(&mut self, now: u64, done: StageDone) {
        if let StageDone::Read { id, result } = done {
            self.on_read(now, id, result);
        }
    }
}

fn reply_of(now: u64, t: &Transfer, result: Result<(), String>) -> StageReply {
    let bytes = t.files.iter().map(|f| f.size).sum();
    let (ok, error) = match result {
        Ok(()) => (true, String::new()),
        Err(e) => (false, e),
    };
    StageReply {
        ok,
        error,
        nodes: t.targets.len() as u32,
        bytes,
        wire_bytes: t.wire,
        elapsed_us: now.saturating_sub(t.started) / 1000,
        segments: t.segments,
    }
}
