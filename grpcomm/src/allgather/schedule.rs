//! Allgather partner schedules: who sends which blocks to whom at each step. Pure functions of
//! (participant count, position, step); no state, no I/O.
//!
//! Owns: positions (a daemon's index in the fence signature's canonical, sorted participant
//! list), [`BlockRange`] (a cyclic run of blocks named by owner position), the two schedules
//! and the choice between them ([`schedule_for`]), and the final concatenation
//! ([`concat_in_participant_order`]).
//!
//! - Recursive doubling (P a power of two, log2 P steps): at step k a daemon exchanges with
//!   position `pos ^ 2^k` (an involution: both sides derive each other with no communication).
//!   Before step k it holds the 2^k blocks of the aligned group containing `pos`; it sends all
//!   of them and receives the partner's group, doubling its holding.
//! - Bruck (any P, ceil(log2 P) steps): at step k a daemon sends to `pos - 2^k` and receives
//!   from `pos + 2^k` (mod P). Before step k it holds blocks `pos, pos+1, …` (mod P),
//!   min(2^k, P) of them; it sends the first min(2^k, P - 2^k) and receives as many, which
//!   extend its run. After the last step the run covers all P blocks.
//!
//! Never: decides anything from a payload size or from arrival order. The choice depends only
//! on P, which every participant reads identically from the signature, so every participant
//! runs the same schedule; an out-of-range input is a typed [`ScheduleError`], never a panic.
//!
//! Invariants:
//! - Every participant receives every other participant's block exactly once and never its
//!   own; a step only sends blocks the sender already holds (proved for P in 1..=1024 and for
//!   random rank subsets up to 4096 by `tests/allgather_schedule.rs`).
//! - For every step, `step(pos, k).to == q` exactly when `step(q, k).from == pos`, and the
//!   receiver's `recv` equals the sender's `send`.
//! - Blocks are stored by owner position, so the output is identical on every daemon whatever
//!   order they arrived in, and byte-identical to the tree gather's concatenation.
//!
//! Traps:
//! - Positions are not ranks: the daemon to talk to is `participants[position]`.
//! - A message for a later step can arrive before the current step's (a partner that is ahead);
//!   hold messages keyed by step, never infer the step from arrival order.
//! - Bruck's last step may carry fewer than 2^k blocks (P - 2^k), and its send and receive
//!   partners differ (except when P = 2), so a step completes on receipt, not on send.
//! - P = 1 has no steps: the fence completes with the daemon's own block.

use std::ops::Range;

use bytes::{Bytes, BytesMut};
use dvm_rml::topology::Rank;

/// A daemon's index in the canonical (sorted, unique) participant list of a fence.
pub type Position = u32;

/// A schedule input that cannot describe an allgather.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("an allgather needs at least one participant")]
    NoParticipants,
    #[error("{participants} participants is more than a position can index ({max})", max = u32::MAX)]
    TooManyParticipants { participants: usize },
    #[error("participant list is not canonical: rank {rank} at position {position} does not follow rank {previous}")]
    NotCanonical { position: usize, previous: Rank, rank: Rank },
    #[error("daemon {rank} is not one of the {participants} participants")]
    NotAParticipant { rank: Rank, participants: u32 },
    #[error("position {position} is out of range for {participants} participants")]
    PositionOutOfRange { position: Position, participants: u32 },
    #[error("step {step} is out of range: {kind} over {participants} participants has {steps} steps")]
    StepOutOfRange { kind: &'static str, step: u32, steps: u32, participants: u32 },
    #[error("recursive doubling needs a power-of-two participant count, not {participants}")]
    NotPowerOfTwo { participants: u32 },
    #[error("{got} blocks given for {participants} participants")]
    BlockCountMismatch { got: usize, participants: usize },
    #[error("block of daemon {rank} (position {position}) is missing")]
    MissingBlock { position: Position, rank: Rank },
}

/// A run of `len` blocks named by owner position: `first, first+1, …` modulo the participant
/// count (it may wrap past the last position). Never longer than the participant count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockRange {
    first: Position,
    len: u32,
    participants: u32,
}

impl BlockRange {
    /// Owner position of the first block.
    pub fn first(&self) -> Position {
        self.first
    }

    /// Number of blocks.
    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The participant count the positions are taken modulo.
    pub fn participants(&self) -> u32 {
        self.participants
    }

    /// True when the run holds every block.
    pub fn is_whole(&self) -> bool {
        self.len == self.participants
    }

    /// Whether the block owned by `pos` is in the run.
    pub fn contains(&self, pos: Position) -> bool {
        pos < self.participants
            && (u64::from(pos) + u64::from(self.participants) - u64::from(self.first)) % u64::from(self.participants)
                < u64::from(self.len)
    }

    /// Owner positions in run order (the order blocks travel in a message).
    pub fn positions(&self) -> impl Iterator<Item = Position> + '_ {
        let (a, b) = self.segments();
        a.chain(b)
    }

    /// The run as at most two increasing ranges of positions, in run order: the part up to the
    /// last position, then the wrapped part (empty when the run does not wrap).
    pub fn segments(&self) -> (Range<Position>, Range<Position>) {
        let end = u64::from(self.first) + u64::from(self.len);
        let p = u64::from(self.participants);
        if end <= p {
            (self.first..end as u32, 0..0)
        } else {
            (self.first..self.participants, 0..(end - p) as u32)
        }
    }
}

/// One step of an allgather as seen by one position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Step {
    /// Step number, 0-based.
    pub step: u32,
    /// Position this daemon sends to at this step.
    pub to: Position,
    /// Position this daemon receives from at this step (equal to `to` for recursive
    /// doubling: a pairwise exchange).
    pub from: Position,
    /// Blocks sent to `to`, all held before this step.
    pub send: BlockRange,
    /// Blocks received from `from`, none held before this step.
    pub recv: BlockRange,
}

/// Which exchange pattern an allgather runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ScheduleKind {
    /// XOR-paired recursive doubling; power-of-two participant counts only.
    RecursiveDoubling,
    /// Bruck's dissemination allgather; any participant count.
    Bruck,
}

impl ScheduleKind {
    pub fn name(self) -> &'static str {
        match self {
            ScheduleKind::RecursiveDoubling => "recursive-doubling",
            ScheduleKind::Bruck => "bruck",
        }
    }
}

/// An allgather schedule over a fixed participant count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Schedule {
    kind: ScheduleKind,
    participants: u32,
}

/// The schedule an allgather over `participants` daemons runs: recursive doubling when the
/// count is a power of two (including 1), Bruck otherwise. It depends on the count alone,
/// which every participant reads identically from the fence signature, and never on payload
/// size (which differs per rank): every participant picks the same schedule.
pub fn schedule_for(participants: u32) -> Result<Schedule, ScheduleError> {
    let kind = if participants.is_power_of_two() { ScheduleKind::RecursiveDoubling } else { ScheduleKind::Bruck };
    Schedule::new(kind, participants)
}

impl Schedule {
    /// A schedule of the given kind (forcing Bruck on a power of two is allowed; recursive
    /// doubling on any other count is [`ScheduleError::NotPowerOfTwo`]).
    pub fn new(kind: ScheduleKind, participants: u32) -> Result<Schedule, ScheduleError> {
        check_count(participants)?;
        if kind == ScheduleKind::RecursiveDoubling && !participants.is_power_of_two() {
            return Err(ScheduleError::NotPowerOfTwo { participants });
        }
        Ok(Schedule { kind, participants })
    }

    /// The schedule for a canonical participant list (see [`schedule_for`]).
    pub fn for_participants(list: &[Rank]) -> Result<Schedule, ScheduleError> {
        schedule_for(participant_count(list)?)
    }

    pub fn kind(&self) -> ScheduleKind {
        self.kind
    }

    pub fn participants(&self) -> u32 {
        self.participants
    }

    /// Number of steps every participant runs.
    pub fn steps(&self) -> u32 {
        match self.kind {
            ScheduleKind::RecursiveDoubling => self.participants.trailing_zeros(),
            ScheduleKind::Bruck => ceil_log2(self.participants),
        }
    }

    /// What position `pos` does at step `k`.
    pub fn step(&self, pos: Position, k: u32) -> Result<Step, ScheduleError> {
        match self.kind {
            ScheduleKind::RecursiveDoubling => rd_step(pos, self.participants, k),
            ScheduleKind::Bruck => bruck_step(pos, self.participants, k),
        }
    }

    /// The blocks position `pos` holds before step `k` (`k == steps()`: after the last step,
    /// which is every block).
    pub fn held_before(&self, pos: Position, k: u32) -> Result<BlockRange, ScheduleError> {
        let p = self.participants;
        check_position(pos, p)?;
        if k > self.steps() {
            return Err(ScheduleError::StepOutOfRange {
                kind: self.kind.name(),
                step: k,
                steps: self.steps(),
                participants: p,
            });
        }
        let size = 1u64 << k;
        Ok(match self.kind {
            ScheduleKind::RecursiveDoubling => aligned_group(pos, size, p),
            ScheduleKind::Bruck => BlockRange { first: pos, len: size.min(u64::from(p)) as u32, participants: p },
        })
    }
}

/// Number of recursive-doubling steps for `participants` (a power of two): log2 P.
pub fn rd_steps(participants: u32) -> Result<u32, ScheduleError> {
    Ok(Schedule::new(ScheduleKind::RecursiveDoubling, participants)?.steps())
}

/// Number of Bruck steps for `participants`: ceil(log2 P).
pub fn bruck_steps(participants: u32) -> Result<u32, ScheduleError> {
    Ok(Schedule::new(ScheduleKind::Bruck, participants)?.steps())
}

/// Recursive doubling, step `k` of position `pos` among `participants` (a power of two):
/// exchange the aligned group of 2^k blocks containing `pos` with position `pos ^ 2^k`.
pub fn rd_step(pos: Position, participants: u32, k: u32) -> Result<Step, ScheduleError> {
    let steps = rd_steps(participants)?;
    check_position(pos, participants)?;
    check_step(ScheduleKind::RecursiveDoubling, k, steps, participants)?;
    let size = 1u64 << k;
    let partner = pos ^ (1u32 << k);
    Ok(Step {
        step: k,
        to: partner,
        from: partner,
        send: aligned_group(pos, size, participants),
        recv: aligned_group(partner, size, participants),
    })
}

/// Bruck, step `k` of position `pos` among `participants`: send the first
/// min(2^k, P - 2^k) held blocks (starting at `pos`) to `pos - 2^k`, receive as many from
/// `pos + 2^k`, starting at that position's own block.
pub fn bruck_step(pos: Position, participants: u32, k: u32) -> Result<Step, ScheduleError> {
    let steps = bruck_steps(participants)?;
    check_position(pos, participants)?;
    check_step(ScheduleKind::Bruck, k, steps, participants)?;
    let p = u64::from(participants);
    let dist = 1u64 << k; // < p, since k < ceil(log2 p)
    let count = dist.min(p - dist) as u32;
    let to = ((u64::from(pos) + p - dist) % p) as u32;
    let from = ((u64::from(pos) + dist) % p) as u32;
    Ok(Step {
        step: k,
        to,
        from,
        send: BlockRange { first: pos, len: count, participants },
        recv: BlockRange { first: from, len: count, participants },
    })
}

/// Position of daemon `rank` in the canonical participant list.
pub fn position_of(list: &[Rank], rank: Rank) -> Result<Position, ScheduleError> {
    let participants = participant_count(list)?;
    list.binary_search(&rank).map(|i| i as Position).map_err(|_| ScheduleError::NotAParticipant { rank, participants })
}

/// Daemon at position `pos` of the participant list.
pub fn rank_at(list: &[Rank], pos: Position) -> Result<Rank, ScheduleError> {
    let participants = participant_count(list)?;
    list.get(pos as usize).copied().ok_or(ScheduleError::PositionOutOfRange { position: pos, participants })
}

/// The allgather's output: every block, stored by owner position, concatenated in participant
/// order (the same bytes the tree gather produces). Identical on every daemon whatever order
/// the blocks arrived in; a missing block is named by its owner.
pub fn concat_in_participant_order<B: AsRef<[u8]>>(
    list: &[Rank],
    blocks: &[Option<B>],
) -> Result<Bytes, ScheduleError> {
    participant_count(list)?;
    if blocks.len() != list.len() {
        return Err(ScheduleError::BlockCountMismatch { got: blocks.len(), participants: list.len() });
    }
    let mut total = 0;
    for (i, b) in blocks.iter().enumerate() {
        match b {
            Some(b) => total += b.as_ref().len(),
            None => return Err(ScheduleError::MissingBlock { position: i as Position, rank: list[i] }),
        }
    }
    let mut out = BytesMut::with_capacity(total);
    for b in blocks.iter().flatten() {
        out.extend_from_slice(b.as_ref());
    }
    Ok(out.freeze())
}

/// Number of participants in a canonical list (strictly increasing ranks, at least one).
pub fn participant_count(list: &[Rank]) -> Result<u32, ScheduleError> {
    let n = u32::try_from(list.len()).map_err(|_| ScheduleError::TooManyParticipants { participants: list.len() })?;
    check_count(n)?;
    if let Some(i) = list.windows(2).position(|w| w[0] >= w[1]) {
        return Err(ScheduleError::NotCanonical { position: i + 1, previous: list[i], rank: list[i + 1] });
    }
    Ok(n)
}

fn check_count(participants: u32) -> Result<(), ScheduleError> {
    if participants == 0 {
        return Err(ScheduleError::NoParticipants);
    }
    Ok(())
}

fn check_position(pos: Position, participants: u32) -> Result<(), ScheduleError> {
    if pos >= participants {
        return Err(ScheduleError::PositionOutOfRange { position: pos, participants });
    }
    Ok(())
}

fn check_step(kind: ScheduleKind, step: u32, steps: u32, participants: u32) -> Result<(), ScheduleError> {
    if step >= steps {
        return Err(ScheduleError::StepOutOfRange { kind: kind.name(), step, steps, participants });
    }
    Ok(())
}

/// The aligned group of `size` (a power of two, at most P) positions containing `pos`.
fn aligned_group(pos: Position, size: u64, participants: u32) -> BlockRange {
    let first = u64::from(pos) & !(size - 1);
    BlockRange { first: first as u32, len: size as u32, participants }
}

/// ceil(log2 n) for n >= 1.
fn ceil_log2(n: u32) -> u32 {
    32 - (n - 1).leading_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_participant_has_no_steps() {
        let s = schedule_for(1).unwrap();
        assert_eq!((s.kind(), s.steps()), (ScheduleKind::RecursiveDoubling, 0));
        assert_eq!(bruck_steps(1), Ok(0));
        assert!(s.held_before(0, 0).unwrap().is_whole());
        assert!(matches!(s.step(0, 0), Err(ScheduleError::StepOutOfRange { steps: 0, .. })));
    }

    #[test]
    fn two_participants_swap_once() {
        for kind in [ScheduleKind::RecursiveDoubling, ScheduleKind::Bruck] {
            let s = Schedule::new(kind, 2).unwrap();
            assert_eq!(s.steps(), 1);
            let a = s.step(0, 0).unwrap();
            assert_eq!((a.to, a.from), (1, 1));
            assert_eq!(a.send.positions().collect::<Vec<_>>(), [0]);
            assert_eq!(a.recv.positions().collect::<Vec<_>>(), [1]);
        }
    }

    #[test]
    fn bad_inputs_are_typed_errors() {
        assert_eq!(schedule_for(0), Err(ScheduleError::NoParticipants));
        assert_eq!(rd_step(0, 6, 0), Err(ScheduleError::NotPowerOfTwo { participants: 6 }));
        assert_eq!(rd_step(8, 8, 0), Err(ScheduleError::PositionOutOfRange { position: 8, participants: 8 }));
        assert!(matches!(bruck_step(0, 5, 3), Err(ScheduleError::StepOutOfRange { step: 3, steps: 3, .. })));
        assert_eq!(position_of(&[3, 7], 4), Err(ScheduleError::NotAParticipant { rank: 4, participants: 2 }));
        assert_eq!(
            Schedule::for_participants(&[3, 7, 7]),
            Err(ScheduleError::NotCanonical { position: 2, previous: 7, rank: 7 })
        );
        assert_eq!(rank_at(&[3, 7], 2), Err(ScheduleError::PositionOutOfRange { position: 2, participants: 2 }));
        let e = concat_in_participant_order(&[3, 7], &[Some(b"a".as_slice()), None]).unwrap_err();
        assert_eq!(e, ScheduleError::MissingBlock { position: 1, rank: 7 });
        assert!(e.to_string().contains("daemon 7"), "{e}");
        assert_eq!(
            concat_in_participant_order(&[3], &[Some(b"a"), Some(b"b")]),
            Err(ScheduleError::BlockCountMismatch { got: 2, participants: 1 })
        );
    }

    #[test]
    fn largest_counts_do_not_overflow() {
        let p = u32::MAX;
        let s = schedule_for(p).unwrap();
        assert_eq!((s.kind(), s.steps()), (ScheduleKind::Bruck, 32));
        let last = s.step(p - 1, 31).unwrap();
        assert_eq!(u64::from(last.from), (u64::from(p) - 1 + (1 << 31)) % u64::from(p));
        assert_eq!(last.send.len(), p - (1 << 31));
        assert!(s.held_before(p - 1, 32).unwrap().is_whole());
        let r = schedule_for(1 << 31).unwrap();
        assert_eq!((r.kind(), r.steps()), (ScheduleKind::RecursiveDoubling, 31));
        assert_eq!(r.step((1 << 31) - 1, 30).unwrap().to, (1 << 30) - 1);
    }

    #[test]
    fn wrapping_range_splits_in_run_order() {
        let r = BlockRange { first: 5, len: 4, participants: 7 };
        assert_eq!(r.segments(), (5..7, 0..2));
        assert_eq!(r.positions().collect::<Vec<_>>(), [5, 6, 0, 1]);
        assert!(r.contains(0) && r.contains(6) && !r.contains(2) && !r.contains(4) && !r.contains(7));
    }
}
