//! Mapping policies (Open MPI / PRRTE habits): per-node proc counts first, then the compact
//! [`Placement`]. Rank sequence = apps concatenated (MPMD), mapped as one.

use dvm_proto::job::{JobSpec, MapBy};

use super::placement::{Layout, Placement};
use super::MapError;

/// A candidate node of the DVM: the daemon on it, its host name and its slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSlots {
    pub daemon: u32,
    pub host: String,
    pub slots: u32,
}

/// Names of `nodes` for a message: all of them up to 8, then the first 8 and the count.
fn host_list<'a>(nodes: impl ExactSizeIterator<Item = &'a NodeSlots>) -> String {
    const SHOWN: usize = 8;
    let n = nodes.len();
    let mut names: Vec<&str> = nodes.take(SHOWN).map(|s| s.host.as_str()).collect();
    if n > SHOWN {
        names.push("...");
    }
    names.join(",")
}

/// Map `spec` onto `nodes` (the DVM's candidate nodes in daemon-rank order). Nodes with 0 slots
/// are never used; a non-empty `spec.hosts` restricts to those host names.
pub fn map_job(spec: &JobSpec, nodes: &[NodeSlots]) -> Result<Placement, MapError> {
    if spec.apps.is_empty() {
        return Err(MapError::NoApps);
    }
    let policy = MapBy::try_from(spec.map_by).map_err(|_| MapError::UnknownPolicy(spec.map_by))?;
    let mut seen = std::collections::HashSet::new();
    for n in nodes {
        if !seen.insert(n.daemon) {
            return Err(MapError::DuplicateDaemon { daemon: n.daemon, host: n.host.clone() });
        }
    }
    let known: std::collections::HashSet<&str> = nodes.iter().map(|n| n.host.as_str()).collect();
    for h in &spec.hosts {
        if !known.contains(h.as_str()) {
            return Err(MapError::UnknownHost { host: h.clone(), known: host_list(nodes.iter()) });
        }
    }
    let wanted: std::collections::HashSet<&str> = spec.hosts.iter().map(String::as_str).collect();
    let usable: Vec<&NodeSlots> =
        nodes.iter().filter(|n| n.slots > 0 && (wanted.is_empty() || wanted.contains(n.host.as_str()))).collect();
    if policy == MapBy::Ppr && spec.ppr == 0 {
        return Err(MapError::ZeroPpr);
    }

    // Resolve np (0 = fill) per app; ranks of app i follow those of apps 0..i.
    let total_slots: u64 = usable.iter().map(|n| n.slots as u64).sum();
    let fill = match policy {
        MapBy::Ppr => spec.ppr as u64 * usable.len() as u64,
        MapBy::Slot | MapBy::Node => total_slots,
    };
    let mut app_first_rank = Vec::with_capacity(spec.apps.len());
    let mut np: u64 = 0;
    for app in &spec.apps {
        app_first_rank.push(np.min(u32::MAX as u64) as u32);
        np += if app.np == 0 { fill } else { app.np as u64 };
    }
    if usable.is_empty() {
        let np0 = if spec.apps.iter().any(|a| a.np == 0) { 0 } else { np };
        let hosts = if spec.hosts.is_empty() && nodes.is_empty() {
            // Every daemon with slots was lost (or none had any): say so, not "()".
            "any node of the DVM: no daemon with slots is left".to_string()
        } else if spec.hosts.is_empty() {
            format!("any node of the DVM ({})", host_list(nodes.iter()))
        } else {
            format!("hosts {}", spec.hosts.join(","))
        };
        return Err(MapError::NoSlots { np: np0, hosts });
    }
    if np > u32::MAX as u64 {
        return Err(MapError::TooManyProcs { np });
    }
    let hosts = || host_list(usable.iter().copied());
    let not_enough = || MapError::NotEnoughSlots { np, slots: total_slots, nodes: usable.len() as u64, hosts: hosts() };
    let overfull = |policy: String, i: usize, procs: u32| MapError::NodeOverfull {
        np,
        policy,
        host: usable[i].host.clone(),
        daemon: usable[i].daemon,
        procs,
        slots: usable[i].slots,
    };
    let daemons: Vec<u32> = usable.iter().map(|n| n.daemon).collect();
    let nprocs = np as u32;

    let counts: Vec<u32> = match policy {
        MapBy::Slot => {
            if np <= total_slots {
                // Fill each node's slots in node order; nodes past the last proc are unused.
                let mut left = nprocs;
                let mut counts = Vec::new();
                for n in &usable {
                    if left == 0 {
                        break;
                    }
                    let c = n.slots.min(left);
                    counts.push(c);
                    left -= c;
                }
                counts
            } else if !spec.oversubscribe {
                return Err(not_enough());
            } else {
                // Every node full, the extra procs dealt one by one round-robin.
                let k = usable.len() as u64;
                let extra = np - total_slots;
                usable
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (n.slots as u64 + extra / k + u64::from((i as u64) < extra % k)) as u32)
                    .collect()
            }
        }
        MapBy::Node => {
            if !spec.oversubscribe && np > total_slots {
                return Err(not_enough());
            }
            let k = (usable.len() as u32).min(nprocs);
            let placement = Placement::new(nprocs, app_first_rank, ranges(&daemons[..k as usize]), Layout::RoundRobin)
                .expect("the mapper builds a valid round-robin placement");
            if !spec.oversubscribe {
                for i in 0..k {
                    let c = placement.ranks_at(i).len();
                    if c > usable[i as usize].slots {
                        return Err(overfull("by node".into(), i as usize, c));
                    }
                }
            }
            return Ok(placement);
        }
        MapBy::Ppr => {
            let ppr = spec.ppr as u64;
            if np > ppr * usable.len() as u64 {
                return Err(MapError::PprExceeded { np, ppr: spec.ppr, nodes: usable.len() as u64 });
            }
            if !spec.oversubscribe && np > total_slots {
                return Err(not_enough());
            }
            let k = np.div_ceil(ppr) as usize;
            let counts: Vec<u32> = (0..k).map(|i| (np - i as u64 * ppr).min(ppr) as u32).collect();
            if !spec.oversubscribe {
                if let Some(i) = (0..k).find(|&i| counts[i] > usable[i].slots) {
                    return Err(overfull(format!("with ppr:{ppr}:node"), i, counts[i]));
                }
            }
            counts
        }
    };
    Ok(block(nprocs, app_first_rank, &daemons[..counts.len()], &counts))
}

/// Consecutive daemon ranks folded into `(first, count)` ranges, in the given order.
fn ranges(daemons: &[u32]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &d in daemons {
        match out.last_mut() {
            Some((first, count)) if first.checked_add(*count) == Some(d) => *count += 1,
            _ => out.push((d, 1)),
        }
    }
    out
}

/// A block placement from per-node counts (all >= 1): uniform when every node but the last
/// holds the same count and the last no more.
fn block(nprocs: u32, app_first_rank: Vec<u32>, daemons: &[u32], counts: &[u32]) -> Placement {
    let each = counts[0];
    let (last, body) = counts.split_last().expect("at least one node");
    let layout = if body.iter().all(|&c| c == each) && *last <= each {
        Layout::Block { each }
    } else {
        let mut first_rank = Vec::with_capacity(counts.len() + 1);
        let mut r = 0;
        first_rank.push(0);
        for &c in counts {
            r += c;
            first_rank.push(r);
        }
        Layout::PerNode { first_rank }
    };
    Placement::new(nprocs, app_first_rank, ranges(daemons), layout).expect("the mapper builds a valid block placement")
}

#[cfg(test)]
mod tests {
    use super::*;
    use dvm_proto::job::AppContext;

    fn node(daemon: u32, host: &str, slots: u32) -> NodeSlots {
        NodeSlots { daemon, host: host.into(), slots }
    }

    #[test]
    fn refusals_name_the_value() {
        let nodes = [node(0, "a", 2), node(1, "b", 2)];
        let app = AppContext { np: 2, ..Default::default() };
        let spec = |map_by: i32| JobSpec { apps: vec![app.clone()], map_by, ..Default::default() };
        assert_eq!(map_job(&JobSpec::default(), &nodes), Err(MapError::NoApps));
        assert_eq!(map_job(&spec(9), &nodes), Err(MapError::UnknownPolicy(9)));
        let e = map_job(&spec(0), &[node(0, "a", 2), node(0, "b", 2)]).unwrap_err();
        assert_eq!(e.to_string(), "cannot map the job: daemon 0 (host b) is listed twice among the DVM's nodes");
        let e = map_job(&JobSpec { hosts: vec!["b".into()], ..spec(0) }, &[node(0, "a", 2), node(1, "b", 0)]);
        assert_eq!(e.unwrap_err().to_string(), "cannot map 2 processes: no slots on hosts b");
        // Every daemon with slots lost: the sentence says so instead of an empty list.
        let e = map_job(&spec(0), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot map 2 processes: no slots on any node of the DVM: no daemon with slots is left"
        );
        let e = map_job(&JobSpec { ppr: 0, ..spec(MapBy::Ppr as i32) }, &nodes).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot map the job: ppr 0 per node asks for no processes; use ppr:N:node with N >= 1"
        );
        let big = AppContext { np: u32::MAX, ..Default::default() };
        let e = map_job(&JobSpec { apps: vec![big.clone(), big], oversubscribe: true, ..spec(0) }, &nodes);
        assert_eq!(e, Err(MapError::TooManyProcs { np: 2 * u32::MAX as u64 }));
    }

    #[test]
    fn host_list_is_bounded() {
        let nodes: Vec<NodeSlots> = (0..20).map(|i| node(i, &format!("h{i}"), 1)).collect();
        assert_eq!(host_list(nodes.iter()), "h0,h1,h2,h3,h4,h5,h6,h7,...");
    }
}
