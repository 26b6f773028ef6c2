//! The launch on the wire: the `JobMap` (broadcast, O(nodes), a few bytes for regular
//! layouts), one `Residual` per hosting daemon (scattered: that daemon's ranks), decoding with
//! full validation, and the byte accounting of a launch.

use bytes::Bytes;
use dvm_proto::grpcomm::ScatterSlice;
use dvm_proto::job::{proc_map, JobMap, JobSpec, NodeRange, ProcMap, RankRange, Residual};
use dvm_proto::Message;

use super::placement::{Layout, Placement, Ranks};
use super::LaunchError;

/// Most procs one daemon forks for a job (Linux's largest pid_max): a map asking for more is
/// refused before anything is allocated for them.
pub const MAX_LOCAL_PROCS: u32 = 1 << 22;

/// A proc this daemon forks, with what it derives for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalProc {
    pub rank: u32,
    pub app: u32,
    pub local_rank: u32,
    pub node_rank: u32,
}

fn rank_ranges(r: &Ranks) -> Vec<RankRange> {
    r.runs()
        .into_iter()
        .map(|(first, count, stride)| RankRange { first, count, stride: if stride == 1 { 0 } else { stride } })
        .collect()
}

impl Placement {
    /// The wire form of the placement (nodes as daemon ranges, layout).
    pub fn to_proc_map(&self) -> ProcMap {
        let nodes = self.node_ranges().iter().map(|&(first, count)| NodeRange { first, count }).collect();
        let layout = match self.layout() {
            Layout::Block { each } => proc_map::Layout::Block(proc_map::Block { each: *each }),
            Layout::PerNode { first_rank } => proc_map::Layout::PerNode(proc_map::PerNode {
                count: first_rank.windows(2).map(|w| w[1] - w[0]).collect(),
            }),
            Layout::RoundRobin => proc_map::Layout::RoundRobin(proc_map::RoundRobin {}),
            Layout::Explicit { node_of } => proc_map::Layout::Explicit(proc_map::Explicit { node: node_of.clone() }),
        };
        ProcMap { nodes, layout: Some(layout) }
    }

    /// Rebuild the placement from a received `JobMap`, validating every field.
    pub fn from_job_map(map: &JobMap) -> Result<Placement, LaunchError> {
        let job = map.jobid;
        let bad = |reason: String| LaunchError::BadMap { job, reason };
        let pm = map.map.as_ref().ok_or_else(|| bad("no proc map".into()))?;
        let layout = match pm.layout.as_ref().ok_or_else(|| bad("no layout".into()))? {
            proc_map::Layout::Block(b) => Layout::Block { each: b.each },
            proc_map::Layout::RoundRobin(_) => Layout::RoundRobin,
            proc_map::Layout::Explicit(e) => Layout::Explicit { node_of: e.node.clone() },
            proc_map::Layout::PerNode(p) => {
                let mut first_rank = Vec::with_capacity(p.count.len() + 1);
                let mut r: u64 = 0;
                first_rank.push(0);
                for &c in &p.count {
                    r += c as u64;
                    if r > map.nprocs as u64 {
                        return Err(bad(format!("per-node counts exceed the job's {} procs", map.nprocs)));
                    }
                    first_rank.push(r as u32);
                }
                Layout::PerNode { first_rank }
            }
        };
        let ranges = pm.nodes.iter().map(|r| (r.first, r.count)).collect();
        let placement = Placement::new(map.nprocs, map.app_first_rank.clone(), ranges, layout).map_err(bad)?;
        if map.apps.len() != map.app_first_rank.len() {
            return Err(bad(format!("{} apps but {} app start ranks", map.apps.len(), map.app_first_rank.len())));
        }
        for (i, app) in map.apps.iter().enumerate() {
            let n = placement.app_ranks(i as u32).map_or(0, |r| r.len());
            if app.np as usize != n {
                return Err(bad(format!("app {i} has np {} but {n} ranks", app.np)));
            }
        }
        Ok(placement)
    }

    /// The procs `me` forks, cross-checked against its residual: the residual must list
    /// exactly the ranks the placement puts on `me`, each once.
    pub fn local_procs(&self, job: u32, residual: &Residual, me: u32) -> Result<Vec<LocalProc>, LaunchError> {
        if residual.jobid != job {
            return Err(LaunchError::WrongJob { daemon: me, job, residual_job: residual.jobid });
        }
        let mine = self.procs_on(me);
        if mine.len() > MAX_LOCAL_PROCS {
            return Err(LaunchError::TooManyLocal { daemon: me, job, procs: mine.len(), max: MAX_LOCAL_PROCS });
        }
        let mut seen = vec![false; mine.len() as usize];
        for (i, rr) in residual.ranks.iter().enumerate() {
            let stride = rr.stride.max(1);
            let last = rr.first as u64 + (rr.count as u64).saturating_sub(1) * stride as u64;
            if rr.count == 0 || last > u32::MAX as u64 {
                let reason = format!(
                    "rank range {i} (first {}, count {}, stride {stride}) is empty or overflows",
                    rr.first, rr.count
                );
                return Err(LaunchError::BadResidual { daemon: me, job, reason });
            }
            // Stops at the first rank that is not ours or repeated: at most |mine| + 1 steps.
            for rank in Ranks::strided(rr.first, rr.count, stride).iter() {
                let Some(idx) = mine.index_of(rank) else {
                    let placed = match self.node_of(rank) {
                        Some(d) => format!("places on daemon {d}"),
                        None => format!("does not have (it has {} procs)", self.nprocs()),
                    };
                    return Err(LaunchError::ForeignRank { daemon: me, job, rank, placed });
                };
                if std::mem::replace(&mut seen[idx as usize], true) {
                    let reason = format!("rank {rank} is listed twice");
                    return Err(LaunchError::BadResidual { daemon: me, job, reason });
                }
            }
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(LaunchError::MissingRank { daemon: me, job, rank: mine.get(i as u32).unwrap() });
        }
        Ok(mine
            .iter()
            .enumerate()
            .map(|(i, rank)| LocalProc {
                rank,
                app: self.app_of(rank).expect("rank of the placement"),
                local_rank: i as u32,
                node_rank: i as u32,
            })
            .collect())
    }
}

/// The launch messages of job `jobid`: the `JobMap` to broadcast (job-level fields of `spec`,
/// each app's np resolved, an empty wdir defaulted to `spec.cwd`; `hnp_iof_window` left 0 for
/// the caller) and `(daemon, Residual)` to scatter, one per hosting daemon in node order.
pub fn encode(jobid: u32, spec: &JobSpec, placement: &Placement) -> (JobMap, Vec<(u32, Residual)>) {
    let apps = spec
        .apps
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mut a = a.clone();
            a.np = placement.app_ranks(i as u32).map_or(0, |r| r.len() as u32);
            if a.wdir.is_empty() {
                a.wdir = spec.cwd.clone();
            }
            a
        })
        .collect();
    let map = JobMap {
        jobid,
        nprocs: placement.nprocs(),
        apps,
        app_first_rank: placement.app_first_rank().to_vec(),
        map: Some(placement.to_proc_map()),
        tag_output: spec.tag_output,
        merge_stderr: spec.merge_stderr,
        stdin_target: spec.stdin_target,
        stdin_rank: spec.stdin_rank,
        hnp_iof_window: 0,
        report_launch: false,
        plan: Some(super::plan_of(spec, placement.nprocs()).to_wire()),
        report_bindings: spec.report_bindings,
        timestamp_output: spec.timestamp_output,
        mpi: spec.mpi,
        pmi_preput: spec.pmi_preput.clone(),
        // The HNP's to fill in (it knows the DVM's slots).
        universe: 0,
    };
    // A rankfile's cpus go to the daemon of each rank, in its rank order.
    let pinned: std::collections::HashMap<u32, &str> =
        spec.rankfile.iter().filter(|e| !e.cpus.is_empty()).map(|e| (e.rank, e.cpus.as_str())).collect();
    let residuals = (0..placement.num_nodes())
        .map(|n| {
            let daemon = placement.daemon_at(n).expect("node index in range");
            let ranks = placement.ranks_at(n);
            let cpus = if pinned.is_empty() {
                Vec::new()
            } else {
                ranks.iter().map(|k| pinned.get(&k).copied().unwrap_or_default().to_string()).collect()
            };
            (daemon, Residual { jobid, ranks: rank_ranges(&ranks), cpus })
        })
        .collect();
    (map, residuals)
}

/// Decode `map`, then [`Placement::local_procs`] for daemon `me`.
pub fn local_procs(map: &JobMap, residual: &Residual, me: u32) -> Result<Vec<LocalProc>, LaunchError> {
    Placement::from_job_map(map)?.local_procs(map.jobid, residual, me)
}

/// Bytes of a launch (protobuf `encoded_len`).
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchSizes {
    pub nprocs: u32,
    /// The encoded `JobMap`, sent once and relayed to every daemon by the broadcast.
    pub map_bytes: usize,
    /// Daemons the broadcast reaches.
    pub receivers: u32,
    /// Sum of the encoded residuals.
    pub residual_bytes: usize,
    /// The residuals framed as grpcomm `ScatterSlice`s (destination + length prefixes).
    pub scatter_bytes: usize,
    /// Largest / smallest map + own residual received by a daemon hosting procs.
    pub per_daemon_max: usize,
    pub per_daemon_min: usize,
}

impl LaunchSizes {
    /// (map + residuals) / nprocs: the launch information per proc.
    pub fn bytes_per_proc(&self) -> f64 {
        (self.map_bytes + self.residual_bytes) as f64 / self.nprocs.max(1) as f64
    }

    /// Bytes delivered (map to every receiver, each residual framed once) per proc.
    pub fn wire_bytes(&self) -> usize {
        self.map_bytes * self.receivers as usize + self.scatter_bytes
    }

    pub fn wire_bytes_per_proc(&self) -> f64 {
        self.wire_bytes() as f64 / self.nprocs.max(1) as f64
    }
}

/// Sizes of the launch of `map` + `residuals` on a DVM of `receivers` daemons.
pub fn launch_sizes(map: &JobMap, residuals: &[(u32, Residual)], receivers: u32) -> LaunchSizes {
    let map_bytes = map.encoded_len();
    let sizes: Vec<usize> = residuals.iter().map(|(_, r)| r.encoded_len()).collect();
    let scatter_bytes = residuals
        .iter()
        .map(|(d, r)| {
            let slice = ScatterSlice { dst: *d, data: Bytes::from(r.encode_to_vec()) };
            prost::encoding::message::encoded_len(4, &slice)
        })
        .sum();
    LaunchSizes {
        nprocs: map.nprocs,
        map_bytes,
        receivers,
        residual_bytes: sizes.iter().sum(),
        scatter_bytes,
        per_daemon_max: map_bytes + sizes.iter().copied().max().unwrap_or(0),
        per_daemon_min: map_bytes + sizes.iter().copied().min().unwrap_or(0),
    }
}
