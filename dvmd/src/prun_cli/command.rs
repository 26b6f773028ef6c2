//! What `prun`'s command line turns into: [`PrunCommand`] (the job plus how to find or boot a
//! DVM), the one-shot DVM choices, the errors, and the `--help` text.
//!
//! Never parses or reads anything. Do not break: [`USAGE`] lists every option the parser's
//! table accepts, and every error names the option as the user typed it.

use std::path::PathBuf;

use dvm_proto::job::JobSpec;

use crate::hostfile::HostfileError;

/// Help text printed by `prun --help`; lists every option [`parse`](super::parse) accepts.
pub const USAGE: &str = "\
Usage: prun [job options] [app options] EXE [ARGS...] [: [app options] EXE [ARGS...]]...
       prun --attach ID [--dvm-uri URI]

Runs a job on a running DVM (--dvm-uri, else the only persistent DVM of this user), or on a
one-shot DVM booted for it and private to it (--local, or --host/--hostfile when no persistent
DVM is running). Everything after EXE is passed to it, up to a lone ':' that starts the next
app (MPMD).

Exit status: 0; the first failing process's status (killed by signal S: 128+S); 127 exec failure;
124 --timeout; 130/143 prun got SIGINT/SIGTERM; 141 prun's stdout was closed; 125 the DVM's head
process ended (or was lost) during the job; 1 prun could not run the job.

App options (before each EXE; -x and --wdir before the first EXE apply to every app):
  -n, --np N                 number of processes of this app (default: fill the slots, or -N per node)
  -x VAR | VAR=value         export VAR from prun's environment, or set it to value
  --wdir, --wd DIR           working directory of the processes (relative to prun's directory)
  --                         end of options: the next argument is the executable

Job options (before the first EXE):
  -N, --npernode N           N processes on each node (same as --map-by ppr:N:node)
  --map-by POLICY[:PE=n][:oversubscribe|:nooversubscribe][:span]
                             slot: fill each node's slots in turn (default); node: round-robin
                             over nodes; hwthread|core|l3cache|numa|package|socket: fill the
                             slots, each node's procs round-robin over its objects; ppr:N:OBJ:
                             N per object (or node); PE=n: n cpus per process; span: spread
                             over the objects of all nodes
  --rank-by slot|node|OBJ[:span]
                             rank in mapping order (default; node for --map-by node), dealt
                             over the nodes, or dealt over each node's objects (span: over
                             the objects of all nodes)
  --bind-to none|hwthread|core|l3cache|numa|package|socket[:overload-allowed][:if-supported]
                             bind each process (default: core for 2 processes or fewer,
                             package above, nothing on an oversubscribed node)
  --cpus-per-rank, --cpus-per-proc N
                             same as :PE=N
  --use-hwthread-cpus        a cpu is a hardware thread, not a core
  --rankfile, --rf FILE      place each rank as FILE says ('rank N=HOST slot=P:C|C|*')
  --oversubscribe            allow more processes than slots on a node
  -H, --host a,b,c           run on these hosts of the DVM (name[:slots] for a one-shot DVM)
  --hostfile, --machinefile F
                             run on the hosts listed in F (lines 'name [slots=N]')
  --output tag,timestamp,merge-stderr-to-stdout,dir=DIR[:nocopy],file=PREFIX[:nocopy]
                             tag each output line with its rank; stamp it with the time its
                             node read it; send stderr to stdout; write each rank's output to
                             DIR/JOB/rank.N/stdout and stderr, or to PREFIX.N, as well (only
                             there with :nocopy)
  --output-filename DIR      same as --output dir=DIR
  --tag-output               same as --output tag
  --timestamp-output         same as --output timestamp
  --merge-stderr-to-stdout   same as --output merge-stderr-to-stdout
  --stdin rank|all|none|R    which processes get prun's stdin (default: rank 0)
  --timeout SECONDS          kill the job after SECONDS
  --mpi both|pmix|pmi1|pmi2|none
                             the ranks' process-management interface (default: the DVM's,
                             itself both: PMIx for Open MPI, a PMI fd for the MPICH family)
  --get-stack-traces, --report-state-on-timeout
                             at --timeout, print every rank's stack trace (gdb) before the kill
  --enable-recovery          a process that dies does not end the job: the others are told
                             (PMIx event PMIX_ERR_PROC_ABORTED; a lost node: LOST_CONNECTION)
  --dvm-uri URI|file:F       the DVM to use: its URI, or a file holding it
  --local N                  boot a one-shot DVM of N daemons on this machine for this job
  --slots S                  with --local: S slots per daemon (default: its cores)
  --launch-sizes             print the sizes of the launch messages instead of launching
  --display map,allocation,bind
                             when the job starts, show where each rank runs, the DVM's nodes
                             and slots, each rank's binding; each alone: --display-map
                             --display-allocation --report-bindings
  --app FILE                 the apps from FILE, one per line as on the command line
                             ('-n 2 ./a.out args'; '#' comments), instead of EXE ...
  --mca, --gmca, --omca NAME VALUE
                             an MCA parameter for the ranks (OMPI_MCA_NAME=VALUE in their
                             environment), as mpirun takes it; a later one of a name wins
  --prtemca NAME VALUE       PRTE_MCA_NAME=VALUE;  --pmixmca NAME VALUE: PMIX_MCA_NAME=VALUE
  --preload-binary           copy each app's executable to every node that runs it and start
                             it from there (removed when the job ends)
  --preload-files a,b,dir/c  copy these files into the job's working directory on each of its
                             nodes before it starts (removed when the job ends)
  --preload-files-dest-dir DIR
                             put them in DIR instead
  --preload-keep             leave the preloaded files in place when the job ends
  --preload-compress         deflate them on the way (worth it for text, not binaries)
  --no-queue                 fail at once when the job does not fit the free slots now
                             (default: wait in the DVM's queue, in order of submission)
  --detach                   print the job id and return; the job runs on, its output kept
  --attach ID                follow a detached job: its kept output, then live, to its end
  --array A-B | N            one job per index A..B (or 0..N-1), DVM_ARRAY_INDEX set in each;
                             a summary at the end
  -h, --help                 print this help
  -V, --version              print the version

Single-dash long options (-np 4, -host a, -wdir d) and --opt=VALUE are accepted.
";

/// What `prun` was asked to do.
#[derive(Debug, Clone, PartialEq)]
pub struct PrunCommand {
    /// The job. `spec.hosts` holds the host names from `--host` or `--hostfile` (empty: all).
    pub spec: JobSpec,
    /// `--dvm-uri`, as given; a relative `file:` path is resolved against prun's directory.
    pub dvm_uri: Option<String>,
    /// `--local N [--slots S]`. Hostfile/host-list one-shots are the caller's decision: see
    /// [`PrunCommand::one_shot_candidate`].
    pub one_shot: Option<OneShot>,
    /// `--hostfile`, resolved against prun's directory (already read into `spec.hosts`).
    pub hostfile: Option<PathBuf>,
    /// `--host` exactly as given (`name[:slots],...`), for booting a one-shot DVM from it.
    pub host_list: Option<String>,
    /// `--launch-sizes`: print the launch message sizes, don't launch.
    pub launch_sizes: bool,
    /// `--output-filename DIR` / `--output dir=DIR[:nocopy]`: each rank's output also (or, with
    /// `nocopy`, only) in DIR/JOB/rank.N/stdout and stderr.
    pub output_dir: Option<(PathBuf, bool)>,
    /// `--output file=PREFIX[:nocopy]`: rank N's output in PREFIX.N (`true`: there only).
    pub output_file: Option<(PathBuf, bool)>,
    /// `--attach ID`: follow a detached job instead of submitting one.
    pub attach: Option<u32>,
    pub help: bool,
    pub version: bool,
}

/// A DVM booted for one job and torn down after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OneShot {
    Local {
        daemons: u32,
        slots: Option<u32>,
    },
    Hostfile(PathBuf),
    Hosts(String),
    /// Inside a Slurm job: the allocation's nodes, read by dvmd from the environment.
    Slurm,
}

impl PrunCommand {
    /// The one-shot DVM to boot if no persistent DVM is running: `--local`, else `--hostfile`,
    /// else `--host`, else the Slurm allocation when prun runs in one.
    pub fn one_shot_candidate(&self, in_slurm_job: bool) -> Option<OneShot> {
        if let Some(o) = &self.one_shot {
            return Some(o.clone());
        }
        if let Some(f) = &self.hostfile {
            return Some(OneShot::Hostfile(f.clone()));
        }
        match &self.host_list {
            Some(h) => Some(OneShot::Hosts(h.clone())),
            None => in_slurm_job.then_some(OneShot::Slurm),
        }
    }
}

/// A command line `prun` refuses. Options are named as the user typed them.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CliError {
    #[error("unknown option '{0}' (see prun --help)")]
    UnknownOption(String),
    #[error("{0} needs a value")]
    MissingValue(String),
    #[error("{0} takes a parameter name and a value (--mca NAME VALUE)")]
    McaWithoutValue(String),
    #[error("{option} {name}: not a parameter name (letters, digits and '_')")]
    BadMcaName { option: String, name: String },
    #[error("{option} takes no value, got '{value}'")]
    UnexpectedValue { option: String, value: String },
    #[error("{option} '{value}': {problem}")]
    BadValue { option: String, value: String, problem: String },
    #[error("{option} given twice{}", for_app(.app))]
    GivenTwice { option: String, app: usize },
    #[error("{first} and {second} cannot both be given")]
    Conflict { first: String, second: String },
    #[error("{option} needs {needs}")]
    Requires { option: String, needs: String },
    #[error("{option} applies to the whole job: give it before the first executable, not in app {app}")]
    JobOptionInApp { option: String, app: usize },
    #[error("no executable given")]
    NoExecutable,
    #[error("app 1 before ':' has no executable")]
    FirstAppWithoutExecutable,
    #[error("app {app} after ':' has no executable")]
    AppWithoutExecutable { app: usize },
    #[error("-x {name}: {name} is not set in prun's environment")]
    UnsetVariable { name: String },
    #[error("--stdin {rank}: the job has only {nprocs} procs")]
    StdinRankOutOfRange { rank: u32, nprocs: u64 },
    #[error("{what} '{path}' is not valid UTF-8")]
    NotUtf8 { what: String, path: String },
    #[error(transparent)]
    Hosts(#[from] HostfileError),
    #[error("--app {path}: {why}")]
    Appfile { path: String, why: String },
    #[error("--rankfile {path}: {why}")]
    Rankfile { path: String, why: String },
    #[error("{path}:{line}: {why}")]
    McaFile { path: String, line: usize, why: String },
}

pub(super) fn for_app(app: &usize) -> String {
    if *app > 1 {
        format!(" for app {app}")
    } else {
        String::new()
    }
}
