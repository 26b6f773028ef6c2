//! Holds a [`FakeCluster`] for a script: `fake_cluster K SLOTS HOSTFILE` builds K fake nodes,
//! writes HOSTFILE (`<node> slots=SLOTS` per line), prints one `key=value` line per fact, then
//! `ready`, and keeps the cluster until its stdin reaches EOF (the script closed it or died);
//! dropping the cluster kills what is left in the nodes and removes every namespace.
//!
//! Printed keys: `k` (third octet of 10.231.k.0/24), `head` (head address in the root
//! namespace), `subnet`, `agent` (launch agent prefix setting the node hostname, `{host}`
//! placeholder), `agent_plain` (`ip netns exec {host}`), `hostfile`, `node=<name> <addr>` per node.
//!
//! ```sh
//! cargo build --release -p dvm-tests --example fake_cluster
//! target/release/examples/fake_cluster 4 4 /tmp/hosts   # root; Ctrl-D tears it down
//! ```

use std::io::{Read, Write};
use std::path::PathBuf;

use dvm_tests::FakeCluster;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [k, slots, hostfile] = args.as_slice() else {
        return Err(format!("usage: fake_cluster NODES SLOTS HOSTFILE (got {args:?})").into());
    };
    let nodes: usize = k.parse().map_err(|e| format!("NODES {k:?}: {e}"))?;
    let slots: usize = slots.parse().map_err(|e| format!("SLOTS {slots:?}: {e}"))?;
    let hostfile = PathBuf::from(hostfile);
    FakeCluster::availability()?;
    let cluster = FakeCluster::new(nodes)?;
    cluster.write_hostfile(&hostfile, slots)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "k={}", cluster.index())?;
    writeln!(out, "head={}", cluster.head_addr())?;
    writeln!(out, "subnet=10.231.{}.0/24", cluster.index())?;
    writeln!(out, "agent={}", cluster.exec_prefix_with_hostname())?;
    writeln!(out, "agent_plain={}", cluster.netns_exec_prefix())?;
    writeln!(out, "hostfile={}", hostfile.display())?;
    for n in cluster.nodes() {
        writeln!(out, "node={} {}", n.name, n.addr)?;
    }
    writeln!(out, "ready")?;
    out.flush()?;
    drop(out);
    // Wait for EOF; whatever arrives on stdin is ignored.
    let mut sink = [0u8; 256];
    let mut stdin = std::io::stdin().lock();
    while !matches!(stdin.read(&mut sink), Ok(0) | Err(_)) {}
    let left = cluster.kill_all_in_netns();
    if left > 0 {
        eprintln!("fake_cluster: killed {left} processes still inside the nodes");
    }
    drop(cluster);
    let _ = std::fs::remove_file(&hostfile);
    Ok(())
}
