//! MPMD jobs (`prun -n 2 A : -n 2 B`) under dvmd's PMIx server, on local DVMs at radix 2 and
//! 64: Open MPI 4.1 ranks see their own MPI_APPNUM (0, 0, 1, 1, as under mpirun) and the
//! universe size, and a plain PMIx client reads each rank's, app's and node's keys as PRRTE
//! registers them (docs/mpi-keys.md). Expected values are built from the apps' sizes and
//! the rank → host answers themselves, not copied from a run.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{mpi_bin, pmix_bin, text as out, Dvm, Nodes};

/// The app of each rank of a job whose apps have these sizes, and its rank in the app.
fn apps_of(sizes: &[u32]) -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    for (app, &n) in sizes.iter().enumerate() {
        for i in 0..n {
            v.push((app as u32, i));
        }
    }
    v
}

/// The DVM's slots: 4 daemons of 4.
const DVM_SLOTS: u32 = 16;

/// `prun -n s0 prog args0 : -n s1 prog args1 ...`; app i gets i extra arguments "a".
fn mpmd_args(sizes: &[u32], prog: &str) -> Vec<String> {
    let mut a = Vec::new();
    for (i, n) in sizes.iter().enumerate() {
        if i > 0 {
            a.push(":".to_string());
        }
        a.extend(["-n".to_string(), n.to_string(), prog.to_string()]);
        a.extend(std::iter::repeat_n("a".to_string(), i));
    }
    a
}

fn run(dvm: &Dvm, args: &[String]) -> String {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = dvm.prun(&a);
    assert!(o.status.success(), "prun {args:?}: {:?}\n{}\n{}", o.status, out(&o).1, dvm.log());
    out(&o).0
}

/// Open MPI 4.1's view: MPI_APPNUM, MPI_UNIVERSE_SIZE, and MPI_COMM_WORLD split by appnum.
fn check_mpi(dvm: &Dvm, sizes: &[u32]) {
    let want = apps_of(sizes);
    let n = want.len() as u32;
    let text = run(dvm, &mpmd_args(sizes, &mpi_bin("appnum")));
    let mut seen = BTreeSet::new();
    for line in text.lines().filter(|l| l.starts_with("rank ")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| f[i].parse::<u32>().unwrap_or_else(|_| panic!("field {i} of {line:?}"));
        let rank = num(1);
        let (app, app_rank) = want[rank as usize];
        // The universe is the DVM's slots, as mpirun gives its allocation's.
        let expect = format!(
            "rank {rank} of {n} appnum {app} universe {} app_rank {app_rank} app_size {} argc {}",
            DVM_SLOTS.max(n),
            sizes[app as usize],
            app + 1
        );
        assert_eq!(line, expect, "sizes {sizes:?}\n{text}");
        assert!(seen.insert(rank), "rank {rank} twice\n{text}");
    }
    assert_eq!(seen.len() as u32, n, "sizes {sizes:?}: not every rank printed\n{text}");
}

/// A PMIx client's view (tests/pmix/keys.c): "rank R SCOPE KEY = VALUE".
fn check_keys(dvm: &Dvm, sizes: &[u32]) {
    let want = apps_of(sizes);
    let n = want.len();
    let text = run(dvm, &mpmd_args(sizes, &pmix_bin("keys")));
    let mut got: BTreeMap<(u32, String, String), String> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("rank ") else { continue };
        let (head, value) = rest.split_once(" = ").unwrap_or_else(|| panic!("{line:?}"));
        let f: Vec<&str> = head.split_whitespace().collect();
        got.insert((f[0].parse().unwrap(), f[1].to_string(), f[2].to_string()), value.to_string());
    }
    let get = |rank: u32, scope: &str, key: &str| -> &str {
        got.get(&(rank, scope.to_string(), key.to_string()))
            .unwrap_or_else(|| panic!("rank {rank} printed no {scope} {key}\n{text}"))
    };
    let firsts: Vec<u32> = sizes.iter().scan(0, |s, &k| Some(std::mem::replace(s, *s + k))).collect();
    let prog = pmix_bin("keys");
    let cwd = std::env::current_dir().unwrap().display().to_string();
    // Each rank's node: its hostname; local ranks count up in rank order on each node.
    let mut on_node: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for r in 0..n as u32 {
        let (app, app_rank) = want[r as usize];
        assert_eq!(get(r, "proc", "pmix.appnum"), format!("{app} (u32)"));
        assert_eq!(get(r, "proc", "pmix.apprank"), format!("{app_rank} (rank)"));
        assert_eq!(get(r, "job", "pmix.job.size"), format!("{n} (u32)"));
        assert_eq!(get(r, "job", "pmix.univ.size"), format!("{} (u32)", DVM_SLOTS.max(n as u32)));
        assert_eq!(get(r, "job", "pmix.job.napps"), format!("{} (u32)", sizes.len()));
        assert_eq!(get(r, "job", "pmix.mapby"), "\"BYSLOT\"");
        assert_eq!(get(r, "job", "pmix.rankby"), "\"SLOT\"");
        for (a, &size) in sizes.iter().enumerate() {
            let scope = format!("app{a}");
            assert_eq!(get(r, &scope, "pmix.app.size"), format!("{size} (u32)"), "rank {r}");
            assert_eq!(get(r, &scope, "pmix.aldr"), format!("{} (rank)", firsts[a]), "rank {r}");
            let argv: Vec<&str> = std::iter::once(prog.as_str()).chain(std::iter::repeat_n("a", a)).collect();
            assert_eq!(get(r, &scope, "pmix.app.argv"), format!("{:?}", argv.join(" ")), "rank {r}");
            assert_eq!(get(r, &scope, "pmix.wdir"), format!("{cwd:?}"), "rank {r}");
        }
        let host = get(r, "proc", "pmix.hname").trim_matches('"').to_string();
        on_node.entry(host).or_default().push(r);
    }
    for ranks in on_node.values() {
        let peers = ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",");
        let nodeid = get(ranks[0], "proc", "pmix.nodeid");
        for (i, &r) in ranks.iter().enumerate() {
            assert_eq!(get(r, "proc", "pmix.lrank"), format!("{i} (u16)"), "rank {r}");
            assert_eq!(get(r, "proc", "pmix.nrank"), format!("{i} (u16)"), "rank {r}");
            assert_eq!(get(r, "proc", "pmix.nodeid"), nodeid, "rank {r}: node ids of one host differ");
            assert_eq!(get(r, "job", "pmix.lpeers"), format!("{peers:?}"), "rank {r}");
            assert_eq!(get(r, "job", "pmix.local.size"), format!("{} (u32)", ranks.len()), "rank {r}");
            assert_eq!(get(r, "node", "pmix.node.size"), format!("{} (u32)", ranks.len()), "rank {r}");
            assert_eq!(get(r, "node", "pmix.lldr"), format!("{} (rank)", ranks[0]), "rank {r}");
        }
    }
    let ids: BTreeSet<&str> = on_node.values().map(|r| get(r[0], "proc", "pmix.nodeid")).collect();
    assert_eq!(ids.len(), on_node.len(), "two hosts share a node id\n{text}");
}

fn appnum_suite(radix: u32) {
    let env = [("OMPI_MCA_pml", "ob1")];
    let dvm = Dvm::start(&format!("appnum-r{radix}"), Nodes::Local { daemons: 4, slots: DVM_SLOTS / 4 }, radix, &env);
    // mpirun's 0, 0, 1, 1; then uneven apps spanning nodes (4 slots each), and one app.
    for sizes in [&[2, 2][..], &[3, 1, 4], &[6, 5, 1], &[4]] {
        check_mpi(&dvm, sizes);
    }
    for sizes in [&[2, 2][..], &[3, 1, 4, 2]] {
        check_keys(&dvm, sizes);
    }
    dvm.stop();
}

#[test]
fn appnum_local_radix_2() {
    appnum_suite(2);
}

#[test]
fn appnum_local_radix_64() {
    appnum_suite(64);
}
