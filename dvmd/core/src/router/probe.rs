//! The HNP's measurement of its link, for the movement choices (`auto` prices the tree against
//! the lateral movements by α and β): once every daemon holds the contact table, a few round
//! trips of an empty and of a large ping to its first live child, alternating. α is half the median empty
//! round trip; β is the difference of the two medians over twice the large payload (it went
//! both ways). Both include what a daemon adds per message and per byte (framing, sealing,
//! the event loop), which is what a broadcast pays too.
//!
//! Owns: the probe's pings (their sequence numbers carry [`PROBE_SEQ_BIT`], so a benchmark's
//! pings are never mistaken for them) and the one update of the link model, broadcast to every
//! daemon (`dtags::LINK_MODEL`) before the DVM is declared ready: fences are priced on every
//! participant with the same α and β, and every job's launch comes after that broadcast in
//! the total order of broadcasts. If the child is lost, the configured model stands.
//! Never: lets a daemon price with a model the others do not hold.

use bytes::Bytes;
use dvm_grpcomm::{FenceCosts, LinkModel};
use dvm_proto::daemon::{daemon_cmd, Ping};
use tracing::{info, warn};

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

    /// Every daemon holds the contact table: start the probe if it was asked for and there
    /// is a child. False if there is nothing to wait for.
    pub(crate) fn start_link_probe(&mut self) -> bool {
        let Some(&peer) = self.g.topology().children().first() else { return false };
        let Some(h) = self.hnp.as_mut() else { return false };
        if !h.probe_wanted || h.probe.is_some() || h.link_xcast.is_some() {
            return false;
        }
        h.probe = Some(LinkProbe { peer, issued: 0, sent_at: 0, small: Vec::new(), large: Vec::new() });
        self.next_probe_ping();
        true
    }

    /// Daemons were declared lost: a probe of one of them ends with the configured model.
    pub(crate) fn link_probe_lost(&mut self, newly: &[Rank]) {
        let Some(h) = self.hnp.as_mut() else { return };
        let Some(p) = h.probe.as_ref().filter(|p| newly.contains(&p.peer)) else { return };
        info!(peer = p.peer, "link probe's daemon lost: the configured link model stands");
        h.probe = None;
        h.probe_wanted = false;
        self.declare_ready();
    }

    /// The HNP's measured model arrived (every daemon, the HNP too).
    pub(crate) fn on_link_model(&mut self, payload: &[u8]) {
        match decode_link(payload) {
            Some((link, costs)) => {
                info!(
                    alpha_us = link.alpha_ns / 1e3,
                    bandwidth_mb_s = 1e3 / link.beta_ns_per_byte,
                    fence_costs = ?costs,
                    "link model from the HNP: fences and broadcasts are priced by it"
                );
                self.g.set_link(link);
                self.g.set_fence_costs(costs);
            }
            None => warn!(len = payload.len(), "malformed link model broadcast ignored"),
        }
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
        let Some(h) = self.hnp.as_mut() else { return };
        let Some(mut p) = h.probe.take() else { return };
        h.probe_wanted = false;
        let (small, large) = (median(&mut p.small), median(&mut p.large));
        let link = LinkModel {
            alpha_ns: small / 2.0,
            beta_ns_per_byte: ((large - small) / (2.0 * LARGE as f64)).max(MIN_BETA_NS_PER_BYTE),
        };
        info!(
            peer = p.peer,
            alpha_us = link.alpha_ns / 1e3,
            bandwidth_mb_s = 1e3 / link.beta_ns_per_byte,
            "link measured (median of {ROUNDS} round trips each of 0 and {LARGE} bytes); broadcast to every daemon"
        );
        self.start_calibration(link);
    }
}

/// The link model, then the fence costs if measured (tree α β, allgather α β, the knee, the
/// tree's and the allgather's β above it), each as a little-endian f64 (nanoseconds,
/// nanoseconds per byte, bytes): 16 or 72 bytes.
pub fn encode_link(link: &LinkModel, costs: Option<&FenceCosts>) -> Bytes {
    let mut v: Vec<f64> = vec![link.alpha_ns, link.beta_ns_per_byte];
    if let Some(c) = costs {
        v.extend([
            c.tree.alpha_ns,
            c.tree.beta_ns_per_byte,
            c.allgather.alpha_ns,
            c.allgather.beta_ns_per_byte,
            c.knee_bytes as f64,
            c.tree_beta_above,
            c.allgather_beta_above,
        ]);
    }
    Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

/// The inverse of [`encode_link`]; `None` for anything but 16 or 72 bytes of finite,
/// non-negative numbers.
pub fn decode_link(b: &[u8]) -> Option<(LinkModel, Option<FenceCosts>)> {
    if b.len() != 16 && b.len() != 72 {
        return None;
    }
    let v: Vec<f64> = b.chunks_exact(8).map(|c| c.try_into().map(f64::from_le_bytes)).collect::<Result<_, _>>().ok()?;
    if v.iter().any(|x| !x.is_finite() || *x < 0.0) {
        return None;
    }
    let m = |i: usize| LinkModel { alpha_ns: v[i], beta_ns_per_byte: v[i + 1] };
    let costs = (v.len() == 9).then(|| FenceCosts {
        tree: m(2),
        allgather: m(4),
        knee_bytes: v[6] as u64,
        tree_beta_above: v[7],
        allgather_beta_above: v[8],
    });
    Some((m(0), costs))
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn link_model_round_trips_and_garbage_is_refused() {
        use super::{decode_link, encode_link, FenceCosts, LinkModel};
        let link = LinkModel { alpha_ns: 512.5, beta_ns_per_byte: 0.25 };
        let costs = FenceCosts {
            tree: LinkModel { alpha_ns: 3e5, beta_ns_per_byte: 5.5 },
            allgather: LinkModel { alpha_ns: 5e5, beta_ns_per_byte: 46.0 },
            knee_bytes: 65_536,
            tree_beta_above: 8.0,
            allgather_beta_above: 45.0,
        };
        assert_eq!(decode_link(&encode_link(&link, None)), Some((link, None)));
        assert_eq!(decode_link(&encode_link(&link, Some(&costs))), Some((link, Some(costs))));
        for len in [0, 15, 17, 32, 48, 71, 73] {
            assert_eq!(decode_link(&vec![0; len]), None, "{len} bytes");
        }
        for at in (0..72).step_by(8) {
            for bad in [f64::NAN, f64::INFINITY, -1.0] {
                let mut v = encode_link(&link, Some(&costs)).to_vec();
                v[at..at + 8].copy_from_slice(&bad.to_le_bytes());
                assert_eq!(decode_link(&v), None, "{bad} at {at}");
            }
        }
    }

    #[test]
    fn median_of_a_few() {
        assert_eq!(median(&mut [5, 1, 3]), 3.0);
        assert_eq!(median(&mut [4, 1, 3, 2]), 3.0);
        assert_eq!(median(&mut []), 0.0);
    }
}
