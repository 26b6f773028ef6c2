//! `--preload-binary` and `--preload-files`: which files a job copies to its nodes, and where
//! they land there.
//!
//! Never reads a file: the HNP checks every source on its node when the job arrives (that is
//! where they are read), so a bad one refuses the job before anything starts.

use std::path::Path;

use dvm_proto::job::{AppContext, PreloadFile};

use super::command::CliError;
use super::options::clean;

/// Where a preloaded executable lands on each node (`%s` the daemon's session directory, `%j`
/// the job's id), the same path the daemon starts it from.
const BINARY_DEST: &str = "%s/preload/%j/";

/// The preload files of a job. `files`: what `--preload-files` listed (comma-separated lists);
/// `dest_dir`: `--preload-files-dest-dir`, else the job's working directory.
pub(super) fn plan(
    apps: &mut [AppContext],
    binary: bool,
    files: &[String],
    dest_dir: Option<&str>,
    cwd: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<PreloadFile>, CliError> {
    let bad = |option: &str, value: &str, problem: String| CliError::BadValue {
        option: option.into(),
        value: value.into(),
        problem,
    };
    let mut out: Vec<PreloadFile> = Vec::new();
    if binary {
        for app in apps.iter_mut() {
            let Some(argv0) = app.argv.first() else { continue };
            let wdir = if app.wdir.is_empty() { cwd.to_path_buf() } else { cwd.join(&app.wdir) };
            let src = resolve(argv0, &wdir, env).ok_or_else(|| {
                bad("--preload-binary", argv0, "not found (neither a path nor a name in prun's PATH)".into())
            })?;
            let name = src.rsplit('/').next().unwrap_or(&src).to_string();
            if let Some(other) = out.iter().find(|p| p.dest.ends_with(&format!("/{name}")) && p.src != src) {
                return Err(bad("--preload-binary", argv0, format!("{} has the same name; rename one", other.src)));
            }
            if !out.iter().any(|p| p.src == src) {
                out.push(PreloadFile { src, dest: format!("{BINARY_DEST}{name}"), ..Default::default() });
            }
            app.preload_binary = true;
        }
    }
    let dir = match dest_dir {
        Some(d) => clean(&cwd.join(d)),
        None => match apps.first().map(|a| a.wdir.as_str()) {
            Some(w) if !w.is_empty() => clean(&cwd.join(w)),
            _ => cwd.to_path_buf(),
        },
    };
    for list in files {
        for f in list.split(',') {
            if f.is_empty() {
                return Err(bad("--preload-files", list, "an empty file name".into()));
            }
            let src = clean(&cwd.join(f));
            let name = src
                .file_name()
                .ok_or_else(|| bad("--preload-files", f, "not a file name".into()))?
                .to_string_lossy()
                .into_owned();
            let dest = dir.join(&name).to_string_lossy().into_owned();
            let src = src.to_string_lossy().into_owned();
            if let Some(other) = out.iter().find(|p| p.dest == dest) {
                return Err(bad("--preload-files", f, format!("{} lands at {dest} too", other.src)));
            }
            out.push(PreloadFile { src, dest, ..Default::default() });
        }
    }
    Ok(out)
}

/// An executable as the daemon would find it: a path (relative to the app's working
/// directory), or a name in prun's PATH.
fn resolve(argv0: &str, wdir: &Path, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    if argv0.contains('/') {
        return Some(clean(&wdir.join(argv0)).to_string_lossy().into_owned());
    }
    let path = env("PATH")?;
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(argv0))
        .find(|p| p.is_file())
        .map(|p| p.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(argv0: &str) -> AppContext {
        AppContext { argv: vec![argv0.into()], ..Default::default() }
    }

    #[test]
    fn binaries_land_in_the_session_directory_and_files_in_the_working_directory() {
        let env = |k: &str| (k == "PATH").then(|| "/nonexistent:/bin:/usr/bin".to_string());
        let mut apps = vec![app("sh"), app("./a.out")];
        let files = vec!["in.dat,sub/b.txt".to_string()];
        let got = plan(&mut apps, true, &files, None, Path::new("/w"), &env).unwrap();
        let pairs: Vec<(&str, &str)> = got.iter().map(|p| (p.src.as_str(), p.dest.as_str())).collect();
        assert!(pairs[0].0.ends_with("/sh") && pairs[0].1 == "%s/preload/%j/sh", "{pairs:?}");
        assert_eq!(
            &pairs[1..],
            &[("/w/a.out", "%s/preload/%j/a.out"), ("/w/in.dat", "/w/in.dat"), ("/w/sub/b.txt", "/w/b.txt")]
        );
        assert!(apps.iter().all(|a| a.preload_binary));
        let got = plan(&mut [], false, &["x".into()], Some("/scratch"), Path::new("/w"), &env).unwrap();
        assert_eq!(got[0].dest, "/scratch/x");
    }

    #[test]
    fn unknown_programs_and_colliding_names_are_refused_by_name() {
        let env = |_: &str| Some("/nonexistent".to_string());
        let e = plan(&mut [app("no-such-prog")], true, &[], None, Path::new("/w"), &env).unwrap_err();
        assert!(e.to_string().contains("no-such-prog") && e.to_string().contains("not found"), "{e}");
        let e = plan(&mut [], false, &["a/x,b/x".into()], None, Path::new("/w"), &env).unwrap_err();
        assert!(e.to_string().contains("lands at /w/x too"), "{e}");
        let e = plan(&mut [], false, &["a,,b".into()], None, Path::new("/w"), &env).unwrap_err();
        assert!(e.to_string().contains("empty file name"), "{e}");
    }
}
