//! Real libpmix server + 2 real client processes: connect, put/commit, fence with collect,
//! get the peer's key, fence without collect, finalize. The test plays the daemon: it answers
//! the single local fence_nb with the same data (a one-daemon allgather).

mod common;

use std::collections::BTreeSet;

use common::{drive, Host, Proc, HOST_ALIAS};
use pmix_shim::{reply_buffers_in_flight, PmixEvent, ProcId, Rank, SUCCESS};

const NS: &str = "dvm-test-fence";

#[test]
fn two_clients_fence_and_exchange_keys() {
    let host = Host::start();
    let envs = host.launch_job(NS, 2);
    let client = env!("CARGO_BIN_EXE_pmix-test-client");
    let mut procs: Vec<Proc> =
        envs.iter().enumerate().map(|(r, env)| Proc::spawn(client, &["fence"], env, r as u32)).collect();

    let mut connected = BTreeSet::new();
    let mut finalized = BTreeSet::new();
    let mut fences = Vec::new();
    drive(
        &host.rx,
        &mut procs,
        "fence test",
        |ev| match ev {
            PmixEvent::ClientConnected { proc, reply } => {
                assert_eq!(proc.nspace, NS);
                connected.insert(proc.rank);
                reply.complete(SUCCESS);
            }
            PmixEvent::FenceNb(f) => {
                // One daemon: the collective result is this server's own contribution.
                let data = f.data.clone();
                fences.push((f.procs.clone(), f.collect, f.local_status, f.data.clone(), f.info.clone()));
                f.reply.complete(SUCCESS, &data);
            }
            PmixEvent::ClientFinalized { proc, reply } => {
                finalized.insert(proc.rank);
                reply.complete(SUCCESS);
            }
            other => panic!("unexpected event {other:?}"),
        },
        |procs| procs.iter().all(|p| p.exit.is_some()),
    );

    let mut outputs = Vec::new();
    for p in &mut procs {
        let (out, err) = p.output();
        assert_eq!(p.exit, Some(0), "rank {} failed\nstdout:\n{out}\nstderr:\n{err}", p.rank);
        outputs.push(Proc::values(&out));
    }
    let both: BTreeSet<Rank> = [Rank::Id(0), Rank::Id(1)].into();
    assert_eq!(connected, both);
    assert_eq!(finalized, both);

    // Exactly the two fences the clients made, in order: collect=true with both ranks' data,
    // then collect=false. Participants as given by the clients: {nspace, WILDCARD}.
    assert_eq!(fences.len(), 2, "fences: {fences:?}");
    let all = vec![ProcId::new(NS, Rank::Wildcard)];
    let (procs0, collect0, st0, data0, info0) = &fences[0];
    assert_eq!(procs0, &all);
    assert!(*collect0, "first fence must carry pmix.collect=true: {info0:?}");
    assert!(st0.unwrap_or(0) == 0, "local collective status {st0:?}");
    for r in 0..2 {
        let needle = format!("value-from-rank-{r}");
        assert!(
            data0.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "fence data ({} B) lacks {needle}",
            data0.len()
        );
    }
    let (procs1, collect1, _, _, info1) = &fences[1];
    assert_eq!(procs1, &all);
    assert!(!*collect1, "second fence must not collect: {info1:?}");

    // Job info as the clients read it: derived by libpmix from our maps under our host alias.
    for (r, v) in outputs.iter().enumerate() {
        assert_eq!(v["rank"], r.to_string());
        assert_eq!(v["job_size"], "2");
        assert_eq!(v["univ_size"], "2");
        assert_eq!(v["appnum"], "0");
        assert_eq!(v["local_rank"], r.to_string());
        assert_eq!(v["node_rank"], r.to_string());
        assert_eq!(v["hostname"], HOST_ALIAS);
        assert_eq!(v["peer_value"], format!("value-from-rank-{}", (r + 1) % 2));
        assert_eq!(v["finalize"], "ok");
    }

    host.finish_job(NS, 2);
    // Every fence buffer handed to libpmix was released through its release callback.
    let t0 = std::time::Instant::now();
    while reply_buffers_in_flight() != 0 && t0.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(reply_buffers_in_flight(), 0, "fence data buffers never released by libpmix");
    drop(procs);
    host.stop();
}
