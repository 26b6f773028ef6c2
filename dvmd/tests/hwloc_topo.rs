//! Ranks receive the hardware topology from their daemon instead of discovering it again.
//!
//! Each daemon's PMIx server discovers the topology once and shares it; Open MPI 4.1's hwloc
//! base then finds it through PMIx before it would discover one itself: first the
//! shared-memory copy (`pmix.hwlocfile`/`pmix.hwlocaddr`/`pmix.hwlocsize`), else the XML
//! string (`pmix.hwlocxml2`). With `OMPI_MCA_hwloc_base_verbose=2` every rank says which one it
//! used ("topology in shared memory", "loading topology from XML") or that it discovered the
//! topology itself ("discovering topology") — what every rank did before the daemon shared it,
//! and still does with `DVM_NO_TOPO=1`, checked here so the check itself is known to tell.

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

/// Two daemons, four ranks each: every rank adopts its own daemon's shared-memory topology.
#[test]
fn ranks_adopt_the_daemons_topology() {
    let dvm = Dvm::start("hwtopo", Nodes::Local { daemons: 2, slots: 4 }, 2, &[("OMPI_MCA_pml", "ob1")]);
    let got = topology_sources(&dvm, 8);
    assert_eq!(got, (8, 0, 0), "(shared memory, XML, discovered) over 8 ranks\n{}", dvm.log());
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
