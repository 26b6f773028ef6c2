//! Running inside a Slurm allocation: the nodes and slots Slurm granted, read from the job's
//! environment, and the one `srun` step that starts every daemon but the HNP.
//!
//! Owns: the hostlist syntax (`node[01-04,07],gpu3`, zero-padded ranges, several bracket
//! groups in one name), the per-node count syntax (`2(x3),1`), the choice of the allocation
//! from the environment, and the `srun` command line.
//! Never: reads a file or asks `scontrol`; everything comes from the variables Slurm sets.
//! Invariants: an expanded hostlist has no duplicate and at most [`MAX_HOSTS`] names; the
//! count list has exactly one entry per node.
//! Traps: a step's `SLURM_NODEID` numbers its nodes in the order of the job's node list
//! (Slurm's node table order), which is why the HNP keeps that order when it leaves its own
//! node out; `salloc CMD` runs CMD where salloc ran, which may be outside the allocation (the
//! HNP then has no slots and every allocated node gets a daemon); a daemonized HNP escapes the
//! batch step's process tracking, so it ends itself when its `srun` step ends (scancel).

use crate::hostfile::HostEntry;

/// Most names one hostlist may expand to (a typo like `n[0-999999999]` is refused, not
/// allocated).
pub const MAX_HOSTS: usize = 1 << 20;

/// A malformed Slurm variable; the message is one sentence naming the variable and value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SlurmError {
    #[error("{var}='{value}' is not a Slurm hostlist: {reason}")]
    Hostlist { var: String, value: String, reason: String },
    #[error("{var}='{value}' is not a Slurm per-node count list: {reason}")]
    Counts { var: String, value: String, reason: String },
    #[error("{var} is not set although SLURM_JOB_ID={job} is: {what}")]
    Missing { var: String, job: String, what: String },
    #[error("{counts_var}='{counts}' has {n_counts} node(s) but {nodes_var}='{nodes}' has {n_nodes}")]
    Mismatch { counts_var: String, counts: String, n_counts: usize, nodes_var: String, nodes: String, n_nodes: usize },
}

/// Expand a Slurm hostlist (`node[01-04,07],gpu3`, `rack[1-2]-n[1-3]`) into names, in order.
/// `var` names the variable in messages.
pub fn parse_hostlist(list: &str, var: &str) -> Result<Vec<String>, SlurmError> {
    let bad = |reason: String| SlurmError::Hostlist { var: var.into(), value: list.into(), reason };
    let mut out: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for item in split_top_level(list).map_err(&bad)? {
        if item.is_empty() {
            return Err(bad("it has an empty name (two commas, or a comma at an end)".into()));
        }
        let names = expand_item(item).map_err(&bad)?;
        if out.len() + names.len() > MAX_HOSTS {
            return Err(bad(format!("it names more than {MAX_HOSTS} hosts")));
        }
        for n in names {
            if !seen.insert(n.clone()) {
                return Err(bad(format!("host '{n}' is listed twice")));
            }
            out.push(n);
        }
    }
    Ok(out)
}

/// Split at the commas outside brackets; refuses unbalanced or nested brackets.
fn split_top_level(list: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let mut depth = 0u32;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("nested '[' at offset {i}")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("']' without '[' at offset {i}")),
            ',' if depth == 0 => {
                items.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '[' is never closed".into());
    }
    items.push(list[start..].trim());
    Ok(items)
}

/// One name with any number of bracket groups: the product of the groups, in order.
fn expand_item(item: &str) -> Result<Vec<String>, String> {
    let mut names = vec![String::new()];
    let mut rest = item;
    while !rest.is_empty() {
        let (literal, group, tail) = match rest.find('[') {
            Some(open) => {
                let close = open + rest[open..].find(']').ok_or("a '[' is never closed")?;
                (&rest[..open], Some(&rest[open + 1..close]), &rest[close + 1..])
            }
            None => (rest, None, ""),
        };
        if let Some(c) = literal.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))) {
            return Err(format!("'{c}' cannot be part of a host name ('{item}')"));
        }
        names.iter_mut().for_each(|n| n.push_str(literal));
        if let Some(g) = group {
            let suffixes = expand_group(g)?;
            if names.len().saturating_mul(suffixes.len()) > MAX_HOSTS {
                return Err(format!("'{item}' names more than {MAX_HOSTS} hosts"));
            }
            names = names.iter().flat_map(|n| suffixes.iter().map(move |s| format!("{n}{s}"))).collect();
        }
        rest = tail;
    }
    Ok(names)
}

/// `01-04,07` -> 01 02 03 04 07. A range is as wide as its lower bound (`08-10` -> 08 09 10).
fn expand_group(group: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in group.split(',') {
        let part = part.trim();
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let number = |s: &str| -> Result<u64, String> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 18 {
                return Err(format!("'[{group}]': '{part}' is not a number or a range N-M"));
            }
            s.parse().map_err(|_| format!("'[{group}]': '{s}' is too large"))
        };
        let (a, b) = (number(lo)?, number(hi)?);
        if a > b {
            return Err(format!("'[{group}]': range {part} runs backwards"));
        }
        if (b - a) as usize >= MAX_HOSTS {
            return Err(format!("'[{group}]': range {part} names more than {MAX_HOSTS} hosts"));
        }
        let width = lo.len();
        out.extend((a..=b).map(|v| format!("{v:0width$}")));
    }
    Ok(out)
}

/// Expand a per-node count list (`SLURM_TASKS_PER_NODE`, `SLURM_JOB_CPUS_PER_NODE`):
/// `2(x3),1` -> 2 2 2 1. Every count is at least 1.
pub fn parse_counts(list: &str, var: &str) -> Result<Vec<u32>, SlurmError> {
    let bad = |reason: String| SlurmError::Counts { var: var.into(), value: list.into(), reason };
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim) {
        let (count, times) = match item.split_once('(') {
            Some((c, rep)) => {
                let n = rep
                    .strip_prefix('x')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| bad(format!("'{item}': a repeat is written N(xM)")))?;
                (c, positive(n).ok_or_else(|| bad(format!("'{item}': the repeat '{n}' is not a positive integer")))?)
            }
            None => (item, 1),
        };
        let count = positive(count).ok_or_else(|| bad(format!("'{item}': '{count}' is not a positive integer")))?;
        if out.len() + times as usize > MAX_HOSTS {
            return Err(bad(format!("it counts more than {MAX_HOSTS} nodes")));
        }
        out.extend(std::iter::repeat_n(count, times as usize));
    }
    Ok(out)
}

fn positive(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|&n| n > 0)
}

/// The inverse of [`parse_counts`]: runs written `N(xM)`.
pub fn format_counts(counts: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < counts.len() {
        let run = counts[i..].iter().take_while(|&&c| c == counts[i]).count();
        out.push(if run == 1 { counts[i].to_string() } else { format!("{}(x{run})", counts[i]) });
        i += run;
    }
    out.join(",")
}

/// The nodes of this Slurm job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub job_id: String,
    pub nodes: Vec<HostEntry>,
}

/// The allocation described by `env` (a lookup such as `std::env::var`), or `None` outside a
/// Slurm job. Slots come from `SLURM_TASKS_PER_NODE` when tasks were asked for
/// (`SLURM_NTASKS` or `SLURM_NTASKS_PER_NODE` set), else from `SLURM_JOB_CPUS_PER_NODE`: a
/// plain `salloc -N 4` on 4-CPU nodes gives 16 slots, `salloc -n 8` gives 8.
pub fn allocation(env: impl Fn(&str) -> Option<String>) -> Result<Option<Allocation>, SlurmError> {
    let Some(job_id) = env("SLURM_JOB_ID").or_else(|| env("SLURM_JOBID")) else { return Ok(None) };
    let missing =
        |var: &str, what: &str| SlurmError::Missing { var: var.into(), job: job_id.clone(), what: what.into() };
    let (nodes_var, nodes) = first_set(&env, &["SLURM_JOB_NODELIST", "SLURM_NODELIST"])
        .ok_or_else(|| missing("SLURM_JOB_NODELIST", "it names the allocated nodes"))?;
    let names = parse_hostlist(&nodes, nodes_var)?;
    let tasks_asked = env("SLURM_NTASKS").is_some() || env("SLURM_NTASKS_PER_NODE").is_some();
    let order: &[&str] = if tasks_asked {
        &["SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"]
    } else {
        &["SLURM_JOB_CPUS_PER_NODE", "SLURM_TASKS_PER_NODE"]
    };
    let (counts_var, counts) =
        first_set(&env, order).ok_or_else(|| missing(order[0], "it gives the slots per node"))?;
    let slots = parse_counts(&counts, counts_var)?;
    if slots.len() != names.len() {
        return Err(SlurmError::Mismatch {
            counts_var: counts_var.into(),
            counts,
            n_counts: slots.len(),
            nodes_var: nodes_var.into(),
            nodes,
            n_nodes: names.len(),
        });
    }
    let nodes = names.into_iter().zip(slots).map(|(name, slots)| HostEntry { name, slots }).collect();
    Ok(Some(Allocation { job_id, nodes }))
}

fn first_set<'a>(env: &impl Fn(&str) -> Option<String>, vars: &[&'a str]) -> Option<(&'a str, String)> {
    vars.iter().find_map(|v| env(v).filter(|s| !s.trim().is_empty()).map(|s| (*v, s)))
}

/// Whether this process runs inside a Slurm job.
pub fn in_job() -> bool {
    std::env::var_os("SLURM_JOB_ID").is_some() || std::env::var_os("SLURM_JOBID").is_some()
}

/// This node's name as Slurm knows it (`SLURMD_NODENAME` in a job step or batch script), else
/// the short host name.
pub fn own_node_name() -> String {
    std::env::var("SLURMD_NODENAME").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| {
        let h = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
        h.split('.').next().unwrap_or_default().to_string()
    })
}

/// Split the allocation into the HNP's node (rank 0: this node with its slots when it is
/// allocated, else this host with no slots) and the nodes `srun` starts daemons on, in the
/// allocation's order (rank = 1 + the step's `SLURM_NODEID`).
pub fn split_for_hnp(alloc: &Allocation, me: &str) -> (HostEntry, Vec<HostEntry>) {
    match alloc.nodes.iter().position(|n| n.name == me) {
        Some(i) => {
            let mut rest = alloc.nodes.clone();
            let own = rest.remove(i);
            (own, rest)
        }
        None => (HostEntry { name: me.to_string(), slots: 0 }, alloc.nodes.clone()),
    }
}

/// The `srun` argv that starts one daemon on each of `nodes`: one step, one task per node,
/// sharing the allocation's CPUs with the jobs' own processes (`--overlap`), ended whole when
/// any daemon fails. The daemon's own argv follows.
pub fn srun_argv(nodes: &[HostEntry], program: &str, args: &[String]) -> Vec<String> {
    let n = nodes.len();
    let list = nodes.iter().map(|h| h.name.as_str()).collect::<Vec<_>>().join(",");
    let mut argv: Vec<String> = [
        "srun".to_string(),
        format!("--nodes={n}"),
        format!("--ntasks={n}"),
        "--ntasks-per-node=1".into(),
        format!("--nodelist={list}"),
        "--kill-on-bad-exit=1".into(),
        "--overlap".into(),
        "--mpi=none".into(),
        "--job-name=dvmd".into(),
    ]
    .into();
    argv.push(program.to_string());
    argv.extend(args.iter().cloned());
    argv
}

/// A daemon started by the `srun` step: its rank (1 + `SLURM_NODEID`, the HNP is 0) and its
/// slots (from the per-node list the HNP passed, indexed the same way).
pub fn step_rank_and_slots(slots_by_node: &str) -> Result<(u32, u32), String> {
    let var = ["SLURM_NODEID", "SLURM_PROCID"]
        .iter()
        .find_map(|v| std::env::var(v).ok().map(|s| (*v, s)))
        .ok_or("neither SLURM_NODEID nor SLURM_PROCID is set (this daemon was not started by srun)")?;
    let id: u32 = var.1.trim().parse().map_err(|_| format!("{}='{}' is not a node index", var.0, var.1))?;
    let slots = parse_counts(slots_by_node, "--slots-by-node").map_err(|e| e.to_string())?;
    let s = *slots
        .get(id as usize)
        .ok_or_else(|| format!("{}={id} but the step has only {} node(s)", var.0, slots.len()))?;
    Ok((id + 1, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hl(s: &str) -> Result<Vec<String>, SlurmError> {
        parse_hostlist(s, "SLURM_JOB_NODELIST")
    }

    /// The obvious construction: every name spelled out.
    fn names(prefix: &str, range: std::ops::RangeInclusive<u32>, width: usize) -> Vec<String> {
        range.map(|i| format!("{prefix}{i:0width$}")).collect()
    }

    #[test]
    fn hostlist_ranges_padding_and_groups() {
        assert_eq!(hl("node1").unwrap(), vec!["node1"]);
        assert_eq!(hl("node[1-4]").unwrap(), names("node", 1..=4, 1));
        let mut want = names("node", 1..=4, 2);
        want.push("node07".into());
        want.push("gpu3".into());
        assert_eq!(hl("node[01-04,07],gpu3").unwrap(), want);
        assert_eq!(hl("n[08-10]").unwrap(), vec!["n08", "n09", "n10"]);
        assert_eq!(hl("n[098-100]").unwrap(), vec!["n098", "n099", "n100"]);
        assert_eq!(hl("a[1-2],b[3],c").unwrap(), vec!["a1", "a2", "b3", "c"]);
        assert_eq!(hl("r[1-2]-n[01-02]").unwrap(), vec!["r1-n01", "r1-n02", "r2-n01", "r2-n02"]);
        assert_eq!(hl("x[1-2]y").unwrap(), vec!["x1y", "x2y"]);
        assert_eq!(hl("[1-2]").unwrap(), vec!["1", "2"]);
        assert_eq!(hl(" a , b ").unwrap(), vec!["a", "b"]);
        assert_eq!(hl("node[1-1000]").unwrap(), names("node", 1..=1000, 1));
    }

    #[test]
    fn hostlist_refuses_malformed_lists_in_one_sentence() {
        for bad in [
            "",
            "a,,b",
            "a,",
            ",a",
            "n[1-3",
            "n1-3]",
            "n[[1]]",
            "n[]",
            "n[a-b]",
            "n[3-1]",
            "n[1-]",
            "n[-2]",
            "n[1,,2]",
            "n[1-2],n2",
            "a b",
            "n[1-9999999]",
            "a[1-2048][1-1024]",
            "n/1",
        ] {
            let e = hl(bad).expect_err(bad).to_string();
            assert!(e.starts_with(&format!("SLURM_JOB_NODELIST='{bad}' is not a Slurm hostlist: ")), "{e}");
            assert!(!e.contains('\n') && e.matches(". ").count() == 0, "one sentence: {e}");
        }
        assert!(hl("n[1-2],n2").unwrap_err().to_string().ends_with("host 'n2' is listed twice"));
        assert!(hl("n[3-1]").unwrap_err().to_string().contains("runs backwards"));
    }

    #[test]
    fn counts_repeat_form() {
        let c = |s: &str| parse_counts(s, "SLURM_TASKS_PER_NODE");
        assert_eq!(c("4").unwrap(), vec![4]);
        assert_eq!(c("2(x3),1").unwrap(), vec![2, 2, 2, 1]);
        assert_eq!(c("4(x4)").unwrap(), vec![4; 4]);
        assert_eq!(c("4,2,1").unwrap(), vec![4, 2, 1]);
        assert_eq!(c("1(x2),3(x2)").unwrap(), vec![1, 1, 3, 3]);
        for bad in ["", "0", "2(x0)", "2(3)", "2(x3", "x", "2,,1", "-1", "2(x3),", "1.5", "(x2)"] {
            let e = c(bad).expect_err(bad).to_string();
            assert!(
                e.starts_with(&format!("SLURM_TASKS_PER_NODE='{bad}' is not a Slurm per-node count list: ")),
                "{e}"
            );
        }
    }

    #[test]
    fn format_counts_round_trips() {
        for v in [vec![1], vec![4, 4, 4, 4], vec![2, 2, 2, 1], vec![1, 2, 2, 3, 3, 3, 1], vec![7; 100]] {
            let s = format_counts(&v);
            assert_eq!(parse_counts(&s, "x").unwrap(), v, "{s}");
        }
        assert_eq!(format_counts(&[2, 2, 2, 1]), "2(x3),1");
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn allocation_from_the_environment() {
        assert_eq!(allocation(env_of(&[("SLURM_JOB_NODELIST", "a")])).unwrap(), None);
        let nodes =
            |v: &[(&str, u32)]| v.iter().map(|(n, s)| HostEntry { name: n.to_string(), slots: *s }).collect::<Vec<_>>();
        let base = [("SLURM_JOB_ID", "7"), ("SLURM_JOB_NODELIST", "n[1-3]"), ("SLURM_JOB_CPUS_PER_NODE", "4(x2),2")];
        let a = allocation(env_of(&[&base[..], &[("SLURM_TASKS_PER_NODE", "1(x3)")]].concat())).unwrap().unwrap();
        assert_eq!(a.job_id, "7");
        assert_eq!(a.nodes, nodes(&[("n1", 4), ("n2", 4), ("n3", 2)]));
        // Tasks asked for: their layout wins.
        let t = [&base[..], &[("SLURM_TASKS_PER_NODE", "2,1(x2)"), ("SLURM_NTASKS", "4")]].concat();
        assert_eq!(allocation(env_of(&t)).unwrap().unwrap().nodes, nodes(&[("n1", 2), ("n2", 1), ("n3", 1)]));
        let e = allocation(env_of(&[
            ("SLURM_JOB_ID", "7"),
            ("SLURM_JOB_NODELIST", "n[1-3]"),
            ("SLURM_JOB_CPUS_PER_NODE", "4(x2)"),
        ]))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "SLURM_JOB_CPUS_PER_NODE='4(x2)' has 2 node(s) but SLURM_JOB_NODELIST='n[1-3]' has 3"
        );
        let e = allocation(env_of(&[("SLURM_JOB_ID", "7")])).unwrap_err();
        assert!(e.to_string().starts_with("SLURM_JOB_NODELIST is not set although SLURM_JOB_ID=7 is"), "{e}");
        let e = allocation(env_of(&[("SLURM_JOB_ID", "7"), ("SLURM_JOB_NODELIST", "n[1-")])).unwrap_err();
        assert!(matches!(e, SlurmError::Hostlist { .. }));
    }

    #[test]
    fn the_hnp_takes_its_own_node_or_none() {
        let alloc = Allocation {
            job_id: "1".into(),
            nodes: ["n1", "n2", "n3"].iter().map(|n| HostEntry { name: n.to_string(), slots: 2 }).collect(),
        };
        let (own, rest) = split_for_hnp(&alloc, "n2");
        assert_eq!(own, HostEntry { name: "n2".into(), slots: 2 });
        assert_eq!(rest.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(), ["n1", "n3"]);
        let (own, rest) = split_for_hnp(&alloc, "login");
        assert_eq!(own, HostEntry { name: "login".into(), slots: 0 });
        assert_eq!(rest, alloc.nodes);
        let argv = srun_argv(&rest, "/bin/dvmd", &["--daemon".into()]);
        assert_eq!(argv[0], "srun");
        assert!(argv.contains(&"--nodes=3".to_string()) && argv.contains(&"--nodelist=n1,n2,n3".to_string()));
        assert_eq!(&argv[argv.len() - 2..], ["/bin/dvmd", "--daemon"]);
    }
}
