//! The HNP's measurement of its link, for the broadcast movement choice (`auto` compares the
//! tree and scatter-allgather by α and β): once the DVM is ready, a few round trips of an
//! empty and of a large ping to its first live child, alternating. α is half the median empty
//! round trip; β is the difference of the two medians over twice the large payload (it went
//! both ways). Both include what a daemon adds per message and per byte (framing, sealing,
//! the event loop), which is what a broadcast pays too.
//!
//! Owns: the probe's pings (their sequence numbers carry [`PROBE_SEQ_BIT`], so a benchmark's
//! pings are never mistaken for them) and the one update of the link model. Never: blocks
//! anything; until it finishes, or if the child is lost, the configured model stands.

use bytes::Bytes;
use dvm_grpcomm::LinkModel;
use dvm_proto::daemon::{daemon_cmd, Ping};
use tracing::info;

use crate::{Core, Rank};

/// Set in the sequence number of every probe ping.
pub const PROBE_SEQ_BIT: u64 = 1 << 63;

/// Round trips of each size.
const ROUNDS: usize = 8;

/// Bytes of the large ping.
const LARGE: usize = 256 * 1024;

/// Fastest link the probe reports (a difference of medians at or below zero is noise).
const MIN_BETA_NS_PER_BYTE: f64 = 0.001;

#[derive(Debug)]
pub(crate) struct LinkProbe {
    peer: Rank,
    /// Pings sent (the last one is in flight unless all are done).
    issued: u64,
    sent_at: u64,
    small: Vec<u64>,
    large: Vec<u64>,
}

fn median(v: &mut [u64]) -> f64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0) as f64
}

impl Core {
    /// HNP: measure the link to a child once the DVM is ready (the shell asks when the user
    /// gave no link model).
    pub fn measure_link(&mut self) {
        if let Some(h) = self.hnp.as_mut() {
            h.probe_wanted = true;
        }
    }

    /// The DVM became ready: start the probe if it was asked for and there is a child.
    pub(crate) fn start_link_probe(&mut self) {
        let Some(h) = self.hnp.as_mut() else { return };
        if !h.probe_wanted || h.probe.is_some() {
            return;
        }
        let Some(&peer) = self.g.topology().children().first() else { return };
        h.probe = Some(LinkProbe { peer, issued: 0, sent_at: 0, small: Vec::new(), large: Vec::new() });
        self.next_probe_ping();
    }

    fn next_probe_ping(&mut self) {
        let now = self.now;
        let Some(p) = self.hnp.as_mut().and_then(|h| h.probe.as_mut()) else { return };
        if p.issued as usize == 2 * ROUNDS {
            return self.finish_link_probe();
        }
        let payload = if p.issued % 2 == 0 { Bytes::new() } else { Bytes::from(vec![0u8; LARGE]) };
        p.issued += 1;
        p.sent_at = now;
        let (peer, seq) = (p.peer, PROBE_SEQ_BIT | p.issued);
        self.send_cmd(peer, daemon_cmd::Body::Ping(Ping { seq, payload }));
    }

    /// A pong whose sequence number carries [`PROBE_SEQ_BIT`].
    pub(crate) fn on_probe_pong(&mut self, seq: u64) {
        let now = self.now;
        let Some(p) = self.hnp.as_mut().and_then(|h| h.probe.as_mut()) else { return };
        if seq != PROBE_SEQ_BIT | p.issued {
            return;
        }
        let rtt = now.saturating_sub(p.sent_at);
        if p.issued % 2 == 1 {
            p.small.push(rtt);
        } else {
            p.large.push(rtt);
        }
        self.next_probe_ping();
    }

    fn finish_link_probe(&mut self) {
        let Some(p) = self.hnp.as_mut().and_then(|h| h.probe.as_mut()) else { return };
        let (small, large) = (median(&mut p.small), median(&mut p.large));
        let link = LinkModel {
            alpha_ns: small / 2.0,
            beta_ns_per_byte: ((large - small) / (2.0 * LARGE as f64)).max(MIN_BETA_NS_PER_BYTE),
        };
        info!(
            peer = p.peer,
            alpha_us = link.alpha_ns / 1e3,
            bandwidth_mb_s = 1e3 / link.beta_ns_per_byte,
            "link measured (median of {ROUNDS} round trips each of 0 and {LARGE} bytes); broadcasts choose their movement by it"
        );
        self.g.set_link(link);
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_a_few() {
        assert_eq!(median(&mut [5, 1, 3]), 3.0);
        assert_eq!(median(&mut [4, 1, 3, 2]), 3.0);
        assert_eq!(median(&mut []), 0.0);
    }
}
