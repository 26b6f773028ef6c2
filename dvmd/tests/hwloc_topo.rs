//! Ranks receive the hardware topology from their daemon instead of discovering it again.
//!
//! Each daemon's PMIx server discovers the topology once and shares it; Open MPI 4.1's hwloc
//! base then finds it through PMIx before it would discover one itself: first the
//! shared-memory copy (`pmix.hwlocfile`/`pmix.hwlocaddr`/`pmix.hwlocsize`), else the XML
//! string (`pmix.hwlocxml2`). With `OMPI_MCA_hwloc_base_verbose=2` every rank says which one it
//! used ("topology in shared memory", "loading topology from XML") or that it discovered the
//! topology itself ("discovering topology") — what every rank did before the daemon shared it,
//! and still does with `DVM_NO_TOPO=1`, checked here so the check itself is known to tell.
//!
//! The servers themselves load the topology from the user's topology cache (hwloc XML beside
//! the session directories) instead of each discovering it: with `PMIX_MCA_pmix_hwloc_verbose=2`
//! libpmix says which it did ("using MCA provided topo file" / "doing discovery").

mod common;

use common::{text, Dvm, Nodes};

const FROM_SHMEM: &str = "hwloc:base: topology in shared memory";
const FROM_XML: &str = "hwloc:base loading topology from XML";
const DISCOVERED: &str = "hwloc:base discovering topology";

fn mpinoop() -> String {
    common::mpi_bin("mpinoop")
}

/// Runs MPI_Init+Finalize on `n` ranks with the hwloc base verbose; returns how many ranks
/// took the topology from shared memory, from XML, and discovered it.
fn topology_sources(dvm: &Dvm, n: u32) -> (usize, usize, usize) {
    let bin = mpinoop();
    let o = dvm.prun(&["-n", &n.to_string(), "-x", "OMPI_MCA_hwloc_base_verbose=2", &bin]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "mpinoop: {:?}\n{out}\n{err}\n{}", o.status, dvm.log());
    let count = |what: &str| err.lines().filter(|l| l.contains(what)).count();
    (count(FROM_SHMEM), count(FROM_XML), count(DISCOVERED))
}

const SERVER_FROM_FILE: &str = "using MCA provided topo file";
const SERVER_DISCOVERED: &str = "doing discovery";

/// (servers that loaded the cached topology, servers that discovered it) from the DVM's log.
fn server_sources(dvm: &Dvm) -> (usize, usize) {
    let log = dvm.log();
    let count = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    (count(SERVER_FROM_FILE), count(SERVER_DISCOVERED))
}

/// This user's topology cache under a `DVM_TMPDIR` root.
fn cache_dir(root: &std::path::Path) -> std::path::PathBuf {
    root.join(format!("dvm-{}", nix::unistd::getuid())).join("topology")
}

/// The cached topology entries under a `DVM_TMPDIR` root.
fn cache_files_in(root: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(cache_dir(root))
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "xml")).collect())
        .unwrap_or_default()
}

/// The cached topology entries of the DVM's user.
fn cache_files(dvm: &Dvm) -> Vec<std::path::PathBuf> {
    cache_files_in(&dvm.root)
}

/// Two daemons, four ranks each: every rank adopts its own daemon's shared-memory topology,
/// and both servers load it from one cached file instead of each discovering it.
#[test]
fn ranks_adopt_the_daemons_topology() {
    let env = [
        ("OMPI_MCA_pml", "ob1"),
        ("PMIX_MCA_pmix_hwloc_verbose", "2"),
        ("DVM_LOG", "info,dvmd::pmix::topo_cache=debug"),
    ];
    let dvm = Dvm::start("hwtopo", Nodes::Local { daemons: 2, slots: 4 }, 2, &env);
    let got = topology_sources(&dvm, 8);
    assert_eq!(got, (8, 0, 0), "(shared memory, XML, discovered) over 8 ranks\n{}", dvm.log());
    assert_eq!(server_sources(&dvm), (2, 0), "(cached, discovered) over 2 servers\n{}", dvm.log());
    // Both workers started with the cache empty: one discovered, the other took its file
    // (waiting on the lock if they overlapped), and neither ran libpmix's own discovery.
    let discoveries = dvm.log().lines().filter(|l| l.contains("topology discovered into the cache")).count();
    assert_eq!(discoveries, 1, "discoveries into the cache\n{}", dvm.log());
    let files = cache_files(&dvm);
    assert_eq!(files.len(), 1, "one cached topology for one machine: {files:?}");
    let xml = std::fs::read_to_string(&files[0]).unwrap();
    assert!(xml.contains("type=\"PU\"") && !xml.contains("\"HostName\""), "{xml}");
    dvm.stop();
}

/// A damaged cache file is not given to libpmix: the next server discovers the topology again
/// into the cache and the ranks still adopt it. Two DVMs one after the other share one session
/// root (`DVM_TMPDIR`), as a user's successive DVMs do; the file is damaged between them.
#[test]
fn a_damaged_cache_file_is_rediscovered() {
    let root = std::env::temp_dir().join(format!("dvm-t-hwtopo-shared-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let _gone = RemoveOnDrop(root.clone());
    let tmpdir = root.to_str().unwrap();
    let env = [("OMPI_MCA_pml", "ob1"), ("PMIX_MCA_pmix_hwloc_verbose", "2"), ("DVM_TMPDIR", tmpdir)];
    let cache = cache_dir(&root);
    let xml_files = || cache_files_in(&root);

    let dvm = Dvm::start("hwtopo-cache1", Nodes::Local { daemons: 1, slots: 2 }, 2, &env);
    assert_eq!(topology_sources(&dvm, 2), (2, 0, 0), "{}", dvm.log());
    dvm.stop();
    let files = xml_files();
    assert_eq!(files.len(), 1, "{files:?}");
    // Truncated: not even taken for a document; the worker discovers into the cache again.
    std::fs::write(&files[0], "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n").unwrap();
    let dvm = Dvm::start("hwtopo-cache2", Nodes::Local { daemons: 1, slots: 2 }, 2, &env);
    assert_eq!(topology_sources(&dvm, 2), (2, 0, 0), "{}", dvm.log());
    assert_eq!(server_sources(&dvm), (1, 0), "(cached, discovered)\n{}", dvm.log());
    dvm.stop();
    assert_eq!(xml_files(), files);
    assert!(std::fs::read_to_string(&files[0]).unwrap().trim_end().ends_with("</topology>"), "not rewritten");

    // Broken in the middle (starts and ends like one): libpmix would fail its init on it, and
    // the job with it. The worker's own load refuses it: the entry is removed and this server
    // discovers by itself; the job runs, its ranks still adopt the topology.
    let broken = "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n<object type=\"Bogus\"\n</topology>\n";
    std::fs::write(&files[0], broken).unwrap();
    let dvm = Dvm::start("hwtopo-cache3", Nodes::Local { daemons: 1, slots: 2 }, 2, &env);
    assert_eq!(topology_sources(&dvm, 2), (2, 0, 0), "{}", dvm.log());
    assert_eq!(server_sources(&dvm), (0, 1), "(cached, discovered)\n{}", dvm.log());
    dvm.stop();
    assert!(xml_files().is_empty(), "the broken entry was kept");
    // Only the cache is left of both DVMs.
    let left: Vec<_> = std::fs::read_dir(cache.parent().unwrap()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left, ["topology"], "left in the session root: {left:?}");
}

/// Removes a test's own directory however the test ends.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `DVM_NO_TOPO_CACHE=1` turns the cache off: the server discovers, nothing is written.
#[test]
fn switched_off_cache_server_discovers() {
    let env = [("OMPI_MCA_pml", "ob1"), ("PMIX_MCA_pmix_hwloc_verbose", "2"), ("DVM_NO_TOPO_CACHE", "1")];
    let dvm = Dvm::start("hwtopo-nocache", Nodes::Local { daemons: 1, slots: 2 }, 2, &env);
    assert_eq!(topology_sources(&dvm, 2), (2, 0, 0), "{}", dvm.log());
    assert_eq!(server_sources(&dvm), (0, 1), "(cached, discovered)\n{}", dvm.log());
    assert!(cache_files(&dvm).is_empty(), "written although switched off");
    dvm.stop();
}

/// Without the shared-memory copy (libpmix told to find no address range for it), the ranks
/// load the XML string the daemon registered.
#[test]
fn ranks_load_the_xml_without_shared_memory() {
    let env = [("OMPI_MCA_pml", "ob1"), ("PMIX_MCA_pmix_hwloc_hole_kind", "none")];
    let dvm = Dvm::start("hwtopo-xml", Nodes::Local { daemons: 1, slots: 2 }, 2, &env);
    let got = topology_sources(&dvm, 2);
    assert_eq!(got, (0, 2, 0), "(shared memory, XML, discovered) over 2 ranks\n{}", dvm.log());
    dvm.stop();
}

/// `DVM_NO_TOPO=1`: the old behaviour, every rank discovers the topology itself.
#[test]
fn switched_off_every_rank_discovers() {
    let env = [("OMPI_MCA_pml", "ob1"), ("DVM_NO_TOPO", "1")];
    let dvm = Dvm::start("hwtopo-off", Nodes::Local { daemons: 1, slots: 2 }, 2, &env);
    let got = topology_sources(&dvm, 2);
    assert_eq!(got, (0, 0, 2), "(shared memory, XML, discovered) over 2 ranks\n{}", dvm.log());
    dvm.stop();
}
