//! Owned Rust copies of libpmix's proc names and info values, and the conversions in both
//! directions. Everything here copies: nothing keeps a pointer into libpmix's memory.

use std::ffi::{c_char, c_void, CStr, CString};

use crate::error::{check, PmixError, Status};
use crate::sys;

/// Size of `pmix_nspace_t`; libpmix reads all of it, so every nspace buffer is zero-padded.
pub const NSPACE_LEN: usize = 256;

/// A rank inside an nspace, or one of libpmix's special values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rank {
    /// A concrete rank.
    Id(u32),
    /// `PMIX_RANK_WILDCARD`: every rank of the nspace.
    Wildcard,
    /// Any other reserved value (`PMIX_RANK_UNDEF`, `PMIX_RANK_LOCAL_NODE`, ...), raw.
    Special(u32),
}

impl Rank {
    /// From libpmix's raw `pmix_rank_t` (as carried on the daemon's own wires).
    pub fn from_raw(r: u32) -> Rank {
        if r == sys::PMIX_RANK_WILDCARD {
            Rank::Wildcard
        } else if r >= sys::PMIX_RANK_VALID {
            Rank::Special(r)
        } else {
            Rank::Id(r)
        }
    }

    /// To libpmix's raw `pmix_rank_t`.
    pub fn to_raw(self) -> u32 {
        match self {
            Rank::Id(r) | Rank::Special(r) => r,
            Rank::Wildcard => sys::PMIX_RANK_WILDCARD,
        }
    }
}

/// A process name: nspace + rank.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcId {
    pub nspace: String,
    pub rank: Rank,
}

impl ProcId {
    pub fn new(nspace: impl Into<String>, rank: Rank) -> ProcId {
        ProcId { nspace: nspace.into(), rank }
    }

    /// Copies a `pmix_proc_t`.
    ///
    /// # Safety
    /// `p` must point to a valid `pmix_proc_t`.
    pub(crate) unsafe fn from_raw(p: *const sys::pmix_proc_t) -> ProcId {
        let p = &*p;
        ProcId { nspace: fixed_str(&p.nspace), rank: Rank::from_raw(p.rank) }
    }

    /// Copies a C array of procs (`NULL`/0 gives an empty vector).
    ///
    /// # Safety
    /// `procs` must point to `n` valid `pmix_proc_t` or be NULL.
    pub(crate) unsafe fn from_raw_array(procs: *const sys::pmix_proc_t, n: usize) -> Vec<ProcId> {
        if procs.is_null() {
            return Vec::new();
        }
        (0..n).map(|i| ProcId::from_raw(procs.add(i))).collect()
    }

    /// A zero-padded `pmix_proc_t`.
    pub(crate) fn to_raw(&self, op: &'static str) -> Result<sys::pmix_proc_t, PmixError> {
        Ok(sys::pmix_proc_t { nspace: nspace_buf(op, &self.nspace)?, rank: self.rank.to_raw() })
    }
}

impl std::fmt::Display for ProcId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rank {
            Rank::Id(r) => write!(f, "{}:{}", self.nspace, r),
            Rank::Wildcard => write!(f, "{}:*", self.nspace),
            Rank::Special(r) => write!(f, "{}:#{:x}", self.nspace, r),
        }
    }
}

/// A zero-padded `pmix_nspace_t` holding `nspace` (at most 255 bytes, no NUL).
pub fn nspace_buf(op: &'static str, nspace: &str) -> Result<sys::pmix_nspace_t, PmixError> {
    if nspace.is_empty() || nspace.len() >= NSPACE_LEN || nspace.as_bytes().contains(&0) {
        return Err(PmixError::InvalidArgument {
            op,
            detail: format!("nspace {nspace:?} must be 1..=255 bytes without NUL"),
        });
    }
    let mut buf = [0 as c_char; NSPACE_LEN];
    for (d, s) in buf.iter_mut().zip(nspace.as_bytes()) {
        *d = *s as c_char;
    }
    Ok(buf)
}

/// Reads a NUL-terminated string out of a fixed-size char array (never past its end).
pub(crate) fn fixed_str(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

pub(crate) fn cstring(op: &'static str, what: &str, s: &str) -> Result<CString, PmixError> {
    CString::new(s).map_err(|_| PmixError::InvalidArgument { op, detail: format!("{what} {s:?} contains NUL") })
}

/// An owned copy of a `pmix_value_t`. Outgoing values are loaded with the exact PMIx type of
/// the variant (Open MPI checks types: job size is `U32`, not `U64`).
#[derive(Debug, Clone, PartialEq)]
pub enum InfoValue {
    Bool(bool),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    I32(i32),
    I64(i64),
    Size(usize),
    F64(f64),
    String(String),
    Bytes(Vec<u8>),
    Status(Status),
    Rank(Rank),
    Proc(ProcId),
    /// A `PMIX_DATA_ARRAY` of `PMIX_INFO` (e.g. `PMIX_PROC_DATA`, `PMIX_APP_INFO`), deep-copied.
    Infos(Vec<Info>),
    /// A `PMIX_DATA_ARRAY` of `PMIX_PROC` (e.g. `PMIX_EVENT_CUSTOM_RANGE`,
    /// `PMIX_EVENT_AFFECTED_PROCS`), copied.
    Procs(Vec<ProcId>),
    /// A value of a type this crate does not copy (data arrays, topologies, ...): its type code.
    Unsupported(u16),
}

impl InfoValue {
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            InfoValue::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// Any integer-valued variant widened to i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            InfoValue::U8(v) => Some(v.into()),
            InfoValue::U16(v) => Some(v.into()),
            InfoValue::U32(v) => Some(v.into()),
            InfoValue::U64(v) => i64::try_from(v).ok(),
            InfoValue::I32(v) | InfoValue::Status(v) => Some(v.into()),
            InfoValue::I64(v) => Some(v),
            InfoValue::Size(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            InfoValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// Copies a `pmix_value_t`.
    ///
    /// # Safety
    /// `v` must be a valid, initialized `pmix_value_t` whose pointers (if any) are valid.
    pub(crate) unsafe fn from_raw(v: &sys::pmix_value_t) -> InfoValue {
        let d = &v.data;
        match u32::from(v.type_) {
            sys::PMIX_BOOL => InfoValue::Bool(d.flag),
            sys::PMIX_BYTE | sys::PMIX_UINT8 | sys::PMIX_PROC_STATE => InfoValue::U8(d.uint8),
            // pmix_data_range_t and pmix_persistence_t are uint8_t.
            sys::PMIX_DATA_RANGE => InfoValue::U8(d.range),
            sys::PMIX_PERSIST => InfoValue::U8(d.persist),
            sys::PMIX_UINT16 => InfoValue::U16(d.uint16),
            sys::PMIX_UINT32 | sys::PMIX_UINT => InfoValue::U32(d.uint32),
            sys::PMIX_UINT64 => InfoValue::U64(d.uint64),
            sys::PMIX_INT8 => InfoValue::I32(d.int8.into()),
            sys::PMIX_INT16 => InfoValue::I32(d.int16.into()),
            sys::PMIX_INT32 | sys::PMIX_INT | sys::PMIX_PID => InfoValue::I32(d.int32),
            sys::PMIX_INT64 | sys::PMIX_TIME => InfoValue::I64(d.int64),
            sys::PMIX_SIZE => InfoValue::Size(d.size),
            sys::PMIX_FLOAT => InfoValue::F64(d.fval.into()),
            sys::PMIX_DOUBLE => InfoValue::F64(d.dval),
            sys::PMIX_STATUS => InfoValue::Status(d.status),
            sys::PMIX_PROC_RANK => InfoValue::Rank(Rank::from_raw(d.rank)),
            sys::PMIX_STRING => {
                if d.string.is_null() {
                    InfoValue::String(String::new())
                } else {
                    InfoValue::String(CStr::from_ptr(d.string).to_string_lossy().into_owned())
                }
            }
            sys::PMIX_BYTE_OBJECT | sys::PMIX_REGEX => {
                let bo = d.bo;
                if bo.bytes.is_null() || bo.size == 0 {
                    InfoValue::Bytes(Vec::new())
                } else {
                    InfoValue::Bytes(std::slice::from_raw_parts(bo.bytes as *const u8, bo.size).to_vec())
                }
            }
            sys::PMIX_PROC => {
                if d.proc_.is_null() {
                    InfoValue::Unsupported(v.type_)
                } else {
                    InfoValue::Proc(ProcId::from_raw(d.proc_))
                }
            }
            sys::PMIX_DATA_ARRAY => {
                let da = d.darray;
                if !da.is_null() && u32::from((*da).type_) == sys::PMIX_INFO {
                    InfoValue::Infos(Info::from_raw_array((*da).array as *const sys::pmix_info_t, (*da).size))
                } else if !da.is_null() && u32::from((*da).type_) == sys::PMIX_PROC {
                    InfoValue::Procs(ProcId::from_raw_array((*da).array as *const sys::pmix_proc_t, (*da).size))
                } else {
                    InfoValue::Unsupported(v.type_)
                }
            }
            _ => InfoValue::Unsupported(v.type_),
        }
    }
}

/// One owned `pmix_info_t`: key and value (directive flags are not kept).
#[derive(Debug, Clone, PartialEq)]
pub struct Info {
    pub key: String,
    pub value: InfoValue,
}

impl Info {
    pub fn new(key: impl Into<String>, value: InfoValue) -> Info {
        Info { key: key.into(), value }
    }

    /// Copies a C info array (`NULL`/0 gives an empty vector).
    ///
    /// # Safety
    /// `info` must point to `n` valid `pmix_info_t` or be NULL.
    pub(crate) unsafe fn from_raw_array(info: *const sys::pmix_info_t, n: usize) -> Vec<Info> {
        if info.is_null() {
            return Vec::new();
        }
        (0..n)
            .map(|i| {
                let it = &*info.add(i);
                Info { key: fixed_str(&it.key), value: InfoValue::from_raw(&it.value) }
            })
            .collect()
    }
}

/// The value of the first info whose key is `key` (a libpmix key constant such as
/// `sys::PMIX_COLLECT_DATA`, with or without its trailing NUL, or a plain string).
pub fn find_info(info: &[Info], key: impl AsRef<[u8]>) -> Option<&InfoValue> {
    let k = key.as_ref();
    let k = k.strip_suffix(&[0]).unwrap_or(k);
    info.iter().find(|i| i.key.as_bytes() == k).map(|i| &i.value)
}

/// A key constant from the bindings (`b"pmix.nmap\0"`) as a `&str`.
pub fn key_str(key: &'static [u8]) -> &'static str {
    let k = key.strip_suffix(&[0]).unwrap_or(key);
    std::str::from_utf8(k).expect("PMIx key constants are ASCII")
}

/// Copies a NULL-terminated C array of strings (NULL gives an empty vector).
///
/// # Safety
/// `argv` must be NULL or point to a NULL-terminated array of valid C strings.
pub(crate) unsafe fn argv_from_raw(argv: *const *mut c_char) -> Vec<String> {
    let mut out = Vec::new();
    if argv.is_null() {
        return out;
    }
    let mut i = 0;
    loop {
        let s = *argv.add(i);
        if s.is_null() {
            return out;
        }
        out.push(CStr::from_ptr(s).to_string_lossy().into_owned());
        i += 1;
    }
}

/// An owned C array of `pmix_info_t`, loaded through `PMIx_Info_load` (which deep-copies)
/// and destructed on drop. Must outlive any libpmix call that reads it asynchronously.
pub(crate) struct InfoArray {
    items: Vec<sys::pmix_info_t>,
}

// SAFETY: the array and everything it points to is owned by this value; libpmix only reads it.
unsafe impl Send for InfoArray {}

impl InfoArray {
    pub(crate) fn new() -> InfoArray {
        InfoArray { items: Vec::new() }
    }

    pub(crate) fn push(&mut self, op: &'static str, key: &str, value: &InfoValue) -> Result<(), PmixError> {
        if key.len() >= 512 {
            return Err(PmixError::InvalidArgument { op, detail: format!("info key {key:?} longer than 511 bytes") });
        }
        let ckey = cstring(op, "info key", key)?;
        // SAFETY: pmix_info_t is plain data; all-zero is its "empty" state (PMIX_INFO_CONSTRUCT).
        let mut info: sys::pmix_info_t = unsafe { std::mem::zeroed() };
        let rc = load(op, &mut info, &ckey, value);
        match rc {
            Ok(()) => {
                self.items.push(info);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut sys::pmix_info_t {
        if self.items.is_empty() {
            std::ptr::null_mut()
        } else {
            self.items.as_mut_ptr()
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// The loaded items (their values stay owned by this array).
    pub(crate) fn items(&self) -> &[sys::pmix_info_t] {
        &self.items
    }
}

impl Drop for InfoArray {
    fn drop(&mut self) {
        for it in &mut self.items {
            // SAFETY: each value was loaded by PMIx_Info_load and is destructed exactly once.
            unsafe { sys::PMIx_Value_destruct(&mut it.value) };
        }
    }
}

fn load(op: &'static str, info: &mut sys::pmix_info_t, key: &CStr, value: &InfoValue) -> Result<(), PmixError> {
    fn ld<T>(info: &mut sys::pmix_info_t, key: &CStr, v: &T, t: u32) -> Status {
        // SAFETY: `v` points to a value of the C type matching `t`; PMIx_Info_load copies it.
        unsafe { sys::PMIx_Info_load(info, key.as_ptr(), v as *const T as *const c_void, t as u16) }
    }
    let rc = match value {
        InfoValue::Bool(v) => ld(info, key, v, sys::PMIX_BOOL),
        InfoValue::U8(v) => ld(info, key, v, sys::PMIX_UINT8),
        InfoValue::U16(v) => ld(info, key, v, sys::PMIX_UINT16),
        InfoValue::U32(v) => ld(info, key, v, sys::PMIX_UINT32),
        InfoValue::U64(v) => ld(info, key, v, sys::PMIX_UINT64),
        InfoValue::I32(v) => ld(info, key, v, sys::PMIX_INT32),
        InfoValue::I64(v) => ld(info, key, v, sys::PMIX_INT64),
        InfoValue::Size(v) => ld(info, key, v, sys::PMIX_SIZE),
        InfoValue::F64(v) => ld(info, key, v, sys::PMIX_DOUBLE),
        InfoValue::Status(v) => ld(info, key, v, sys::PMIX_STATUS),
        InfoValue::Rank(r) => ld(info, key, &r.to_raw(), sys::PMIX_PROC_RANK),
        InfoValue::String(s) => {
            let c = cstring(op, "info string value", s)?;
            // SAFETY: for PMIX_STRING the data argument is the char* itself; it is strdup'ed.
            unsafe { sys::PMIx_Info_load(info, key.as_ptr(), c.as_ptr() as *const c_void, sys::PMIX_STRING as u16) }
        }
        InfoValue::Bytes(b) => {
            let bo = sys::pmix_byte_object_t { bytes: b.as_ptr() as *mut c_char, size: b.len() };
            ld(info, key, &bo, sys::PMIX_BYTE_OBJECT)
        }
        InfoValue::Proc(p) => {
            let raw = p.to_raw(op)?;
            ld(info, key, &raw, sys::PMIX_PROC)
        }
        InfoValue::Infos(inner) => {
            let mut arr = InfoArray::new();
            for i in inner {
                arr.push(op, &i.key, &i.value)?;
            }
            let da = sys::pmix_data_array_t {
                type_: sys::PMIX_INFO as u16,
                size: arr.len(),
                array: arr.as_mut_ptr() as *mut c_void,
            };
            // PMIx_Info_load deep-copies the array; `arr` is destructed afterwards.
            ld(info, key, &da, sys::PMIX_DATA_ARRAY)
        }
        InfoValue::Procs(procs) => {
            let mut raw = procs.iter().map(|p| p.to_raw(op)).collect::<Result<Vec<_>, _>>()?;
            let da = sys::pmix_data_array_t {
                type_: sys::PMIX_PROC as u16,
                size: raw.len(),
                array: if raw.is_empty() { std::ptr::null_mut() } else { raw.as_mut_ptr() as *mut c_void },
            };
            // PMIx_Info_load copies the procs; `raw` is dropped afterwards.
            ld(info, key, &da, sys::PMIX_DATA_ARRAY)
        }
        InfoValue::Unsupported(t) => {
            return Err(PmixError::InvalidArgument { op, detail: format!("cannot send a value of PMIx type {t}") })
        }
    };
    check(op, rc)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant survives libpmix's own loader (PMIx_Info_load deep copy) and our reader;
    /// the nested array is read after its temporary source was destructed.
    #[test]
    fn values_round_trip_through_libpmix() {
        let infos = vec![
            Info::new("k.bool", InfoValue::Bool(true)),
            Info::new("k.u8", InfoValue::U8(7)),
            Info::new("k.u16", InfoValue::U16(65000)),
            Info::new("k.u32", InfoValue::U32(4_000_000_000)),
            Info::new("k.u64", InfoValue::U64(u64::MAX - 1)),
            Info::new("k.i32", InfoValue::I32(-5)),
            Info::new("k.i64", InfoValue::I64(-(1 << 40))),
            Info::new("k.size", InfoValue::Size(12345)),
            Info::new("k.f64", InfoValue::F64(0.25)),
            Info::new("k.str", InfoValue::String("hello world".into())),
            Info::new("k.bytes", InfoValue::Bytes(vec![0, 1, 2, 255])),
            Info::new("k.status", InfoValue::Status(-52)),
            Info::new("k.rank", InfoValue::Rank(Rank::Id(3))),
            Info::new("k.wild", InfoValue::Rank(Rank::Wildcard)),
            Info::new("k.proc", InfoValue::Proc(ProcId::new("ns-x", Rank::Id(9)))),
            Info::new(
                "k.infos",
                InfoValue::Infos(vec![
                    Info::new("pmix.rank", InfoValue::Rank(Rank::Id(1))),
                    Info::new("pmix.hname", InfoValue::String("node1".into())),
                ]),
            ),
            Info::new(
                "k.procs",
                InfoValue::Procs(vec![ProcId::new("ns-a", Rank::Wildcard), ProcId::new("ns-b", Rank::Id(4))]),
            ),
        ];
        let mut arr = InfoArray::new();
        for i in &infos {
            arr.push("test", &i.key, &i.value).unwrap();
        }
        // SAFETY: arr holds arr.len() loaded infos.
        let back = unsafe { Info::from_raw_array(arr.as_mut_ptr(), arr.len()) };
        assert_eq!(back, infos);
    }

    #[test]
    fn nspace_is_zero_padded_and_bounded() {
        let b = nspace_buf("t", "abc").unwrap();
        assert_eq!(&b[..4], &[b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
        assert!(b[3..].iter().all(|c| *c == 0));
        assert!(nspace_buf("t", &"x".repeat(255)).is_ok());
        assert!(nspace_buf("t", &"x".repeat(256)).is_err());
        assert!(nspace_buf("t", "").is_err());
        assert!(nspace_buf("t", "a\0b").is_err());
    }
}
