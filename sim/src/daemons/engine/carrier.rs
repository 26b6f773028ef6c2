//! The carrier and the faults of the daemon engine: frames on links (α/β per link, lossy
//! cuts), loss detection (heartbeat bound, closed sockets, refused sends), freezes and their
//! resume, kills. See the parent module for the loss model.
//!
//! Never: a decision of a daemon's; it only reports what a socket or a heartbeat would.

use bytes::Bytes;
use dvm_core::Input;
use dvm_grpcomm::Rank;
use dvm_proto::rml::FrameHeader;
use dvm_proto::Message;
use rand::Rng;

use super::{describe, norm, CoreEngine, Kind, Msg, State, MAX_DELAY_ROUNDS};
use crate::daemons::scenario::FaultKind;
use crate::daemons::trace::End;

impl CoreEngine<'_> {
    // ------------------------------------------------------------------ the carrier

    pub(super) fn arrive(&mut self, from: Rank, to: Rank, msg: Msg, sent_at: u64) {
        if matches!(msg, Msg::Frame { .. })
            && matches!(self.nodes[from as usize].state, State::Dead { .. })
            && self.trace.ends[from as usize].died_before(sent_at)
        {
            self.trace.stats.lost_frames += 1;
            return; // still on the sender's NIC when it died: never left
        }
        match self.nodes[to as usize].state {
            State::Dead { rst } => {
                if let Msg::Frame { .. } = msg {
                    self.trace.stats.lost_frames += 1;
                    self.refused(from, to, rst);
                }
            }
            State::Stopped => self.nodes[to as usize].queue.push((from, msg)),
            State::Running => {
                let at = self.carrier.handled_at(&self.sc.net, self.q.now(), to);
                self.q.push(at, Kind::Handle { from, to, msg });
            }
        }
    }

    pub(super) fn handle(&mut self, from: Rank, to: Rank, msg: Msg) {
        match self.nodes[to as usize].state {
            State::Dead { .. } => {}
            State::Stopped => self.nodes[to as usize].queue.push((from, msg)),
            State::Running => self.deliver(from, to, msg),
        }
    }

    /// Hand one frame or close to a running daemon.
    pub(super) fn deliver(&mut self, from: Rank, to: Rank, msg: Msg) {
        match msg {
            Msg::Close => {
                if from != to {
                    self.peer_lost(to, from, "connection closed");
                }
            }
            Msg::Frame { header, payload, delayed } => {
                if delayed > 0 && self.nodes[to as usize].node.router().topology().is_alive(from) {
                    // A frame held on a failing link comes out only once its receiver has
                    // declared the sender dead (else it would overtake later frames).
                    if delayed < MAX_DELAY_ROUNDS {
                        let at = self.q.now() + self.sc.heartbeat_ns;
                        self.q.push(
                            at,
                            Kind::Handle { from, to, msg: Msg::Frame { header, payload, delayed: delayed + 1 } },
                        );
                    } else {
                        self.trace.stats.lost_frames += 1;
                    }
                    return;
                }
                self.q.note(|| format!("d{to} <- d{from} {}", describe(&header, &payload)));
                self.drive(to, Input::Frame { from_peer: from, header, payload });
            }
        }
    }

    /// A frame reached a dead daemon: refused at once if its sockets were closed; the
    /// connection gives up one heartbeat bound later either way.
    pub(super) fn refused(&mut self, from: Rank, to: Rank, rst: bool) {
        if matches!(self.nodes[from as usize].state, State::Dead { .. }) {
            return;
        }
        if rst {
            self.q.push(self.q.now() + self.sc.net.alpha_ns, Kind::SendFailed { daemon: from, peer: to });
        }
        self.detect(from, to);
    }

    /// Report `peer` lost to `daemon` one heartbeat bound (plus jitter) from now, if it is
    /// still silent then.
    pub(super) fn detect(&mut self, daemon: Rank, peer: Rank) {
        if self.detecting.insert((daemon, peer)) {
            let j = self.rng.gen_range(0..=self.sc.detect_jitter_ns);
            self.q.push(self.q.now() + self.sc.heartbeat_ns + j, Kind::Lost { daemon, peer });
        }
    }

    /// Heartbeats: every tree neighbour of `r` (in its own view) that is silent is detected.
    pub(super) fn watch(&mut self, r: Rank) {
        if !self.faulty || !self.running(r) {
            return;
        }
        let topo = self.nodes[r as usize].node.router().topology();
        let mut peers: Vec<Rank> = topo.children().to_vec();
        peers.extend(topo.parent());
        for p in peers {
            if self.silent(r, p) {
                self.detect(r, p);
            }
        }
    }

    pub(super) fn transmit(&mut self, from: Rank, to: Rank, header: FrameHeader, payload: Bytes) {
        if to == from || to >= self.sc.n {
            self.trace
                .engine_errors
                .push(format!("daemon {from}: Transmit to next hop {to} (tag {}, dst {})", header.tag, header.dst));
            return;
        }
        self.conns.insert(norm(from, to));
        let link = norm(from, to);
        if self.cut.contains(&link) {
            self.trace.stats.lost_frames += 1;
            self.detect(from, to);
            return;
        }
        if let State::Dead { rst } = self.nodes[to as usize].state {
            self.trace.stats.lost_frames += 1;
            self.refused(from, to, rst);
            return;
        }
        let bytes = header.encoded_len() + payload.len();
        let mut copies = 1;
        let mut delayed = 0;
        if let Some(&cut_at) = self.lossy_cuts.get(&link) {
            // The last few round trips before a lossy cut: frames vanish, double or stall.
            if self.q.now() + 8 * self.sc.net.alpha_ns >= cut_at {
                match self.rng.gen_range(0..4) {
                    0 => {
                        self.trace.stats.lost_frames += 1;
                        return;
                    }
                    1 => {
                        self.trace.stats.duplicated += 1;
                        copies = 2;
                    }
                    2 => {
                        self.trace.stats.delayed += 1;
                        delayed = 1;
                    }
                    _ => {}
                }
            }
        }
        for _ in 0..copies {
            let msg = Msg::Frame { header, payload: payload.clone(), delayed };
            if delayed > 0 {
                let at = self.q.now() + 2 * self.sc.heartbeat_ns + self.sc.detect_jitter_ns;
                self.q.push(at, Kind::Handle { from, to, msg });
            } else {
                self.link_send(from, to, msg, bytes);
            }
        }
    }

    pub(super) fn link_send(&mut self, from: Rank, to: Rank, msg: Msg, bytes: usize) {
        let (start, arrive) = self.carrier.send(&self.sc.net, &mut self.rng, self.q.now(), from, to, bytes);
        self.trace.stats.frames += 1;
        self.trace.stats.bytes += bytes as u64;
        self.q.push(arrive, Kind::Arrive { from, to, msg, sent_at: start });
    }

    // ------------------------------------------------------------------ faults

    pub(super) fn fault(&mut self, idx: usize) {
        let f = self.sc.faults[idx].kind.clone();
        self.faulty = true;
        self.trace.last_fault_at = self.q.now();
        self.q.note(|| format!("FAULT {f:?}"));
        match f {
            FaultKind::Kill { rank, rst } => self.kill(rank, rst),
            FaultKind::KillAtStep { rank, step, carried } => {
                let n = &mut self.nodes[rank as usize];
                n.kill_at_step = Some((n.steps + step, carried));
            }
            FaultKind::Stop { rank, for_ns } => {
                if self.running(rank) {
                    self.nodes[rank as usize].state = State::Stopped;
                    self.nodes[rank as usize].stopped_at = self.q.now();
                    self.trace.stops.push((rank, self.q.now(), self.q.now() + for_ns));
                    self.q.push(self.q.now() + for_ns, Kind::Resume { daemon: rank });
                }
            }
            FaultKind::Cut { a, b, .. } => {
                self.cut.insert(norm(a, b));
                self.trace.cuts.push((a, b, self.q.now()));
                // Both ends notice: the connection breaks (or never comes up).
                for (x, y) in [(a, b), (b, a)] {
                    if self.running(x) {
                        self.detect(x, y);
                    }
                }
            }
        }
        for r in 0..self.sc.n {
            self.watch(r);
        }
    }

    pub(super) fn kill(&mut self, r: Rank, rst: bool) {
        if matches!(self.nodes[r as usize].state, State::Dead { .. }) {
            return;
        }
        self.q.note(|| format!("KILL d{r} rst {rst}"));
        self.clients_died(r);
        self.nodes[r as usize].state = State::Dead { rst };
        self.nodes[r as usize].queue.clear();
        self.trace.ends[r as usize] = End::Killed(self.q.now());
        self.faulty = true;
        self.trace.last_fault_at = self.trace.last_fault_at.max(self.q.now());
        if rst {
            self.close_all(r);
        }
        for p in 0..self.sc.n {
            self.watch(p);
        }
    }

    /// `r`'s process ended: every connected peer sees its socket close.
    pub(super) fn close_all(&mut self, r: Rank) {
        let peers: Vec<Rank> =
            self.conns.iter().filter(|&&(a, b)| a == r || b == r).map(|&(a, b)| if a == r { b } else { a }).collect();
        for p in peers {
            if !matches!(self.nodes[p as usize].state, State::Dead { .. }) && !self.cut.contains(&norm(r, p)) {
                self.link_send(r, p, Msg::Close, 0);
            }
        }
    }

    pub(super) fn resume(&mut self, r: Rank) {
        if self.nodes[r as usize].state != State::Stopped {
            return;
        }
        self.q.note(|| format!("RESUME d{r}"));
        self.nodes[r as usize].state = State::Running;
        let queue = std::mem::take(&mut self.nodes[r as usize].queue);
        for (from, msg) in queue {
            if !self.running(r) {
                return;
            }
            self.deliver(from, r, msg);
        }
        if !self.running(r) {
            return;
        }
        // Its heartbeat bound passed while it was frozen for every neighbour silent since
        // before then; the others are detected in the usual way.
        let topo = self.nodes[r as usize].node.router().topology();
        let mut peers: Vec<Rank> = topo.children().to_vec();
        peers.extend(topo.parent());
        // Lateral connections carry heartbeats too: a cut one is noticed the same way (the
        // lifeline to the HNP keeps its own model).
        let lateral: Vec<Rank> = (0..self.sc.n)
            .filter(|&p| p != r && p != 0 && !peers.contains(&p))
            .filter(|&p| self.conns.contains(&norm(r, p)) && self.cut.contains(&norm(r, p)))
            .collect();
        peers.extend(lateral);
        for p in peers {
            if !self.running(r) || !self.silent(r, p) {
                continue;
            }
            if self.silent_since(r, p) + self.sc.heartbeat_ns <= self.q.now() {
                self.peer_lost(r, p, "heartbeat silence while frozen");
            } else {
                self.detect(r, p);
            }
        }
        if self.running(r) {
            self.drive(r, Input::Tick);
        }
        for k in std::mem::take(&mut self.nodes[r as usize].deferred) {
            self.q.push(self.q.now(), k);
        }
    }
}
