//! The invariants every run must satisfy, judged from its trace against independent oracles
//! (the scenario's own record of what was started and contributed).

use std::collections::{BTreeMap, BTreeSet};

use bytes::{Bytes, BytesMut};
use dvm_grpcomm::{FenceError, Participants, Rank};

use crate::scenario::{FenceChain, Scenario};
use crate::trace::{Delivery, FenceCall, Trace};

/// Same bytes (cheap when both are views of one buffer).
fn same(a: &Bytes, b: &Bytes) -> bool {
    (a.as_ptr() == b.as_ptr() && a.len() == b.len()) || a == b
}

fn same_delivery(a: &Delivery, b: &Delivery) -> bool {
    a.op_id == b.op_id && a.origin == b.origin && a.tag == b.tag && same(&a.payload, &b.payload)
}

fn show(b: &Bytes) -> String {
    if b.len() <= 48 {
        format!("{:?}", String::from_utf8_lossy(b))
    } else {
        format!("{:?}..({} bytes)", String::from_utf8_lossy(&b[..40]), b.len())
    }
}

/// Every violated invariant of one run, each naming the daemon and operation.
pub fn check(sc: &Scenario, t: &Trace) -> Vec<String> {
    let mut v: Vec<String> = t.engine_errors.clone();
    let alive = |r: Rank| t.final_alive[r as usize];
    let survivors: Vec<Rank> = (0..sc.n).filter(|&r| alive(r)).collect();
    check_xcast(sc, t, &survivors, &mut v);
    check_fences(sc, t, &mut v);
    check_scatter(t, &mut v);

    for &r in &survivors {
        if !t.final_quiescent[r as usize] {
            v.push(format!(
                "daemon {r}: not quiescent at the end (t={} ns): a tracker or op was left behind",
                t.end_ns
            ));
        }
    }
    if t.end_ns > sc.bound_ns {
        v.push(format!("run ended at t={} ns, past the bound of {} ns", t.end_ns, sc.bound_ns));
    }
    if t.crashes.is_empty() {
        for (d, from, reason) in t.dropped.iter().take(3) {
            v.push(format!("daemon {d}: dropped a message from {from} in a run without crashes: {reason}"));
        }
        if t.stats.unroutable + t.stats.looped + t.stats.refused > 0 {
            v.push(format!(
                "carrier lost messages in a run without crashes: {} unroutable, {} looped, {} refused",
                t.stats.unroutable, t.stats.looped, t.stats.refused
            ));
        }
    }
    v
}

fn check_xcast(sc: &Scenario, t: &Trace, survivors: &[Rank], v: &mut Vec<String>) {
    // Exactly once, in op-id order, no gap, on every daemon (crashed ones up to their crash).
    for r in 0..sc.n {
        let first_op = t.initial_next_op[r as usize];
        if let Some((expect, d)) = (first_op..).zip(&t.deliveries[r as usize]).find(|(expect, d)| d.op_id != *expect) {
            v.push(format!(
                "daemon {r}: delivered xcast op {} (origin {}, tag {}) where op {expect} was next",
                d.op_id, d.origin, d.tag
            ));
        }
    }
    let Some(&first) = survivors.first() else {
        return;
    };
    let reference = &t.deliveries[first as usize];
    for &r in survivors {
        let mine = &t.deliveries[r as usize];
        if mine.len() != reference.len() || !mine.iter().zip(reference).all(|(a, b)| same_delivery(a, b)) {
            let at = mine
                .iter()
                .zip(reference)
                .position(|(a, b)| !same_delivery(a, b))
                .unwrap_or(mine.len().min(reference.len()));
            v.push(format!(
                "daemon {r}: delivered {} xcasts, daemon {first} {}; first difference at position {at}",
                mine.len(),
                reference.len()
            ));
        }
        if t.final_next_op[r as usize] != t.initial_next_op[r as usize] + mine.len() as u64 {
            v.push(format!(
                "daemon {r}: xcast_next_op() is {} after delivering {} ops from {}",
                t.final_next_op[r as usize],
                mine.len(),
                t.initial_next_op[r as usize]
            ));
        }
    }
    for r in 0..sc.n {
        if survivors.contains(&r) {
            continue;
        }
        for d in &t.deliveries[r as usize] {
            if !reference.iter().any(|x| same_delivery(x, d)) {
                v.push(format!(
                    "crashed daemon {r}: delivered op {} (origin {}) that the survivors never delivered",
                    d.op_id, d.origin
                ));
            }
        }
    }
    // Every delivered op was started by someone; every op a survivor started was delivered
    // exactly once and completed exactly once on its origin, with the same op id.
    for d in reference {
        if !t.xcast_starts.iter().any(|s| s.daemon == d.origin && s.tag == d.tag && same(&s.payload, &d.payload)) {
            v.push(format!(
                "op {}: delivered from origin {} (tag {}) but no such xcast was started",
                d.op_id, d.origin, d.tag
            ));
        }
    }
    for s in &t.xcast_starts {
        let survived = t.final_alive[s.daemon as usize];
        let got: Vec<&Delivery> = reference
            .iter()
            .filter(|d| d.origin == s.daemon && d.tag == s.tag && same(&d.payload, &s.payload))
            .collect();
        let done: Vec<&(Rank, _, u64, u64)> =
            t.xcast_completes.iter().filter(|c| c.0 == s.daemon && c.1 == s.id).collect();
        if got.len() > 1 {
            v.push(format!("xcast {:?} from daemon {} delivered {} times", s.id, s.daemon, got.len()));
        }
        if done.len() > 1 {
            v.push(format!("xcast {:?}: XcastComplete fired {} times on daemon {}", s.id, done.len(), s.daemon));
        }
        if survived {
            if got.is_empty() {
                v.push(format!(
                    "xcast {:?} (tag {}, {}) started by surviving daemon {} at t={} was never delivered",
                    s.id,
                    s.tag,
                    show(&s.payload),
                    s.daemon,
                    s.at
                ));
            }
            if done.is_empty() {
                v.push(format!(
                    "xcast {:?} started by surviving daemon {} at t={}: no XcastComplete",
                    s.id, s.daemon, s.at
                ));
            }
        }
        if let (Some(g), Some(c)) = (got.first(), done.first()) {
            if g.op_id != c.2 {
                v.push(format!(
                    "xcast {:?}: XcastComplete says op {} but it was delivered as op {}",
                    s.id, c.2, g.op_id
                ));
            }
        }
    }
}

fn concat<'a>(parts: impl Iterator<Item = &'a Bytes>) -> Bytes {
    let mut b = BytesMut::new();
    for p in parts {
        b.extend_from_slice(p);
    }
    b.freeze()
}

/// Whether a fence lost no participant: none of its members (every daemon for
/// `Participants::All`, which counts a failed daemon as a lost participant) crashed before
/// the fence ended. Crashes of non-participant relays do not count: those fences must
/// re-converge after the repair.
fn clean(t: &Trace, chain: &FenceChain, end: u64) -> bool {
    t.crashes.iter().all(|&(r, at)| at >= end || !chain.members.contains(&r))
}

fn check_fences(sc: &Scenario, t: &Trace, v: &mut Vec<String>) {
    let mut groups: BTreeMap<(usize, usize), Vec<&FenceCall>> = BTreeMap::new();
    for c in &t.fence_calls {
        groups.entry((c.chain, c.step)).or_default().push(c);
    }
    for ((ci, step), calls) in groups {
        let chain = &sc.chains[ci];
        let name = format!("fence chain {ci} ({}) step {step}", if calls[0].collect { "modex" } else { "barrier" });
        let seqs: BTreeSet<u64> = calls.iter().map(|c| c.id.seq).collect();
        if seqs.len() > 1 {
            v.push(format!("{name}: daemons disagree on the sequence number: {seqs:?}"));
        }
        let live: Vec<&&FenceCall> = calls.iter().filter(|c| t.final_alive[c.daemon as usize]).collect();
        let mut hung = false;
        for c in &live {
            if c.done.is_none() {
                hung = true;
                v.push(format!(
                    "{name} (seq {}): never completed on surviving daemon {} (called at t={})",
                    c.id.seq, c.daemon, c.at
                ));
            }
        }
        if hung || live.is_empty() {
            continue;
        }
        let results: Vec<(Rank, u64, &Result<Bytes, FenceError>)> =
            live.iter().map(|c| (c.daemon, c.done.as_ref().unwrap().0, &c.done.as_ref().unwrap().1)).collect();
        // A movement without a release (the allgather) lets each participant finish on its
        // own: when a participant is lost mid-exchange, survivors that already held every block
        // keep their result while the others fail with LostConnection. Oks must still agree
        // with each other (and the oracle), errors with each other.
        let release_free = sc.cfg.fence_movement != dvm_grpcomm::FenceMovementMode::Tree;
        let end_all = results.iter().map(|x| x.1).max().unwrap_or(0);
        let may_split = release_free && !clean(t, chain, end_all);
        let firsts: Vec<(Rank, u64, &Result<Bytes, FenceError>)> = if may_split {
            let ok = results.iter().find(|x| x.2.is_ok()).copied();
            let err = results.iter().find(|x| x.2.is_err()).copied();
            ok.into_iter().chain(err).collect()
        } else {
            vec![results[0]]
        };
        let (r0, _, res0) = firsts[0];
        for &(r, _, res) in &results[1..] {
            let equal = firsts.iter().any(|&(_, _, first)| match (first, res) {
                (Ok(a), Ok(b)) => same(a, b),
                (Err(a), Err(b)) => a == b,
                _ => false,
            });
            if !equal {
                v.push(format!(
                    "{name}: daemon {r0} returned {} but daemon {r} returned {}",
                    fmt_res(res0),
                    fmt_res(res)
                ));
            }
        }
        let end = results.iter().map(|x| x.1).max().unwrap_or(0);
        if end > sc.bound_ns {
            v.push(format!("{name}: completed at t={end} ns, past the bound of {} ns", sc.bound_ns));
        }
        // Every result equals one of `firsts` (checked above), so the oracle judges those.
        for &(r0, _, res0) in &firsts {
            let mut callers: Vec<&&FenceCall> = calls.iter().collect();
            callers.sort_by_key(|c| c.daemon);
            match res0 {
                Ok(out) => {
                    let who: Vec<Rank> = callers.iter().map(|c| c.daemon).collect();
                    if who != chain.members {
                        v.push(format!(
                            "{name}: daemon {r0} reports success but only daemons {who:?} of {:?} contributed",
                            chain.members
                        ));
                    }
                    let expect =
                        if callers[0].collect { concat(callers.iter().map(|c| &c.data)) } else { Bytes::new() };
                    if !same(out, &expect) {
                        v.push(format!(
                            "{name}: daemon {r0} returned {} but the contributions in daemon order are {}",
                            show(out),
                            show(&expect)
                        ));
                    }
                }
                Err(FenceError::LostConnection { lost }) => {
                    for x in lost {
                        let member = match &chain.sig.participants {
                            Participants::All => true,
                            Participants::Daemons(m) => m.contains(x),
                        };
                        if t.crash_time(*x).is_none() || !member {
                            v.push(format!(
                                "{name}: daemon {r0} reports lost participant {x}, which is not a crashed participant"
                            ));
                        }
                    }
                }
                // A timeout is an answer only to a fence that asked for one; nothing else may fail
                // a fence in these schedules (no forced movement, every caller a participant).
                Err(FenceError::Timeout { .. }) if chain.steps[step].timeout.is_some() => {}
                Err(e) => v.push(format!("{name}: daemon {r0} failed with an error no schedule can cause: {e}")),
            }
        }
        let no_timeout = chain.steps[step].timeout.is_none();
        if no_timeout && results.iter().any(|x| x.2.is_err()) && clean(t, chain, end) {
            let (r, _, res) = results.iter().find(|x| x.2.is_err()).unwrap();
            v.push(format!(
                "{name} (seq {}): lost no participant but failed: daemon {r} returned {}",
                calls[0].id.seq,
                fmt_res(res)
            ));
        }
        // Keep the report readable when everything disagrees.
        if v.len() > 200 {
            return;
        }
    }
}

fn fmt_res(r: &Result<Bytes, FenceError>) -> String {
    match r {
        Ok(b) => format!("Ok({})", show(b)),
        Err(e) => format!("Err({e})"),
    }
}

fn check_scatter(t: &Trace, v: &mut Vec<String>) {
    let mut seen: BTreeSet<(Rank, u64, Rank)> = BTreeSet::new();
    for g in &t.scatter_got {
        let Some(s) = t.scatter_starts.iter().find(|s| s.daemon == g.origin && s.scatter_id == g.scatter_id) else {
            v.push(format!(
                "daemon {}: got a slice of scatter {}:{} that was never started",
                g.daemon, g.origin, g.scatter_id
            ));
            continue;
        };
        if !seen.insert((g.origin, g.scatter_id, g.daemon)) {
            v.push(format!("daemon {}: got its slice of scatter {}:{} twice", g.daemon, g.origin, g.scatter_id));
        }
        match s.slices.iter().find(|(d, _)| *d == g.daemon) {
            None => v.push(format!(
                "daemon {}: got a slice of scatter {}:{} addressed to nobody there",
                g.daemon, g.origin, g.scatter_id
            )),
            Some((_, data)) if !same(data, &g.data) || g.tag != s.tag => v.push(format!(
                "daemon {}: scatter {}:{} slice is {} (tag {}), origin's map says {} (tag {})",
                g.daemon,
                g.origin,
                g.scatter_id,
                show(&g.data),
                g.tag,
                show(data),
                s.tag
            )),
            Some(_) => {}
        }
    }
    if t.crashes.is_empty() {
        for s in &t.scatter_starts {
            for (d, _) in &s.slices {
                if !seen.contains(&(s.daemon, s.scatter_id, *d)) {
                    v.push(format!("daemon {d}: never got its slice of scatter {}:{}", s.daemon, s.scatter_id));
                }
            }
        }
    }
}
