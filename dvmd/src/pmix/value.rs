//! PMIx values as they cross the worker socket and the DVM (`pmixworker.Value`): each keeps
//! its exact PMIx type, so a value published by one rank is looked up with the type it had
//! (Open MPI checks types). Values of a type with no wire form (topologies, nested arrays)
//! have none: the caller refuses them by name instead of passing something else. A proc and
//! an array of procs (event ranges, affected procs) travel as `procs`.

use dvm_proto::pmixworker as wire;
use pmix_shim::{Info, InfoValue, Rank};

use dvm_core::pmixdef::kind::*;

fn proc_to_wire(p: &pmix_shim::ProcId) -> wire::Proc {
    wire::Proc { nspace: p.nspace.clone(), rank: p.rank.to_raw() }
}

fn proc_from_wire(p: &wire::Proc) -> pmix_shim::ProcId {
    pmix_shim::ProcId::new(p.nspace.clone(), Rank::from_raw(p.rank))
}

/// The wire form of one info; None for a value with no wire form.
pub fn to_wire(info: &Info) -> Option<wire::Value> {
    let mut v = wire::Value { key: info.key.clone(), ..Default::default() };
    match &info.value {
        InfoValue::String(s) => (v.kind, v.str) = (STRING, s.clone()),
        InfoValue::Bytes(b) => (v.kind, v.bytes) = (BYTES, b.clone().into()),
        InfoValue::Bool(b) => (v.kind, v.flag) = (BOOL, *b),
        InfoValue::U8(x) => (v.kind, v.uint) = (U8, (*x).into()),
        InfoValue::U16(x) => (v.kind, v.uint) = (U16, (*x).into()),
        InfoValue::U32(x) => (v.kind, v.uint) = (U32, (*x).into()),
        InfoValue::U64(x) => (v.kind, v.uint) = (U64, *x),
        InfoValue::I32(x) => (v.kind, v.int) = (I32, (*x).into()),
        InfoValue::I64(x) => (v.kind, v.int) = (I64, *x),
        InfoValue::Size(x) => (v.kind, v.uint) = (SIZE, *x as u64),
        InfoValue::F64(x) => (v.kind, v.real) = (F64, *x),
        InfoValue::Status(x) => (v.kind, v.int) = (STATUS, (*x).into()),
        InfoValue::Rank(r) => (v.kind, v.uint) = (RANK, r.to_raw().into()),
        InfoValue::Proc(p) => (v.kind, v.procs) = (PROC, vec![proc_to_wire(p)]),
        InfoValue::Procs(ps) => (v.kind, v.procs) = (PROCS, ps.iter().map(proc_to_wire).collect()),
        InfoValue::Infos(_) | InfoValue::Unsupported(_) => return None,
    }
    Some(v)
}

/// Back to an info; None for an unknown kind or a value out of its type's range (from the
/// network: never trusted).
pub fn from_wire(v: &wire::Value) -> Option<Info> {
    let value = match v.kind {
        STRING => InfoValue::String(v.str.clone()),
        BYTES => InfoValue::Bytes(v.bytes.to_vec()),
        BOOL => InfoValue::Bool(v.flag),
        U8 => InfoValue::U8(u8::try_from(v.uint).ok()?),
        U16 => InfoValue::U16(u16::try_from(v.uint).ok()?),
        U32 => InfoValue::U32(u32::try_from(v.uint).ok()?),
        U64 => InfoValue::U64(v.uint),
        I32 => InfoValue::I32(i32::try_from(v.int).ok()?),
        I64 => InfoValue::I64(v.int),
        SIZE => InfoValue::Size(usize::try_from(v.uint).ok()?),
        F64 => InfoValue::F64(v.real),
        STATUS => InfoValue::Status(i32::try_from(v.int).ok()?),
        RANK => InfoValue::Rank(Rank::from_raw(u32::try_from(v.uint).ok()?)),
        PROC => match v.procs.as_slice() {
            [p] => InfoValue::Proc(proc_from_wire(p)),
            _ => return None,
        },
        PROCS => InfoValue::Procs(v.procs.iter().map(proc_from_wire).collect()),
        _ => return None,
    };
    Some(Info::new(v.key.clone(), value))
}

/// Every info with a wire form (the others are dropped: directives libpmix adds of types
/// the DVM never reads).
pub fn infos_to_wire(infos: &[Info]) -> Vec<wire::Value> {
    infos.iter().filter_map(to_wire).collect()
}

/// Every info, one with no wire form kept as its key with kind 0, so the node can refuse it by
/// name (a publish must not drop a value silently).
pub fn infos_to_wire_marked(infos: &[Info]) -> Vec<wire::Value> {
    infos
        .iter()
        .map(|i| to_wire(i).unwrap_or_else(|| wire::Value { key: i.key.clone(), ..Default::default() }))
        .collect()
}

/// Every value that decodes.
pub fn infos_from_wire(values: &[wire::Value]) -> Vec<Info> {
    values.iter().filter_map(from_wire).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmix_shim::ProcId;

    #[test]
    fn every_wire_type_round_trips() {
        let infos = vec![
            Info::new("s", InfoValue::String("port:1".into())),
            Info::new("b", InfoValue::Bytes(vec![0, 255])),
            Info::new("f", InfoValue::Bool(true)),
            Info::new("u8", InfoValue::U8(7)),
            Info::new("u16", InfoValue::U16(700)),
            Info::new("u32", InfoValue::U32(70_000)),
            Info::new("u64", InfoValue::U64(u64::MAX)),
            Info::new("i32", InfoValue::I32(-3)),
            Info::new("i64", InfoValue::I64(i64::MIN)),
            Info::new("sz", InfoValue::Size(12)),
            Info::new("d", InfoValue::F64(0.5)),
            Info::new("st", InfoValue::Status(-46)),
            Info::new("r", InfoValue::Rank(Rank::Wildcard)),
            Info::new("p", InfoValue::Proc(ProcId::new("ns", Rank::Id(3)))),
            Info::new("ps", InfoValue::Procs(vec![ProcId::new("a", Rank::Wildcard), ProcId::new("b", Rank::Id(0))])),
        ];
        let back: Vec<Info> = infos.iter().map(|i| from_wire(&to_wire(i).unwrap()).unwrap()).collect();
        assert_eq!(back, infos);
    }

    #[test]
    fn values_without_a_wire_form_are_refused() {
        assert!(to_wire(&Info::new("i", InfoValue::Infos(vec![]))).is_none());
        assert!(to_wire(&Info::new("t", InfoValue::Unsupported(40))).is_none());
        let bad = wire::Value { key: "x".into(), kind: U8, uint: 300, ..Default::default() };
        assert!(from_wire(&bad).is_none(), "a u8 out of range from the network");
        assert!(from_wire(&wire::Value { kind: 99, ..Default::default() }).is_none());
        assert!(from_wire(&wire::Value { kind: PROC, ..Default::default() }).is_none(), "a proc kind with no proc");
    }
}
