//! Reply objects: a libpmix cbfunc + cbdata captured in an upcall, completed later from the
//! daemon's own thread.
//!
//! Invariants: a reply completes at most once (`complete` consumes it); a reply dropped
//! uncompleted completes with `PMIX_ERROR` so no client hangs; a reply completed (or dropped)
//! inside an upcall is handed to a helper thread, because calling a cbfunc inside its upcall
//! deadlocks libpmix; a reply that outlives its server is discarded without calling into
//! libpmix.

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Status, ERROR};
use crate::state;
use crate::sys;

type OpCb = unsafe extern "C" fn(sys::pmix_status_t, *mut c_void);
type ModexCb = unsafe extern "C" fn(
    sys::pmix_status_t,
    *const c_char,
    usize,
    *mut c_void,
    sys::pmix_release_cbfunc_t,
    *mut c_void,
);
type InfoCb = unsafe extern "C" fn(
    sys::pmix_status_t,
    *mut sys::pmix_info_t,
    usize,
    *mut c_void,
    sys::pmix_release_cbfunc_t,
    *mut c_void,
);

/// Byte buffers handed to a modex cbfunc that libpmix has not released yet.
static BUFFERS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// How many data buffers given to fence/modex cbfuncs libpmix still holds (each is freed by
/// libpmix's release callback). For leak checks in tests.
pub fn reply_buffers_in_flight() -> usize {
    BUFFERS_IN_FLIGHT.load(Ordering::SeqCst)
}

unsafe extern "C" fn release_bytes(cbdata: *mut c_void) {
    if !cbdata.is_null() {
        // SAFETY: cbdata is the Box<Vec<u8>> leaked in `Pending::fire`, released exactly once.
        drop(Box::from_raw(cbdata as *mut Vec<u8>));
        BUFFERS_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy)]
enum Callback {
    Op(OpCb),
    Modex(ModexCb),
    Info(InfoCb),
}

/// A captured callback. Raw pointers make it !Send by default; libpmix's cbfuncs are
/// thread-safe (they thread-shift into the progress thread), so moving it is sound.
struct Pending {
    cb: Callback,
    cbdata: *mut c_void,
    generation: u64,
    what: &'static str,
}

// SAFETY: see the type's comment; cbdata is only ever passed back to its own cbfunc.
unsafe impl Send for Pending {}

impl Pending {
    fn fire(self, status: Status, data: Vec<u8>) {
        if state::in_upcall() {
            tracing::warn!(reply = self.what, "reply completed inside a PMIx upcall; deferring to a helper thread");
            std::thread::spawn(move || self.fire(status, data));
            return;
        }
        let what = self.what;
        let delivered = state::with_live_server(self.generation, || {
            // SAFETY: the cbfunc/cbdata pair came from libpmix for this server generation,
            // the server is still initialized (read lock held) and this runs exactly once.
            unsafe { self.call(status, data) }
        });
        if !delivered {
            tracing::debug!(reply = what, "PMIx server finalized; reply discarded");
        }
    }

    unsafe fn call(self, status: Status, data: Vec<u8>) {
        match self.cb {
            Callback::Op(cb) => cb(status, self.cbdata),
            Callback::Info(cb) => cb(status, std::ptr::null_mut(), 0, self.cbdata, None, std::ptr::null_mut()),
            Callback::Modex(cb) => {
                if data.is_empty() {
                    cb(status, std::ptr::null(), 0, self.cbdata, None, std::ptr::null_mut());
                } else {
                    // The bytes must stay valid until libpmix calls release_bytes.
                    let buf = Box::new(data);
                    let (ptr, len) = (buf.as_ptr() as *const c_char, buf.len());
                    BUFFERS_IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
                    cb(status, ptr, len, self.cbdata, Some(release_bytes), Box::into_raw(buf) as *mut c_void);
                }
            }
        }
    }
}

macro_rules! reply_type {
    ($(#[$doc:meta])* $name:ident, $variant:ident, $cbty:ty) => {
        $(#[$doc])*
        #[must_use = "an uncompleted reply leaves a client blocked until it is dropped (then it fails)"]
        pub struct $name {
            pending: Option<Pending>,
        }

        impl $name {
            /// # Safety-relevant
            /// `cbfunc`/`cbdata` must be the pair libpmix passed to the upcall.
            pub(crate) fn new(cbfunc: Option<$cbty>, cbdata: *mut c_void, generation: u64, what: &'static str) -> Self {
                $name {
                    pending: cbfunc.map(|cb| Pending { cb: Callback::$variant(cb), cbdata, generation, what }),
                }
            }

            /// True if libpmix gave no cbfunc (completing is then a no-op).
            pub fn is_noop(&self) -> bool {
                self.pending.is_none()
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name)).field("pending", &self.pending.as_ref().map(|p| p.what)).finish()
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                if let Some(p) = self.pending.take() {
                    tracing::warn!(reply = p.what, "PMIx reply dropped without completion; completing with PMIX_ERROR");
                    p.fire(ERROR, Vec::new());
                }
            }
        }
    };
}

reply_type!(
    /// Completion of an operation upcall (client_connected, client_finalized, abort, log).
    Reply,
    Op,
    OpCb
);
reply_type!(
    /// Completion of a `fence_nb` upcall: the status and the collective data (for a collecting
    /// fence: every participating server's blob, concatenated).
    FenceReply,
    Modex,
    ModexCb
);
reply_type!(
    /// Completion of a `direct_modex` upcall: the status and the target proc's data blob (as
    /// returned by `PmixServer::dmodex_request` on the daemon hosting it).
    ModexReply,
    Modex,
    ModexCb
);
reply_type!(
    /// Completion of a `job_control` upcall (status only; no result info).
    InfoReply,
    Info,
    InfoCb
);

impl Reply {
    /// Calls the cbfunc with `status`. Call from the daemon's thread, never inside an upcall.
    pub fn complete(mut self, status: Status) {
        if let Some(p) = self.pending.take() {
            p.fire(status, Vec::new());
        }
    }
}

impl InfoReply {
    /// Calls the cbfunc with `status` and no result info.
    pub fn complete(mut self, status: Status) {
        if let Some(p) = self.pending.take() {
            p.fire(status, Vec::new());
        }
    }
}

impl FenceReply {
    /// Calls the cbfunc with `status` and a copy of `data`; the copy is kept alive until
    /// libpmix's release callback frees it.
    pub fn complete(mut self, status: Status, data: &[u8]) {
        if let Some(p) = self.pending.take() {
            p.fire(status, data.to_vec());
        }
    }
}

impl ModexReply {
    /// Calls the cbfunc with `status` and a copy of `data` (freed by libpmix's release callback).
    pub fn complete(mut self, status: Status, data: &[u8]) {
        if let Some(p) = self.pending.take() {
            p.fire(status, data.to_vec());
        }
    }
}
