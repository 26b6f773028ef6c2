//! The event queue both engines run on: virtual time, events ordered by `(time, insertion)`,
//! a count of the events that are not idle (timer ticks), the hard limits that turn a livelock
//! or a message storm into a named engine error instead of a hung test, and the event log of
//! `replay --log`.
//!
//! Invariants: time never goes back (an event pushed into the past runs now); two events at
//! the same time run in the order they were pushed, so a seed fixes the order. Traps: an
//! engine stops when only idle events are left — a kind wrongly counted idle ends runs early.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Ev<K> {
    at: u64,
    seq: u64,
    kind: K,
}

impl<K> PartialEq for Ev<K> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl<K> Eq for Ev<K> {}
impl<K> PartialOrd for Ev<K> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<K> Ord for Ev<K> {
    // Reversed: BinaryHeap is a max-heap, the earliest event must come out first.
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Pending events of kind `K` and the virtual clock they advance.
pub(crate) struct EventQueue<K> {
    now: u64,
    seq: u64,
    heap: BinaryHeap<Ev<K>>,
    /// Which kinds are idle (timer ticks): they alone never keep a run going.
    idle: fn(&K) -> bool,
    /// Events in the heap that are not idle.
    busy: u64,
    /// Past this time (4x the scenario's bound) or this many events, the run stops.
    hard_stop: u64,
    bound_ns: u64,
    max_events: u64,
    /// Events popped so far (the one that hit a limit included).
    handled: u64,
    /// Why the run stopped early, once a limit was hit.
    overrun: Option<String>,
    /// Event log for `replay --log` (off in campaigns).
    log: Option<Vec<String>>,
}

impl<K> EventQueue<K> {
    /// An empty queue at time 0 for a scenario bounded by `bound_ns`; `idle` says which kinds
    /// are idle.
    pub(crate) fn new(idle: fn(&K) -> bool, bound_ns: u64, max_events: u64) -> Self {
        EventQueue {
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
            idle,
            busy: 0,
            hard_stop: bound_ns.saturating_mul(4),
            bound_ns,
            max_events,
            handled: 0,
            overrun: None,
            log: None,
        }
    }

    /// Virtual time of the event being handled (ns).
    pub(crate) fn now(&self) -> u64 {
        self.now
    }

    /// Schedule `kind` at `at`, or now if `at` has passed.
    pub(crate) fn push(&mut self, at: u64, kind: K) {
        if !(self.idle)(&kind) {
            self.busy += 1;
        }
        self.seq += 1;
        self.heap.push(Ev { at: at.max(self.now), seq: self.seq, kind });
    }

    /// The earliest event; the clock moves to its time. `None` when no event is left, or when
    /// this one is past a hard limit (then [`Self::overrun`] says which).
    pub(crate) fn pop(&mut self) -> Option<K> {
        if self.overrun.is_some() {
            return None;
        }
        let ev = self.heap.pop()?;
        if !(self.idle)(&ev.kind) {
            self.busy -= 1;
        }
        self.now = ev.at;
        self.handled += 1;
        if self.now > self.hard_stop {
            self.overrun = Some(format!(
                "still running at t={} ns, 4x past the bound of {} ns (livelock?)",
                self.now, self.bound_ns
            ));
        } else if self.handled > self.max_events {
            self.overrun = Some(format!("more than {} events at t={} ns (message storm?)", self.max_events, self.now));
        }
        self.overrun.is_none().then_some(ev.kind)
    }

    /// Nothing but idle events is pending.
    pub(crate) fn only_idle_left(&self) -> bool {
        self.busy == 0
    }

    /// Events popped so far, the one that hit a limit included.
    pub(crate) fn handled(&self) -> u64 {
        self.handled
    }

    /// Why the run stopped although events were pending: the hard limit it hit.
    pub(crate) fn overrun(&self) -> Option<&str> {
        self.overrun.as_deref()
    }

    /// Start recording [`Self::note`] lines.
    pub(crate) fn enable_log(&mut self) {
        self.log = Some(Vec::new());
    }

    /// Log one line, stamped with the time, if the log is on (`line` runs only then).
    pub(crate) fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(log) = &mut self.log {
            log.push(format!("t={:>10} {}", self.now, line()));
        }
    }

    /// The lines logged so far (empty when the log is off).
    pub(crate) fn take_log(&mut self) -> Vec<String> {
        self.log.take().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_then_insertion_order_and_idle_not_counted() {
        let mut q = EventQueue::new(|k: &(char, bool)| k.1, 100, 10);
        q.push(20, ('a', false));
        q.push(10, ('b', true));
        q.push(20, ('c', false));
        q.push(10, ('d', false));
        assert!(!q.only_idle_left());
        let mut got = Vec::new();
        while let Some(k) = q.pop() {
            got.push((q.now(), k.0));
            // Pushed into the past: runs now, after what is already due now.
            if k.0 == 'd' {
                q.push(0, ('e', false));
            }
        }
        assert_eq!(got, [(10, 'b'), (10, 'd'), (10, 'e'), (20, 'a'), (20, 'c')]);
        assert!(q.only_idle_left());
        q.push(5, ('f', true));
        assert!(q.only_idle_left(), "an idle event alone keeps nothing busy");
        assert_eq!((q.handled(), q.overrun()), (5, None));
    }

    #[test]
    fn limits_stop_the_run_and_say_why() {
        let mut q = EventQueue::new(|_: &u32| false, 100, 3);
        for k in 0..5 {
            q.push(k.into(), k);
        }
        assert_eq!([q.pop(), q.pop(), q.pop(), q.pop(), q.pop()], [Some(0), Some(1), Some(2), None, None]);
        assert_eq!(q.handled(), 4);
        assert_eq!(q.overrun(), Some("more than 3 events at t=3 ns (message storm?)"));

        let mut q = EventQueue::new(|_: &u32| false, 100, 1000);
        q.push(400, 1);
        q.push(401, 2);
        assert_eq!(q.pop(), Some(1), "4x the bound is still allowed");
        assert_eq!(q.pop(), None);
        assert_eq!(q.overrun(), Some("still running at t=401 ns, 4x past the bound of 100 ns (livelock?)"));
    }
}
