//! What a namespace is registered with: the job's maps (`JobInfo`) and, as PRRTE registers
//! them, each rank's, app's and node's keys derived from those maps, never given in part.

use std::collections::BTreeMap;

use crate::error::PmixError;
use crate::sys;
use crate::types::{key_str, Info, InfoArray, InfoValue, Rank};

/// The facts registered with an nspace. Only the maps are required by libpmix; from them it
/// derives job size, local peers, and each rank's local rank, node rank and hostname.
///
/// With `apps` (or `proc_extra`) given, the job is registered as PRRTE registers it: every
/// rank's `PMIX_PROC_DATA` (appnum, app rank, local and node rank, node id, hostname), each
/// app's `PMIX_APP_INFO_ARRAY` and each node's `PMIX_NODE_INFO_ARRAY`. Registering any proc data
/// stops libpmix's per-rank derivation, so all of it is supplied, for every rank, from the
/// maps (one source: [`JobInfo::proc_data`]).
#[derive(Debug, Clone, Default)]
pub struct JobInfo {
    /// Hostnames in node order (`PMIX_NODE_MAP`). One of them must be this server's hostname.
    pub node_map: Vec<String>,
    /// The ranks on each node, same order as `node_map` (`PMIX_PROC_MAP`).
    pub proc_map: Vec<Vec<u32>>,
    /// `PMIX_JOB_SIZE`: must equal the number of ranks in `proc_map`.
    pub job_size: u32,
    /// `PMIX_UNIV_SIZE`.
    pub universe_size: u32,
    /// `PMIX_APPNUM`.
    pub appnum: u32,
    /// `PMIX_JOBID`, if the host has a printable job id.
    pub jobid: Option<String>,
    /// `PMIX_MAX_PROCS`; None: `universe_size`.
    pub max_procs: Option<u32>,
    /// Further job-level keys, appended as given.
    pub extra: Vec<Info>,
    /// The job's applications in appnum order (MPMD: `prun A : B`). Empty: a job-level
    /// `PMIX_APPNUM` (`appnum`) and no per-app keys.
    pub apps: Vec<AppInfo>,
    /// Further keys of single ranks, added to their `PMIX_PROC_DATA` (the cpuset and locality
    /// of bound ranks).
    pub proc_extra: BTreeMap<u32, Vec<Info>>,
}

/// One application of a job (`PMIX_APP_INFO_ARRAY`): ranks `first_rank..` up to the next app's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppInfo {
    /// `PMIX_APPLDR`.
    pub first_rank: u32,
    /// `PMIX_APP_ARGV` (joined by spaces, as PRRTE does); empty: not registered.
    pub argv: Vec<String>,
    /// `PMIX_WDIR`; empty: not registered.
    pub wdir: String,
}

/// What libpmix is told of one rank (`PMIX_PROC_DATA`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcData {
    pub rank: u32,
    pub appnum: u32,
    pub app_rank: u32,
    pub local_rank: u16,
    pub node_rank: u16,
    pub nodeid: u32,
    pub hostname: String,
}

impl JobInfo {
    /// `PMIX_NODE_MAP` as registered: comma-separated hostnames.
    pub fn node_map_string(&self) -> String {
        self.node_map.join(",")
    }

    /// `PMIX_PROC_MAP` as registered: per node a comma-separated rank list, nodes separated by ';'.
    pub fn proc_map_string(&self) -> String {
        self.proc_map
            .iter()
            .map(|ranks| ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(","))
            .collect::<Vec<_>>()
            .join(";")
    }

    /// First rank of each app (one app of the whole job when `apps` is empty).
    fn app_firsts(&self) -> Vec<u32> {
        if self.apps.is_empty() {
            vec![0]
        } else {
            self.apps.iter().map(|a| a.first_rank).collect()
        }
    }

    /// Whether ranks get `PMIX_PROC_DATA` (see [`JobInfo`]).
    fn has_proc_data(&self) -> bool {
        !self.apps.is_empty() || !self.proc_extra.is_empty()
    }

    /// Every rank's proc data, in rank order, from the maps and the apps' first ranks: local
    /// and node rank are the index among the node's ranks in rank order (one job per node's
    /// ranks: node rank equals local rank), app rank the offset from the app's first rank.
    pub fn proc_data(&self) -> Vec<ProcData> {
        let firsts = self.app_firsts();
        let mut out = Vec::with_capacity(self.job_size as usize);
        for (nodeid, (host, ranks)) in self.node_map.iter().zip(&self.proc_map).enumerate() {
            let mut sorted = ranks.clone();
            sorted.sort_unstable();
            for (i, &rank) in sorted.iter().enumerate() {
                let appnum = firsts.partition_point(|&f| f <= rank).saturating_sub(1);
                let local = u16::try_from(i).unwrap_or(u16::MAX);
                out.push(ProcData {
                    rank,
                    appnum: appnum as u32,
                    app_rank: rank - firsts[appnum],
                    local_rank: local,
                    node_rank: local,
                    nodeid: nodeid as u32,
                    hostname: host.clone(),
                });
            }
        }
        out.sort_unstable_by_key(|p| p.rank);
        out
    }

    pub(crate) fn validate(&self, op: &'static str, nspace: &str) -> Result<(), PmixError> {
        let bad = |detail: String| PmixError::InvalidArgument { op, detail: format!("nspace {nspace}: {detail}") };
        if let Some(a) = self.apps.first().filter(|a| a.first_rank != 0) {
            return Err(bad(format!("app 0 starts at rank {}, not 0", a.first_rank)));
        }
        for (i, w) in self.apps.windows(2).enumerate() {
            if w[1].first_rank <= w[0].first_rank || w[1].first_rank >= self.job_size {
                return Err(bad(format!(
                    "app {} starts at rank {}: not after app {i} (rank {}) and below job_size {}",
                    i + 1,
                    w[1].first_rank,
                    w[0].first_rank,
                    self.job_size
                )));
            }
        }
        if let Some(r) = self.proc_extra.keys().find(|&&r| r >= self.job_size) {
            return Err(bad(format!("proc_extra names rank {r}, >= job_size {}", self.job_size)));
        }
        if self.node_map.is_empty() || self.node_map.len() != self.proc_map.len() {
            return Err(bad(format!(
                "node_map has {} nodes but proc_map has {}",
                self.node_map.len(),
                self.proc_map.len()
            )));
        }
        if let Some(h) = self.node_map.iter().find(|h| h.is_empty() || h.contains([',', ';', '\0'])) {
            return Err(bad(format!("hostname {h:?} is empty or contains ',' ';' or NUL")));
        }
        let mut seen = vec![false; self.job_size as usize];
        for (node, ranks) in self.node_map.iter().zip(&self.proc_map) {
            if ranks.is_empty() {
                return Err(bad(format!("node {node} has no ranks in proc_map")));
            }
            for &r in ranks {
                match seen.get_mut(r as usize) {
                    None => return Err(bad(format!("rank {r} on node {node} is >= job_size {}", self.job_size))),
                    Some(true) => return Err(bad(format!("rank {r} appears twice in proc_map"))),
                    Some(s) => *s = true,
                }
            }
        }
        if let Some(missing) = seen.iter().position(|s| !s) {
            return Err(bad(format!("rank {missing} of job_size {} is on no node", self.job_size)));
        }
        Ok(())
    }

    pub(crate) fn to_info(&self, op: &'static str) -> Result<InfoArray, PmixError> {
        let mut a = InfoArray::new();
        a.push(op, key_str(sys::PMIX_NODE_MAP), &InfoValue::String(self.node_map_string()))?;
        a.push(op, key_str(sys::PMIX_PROC_MAP), &InfoValue::String(self.proc_map_string()))?;
        a.push(op, key_str(sys::PMIX_JOB_SIZE), &InfoValue::U32(self.job_size))?;
        a.push(op, key_str(sys::PMIX_UNIV_SIZE), &InfoValue::U32(self.universe_size))?;
        a.push(op, key_str(sys::PMIX_MAX_PROCS), &InfoValue::U32(self.max_procs.unwrap_or(self.universe_size)))?;
        if self.apps.is_empty() {
            a.push(op, key_str(sys::PMIX_APPNUM), &InfoValue::U32(self.appnum))?;
        }
        if let Some(j) = &self.jobid {
            a.push(op, key_str(sys::PMIX_JOBID), &InfoValue::String(j.clone()))?;
        }
        for i in &self.extra {
            a.push(op, &i.key, &i.value)?;
        }
        for i in self.app_infos().into_iter().chain(self.node_infos()).chain(self.proc_infos()) {
            a.push(op, &i.key, &i.value)?;
        }
        Ok(a)
    }

    /// `PMIX_JOB_NUM_APPS` and each app's `PMIX_APP_INFO_ARRAY` (none without `apps`).
    fn app_infos(&self) -> Vec<Info> {
        if self.apps.is_empty() {
            return Vec::new();
        }
        let mut out = vec![Info::new(key_str(sys::PMIX_JOB_NUM_APPS), InfoValue::U32(self.apps.len() as u32))];
        for (n, app) in self.apps.iter().enumerate() {
            let end = self.apps.get(n + 1).map_or(self.job_size, |next| next.first_rank);
            let mut data = vec![
                Info::new(key_str(sys::PMIX_APPNUM), InfoValue::U32(n as u32)),
                Info::new(key_str(sys::PMIX_APP_SIZE), InfoValue::U32(end - app.first_rank)),
                Info::new(key_str(sys::PMIX_APPLDR), InfoValue::Rank(Rank::Id(app.first_rank))),
            ];
            if !app.argv.is_empty() {
                data.push(Info::new(key_str(sys::PMIX_APP_ARGV), InfoValue::String(app.argv.join(" "))));
            }
            if !app.wdir.is_empty() {
                data.push(Info::new(key_str(sys::PMIX_WDIR), InfoValue::String(app.wdir.clone())));
            }
            out.push(Info::new(key_str(sys::PMIX_APP_INFO_ARRAY), InfoValue::Infos(data)));
        }
        out
    }

    /// Each node's `PMIX_NODE_INFO_ARRAY` (none without `apps`): its hostname, id, peers,
    /// their count and leader.
    fn node_infos(&self) -> Vec<Info> {
        if self.apps.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(self.node_map.len());
        for (nodeid, (host, ranks)) in self.node_map.iter().zip(&self.proc_map).enumerate() {
            let mut sorted = ranks.clone();
            sorted.sort_unstable();
            let peers = sorted.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",");
            let n = sorted.len() as u32;
            let data = vec![
                Info::new(key_str(sys::PMIX_HOSTNAME), InfoValue::String(host.clone())),
                Info::new(key_str(sys::PMIX_NODEID), InfoValue::U32(nodeid as u32)),
                Info::new(key_str(sys::PMIX_LOCAL_PEERS), InfoValue::String(peers)),
                Info::new(key_str(sys::PMIX_LOCAL_SIZE), InfoValue::U32(n)),
                Info::new(key_str(sys::PMIX_NODE_SIZE), InfoValue::U32(n)),
                Info::new(key_str(sys::PMIX_LOCALLDR), InfoValue::Rank(Rank::Id(sorted[0]))),
            ];
            out.push(Info::new(key_str(sys::PMIX_NODE_INFO_ARRAY), InfoValue::Infos(data)));
        }
        out
    }

    /// Every rank's `PMIX_PROC_DATA` (none unless [`Self::has_proc_data`]).
    fn proc_infos(&self) -> Vec<Info> {
        if !self.has_proc_data() {
            return Vec::new();
        }
        self.proc_data()
            .into_iter()
            .map(|p| {
                let mut data = vec![
                    Info::new(key_str(sys::PMIX_RANK), InfoValue::Rank(Rank::Id(p.rank))),
                    Info::new(key_str(sys::PMIX_APPNUM), InfoValue::U32(p.appnum)),
                    Info::new(key_str(sys::PMIX_APP_RANK), InfoValue::Rank(Rank::Id(p.app_rank))),
                    Info::new(key_str(sys::PMIX_GLOBAL_RANK), InfoValue::Rank(Rank::Id(p.rank))),
                    Info::new(key_str(sys::PMIX_LOCAL_RANK), InfoValue::U16(p.local_rank)),
                    Info::new(key_str(sys::PMIX_NODE_RANK), InfoValue::U16(p.node_rank)),
                    Info::new(key_str(sys::PMIX_NODEID), InfoValue::U32(p.nodeid)),
                    Info::new(key_str(sys::PMIX_HOSTNAME), InfoValue::String(p.hostname)),
                ];
                if let Some(extra) = self.proc_extra.get(&p.rank) {
                    data.extend(extra.iter().cloned());
                }
                Info::new(key_str(sys::PMIX_PROC_DATA), InfoValue::Infos(data))
            })
            .collect()
    }
}
