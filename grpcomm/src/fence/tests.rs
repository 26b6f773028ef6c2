//! State accounting of the fence machine, checked on `FenceState` itself (the integration
//! tests in `tests/fence_*.rs` cover behaviour across many daemons).

use std::collections::BTreeSet;

use bytes::Bytes;
use dvm_proto::grpcomm::{grpcomm_msg::Body, GrpcommMsg};

use super::*;
use crate::{Config, Grpcomm, Topology};

fn daemons(n: u32) -> Vec<Grpcomm> {
    (0..n).map(|r| Grpcomm::new(Topology::new(r, 2, n).unwrap(), Config::default())).collect()
}

/// Deliver every Send (to its named neighbour) until nothing moves; returns completions.
fn settle(g: &mut [Grpcomm]) -> Vec<(Rank, FenceResult)> {
    let mut done = Vec::new();
    loop {
        let mut moved = false;
        for r in 0..g.len() {
            let fx: Vec<Effect> = g[r].drain().collect();
            for e in fx {
                match e {
                    Effect::Send { to, msg, .. } => {
                        moved = true;
                        if (to as usize) < g.len() {
                            g[to as usize].handle(r as Rank, msg);
                        }
                    }
                    Effect::FenceComplete { result, .. } => done.push((r as Rank, result)),
                    _ => {}
                }
            }
        }
        if !moved {
            return done;
        }
    }
}

fn modex(sig: &FenceSignature, data: &'static [u8]) -> FenceRequest {
    FenceRequest { sig: sig.clone(), collect: true, data: Bytes::from_static(data), timeout: Some(10) }
}

#[test]
fn state_is_held_while_pending_and_released_after() {
    let sig = FenceSignature::new("s", Participants::All);
    let mut g = daemons(3);
    g[1].fence(modex(&sig, b"one"), 0);
    g[2].fence(modex(&sig, b"two"), 0);
    settle(&mut g);
    assert!(g[0].fence.state_bytes() > 0 && !g[0].fence.is_quiescent(), "root holds two child slots");
    assert!(g[1].fence.state_bytes() > 0, "a sent-up participant keeps its own slot until release");
    g[0].fence(modex(&sig, b"zero"), 0);
    let done = settle(&mut g);
    assert_eq!(done.len(), 3);
    assert!(done.iter().all(|(_, r)| r == &Ok(Bytes::from_static(b"zeroonetwo"))));
    for d in &g {
        assert_eq!(d.fence.state_bytes(), 0);
        assert!(d.fence.is_quiescent());
    }
}

#[test]
fn stash_and_early_errors_are_accounted_and_consumed() {
    let sig = FenceSignature::new("s", Participants::All);
    let mut g = daemons(3);
    // A contribution from a newer topology epoch waits in the stash.
    g[2].fence(modex(&sig, b"two"), 0);
    let Some(Effect::Send { msg, .. }) = g[2].drain().find(|e| matches!(e, Effect::Send { .. })) else {
        panic!("daemon 2 sends its contribution up")
    };
    let Some(Body::Contrib(mut c)) = msg.body else { panic!("a contribution") };
    c.topo_epoch = 1;
    g[0].handle(2, GrpcommMsg { body: Some(Body::Contrib(c)) });
    assert!(g[0].fence.state_bytes() > 0 && !g[0].fence.is_quiescent());

    // Daemon 1 times out; the root releases the error; daemon 0 has not started: early error.
    let mut g = daemons(3);
    g[1].fence(modex(&sig, b"one"), 0);
    g[1].tick(10);
    let done = settle(&mut g);
    let err = FenceError::Timeout { timeout_ns: 10, daemon: 1 };
    assert_eq!(done, vec![(1, Err(err.clone()))]);
    assert!(g[0].fence.state_bytes() > 0, "root remembers the error for its own later start");
    assert!(g[0].fence.is_quiescent(), "an early error is not an operation in flight");
    g[0].fence(modex(&sig, b"zero"), 0);
    assert_eq!(settle(&mut g), vec![(0, Err(err))]);
    assert_eq!(g[0].fence.state_bytes(), 0);

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
    let mut g = daemons(3);
    g[0].fence(modex(&sig, b"zero"), 0);
    g[1].fence(modex(&sig, b"one"), 0);
    g[1].drain().for_each(drop);
    g[0].topology_changed(&failed).unwrap();
    let fx: Vec<Effect> = g[0].drain().collect();
    assert!(fx.contains(&Effect::FenceComplete { id: FenceId { sig: sig.clone(), seq: 0 }, result: lost.clone() }));
    let sent: Vec<(Rank, Body)> = fx.iter().filter_map(fence_msg).collect();
    assert!(matches!(&sent[..], [(1, Body::Release(r))] if r.status != 0), "{sent:?}");
    assert!(g[0].fence.is_quiescent() && g[0].fence.state_bytes() == 0);
    g[1].topology_changed(&failed).unwrap();
    let fx: Vec<Effect> = g[1].drain().collect();
    let sent: Vec<(Rank, Body)> = fx.iter().filter_map(fence_msg).collect();
    assert!(matches!(&sent[..], [(0, Body::Contrib(c))] if c.status != 0 && c.topo_epoch == 1), "{sent:?}");
    assert!(!fx.iter().any(|e| matches!(e, Effect::FenceComplete { .. })), "waits for the root: {fx:?}");
    assert!(!g[1].fence.is_quiescent());
}
