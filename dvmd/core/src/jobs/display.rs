//! HNP: what `prun --display map|allocation|bind` shows when a job starts, as notices on its
//! prun: the DVM's nodes and slots, where each rank runs, and each rank's binding.
//!
//! Never: a decision. Only text of what the table and the placement already hold.

use std::fmt::Write;

use dvm_proto::job::JobSpec;

use super::hnp::JobTable;
use crate::jobmap::{Placement, Ranks};
use crate::Core;

/// `0-3`, `0,2,4`, `5`: a set of ranks as a person writes it.
pub fn ranks_text(r: &Ranks) -> String {
    match (r.count, r.stride) {
        (0, _) => "none".into(),
        (1, _) => r.first.to_string(),
        (n, 1) => format!("{}-{}", r.first, r.first + n - 1),
        (n, _) if n <= 8 => r.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(","),
        (n, s) => format!("{},{},...,{} (every {s})", r.first, r.first + s, r.first + (n - 1) * s),
    }
}

impl JobTable {
    /// The notices `spec` asked for about job `jobid` placed as `p`.
    pub(crate) fn display_start(&mut self, r: &Core, jobid: u32, spec: &JobSpec, p: &Placement) {
        if spec.display_allocation {
            let used = self.used_slots();
            let mut t = String::from("the DVM's allocation:");
            for n in Self::candidate_nodes(r) {
                let u = used.get(&n.daemon).copied().unwrap_or(0);
                let _ = write!(t, "\n  {} (daemon {}): {} slots, {u} in use", n.host, n.daemon, n.slots);
            }
            self.notice(jobid, t);
        }
        if spec.display_map {
            let mut t = format!("job {jobid} map: {} processes on {} nodes", p.nprocs(), p.num_nodes());
            for (i, d) in p.daemons().enumerate() {
                let ranks = p.ranks_at(i as u32);
                let plural = if ranks.count == 1 { "" } else { "s" };
                let _ = write!(
                    t,
                    "\n  {} (daemon {d}): {} rank{plural}: {}",
                    r.host_of(d),
                    ranks.count,
                    ranks_text(&ranks)
                );
            }
            self.notice(jobid, t);
        }
        if spec.report_bindings {
            // Nothing binds yet: each rank may run on any core of its node, and is told so.
            let mut t = String::new();
            for (i, d) in p.daemons().enumerate() {
                for k in p.ranks_at(i as u32).iter() {
                    let _ = write!(
                        t,
                        "{}[{}:{k}] is not bound (any core of the node)",
                        if t.is_empty() { "" } else { "\n" },
                        r.host_of(d)
                    );
                }
            }
            self.notice(jobid, t);
        }
    }
}
