//! [`FakeCluster`]: N fake hosts on one machine, each a network namespace with its own
//! `eth0`, joined by a bridge; the root namespace is the head node.
//!
//! Layout of cluster index `k` (all names derive from `k`, so a crashed run can be reaped
//! by pattern):
//!
//! ```text
//!  root netns                 switch netns dvm<k>sw           node netns dvm<k>n<i>
//!  dvm<k>hd 10.231.k.1/24 ── hd ─┐
//!                                br0 ── v<i> ──────────────── eth0 10.231.k.(10+i)/24
//!                                                              default via 10.231.k.1
//! ```
//!
//! The bridge sits in its own namespace so that bridged frames never meet the host's
//! iptables FORWARD chain (see the crate docs). `cut(i)` downs `v<i>`: frames to and from
//! node i are dropped, no RST or ICMP comes back, exactly like a host that lost its link.

use std::fs::{self, File};
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Once, OnceLock};
use std::time::Duration;

use nix::sched::{setns, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cmd::{ip, link_names, netns_list, netns_pids};
use crate::registry::{self, cleanup_stale};
use crate::{io_err, HarnessError, Result};

/// Launch-agent prefix that runs a command on a node: `{host}` is the node (namespace) name.
/// The command keeps the head's hostname; see [`FakeCluster::exec_prefix_with_hostname`].
pub const NETNS_EXEC_PREFIX: &str = "ip netns exec {host}";

/// Node i gets host number `FIRST_NODE_HOST + i`; the head is `.1`.
const HEAD_HOST: u8 = 1;
const FIRST_NODE_HOST: u8 = 10;
const MAX_NODES: usize = 254 - FIRST_NODE_HOST as usize + 1;

/// Where `ip netns exec <ns>` finds files it bind-mounts over `/etc` (here: `hosts`).
const ETC_NETNS: &str = "/etc/netns";

pub(crate) fn switch_ns(k: u8) -> String {
    format!("dvm{k}sw")
}

pub(crate) fn node_ns(k: u8, i: usize) -> String {
    format!("dvm{k}n{i}")
}

pub(crate) fn head_link(k: u8) -> String {
    format!("dvm{k}hd")
}

/// Whether namespace `name` is one of cluster `k`'s (`dvm<k>sw` or `dvm<k>n<digits>`).
fn belongs(k: u8, name: &str) -> bool {
    name == switch_ns(k)
        || name
            .strip_prefix(&format!("dvm{k}n"))
            .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
}

fn subnet_addr(k: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 231, k, host)
}

/// One fake host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Namespace name, hostname under the hostname prefix, and hostfile entry.
    pub name: String,
    /// Address of its `eth0`.
    pub addr: Ipv4Addr,
}

/// Everything a cluster creates, for checking that nothing is left after it is dropped.
#[derive(Debug, Clone)]
pub struct ClusterFootprint {
    pub k: u8,
    /// The registry marker directory, holding the `owner` file ("pid starttime").
    pub marker: PathBuf,
    pub netns: Vec<String>,
    /// Links in the root namespace (the others die with their namespaces).
    pub root_links: Vec<String>,
    pub paths: Vec<PathBuf>,
}

impl ClusterFootprint {
    /// What of the footprint still exists on the system, one description per item.
    pub fn remaining(&self) -> Vec<String> {
        let mut left = Vec::new();
        let netns = netns_list().unwrap_or_default();
        left.extend(self.netns.iter().filter(|n| netns.contains(n)).map(|n| format!("netns {n}")));
        let links = link_names().unwrap_or_default();
        left.extend(self.root_links.iter().filter(|l| links.contains(l)).map(|l| format!("link {l}")));
        left.extend(self.paths.iter().filter(|p| p.exists()).map(|p| format!("path {}", p.display())));
        left
    }
}

/// N fake hosts in network namespaces behind one bridge; dropping it removes them all.
#[derive(Debug)]
pub struct FakeCluster {
    k: u8,
    nodes: Vec<Node>,
    marker: PathBuf,
}

impl FakeCluster {
    /// `Ok` when clusters can be built here (root, a working `ip netns`); otherwise why not.
    /// Probed once per process by adding and deleting a scratch namespace.
    pub fn availability() -> std::result::Result<(), String> {
        static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
        PROBE
            .get_or_init(|| {
                let euid = nix::unistd::geteuid();
                if !euid.is_root() {
                    return Err(format!("needs root for network namespaces (euid {euid})"));
                }
                netns_list().map_err(|e| format!("`ip netns` unusable: {e}"))?;
                let probe = format!("dvmprobe{}", std::process::id());
                ip(&["netns", "add", &probe]).map_err(|e| format!("cannot create a network namespace: {e}"))?;
                ip(&["netns", "del", &probe]).map_err(|e| format!("cannot delete namespace {probe}: {e}"))?;
                Ok(())
            })
            .clone()
    }

    /// Whether clusters can be built here; see [`FakeCluster::availability`] for the reason.
    pub fn available() -> bool {
        Self::availability().is_ok()
    }

    /// Builds `nodes` fake hosts. Reaps stale clusters of dead runs once per process first.
    pub fn new(nodes: usize) -> Result<FakeCluster> {
        Self::availability().map_err(HarnessError::Unavailable)?;
        if nodes == 0 || nodes > MAX_NODES {
            return Err(HarnessError::BadNodeCount { requested: nodes, max: MAX_NODES });
        }
        static REAPED: Once = Once::new();
        REAPED.call_once(|| {
            if let Err(e) = cleanup_stale() {
                eprintln!("dvm-tests: reaping stale clusters failed: {e}");
            }
        });
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let seed =
            std::process::id().wrapping_mul(37).wrapping_add(COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(101));
        let claim = registry::claim(seed, index_free)?;
        let mut cluster = FakeCluster { k: claim.k, nodes: Vec::new(), marker: claim.dir };
        // On error `cluster` drops here and tears down whatever was built.
        cluster.build(nodes)?;
        Ok(cluster)
    }

    fn build(&mut self, n: usize) -> Result<()> {
        let (k, sw, hd) = (self.k, switch_ns(self.k), head_link(self.k));
        let head = format!("{}/24", self.head_addr());
        ip(&["netns", "add", &sw])?;
        ip(&["-n", &sw, "link", "set", "lo", "up"])?;
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        ip(&["link", "add", &hd, "type", "veth", "peer", "name", "hd", "netns", &sw])?;
        ip(&["-n", &sw, "link", "set", "hd", "master", "br0", "up"])?;
        ip(&["addr", "add", &head, "dev", &hd])?;
        // Node traffic to anything but the head ends at the head: never routed off the
        // machine. Per-interface, on our own link; the machine's settings are untouched.
        let forwarding = format!("/proc/sys/net/ipv4/conf/{hd}/forwarding");
        fs::write(&forwarding, "0").map_err(io_err(format!("writing 0 to {forwarding}")))?;
        ip(&["link", "set", &hd, "up"])?;
        for i in 0..n {
            let node = Node { name: node_ns(k, i), addr: subnet_addr(k, FIRST_NODE_HOST + i as u8) };
            let (ns, port) = (node.name.as_str(), format!("v{i}"));
            ip(&["netns", "add", ns])?;
            self.nodes.push(node.clone());
            ip(&["-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", ns])?;
            ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
            ip(&["-n", ns, "addr", "add", &format!("{}/24", node.addr), "dev", "eth0"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "route", "add", "default", "via", &self.head_addr().to_string()])?;
        }
        self.write_sethost()?;
        self.write_etc_files()
    }

    /// The helper behind the hostname prefix: sets the (already unshared) UTS namespace's
    /// hostname, then becomes the command.
    fn write_sethost(&self) -> Result<()> {
        let path = self.sethost_path();
        let script = "#!/bin/sh\n\
             # dvm-tests: run only under `unshare --uts`; names this node, then execs the command.\n\
             hostname \"$1\" || exit 127\nshift\nexec \"$@\"\n";
        fs::write(&path, script).map_err(io_err(format!("writing {}", path.display())))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .map_err(io_err(format!("chmod {}", path.display())))
    }

    /// Files that `ip netns exec` mounts over their `/etc` namesakes, per node: `hosts`, in
    /// which every node name resolves to its address and the head's hostname to the head
    /// address, and a resolver setup without DNS (`hosts: files`; nameserver on loopback),
    /// since no DNS server is reachable from a node: a lookup that fell through to DNS would
    /// wait out the resolver timeout (`getent hosts <node>` took 10 s: its IPv6 lookup missed
    /// the hosts file and went to DNS).
    fn write_etc_files(&self) -> Result<()> {
        let head_name =
            nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "localhost".into());
        let mut hosts = format!(
            "# dvm-tests fake cluster k={}\n127.0.0.1 localhost\n::1 localhost\n{} {head_name}\n",
            self.k,
            self.head_addr()
        );
        for n in &self.nodes {
            hosts.push_str(&format!("{} {}\n", n.addr, n.name));
        }
        let nsswitch: String = fs::read_to_string("/etc/nsswitch.conf")
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim_start().starts_with("hosts:"))
            .map(|l| format!("{l}\n"))
            .chain(std::iter::once("hosts: files\n".to_string()))
            .collect();
        let resolv = "# dvm-tests: fake nodes have no DNS\nnameserver 127.0.0.1\n\
                      options timeout:1 attempts:1\n";
        for n in &self.nodes {
            let dir = Path::new(ETC_NETNS).join(&n.name);
            fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
            for (file, text) in [("hosts", hosts.as_str()), ("nsswitch.conf", &nsswitch), ("resolv.conf", resolv)] {
                let path = dir.join(file);
                fs::write(&path, text).map_err(io_err(format!("writing {}", path.display())))?;
            }
        }
        Ok(())
    }

    fn sethost_path(&self) -> PathBuf {
        self.marker.join("sethost")
    }

    fn node(&self, i: usize) -> Result<&Node> {
        self.nodes.get(i).ok_or_else(|| HarnessError::NoSuchNode {
            cluster: switch_ns(self.k),
            node: i,
            nodes: self.nodes.len(),
        })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node_names(&self) -> Vec<&str> {
        self.nodes.iter().map(|n| n.name.as_str()).collect()
    }

    /// # Panics
    /// If `i` is not a node of this cluster.
    pub fn node_name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// # Panics
    /// If `i` is not a node of this cluster.
    pub fn node_addr(&self, i: usize) -> Ipv4Addr {
        self.nodes[i].addr
    }

    /// The head node's address: the root namespace's end of the cluster network. Daemons
    /// in the root namespace (the HNP, `prun`) bind or connect here to reach the nodes.
    pub fn head_addr(&self) -> Ipv4Addr {
        subnet_addr(self.k, HEAD_HOST)
    }

    /// The cluster's index k, the third octet of its 10.231.k.0/24 subnet.
    pub fn index(&self) -> u8 {
        self.k
    }

    /// Launch agent that runs a command in node `{host}`'s namespace; the command sees the
    /// head's hostname. Enough for anything that only needs the network.
    pub fn netns_exec_prefix(&self) -> &'static str {
        NETNS_EXEC_PREFIX
    }

    /// Launch agent that runs a command in node `{host}`'s namespace *and* in a fresh UTS
    /// namespace named `{host}`, so `hostname`/`gethostname()` return the node name. Use this
    /// one for daemons and procs. It contains no quoting, so splitting it on whitespace (as a
    /// launch agent does) is correct.
    pub fn exec_prefix_with_hostname(&self) -> String {
        format!("{NETNS_EXEC_PREFIX} unshare --uts sh {} {{host}}", self.sethost_path().display())
    }

    /// `prefix` with `{host}` replaced by node i's name, split into argv words.
    pub fn expand_prefix(&self, prefix: &str, i: usize) -> Result<Vec<String>> {
        let name = &self.node(i)?.name;
        Ok(prefix.split_whitespace().map(|w| w.replace("{host}", name)).collect())
    }

    /// A `Command` that runs `program` on node i with the node's hostname (the
    /// [`FakeCluster::exec_prefix_with_hostname`] prefix). Add args, env, stdio as usual.
    pub fn node_command(&self, i: usize, program: &str) -> Result<Command> {
        let argv = self.expand_prefix(&self.exec_prefix_with_hostname(), i)?;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]).arg(program);
        Ok(cmd)
    }

    /// Writes a hostfile listing every node: `<name> slots=<slots>` per line.
    pub fn write_hostfile(&self, path: &Path, slots: usize) -> Result<()> {
        let text: String = self.nodes.iter().map(|n| format!("{} slots={slots}\n", n.name)).collect();
        fs::write(path, text).map_err(io_err(format!("writing hostfile {}", path.display())))
    }

    /// Node i drops off the network without a trace: its switch port goes down, so frames
    /// to and from it are discarded and peers see neither RST nor ICMP, only silence.
    pub fn cut(&self, i: usize) -> Result<()> {
        self.node(i)?;
        ip(&["-n", &switch_ns(self.k), "link", "set", &format!("v{i}"), "down"]).map(drop)
    }

    /// Undoes [`FakeCluster::cut`]; connections that survived the silence resume.
    pub fn restore(&self, i: usize) -> Result<()> {
        self.node(i)?;
        ip(&["-n", &switch_ns(self.k), "link", "set", &format!("v{i}"), "up"]).map(drop)
    }

    /// Runs `f` on a new thread that has entered node i's network namespace, and returns its
    /// result. Sockets created by `f` stay in that namespace wherever they are used later.
    /// A panic in `f` propagates.
    pub fn in_node<T: Send>(&self, i: usize, f: impl FnOnce() -> T + Send) -> Result<T> {
        let path = format!("/run/netns/{}", self.node(i)?.name);
        std::thread::scope(|s| {
            let worker = s.spawn(|| {
                let ns = File::open(&path).map_err(io_err(format!("opening {path}")))?;
                setns(&ns, CloneFlags::CLONE_NEWNET)
                    .map_err(|e| HarnessError::Io { context: format!("entering {path}"), source: e.into() })?;
                Ok(f())
            });
            worker.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// SIGKILLs every process still inside one of the cluster's namespaces (as listed by
    /// `ip netns pids`) and waits briefly until they are gone. Returns how many it signalled.
    /// Dropping the cluster does this too.
    pub fn kill_all_in_netns(&self) -> usize {
        let mut names = self.node_names().iter().map(|s| s.to_string()).collect::<Vec<_>>();
        names.push(switch_ns(self.k));
        kill_in(&names)
    }

    /// What this cluster put on the system, to check after drop that all of it is gone.
    pub fn footprint(&self) -> ClusterFootprint {
        let mut netns = vec![switch_ns(self.k)];
        netns.extend(self.nodes.iter().map(|n| n.name.clone()));
        let mut paths = vec![self.marker.clone()];
        paths.extend(self.nodes.iter().map(|n| Path::new(ETC_NETNS).join(&n.name)));
        ClusterFootprint { k: self.k, marker: self.marker.clone(), netns, root_links: vec![head_link(self.k)], paths }
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        for problem in teardown(self.k) {
            eprintln!("dvm-tests: tearing down cluster k={}: {problem}", self.k);
        }
        if let Err(e) = fs::remove_dir_all(&self.marker) {
            eprintln!("dvm-tests: removing {}: {e}", self.marker.display());
        }
    }
}

/// Kills the processes in `namespaces` until none are left (bounded), sparing this process.
fn kill_in(namespaces: &[String]) -> usize {
    let me = std::process::id() as i32;
    let mut signalled = std::collections::BTreeSet::new();
    for _ in 0..100 {
        let pids: Vec<i32> =
            namespaces.iter().flat_map(|ns| netns_pids(ns).unwrap_or_default()).filter(|&p| p != me).collect();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            signalled.insert(pid);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signalled.len()
}

/// Removes everything of cluster index `k`, found by name: processes in its namespaces, the
/// head link, the namespaces, `/etc/netns` entries. Best effort; returns what went wrong.
pub(crate) fn teardown(k: u8) -> Vec<String> {
    let mut problems = Vec::new();
    let namespaces: Vec<String> = match netns_list() {
        Ok(all) => all.into_iter().filter(|n| belongs(k, n)).collect(),
        Err(e) => {
            problems.push(e.to_string());
            Vec::new()
        }
    };
    kill_in(&namespaces);
    let hd = head_link(k);
    if link_names().is_ok_and(|links| links.contains(&hd)) {
        if let Err(e) = ip(&["link", "del", &hd]) {
            problems.push(e.to_string());
        }
    }
    for ns in &namespaces {
        if let Err(e) = ip(&["netns", "del", ns]) {
            problems.push(e.to_string());
        }
    }
    if let Ok(entries) = fs::read_dir(ETC_NETNS) {
        for entry in entries.flatten() {
            if belongs(k, &entry.file_name().to_string_lossy()) {
                if let Err(e) = fs::remove_dir_all(entry.path()) {
                    problems.push(format!("removing {}: {e}", entry.path().display()));
                }
            }
        }
    }
    problems
}

/// Refuses index `k` if any of its names or addresses is already in use on this machine.
fn index_free(k: u8) -> std::result::Result<(), String> {
    let netns = netns_list().map_err(|e| e.to_string())?;
    if let Some(ns) = netns.iter().find(|n| belongs(k, n)) {
        return Err(format!("namespace {ns} exists"));
    }
    if link_names().map_err(|e| e.to_string())?.contains(&head_link(k)) {
        return Err(format!("link {} exists", head_link(k)));
    }
    let needle = format!("10.231.{k}.");
    let addrs = ip(&["-4", "-o", "addr", "show"]).map_err(|e| e.to_string())?;
    let routes = ip(&["-4", "route", "show", "table", "all"]).map_err(|e| e.to_string())?;
    if let Some(line) = addrs.lines().chain(routes.lines()).find(|l| l.contains(&needle)) {
        return Err(format!("10.231.{k}.0/24 in use: {}", line.trim()));
    }
    Ok(())
}
