//! A tiny PMIx client for this crate's integration tests (the client half of libpmix through
//! the same bindings). Usage: `pmix-test-client fence|getremote|abort|log|group|query|events`. It prints `key=value` lines
//! the tests check and exits non-zero on any PMIx failure.

use std::ffi::{c_char, c_void, CStr, CString};
use std::process::exit;

use pmix_shim::{status_name, sys};

fn check(what: &str, rc: sys::pmix_status_t) {
    if rc != sys::PMIX_SUCCESS as i32 {
        eprintln!("pmix-test-client: {what} failed: {} ({rc})", status_name(rc));
        exit(3);
    }
}

fn key(k: &[u8]) -> *const c_char {
    k.as_ptr() as *const c_char
}

fn proc_of(ns: &sys::pmix_nspace_t, rank: u32) -> sys::pmix_proc_t {
    sys::pmix_proc_t { nspace: *ns, rank }
}

/// PMIx_Get, returning the value as a string (strings verbatim, integers in decimal).
fn get(p: &sys::pmix_proc_t, k: &[u8]) -> String {
    let mut val: *mut sys::pmix_value_t = std::ptr::null_mut();
    // SAFETY: p and k are valid; val receives a malloc'ed value we release below.
    let rc = unsafe { sys::PMIx_Get(p, key(k), std::ptr::null(), 0, &mut val) };
    check(&format!("PMIx_Get({})", String::from_utf8_lossy(k)), rc);
    // SAFETY: PMIx_Get succeeded, val is a valid value.
    unsafe {
        let v = &*val;
        let s = match u32::from(v.type_) {
            sys::PMIX_STRING => CStr::from_ptr(v.data.string).to_string_lossy().into_owned(),
            sys::PMIX_UINT32 => v.data.uint32.to_string(),
            sys::PMIX_UINT16 => v.data.uint16.to_string(),
            sys::PMIX_INT32 | sys::PMIX_INT => v.data.int32.to_string(),
            sys::PMIX_PROC_RANK => v.data.rank.to_string(),
            t => format!("<type {t}>"),
        };
        sys::PMIx_Value_destruct(val);
        libc::free(val as *mut c_void);
        s
    }
}

fn fence(ns: &sys::pmix_nspace_t, collect: bool) {
    let all = proc_of(ns, sys::PMIX_RANK_WILDCARD);
    // SAFETY: zeroed info is the constructed state; PMIx_Info_load copies the bool.
    unsafe {
        let mut info: sys::pmix_info_t = std::mem::zeroed();
        let (ip, n) = if collect {
            let t = true;
            check(
                "PMIx_Info_load",
                sys::PMIx_Info_load(
                    &mut info,
                    key(sys::PMIX_COLLECT_DATA),
                    &t as *const bool as *const c_void,
                    sys::PMIX_BOOL as u16,
                ),
            );
            (&info as *const sys::pmix_info_t, 1)
        } else {
            (std::ptr::null(), 0)
        };
        check("PMIx_Fence", sys::PMIx_Fence(&all, 1, ip, n));
    }
}

/// PMIx_Put("dvm.test.key" = "value-from-rank-`<rank>`", GLOBAL) + PMIx_Commit.
fn put_own(rank: u32) {
    let mine = CString::new(format!("value-from-rank-{rank}")).unwrap();
    // SAFETY: zeroed value is the constructed state; PMIx_Value_load copies the string.
    unsafe {
        let mut v: sys::pmix_value_t = std::mem::zeroed();
        check("PMIx_Value_load", sys::PMIx_Value_load(&mut v, mine.as_ptr() as *const c_void, sys::PMIX_STRING as u16));
        check("PMIx_Put", sys::PMIx_Put(sys::PMIX_GLOBAL as u8, key(b"dvm.test.key\0"), &mut v));
        sys::PMIx_Value_destruct(&mut v);
        check("PMIx_Commit", sys::PMIx_Commit());
    }
}

/// A user event code (below PMIX_EXTERNAL_ERR_BASE).
const EV_CUSTOM: sys::pmix_status_t = sys::PMIX_EXTERNAL_ERR_BASE - 100;

/// What the event handler saw last of PMIX_EVENT_NODE_DOWN: its source rank (u32::MAX: none yet).
static NODE_DOWN_FROM: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn on_event(
    _id: usize,
    status: sys::pmix_status_t,
    source: *const sys::pmix_proc_t,
    _info: *mut sys::pmix_info_t,
    _ninfo: usize,
    _results: *mut sys::pmix_info_t,
    _nresults: usize,
    cbfunc: sys::pmix_event_notification_cbfunc_fn_t,
    cbdata: *mut c_void,
) {
    if status == sys::PMIX_EVENT_NODE_DOWN && !source.is_null() {
        NODE_DOWN_FROM.store((*source).rank, std::sync::atomic::Ordering::SeqCst);
    }
    if let Some(cb) = cbfunc {
        cb(sys::PMIX_EVENT_ACTION_COMPLETE, std::ptr::null_mut(), 0, None, std::ptr::null_mut(), cbdata);
    }
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "fence".into());
    // SAFETY: plain FFI calls with valid, zero-initialized arguments.
    unsafe {
        let mut me: sys::pmix_proc_t = std::mem::zeroed();
        check("PMIx_Init", sys::PMIx_Init(&mut me, std::ptr::null_mut(), 0));
        let rank = me.rank;
        let ns = me.nspace;
        let wild = proc_of(&ns, sys::PMIX_RANK_WILDCARD);
        println!("rank={rank}");
        match mode.as_str() {
            "fence" => {
                let size: u32 = get(&wild, sys::PMIX_JOB_SIZE).parse().expect("job size");
                println!("job_size={size}");
                println!("local_rank={}", get(&me, sys::PMIX_LOCAL_RANK));
                println!("node_rank={}", get(&me, sys::PMIX_NODE_RANK));
                println!("hostname={}", get(&me, sys::PMIX_HOSTNAME));
                println!("appnum={}", get(&wild, sys::PMIX_APPNUM));
                println!("univ_size={}", get(&wild, sys::PMIX_UNIV_SIZE));
                put_own(rank);
                fence(&ns, true);
                let peer = (rank + 1) % size;
                println!("peer_value={}", get(&proc_of(&ns, peer), b"dvm.test.key\0"));
                fence(&ns, false);
            }
            "getremote" => {
                // Put/commit, then get rank 1's key without a fence: rank 1 sits on another
                // node, so the server must ask its host (direct_modex).
                put_own(rank);
                println!("peer_value={}", get(&proc_of(&ns, 1), b"dvm.test.key\0"));
            }
            "abort" => {
                let msg = CString::new(format!("test abort from rank {rank}")).unwrap();
                let rc = sys::PMIx_Abort(7, msg.as_ptr(), std::ptr::null_mut(), 0);
                println!("abort_rc={rc}");
                exit(7);
            }
            "log" => {
                let text = CString::new(format!("log line from rank {rank}")).unwrap();
                let mut info: sys::pmix_info_t = std::mem::zeroed();
                check(
                    "PMIx_Info_load",
                    sys::PMIx_Info_load(
                        &mut info,
                        key(sys::PMIX_LOG_STDERR),
                        text.as_ptr() as *const c_void,
                        sys::PMIX_STRING as u16,
                    ),
                );
                let rc = sys::PMIx_Log(&info, 1, std::ptr::null(), 0);
                println!("log_rc={rc}");
                sys::PMIx_Value_destruct(&mut info.value);
            }
            "group" => {
                // A group of this proc alone that asks for a context id: libpmix must call the
                // host (an all-local group without one it completes itself).
                let mut info: sys::pmix_info_t = std::mem::zeroed();
                let t = true;
                check(
                    "PMIx_Info_load",
                    sys::PMIx_Info_load(
                        &mut info,
                        key(sys::PMIX_GROUP_ASSIGN_CONTEXT_ID),
                        &t as *const bool as *const c_void,
                        sys::PMIX_BOOL as u16,
                    ),
                );
                let grp = CString::new("dvm-test-group").unwrap();
                let (mut results, mut n): (*mut sys::pmix_info_t, usize) = (std::ptr::null_mut(), 0);
                check(
                    "PMIx_Group_construct",
                    sys::PMIx_Group_construct(grp.as_ptr(), &me, 1, &info, 1, &mut results, &mut n),
                );
                for i in 0..n {
                    let r = &*results.add(i);
                    if CStr::from_ptr(r.key.as_ptr()).to_bytes_with_nul() == sys::PMIX_GROUP_CONTEXT_ID {
                        println!("ctxid={}", r.value.data.size);
                    }
                    sys::PMIx_Value_destruct(&mut (*results.add(i)).value);
                }
                libc::free(results as *mut c_void);
                check("PMIx_Group_destruct", sys::PMIx_Group_destruct(grp.as_ptr(), std::ptr::null(), 0));
                println!("destruct=ok");
            }
            "query" => {
                // PMIX_QUERY_NUM_PSETS: not in libpmix's own store, so the host answers.
                let mut keys = [key(sys::PMIX_QUERY_NUM_PSETS) as *mut c_char, std::ptr::null_mut()];
                let mut q: sys::pmix_query_t = std::mem::zeroed();
                q.keys = keys.as_mut_ptr();
                let (mut results, mut n): (*mut sys::pmix_info_t, usize) = (std::ptr::null_mut(), 0);
                check("PMIx_Query_info", sys::PMIx_Query_info(&mut q, 1, &mut results, &mut n));
                for i in 0..n {
                    let r = &*results.add(i);
                    if CStr::from_ptr(r.key.as_ptr()).to_bytes_with_nul() == sys::PMIX_QUERY_NUM_PSETS {
                        println!("psets={}", r.value.data.size);
                    }
                    sys::PMIx_Value_destruct(&mut (*results.add(i)).value);
                }
                libc::free(results as *mut c_void);
            }
            "events" => {
                // A system code (its registration reaches the host) and a user code; then a
                // user event for the whole session (it reaches the host); then wait for the
                // NODE_DOWN the host sends back.
                // A user code alone first: its registration stays in the server.
                let mut user = [EV_CUSTOM - 1];
                let id = sys::PMIx_Register_event_handler(
                    user.as_mut_ptr(),
                    1,
                    std::ptr::null_mut(),
                    0,
                    Some(on_event),
                    None,
                    std::ptr::null_mut(),
                );
                println!("register_user_rc={}", if id < 0 { id } else { 0 });
                let mut codes = [sys::PMIX_EVENT_NODE_DOWN, EV_CUSTOM];
                let id = sys::PMIx_Register_event_handler(
                    codes.as_mut_ptr(),
                    codes.len(),
                    std::ptr::null_mut(),
                    0,
                    Some(on_event),
                    None,
                    std::ptr::null_mut(),
                );
                println!("register_rc={}", if id < 0 { id } else { 0 });
                let mut info: sys::pmix_info_t = std::mem::zeroed();
                let v = 42u32;
                check(
                    "PMIx_Info_load",
                    sys::PMIx_Info_load(
                        &mut info,
                        key(b"dvm.test.ev\0"),
                        &v as *const u32 as *const c_void,
                        sys::PMIX_UINT32 as u16,
                    ),
                );
                let rc = sys::PMIx_Notify_event(
                    EV_CUSTOM,
                    &me,
                    sys::PMIX_RANGE_SESSION as u8,
                    &info,
                    1,
                    None,
                    std::ptr::null_mut(),
                );
                println!("notify_rc={rc}");
                while NODE_DOWN_FROM.load(std::sync::atomic::Ordering::SeqCst) == u32::MAX {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                println!("node_down_from={}", NODE_DOWN_FROM.load(std::sync::atomic::Ordering::SeqCst));
            }
            m => {
                eprintln!("pmix-test-client: unknown mode {m}");
                exit(2);
            }
        }
        check("PMIx_Finalize", sys::PMIx_Finalize(std::ptr::null(), 0));
        println!("finalize=ok");
    }
}
