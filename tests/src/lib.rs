//! Test support for multi-host dvm tests (docs/architecture.md).
//!
//! Owns: fake nodes built from Linux network namespaces ([`FakeCluster`]), the
//! system-wide registry of clusters that lets a later run reap what a crashed run left
//! behind ([`cleanup_stale`]), and process helpers for tests that start real daemons
//! ([`ChildGuard`], [`LineReader`], [`leftovers`]).
//!
//! Never: touch network state it did not create (no host firewall rules, no sysctls, no
//! addresses outside the cluster's own 10.231.k.0/24), or signal a process it cannot tie to
//! a child or to one of its own namespaces.
//!
//! Invariants and traps:
//! - The bridge lives in a dedicated *switch* namespace, not in the root namespace: with
//!   `br_netfilter` loaded (any machine running docker) frames bridged in the root namespace
//!   go through the host's iptables FORWARD chain, whose policy is often DROP, so node-to-node
//!   traffic silently vanishes while head-to-node traffic works.
//! - `ip netns exec` keeps the host's hostname; use the hostname prefix
//!   ([`FakeCluster::exec_prefix_with_hostname`]) for daemons that must see their node name.
//! - Deleting a namespace kills nothing: processes keep it (and its links) alive. Teardown
//!   SIGKILLs every process still inside a cluster namespace first.
//! - A socket keeps the namespace it was created in; [`FakeCluster::in_node`] runs a closure
//!   on a fresh thread that entered the node's namespace, never on the caller's thread.
//! - Timed socket reads (`SO_RCVTIMEO`) can fail with EINTR under load here even without a
//!   signal handler; retry them.
//!
//! ```no_run
//! use std::process::Stdio;
//! use std::time::Duration;
//! use dvm_tests::{assert_no_leftovers, wait_for_line, ChildGuard, FakeCluster, TestTag};
//!
//! dvm_tests::require_netns!(Ok(())); // records a skip and returns when not root
//! let cluster = FakeCluster::new(4)?; // dropped last: kills what is left in the nodes
//! let hostfile = std::env::temp_dir().join("hosts");
//! cluster.write_hostfile(&hostfile, 2)?; // "dvm<k>n0 slots=2" ...
//! let agent = cluster.exec_prefix_with_hostname(); // "ip netns exec {host} unshare --uts sh ..."
//! let tag = TestTag::new();
//!
//! let mut hnp = std::process::Command::new("dvmd");
//! hnp.arg("--hostfile").arg(&hostfile).arg("--launch-agent").arg(&agent)
//!     .arg("--bind").arg(cluster.head_addr().to_string())
//!     .stdout(Stdio::piped());
//! tag.apply(&mut hnp);
//! let mut hnp = ChildGuard::spawn(&mut hnp)?; // SIGKILLs its process group on drop
//! let (_, mut out) = wait_for_line(hnp.take_stdout().unwrap(), "DVM ready", Duration::from_secs(30))?;
//!
//! cluster.cut(3)?; // node 3 goes silent: no RST, no ICMP
//! out.wait_for_line("daemon 3 lost", Duration::from_secs(30))?;
//! cluster.restore(3)?;
//!
//! drop(hnp);
//! assert_no_leftovers("dvmd", &tag); // daemons on the nodes carry the tag too
//! # Ok::<(), dvm_tests::HarnessError>(())
//! ```

mod cmd;
pub mod fuzz;
pub mod netns;
pub mod process;
mod registry;

pub use netns::{ClusterFootprint, FakeCluster, Node, NETNS_EXEC_PREFIX};
pub use process::{
    assert_no_leftovers, leftovers, processes_in_netns, processes_named, wait_for_line, ChildGuard, LineReader,
    ProcInfo, TestTag,
};
pub use registry::{cleanup_stale, REGISTRY_DIR};

use std::time::Duration;

/// Everything that can go wrong in the harness, naming the command, node or value at fault.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("fake cluster unavailable: {0}")]
    Unavailable(String),
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Command { cmd: String, status: String, stderr: String },
    #[error("no free subnet 10.231.k.0/24 after {tries} candidates (last refusal: {last})")]
    NoFreeSubnet { tries: usize, last: String },
    #[error("a fake cluster holds 1..={max} nodes, {requested} requested")]
    BadNodeCount { requested: usize, max: usize },
    #[error("node {node} does not exist: cluster {cluster} has {nodes} nodes")]
    NoSuchNode { cluster: String, node: usize, nodes: usize },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no line containing {pattern:?} within {timeout:?}; last lines: {tail:?}")]
    LineTimeout { pattern: String, timeout: Duration, tail: Vec<String> },
    #[error("stream ended before a line containing {pattern:?}; last lines: {tail:?}")]
    LineEof { pattern: String, tail: Vec<String> },
}

pub type Result<T> = std::result::Result<T, HarnessError>;

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> HarnessError {
    let context = context.into();
    move |source| HarnessError::Io { context, source }
}

/// Environment variable naming a directory where a skipped test leaves a record
/// (`scripts/test.sh` sets it and summarizes the records at the end).
pub const SKIP_DIR_VAR: &str = "DVM_TEST_SKIP_DIR";

/// Records that `test` is skipped because of `reason`, or fails it when this process is root:
/// root (CI) can build fake clusters, so there a skip would hide a broken harness. The
/// record is a line `test<TAB>reason` in a file of its own under `$DVM_TEST_SKIP_DIR` (when
/// set) and a `SKIP` line on stderr.
pub fn skip(test: &str, reason: &str) {
    if nix::unistd::geteuid().is_root() {
        panic!("{test}: running as root, so it must not skip, but: {reason}");
    }
    eprintln!("SKIP {test}: {reason}");
    if let Some(dir) = std::env::var_os(SKIP_DIR_VAR) {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let file = std::path::Path::new(&dir).join(format!("{}-{n}.skip", std::process::id()));
        let line = format!("{}\t{}\n", test, reason.replace(['\n', '\t'], " "));
        if let Err(e) = std::fs::write(&file, line) {
            panic!("{test}: cannot record its skip in {}: {e}", file.display());
        }
    }
}

/// Returns from the current test when fake clusters cannot be built here (not root, no
/// usable `ip netns`), after recording the skip with [`skip`] (which fails the test instead
/// when running as root). On a root machine with iproute2 it does nothing, so the test
/// runs. `require_netns!(value)` returns `value` instead, for tests that return a `Result`.
#[macro_export]
macro_rules! require_netns {
    () => {
        $crate::require_netns!(())
    };
    ($skipped:expr) => {
        if let Err(reason) = $crate::FakeCluster::availability() {
            // libtest names each test's thread after the test.
            let current = std::thread::current();
            let name = format!("{}::{}", module_path!(), current.name().unwrap_or("?"));
            $crate::skip(&name, &reason);
            return $skipped;
        }
    };
}
