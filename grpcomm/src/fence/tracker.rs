//! One fence in flight on one daemon: a slot per child subtree that holds a participant, plus
//! this daemon's own slot when it participates. Bookkeeping is O(radix); the only data held
//! is what the subtree contributed, and child data is released once merged and sent up.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use dvm_proto::grpcomm::FenceEntry;
use dvm_rml::topology::{Rank, Route, Topology};

use super::run::Run;
use super::types::{FenceError, Participants};

/// Allgather messages held for a fence this daemon has not started (one per sender and step;
/// a schedule has at most 32 steps, so this bounds a sender that misbehaves).
pub(super) const MAX_EARLY_BLOCKS: usize = 64;

/// A subtree's part of a fence: how many participants it holds and, for a gather, their
/// entries sorted by daemon rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct SubtreeContrib {
    pub count: u32,
    pub entries: Vec<FenceEntry>,
}

#[derive(Debug)]
pub(super) enum OwnSlot {
    /// This daemon is a relay for the fence, not a participant.
    Relay,
    /// A participant that has not started the fence yet.
    Waiting,
    /// Started locally with this movement (and data, for a gather).
    Filled { movement: u32, data: Bytes },
}

#[derive(Debug)]
pub(super) struct ChildSlot {
    pub child: Rank,
    pub filled: bool,
    pub movement: u32,
    /// Held until merged; `None` once sent up (`filled` still catches duplicates).
    pub contrib: Option<SubtreeContrib>,
}

/// What the filled slots say about the movement.
#[derive(Debug, PartialEq)]
pub(super) enum Agreement {
    Agreed(u32),
    /// `daemon` (this daemon or the child whose subtree sent it) used `got`, not `expected`.
    Mismatch {
        expected: u32,
        got: u32,
        daemon: Rank,
    },
}

#[derive(Debug)]
pub(super) struct FenceTracker {
    pub own: OwnSlot,
    pub run: Run,
    pub children: Vec<ChildSlot>,
    /// The merged contribution went to the parent (cleared by a repair).
    pub sent_up: bool,
    /// The fence failed in this subtree; the error went up and the root's release is awaited.
    pub failed: Option<FenceError>,
    /// Local deadline (participants that started with a timeout).
    pub deadline: Option<u64>,
    pub timeout_ns: u64,
    /// Started here as a collecting fence (`PMIX_COLLECT_DATA`).
    pub collect: bool,
}

impl FenceTracker {
    pub fn new(participant: bool, children: Vec<Rank>) -> Self {
        let mut t = FenceTracker {
            own: if participant { OwnSlot::Waiting } else { OwnSlot::Relay },
            run: Run::Pending { early: Vec::new() },
            children: Vec::new(),
            sent_up: false,
            failed: None,
            deadline: None,
            timeout_ns: 0,
            collect: false,
        };
        t.reset_children(children);
        t
    }

    pub fn started(&self) -> bool {
        matches!(self.own, OwnSlot::Filled { .. })
    }

    pub fn participant(&self) -> bool {
        !matches!(self.own, OwnSlot::Relay)
    }

    /// Forget every child contribution and expect these children (after a repair).
    pub fn reset_children(&mut self, children: Vec<Rank>) {
        self.children =
            children.into_iter().map(|child| ChildSlot { child, filled: false, movement: 0, contrib: None }).collect();
        self.sent_up = false;
    }

    pub fn slot_mut(&mut self, child: Rank) -> Option<&mut ChildSlot> {
        self.children.iter_mut().find(|s| s.child == child)
    }

    /// Every expected slot is filled.
    pub fn ready(&self) -> bool {
        !matches!(self.own, OwnSlot::Waiting) && self.children.iter().all(|s| s.filled)
    }

    /// The movement of the fence by participant-weighted majority of the filled slots; ties go
    /// to this daemon's own movement, then to the earlier child. The odd one named is the
    /// first slot (self first) that disagrees with that majority.
    pub fn agreement(&self, me: Rank) -> Agreement {
        let mut votes: Vec<(Rank, u32, u64)> = Vec::with_capacity(self.children.len() + 1);
        if let OwnSlot::Filled { movement, .. } = self.own {
            votes.push((me, movement, 1));
        }
        for s in self.children.iter().filter(|s| s.filled) {
            let weight = s.contrib.as_ref().map_or(1, |c| u64::from(c.count.max(1)));
            votes.push((s.child, s.movement, weight));
        }
        let mut weight: BTreeMap<u32, u64> = BTreeMap::new();
        for &(_, m, w) in &votes {
            *weight.entry(m).or_default() += w;
        }
        let best = weight.values().copied().max().unwrap_or(0);
        let Some(&(_, expected, _)) = votes.iter().find(|v| weight[&v.1] == best) else {
            return Agreement::Agreed(0);
        };
        match votes.iter().find(|v| v.1 != expected) {
            None => Agreement::Agreed(expected),
            Some(&(daemon, got, _)) => Agreement::Mismatch { expected, got, daemon },
        }
    }

    /// Merge self and every child contribution (taking the child data). Entries (gather only)
    /// come out sorted by daemon; a daemon present twice is an error.
    pub fn merge(&mut self, me: Rank, gather: bool) -> Result<SubtreeContrib, String> {
        let mut out = SubtreeContrib::default();
        if let OwnSlot::Filled { data, .. } = &self.own {
            out.count = 1;
            if gather {
                out.entries.push(FenceEntry { daemon: me, data: data.clone() });
            }
        }
        for s in &mut self.children {
            let c = s.contrib.take().unwrap_or_default();
            out.count = out.count.saturating_add(c.count);
            if gather {
                out.entries.extend(c.entries);
            }
        }
        out.entries.sort_by_key(|e| e.daemon);
        if let Some(w) = out.entries.windows(2).find(|w| w[0].daemon == w[1].daemon) {
            return Err(format!("daemon {} contributed twice", w[0].daemon));
        }
        Ok(out)
    }

    pub fn state_bytes(&self) -> usize {
        let own = match &self.own {
            OwnSlot::Filled { data, .. } => data.len(),
            _ => 0,
        };
        let children: usize = self
            .children
            .iter()
            .map(|s| {
                std::mem::size_of::<ChildSlot>()
                    + s.contrib
                        .as_ref()
                        .map_or(0, |c| c.entries.iter().map(|e| e.data.len() + std::mem::size_of::<FenceEntry>()).sum())
            })
            .sum();
        std::mem::size_of::<Self>() + own + children + self.run.state_bytes()
    }

    /// Success releases go down the tree only for movements that release.
    pub fn releases_success(&self) -> bool {
        self.run.releases_success()
    }
}

/// The children of this daemon whose subtrees hold a participant, in topology order.
pub(super) fn child_slots(topo: &Topology, p: &Participants) -> Vec<Rank> {
    let children = topo.children();
    match p {
        Participants::All => children.to_vec(),
        Participants::Daemons(list) => {
            let mut hit = vec![false; children.len()];
            for &x in list.iter().filter(|&&x| x != topo.me() && topo.in_subtree(x)) {
                if let Route::Down(c) = topo.route_to(x) {
                    if let Some(i) = children.iter().position(|&k| k == c) {
                        hit[i] = true;
                    }
                }
            }
            children.iter().zip(hit).filter(|(_, h)| *h).map(|(&c, _)| c).collect()
        }
    }
}

/// The participants a fence over `p` lost, identical on every daemon: those failed by the first
/// repair (in the order every daemon applies them) that hit the set. `All` is every daemon of
/// the DVM, so the first repair hits it.
pub(super) fn lost(topo: &Topology, repairs: &[Vec<Rank>], p: &Participants) -> Vec<Rank> {
    let hit = |failed: &[Rank]| -> Vec<Rank> { failed.iter().copied().filter(|&r| p.contains(r)).collect() };
    repairs.iter().map(|f| hit(f)).find(|l| !l.is_empty()).unwrap_or_else(|| {
        // Failures from before this daemon kept a history (none in practice).
        let failed: Vec<Rank> = topo.failed().iter().copied().collect();
        hit(&failed)
    })
}

/// Number of participants of a fence with no lost participant.
pub(super) fn participant_count(topo: &Topology, p: &Participants) -> u64 {
    match p {
        Participants::All => u64::from(topo.live_count()),
        Participants::Daemons(list) => list.len() as u64,
    }
}

/// Concatenation of the entries' data (already in daemon order).
pub(super) fn concat(entries: &[FenceEntry]) -> Bytes {
    let mut buf = BytesMut::with_capacity(entries.iter().map(|e| e.data.len()).sum());
    for e in entries {
        buf.extend_from_slice(&e.data);
    }
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(t: &mut FenceTracker, child: Rank, movement: u32, count: u32) {
        let s = t.slot_mut(child).unwrap();
        s.filled = true;
        s.movement = movement;
        s.contrib = Some(SubtreeContrib { count, entries: vec![] });
    }

    #[test]
    fn majority_names_the_odd_daemon() {
        let mut t = FenceTracker::new(true, vec![3, 5]);
        t.own = OwnSlot::Filled { movement: 2, data: Bytes::new() };
        filled(&mut t, 3, 3, 2);
        filled(&mut t, 5, 3, 1);
        assert_eq!(t.agreement(1), Agreement::Mismatch { expected: 3, got: 2, daemon: 1 });
        let mut t = FenceTracker::new(true, vec![3]);
        t.own = OwnSlot::Filled { movement: 3, data: Bytes::new() };
        filled(&mut t, 3, 2, 1);
        assert_eq!(t.agreement(1), Agreement::Mismatch { expected: 3, got: 2, daemon: 3 });
        let mut t = FenceTracker::new(false, vec![3, 5]);
        filled(&mut t, 3, 3, 4);
        filled(&mut t, 5, 3, 1);
        assert_eq!(t.agreement(1), Agreement::Agreed(3));
    }

    #[test]
    fn merge_sorts_and_catches_duplicates() {
        let mut t = FenceTracker::new(true, vec![2, 4]);
        t.own = OwnSlot::Filled { movement: 3, data: Bytes::from_static(b"a") };
        let e = |d: Rank, s: &'static [u8]| FenceEntry { daemon: d, data: Bytes::from_static(s) };
        t.slot_mut(2).unwrap().contrib = Some(SubtreeContrib { count: 2, entries: vec![e(2, b"c"), e(6, b"e")] });
        t.slot_mut(4).unwrap().contrib = Some(SubtreeContrib { count: 1, entries: vec![e(4, b"d")] });
        let m = t.merge(0, true).unwrap();
        assert_eq!(m.count, 4);
        assert_eq!(concat(&m.entries), Bytes::from_static(b"acde"));
        t.slot_mut(2).unwrap().contrib = Some(SubtreeContrib { count: 1, entries: vec![e(0, b"x")] });
        assert!(t.merge(0, true).is_err());
    }
}
