//! File staging: files from the HNP's node to every daemon (or a chosen few) as a stream of
//! broadcasts on tag [`crate::dtags::STAGE`], large segments taking scatter-allgather.
//!
//! Owns: the decisions of a transfer. At the HNP ([`origin`]): which segment is read next, how
//! many are in flight (a window, so no daemon holds more than a few whatever the file's size),
//! which targets verified and committed, and when the transfer fails (a target's error, a
//! target lost) and nothing of it may stay. On every daemon ([`sink`]): what to write, and what
//! to report to the HNP.
//! Never: a file, a hash or a path on disk. Reads, writes, checks, commits and removals leave
//! as [`StageIo`] for the shell, which answers each with [`StageDone`].
//! Invariants: a transfer is all or nothing. Files stay unnamed (or under a temporary name)
//! until every target verified every file; a failure discards them everywhere, including files
//! already committed. Segments arrive in op order, so each file is written front to back.
//! A failed transfer is answered, and a job's end is told, only once every live target
//! reported its files gone: whoever waits on either finds nothing of it left.

pub mod origin;
pub mod sink;

pub use dvm_proto::daemon::{StageDest, StageSegment};

/// Bytes per segment unless the request says otherwise. With [`WINDOW`]: smaller segments
/// in a deeper window fill the pipe sooner (docs/staging.md: 1 MiB × 8 against 4 MiB × 3,
/// 0.93× the time and less memory on 16 rate-limited nodes; 1.27× against 1.50× the model
/// at N = 256 in the simulator).
pub const DEFAULT_SEGMENT: u64 = 1 << 20;
/// Smallest and largest segment a request may ask for.
pub const MIN_SEGMENT: u64 = 64 << 10;
pub const MAX_SEGMENT: u64 = 64 << 20;
/// Segments started and not yet held by every daemon, unless the request says otherwise.
pub const WINDOW: usize = 8;
/// The most a request may ask for.
pub const MAX_WINDOW: usize = 64;
/// The most bytes a request may put in flight (window × segment): each daemon holds them.
pub const MAX_IN_FLIGHT: u64 = 256 << 20;

/// Disk work for the shell. Each is answered with [`StageDone`] (through
/// `Node::handle_stage`), in the order asked.
#[derive(Debug, Clone, PartialEq)]
pub enum StageIo {
    /// HNP: read `len` bytes of `path` from `offset`, hash them (and deflate them when
    /// `compress`); `last`: the file's last segment, which also carries the file's hash.
    Read { id: u64, file: u32, path: String, offset: u64, len: u64, last: bool, compress: bool },
    /// HNP: the transfer's reads are over (forget what was kept to hash its files).
    ReadEnd { id: u64 },
    /// A target: prepare to receive these files (destinations not yet expanded).
    Open { id: u64, files: Vec<StageDest>, uid: u32 },
    /// A target: check and write one segment.
    Write { id: u64, seg: StageSegment },
    /// A target: give every file of the transfer its name.
    Commit { id: u64 },
    /// A target, on its own failure: nothing of the transfer may stay (unnamed files dropped,
    /// named ones removed). Not answered.
    Discard { id: u64 },
    /// A target, at the HNP's discard or remove: as `Discard`, answered with
    /// [`StageDone::Removed`] once nothing of the transfer is left on this node.
    Remove { id: u64 },
    /// A target: the files stay where they are; forget the transfer.
    Keep { id: u64 },
}

/// The shell's answer to a [`StageIo`].
#[derive(Debug, Clone, PartialEq)]
pub enum StageDone {
    /// A segment was read (or could not be: the sentence names the path).
    Read { id: u64, result: Result<StageSegment, String> },
    /// A target's disk work finished; `Ok(true)` after a write: every file of the transfer is
    /// complete and verified.
    Sink { id: u64, result: Result<bool, String> },
    /// A target removed what it held of a transfer (`Err`: a path it could not remove).
    Removed { id: u64, result: Result<(), String> },
}

/// One file to stage, as the shell found it on the HNP's node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    pub src: String,
    pub dest: String,
    pub size: u64,
    pub mode: u32,
}

/// A transfer to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    pub files: Vec<SourceFile>,
    /// Only daemons on these hosts (empty: every live daemon).
    pub hosts: Vec<String>,
    pub compress: bool,
    /// Bytes per segment (0: [`DEFAULT_SEGMENT`]).
    pub segment: u64,
    /// Segments in flight (0: [`WINDOW`]).
    pub window: usize,
    /// The asking user (a target refuses destinations that user may not write).
    pub uid: u32,
}

/// Split `size` bytes into segments of `seg`: (offset, len, last) in order; an empty file is
/// one empty segment, so that every file ends with a `last`.
pub fn segments(size: u64, seg: u64) -> impl Iterator<Item = (u64, u64, bool)> {
    let seg = seg.max(1);
    let n = size.div_ceil(seg).max(1);
    (0..n).map(move |i| {
        let off = i * seg;
        let len = (size - off).min(seg);
        (off, len, i + 1 == n)
    })
}

#[cfg(test)]
mod tests;
