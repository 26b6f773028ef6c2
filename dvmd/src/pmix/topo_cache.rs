//! The machine's hardware topology kept as hwloc XML, so a PMIx worker loads it (~3 ms) instead
//! of discovering it (~13 ms of CPU) in `PMIx_server_init`.
//!
//! Every worker of every daemon used to discover the same topology: a one-shot `prun` on a
//! machine starts a fresh server per daemon, and daemons sharing a machine (`--local`, network
//! namespaces, containers without CPU limits) discovered it once each, at the same time. Now
//! a worker, before anything else, looks in `<session root>/topology/` (the user's own 0700
//! directory beside the session directories) for `hwloc-<key>.xml` and hands it to libpmix
//! ([`pmix_shim::topology::TOPO_FILE_VAR`]); if it is missing, the worker discovers the
//! topology once under an exclusive lock (so co-starting workers wait for one discovery instead
//! of each running their own) and writes it atomically (temporary file, rename).
//!
//! The key hashes what decides a discovery on one machine: the boot
//! (`/proc/sys/kernel/random/boot_id`), the cgroup's CPU and memory sets (not its path: every
//! Slurm step and login session has its own), the process's allowed CPUs and memory nodes, the
//! CPUs online, the hwloc ABI level and the cache's format. What it does not see: devices or
//! memory hot-plugged after boot, and per-container views of `/sys` that differ without a
//! different boot id or cgroup set. The node's hostname and the cgroup's path are removed from
//! the XML (informational attributes), so fake nodes of one machine share one entry. Entries
//! unused for a week and temporary files older than an hour are removed on the next discovery.
//!
//! Never trusted blindly: a file that is not ours, not a regular file, or not a complete hwloc
//! v2 document is ignored and rewritten, and an entry libpmix failed to start with is removed
//! ([`forget_after_failed_init`]), so the next worker discovers again. `DVM_NO_TOPO_CACHE=1`
//! turns the cache off (libpmix discovers as before), and so does a topology file the user
//! already gave libpmix or any `HWLOC_*` variable in the daemon's environment.

use std::collections::hash_map::DefaultHasher;
use std::fs::{File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pmix_shim::topology::{self, TOPO_FILE_VAR};
use tracing::{debug, warn};

/// Set (non-empty, not `0`) in dvmd's environment: no topology cache, every PMIx server
/// discovers the topology itself (for comparisons such as scripts/bench_topo.sh).
pub const NO_CACHE_VAR: &str = "DVM_NO_TOPO_CACHE";

/// Largest file taken for a topology (a large machine's XML is a few hundred KiB).
const MAX_XML: u64 = 16 << 20;

/// How long a worker waits for another one's discovery before it discovers by itself.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// What this code writes into an entry (bumped when that changes: an entry written with
/// other discovery settings is then never read).
const FORMAT: u32 = 3;

/// Why the cache was not used (logged; libpmix then discovers the topology itself).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("topology cache {dir}: {what}")]
    Dir { dir: PathBuf, what: String },
    #[error("topology cache {file}: {source}")]
    Io { file: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Discovery(#[from] topology::TopologyError),
}

/// Whether a worker should use the cache: not switched off, and nothing in the environment
/// already steers libpmix's or hwloc's view of the topology.
pub fn enabled() -> bool {
    let off = std::env::var_os(NO_CACHE_VAR).is_some_and(|v| !v.is_empty() && v != "0");
    !off && std::env::var_os(TOPO_FILE_VAR).is_none()
        && !std::env::vars_os().any(|(k, _)| k.to_string_lossy().starts_with("HWLOC_"))
}

/// The cache directory of this user: beside the session directories, never swept with them.
pub fn default_dir() -> PathBuf {
    crate::session::session_root().join("topology")
}

/// The XML of this machine's topology in `dir`, discovered and written first if it is not
/// there yet. Returns the file to give libpmix.
pub fn xml_file(dir: &Path) -> Result<PathBuf, CacheError> {
    private_dir(dir)?;
    let key = key();
    let file = dir.join(format!("hwloc-{key:016x}.xml"));
    if usable(&file) {
        debug!(file = %file.display(), "topology from the cache");
        return Ok(file);
    }
    let lock_path = dir.join(format!("hwloc-{key:016x}.lock"));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|source| CacheError::Io { file: lock_path.clone(), source })?;
    if !lock_exclusive(&lock, LOCK_WAIT) {
        debug!(lock = %lock_path.display(), "discovering without the cache lock (busy for {LOCK_WAIT:?}, or no flock here)");
    }
    // Another worker may have written it while this one waited (or gave up waiting).
    if usable(&file) {
        debug!(file = %file.display(), "topology from the cache (written by another worker)");
        return Ok(file);
    }
    remove_stale(dir);
    let t0 = Instant::now();
    let xml = without_local_names(&topology::discover_xml()?);
    // A name no other writer can hold (threads share a PID; PID namespaces share /tmp).
    let tmp = dir.join(format!("hwloc-{key:016x}.xml.{:016x}", rand::random::<u64>()));
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new().create_new(true).write(true).mode(0o600).open(&tmp)?;
        f.write_all(xml.as_bytes())?;
        f.sync_data()?;
        std::fs::rename(&tmp, &file)
    };
    if let Err(source) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(CacheError::Io { file, source });
    }
    debug!(file = %file.display(), ms = t0.elapsed().as_millis() as u64, "topology discovered into the cache");
    Ok(file)
    // The lock is released when `lock` is dropped (closing the descriptor).
}

/// Set up a worker's environment before libpmix starts: point libpmix at the cached XML.
/// Must run while the process has a single thread (it changes the environment).
pub fn prepare_worker() {
    if !enabled() {
        return;
    }
    let dir = default_dir();
    match xml_file(&dir) {
        // A discovery runs hwloc's plugins, which could leave a thread behind: the
        // environment is only changed while this process is still single-threaded.
        Ok(_) if threads() != Some(1) => {
            warn!("hwloc left threads running in the PMIx worker; its server discovers the topology itself")
        }
        Ok(file) => {
            // Loading XML needs none of hwloc's plugins (its own parser reads it), yet hwloc
            // loads every plugin it finds at its first topology — libxml2 with ICU, X11 and
            // OpenCL libraries: ~3 ms of the ~3.5 ms a load took, none of it for the topology.
            // A directory that never exists (inside our private one) means no plugins here,
            // in the worker only; the ranks load theirs as they always do.
            std::env::set_var(PLUGINS_PATH_VAR, dir.join(NO_PLUGINS));
            // libpmix fails its init on a file hwloc cannot load (it does not fall back to a
            // discovery): load it first, as libpmix will.
            match topology::load_xml_file(&file) {
                Ok(()) => std::env::set_var(TOPO_FILE_VAR, file),
                Err(e) => {
                    warn!(file = %file.display(), "{e}: the cached topology is removed; the PMIx server discovers it itself");
                    let _ = std::fs::remove_file(&file);
                    std::env::remove_var(PLUGINS_PATH_VAR);
                }
            }
        }
        Err(e) => warn!("{e}; the PMIx server discovers the topology itself"),
    }
}

/// libpmix could not start with the topology file this worker gave it: remove the entry, so
/// the next worker discovers the topology again instead of failing the same way.
pub fn forget_after_failed_init() {
    if let Some(file) = std::env::var_os(TOPO_FILE_VAR) {
        let file = PathBuf::from(file);
        if file.parent() == Some(default_dir().as_path()) {
            warn!(file = %file.display(), "the PMIx server did not start with the cached topology; the entry is removed");
            let _ = std::fs::remove_file(file);
        }
    }
}

/// This process's thread count (`/proc/self/status`).
fn threads() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|n| n.trim().parse().ok())
}

/// Where hwloc looks for its plugins.
const PLUGINS_PATH_VAR: &str = "HWLOC_PLUGINS_PATH";

/// Never created, so hwloc finds no plugins there.
const NO_PLUGINS: &str = "no-plugins";

/// Files nobody will read again: temporary files of writers that died before their rename
/// (older than [`TMP_AGE`]) and entries older than [`ENTRY_AGE`] (keys of past boots, of cgroups
/// that are gone; an entry still in use is simply discovered again).
fn remove_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str().and_then(|n| n.strip_prefix("hwloc-")) else { continue };
        let limit = if name.ends_with(".xml") {
            ENTRY_AGE
        } else if name.contains(".xml.") {
            TMP_AGE
        } else {
            continue;
        };
        let age = e.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
        if age.is_some_and(|a| a > limit) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Age past which a temporary file's writer is surely gone.
const TMP_AGE: Duration = Duration::from_secs(3600);

/// Age past which an entry is dropped.
const ENTRY_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

fn private_dir(dir: &Path) -> Result<(), CacheError> {
    let err = |what: String| CacheError::Dir { dir: dir.to_owned(), what };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| err(e.to_string()))?;
    crate::session::check_private_dir(dir).map_err(|e| err(format!("{e:#}")))
}

/// A complete hwloc v2 document of ours that libpmix can load.
fn usable(file: &Path) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(file) else { return false };
    if !meta.is_file() || meta.uid() != nix::unistd::getuid().as_raw() || meta.len() == 0 || meta.len() > MAX_XML {
        return false;
    }
    let Ok(text) = std::fs::read_to_string(file) else { return false };
    complete_xml(&text)
}

fn complete_xml(text: &str) -> bool {
    text.starts_with("<?xml") && text.contains("<topology version=\"2.") && text.trim_end().ends_with("</topology>")
}

/// The XML without what names this process's place rather than the machine: the node's name
/// and the cgroup's path (informational attributes hwloc adds at discovery).
fn without_local_names(xml: &str) -> String {
    let local = |l: &str| {
        let l = l.trim_start();
        l.starts_with("<info name=\"HostName\"") || l.starts_with("<info name=\"LinuxCgroup\"")
    };
    xml.lines().filter(|l| !local(l)).fold(String::new(), |mut s, l| {
        s.push_str(l);
        s.push('\n');
        s
    })
}

/// What the discovery depends on, hashed.
fn key() -> u64 {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let status = read("/proc/self/status");
    let sets: Vec<&str> =
        status.lines().filter(|l| l.starts_with("Cpus_allowed_list:") || l.starts_with("Mems_allowed_list:")).collect();
    // The cgroup's CPU and memory sets (what hwloc restricts the topology to), not its path:
    // every Slurm step and login session has a path of its own.
    let cgroup = read("/proc/self/cgroup");
    let cpuset = cgroup.lines().find_map(|l| l.strip_prefix("0::")).map(|path| {
        let base = format!("/sys/fs/cgroup{}", path.trim());
        (read(&format!("{base}/cpuset.cpus.effective")), read(&format!("{base}/cpuset.mems.effective")))
    });
    let mut h = DefaultHasher::new();
    (
        read("/proc/sys/kernel/random/boot_id"),
        cpuset,
        sets,
        read("/sys/devices/system/cpu/online"),
        topology::hwloc_version(),
        FORMAT,
    )
        .hash(&mut h);
    h.finish()
}

/// Take an exclusive `flock` on `f`, waiting up to `limit`; false when it could not be had
/// in time (the caller then discovers without it).
fn lock_exclusive(f: &File, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        // SAFETY: flock on a descriptor this function borrows.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return true;
        }
        // A file system without flock: go on unlocked at once (the rename keeps readers safe).
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EWOULDBLOCK) || Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test's own directory, removed however the test ends.
    struct TmpDir(PathBuf);

    impl Drop for TmpDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tmp(name: &str) -> TmpDir {
        let d = std::env::temp_dir().join(format!("dvm-topo-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        TmpDir(d)
    }

    #[test]
    fn discovers_once_then_reuses() {
        let t = tmp("reuse");
        let dir = &t.0;
        let f1 = xml_file(dir).unwrap();
        let t1 = std::fs::metadata(&f1).unwrap().modified().unwrap();
        let text = std::fs::read_to_string(&f1).unwrap();
        assert!(complete_xml(&text));
        assert!(!text.contains("name=\"HostName\""), "hostname kept in the cached XML");
        assert!(!text.contains("name=\"LinuxCgroup\""), "cgroup path kept in the cached XML");
        let f2 = xml_file(dir).unwrap();
        assert_eq!(f1, f2);
        assert_eq!(std::fs::metadata(&f2).unwrap().modified().unwrap(), t1, "rewritten although usable");
        assert_eq!(std::fs::metadata(dir).unwrap().mode() & 0o777, 0o700);
    }

    #[test]
    fn a_damaged_file_is_replaced() {
        let t = tmp("damaged");
        let dir = &t.0;
        let f = xml_file(dir).unwrap();
        let good = std::fs::read_to_string(&f).unwrap();
        for bad in ["", "garbage", &good[..good.len() / 2]] {
            std::fs::write(&f, bad).unwrap();
            assert!(!usable(&f));
            assert_eq!(xml_file(dir).unwrap(), f);
            assert!(usable(&f), "not rewritten after {:?}", &bad[..bad.len().min(20)]);
        }
    }

    #[test]
    fn an_open_directory_is_refused() {
        let t = tmp("open");
        std::fs::create_dir_all(&t.0).unwrap();
        std::fs::set_permissions(&t.0, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let e = xml_file(&t.0).unwrap_err().to_string();
        assert!(e.contains("has mode 777") && e.contains("chmod 700"), "{e}");
    }

    #[test]
    fn concurrent_workers_share_one_file() {
        let t = tmp("concurrent");
        let dir = &t.0;
        let files: Vec<PathBuf> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..6).map(|_| s.spawn(|| xml_file(dir).unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(files.windows(2).all(|w| w[0] == w[1]));
        assert!(usable(&files[0]));
        let left: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 2, "only the XML and its lock remain: {left:?}");
    }

    #[test]
    fn stale_files_are_removed_fresh_ones_kept() {
        let t = tmp("stale");
        let dir = &t.0;
        let f = xml_file(dir).unwrap();
        let name = f.file_name().unwrap().to_str().unwrap().to_owned();
        let age = |p: &Path, by: Duration| {
            let when = std::time::SystemTime::now() - by;
            std::fs::File::options().write(true).open(p).unwrap().set_modified(when).unwrap();
        };
        // A writer that died before its rename an hour and more ago, one writing now, and an
        // entry of another key unused for longer than ENTRY_AGE.
        let dead = dir.join(format!("{name}.00000000deadbeef"));
        let busy = dir.join(format!("{name}.00000000cafebabe"));
        let old = dir.join("hwloc-00000000000000aa.xml");
        for p in [&dead, &busy, &old] {
            std::fs::write(p, "partial").unwrap();
        }
        age(&dead, TMP_AGE + Duration::from_secs(60));
        age(&old, ENTRY_AGE + Duration::from_secs(60));
        std::fs::remove_file(&f).unwrap();
        assert_eq!(xml_file(dir).unwrap(), f);
        assert!(!dead.exists(), "a dead writer's temporary file was kept");
        assert!(!old.exists(), "an entry unused past ENTRY_AGE was kept");
        assert!(busy.exists(), "a writer's fresh temporary file was removed");
        assert!(usable(&f));
    }

    #[test]
    fn local_names_removed_only() {
        let xml = "<?xml a?>\n<topology version=\"2.0\">\n  <info name=\"HostName\" value=\"n1\"/>\n  <info name=\"LinuxCgroup\" value=\"/a/b\"/>\n  <info name=\"OSName\" value=\"Linux\"/>\n</topology>\n";
        let out = without_local_names(xml);
        assert!(!out.contains("HostName") && !out.contains("LinuxCgroup"));
        assert!(out.contains("OSName"));
        assert!(complete_xml(&out));
    }
}
