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
//! The key names everything that can make two processes' discoveries differ: the boot
//! (`/proc/sys/kernel/random/boot_id`: a reboot or a hot-plug after it gets a fresh entry only
//! through the CPUs online, also in the key), the cgroup and its CPU and memory-node sets, the
//! online CPUs, and the hwloc version. The node's hostname is not in the key: it is removed
//! from the XML (hwloc records it as an informational attribute only), so fake nodes of one
//! machine share one entry.
//!
//! Never trusted blindly: a file that is not ours, not a regular file, or not a complete hwloc
//! v2 document is ignored and rewritten. `DVM_NO_TOPO_CACHE=1` turns the cache off (libpmix
//! discovers as before), and so does a topology file the user already gave libpmix or any
//! `HWLOC_*` variable that changes what hwloc discovers.

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
const FORMAT: u32 = 2;

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
    let locked = lock_exclusive(&lock, LOCK_WAIT);
    // Another worker may have written it while this one waited.
    if locked && usable(&file) {
        debug!(file = %file.display(), "topology from the cache (written by another worker)");
        return Ok(file);
    }
    remove_orphans(dir);
    let t0 = Instant::now();
    let xml = without_hostname(&topology::discover_xml()?);
    let tmp = dir.join(format!("hwloc-{key:016x}.xml.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
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
        Ok(file) => {
            std::env::set_var(TOPO_FILE_VAR, file);
            // Loading XML needs none of hwloc's plugins (its own parser reads it), yet hwloc
            // loads every plugin it finds at its first topology — libxml2 with ICU, X11 and
            // OpenCL libraries: ~3 ms of the ~3.5 ms a load took, none of it for the topology.
            // A directory that never exists (inside our private one) means no plugins here,
            // in the worker only; the ranks load theirs as they always do.
            std::env::set_var(PLUGINS_PATH_VAR, dir.join(NO_PLUGINS));
        }
        Err(e) => warn!("{e}; the PMIx server discovers the topology itself"),
    }
}

/// Where hwloc looks for its plugins.
const PLUGINS_PATH_VAR: &str = "HWLOC_PLUGINS_PATH";

/// Never created, so hwloc finds no plugins there.
const NO_PLUGINS: &str = "no-plugins";

/// Temporary files (`hwloc-<key>.xml.<pid>`) of writers that died before their rename.
fn remove_orphans(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((_, pid)) = name.to_str().and_then(|n| n.strip_prefix("hwloc-")).and_then(|n| n.split_once(".xml."))
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok_and(crate::session::process_gone) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn private_dir(dir: &Path) -> Result<(), CacheError> {
    let err = |what: String| CacheError::Dir { dir: dir.to_owned(), what };
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) => return Err(err(e.to_string())),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| err(e.to_string()))?;
    if !meta.is_dir() {
        return Err(err("not a directory".into()));
    }
    if meta.uid() != nix::unistd::getuid().as_raw() {
        return Err(err(format!("owned by uid {}, not by this user", meta.uid())));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(err(format!("mode {:o} lets others in (want 0700)", meta.mode() & 0o777)));
    }
    Ok(())
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

/// The XML without the node's name (an informational attribute hwloc adds at discovery).
fn without_hostname(xml: &str) -> String {
    xml.lines().filter(|l| !l.trim_start().starts_with("<info name=\"HostName\"")).fold(String::new(), |mut s, l| {
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
    let mut h = DefaultHasher::new();
    (
        read("/proc/sys/kernel/random/boot_id"),
        read("/proc/self/cgroup"),
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
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("dvm-topo-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn discovers_once_then_reuses() {
        let dir = tmp("reuse");
        let f1 = xml_file(&dir).unwrap();
        let t1 = std::fs::metadata(&f1).unwrap().modified().unwrap();
        let text = std::fs::read_to_string(&f1).unwrap();
        assert!(complete_xml(&text));
        assert!(!text.contains("name=\"HostName\""), "hostname kept in the cached XML");
        let f2 = xml_file(&dir).unwrap();
        assert_eq!(f1, f2);
        assert_eq!(std::fs::metadata(&f2).unwrap().modified().unwrap(), t1, "rewritten although usable");
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_damaged_file_is_replaced() {
        let dir = tmp("damaged");
        let f = xml_file(&dir).unwrap();
        let good = std::fs::read_to_string(&f).unwrap();
        for bad in ["", "garbage", &good[..good.len() / 2]] {
            std::fs::write(&f, bad).unwrap();
            assert!(!usable(&f));
            assert_eq!(xml_file(&dir).unwrap(), f);
            assert!(usable(&f), "not rewritten after {:?}", &bad[..bad.len().min(20)]);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_open_directory_is_refused() {
        let dir = tmp("open");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let e = xml_file(&dir).unwrap_err().to_string();
        assert!(e.contains("want 0700"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_workers_share_one_file() {
        let dir = tmp("concurrent");
        let files: Vec<PathBuf> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..6).map(|_| s.spawn(|| xml_file(&dir).unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(files.windows(2).all(|w| w[0] == w[1]));
        assert!(usable(&files[0]));
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left.len(), 2, "only the XML and its lock remain: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_dead_writers_temporary_file_is_removed() {
        let dir = tmp("orphan");
        let f = xml_file(&dir).unwrap();
        // A writer killed between its write and its rename (PID 0x7fff_fff0 is never a live
        // process's), and one that still runs (this process).
        let dead = dir.join(format!("{}.{}", f.file_name().unwrap().to_str().unwrap(), 0x7fff_fff0u32));
        let live = dir.join(format!("{}.{}", f.file_name().unwrap().to_str().unwrap(), std::process::id()));
        std::fs::write(&dead, "partial").unwrap();
        std::fs::write(&live, "partial").unwrap();
        std::fs::remove_file(&f).unwrap();
        assert_eq!(xml_file(&dir).unwrap(), f);
        assert!(!dead.exists(), "a dead writer's temporary file was kept");
        assert!(usable(&f));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hostname_line_removed_only() {
        let xml = "<?xml a?>\n<topology version=\"2.0\">\n  <info name=\"HostName\" value=\"n1\"/>\n  <info name=\"OSName\" value=\"Linux\"/>\n</topology>\n";
        let out = without_hostname(xml);
        assert!(!out.contains("HostName"));
        assert!(out.contains("OSName"));
        assert!(complete_xml(&out));
    }
}
