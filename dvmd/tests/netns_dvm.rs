//! DVMs over fake nodes: one network namespace per host (own address, own hostname) joined by a
//! bridge, daemons started through the `ip netns exec {host}` launch agent, the HNP on the
//! head address. Needs root: otherwise each test records a skip (`dvm_tests::skip`); as root
//! a skip is a failure.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use dvm_proto::control::{BenchKind, BenchRequest};
use dvm_tests::process::{assert_no_leftovers, wait_for_line, ChildGuard, LineReader, TestTag};
use dvm_tests::{require_netns, FakeCluster};
use dvmd::control::Client;
use dvmd::session::DvmUri;

const DVMD: &str = env!("CARGO_BIN_EXE_dvmd");
const PTERM: &str = env!("CARGO_BIN_EXE_pterm");
const PRUN: &str = env!("CARGO_BIN_EXE_prun");

/// Only guards against a hung boot; never what decides pass or fail.
const BOOT_GUARD: Duration = Duration::from_secs(120);

struct NetnsDvm {
    cluster: FakeCluster,
    hnp: ChildGuard,
    /// Keeps draining the HNP's stdout.
    _out: LineReader,
    dir: std::path::PathBuf,
    uri_file: std::path::PathBuf,
    tag: TestTag,
}

/// How long a daemon may stay silent before its peers declare it lost (`--heartbeat-ms` x
/// `--heartbeat-misses`).
#[derive(Clone, Copy)]
struct Heartbeat {
    ms: u64,
    misses: u32,
}

/// For tests that are not about losing a node: 30 s of silence, which a loaded two-core
/// machine running 1,000 fences over namespaces does not reach, so no daemon is lost by
/// accident.
const LOSS_NOT_TESTED: Heartbeat = Heartbeat { ms: 1000, misses: 30 };
/// For the test about detecting a silent node: 3 s, well inside its 30 s guard.
const LOSS_TESTED: Heartbeat = Heartbeat { ms: 500, misses: 6 };

fn start(name: &str, nodes: usize, radix: u32, hb: Heartbeat) -> NetnsDvm {
    let cluster = FakeCluster::new(nodes).expect("fake cluster");
    let dir = std::env::temp_dir().join(format!("dvm-netns-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let hostfile = dir.join("hosts");
    cluster.write_hostfile(&hostfile, 2).unwrap();
    let uri_file = dir.join("uri");
    let tag = TestTag::new();
    let mut cmd = Command::new(DVMD);
    cmd.arg("--hostfile")
        .arg(&hostfile)
        .arg("--launch-agent")
        .arg(cluster.exec_prefix_with_hostname())
        .arg("--bind-address")
        .arg(cluster.head_addr().to_string())
        .arg("--radix")
        .arg(radix.to_string())
        .arg("--heartbeat-ms")
        .arg(hb.ms.to_string())
        .arg("--heartbeat-misses")
        .arg(hb.misses.to_string())
        .arg("--report-uri")
        .arg(&uri_file)
        .env("DVM_TMPDIR", &dir)
        .stdout(Stdio::piped());
    tag.apply(&mut cmd);
    let mut hnp = ChildGuard::spawn(&mut cmd).expect("start dvmd");
    let out = hnp.take_stdout().unwrap();
    let out = match wait_for_line(out, "DVM ready", BOOT_GUARD) {
        Ok((_, out)) => out,
        // The guards kill dvmd and everything in the nodes on the way out.
        Err(e) => panic!("dvmd over {nodes} fake nodes (radix {radix}) not ready: {e}"),
    };
    NetnsDvm { cluster, hnp, _out: out, dir, uri_file, tag }
}

impl NetnsDvm {
    async fn client(&self) -> Client {
        let uri = DvmUri::parse(&std::fs::read_to_string(&self.uri_file).unwrap()).unwrap();
        Client::connect(uri).await.unwrap()
    }

    fn pterm(&mut self) {
        let st =
            Command::new(PTERM).arg("--dvm-uri").arg(format!("file:{}", self.uri_file.display())).status().unwrap();
        assert!(st.success(), "pterm: {st}");
        let st = self.hnp.wait_timeout(Duration::from_secs(20)).unwrap().expect("dvmd did not exit");
        assert!(st.success(), "dvmd exit: {st}");
    }

    fn assert_clean(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !dvm_tests::process::leftovers("dvmd", &self.tag).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_no_leftovers("dvmd", &self.tag);
        let left = common::session_dirs(&self.dir);
        assert!(left.is_empty(), "session directories left: {left:?}");
    }
}

impl Drop for NetnsDvm {
    fn drop(&mut self) {
        self.cluster.kill_all_in_netns();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn four_fake_nodes(radix: u32) {
    let mut dvm = start(&format!("r{radix}"), 4, radix, LOSS_NOT_TESTED);
    let mut c = dvm.client().await;
    let st = c.status().await.unwrap();
    assert_eq!(st.num_daemons, 5, "HNP plus one daemon per node");
    let views = c.tree_views().await.unwrap().views;
    assert_eq!(views.len(), 5);
    for (i, name) in dvm.cluster.node_names().iter().enumerate() {
        let r = i + 1;
        assert_eq!(st.daemons[r].host, *name, "daemon {r} label");
        assert_eq!(views[r].host, *name, "daemon {r} runs in its own node (hostname)");
        assert!(st.daemons[r].addr.starts_with(&dvm.cluster.node_addr(i).to_string()), "daemon {r} address");
        assert_eq!((views[r].parent, &views[r].children), (st.daemons[r].parent, &st.daemons[r].children));
    }
    // 1 MiB broadcasts on both movements and alternating fences on both, checked on every
    // daemon (over the nodes' own links: the lateral ones too).
    for bcast in ["tree", "bulk"] {
        let req = BenchRequest {
            kind: BenchKind::Xcast as i32,
            count: 3,
            bytes: 1 << 20,
            bcast_movement: bcast.into(),
            ..Default::default()
        };
        let x = c.bench(req).await.unwrap();
        assert_eq!(x.errors, 0, "{bcast}: {}", x.first_error);
    }
    for fence in ["tree", "allgather", "auto"] {
        let req = BenchRequest {
            kind: BenchKind::Alternate as i32,
            count: 1000,
            bytes: 64,
            fence_movement: fence.into(),
            ..Default::default()
        };
        let f = c.bench(req).await.unwrap();
        assert_eq!(f.errors, 0, "{fence}: {}", f.first_error);
    }

    // Jobs on the fake nodes: every rank runs on the node the map says, seen by its hostname.
    let uri = format!("file:{}", dvm.uri_file.display());
    let prun = |args: &[&str]| Command::new(PRUN).arg("--dvm-uri").arg(&uri).args(args).output().unwrap();
    let out = prun(&["-n", "8", "--output", "tag", "sh", "-c", "echo $(hostname) $DVM_RANK"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let names = dvm.cluster.node_names();
    for r in 0..8usize {
        // Two slots per node, block mapping: ranks 2i and 2i+1 on node i.
        let want = format!("<stdout>: {} {r}", names[r / 2]);
        assert!(text.lines().any(|l| l.starts_with(&format!("[1,{r}]")) && l.ends_with(&want)), "rank {r}: {text}");
    }
    // 10 MiB from a proc on the last node arrives byte-exact; a failure is named.
    let blob = dvm.dir.join("blob");
    let data: Vec<u8> = (0..10u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    std::fs::write(&blob, &data).unwrap();
    let out = prun(&["-n", "1", "--host", names[3], "cat", blob.to_str().unwrap()]);
    assert!(out.status.success() && out.stdout == data, "10 MiB over the fake network differs");
    let out = prun(&["-n", "8", "sh", "-c", "[ $DVM_RANK = 7 ] && exit 3; sleep 30"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("rank 7 on node {}", names[3])));
    dvm.pterm();
    dvm.assert_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_fake_nodes_radix_2() {
    require_netns!();
    four_fake_nodes(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_fake_nodes_radix_64() {
    require_netns!();
    four_fake_nodes(64).await;
}

/// A node that vanishes without a RST (its link cut) is noticed by heartbeats, named, and
/// the survivors keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_is_detected_and_named() {
    require_netns!();
    let mut dvm = start("cut", 4, 2, LOSS_TESTED);
    let mut c = dvm.client().await;
    // Node 3 holds daemon 4, a leaf at radix 2 (children of 1 are 3 and 5; 4 is 2's child).
    dvm.cluster.cut(3).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = c.status().await.unwrap();
        if !st.daemons[4].alive {
            break;
        }
        assert!(Instant::now() < deadline, "the cut node was never declared lost");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let f = c
        .bench(BenchRequest { kind: BenchKind::Alternate as i32, count: 50, bytes: 16, ..Default::default() })
        .await
        .unwrap();
    assert_eq!(f.errors, 0, "{}", f.first_error);
    dvm.cluster.restore(3).unwrap();
    dvm.pterm();
    // The cut daemon lost its HNP and exited by itself (or is killed with its namespace).
    dvm.cluster.kill_all_in_netns();
    dvm.assert_clean();
}
