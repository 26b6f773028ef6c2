//! This node's hardware summary for placement ([`NodeTopo`]), read from the hwloc XML the
//! PMIx workers already use (the topology cache), so the HNP maps and binds on what the ranks
//! will see: the PUs of the daemon's cgroup and affinity, in hwloc's logical order.
//!
//! Never: a decision (the core maps and binds). A node whose discovery fails reports nothing,
//! and its ranks run unbound.

use dvm_core::jobmap::NodeTopo;
use tracing::{debug, warn};

use crate::pmix::topo_cache;

/// The summary of this machine, from the cached XML (discovered first if missing), or by a
/// discovery of its own when the cache is off. `None` (logged) when hwloc fails.
pub fn discover() -> Option<NodeTopo> {
    let t0 = std::time::Instant::now();
    let xml = if topo_cache::enabled() {
        topo_cache::xml_file(&topo_cache::default_dir())
            .map_err(|e| e.to_string())
            .and_then(|f| std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display())))
    } else {
        pmix_shim::topology::discover_xml().map_err(|e| e.to_string())
    };
    match xml.and_then(|x| parse_xml(&x)) {
        Ok(mut t) => {
            t.machine = machine_id();
            debug!(ms = t0.elapsed().as_millis() as u64, hw = %t.describe(), "hardware summary");
            Some(t)
        }
        Err(e) => {
            warn!("no hardware summary, ranks here run unbound: {e}");
            None
        }
    }
}

/// This machine's boot id, hashed (0 when unreadable): equal for every daemon sharing the
/// machine, so the HNP can tell fake nodes from real ones.
fn machine_id() -> u64 {
    use std::hash::{Hash, Hasher};
    let Ok(id) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") else { return 0 };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.trim().hash(&mut h);
    h.finish().max(1)
}

/// The summary of an hwloc v2 XML document: each PU (in document order, hwloc's logical
/// order) with the core, L3 cache and package above it and the NUMA node attached nearest
/// above it (hwloc 2 hangs NUMA nodes off their parent as memory children).
pub fn parse_xml(xml: &str) -> Result<NodeTopo, String> {
    // hwloc's documents name their DTD (`<!DOCTYPE topology SYSTEM "hwloc2.dtd">`).
    let opts = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    let doc = roxmltree::Document::parse_with_options(xml, opts).map_err(|e| format!("hwloc XML: {e}"))?;
    fn kind<'a>(n: &roxmltree::Node<'a, '_>) -> Option<&'a str> {
        if !n.has_tag_name("object") {
            return None;
        }
        match n.attribute("type")? {
            "Cache" if n.attribute("depth") == Some("3") => Some("L3Cache"),
            "Socket" => Some("Package"),
            t => Some(t),
        }
    }
    // Logical index of each object of a type: its position in document order.
    let mut index = std::collections::HashMap::new();
    let mut next: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    for n in doc.descendants() {
        if let Some(k @ ("Core" | "L3Cache" | "Package" | "NUMANode")) = kind(&n) {
            let c = next.entry(k).or_insert(0);
            index.insert(n.id(), *c);
            *c += 1;
        }
    }
    let (mut os, mut core, mut l3, mut numa, mut pkg) = (vec![], vec![], vec![], vec![], vec![]);
    for pu in doc.descendants().filter(|n| kind(n) == Some("PU")) {
        let os_index = pu.attribute("os_index").and_then(|v| v.parse::<u32>().ok());
        os.push(os_index.ok_or_else(|| format!("hwloc XML: PU {} has no os_index", os.len()))?);
        let above = |k: &str| pu.ancestors().find(|a| kind(a) == Some(k)).and_then(|a| index.get(&a.id()).copied());
        let near_numa = pu
            .ancestors()
            .find_map(|a| a.children().find(|c| kind(c) == Some("NUMANode")).and_then(|c| index.get(&c.id()).copied()));
        for (col, v) in [
            (&mut core, above("Core")),
            (&mut l3, above("L3Cache")),
            (&mut pkg, above("Package")),
            (&mut numa, near_numa),
        ] {
            col.push(v);
        }
    }
    // A level is kept only when every PU has an object of it.
    let keep =
        |col: Vec<Option<u32>>| -> Vec<u32> { col.iter().copied().collect::<Option<Vec<u32>>>().unwrap_or_default() };
    NodeTopo::new(os, keep(core), keep(l3), keep(numa), keep(pkg)).map_err(|e| format!("hwloc XML: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hwloc_synthetic_topologies_read_as_the_core_builds_them() {
        for desc in [
            "package:2 numa:2 core:8 pu:2",
            "package:2 l3cache:2 core:4 pu:1",
            "numa:4 core:2 pu:2",
            "package:1 core:2 pu:1",
            "package:4 numa:1 l3:3 l2:2 core:2 pu:4",
        ] {
            let xml = pmix_shim::topology::synthetic_xml(desc).expect("hwloc builds it");
            let read = parse_xml(&xml).unwrap_or_else(|e| panic!("{desc}: {e}"));
            let built = NodeTopo::synthetic(desc).unwrap();
            assert_eq!(read, built, "{desc}");
        }
    }

    #[test]
    fn this_machine_has_pus() {
        let t = parse_xml(&pmix_shim::topology::discover_xml().unwrap()).unwrap();
        assert!(t.num_pus() >= 1);
        assert!(t.count(dvm_core::jobmap::Level::Core) >= 1, "{}", t.describe());
    }

    #[test]
    fn broken_documents_are_refused() {
        assert!(parse_xml("<topology").unwrap_err().starts_with("hwloc XML"));
        assert!(parse_xml("<topology version=\"2.0\"></topology>").unwrap_err().contains("no PUs"));
    }
}
