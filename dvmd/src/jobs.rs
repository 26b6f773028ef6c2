//! Jobs on the DVM: the HNP's job table (launch, exits, output, kill, timeout) and each
//! daemon's local part (launch message in, procs out). Placement comes from `jobmap`,
//! processes from `odls`; this module decides and routes.

use dvm_proto::daemon::daemon_cmd;
use dvm_rml::Rank;
use tracing::warn;

use crate::control::ControlCmd;
use crate::daemon::Daemon;

impl Daemon {
    pub(crate) fn on_job_cmd(&mut self, origin: Rank, cmd: daemon_cmd::Body) {
        warn!(origin, "job command not handled yet: {cmd:?}");
    }

    pub(crate) fn on_job_control(&mut self, cmd: ControlCmd) {
        warn!("job control not handled yet: {cmd:?}");
    }
}
