//! `pmix-shim`: the DVM's only contact with libpmix (OpenPMIx 4.2, Debian's `libpmix-dev`).
//!
//! **Owns**: the FFI (bindgen over `pmix.h` + `pmix_server.h`, module [`sys`]), a safe wrapper
//! over the server calls ([`PmixServer`]), and the host module whose upcalls become owned
//! [`PmixEvent`]s carrying reply objects ([`Reply`], [`FenceReply`], [`ModexReply`],
//! [`InfoReply`], [`SpawnReply`], [`LookupReply`]). Hosted upcalls: client connected/finalized,
//! abort, fence, direct modex, log, job control, spawn, connect, disconnect, publish, lookup,
//! unpublish, query, group, register_events, deregister_events, notify_event
//! (docs/dynamic-mpi.md has the table). [`PmixServer::notify_event`] hands the host's own
//! events to the server.
//!
//! **Never**: makes a protocol decision (what a fence collects, who answers a direct modex,
//! whether an abort kills the job: all the daemon's), and never calls a cbfunc inside an upcall
//! (the `log` cbfunc called inside its upcall deadlocks libpmix every time).
//!
//! **Threading rule**: upcalls run on libpmix's progress thread; each copies its arguments
//! (the pointers die when it returns), hands one event to the sink given to
//! [`PmixServer::init`] (which must not block: an unbounded channel send) and returns. The
//! daemon's actor completes the reply later from its own thread. A reply completes once
//! (`complete(self, ..)`), completes with `PMIX_ERROR` if dropped, is deferred to a helper
//! thread if completed inside an upcall, and is discarded after the server is finalized.
//! The event upcalls (`register_events`, `notify_event`) carry no reply: they answer
//! `PMIX_OPERATION_SUCCEEDED` and never call their cbfunc (libpmix 4.2.2 dereferences a NULL
//! when the host calls `notify_event`'s).
//!
//! **Blocking calls** (measured here, libpmix 4.2.2, from the tests' `timing:` lines):
//! `init` 13–37 ms; `register_nspace` 0.3–1.2 ms; `register_client` ~0.01 ms; `setup_fork`
//! ~0.03 ms; `deregister_client` sub-ms; `deregister_nspace` 3–29 ms (typically ~20). Each waits
//! for libpmix's completion callback, bounded by `ServerConfig::op_timeout`. The actor should
//! prefer `deregister_nspace_nb` (returns in µs, completion as [`PmixEvent::NspaceDeregistered`]).
//! `dmodex_request` never blocks: its answer arrives as [`PmixEvent::DmodexData`]. None of these
//! may be called inside an upcall (refused with `PmixError::CalledFromUpcall`).
//!
//! **Call order** (a daemon): `init` once → per job `register_nspace` → per local rank
//! `register_client`, `setup_fork` (add every variable to the child env), fork/exec → ...
//! events ... → after every local rank is reaped `deregister_client`s, `deregister_nspace(_nb)`
//! → `finalize` (or drop) at exit. Abort: complete the reply, wait for the aborting rank's exit,
//! then kill the others (the only order that never broke libpmix). `Log` events carry Open MPI's
//! rendered error text (e.g. "getting local rank failed"): surface it to the user.
//!
//! **Traps** (shared/PMIX-NOTES.md): `pmix_nspace_t` is 256 bytes and libpmix reads all of them
//! (we always zero-pad); registering any `PMIX_PROC_DATA` stops libpmix deriving local/node
//! ranks: `JobInfo` then gives every rank all of it (`JobInfo::proc_data`), never part; libpmix 4.2.2 ignores an error status on `client_connected` (the client's
//! PMIx_Init still succeeds: refuse a client some other way); with every fence participant on one server libpmix completes fences itself unless
//! `PMIX_MCA_pmix_server_fence_localonly_opt=0` is in the server's env before `init`; Open MPI
//! ranks need `OMPI_MCA_schizo=^orte` in their env or they start as singletons.

pub mod sys {
    //! Raw bindgen output for `pmix.h` + `pmix_server.h` (allowlist `PMIx_*`, `pmix_*`, `PMIX_*`).
    #![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code, missing_docs)]
    #![allow(clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/pmix_bindings.rs"));
}

/// Where the build found libpmix (pkg-config's libdir), if it said.
pub const LIBDIR: Option<&str> = option_env!("DVM_PMIX_LIBDIR");

mod error;
mod event;
mod jobinfo;
mod logtext;
mod reply;
mod server;
mod state;
pub mod topology;
mod types;
mod upcalls;

pub use error::{
    status_name, PmixError, Status, ERROR, ERR_BAD_PARAM, ERR_DUPLICATE_KEY, ERR_JOB_FAILED_TO_LAUNCH,
    ERR_JOB_FAILED_TO_MAP, ERR_LOST_CONNECTION, ERR_NOT_FOUND, ERR_NOT_SUPPORTED, ERR_PARTIAL_SUCCESS,
    ERR_PROC_ABORTED, ERR_TIMEOUT, EVENT_NODE_DOWN, OPERATION_SUCCEEDED, SUCCESS,
};
pub use event::{FenceRequest, GroupOp, PmixEvent, Query, SpawnApp};
pub use jobinfo::{AppInfo, JobInfo, ProcData};
pub use logtext::{last_dss_string, log_text};
pub use reply::{
    reply_buffers_in_flight, reply_infos_in_flight, FenceReply, InfoReply, LookupReply, ModexReply, Published, Reply,
    SpawnReply,
};
pub use server::{PmixServer, ServerConfig, DEFAULT_OP_TIMEOUT};
pub use types::{find_info, key_str, nspace_buf, Info, InfoValue, ProcId, Rank, NSPACE_LEN};
