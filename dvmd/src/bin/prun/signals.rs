//! prun's signal handling: SIGINT/SIGTERM end the job, SIGUSR1/SIGUSR2 are forwarded to it;
//! the signals are held from prun's first instruction until the handlers are installed.
//!
//! Never acts on a signal itself: it reports which one came. Do not break: a signal that
//! arrives while nobody waits is kept until the next `Signals::next`.

use anyhow::Result;
use nix::sys::signal::{SigSet, Signal};
use tokio::signal::unix::{signal, SignalKind};

/// The signals prun catches: SIGINT and SIGTERM end the job, SIGUSR1 and SIGUSR2 are forwarded.
pub(super) fn handled() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGUSR1, Signal::SIGUSR2] {
        set.add(s);
    }
    set
}

pub(super) fn hold_signals() {
    let _ = handled().thread_block();
}

pub(super) fn release_signals() {
    let _ = handled().thread_unblock();
}

/// SIGINT and SIGTERM end the job; other caught signals are forwarded to it.
pub(super) fn ends_job(sig: i32) -> bool {
    sig == libc::SIGINT || sig == libc::SIGTERM
}

/// prun's signal handlers, installed once before anything starts. A signal that arrives while
/// nobody waits on it is kept until the next [`Signals::next`].
pub(super) struct Signals {
    pub(super) int: tokio::signal::unix::Signal,
    pub(super) term: tokio::signal::unix::Signal,
    pub(super) usr1: tokio::signal::unix::Signal,
    pub(super) usr2: tokio::signal::unix::Signal,
}

impl Signals {
    pub(super) fn install() -> Result<Signals> {
        let s = Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
        };
        release_signals();
        Ok(s)
    }

    pub(super) async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.usr1.recv() => libc::SIGUSR1,
            _ = self.usr2.recv() => libc::SIGUSR2,
        }
    }

    /// The next SIGINT or SIGTERM (others are dropped: there is no job to forward them to).
    pub(super) async fn next_ending(&mut self) -> i32 {
        loop {
            let sig = self.next().await;
            if ends_job(sig) {
                return sig;
            }
        }
    }

    /// A SIGINT or SIGTERM that already arrived, without waiting.
    pub(super) async fn ending_now(&mut self) -> Option<i32> {
        tokio::select! {
            biased;
            sig = self.next_ending() => Some(sig),
            () = std::future::ready(()) => None,
        }
    }
}
