//! Process-wide server state. libpmix's server is a singleton and its upcalls carry no host
//! context pointer, so the event sink lives in a static.
//!
//! Locking: upcalls and reply completions take the read lock; `init`/`finalize` take the write
//! lock, so no cbfunc runs concurrently with `PMIx_server_finalize` and no reply for a dead
//! server reaches libpmix. Nothing holding the read lock waits on libpmix's progress thread.

use std::cell::Cell;
use std::sync::{Arc, RwLock};

use crate::event::PmixEvent;

pub(crate) type Sink = dyn Fn(PmixEvent) + Send + Sync + 'static;

pub(crate) struct Shared {
    pub(crate) sink: Box<Sink>,
    pub(crate) generation: u64,
}

pub(crate) static STATE: RwLock<Option<Arc<Shared>>> = RwLock::new(None);

thread_local! {
    static IN_UPCALL: Cell<bool> = const { Cell::new(false) };
}

/// True while the current thread is inside one of our upcalls (libpmix progress thread).
pub(crate) fn in_upcall() -> bool {
    IN_UPCALL.with(|c| c.get())
}

pub(crate) struct UpcallGuard(bool);

impl UpcallGuard {
    pub(crate) fn enter() -> UpcallGuard {
        UpcallGuard(IN_UPCALL.with(|c| c.replace(true)))
    }
}

impl Drop for UpcallGuard {
    fn drop(&mut self) {
        let prev = self.0;
        IN_UPCALL.with(|c| c.set(prev));
    }
}

/// Runs `f` under the read lock if the server of `generation` is still initialized.
pub(crate) fn with_live_server(generation: u64, f: impl FnOnce()) -> bool {
    let guard = STATE.read().unwrap_or_else(|e| e.into_inner());
    match guard.as_ref() {
        Some(s) if s.generation == generation => {
            f();
            true
        }
        _ => false,
    }
}

/// The live server's state, if any (a clone: the sink is called without holding the lock).
pub(crate) fn current() -> Option<Arc<Shared>> {
    STATE.read().unwrap_or_else(|e| e.into_inner()).clone()
}
