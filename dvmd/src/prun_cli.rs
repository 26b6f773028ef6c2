//! `prun`'s command line: `prun [job options] [app options] EXE [ARGS...] [: [app options] EXE [ARGS...]]...`
//!
//! A hand-written parser (MPMD segments split by a lone `:` do not fit clap) that turns the
//! arguments into a [`JobSpec`] plus what the caller needs to find or boot a DVM. It does no
//! I/O except reading a `--hostfile`, so every rule is testable without a DVM.
//!
//! Rules, following `mpirun`/`prterun` habits:
//! - Options take `--opt VALUE` or `--opt=VALUE`; short ones also `-n 4`, `-n4`, `-n=4`; the
//!   long ones also take a single dash (`-np 4`, `-host a`, `-wdir d`), as Open MPI did.
//! - The first token that is not an option is the app's executable; everything after it, even
//!   tokens that look like options, is its argv until a lone `:`. `--` ends the options early.
//! - App options (`-n`, `-x`, `--wdir`) belong to the app they precede, except that `-x` and
//!   `--wdir` before the first executable apply to every app (an app's own setting wins).
//! - Job options are only accepted before the first executable: after a `:` they would look
//!   per-app (as `--host` is in `mpirun`) while acting on the whole job, so they are refused.
//! - A single-value option given twice in one scope, an unknown option and a malformed value
//!   are errors naming the option as typed and the value; nothing falls back to a default.
//!
//! Traps: `args` excludes the program name. `--help`/`--version` short-circuit where they
//! appear, like clap: what follows them is not checked.

use std::path::{Path, PathBuf};

use dvm_proto::job::{AppContext, JobSpec, MapBy, StdinTarget};

use crate::hostfile::{self, HostfileError};

/// Help text printed by `prun --help`; lists every option [`parse`] accepts.
pub const USAGE: &str = "\
Usage: prun [job options] [app options] EXE [ARGS...] [: [app options] EXE [ARGS...]]...

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
  --map-by slot|node|ppr:N:node[:oversubscribe]
                             fill each node's slots in turn (default), round-robin over nodes,
                             or N per node
  --oversubscribe            allow more processes than slots on a node
  -H, --host a,b,c           run on these hosts of the DVM (name[:slots] for a one-shot DVM)
  --hostfile, --machinefile F
                             run on the hosts listed in F (lines 'name [slots=N]')
  --output tag[,merge-stderr-to-stdout]
                             tag each output line with its rank; send stderr to stdout
  --tag-output               same as --output tag
  --merge-stderr-to-stdout   same as --output merge-stderr-to-stdout
  --stdin rank|all|none|R    which processes get prun's stdin (default: rank 0)
  --timeout SECONDS          kill the job after SECONDS
  --enable-recovery          a process that dies does not end the job: the others are told
                             (PMIx event PMIX_ERR_PROC_ABORTED; a lost node: LOST_CONNECTION)
  --dvm-uri URI|file:F       the DVM to use: its URI, or a file holding it
  --local N                  boot a one-shot DVM of N daemons on this machine for this job
  --slots S                  with --local: S slots per daemon
  --launch-sizes             print the sizes of the launch messages instead of launching
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
}

fn for_app(app: &usize) -> String {
    if *app > 1 {
        format!(" for app {app}")
    } else {
        String::new()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Np,
    Export,
    Wdir,
    PerNode,
    MapBy,
    Oversubscribe,
    Host,
    Hostfile,
    Output,
    TagOutput,
    MergeStderr,
    Stdin,
    Timeout,
    DvmUri,
    Local,
    Slots,
    LaunchSizes,
    EnableRecovery,
    Help,
    Version,
}

impl Kind {
    fn takes_value(self) -> bool {
        !matches!(
            self,
            Kind::Oversubscribe
                | Kind::TagOutput
                | Kind::MergeStderr
                | Kind::LaunchSizes
                | Kind::EnableRecovery
                | Kind::Help
                | Kind::Version
        )
    }
    fn is_app_option(self) -> bool {
        matches!(self, Kind::Np | Kind::Export | Kind::Wdir)
    }
}

/// Every spelling `prun` accepts (single-dash forms of the long names are derived in [`lookup`]).
const OPTIONS: &[(Kind, &[&str])] = &[
    (Kind::Np, &["-n", "--np"]),
    (Kind::Export, &["-x"]),
    (Kind::Wdir, &["--wdir", "--wd"]),
    (Kind::PerNode, &["-N", "--npernode"]),
    (Kind::MapBy, &["--map-by"]),
    (Kind::Oversubscribe, &["--oversubscribe"]),
    (Kind::Host, &["-H", "--host"]),
    (Kind::Hostfile, &["--hostfile", "--machinefile"]),
    (Kind::Output, &["--output"]),
    (Kind::TagOutput, &["--tag-output"]),
    (Kind::MergeStderr, &["--merge-stderr-to-stdout"]),
    (Kind::Stdin, &["--stdin"]),
    (Kind::Timeout, &["--timeout"]),
    (Kind::DvmUri, &["--dvm-uri"]),
    (Kind::Local, &["--local"]),
    (Kind::Slots, &["--slots"]),
    (Kind::LaunchSizes, &["--launch-sizes"]),
    (Kind::EnableRecovery, &["--enable-recovery"]),
    (Kind::Help, &["-h", "--help"]),
    (Kind::Version, &["-V", "--version"]),
];

fn kind_of(name: &str) -> Option<Kind> {
    OPTIONS.iter().find(|(_, names)| names.contains(&name)).map(|(k, _)| *k)
}

/// Resolve an option token to its kind, its spelling (for messages) and an inline value.
fn lookup(token: &str) -> Result<(Kind, String, Option<String>), CliError> {
    // `-np` means `--np`; a name written with `--` is only ever itself.
    let find =
        |name: &str| kind_of(name).or_else(|| if name.starts_with("--") { None } else { kind_of(&format!("-{name}")) });
    if let Some(k) = find(token) {
        return Ok((k, token.to_string(), None));
    }
    if let Some((name, value)) = token.split_once('=') {
        if let Some(k) = find(name) {
            return Ok((k, name.to_string(), Some(value.to_string())));
        }
    }
    if !token.starts_with("--") && token.len() > 2 && token.is_char_boundary(2) {
        // `-n4`, `-xFOO=1`: a one-letter option with its value attached.
        if let Some(k) = kind_of(&token[..2]).filter(|k| k.takes_value()) {
            return Ok((k, token[..2].to_string(), Some(token[2..].to_string())));
        }
    }
    let name = if token.starts_with("--") { token.split('=').next().unwrap_or(token) } else { token };
    Err(CliError::UnknownOption(name.to_string()))
}

#[derive(Default)]
struct AppDraft {
    argv: Vec<String>,
    np: Option<u32>,
    env: Vec<(String, String)>,
    wdir: Option<String>,
}

/// Parse state; each single-value option keeps the spelling it was given with, for messages.
struct Parser<'a> {
    cwd: &'a Path,
    env: &'a dyn Fn(&str) -> Option<String>,
    global: AppDraft,
    apps: Vec<AppDraft>,
    map_by: Option<(String, MapBy, u32)>,
    per_node: Option<(String, u32)>,
    oversubscribe: bool,
    host: Option<(String, String, Vec<String>)>,
    hostfile: Option<(String, PathBuf, Vec<String>)>,
    output: Option<String>,
    tag_output: bool,
    merge_stderr: bool,
    stdin: Option<(StdinTarget, u32)>,
    timeout: Option<f64>,
    dvm_uri: Option<(String, String)>,
    local: Option<(String, u32)>,
    slots: Option<(String, u32)>,
    launch_sizes: bool,
    enable_recovery: bool,
}

/// Parse `prun`'s arguments (without the program name). `cwd` is prun's working directory
/// (absolute); `env` looks up prun's environment for `-x VAR`.
pub fn parse(args: &[String], cwd: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<PrunCommand, CliError> {
    let cwd_str = utf8(cwd, "prun's working directory")?;
    let mut p = Parser {
        cwd,
        env,
        global: AppDraft::default(),
        apps: vec![AppDraft::default()],
        map_by: None,
        per_node: None,
        oversubscribe: false,
        host: None,
        hostfile: None,
        output: None,
        tag_output: false,
        merge_stderr: false,
        stdin: None,
        timeout: None,
        dvm_uri: None,
        local: None,
        slots: None,
        launch_sizes: false,
        enable_recovery: false,
    };
    let mut i = 0;
    loop {
        let app = p.apps.len();
        // Options of this segment, up to its executable.
        while i < args.len() && args[i] != ":" {
            let token = &args[i];
            i += 1;
            if token == "--" {
                break;
            }
            if !token.starts_with('-') {
                i -= 1;
                break;
            }
            let (kind, spelled, inline) = lookup(token)?;
            let value = match (kind.takes_value(), inline) {
                (true, Some(v)) => Some(v),
                (true, None) => {
                    let v = args.get(i).ok_or_else(|| CliError::MissingValue(spelled.clone()))?;
                    i += 1;
                    Some(v.clone())
                }
                (false, Some(v)) => return Err(CliError::UnexpectedValue { option: spelled, value: v }),
                (false, None) => None,
            };
            match kind {
                Kind::Help | Kind::Version => return Ok(short_circuit(cwd_str, kind)),
                _ => p.apply(kind, &spelled, value.unwrap_or_default(), app)?,
            }
        }
        // The executable and its argv, up to a lone ':'.
        let start = i;
        while i < args.len() && args[i] != ":" {
            i += 1;
        }
        if start == i {
            return Err(match (app, i < args.len()) {
                (1, false) => CliError::NoExecutable,
                (1, true) => CliError::FirstAppWithoutExecutable,
                _ => CliError::AppWithoutExecutable { app },
            });
        }
        p.apps[app - 1].argv = args[start..i].to_vec();
        if i == args.len() {
            break;
        }
        i += 1; // the ':'
        p.apps.push(AppDraft::default());
    }
    p.finish(cwd_str)
}

impl Parser<'_> {
    fn apply(&mut self, kind: Kind, opt: &str, value: String, app: usize) -> Result<(), CliError> {
        if app > 1 && !kind.is_app_option() {
            return Err(CliError::JobOptionInApp { option: opt.to_string(), app });
        }
        let twice = || CliError::GivenTwice { option: opt.to_string(), app };
        let bad = |problem: &str| CliError::BadValue {
            option: opt.to_string(),
            value: value.clone(),
            problem: problem.to_string(),
        };
        match kind {
            Kind::Np => {
                let n = positive(&value).ok_or_else(|| bad("not a positive integer"))?;
                set_once(&mut self.apps[app - 1].np, n, twice)?;
            }
            Kind::Export => {
                let (name, val) = match value.split_once('=') {
                    Some((name, val)) => (name.to_string(), val.to_string()),
                    None => (value.clone(), String::new()),
                };
                if name.is_empty() {
                    return Err(bad("expected VAR or VAR=value"));
                }
                let val = if value.contains('=') {
                    val
                } else {
                    (self.env)(&name).ok_or_else(|| CliError::UnsetVariable { name: name.clone() })?
                };
                let scope = if app == 1 { &mut self.global } else { &mut self.apps[app - 1] };
                if scope.env.iter().any(|(n, _)| *n == name) {
                    return Err(CliError::GivenTwice { option: format!("{opt} {name}"), app });
                }
                scope.env.push((name, val));
            }
            Kind::Wdir => {
                if value.is_empty() {
                    return Err(bad("not a directory path"));
                }
                let dir = utf8(&clean(&self.cwd.join(&value)), opt)?;
                let scope = if app == 1 { &mut self.global } else { &mut self.apps[app - 1] };
                set_once(&mut scope.wdir, dir, twice)?;
            }
            Kind::PerNode => {
                let n = positive(&value).ok_or_else(|| bad("not a positive integer"))?;
                if let Some((first, ..)) = &self.map_by {
                    return Err(CliError::Conflict { first: first.clone(), second: opt.to_string() });
                }
                set_once(&mut self.per_node, (opt.to_string(), n), twice)?;
            }
            Kind::MapBy => {
                let (map_by, ppr, oversubscribe) = parse_map_by(&value).map_err(|p| bad(&p))?;
                if let Some((first, _)) = &self.per_node {
                    return Err(CliError::Conflict { first: first.clone(), second: opt.to_string() });
                }
                set_once(&mut self.map_by, (opt.to_string(), map_by, ppr), twice)?;
                self.oversubscribe |= oversubscribe;
            }
            Kind::Oversubscribe => self.oversubscribe = true,
            Kind::Host => {
                if let Some((first, ..)) = &self.hostfile {
                    return Err(CliError::Conflict { first: first.clone(), second: opt.to_string() });
                }
                let names = hostfile::parse_host_list(&value)?.into_iter().map(|h| h.name).collect();
                set_once(&mut self.host, (opt.to_string(), value.clone(), names), twice)?;
            }
            Kind::Hostfile => {
                if let Some((first, ..)) = &self.host {
                    return Err(CliError::Conflict { first: first.clone(), second: opt.to_string() });
                }
                if self.hostfile.is_some() {
                    return Err(twice());
                }
                if value.is_empty() {
                    return Err(bad("not a file path"));
                }
                let path = clean(&self.cwd.join(&value));
                let names = hostfile::read(&path)?.into_iter().map(|h| h.name).collect();
                self.hostfile = Some((opt.to_string(), path, names));
            }
            Kind::Output => {
                set_once(&mut self.output, value.clone(), twice)?;
                for item in value.split(',') {
                    match item {
                        "tag" => self.tag_output = true,
                        "merge-stderr-to-stdout" => self.merge_stderr = true,
                        _ => return Err(bad("expected tag, merge-stderr-to-stdout or both separated by ','")),
                    }
                }
            }
            Kind::TagOutput => self.tag_output = true,
            Kind::MergeStderr => self.merge_stderr = true,
            Kind::Stdin => {
                let target = match value.to_ascii_lowercase().as_str() {
                    "rank" => (StdinTarget::Rank, 0),
                    "all" => (StdinTarget::All, 0),
                    "none" => (StdinTarget::None, 0),
                    v => (StdinTarget::Rank, v.parse().map_err(|_| bad("expected rank, all, none or a rank number"))?),
                };
                set_once(&mut self.stdin, target, twice)?;
            }
            Kind::Timeout => {
                let t = value
                    .parse::<f64>()
                    .ok()
                    .filter(|t| t.is_finite() && *t > 0.0)
                    .ok_or_else(|| bad("not a positive number of seconds"))?;
                set_once(&mut self.timeout, t, twice)?;
            }
            Kind::DvmUri => {
                let uri = match value.strip_prefix("file:") {
                    Some("") => return Err(bad("expected a URI or file:PATH")),
                    Some(f) => format!("file:{}", utf8(&clean(&self.cwd.join(f)), opt)?),
                    None if value.is_empty() => return Err(bad("expected a URI or file:PATH")),
                    None => value.clone(),
                };
                set_once(&mut self.dvm_uri, (opt.to_string(), uri), twice)?;
            }
            Kind::Local => {
                let n = positive(&value).ok_or_else(|| bad("not a positive number of daemons"))?;
                set_once(&mut self.local, (opt.to_string(), n), twice)?;
            }
            Kind::Slots => {
                let n = positive(&value).ok_or_else(|| bad("not a positive integer"))?;
                set_once(&mut self.slots, (opt.to_string(), n), twice)?;
            }
            Kind::LaunchSizes => self.launch_sizes = true,
            Kind::EnableRecovery => self.enable_recovery = true,
            Kind::Help | Kind::Version => unreachable!("--help and --version short-circuit in parse"),
        }
        Ok(())
    }

    fn finish(self, cwd: String) -> Result<PrunCommand, CliError> {
        if let Some((local, _)) = &self.local {
            let other = (self.dvm_uri.as_ref().map(|d| &d.0))
                .or(self.host.as_ref().map(|h| &h.0))
                .or(self.hostfile.as_ref().map(|h| &h.0))
                .cloned();
            if let Some(other) = other {
                return Err(CliError::Conflict { first: local.clone(), second: other });
            }
        } else if let Some((slots, _)) = &self.slots {
            return Err(CliError::Requires { option: slots.clone(), needs: "--local N".into() });
        }
        let global = self.global;
        let apps: Vec<AppContext> = self
            .apps
            .into_iter()
            .map(|a| {
                // Global -x first, minus the names this app sets itself.
                let env = global
                    .env
                    .iter()
                    .filter(|(n, _)| !a.env.iter().any(|(m, _)| m == n))
                    .chain(a.env.iter())
                    .map(|(n, v)| format!("{n}={v}"))
                    .collect();
                AppContext {
                    argv: a.argv,
                    np: a.np.unwrap_or(0),
                    env,
                    wdir: a.wdir.or_else(|| global.wdir.clone()).unwrap_or_default(),
                }
            })
            .collect();
        let (stdin_target, stdin_rank) = self.stdin.unwrap_or((StdinTarget::Rank, 0));
        if stdin_target == StdinTarget::Rank && apps.iter().all(|a| a.np > 0) {
            let nprocs: u64 = apps.iter().map(|a| u64::from(a.np)).sum();
            if u64::from(stdin_rank) >= nprocs {
                return Err(CliError::StdinRankOutOfRange { rank: stdin_rank, nprocs });
            }
        }
        let (map_by, ppr) = match (self.map_by, self.per_node) {
            (Some((_, m, ppr)), _) => (m, ppr),
            (None, Some((_, n))) => (MapBy::Ppr, n),
            (None, None) => (MapBy::Slot, 0),
        };
        let (host_list, hosts) = match (self.host, &self.hostfile) {
            (Some((_, list, names)), _) => (Some(list), names),
            (None, Some((_, _, names))) => (None, names.clone()),
            (None, None) => (None, Vec::new()),
        };
        let spec = JobSpec {
            apps,
            map_by: map_by as i32,
            ppr,
            oversubscribe: self.oversubscribe,
            hosts,
            tag_output: self.tag_output,
            merge_stderr: self.merge_stderr,
            stdin_target: stdin_target as i32,
            stdin_rank,
            timeout_s: self.timeout.unwrap_or(0.0),
            cwd,
            enable_recovery: self.enable_recovery,
        };
        Ok(PrunCommand {
            spec,
            dvm_uri: self.dvm_uri.map(|(_, u)| u),
            one_shot: self.local.map(|(_, daemons)| OneShot::Local { daemons, slots: self.slots.map(|(_, s)| s) }),
            hostfile: self.hostfile.map(|(_, path, _)| path),
            host_list,
            launch_sizes: self.launch_sizes,
            help: false,
            version: false,
        })
    }
}

/// `--help` / `--version`: nothing else of the command line matters.
fn short_circuit(cwd: String, kind: Kind) -> PrunCommand {
    PrunCommand {
        spec: JobSpec { cwd, ..Default::default() },
        dvm_uri: None,
        one_shot: None,
        hostfile: None,
        host_list: None,
        launch_sizes: false,
        help: kind == Kind::Help,
        version: kind == Kind::Version,
    }
}

fn set_once<T>(slot: &mut Option<T>, value: T, twice: impl FnOnce() -> CliError) -> Result<(), CliError> {
    if slot.is_some() {
        return Err(twice());
    }
    *slot = Some(value);
    Ok(())
}

fn positive(s: &str) -> Option<u32> {
    s.parse::<u32>().ok().filter(|&n| n > 0)
}

/// `slot`, `node` or `ppr:N:node`, each optionally `:oversubscribe` (any case).
fn parse_map_by(value: &str) -> Result<(MapBy, u32, bool), String> {
    const EXPECTED: &str = "expected slot, node or ppr:N:node[:oversubscribe]";
    let mut parts: Vec<&str> = value.split(':').collect();
    let oversubscribe = parts.len() > 1 && parts.last().is_some_and(|m| m.eq_ignore_ascii_case("oversubscribe"));
    if oversubscribe {
        parts.pop();
    }
    let lower: Vec<String> = parts.iter().map(|p| p.to_ascii_lowercase()).collect();
    match lower.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["slot"] => Ok((MapBy::Slot, 0, oversubscribe)),
        ["node"] => Ok((MapBy::Node, 0, oversubscribe)),
        ["ppr", n, "node"] => match positive(n) {
            Some(n) => Ok((MapBy::Ppr, n, oversubscribe)),
            None => Err("N in ppr:N:node must be a positive integer".to_string()),
        },
        _ => Err(EXPECTED.to_string()),
    }
}

/// Drop `.` components lexically (no file system access; `..` is kept as given).
fn clean(path: &Path) -> PathBuf {
    path.components().collect()
}

fn utf8(path: &Path, what: &str) -> Result<String, CliError> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| CliError::NotUtf8 { what: what.to_string(), path: path.display().to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CWD: &str = "/w";

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/home/u".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn run(s: &str) -> Result<PrunCommand, CliError> {
        parse(&words(s), Path::new(CWD), &env)
    }

    fn err(s: &str) -> String {
        match run(s) {
            Ok(c) => panic!("`prun {s}` was accepted: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn app(argv: &[&str], np: u32, env: &[&str], wdir: &str) -> AppContext {
        AppContext {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            np,
            env: env.iter().map(|s| s.to_string()).collect(),
            wdir: wdir.into(),
        }
    }

    /// `prun a` as built by hand, then changed by `f`.
    fn expect(f: impl Fn(&mut PrunCommand)) -> PrunCommand {
        let mut c = PrunCommand {
            spec: JobSpec {
                apps: vec![app(&["a"], 0, &[], "")],
                map_by: MapBy::Slot as i32,
                stdin_target: StdinTarget::Rank as i32,
                cwd: CWD.into(),
                ..Default::default()
            },
            dvm_uri: None,
            one_shot: None,
            hostfile: None,
            host_list: None,
            launch_sizes: false,
            help: false,
            version: false,
        };
        f(&mut c);
        c
    }

    #[test]
    fn defaults() {
        assert_eq!(run("a").unwrap(), expect(|_| {}));
        assert_eq!(run("a").unwrap().one_shot_candidate(false), None);
    }

    #[test]
    fn every_option_in_every_form() {
        type Change = fn(&mut PrunCommand);
        let cases: &[(&[&str], Change)] = &[
            (&["-n 4", "-n=4", "-n4", "--np 4", "--np=4", "-np 4", "-np=4"], |c| c.spec.apps[0].np = 4),
            (&["-N 2", "-N2", "-N=2", "--npernode 2", "--npernode=2", "-npernode 2"], |c| {
                c.spec.map_by = MapBy::Ppr as i32;
                c.spec.ppr = 2;
            }),
            (&["--map-by node", "--map-by=node", "-map-by NODE", "--map-by=Node"], |c| {
                c.spec.map_by = MapBy::Node as i32
            }),
            (&["--map-by slot", "--map-by=slot"], |_| {}),
            (
                &["--map-by slot:oversubscribe", "--map-by=SLOT:OVERSUBSCRIBE", "--oversubscribe", "-oversubscribe"],
                |c| c.spec.oversubscribe = true,
            ),
            (&["--map-by node:oversubscribe", "--map-by=node:OVERSUBSCRIBE", "--map-by node --oversubscribe"], |c| {
                c.spec.map_by = MapBy::Node as i32;
                c.spec.oversubscribe = true;
            }),
            (
                &["--map-by ppr:4:node:oversubscribe", "--map-by=PPR:4:NODE:oversubscribe", "-N 4 --oversubscribe"],
                |c| {
                    c.spec.map_by = MapBy::Ppr as i32;
                    c.spec.ppr = 4;
                    c.spec.oversubscribe = true;
                },
            ),
            (&["--host a,b:2", "--host=a,b:2", "-H a,b:2", "-Ha,b:2", "-H=a,b:2", "-host a,b:2"], |c| {
                c.spec.hosts = vec!["a".into(), "b".into()];
                c.host_list = Some("a,b:2".into());
            }),
            (&["--output tag", "--output=tag", "--tag-output", "-tag-output"], |c| c.spec.tag_output = true),
            (
                &["--output merge-stderr-to-stdout", "--output=merge-stderr-to-stdout", "--merge-stderr-to-stdout"],
                |c| c.spec.merge_stderr = true,
            ),
            (
                &[
                    "--output tag,merge-stderr-to-stdout",
                    "--output=merge-stderr-to-stdout,tag",
                    "--tag-output --merge-stderr-to-stdout",
                    "--output tag --merge-stderr-to-stdout",
                ],
                |c| {
                    c.spec.tag_output = true;
                    c.spec.merge_stderr = true;
                },
            ),
            (&["--stdin all", "--stdin=all", "--stdin ALL"], |c| c.spec.stdin_target = StdinTarget::All as i32),
            (&["--stdin none", "--stdin=none"], |c| c.spec.stdin_target = StdinTarget::None as i32),
            (&["--stdin rank", "--stdin=rank", "--stdin 0"], |_| {}),
            (&["--stdin 3", "--stdin=3"], |c| c.spec.stdin_rank = 3),
            (&["--timeout 2.5", "--timeout=2.5", "-timeout 2.5"], |c| c.spec.timeout_s = 2.5),
            (&["--timeout 60", "--timeout=60"], |c| c.spec.timeout_s = 60.0),
            (&["--dvm-uri tcp://h:1", "--dvm-uri=tcp://h:1"], |c| c.dvm_uri = Some("tcp://h:1".into())),
            (&["--dvm-uri file:u.txt", "--dvm-uri=file:./u.txt", "--dvm-uri file:/w/u.txt"], |c| {
                c.dvm_uri = Some("file:/w/u.txt".into())
            }),
            (
                &["--wdir sub", "--wdir=sub", "--wd sub", "-wdir sub", "-wd=sub", "--wdir ./sub/.", "--wdir /w/sub"],
                |c| c.spec.apps[0].wdir = "/w/sub".into(),
            ),
            (&["--wdir ../up", "--wdir=../up"], |c| c.spec.apps[0].wdir = "/w/../up".into()),
            (&["-x FOO=1", "-x=FOO=1", "-xFOO=1"], |c| c.spec.apps[0].env = vec!["FOO=1".into()]),
            (&["-x HOME", "-x=HOME", "-xHOME"], |c| c.spec.apps[0].env = vec!["HOME=/home/u".into()]),
            (&["-x EMPTY", "-x EMPTY="], |c| c.spec.apps[0].env = vec!["EMPTY=".into()]),
            (&["-x A=b=c"], |c| c.spec.apps[0].env = vec!["A=b=c".into()]),
            (&["--local 3", "--local=3", "-local 3"], |c| {
                c.one_shot = Some(OneShot::Local { daemons: 3, slots: None })
            }),
            (&["--local 3 --slots 2", "--slots=2 --local=3"], |c| {
                c.one_shot = Some(OneShot::Local { daemons: 3, slots: Some(2) })
            }),
            (&["--launch-sizes", "-launch-sizes"], |c| c.launch_sizes = true),
            (&["--enable-recovery", "-enable-recovery"], |c| c.spec.enable_recovery = true),
            (&["--"], |_| {}),
            (&["-n 2 --", "-n2 --"], |c| c.spec.apps[0].np = 2),
        ];
        for (variants, change) in cases {
            let want = expect(change);
            for v in *variants {
                let line = format!("{v} a");
                assert_eq!(run(&line).unwrap(), want, "prun {line}");
            }
        }
    }

    #[test]
    fn every_spelling_is_documented_and_parses() {
        for (kind, names) in OPTIONS {
            for name in *names {
                let documented =
                    USAGE.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == '=').any(|w| w == *name);
                assert!(documented, "{name} is missing from USAGE");
                assert_eq!(lookup(name).unwrap().0, *kind, "{name}");
                if let Some(long) = name.strip_prefix('-').filter(|n| n.starts_with('-')) {
                    assert_eq!(lookup(long).unwrap(), (*kind, long.to_string(), None), "{long}");
                }
            }
        }
    }

    #[test]
    fn help_and_version_short_circuit() {
        for line in ["-h", "--help", "-help", "-n 2 --help --bogus", "a : -h"] {
            let c = run(line).unwrap();
            assert!(c.help && !c.version, "prun {line}");
            assert!(c.spec.apps.is_empty());
        }
        for line in ["-V", "--version", "--map-by node --version"] {
            let c = run(line).unwrap();
            assert!(c.version && !c.help, "prun {line}");
        }
        assert_eq!(err("--bogus --help"), "unknown option '--bogus' (see prun --help)");
        assert!(!run("a --help").unwrap().help);
    }

    #[test]
    fn mpmd_three_apps_with_per_app_options() {
        let c = run("-x G=1 --wdir base -n 1 a x : -n 2 -x A=2 --wdir /t b : -x G=3 c -n 9 -x Q=1").unwrap();
        let want = expect(|c| {
            c.spec.apps = vec![
                app(&["a", "x"], 1, &["G=1"], "/w/base"),
                app(&["b"], 2, &["G=1", "A=2"], "/t"),
                app(&["c", "-n", "9", "-x", "Q=1"], 0, &["G=3"], "/w/base"),
            ]
        });
        assert_eq!(c, want);
    }

    #[test]
    fn export_global_versus_per_app() {
        let c = run("-x A=1 -x HOME a : -x A=9 b : c").unwrap();
        let envs: Vec<Vec<String>> = c.spec.apps.iter().map(|a| a.env.clone()).collect();
        assert_eq!(envs, vec![vec!["A=1", "HOME=/home/u"], vec!["HOME=/home/u", "A=9"], vec!["A=1", "HOME=/home/u"]]);
        // Per-app -x in one app only: nothing leaks to the others.
        let c = run("a : -x B=2 b : c").unwrap();
        let envs: Vec<usize> = c.spec.apps.iter().map(|a| a.env.len()).collect();
        assert_eq!(envs, vec![0, 1, 0]);
    }

    #[test]
    fn words_after_the_executable_are_its_argv() {
        let c = run("-n 2 a --np 3 -x FOO --help --bogus : b -- --timeout=x").unwrap();
        assert_eq!(c.spec.apps[0], app(&["a", "--np", "3", "-x", "FOO", "--help", "--bogus"], 2, &[], ""));
        assert_eq!(c.spec.apps[1], app(&["b", "--", "--timeout=x"], 0, &[], ""));
        assert!(!c.help);
        // `--` lets the executable start with a dash; ':' glued to a word is not a separator.
        let c = run("-- -weird -n 1 a: :b").unwrap();
        assert_eq!(c.spec.apps, vec![app(&["-weird", "-n", "1", "a:", ":b"], 0, &[], "")]);
    }

    #[test]
    fn stdin_rank_is_checked_when_every_np_is_known() {
        let c = run("-n 4 --stdin 3 a").unwrap();
        assert_eq!((c.spec.stdin_target, c.spec.stdin_rank), (StdinTarget::Rank as i32, 3));
        assert_eq!(err("-n 2 --stdin 2 a"), "--stdin 2: the job has only 2 procs");
        assert_eq!(run("-n 2 --stdin 2 a : -n 1 b").unwrap().spec.stdin_rank, 2);
        assert_eq!(err("-n 2 --stdin 3 a : -n 1 b"), "--stdin 3: the job has only 3 procs");
        // np 0 (fill) in any app: the mapper decides, so the rank cannot be checked here.
        assert_eq!(run("-n 2 --stdin 7 a : b").unwrap().spec.stdin_rank, 7);
        assert_eq!(run("-n 1 --stdin all a").unwrap().spec.stdin_target, StdinTarget::All as i32);
    }

    #[test]
    fn errors_name_the_option_and_value() {
        let cases = [
            ("--np x a", "--np 'x': not a positive integer"),
            ("-n 0 a", "-n '0': not a positive integer"),
            ("-n -3 a", "-n '-3': not a positive integer"),
            ("-n4x a", "-n '4x': not a positive integer"),
            ("--np= a", "--np '': not a positive integer"),
            ("--bogus a", "unknown option '--bogus' (see prun --help)"),
            ("--bogus=3 a", "unknown option '--bogus' (see prun --help)"),
            ("-q a", "unknown option '-q' (see prun --help)"),
            ("- a", "unknown option '-' (see prun --help)"),
            ("--n 4 a", "unknown option '--n' (see prun --help)"),
            ("--timeout 5 --timeout 6 a", "--timeout given twice"),
            ("--timeout 0 a", "--timeout '0': not a positive number of seconds"),
            ("--timeout -1 a", "--timeout '-1': not a positive number of seconds"),
            ("--timeout inf a", "--timeout 'inf': not a positive number of seconds"),
            ("--timeout 1m a", "--timeout '1m': not a positive number of seconds"),
            ("--map-by diagonal a", "--map-by 'diagonal': expected slot, node or ppr:N:node[:oversubscribe]"),
            ("--map-by ppr:2:socket a", "--map-by 'ppr:2:socket': expected slot, node or ppr:N:node[:oversubscribe]"),
            ("--map-by oversubscribe a", "--map-by 'oversubscribe': expected slot, node or ppr:N:node[:oversubscribe]"),
            ("--map-by node:span a", "--map-by 'node:span': expected slot, node or ppr:N:node[:oversubscribe]"),
            ("--map-by ppr:0:node a", "--map-by 'ppr:0:node': N in ppr:N:node must be a positive integer"),
            ("--map-by node --map-by slot a", "--map-by given twice"),
            ("-N 2 -N 3 a", "-N given twice"),
            ("-N x a", "-N 'x': not a positive integer"),
            ("-N 2 --map-by node a", "-N and --map-by cannot both be given"),
            ("--map-by node -N 2 a", "--map-by and -N cannot both be given"),
            ("", "no executable given"),
            ("-n 2", "no executable given"),
            ("--launch-sizes", "no executable given"),
            ("--", "no executable given"),
            ("-n 2 : b", "app 1 before ':' has no executable"),
            ("a :", "app 2 after ':' has no executable"),
            ("a : -n 2", "app 2 after ':' has no executable"),
            ("a : : b", "app 2 after ':' has no executable"),
            ("a : b :", "app 3 after ':' has no executable"),
            ("-x FOO a", "-x FOO: FOO is not set in prun's environment"),
            ("a : -x FOO b", "-x FOO: FOO is not set in prun's environment"),
            ("-x =1 a", "-x '=1': expected VAR or VAR=value"),
            ("-x FOO=1 -x FOO=2 a", "-x FOO given twice"),
            ("a : -x B=1 -x B=1 b", "-x B given twice for app 2"),
            ("-n 2 -n 3 a", "-n given twice"),
            ("a : -n 2 --np 3 b", "--np given twice for app 2"),
            ("--wdir a --wdir b x", "--wdir given twice"),
            ("x : --wdir a --wd b y", "--wd given twice for app 2"),
            ("--wdir= x", "--wdir '': not a directory path"),
            ("--stdin 1 --stdin all a", "--stdin given twice"),
            ("--stdin first a", "--stdin 'first': expected rank, all, none or a rank number"),
            ("--stdin -1 a", "--stdin '-1': expected rank, all, none or a rank number"),
            ("--output tag --output tag a", "--output given twice"),
            (
                "--output timestamp a",
                "--output 'timestamp': expected tag, merge-stderr-to-stdout or both separated by ','",
            ),
            ("--output tag, a", "--output 'tag,': expected tag, merge-stderr-to-stdout or both separated by ','"),
            ("--dvm-uri x --dvm-uri y a", "--dvm-uri given twice"),
            ("--dvm-uri file: a", "--dvm-uri 'file:': expected a URI or file:PATH"),
            ("--dvm-uri= a", "--dvm-uri '': expected a URI or file:PATH"),
            ("--host a --host b x", "--host given twice"),
            ("--host a,a x", "--host: host 'a' is listed twice"),
            ("-H a,,b x", "--host: empty host name in 'a,,b'"),
            ("--host a --hostfile /nonexistent x", "--host and --hostfile cannot both be given"),
            (
                "a : --map-by node b",
                "--map-by applies to the whole job: give it before the first executable, not in app 2",
            ),
            ("a : -H h b", "-H applies to the whole job: give it before the first executable, not in app 2"),
            (
                "a : b : --timeout 3 c",
                "--timeout applies to the whole job: give it before the first executable, not in app 3",
            ),
            ("--np", "--np needs a value"),
            ("a : -x", "-x needs a value"),
            ("--oversubscribe=yes a", "--oversubscribe takes no value, got 'yes'"),
            ("--help=me a", "--help takes no value, got 'me'"),
            ("--slots 2 a", "--slots needs --local N"),
            ("--local 2 --slots 0 a", "--slots '0': not a positive integer"),
            ("--local 0 a", "--local '0': not a positive number of daemons"),
            ("--local 2 --local 3 a", "--local given twice"),
            ("--local 2 --dvm-uri u a", "--local and --dvm-uri cannot both be given"),
            ("--local 2 -H h a", "--local and -H cannot both be given"),
        ];
        for (line, want) in cases {
            assert_eq!(err(line), want, "prun {line}");
        }
    }

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let d = std::env::temp_dir().join(format!("prun-cli-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&d).unwrap();
            TempDir(d)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn hostfile_is_read_relative_to_cwd() {
        let dir = TempDir::new("hostfile");
        std::fs::write(dir.0.join("hf"), "# nodes\nn1 slots=4\nn2\n").unwrap();
        let path = dir.0.join("hf");
        for line in ["--hostfile hf a", "--hostfile=hf a", "--machinefile ./hf a", "-hostfile hf a"] {
            let c = parse(&words(line), &dir.0, &env).unwrap();
            assert_eq!(c.spec.hosts, vec!["n1".to_string(), "n2".to_string()], "prun {line}");
            assert_eq!(c.hostfile.as_deref(), Some(path.as_path()));
            assert_eq!(c.one_shot_candidate(false), Some(OneShot::Hostfile(path.clone())));
            assert_eq!(c.host_list, None);
        }
        let abs = format!("--hostfile {} a", path.display());
        assert_eq!(run(&abs).unwrap().hostfile, Some(path.clone()));
        assert_eq!(
            err(&format!("--hostfile {} --hostfile {} a", path.display(), path.display())),
            "--hostfile given twice"
        );
        assert_eq!(err(&format!("--hostfile {} -H n1 a", path.display())), "--hostfile and -H cannot both be given");
        assert_eq!(
            err(&format!("--local 2 --hostfile {} a", path.display())),
            "--local and --hostfile cannot both be given"
        );
        assert!(err("--hostfile nope a").starts_with("cannot read hostfile /w/nope: "), "{}", err("--hostfile nope a"));
        std::fs::write(dir.0.join("dup"), "n1\nn1\n").unwrap();
        let e = parse(&words("--hostfile dup a"), &dir.0, &env).unwrap_err();
        assert_eq!(e.to_string(), format!("{}:2: host 'n1' is already listed on line 1", dir.0.join("dup").display()));
    }

    #[test]
    fn one_shot_candidate_prefers_local_then_hostfile_then_hosts_then_slurm() {
        let c = run("--host a:2,b a").unwrap();
        assert_eq!(c.one_shot_candidate(true), Some(OneShot::Hosts("a:2,b".into())));
        let c = run("--local 2 a").unwrap();
        assert_eq!(c.one_shot_candidate(true), Some(OneShot::Local { daemons: 2, slots: None }));
        let c = run("a").unwrap();
        assert_eq!(c.one_shot_candidate(true), Some(OneShot::Slurm));
        assert_eq!(c.one_shot_candidate(false), None);
    }

    #[test]
    fn non_utf8_cwd_is_refused() {
        use std::os::unix::ffi::OsStrExt;
        let cwd = Path::new(std::ffi::OsStr::from_bytes(b"/w/\xff"));
        let e = parse(&words("a"), cwd, &env).unwrap_err();
        assert_eq!(e.to_string(), "prun's working directory '/w/\u{fffd}' is not valid UTF-8");
    }

    /// Tiny deterministic generator (xorshift64*), so failures reproduce.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
        }
        fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
            xs[self.below(xs.len())]
        }
    }

    /// Render `opt value` in one of the spellings a user may type.
    fn render(rng: &mut Rng, spellings: &[&str], value: &str, out: &mut Vec<String>) {
        let name = rng.pick(spellings);
        match rng.below(3) {
            0 => out.extend([name.to_string(), value.to_string()]),
            1 => out.push(format!("{name}={value}")),
            // `-n4`, or `-np 4` for a long name.
            _ if name.len() == 2 => out.push(format!("{name}{value}")),
            _ => out.extend([name[1..].to_string(), value.to_string()]),
        }
    }

    /// Random MPMD command lines, rendered with random spellings and option orders, parse to
    /// the job built directly from the model they were rendered from.
    #[test]
    fn random_command_lines_match_their_model() {
        let vars = ["A", "B", "HOME"];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..3000 {
            let napps = 1 + rng.below(4);
            let mut args: Vec<String> = Vec::new();
            let mut want_apps = Vec::new();
            let mut global_env: Vec<(String, String)> = Vec::new();
            let mut global_wdir = None;
            let mut want = expect(|_| {});
            for k in 0..napps {
                // Options of this segment, in a shuffled order.
                // Each option's words, and the variable it exports.
                type Var = Option<(String, String)>;
                let mut opts: Vec<(Vec<String>, Var)> = Vec::new();
                let np = rng.below(4) as u32;
                if np > 0 {
                    let mut o = Vec::new();
                    render(&mut rng, &["-n", "--np"], &np.to_string(), &mut o);
                    opts.push((o, None));
                }
                for v in vars {
                    if rng.below(3) == 0 {
                        let value = if v == "HOME" && rng.below(2) == 0 { None } else { Some(format!("{k}")) };
                        let mut o = Vec::new();
                        let text = value.as_ref().map_or(v.to_string(), |x| format!("{v}={x}"));
                        render(&mut rng, &["-x"], &text, &mut o);
                        opts.push((o, Some((v.to_string(), value.unwrap_or_else(|| "/home/u".into())))));
                    }
                }
                let wdir = (rng.below(3) == 0).then(|| format!("d{k}"));
                if let Some(w) = &wdir {
                    let mut o = Vec::new();
                    render(&mut rng, &["--wdir", "--wd"], w, &mut o);
                    opts.push((o, None));
                }
                if k == 0 {
                    if rng.below(2) == 0 {
                        let mut o = Vec::new();
                        render(&mut rng, &["-N", "--npernode"], "3", &mut o);
                        opts.push((o, None));
                        want.spec.map_by = MapBy::Ppr as i32;
                        want.spec.ppr = 3;
                    }
                    if rng.below(2) == 0 {
                        opts.push((vec!["--tag-output".into()], None));
                        want.spec.tag_output = true;
                    }
                    if rng.below(2) == 0 {
                        let mut o = Vec::new();
                        render(&mut rng, &["--timeout"], "7", &mut o);
                        opts.push((o, None));
                        want.spec.timeout_s = 7.0;
                    }
                }
                for i in (1..opts.len()).rev() {
                    let j = rng.below(i + 1);
                    opts.swap(i, j);
                }
                // -x takes effect in command-line order.
                let env: Vec<(String, String)> = opts.iter().filter_map(|(_, e)| e.clone()).collect();
                args.extend(opts.into_iter().flat_map(|(o, _)| o));
                let argv = vec![format!("exe{k}"), "-n".to_string(), ":x".to_string()];
                args.extend(argv.iter().cloned());
                if k + 1 < napps {
                    args.push(":".into());
                }
                if k == 0 {
                    global_env = env;
                    global_wdir = wdir.map(|w| format!("/w/{w}"));
                    want_apps.push((argv, np, Vec::new(), None));
                } else {
                    want_apps.push((argv, np, env, wdir.map(|w| format!("/w/{w}"))));
                }
            }
            want.spec.apps = want_apps
                .into_iter()
                .map(|(argv, np, env, wdir)| {
                    let mut merged: Vec<String> = global_env
                        .iter()
                        .filter(|(n, _)| !env.iter().any(|(m, _): &(String, String)| m == n))
                        .map(|(n, v)| format!("{n}={v}"))
                        .collect();
                    merged.extend(env.iter().map(|(n, v)| format!("{n}={v}")));
                    AppContext { argv, np, env: merged, wdir: wdir.or(global_wdir.clone()).unwrap_or_default() }
                })
                .collect();
            assert_eq!(parse(&args, Path::new(CWD), &env).unwrap(), want, "prun {}", args.join(" "));
        }
    }
}
