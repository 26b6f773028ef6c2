//! What `dvmd`'s options become: the collective and transport settings every daemon of a DVM
//! must hold alike, their checks, and how a daemon's PMIx workers are set up.
//!
//! Never: starts anything.

use super::*;

pub(super) fn validate_common(args: &Args) -> Result<()> {
    dvm_rml::Tree::new(args.radix, 1).map_err(|e| anyhow!("--radix {}: {e}", args.radix))?;
    if !(args.startup_timeout > 0.0 && args.startup_timeout.is_finite()) {
        bail!("--startup-timeout {}: must be a positive number of seconds", args.startup_timeout);
    }
    if args.max_message < 1024 {
        bail!("--max-message {}: must be at least 1024 bytes", args.max_message);
    }
    if let Some(us) = args.link_latency_us.filter(|us| !(us.is_finite() && *us >= 0.0)) {
        bail!("--link-latency-us {us}: must be a non-negative number of microseconds");
    }
    if let Some(mbps) = args.link_bandwidth_mbps.filter(|m| !(m.is_finite() && *m > 0.0)) {
        bail!("--link-bandwidth-mbps {mbps}: must be a positive number of MB/s");
    }
    Ok(())
}

/// `mode`, or with `other` the movement a test hook forces instead (see
/// `DVMD_FAULT_OTHER_FENCE_MOVEMENT_RANK`).
pub(super) fn other_movement(mode: dvm_grpcomm::FenceMovementMode, other: bool) -> dvm_grpcomm::FenceMovementMode {
    use dvm_grpcomm::FenceMovementMode::{Allgather, Tree};
    match (other, mode) {
        (false, m) => m,
        (true, Allgather) => Tree,
        (true, _) => Allgather,
    }
}

/// The collective configuration from the command line (the same on every daemon).
pub(super) fn grpcomm_config(args: &Args) -> dvm_grpcomm::Config {
    let mut cfg = dvm_grpcomm::Config {
        fence_movement: args.fence_movement,
        bcast_movement: args.bcast_movement,
        // grpcomm's default stands for what is not given, until the HNP has measured a link.
        link: {
            let d = dvm_grpcomm::LinkModel::default();
            dvm_grpcomm::LinkModel {
                alpha_ns: args.link_latency_us.map_or(d.alpha_ns, |us| us * 1e3),
                beta_ns_per_byte: args.link_bandwidth_mbps.map_or(d.beta_ns_per_byte, |mbps| 1e3 / mbps),
            }
        },
        ..dvm_grpcomm::Config::default()
    };
    // dvm-bench's broadcast may take either movement (its A/B runs force one).
    cfg.bulk_tags.insert(dvm_core::dtags::BENCH_XCAST);
    cfg
}

pub(super) fn transport_config(
    args: &Args,
    rank: Rank,
    epoch: u64,
    listen: SocketAddr,
    secret: DvmSecret,
) -> TransportConfig {
    let mut cfg = TransportConfig::new(rank, epoch, listen, secret);
    cfg.max_frame = args.max_message;
    cfg.heartbeat = Duration::from_millis(args.heartbeat_ms);
    cfg.heartbeat_misses = args.heartbeat_misses;
    cfg.link_security = args.link_security;
    cfg
}

/// Test hook `DVM_TEST_DIAL_VIA=RANK@IP:PORT` (read by the HNP only): the HNP dials daemon RANK
/// through the forwarding proxy at IP:PORT (see `TransportConfig::dial_via`).
pub(super) fn dial_via_from_env() -> Result<Option<(Rank, SocketAddr)>> {
    let Ok(v) = std::env::var("DVM_TEST_DIAL_VIA") else { return Ok(None) };
    let parsed = v.split_once('@').and_then(|(r, a)| Some((r.parse().ok()?, a.parse().ok()?)));
    parsed.map(Some).ok_or_else(|| anyhow!("DVM_TEST_DIAL_VIA={v}: expected RANK@IP:PORT"))
}

/// Every daemon hosts a PMIx server (in a worker process) in its own session directory:
/// started by the first job that reaches the daemon, or (eager) now, in the background — but
/// not on a daemon with no slots (an HNP outside the allocation), where no job will run
/// unless spawned there later, and a server would only take CPU from the boot. `hnp` is the
/// HNP's address: it names the DVM's cpu groups.
pub(super) fn start_pmix(
    daemon: &mut Daemon,
    session: &std::path::Path,
    args: &Args,
    slots: u32,
    hnp: std::net::SocketAddr,
) {
    daemon.set_session_dir(session);
    daemon.set_rank_priority(args.rank_priority, &hnp.to_string());
    daemon.set_mpi(args.mpi);
    daemon.set_heartbeat_bound(std::time::Duration::from_millis(args.heartbeat_ms) * args.heartbeat_misses.max(1));
    daemon.set_pmix_settings(pmix_settings(session, args));
    if eager_pmix(args, slots) {
        daemon.start_pmix_background();
    }
}

/// Where a daemon's PMIx workers keep their files, and when one is replaced.
pub(super) fn pmix_settings(session: &std::path::Path, args: &Args) -> dvmd::pmix::PmixSettings {
    dvmd::pmix::PmixSettings { dir: session.join("pmix"), recycle_kib: args.pmix_recycle_kib }
}

/// Whether a daemon with `slots` starts its PMIx server at boot (and, not the HNP, forks its
/// worker as it starts): `--pmix-start eager`, and a slot a job could use.
pub(super) fn eager_pmix(args: &Args, slots: u32) -> bool {
    args.pmix_start == "eager" && slots > 0
}
