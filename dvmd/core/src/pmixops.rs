//! How a PMIx client's collective becomes a grpcomm fence, and where a peer's data is asked
//! for: the signature every daemon of an operation derives alike from the procs a client
//! named, the daemons that take part, and whether a namespace not learned yet may still come.
//!
//! Owns these rules and nothing else: placements and names in, decisions out. Never: calls
//! libpmix, holds a reply, or keeps state (the shell's PMIx host calls these with what it has
//! learned). Do not break: two daemons given the same set of procs, in any order, must derive
//! byte-identical keys and the same participants, or the fence never completes.

use std::collections::{BTreeMap, BTreeSet};

use dvm_grpcomm::{FenceSignature, Participants};

use crate::jobmap::Placement;
use crate::Rank;

/// A proc as a client names it: a rank of a namespace, or all of them (`rank: None`, PMIx's
/// wildcard).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc<'a> {
    pub nspace: &'a str,
    pub rank: Option<u32>,
}

/// A participant set written canonically: nspaces in order, each with its ranks as sorted
/// ranges (`ns:0-3,7`) or `*`, joined by `;`. The same for the same set in any order.
pub fn canonical(procs: &[Proc<'_>]) -> String {
    let mut by_ns: BTreeMap<&str, Option<BTreeSet<u32>>> = BTreeMap::new();
    for p in procs {
        let e = by_ns.entry(p.nspace).or_insert_with(|| Some(BTreeSet::new()));
        match (p.rank, e.as_mut()) {
            (Some(r), Some(set)) => {
                set.insert(r);
            }
            (None, _) => *e = None,
            (Some(_), None) => {}
        }
    }
    let mut out = Vec::new();
    for (ns, ranks) in by_ns {
        let Some(ranks) = ranks else {
            out.push(format!("{ns}:*"));
            continue;
        };
        let mut ranges: Vec<String> = Vec::new();
        let mut it = ranks.into_iter().peekable();
        while let Some(first) = it.next() {
            let mut last = first;
            while it.peek() == Some(&(last + 1)) {
                last = it.next().unwrap_or(last);
            }
            ranges.push(if first == last { first.to_string() } else { format!("{first}-{last}") });
        }
        out.push(format!("{ns}:{}", ranges.join(",")));
    }
    out.join(";")
}

/// A fence over procs of one job (`nspace`, its `placement`): its signature and the number of
/// procs it names (what the movement's size hint counts). Participants are the daemons that
/// host a named rank (every daemon of the job for a wildcard); a rank the job does not have
/// adds none.
pub fn job_fence(nspace: &str, procs: &[Proc<'_>], placement: &Placement) -> (FenceSignature, u64) {
    let wildcard = procs.iter().any(|p| p.rank.is_none());
    let (key, mut daemons): (String, Vec<Rank>) = if wildcard {
        (format!("{nspace}:*"), placement.daemons().collect())
    } else {
        let mut ranks: Vec<u32> = procs.iter().filter_map(|p| p.rank).collect();
        ranks.sort_unstable();
        ranks.dedup();
        let ds = ranks.iter().filter_map(|&r| placement.node_of(r)).collect();
        (format!("{nspace}:{}", ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(",")), ds)
    };
    daemons.sort_unstable();
    daemons.dedup();
    let nprocs = if wildcard { u64::from(placement.nprocs()) } else { procs.len() as u64 };
    (FenceSignature::new(key.into_bytes(), Participants::Daemons(daemons)), nprocs)
}

/// The daemons hosting any of `procs` (a wildcard: every daemon of that job), in order, with
/// `placement_of` giving each namespace's placement; an error names the first proc of a job
/// not known or a rank its job does not have.
pub fn daemons_of<'p>(
    procs: &[Proc<'_>],
    placement_of: impl Fn(&str) -> Option<&'p Placement>,
) -> Result<Vec<Rank>, String> {
    let mut daemons = BTreeSet::new();
    for p in procs {
        let Some(placement) = placement_of(p.nspace) else {
            return Err(format!("{} is of no job this DVM runs", show(p)));
        };
        match p.rank {
            None => daemons.extend(placement.daemons()),
            Some(r) => match placement.node_of(r) {
                Some(d) => {
                    daemons.insert(d);
                }
                None => return Err(format!("{}: the job has {} ranks", show(p), placement.nprocs())),
            },
        }
    }
    Ok(daemons.into_iter().collect())
}

/// A collective across jobs (connect, disconnect, a fence over several namespaces): the
/// signature under `what` (and a group's id, if any) over the canonical set and `daemons`.
pub fn union_fence(what: &str, group: Option<&str>, procs: &[Proc<'_>], daemons: Vec<Rank>) -> FenceSignature {
    FenceSignature::new(canonical_key(what, group, procs).into_bytes(), Participants::Daemons(daemons))
}

/// The key of an operation across jobs: `what`, a group's id if any, and the canonical set.
pub fn canonical_key(what: &str, group: Option<&str>, procs: &[Proc<'_>]) -> String {
    match group {
        Some(id) => format!("{what}|{id}|{}", canonical(procs)),
        None => format!("{what}|{}", canonical(procs)),
    }
}

fn show(p: &Proc<'_>) -> String {
    match p.rank {
        Some(r) => format!("{}:{r}", p.nspace),
        None => format!("{}:*", p.nspace),
    }
}

/// Jobs whose maps may still be on their way to a daemon that has learned job `highest`: the
/// HNP numbers jobs in order and broadcasts their maps in order, so a job not yet learned is
/// a later one, and no more than this many are launched while one daemon lags.
pub const MAX_JOBS_AHEAD: u32 = 64;

/// Whether `nspace` may name a job of this DVM whose maps have not reached this daemon yet:
/// a job namespace (`nspace_of`) numbered above the highest job learned, by at most
/// [`MAX_JOBS_AHEAD`]. Anything else (a job that ended, or a name no job of this DVM has)
/// never comes, and a request waiting for it would wait forever.
pub fn may_still_come(nspace: &str, highest_learned: Option<u32>) -> bool {
    let Some(jobid) = nspace
        .rsplit_once("-job")
        .and_then(|(dvm, n)| (dvm.starts_with("dvm-") && !n.starts_with('+')).then(|| n.parse::<u32>().ok()).flatten())
    else {
        return false;
    };
    match highest_learned {
        Some(h) => jobid > h && jobid - h <= MAX_JOBS_AHEAD,
        None => jobid <= MAX_JOBS_AHEAD,
    }
}

#[cfg(test)]
mod tests;
