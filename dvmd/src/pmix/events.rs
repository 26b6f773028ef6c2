//! PMIx events on one daemon (docs/dynamic-mpi.md): a client's event for procs beyond its own
//! server goes to every daemon; an event the DVM raises (a rank aborted or died, a daemon was
//! lost) goes to the ranks of the jobs it concerns. Both travel as one `PMIX_EVENT` xcast
//! (`dvm.daemon.PmixEvent`), and each daemon that hosts a proc in range hands it to its server
//! with `PMIx_Notify_event`, keeping the event's source; libpmix then sends it to each of its
//! clients that registered for the code.
//!
//! Range: libpmix 4.2.2's server filters delivery by range only when the event carries
//! `PMIX_EVENT_CUSTOM_RANGE`, so a daemon never injects an event with a namespace range as
//! such: it is delivered with a custom range naming the source's job (every rank of it).
//! Events of the local range never reach the host (libpmix handles them); the client's own
//! server delivered the event to its clients already, so its daemon skips its own broadcast.
//!
//! Never: starts a PMIx worker for an event (a daemon with no worker has no client to tell),
//! or waits for an event's delivery (libpmix copies it and returns).
//!
//! Traps (libpmix 4.2.2, measured here): the host's `notify_event` must answer
//! `PMIX_OPERATION_SUCCEEDED` and never call its cbfunc (a NULL dereference in libpmix);
//! `register_events` reaches the host only for system event codes (-230..-330, e.g.
//! `PMIX_EVENT_NODE_DOWN`), and without the upcall a client cannot register one;
//! `deregister_events` never reaches the host. An event is cached for clients that register
//! later (unless `PMIX_EVENT_DO_NOT_CACHE`): a cached event with a session range reaches any
//! later client of the worker that registers for its code, a namespace or custom range only
//! clients of the jobs named.

use bytes::Bytes;
use dvm_core::{dtags, Input as CoreInput};
use dvm_proto::daemon::PmixEvent as EventMsg;
use dvm_proto::pmixworker as wire;
use dvm_proto::Message;
use pmix_shim::{key_str, sys, Info, InfoValue, ProcId, Rank};
use tracing::{debug, info, warn};

use super::PmixHost;

/// `origin` of an event the DVM raised (no client's server delivered it yet).
pub const FROM_DVM: u32 = u32::MAX;

/// The key libpmix's server adds to an event it received from a client (its own marker, not
/// for other servers; src/event/pmix_event.h of libpmix 4.2.2).
const SERVER_INTERNAL_NOTIFY: &str = "pmix.srvr.internal.notify";

/// The payload of a `PMIX_EVENT` xcast: `status` from `source`, for the procs of `targets`
/// (a custom range; empty: by `range`), with `info` (custom range removed).
pub fn event_payload(
    origin: u32,
    status: pmix_shim::Status,
    source: &ProcId,
    range: u32,
    targets: &[ProcId],
    info: &[Info],
) -> Bytes {
    let event = wire::Notify {
        status,
        source: Some(wire::Proc { nspace: source.nspace.clone(), rank: source.rank.to_raw() }),
        range,
        info: super::value::infos_to_wire(info),
    };
    let targets = targets.iter().map(|p| wire::Proc { nspace: p.nspace.clone(), rank: p.rank.to_raw() }).collect();
    Bytes::from(EventMsg { origin, event: Some(event), targets }.encode_to_vec())
}

/// What a client's event turns into on the wire: its range and the procs in range, or None
/// when it stays on its own server. The custom range moves from the info to the targets.
pub fn client_event_scope(source: &ProcId, range: u32, info: &mut Vec<Info>) -> Option<Vec<ProcId>> {
    let custom = info.iter().position(|i| i.key == key_str(sys::PMIX_EVENT_CUSTOM_RANGE));
    let targets = custom.map(|at| match info.remove(at).value {
        InfoValue::Procs(p) => p,
        InfoValue::Proc(p) => vec![p],
        _ => Vec::new(),
    });
    info.retain(|i| i.key != SERVER_INTERNAL_NOTIFY);
    match range {
        sys::PMIX_RANGE_LOCAL | sys::PMIX_RANGE_PROC_LOCAL | sys::PMIX_RANGE_RM => None,
        sys::PMIX_RANGE_CUSTOM => targets.filter(|t| !t.is_empty()),
        sys::PMIX_RANGE_NAMESPACE => Some(vec![ProcId::new(source.nspace.clone(), Rank::Wildcard)]),
        // Session, global, undefined: every proc of the DVM.
        _ => Some(Vec::new()),
    }
}

impl PmixHost {
    /// A local client's `PMIx_Notify_event` for procs beyond this server: broadcast to every
    /// daemon (its own server delivered it here already).
    pub(crate) fn client_event(&mut self, event: wire::Notify) {
        let source = event.source.clone().unwrap_or_default();
        let source = ProcId::new(source.nspace, Rank::from_raw(source.rank));
        let mut info = super::value::infos_from_wire(&event.info);
        let Some(targets) = client_event_scope(&source, event.range, &mut info) else {
            debug!(status = event.status, range = event.range, "client event of a local range: not broadcast");
            return;
        };
        info!(
            status = event.status,
            %source,
            range = event.range,
            targets = targets.len(),
            "PMIx event from a client -> every daemon"
        );
        let payload = event_payload(self.me, event.status, &source, event.range, &targets, &info);
        self.out.push(CoreInput::Xcast { tag: dtags::PMIX_EVENT, payload });
    }

    /// A `PMIX_EVENT` xcast reached this daemon: its server gets the event if it hosts a proc
    /// in range.
    pub(crate) fn deliver_event(&mut self, payload: Bytes) {
        let msg = match EventMsg::decode(payload) {
            Ok(m) => m,
            Err(e) => {
                warn!("daemon {}: undecodable PMIx event: {e}", self.me);
                return;
            }
        };
        if msg.origin == self.me {
            return;
        }
        let Some(mut event) = msg.event else { return };
        if msg.origin == FROM_DVM && event.status == pmix_shim::ERR_PROC_ABORTED {
            if let Some(p) = &event.source {
                self.member_died(ProcId::new(p.nspace.clone(), Rank::from_raw(p.rank)));
            }
        }
        let targets: Vec<ProcId> =
            msg.targets.iter().map(|p| ProcId::new(p.nspace.clone(), Rank::from_raw(p.rank))).collect();
        let hosted = |ns: &str| self.by_nspace.get(ns).is_some_and(|j| self.jobs.get(j).is_some_and(|j| j.registered));
        let in_range = if targets.is_empty() {
            self.by_nspace.keys().any(|ns| hosted(ns))
        } else {
            targets.iter().any(|t| hosted(&t.nspace))
        };
        if !in_range {
            debug!(status = event.status, "PMIx event for no proc of this daemon");
            return;
        }
        if !targets.is_empty() {
            // libpmix filters by range only with an explicit custom range.
            let range = Info::new(key_str(sys::PMIX_EVENT_CUSTOM_RANGE), InfoValue::Procs(targets));
            event.info.extend(super::value::to_wire(&range));
            event.range = sys::PMIX_RANGE_CUSTOM;
        }
        let Some(w) = self.worker.as_ref() else { return };
        let status = event.status;
        match w.notify(event) {
            Ok(()) => debug!(status, origin = msg.origin, "PMIx event handed to this daemon's server"),
            Err(e) => warn!("daemon {} on node {}: PMIx event {status} not delivered: {e}", self.me, self.host),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(ns: &str, r: u32) -> ProcId {
        ProcId::new(ns, Rank::Id(r))
    }

    #[test]
    fn scope_of_client_events() {
        let src = p("job1", 3);
        let marker = Info::new(SERVER_INTERNAL_NOTIFY, InfoValue::Bool(true));
        let round = Info::new("dvm.ev.round", InfoValue::U32(2));
        // A namespace range becomes a custom range over the source's job.
        let mut info = vec![round.clone(), marker.clone()];
        let t = client_event_scope(&src, sys::PMIX_RANGE_NAMESPACE, &mut info).unwrap();
        assert_eq!(t, vec![ProcId::new("job1", Rank::Wildcard)]);
        assert_eq!(info, vec![round.clone()], "libpmix's own marker is not carried");
        // A custom range keeps its procs, out of the info.
        let custom =
            Info::new(key_str(sys::PMIX_EVENT_CUSTOM_RANGE), InfoValue::Procs(vec![p("job2", 0), p("job3", 1)]));
        let mut info = vec![custom, round.clone()];
        let t = client_event_scope(&src, sys::PMIX_RANGE_CUSTOM, &mut info).unwrap();
        assert_eq!((t, info), (vec![p("job2", 0), p("job3", 1)], vec![round.clone()]));
        // Session: everyone (no targets). Local ranges: not broadcast.
        assert_eq!(client_event_scope(&src, sys::PMIX_RANGE_SESSION, &mut vec![]), Some(vec![]));
        for r in [sys::PMIX_RANGE_LOCAL, sys::PMIX_RANGE_PROC_LOCAL, sys::PMIX_RANGE_RM] {
            assert_eq!(client_event_scope(&src, r, &mut vec![]), None);
        }
        // A custom range naming nobody reaches nobody.
        assert_eq!(client_event_scope(&src, sys::PMIX_RANGE_CUSTOM, &mut vec![]), None);
    }

    #[test]
    fn payload_round_trips() {
        let info = vec![Info::new("pmix.exit.code", InfoValue::I32(7))];
        let b = event_payload(FROM_DVM, -7, &p("job1", 3), sys::PMIX_RANGE_CUSTOM, &[p("job1", 0)], &info);
        let m = EventMsg::decode(b).unwrap();
        assert_eq!(m.origin, FROM_DVM);
        let ev = m.event.unwrap();
        assert_eq!((ev.status, ev.range, ev.source.unwrap().rank), (-7, sys::PMIX_RANGE_CUSTOM, 3));
        assert_eq!(super::super::value::infos_from_wire(&ev.info), info);
        assert_eq!(m.targets.len(), 1);
    }
}
