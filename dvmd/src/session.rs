//! Session directories and the DVM URI that tools use to find a running DVM.
//!
//! The HNP's session directory (`<tmp>/dvm-<uid>/dvm-<pid>-<random>`, mode 0700) holds the DVM
//! secret (`secret`, 0600), the contact URI (`uri`) and, when daemonized, the log. Every
//! daemon removes its own session directory on exit.
//!
//! Discovery: a tool given no `--dvm-uri` attaches to the only persistent DVM of this user on
//! this machine, i.e. the only session directory that holds a `uri` file and whose HNP is alive.
//! A one-shot DVM (`dvmd --private`, started by `prun`) writes no `uri` file: it belongs to the
//! `prun` that started it and is never discovered by any other command.

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

/// The process that owns a session directory, from its name `<tag>-<pid>-<random>`.
pub fn owner_pid(dir: &Path) -> Option<u32> {
    let name = dir.file_name()?.to_str()?;
    let mut parts = name.rsplitn(3, '-');
    let (Some(_rand), Some(pid), Some(_tag)) = (parts.next(), parts.next(), parts.next()) else { return None };
    pid.parse().ok()
}

/// The process has ended: it does not exist, or it is a zombie nobody has reaped yet.
pub fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// Remove session directories of this user whose owner process is gone (a daemon killed with
/// SIGKILL cannot clean up after itself). Names are `<tag>-<pid>-<random>`.
pub fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(session_root()) else { return };
    for e in entries.flatten() {
        if owner_pid(&e.path()).is_some_and(process_gone) {
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
    /// The session root must be this user's own directory that nobody else can enter (it may
    /// pre-exist in a shared `/tmp`); it is refused otherwise.
    pub fn create(tag: &str) -> Result<Session> {
        let root = session_root();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .with_context(|| format!("cannot create session root {}", root.display()))?;
        check_private_dir(&root)?;
        let dir = root.join(format!("{tag}-{}-{:08x}", std::process::id(), rand::random::<u32>()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("cannot create session directory {}", dir.display()))?;
        check_private_dir(&dir)?;
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

    /// The process id of this DVM's HNP (from its session directory's name), if it follows the
    /// naming scheme.
    pub fn hnp_pid(&self) -> Option<u32> {
        owner_pid(&self.session)
    }

    /// Resolve the `--dvm-uri` argument: a URI, `file:PATH`, or (None) the only persistent DVM
    /// of this user on this machine.
    pub fn resolve(arg: Option<&str>) -> Result<DvmUri> {
        match arg {
            Some(a) if a.starts_with("file:") => {
                let path = &a[5..];
                let text = std::fs::read_to_string(path).with_context(|| format!("cannot read DVM URI file {path}"))?;
                DvmUri::parse(&text).with_context(|| format!("in DVM URI file {path}"))
            }
            Some(a) => DvmUri::parse(a),
            None => discover().into_uri(),
        }
    }
}

/// The persistent DVMs of this user on this machine that a tool may attach to unasked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    None { root: PathBuf },
    One(DvmUri),
    Several { root: PathBuf, uris: Vec<DvmUri> },
}

impl Discovery {
    /// The one DVM, or a one-sentence error saying there is none or naming every candidate.
    pub fn into_uri(self) -> Result<DvmUri> {
        match self {
            Discovery::One(u) => Ok(u),
            Discovery::None { root } => bail!(
                "no running DVM found under {} (start one with `dvmd --local N --daemonize`, or pass --dvm-uri)",
                root.display()
            ),
            Discovery::Several { uris, .. } => bail!(
                "{} DVMs of this user are running ({}); choose one with --dvm-uri",
                uris.len(),
                uris.iter().map(|u| u.to_string()).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// Persistent DVMs of this user: session directories under [`session_root`] with a `uri` file
/// whose HNP is alive (the `uri` of an HNP killed with SIGKILL stays behind and is skipped).
/// One-shot DVMs write no `uri` file and are never found here.
pub fn discover() -> Discovery {
    let root = session_root();
    let mut uris = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&root) {
        for e in entries.flatten() {
            let Ok(text) = std::fs::read_to_string(e.path().join("uri")) else { continue };
            let Ok(u) = DvmUri::parse(&text) else { continue };
            if u.hnp_pid().is_some_and(process_gone) {
                continue;
            }
            uris.push(u);
        }
    }
    uris.sort_by_key(|u| u.to_string());
    match uris.len() {
        0 => Discovery::None { root },
        1 => Discovery::One(uris.remove(0)),
        _ => Discovery::Several { root, uris },
    }
}

/// Refuse, in one sentence, a directory that is a symlink, belongs to another user, or that
/// group or others may read or enter: it holds (or leads to) the DVM secret.
pub fn check_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir).with_context(|| format!("cannot inspect {}", dir.display()))?;
    let uid = nix::unistd::getuid().as_raw();
    let mode = meta.mode() & 0o777;
    if !meta.is_dir() {
        bail!("{} is not a directory (a symlink?); refusing to use it", dir.display());
    }
    if meta.uid() != uid {
        bail!(
            "directory {} belongs to uid {}, not to this user ({uid}); refusing to use it",
            dir.display(),
            meta.uid()
        );
    }
    if mode & 0o077 != 0 {
        bail!("directory {} has mode {mode:o}; it must not be open to group or others (chmod 700)", dir.display());
    }
    Ok(())
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

    #[test]
    fn owner_pid_from_session_dir_names() {
        assert_eq!(owner_pid(Path::new("/tmp/dvm-0/dvm-1234-0a1b2c3d")), Some(1234));
        assert_eq!(owner_pid(Path::new("/tmp/dvm-0/dvmd-r7-99-0a1b2c3d")), Some(99));
        assert_eq!(owner_pid(Path::new("/tmp/dvm-0/x")), None);
        assert_eq!(owner_pid(Path::new("/tmp/dvm-0/dvm-x-0a1b2c3d")), None);
        assert!(!process_gone(std::process::id()));
    }
}
