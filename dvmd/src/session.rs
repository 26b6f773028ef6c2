//! Session directories and the DVM URI that tools use to find a running DVM.
//!
//! The HNP's session directory (`<tmp>/dvm-<uid>/dvm-<pid>-<random>`, mode 0700) holds the DVM
//! secret (`secret`, 0600), the contact URI (`uri`) and, when daemonized, the log. Every
//! daemon removes its own session directory on exit.

use std::fmt;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

/// Parent of every session directory of this user.
pub fn session_root() -> PathBuf {
    let base = std::env::var_os("DVM_TMPDIR")
        .or_else(|| std::env::var_os("TMPDIR"))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join(format!("dvm-{}", nix::unistd::getuid()))
}

/// Remove session directories of this user whose owner process is gone (a daemon killed with
/// SIGKILL cannot clean up after itself). Names are `<tag>-<pid>-<random>`.
pub fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(session_root()) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let mut parts = name.rsplitn(3, '-');
        let (Some(_rand), Some(pid)) = (parts.next(), parts.next()) else { continue };
        let Ok(pid) = pid.parse::<i32>() else { continue };
        let gone =
            matches!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None), Err(nix::errno::Errno::ESRCH));
        if gone {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A session directory, removed when dropped (unless kept).
#[derive(Debug)]
pub struct Session {
    dir: PathBuf,
    keep: bool,
}

impl Session {
    /// Create a fresh session directory for this process.
    pub fn create(tag: &str) -> Result<Session> {
        let root = session_root();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .with_context(|| format!("cannot create session root {}", root.display()))?;
        let dir = root.join(format!("{tag}-{}-{:08x}", std::process::id(), rand::random::<u32>()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create session directory {}", dir.display()))?;
        Ok(Session { dir, keep: false })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn secret_path(&self) -> PathBuf {
        self.dir.join("secret")
    }
    pub fn uri_path(&self) -> PathBuf {
        self.dir.join("uri")
    }
    /// Leave the directory in place when dropped.
    pub fn keep(&mut self) {
        self.keep = true;
    }
    /// Remove the directory now.
    pub fn remove(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        self.keep = true;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Where a tool reaches a DVM: the control API address and the session directory that holds
/// the secret. Text form: `dvm://ADDR/absolute/session/dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DvmUri {
    pub control: SocketAddr,
    pub session: PathBuf,
}

impl fmt::Display for DvmUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dvm://{}{}", self.control, self.session.display())
    }
}

impl DvmUri {
    pub fn parse(text: &str) -> Result<DvmUri> {
        let text = text.trim();
        let rest = text.strip_prefix("dvm://").ok_or_else(|| anyhow!("DVM URI '{text}' does not start with dvm://"))?;
        let slash = rest.find('/').ok_or_else(|| anyhow!("DVM URI '{text}' has no session directory"))?;
        let control: SocketAddr = rest[..slash]
            .parse()
            .map_err(|_| anyhow!("DVM URI '{text}': '{}' is not an ip:port address", &rest[..slash]))?;
        Ok(DvmUri { control, session: PathBuf::from(&rest[slash..]) })
    }

    pub fn secret_path(&self) -> PathBuf {
        self.session.join("secret")
    }

    /// Resolve the `--dvm-uri` argument: a URI, `file:PATH`, or (None) the only DVM of this
    /// user on this machine.
    pub fn resolve(arg: Option<&str>) -> Result<DvmUri> {
        match arg {
            Some(a) if a.starts_with("file:") => {
                let path = &a[5..];
                let text = std::fs::read_to_string(path).with_context(|| format!("cannot read DVM URI file {path}"))?;
                DvmUri::parse(&text).with_context(|| format!("in DVM URI file {path}"))
            }
            Some(a) => DvmUri::parse(a),
            None => {
                let root = session_root();
                let mut found = Vec::new();
                if let Ok(entries) = std::fs::read_dir(&root) {
                    for e in entries.flatten() {
                        let uri = e.path().join("uri");
                        if let Ok(text) = std::fs::read_to_string(&uri) {
                            if let Ok(u) = DvmUri::parse(&text) {
                                found.push(u);
                            }
                        }
                    }
                }
                match found.len() {
                    0 => bail!("no running DVM found under {} (start one with `dvmd --local N --daemonize`, or pass --dvm-uri)", root.display()),
                    1 => Ok(found.remove(0)),
                    _ => bail!(
                        "{} DVMs found under {}; choose one with --dvm-uri: {}",
                        found.len(),
                        root.display(),
                        found.iter().map(|u| u.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                }
            }
        }
    }
}

/// Write `text` to `path` atomically (rename), mode 0600.
pub fn write_private(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_round_trip_and_errors() {
        let u = DvmUri { control: "127.0.0.1:4000".parse().unwrap(), session: "/tmp/dvm-0/x".into() };
        assert_eq!(u.to_string(), "dvm://127.0.0.1:4000/tmp/dvm-0/x");
        assert_eq!(DvmUri::parse(&u.to_string()).unwrap(), u);
        assert!(DvmUri::parse("http://x").is_err());
        assert!(DvmUri::parse("dvm://nohost").is_err());
        assert!(DvmUri::parse("dvm://a:b/tmp").unwrap_err().to_string().contains("'a:b'"));
    }
}
