//! The user's MCA parameter files, as Open MPI, PRRTE and PMIx read them:
//! `$HOME/.openmpi/mca-params.conf`, `.prte/`, `.pmix/`; lines `name = value`, `#` comments.
//!
//! Never decides precedence against the command line (the parser's); only a parameter's
//! value in prun's own environment wins over the file's here.

use std::path::Path;

use super::command::CliError;

/// Every parameter of the files as (environment variable, value), in file order; prun's own
/// value of a variable replaces the file's (Open MPI ranks the environment above the files).
pub(super) fn read(env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<(String, String)>, CliError> {
    let Some(home) = env("HOME").filter(|h| !h.is_empty()) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for (dir, prefix) in [(".openmpi", "OMPI_MCA_"), (".prte", "PRTE_MCA_"), (".pmix", "PMIX_MCA_")] {
        let path = Path::new(&home).join(dir).join("mca-params.conf");
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let shown = path.display().to_string();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let bad = |why: String| CliError::McaFile { path: shown.clone(), line: n + 1, why };
            let (name, value) = line.split_once('=').ok_or_else(|| bad("expected 'name = value'".into()))?;
            let (name, value) = (name.trim(), value.trim());
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(bad(format!("'{name}' is not a parameter name (letters, digits and '_')")));
            }
            let var = format!("{prefix}{name}");
            let value = env(&var).unwrap_or_else(|| value.to_string());
            out.push((var, value));
        }
    }
    Ok(out)
}
