//! Mapping policies (Open MPI / PRRTE habits): per-node proc counts first, then the compact
//! [`Placement`]. Rank sequence = apps concatenated (MPMD), mapped as one.

use dvm_proto::job::{BindTo, JobSpec, MapBy, RankBy};

use super::bind::{place_node, Bind, Plan};
use super::placement::{block_layout, layout_of, Layout, NodeSlots, Placement};
use super::topo::Level;
use super::MapError;

/// How every node places its procs on its hardware, from the job's options.
pub fn plan_of(spec: &JobSpec, nprocs: u32) -> Plan {
    let obj = Level::from_wire(spec.map_obj).filter(|&l| l != Level::Node);
    let map_obj = match MapBy::try_from(spec.map_by) {
        Ok(MapBy::Object) | Ok(MapBy::Ppr) => obj,
        _ => None,
    };
    let bind = match BindTo::try_from(spec.bind_to) {
        Ok(BindTo::None) => Bind::None,
        Ok(BindTo::Obj) => Level::from_wire(spec.bind_obj).map_or(Bind::None, Bind::To),
        _ => Bind::Default,
    };
    let rank_obj = match RankBy::try_from(spec.rank_by) {
        Ok(RankBy::Obj) => Level::from_wire(spec.rank_obj),
        _ => None,
    };
    Plan {
        map_obj,
        per_obj: if spec.map_by == MapBy::Ppr as i32 && map_obj.is_some() { spec.ppr } else { 0 },
        rank_obj,
        bind,
        pe: spec.cpus_per_rank.max(1),
        hwthread_cpus: spec.use_hwthread_cpus,
        overload_allowed: spec.bind_overload_allowed,
        if_supported: spec.bind_if_supported,
        job_procs: nprocs,
    }
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
    // With several cpus per rank, a node holds its slots / PE procs.
    let pe = spec.cpus_per_rank.max(1);
    let shares: Vec<NodeSlots> = nodes
        .iter()
        .filter(|n| wanted.is_empty() || wanted.contains(n.host.as_str()))
        .map(|n| NodeSlots { slots: n.slots / pe, ..n.clone() })
        .collect();
    if pe > 1 && !shares.is_empty() && shares.iter().all(|n| n.slots == 0) {
        let most = nodes.iter().map(|n| n.slots).max().unwrap_or(0);
        return Err(MapError::PeExceedsSlots { pe, most });
    }
    let usable: Vec<&NodeSlots> = shares.iter().filter(|n| n.slots > 0).collect();
    if policy == MapBy::Ppr && spec.ppr == 0 {
        return Err(MapError::ZeroPpr);
    }
    let ppr_obj = Level::from_wire(spec.map_obj).filter(|&l| policy == MapBy::Ppr && l != Level::Node);
    // ppr: procs each node holds (N per node, or N per object of the node).
    let ppr_caps: Vec<u64> = match ppr_obj {
        None => usable.iter().map(|_| spec.ppr as u64).collect(),
        Some(obj) => {
            let mut caps = Vec::with_capacity(usable.len());
            for n in &usable {
                let Some(t) = n.topo.as_ref() else {
                    return Err(MapError::NoHardware {
                        host: n.host.clone(),
                        daemon: n.daemon,
                        what: format!("ppr:{}:{}", spec.ppr, obj.name()),
                    });
                };
                caps.push(spec.ppr as u64 * t.count(obj) as u64);
            }
            caps
        }
    };

    // Resolve np (0 = fill) per app; ranks of app i follow those of apps 0..i.
    let total_slots: u64 = usable.iter().map(|n| n.slots as u64).sum();
    let fill = match policy {
        _ if !spec.rankfile.is_empty() => spec.rankfile.len() as u64,
        MapBy::Ppr => ppr_caps.iter().sum(),
        MapBy::Slot | MapBy::Node | MapBy::Object => total_slots,
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
    if !spec.rankfile.is_empty() {
        let p = super::rankfile::map_rankfile(spec, nodes, app_first_rank, np as u32)?;
        super::rankfile::rankfile_cpus(spec, nodes, np as u32)?;
        if !spec.oversubscribe {
            for (i, d) in p.daemons().enumerate() {
                let (c, n) = (p.ranks_at(i as u32).len(), nodes.iter().find(|n| n.daemon == d).expect("mapped here"));
                if c > n.slots {
                    let node = NodeSlots { slots: n.slots, ..n.clone() };
                    return Err(MapError::NodeOverfull {
                        np,
                        policy: "by the rankfile".into(),
                        host: node.host,
                        daemon: d,
                        procs: c,
                        slots: node.slots,
                    });
                }
            }
        }
        return Ok(p);
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
        MapBy::Object if spec.map_span => {
            // Spread over the objects of all nodes as one set: each object gets np / K procs
            // (the first np mod K one more); a node hosts the shares of its objects.
            let obj = Level::from_wire(spec.map_obj).unwrap_or(Level::Core);
            let mut objs = Vec::with_capacity(usable.len());
            for n in &usable {
                let Some(t) = n.topo.as_ref() else {
                    let what = format!("--map-by {}:span", obj.name());
                    return Err(MapError::NoHardware { host: n.host.clone(), daemon: n.daemon, what });
                };
                objs.push(t.count(obj) as u64);
            }
            if let Some(i) = objs.iter().position(|&c| c == 0) {
                let (host, has) =
                    (usable[i].host.clone(), usable[i].topo.as_ref().map_or(String::new(), |t| t.describe()));
                return Err(MapError::Bind(super::bind::BindError::NoObject { host, level: obj, has }));
            }
            let k: u64 = objs.iter().sum::<u64>().max(1);
            let mut before = 0u64;
            let mut picked = Vec::new();
            for (i, &c) in objs.iter().enumerate() {
                let share = |o: u64| np / k * o + o.min(np % k);
                let take = (share(before + c) - share(before)) as u32;
                before += c;
                if take > 0 {
                    picked.push((i, take));
                }
            }
            if !spec.oversubscribe {
                if let Some(&(i, c)) = picked.iter().find(|&&(i, c)| c > usable[i].slots) {
                    return Err(overfull(format!("by {}:span", obj.name()), i, c));
                }
            }
            let chosen: Vec<u32> = picked.iter().map(|&(i, _)| daemons[i]).collect();
            let counts: Vec<u32> = picked.iter().map(|&(_, c)| c).collect();
            let p = ranked(spec, policy, nprocs, app_first_rank, &chosen, &counts, &usable)?;
            check_binding(spec, &p, &usable)?;
            return Ok(p);
        }
        MapBy::Slot | MapBy::Object => {
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
            let counts: Vec<u32> = (0..k).map(|i| nprocs / k + u32::from(i < nprocs % k)).collect();
            if !spec.oversubscribe {
                if let Some(i) = (0..k as usize).find(|&i| counts[i] > usable[i].slots) {
                    return Err(overfull("by node".into(), i, counts[i]));
                }
            }
            counts
        }
        MapBy::Ppr => {
            let ppr = spec.ppr;
            let obj = ppr_obj.map_or("node", |l| l.name());
            let cap: u64 = ppr_caps.iter().sum();
            if np > cap {
                return Err(MapError::PprExceeded { np, ppr, obj: obj.into(), nodes: usable.len() as u64, cap });
            }
            if !spec.oversubscribe && np > total_slots {
                return Err(not_enough());
            }
            // Nodes in turn, each up to its capacity; nodes that hold none are skipped.
            let mut left = np;
            let mut picked = Vec::new();
            for (i, &c) in ppr_caps.iter().enumerate() {
                if left == 0 {
                    break;
                }
                let take = c.min(left);
                if take > 0 {
                    picked.push((i, take as u32));
                    left -= take;
                }
            }
            if !spec.oversubscribe {
                if let Some(&(i, c)) = picked.iter().find(|&&(i, c)| c > usable[i].slots) {
                    return Err(overfull(format!("with ppr:{ppr}:{obj}"), i, c));
                }
            }
            let chosen: Vec<u32> = picked.iter().map(|&(i, _)| daemons[i]).collect();
            let counts: Vec<u32> = picked.iter().map(|&(_, c)| c).collect();
            let p = ranked(spec, policy, nprocs, app_first_rank, &chosen, &counts, &usable)?;
            check_binding(spec, &p, &usable)?;
            return Ok(p);
        }
    };
    let p = ranked(spec, policy, nprocs, app_first_rank, &daemons[..counts.len()], &counts, &usable)?;
    check_binding(spec, &p, &usable)?;
    Ok(p)
}

/// The placement of per-node `counts` on `daemons` with the job's ranking: contiguous ranks
/// per node (`--rank-by slot`, or an object within the node), dealt round-robin over the
/// nodes (`--rank-by node`, the default of `--map-by node`; a node that is full is skipped),
/// or dealt over the objects of all nodes (`--rank-by OBJ:span`).
fn ranked(
    spec: &JobSpec,
    policy: MapBy,
    nprocs: u32,
    app_first_rank: Vec<u32>,
    daemons: &[u32],
    counts: &[u32],
    usable: &[&NodeSlots],
) -> Result<Placement, MapError> {
    let rank_by = RankBy::try_from(spec.rank_by);
    let by_node = match rank_by {
        Ok(RankBy::Node) => true,
        Ok(RankBy::Default) => policy == MapBy::Node,
        _ => false,
    };
    let span = rank_by == Ok(RankBy::Obj) && spec.rank_span;
    if !by_node && !span {
        return Ok(block(nprocs, app_first_rank, daemons, counts));
    }
    let k = counts.len() as u32;
    if by_node && (0..k).all(|i| counts[i as usize] == nprocs / k + u32::from(i < nprocs % k)) {
        // The dealt counts (equal, or one more on the first nodes): round-robin, no list.
        return Ok(Placement::new(nprocs, app_first_rank, ranges(daemons), Layout::RoundRobin)
            .expect("the mapper builds a valid round-robin placement"));
    }
    // Each node's share of each pass: one proc per pass by node; by object, one per object
    // of the node that still has procs.
    let mut rounds: Vec<Vec<u32>> = Vec::with_capacity(counts.len());
    let plan = plan_of(spec, nprocs);
    for (&d, &c) in daemons.iter().zip(counts) {
        if by_node {
            rounds.push(vec![1; c as usize]);
            continue;
        }
        let n = usable.iter().find(|n| n.daemon == d).expect("a mapped node is usable");
        let Some(t) = n.topo.as_ref() else {
            let what = format!("--rank-by {}:span", plan.rank_obj.map_or("object", |l| l.name()));
            return Err(MapError::NoHardware { host: n.host.clone(), daemon: d, what });
        };
        rounds.push(super::bind::rank_rounds(t, &plan, c, &n.host)?);
    }
    let node_of = deal(&rounds, nprocs);
    Ok(Placement::new(nprocs, app_first_rank, ranges(daemons), layout_of(node_of, counts))
        .expect("the mapper builds a valid placement"))
}

/// Ranks dealt in passes: in pass p, node i takes `rounds[i][p]` consecutive ranks, nodes in
/// order; a node whose passes are over is skipped. The node index of each rank.
fn deal(rounds: &[Vec<u32>], nprocs: u32) -> Vec<u32> {
    let mut node_of = Vec::with_capacity(nprocs as usize);
    let mut active: Vec<usize> = (0..rounds.len()).collect();
    let mut pass = 0;
    while !active.is_empty() {
        active.retain(|&i| pass < rounds[i].len());
        for &i in &active {
            node_of.extend(std::iter::repeat_n(i as u32, rounds[i][pass] as usize));
        }
        pass += 1;
    }
    node_of
}

/// Refuse before launch a binding some node cannot honour (each node placed as its daemon
/// will place it, with none of its PUs held by other jobs).
fn check_binding(spec: &JobSpec, p: &Placement, usable: &[&NodeSlots]) -> Result<(), MapError> {
    let plan = plan_of(spec, p.nprocs());
    let needs_hw = plan.map_obj.is_some() || matches!(plan.bind, Bind::To(_)) || plan.pe > 1 || plan.rank_obj.is_some();
    for (i, d) in p.daemons().enumerate() {
        let Some(n) = usable.iter().find(|n| n.daemon == d) else { continue };
        match n.topo.as_ref() {
            Some(t) => {
                place_node(t, &plan, p.ranks_at(i as u32).len(), &Default::default(), &n.host)?;
            }
            None if needs_hw => {
                let what = spec_placement_text(&plan);
                return Err(MapError::NoHardware { host: n.host.clone(), daemon: d, what });
            }
            None => {}
        }
    }
    Ok(())
}

/// What a plan asks of the hardware, for a message.
fn spec_placement_text(plan: &Plan) -> String {
    match (plan.map_obj, plan.bind, plan.pe) {
        (Some(m), _, _) => format!("--map-by {}", m.name()),
        (_, Bind::To(b), _) => format!("--bind-to {}", b.name()),
        (_, _, pe) if pe > 1 => format!("{pe} cpus per rank"),
        _ => "--rank-by".into(),
    }
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

/// A block placement from per-node counts (all >= 1).
fn block(nprocs: u32, app_first_rank: Vec<u32>, daemons: &[u32], counts: &[u32]) -> Placement {
    Placement::new(nprocs, app_first_rank, ranges(daemons), block_layout(counts))
        .expect("the mapper builds a valid block placement")
}

#[cfg(test)]
mod tests {
    use super::*;
    use dvm_proto::job::AppContext;

    fn node(daemon: u32, host: &str, slots: u32) -> NodeSlots {
        NodeSlots::new(daemon, host, slots)
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
