//! Which accepted connections may sit in their handshake: sans-IO, the listener's bookkeeping.
//!
//! Owns: the bound on connections that have not proven knowledge of the DVM secret yet, and
//! which one gives way when a new one arrives at the bound. Never: sockets, the handshake.
//!
//! Rule: a new connection is always admitted; at the bound, the *oldest* unproven connection
//! is evicted (closed) to make room. Anyone who can reach the port can open connections and
//! hold them idle, so a rule that refuses newcomers at the bound (the transport's first one)
//! lets strangers starve the daemons: a repair's reconnects were refused and healthy daemons
//! were dropped (issue 29). Under this rule a newcomer can only be evicted by `bound` *later*
//! arrivals while its own handshake runs (two round trips, about a millisecond on a LAN), so
//! starving a daemon takes a flood of `bound` connections per handshake time, not a few hundred
//! idle sockets. Chosen over a per-source limit (every daemon on a host, and every stranger on
//! it, share one address: on loopback all of them) and over a short first-byte deadline alone
//! (strangers that reconnect when closed keep every slot full; a deadline short enough to help
//! would also cut a real peer that is slow to be scheduled, e.g. right after a pause).
//!
//! Invariants: at most `bound` connections are pending at once; tickets are handed out in
//! arrival order and never reused; a finished or evicted ticket is gone.

use std::collections::BTreeMap;

/// The connections of one listener still in their handshake, oldest first.
#[derive(Debug)]
pub struct Admission<T> {
    bound: usize,
    next: u64,
    pending: BTreeMap<u64, T>,
}

/// A pending connection's place in arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(u64);

impl<T> Admission<T> {
    /// At most `bound` pending connections (at least 1).
    pub fn new(bound: usize) -> Admission<T> {
        Admission { bound: bound.max(1), next: 0, pending: BTreeMap::new() }
    }

    /// Admit a new connection with `handle` (what closes it). Returns its ticket and, at the
    /// bound, the oldest pending connection's, which the caller must close.
    pub fn admit(&mut self, handle: T) -> (Ticket, Option<(Ticket, T)>) {
        let evicted =
            if self.pending.len() >= self.bound { self.pending.pop_first().map(|(t, h)| (Ticket(t), h)) } else { None };
        let t = self.next;
        self.next += 1;
        self.pending.insert(t, handle);
        (Ticket(t), evicted)
    }

    /// The connection's handshake ended (proven, failed or timed out); `None` if it had been
    /// evicted.
    pub fn finished(&mut self, ticket: Ticket) -> Option<T> {
        self.pending.remove(&ticket.0)
    }

    /// Connections pending now.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn bound(&self) -> usize {
        self.bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule before: refuse a newcomer at the bound. Returns whether it is admitted.
    fn refuse_at_bound(pending: &mut usize, bound: usize) -> bool {
        if *pending >= bound {
            return false;
        }
        *pending += 1;
        true
    }

    #[test]
    fn a_newcomer_is_admitted_when_idle_strangers_hold_every_slot() {
        let bound = 256;
        let mut a = Admission::new(bound);
        let mut old = 0;
        // 300 strangers connect and never speak.
        let strangers: Vec<Ticket> = (0..300).map(|i| a.admit(("stranger", i)).0).collect();
        for _ in 0..300 {
            refuse_at_bound(&mut old, bound);
        }
        assert_eq!(a.len(), bound);
        // A daemon reconnecting during a repair.
        assert!(!refuse_at_bound(&mut old, bound), "the old rule refuses the daemon");
        let (daemon, evicted) = a.admit(("daemon", 0));
        let (_, gone) = evicted.expect("at the bound, someone gives way");
        assert_eq!(gone, ("stranger", 44), "the oldest pending stranger gives way");
        assert_eq!(a.len(), bound);
        assert_eq!(a.finished(daemon), Some(("daemon", 0)), "the daemon's handshake ran to its end");
        // The first 44 strangers were evicted as the others arrived.
        assert!(strangers[..45].iter().all(|&t| a.finished(t).is_none()));
        assert!(strangers[45..].iter().all(|&t| a.finished(t).is_some()));
        assert!(a.is_empty());
    }

    #[test]
    fn a_newcomer_is_evicted_only_after_bound_later_arrivals() {
        for bound in [1, 2, 7, 64] {
            let mut a = Admission::new(bound);
            let (me, _) = a.admit(0usize);
            for later in 1..bound {
                assert!(a.admit(later).1.is_none(), "bound {bound}: evicted at {later}");
            }
            let (_, evicted) = a.admit(bound);
            assert_eq!(evicted, Some((me, 0)), "bound {bound}");
        }
    }

    #[test]
    fn finished_connections_free_their_slot() {
        let mut a = Admission::new(2);
        let (x, _) = a.admit('x');
        let (_, _) = a.admit('y');
        assert_eq!(a.finished(x), Some('x'));
        assert_eq!(a.finished(x), None, "a ticket is gone once finished");
        assert!(a.admit('z').1.is_none());
        assert_eq!(a.len(), 2);
        assert_eq!(Admission::<()>::new(0).bound(), 1);
    }
}
