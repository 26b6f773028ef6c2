//! The `extern "C"` host module handed to `PMIx_server_init`. Each upcall runs on libpmix's
//! progress thread: it copies its arguments into an owned [`PmixEvent`], posts it to the sink
//! and returns `PMIX_SUCCESS`. No upcall ever calls its cbfunc (the reply object does that
//! later, from the daemon's thread). A panic never unwinds into C: it is caught and the upcall
//! reports `PMIX_ERROR`.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{Status, ERROR, ERR_NOT_SUPPORTED, OPERATION_SUCCEEDED, SUCCESS};
use crate::event::{FenceRequest, GroupOp, PmixEvent, Query, SpawnApp};
use crate::logtext::log_text;
use crate::reply::{FenceReply, InfoReply, LookupReply, ModexReply, Reply, SpawnReply};
use crate::state::{self, UpcallGuard};
use crate::sys;
use crate::types::{argv_from_raw, Info, ProcId};

/// The module with our upcalls filled in; everything else NULL (libpmix answers NOT_SUPPORTED).
pub(crate) fn module() -> sys::pmix_server_module_t {
    // SAFETY: the module is a struct of nullable function pointers; all-zero = all NULL.
    let mut m: sys::pmix_server_module_t = unsafe { std::mem::zeroed() };
    m.client_connected = Some(client_connected);
    m.client_finalized = Some(client_finalized);
    m.abort = Some(abort);
    m.fence_nb = Some(fence_nb);
    m.direct_modex = Some(direct_modex);
    m.log = Some(log);
    m.job_control = Some(job_control);
    m.spawn = Some(spawn);
    m.connect = Some(connect);
    m.disconnect = Some(disconnect);
    m.publish = Some(publish);
    m.lookup = Some(lookup);
    m.unpublish = Some(unpublish);
    m.query = Some(query);
    m.group = Some(group);
    m.register_events = Some(register_events);
    m.deregister_events = Some(deregister_events);
    m.notify_event = Some(notify_event);
    m
}

/// Common frame: marks the thread as inside an upcall, finds the live server, builds the event
/// (copying everything), posts it. Returns ERR_NOT_SUPPORTED when no server is live (no reply
/// was created, so libpmix does not wait for a cbfunc).
fn post(name: &'static str, build: impl FnOnce(u64) -> PmixEvent) -> Status {
    // Once the event (and so its reply) exists, the reply owns the answer: even if the sink
    // panics, the dropped reply completes with PMIX_ERROR, so the upcall must report SUCCESS.
    let mut built = false;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let _guard = UpcallGuard::enter();
        let Some(shared) = state::current() else {
            // Expected while a daemon tears its server down (late deregistrations, clients
            // that finalize as the job is killed): not worth a warning on every one-shot job.
            tracing::debug!(upcall = name, "PMIx upcall with no live server; refused");
            return ERR_NOT_SUPPORTED;
        };
        let ev = build(shared.generation);
        built = true;
        tracing::trace!(upcall = name, "PMIx upcall posted");
        (shared.sink)(ev);
        SUCCESS
    }));
    result.unwrap_or_else(|_| {
        tracing::error!(upcall = name, "panic inside a PMIx upcall");
        if built {
            SUCCESS
        } else {
            ERROR
        }
    })
}

/// Posts an event that needs no reply and answers `PMIX_OPERATION_SUCCEEDED` (libpmix then
/// never waits for the cbfunc, which is never called).
fn post_done(name: &'static str, build: impl FnOnce() -> PmixEvent) -> Status {
    match post(name, |_| build()) {
        SUCCESS => OPERATION_SUCCEEDED,
        other => other,
    }
}

unsafe extern "C" fn client_connected(
    proc_: *const sys::pmix_proc_t,
    _server_object: *mut c_void,
    cbfunc: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("client_connected", |g| PmixEvent::ClientConnected {
        proc: ProcId::from_raw(proc_),
        reply: Reply::new(cbfunc, cbdata, g, "client_connected"),
    })
}

unsafe extern "C" fn client_finalized(
    proc_: *const sys::pmix_proc_t,
    _server_object: *mut c_void,
    cbfunc: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("client_finalized", |g| PmixEvent::ClientFinalized {
        proc: ProcId::from_raw(proc_),
        reply: Reply::new(cbfunc, cbdata, g, "client_finalized"),
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn abort(
    proc_: *const sys::pmix_proc_t,
    _server_object: *mut c_void,
    status: c_int,
    msg: *const c_char,
    procs: *mut sys::pmix_proc_t,
    nprocs: usize,
    cbfunc: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("abort", |g| PmixEvent::Abort {
        proc: ProcId::from_raw(proc_),
        status,
        message: if msg.is_null() { String::new() } else { CStr::from_ptr(msg).to_string_lossy().into_owned() },
        procs: if procs.is_null() || nprocs == 0 { None } else { Some(ProcId::from_raw_array(procs, nprocs)) },
        reply: Reply::new(cbfunc, cbdata, g, "abort"),
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn fence_nb(
    procs: *const sys::pmix_proc_t,
    nprocs: usize,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    data: *mut c_char,
    ndata: usize,
    cbfunc: sys::pmix_modex_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("fence_nb", |g| {
        let bytes = if data.is_null() || ndata == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(data as *const u8, ndata).to_vec()
        };
        PmixEvent::FenceNb(FenceRequest::new(
            ProcId::from_raw_array(procs, nprocs),
            Info::from_raw_array(info, ninfo),
            bytes,
            FenceReply::new(cbfunc, cbdata, g, "fence_nb"),
        ))
    })
}

unsafe extern "C" fn direct_modex(
    proc_: *const sys::pmix_proc_t,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cbfunc: sys::pmix_modex_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("direct_modex", |g| PmixEvent::DirectModex {
        proc: ProcId::from_raw(proc_),
        info: Info::from_raw_array(info, ninfo),
        reply: ModexReply::new(cbfunc, cbdata, g, "direct_modex"),
    })
}

unsafe extern "C" fn log(
    client: *const sys::pmix_proc_t,
    data: *const sys::pmix_info_t,
    ndata: usize,
    directives: *const sys::pmix_info_t,
    ndirs: usize,
    cbfunc: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) {
    // A void upcall: if no server is live there is nobody to answer; calling cbfunc here would
    // deadlock libpmix, so the request is left unanswered (only possible during finalize).
    post("log", |g| {
        let data = Info::from_raw_array(data, ndata);
        PmixEvent::Log {
            client: if client.is_null() { ProcId::new("", crate::Rank::Wildcard) } else { ProcId::from_raw(client) },
            text: log_text(&data),
            data,
            directives: Info::from_raw_array(directives, ndirs),
            reply: Reply::new(cbfunc, cbdata, g, "log"),
        }
    });
}

unsafe extern "C" fn job_control(
    requestor: *const sys::pmix_proc_t,
    targets: *const sys::pmix_proc_t,
    ntargets: usize,
    directives: *const sys::pmix_info_t,
    ndirs: usize,
    cbfunc: sys::pmix_info_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("job_control", |g| PmixEvent::JobControl {
        requestor: ProcId::from_raw(requestor),
        targets: ProcId::from_raw_array(targets, ntargets),
        directives: Info::from_raw_array(directives, ndirs),
        reply: InfoReply::new(cbfunc, cbdata, g, "job_control"),
    })
}

unsafe fn opt_str(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

unsafe extern "C" fn spawn(
    proc_: *const sys::pmix_proc_t,
    job_info: *const sys::pmix_info_t,
    ninfo: usize,
    apps: *const sys::pmix_app_t,
    napps: usize,
    cbfunc: sys::pmix_spawn_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("spawn", |g| {
        let apps = if apps.is_null() {
            Vec::new()
        } else {
            (0..napps)
                .map(|i| {
                    let a = &*apps.add(i);
                    SpawnApp {
                        cmd: opt_str(a.cmd),
                        argv: argv_from_raw(a.argv),
                        env: argv_from_raw(a.env),
                        cwd: opt_str(a.cwd),
                        maxprocs: a.maxprocs,
                        info: Info::from_raw_array(a.info, a.ninfo),
                    }
                })
                .collect()
        };
        PmixEvent::Spawn {
            proc: ProcId::from_raw(proc_),
            job_info: Info::from_raw_array(job_info, ninfo),
            apps,
            reply: SpawnReply::new(cbfunc, cbdata, g, "spawn"),
        }
    })
}

unsafe extern "C" fn connect(
    procs: *const sys::pmix_proc_t,
    nprocs: usize,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cbfunc: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("connect", |g| PmixEvent::Connect {
        procs: ProcId::from_raw_array(procs, nprocs),
        info: Info::from_raw_array(info, ninfo),
        reply: Reply::new(cbfunc, cbdata, g, "connect"),
    })
}

unsafe extern "C" fn disconnect(
    procs: *const sys::pmix_proc_t,
    nprocs: usize,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cbfunc: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("disconnect", |g| PmixEvent::Disconnect {
        procs: ProcId::from_raw_array(procs, nprocs),
        info: Info::from_raw_array(info, ninfo),
        reply: Reply::new(cbfunc, cbdata, g, "disconnect"),
    })
}

unsafe extern "C" fn publish(
    proc_: *const sys::pmix_proc_t,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cbfunc: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("publish", |g| PmixEvent::Publish {
        proc: ProcId::from_raw(proc_),
        info: Info::from_raw_array(info, ninfo),
        reply: Reply::new(cbfunc, cbdata, g, "publish"),
    })
}

unsafe extern "C" fn lookup(
    proc_: *const sys::pmix_proc_t,
    keys: *mut *mut c_char,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cbfunc: sys::pmix_lookup_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("lookup", |g| PmixEvent::Lookup {
        proc: ProcId::from_raw(proc_),
        keys: argv_from_raw(keys),
        info: Info::from_raw_array(info, ninfo),
        reply: LookupReply::new(cbfunc, cbdata, g, "lookup"),
    })
}

unsafe extern "C" fn unpublish(
    proc_: *const sys::pmix_proc_t,
    keys: *mut *mut c_char,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    cbfunc: sys::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("unpublish", |g| PmixEvent::Unpublish {
        proc: ProcId::from_raw(proc_),
        keys: argv_from_raw(keys),
        info: Info::from_raw_array(info, ninfo),
        reply: Reply::new(cbfunc, cbdata, g, "unpublish"),
    })
}

unsafe extern "C" fn query(
    _proct: *mut sys::pmix_proc_t,
    queries: *mut sys::pmix_query_t,
    nqueries: usize,
    cbfunc: sys::pmix_info_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post("query", |g| {
        let queries = if queries.is_null() {
            Vec::new()
        } else {
            (0..nqueries)
                .map(|i| {
                    let q = &*queries.add(i);
                    Query { keys: argv_from_raw(q.keys), qualifiers: Info::from_raw_array(q.qualifiers, q.nqual) }
                })
                .collect()
        };
        PmixEvent::Query { queries, reply: InfoReply::new(cbfunc, cbdata, g, "query") }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn group(
    op: sys::pmix_group_operation_t,
    grp: *mut c_char,
    procs: *const sys::pmix_proc_t,
    nprocs: usize,
    directives: *const sys::pmix_info_t,
    ndirs: usize,
    cbfunc: sys::pmix_info_cbfunc_t,
    cbdata: *mut c_void,
) -> sys::pmix_status_t {
    let op = match op {
        sys::pmix_group_operation_t_PMIX_GROUP_CONSTRUCT => GroupOp::Construct,
        sys::pmix_group_operation_t_PMIX_GROUP_DESTRUCT => GroupOp::Destruct,
        // No reply object exists yet: libpmix answers the client with this status itself.
        _ => return ERR_NOT_SUPPORTED,
    };
    post("group", |g| PmixEvent::Group {
        op,
        id: opt_str(grp),
        procs: ProcId::from_raw_array(procs, nprocs),
        directives: Info::from_raw_array(directives, ndirs),
        reply: InfoReply::new(cbfunc, cbdata, g, "group"),
    })
}

unsafe extern "C" fn register_events(
    codes: *mut sys::pmix_status_t,
    ncodes: usize,
    info: *const sys::pmix_info_t,
    ninfo: usize,
    _cbfunc: sys::pmix_op_cbfunc_t,
    _cbdata: *mut c_void,
) -> sys::pmix_status_t {
    post_done("register_events", || PmixEvent::RegisterEvents {
        codes: if codes.is_null() { Vec::new() } else { std::slice::from_raw_parts(codes, ncodes).to_vec() },
        info: Info::from_raw_array(info, ninfo),
    })
}

unsafe extern "C" fn deregister_events(
    _codes: *mut sys::pmix_status_t,
    _ncodes: usize,
    _cbfunc: sys::pmix_op_cbfunc_t,
    _cbdata: *mut c_void,
) -> sys::pmix_status_t {
    // libpmix 4.2.2 never calls this (a client's deregistration stays in its server); nothing
    // to undo on the host side either way.
    OPERATION_SUCCEEDED
}

unsafe extern "C" fn notify_event(
    code: sys::pmix_status_t,
    source: *const sys::pmix_proc_t,
    range: sys::pmix_data_range_t,
    info: *mut sys::pmix_info_t,
    ninfo: usize,
    _cbfunc: sys::pmix_op_cbfunc_t,
    _cbdata: *mut c_void,
) -> sys::pmix_status_t {
    // Never call the cbfunc: libpmix 4.2.2 dereferences a NULL once it is called (measured);
    // PMIX_OPERATION_SUCCEEDED makes it answer the client itself.
    post_done("notify_event", || PmixEvent::Notify {
        status: code,
        source: if source.is_null() { ProcId::new("", crate::Rank::Wildcard) } else { ProcId::from_raw(source) },
        range,
        info: Info::from_raw_array(info, ninfo),
    })
}

/// Completion of `PMIx_server_dmodex_request`: posts `DmodexData`.
pub(crate) struct DmodexCtx {
    pub(crate) request: u64,
    pub(crate) proc: ProcId,
}

pub(crate) unsafe extern "C" fn dmodex_done(
    status: sys::pmix_status_t,
    data: *mut c_char,
    sz: usize,
    cbdata: *mut c_void,
) {
    // SAFETY: cbdata is the Box<DmodexCtx> leaked by PmixServer::dmodex_request; called once.
    let ctx = Box::from_raw(cbdata as *mut DmodexCtx);
    post("dmodex_response", |_| PmixEvent::DmodexData {
        request: ctx.request,
        proc: ctx.proc,
        status,
        data: if data.is_null() || sz == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(data as *const u8, sz).to_vec()
        },
    });
}

/// Completion of `PmixServer::deregister_nspace_nb`: posts `NspaceDeregistered`.
pub(crate) struct DeregisterCtx {
    pub(crate) nspace: String,
    pub(crate) buf: sys::pmix_nspace_t,
}

pub(crate) unsafe extern "C" fn deregister_done(status: sys::pmix_status_t, cbdata: *mut c_void) {
    // SAFETY: cbdata is the Box<DeregisterCtx> leaked by deregister_nspace_nb; called once.
    let ctx = Box::from_raw(cbdata as *mut DeregisterCtx);
    post("deregister_nspace", |_| PmixEvent::NspaceDeregistered { nspace: ctx.nspace, status });
}
