//! How a daemon's procs are scheduled against the daemon itself: when ranks spin on every
//! core, the daemon's heartbeats, fences and launches must still get the cpu at once.
//!
//! Owns: the `--rank-priority` policy, its per-job override (`DVM_RANK_PRIORITY` in the proc's
//! environment) and what the daemon sets on the proc once it has exec'd (never in the vfork
//! child: the daemon waits for that child's exec). Never: raising a proc above its daemon
//! (that would need privilege and would be the opposite of the point).
//! The default is `group`, chosen by `scripts/bench_spin.py` (docs/liveness.md): each job's
//! procs in a cpu group of their own under an idle group of the DVM's (`cgroup`), or, where
//! the daemon cannot make groups, `idle` (SCHED_IDLE). Either way a waking daemon preempts a
//! spinning rank at once; a nicer SCHED_OTHER rank only gives the daemon a larger share, and it
//! still waits for the rank's slice to end. Groups also share the node between jobs equally.

use std::fmt;
use std::str::FromStr;

/// The environment variable with which a job chooses its procs' policy (`-x DVM_RANK_PRIORITY=same`).
pub const RANK_PRIORITY_VAR: &str = "DVM_RANK_PRIORITY";

/// How procs run relative to their daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankPriority {
    /// Each job in a cpu group of its own under an idle group of the DVM's: the daemon
    /// preempts the procs at once, and jobs share the cpus equally among themselves.
    /// Falls back to `Idle` where the daemon cannot make groups.
    Group,
    /// SCHED_IDLE: procs share the cpus among themselves as usual, and give way at once to the
    /// daemon (and to any other ordinary process of the node).
    Idle,
    /// SCHED_OTHER, this much nicer than the daemon (1-19).
    Nice(u8),
    /// As the daemon: nothing changed.
    Same,
}

impl RankPriority {
    pub const DEFAULT: RankPriority = RankPriority::Group;
}

impl fmt::Display for RankPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RankPriority::Group => f.write_str("group"),
            RankPriority::Idle => f.write_str("idle"),
            RankPriority::Nice(n) => write!(f, "nice:{n}"),
            RankPriority::Same => f.write_str("same"),
        }
    }
}

impl FromStr for RankPriority {
    type Err = String;

    fn from_str(s: &str) -> Result<RankPriority, String> {
        let bad =
            || format!("'{s}' is not a rank priority (expected group, idle, same, or nice:N with N from 1 to 19)");
        match s.trim().to_ascii_lowercase().as_str() {
            "group" => Ok(RankPriority::Group),
            "idle" => Ok(RankPriority::Idle),
            "same" | "nice:0" => Ok(RankPriority::Same),
            other => {
                let n = other.strip_prefix("nice:").ok_or_else(bad)?;
                match n.parse::<u8>() {
                    Ok(n @ 1..=19) => Ok(RankPriority::Nice(n)),
                    _ => Err(bad()),
                }
            }
        }
    }
}

/// What the daemon sets on a proc once it has exec'd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ChildPriority {
    /// Move it into its job's cpu group (the caller does; if that fails, SCHED_IDLE instead).
    pub group: bool,
    /// Switch to SCHED_IDLE.
    pub idle: bool,
    /// This much nicer than the launching thread (capped at 19).
    pub nicer: Option<i32>,
}

impl RankPriority {
    /// The policy of a proc whose environment is `env` (the last `DVM_RANK_PRIORITY` wins)
    /// on a daemon whose default is `self`.
    pub(super) fn for_proc(self, env: &[(String, String)]) -> Result<RankPriority, String> {
        match env.iter().rev().find(|(k, _)| k == RANK_PRIORITY_VAR) {
            None => Ok(self),
            Some((_, v)) => v.parse().map_err(|e| format!("{RANK_PRIORITY_VAR}: {e}")),
        }
    }

    /// What is set on the proc, on a daemon that has cpu groups or not (without, `Group` is
    /// `Idle`).
    pub(super) fn child(self, has_groups: bool) -> ChildPriority {
        let none = ChildPriority { group: false, idle: false, nicer: None };
        match self {
            RankPriority::Group if has_groups => ChildPriority { group: true, ..none },
            RankPriority::Group | RankPriority::Idle => ChildPriority { idle: true, ..none },
            RankPriority::Nice(n) => ChildPriority { nicer: Some(n as i32), ..none },
            RankPriority::Same => none,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_and_print_back() {
        for (text, want) in [
            ("group", RankPriority::Group),
            ("idle", RankPriority::Idle),
            ("SAME", RankPriority::Same),
            ("nice:7", RankPriority::Nice(7)),
        ] {
            let p: RankPriority = text.parse().unwrap();
            assert_eq!(p, want);
            assert_eq!(p.to_string().parse::<RankPriority>().unwrap(), want);
        }
        assert_eq!("nice:0".parse::<RankPriority>(), Ok(RankPriority::Same));
        for bad in ["", "nice", "nice:20", "nice:-1", "fast"] {
            let e = bad.parse::<RankPriority>().unwrap_err();
            assert!(e.contains(&format!("'{bad}' is not a rank priority")), "{e}");
        }
    }

    #[test]
    fn a_job_may_choose_its_own() {
        let env = |v: &str| vec![(RANK_PRIORITY_VAR.to_string(), v.to_string())];
        assert_eq!(RankPriority::Idle.for_proc(&[]), Ok(RankPriority::Idle));
        assert_eq!(RankPriority::Group.for_proc(&env("idle")), Ok(RankPriority::Idle));
        assert_eq!(RankPriority::Idle.for_proc(&env("same")), Ok(RankPriority::Same));
        let e = RankPriority::Idle.for_proc(&env("x")).unwrap_err();
        assert!(e.starts_with("DVM_RANK_PRIORITY: 'x' is not a rank priority"), "{e}");
        assert_eq!(RankPriority::Nice(10).child(true), ChildPriority { group: false, idle: false, nicer: Some(10) });
        assert_eq!(RankPriority::Idle.child(true), ChildPriority { group: false, idle: true, nicer: None });
        assert_eq!(RankPriority::Group.child(true), ChildPriority { group: true, idle: false, nicer: None });
        // A daemon without groups runs the procs under SCHED_IDLE.
        assert_eq!(RankPriority::Group.child(false), ChildPriority { group: false, idle: true, nicer: None });
    }
}
