//! A node's hardware as placement sees it: PUs in logical order, each with the logical index
//! of its core, L3 cache, NUMA node and package. Each daemon sends its own at check-in (from
//! its hwloc discovery); tests build them from hwloc-style synthetic descriptions.
//!
//! Never: discovery (the shell parses hwloc's XML) or a decision.
//! Invariants: at least one PU; PU OS indices distinct; on every level the object indices are
//! dense (`0..count`, numbered in order of first appearance) so the objects of a level are
//! listed once each; a level the node lacks has count 0 (the node level always has 1).

use dvm_proto::job::HwObj;
use dvm_proto::rml::NodeTopo as WireTopo;

/// Most PUs a node may report: bounds what a check-in from the network may make us allocate.
pub const MAX_PUS: usize = 1 << 16;

/// A level of the hardware, finest first (`Ord` follows containment).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    Hwthread,
    Core,
    L3,
    Numa,
    Package,
    Node,
}

impl Level {
    pub const ALL: [Level; 6] = [Level::Hwthread, Level::Core, Level::L3, Level::Numa, Level::Package, Level::Node];

    /// The level of a wire object (`None` for `HW_OBJ_NONE` or an unknown value).
    pub fn from_wire(v: i32) -> Option<Level> {
        Some(match HwObj::try_from(v).ok()? {
            HwObj::None => return None,
            HwObj::Hwthread => Level::Hwthread,
            HwObj::Core => Level::Core,
            HwObj::L3 => Level::L3,
            HwObj::Numa => Level::Numa,
            HwObj::Package => Level::Package,
            HwObj::Node => Level::Node,
        })
    }

    pub fn wire(self) -> HwObj {
        match self {
            Level::Hwthread => HwObj::Hwthread,
            Level::Core => HwObj::Core,
            Level::L3 => HwObj::L3,
            Level::Numa => HwObj::Numa,
            Level::Package => HwObj::Package,
            Level::Node => HwObj::Node,
        }
    }

    /// The name mpirun users type (`--map-by`, `--bind-to`).
    pub fn name(self) -> &'static str {
        match self {
            Level::Hwthread => "hwthread",
            Level::Core => "core",
            Level::L3 => "l3cache",
            Level::Numa => "numa",
            Level::Package => "package",
            Level::Node => "node",
        }
    }

    /// Parse a name as mpirun, PRRTE and hwloc spell it (any case; `socket` = package).
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s.to_ascii_lowercase().as_str() {
            "hwthread" | "pu" | "hwt" => Level::Hwthread,
            "core" => Level::Core,
            "l3cache" | "l3" => Level::L3,
            "numa" | "numanode" => Level::Numa,
            "package" | "socket" => Level::Package,
            "node" | "board" | "machine" => Level::Node,
            _ => return None,
        })
    }
}

/// One node's hardware summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTopo {
    /// The machine this node runs on (a hash of its boot id; 0: unknown). Fake nodes of one
    /// machine (namespaces, containers, `--local`) share it.
    pub machine: u64,
    pu_os: Vec<u32>,
    /// Per level below the node (hwthread, core, l3, numa, package): each PU's object index,
    /// or empty when the node lacks the level.
    index: [Vec<u32>; 5],
    count: [u32; 5],
}

fn slot(level: Level) -> Option<usize> {
    match level {
        Level::Node => None,
        l => Some(l as usize),
    }
}

/// Renumber `v` densely in order of first appearance; the number of distinct values.
fn dense(v: &mut [u32]) -> u32 {
    let mut map = std::collections::HashMap::new();
    for x in v.iter_mut() {
        let next = map.len() as u32;
        *x = *map.entry(*x).or_insert(next);
    }
    map.len() as u32
}

impl NodeTopo {
    /// From per-PU columns (`core`, `l3`, `numa`, `package` each empty or one entry per PU).
    pub fn new(
        pu_os: Vec<u32>,
        core: Vec<u32>,
        l3: Vec<u32>,
        numa: Vec<u32>,
        package: Vec<u32>,
    ) -> Result<NodeTopo, String> {
        let n = pu_os.len();
        if n == 0 {
            return Err("no PUs".into());
        }
        if n > MAX_PUS {
            return Err(format!("{n} PUs, more than the {MAX_PUS} a node may have"));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = pu_os.iter().find(|&&os| !seen.insert(os)) {
            return Err(format!("PU {dup} is listed twice"));
        }
        let mut index = [(0..n as u32).collect(), core, l3, numa, package];
        let mut count = [n as u32, 0, 0, 0, 0];
        for (i, (col, name)) in index.iter_mut().zip(["hwthread", "core", "l3", "numa", "package"]).enumerate() {
            if col.is_empty() {
                continue;
            }
            if col.len() != n {
                return Err(format!("{} {name} indices for {n} PUs", col.len()));
            }
            count[i] = dense(col);
        }
        Ok(NodeTopo { machine: 0, pu_os, index, count })
    }

    pub fn from_wire(w: &WireTopo) -> Result<NodeTopo, String> {
        let t = NodeTopo::new(w.pu_os.clone(), w.core.clone(), w.l3.clone(), w.numa.clone(), w.package.clone())?;
        Ok(NodeTopo { machine: w.machine, ..t })
    }

    pub fn to_wire(&self) -> WireTopo {
        WireTopo {
            pu_os: self.pu_os.clone(),
            core: self.index[1].clone(),
            l3: self.index[2].clone(),
            numa: self.index[3].clone(),
            package: self.index[4].clone(),
            machine: self.machine,
        }
    }

    /// A topology from an hwloc synthetic description, `package:2 numa:2 core:8 pu:2`: each
    /// `type:count` splits every object of the level above. Types: package|socket, numa,
    /// l3|l3cache, core, pu|hwthread; `group`, `l2`, `l1` (and their `cache` forms) divide
    /// without being kept. PUs get OS indices in logical order. Without `pu:` a core has one;
    /// without `numa:` the machine has one NUMA node, as hwloc gives it.
    pub fn synthetic(desc: &str) -> Result<NodeTopo, String> {
        let mut levels: Vec<(Option<Level>, u32)> = Vec::new();
        for tok in desc.split_whitespace() {
            let (name, n) = tok.split_once(':').ok_or_else(|| format!("'{tok}': expected TYPE:COUNT"))?;
            let n: u32 = n
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("'{tok}': COUNT must be a positive integer"))?;
            let lower = name.to_ascii_lowercase();
            let level = match lower.as_str() {
                "group" | "l2" | "l2cache" | "l1" | "l1cache" | "l1d" => None,
                "node" | "machine" => return Err(format!("'{tok}': a synthetic description starts below the machine")),
                other => Some(Level::parse(other).ok_or_else(|| format!("'{tok}': unknown type '{name}'"))?),
            };
            levels.push((level, n));
        }
        if !levels.iter().any(|(l, _)| *l == Some(Level::Hwthread)) {
            levels.push((Some(Level::Hwthread), 1));
        }
        let total: u64 = levels.iter().map(|&(_, n)| n as u64).product();
        if total as usize > MAX_PUS {
            return Err(format!("{total} PUs, more than {MAX_PUS}"));
        }
        let n = total as u32;
        // PU p's object at a level: p divided by the PUs under one object of that level.
        let mut cols: [Vec<u32>; 5] = Default::default();
        let mut below = total;
        for &(level, k) in &levels {
            below /= k as u64;
            if let Some(l) = level.and_then(slot).filter(|&s| s > 0) {
                cols[l] = (0..n).map(|p| (p as u64 / below) as u32).collect();
            }
        }
        let [_, core, l3, numa, package] = cols;
        let core = if core.is_empty() { (0..n).collect() } else { core };
        // hwloc always has a NUMA node: without one in the description, the machine's.
        let numa = if numa.is_empty() { vec![0; n as usize] } else { numa };
        NodeTopo::new((0..n).collect(), core, l3, numa, package)
    }

    pub fn num_pus(&self) -> u32 {
        self.pu_os.len() as u32
    }

    /// Objects of `level` on this node (0 when it lacks the level; 1 node).
    pub fn count(&self, level: Level) -> u32 {
        slot(level).map_or(1, |s| self.count[s])
    }

    /// The index of PU `pu` (a logical position) at `level`; `None` when the node lacks it.
    pub fn object_of(&self, pu: u32, level: Level) -> Option<u32> {
        match slot(level) {
            None => Some(0),
            Some(s) => self.index[s].get(pu as usize).copied(),
        }
    }

    /// The PUs (logical positions) of object `idx` at `level`, in order.
    pub fn pus_of(&self, level: Level, idx: u32) -> Vec<u32> {
        (0..self.num_pus()).filter(|&p| self.object_of(p, level) == Some(idx)).collect()
    }

    /// The OS index of PU `pu`.
    pub fn os_index(&self, pu: u32) -> u32 {
        self.pu_os[pu as usize]
    }

    /// The objects of `inner` that hold PUs of object `idx` at `outer`, in order.
    pub fn objects_within(&self, outer: Level, idx: u32, inner: Level) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        for p in self.pus_of(outer, idx) {
            if let Some(o) = self.object_of(p, inner) {
                if !out.contains(&o) {
                    out.push(o);
                }
            }
        }
        out
    }

    /// `SK0:L30:CR0-1:HT0-3:NM0:`-style locality of a set of PUs (logical positions): for each
    /// level the objects it touches, as PMIx's `PMIX_LOCALITY_STRING` spells them.
    pub fn locality_string(&self, pus: &[u32]) -> String {
        let mut s = String::new();
        for (tag, level) in [
            ("SK", Level::Package),
            ("L3", Level::L3),
            ("CR", Level::Core),
            ("HT", Level::Hwthread),
            ("NM", Level::Numa),
        ] {
            let mut objs: Vec<u32> = pus.iter().filter_map(|&p| self.object_of(p, level)).collect();
            objs.sort_unstable();
            objs.dedup();
            if !objs.is_empty() {
                s.push_str(tag);
                s.push_str(&list_text(&objs));
                s.push(':');
            }
        }
        s
    }

    /// The OS indices of `pus` (logical positions), sorted.
    pub fn os_set(&self, pus: &[u32]) -> Vec<u32> {
        let mut v: Vec<u32> = pus.iter().map(|&p| self.os_index(p)).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// `package:2 numa:... core:... pu:...`: what the node has, for messages.
    pub fn describe(&self) -> String {
        [Level::Package, Level::Numa, Level::L3, Level::Core, Level::Hwthread]
            .iter()
            .filter(|&&l| self.count(l) > 0)
            .map(|&l| format!("{} {}", self.count(l), l.name()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `0-3,8,10-11`: sorted numbers as a list (Linux's `Cpus_allowed_list` form).
pub fn list_text(sorted: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j == i {
            out.push_str(&sorted[i].to_string());
        } else {
            out.push_str(&format!("{}-{}", sorted[i], sorted[j]));
        }
        i = j + 1;
    }
    out
}

/// Parse `0-3,8` (a cpu list) into sorted, distinct numbers; `None` when malformed or larger
/// than [`MAX_PUS`] entries.
pub fn parse_list(s: &str) -> Option<Vec<u32>> {
    let mut v = Vec::new();
    for part in s.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?),
            None => {
                let a = part.trim().parse::<u32>().ok()?;
                (a, a)
            }
        };
        if b < a || (b - a) as usize >= MAX_PUS || v.len() + (b - a) as usize >= MAX_PUS {
            return None;
        }
        v.extend(a..=b);
    }
    v.sort_unstable();
    v.dedup();
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_levels_split_their_parents() {
        let t = NodeTopo::synthetic("package:2 numa:2 core:8 pu:2").unwrap();
        assert_eq!(t.num_pus(), 64);
        assert_eq!(t.count(Level::Package), 2);
        assert_eq!(t.count(Level::Numa), 4);
        assert_eq!(t.count(Level::Core), 32);
        assert_eq!(t.count(Level::L3), 0);
        assert_eq!(t.count(Level::Node), 1);
        assert_eq!(t.pus_of(Level::Core, 1), vec![2, 3]);
        assert_eq!(t.objects_within(Level::Package, 1, Level::Numa), vec![2, 3]);
        assert_eq!(t.locality_string(&[0, 1]), "SK0:CR0:HT0-1:NM0:");
        let flat = NodeTopo::synthetic("core:2").unwrap();
        assert_eq!((flat.num_pus(), flat.count(Level::Core), flat.count(Level::Package)), (2, 2, 0));
        assert_eq!(flat.count(Level::Numa), 1);
        assert!(NodeTopo::synthetic("package:0").unwrap_err().contains("positive"));
        assert!(NodeTopo::synthetic("die:2").unwrap_err().contains("unknown type 'die'"));
    }

    #[test]
    fn wire_form_is_checked_and_renumbered() {
        let t = NodeTopo::new(vec![4, 5, 6, 7], vec![9, 9, 3, 3], vec![], vec![0, 0, 0, 0], vec![7, 7, 7, 7]).unwrap();
        assert_eq!(t.count(Level::Core), 2);
        assert_eq!(t.object_of(2, Level::Core), Some(1));
        assert_eq!(NodeTopo::from_wire(&t.to_wire()).unwrap(), t);
        assert!(NodeTopo::new(vec![], vec![], vec![], vec![], vec![]).is_err());
        assert!(NodeTopo::new(vec![1, 1], vec![], vec![], vec![], vec![]).unwrap_err().contains("twice"));
        assert!(NodeTopo::new(vec![1, 2], vec![0], vec![], vec![], vec![]).unwrap_err().contains("1 core indices"));
    }

    #[test]
    fn cpu_lists_round_trip() {
        assert_eq!(list_text(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(parse_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_list("3-1"), None);
        assert_eq!(parse_list("a"), None);
        assert_eq!(parse_list("0-4000000000"), None);
    }
}
