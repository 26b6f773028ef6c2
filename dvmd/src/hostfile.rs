//! Hostfiles in the Open MPI / PRRTE format: one host per line, `name [slots=N] [max_slots=N]`,
//! `#` comments, blank lines ignored. A host listed twice is refused with both line numbers.

use std::path::Path;

/// One node of the DVM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    pub name: String,
    pub slots: u32,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostfileError {
    #[error("cannot read hostfile {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}:{line}: {reason}")]
    Syntax { path: String, line: usize, reason: String },
    #[error("{path}:{line}: host '{host}' is already listed on line {first}")]
    Duplicate { path: String, line: usize, host: String, first: usize },
    #[error("{path}: no hosts listed")]
    Empty { path: String },
    #[error("--host: {0}")]
    HostList(String),
}

/// Parse hostfile text; `path` is only used in messages.
pub fn parse(text: &str, path: &str) -> Result<Vec<HostEntry>, HostfileError> {
    let mut hosts: Vec<(HostEntry, usize)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let mut words = content.split_whitespace();
        let name = words.next().expect("non-empty line has a word").to_string();
        let syntax = |reason: String| HostfileError::Syntax { path: path.to_string(), line, reason };
        if !valid_host_name(&name) {
            return Err(syntax(format!("'{name}' is not a valid host name")));
        }
        // No slots= given: as many as the node has cores (its daemon counts them).
        let mut slots = SLOTS_AUTO;
        for w in words {
            let (key, value) = w
                .split_once('=')
                .ok_or_else(|| syntax(format!("expected key=value after the host name, found '{w}'")))?;
            if !matches!(key, "slots" | "cpu" | "count" | "max_slots" | "max-slots") {
                return Err(syntax(format!("unknown attribute '{key}' (known: slots, max_slots)")));
            }
            let n: u32 =
                value.parse().map_err(|_| syntax(format!("{key}={value}: '{value}' is not a non-negative integer")))?;
            match key {
                "slots" | "cpu" | "count" => {
                    if n == 0 {
                        return Err(syntax(format!("{key}=0: a host needs at least one slot")));
                    }
                    slots = n;
                }
                "max_slots" | "max-slots" => {}
                _ => return Err(syntax(format!("unknown attribute '{key}' (known: slots, max_slots)"))),
            }
        }
        if let Some((_, first)) = hosts.iter().find(|(h, _)| h.name == name) {
            return Err(HostfileError::Duplicate { path: path.to_string(), line, host: name, first: *first });
        }
        hosts.push((HostEntry { name, slots }, line));
    }
    if hosts.is_empty() {
        return Err(HostfileError::Empty { path: path.to_string() });
    }
    Ok(hosts.into_iter().map(|(h, _)| h).collect())
}

/// Read and parse a hostfile.
pub fn read(path: &Path) -> Result<Vec<HostEntry>, HostfileError> {
    let p = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|e| HostfileError::Read { path: p.clone(), reason: e.to_string() })?;
    parse(&text, &p)
}

/// Parse `--host a,b:2,c` (`name[:slots]`).
pub fn parse_host_list(list: &str) -> Result<Vec<HostEntry>, HostfileError> {
    let mut out: Vec<HostEntry> = Vec::new();
    for item in list.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(HostfileError::HostList(format!("empty host name in '{list}'")));
        }
        let (name, slots) = match item.split_once(':') {
            Some((n, s)) => {
                let slots: u32 =
                    s.parse().ok().filter(|&s| s > 0).ok_or_else(|| {
                        HostfileError::HostList(format!("'{item}': slots must be a positive integer"))
                    })?;
                (n, slots)
            }
            None => (item, 1),
        };
        if !valid_host_name(name) {
            return Err(HostfileError::HostList(format!("'{name}' is not a valid host name")));
        }
        if out.iter().any(|h| h.name == name) {
            return Err(HostfileError::HostList(format!("host '{name}' is listed twice")));
        }
        out.push(HostEntry { name: name.to_string(), slots });
    }
    Ok(out)
}

fn valid_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'))
}

/// Slots of a node that did not say: its daemon counts its cores (hwthreads with
/// `--use-hwthread-cpus`), as mpirun does for a hostfile line without `slots=`.
pub const SLOTS_AUTO: u32 = u32::MAX;

/// `--slots N|auto`.
pub fn parse_slots(s: &str) -> Result<u32, String> {
    match s {
        "auto" => Ok(SLOTS_AUTO),
        _ => s
            .parse::<u32>()
            .ok()
            .filter(|&n| n > 0 && n != SLOTS_AUTO)
            .ok_or_else(|| format!("'{s}': expected a positive number of slots, or auto (the node's cores)")),
    }
}

/// `--slots` as passed on to a daemon.
pub fn slots_arg(slots: u32) -> String {
    if slots == SLOTS_AUTO {
        "auto".into()
    } else {
        slots.to_string()
    }
}

/// A daemon's slots: what it was given, or (auto) its cores or hwthreads from its hardware,
/// else the CPUs it may run on.
pub fn resolve_slots(slots: u32, hw: Option<&dvm_core::jobmap::NodeTopo>, hwthreads: bool) -> u32 {
    use dvm_core::jobmap::Level;
    if slots != SLOTS_AUTO {
        return slots;
    }
    let level = if hwthreads { Level::Hwthread } else { Level::Core };
    hw.map(|t| t.count(level)).filter(|&n| n > 0).unwrap_or_else(crate::pmix::node_cores)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_slots_comments_and_blanks() {
        let text = "# cluster\nnode1 slots=4\n\nnode2   # its cores\nnode3 slots=2 max_slots=8\n";
        let hosts = parse(text, "hf").unwrap();
        assert_eq!(
            hosts,
            vec![
                HostEntry { name: "node1".into(), slots: 4 },
                HostEntry { name: "node2".into(), slots: SLOTS_AUTO },
                HostEntry { name: "node3".into(), slots: 2 },
            ]
        );
    }

    #[test]
    fn duplicates_name_both_lines() {
        let err = parse("a\nb\na slots=2\n", "hf").unwrap_err();
        assert_eq!(err.to_string(), "hf:3: host 'a' is already listed on line 1");
    }

    #[test]
    fn bad_values_name_the_line() {
        assert_eq!(
            parse("a slots=x\n", "hf").unwrap_err().to_string(),
            "hf:1: slots=x: 'x' is not a non-negative integer"
        );
        assert!(parse("a slots=0\n", "hf").unwrap_err().to_string().starts_with("hf:1:"));
        assert!(parse("a\nb color=red\n", "hf").unwrap_err().to_string().starts_with("hf:2: unknown attribute"));
        assert!(parse("a\nb slots\n", "hf").unwrap_err().to_string().starts_with("hf:2:"));
        assert_eq!(parse("# nothing\n", "hf").unwrap_err(), HostfileError::Empty { path: "hf".into() });
    }

    #[test]
    fn host_list() {
        let h = parse_host_list("a,b:3").unwrap();
        assert_eq!(h[1], HostEntry { name: "b".into(), slots: 3 });
        assert!(parse_host_list("a,,b").is_err());
        assert!(parse_host_list("a,a").is_err());
        assert!(parse_host_list("a:0").is_err());
    }
}
