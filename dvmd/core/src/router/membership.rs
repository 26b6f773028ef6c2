//! Who is in the DVM: check-in and WIREUP at boot, the loss of a tree neighbour and its
//! report to the HNP, DAEMON_DIED (decided by the HNP, applied before it is forwarded) and the
//! repair it causes.
//!
//! Never: a loss decided on the word of a failed daemon, or a check-in after WIREUP.
//! Traps: during termination nothing is repaired; a lost neighbour only stops being waited
//! for.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use bytes::Bytes;
use dvm_grpcomm::tags;
use dvm_proto::daemon::{daemon_cmd, DaemonCmd, DaemonDied, DaemonLost, Evicted};
use dvm_proto::rml::{Checkin, Tag, Wireup};
use dvm_proto::Message;
use tracing::{debug, error, info, warn};

use super::{Core, Effect, Exit, Rank, XcastOwner};

impl Core {
    // ------------------------------------------------------------------ boot

    pub(super) fn on_checkin(&mut self, from_peer: Rank, epoch: u64, payload: Bytes) {
        let Some(hnp) = self.hnp.as_mut() else {
            warn!(from_peer, "check-in received by a daemon that is not the HNP");
            return;
        };
        let Ok(ci) = Checkin::decode(payload) else {
            warn!(from_peer, "undecodable check-in");
            return;
        };
        let size = self.g.topology().size();
        for mut c in ci.contacts {
            if c.rank == 0 || c.rank >= size {
                warn!(from_peer, rank = c.rank, "check-in for a rank outside the DVM");
                continue;
            }
            if hnp.wireup.is_some() {
                warn!(rank = c.rank, "check-in after WIREUP refused (daemon {} already known)", c.rank);
                continue;
            }
            if c.rank == from_peer {
                // The frame's own epoch is the one its origin runs with; a contact relayed
                // for another daemon keeps the epoch it carries.
                c.epoch = epoch;
            }
            debug!(rank = c.rank, host = %c.host, addr = %c.addr, "daemon checked in");
            self.epochs.insert(c.rank, c.epoch);
            self.hosts.insert(c.rank, c.host.clone());
            super::take_hardware(&mut c, &mut hnp.hardware);
            hnp.contacts.insert(c.rank, c);
        }
        self.maybe_wireup();
    }

    /// HNP: once every daemon checked in, broadcast the contact table (WIREUP).
    pub(super) fn maybe_wireup(&mut self) {
        let size = self.g.topology().size();
        let radix = self.g.topology().radix();
        let Some(hnp) = self.hnp.as_mut() else { return };
        if hnp.contacts.len() as u32 == size && hnp.wireup.is_none() {
            let w = Wireup { contacts: hnp.contacts.values().cloned().collect(), radix };
            // WIREUP stays on the tree and is processed before it is forwarded: it gives the
            // children their contacts.
            let id = self.g.xcast(tags::WIREUP, Bytes::from(w.encode_to_vec()));
            if let Some(h) = self.hnp.as_mut() {
                h.wireup = Some(id);
            }
            self.xcast_owners.insert(id, XcastOwner::Core);
        }
    }

    pub(super) fn apply_wireup(&mut self, payload: &[u8]) {
        match Wireup::decode(payload) {
            Ok(w) => {
                let mut table = Vec::new();
                for c in &w.contacts {
                    self.hosts.insert(c.rank, c.host.clone());
                    if c.rank == 0 {
                        self.hnp_pid = Some(c.pid);
                    }
                    if c.rank != self.me {
                        self.epochs.insert(c.rank, c.epoch);
                    }
                    match c.addr.parse::<SocketAddr>() {
                        Ok(a) if c.rank != self.me => table.push((c.rank, a)),
                        Ok(_) => {}
                        Err(_) => warn!(rank = c.rank, addr = %c.addr, "bad address in the contact table"),
                    }
                }
                self.out.push(Effect::SetContacts(table));
                self.contacts_known = true;
                info!(daemons = w.contacts.len(), "wired up");
            }
            Err(e) => error!("undecodable WIREUP: {e}"),
        }
    }

    // ------------------------------------------------------------------ loss and repair

    pub(super) fn on_peer_lost(&mut self, peer: Rank, reason: String) {
        if peer == 0 && self.me != 0 {
            let exit = if self.terminating {
                Exit::Terminated
            } else {
                Exit::LostHnp(format!("lost the connection to the HNP: {reason}"))
            };
            self.out.push(Effect::Exit(exit));
            return;
        }
        if peer >= self.g.topology().size() || !self.g.topology().is_alive(peer) {
            return;
        }
        let topo = self.g.topology();
        let neighbour = topo.parent() == Some(peer) || topo.children().contains(&peer);
        if !neighbour {
            // A lateral link (an allgather partner, a direct report): never a tree loss and
            // never a repair. If the peer really died, its tree neighbours report it; until
            // then grpcomm sends that peer's blocks along the tree.
            debug!(peer, "lost a lateral connection: {reason}");
            self.g.peer_unreachable(peer);
            return;
        }
        if self.terminating {
            // No repair any more, but TERMINATE's ACK rollup must not wait for it.
            self.g.peer_unreachable(peer);
            return;
        }
        warn!(peer, "lost tree neighbour daemon {peer}: {reason}");
        self.g.peer_unreachable(peer);
        self.report_to_hnp(daemon_cmd::Body::DaemonLost(DaemonLost { lost: peer, reason }));
    }

    /// A report the HNP must get (a loss, a benchmark's end): straight to it, never along the
    /// tree, which may be broken at this very moment (a relay lost or cut off whose
    /// DAEMON_DIED has not reached this daemon yet), and a routed command is never re-sent.
    pub(crate) fn report_to_hnp(&mut self, body: daemon_cmd::Body) {
        if self.me == 0 {
            self.on_cmd(0, body);
        } else {
            let payload = Bytes::from(DaemonCmd { body: Some(body) }.encode_to_vec());
            self.transmit_direct(0, Tag::DaemonCmd, payload);
        }
    }

    /// HNP: a daemon reports a lost neighbour. Mark it failed everywhere (DAEMON_DIED).
    pub(super) fn on_daemon_lost(&mut self, reporter: Rank, lost: DaemonLost) {
        if self.hnp.is_none() || self.terminating || lost.lost == 0 || lost.lost >= self.g.topology().size() {
            return;
        }
        let topo = self.g.topology();
        if !topo.is_alive(lost.lost) || !topo.is_alive(reporter) {
            return;
        }
        warn!(reporter, "daemon {} on host {} was lost: {}", lost.lost, self.host_of(lost.lost), lost.reason);
        self.loss_reasons.insert(lost.lost, format!("{} (reported by daemon {reporter})", lost.reason));
        let mut failed: Vec<Rank> = topo.failed().iter().copied().collect();
        failed.push(lost.lost);
        // DAEMON_DIED stays on the tree and is processed before it is forwarded: it changes
        // the child set the forward goes to.
        let id = self.g.xcast(tags::DAEMON_DIED, Bytes::from(DaemonDied { failed }.encode_to_vec()));
        self.xcast_owners.insert(id, XcastOwner::Core);
    }

    pub(super) fn apply_daemon_died(&mut self, payload: Bytes) {
        let d = match DaemonDied::decode(payload) {
            Ok(d) => d,
            Err(e) => {
                error!("undecodable DAEMON_DIED: {e}");
                return;
            }
        };
        let before: BTreeSet<Rank> = self.g.topology().failed().clone();
        let failed: BTreeSet<Rank> = d.failed.into_iter().filter(|&r| r != self.me).collect();
        if let Err(e) = self.g.topology_changed(&failed) {
            error!("cannot repair the tree: {e}");
            return;
        }
        let newly: Vec<Rank> = self.g.topology().failed().difference(&before).copied().collect();
        if newly.is_empty() {
            return;
        }
        if self.hnp.is_some() {
            // Tell each one it is out, in case it is only frozen and wakes up later.
            for &r in &newly {
                if self.evicted.insert(r) {
                    let ev = Evicted { reason: format!("the DVM declared daemon {r} dead") };
                    let payload = Bytes::from(DaemonCmd { body: Some(daemon_cmd::Body::Evicted(ev)) }.encode_to_vec());
                    self.transmit_direct(r, Tag::DaemonCmd, payload);
                }
            }
        }
        self.link_probe_lost(&newly);
        self.out.push(Effect::DaemonsFailed { newly });
        self.check_bench_done();
    }
}
