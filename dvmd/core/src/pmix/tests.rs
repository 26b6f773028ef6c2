//! PMIx hosting's rules on the in-memory harness: real nodes on a simulated network, each
//! with a simulated server whose upcalls the tests make and whose answers they read.

use bytes::Bytes;
use dvm_proto::job::MapBy;
use dvm_proto::pmixworker::{self as wire, worker_event::Body as Ev};
use dvm_proto::Message;

use super::*;
use crate::harness::{job, Net, Program};
use crate::pmixdef::{self as def, key, range, RANK_WILDCARD};

fn hang() -> Vec<String> {
    Program::Hang.argv()
}

/// A DVM of `n` daemons (radix 2, one slot each) running one hanging rank per daemon as job 1.
fn running(n: u32) -> Net {
    let mut net = Net::boot(n, 2, 1);
    net.launch(job(n, hang()));
    net.run();
    assert_eq!(net.live_procs(), n as usize);
    net
}

/// `pcancel 1`: job 1 ends everywhere.
fn cancel(net: &mut Net) {
    let req = dvm_proto::control::CancelRequest { jobids: vec![1], all: false, uid: 0 };
    net.control(crate::node::Control::Cancel(req));
    net.run();
}

fn fence(procs: Vec<wire::Proc>, collect: bool, data: &'static [u8]) -> Ev {
    Ev::Fence(wire::Fence { procs, collect, data: Bytes::from_static(data), ..Default::default() })
}

fn answers(net: &Net, d: u32, reply: u64) -> Vec<(i32, Bytes)> {
    net.pmix_replies(d).into_iter().filter(|r| r.0 == reply).map(|r| (r.1, r.2)).collect()
}

#[test]
fn a_job_fence_completes_on_every_daemon_once_with_every_contribution() {
    let mut net = running(4);
    let all = vec![net.proc(1, RANK_WILDCARD)];
    let datas: [&'static [u8]; 4] = [b"a", b"bb", b"ccc", b"dddd"];
    for d in 0..4 {
        net.upcall(d, 10 + u64::from(d), fence(all.clone(), true, datas[d as usize]));
    }
    net.run();
    let first = answers(&net, 0, 10);
    assert_eq!(first.len(), 1, "answered once");
    assert_eq!(first[0].0, def::SUCCESS);
    for d in 1..4 {
        assert_eq!(answers(&net, d, 10 + u64::from(d)), first, "daemon {d} got the same data");
    }
    for piece in datas {
        assert!(first[0].1.windows(piece.len()).any(|w| w == piece), "{piece:?} is in the result");
    }
    // The procs named one by one, in any order, are the same fence as the wildcard's next one.
    let mut ranks: Vec<wire::Proc> = (0..4).map(|r| net.proc(1, r)).collect();
    for d in 0..4 {
        ranks.rotate_left(1);
        net.upcall(d, 20 + u64::from(d), fence(ranks.clone(), false, b""));
    }
    net.run();
    for d in 0..4 {
        assert_eq!(answers(&net, d, 20 + u64::from(d)), vec![(def::SUCCESS, Bytes::new())], "daemon {d}");
    }
}

#[test]
fn a_fence_a_local_rank_left_fails_at_once_and_an_unknown_namespace_is_refused() {
    let mut net = running(2);
    let mut f = wire::Fence { procs: vec![net.proc(1, RANK_WILDCARD)], ..Default::default() };
    (f.has_local_status, f.local_status) = (true, def::ERR_LOST_CONNECTION);
    net.upcall(1, 3, Ev::Fence(f));
    assert_eq!(answers(&net, 1, 3), vec![(def::ERR_LOST_CONNECTION, Bytes::new())]);
    net.upcall(1, 4, fence(vec![info::proc("no-such-job", 0)], false, b""));
    assert_eq!(answers(&net, 1, 4), vec![(def::ERR_NOT_FOUND, Bytes::new())]);
    // An upcall this daemon does not know is refused, not left waiting.
    net.with(1, |n, now| n.handle_pmix(now, wire::WorkerEvent { reply: 5, body: None }));
    assert_eq!(answers(&net, 1, 5), vec![(def::ERR_NOT_SUPPORTED, Bytes::new())]);
}

#[test]
fn a_direct_modex_is_asked_of_the_daemon_hosting_the_rank_and_answered_once() {
    let mut net = running(4);
    net.upcall(1, 7, Ev::DirectModex(net.proc(1, 3)));
    net.run();
    assert!(answers(&net, 1, 7).is_empty(), "waits for the owner's server");
    let (&request, asked) = net.node(3).host().dmodex.iter().next().expect("daemon 3's server was asked");
    assert_eq!(asked.1, 3);
    let data =
        wire::DmodexData { request, status: def::SUCCESS, data: Bytes::from_static(b"blob of rank 3"), proc: None };
    net.upcall(3, 0, Ev::DmodexData(data));
    net.run();
    assert_eq!(answers(&net, 1, 7), vec![(def::SUCCESS, Bytes::from_static(b"blob of rank 3"))]);
    // A rank beyond the job has no owner.
    net.upcall(1, 8, Ev::DirectModex(net.proc(1, 9)));
    assert_eq!(answers(&net, 1, 8), vec![(def::ERR_NOT_FOUND, Bytes::new())]);
}

#[test]
fn a_request_naming_a_job_whose_maps_have_not_come_waits_for_them_and_a_stranger_is_refused() {
    let mut net = Net::boot(2, 2, 2);
    net.launch(job(2, hang()));
    net.run();
    // Job 2 is not launched yet: a later job of this DVM may still come.
    let child = net.proc(2, 0);
    net.upcall(1, 4, Ev::DirectModex(child.clone()));
    let connect = wire::ProcSet { procs: vec![net.proc(1, RANK_WILDCARD), net.proc(2, RANK_WILDCARD)], timeout: 0 };
    net.upcall(1, 5, Ev::Connect(connect.clone()));
    net.run();
    assert!(net.pmix_replies(1).is_empty(), "both wait for job 2's maps");
    assert_eq!(net.node(1).pmix().waiting(), 2);
    net.upcall(1, 6, Ev::DirectModex(info::proc("a-stranger", 0)));
    assert_eq!(answers(&net, 1, 6), vec![(def::ERR_NOT_FOUND, Bytes::new())], "no job of this DVM: refused at once");
    net.launch(job(2, hang()));
    net.run();
    // The modex went to job 2's owner (daemon 0: the mapper fills it first); the connect is a
    // barrier that waits for the other participants.
    let owner = if net.node(0).host().dmodex.is_empty() { 1 } else { 0 };
    let (&request, _) = net.node(owner).host().dmodex.iter().next().expect("asked of job 2's daemon");
    net.upcall(
        owner,
        0,
        Ev::DmodexData(wire::DmodexData { request, status: 0, data: Bytes::from_static(b"x"), proc: None }),
    );
    net.upcall(0, 9, Ev::Connect(connect));
    net.run();
    assert_eq!(answers(&net, 1, 4), vec![(def::SUCCESS, Bytes::from_static(b"x"))]);
    assert_eq!(answers(&net, 1, 5), vec![(def::SUCCESS, Bytes::new())]);
    assert_eq!(answers(&net, 0, 9), vec![(def::SUCCESS, Bytes::new())]);
    assert_eq!(net.node(1).pmix().waiting(), 0);
}

#[test]
fn a_group_construct_gives_every_member_the_same_context_id_and_every_endpoint() {
    let mut net = running(3);
    let members: Vec<wire::Proc> = (0..3).map(|r| net.proc(1, r)).collect();
    for d in 0..3 {
        let directives = vec![
            wire::Value {
                key: key::GROUP_ASSIGN_CONTEXT_ID.into(),
                kind: def::kind::BOOL,
                flag: true,
                ..Default::default()
            },
            info::bytes(key::GROUP_ENDPT_DATA, vec![b'0' + d as u8]),
        ];
        let g = wire::Group { construct: true, id: "g".into(), procs: members.clone(), directives };
        net.upcall(d, 30, Ev::Group(g));
    }
    net.run();
    let mut ctx = Vec::new();
    for d in 0..3 {
        let a = answers(&net, d, 30);
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].0, def::SUCCESS);
        let infos = wire::InfoResult::decode(a[0].1.clone()).unwrap().infos;
        let id = info::find(&infos, key::GROUP_CONTEXT_ID).expect("a context id").uint;
        let ends = &info::find(&infos, key::GROUP_ENDPT_DATA).expect("endpoints").bytes;
        assert_eq!(&ends[..], b"012", "every member's data, in daemon order");
        ctx.push(id);
    }
    assert!(ctx.iter().all(|&c| c == ctx[0] && c != 0), "{ctx:?}");
    // A group kept by libpmix makes the worker go once idle, even if it did not grow.
    cancel(&mut net);
    let ns = net.proc(1, 0).nspace;
    net.upcall(2, 0, Ev::NspaceDeregistered(wire::NspaceDeregistered { nspace: ns, status: 0 }));
    assert!(net.shells[2].pmix.contains(&PmixEffect::Replace), "the worker keeping group g is replaced");
}

#[test]
fn the_worker_is_replaced_once_idle_and_grown_never_under_a_job() {
    let mut net = running(2);
    net.nodes[1].as_mut().unwrap().host_mut().growth_kib = 4096;
    net.upcall(1, 3, fence(vec![net.proc(1, RANK_WILDCARD)], false, b""));
    net.upcall(0, 3, fence(vec![net.proc(1, RANK_WILDCARD)], false, b""));
    net.run();
    assert!(!net.shells[1].pmix.contains(&PmixEffect::Replace), "not while job 1 runs");
    cancel(&mut net);
    // Daemon 1 let go of the namespace; once libpmix says it did, the grown worker goes.
    let ns = net.proc(1, 0).nspace;
    assert_eq!(net.node(1).host().deregistered, vec![ns.clone()]);
    net.upcall(1, 0, Ev::NspaceDeregistered(wire::NspaceDeregistered { nspace: ns.clone(), status: 0 }));
    net.upcall(0, 0, Ev::NspaceDeregistered(wire::NspaceDeregistered { nspace: ns, status: 0 }));
    assert_eq!(net.shells[1].pmix.iter().filter(|e| **e == PmixEffect::Replace).count(), 1);
    assert!(!net.shells[0].pmix.contains(&PmixEffect::Replace), "daemon 0's worker did not grow");
}

#[test]
fn a_lost_worker_fails_the_jobs_it_served_naming_the_node() {
    let mut net = Net::boot(3, 2, 1);
    let c = net.launch(job(3, hang()));
    net.run();
    net.with(2, |n, now| n.handle_pmix_lost(now, 4242, "it was killed by signal 9"));
    net.run();
    let (code, why) = net.ended(c).expect("the job ended");
    assert_ne!(code, 0);
    assert!(why.contains("the PMIx server of daemon 2 on node n2 (pid 4242) ended while job 1 ran"), "{why}");
}

#[test]
fn queries_are_answered_from_every_jobs_maps() {
    let mut net = running(2);
    let q = |keys: &[&str], qualifiers| wire::Query { keys: keys.iter().map(|k| k.to_string()).collect(), qualifiers };
    let ns = net.proc(1, 0).nspace;
    let queries = vec![
        q(&[key::QUERY_NAMESPACES, key::QUERY_NUM_PSETS], vec![]),
        q(&[key::JOB_SIZE], vec![info::string(key::NSPACE, ns.clone())]),
    ];
    net.upcall(1, 2, Ev::Query(wire::QueryRequest { queries }));
    let a = answers(&net, 1, 2);
    assert_eq!(a[0].0, def::SUCCESS);
    let infos = wire::InfoResult::decode(a[0].1.clone()).unwrap().infos;
    assert_eq!(info::find(&infos, key::QUERY_NAMESPACES).unwrap().str, ns);
    assert_eq!(info::find(&infos, key::JOB_SIZE).unwrap().uint, 2);
    net.upcall(1, 3, Ev::Query(wire::QueryRequest { queries: vec![q(&["pmix.qry.nope"], vec![])] }));
    assert_eq!(answers(&net, 1, 3)[0].0, def::ERR_NOT_SUPPORTED);
}

#[test]
fn map_by_values() {
    let m = parse_map_by("node:OVERSUBSCRIBE").unwrap();
    assert_eq!((m.map_by, m.oversubscribe), (MapBy::Node, true));
    let m = parse_map_by("ppr:2:node").unwrap();
    assert_eq!((m.map_by, m.ppr, m.oversubscribe), (MapBy::Ppr, 2, false));
    assert_eq!(parse_map_by("slot").unwrap().map_by, MapBy::Slot);
    assert!(parse_map_by("socket").unwrap_err().contains("unknown policy"));
    assert!(parse_map_by("ppr:0:node").is_err());
    assert!(parse_map_by("node:pe=2").unwrap_err().contains("modifier"));
}

/// The records of several daemons decode to the largest candidate and the endpoint data in
/// participant order; malformed ones are named.
#[test]
fn group_records_round_trip_and_malformed_ones_are_named() {
    let parts: Vec<(u64, Vec<u8>)> = vec![(3 << 32 | 1, b"abc".to_vec()), (0, vec![]), (2 << 32 | 7, vec![9; 300])];
    let mut out = Vec::new();
    for (c, e) in &parts {
        out.extend_from_slice(&encode_record(*c, e));
    }
    let (best, endpoints) = decode_records(&out).unwrap();
    assert_eq!(best, parts.iter().map(|p| p.0).max().unwrap());
    assert_eq!(endpoints, parts.iter().flat_map(|p| p.1.clone()).collect::<Vec<u8>>());
    assert_eq!(decode_records(&[]).unwrap(), (0, vec![]));
    let rec = encode_record(5, b"hello");
    assert!(decode_records(&rec[..7]).unwrap_err().contains("truncated"));
    assert!(decode_records(&rec[..rec.len() - 1]).unwrap_err().contains("announces 5 bytes"));
}

#[test]
fn group_signatures_are_member_order_free_and_split_by_op() {
    let p = |r: u32| info::proc("ns", r);
    let a = [p(3), p(0), p(1), p(2)];
    let b = [p(0), p(1), p(2), p(3)];
    assert_eq!(group_key(true, "g", &a), group_key(true, "g", &b));
    assert_eq!(group_key(true, "g", &a), "group-construct|g|ns:0-3");
    assert_ne!(group_key(true, "g", &a), group_key(false, "g", &a));
    assert_ne!(group_key(true, "g", &a), group_key(true, "g", &a[..3]));
}

#[test]
fn scope_of_client_events() {
    let src = info::proc("job1", 3);
    let marker = wire::Value {
        key: "pmix.srvr.internal.notify".into(),
        kind: def::kind::BOOL,
        flag: true,
        ..Default::default()
    };
    let round = info::u32_value("dvm.ev.round", 2);
    // A namespace range becomes a custom range over the source's job.
    let mut infos = vec![round.clone(), marker];
    let t = client_event_scope(&src, range::NAMESPACE, &mut infos).unwrap();
    assert_eq!(t, vec![info::proc("job1", RANK_WILDCARD)]);
    assert_eq!(infos, vec![round.clone()], "libpmix's own marker is not carried");
    // A custom range keeps its procs, out of the info.
    let custom = info::procs(key::EVENT_CUSTOM_RANGE, vec![info::proc("job2", 0), info::proc("job3", 1)]);
    let mut infos = vec![custom, round.clone()];
    let t = client_event_scope(&src, range::CUSTOM, &mut infos).unwrap();
    assert_eq!((t, infos), (vec![info::proc("job2", 0), info::proc("job3", 1)], vec![round]));
    // Session: everyone (no targets). Local ranges: not broadcast.
    assert_eq!(client_event_scope(&src, range::SESSION, &mut vec![]), Some(vec![]));
    for r in [range::LOCAL, range::PROC_LOCAL, range::RM] {
        assert_eq!(client_event_scope(&src, r, &mut vec![]), None);
    }
    // A custom range naming nobody reaches nobody.
    assert_eq!(client_event_scope(&src, range::CUSTOM, &mut vec![]), None);
}

#[test]
fn a_direct_modex_asked_of_a_daemon_that_is_lost_is_answered_with_an_error() {
    let mut net = running(4);
    net.upcall(1, 7, Ev::DirectModex(net.proc(1, 3)));
    net.run_for(1_000_000);
    assert!(!net.node(3).host().dmodex.is_empty(), "asked of daemon 3");
    net.kill(3);
    net.run();
    assert_eq!(answers(&net, 1, 7), vec![(def::ERR_LOST_CONNECTION, Bytes::new())]);
    assert_eq!(net.node(1).pmix().waiting(), 0, "nothing is kept for it");
}

/// Found in CI: after a job's ranks on a daemon ended, libpmix still passed on direct modex
/// requests of the dying clients; the daemon registered the job's namespace again as another
/// daemon's, and libpmix then hung in the next job's registration.
#[test]
fn a_direct_modex_of_a_job_whose_ranks_here_ended_is_refused_and_registers_nothing() {
    let mut net = Net::boot(2, 2, 1);
    let spec = dvm_proto::job::JobSpec {
        apps: vec![
            dvm_proto::job::AppContext { argv: hang(), np: 1, ..Default::default() },
            dvm_proto::job::AppContext {
                argv: Program::Exit { code: 0, after_ns: 1_000 }.argv(),
                np: 1,
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    net.launch(spec);
    net.run();
    let ns = net.proc(1, 0).nspace;
    assert_eq!(net.node(1).host().deregistered, vec![ns.clone()], "rank 1 ended: daemon 1 let go of the job");
    net.upcall(1, 5, Ev::DirectModex(net.proc(1, 0)));
    net.run();
    assert_eq!(answers(&net, 1, 5), vec![(def::ERR_NOT_FOUND, Bytes::new())]);
    assert!(!net.node(1).host().namespaces.contains_key(&ns), "not registered again");
}

#[test]
fn a_namespace_the_server_refuses_fails_the_job_naming_the_node() {
    let mut net = Net::boot(3, 2, 1);
    net.nodes[2].as_mut().unwrap().host_mut().refuse_register = Some("it did not complete within 10000 ms".into());
    let c = net.launch(job(3, hang()));
    net.run();
    let (code, why) = net.ended(c).expect("the job ended instead of hanging");
    assert_ne!(code, 0);
    assert!(why.contains("the PMIx server of daemon 2 on node n2 could not register job 1"), "{why}");
}

#[test]
fn a_daemon_whose_pmix_server_cannot_start_fails_the_job_naming_the_node() {
    let mut net = Net::boot(3, 2, 1);
    net.nodes[1].as_mut().unwrap().host_mut().broken = true;
    let c = net.launch(job(3, hang()));
    net.run();
    let (code, why) = net.ended(c).expect("the job ended instead of hanging");
    assert_ne!(code, 0);
    assert!(why.contains("the PMIx server of daemon 1 on node n1 is unavailable: its worker exited at once"), "{why}");
    assert_eq!(net.live_procs(), 0);
}
