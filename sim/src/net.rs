//! The link cost model: latency α per message, β per byte on the sender's egress (and the
//! receiver's ingress), a per-message receive CPU cost, and seeded jitter that never breaks
//! per-link FIFO order; the carrier state (`Carrier`: when each NIC, CPU and link is next
//! free) that applies it in both engines.

use std::collections::BTreeMap;

use dvm_grpcomm::Rank;
use rand::seq::SliceRandom;
use rand::Rng;

/// Cost parameters of the simulated network. Times are virtual nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetModel {
    /// Latency per message (α).
    pub alpha_ns: u64,
    /// Transfer cost per byte (β) in picoseconds: 1000 ps/byte is 1 GB/s.
    pub beta_ps_per_byte: u64,
    /// Receive handling per message at every daemon, relays included (serialized per daemon).
    pub cpu_ns: u64,
    /// Largest extra random delay added to one message (uniform in `0..=jitter_ns`).
    pub jitter_ns: u64,
    /// The receiver's inbound link is also busy `bytes·β` per message (one NIC per daemon).
    pub ingress_serialized: bool,
}

impl NetModel {
    /// α = 50 µs, 1 GB/s, 100 ns of receive handling, no jitter.
    pub fn projection_default() -> Self {
        NetModel { alpha_ns: 50_000, beta_ps_per_byte: 1_000, cpu_ns: 100, jitter_ns: 0, ingress_serialized: true }
    }

    /// The network of a generated schedule: α = 50 µs, 1 GB/s, and from `rng` (in this order)
    /// the jitter, the receive cost and whether ingress is serialized.
    pub fn generated(rng: &mut impl Rng) -> Self {
        let alpha = 50_000u64;
        let jitter = *[0, alpha / 10, alpha, 3 * alpha].choose(rng).unwrap();
        let cpu = *[0u64, 1_000, 5_000].choose(rng).unwrap();
        NetModel {
            alpha_ns: alpha,
            beta_ps_per_byte: 1_000,
            cpu_ns: cpu,
            jitter_ns: jitter,
            ingress_serialized: rng.gen_bool(0.5),
        }
    }

    /// One fence round trip on a tree of `height` whose daemons have `fanout` children,
    /// roughly, with everything slow at once (small messages; used to size bounds).
    pub fn round_ns(&self, height: u64, fanout: u64) -> u64 {
        2 * (height + 1) * (self.alpha_ns + self.jitter_ns) + 2 * (height + 1) * fanout * (self.cpu_ns + 1_000)
    }

    /// Time the link is busy with `bytes` bytes.
    pub fn wire_ns(&self, bytes: usize) -> u64 {
        ((bytes as u128 * self.beta_ps_per_byte as u128) / 1_000) as u64
    }
}

/// Messages up to this size (a packet or two) do not wait for the receiver's inbound link.
pub const SMALL_MESSAGE: usize = 1500;

/// When each daemon's NIC (out and in) and receive CPU are next free, and when the last
/// message on each `(from, to)` link arrives: the timing state of the carrier, for both engines.
pub(crate) struct Carrier {
    egress_free: Vec<u64>,
    ingress: Vec<Ingress>,
    cpu_free: Vec<u64>,
    /// Arrival time of the last message on each (from, to) link: keeps every link FIFO.
    link_last: BTreeMap<(Rank, Rank), u64>,
}

impl Carrier {
    /// Every NIC and CPU of `n` daemons idle, no message sent yet.
    pub(crate) fn new(n: u32) -> Self {
        let idle = vec![0; n as usize];
        Carrier {
            egress_free: idle.clone(),
            ingress: (0..n).map(|_| Ingress::default()).collect(),
            cpu_free: idle,
            link_last: BTreeMap::new(),
        }
    }

    /// Put `bytes` bytes on the link `from -> to` at `now`: returns when they start to leave
    /// the sender and when they arrive. Draws the jitter (only if there is any) from `rng`.
    pub(crate) fn send(
        &mut self,
        net: &NetModel,
        rng: &mut impl Rng,
        now: u64,
        from: Rank,
        to: Rank,
        bytes: usize,
    ) -> (u64, u64) {
        let wire = net.wire_ns(bytes);
        let jitter = if net.jitter_ns > 0 { rng.gen_range(0..=net.jitter_ns) } else { 0 };
        let egress = &mut self.egress_free[from as usize];
        let start = (*egress).max(now);
        *egress = start + wire;
        let mut arrive = start + wire + net.alpha_ns + jitter;
        // A message of a packet or two interleaves with whatever else is arriving (it waits
        // for a packet, not for a whole message); larger ones take the link in turn.
        if net.ingress_serialized && bytes > SMALL_MESSAGE {
            arrive = self.ingress[to as usize].place(now, arrive - wire, wire);
        }
        let last = self.link_last.entry((from, to)).or_insert(0);
        arrive = arrive.max(*last);
        *last = arrive;
        (start, arrive)
    }

    /// A message reached `to` at `now`: when `to` has handled it (receives are serialized).
    pub(crate) fn handled_at(&mut self, net: &NetModel, now: u64, to: Rank) -> u64 {
        let cpu = &mut self.cpu_free[to as usize];
        *cpu = (*cpu).max(now) + net.cpu_ns;
        *cpu
    }
}

/// The busy intervals of one daemon's inbound link: sorted, disjoint, each `[start, end)` of
/// virtual time during which one message's bytes arrive.
///
/// Intervals rather than a single "free from" time: a message is placed when it is sent, which
/// may be long before its bytes leave a sender with a queue (the HNP's scatter queues one
/// message per child). Its interval must not block the receiver's link before it starts: a
/// message placed later but ready earlier arrives in the gap, as its packets would.
#[derive(Debug, Default)]
struct Ingress {
    busy: Vec<(u64, u64)>,
}

impl Ingress {
    /// Place `wire` ns of arrival at the earliest free time at or after `ready`; returns when
    /// the last byte has arrived. Intervals that ended by `now` are forgotten (every later
    /// message is ready at or after `now`).
    fn place(&mut self, now: u64, ready: u64, wire: u64) -> u64 {
        self.busy.retain(|&(_, end)| end > now);
        let mut at = ready;
        let mut idx = self.busy.len();
        for (i, &(start, end)) in self.busy.iter().enumerate() {
            if end <= at {
                continue;
            }
            if at + wire <= start {
                idx = i;
                break;
            }
            at = end;
        }
        self.busy.insert(idx, (at, at + wire));
        at + wire
    }
}

#[cfg(test)]
mod tests {
    use super::Ingress;

    #[test]
    fn ingress_fills_gaps_and_never_overlaps() {
        let mut g = Ingress::default();
        // A message queued behind a long egress: its bytes arrive at 1000..1100.
        assert_eq!(g.place(0, 1000, 100), 1100);
        // Ready at 10: fits before it.
        assert_eq!(g.place(5, 10, 50), 60);
        // Ready at 950, 100 long: does not fit before 1000, goes after 1100.
        assert_eq!(g.place(20, 950, 100), 1200);
        // Ready at 60, exactly fills up to 1000 (940 long).
        assert_eq!(g.place(30, 60, 940), 1000);
        let busy = g.busy.clone();
        for w in busy.windows(2) {
            assert!(w[0].1 <= w[1].0, "{busy:?}");
        }
        // Intervals that ended are forgotten.
        assert_eq!(g.place(1150, 1150, 10), 1210);
        assert!(g.busy.iter().all(|&(_, e)| e > 1150));
    }
}
