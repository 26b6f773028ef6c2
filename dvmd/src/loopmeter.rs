//! How well the daemon's loop keeps time: how late its timers fire and how long one step (an
//! input handled and its effects carried out) holds the loop. A heartbeat can only go out
//! when the loop runs, so these are what decide whether a busy daemon looks dead to its peers.
//!
//! Owns: the figures (a histogram of timer lateness, the longest step) and the warning when
//! either passes a fraction of the heartbeat bound. Never: a decision; it only measures.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tracing::warn;

/// The loop wakes at least this often, so lateness is sampled even when nothing is due.
pub const PROBE: Duration = Duration::from_millis(250);

/// At most one warning per this long (a stalled machine would otherwise log every step).
const WARN_EVERY: Duration = Duration::from_secs(10);

pub use dvm_core::LoopStats;

pub struct LoopMeter {
    late: Histogram<u64>,
    longest_step: Duration,
    /// Warn when a timer fires this late or a step takes this long.
    warn_at: Duration,
    last_warning: Option<Instant>,
}

impl Default for LoopMeter {
    fn default() -> LoopMeter {
        LoopMeter::new(Duration::from_secs(5) / 4)
    }
}

impl LoopMeter {
    pub fn new(warn_at: Duration) -> LoopMeter {
        // 1 µs .. 1 hour at 3 significant digits.
        let late = Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
        LoopMeter { late, longest_step: Duration::ZERO, warn_at, last_warning: None }
    }

    /// Warn past a quarter of the heartbeat bound (heartbeat × misses); never without
    /// heartbeats (a zero bound).
    pub fn set_bound(&mut self, bound: Duration) {
        self.warn_at = if bound.is_zero() { Duration::MAX } else { bound / 4 };
    }

    /// A timer due at `due` fired at `now`.
    pub fn timer_fired(&mut self, due: Instant, now: Instant) {
        let late = now.saturating_duration_since(due);
        let _ = self.late.record((late.as_micros() as u64).clamp(1, 3_600_000_000));
        if late >= self.warn_at {
            self.warn(now, format_args!("a timer fired {} ms late", late.as_millis()));
        }
    }

    /// One step of the loop took `took`.
    pub fn step(&mut self, took: Duration, now: Instant) {
        self.longest_step = self.longest_step.max(took);
        if took >= self.warn_at {
            self.warn(now, format_args!("one step of the loop took {} ms", took.as_millis()));
        }
    }

    fn warn(&mut self, now: Instant, what: std::fmt::Arguments<'_>) {
        if self.last_warning.is_some_and(|t| now.saturating_duration_since(t) < WARN_EVERY) {
            return;
        }
        self.last_warning = Some(now);
        warn!(
            "{what}, past a quarter of the heartbeat bound ({} ms): the daemon was starved, stopped or busy; peers may see it as silent",
            self.warn_at.saturating_mul(4).as_millis()
        );
    }

    pub fn stats(&self) -> LoopStats {
        let q = |x: f64| if self.late.is_empty() { 0 } else { self.late.value_at_quantile(x) };
        LoopStats {
            late_p50_us: q(0.5),
            late_p99_us: q(0.99),
            late_max_us: if self.late.is_empty() { 0 } else { self.late.max() },
            longest_step_us: self.longest_step.as_micros() as u64,
            samples: self.late.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_and_steps_are_kept() {
        let mut m = LoopMeter::new(Duration::from_millis(100));
        assert_eq!(m.stats(), LoopStats::default());
        let t0 = Instant::now();
        for us in [10, 20, 30, 5000] {
            m.timer_fired(t0, t0 + Duration::from_micros(us));
        }
        m.step(Duration::from_millis(3), t0);
        m.step(Duration::from_millis(1), t0);
        // A timer that fired early counts as on time (1 µs, the histogram's floor).
        m.timer_fired(t0 + Duration::from_secs(1), t0);
        let s = m.stats();
        assert_eq!((s.samples, s.longest_step_us), (5, 3000));
        assert_eq!(s.late_p50_us, 20);
        assert!((4990..=5010).contains(&s.late_max_us), "{s:?}");
        assert!(s.late_p99_us >= 4990, "{s:?}");
    }
}
