//! HNP: what `prun --display map|allocation|bind` shows when a job starts, as notices on its
//! prun: the DVM's nodes and slots, where each rank runs, and each rank's binding.
//!
//! Never: a decision. Only text of what the table and the placement already hold.

use std::fmt::Write;

use dvm_proto::job::JobSpec;

use super::hnp::JobTable;
use crate::jobmap::{place_node, plan_of, Placement, Ranks};
use crate::Core;

/// `0-3`, `0,2,4`, `5`: a set of ranks as a person writes it.
pub fn ranks_text(r: &Ranks) -> String {
    let runs = r.runs();
    match runs.as_slice() {
        [] | [(_, 0, _)] => "none".into(),
        [(first, 1, _)] => first.to_string(),
        [(first, n, 1)] => format!("{first}-{}", first + n - 1),
        _ if r.len() <= 8 => r.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(","),
        [(first, n, s)] => format!("{first},{},...,{} (every {s})", first + s, first + (n - 1) * s),
        _ => {
            // Runs of consecutive ranks as ranges, at most 8 of them shown.
            let mut parts: Vec<String> = Vec::new();
            let mut it = r.iter().peekable();
            while let Some(a) = it.next() {
                let mut b = a;
                while it.peek() == Some(&(b + 1)) {
                    b = it.next().expect("peeked");
                }
                parts.push(if a == b { a.to_string() } else { format!("{a}-{b}") });
            }
            if parts.len() > 8 {
                let more = parts.len() - 8;
                parts.truncate(8);
                parts.push(format!("... ({more} more ranges)"));
            }
            parts.join(",")
        }
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
                let plural = if ranks.len() == 1 { "" } else { "s" };
                let _ = write!(
                    t,
                    "\n  {} (daemon {d}): {} rank{plural}: {}",
                    r.host_of(d),
                    ranks.len(),
                    ranks_text(&ranks)
                );
                t.push_str(&objects_text(r, spec, p, d, &ranks));
            }
            self.notice(jobid, t);
        }
        // Bindings are reported by the daemons that make them (`BindingReport`).
    }
}

/// The objects a node's ranks are mapped to (`--map-by OBJ` or ppr), in rank order:
/// `\n    rank 0: package 0` lines; empty when the job maps no objects or the node did not
/// report its hardware.
fn objects_text(r: &Core, spec: &JobSpec, p: &Placement, daemon: u32, ranks: &Ranks) -> String {
    let plan = plan_of(spec, p.nprocs());
    let (Some(_), Some(topo)) = (plan.map_obj, r.hardware_of(daemon)) else { return String::new() };
    let Ok(placed) = place_node(&topo, &plan, ranks.len(), &Default::default(), &r.host_of(daemon)) else {
        return String::new();
    };
    let mut t = String::new();
    for (rank, pl) in ranks.iter().zip(placed) {
        if let Some((level, i)) = pl.obj {
            let _ = write!(t, "\n    rank {rank}: {} {i}", level.name());
        }
    }
    t
}
