//! Allgather partner schedules, simulated by message passing against independent oracles.
//!
//! Each position starts with its own block; at each step every position sends exactly what
//! the schedule says, and every position takes the one message addressed to it. Two oracles:
//! - `run_ranges` tracks what each position holds as disjoint intervals of owner positions
//!   (O(P log P) per run): a send only carries held blocks, each position receives exactly one
//!   message per step and from the position its schedule names, what arrives is what the
//!   receiver expects, nothing arrives twice, and every position ends holding every block.
//! - `run_bytes` moves real bytes into per-position slot tables and checks the final
//!   concatenation on every position against a naive concatenation of the contributions in
//!   rank order.
//!
//! Coverage: `run_ranges` for every participant count 1..=1024 (both schedules where they
//! apply) and for 300 random rank subsets of 0..65536 with sizes up to 4096; `run_bytes`, which
//! costs O(P^2), for every count up to 300, counts around the powers of two up to 1024, the
//! random subsets up to 512 and a subset of 4096.

use std::collections::BTreeMap;
use std::ops::Range;

use dvm_grpcomm::allgather::schedule::{
    concat_in_participant_order, position_of, rank_at, schedule_for, BlockRange, Schedule, ScheduleError, ScheduleKind,
};
use dvm_grpcomm::Rank;

/// Seeded generator, so every case replays from its seed.
type Rng = rand::rngs::StdRng;

fn seeded(seed: u64) -> Rng {
    rand::SeedableRng::seed_from_u64(seed)
}

/// Uniform in 0..n.
fn below(rng: &mut Rng, n: u64) -> u64 {
    rand::Rng::gen_range(rng, 0..n)
}

/// A sorted, unique list of `size` ranks drawn from 0..65536.
fn random_participants(rng: &mut Rng, size: usize) -> Vec<Rank> {
    let mut picked = std::collections::BTreeSet::new();
    while picked.len() < size {
        picked.insert(below(rng, 65536) as Rank);
    }
    picked.into_iter().collect()
}

/// The positions of a cyclic run, as increasing half-open ranges, computed here from
/// (first, len, P) alone rather than by the module's own splitting. Empty ranges are left out.
fn cyclic_ranges(r: &BlockRange) -> Vec<Range<u32>> {
    let (first, len, p) = (u64::from(r.first()), u64::from(r.len()), u64::from(r.participants()));
    assert!(first < p && len <= p, "malformed range {r:?}");
    let (head, tail) = if first + len <= p { (first..first + len, 0..0) } else { (first..p, 0..first + len - p) };
    [head, tail].into_iter().filter(|r| !r.is_empty()).map(|r| r.start as u32..r.end as u32).collect()
}

/// What one position holds: disjoint, coalesced half-open intervals (start -> end).
#[derive(Debug, Default, Clone, PartialEq)]
struct Held(BTreeMap<u32, u32>);

impl Held {
    fn own(pos: u32) -> Held {
        Held([(pos, pos + 1)].into_iter().collect())
    }

    fn covers(&self, r: &Range<u32>) -> bool {
        self.0.range(..=r.start).next_back().is_some_and(|(_, &end)| end >= r.end)
    }

    /// Adds a range none of which is held yet; false if any of it already is.
    fn insert_new(&mut self, r: Range<u32>) -> bool {
        if let Some((_, &end)) = self.0.range(..=r.start).next_back() {
            if end > r.start {
                return false;
            }
        }
        if self.0.range(r.start..r.end).next().is_some() {
            return false;
        }
        let (mut start, mut end) = (r.start, r.end);
        if let Some((&s, &e)) = self.0.range(..start).next_back() {
            if e == start {
                self.0.remove(&s);
                start = s;
            }
        }
        if let Some(e) = self.0.remove(&end) {
            end = e;
        }
        self.0.insert(start, end);
        true
    }

    fn from_range(r: &BlockRange) -> Held {
        let mut h = Held::default();
        for seg in cyclic_ranges(r) {
            assert!(h.insert_new(seg), "range {r:?} overlaps itself");
        }
        h
    }
}

/// A message in flight: who sent it, and which blocks (by owner position) it carries.
#[derive(Debug, Clone, Copy)]
struct Msg {
    from: u32,
    blocks: BlockRange,
}

/// Message-passing run over interval holdings; returns the number of messages and of blocks
/// moved.
fn run_ranges(s: &Schedule) -> (u64, u64) {
    let p = s.participants();
    let mut held: Vec<Held> = (0..p).map(Held::own).collect();
    let (mut messages, mut blocks) = (0u64, 0u64);
    for k in 0..s.steps() {
        let mut inbox: Vec<Option<Msg>> = vec![None; p as usize];
        for pos in 0..p {
            let st = s.step(pos, k).unwrap();
            assert_eq!(st.step, k);
            assert!(
                Held::from_range(&s.held_before(pos, k).unwrap()) == held[pos as usize],
                "{s:?} pos {pos} step {k}: held_before disagrees with the simulation"
            );
            assert!(st.to < p && st.to != pos, "{s:?} pos {pos} step {k}: sends to {}", st.to);
            assert!(!st.send.is_empty(), "{s:?} pos {pos} step {k}: empty send");
            for seg in cyclic_ranges(&st.send) {
                assert!(held[pos as usize].covers(&seg), "{s:?} pos {pos} step {k}: sends {seg:?} it does not hold");
            }
            let slot = &mut inbox[st.to as usize];
            assert!(slot.is_none(), "{s:?} step {k}: two messages to {}", st.to);
            *slot = Some(Msg { from: pos, blocks: st.send });
            messages += 1;
            blocks += u64::from(st.send.len());
        }
        for pos in 0..p {
            let st = s.step(pos, k).unwrap();
            let msg = inbox[pos as usize].take().unwrap_or_else(|| panic!("{s:?} step {k}: nothing for {pos}"));
            assert_eq!(msg.from, st.from, "{s:?} pos {pos} step {k}: message from the wrong position");
            assert_eq!(msg.blocks, st.recv, "{s:?} pos {pos} step {k}: received blocks differ from the expected");
            if s.kind() == ScheduleKind::RecursiveDoubling {
                assert_eq!(st.to, st.from, "{s:?} pos {pos} step {k}: not a pairwise exchange");
            }
            for seg in cyclic_ranges(&msg.blocks) {
                assert!(held[pos as usize].insert_new(seg.clone()), "{s:?} pos {pos} step {k}: {seg:?} received twice");
            }
        }
    }
    for pos in 0..p {
        assert_eq!(
            held[pos as usize],
            Held([(0, p)].into_iter().collect()),
            "{s:?} pos {pos} ends without every block"
        );
        assert!(s.held_before(pos, s.steps()).unwrap().is_whole());
    }
    // Each position received each other block exactly once, so P(P-1) blocks moved.
    assert_eq!(blocks, u64::from(p) * u64::from(p - 1), "{s:?}");
    assert_eq!(messages, u64::from(p) * u64::from(s.steps()), "{s:?}");
    (messages, blocks)
}

/// Block contributed by daemon `rank`: varying lengths, some empty, content naming the owner.
fn block_of(rank: Rank) -> Vec<u8> {
    format!("<{rank}>").repeat((rank % 3) as usize).into_bytes()
}

/// A message with real bytes: the sender's position and the blocks in run order.
type Parcel<'a> = (u32, Vec<&'a [u8]>);

/// Message-passing run with real bytes in per-position slot tables; checks every position's
/// output against the naive concatenation in rank order.
fn run_bytes(s: &Schedule, ranks: &[Rank], rng: &mut Rng) {
    let p = s.participants();
    assert_eq!(p as usize, ranks.len());
    // The contributions, kept by rank: the oracle below never looks at positions.
    let contributions: BTreeMap<Rank, Vec<u8>> = ranks.iter().map(|&r| (r, block_of(r))).collect();
    let naive: Vec<u8> = contributions.values().flatten().copied().collect();

    let mut store: Vec<Vec<Option<&[u8]>>> = (0..p)
        .map(|pos| {
            let mut slots = vec![None; p as usize];
            let me = rank_at(ranks, pos).unwrap();
            slots[pos as usize] = Some(contributions[&me].as_slice());
            slots
        })
        .collect();
    for k in 0..s.steps() {
        let mut inbox: Vec<Option<Parcel>> = vec![None; p as usize];
        for pos in 0..p {
            let st = s.step(pos, k).unwrap();
            let data = st
                .send
                .positions()
                .map(|b| {
                    store[pos as usize][b as usize]
                        .unwrap_or_else(|| panic!("{s:?} pos {pos} step {k}: sends block {b} it lacks"))
                })
                .collect();
            inbox[st.to as usize] = Some((pos, data));
        }
        // Deliver in a random order: a position's slots must not depend on it.
        let mut order: Vec<u32> = (0..p).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, below(rng, i as u64 + 1) as usize);
        }
        for pos in order {
            let st = s.step(pos, k).unwrap();
            let (from, data) = inbox[pos as usize].take().expect("one message per position per step");
            assert_eq!(from, st.from);
            assert_eq!(data.len(), st.recv.len() as usize);
            for (b, d) in st.recv.positions().zip(data) {
                let slot = &mut store[pos as usize][b as usize];
                assert!(slot.is_none(), "{s:?} pos {pos} step {k}: block {b} received twice");
                *slot = Some(d);
            }
        }
    }
    for (pos, slots) in store.iter().enumerate() {
        let out = concat_in_participant_order(ranks, slots).unwrap_or_else(|e| panic!("{s:?} pos {pos}: {e}"));
        assert!(out == naive, "{s:?} pos {pos}: output differs from the naive concatenation");
    }
}

fn kinds_for(p: u32) -> Vec<Schedule> {
    let mut v = vec![Schedule::new(ScheduleKind::Bruck, p).unwrap()];
    if p.is_power_of_two() {
        v.push(Schedule::new(ScheduleKind::RecursiveDoubling, p).unwrap());
    }
    v
}

#[test]
fn every_count_up_to_1024_gathers_every_block_exactly_once() {
    let mut runs = 0;
    for p in 1..=1024u32 {
        let chosen = schedule_for(p).unwrap();
        assert_eq!(
            chosen.kind(),
            if p.is_power_of_two() { ScheduleKind::RecursiveDoubling } else { ScheduleKind::Bruck }
        );
        // The chosen schedule takes ceil(log2 P) steps whichever kind it is.
        assert_eq!(chosen.steps(), (p as f64).log2().ceil() as u32, "P = {p}");
        for s in kinds_for(p) {
            run_ranges(&s);
            runs += 1;
        }
    }
    assert_eq!(runs, 1024 + 11);
}

/// Byte runs cost O(P^2), so they take every count up to 300 and, up to 1024, the counts
/// around each power of two and the top of the range (`run_ranges` covers every count).
#[test]
fn counts_up_to_1024_output_the_naive_concatenation() {
    let mut rng = seeded(0xA11_6A7E);
    let mut counts: Vec<u32> = (1..=300).collect();
    counts.extend((9..=10).flat_map(|j| [(1u32 << j) - 1, 1 << j, (1 << j) + 1]));
    counts.extend([333, 500, 640, 700, 767, 999, 1000, 1021, 1022]);
    for p in counts {
        let ranks: Vec<Rank> = (0..p).map(|i| i * 3 + 1).collect();
        for s in kinds_for(p) {
            run_bytes(&s, &ranks, &mut rng);
        }
    }
}

#[test]
fn random_rank_subsets_up_to_4096() {
    let mut rng = seeded(0x5EED_0008);
    let fixed = [1usize, 2, 3, 4, 5, 2047, 2048, 2049, 4095, 4096];
    let mut sizes: Vec<usize> = fixed.to_vec();
    sizes.extend((0..290).map(|_| 1 + below(&mut rng, 4096) as usize));
    let mut byte_runs = 0;
    for &size in &sizes {
        let ranks = random_participants(&mut rng, size);
        let s = Schedule::for_participants(&ranks).unwrap();
        assert_eq!(s, schedule_for(size as u32).unwrap());
        let mut kinds = vec![s];
        if s.kind() != ScheduleKind::Bruck {
            kinds.push(Schedule::new(ScheduleKind::Bruck, size as u32).unwrap());
        }
        for s in &kinds {
            run_ranges(s);
            // Bytes (O(P^2) memory and time) for the small subsets and the largest.
            if size <= 512 || (size == 4096 && s.kind() == ScheduleKind::RecursiveDoubling) {
                run_bytes(s, &ranks, &mut rng);
                byte_runs += 1;
            }
        }
    }
    assert!(byte_runs >= 30, "only {byte_runs} byte runs");
}

#[test]
fn every_participant_derives_the_same_schedule() {
    let mut rng = seeded(0xC401CE);
    for case in 0..180 {
        let size = 1 + below(&mut rng, if case < 160 { 64 } else { 4096 }) as usize;
        let ranks = random_participants(&mut rng, size);
        let reference = schedule_for(size as u32).unwrap();
        let mut seen = vec![false; size];
        for &me in &ranks {
            // Each daemon derives everything from the signature's list, as it arrives.
            let mine = ranks.as_slice();
            let s = Schedule::for_participants(mine).unwrap();
            assert_eq!(s, reference, "daemon {me} of {size}");
            let pos = position_of(mine, me).unwrap();
            assert_eq!(rank_at(mine, pos), Ok(me));
            assert!(!std::mem::replace(&mut seen[pos as usize], true), "two daemons at position {pos}");
            // Partners seen from both ends agree.
            for k in 0..s.steps() {
                let st = s.step(pos, k).unwrap();
                assert_eq!(s.step(st.to, k).unwrap().from, pos);
                assert_eq!(s.step(st.from, k).unwrap().to, pos);
            }
        }
        assert!(seen.iter().all(|&x| x));
        // A different list of the same size gives the same schedule: only the count matters.
        let other = random_participants(&mut rng, size);
        assert_eq!(Schedule::for_participants(&other).unwrap(), reference);
        // A daemon outside the list has no position.
        if let Some(outsider) = (0..65536).find(|r| ranks.binary_search(r).is_err()) {
            assert!(matches!(position_of(&ranks, outsider), Err(ScheduleError::NotAParticipant { .. })));
        }
    }
}

#[test]
fn block_ranges_match_a_naive_modulo() {
    for p in 1..=20u32 {
        let s = Schedule::new(ScheduleKind::Bruck, p).unwrap();
        for pos in 0..p {
            for k in 0..=s.steps() {
                let r = s.held_before(pos, k).unwrap();
                let naive: Vec<u32> = (0..r.len()).map(|i| (pos + i) % p).collect();
                assert_eq!(r.positions().collect::<Vec<_>>(), naive);
                let flat: Vec<u32> = cyclic_ranges(&r).into_iter().flatten().collect();
                let (a, b) = r.segments();
                assert_eq!(a.chain(b).collect::<Vec<_>>(), flat);
                for q in 0..p + 2 {
                    assert_eq!(r.contains(q), naive.contains(&q), "P {p} pos {pos} k {k} q {q}");
                }
            }
        }
    }
}

#[test]
fn concatenation_ignores_arrival_order() {
    let mut rng = seeded(7);
    let ranks = random_participants(&mut rng, 300);
    let naive: Vec<u8> = ranks.iter().flat_map(|&r| block_of(r)).collect();
    for _ in 0..20 {
        let mut slots: Vec<Option<Vec<u8>>> = vec![None; ranks.len()];
        let mut order: Vec<usize> = (0..ranks.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, below(&mut rng, i as u64 + 1) as usize);
        }
        for (n, &i) in order.iter().enumerate() {
            slots[i] = Some(block_of(ranks[i]));
            let r = concat_in_participant_order(&ranks, &slots);
            if n + 1 < order.len() {
                assert!(matches!(r, Err(ScheduleError::MissingBlock { .. })));
            } else {
                assert_eq!(r.unwrap().as_ref(), naive.as_slice());
            }
        }
    }
}
