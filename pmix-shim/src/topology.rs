//! The node's hardware topology as hwloc XML, discovered by this process (hwloc 2, the library
//! libpmix itself is built against: Debian's `libhwloc-dev`, a dependency of `libpmix-dev`).
//!
//! What for: libpmix discovers the topology in `PMIx_server_init` unless it is given an XML file
//! (its MCA parameter `pmix_hwloc_topo_file`, [`TOPO_FILE_VAR`] in the environment before
//! `init`). Loading the XML costs a fraction of a discovery (measured ~3 ms against ~13 ms with
//! hwloc's plugins loaded, ~1 ms without them), so a host that keeps the XML of its machine (see
//! dvmd's topology cache) starts its servers faster.
//! Only the few hwloc calls needed are declared here; the topology handle never leaves this
//! module.

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void, CStr};

/// The environment variable through which libpmix takes a topology file instead of
/// discovering the topology (`PMIX_MCA_` + framework `pmix` + component `hwloc` + `topo_file`).
pub const TOPO_FILE_VAR: &str = "PMIX_MCA_pmix_hwloc_topo_file";

type Topology = *mut c_void;

/// `HWLOC_TYPE_FILTER_KEEP_IMPORTANT` (hwloc 2's `enum hwloc_type_filter_e`).
const KEEP_IMPORTANT: c_int = 3;

/// `HWLOC_TOPOLOGY_FLAG_IS_THISSYSTEM`.
const IS_THISSYSTEM: c_ulong = 1 << 1;

#[link(name = "hwloc")]
extern "C" {
    fn hwloc_get_api_version() -> c_uint;
    fn hwloc_topology_init(topology: *mut Topology) -> c_int;
    fn hwloc_topology_load(topology: Topology) -> c_int;
    fn hwloc_topology_set_io_types_filter(topology: Topology, filter: c_int) -> c_int;
    fn hwloc_topology_set_xml(topology: Topology, xmlpath: *const c_char) -> c_int;
    fn hwloc_topology_set_flags(topology: Topology, flags: c_ulong) -> c_int;
    fn hwloc_topology_set_synthetic(topology: Topology, description: *const c_char) -> c_int;
    fn hwloc_topology_destroy(topology: Topology);
    fn hwloc_topology_export_xmlbuffer(
        topology: Topology,
        xmlbuffer: *mut *mut c_char,
        buflen: *mut c_int,
        flags: c_ulong,
    ) -> c_int;
    fn hwloc_free_xmlbuffer(topology: Topology, xmlbuffer: *mut c_char);
}

/// A discovery that did not complete.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// An hwloc call returned an error.
    #[error("hwloc: {call} failed")]
    Hwloc { call: &'static str },
    /// The library is older than hwloc 2 (its XML is not what libpmix 4 loads).
    #[error("hwloc {0:#x} is older than 2.0")]
    TooOld(u32),
}

/// The runtime library's API version (hwloc's ABI level: `0x20800` for every 2.8 and 2.9 release).
pub fn hwloc_version() -> u32 {
    // SAFETY: no arguments, returns a constant.
    unsafe { hwloc_get_api_version() }
}

/// Discover this machine's topology (as this process sees it: its cgroup's CPUs and memory
/// nodes) and return it as hwloc v2 XML. I/O objects are kept as libpmix's own discovery keeps
/// them (the important PCI and OS devices, the bridges leading to them), so the ranks see the
/// same topology either way.
pub fn discover_xml() -> Result<String, TopologyError> {
    let version = hwloc_version();
    if version < 0x20000 {
        return Err(TopologyError::TooOld(version));
    }
    let mut topo: Topology = std::ptr::null_mut();
    // SAFETY: init writes a fresh handle into `topo`.
    if unsafe { hwloc_topology_init(&mut topo) } != 0 || topo.is_null() {
        return Err(TopologyError::Hwloc { call: "hwloc_topology_init" });
    }
    let out = export(topo);
    // SAFETY: `topo` came from a successful init and is not used afterwards.
    unsafe { hwloc_topology_destroy(topo) };
    out
}

/// hwloc's own topology for a synthetic description (`package:2 numa:2 core:8 pu:2`), as
/// XML: what tests compare a summary of synthetic hardware against.
pub fn synthetic_xml(description: &str) -> Result<String, TopologyError> {
    let c_desc = std::ffi::CString::new(description)
        .map_err(|_| TopologyError::Hwloc { call: "hwloc_topology_set_synthetic (a NUL in the description)" })?;
    let mut topo: Topology = std::ptr::null_mut();
    // SAFETY: init writes a fresh handle into `topo`.
    if unsafe { hwloc_topology_init(&mut topo) } != 0 || topo.is_null() {
        return Err(TopologyError::Hwloc { call: "hwloc_topology_init" });
    }
    // SAFETY: an initialised, not yet loaded handle and a NUL-terminated description.
    let out = if unsafe { hwloc_topology_set_synthetic(topo, c_desc.as_ptr()) } != 0 {
        Err(TopologyError::Hwloc { call: "hwloc_topology_set_synthetic" })
    } else {
        export(topo)
    };
    // SAFETY: `topo` came from a successful init and is not used afterwards.
    unsafe { hwloc_topology_destroy(topo) };
    out
}

/// Load `path` the way libpmix 4.2.2 loads its `pmix_hwloc_topo_file` (XML, this system's):
/// whether libpmix could start with it. hwloc's own parse is the only complete check of a file
/// (a document damaged in its middle still starts and ends like one).
pub fn load_xml_file(path: &std::path::Path) -> Result<(), TopologyError> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| TopologyError::Hwloc { call: "hwloc_topology_set_xml (a NUL in the path)" })?;
    let mut topo: Topology = std::ptr::null_mut();
    // SAFETY: init writes a fresh handle into `topo`.
    if unsafe { hwloc_topology_init(&mut topo) } != 0 || topo.is_null() {
        return Err(TopologyError::Hwloc { call: "hwloc_topology_init" });
    }
    // SAFETY: an initialised, not yet loaded handle and a NUL-terminated path that outlives
    // the calls.
    let out = unsafe {
        if hwloc_topology_set_xml(topo, c_path.as_ptr()) != 0 {
            Err(TopologyError::Hwloc { call: "hwloc_topology_set_xml" })
        } else if hwloc_topology_set_flags(topo, IS_THISSYSTEM) != 0 {
            Err(TopologyError::Hwloc { call: "hwloc_topology_set_flags" })
        } else if hwloc_topology_load(topo) != 0 {
            Err(TopologyError::Hwloc { call: "hwloc_topology_load" })
        } else {
            Ok(())
        }
    };
    // SAFETY: `topo` came from a successful init and is not used afterwards.
    unsafe { hwloc_topology_destroy(topo) };
    out
}

fn export(topo: Topology) -> Result<String, TopologyError> {
    // SAFETY: `topo` is an initialised, not yet loaded handle.
    if unsafe { hwloc_topology_set_io_types_filter(topo, KEEP_IMPORTANT) } != 0 {
        return Err(TopologyError::Hwloc { call: "hwloc_topology_set_io_types_filter" });
    }
    // SAFETY: `topo` is an initialised handle.
    if unsafe { hwloc_topology_load(topo) } != 0 {
        return Err(TopologyError::Hwloc { call: "hwloc_topology_load" });
    }
    let mut buf: *mut c_char = std::ptr::null_mut();
    let mut len: c_int = 0;
    // SAFETY: a loaded topology; hwloc allocates `buf` (NUL-terminated), freed below.
    if unsafe { hwloc_topology_export_xmlbuffer(topo, &mut buf, &mut len, 0) } != 0 || buf.is_null() {
        return Err(TopologyError::Hwloc { call: "hwloc_topology_export_xmlbuffer" });
    }
    // SAFETY: hwloc returned a NUL-terminated buffer.
    let xml = unsafe { CStr::from_ptr(buf) }.to_string_lossy().into_owned();
    // SAFETY: the buffer came from this topology's export.
    unsafe { hwloc_free_xmlbuffer(topo, buf) };
    Ok(xml)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovers_this_machine() {
        let xml = discover_xml().expect("hwloc discovery");
        assert!(xml.starts_with("<?xml"), "{}", &xml[..xml.len().min(200)]);
        assert!(xml.contains("<topology version=\"2."), "not hwloc v2 XML");
        assert!(xml.trim_end().ends_with("</topology>"));
        // Every machine has at least one processing unit.
        assert!(xml.contains("type=\"PU\""));
        assert!(hwloc_version() >= 0x20000);
    }

    #[test]
    fn loads_what_it_wrote_and_refuses_a_damaged_document() {
        let dir = std::env::temp_dir().join(format!("dvm-shim-topo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.xml");
        std::fs::write(&good, discover_xml().unwrap()).unwrap();
        let loaded = load_xml_file(&good);
        // Starts and ends like a topology, broken in the middle.
        let bad = dir.join("bad.xml");
        std::fs::write(
            &bad,
            "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n<object type=\"Bogus\"\n</topology>\n",
        )
        .unwrap();
        let refused = load_xml_file(&bad);
        let missing = load_xml_file(&dir.join("missing.xml"));
        std::fs::remove_dir_all(&dir).unwrap();
        loaded.expect("the discovered topology loads back");
        assert!(refused.is_err(), "a damaged document was loaded");
        assert!(missing.is_err(), "a missing file was loaded");
    }
}
