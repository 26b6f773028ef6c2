//! Every timer a daemon has beyond the collectives' deadlines, in one table keyed by what it
//! is for. The shell sleeps until [`crate::Node::poll_timeout`] and calls
//! [`crate::Node::handle_timeout`]; nothing else wakes the daemon up by time.
//!
//! Never: a clock. `at` is the caller's `now` plus a duration, in ns.
//! Invariants: one deadline per key (setting a key again moves it); a timer that fired is
//! gone from the table before its expiry is acted on.

use std::collections::{BTreeMap, BTreeSet};

/// What a timer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Timer {
    /// HNP: the boot must have finished by then (`--startup-timeout`).
    Startup,
    /// HNP: a job's `--timeout`.
    JobTimeout(u32),
    /// HNP: a rank that called PMIx_Abort has had its grace to exit by itself.
    AbortGrace { jobid: u32, rank: u32 },
    /// HNP: the jobs ended by a termination have had their grace; stop the daemons.
    TerminateGrace,
    /// HNP: TERMINATE has not reached every daemon by then; the HNP ends regardless (the
    /// daemons it did not reach lose it and end too).
    TerminateDeadline,
    /// HNP: a waiting data-server lookup (its token) gives up.
    Lookup(u64),
    /// HNP: a daemon declared dead has had its chance to hear `Evicted`; its connections are
    /// closed, so one that is alive but out of the DVM loses the HNP and ends.
    Disconnect(u32),
    /// HNP: a stack-trace query (its id) stops waiting for daemons that did not answer.
    Stacks(u64),
}

/// The daemon's timers.
#[derive(Debug, Default)]
pub struct Timers {
    by_key: BTreeMap<Timer, u64>,
    by_time: BTreeSet<(u64, Timer)>,
}

impl Timers {
    /// Arm `t` to fire at `at` (moving it if it was armed).
    pub fn set(&mut self, t: Timer, at: u64) {
        if let Some(old) = self.by_key.insert(t, at) {
            self.by_time.remove(&(old, t));
        }
        self.by_time.insert((at, t));
    }

    /// Disarm `t` (nothing if it is not armed).
    pub fn cancel(&mut self, t: Timer) {
        if let Some(at) = self.by_key.remove(&t) {
            self.by_time.remove(&(at, t));
        }
    }

    pub fn is_armed(&self, t: Timer) -> bool {
        self.by_key.contains_key(&t)
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<u64> {
        self.by_time.first().map(|(at, _)| *at)
    }

    /// Remove and return the first timer due at `now`, earliest first.
    pub fn pop_expired(&mut self, now: u64) -> Option<Timer> {
        let &(at, t) = self.by_time.first()?;
        if at > now {
            return None;
        }
        self.by_time.remove(&(at, t));
        self.by_key.remove(&t);
        Some(t)
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_fire_in_order_once_and_a_moved_timer_fires_at_its_new_time() {
        let mut t = Timers::default();
        t.set(Timer::JobTimeout(1), 50);
        t.set(Timer::Startup, 10);
        t.set(Timer::Lookup(7), 30);
        t.set(Timer::JobTimeout(1), 5); // moved earlier
        t.cancel(Timer::Lookup(7));
        assert_eq!(t.next(), Some(5));
        assert_eq!(t.pop_expired(4), None);
        assert_eq!(t.pop_expired(100), Some(Timer::JobTimeout(1)));
        assert_eq!(t.pop_expired(100), Some(Timer::Startup));
        assert_eq!(t.pop_expired(100), None);
        assert!(t.is_empty());
    }
}
