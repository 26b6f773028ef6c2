//! The placement options as mpirun users type them: `--map-by`, `--rank-by`, `--bind-to`
//! values with their qualifiers. Each refusal is one sentence naming the part that was wrong.

use dvm_core::jobmap::Level;
use dvm_proto::job::{BindTo, HwObj, MapBy, RankBy};

use super::options::positive;

const OBJECTS: &str = "hwthread, core, l3cache, numa, package or socket";

/// A parsed `--map-by` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MapSpec {
    pub policy: MapBy,
    /// ppr's N.
    pub ppr: u32,
    /// The object of an object mapping or of ppr (`None`: node).
    pub obj: HwObj,
    /// `:PE=n` (0: not given).
    pub pe: u32,
    pub oversubscribe: bool,
    /// `:nooversubscribe`.
    pub no_oversubscribe: bool,
    pub span: bool,
    /// `:hwtcpus`.
    pub hwt_cpus: bool,
}

fn object(name: &str) -> Option<HwObj> {
    Level::parse(name).filter(|&l| l != Level::Node).map(Level::wire)
}

/// `slot|node|hwthread|core|l3cache|numa|package|socket|ppr:N:OBJ`, then any of
/// `:PE=n`, `:oversubscribe`, `:nooversubscribe`, `:span`, `:hwtcpus` (any case).
pub(super) fn parse_map_by(value: &str) -> Result<MapSpec, String> {
    let expected = || {
        format!("expected slot, node, {OBJECTS}, or ppr:N:OBJ, then :PE=n, :oversubscribe, :nooversubscribe or :span")
    };
    let parts: Vec<String> = value.split(':').map(|p| p.to_ascii_lowercase()).collect();
    let mut spec = MapSpec {
        policy: MapBy::Slot,
        ppr: 0,
        obj: HwObj::None,
        pe: 0,
        oversubscribe: false,
        no_oversubscribe: false,
        span: false,
        hwt_cpus: false,
    };
    let rest = match parts.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["ppr", n, obj, ..] => {
            spec.policy = MapBy::Ppr;
            spec.ppr = positive(n).ok_or_else(|| format!("N in ppr:{n}:{obj} must be a positive integer"))?;
            spec.obj = match obj {
                "node" => HwObj::None,
                o => object(o)
                    .ok_or_else(|| format!("unknown object '{o}' in ppr:{n}:{o} (expected node, {OBJECTS})"))?,
            };
            &parts[3..]
        }
        ["ppr", ..] => return Err("ppr needs a count and an object: ppr:N:OBJ".into()),
        ["slot", ..] => &parts[1..],
        ["node", ..] => {
            spec.policy = MapBy::Node;
            &parts[1..]
        }
        [first, ..] => match object(first) {
            Some(o) => {
                spec.policy = MapBy::Object;
                spec.obj = o;
                &parts[1..]
            }
            None => return Err(format!("unknown policy '{first}': {}", expected())),
        },
        [] => return Err(expected()),
    };
    for q in rest {
        match q.as_str() {
            "oversubscribe" => spec.oversubscribe = true,
            "nooversubscribe" => spec.no_oversubscribe = true,
            "span" => spec.span = true,
            "hwtcpus" => spec.hwt_cpus = true,
            q if q.starts_with("pe=") => {
                spec.pe = positive(&q[3..]).ok_or_else(|| format!("PE={} must be a positive integer", &q[3..]))?;
            }
            q => return Err(format!("unknown qualifier '{q}': {}", expected())),
        }
    }
    if spec.oversubscribe && spec.no_oversubscribe {
        return Err(":oversubscribe and :nooversubscribe contradict each other".into());
    }
    if spec.span && spec.policy != MapBy::Object {
        return Err(format!(":span spreads over objects: use it with --map-by {OBJECTS}"));
    }
    Ok(spec)
}

/// `slot|node|OBJ` (any case): the policy and its object.
pub(super) fn parse_rank_by(value: &str) -> Result<(RankBy, HwObj), String> {
    let lower = value.to_ascii_lowercase();
    let mut parts = lower.split(':');
    let first = parts.next().unwrap_or_default();
    if let Some(q) = parts.next() {
        return Err(format!(
            "unknown qualifier '{q}' (ranks are dealt within each node; expected slot, node or {OBJECTS})"
        ));
    }
    match first {
        "slot" | "fill" => Ok((RankBy::Slot, HwObj::None)),
        "node" => Ok((RankBy::Node, HwObj::None)),
        o => match object(o) {
            Some(obj) => Ok((RankBy::Obj, obj)),
            None => Err(format!("unknown policy '{o}' (expected slot, node or {OBJECTS})")),
        },
    }
}

/// A parsed `--bind-to` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct BindSpec {
    pub to: BindTo,
    pub obj: HwObj,
    pub overload_allowed: bool,
    pub if_supported: bool,
}

/// `none|hwthread|core|l3cache|numa|package|socket`, then `:overload-allowed` and/or
/// `:if-supported` (any case).
pub(super) fn parse_bind_to(value: &str) -> Result<BindSpec, String> {
    let lower = value.to_ascii_lowercase();
    let mut parts = lower.split(':');
    let first = parts.next().unwrap_or_default();
    let mut spec = match first {
        "none" => BindSpec { to: BindTo::None, obj: HwObj::None, overload_allowed: false, if_supported: false },
        o => match object(o) {
            Some(obj) => BindSpec { to: BindTo::Obj, obj, overload_allowed: false, if_supported: false },
            None => return Err(format!("unknown object '{o}' (expected none, {OBJECTS})")),
        },
    };
    for q in parts {
        match q {
            "overload-allowed" => spec.overload_allowed = true,
            "if-supported" => spec.if_supported = true,
            q => return Err(format!("unknown qualifier '{q}' (expected :overload-allowed or :if-supported)")),
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_by_values() {
        let m = parse_map_by("ppr:2:socket:PE=3:oversubscribe").unwrap();
        assert_eq!((m.policy, m.ppr, m.obj, m.pe, m.oversubscribe), (MapBy::Ppr, 2, HwObj::Package, 3, true));
        assert_eq!(parse_map_by("NUMA:span").unwrap().obj, HwObj::Numa);
        assert_eq!(parse_map_by("core").unwrap().policy, MapBy::Object);
        assert_eq!(parse_map_by("ppr:4:node").unwrap().obj, HwObj::None);
        for (bad, why) in [
            ("ppr:0:core", "N in ppr:0:core must be a positive integer"),
            ("ppr:2:blob", "unknown object 'blob' in ppr:2:blob"),
            ("core:PE=0", "PE=0 must be a positive integer"),
            ("diagonal", "unknown policy 'diagonal'"),
            ("core:sideways", "unknown qualifier 'sideways'"),
            ("node:span", ":span spreads over objects"),
            ("core:oversubscribe:nooversubscribe", ":oversubscribe and :nooversubscribe contradict"),
        ] {
            let e = parse_map_by(bad).unwrap_err();
            assert!(e.starts_with(why), "{bad}: {e}");
        }
    }

    #[test]
    fn rank_by_and_bind_to_values() {
        assert_eq!(parse_rank_by("Package"), Ok((RankBy::Obj, HwObj::Package)));
        assert_eq!(parse_rank_by("node"), Ok((RankBy::Node, HwObj::None)));
        assert!(parse_rank_by("core:span").unwrap_err().starts_with("unknown qualifier 'span'"));
        let b = parse_bind_to("core:overload-allowed:if-supported").unwrap();
        assert_eq!((b.to, b.obj, b.overload_allowed, b.if_supported), (BindTo::Obj, HwObj::Core, true, true));
        assert_eq!(parse_bind_to("none").unwrap().to, BindTo::None);
        assert!(parse_bind_to("board").unwrap_err().starts_with("unknown object 'board'"));
        assert!(parse_bind_to("core:loose").unwrap_err().starts_with("unknown qualifier 'loose'"));
    }
}
