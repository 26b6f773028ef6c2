//! Structure-aware fuzzing of every message handler of the core: the frames of a real run
//! (WIREUP and check-ins, xcast relay/forward/ack/done, barrier and modex fence contributions
//! and releases, allgather blocks, scatter, daemon commands) are recorded, then replayed
//! mutated (bytes flipped, cut, spliced, fields of the header changed) into a booted 8-daemon
//! DVM at radix 2. Nothing may panic, and the network must go quiet (no message loops).
//!
//! Inputs: `dvm_tests::fuzz` (300 in `cargo test`; millions from scripts/fuzz.sh).

use bytes::Bytes;
use proptest::prelude::*;

use super::tests::{epoch_of, Net};
use super::*;

type Recorded = (Rank, Rank, FrameHeader, Bytes);

/// Frames of a real run on 8 daemons at radix 2: every kind of message the core handles.
fn corpus() -> &'static [Recorded] {
    static CORPUS: std::sync::OnceLock<Vec<Recorded>> = std::sync::OnceLock::new();
    CORPUS.get_or_init(|| {
        let mut net = Net::boot(8, 2);
        let mut all: Vec<Recorded> = Vec::new();
        let mut record = |net: &mut Net, input: Input| {
            net.input(0, input);
            while let Some(f) = net.wire.pop_front() {
                all.push(f.clone());
                net.wire.push_front(f);
                net.run_some(1);
            }
        };
        record(
            &mut net,
            Input::Bench {
                kind: BenchKind::Alternate,
                count: 4,
                bytes: 24,
                fence_movement: None,
                bcast_movement: None,
            },
        );
        record(
            &mut net,
            Input::Bench { kind: BenchKind::Xcast, count: 2, bytes: 3000, fence_movement: None, bcast_movement: None },
        );
        // The lateral movements' messages too: scatter-allgather chunks and blocks, allgather
        // fence blocks.
        let bulk = Some(dvm_grpcomm::BcastMovementMode::Bulk);
        record(
            &mut net,
            Input::Bench { kind: BenchKind::Xcast, count: 2, bytes: 3000, fence_movement: None, bcast_movement: bulk },
        );
        let ag = Some(dvm_grpcomm::FenceMovementMode::Allgather);
        record(
            &mut net,
            Input::Bench { kind: BenchKind::Alternate, count: 4, bytes: 24, fence_movement: ag, bcast_movement: None },
        );
        record(
            &mut net,
            Input::Bench { kind: BenchKind::Ping, count: 2, bytes: 16, fence_movement: None, bcast_movement: None },
        );
        let slices = (1..8).map(|r| (r, Bytes::from(vec![r as u8; 40]))).collect();
        record(&mut net, Input::Scatter { tag: 77, slices });
        assert!(all.len() > 50, "the recorded run is too small: {} frames", all.len());
        all
    })
}

/// The mutation applied to one recorded frame.
#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    Cut {
        at: usize,
    },
    Splice {
        at: usize,
        bytes: Vec<u8>,
    },
    Replace(Vec<u8>),
    Header {
        origin: Option<Rank>,
        dst: Option<Rank>,
        tag: Option<u32>,
        seq: Option<u64>,
    },
    /// Delivered unchanged, again (a duplicate from an authenticated peer).
    Duplicate,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        any::<usize>().prop_map(|at| Mutation::Cut { at }),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Splice { at, bytes }),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Mutation::Replace),
        (
            proptest::option::of(0u32..10),
            proptest::option::of(0u32..10),
            proptest::option::of(0u32..6),
            proptest::option::of(any::<u64>())
        )
            .prop_map(|(origin, dst, tag, seq)| Mutation::Header { origin, dst, tag, seq }),
        Just(Mutation::Duplicate),
    ]
}

fn apply(m: &Mutation, header: &mut FrameHeader, payload: &Bytes) -> Bytes {
    let mut p = payload.to_vec();
    match m {
        Mutation::Flip { at, bit } if !p.is_empty() => {
            let i = at % p.len();
            p[i] ^= 1 << bit;
        }
        Mutation::Flip { .. } | Mutation::Duplicate => {}
        Mutation::Cut { at } => p.truncate(at % (p.len() + 1)),
        Mutation::Splice { at, bytes } => {
            let i = at % (p.len() + 1);
            p.splice(i..i, bytes.iter().copied());
        }
        Mutation::Replace(b) => p = b.clone(),
        Mutation::Header { origin, dst, tag, seq } => {
            header.origin = origin.unwrap_or(header.origin);
            header.dst = dst.unwrap_or(header.dst);
            header.tag = tag.unwrap_or(header.tag);
            header.seq = seq.unwrap_or(header.seq);
        }
    }
    Bytes::from(p)
}

proptest! {
    #![proptest_config(dvm_tests::fuzz::config(300))]

    /// Mutated real frames into a live DVM: no panic, and the network goes quiet.
    #[test]
    fn fuzz_core_message_handlers(picks in proptest::collection::vec((any::<usize>(), mutation()), 1..6)) {
        let corpus = corpus();
        let mut net = Net::boot(8, 2);
        // Half the cases start from a DVM in the middle of a benchmark.
        if picks[0].0 % 2 == 0 {
            net.input(0, Input::Bench { kind: BenchKind::Alternate, count: 3, bytes: 8, fence_movement: None, bcast_movement: None });
            net.run_some(picks[0].0 % 40);
        }
        for (i, m) in &picks {
            let (from, to, mut header, payload) = corpus[i % corpus.len()].clone();
            // A frame arrives on the link of its authenticated peer, with its epoch.
            header.epoch = epoch_of(from);
            let payload = apply(m, &mut header, &payload);
            net.input(to, Input::Frame { from_peer: from, header, payload });
        }
        // Net::run fails the case if the network never goes quiet.
        net.run();
    }
}
