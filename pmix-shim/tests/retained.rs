//! What libpmix 4.2.2 keeps after a job: real server, 2 real clients per job (connect, put,
//! fence with collect, get, fence, finalize), then the host's full cleanup (deregister each
//! client, then the namespace). The heap in use (glibc `mallinfo2`, every arena) is compared
//! before and after each job; the clients use the shared-memory store (ds21, libpmix's first
//! choice) or the hash store (`PMIX_GDS_MODULE=hash`, what the daemon gives its ranks),
//! interleaved and alternating order so neither arm sees a warmer heap.
//!
//! libpmix 4.2.2 never frees a connected client's records before `PMIx_server_finalize`; the
//! test checks that the hash store makes that retention clearly smaller (the reason the
//! daemon chooses it), and reports the bytes per client of both.

mod common;

use common::{answer_routine, drive, Host, Proc};

const CLIENTS: u32 = 2;
const WARMUP: usize = 2;
const JOBS: usize = 10;

fn heap_in_use() -> usize {
    // SAFETY: mallinfo2 only reads glibc's allocator statistics.
    unsafe { libc::mallinfo2() }.uordblks
}

/// One job of `CLIENTS` clients with store `gds` (None: libpmix's choice); returns the heap
/// bytes still in use afterwards compared with before.
fn one_job(host: &Host, n: usize, gds: Option<&str>) -> i64 {
    let nspace = format!("dvm-test-retained-{n}");
    let before = heap_in_use() as i64;
    let mut envs = host.launch_job(&nspace, CLIENTS);
    if let Some(g) = gds {
        for env in &mut envs {
            env.retain(|(k, _)| k != "PMIX_GDS_MODULE");
            env.push(("PMIX_GDS_MODULE".into(), g.into()));
        }
    }
    let client = env!("CARGO_BIN_EXE_pmix-test-client");
    let mut procs: Vec<Proc> =
        envs.iter().enumerate().map(|(r, env)| Proc::spawn(client, &["fence"], env, r as u32)).collect();
    drive(
        &host.rx,
        &mut procs,
        "retained test",
        |ev| match answer_routine(ev) {
            None => {}
            Some(other) => panic!("unexpected event {other:?}"),
        },
        |procs| procs.iter().all(|p| p.exit.is_some()),
    );
    for p in &mut procs {
        let (out, err) = p.output();
        assert_eq!(p.exit, Some(0), "rank {} ({gds:?}) failed\nstdout:\n{out}\nstderr:\n{err}", p.rank);
    }
    drop(procs);
    host.finish_job(&nspace, CLIENTS);
    heap_in_use() as i64 - before
}

fn median(mut v: Vec<i64>) -> i64 {
    v.sort_unstable();
    v[v.len() / 2]
}

#[test]
fn hash_store_retains_less_per_client() {
    let host = Host::start();
    let mut n = 0;
    let (mut ds, mut hash) = (Vec::new(), Vec::new());
    for i in 0..WARMUP + JOBS {
        let order = if i % 2 == 0 { [None, Some("hash")] } else { [Some("hash"), None] };
        for gds in order {
            n += 1;
            let kept = one_job(&host, n, gds);
            if i >= WARMUP {
                if gds.is_some() { &mut hash } else { &mut ds }.push(kept);
            }
        }
    }
    host.stop();
    let per_client = |v: &[i64]| median(v.to_vec()) / CLIENTS as i64;
    let (ds_c, hash_c) = (per_client(&ds), per_client(&hash));
    eprintln!("retained heap per client after a job: default store {ds_c} B, hash store {hash_c} B");
    eprintln!("  default store, per job: {ds:?}");
    eprintln!("  hash store, per job:    {hash:?}");
    // What dvmd's ranks use is bounded whatever this libpmix does with its default store
    // (measured here: ~7 KB per client with libpmix 4.2.2).
    assert!(hash_c < 16 * 1024, "the hash store keeps {hash_c} B per departed client (bound 16 KiB)");
    if ds_c < 1024 {
        eprintln!("this libpmix keeps under 1 KiB per client with its default store: nothing to compare");
        return;
    }
    assert!(
        hash_c * 10 < ds_c * 8,
        "the hash store should keep clearly less per client than the default store: {hash_c} B vs {ds_c} B"
    );
}
