//! The placement options as mpirun users type them: `--map-by`, `--rank-by`, `--bind-to`
//! values with their qualifiers. Each refusal is one sentence naming the part that was wrong.

use dvm_core::jobmap::Level;
use dvm_proto::job::{BindTo, HwObj, JobSpec, MapBy, RankBy};

use super::options::{positive, Kind};

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

/// `slot|node|OBJ[:span|:fill]` (any case): the policy, its object, and whether ranks are
/// dealt over the objects of all nodes (`:span`) instead of node by node (`:fill`, the default).
pub(super) fn parse_rank_by(value: &str) -> Result<(RankBy, HwObj, bool), String> {
    let lower = value.to_ascii_lowercase();
    let mut parts = lower.split(':');
    let first = parts.next().unwrap_or_default();
    let mut span = false;
    for q in parts {
        match q {
            "span" => span = true,
            "fill" => span = false,
            _ => return Err(format!("unknown qualifier '{q}' (expected :span or :fill)")),
        }
    }
    match first {
        "slot" | "fill" => Ok((RankBy::Slot, HwObj::None, false)),
        "node" => Ok((RankBy::Node, HwObj::None, false)),
        o => match object(o) {
            Some(obj) => Ok((RankBy::Obj, obj, span)),
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

/// Why a placement option was refused (the parser words it).
pub(super) enum PlaceError {
    /// The value's problem.
    Bad(String),
    Twice,
    /// (first given, second given).
    Conflict(String, String),
}

/// The placement options of a job, each with the spelling it was given with.
#[derive(Default)]
pub(super) struct Placement {
    map_by: Option<(String, MapSpec)>,
    pub per_node: Option<(String, u32)>,
    rank_by: Option<(String, (RankBy, HwObj, bool))>,
    bind_to: Option<(String, BindSpec)>,
    cpus_per_rank: Option<(String, u32)>,
    use_hwthread_cpus: bool,
    pub rankfile: Option<(String, std::path::PathBuf, Vec<dvm_proto::job::RankfileEntry>)>,
}

fn once<T>(slot: &mut Option<T>, value: T) -> Result<(), PlaceError> {
    match slot {
        Some(_) => Err(PlaceError::Twice),
        None => {
            *slot = Some(value);
            Ok(())
        }
    }
}

impl Placement {
    /// Take `-N`, `--map-by`, `--rank-by`, `--bind-to`, `--cpus-per-rank` or
    /// `--use-hwthread-cpus`; true when it asks to oversubscribe.
    pub(super) fn apply(&mut self, kind: Kind, opt: &str, value: &str) -> Result<bool, PlaceError> {
        let conflict = |first: &str, second: String| PlaceError::Conflict(first.to_string(), second);
        match kind {
            Kind::PerNode => {
                let n = positive(value).ok_or_else(|| PlaceError::Bad("not a positive integer".into()))?;
                if let Some((first, _)) = &self.map_by {
                    return Err(conflict(first, opt.to_string()));
                }
                once(&mut self.per_node, (opt.to_string(), n))?;
            }
            Kind::MapBy => {
                let m = parse_map_by(value).map_err(PlaceError::Bad)?;
                if let Some((first, _)) = &self.per_node {
                    return Err(conflict(first, opt.to_string()));
                }
                if let (true, Some((first, _))) = (m.pe > 0, &self.cpus_per_rank) {
                    return Err(conflict(first, format!("{opt} ...:PE")));
                }
                self.use_hwthread_cpus |= m.hwt_cpus;
                let over = m.oversubscribe;
                once(&mut self.map_by, (opt.to_string(), m))?;
                return Ok(over);
            }
            Kind::RankBy => once(&mut self.rank_by, (opt.to_string(), parse_rank_by(value).map_err(PlaceError::Bad)?))?,
            Kind::BindTo => once(&mut self.bind_to, (opt.to_string(), parse_bind_to(value).map_err(PlaceError::Bad)?))?,
            Kind::CpusPerRank => {
                let n = positive(value).ok_or_else(|| PlaceError::Bad("not a positive integer".into()))?;
                if let Some((first, m)) = &self.map_by {
                    if m.pe > 0 {
                        return Err(conflict(&format!("{first} ...:PE"), opt.to_string()));
                    }
                }
                once(&mut self.cpus_per_rank, (opt.to_string(), n))?;
            }
            Kind::UseHwthreadCpus => self.use_hwthread_cpus = true,
            _ => unreachable!("not a placement option: {kind:?}"),
        }
        Ok(false)
    }

    /// `:nooversubscribe` was given.
    pub(super) fn no_oversubscribe(&self) -> bool {
        self.map_by.as_ref().is_some_and(|(_, m)| m.no_oversubscribe)
    }

    /// The placement fields of `spec`.
    pub(super) fn fill(self, spec: &mut JobSpec) {
        let (map_by, ppr, map_obj, pe, span) = match (&self.map_by, self.per_node) {
            (Some((_, m)), _) => (m.policy, m.ppr, m.obj, m.pe, m.span),
            (None, Some((_, n))) => (MapBy::Ppr, n, HwObj::None, 0, false),
            (None, None) => (MapBy::Slot, 0, HwObj::None, 0, false),
        };
        let (rank_by, rank_obj, rank_span) =
            self.rank_by.as_ref().map_or((RankBy::Default, HwObj::None, false), |(_, r)| *r);
        let bind = self.bind_to.as_ref().map(|(_, b)| *b);
        spec.map_by = map_by as i32;
        spec.ppr = ppr;
        spec.map_obj = map_obj as i32;
        spec.map_span = span;
        spec.cpus_per_rank = self.cpus_per_rank.as_ref().map_or(pe, |(_, n)| *n);
        spec.rank_by = rank_by as i32;
        spec.rank_obj = rank_obj as i32;
        spec.rank_span = rank_span;
        spec.bind_to = bind.map_or(BindTo::Default, |b| b.to) as i32;
        spec.bind_obj = bind.map_or(HwObj::None, |b| b.obj) as i32;
        spec.bind_overload_allowed = bind.is_some_and(|b| b.overload_allowed);
        spec.bind_if_supported = bind.is_some_and(|b| b.if_supported);
        spec.use_hwthread_cpus = self.use_hwthread_cpus;
        if let Some((_, path, entries)) = self.rankfile {
            spec.rankfile_name = path.display().to_string();
            spec.rankfile = entries;
        }
    }
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
        assert_eq!(parse_rank_by("Package"), Ok((RankBy::Obj, HwObj::Package, false)));
        assert_eq!(parse_rank_by("node"), Ok((RankBy::Node, HwObj::None, false)));
        assert_eq!(parse_rank_by("core:SPAN"), Ok((RankBy::Obj, HwObj::Core, true)));
        assert_eq!(parse_rank_by("numa:span:fill"), Ok((RankBy::Obj, HwObj::Numa, false)));
        assert_eq!(parse_rank_by("node:span"), Ok((RankBy::Node, HwObj::None, false)));
        assert_eq!(parse_rank_by("core:x").unwrap_err(), "unknown qualifier 'x' (expected :span or :fill)");
        let b = parse_bind_to("core:overload-allowed:if-supported").unwrap();
        assert_eq!((b.to, b.obj, b.overload_allowed, b.if_supported), (BindTo::Obj, HwObj::Core, true, true));
        assert_eq!(parse_bind_to("none").unwrap().to, BindTo::None);
        assert!(parse_bind_to("board").unwrap_err().starts_with("unknown object 'board'"));
        assert!(parse_bind_to("core:loose").unwrap_err().starts_with("unknown qualifier 'loose'"));
    }
}
