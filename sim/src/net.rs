//! The link cost model: latency α per message, β per byte on the sender's egress (and the
//! receiver's ingress), a per-message receive CPU cost, and seeded jitter that never breaks
//! per-link FIFO order.

/// Cost parameters of the simulated network. Times are virtual nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetModel {
    /// Latency per message (α).
    pub alpha_ns: u64,
    /// Transfer cost per byte (β) in picoseconds: 1000 ps/byte is 1 GB/s.
    pub beta_ps_per_byte: u64,
    /// Receive handling per message at every daemon, relays included (serialized per daemon).
    pub cpu_ns: u64,
    /// Largest extra random delay added to one message (uniform in `0..=jitter_ns`).
    pub jitter_ns: u64,
    /// The receiver's inbound link is also busy `bytes·β` per message (one NIC per daemon).
    pub ingress_serialized: bool,
}

impl NetModel {
    /// α = 50 µs, 1 GB/s, 100 ns of receive handling, no jitter.
    pub fn projection_default() -> Self {
        NetModel { alpha_ns: 50_000, beta_ps_per_byte: 1_000, cpu_ns: 100, jitter_ns: 0, ingress_serialized: true }
    }

    /// Time the link is busy with `bytes` bytes.
    pub fn wire_ns(&self, bytes: usize) -> u64 {
        ((bytes as u128 * self.beta_ps_per_byte as u128) / 1_000) as u64
    }
}
