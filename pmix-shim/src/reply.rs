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
use crate::types::{nspace_buf, Info, InfoArray, InfoValue, ProcId};

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

type SpawnCb = unsafe extern "C" fn(sys::pmix_status_t, *mut c_char, *mut c_void);
type LookupCb = unsafe extern "C" fn(sys::pmix_status_t, *mut sys::pmix_pdata_t, usize, *mut c_void);

/// One datum a lookup found: who published it, its key and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    pub proc: ProcId,
    pub key: String,
    pub value: InfoValue,
}

/// What a completion hands to its cbfunc besides the status.
enum Payload {
    None,
    Bytes(Vec<u8>),
    Nspace(String),
    Found(Vec<Published>),
    Infos(Vec<Info>),
}

/// Byte buffers handed to a modex cbfunc that libpmix has not released yet.
static BUFFERS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// How many data buffers given to fence/modex cbfuncs libpmix still holds (each is freed by
/// libpmix's release callback). For leak checks in tests.
pub fn reply_buffers_in_flight() -> usize {
    BUFFERS_IN_FLIGHT.load(Ordering::SeqCst)
}

/// Result arrays handed to an info cbfunc that libpmix has not released yet.
static INFOS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// How many result arrays given to info cbfuncs (query, group) libpmix still holds. For leak
/// checks in tests.
pub fn reply_infos_in_flight() -> usize {
    INFOS_IN_FLIGHT.load(Ordering::SeqCst)
}

unsafe extern "C" fn release_infos(cbdata: *mut c_void) {
    if !cbdata.is_null() {
        // SAFETY: cbdata is the Box<InfoArray> leaked in `call_info`, released exactly once.
        drop(Box::from_raw(cbdata as *mut InfoArray));
        INFOS_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Calls an info cbfunc with `infos` as a `pmix_info_t` array that stays valid until libpmix
/// calls the release function it is given (libpmix reads a group's result after a thread
/// shift, so the array must outlive the call).
///
/// # Safety
/// `cb`/`cbdata` are libpmix's pair for one upcall that takes a `pmix_info_cbfunc_t`.
unsafe fn call_info(cb: InfoCb, status: Status, infos: &[Info], cbdata: *mut c_void) {
    let mut arr = InfoArray::new();
    for i in infos {
        if let Err(e) = arr.push("info reply", &i.key, &i.value) {
            tracing::error!("info reply: {e}");
            cb(crate::error::ERR_BAD_PARAM, std::ptr::null_mut(), 0, cbdata, None, std::ptr::null_mut());
            return;
        }
    }
    let mut arr = Box::new(arr);
    let (ptr, len) = (arr.as_mut_ptr(), arr.len());
    INFOS_IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    cb(status, ptr, len, cbdata, Some(release_infos), Box::into_raw(arr) as *mut c_void);
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
    Spawn(SpawnCb),
    Lookup(LookupCb),
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
    fn fire(self, status: Status, data: Payload) {
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

    unsafe fn call(self, status: Status, payload: Payload) {
        match (self.cb, payload) {
            (Callback::Op(cb), _) => cb(status, self.cbdata),
            (Callback::Info(cb), Payload::Infos(infos)) if !infos.is_empty() => {
                call_info(cb, status, &infos, self.cbdata)
            }
            (Callback::Info(cb), _) => cb(status, std::ptr::null_mut(), 0, self.cbdata, None, std::ptr::null_mut()),
            (Callback::Spawn(cb), Payload::Nspace(ns)) if status == crate::error::SUCCESS => {
                match nspace_buf("spawn reply", &ns) {
                    // libpmix copies the name (strdup) before the cbfunc returns.
                    Ok(mut buf) => cb(status, buf.as_mut_ptr(), self.cbdata),
                    Err(e) => {
                        tracing::error!("spawn reply: {e}");
                        cb(crate::error::ERR_BAD_PARAM, std::ptr::null_mut(), self.cbdata)
                    }
                }
            }
            (Callback::Spawn(cb), _) => cb(status, std::ptr::null_mut(), self.cbdata),
            (Callback::Lookup(cb), Payload::Found(found)) => call_lookup(cb, status, &found, self.cbdata),
            (Callback::Lookup(cb), _) => cb(status, std::ptr::null_mut(), 0, self.cbdata),
            (Callback::Modex(cb), Payload::Bytes(data)) if !data.is_empty() => {
                // The bytes must stay valid until libpmix calls release_bytes.
                let buf = Box::new(data);
                let (ptr, len) = (buf.as_ptr() as *const c_char, buf.len());
                BUFFERS_IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
                cb(status, ptr, len, self.cbdata, Some(release_bytes), Box::into_raw(buf) as *mut c_void);
            }
            (Callback::Modex(cb), _) => cb(status, std::ptr::null(), 0, self.cbdata, None, std::ptr::null_mut()),
        }
    }
}

/// Calls a lookup cbfunc with `found` as a `pmix_pdata_t` array. libpmix packs the array
/// before the cbfunc returns (it does not keep it), so it is freed right after.
///
/// # Safety
/// `cb`/`cbdata` are libpmix's pair for one lookup upcall.
unsafe fn call_lookup(cb: LookupCb, status: Status, found: &[Published], cbdata: *mut c_void) {
    let mut values = InfoArray::new();
    let mut procs = Vec::with_capacity(found.len());
    for p in found {
        let loaded = values.push("lookup reply", &p.key, &p.value);
        let proc = p.proc.to_raw("lookup reply");
        match (loaded, proc) {
            (Ok(()), Ok(proc)) => procs.push(proc),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!("lookup reply: {e}");
                cb(crate::error::ERR_BAD_PARAM, std::ptr::null_mut(), 0, cbdata);
                return;
            }
        }
    }
    let mut pdata: Vec<sys::pmix_pdata_t> = values
        .items()
        .iter()
        .zip(procs)
        .map(|(info, proc)| {
            // A shallow copy: key and value stay owned by `values`, which outlives the call.
            sys::pmix_pdata_t { proc_: proc, key: info.key, value: std::ptr::read(&info.value) }
        })
        .collect();
    let ptr = if pdata.is_empty() { std::ptr::null_mut() } else { pdata.as_mut_ptr() };
    cb(status, ptr, pdata.len(), cbdata);
    // The shallow copies are forgotten, never destructed (`values` owns what they point to).
    drop(pdata);
    drop(values);
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
                    p.fire(ERROR, Payload::None);
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
    /// Completion of an upcall answered with an info array: `job_control` (status only),
    /// `query` (one info per answered key), `group` (context id, endpoint data).
    InfoReply,
    Info,
    InfoCb
);
reply_type!(
    /// Completion of a `spawn` upcall: the status and, on success, the new job's nspace.
    SpawnReply,
    Spawn,
    SpawnCb
);
reply_type!(
    /// Completion of a `lookup` upcall: the status and what was found.
    LookupReply,
    Lookup,
    LookupCb
);

impl Reply {
    /// Calls the cbfunc with `status`. Call from the daemon's thread, never inside an upcall.
    pub fn complete(mut self, status: Status) {
        if let Some(p) = self.pending.take() {
            p.fire(status, Payload::None);
        }
    }
}

impl InfoReply {
    /// Calls the cbfunc with `status` and no result info.
    pub fn complete(mut self, status: Status) {
        if let Some(p) = self.pending.take() {
            p.fire(status, Payload::None);
        }
    }

    /// Calls the cbfunc with `status` and `infos` (kept alive until libpmix releases them). A
    /// value libpmix cannot load fails the upcall with `PMIX_ERR_BAD_PARAM` instead.
    pub fn complete_with_info(mut self, status: Status, infos: Vec<Info>) {
        if let Some(p) = self.pending.take() {
            p.fire(status, Payload::Infos(infos));
        }
    }
}

impl FenceReply {
    /// Calls the cbfunc with `status` and a copy of `data`; the copy is kept alive until
    /// libpmix's release callback frees it.
    pub fn complete(mut self, status: Status, data: &[u8]) {
        if let Some(p) = self.pending.take() {
            p.fire(status, Payload::Bytes(data.to_vec()));
        }
    }
}

impl ModexReply {
    /// Calls the cbfunc with `status` and a copy of `data` (freed by libpmix's release callback).
    pub fn complete(mut self, status: Status, data: &[u8]) {
        if let Some(p) = self.pending.take() {
            p.fire(status, Payload::Bytes(data.to_vec()));
        }
    }
}

impl SpawnReply {
    /// Success with the new job's nspace, or an error status (`nspace` ignored).
    pub fn complete(mut self, status: Status, nspace: &str) {
        if let Some(p) = self.pending.take() {
            p.fire(status, Payload::Nspace(nspace.to_owned()));
        }
    }
}

impl LookupReply {
    /// The status and what was found (empty unless success).
    pub fn complete(mut self, status: Status, found: Vec<Published>) {
        if let Some(p) = self.pending.take() {
            p.fire(status, Payload::Found(found));
        }
    }
}
