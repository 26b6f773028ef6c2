//! What a worker tells the daemon: [`HostEvent`]s (upcalls with their reply handles, data
//! answers, the end of the event stream) read by one thread per worker and posted, tagged with
//! the worker's generation, into the actor's channel.
//!
//! Never answers an upcall itself, except one this daemon does not know (failed with
//! `PMIX_ERR_NOT_SUPPORTED` so no client waits). Do not break: the last item a reader posts is
//! [`HostEvent::Ended`], and a reader stops once the actor's channel is closed.

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use bytes::Bytes;
use dvm_proto::pmixworker::{self as wire, worker_event::Body as Ev};
use pmix_shim::{ProcId, Rank, Status};
use tokio::sync::mpsc;

use super::protocol::WorkerLink;
use super::reply::WorkerReplyHandle;
use crate::pmix::frame::read_frame;

/// What the daemon learns from its worker.
#[derive(Debug)]
pub(crate) enum HostEvent {
    ClientConnected {
        proc: ProcId,
        reply: WorkerReplyHandle,
    },
    ClientFinalized {
        proc: ProcId,
        reply: WorkerReplyHandle,
    },
    Abort {
        proc: ProcId,
        status: Status,
        message: String,
        reply: WorkerReplyHandle,
    },
    FenceNb(FenceUpcall),
    DirectModex {
        proc: ProcId,
        reply: WorkerReplyHandle,
    },
    Log {
        client: ProcId,
        text: Option<String>,
        reply: WorkerReplyHandle,
    },
    JobControl {
        reply: WorkerReplyHandle,
    },
    DmodexData {
        request: u64,
        status: Status,
        data: Bytes,
    },
    /// PMIx_Spawn: the requesting proc and the request as the worker copied it.
    Spawn {
        proc: ProcId,
        spawn: wire::Spawn,
        reply: WorkerReplyHandle,
    },
    /// PMIx_Connect (`connect`) or PMIx_Disconnect: every participant; complete when all have
    /// arrived everywhere.
    Connect {
        connect: bool,
        procs: Vec<ProcId>,
        timeout: Option<i32>,
        reply: WorkerReplyHandle,
    },
    /// PMIx_Publish, PMIx_Lookup, PMIx_Unpublish: the data server's requests.
    Data {
        op: dvm_proto::daemon::DataOp,
        proc: ProcId,
        keys: Vec<String>,
        info: Vec<pmix_shim::Info>,
        reply: WorkerReplyHandle,
    },
    /// PMIx_Query_info that libpmix could not answer itself; complete with an `InfoResult`.
    Query {
        queries: Vec<pmix_shim::Query>,
        reply: WorkerReplyHandle,
    },
    /// PMIx_Group_construct / _destruct: every local member arrived (see
    /// [`pmix_shim::PmixEvent::Group`]).
    Group {
        op: pmix_shim::GroupOp,
        id: String,
        procs: Vec<ProcId>,
        directives: Vec<pmix_shim::Info>,
        reply: WorkerReplyHandle,
    },
    NspaceDeregistered {
        nspace: String,
        status: Status,
    },
    /// A client's PMIx_Notify_event for procs beyond its server (see
    /// [`pmix_shim::PmixEvent::Notify`]).
    Notify {
        event: wire::Notify,
    },
    /// A client registered for system event codes.
    RegisterEvents {
        codes: Vec<Status>,
    },
    /// The worker's event stream ended: it exited or was killed.
    Ended {
        how: String,
    },
}

impl HostEvent {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            HostEvent::ClientConnected { .. } => "client_connected",
            HostEvent::ClientFinalized { .. } => "client_finalized",
            HostEvent::Abort { .. } => "abort",
            HostEvent::FenceNb(_) => "fence_nb",
            HostEvent::DirectModex { .. } => "direct_modex",
            HostEvent::Log { .. } => "log",
            HostEvent::JobControl { .. } => "job_control",
            HostEvent::DmodexData { .. } => "dmodex_data",
            HostEvent::Spawn { .. } => "spawn",
            HostEvent::Connect { connect: true, .. } => "connect",
            HostEvent::Connect { connect: false, .. } => "disconnect",
            HostEvent::Data { .. } => "data_server",
            HostEvent::Query { .. } => "query",
            HostEvent::Group { op: pmix_shim::GroupOp::Construct, .. } => "group_construct",
            HostEvent::Group { op: pmix_shim::GroupOp::Destruct, .. } => "group_destruct",
            HostEvent::NspaceDeregistered { .. } => "nspace_deregistered",
            HostEvent::Notify { .. } => "notify_event",
            HostEvent::RegisterEvents { .. } => "register_events",
            HostEvent::Ended { .. } => "worker_ended",
        }
    }
}

/// A `fence_nb` upcall: every local participant contributed.
#[derive(Debug)]
pub(crate) struct FenceUpcall {
    pub procs: Vec<ProcId>,
    /// `PMIX_COLLECT_DATA`, false when absent (never inferred from the data).
    pub collect: bool,
    /// `PMIX_TIMEOUT` in seconds, if given.
    pub timeout: Option<i32>,
    /// `pmix.loc.col.st`, if given: non-zero means a local participant died.
    pub local_status: Option<Status>,
    pub data: Bytes,
    pub reply: WorkerReplyHandle,
}

/// Channel items: the worker generation an event came from, and the event.
pub(crate) type EventTx = mpsc::UnboundedSender<(u64, HostEvent)>;

pub(super) fn proc_from(p: Option<wire::Proc>) -> ProcId {
    let p = p.unwrap_or_default();
    ProcId::new(p.nspace, Rank::from_raw(p.rank))
}

/// The event thread of one worker: every frame becomes a [`HostEvent`]; the end of the
/// stream becomes [`HostEvent::Ended`].
pub(super) fn read_events(sock: UnixStream, link: Arc<WorkerLink>, gen: u64, tx: EventTx) {
    let mut r = BufReader::new(sock);
    let how = loop {
        let ev = match read_frame::<wire::WorkerEvent>(&mut r) {
            Ok(Some(ev)) => ev,
            Ok(None) => break "its event stream ended".to_string(),
            Err(e) => break format!("its event stream broke: {e}"),
        };
        let reply = WorkerReplyHandle { id: ev.reply, link: (ev.reply != 0).then(|| link.clone()) };
        let event = match ev.body {
            Some(Ev::ClientConnected(p)) => HostEvent::ClientConnected { proc: proc_from(Some(p)), reply },
            Some(Ev::ClientFinalized(p)) => HostEvent::ClientFinalized { proc: proc_from(Some(p)), reply },
            Some(Ev::Abort(a)) => {
                HostEvent::Abort { proc: proc_from(a.proc), status: a.status, message: a.message, reply }
            }
            Some(Ev::Fence(f)) => HostEvent::FenceNb(FenceUpcall {
                procs: f.procs.into_iter().map(|p| proc_from(Some(p))).collect(),
                collect: f.collect,
                timeout: (f.timeout != 0).then_some(f.timeout),
                local_status: f.has_local_status.then_some(f.local_status),
                data: f.data,
                reply,
            }),
            Some(Ev::DirectModex(p)) => HostEvent::DirectModex { proc: proc_from(Some(p)), reply },
            Some(Ev::Log(l)) => {
                HostEvent::Log { client: proc_from(l.client), text: l.has_text.then_some(l.text), reply }
            }
            Some(Ev::JobControl(_)) => HostEvent::JobControl { reply },
            Some(Ev::DmodexData(d)) => HostEvent::DmodexData { request: d.request, status: d.status, data: d.data },
            Some(Ev::NspaceDeregistered(n)) => HostEvent::NspaceDeregistered { nspace: n.nspace, status: n.status },
            Some(Ev::Spawn(sp)) => HostEvent::Spawn { proc: proc_from(sp.proc.clone()), spawn: sp, reply },
            Some(Ev::Connect(set)) => HostEvent::Connect {
                connect: true,
                procs: set.procs.into_iter().map(|p| proc_from(Some(p))).collect(),
                timeout: (set.timeout > 0).then_some(set.timeout),
                reply,
            },
            Some(Ev::Disconnect(set)) => HostEvent::Connect {
                connect: false,
                procs: set.procs.into_iter().map(|p| proc_from(Some(p))).collect(),
                timeout: (set.timeout > 0).then_some(set.timeout),
                reply,
            },
            Some(Ev::Publish(p)) => HostEvent::Data {
                op: dvm_proto::daemon::DataOp::DataPublish,
                proc: proc_from(p.proc),
                keys: Vec::new(),
                info: crate::pmix::value::infos_from_wire(&p.info),
                reply,
            },
            Some(Ev::Lookup(l)) => HostEvent::Data {
                op: dvm_proto::daemon::DataOp::DataLookup,
                proc: proc_from(l.proc),
                keys: l.keys,
                info: crate::pmix::value::infos_from_wire(&l.info),
                reply,
            },
            Some(Ev::Unpublish(l)) => HostEvent::Data {
                op: dvm_proto::daemon::DataOp::DataUnpublish,
                proc: proc_from(l.proc),
                keys: l.keys,
                info: crate::pmix::value::infos_from_wire(&l.info),
                reply,
            },
            Some(Ev::Query(q)) => HostEvent::Query {
                queries: q
                    .queries
                    .into_iter()
                    .map(|q| pmix_shim::Query {
                        keys: q.keys,
                        qualifiers: crate::pmix::value::infos_from_wire(&q.qualifiers),
                    })
                    .collect(),
                reply,
            },
            Some(Ev::Group(g)) => HostEvent::Group {
                op: if g.construct { pmix_shim::GroupOp::Construct } else { pmix_shim::GroupOp::Destruct },
                id: g.id,
                procs: g.procs.into_iter().map(|p| proc_from(Some(p))).collect(),
                directives: crate::pmix::value::infos_from_wire(&g.directives),
                reply,
            },
            Some(Ev::Notify(event)) => HostEvent::Notify { event },
            Some(Ev::RegisterEvents(r)) => HostEvent::RegisterEvents { codes: r.codes },
            None => {
                // Unknown to this daemon: fail the upcall rather than leave a client waiting.
                reply.complete(pmix_shim::ERR_NOT_SUPPORTED);
                continue;
            }
        };
        if tx.send((gen, event)).is_err() {
            return;
        }
    };
    let _ = tx.send((gen, HostEvent::Ended { how }));
}
