//! The rules by which a client's procs become a fence: order-free keys, the daemons that take
//! part, refusals that name the proc, and which namespaces may still come.

use super::*;
use crate::jobmap::Layout;
use crate::jobs::nspace_of;

/// 6 ranks in blocks of 2 on daemons 1, 2 and 3.
fn six_on_three() -> Placement {
    Placement::new(6, vec![0], vec![(1, 3)], Layout::Block { each: 2 }).unwrap()
}

fn p(nspace: &str, rank: u32) -> Proc<'_> {
    Proc { nspace, rank: Some(rank) }
}

fn all(nspace: &str) -> Proc<'_> {
    Proc { nspace, rank: None }
}

fn daemons(sig: &FenceSignature) -> Vec<Rank> {
    match &sig.participants {
        Participants::Daemons(d) => d.clone(),
        Participants::All => panic!("a PMIx fence names its daemons"),
    }
}

/// The canonical text depends on the set only, never on the order libpmix gave.
#[test]
fn canonical_set_is_order_free() {
    let a = vec![p("b", 1), p("a", 3), p("a", 0), p("a", 1), p("a", 2), p("b", 0), p("a", 7)];
    let mut b = a.clone();
    b.reverse();
    assert_eq!(canonical(&a), "a:0-3,7;b:0-1");
    assert_eq!(canonical(&a), canonical(&b));
    assert_eq!(canonical(&[p("a", 2), all("a"), p("c", 5)]), "a:*;c:5");
    assert_eq!(canonical(&[all("a"), p("a", 2)]), "a:*", "a wildcard covers the ranks after it too");
}

/// A job's fence: the same key and daemons on every daemon whatever the order and repeats;
/// a wildcard takes every daemon of the job.
#[test]
fn a_job_fence_is_keyed_by_its_rank_set_and_takes_their_daemons() {
    let pl = six_on_three();
    let (sig, n) = job_fence("ns", &[p("ns", 5), p("ns", 0), p("ns", 5)], &pl);
    assert_eq!(&sig.key[..], b"ns:0,5");
    assert_eq!(daemons(&sig), vec![1, 3]);
    assert_eq!(n, 3, "the procs as named, for the size hint");
    let (other_order, _) = job_fence("ns", &[p("ns", 0), p("ns", 5)], &pl);
    assert_eq!(other_order, sig);
    let (wild, n) = job_fence("ns", &[p("ns", 1), all("ns")], &pl);
    assert_eq!((&wild.key[..], daemons(&wild), n), (&b"ns:*"[..], vec![1, 2, 3], 6));
    // A rank beyond the job adds no daemon (libpmix checked the procs it lets through).
    let (beyond, _) = job_fence("ns", &[p("ns", 2), p("ns", 9)], &pl);
    assert_eq!(daemons(&beyond), vec![2]);
}

/// The daemons of a collective across jobs; an unknown job or a rank it does not have is
/// refused naming the proc.
#[test]
fn a_union_takes_every_named_jobs_daemons_and_names_what_it_refuses() {
    let (a, b) = (six_on_three(), Placement::new(2, vec![0], vec![(0, 1), (4, 1)], Layout::RoundRobin).unwrap());
    let lookup = |ns: &str| match ns {
        "a" => Some(&a),
        "b" => Some(&b),
        _ => None,
    };
    assert_eq!(daemons_of(&[p("a", 3), all("b")], lookup), Ok(vec![0, 2, 4]));
    assert_eq!(daemons_of(&[p("a", 0), p("x", 1)], lookup), Err("x:1 is of no job this DVM runs".to_string()));
    assert_eq!(daemons_of(&[p("b", 2)], lookup), Err("b:2: the job has 2 ranks".to_string()));
    let sig = union_fence("connect", None, &[p("b", 1), p("a", 0), p("b", 0)], vec![0, 1, 4]);
    assert_eq!(&sig.key[..], b"connect|a:0;b:0-1");
    let grp = union_fence("group", Some("g7"), &[p("a", 0)], vec![1]);
    assert_eq!(&grp.key[..], b"group|g7|a:0");
}

#[test]
fn only_a_later_job_of_this_dvm_may_still_come() {
    let ns = |j: u32| nspace_of("abc", j);
    // Later jobs, within reach, may come; the last one learned and earlier ones never do.
    assert!(may_still_come(&ns(8), Some(7)));
    assert!(may_still_come(&ns(7 + MAX_JOBS_AHEAD), Some(7)));
    assert!(may_still_come(&ns(1), None));
    assert!(!may_still_come(&ns(7), Some(7)));
    assert!(!may_still_come(&ns(3), Some(7)));
    assert!(!may_still_come(&ns(8 + MAX_JOBS_AHEAD), Some(7)));
    // Names that are no job namespace at all.
    for bad in ["", "bogus", "dvm-abc-job", "dvm-abc-jobx", "dvm-abc-job+9", "other-job9", "dvm-abc-job99999999999"] {
        assert!(!may_still_come(bad, Some(7)), "{bad:?}");
    }
}
