//! The safe wrapper over libpmix's server calls.

use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{check, PmixError, Status, SUCCESS};
use crate::event::PmixEvent;
use crate::jobinfo::JobInfo;
use crate::state::{self, Shared, STATE};
use crate::sys;
use crate::types::{key_str, nspace_buf, Info, InfoArray, InfoValue, ProcId, Rank};
use crate::upcalls;

/// Default bound on the blocking calls (register/deregister): libpmix completes them in
/// milliseconds; hitting this means libpmix is wedged.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start the server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `PMIX_SERVER_TMPDIR` (and `PMIX_SYSTEM_TMPDIR`): owned by this server alone; its
    /// contents are deleted at init (a killed daemon leaves dstore files behind).
    pub tmpdir: PathBuf,
    /// `PMIX_HOSTNAME`: the name of this node as it appears in `JobInfo::node_map`. libpmix
    /// uses it to find which node of the map is local. None: gethostname().
    pub hostname: Option<String>,
    /// `PMIX_SERVER_NSPACE` / `PMIX_SERVER_RANK`: the daemon's own name, if any.
    pub server_nspace: Option<String>,
    pub server_rank: Option<u32>,
    /// `PMIX_SERVER_SHARE_TOPOLOGY`: libpmix discovers this node's hardware topology once in
    /// `PMIx_server_init` (it always does) and, with this set, hands it to every client as
    /// job-level data of each namespace: a shared-memory copy (`pmix.hwlocfile`,
    /// `pmix.hwlocaddr`, `pmix.hwlocsize`, in `tmpdir`) and XML strings (`pmix.hwlocxml2`,
    /// `pmix.hwlocxml1`, `pmix.ltopo`). Open MPI 4.1 adopts one of them instead of running its
    /// own discovery in every rank.
    pub share_topology: bool,
    /// Bound on each blocking call (see the crate docs).
    pub op_timeout: Duration,
}

impl ServerConfig {
    pub fn new(tmpdir: impl Into<PathBuf>) -> ServerConfig {
        ServerConfig {
            tmpdir: tmpdir.into(),
            hostname: None,
            server_nspace: None,
            server_rank: None,
            share_topology: false,
            op_timeout: DEFAULT_OP_TIMEOUT,
        }
    }
}

/// Serializes init/finalize.
static LIFECYCLE: Mutex<()> = Mutex::new(());
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// The one libpmix server of this process. Methods may be called from any thread except a PMIx
/// upcall; the blocking ones wait for libpmix's completion callback (milliseconds, bounded by
/// `ServerConfig::op_timeout`). Dropping it finalizes libpmix.
#[derive(Debug)]
pub struct PmixServer {
    generation: u64,
    op_timeout: Duration,
    next_request: AtomicU64,
    finalized: bool,
    hostname: Option<String>,
}

/// A completion flag signalled by `op_done` from libpmix's thread.
type Completion = (Mutex<Option<Status>>, Condvar);

unsafe extern "C" fn op_done(status: sys::pmix_status_t, cbdata: *mut c_void) {
    // SAFETY: cbdata is an Arc<Completion> leaked by `blocking`; each callback consumes one ref.
    let c = Arc::from_raw(cbdata as *const Completion);
    *c.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
    c.1.notify_all();
}

impl PmixServer {
    /// libpmix's version string.
    pub fn version() -> String {
        // SAFETY: static string.
        unsafe { CStr::from_ptr(sys::PMIx_Get_version()) }.to_string_lossy().into_owned()
    }

    /// Cleans `config.tmpdir`, installs the upcalls and starts libpmix's server
    /// (`PMIx_server_init`, measured 16–35 ms). Every upcall becomes a [`PmixEvent`] passed to
    /// `sink` on libpmix's progress thread: `sink` must not block (e.g. an unbounded channel's
    /// send). One server per process.
    pub fn init(
        config: &ServerConfig,
        sink: impl Fn(PmixEvent) + Send + Sync + 'static,
    ) -> Result<PmixServer, PmixError> {
        const OP: &str = "PMIx_server_init";
        if state::in_upcall() {
            return Err(PmixError::CalledFromUpcall { op: OP });
        }
        let _life = LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner());
        if state::current().is_some() {
            return Err(PmixError::AlreadyInitialized);
        }
        prepare_tmpdir(&config.tmpdir)?;
        let dir = config.tmpdir.to_str().ok_or_else(|| PmixError::InvalidArgument {
            op: OP,
            detail: format!("tmpdir {} is not UTF-8", config.tmpdir.display()),
        })?;
        let mut info = InfoArray::new();
        info.push(OP, key_str(sys::PMIX_SERVER_TMPDIR), &InfoValue::String(dir.to_owned()))?;
        info.push(OP, key_str(sys::PMIX_SYSTEM_TMPDIR), &InfoValue::String(dir.to_owned()))?;
        if let Some(h) = &config.hostname {
            info.push(OP, key_str(sys::PMIX_HOSTNAME), &InfoValue::String(h.clone()))?;
        }
        if let Some(ns) = &config.server_nspace {
            info.push(OP, key_str(sys::PMIX_SERVER_NSPACE), &InfoValue::String(ns.clone()))?;
        }
        if let Some(r) = config.server_rank {
            info.push(OP, key_str(sys::PMIX_SERVER_RANK), &InfoValue::Rank(Rank::Id(r)))?;
        }
        if config.share_topology {
            info.push(OP, key_str(sys::PMIX_SERVER_SHARE_TOPOLOGY), &InfoValue::Bool(true))?;
        }

        let generation = GENERATION.fetch_add(1, Ordering::SeqCst);
        *STATE.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(Shared { sink: Box::new(sink), generation }));
        let mut module = upcalls::module();
        let t0 = Instant::now();
        // SAFETY: module and info are valid for the call; libpmix copies the module.
        let rc = unsafe { sys::PMIx_server_init(&mut module, info.as_mut_ptr(), info.len()) };
        let took = t0.elapsed();
        if let Err(e) = check(OP, rc) {
            *STATE.write().unwrap_or_else(|e| e.into_inner()) = None;
            tracing::error!(tmpdir = %config.tmpdir.display(), error = %e, "PMIx server init failed");
            return Err(e);
        }
        tracing::info!(
            tmpdir = %config.tmpdir.display(),
            version = %Self::version(),
            ms = took.as_secs_f64() * 1e3,
            "PMIx server initialized"
        );
        Ok(PmixServer {
            generation,
            op_timeout: config.op_timeout,
            next_request: AtomicU64::new(1),
            finalized: false,
            hostname: config.hostname.clone(),
        })
    }

    /// Runs a libpmix call that completes through a `pmix_op_cbfunc_t` and waits for it.
    /// `keep` (e.g. the info array the call reads asynchronously) lives until completion; on
    /// timeout it is leaked, since libpmix may still read it.
    fn blocking<K>(
        &self,
        op: &'static str,
        keep: K,
        start: impl FnOnce(sys::pmix_op_cbfunc_t, *mut c_void) -> Option<Status>,
    ) -> Result<Duration, PmixError> {
        if state::in_upcall() {
            return Err(PmixError::CalledFromUpcall { op });
        }
        let c: Arc<Completion> = Arc::new((Mutex::new(None), Condvar::new()));
        let raw = Arc::into_raw(c.clone()) as *mut c_void;
        let t0 = Instant::now();
        if let Some(rc) = start(Some(op_done), raw) {
            if rc != SUCCESS {
                // SAFETY: libpmix refused the call, so it will not call op_done: reclaim the ref.
                drop(unsafe { Arc::from_raw(raw as *const Completion) });
                if rc == sys::PMIX_OPERATION_SUCCEEDED {
                    return Ok(t0.elapsed());
                }
                return check(op, rc).map(|_| t0.elapsed());
            }
        }
        let deadline = t0 + self.op_timeout;
        let mut done = c.0.lock().unwrap_or_else(|e| e.into_inner());
        while done.is_none() {
            let now = Instant::now();
            if now >= deadline {
                drop(done);
                std::mem::forget(keep);
                tracing::error!(op, ms = self.op_timeout.as_millis(), "libpmix did not complete a blocking call");
                return Err(PmixError::Timeout { op, ms: self.op_timeout.as_millis() });
            }
            done = c.1.wait_timeout(done, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        let status = done.expect("loop exits on Some");
        drop(done);
        drop(keep);
        check(op, status).map(|_| t0.elapsed())
    }

    /// Registers a job's nspace with `n_local` procs on this node and the job-level keys from
    /// `job` (see [`JobInfo`]). Blocks until libpmix has processed it.
    pub fn register_nspace(&self, nspace: &str, n_local: u32, job: &JobInfo) -> Result<Duration, PmixError> {
        const OP: &str = "PMIx_server_register_nspace";
        job.validate(OP, nspace)?;
        // With no local procs (a job of other nodes, registered so that its procs can be
        // named here) this node need not be in the map.
        if let Some(h) = self.hostname.as_ref().filter(|_| n_local > 0) {
            let Some(idx) = job.node_map.iter().position(|n| n == h) else {
                return Err(PmixError::InvalidArgument {
                    op: OP,
                    detail: format!("nspace {nspace}: this server's hostname {h} is not in node_map"),
                });
            };
            if job.proc_map[idx].len() != n_local as usize {
                return Err(PmixError::InvalidArgument {
                    op: OP,
                    detail: format!(
                        "nspace {nspace}: n_local {n_local} but proc_map has {} ranks on {h}",
                        job.proc_map[idx].len()
                    ),
                });
            }
        }
        // Boxed: the buffer must not move or die before libpmix completes (even on timeout).
        let ns = Box::new(nspace_buf(OP, nspace)?);
        let nlocal = i32::try_from(n_local)
            .map_err(|_| PmixError::InvalidArgument { op: OP, detail: format!("n_local {n_local} too large") })?;
        let mut info = job.to_info(OP)?;
        let (ptr, len, nsp) = (info.as_mut_ptr(), info.len(), ns.as_ptr());
        let took = self.blocking(OP, (info, ns), |cb, cbdata| {
            // SAFETY: ns and info (heap) are kept alive by `blocking` until completion.
            Some(unsafe { sys::PMIx_server_register_nspace(nsp, nlocal, ptr, len, cb, cbdata) })
        })?;
        tracing::debug!(nspace, n_local, job_size = job.job_size, ms = took.as_secs_f64() * 1e3, "nspace registered");
        Ok(took)
    }

    /// Purges an nspace (after all its local procs are reaped). Blocks; measured 4–25 ms.
    pub fn deregister_nspace(&self, nspace: &str) -> Result<Duration, PmixError> {
        const OP: &str = "PMIx_server_deregister_nspace";
        let ns = Box::new(nspace_buf(OP, nspace)?);
        let nsp = ns.as_ptr();
        let took = self.blocking(OP, ns, |cb, cbdata| {
            // SAFETY: ns lives until completion.
            unsafe { sys::PMIx_server_deregister_nspace(nsp, cb, cbdata) };
            None
        })?;
        tracing::debug!(nspace, ms = took.as_secs_f64() * 1e3, "nspace deregistered");
        Ok(took)
    }

    /// As [`Self::deregister_nspace`] without blocking: returns at once and posts
    /// [`PmixEvent::NspaceDeregistered`] when libpmix is done (measured 3–27 ms later).
    pub fn deregister_nspace_nb(&self, nspace: &str) -> Result<(), PmixError> {
        const OP: &str = "PMIx_server_deregister_nspace";
        let ns = nspace_buf(OP, nspace)?;
        let ctx = Box::new(upcalls::DeregisterCtx { nspace: nspace.to_owned(), buf: ns });
        let nsp = ctx.buf.as_ptr();
        // SAFETY: ctx (holding the nspace buffer) is consumed by deregister_done; the void call
        // always completes through its cbfunc.
        unsafe {
            sys::PMIx_server_deregister_nspace(nsp, Some(upcalls::deregister_done), Box::into_raw(ctx) as *mut c_void)
        };
        Ok(())
    }

    /// Registers a local client (before `setup_fork` and the fork). Blocks until processed.
    pub fn register_client(&self, nspace: &str, rank: u32, uid: u32, gid: u32) -> Result<Duration, PmixError> {
        const OP: &str = "PMIx_server_register_client";
        let p = Box::new(ProcId::new(nspace, Rank::Id(rank)).to_raw(OP)?);
        let pp: *const sys::pmix_proc_t = &*p;
        self.blocking(OP, p, |cb, cbdata| {
            // SAFETY: the proc lives until completion.
            Some(unsafe { sys::PMIx_server_register_client(pp, uid, gid, std::ptr::null_mut(), cb, cbdata) })
        })
    }

    /// Forgets a local client (after it was reaped). Blocks until processed.
    pub fn deregister_client(&self, nspace: &str, rank: u32) -> Result<Duration, PmixError> {
        const OP: &str = "PMIx_server_deregister_client";
        let p = Box::new(ProcId::new(nspace, Rank::Id(rank)).to_raw(OP)?);
        let pp: *const sys::pmix_proc_t = &*p;
        self.blocking(OP, p, |cb, cbdata| {
            // SAFETY: the proc lives until completion.
            unsafe { sys::PMIx_server_deregister_client(pp, cb, cbdata) };
            None
        })
    }

    /// The environment a registered client needs (PMIX_NAMESPACE, PMIX_RANK, PMIX_SERVER_URI*,
    /// dstore paths, ...): add all of it to the child's environment.
    pub fn setup_fork(&self, nspace: &str, rank: u32) -> Result<Vec<(String, String)>, PmixError> {
        const OP: &str = "PMIx_server_setup_fork";
        let p = ProcId::new(nspace, Rank::Id(rank)).to_raw(OP)?;
        let mut env: *mut *mut c_char = std::ptr::null_mut();
        // SAFETY: p is valid; env starts as an empty (NULL) argv that libpmix grows with malloc.
        let rc = unsafe { sys::PMIx_server_setup_fork(&p, &mut env) };
        let vars = take_argv(env);
        check(OP, rc)?;
        Ok(vars.into_iter().filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))).collect())
    }

    /// Asks libpmix for a local proc's modex blob (to answer another daemon's direct_modex).
    /// Returns a request id at once; the answer arrives as [`PmixEvent::DmodexData`] with that
    /// id (libpmix waits until the proc has committed its data).
    pub fn dmodex_request(&self, nspace: &str, rank: u32) -> Result<u64, PmixError> {
        const OP: &str = "PMIx_server_dmodex_request";
        let proc = ProcId::new(nspace, Rank::Id(rank));
        let p = proc.to_raw(OP)?;
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        let ctx = Box::into_raw(Box::new(upcalls::DmodexCtx { request, proc }));
        // SAFETY: p is valid for the call (libpmix copies the name); ctx is consumed by dmodex_done.
        let rc = unsafe { sys::PMIx_server_dmodex_request(&p, Some(upcalls::dmodex_done), ctx as *mut c_void) };
        if rc != SUCCESS {
            // SAFETY: refused, so dmodex_done will not run: reclaim ctx.
            drop(unsafe { Box::from_raw(ctx) });
            check(OP, rc)?;
        }
        Ok(request)
    }

    /// Hands an event to this server (`PMIx_Notify_event` called by the host), which sends it
    /// to each of its clients that registered for `status`, except `source` itself. libpmix
    /// 4.2.2 copies everything before it returns and filters by range only when `info` holds
    /// `PMIX_EVENT_CUSTOM_RANGE` (then `range` must be `PMIX_RANGE_CUSTOM`); it keeps the event
    /// for clients that register later unless `PMIX_EVENT_DO_NOT_CACHE` is set. Never blocks.
    pub fn notify_event(&self, status: Status, source: &ProcId, range: u8, info: &[Info]) -> Result<(), PmixError> {
        const OP: &str = "PMIx_Notify_event";
        if state::in_upcall() {
            return Err(PmixError::CalledFromUpcall { op: OP });
        }
        let src = source.to_raw(OP)?;
        let mut arr = InfoArray::new();
        for i in info {
            arr.push(OP, &i.key, &i.value)?;
        }
        // SAFETY: src and arr are valid for the call, which copies both before it returns; no
        // cbfunc is given (libpmix checks for NULL).
        let rc = unsafe {
            sys::PMIx_Notify_event(status, &src, range, arr.as_mut_ptr(), arr.len(), None, std::ptr::null_mut())
        };
        if rc == sys::PMIX_OPERATION_SUCCEEDED {
            return Ok(());
        }
        check(OP, rc)
    }

    /// Stops libpmix's server. Outstanding replies are discarded afterwards (never called into a
    /// finalized library). Also done by Drop.
    pub fn finalize(mut self) -> Result<(), PmixError> {
        self.finalize_inner()
    }

    fn finalize_inner(&mut self) -> Result<(), PmixError> {
        if self.finalized {
            return Ok(());
        }
        self.finalized = true;
        if state::in_upcall() {
            return Err(PmixError::CalledFromUpcall { op: "PMIx_server_finalize" });
        }
        let _life = LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut st = STATE.write().unwrap_or_else(|e| e.into_inner());
            if st.as_ref().map(|s| s.generation) == Some(self.generation) {
                *st = None;
            }
        }
        let t0 = Instant::now();
        // SAFETY: the server was initialized by this object and is finalized once.
        let rc = unsafe { sys::PMIx_server_finalize() };
        tracing::info!(ms = t0.elapsed().as_secs_f64() * 1e3, "PMIx server finalized");
        check("PMIx_server_finalize", rc)
    }
}

impl Drop for PmixServer {
    fn drop(&mut self) {
        if let Err(e) = self.finalize_inner() {
            tracing::error!(error = %e, "PMIx server finalize failed");
        }
    }
}

/// Copies and frees a malloc'ed NULL-terminated argv from libpmix.
fn take_argv(argv: *mut *mut c_char) -> Vec<String> {
    let mut out = Vec::new();
    if argv.is_null() {
        return out;
    }
    // SAFETY: libpmix built argv with malloc'ed strings and a NULL terminator; we own it now.
    unsafe {
        let mut i = 0;
        loop {
            let s = *argv.add(i);
            if s.is_null() {
                break;
            }
            out.push(CStr::from_ptr(s).to_string_lossy().into_owned());
            libc::free(s as *mut c_void);
            i += 1;
        }
        libc::free(argv as *mut c_void);
    }
    out
}

/// Empties (or creates) the server's private tmpdir. Refuses paths too short to be private.
fn prepare_tmpdir(dir: &Path) -> Result<(), PmixError> {
    let err = |source| PmixError::TmpDir { path: dir.display().to_string(), source };
    if !dir.is_absolute() || dir.components().count() < 3 {
        return Err(PmixError::InvalidArgument {
            op: "PMIx_server_init",
            detail: format!(
                "tmpdir {} must be an absolute private directory (its contents are deleted)",
                dir.display()
            ),
        });
    }
    if dir.exists() {
        for entry in std::fs::read_dir(dir).map_err(err)? {
            let entry = entry.map_err(err)?;
            let path = entry.path();
            let r = if entry.file_type().map_err(err)?.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            r.map_err(err)?;
        }
    } else {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobinfo::{AppInfo, ProcData};

    fn job(nodes: &[&str], ranks: &[&[u32]], size: u32) -> JobInfo {
        JobInfo {
            node_map: nodes.iter().map(|s| s.to_string()).collect(),
            proc_map: ranks.iter().map(|r| r.to_vec()).collect(),
            job_size: size,
            universe_size: size,
            ..Default::default()
        }
    }

    /// The daemon moves the server and events into its actor: they must be Send (+ Sync server).
    #[test]
    fn types_cross_threads() {
        fn send<T: Send>() {}
        fn sync<T: Sync>() {}
        send::<PmixServer>();
        sync::<PmixServer>();
        send::<PmixEvent>();
        send::<crate::Reply>();
        send::<crate::FenceReply>();
        send::<crate::ModexReply>();
        send::<crate::InfoReply>();
    }

    #[test]
    fn map_strings() {
        let j = job(&["n0", "n1"], &[&[0, 2], &[1, 3]], 4);
        j.validate("t", "ns").unwrap();
        assert_eq!(j.node_map_string(), "n0,n1");
        assert_eq!(j.proc_map_string(), "0,2;1,3");
    }

    #[test]
    fn inconsistent_maps_are_named_errors() {
        for (j, needle) in [
            (job(&["n0"], &[&[0], &[1]], 2), "proc_map has 2"),
            (job(&["n0", "n1"], &[&[0], &[0]], 2), "rank 0 appears twice"),
            (job(&["n0"], &[&[0, 5]], 2), "rank 5 on node n0"),
            (job(&["n0"], &[&[0]], 2), "rank 1 of job_size 2"),
            (job(&["n,0"], &[&[0]], 1), "hostname"),
            (job(&["n0", "n1"], &[&[0], &[]], 1), "node n1 has no ranks"),
        ] {
            let e = j.validate("t", "ns7").unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("ns7"), "{e}");
        }
    }

    /// Every rank's proc data against a naive reading of the maps: its node is the one listing
    /// it, its local rank the count of lower ranks there, its app the last app starting at or
    /// below it.
    #[test]
    fn proc_data_from_the_maps() {
        for (nodes, ranks, firsts) in [
            (&["a", "b"][..], &[&[0, 2, 4][..], &[1, 3]][..], &[0, 3][..]),
            (&["a", "b", "c"], &[&[5, 0], &[1, 2], &[3, 4]], &[0, 1, 4]),
            (&["a"], &[&[0, 1, 2, 3]], &[0]),
        ] {
            let size = ranks.iter().map(|r| r.len() as u32).sum();
            let mut j = job(nodes, ranks, size);
            j.apps = firsts.iter().map(|&first_rank| AppInfo { first_rank, ..Default::default() }).collect();
            j.validate("t", "ns").unwrap();
            let got = j.proc_data();
            assert_eq!(got.len() as u32, size);
            for (r, p) in got.iter().enumerate() {
                let r = r as u32;
                let node = ranks.iter().position(|l| l.contains(&r)).unwrap();
                let local = ranks[node].iter().filter(|&&x| x < r).count() as u16;
                let app = firsts.iter().rposition(|&f| f <= r).unwrap();
                let want = ProcData {
                    rank: r,
                    appnum: app as u32,
                    app_rank: r - firsts[app],
                    local_rank: local,
                    node_rank: local,
                    nodeid: node as u32,
                    hostname: nodes[node].to_string(),
                };
                assert_eq!(p, &want, "{nodes:?} {ranks:?} {firsts:?}");
            }
            // Proc data for every rank, app info for every app, node info for every node.
            let info = j.to_info("t").unwrap();
            // SAFETY: each key is a NUL-terminated string inside its pmix_info_t.
            let keys: Vec<String> = info
                .items()
                .iter()
                .map(|i| unsafe { CStr::from_ptr(i.key.as_ptr()) }.to_string_lossy().into())
                .collect();
            let count = |k: &'static [u8]| keys.iter().filter(|x| x.as_str() == key_str(k)).count();
            assert_eq!(count(sys::PMIX_PROC_DATA) as u32, size);
            assert_eq!(count(sys::PMIX_APP_INFO_ARRAY), firsts.len());
            assert_eq!(count(sys::PMIX_NODE_INFO_ARRAY), nodes.len());
            assert_eq!(count(sys::PMIX_APPNUM), 0, "no job-level appnum beside the apps'");
        }
    }

    #[test]
    fn inconsistent_apps_are_named_errors() {
        let app = |first_rank| AppInfo { first_rank, ..Default::default() };
        for (apps, needle) in [
            (vec![app(1)], "app 0 starts at rank 1"),
            (vec![app(0), app(2), app(2)], "app 2 starts at rank 2"),
            (vec![app(0), app(4)], "app 1 starts at rank 4"),
        ] {
            let mut j = job(&["n0"], &[&[0, 1, 2, 3]], 4);
            j.apps = apps;
            let e = j.validate("t", "ns7").unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("ns7"), "{e}");
        }
    }

    #[test]
    fn tmpdir_must_be_private() {
        assert!(prepare_tmpdir(Path::new("/tmp")).is_err());
        assert!(prepare_tmpdir(Path::new("/")).is_err());
        assert!(prepare_tmpdir(Path::new("rel/dir/x")).is_err());
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("srv");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("stale"), b"x").unwrap();
        prepare_tmpdir(&d).unwrap();
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
    }
}
