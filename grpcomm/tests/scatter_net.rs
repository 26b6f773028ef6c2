//! Scatter on grpcomm's shared test network (`dvm_grpcomm::testnet::Links`): every live
//! destination receives exactly its own slice, once, also while a relay on its way has not
//! applied the repair its neighbours routed the scatter by.

use bytes::Bytes;
use dvm_grpcomm::testnet::Links as Net;
use dvm_grpcomm::{tags, Topology};

/// Daemon 0 scatters one slice to every live daemon (its bytes name the destination), the
/// network runs to quiescence, and each live daemon's slices are returned by rank.
fn scatter_to_every_survivor(net: &mut Net) -> Vec<Vec<Bytes>> {
    let slices = net.live().into_iter().map(|r| (r, Bytes::from(format!("slice for {r}")))).collect();
    net.with(0, |g| g.scatter(tags::LAUNCH_RESIDUALS, slices));
    net.run();
    (0..net.size()).map(|r| net.scattered[r as usize].iter().map(|s| s.3.clone()).collect()).collect()
}

fn assert_each_got_its_own(net: &Net, got: &[Vec<Bytes>], what: &str) {
    for r in net.live() {
        let own = vec![Bytes::from(format!("slice for {r}"))];
        assert_eq!(got[r as usize], own, "daemon {r} ({what})");
    }
}

/// On a tree every daemon agrees on (no fault, or every survivor repaired) each slice follows
/// the tree: nothing goes over a lateral link.
#[test]
fn a_scatter_on_an_agreed_tree_follows_the_tree_only() {
    for (n, radix) in [(7, 2), (16, 2), (16, 3), (33, 4)] {
        let mut net = Net::new(n, radix, 1);
        let got = scatter_to_every_survivor(&mut net);
        assert_each_got_its_own(&net, &got, &format!("n {n} radix {radix}, no fault"));
        assert_eq!(net.direct_sends(), 0, "n {n} radix {radix}, no fault");
        for victim in 1..n {
            let mut net = Net::new(n, radix, 1);
            net.crash(victim);
            net.repair_all();
            let got = scatter_to_every_survivor(&mut net);
            let what = format!("n {n} radix {radix}, daemon {victim} lost, every survivor repaired");
            assert_each_got_its_own(&net, &got, &what);
            assert_eq!(net.direct_sends(), 0, "{what}");
        }
    }
}

/// Every daemon but one relay (`lagging`) applied the loss of `victim`; daemon 0 scatters.
/// The relay is handed slices by the repaired tree that its own tree would send up to its old
/// parent, or down from a parent it does not know: each must still reach its destination.
/// (Left out: the lagging relay is the victim's parent. Its slices then come from its own
/// parent and go down toward the victim, which its tree holds alive: no daemon on the way can
/// see that anything is stale.)
#[test]
fn a_relay_behind_a_repair_sends_the_slices_routed_by_the_newer_tree_straight() {
    for (n, radix) in [(7, 2), (16, 2), (16, 3), (33, 4)] {
        for victim in 1..n {
            let victim_parent = Topology::new(victim, radix, n).expect("in range").parent();
            for lagging in (1..n).filter(|&r| r != victim && Some(r) != victim_parent) {
                let mut net = Net::new(n, radix, u64::from(victim * 100 + lagging));
                net.crash(victim);
                for r in net.live().into_iter().filter(|&r| r != lagging) {
                    net.repair(r);
                }
                let got = scatter_to_every_survivor(&mut net);
                let what = format!("n {n} radix {radix}, daemon {victim} lost, daemon {lagging} not repaired yet");
                assert_each_got_its_own(&net, &got, &what);
            }
        }
    }
}

/// A relay behind the loss of both its parent and one of its children: its new parent (a
/// daemon its tree does not know as a neighbour) hands it the slices of the lost child's
/// subtree, which its own tree would send down to the dead child.
#[test]
fn a_relay_behind_the_loss_of_its_parent_and_a_child_sends_their_slices_straight() {
    for (n, radix) in [(7, 2), (16, 2), (16, 3), (33, 4)] {
        for lagging in 1..n {
            let own = Topology::new(lagging, radix, n).expect("in range");
            let Some(parent) = own.parent().filter(|&p| p != 0) else { continue };
            for &child in own.children() {
                let mut net = Net::new(n, radix, u64::from(lagging * 100 + child));
                net.crash(parent);
                net.crash(child);
                for r in net.live().into_iter().filter(|&r| r != lagging) {
                    net.repair(r);
                }
                let got = scatter_to_every_survivor(&mut net);
                let what = format!(
                    "n {n} radix {radix}, daemons {parent} and {child} lost, daemon {lagging} not repaired yet"
                );
                assert_each_got_its_own(&net, &got, &what);
            }
        }
    }
}

/// The geometry of the simulator's seed 308715 (16 daemons, radix 2): daemons 1, 2 and 4
/// lost; daemon 8 has not applied it and is handed, by daemon 6 (which has), the slices of 8
/// and 12. Daemon 8's own tree routes 12 up to its dead parent 4.
#[test]
fn the_slice_a_lagging_relay_would_send_to_its_dead_parent_reaches_its_destination() {
    let mut net = Net::new(16, 2, 7);
    for v in [1, 2, 4] {
        net.crash(v);
    }
    for r in net.live().into_iter().filter(|&r| r != 8) {
        net.repair(r);
    }
    assert!(net.node(6).topology().children().contains(&8), "daemon 6 took 8 as its child");
    assert_eq!(net.node(8).topology().parent(), Some(4), "daemon 8 still holds its old parent");
    let got = scatter_to_every_survivor(&mut net);
    assert_each_got_its_own(&net, &got, "seed 308715's geometry");
    assert_eq!(net.direct_sends(), 1, "only the slice for 12 went straight");
}
