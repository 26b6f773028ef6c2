//! Direct modex round trip through the real library: a job of 2 ranks over 2 nodes, only rank 0
//! (on this server's node) runs. It gets rank 1's key without a fence, so libpmix raises
//! `direct_modex` for rank 1. Playing the daemon that hosts rank 1, the test answers with
//! `PmixServer::dmodex_request` for rank 0 (the only proc with data here): the blob travels
//! DmodexData -> ModexReply -> libpmix -> the client's PMIx_Get, which then returns rank 0's
//! value under rank 1's name. This checks the answer path, not which proc's data it holds.

mod common;

use common::{drive, Host, Proc, HOST_ALIAS};
use pmix_shim::{find_info, sys, InfoValue, JobInfo, ModexReply, PmixEvent, ProcId, Rank, SUCCESS};

const NS: &str = "dvm-test-dmodex";

#[test]
fn direct_modex_answered_with_dmodex_request() {
    let host = Host::start();
    let job = JobInfo {
        node_map: vec![HOST_ALIAS.into(), "dvm-test-node1".into()],
        proc_map: vec![vec![0], vec![1]],
        job_size: 2,
        universe_size: 2,
        appnum: 0,
        jobid: None,
        ..Default::default()
    };
    host.server().register_nspace(NS, 1, &job).expect("register_nspace");
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    host.server().register_client(NS, 0, uid, gid).expect("register_client");
    let env = host.server().setup_fork(NS, 0).expect("setup_fork");
    let mut procs = vec![Proc::spawn(env!("CARGO_BIN_EXE_pmix-test-client"), &["getremote"], &env, 0)];

    let mut pending: Option<(u64, ModexReply)> = None;
    let mut asked = Vec::new();
    let mut answered = Vec::new();
    drive(
        &host.rx,
        &mut procs,
        "dmodex test",
        |ev| match ev {
            PmixEvent::ClientConnected { reply, .. } | PmixEvent::ClientFinalized { reply, .. } => {
                reply.complete(SUCCESS)
            }
            PmixEvent::DirectModex { proc, info, reply } => {
                asked.push((proc, find_info(&info, sys::PMIX_REQUIRED_KEY).cloned(), info));
                let id = host.server().dmodex_request(NS, 0).expect("dmodex_request");
                pending = Some((id, reply));
            }
            PmixEvent::DmodexData { request, proc, status, data } => {
                let (id, reply) = pending.take().expect("a direct_modex is waiting");
                assert_eq!(request, id);
                assert_eq!(proc, ProcId::new(NS, Rank::Id(0)));
                assert_eq!(status, SUCCESS);
                answered.push(data.len());
                reply.complete(SUCCESS, &data);
            }
            other => panic!("unexpected event {other:?}"),
        },
        |p| p[0].exit.is_some(),
    );
    let (out, err) = procs[0].output();
    assert_eq!(procs[0].exit, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(asked.len(), 1, "direct_modex upcalls: {asked:?}");
    assert_eq!(asked[0].0, ProcId::new(NS, Rank::Id(1)));
    eprintln!("direct_modex info: {:?}; answered with {:?} B", asked[0].2, answered);
    assert_eq!(answered.len(), 1);
    assert_eq!(Proc::values(&out)["peer_value"], "value-from-rank-0");
    assert_eq!(asked[0].1, Some(InfoValue::String("dvm.test.key".into())), "pmix.req.key names the wanted key");

    host.server().deregister_client(NS, 0).expect("deregister_client");
    host.server().deregister_nspace(NS).expect("deregister_nspace");
    drop(procs);
    host.stop();
}
