//! The unit and property tests' carrier over a [`Net`]: one FIFO queue per directed link, a
//! seeded choice of which link delivers next, and the record of what every daemon reported
//! (fences done, broadcasts delivered, drops); plus the scenario helpers (crash, repair,
//! drive a plan of fences).
//!
//! Never routes or applies carrier rules itself (that is [`Net`]'s). Do not break: the only
//! randomness is [`XorShift`] seeded at construction, so a run is reproducible from its seed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;

use crate::{Config, FenceError, FenceId, FenceRequest, FenceSignature, Grpcomm, Participants, Rank, XcastId};

use super::net::{Event, Frame, Net};

/// A seeded xorshift generator: the only randomness of [`Links`].
pub struct XorShift(u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform-ish in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A fence's result on one daemon.
pub type Outcome = (FenceId, Result<Bytes, FenceError>);

/// The tests' carrier over a [`Net`]: one FIFO queue per directed link, a seeded choice of
/// which link delivers next (or which daemon's driver confirms a held process-first op), a
/// refused send noticed at once; and the record of what every daemon reported.
pub struct Links {
    pub net: Net,
    queues: BTreeMap<(Rank, Rank), VecDeque<Frame>>,
    pub rng: XorShift,
    /// Crashed daemons: the failed set every survivor applies on [`Links::repair`].
    pub failed: BTreeSet<Rank>,
    /// Fences completed per daemon, in completion order.
    pub done: Vec<Vec<Outcome>>,
    /// Broadcast ops delivered per daemon, in order.
    pub delivered: Vec<Vec<(u64, Bytes)>>,
    /// Broadcasts started per daemon that completed.
    pub completed: Vec<Vec<XcastId>>,
    /// Scatter slices received per daemon: (origin, scatter id, tag, data).
    pub scattered: Vec<Vec<(Rank, u64, u32, Bytes)>>,
    /// Timers armed per daemon.
    pub timers: Vec<Vec<u64>>,
    /// Messages a daemon could not use: (daemon, from, reason).
    pub dropped: Vec<(Rank, Rank, String)>,
    /// Hops delivered so far.
    pub hops: u64,
    /// Frames handed to the grpcomm of their destination, in order (when `Some`).
    pub trace: Option<Vec<Frame>>,
    /// Frames that reached a daemon while it held a process-first op for its driver.
    pub held_across_traffic: usize,
    /// [`Links::drive`] crashes each of these daemons once this many hops were delivered
    /// (ascending), then repairs the survivors one by one at random moments.
    pub scheduled_crashes: Vec<(u64, Rank)>,
}

impl Links {
    /// `n` daemons of `Config::default()` on a tree of `radix`.
    pub fn new(n: u32, radix: u32, seed: u64) -> Self {
        Self::with_configs(n, radix, seed, |_| Config::default())
    }

    pub fn with_configs(n: u32, radix: u32, seed: u64, cfg: impl Fn(Rank) -> Config) -> Self {
        Links {
            net: Net::new(n, radix, cfg),
            queues: BTreeMap::new(),
            rng: XorShift::new(seed),
            failed: BTreeSet::new(),
            done: per_daemon(n),
            delivered: per_daemon(n),
            completed: per_daemon(n),
            scattered: per_daemon(n),
            timers: per_daemon(n),
            dropped: Vec::new(),
            hops: 0,
            trace: None,
            held_across_traffic: 0,
            scheduled_crashes: Vec::new(),
        }
    }

    pub fn size(&self) -> u32 {
        self.net.size()
    }

    pub fn live(&self) -> Vec<Rank> {
        self.net.live()
    }

    pub fn is_alive(&self, r: Rank) -> bool {
        self.net.is_alive(r)
    }

    pub fn node(&self, r: Rank) -> &Grpcomm {
        self.net.node(r)
    }

    /// Daemon `r`'s machine to drive by hand; [`Links::pump`] carries out what it did.
    pub fn node_mut(&mut self, r: Rank) -> &mut Grpcomm {
        self.net.node_mut(r)
    }

    /// Sends over lateral links so far.
    pub fn direct_sends(&self) -> u64 {
        self.net.stats.direct
    }

    /// Call into live daemon `r` and carry out what it does.
    pub fn with<T>(&mut self, r: Rank, f: impl FnOnce(&mut Grpcomm) -> T) -> T {
        let out = self.net.call(r, f);
        self.settle();
        out
    }

    pub fn start(&mut self, r: Rank, req: FenceRequest, now: u64) -> FenceId {
        self.with(r, |g| g.fence(req, now))
    }

    pub fn xcast(&mut self, r: Rank, tag: u32, payload: Bytes) -> XcastId {
        self.with(r, |g| g.xcast(tag, payload))
    }

    /// Carry out what daemon `r` did while driven through [`Links::node_mut`].
    pub fn pump(&mut self, r: Rank) {
        self.net.pump(r);
        self.settle();
    }

    pub fn tick(&mut self, r: Rank, now: u64) {
        self.net.tick(r, now);
        self.settle();
    }

    /// Daemon `r`'s driver confirms the process-first op it holds (false if none).
    pub fn confirm(&mut self, r: Rank) -> bool {
        let held = self.net.confirm(r);
        self.settle();
        held
    }

    /// Take every event the network reported: frames onto their links, refusals noticed at
    /// once, outcomes into the record.
    fn settle(&mut self) {
        while let Some(ev) = self.net.pop_event() {
            match ev {
                Event::Carry(f) => self.queues.entry((f.from, f.to)).or_default().push_back(f),
                Event::Refused { from, to } => self.net.unreachable(from, to),
                Event::Deliver { daemon, op_id, payload, .. } => self.delivered[daemon as usize].push((op_id, payload)),
                Event::XcastComplete { daemon, id, .. } => self.completed[daemon as usize].push(id),
                Event::FenceComplete { daemon, id, result } => self.done[daemon as usize].push((id, result)),
                Event::ScatterDeliver { daemon, origin, scatter_id, tag, data } => {
                    self.scattered[daemon as usize].push((origin, scatter_id, tag, data))
                }
                Event::ArmTimer { daemon, at } => self.timers[daemon as usize].push(at),
                Event::Dropped { daemon, from, reason } => self.dropped.push((daemon, from, reason)),
            }
        }
    }

    /// Frames queued on every link.
    pub fn pending_messages(&self) -> usize {
        self.queues.values().map(VecDeque::len).sum()
    }

    /// Links with a frame queued, ascending.
    pub fn busy_links(&self) -> Vec<(Rank, Rank)> {
        self.queues.iter().filter(|(_, q)| !q.is_empty()).map(|(&k, _)| k).collect()
    }

    /// Deliver the head of one link, or let one daemon's driver confirm its held
    /// process-first op, chosen at random; false when neither is possible.
    pub fn step(&mut self) -> bool {
        let busy = self.busy_links();
        let waiting: Vec<Rank> = self.live().into_iter().filter(|&r| self.net.unconfirmed(r).is_some()).collect();
        if busy.is_empty() && waiting.is_empty() {
            return false;
        }
        let pick = self.rng.below(busy.len() + waiting.len());
        match busy.get(pick) {
            Some(&(from, to)) => self.deliver_hop(from, to),
            None => {
                self.confirm(waiting[pick - busy.len()]);
            }
        }
        true
    }

    /// Deliver the frame at the head of link `from -> to` (which must have one).
    pub fn deliver_hop(&mut self, from: Rank, to: Rank) {
        let f = self.queues.get_mut(&(from, to)).and_then(VecDeque::pop_front).expect("a frame on this link");
        self.hops += 1;
        if self.net.is_alive(to) && f.dst == to {
            if self.net.unconfirmed(to).is_some() {
                self.held_across_traffic += 1;
            }
            if let Some(t) = self.trace.as_mut() {
                t.push(f.clone());
            }
        }
        self.net.arrive(f);
        self.settle();
    }

    /// Step until nothing moves.
    pub fn run(&mut self) {
        let mut steps = 0u64;
        while self.step() {
            steps += 1;
            assert!(steps < 10_000_000, "no quiescence after {steps} steps");
        }
    }

    /// Daemon `victim` crashes: frames queued toward it are lost; frames it already sent
    /// stay on their links. Nobody is told until [`Links::repair`] (or a refused send).
    pub fn crash(&mut self, victim: Rank) {
        self.net.crash(victim);
        self.failed.insert(victim);
        self.queues.retain(|&(_, to), _| to != victim);
    }

    /// Daemon `r` applies the failed set (every crash so far).
    pub fn repair(&mut self, r: Rank) {
        let failed = self.failed.clone();
        if let Some(res) = self.net.repair(r, &failed) {
            res.expect("repair");
        }
        self.settle();
    }

    /// Every survivor applies the failed set at once, in rank order.
    pub fn repair_all(&mut self) {
        for r in self.live() {
            self.repair(r);
        }
    }

    /// Crash `victim`, then repair the survivors one at a time in a random order, letting one
    /// frame through after each (a repair reaches daemons at different moments).
    pub fn crash_then_repair(&mut self, victim: Rank) {
        self.crash(victim);
        let mut unrepaired = self.live();
        while !unrepaired.is_empty() {
            let i = self.rng.below(unrepaired.len());
            self.repair(unrepaired.swap_remove(i));
            self.step();
        }
    }

    /// The connection between `a` and `b` (both alive) drops: frames queued on it both ways
    /// are lost and each end notices (no daemon failed, no repair). Returns the frames lost.
    pub fn lose_link(&mut self, a: Rank, b: Rank) -> usize {
        let lost = [(a, b), (b, a)].iter().filter_map(|k| self.queues.remove(k)).map(|q| q.len()).sum();
        self.net.unreachable(a, b);
        self.net.unreachable(b, a);
        self.settle();
        lost
    }

    /// No operation in flight on any live daemon.
    pub fn all_quiescent(&self) -> bool {
        self.live().into_iter().all(|r| self.node(r).is_quiescent())
    }

    /// Panics naming every broken driver rule on process-first tags.
    pub fn assert_driver_rules_kept(&self) {
        let v = &self.net.violations;
        assert!(v.is_empty(), "{} violation(s):\n{}", v.len(), v.join("\n"));
    }

    /// Start the fences of each daemon's plan in order, interleaved at random with
    /// deliveries and the [`Links::scheduled_crashes`] (each followed by repairs reaching the
    /// survivors one by one at random moments). In sequential mode a daemon starts its next
    /// fence only after its previous one completed.
    pub fn drive(&mut self, mut plans: Vec<VecDeque<FenceRequest>>, sequential: bool) {
        let mut started: Vec<usize> = self.done.iter().map(Vec::len).collect();
        let mut unrepaired: Vec<Rank> = Vec::new();
        let mut rounds = 0u64;
        loop {
            rounds += 1;
            assert!(rounds < 10_000_000, "drive: no quiescence after {rounds} rounds");
            if let Some(&(at, victim)) = self.scheduled_crashes.first() {
                if self.hops >= at && unrepaired.is_empty() {
                    self.scheduled_crashes.remove(0);
                    self.crash(victim);
                    unrepaired = self.live();
                }
            }
            if !unrepaired.is_empty() && self.rng.below(4) == 0 {
                let i = self.rng.below(unrepaired.len());
                self.repair(unrepaired.swap_remove(i));
                continue;
            }
            let ready: Vec<usize> = (0..plans.len())
                .filter(|&r| !plans[r].is_empty() && self.is_alive(r as Rank))
                .filter(|&r| !sequential || self.done[r].len() == started[r])
                .collect();
            let msgs = self.pending_messages();
            if ready.is_empty() && msgs == 0 {
                if unrepaired.is_empty() && self.scheduled_crashes.is_empty() {
                    return;
                }
                if unrepaired.is_empty() {
                    let (_, victim) = self.scheduled_crashes.remove(0);
                    self.crash(victim);
                    unrepaired = self.live();
                }
                let r = unrepaired.pop().expect("non-empty");
                self.repair(r);
                continue;
            }
            if !ready.is_empty() && (msgs == 0 || self.rng.below(3) == 0) {
                let r = ready[self.rng.below(ready.len())];
                let req = plans[r].pop_front().expect("ready");
                started[r] += 1;
                self.start(r as Rank, req, 0);
            } else {
                self.step();
            }
        }
    }
}

fn per_daemon<T>(n: u32) -> Vec<Vec<T>> {
    (0..n).map(|_| Vec::new()).collect()
}

/// The daemons taking part in fences over `sig` on a DVM of `n`.
pub fn members(sig: &FenceSignature, n: u32) -> Vec<Rank> {
    match &sig.participants {
        Participants::All => (0..n).collect(),
        Participants::Daemons(d) => d.clone(),
    }
}
