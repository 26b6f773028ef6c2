//! The PMIx status codes, keys and reserved values the core decides with (libpmix 4.2's
//! `pmix_common.h`; `PMIX_ERR_PROC_ABORTED` from its `pmix_deprecated.h`). The core never
//! links libpmix: dvmd checks each value against the library it hosts (`pmix::tests`).

/// A PMIx status code.
pub type Status = i32;

pub const ERR_TIMEOUT: Status = -24;
pub const ERR_BAD_PARAM: Status = -27;
pub const ERR_NOT_FOUND: Status = -46;
pub const ERR_DUPLICATE_KEY: Status = -53;
pub const ERR_LOST_CONNECTION: Status = -61;
pub const ERR_JOB_FAILED_TO_MAP: Status = -179;
pub const ERR_JOB_FAILED_TO_LAUNCH: Status = -181;
pub const ERR_PROC_ABORTED: Status = -7;
pub const EVENT_NODE_DOWN: Status = -231;

/// `PMIX_RANGE_CUSTOM`: an event for the procs its info names.
pub const RANGE_CUSTOM: u32 = 6;
/// `PMIX_RANK_WILDCARD` as a raw rank: every proc of a namespace.
pub const RANK_WILDCARD: u32 = u32::MAX - 1;

pub const KEY_EVENT_AFFECTED_PROC: &str = "pmix.evproc";
pub const KEY_EVENT_AFFECTED_PROCS: &str = "pmix.evaffected";
pub const KEY_EXIT_CODE: &str = "pmix.exit.code";
pub const KEY_EVENT_TEXT_MESSAGE: &str = "pmix.evtext";
pub const KEY_HOSTNAME: &str = "pmix.hname";

/// The type of a PMIx value on the worker socket and the DVM (`pmixworker.Value.kind`).
pub mod kind {
    pub const STRING: u32 = 1;
    pub const BYTES: u32 = 2;
    pub const BOOL: u32 = 3;
    pub const U8: u32 = 4;
    pub const U16: u32 = 5;
    pub const U32: u32 = 6;
    pub const U64: u32 = 7;
    pub const I32: u32 = 8;
    pub const I64: u32 = 9;
    pub const SIZE: u32 = 10;
    pub const F64: u32 = 11;
    pub const STATUS: u32 = 12;
    pub const RANK: u32 = 13;
    pub const PROC: u32 = 14;
    pub const PROCS: u32 = 15;
}
