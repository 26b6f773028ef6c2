//! Reading PMIx procs and values in their wire form (`dvm.pmixworker.Proc` / `Value`), as the
//! worker hands them over: a rank that is an id or a wildcard, a directive found by key, a
//! number or flag whatever integer type libpmix gave it.
//!
//! Never trusts a value: one of another kind reads as absent.

use std::fmt;

use dvm_proto::pmixworker as wire;

use crate::pmixdef::{kind, RANK_VALID, RANK_WILDCARD};
use crate::pmixops::Proc as ProcView;

/// A concrete rank of a proc name (None for the wildcard and libpmix's other reserved ranks).
pub fn rank_id(p: &wire::Proc) -> Option<u32> {
    (p.rank < RANK_VALID).then_some(p.rank)
}

/// `procs` as the core's rules take them (`crate::pmixops`): a rank, or all of them.
pub fn view(procs: &[wire::Proc]) -> Vec<ProcView<'_>> {
    procs.iter().map(|p| ProcView { nspace: &p.nspace, rank: rank_id(p) }).collect()
}

/// A proc name for people: `ns:3`, `ns:*`.
pub struct Shown<'a>(pub &'a wire::Proc);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (rank_id(self.0), self.0.rank) {
            (Some(r), _) => write!(f, "{}:{r}", self.0.nspace),
            (None, RANK_WILDCARD) => write!(f, "{}:*", self.0.nspace),
            (None, r) => write!(f, "{}:#{r:x}", self.0.nspace),
        }
    }
}

pub fn proc(nspace: impl Into<String>, rank: u32) -> wire::Proc {
    wire::Proc { nspace: nspace.into(), rank }
}

/// The first value under `key`.
pub fn find<'a>(values: &'a [wire::Value], key: &str) -> Option<&'a wire::Value> {
    values.iter().find(|v| v.key == key)
}

/// An integer value of any integer kind (a status too), as i64.
pub fn as_i64(v: &wire::Value) -> Option<i64> {
    match v.kind {
        kind::I32 | kind::I64 | kind::STATUS => Some(v.int),
        kind::U8 | kind::U16 | kind::U32 | kind::U64 | kind::SIZE => i64::try_from(v.uint).ok(),
        kind::BOOL => Some(i64::from(v.flag)),
        _ => None,
    }
}

pub fn as_str(v: &wire::Value) -> Option<&str> {
    (v.kind == kind::STRING).then_some(v.str.as_str())
}

/// A number under `key`.
pub fn num(values: &[wire::Value], key: &str) -> Option<i64> {
    find(values, key).and_then(as_i64)
}

/// A flag under `key`: a bool, or a non-zero number; absent is false.
pub fn flag(values: &[wire::Value], key: &str) -> bool {
    num(values, key).is_some_and(|n| n != 0)
}

pub fn string(key: &str, s: impl Into<String>) -> wire::Value {
    wire::Value { key: key.into(), kind: kind::STRING, str: s.into(), ..Default::default() }
}

pub fn size(key: &str, n: u64) -> wire::Value {
    wire::Value { key: key.into(), kind: kind::SIZE, uint: n, ..Default::default() }
}

pub fn u32_value(key: &str, n: u32) -> wire::Value {
    wire::Value { key: key.into(), kind: kind::U32, uint: n.into(), ..Default::default() }
}

pub fn bytes(key: &str, b: Vec<u8>) -> wire::Value {
    wire::Value { key: key.into(), kind: kind::BYTES, bytes: b.into(), ..Default::default() }
}

pub fn i32_value(key: &str, n: i32) -> wire::Value {
    wire::Value { key: key.into(), kind: kind::I32, int: n.into(), ..Default::default() }
}

pub fn proc_value(key: &str, p: wire::Proc) -> wire::Value {
    wire::Value { key: key.into(), kind: kind::PROC, procs: vec![p], ..Default::default() }
}

pub fn procs(key: &str, ps: Vec<wire::Proc>) -> wire::Value {
    wire::Value { key: key.into(), kind: kind::PROCS, procs: ps, ..Default::default() }
}

/// The procs of a proc or procs value.
pub fn as_procs(v: wire::Value) -> Vec<wire::Proc> {
    match v.kind {
        kind::PROC | kind::PROCS => v.procs,
        _ => Vec::new(),
    }
}
