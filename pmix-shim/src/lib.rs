//! `pmix-shim`: the DVM's only contact with libpmix (OpenPMIx 4.2, Debian's `libpmix-dev`).
//!
//! **Owns**: the FFI (bindgen over `pmix.h` + `pmix_server.h`, module [`sys`]), a safe wrapper
//! over the server calls ([`PmixServer`]), and the host module whose upcalls become owned
//! [`PmixEvent`]s carrying reply objects ([`Reply`], [`FenceReply`], [`ModexReply`],
//! [`InfoReply`]).
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
//!
//! **Blocking calls**: `register_nspace`, `register_client`, `deregister_client`,
//! `deregister_nspace` wait for libpmix's completion callback (a few ms: see the crate README
//! figures in the tests' output; notes: deregister 4–25 ms). `dmodex_request` does not block:
//! its answer arrives as [`PmixEvent::DmodexData`]. None may be called inside an upcall.
//!
//! **Call order** (a daemon): `init` once → per job `register_nspace` → per local rank
//! `register_client`, `setup_fork` (add every variable to the child env), fork/exec → ...
//! events ... → after every local rank is reaped `deregister_client`s, `deregister_nspace` →
//! `finalize` (or drop) at exit.
//!
//! **Traps** (shared/PMIX-NOTES.md): `pmix_nspace_t` is 256 bytes and libpmix reads all of them
//! (we always zero-pad); never register `PMIX_PROC_DATA` (it stops libpmix deriving local/node
//! ranks); with every fence participant on one server libpmix completes fences itself unless
//! `PMIX_MCA_pmix_server_fence_localonly_opt=0` is in the server's env before `init`; Open MPI
//! ranks need `OMPI_MCA_schizo=^orte` in their env or they start as singletons.

pub mod sys {
    //! Raw bindgen output for `pmix.h` + `pmix_server.h` (allowlist `PMIx_*`, `pmix_*`, `PMIX_*`).
    #![allow(non_upper_case_globals, non_camel_case_types, non_snake_case, dead_code, missing_docs)]
    #![allow(clippy::all, clippy::pedantic)]
    include!(concat!(env!("OUT_DIR"), "/pmix_bindings.rs"));
}

mod error;
mod event;
mod logtext;
mod reply;
mod server;
mod state;
mod types;
mod upcalls;

pub use error::{
    status_name, PmixError, Status, ERROR, ERR_NOT_FOUND, ERR_NOT_SUPPORTED, ERR_PARTIAL_SUCCESS, ERR_TIMEOUT, SUCCESS,
};
pub use event::{FenceRequest, PmixEvent};
pub use logtext::{last_dss_string, log_text};
pub use reply::{reply_buffers_in_flight, FenceReply, InfoReply, ModexReply, Reply};
pub use server::{JobInfo, PmixServer, ServerConfig, DEFAULT_OP_TIMEOUT};
pub use types::{find_info, key_str, nspace_buf, Info, InfoValue, ProcId, Rank, NSPACE_LEN};
