//! `--rankfile FILE`: where each rank runs, one `rank R=HOST slot=SPEC` per line (blank lines
//! and `#` comments skipped), as Open MPI's rankfiles say it. The DVM checks the hosts and the
//! cpus against its nodes; here only the file's form is checked.
//!
//! Never reads anything but the file. Do not break: every error names the file and the line.

use std::path::Path;

use dvm_proto::job::RankfileEntry;

use super::command::CliError;

/// Most lines taken (one per rank).
const MAX_RANKS: usize = 1 << 20;

/// The entries of the rankfile at `path`, in file order.
pub(super) fn read(path: &Path) -> Result<Vec<RankfileEntry>, CliError> {
    let shown = path.display().to_string();
    let fail = |why: String| CliError::Rankfile { path: shown.clone(), why };
    let text = std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read it: {e}")))?;
    let entries = parse(&text).map_err(fail)?;
    if entries.is_empty() {
        return Err(fail("it names no rank".into()));
    }
    Ok(entries)
}

/// Parse a rankfile's text.
pub(super) fn parse(text: &str) -> Result<Vec<RankfileEntry>, String> {
    let mut out: Vec<RankfileEntry> = Vec::new();
    let mut line_of: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = (i + 1) as u32;
        let content = raw.split('#').next().unwrap_or_default().trim();
        if content.is_empty() {
            continue;
        }
        let bad = |why: &str| format!("line {line}: {why} (expected 'rank N=HOST slot=SPEC', got '{content}')");
        let rest = content
            .strip_prefix("rank")
            .filter(|r| r.starts_with(char::is_whitespace))
            .ok_or_else(|| bad("no 'rank'"))?;
        let (num, rest) = rest.trim_start().split_once('=').ok_or_else(|| bad("no '=' after the rank"))?;
        let rank: u32 = num.trim().parse().map_err(|_| bad(&format!("'{}' is not a rank number", num.trim())))?;
        let mut words = rest.split_whitespace();
        let host = words.next().ok_or_else(|| bad("no host"))?.to_string();
        let slot = match (words.next().and_then(|w| w.strip_prefix("slot=")), words.next()) {
            (Some(s), None) if !s.is_empty() => s.to_string(),
            _ => return Err(bad("the host is followed by one 'slot=SPEC'")),
        };
        if let Some(first) = line_of.get(&rank) {
            return Err(format!("line {line}: rank {rank} is already placed on line {first}"));
        }
        line_of.insert(rank, line);
        if out.len() == MAX_RANKS {
            return Err(format!("line {line}: more than {MAX_RANKS} ranks"));
        }
        out.push(RankfileEntry { rank, host, slot, line, cpus: String::new() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_their_errors() {
        let e = parse("# two ranks\nrank 0=n1 slot=0:0-1\n\nrank 1=n2 slot=2  # a core\n").unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!((e[1].rank, e[1].host.as_str(), e[1].slot.as_str(), e[1].line), (1, "n2", "2", 4));
        for (text, want) in [
            ("rank 0=n1 slot=0\nrank x=n1 slot=1\n", "line 2: 'x' is not a rank number"),
            ("ranks 0=n1 slot=0\n", "line 1: no 'rank'"),
            ("rank 0 n1 slot=0\n", "line 1: '0 n1 slot' is not a rank number"),
            ("rank 0\n", "line 1: no '=' after the rank"),
            ("rank 0=n1\n", "line 1: the host is followed by one 'slot=SPEC'"),
            ("rank 0=n1 slot=0 extra\n", "line 1: the host is followed by one 'slot=SPEC'"),
            ("rank 0=n1 slot=0\nrank 0=n2 slot=1\n", "line 2: rank 0 is already placed on line 1"),
        ] {
            let got = parse(text).unwrap_err();
            assert!(got.starts_with(want), "{text:?}: {got}");
        }
    }
}
