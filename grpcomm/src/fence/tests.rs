//! State accounting of the fence machine, checked on `FenceState` itself (the integration
//! tests in `tests/fence_*.rs` cover behaviour across many daemons).

use std::collections::BTreeSet;

use bytes::Bytes;
use dvm_proto::grpcomm::{grpcomm_msg::Body, GrpcommMsg};

use super::types::FenceResult;
use super::*;
use crate::testnet::Links;
use crate::Effect;

fn daemons(n: u32) -> Links {
    Links::new(n, 2, 0)
}

/// Run the shared test network until nothing moves; returns the completions since the last
/// call, in rank order.
fn settle(net: &mut Links) -> Vec<(Rank, FenceResult)> {
    net.run();
    let mut done = Vec::new();
    for (r, d) in net.done.iter_mut().enumerate() {
        done.extend(d.drain(..).map(|(_, res)| (r as Rank, res)));
    }
    done
}

fn modex(sig: &FenceSignature, data: &'static [u8]) -> FenceRequest {
    FenceRequest { sig: sig.clone(), collect: true, data: Bytes::from_static(data), timeout: Some(10), size_hint: None }
}

#[test]
fn state_is_held_while_pending_and_released_after() {
    let sig = FenceSignature::new("s", Participants::All);
    let mut net = daemons(3);
    net.start(1, modex(&sig, b"one"), 0);
    net.start(2, modex(&sig, b"two"), 0);
    settle(&mut net);
    let root = &net.node(0).fence;
    assert!(root.state_bytes() > 0 && !root.is_quiescent(), "root holds two child slots");
    assert!(net.node(1).fence.state_bytes() > 0, "a sent-up participant keeps its own slot until release");
    net.start(0, modex(&sig, b"zero"), 0);
    let done = settle(&mut net);
    assert_eq!(done.len(), 3);
    assert!(done.iter().all(|(_, r)| r == &Ok(Bytes::from_static(b"zeroonetwo"))));
    for r in 0..3 {
        assert_eq!(net.node(r).fence.state_bytes(), 0);
        assert!(net.node(r).fence.is_quiescent());
    }
}

#[test]
fn stash_and_early_errors_are_accounted_and_consumed() {
    let sig = FenceSignature::new("s", Participants::All);
    let mut net = daemons(3);
    // A contribution from a newer topology epoch waits in the stash.
    net.node_mut(2).fence(modex(&sig, b"two"), 0);
    let Some(Effect::Send { msg, .. }) = net.node_mut(2).drain().find(|e| matches!(e, Effect::Send { .. })) else {
        panic!("daemon 2 sends its contribution up")
    };
    let Some(Body::Contrib(mut c)) = msg.body else { panic!("a contribution") };
    c.topo_epoch = 1;
    net.node_mut(0).handle(2, GrpcommMsg { body: Some(Body::Contrib(c)) });
    assert!(net.node(0).fence.state_bytes() > 0 && !net.node(0).fence.is_quiescent());

    // Daemon 1 times out; the root releases the error; daemon 0 has not started: early error.
    let mut net = daemons(3);
    net.start(1, modex(&sig, b"one"), 0);
    net.tick(1, 10);
    let done = settle(&mut net);
    let err = FenceError::Timeout { timeout_ns: 10, daemon: 1 };
    assert_eq!(done, vec![(1, Err(err.clone()))]);
    assert!(net.node(0).fence.state_bytes() > 0, "root remembers the error for its own later start");
    assert!(net.node(0).fence.is_quiescent(), "an early error is not an operation in flight");
    net.start(0, modex(&sig, b"zero"), 0);
    assert_eq!(settle(&mut net), vec![(0, Err(err))]);
    assert_eq!(net.node(0).fence.state_bytes(), 0);

    // A repair that loses a participant: the root fails the fence and releases the error to
    // its live children; a non-root sends the error up and waits for the root's word.
    let fence_msg = |e: &Effect| match e {
        Effect::Send { to, msg: GrpcommMsg { body: Some(b @ (Body::Contrib(_) | Body::Release(_))) }, .. } => {
            Some((*to, b.clone()))
        }
        _ => None,
    };
    let failed: BTreeSet<Rank> = [2].into_iter().collect();
    let lost = Err(FenceError::LostConnection { lost: vec![2] });
    let mut net = daemons(3);
    net.node_mut(0).fence(modex(&sig, b"zero"), 0);
    net.node_mut(1).fence(modex(&sig, b"one"), 0);
    net.node_mut(1).drain().for_each(drop);
    net.node_mut(0).topology_changed(&failed).unwrap();
    let fx: Vec<Effect> = net.node_mut(0).drain().collect();
    assert!(fx.contains(&Effect::FenceComplete { id: FenceId { sig: sig.clone(), seq: 0 }, result: lost.clone() }));
    let sent: Vec<(Rank, Body)> = fx.iter().filter_map(fence_msg).collect();
    assert!(matches!(&sent[..], [(1, Body::Release(r))] if r.status != 0), "{sent:?}");
    assert!(net.node(0).fence.is_quiescent() && net.node(0).fence.state_bytes() == 0);
    net.node_mut(1).topology_changed(&failed).unwrap();
    let fx: Vec<Effect> = net.node_mut(1).drain().collect();
    let sent: Vec<(Rank, Body)> = fx.iter().filter_map(fence_msg).collect();
    assert!(matches!(&sent[..], [(0, Body::Contrib(c))] if c.status != 0 && c.topo_epoch == 1), "{sent:?}");
    assert!(!fx.iter().any(|e| matches!(e, Effect::FenceComplete { .. })), "waits for the root: {fx:?}");
    assert!(!net.node(1).fence.is_quiescent());
}

#[test]
fn every_daemon_holds_only_the_last_successful_result() {
    let sig = FenceSignature::new("s", Participants::All);
    let mut net = daemons(3);
    for data in [&b"aaaa"[..], b"bbbbbbbb", b"cccccccccccc"] {
        for r in 0..3 {
            net.start(r, FenceRequest { data: Bytes::from_static(data), ..modex(&sig, b"") }, 0);
        }
        assert_eq!(settle(&mut net).len(), 3);
    }
    for r in 0..3 {
        // 3 x 12 bytes of the last fence; kept, the first two would add 3 x 4 + 3 x 8.
        assert_eq!(net.node(r).fence.held_bytes(), 36, "daemon {r}");
    }
}
