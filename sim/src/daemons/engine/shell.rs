//! Each simulated daemon's shell: hand one input to its `Node`, then carry out what it put
//! out, in order — frames to the carrier, effects to `dvm_core::harness::SimShell` (the same
//! shell the core's unit tests use), proc events back into the queue.

use std::collections::VecDeque;

use dvm_core::harness::{self, Due};
use dvm_core::jobs::ProcEvent;
use dvm_core::node::{Control, Effect, LinkEvent, Reply, Start, Transmit};
use dvm_core::Input;
use dvm_grpcomm::Rank;
use dvm_proto::control::{BenchKind, BenchRequest};
use dvm_proto::rml::Tag;

use super::{is_eviction, CoreEngine, Kind, State};
use crate::daemons::scenario::{JOB_END, USER_XCAST};
use crate::daemons::trace::End;

/// One input of a simulated daemon.
#[derive(Debug)]
pub(super) enum In {
    /// A router input: a frame, a loss, a tick, a check-in, or what a simulated PMIx client
    /// asks (fences, xcasts, forgetting a signature), or a benchmark at the HNP.
    Router(Input),
    Proc(ProcEvent),
    Control(u64, Control),
    /// The disk answered staging (at once, as the daemon's shell does).
    Stage(dvm_core::stage::StageDone),
    /// An upcall of the daemon's PMIx server (a simulated client's request).
    Pmix(dvm_proto::pmixworker::WorkerEvent),
}

impl CoreEngine<'_> {
    /// Step `input` on daemon `r` and carry out its effects (and the inputs they cause) in
    /// order, as the daemon's shell does.
    pub(super) fn drive(&mut self, r: Rank, input: Input) {
        self.drive_in(r, In::Router(input));
    }

    pub(super) fn drive_in(&mut self, r: Rank, input: In) {
        let mut inbox = VecDeque::from([input]);
        while let Some(input) = inbox.pop_front() {
            if !self.running(r) {
                return;
            }
            let probe = match &input {
                In::Router(Input::Frame { from_peer, header, payload }) => {
                    let topo = self.nodes[r as usize].node.router().topology();
                    let dead_hop = *from_peer != r && !topo.is_alive(*from_peer);
                    let dead_origin =
                        header.origin != r && header.origin < topo.size() && !topo.is_alive(header.origin);
                    (dead_hop || dead_origin).then(|| (*from_peer, *header, is_eviction(header, payload)))
                }
                _ => None,
            };
            let now = self.q.now();
            let node = &mut self.nodes[r as usize];
            let stale_before = node.node.router().stale_frames;
            step(&mut node.node, now, input);
            let (mut transmits, mut effects) = harness::drain(&mut node.node);
            node.steps += 1;
            if self.sc.sample_state.contains(&r) {
                let held = node.node.router().grpcomm().state_bytes();
                let peak = &mut self.trace.peak_state[r as usize];
                *peak = (*peak).max(held);
            }
            let crash = match node.kill_at_step {
                Some((at, carried)) if node.steps > at => {
                    node.kill_at_step = None;
                    // A crash in the middle of draining: only the first frames went out.
                    transmits.truncate(carried);
                    effects.clear();
                    true
                }
                _ => false,
            };
            if let Some((from, header, eviction)) = probe {
                self.trace.stats.dead_frames += 1;
                let admitted = self.nodes[r as usize].node.router().stale_frames == stale_before;
                let only_notice = effects.is_empty()
                    && transmits.iter().all(|t| {
                        matches!(t, Transmit::Frame { next_hop, header: h, .. }
                            if *next_hop == from && h.tag == Tag::DaemonCmd as u32)
                    });
                if (admitted && !(eviction && transmits.is_empty())) || !only_notice {
                    self.trace.engine_errors.push(format!(
                        "daemon {r} at t={}: a frame from daemon {from} (origin {}, tag {}), declared dead here, \
                         was admitted or acted on ({} frames, {} effects)",
                        self.q.now(),
                        header.origin,
                        header.tag,
                        transmits.len(),
                        effects.len()
                    ));
                }
            }
            for t in transmits {
                if let Transmit::Frame { next_hop, header, payload } = t {
                    self.transmit(r, next_hop, header, payload.into_bytes());
                }
            }
            self.after_step(r, &mut inbox);
            for e in effects {
                self.apply(r, e);
            }
            for (key, result) in std::mem::take(&mut self.nodes[r as usize].shell.fences_done) {
                self.q.note(|| format!("d{r} FENCE_DONE {key:#x} ok {}", result.is_ok()));
                self.fence_done(r, key, result);
            }
            self.after_pmix(r);
            self.after_pmi(r);
            inbox.extend(self.nodes[r as usize].shell.disk.answers.drain(..).map(In::Stage));
            if crash {
                self.kill(r, true);
                return;
            }
            if !self.running(r) {
                return;
            }
            if let Some(d) = self.nodes[r as usize].node.poll_timeout() {
                if self.nodes[r as usize].armed.insert(d) {
                    self.q.push(d, Kind::Tick { daemon: r, at: d });
                }
            }
            self.watch(r);
        }
    }

    /// What the step changed that the node reports through its host or its view: daemons it
    /// now holds failed, fences finished, workload broadcasts delivered.
    fn after_step(&mut self, r: Rank, inbox: &mut VecDeque<In>) {
        let n = &mut self.nodes[r as usize];
        let failed = n.node.router().topology().failed().clone();
        let newly: Vec<Rank> = failed.difference(&n.failed_seen).copied().collect();
        n.failed_seen = failed;
        let delivered = std::mem::take(&mut n.node.host_mut().delivered);
        if !newly.is_empty() {
            self.q.note(|| format!("d{r} DAEMONS_FAILED {newly:?}"));
            for x in newly {
                // x hears nothing more from r.
                self.declared.entry((r, x)).or_insert(self.q.now());
                self.watch(x);
            }
            if r == 0 {
                self.maybe_end_jobs();
            }
        }
        for (tag, payload) in delivered {
            if tag == JOB_END {
                let j = payload.get(..8).map_or(u64::MAX, |b| u64::from_le_bytes(b.try_into().unwrap()));
                match self.sc.jobs.get(j as usize) {
                    Some(job) => inbox.push_back(In::Router(Input::ForgetFence(job.sig.clone()))),
                    None => self.trace.engine_errors.push(format!("daemon {r}: JOB_END for unknown job {j}")),
                }
            } else if tag >= USER_XCAST {
                self.trace.deliveries[r as usize].push((tag, payload));
            }
        }
    }

    fn apply(&mut self, r: Rank, e: Effect) {
        match e {
            Effect::Ready => {
                self.q.note(|| "READY".into());
                if r == 0 {
                    self.on_ready();
                } else {
                    self.trace.engine_errors.push(format!("daemon {r} reported Ready: only the HNP does"));
                }
            }
            Effect::Reply { reply: Reply::Bench(res), .. } => {
                self.q.note(|| format!("d{r} BENCH_DONE {res:?}"));
                if r != 0 {
                    self.trace.engine_errors.push(format!("daemon {r} answered a benchmark: only the HNP does"));
                }
                self.trace.bench_dones.push((self.q.now(), res));
            }
            Effect::Reply { token, reply: Reply::Stage(rep) } if token >= super::STAGE_TOKEN => {
                self.q.note(|| format!("d{r} STAGE_DONE {rep:?}"));
                let idx = (token - super::STAGE_TOKEN) as usize;
                if !rep.ok {
                    let holding = self.holding_stage(idx);
                    if !holding.is_empty() {
                        self.trace.engine_errors.push(format!(
                            "staged file {idx} was answered as failed while live daemons {holding:?} still held part of it"
                        ));
                    }
                }
                match self.trace.stage_dones.get_mut(idx) {
                    Some(slot @ None) if r == 0 => *slot = Some((self.q.now(), rep)),
                    _ => self.trace.engine_errors.push(format!("daemon {r}: a stray staging answer {rep:?}")),
                }
            }
            Effect::Exit(exit) => {
                self.q.note(|| format!("d{r} EXIT {exit:?}"));
                if self.trace.ends[r as usize] == End::Running {
                    self.trace.ends[r as usize] = End::Exited(self.q.now(), exit.clone());
                } else if self.trace.restarted.is_some_and(|(x, _)| x == r) && self.trace.restart_end.is_none() {
                    self.trace.restart_end = Some((self.q.now(), exit.clone()));
                }
                self.nodes[r as usize].shell.apply(r, self.q.now(), Effect::Exit(exit));
                // The process ends once this batch of effects is carried out.
                self.nodes[r as usize].state = State::Dead { rst: true };
                self.nodes[r as usize].queue.clear();
                self.close_all(r);
                for p in 0..self.sc.n {
                    self.watch(p);
                }
                self.maybe_end_jobs();
            }
            e => {
                if let Effect::ToClient { client, .. } = &e {
                    self.job_heard(*client);
                }
                let now = self.q.now();
                for Due { at, ev } in self.nodes[r as usize].shell.apply(r, now, e) {
                    self.q.push(at.max(now), Kind::Proc { daemon: r, ev });
                }
            }
        }
    }

    /// A benchmark asked of the HNP.
    pub(super) fn bench_input(count: u64, bytes: u64) -> In {
        let req = BenchRequest { kind: BenchKind::Alternate as i32, count, bytes, ..Default::default() };
        In::Control(0, Control::Bench(req))
    }
}

/// Hand one input to a node.
fn step(node: &mut dvm_core::Node<dvm_core::harness::SimHost>, now: u64, input: In) {
    match input {
        In::Router(Input::Frame { from_peer, header, payload }) => node.handle_frame(now, from_peer, header, payload),
        In::Router(Input::PeerLost { peer, reason }) => node.handle_link(now, LinkEvent::Lost { peer, reason }),
        In::Router(Input::SendFailed { peer }) => node.handle_link(now, LinkEvent::SendFailed { peer }),
        In::Router(Input::Tick) => node.handle_timeout(now),
        In::Router(Input::CheckIn(own)) => node.handle_start(now, Start::CheckIn(own)),
        In::Router(other) => node.handle_input(now, other),
        In::Proc(ev) => node.handle_proc(now, ev),
        In::Control(token, c) => node.handle_control(now, token, c),
        In::Stage(done) => node.handle_stage(now, done),
        In::Pmix(ev) => node.handle_pmix(now, ev),
    }
}
