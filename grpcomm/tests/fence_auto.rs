//! `auto` fences: each fence goes on the movement its model prices cheaper, from inputs every
//! participant holds alike (participant count, depth, the bytes the previous collecting fence
//! over the signature released, or the caller's hint for the first). Whatever the order of
//! inputs, pipelining and crashes, no participant ever picks another movement than its peers.

mod fence_support;

use std::collections::VecDeque;

use bytes::Bytes;
use dvm_grpcomm::{
    Config, FenceCosts, FenceError, FenceMovementMode, FenceRequest, FenceShape, FenceSignature, LinkModel, Movement,
    Participants, Rank,
};
use fence_support::{members, Net, XorShift};

/// A link on which the crossover falls at a few hundred bytes over a few tens of daemons.
const LINK: LinkModel = LinkModel { alpha_ns: 1_000.0, beta_ns_per_byte: 1.0 };

fn net(n: u32, radix: u32, seed: u64) -> Net {
    Net::with_configs(n, radix, seed, |_| Config {
        fence_movement: FenceMovementMode::Auto,
        link: LINK,
        ..Config::default()
    })
}

/// Daemon `r`'s contribution to fence `seq`: about `len` bytes (± a few, so that daemons
/// differ), derived from both.
fn data(r: Rank, seq: u64, len: usize) -> Bytes {
    let len = len + (r as usize * 3 + seq as usize) % 4;
    Bytes::from((0..len).map(|i| (r as usize * 31 + seq as usize * 7 + i) as u8).collect::<Vec<u8>>())
}

fn request(sig: &FenceSignature, r: Rank, seq: u64, collect: bool, len: usize, hint: Option<u64>) -> FenceRequest {
    FenceRequest { sig: sig.clone(), collect, data: data(r, seq, len), timeout: None, size_hint: hint }
}

fn oracle(sig: &FenceSignature, n: u32, seq: u64, collect: bool, len: usize) -> Bytes {
    if !collect {
        return Bytes::new();
    }
    Bytes::from(members(sig, n).into_iter().flat_map(|r| data(r, seq, len).to_vec()).collect::<Vec<u8>>())
}

fn no_mismatch(net: &Net, what: &str) {
    for (r, done) in net.done.iter().enumerate() {
        for (id, res) in done {
            assert!(
                !matches!(res, Err(FenceError::MovementMismatch { .. })),
                "{what}: daemon {r} fence {}: {res:?}",
                id.seq
            );
        }
    }
    assert!(net.dropped.iter().all(|(_, _, why)| !why.contains("mismatch")), "{what}: {:?}", net.dropped);
}

/// One fence at a time over every daemon of a flat tree of 16: the lateral sends each fence
/// makes say which movement it took, and that follows the previous fence's size.
#[test]
fn auto_moves_each_fence_as_its_model_prices_it() {
    let n = 16;
    let sig = FenceSignature::new("price", Participants::All);
    let mut net = net(n, 64, 1);
    // (collect, bytes per daemon, hint, the movement the model gives for this fence)
    let shape = |bytes: u64| FenceShape { participants: 16, depth: 1, radix: 64, bytes };
    let auto = |collect: bool, bytes: u64| {
        FenceMovementMode::Auto.for_fence(collect, &shape(bytes), &FenceCosts::uniform(LINK))
    };
    let plan: [(bool, usize, Option<u64>); 6] = [
        (true, 100, None),    // first: no estimate, priced as latency-bound
        (true, 2, None),      // priced by fence 0's ~1.6 KB
        (false, 0, None),     // a barrier: no bytes whatever came before
        (true, 100, None),    // priced by fence 1's ~50 B
        (true, 100, Some(1)), // a hint never overrides what was released
        (true, 100, None),
    ];
    let mut released = None::<u64>;
    for (seq, &(collect, len, hint)) in plan.iter().enumerate() {
        let seq = seq as u64;
        let est = if collect { released.or(hint).unwrap_or(0) } else { 0 };
        let want = auto(collect, est);
        let before = net.direct_sends();
        for r in 0..n {
            net.start(r, request(&sig, r, seq, collect, len, hint), 0);
        }
        net.run();
        let lateral = net.direct_sends() > before;
        assert_eq!(lateral, want == Movement::Allgather, "fence {seq}: expected {want:?} (estimate {est})");
        for r in 0..n {
            assert_eq!(net.done[r as usize][seq as usize].1, Ok(oracle(&sig, n, seq, collect, len)), "fence {seq}");
        }
        if collect {
            released = Some(oracle(&sig, n, seq, collect, len).len() as u64);
        }
    }
    // The run above exercised both movements.
    let moves: Vec<Movement> = [0u64, 1600, 50].iter().map(|&b| auto(true, b)).collect();
    assert_eq!(moves, [Movement::TreeGatherRelease, Movement::Allgather, Movement::TreeGatherRelease]);
    assert!(net.all_quiescent());
}

/// The first collecting fence over a signature is priced with the caller's hint: at 4096
/// daemons a few bytes each already belong on the allgather.
#[test]
fn the_first_fence_takes_the_hint() {
    let n = 64;
    let sig = FenceSignature::new("hint", Participants::All);
    for (hint, lateral) in [(None, false), (Some(64 * 64), true)] {
        let mut net = net(n, 64, 2);
        for r in 0..n {
            net.start(r, request(&sig, r, 0, true, 64, hint), 0);
        }
        net.run();
        assert_eq!(net.direct_sends() > 0, lateral, "hint {hint:?}");
        for r in 0..n {
            assert_eq!(net.done[r as usize][0].1, Ok(oracle(&sig, n, 0, true, 64)));
        }
    }
}

/// A participant that starts collecting fence k+1 while fence k is in flight here waits to
/// choose k+1's movement until k has released: pipelined starts never split the choice.
#[test]
fn a_pipelined_collecting_fence_waits_for_its_price() {
    let n = 16;
    let sig = FenceSignature::new("pipe", Participants::All);
    let mut net = net(n, 64, 3);
    // Daemon 0 starts fences 0 (large) and 1 (small) back to back before anything moves; the
    // others start fence 1 only once fence 0 completed for them.
    net.start(0, request(&sig, 0, 0, true, 200, None), 0);
    net.start(0, request(&sig, 0, 1, true, 2, None), 0);
    assert!(net.done[0].is_empty());
    for r in 1..n {
        net.start(r, request(&sig, r, 0, true, 200, None), 0);
    }
    net.run();
    for r in 1..n {
        net.start(r, request(&sig, r, 1, true, 2, None), 0);
    }
    net.run();
    no_mismatch(&net, "pipelined");
    for r in 0..n {
        let got: Vec<_> = net.done[r as usize].iter().map(|(id, res)| (id.seq, res.clone())).collect();
        assert_eq!(got, [(0, Ok(oracle(&sig, n, 0, true, 200))), (1, Ok(oracle(&sig, n, 1, true, 2)))], "daemon {r}");
    }
    assert!(net.all_quiescent());
}

/// The property: any geometry, any sizes (so that the estimate crosses the crossover up and
/// down), any interleaving, pipelined or not, with crashes of relays and participants: no
/// participant ever fails a fence by a movement mismatch; without a lost participant every
/// fence returns the oracle's bytes everywhere, with one, each survivor returns them or the
/// lost-participant error.
#[test]
fn auto_never_splits_participants() {
    let mut rng = XorShift::new(0xa070);
    let mut both = [0u32; 2];
    for seed in 0..600u64 {
        let (n, radix) = [(16, 64), (27, 3), (12, 2), (40, 4), (9, 64), (5, 2)][seed as usize % 6];
        let subset = seed % 3 == 1;
        let participants: Vec<Rank> =
            if subset { (0..n).filter(|_| rng.below(4) != 0).collect() } else { (0..n).collect() };
        if participants.is_empty() {
            continue;
        }
        let sig = FenceSignature::new("prop", Participants::Daemons(participants.clone()));
        let k = 6 + rng.below(10);
        let steps: Vec<(bool, usize, Option<u64>)> = (0..k)
            .map(|_| {
                let collect = rng.below(4) != 0;
                let len = [0usize, 1, 4, 16, 64, 256][rng.below(6)];
                (collect, len, (rng.below(2) == 0).then(|| rng.below(20_000) as u64))
            })
            .collect();
        // The first fence's hint must be the same everywhere; later ones are never read.
        let mut net = net(n, radix, seed);
        let crash = seed % 4 == 3;
        let victim = if crash { rng.below(n as usize) as Rank } else { u32::MAX };
        if crash {
            net.scheduled_crashes = vec![(rng.below(k * n as usize * 4) as u64, victim)];
        }
        let plans: Vec<VecDeque<FenceRequest>> = (0..n)
            .map(|r| {
                if !participants.contains(&r) {
                    return VecDeque::new();
                }
                steps.iter().enumerate().map(|(s, &(c, len, hint))| request(&sig, r, s as u64, c, len, hint)).collect()
            })
            .collect();
        let sequential = seed % 2 == 0;
        net.drive(plans, sequential);
        let what = format!("seed {seed} n {n} radix {radix} crash {crash} victim {victim} sequential {sequential}");
        no_mismatch(&net, &what);
        let lost_one = crash && participants.contains(&victim);
        for &r in participants.iter().filter(|&&r| net.is_alive(r)) {
            let mut got: Vec<_> = net.done[r as usize].clone();
            got.sort_by_key(|(id, _)| id.seq);
            assert_eq!(got.len(), k, "{what}: daemon {r} completed {} of {k}", got.len());
            for (s, (id, res)) in got.iter().enumerate() {
                let (c, len, _) = steps[s];
                let want = oracle(&sig, n, s as u64, c, len);
                let ok = res.as_ref() == Ok(&want)
                    || (lost_one && matches!(res, Err(FenceError::LostConnection { lost }) if lost == &vec![victim]));
                assert!(ok, "{what}: daemon {r} fence {}: {res:?}", id.seq);
            }
        }
        assert!(net.all_quiescent(), "{what}: state left behind");
        if !crash {
            // Count seeds in which the sizes crossed the crossover both ways.
            let mut prev = None::<u64>;
            let mut seen = [false; 2];
            for (s, &(c, len, hint)) in steps.iter().enumerate() {
                if !c {
                    continue;
                }
                let depth = dvm_rml::topology::Tree::new(radix, n).unwrap().depth(*participants.last().unwrap());
                let shape = FenceShape {
                    participants: participants.len() as u64,
                    depth,
                    radix,
                    bytes: prev.or(hint).unwrap_or(0),
                };
                let m = FenceMovementMode::Auto.for_fence(true, &shape, &FenceCosts::uniform(LINK));
                seen[usize::from(m == Movement::Allgather)] = true;
                prev = Some(oracle(&sig, n, s as u64, true, len).len() as u64);
            }
            both[0] += u32::from(seen[0] && seen[1]);
            both[1] += 1;
        }
    }
    assert!(both[0] * 4 > both[1], "the estimate crossed the crossover in {} of {} clean runs", both[0], both[1]);
}

/// A deferred collecting fence keeps its timeout: it fails when its deadline passes, even
/// though the fence it waits for never completes (its other participants never start it).
#[test]
fn a_deferred_fence_times_out_on_time() {
    let n = 4;
    let sig = FenceSignature::new("late", Participants::All);
    let mut net = net(n, 2, 4);
    net.start(3, request(&sig, 3, 0, true, 16, None), 0);
    let timed = FenceRequest { timeout: Some(1_000), ..request(&sig, 3, 1, true, 16, None) };
    net.start(3, timed, 0);
    net.run();
    assert!(net.done[3].is_empty(), "nothing can complete yet");
    for r in 0..n {
        net.tick(r, 1_000);
    }
    net.run();
    for r in 0..n {
        net.tick(r, 2_000);
    }
    net.run();
    let got: Vec<_> = net.done[3].iter().map(|(id, res)| (id.seq, res.clone())).collect();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, 1);
    assert!(matches!(got[0].1, Err(FenceError::Timeout { timeout_ns: 1_000, daemon: 3 })), "{got:?}");
}
