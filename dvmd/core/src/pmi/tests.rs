//! The PMI server's rules on the in-memory harness: real nodes on a simulated network, ranks
//! played by the test writing PMI-1 and PMI-2 bytes and reading the answers.

use dvm_proto::job::MpiInterface;

use super::*;
use crate::harness::{job, Net, Program};

/// A DVM of `n` daemons (radix 2, `slots` each) running job 1 of `np` hanging ranks.
fn running(n: u32, slots: u32, np: u32, mpi: MpiInterface) -> Net {
    let mut net = Net::boot(n, 2, slots);
    let mut spec = job(np, Program::Hang.argv());
    spec.mpi = mpi as i32;
    assert_eq!(net.launch(spec), CLIENT);
    net.run();
    assert_eq!(net.live_procs(), np as usize);
    net
}

/// The daemon hosting rank `r` when each daemon has `slots` (block placement).
fn host_of(r: u32, slots: u32) -> u32 {
    r / slots
}

fn say(net: &mut Net, slots: u32, rank: u32, line: &str) {
    net.pmi_send(host_of(rank, slots), 1, rank, line.as_bytes());
    net.run();
}

fn read(net: &mut Net, slots: u32, rank: u32) -> String {
    net.pmi_read(host_of(rank, slots), 1, rank)
}

fn v2(cmd: &str) -> String {
    String::from_utf8(wire::encode(wire::Form::V2, cmd, &[])).expect("text")
}

/// The prun of job 1.
const CLIENT: crate::jobs::ClientId = crate::jobs::ClientId(1);

/// A PMI-1 client's first line.
const INIT1: &str = "cmd=init pmi_version=1 pmi_subversion=1\n";

fn ended(net: &Net) -> Option<(i32, String)> {
    net.ended(CLIENT)
}

#[test]
fn pmi1_puts_become_visible_everywhere_after_one_barrier_and_each_rank_is_answered_once() {
    let (n, slots, np) = (4, 2, 8);
    let mut net = running(n, slots, np, MpiInterface::MpiDefault);
    for r in 0..np {
        say(&mut net, slots, r, INIT1);
        assert_eq!(read(&mut net, slots, r), "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
        say(&mut net, slots, r, "cmd=get_my_kvsname\n");
        let kvs = read(&mut net, slots, r);
        assert!(kvs.starts_with("cmd=my_kvsname kvsname=dvm-") && kvs.ends_with("-job1 rc=0\n"), "{kvs}");
        say(&mut net, slots, r, &format!("cmd=put kvsname=x key=card-{r} value=addr-of-{r}\n"));
        assert_eq!(read(&mut net, slots, r), "cmd=put_result rc=0 msg=success\n");
    }
    // Every rank but the last in the barrier: nobody is released.
    for r in 0..np - 1 {
        say(&mut net, slots, r, "cmd=barrier_in\n");
    }
    for r in 0..np {
        assert_eq!(read(&mut net, slots, r), "", "rank {r} still waits");
    }
    say(&mut net, slots, np - 1, "cmd=barrier_in\n");
    for r in 0..np {
        assert_eq!(read(&mut net, slots, r), "cmd=barrier_out rc=0\n", "rank {r} released once");
        let peer = (r + 3) % np;
        say(&mut net, slots, r, &format!("cmd=get kvsname=x key=card-{peer}\n"));
        assert_eq!(read(&mut net, slots, r), format!("cmd=get_result rc=0 msg=success value=addr-of-{peer}\n"));
    }
    say(&mut net, slots, 5, "cmd=get kvsname=x key=nobody\n");
    assert_eq!(read(&mut net, slots, 5), "cmd=get_result rc=-1 msg=key_nobody_not_found\n");
    // Block placement of 2 per node over 4 nodes, in MPICH's form.
    say(&mut net, slots, 0, "cmd=get kvsname=x key=PMI_process_mapping\n");
    assert_eq!(read(&mut net, slots, 0), "cmd=get_result rc=0 msg=success value=(vector,(0,4,2))\n");
    for r in 0..np {
        say(&mut net, slots, r, "cmd=finalize\n");
        assert_eq!(read(&mut net, slots, r), "cmd=finalize_ack rc=0\n");
    }
    assert!(ended(&net).is_none(), "the job runs on");
}

#[test]
fn pmi2_fullinit_fence_and_get_on_the_same_fd_after_a_pmi1_init() {
    let (n, slots, np) = (2, 2, 4);
    let mut net = running(n, slots, np, MpiInterface::MpiPmi2);
    for r in 0..np {
        say(&mut net, slots, r, "cmd=init pmi_version=2 pmi_subversion=0\n");
        assert_eq!(read(&mut net, slots, r), "cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n");
        let init = wire::encode(wire::Form::V2, "fullinit", &[("pmirank", &r.to_string()), ("threaded", "FALSE")]);
        net.pmi_send(host_of(r, slots), 1, r, &init);
        net.run();
        let got = read(&mut net, slots, r);
        assert!(
            got.contains(&format!("cmd=fullinit-response;pmi-version=2;pmi-subversion=0;rank={r};size=4;")),
            "{got}"
        );
        let put = wire::encode(wire::Form::V2, "kvs-put", &[("key", &format!("k{r}")), ("value", "a;b c")]);
        net.pmi_send(host_of(r, slots), 1, r, &put);
        net.run();
        assert!(read(&mut net, slots, r).ends_with("cmd=kvs-put-response;rc=0;"));
    }
    for r in 0..np {
        say(&mut net, slots, r, &v2("kvs-fence"));
    }
    for r in 0..np {
        assert!(read(&mut net, slots, r).ends_with("cmd=kvs-fence-response;rc=0;"), "rank {r}");
    }
    let get = wire::encode(wire::Form::V2, "kvs-get", &[("jobid", ""), ("srcid", "-1"), ("key", "k3")]);
    net.pmi_send(0, 1, 0, &get);
    net.run();
    // A value with a ';' and a space travels intact in PMI-2.
    assert!(read(&mut net, slots, 0).ends_with("cmd=kvs-get-response;found=TRUE;value=a;;b c;rc=0;"));
    // A node attribute get that waits is answered by the put of a rank on the same node.
    let wait = wire::encode(wire::Form::V2, "info-getnodeattr", &[("key", "shm"), ("wait", "TRUE")]);
    net.pmi_send(0, 1, 1, &wait);
    net.run();
    assert_eq!(read(&mut net, slots, 1), "", "waits for the put");
    let put = wire::encode(wire::Form::V2, "info-putnodeattr", &[("key", "shm"), ("value", "seg0")]);
    net.pmi_send(0, 1, 0, &put);
    net.run();
    assert!(read(&mut net, slots, 1).ends_with("cmd=info-getnodeattr-response;found=TRUE;value=seg0;rc=0;"));
}

/// Each fault a rank can send fails the job naming rank and node, and no daemon suffers.
#[test]
fn bad_input_fails_the_job_by_rank_and_node_never_the_daemon() {
    let cases: [(&str, &str); 8] = [
        ("cmd=init pmi_version=2 pmi_subversion=0\ncmd=init pmi_version=2 pmi_subversion=0\n", "second PMI init"),
        (
            "cmd=init pmi_version=1 pmi_subversion=1\ncmd=put kvsname=x key=a value=two words\n",
            "'words' is not key=value",
        ),
        ("cmd=init pmi_version=1 pmi_subversion=1\ncmd=frobnicate\n", "unknown PMI command 'frobnicate'"),
        ("cmd=init pmi_version=1 pmi_subversion=1\ncmd=init pmi_version=1 pmi_subversion=1\n", "second PMI init"),
        ("cmd=get kvsname=x key=a\n", "'get' before init"),
        ("cmd=init pmi_version=1 pmi_subversion=1\ncmd=finalize\ncmd=barrier_in\n", "after finalize"),
        ("cmd=init pmi_version=3 pmi_subversion=0\n", "PMI version 3.0"),
        ("cmd=init pmi_version=1 pmi_subversion=1\ncmd=put kvsname=x key=a value=", "longer than 4096 bytes"),
    ];
    for (bytes, says) in cases {
        let mut net = running(2, 1, 2, MpiInterface::MpiDefault);
        net.pmi_send(1, 1, 1, bytes.as_bytes());
        if says.contains("longer") {
            net.pmi_send(1, 1, 1, &vec![b'v'; wire::MAX_LINE]);
        }
        net.run();
        let (code, why) = ended(&net).unwrap_or_else(|| panic!("the job ended for {bytes:?}"));
        assert_ne!(code, 0);
        assert!(why.contains("rank 1 on node n1") && why.contains(says), "{why}");
        assert!(net.pmi_closed(1, 1, 1), "its connection closed");
        assert!(net.alive(0) && net.alive(1));
        // The DVM runs the next job as before.
        net.launch(job(2, Program::Exit { code: 0, after_ns: 1000 }.argv()));
        net.run();
    }
}

#[test]
fn a_rank_that_leaves_a_barrier_by_closing_its_fd_fails_the_job_and_abort_carries_its_code() {
    let mut net = running(2, 1, 2, MpiInterface::MpiDefault);
    say(&mut net, 1, 1, "cmd=init pmi_version=1 pmi_subversion=1\ncmd=barrier_in\n");
    net.with(1, |n, now| n.handle_proc(now, crate::jobs::ProcEvent::PmiClosed { jobid: 1, rank: 1 }));
    net.run();
    let (_, why) = ended(&net).expect("ended");
    assert!(why.contains("rank 1 on node n1 closed its PMI connection in a barrier"), "{why}");

    let mut net = running(2, 1, 2, MpiInterface::MpiDefault);
    say(&mut net, 1, 0, "cmd=init pmi_version=1 pmi_subversion=1\ncmd=abort exitcode=7\n");
    net.run_for(10_000_000_000);
    let (code, why) = ended(&net).expect("ended");
    assert_eq!(code, 7, "{why}");
}

#[test]
fn under_mpi_pmix_a_rank_that_speaks_pmi_fails_the_job_instead_of_running_as_a_singleton() {
    let mut net = running(2, 1, 2, MpiInterface::MpiPmix);
    say(&mut net, 1, 0, INIT1);
    let (code, why) = ended(&net).expect("ended");
    assert_ne!(code, 0);
    assert!(why.contains("rank 0 on node n0 speaks PMI") && why.contains("--mpi pmix"), "{why}");
}

#[test]
fn a_barrier_answers_every_daemon_with_the_same_bytes_at_radix_2_over_many_daemons() {
    let (n, slots, np) = (9, 1, 9);
    let mut net = running(n, slots, np, MpiInterface::MpiPmi1);
    for round in 0..3 {
        for r in 0..np {
            if round == 0 {
                say(&mut net, slots, r, INIT1);
            }
            say(&mut net, slots, r, &format!("cmd=put kvsname=x key=r{r}-{round} value={round}\n"));
            say(&mut net, slots, r, "cmd=barrier_in\n");
        }
        for r in 0..np {
            assert!(read(&mut net, slots, r).ends_with("cmd=barrier_out rc=0\n"), "round {round} rank {r}");
        }
        let kvs: Vec<_> = (0..n).map(|d| net.node(d).pmi().kvs_len(1)).collect();
        assert!(kvs.iter().all(|&k| k == kvs[0]), "every daemon holds the same keys: {kvs:?}");
    }
    assert_eq!(net.node(0).pmi().kvs_len(1), Some(1 + 3 * 9));
}

#[test]
fn process_mapping_follows_each_layout() {
    use crate::jobmap::Layout;
    let p = |layout, k, np| Placement::new(np, vec![0], vec![(0, k)], layout).expect("valid");
    assert_eq!(process_mapping(&p(Layout::RoundRobin, 3, 7)).as_deref(), Some("(vector,(0,3,1))"));
    let uneven = Layout::PerNode { first_rank: vec![0, 3, 4] };
    assert_eq!(process_mapping(&p(uneven, 2, 4)).as_deref(), Some("(vector,(0,1,3),(1,1,1))"));
    let explicit = Layout::Explicit { node_of: vec![0, 0, 1, 0] };
    assert_eq!(process_mapping(&p(explicit, 2, 4)).as_deref(), Some("(vector,(0,1,2),(1,1,1),(0,1,1))"));
}

#[test]
fn a_pmi1_spawn_starts_a_child_job_whose_kvs_holds_the_parents_preput_and_answers_once_it_started() {
    let mut net = running(2, 2, 2, MpiInterface::MpiDefault);
    say(&mut net, 2, 0, INIT1);
    read(&mut net, 2, 0);
    let block = "mcmd=spawn\nnprocs=2\nexecname=sim-hang\ntotspawns=1\nspawnssofar=1\nargcnt=0\n\
                 preput_num=1\npreput_key_0=PARENT_ROOT_PORT_NAME\npreput_val_0=tag#0$port$\ninfo_num=0\nendcmd\n";
    // Sent in two pieces: nothing happens until `endcmd`.
    let (a, b) = block.split_at(20);
    say(&mut net, 2, 0, a);
    assert_eq!(net.live_procs(), 2);
    say(&mut net, 2, 0, b);
    assert_eq!(net.live_procs(), 4, "the child job's two ranks started");
    assert_eq!(read(&mut net, 2, 0), "cmd=spawn_result rc=0\n", "answered once the children started");
    // A child rank reads its parent's port from its own kvs, and knows it was spawned.
    let d = (0..2).find(|&d| net.node(d).pmi().kvs_len(2).is_some()).expect("a daemon hosts the child");
    net.pmi_send(d, 2, 0, b"cmd=init pmi_version=1 pmi_subversion=1\ncmd=get kvsname=x key=PARENT_ROOT_PORT_NAME\n");
    net.run();
    let got = net.pmi_read(d, 2, 0);
    assert!(got.ends_with("cmd=get_result rc=0 msg=success value=tag#0$port$\n"), "{got}");
    let spec = net.node(d).pmi().proc_env(2, 0);
    assert!(spec.contains(&("PMI_SPAWNED".to_string(), "1".to_string())), "{spec:?}");
}

#[test]
fn spawn_plans_read_every_field_of_both_wire_forms() {
    let block = |text: &str| {
        let mut d = wire::Decoder::default();
        d.push(text.as_bytes());
        d.next_request().expect("valid").expect("whole")
    };
    let v1 = block(
        "mcmd=spawn\nnprocs=3\nexecname=./c\ntotspawns=1\nspawnssofar=1\narg1=x y\nargcnt=1\npreput_num=1\n\
         preput_key_0=K\npreput_val_0=V=1\ninfo_num=1\ninfo_key_0=wdir\ninfo_val_0=/tmp\nendcmd\n",
    );
    let plan = spawn::plan_v1(&[v1], "/home").expect("valid");
    assert_eq!(plan.preput, vec!["K=V=1".to_string()]);
    assert_eq!(
        (plan.apps[0].np, plan.apps[0].argv.clone(), plan.apps[0].wdir.as_str()),
        (3, vec!["./c".into(), "x y".into()], "/tmp")
    );
    let v2 = wire::encode(
        wire::Form::V2,
        "spawn",
        &[
            ("ncmds", "2"),
            ("preputcount", "1"),
            ("ppkey0", "P"),
            ("ppval0", "a;b"),
            ("subcmd", "one"),
            ("maxprocs", "1"),
            ("argc", "0"),
            ("infokeycount", "0"),
            ("subcmd", "two"),
            ("maxprocs", "2"),
            ("argc", "1"),
            ("argv0", "z"),
            ("infokeycount", "1"),
            ("infokey0", "wdir"),
            ("infoval0", "/w"),
        ],
    );
    let mut d = wire::Decoder::default();
    d.push(&v2);
    let plan = spawn::plan_v2(&d.next_request().unwrap().unwrap(), "/home").expect("valid");
    assert_eq!(plan.preput, vec!["P=a;b".to_string()]);
    let apps: Vec<_> = plan.apps.iter().map(|a| (a.argv.clone(), a.np, a.wdir.clone())).collect();
    assert_eq!(apps, vec![(vec!["one".into()], 1, "/home".into()), (vec!["two".into(), "z".into()], 2, "/w".into())]);
    // A spawn missing what it must say is refused by name.
    let bad = block("mcmd=spawn\nexecname=./c\nendcmd\n");
    assert!(spawn::plan_v1(&[bad], "/").unwrap_err().contains("without nprocs"));
}

/// A rank killed in a barrier: its fd closes while its daemon's contribution is in flight,
/// and the barrier's end then reaches that daemon before the job's kill does. Nothing may be
/// written on the closed fd (the rank is gone; the shell would write on a dead socket).
#[test]
fn a_barrier_that_ends_after_a_waiting_rank_closed_its_fd_writes_nothing_on_that_fd() {
    let (n, slots, np) = (2, 2, 4);
    let mut net = running(n, slots, np, MpiInterface::MpiPmi1);
    for r in 0..np {
        say(&mut net, slots, r, INIT1);
        assert!(read(&mut net, slots, r).starts_with("cmd=response_to_init"));
    }
    // Ranks 2 and 3 (daemon 1) in the barrier: daemon 1's contribution waits at daemon 0.
    say(&mut net, slots, 2, "cmd=barrier_in\n");
    say(&mut net, slots, 3, "cmd=barrier_in\n");
    net.with(1, |n, now| n.handle_proc(now, crate::jobs::ProcEvent::PmiClosed { jobid: 1, rank: 2 }));
    // Ranks 0 and 1 enter before the network moves: the release leaves before the job fails.
    net.pmi_send(0, 1, 0, b"cmd=barrier_in\n");
    net.pmi_send(0, 1, 1, b"cmd=barrier_in\n");
    net.run();
    assert!(net.pmi_closed(1, 1, 2), "its daemon closed it too");
    assert_eq!(read(&mut net, slots, 2), "", "nothing written on rank 2's fd after it closed");
    assert!(read(&mut net, slots, 3).starts_with("cmd=barrier_out rc="), "rank 3 is released");
    let (_, why) = ended(&net).expect("the job failed");
    assert!(why.contains("rank 2 on node n1 closed its PMI connection in a barrier"), "{why}");
}

#[test]
fn a_rank_that_never_speaks_pmi_while_its_apps_peers_here_did_fails_the_job_as_a_singleton() {
    use crate::jobs::{ExitKind, ProcEvent};
    let exit = |net: &mut Net, d: u32, rank: u32| {
        let ev = ProcEvent::Exited { jobid: 1, rank, pid: 1, status: ExitKind::Code(0) };
        net.with(d, |n, now| n.handle_proc(now, ev));
        net.run();
    };
    // Two ranks of one app on daemon 0: rank 1 spoke PMI, rank 0 never did and ended cleanly.
    let mut net = running(1, 2, 2, MpiInterface::MpiDefault);
    say(&mut net, 2, 1, INIT1);
    exit(&mut net, 0, 0);
    let (code, why) = ended(&net).expect("failed");
    assert_ne!(code, 0);
    assert!(why.contains("rank 0 on node n0 exited without ever connecting to PMI"), "{why}");

    // A rank of another app (a non-MPI helper beside the MPI ranks) is not judged by them.
    let mut net = Net::boot(1, 2, 2);
    let mut spec = job(1, Program::Hang.argv());
    spec.apps.push(spec.apps[0].clone());
    assert_eq!(net.launch(spec), CLIENT);
    net.run();
    say(&mut net, 2, 0, INIT1);
    exit(&mut net, 0, 1);
    assert!(ended(&net).is_none(), "the helper's clean end fails nothing");
}
