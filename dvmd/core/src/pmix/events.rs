//! PMIx events on one daemon (docs/dynamic-mpi.md): a client's event for procs beyond its own
//! server goes to every daemon; an event the DVM raises (a rank aborted or died, a daemon was
//! lost: `jobs/recovery.rs`) goes to the ranks of the jobs it concerns. Both travel as one
//! `PMIX_EVENT` xcast (`dvm.daemon.PmixEvent`), and each daemon that hosts a proc in range
//! hands it to its server, keeping the event's source.
//!
//! Range: libpmix 4.2.2's server filters delivery by range only when the event carries
//! `PMIX_EVENT_CUSTOM_RANGE`, so a daemon never hands over an event with a namespace range as
//! such: it is delivered with a custom range naming the source's job. Events of the local
//! range never reach the host; the client's own server delivered the event to its clients
//! already, so its daemon skips its own broadcast.
//!
//! Never: asks for a server for an event (a daemon with no worker has no client to tell), or
//! waits for an event's delivery.

use bytes::Bytes;
use dvm_proto::daemon::PmixEvent as EventMsg;
use dvm_proto::pmixworker as wire;
use dvm_proto::Message;
use tracing::{debug, info, warn};

use super::info::{self, Shown};
use super::Pmix;
use crate::host::Host;
use crate::pmixdef::{self as def, key, range, RANK_WILDCARD};
use crate::{dtags, Input};

/// `origin` of an event the DVM raised (no client's server delivered it yet).
pub const FROM_DVM: u32 = u32::MAX;

/// The key libpmix's server adds to an event it received from a client (its own marker, not
/// for other servers).
const SERVER_INTERNAL_NOTIFY: &str = "pmix.srvr.internal.notify";

/// The payload of a `PMIX_EVENT` xcast: `event` for the procs of `targets` (a custom range;
/// empty: by the event's range).
pub fn event_payload(origin: u32, event: wire::Notify, targets: Vec<wire::Proc>) -> Bytes {
    Bytes::from(EventMsg { origin, event: Some(event), targets }.encode_to_vec())
}

/// What a client's event turns into on the wire: the procs in range (empty: every proc), or
/// None when it stays on its own server. The custom range moves from the info to the targets.
pub fn client_event_scope(source: &wire::Proc, rng: u32, infos: &mut Vec<wire::Value>) -> Option<Vec<wire::Proc>> {
    let custom = infos.iter().position(|i| i.key == key::EVENT_CUSTOM_RANGE);
    let targets = custom.map(|at| info::as_procs(infos.remove(at)));
    infos.retain(|i| i.key != SERVER_INTERNAL_NOTIFY);
    match rng {
        range::LOCAL | range::PROC_LOCAL | range::RM => None,
        range::CUSTOM => targets.filter(|t| !t.is_empty()),
        range::NAMESPACE => Some(vec![info::proc(&source.nspace, RANK_WILDCARD)]),
        // Session, global, undefined: every proc of the DVM.
        _ => Some(Vec::new()),
    }
}

impl Pmix {
    /// A local client's `PMIx_Notify_event` for procs beyond this server: broadcast to every
    /// daemon (its own server delivered it here already).
    pub(super) fn client_event(&mut self, mut event: wire::Notify) {
        let source = event.source.clone().unwrap_or_default();
        let Some(targets) = client_event_scope(&source, event.range, &mut event.info) else {
            return debug!(status = event.status, range = event.range, "client event of a local range: not broadcast");
        };
        info!(
            status = event.status,
            source = %Shown(&source),
            range = event.range,
            targets = targets.len(),
            "PMIx event from a client -> every daemon"
        );
        let payload = event_payload(self.me, event, targets);
        self.ask(Input::Xcast { tag: dtags::PMIX_EVENT, payload });
    }

    /// A `PMIX_EVENT` xcast reached this daemon: its server gets the event if it hosts a proc
    /// in range.
    pub fn deliver_event(&mut self, host: &mut impl Host, payload: Bytes) {
        let msg = match EventMsg::decode(payload) {
            Ok(m) => m,
            Err(e) => return warn!("daemon {}: undecodable PMIx event: {e}", self.me),
        };
        if msg.origin == self.me {
            return;
        }
        let Some(mut event) = msg.event else { return };
        if msg.origin == FROM_DVM && event.status == def::ERR_PROC_ABORTED {
            if let Some(p) = &event.source {
                self.member_died(p);
            }
        }
        let hosted = |ns: &str| self.job_of(ns).is_some_and(|j| self.jobs.get(&j).is_some_and(|j| j.registered));
        let in_range = if msg.targets.is_empty() {
            self.by_nspace.keys().any(|ns| hosted(ns))
        } else {
            msg.targets.iter().any(|t| hosted(&t.nspace))
        };
        if !in_range || self.ended {
            return debug!(status = event.status, "PMIx event for no proc of this daemon");
        }
        if !msg.targets.is_empty() {
            // libpmix filters by range only with an explicit custom range.
            event.info.push(info::procs(key::EVENT_CUSTOM_RANGE, msg.targets));
            event.range = range::CUSTOM;
        }
        let status = event.status;
        match host.pmix_notify(event) {
            Ok(()) => debug!(status, origin = msg.origin, "PMIx event handed to this daemon's server"),
            Err(e) => warn!("daemon {} on node {}: PMIx event {status} not delivered: {e}", self.me, self.host),
        }
    }
}
