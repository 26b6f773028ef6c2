//! An in-memory disk for staging ([`crate::stage::StageIo`]): the HNP's sources, and on each
//! node the files being received, named, kept or removed. Answers at once, in order.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use dvm_rml::Rank;

use crate::stage::{StageDest, StageDone, StageIo, StageSegment};

#[derive(Debug, Default)]
pub struct SimDisk {
    /// Files on the HNP's node, by path.
    pub sources: BTreeMap<String, Bytes>,
    /// Files with their name on this node, by path.
    pub files: BTreeMap<String, Vec<u8>>,
    /// Destinations a write fails on (a full disk).
    pub full: BTreeSet<String>,
    /// Answers for the node, in order.
    pub answers: Vec<StageDone>,
    /// Transfers being received: each file's destination and bytes so far.
    incoming: BTreeMap<u64, Vec<(StageDest, Vec<u8>, u64)>>,
    /// Transfers named here: their paths.
    named: BTreeMap<u64, Vec<String>>,
    /// Bytes held unnamed at most (a bound on what a transfer costs a node's disk).
    pub peak_unnamed: usize,
    /// Count what arrives but keep none of it (projections of large files on many nodes).
    pub count_only: bool,
    /// Bytes received unnamed, per transfer (the same as the files' lengths unless `count_only`).
    unnamed: BTreeMap<u64, usize>,
}

impl SimDisk {
    pub fn apply(&mut self, me: Rank, io: StageIo) {
        let done = match io {
            StageIo::Read { id, file, path, offset, len, last, compress: _ } => {
                let result = match self.sources.get(&path) {
                    None => Err(format!("cannot read {path}: no such file")),
                    Some(b) if (offset + len) as usize > b.len() => Err(format!("{path} shrank while being read")),
                    Some(b) => {
                        let data = b.slice(offset as usize..(offset + len) as usize);
                        Ok(StageSegment { id, file, offset, data, last, ..Default::default() })
                    }
                };
                StageDone::Read { id, result }
            }
            StageIo::ReadEnd { .. } => return,
            StageIo::Open { id, files, uid: _ } => {
                let files = files
                    .into_iter()
                    .map(|mut d| {
                        d.path = d.path.replace("%n", &me.to_string());
                        (d, Vec::new(), 0)
                    })
                    .collect();
                self.incoming.insert(id, files);
                StageDone::Sink { id, result: Ok(false) }
            }
            StageIo::Write { id, seg } => StageDone::Sink { id, result: self.write(id, seg) },
            StageIo::Commit { id } => {
                let files = self.incoming.remove(&id).unwrap_or_default();
                self.unnamed.remove(&id);
                let mut paths = Vec::new();
                for (d, data, _) in files {
                    paths.push(d.path.clone());
                    self.files.insert(d.path, data);
                }
                self.named.insert(id, paths);
                StageDone::Sink { id, result: Ok(true) }
            }
            StageIo::Discard { id } => return self.discard(id),
            StageIo::Remove { id } => {
                self.discard(id);
                StageDone::Removed { id, result: Ok(()) }
            }
            StageIo::Keep { id } => {
                self.named.remove(&id);
                return;
            }
        };
        self.answers.push(done);
    }

    /// Whether any file, named or still being received, has a path `pred` accepts.
    pub fn holds(&self, pred: impl Fn(&str) -> bool) -> bool {
        self.files.keys().any(|p| pred(p)) || self.incoming.values().flatten().any(|(d, _, _)| pred(&d.path))
    }

    /// Transfers being received here (their files unnamed).
    pub fn receiving(&self) -> usize {
        self.incoming.len()
    }

    fn discard(&mut self, id: u64) {
        self.incoming.remove(&id);
        self.unnamed.remove(&id);
        for p in self.named.remove(&id).unwrap_or_default() {
            self.files.remove(&p);
        }
    }

    fn write(&mut self, id: u64, seg: StageSegment) -> Result<bool, String> {
        let files = self.incoming.get_mut(&id).ok_or("a segment of a transfer never opened")?;
        let n = files.len();
        let (d, data, len) = files.get_mut(seg.file as usize).ok_or("a segment of a file the transfer lacks")?;
        if self.full.contains(&d.path) {
            return Err(format!("cannot write {}: no space left on device", d.path));
        }
        if seg.offset != *len {
            return Err(format!("{}: a segment at {} after {} bytes", d.path, seg.offset, len));
        }
        if !self.count_only {
            data.extend_from_slice(&seg.data);
        }
        *len += seg.data.len() as u64;
        if seg.last && *len != d.size {
            return Err(format!("{}: {} bytes arrived, {} expected", d.path, len, d.size));
        }
        *self.unnamed.entry(id).or_default() += seg.data.len();
        let held: usize = self.unnamed.values().sum();
        self.peak_unnamed = self.peak_unnamed.max(held);
        Ok(seg.last && seg.file as usize + 1 == n)
    }
}
