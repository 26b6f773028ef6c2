//! Typed errors: every failure from libpmix carries the operation, the status code and the
//! library's own name for it (`PMIx_Error_string`).

use std::ffi::CStr;

use crate::sys;

/// A libpmix status code (`pmix_status_t`); 0 is success, negative values are errors.
pub type Status = i32;

/// `PMIX_SUCCESS`.
pub const SUCCESS: Status = sys::PMIX_SUCCESS as Status;
/// `PMIX_ERROR`: generic failure; what a dropped, never-completed reply reports.
pub const ERROR: Status = sys::PMIX_ERROR;
/// `PMIX_ERR_NOT_SUPPORTED`.
pub const ERR_NOT_SUPPORTED: Status = sys::PMIX_ERR_NOT_SUPPORTED;
/// `PMIX_ERR_TIMEOUT`.
pub const ERR_TIMEOUT: Status = sys::PMIX_ERR_TIMEOUT;
/// `PMIX_ERR_PARTIAL_SUCCESS` (-52): what `pmix.loc.col.st` carries when a local rank died
/// without contributing to a fence.
pub const ERR_PARTIAL_SUCCESS: Status = sys::PMIX_ERR_PARTIAL_SUCCESS;
/// `PMIX_ERR_NOT_FOUND`.
pub const ERR_NOT_FOUND: Status = sys::PMIX_ERR_NOT_FOUND;
/// `PMIX_ERR_BAD_PARAM`.
pub const ERR_BAD_PARAM: Status = sys::PMIX_ERR_BAD_PARAM;
/// `PMIX_ERR_DUPLICATE_KEY`: a publish of a key already published in the same range.
pub const ERR_DUPLICATE_KEY: Status = sys::PMIX_ERR_DUPLICATE_KEY;
/// `PMIX_ERR_JOB_FAILED_TO_LAUNCH`: a spawn whose procs could not all be started.
pub const ERR_JOB_FAILED_TO_LAUNCH: Status = sys::PMIX_ERR_JOB_FAILED_TO_LAUNCH;
/// `PMIX_ERR_JOB_FAILED_TO_MAP`: a spawn the DVM has no room for.
pub const ERR_JOB_FAILED_TO_MAP: Status = sys::PMIX_ERR_JOB_FAILED_TO_MAP;
/// `PMIX_ERR_PROC_ABORTED` (-7, in libpmix 4.2's deprecated header): the event the DVM raises
/// when a rank aborts or dies.
pub const ERR_PROC_ABORTED: Status = sys::PMIX_ERR_PROC_ABORTED;
/// `PMIX_ERR_LOST_CONNECTION` (-61): the event the DVM raises when a daemon is lost.
pub const ERR_LOST_CONNECTION: Status = sys::PMIX_ERR_LOST_CONNECTION;
/// `PMIX_EVENT_NODE_DOWN` (-231, a system event: a client's registration for it reaches the
/// host's `register_events`).
pub const EVENT_NODE_DOWN: Status = sys::PMIX_EVENT_NODE_DOWN;
/// `PMIX_OPERATION_SUCCEEDED`: what an upcall returns when it is done and will not call its
/// cbfunc.
pub const OPERATION_SUCCEEDED: Status = sys::PMIX_OPERATION_SUCCEEDED;

/// libpmix's name for a status code, e.g. `PMIX_ERR_NOT_FOUND` -> "NOT-FOUND".
pub fn status_name(status: Status) -> String {
    // SAFETY: PMIx_Error_string returns a pointer to a static string (or NULL) for any input.
    let p = unsafe { sys::PMIx_Error_string(status) };
    if p.is_null() {
        return format!("PMIX status {status}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Errors of the safe wrapper.
#[derive(Debug, thiserror::Error)]
pub enum PmixError {
    /// libpmix returned a non-success status.
    #[error("{op} failed: {name} ({code})")]
    Status { op: &'static str, code: Status, name: String },
    /// libpmix did not call the completion callback of a blocking call in time.
    #[error("{op} did not complete within {ms} ms")]
    Timeout { op: &'static str, ms: u128 },
    /// An argument cannot be expressed to libpmix (embedded NUL, too long, inconsistent map...).
    #[error("invalid argument to {op}: {detail}")]
    InvalidArgument { op: &'static str, detail: String },
    /// libpmix's server is a process-wide singleton and one is already running.
    #[error("a PMIx server is already initialized in this process")]
    AlreadyInitialized,
    /// A blocking call was made from inside a PMIx upcall (on libpmix's progress thread):
    /// it would deadlock, so it is refused.
    #[error("{op} called from inside a PMIx upcall (libpmix progress thread); call it from the daemon's own thread")]
    CalledFromUpcall { op: &'static str },
    /// Preparing the server's temporary directory failed.
    #[error("PMIx server tmpdir {path}: {source}")]
    TmpDir { path: String, source: std::io::Error },
}

impl PmixError {
    /// The libpmix status code behind this error, if it came from libpmix.
    pub fn status(&self) -> Option<Status> {
        match self {
            PmixError::Status { code, .. } => Some(*code),
            PmixError::Timeout { .. } => Some(ERR_TIMEOUT),
            _ => None,
        }
    }
}

/// Maps a libpmix return code to `Ok(())` or a named error.
pub(crate) fn check(op: &'static str, code: Status) -> Result<(), PmixError> {
    if code == SUCCESS {
        Ok(())
    } else {
        Err(PmixError::Status { op, code, name: status_name(code) })
    }
}
