//! The invariants every run of the daemon-core engine must satisfy, judged from its trace
//! against the schedule (who was killed, frozen or cut, what each daemon contributed).
//!
//! What a fault may legitimately cost (the *legitimate* set a declared-dead daemon must be in):
//! a killed daemon; a daemon frozen past the heartbeat bound; an endpoint of a cut link — at
//! most one endpoint per cut (the HNP acts on the first report and ignores the word of the
//! daemon it just declared dead), and with the HNP as one end, always the other end. A daemon
//! whose core exits is lost as well, but it may exit only for a reason the schedule gave it:
//! `Evicted` once the DVM declared it dead, `LostHnp` when the HNP died, its link to the HNP
//! was cut, or it was declared dead (the HNP stops talking to it).

use std::collections::{BTreeMap, BTreeSet};

use bytes::{Bytes, BytesMut};
use dvm_core::Exit;
use dvm_grpcomm::{FenceError, Rank};

use super::scenario::CoreScenario;
use super::trace::{CoreTrace, End, FenceCall};

fn show(b: &Bytes) -> String {
    if b.len() <= 48 {
        format!("{:?}", String::from_utf8_lossy(b))
    } else {
        format!("{:?}..({} bytes)", String::from_utf8_lossy(&b[..40]), b.len())
    }
}

fn fmt_res(r: &Result<Bytes, FenceError>) -> String {
    match r {
        Ok(b) => format!("Ok({})", show(b)),
        Err(e) => format!("Err({e})"),
    }
}

/// Every violated invariant of one run, each naming the daemon and operation.
pub fn check(sc: &CoreScenario, t: &CoreTrace) -> Vec<String> {
    let mut v: Vec<String> = t.engine_errors.clone();
    v.extend(t.pmix_errors.iter().cloned());
    v.extend(t.pmi_errors.iter().cloned());
    v.extend(t.shell_errors.iter().cloned());
    let Some(ready) = t.ready_at else {
        v.push("the DVM never became ready (no Effect::Ready at the HNP)".into());
        return v;
    };
    let hnp_dead = t.killed(0);
    let heartbeat = sc.heartbeat_ns;
    let stopped_long: BTreeSet<Rank> =
        t.stops.iter().filter(|&&(_, from, until)| until - from >= heartbeat).map(|s| s.0).collect();
    let cut_with_hnp: BTreeSet<Rank> = t.cuts.iter().filter(|c| c.0 == 0 || c.1 == 0).map(|c| c.0.max(c.1)).collect();
    let hard = |r: Rank| t.killed(r) || stopped_long.contains(&r);

    // How each daemon ended.
    for r in 1..sc.n {
        match (&t.ends[r as usize], hnp_dead) {
            (End::Running, true) => v.push(format!("daemon {r}: still running after the HNP died (no Exit::LostHnp)")),
            (End::Exited(_, Exit::Terminated), _) if t.terminate_asked.is_none() => {
                v.push(format!("daemon {r}: exited Terminated without TERMINATE"))
            }
            _ => {}
        }
    }
    if hnp_dead {
        if let End::Exited(_, e) = &t.ends[0] {
            v.push(format!("HNP: exited ({e:?}) instead of being killed"));
        }
        check_fences(sc, t, &BTreeSet::new(), false, &mut v);
        return v;
    }
    if let (End::Exited(_, Exit::Terminated), Some(asked)) = (&t.ends[0], t.terminate_asked) {
        check_terminated(sc, t, asked, &mut v);
        return v;
    }
    if let End::Exited(_, e) = &t.ends[0] {
        v.push(format!("HNP: exited: {e:?}"));
        return v;
    }
    if t.terminate_asked.is_some() {
        v.push("the HNP still runs at the end although pterm asked it to terminate".into());
    }
    let failed = &t.final_failed[0];

    // No healthy daemon declared lost.
    for &f in failed {
        let endpoint = t.cuts.iter().any(|c| c.0 == f || c.1 == f);
        if !hard(f) && !endpoint {
            v.push(format!(
                "daemon {f}: declared dead but it was never killed, frozen past the heartbeat bound or cut off"
            ));
        }
    }
    // Each cut costs at most one endpoint: the soft losses must match cuts one to one.
    let soft: Vec<Rank> =
        failed.iter().copied().filter(|&f| !hard(f) && t.cuts.iter().any(|c| c.0 == f || c.1 == f)).collect();
    let mut owner: Vec<Option<usize>> = vec![None; t.cuts.len()];
    for (i, &f) in soft.iter().enumerate() {
        let mut seen = vec![false; t.cuts.len()];
        if !augment(i, &soft, &t.cuts, &mut owner, &mut seen) {
            v.push(format!(
                "daemon {f}: declared dead as one end of a cut link, but every cut it touches ({:?}) already cost                  another daemon (lost: {:?})",
                t.cuts.iter().filter(|c| c.0 == f || c.1 == f).map(|c| (c.0, c.1)).collect::<Vec<_>>(),
                soft
            ));
        }
    }
    // Exits only for a reason the schedule gave, and every survivor declared dead is out.
    for r in 1..sc.n {
        match &t.ends[r as usize] {
            End::Exited(_, Exit::Evicted(why)) if !failed.contains(&r) => {
                v.push(format!("daemon {r}: evicted ({why}) but the HNP never declared it dead"));
            }
            End::Exited(_, Exit::LostHnp(why)) if !cut_with_hnp.contains(&r) && !failed.contains(&r) => {
                v.push(format!("daemon {r}: exited LostHnp ({why}) with the HNP alive and reachable"));
            }
            End::Exited(_, _) if !failed.contains(&r) => {
                v.push(format!("daemon {r}: exited but was never declared dead (its loss went unnoticed)"));
            }
            End::Running if failed.contains(&r) => {
                v.push(format!("daemon {r}: declared dead but still running at the end (never evicted)"));
            }
            _ => {}
        }
        if stopped_long.contains(&r) && !t.killed(r) && failed.contains(&r) {
            // With a file being staged, the HNP's eviction notice can wait behind segments on
            // the link while its heartbeats to the daemon have stopped: the daemon thaws, hears
            // silence and ends LostHnp first. Either way it is out; without staging, eviction
            // must be what ends it.
            let lost_hnp_ok = cut_with_hnp.contains(&r) || !sc.stages.is_empty();
            let ok = matches!(&t.ends[r as usize], End::Exited(_, Exit::Evicted(_)))
                || (lost_hnp_ok && matches!(&t.ends[r as usize], End::Exited(_, Exit::LostHnp(_))));
            if !ok {
                v.push(format!("daemon {r}: frozen, declared dead, but ended {:?}, not evicted", t.ends[r as usize]));
            }
        }
    }
    // Every killed daemon is noticed; DAEMON_DIED is applied everywhere.
    for r in 1..sc.n {
        if t.killed(r) && !failed.contains(&r) {
            v.push(format!("daemon {r}: killed but never declared dead by the HNP"));
        }
        if t.running(r) && &t.final_failed[r as usize] != failed {
            v.push(format!(
                "daemon {r}: holds failed set {:?}, the HNP {:?} (DAEMON_DIED not applied everywhere)",
                t.final_failed[r as usize], failed
            ));
        }
    }
    // Quiescence: no leaked owner, no tracker left behind.
    for r in 0..sc.n {
        if t.running(r) {
            if t.final_owned[r as usize] != 0 {
                v.push(format!("daemon {r}: still owns {} operation(s) at the end", t.final_owned[r as usize]));
            }
            if !t.final_quiescent[r as usize] {
                v.push(format!("daemon {r}: grpcomm not quiescent at the end (a tracker or op was left behind)"));
            }
        }
    }
    let deadline = t.last_fault_at.max(ready) + sc.bound_ns;
    if t.end_ns > deadline {
        v.push(format!(
            "run ended at t={} ns, past the bound (last fault + {} ns = {deadline})",
            t.end_ns, sc.bound_ns
        ));
    }
    // Benchmarks: each request answered exactly once; without faults, cleanly.
    if t.bench_dones.len() != t.bench_starts.len() {
        v.push(format!("{} benchmark(s) asked for, {} answered", t.bench_starts.len(), t.bench_dones.len()));
    }
    if sc.faults.is_empty() {
        for (_, res) in &t.bench_dones {
            match res {
                Ok(rep) if rep.errors > 0 => {
                    v.push(format!("benchmark without faults had errors: {}", rep.first_error))
                }
                Err(e) if !e.contains("already running") => v.push(format!("benchmark failed without faults: {e}")),
                _ => {}
            }
        }
    }
    check_stages(sc, t, failed, &mut v);
    check_xcasts(sc, t, failed, &mut v);
    check_fences(sc, t, failed, true, &mut v);
    check_launches(sc, t, &mut v);
    if let Some((r, at)) = t.restarted {
        // Told it cannot rejoin, or (the simulated links carry no heartbeat on its fresh
        // connection) it lost the HNP first: either way it ended and changed nothing.
        if !matches!(&t.restart_end, Some((_, Exit::Evicted(_) | Exit::LostHnp(_)))) {
            v.push(format!(
                "daemon {r}: its new incarnation (started at {at}) ended {:?}: it should have been told it cannot rejoin",
                t.restart_end
            ));
        }
    }
    v
}

/// Bipartite matching of soft losses to cuts (augmenting path from loss `i`).
fn augment(
    i: usize,
    soft: &[Rank],
    cuts: &[(Rank, Rank, u64)],
    owner: &mut [Option<usize>],
    seen: &mut [bool],
) -> bool {
    for (c, &(a, b, _)) in cuts.iter().enumerate() {
        if (a == soft[i] || b == soft[i]) && !seen[c] {
            seen[c] = true;
            if owner[c].is_none_or(|o| augment(o, soft, cuts, owner, seen)) {
                owner[c] = Some(i);
                return true;
            }
        }
    }
    false
}

/// Staged files: each request answered once; on success every live daemon holds the file
/// whole; on failure none holds any of it (checked again at the answer, by the engine); and
/// no daemon keeps a record of a finished transfer.
fn check_stages(sc: &CoreScenario, t: &CoreTrace, failed: &BTreeSet<Rank>, v: &mut Vec<String>) {
    let restarted = t.restarted.map(|(r, _)| r);
    // Projections keep no bytes: their files are checked for presence only.
    let counted = sc.stages.iter().any(|s| s.bytes.len() > super::stage::COUNT_ONLY_ABOVE);
    for (idx, st) in sc.stages.iter().enumerate() {
        if t.stage_starts[idx].is_none() {
            continue;
        }
        let Some((_, rep)) = &t.stage_dones[idx] else {
            v.push(format!("staged file {idx} was never answered"));
            continue;
        };
        let want = super::stage::fingerprint(&st.bytes);
        for r in (0..sc.n).filter(|&r| t.running(r) && !failed.contains(&r) && Some(r) != restarted) {
            let path = format!("/scratch/{r}/stage{idx}");
            match (rep.ok, t.final_files[r as usize].get(&path)) {
                (true, Some(&h)) if h == want || counted => {}
                (true, Some(_)) => v.push(format!("daemon {r}: staged file {idx} differs from its source")),
                (true, None) => v.push(format!("daemon {r}: staged file {idx} answered ok but missing here")),
                (false, Some(_)) => {
                    v.push(format!("daemon {r}: staged file {idx} failed ({}) but stays here", rep.error))
                }
                (false, None) => {}
            }
        }
    }
    for r in (0..sc.n).filter(|&r| t.running(r) && !failed.contains(&r)) {
        if t.final_stage_held[r as usize] != (0, 0) {
            v.push(format!(
                "daemon {r}: holds staging records (origin, target) {:?} after every transfer ended",
                t.final_stage_held[r as usize]
            ));
        }
    }
}

fn check_xcasts(sc: &CoreScenario, t: &CoreTrace, failed: &BTreeSet<Rank>, v: &mut Vec<String>) {
    let live: Vec<Rank> = (0..sc.n).filter(|&r| t.running(r)).collect();
    let Some(&first) = live.first() else { return };
    let reference = &t.deliveries[first as usize];
    for &r in &live {
        if &t.deliveries[r as usize] != reference {
            v.push(format!(
                "daemon {r}: delivered {} workload xcasts, daemon {first} {} (or in another order)",
                t.deliveries[r as usize].len(),
                reference.len()
            ));
        }
    }
    for (origin, tag, payload, at) in &t.xcast_starts {
        let n = reference.iter().filter(|(tg, p)| tg == tag && p == payload).count();
        if t.running(*origin) && !failed.contains(origin) && n != 1 {
            v.push(format!(
                "xcast {} (tag {tag}) from surviving daemon {origin} at t={at}: delivered {n} times on daemon {first}",
                show(payload)
            ));
        }
        if n > 1 {
            v.push(format!("xcast {} from daemon {origin}: delivered {n} times", show(payload)));
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

/// `hnp_alive`: liveness and "lost nobody, failed nobody" are judged only with a live HNP.
fn check_fences(sc: &CoreScenario, t: &CoreTrace, failed: &BTreeSet<Rank>, hnp_alive: bool, v: &mut Vec<String>) {
    let mut groups: BTreeMap<(usize, usize), Vec<&FenceCall>> = BTreeMap::new();
    for c in &t.fence_calls {
        groups.entry((c.job, c.step)).or_default().push(c);
    }
    for ((j, step), calls) in groups {
        let job = &sc.jobs[j];
        let name = format!("job {j} fence {step} ({})", if job.steps[step] { "modex" } else { "barrier" });
        let mut hung = false;
        for c in &calls {
            if c.done.is_none() && hnp_alive && t.running(c.daemon) {
                hung = true;
                v.push(format!("{name}: never completed on surviving daemon {} (called at t={})", c.daemon, c.at));
            }
        }
        if hung {
            continue;
        }
        // Every success is the contributions in daemon order; survivors agree.
        let mut callers: Vec<&&FenceCall> = calls.iter().collect();
        callers.sort_by_key(|c| c.daemon);
        let expect = if job.steps[step] { concat(callers.iter().map(|c| &c.data)) } else { Bytes::new() };
        let complete = callers.iter().map(|c| c.daemon).collect::<Vec<_>>() == job.members;
        // Without a release (the allgather) each participant finishes on its own: when a member
        // is lost mid-exchange, survivors that already held every block keep their (checked)
        // result and the rest fail. Successes agree with each other, failures with each other.
        let lost_member = job.members.iter().any(|m| failed.contains(m) || !t.running(*m));
        // Any mode but the tree may put this fence on the allgather (auto prices each one).
        let may_split = lost_member && sc.cfg.fence_movement != dvm_grpcomm::FenceMovementMode::Tree;
        let mut reference: Option<(Rank, &Result<Bytes, FenceError>)> = None;
        let mut reference_err: Option<(Rank, &Result<Bytes, FenceError>)> = None;
        for c in &callers {
            let Some((_, res)) = &c.done else { continue };
            match res {
                Ok(out) if !complete || out != &expect => v.push(format!(
                    "{name}: daemon {} returned {} but the contributions in daemon order are {} (callers {:?} of {:?})",
                    c.daemon,
                    show(out),
                    show(&expect),
                    callers.iter().map(|c| c.daemon).collect::<Vec<_>>(),
                    job.members
                )),
                Err(FenceError::LostConnection { lost }) if hnp_alive => {
                    for x in lost {
                        if !failed.contains(x) || !job.members.contains(x) {
                            v.push(format!(
                                "{name}: daemon {} reports lost participant {x}, not a declared-dead member",
                                c.daemon
                            ));
                        }
                    }
                }
                _ => {}
            }
            if !t.running(c.daemon) {
                continue;
            }
            let slot = if may_split && res.is_err() { &mut reference_err } else { &mut reference };
            match slot {
                None => *slot = Some((c.daemon, res)),
                Some((r0, res0)) if *res0 != res => v.push(format!(
                    "{name}: daemon {r0} returned {} but daemon {} {}",
                    fmt_res(res0),
                    c.daemon,
                    fmt_res(res)
                )),
                _ => {}
            }
        }
        // A job that lost no member never fails (fences re-converge after relays are lost).
        if hnp_alive && !lost_member {
            if let Some(c) = callers.iter().find(|c| matches!(c.done, Some((_, Err(_))))) {
                v.push(format!(
                    "{name}: lost no member but failed on daemon {}: {}",
                    c.daemon,
                    fmt_res(&c.done.as_ref().unwrap().1)
                ));
            }
        }
        if v.len() > 200 {
            return;
        }
    }
}

/// With the HNP up to the end: every job a prun submitted ended for its prun, within the
/// bound, with a reason that names what failed; nothing of it is left on any daemon.
fn check_launches(sc: &CoreScenario, t: &CoreTrace, v: &mut Vec<String>) {
    for (i, plan) in sc.launches.iter().enumerate() {
        let Some(at) = t.launched_at[i] else { continue };
        match &t.launch_ends[i] {
            None => v.push(format!("launch {i} (submitted at {at}): its prun never heard the job end")),
            Some((end, code, why)) => {
                let from = at.max(t.last_fault_at);
                if end.saturating_sub(from) > plan.runs_ns + sc.bound_ns {
                    v.push(format!(
                        "launch {i}: ended {} ns after {from}, past its bound of {} ns",
                        end - from,
                        plan.runs_ns + sc.bound_ns
                    ));
                }
                let named = ["rank ", "daemon ", "--timeout", "slots", "cannot map", "terminat"]
                    .iter()
                    .any(|w| why.contains(w));
                if *code != 0 && !named {
                    v.push(format!("launch {i}: ended with status {code} but its reason names nothing: {why:?}"));
                }
                if *code == 0 && !why.is_empty() {
                    v.push(format!("launch {i}: succeeded with a reason: {why:?}"));
                }
            }
        }
    }
    for (i, asked) in t.spawns_asked.iter().enumerate() {
        if asked.is_some() && t.spawn_answers[i].len() != 1 {
            v.push(format!("launch {i}: its rank 0's spawn got {} answers, not one", t.spawn_answers[i].len()));
        }
    }
    // One set of slot books: no slot is given to two jobs at once (one slot per daemon here).
    for (d, &peak) in t.peak_procs.iter().enumerate() {
        if peak > 1 {
            v.push(format!("daemon {d}: {peak} procs ran at once on its one slot"));
        }
    }
    for &(d, job, rank) in &t.leftover_procs {
        v.push(format!("daemon {d}: rank {rank} of job {job} still runs at the end"));
    }
    if t.hnp_jobs_left > 0 {
        v.push(format!("the HNP still holds {} job(s) at the end", t.hnp_jobs_left));
    }
}

/// The DVM was terminated (pterm): every daemon ended with it (or was lost before), every
/// job submitted before ended for its prun (those after were refused), nothing runs.
fn check_terminated(sc: &CoreScenario, t: &CoreTrace, asked: u64, v: &mut Vec<String>) {
    for r in 1..sc.n {
        match &t.ends[r as usize] {
            End::Running => v.push(format!("daemon {r}: still running after TERMINATE")),
            End::Exited(at, Exit::Terminated) if *at < asked => {
                v.push(format!("daemon {r}: exited Terminated at {at}, before pterm asked at {asked}"))
            }
            _ => {}
        }
    }
    check_launches(sc, t, v);
}
