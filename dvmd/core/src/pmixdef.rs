//! The PMIx status codes, keys and reserved values the core decides with (libpmix 4.2's
//! `pmix_common.h`; `PMIX_ERR_PROC_ABORTED` from its `pmix_deprecated.h`). The core never
//! links libpmix: dvmd checks each value against the library it hosts (`pmix::tests`).

/// A PMIx status code.
pub type Status = i32;

pub const SUCCESS: Status = 0;
pub const ERROR: Status = -1;
pub const ERR_TIMEOUT: Status = -24;
pub const ERR_NOT_SUPPORTED: Status = -47;
pub const ERR_PARTIAL_SUCCESS: Status = -52;
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
/// `PMIX_RANK_VALID`: raw ranks at or above it are reserved values, not ranks.
pub const RANK_VALID: u32 = u32::MAX - 50;

/// `pmix_data_range_t` values.
pub mod range {
    pub const RM: u32 = 1;
    pub const LOCAL: u32 = 2;
    pub const NAMESPACE: u32 = 3;
    pub const SESSION: u32 = 4;
    pub const CUSTOM: u32 = super::RANGE_CUSTOM;
    pub const PROC_LOCAL: u32 = 7;
}

/// Info keys the PMIx host reads or answers with.
pub mod key {
    pub const MAPBY: &str = "pmix.mapby";
    pub const WDIR: &str = "pmix.wdir";
    pub const RANGE: &str = "pmix.range";
    pub const PERSISTENCE: &str = "pmix.persist";
    pub const USERID: &str = "pmix.euid";
    pub const GRPID: &str = "pmix.egid";
    pub const TIMEOUT: &str = "pmix.timeout";
    pub const WAIT: &str = "pmix.wait";
    pub const LOCAL_COLLECTIVE_STATUS: &str = "pmix.loc.col.st";
    pub const GROUP_ASSIGN_CONTEXT_ID: &str = "pmix.grp.actxid";
    pub const GROUP_ENDPT_DATA: &str = "pmix.grp.endpt";
    pub const GROUP_CONTEXT_ID: &str = "pmix.grp.ctxid";
    pub const QUERY_NUM_PSETS: &str = "pmix.qry.psetnum";
    pub const QUERY_NAMESPACES: &str = "pmix.qry.ns";
    pub const JOB_SIZE: &str = "pmix.job.size";
    pub const NSPACE: &str = "pmix.nspace";
    pub const PROCID: &str = "pmix.procid";
    pub const EVENT_CUSTOM_RANGE: &str = "pmix.evrange";
}

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
