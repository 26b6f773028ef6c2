//! When a connection's silence means its peer is gone: the read-idle rule, sans-IO (every
//! input carries `now`; nothing here reads a clock or touches a socket).
//!
//! Owns: how long a peer has been silent *as this daemon could observe it*, and when to look
//! again. Never: sockets, timers, or what a loss means for the tree.
//!
//! Rule: any byte received (a heartbeat, a frame, the middle of a long frame) restarts the
//! silence. The owner wakes the rule every [`ReadIdle::next_wake`] (a tick of a quarter
//! heartbeat, or the deadline if sooner) and compares when it woke with when it asked to:
//! - late by less than a heartbeat period (scheduling jitter, a busy loop): the lateness is not
//!   counted as the peer's silence, so a starved daemon stretches its bound by exactly the time
//!   it could not run, and still detects a silent peer;
//! - late by a heartbeat period or more (the process was stopped, paused with its VM or
//!   container, or starved for that long): this daemon cannot tell what its peers did
//!   meanwhile (they may have been paused with it), so their silence counts from now: a fresh
//!   bound to speak. Peers that were paused with it send a heartbeat as soon as they resume.
//!
//! Invariants: a peer that sends nothing while this daemon runs on schedule is declared silent
//! once `bound` has passed since the later of its last byte and this daemon's last stall; the
//! tick never lets an unnoticed stall exceed a quarter heartbeat plus a heartbeat.
//!
//! Trap: CLOCK_MONOTONIC (tokio's `Instant`) advances while a process is stopped (SIGSTOP)
//! but not while the machine is suspended; a stall is only ever seen as a late wake-up of this
//! rule's own timer, never by comparing against a peer's clock.

use std::time::{Duration, Instant};

/// The read-idle state of one connection.
#[derive(Debug, Clone)]
pub struct ReadIdle {
    bound: Duration,
    tick: Duration,
    stall: Duration,
    /// Silence counts from here: the last byte, or the end of this daemon's last stall.
    quiet_since: Instant,
    /// When the owner was asked to wake the rule next.
    wake_at: Instant,
}

/// A peer silent past the bound, in time this daemon ran on schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silent {
    pub for_: Duration,
    pub bound: Duration,
}

/// What a wake-up found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Nothing to report; wake again at [`ReadIdle::next_wake`].
    Quiet,
    /// This daemon's timer fired this late: it was stopped or starved, and the peer gets a
    /// fresh bound from now.
    Stalled { late: Duration },
    /// The peer was silent for the bound while this daemon ran.
    Silent(Silent),
}

impl ReadIdle {
    /// A connection that starts (heard) at `now`, lost after `heartbeat * misses` of silence.
    /// `misses` of 0 is treated as 1.
    pub fn new(heartbeat: Duration, misses: u32, now: Instant) -> ReadIdle {
        let bound = heartbeat * misses.max(1);
        let tick = (heartbeat / 4).max(Duration::from_millis(1));
        let mut r = ReadIdle { bound, tick, stall: heartbeat, quiet_since: now, wake_at: now };
        r.wake_at = r.next_after(now);
        r
    }

    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// Bytes arrived from the peer.
    pub fn heard(&mut self, now: Instant) {
        self.quiet_since = self.quiet_since.max(now);
    }

    /// When the owner must call [`ReadIdle::wake`] next.
    pub fn next_wake(&self) -> Instant {
        self.wake_at
    }

    /// The timer asked for by [`ReadIdle::next_wake`] fired at `now`.
    pub fn wake(&mut self, now: Instant) -> Wake {
        let late = now.saturating_duration_since(self.wake_at);
        let mut out = Wake::Quiet;
        if late >= self.stall {
            self.quiet_since = self.quiet_since.max(now);
            out = Wake::Stalled { late };
        } else {
            self.quiet_since = (self.quiet_since + late).min(now).max(self.quiet_since);
        }
        let silent = now.saturating_duration_since(self.quiet_since);
        if silent >= self.bound {
            return Wake::Silent(Silent { for_: silent, bound: self.bound });
        }
        self.wake_at = self.next_after(now);
        out
    }

    fn next_after(&self, now: Instant) -> Instant {
        (now + self.tick).min(self.quiet_since + self.bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HB: Duration = Duration::from_millis(500);
    const MISSES: u32 = 3;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Drive the rule on schedule (each wake exactly when asked, plus `jitter`) until `until`,
    /// hearing from the peer at the instants in `heard`; return the first verdict other than
    /// `Quiet` with the time it came.
    fn run(
        r: &mut ReadIdle,
        t0: Instant,
        until: Duration,
        heard: &[Duration],
        jitter: Duration,
    ) -> Option<(Duration, Wake)> {
        let mut heard = heard.iter().copied().peekable();
        loop {
            let at = r.next_wake() + jitter;
            while let Some(h) = heard.next_if(|h| t0 + *h <= at) {
                r.heard(t0 + h);
            }
            if at > t0 + until {
                return None;
            }
            match r.wake(at) {
                Wake::Quiet => {}
                w => return Some((at - t0, w)),
            }
        }
    }

    #[test]
    fn silent_peer_is_declared_at_the_bound() {
        let t0 = Instant::now();
        let mut r = ReadIdle::new(HB, MISSES, t0);
        let (at, w) = run(&mut r, t0, ms(10_000), &[ms(300), ms(800)], Duration::ZERO).unwrap();
        assert_eq!(at, ms(800) + HB * MISSES);
        assert_eq!(w, Wake::Silent(Silent { for_: HB * MISSES, bound: HB * MISSES }));
    }

    #[test]
    fn a_peer_that_keeps_speaking_is_never_silent() {
        let t0 = Instant::now();
        let mut r = ReadIdle::new(HB, MISSES, t0);
        let beats: Vec<Duration> = (1..100).map(|i| HB * i).collect();
        assert_eq!(run(&mut r, t0, HB * 99, &beats, ms(3)), None);
    }

    #[test]
    fn jitter_below_a_heartbeat_only_stretches_the_bound_by_the_lateness() {
        // Every wake 40 ms late (a starved loop): a silent peer is still declared, after the
        // bound measured in time this daemon ran.
        let t0 = Instant::now();
        let mut r = ReadIdle::new(HB, MISSES, t0);
        let (at, w) = run(&mut r, t0, ms(10_000), &[], ms(40)).unwrap();
        assert!(matches!(w, Wake::Silent(s) if s.for_ == HB * MISSES), "{w:?}");
        let ticks = (HB * MISSES).as_millis() / (HB / 4).as_millis();
        assert_eq!(at, HB * MISSES + ms(40) * ticks as u32);
    }

    /// The rule the transport had before: silence counted in wall time since the last byte.
    fn wall_clock_rule(last_byte: Instant, now: Instant) -> bool {
        now - last_byte >= HB * MISSES
    }

    #[test]
    fn a_pause_of_this_daemon_gives_the_peer_a_fresh_bound() {
        let t0 = Instant::now();
        let mut r = ReadIdle::new(HB, MISSES, t0);
        // Heard at 1.0 s; the whole DVM stops at 1.2 s for 3x the bound; resumes at 5.7 s.
        r.heard(t0 + ms(1000));
        assert_eq!(run(&mut r, t0, ms(1200), &[], Duration::ZERO), None);
        let resume = t0 + ms(1200) + HB * MISSES * 3;
        assert!(wall_clock_rule(t0 + ms(1000), resume), "the old rule blames the peer at once");
        let due = r.next_wake();
        assert_eq!(r.wake(resume), Wake::Stalled { late: resume - due });
        // The peer, resumed too, speaks 300 ms later: never silent.
        assert_eq!(r.wake(resume + ms(1)), Wake::Quiet);
        r.heard(resume + ms(300));
        let t = resume - t0;
        let beats: Vec<Duration> = (0..20).map(|i| t + ms(300) + HB * i).collect();
        assert_eq!(run(&mut r, t0, t + HB * 19, &beats, Duration::ZERO), None);
    }

    #[test]
    fn a_peer_that_stays_frozen_after_the_resume_is_lost_one_bound_later() {
        let t0 = Instant::now();
        let mut r = ReadIdle::new(HB, MISSES, t0);
        let resume = t0 + ms(20_000);
        assert!(matches!(r.wake(resume), Wake::Stalled { .. }));
        let (at, w) = run(&mut r, t0, ms(40_000), &[], Duration::ZERO).unwrap();
        assert_eq!(at, ms(20_000) + HB * MISSES);
        assert!(matches!(w, Wake::Silent(_)));
    }

    #[test]
    fn a_stall_just_below_a_heartbeat_is_not_counted_as_silence() {
        // Stopped for 490 ms right after a tick: the lateness is discounted.
        let t0 = Instant::now();
        let mut r = ReadIdle::new(HB, MISSES, t0);
        let at = r.next_wake();
        assert_eq!(r.wake(at + ms(490)), Wake::Quiet);
        let (when, _) = run(&mut r, t0, ms(10_000), &[], Duration::ZERO).unwrap();
        assert_eq!(when, HB * MISSES + ms(490));
    }

    #[test]
    fn bytes_heard_late_never_move_the_silence_back() {
        let t0 = Instant::now();
        let mut r = ReadIdle::new(HB, MISSES, t0);
        r.heard(t0 + ms(900));
        r.heard(t0 + ms(100));
        let (at, _) = run(&mut r, t0, ms(10_000), &[], Duration::ZERO).unwrap();
        assert_eq!(at, ms(900) + HB * MISSES);
    }
}
