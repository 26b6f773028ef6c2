//! The DVM's head process as prun knows it, and the error that says the DVM went away during
//! the job (head process ended, or contact lost) with prun's exit status for it.
//!
//! Never ends or kills the head process. Do not break: a `LostDvm` maps to exit status
//! [`LOST_DVM`], never to the job's own status (its outcome is unknown).

use std::fmt;
use std::time::{Duration, Instant};

use dvmd::control::Client;
use dvmd::session::{self, DvmUri};

/// Exit status when the DVM failed under the job (its head process ended, or prun lost contact
/// with it): the job's own outcome is unknown. The same status the HNP gives a job it ends
/// because the DVM is terminated: either way the DVM ended under the job.
pub(super) const LOST_DVM: i32 = dvmd::jobs::TERMINATED_EXIT;

/// The DVM's head process as prun knows it, to say what happened when the DVM goes away.
pub(super) struct Head {
    pub(super) uri: DvmUri,
    /// Its pid (from the session directory's name; the HNP runs on this machine, where prun
    /// reads the DVM secret).
    pub(super) pid: Option<u32>,
    pub(super) one_shot: bool,
}

/// The DVM went away during the job.
#[derive(Debug)]
pub(super) struct LostDvm {
    pub(super) uri: DvmUri,
    pub(super) pid: Option<u32>,
    pub(super) host: String,
    /// The head process is gone (else prun only lost its connection to it).
    pub(super) hnp_ended: bool,
    /// How the head process ended, when prun is its parent.
    pub(super) how: Option<String>,
    /// What the transport said.
    pub(super) detail: String,
}

impl fmt::Display for LostDvm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.hnp_ended {
            return write!(f, "lost contact with the DVM at {} during the job ({})", self.uri, self.detail);
        }
        write!(f, "the DVM's head process ended during the job (dvmd")?;
        if let Some(pid) = self.pid {
            write!(f, " pid {pid}")?;
        }
        write!(f, " on host {}", self.host)?;
        if let Some(how) = &self.how {
            write!(f, ", {how}")?;
        }
        write!(f, "; {})", self.uri)
    }
}

impl std::error::Error for LostDvm {}

impl Head {
    /// The head process still runs (as far as prun can tell).
    pub(super) fn alive(&self) -> bool {
        self.pid.is_none_or(|p| !session::process_gone(p))
    }

    /// Why the job's event stream broke: the head process ended (waited for up to 2 s), or not.
    pub(super) async fn lost(&self, detail: &str) -> LostDvm {
        let hnp_ended = match self.pid {
            Some(pid) => {
                let deadline = Instant::now() + Duration::from_secs(2);
                while !session::process_gone(pid) && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                session::process_gone(pid)
            }
            None => !matches!(
                tokio::time::timeout(Duration::from_secs(2), Client::connect(self.uri.clone())).await,
                Ok(Ok(_))
            ),
        };
        let host =
            nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "localhost".into());
        LostDvm { uri: self.uri.clone(), pid: self.pid, host, hnp_ended, how: None, detail: detail.to_string() }
    }
}
