//! `--app FILE`: the apps of an MPMD job from a file, one per line as they would be written on
//! the command line (`-n 2 ./a.out x`), blank lines and `#` comments skipped, words split as
//! a shell splits them. The command line becomes its job options followed by the file's apps
//! joined by `:`.
//!
//! Never runs anything or expands variables. Do not break: every error names the file and,
//! for a line, its number.

use std::path::Path;

use super::command::CliError;
use super::options::{clean, lookup, Kind};

/// The command line with `--app FILE` replaced by the file's apps; None without `--app`.
pub(super) fn expand(args: &[String], cwd: &Path) -> Result<Option<Vec<String>>, CliError> {
    // Only among the job options before the first executable.
    let mut i = 0;
    let mut found = None;
    while i < args.len() {
        let token = &args[i];
        if token == "--" || token == ":" || !token.starts_with('-') {
            break;
        }
        let Ok((kind, spelled, inline)) = lookup(token) else { break };
        let width = match (kind, &inline) {
            (Kind::App, Some(_)) => 1,
            (Kind::App, None) => 2,
            _ if kind.mca_prefix().is_some() => 3,
            _ if kind.takes_value() && inline.is_none() => 2,
            _ => 1,
        };
        if kind == Kind::App {
            let file = inline.or_else(|| args.get(i + 1).cloned()).ok_or(CliError::MissingValue(spelled))?;
            found = Some((i, width, file));
            break;
        }
        i += width;
    }
    let Some((at, width, file)) = found else { return Ok(None) };
    let mut out: Vec<String> = args[..at].to_vec();
    let rest = &args[at + width..];
    let path = clean(&cwd.join(&file));
    let shown = path.display().to_string();
    let fail = |why: String| CliError::Appfile { path: shown.clone(), why };
    if let Some(exe) = rest.iter().find(|a| !a.starts_with('-')) {
        return Err(fail(format!("the apps come from the file; '{exe}' on the command line too")));
    }
    out.extend(rest.iter().cloned());
    let text = std::fs::read_to_string(&path).map_err(|e| fail(format!("cannot read it: {e}")))?;
    let mut apps = 0;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words = shlex::split(line).ok_or_else(|| fail(format!("line {}: unbalanced quotes", n + 1)))?;
        if apps > 0 {
            out.push(":".into());
        }
        out.extend(words);
        apps += 1;
    }
    if apps == 0 {
        return Err(fail("no app in it (one per line: '-n 2 ./a.out args')".into()));
    }
    Ok(Some(out))
}
