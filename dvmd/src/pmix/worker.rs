//! The PMIx worker: the child process of a daemon that hosts libpmix's server
//! (`dvmd --pmix-worker CMD_FD,EVENT_FD`, started by `link::Worker::spawn`).
//!
//! Why a process: libpmix 4.2.2 keeps what it holds for every client that ever connected
//! until `PMIx_server_finalize`, and its server cannot be started twice in one process
//! (docs/soak.md). A daemon serving thousands of jobs would grow without bound; a worker that
//! is ended while idle gives all of it back, and its successor starts clean.
//!
//! Owns: the `PmixServer`, the upcall replies libpmix waits on (numbered, completed when the
//! daemon says so), and the two sockets. Never: a decision. Every upcall goes to the daemon
//! as a `WorkerEvent` and every reply is the daemon's; the worker only translates.
//!
//! Threads: the main thread reads commands and makes the blocking libpmix calls; a writer
//! thread numbers each upcall's reply, keeps it, and sends the event (upcalls run on libpmix's
//! progress thread and only post to it). End of the command stream — the daemon closed it or
//! died — finalizes the server and exits; the daemon kills a worker that does not end in time.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use dvm_proto::pmixworker::{
    self as wire, worker_cmd::Body as Cmd, worker_event::Body as Ev, WorkerCmd, WorkerEvent, WorkerReply,
};
use pmix_shim::{
    FenceReply, InfoReply, JobInfo, LookupReply, ModexReply, PmixEvent, PmixServer, ProcId, Published, Reply,
    ServerConfig, SpawnReply,
};
use prost::Message;
use tracing::{debug, error, info};

use super::frame::{read_frame, write_frame};

/// A libpmix reply kept until the daemon completes it.
enum Pending {
    Op(Reply),
    Fence(FenceReply),
    Modex(ModexReply),
    Info(InfoReply),
    Spawn(SpawnReply),
    Lookup(LookupReply),
}

impl Pending {
    /// `data`: a fence's or modex's bytes; a spawn's nspace (UTF-8); a lookup's
    /// `LookupResult`; a query's or group's `InfoResult` (empty: no infos).
    fn complete(self, status: pmix_shim::Status, data: &[u8]) {
        match self {
            Pending::Op(r) => r.complete(status),
            // A job control's status alone; a query's or group's infos as an `InfoResult`.
            Pending::Info(r) if data.is_empty() => r.complete(status),
            Pending::Info(r) => match wire::InfoResult::decode(data) {
                Ok(res) => r.complete_with_info(status, super::value::infos_from_wire(&res.infos)),
                Err(e) => {
                    error!("PMIx worker: undecodable info result: {e}");
                    r.complete(pmix_shim::ERR_BAD_PARAM)
                }
            },
            Pending::Fence(r) => r.complete(status, data),
            Pending::Modex(r) => r.complete(status, data),
            Pending::Spawn(r) => match std::str::from_utf8(data) {
                Ok(ns) => r.complete(status, ns),
                Err(_) => r.complete(pmix_shim::ERR_BAD_PARAM, ""),
            },
            Pending::Lookup(r) => match wire::LookupResult::decode(data) {
                Ok(res) => {
                    let found = res
                        .found
                        .iter()
                        .filter_map(|p| {
                            let info = super::value::from_wire(p.value.as_ref()?)?;
                            let proc = p.proc.as_ref()?;
                            let proc = ProcId::new(proc.nspace.clone(), pmix_shim::Rank::from_raw(proc.rank));
                            Some(Published { proc, key: info.key, value: info.value })
                        })
                        .collect();
                    r.complete(status, found)
                }
                Err(e) => {
                    error!("PMIx worker: undecodable lookup result: {e}");
                    r.complete(pmix_shim::ERR_BAD_PARAM, Vec::new())
                }
            },
        }
    }
}

type Replies = Arc<Mutex<HashMap<u64, Pending>>>;

/// The command that starts a worker by exec: `program --pmix-worker CMD_FD,EVENT_FD`, the two
/// descriptors kept open across the exec (every other keeps its close-on-exec flag), no stdin,
/// no stdout; stderr and the process group are the caller's. `program` is dvmd.
pub fn command(program: &std::path::Path, cmd_fd: RawFd, ev_fd: RawFd) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut c = std::process::Command::new(program);
    c.arg("--pmix-worker").arg(format!("{cmd_fd},{ev_fd}"));
    c.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
    // SAFETY: between fork and exec only an async-signal-safe call (fcntl).
    unsafe {
        c.pre_exec(move || {
            for fd in [cmd_fd, ev_fd] {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    };
    c
}

/// Parse `CMD_FD,EVENT_FD` as passed on the worker's command line ([`command`]'s inverse).
pub fn parse_fds(arg: &str) -> Option<(RawFd, RawFd)> {
    let (a, b) = arg.split_once(',')?;
    let (a, b): (RawFd, RawFd) = (a.parse().ok()?, b.parse().ok()?);
    (a > 2 && b > 2 && a != b).then_some((a, b))
}

fn fd_is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// Run the worker on the two inherited sockets until the daemon closes the command stream.
/// Returns the process exit status.
pub fn run(cmd_fd: RawFd, ev_fd: RawFd) -> u8 {
    if !fd_is_open(cmd_fd) || !fd_is_open(ev_fd) {
        crate::say!("dvmd --pmix-worker: descriptors {cmd_fd},{ev_fd} are not open (this mode is started by a daemon)");
        return 2;
    }
    // SAFETY: both descriptors were checked open and were handed to this process for exactly
    // this use (the daemon cleared their close-on-exec flag for us and nothing else owns them).
    let (cmd, ev) = unsafe { (UnixStream::from_raw_fd(cmd_fd), UnixStream::from_raw_fd(ev_fd)) };
    for fd in [cmd_fd, ev_fd] {
        // Not inherited by anything libpmix might start.
        // SAFETY: setting FD_CLOEXEC on a descriptor this process owns.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    // One name for ps and pgrep however it started (a forked worker's command line is its
    // daemon's, an exec'd one's `/proc/self/exe --pmix-worker`).
    let _ = nix::sys::prctl::set_name(c"pmix-worker");
    // Still one thread: what libpmix reads from the environment at init goes there now.
    server_env();
    let replies: Replies = Arc::new(Mutex::new(HashMap::new()));
    let (tx, rx) = mpsc::channel::<PmixEvent>();
    let writer_replies = replies.clone();
    let writer = std::thread::Builder::new().name("pmix-events".into()).spawn(move || {
        let mut out = BufWriter::new(ev);
        let mut next = 1u64;
        for event in rx {
            let (pending, body) = translate(event);
            let reply = match pending {
                Some(p) => {
                    let id = next;
                    next += 1;
                    writer_replies.lock().unwrap_or_else(|e| e.into_inner()).insert(id, p);
                    id
                }
                None => 0,
            };
            if write_frame(&mut out, &WorkerEvent { reply, body: Some(body) }).is_err() {
                // The daemon is gone; the command stream ends too and the main thread exits.
                return;
            }
        }
    });
    if let Err(e) = writer {
        error!("PMIx worker: cannot start its event thread: {e}");
        return 1;
    }
    let mut input = BufReader::new(match cmd.try_clone() {
        Ok(c) => c,
        Err(e) => {
            error!("PMIx worker: cannot use its command socket: {e}");
            return 1;
        }
    });
    let mut output = BufWriter::new(cmd);
    let mut server: Option<PmixServer> = None;
    let status = loop {
        let cmd = match read_frame::<WorkerCmd>(&mut input) {
            Ok(Some(c)) => c,
            Ok(None) => break 0,
            // The daemon ended without closing the stream first (its process exited with this
            // worker's replies or events unread, as a one-shot DVM's HNP does): the ordinary
            // end, not an error to print on the user's terminal.
            Err(e) if daemon_gone(&e) => {
                debug!("PMIx worker: the daemon is gone ({e})");
                break 0;
            }
            Err(e) => {
                error!("PMIx worker: command stream broken: {e}");
                break 1;
            }
        };
        let reply = match cmd.body {
            Some(Cmd::Complete(c)) => {
                // Not answered: the daemon does not wait for completions.
                let pending = replies.lock().unwrap_or_else(|e| e.into_inner()).remove(&c.reply);
                match pending {
                    Some(p) => p.complete(c.status, &c.data),
                    None => error!(reply = c.reply, "PMIx worker: no upcall reply with this number is waiting"),
                }
                continue;
            }
            Some(body) => execute(body, &mut server, &tx),
            None => failed("an empty command"),
        };
        if write_frame(&mut output, &reply).is_err() {
            break 0;
        }
    };
    // Replies still held fail (their clients are being ended with the daemon's job); then
    // the server goes, which is what gives the memory back.
    replies.lock().unwrap_or_else(|e| e.into_inner()).clear();
    if let Some(s) = server {
        if let Err(e) = s.finalize() {
            error!("PMIx worker: finalize: {e}");
        }
    }
    status
}

/// The environment libpmix's server reads at `PMIx_server_init`: the cached topology, the
/// data stores it opens. Changes the process environment: call while single-threaded.
fn server_env() {
    super::topo_cache::prepare_worker();
    if std::env::var_os("PMIX_MCA_gds").is_none() {
        std::env::set_var("PMIX_MCA_gds", super::SERVER_GDS);
    }
}

/// A read error that only means the daemon's end of the stream is gone.
fn daemon_gone(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    matches!(e.kind(), ConnectionReset | BrokenPipe | ConnectionAborted | UnexpectedEof)
}

fn failed(what: impl std::fmt::Display) -> WorkerReply {
    WorkerReply { error: what.to_string(), ..Default::default() }
}

fn execute(body: Cmd, server: &mut Option<PmixServer>, tx: &mpsc::Sender<PmixEvent>) -> WorkerReply {
    if let Cmd::Init(init) = body {
        if server.is_some() {
            return failed("the PMIx server of this worker is already running");
        }
        let mut cfg = ServerConfig::new(init.tmpdir);
        cfg.hostname = (!init.hostname.is_empty()).then_some(init.hostname);
        cfg.share_topology = init.share_topology;
        if init.op_timeout_ms > 0 {
            cfg.op_timeout = Duration::from_millis(init.op_timeout_ms);
        }
        let tx = tx.clone();
        return match PmixServer::init(&cfg, move |ev| {
            let _ = tx.send(ev);
        }) {
            Ok(s) => {
                *server = Some(s);
                info!(pid = std::process::id(), "PMIx worker up");
                WorkerReply { version: PmixServer::version(), pid: std::process::id(), ..Default::default() }
            }
            Err(e) => {
                super::topo_cache::forget_after_failed_init();
                failed(e)
            }
        };
    }
    let Some(s) = server.as_ref() else {
        return failed("the PMIx server of this worker is not started");
    };
    match body {
        Cmd::Init(_) => unreachable!("handled above"),
        Cmd::RegisterNspace(r) => {
            let proc_map: Vec<Vec<u32>> = r.proc_map.into_iter().map(|l| l.ranks).collect();
            let proc_extra = proc_places(&r.places);
            let apps = r
                .apps
                .into_iter()
                .map(|a| pmix_shim::AppInfo { first_rank: a.first_rank, argv: a.argv, wdir: a.wdir })
                .collect();
            // A key with no wire form never leaves the daemon (value::to_wire): none is lost here.
            let extra = r.extra.iter().filter_map(super::value::from_wire).collect();
            let info = JobInfo {
                node_map: r.node_map,
                proc_map,
                job_size: r.job_size,
                universe_size: r.universe_size,
                appnum: r.appnum,
                jobid: (!r.jobid.is_empty()).then_some(r.jobid),
                max_procs: None,
                extra,
                apps,
                proc_extra,
            };
            match s.register_nspace(&r.nspace, r.n_local, &info) {
                Ok(took) => {
                    debug!(nspace = %r.nspace, ?took, "namespace registered");
                    WorkerReply::default()
                }
                Err(e) => failed(e),
            }
        }
        Cmd::PrepareClient(c) => {
            let registered =
                if c.registered { Ok(()) } else { s.register_client(&c.nspace, c.rank, c.uid, c.gid).map(drop) };
            match registered.and_then(|()| s.setup_fork(&c.nspace, c.rank)) {
                Ok(env) => WorkerReply {
                    env: env.into_iter().map(|(key, value)| wire::EnvVar { key, value }).collect(),
                    ..Default::default()
                },
                Err(e) => failed(e),
            }
        }
        Cmd::RegisterClients(r) => {
            match r.ranks.iter().try_for_each(|&rank| s.register_client(&r.nspace, rank, r.uid, r.gid).map(drop)) {
                Ok(()) => WorkerReply::default(),
                Err(e) => failed(e),
            }
        }
        Cmd::DeregisterNspace(d) => match s.deregister_nspace_nb(&d.nspace) {
            Ok(()) => WorkerReply::default(),
            Err(e) => failed(e),
        },
        Cmd::DmodexRequest(d) => match s.dmodex_request(&d.nspace, d.rank) {
            Ok(request) => WorkerReply { request, ..Default::default() },
            Err(e) => failed(e),
        },
        Cmd::Notify(n) => {
            let source = proc_from(n.source.as_ref());
            let info = super::value::infos_from_wire(&n.info);
            let range = u8::try_from(n.range).unwrap_or(u8::MAX);
            match s.notify_event(n.status, &source, range, &info) {
                Ok(()) => WorkerReply::default(),
                Err(e) => failed(e),
            }
        }
        Cmd::Complete(_) => unreachable!("completions are handled by the command loop"),
    }
}

fn proc_from(p: Option<&wire::Proc>) -> ProcId {
    let p = p.cloned().unwrap_or_default();
    ProcId::new(p.nspace, pmix_shim::Rank::from_raw(p.rank))
}

fn proc_of(p: &ProcId) -> wire::Proc {
    wire::Proc { nspace: p.nspace.clone(), rank: p.rank.to_raw() }
}

fn proc_set(procs: &[ProcId], info: &[pmix_shim::Info]) -> wire::ProcSet {
    let timeout = pmix_shim::find_info(info, pmix_shim::sys::PMIX_TIMEOUT).and_then(|v| v.as_i64()).unwrap_or(0);
    wire::ProcSet { procs: procs.iter().map(proc_of).collect(), timeout: i32::try_from(timeout).unwrap_or(0) }
}

/// An upcall as an event, and the reply it leaves waiting.
fn translate(ev: PmixEvent) -> (Option<Pending>, Ev) {
    match ev {
        PmixEvent::ClientConnected { proc, reply } => (Some(Pending::Op(reply)), Ev::ClientConnected(proc_of(&proc))),
        PmixEvent::ClientFinalized { proc, reply } => (Some(Pending::Op(reply)), Ev::ClientFinalized(proc_of(&proc))),
        PmixEvent::Abort { proc, status, message, reply, .. } => {
            (Some(Pending::Op(reply)), Ev::Abort(wire::Abort { proc: Some(proc_of(&proc)), status, message }))
        }
        PmixEvent::FenceNb(req) => {
            let fence = wire::Fence {
                procs: req.procs.iter().map(proc_of).collect(),
                collect: req.collect,
                timeout: req.timeout.unwrap_or(0),
                has_local_status: req.local_status.is_some(),
                local_status: req.local_status.unwrap_or(0),
                data: Bytes::from(req.data),
            };
            (Some(Pending::Fence(req.reply)), Ev::Fence(fence))
        }
        PmixEvent::DirectModex { proc, reply, .. } => (Some(Pending::Modex(reply)), Ev::DirectModex(proc_of(&proc))),
        PmixEvent::Log { client, text, reply, .. } => (
            Some(Pending::Op(reply)),
            Ev::Log(wire::Log {
                client: Some(proc_of(&client)),
                has_text: text.is_some(),
                text: text.unwrap_or_default(),
            }),
        ),
        PmixEvent::JobControl { requestor, reply, .. } => {
            (Some(Pending::Info(reply)), Ev::JobControl(proc_of(&requestor)))
        }
        PmixEvent::Spawn { proc, job_info, apps, reply } => {
            let apps = apps
                .into_iter()
                .map(|a| wire::SpawnApp {
                    cmd: a.cmd,
                    argv: a.argv,
                    env: a.env,
                    cwd: a.cwd,
                    maxprocs: a.maxprocs,
                    info: super::value::infos_to_wire(&a.info),
                })
                .collect();
            let job_info = super::value::infos_to_wire(&job_info);
            (Some(Pending::Spawn(reply)), Ev::Spawn(wire::Spawn { proc: Some(proc_of(&proc)), job_info, apps }))
        }
        PmixEvent::Connect { procs, info, reply } => (Some(Pending::Op(reply)), Ev::Connect(proc_set(&procs, &info))),
        PmixEvent::Disconnect { procs, info, reply } => {
            (Some(Pending::Op(reply)), Ev::Disconnect(proc_set(&procs, &info)))
        }
        PmixEvent::Publish { proc, info, reply } => (
            Some(Pending::Op(reply)),
            Ev::Publish(wire::Publish { proc: Some(proc_of(&proc)), info: super::value::infos_to_wire_marked(&info) }),
        ),
        PmixEvent::Lookup { proc, keys, info, reply } => (
            Some(Pending::Lookup(reply)),
            Ev::Lookup(wire::Lookup { proc: Some(proc_of(&proc)), keys, info: super::value::infos_to_wire(&info) }),
        ),
        PmixEvent::Unpublish { proc, keys, info, reply } => (
            Some(Pending::Op(reply)),
            Ev::Unpublish(wire::Lookup { proc: Some(proc_of(&proc)), keys, info: super::value::infos_to_wire(&info) }),
        ),
        PmixEvent::Query { queries, reply } => {
            let queries = queries
                .into_iter()
                .map(|q| wire::Query { keys: q.keys, qualifiers: super::value::infos_to_wire(&q.qualifiers) })
                .collect();
            (Some(Pending::Info(reply)), Ev::Query(wire::QueryRequest { queries }))
        }
        PmixEvent::Group { op, id, procs, directives, reply } => (
            Some(Pending::Info(reply)),
            Ev::Group(wire::Group {
                construct: op == pmix_shim::GroupOp::Construct,
                id,
                procs: procs.iter().map(proc_of).collect(),
                directives: super::value::infos_to_wire(&directives),
            }),
        ),
        PmixEvent::DmodexData { request, proc, status, data } => (
            None,
            Ev::DmodexData(wire::DmodexData { request, proc: Some(proc_of(&proc)), status, data: Bytes::from(data) }),
        ),
        PmixEvent::NspaceDeregistered { nspace, status } => {
            (None, Ev::NspaceDeregistered(wire::NspaceDeregistered { nspace, status }))
        }
        PmixEvent::Notify { status, source, range, info } => (
            None,
            Ev::Notify(wire::Notify {
                status,
                source: Some(proc_of(&source)),
                range: range.into(),
                info: super::value::infos_to_wire(&info),
            }),
        ),
        PmixEvent::RegisterEvents { codes, info } => {
            (None, Ev::RegisterEvents(wire::RegisterEvents { codes, info: super::value::infos_to_wire(&info) }))
        }
    }
}

/// The cpuset and locality of each bound rank, added to its `PMIX_PROC_DATA` (with that,
/// the job's every rank gets proc data: `JobInfo`).
fn proc_places(places: &[wire::ProcPlace]) -> std::collections::BTreeMap<u32, Vec<pmix_shim::Info>> {
    use pmix_shim::{key_str, sys, Info, InfoValue};
    places
        .iter()
        .map(|p| {
            let data = vec![
                Info::new(key_str(sys::PMIX_CPUSET), InfoValue::String(p.cpuset.clone())),
                Info::new(key_str(sys::PMIX_LOCALITY_STRING), InfoValue::String(p.locality.clone())),
            ];
            (p.rank, data)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parse_fds;

    #[test]
    fn fds_argument() {
        assert_eq!(parse_fds("7,8"), Some((7, 8)));
        assert_eq!(parse_fds("7"), None);
        assert_eq!(parse_fds("1,8"), None, "stdio descriptors are never the worker's sockets");
        assert_eq!(parse_fds("7,7"), None);
        assert_eq!(parse_fds("a,8"), None);
    }
}
