//! Fences without faults: every geometry, subsets, back-to-back and pipelined fences, and
//! hostile input. Outputs are compared with a naive concatenation in daemon order.

mod fence_support;

use std::collections::VecDeque;

use bytes::Bytes;
use dvm_grpcomm::{Effect, FenceError, FenceRequest, FenceSignature, Grpcomm, Participants, Rank, Topology};
use dvm_proto::grpcomm::{grpcomm_msg::Body, FenceContrib, FenceEntry, FenceRelease, GrpcommMsg};
use fence_support::{check, request, Net, XorShift};

fn run_one(n: u32, radix: u32, seed: u64, sig: &FenceSignature, collect: bool) {
    let mut net = Net::new(n, radix, seed);
    let plans = (0..n)
        .map(|r| {
            let mut q = VecDeque::new();
            if sig.participants.contains(r) {
                q.push_back(request(sig, r, 0, collect));
            }
            q
        })
        .collect();
    net.drive(plans, true);
    check(&net, sig, &[collect], true);
    assert!(net.dropped.is_empty(), "{:?}", net.dropped);
    assert!(net.all_quiescent(), "n {n} radix {radix}: state left behind");
}

#[test]
fn barrier_and_modex_in_every_geometry() {
    let all = FenceSignature::new("job1", Participants::All);
    for radix in [2, 3, 64] {
        for n in [1, 2, 7, 16, 64] {
            for seed in 0..3 {
                for collect in [false, true] {
                    run_one(n, radix, seed, &all, collect);
                }
            }
        }
    }
}

#[test]
fn subset_participants() {
    let mut rng = XorShift::new(99);
    for radix in [2, 3, 64] {
        for n in [2, 7, 16, 64, 100] {
            for seed in 0..4 {
                let mut d: Vec<Rank> = (0..n).filter(|_| rng.below(3) == 0).collect();
                if d.is_empty() {
                    d.push(rng.below(n as usize) as Rank);
                }
                let sig = FenceSignature::new(format!("sub{seed}"), Participants::Daemons(d));
                run_one(n, radix, seed, &sig, seed % 2 == 0);
            }
        }
    }
}

#[test]
fn thousand_back_to_back_fences_alternating_barrier_and_modex() {
    for (n, radix) in [(16, 2), (7, 3), (16, 64)] {
        let sig = FenceSignature::new("loop", Participants::All);
        let collects: Vec<bool> = (0..1000).map(|k| k % 2 == 1).collect();
        let mut net = Net::new(n, radix, 7);
        let plans = (0..n)
            .map(|r| collects.iter().enumerate().map(|(k, &c)| request(&sig, r, k as u64, c)).collect())
            .collect();
        net.drive(plans, true);
        check(&net, &sig, &collects, true);
        assert!(net.all_quiescent());
    }
}

#[test]
fn pipelined_fences_and_concurrent_signatures_stay_apart() {
    for (n, radix) in [(16, 2), (30, 3), (64, 64)] {
        let a = FenceSignature::new("a", Participants::All);
        let b = FenceSignature::new("b", Participants::Daemons((0..n).filter(|r| r % 3 != 1).collect()));
        let collects: Vec<bool> = (0..20).map(|k| k % 3 == 0).collect();
        let mut net = Net::new(n, radix, 11);
        let plans = (0..n)
            .map(|r| {
                let mut q = VecDeque::new();
                for (k, &c) in collects.iter().enumerate() {
                    q.push_back(request(&a, r, k as u64, c));
                    if b.participants.contains(r) {
                        q.push_back(request(&b, r, k as u64, c));
                    }
                }
                q
            })
            .collect();
        net.drive(plans, false);
        check(&net, &a, &collects, true);
        check(&net, &b, &collects, true);
        assert!(net.all_quiescent());
    }
}

#[test]
fn refused_starts_fail_locally_with_a_named_error() {
    let mut net = Net::new(4, 2, 1);
    let sig = FenceSignature::new("x", Participants::Daemons(vec![0, 1]));
    let id = net.start(2, request(&sig, 2, 0, false), 0);
    assert_eq!(net.done[2], vec![(id, Err(FenceError::NotParticipant { daemon: 2 }))]);
    let bad = FenceSignature::new("y", Participants::Daemons(vec![1, 9]));
    net.start(1, request(&bad, 1, 0, false), 0);
    assert!(matches!(&net.done[1][0].1, Err(FenceError::Protocol(m)) if m.contains('9')));
    // A refused start does not consume a sequence number.
    let id = net.start(0, request(&sig, 0, 0, false), 0);
    assert_eq!(id.seq, 0);
}

fn contrib(sig: &FenceSignature, seq: u64, movement: u32, count: u32, entries: Vec<FenceEntry>) -> FenceContrib {
    let (all, daemons) = match &sig.participants {
        Participants::All => (true, vec![]),
        Participants::Daemons(d) => (false, d.clone()),
    };
    FenceContrib {
        sig: Some(dvm_proto::grpcomm::FenceSignature { key: sig.key.clone(), all_daemons: all, daemons }),
        seq,
        movement,
        topo_epoch: 0,
        count,
        entries,
        status: 0,
        error: String::new(),
    }
}

fn effects(g: &mut Grpcomm) -> Vec<Effect> {
    g.drain().collect()
}

#[test]
fn hostile_input_is_dropped_or_fails_by_name_never_panics() {
    let sig = FenceSignature::new("h", Participants::All);
    let mut g = Grpcomm::new(Topology::new(0, 2, 7).unwrap(), Default::default());
    let msg = |c: FenceContrib| GrpcommMsg { body: Some(Body::Contrib(c)) };
    // No signature.
    g.handle(1, msg(FenceContrib { sig: None, ..contrib(&sig, 0, 2, 1, vec![]) }));
    // Unsorted participant list.
    let mut c = contrib(&sig, 0, 2, 1, vec![]);
    c.sig.as_mut().unwrap().all_daemons = false;
    c.sig.as_mut().unwrap().daemons = vec![3, 1];
    g.handle(1, msg(c));
    // Rank 5 is not a child of 0 (radix 2, children 1 and 2).
    g.handle(5, msg(contrib(&sig, 0, 2, 1, vec![])));
    // Release with a garbage signature.
    g.handle(1, GrpcommMsg { body: Some(Body::Release(FenceRelease { sig: None, ..Default::default() })) });
    let fx = effects(&mut g);
    assert_eq!(fx.iter().filter(|e| matches!(e, Effect::Dropped { .. })).count(), 4, "{fx:?}");
    assert!(g.is_quiescent());

    // A gather entry for a daemon outside the sender's subtree fails the fence by name.
    let e = FenceEntry { daemon: 2, data: Bytes::from_static(b"x") };
    g.handle(1, msg(contrib(&sig, 0, 3, 1, vec![e])));
    let fx = effects(&mut g);
    assert!(fx.iter().any(|e| matches!(e, Effect::Send { to: 2, .. })), "error released to 2: {fx:?}");
    let id = g
        .fence(FenceRequest { sig: sig.clone(), collect: true, data: Bytes::new(), timeout: None, size_hint: None }, 0);
    assert_eq!(id.seq, 0);
    let fx = effects(&mut g);
    assert!(
        matches!(&fx[..], [Effect::FenceComplete { result: Err(FenceError::Protocol(m)), .. }] if m.contains("daemon 2")),
        "{fx:?}"
    );
    assert!(g.is_quiescent());

    // An unknown movement id agreed by nobody else is a named mismatch, once every slot is in.
    let mut g = Grpcomm::new(Topology::new(0, 2, 3).unwrap(), Default::default());
    g.handle(1, msg(contrib(&sig, 0, 77, 1, vec![])));
    g.handle(2, msg(contrib(&sig, 0, 2, 1, vec![])));
    g.handle(2, msg(contrib(&sig, 0, 2, 1, vec![]))); // duplicate: dropped before merging
    g.fence(FenceRequest { sig: sig.clone(), collect: false, data: Bytes::new(), timeout: None, size_hint: None }, 0);
    let fx = effects(&mut g);
    let want =
        FenceError::MovementMismatch { expected: "tree-barrier".into(), got: "unknown movement 77".into(), daemon: 1 };
    assert!(
        fx.contains(&Effect::FenceComplete { id: dvm_grpcomm::FenceId { sig, seq: 0 }, result: Err(want) }),
        "{fx:?}"
    );
    assert!(g.is_quiescent());
}
