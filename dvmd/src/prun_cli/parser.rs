//! The hand-written parser: walks the arguments once, splitting MPMD segments at a lone `:`,
//! and builds the [`PrunCommand`].
//!
//! No I/O except reading a `--hostfile`. Do not break: job options are refused after the
//! first executable, everything after an app's executable is its argv up to a lone `:`, and
//! `--help`/`--version` short-circuit where they appear.

use std::path::{Path, PathBuf};

use dvm_proto::job::{AppContext, ArraySpec, JobSpec, StdinTarget};

use crate::hostfile;

use super::appfile;
use super::command::{CliError, OneShot, PrunCommand};
use super::options::{clean, command_line, lookup, parse_array, positive, set_once, utf8, Kind};
use super::output::Item;
use super::placement::{PlaceError, Placement};

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
    place: Placement,
    timestamp_output: bool,
    oversubscribe: bool,
    host: Option<(String, String, Vec<String>)>,
    hostfile: Option<(String, PathBuf, Vec<String>)>,
    output: Option<String>,
    output_dir: Option<(PathBuf, bool)>,
    output_file: Option<(PathBuf, bool)>,
    tag_output: bool,
    merge_stderr: bool,
    stdin: Option<(StdinTarget, u32)>,
    timeout: Option<f64>,
    mpi: Option<dvm_proto::job::MpiInterface>,
    dvm_uri: Option<(String, String)>,
    local: Option<(String, u32)>,
    slots: Option<(String, u32)>,
    launch_sizes: bool,
    enable_recovery: bool,
    no_queue: bool,
    get_stack_traces: bool,
    detach: Option<String>,
    attach: Option<(String, u32)>,
    array: Option<(String, u32, u32)>,
    /// Variables set by an MCA option (a later one may set them again; `-x` may not).
    mca_set: Vec<String>,
    /// `--display`: (map, allocation, bind).
    display: (bool, bool, bool),
    /// `--preload-binary`, `--preload-files` lists, `--preload-files-dest-dir`, keep, compress.
    preload: (bool, Vec<String>, Option<String>, bool, bool),
}

/// Parse `prun`'s arguments (without the program name). `cwd` is prun's working directory
/// (absolute); `env` looks up prun's environment for `-x VAR`.
pub fn parse(args: &[String], cwd: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<PrunCommand, CliError> {
    let expanded = appfile::expand(args, cwd)?;
    let args = expanded.as_deref().unwrap_or(args);
    let cwd_str = utf8(cwd, "prun's working directory")?;
    let mut p = Parser {
        cwd,
        env,
        global: AppDraft::default(),
        apps: vec![AppDraft::default()],
        place: Placement::default(),
        timestamp_output: false,
        oversubscribe: false,
        host: None,
        hostfile: None,
        output: None,
        output_dir: None,
        output_file: None,
        tag_output: false,
        merge_stderr: false,
        stdin: None,
        timeout: None,
        mpi: None,
        dvm_uri: None,
        local: None,
        slots: None,
        launch_sizes: false,
        enable_recovery: false,
        no_queue: false,
        get_stack_traces: false,
        detach: None,
        attach: None,
        array: None,
        mca_set: Vec::new(),
        display: (false, false, false),
        preload: (false, Vec::new(), None, false, false),
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
            if let Some(prefix) = kind.mca_prefix() {
                // Two words: a name and a value (`--mca btl self,vader`).
                let (Some(name), Some(value), None) = (args.get(i), args.get(i + 1), &inline) else {
                    return Err(CliError::McaWithoutValue(spelled));
                };
                i += 2;
                p.mca(prefix, &spelled, name, value, app)?;
                continue;
            }
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
        if start == i && app == 1 && i == args.len() && p.attach.is_some() {
            // `--attach ID` follows a job that runs already: no executable.
            return p.finish(cwd_str);
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
    /// An MCA parameter: an environment variable of every app (a later one of a name wins, as
    /// with mpirun; `-x` of the same variable is refused as given twice).
    fn mca(&mut self, prefix: &str, opt: &str, name: &str, value: &str, app: usize) -> Result<(), CliError> {
        if app > 1 {
            return Err(CliError::JobOptionInApp { option: opt.to_string(), app });
        }
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(CliError::BadMcaName { option: opt.to_string(), name: name.to_string() });
        }
        let var = format!("{prefix}{name}");
        if let Some(kv) = self.global.env.iter_mut().find(|(n, _)| *n == var) {
            if !self.mca_set.contains(&var) {
                return Err(CliError::GivenTwice { option: format!("-x {var} and {opt} {name}"), app });
            }
            kv.1 = value.to_string();
        } else {
            self.global.env.push((var.clone(), value.to_string()));
            self.mca_set.push(var);
        }
        Ok(())
    }

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
            Kind::PerNode | Kind::MapBy | Kind::RankBy | Kind::BindTo | Kind::CpusPerRank | Kind::UseHwthreadCpus => {
                self.oversubscribe |= self.place.apply(kind, opt, &value).map_err(|e| match e {
                    PlaceError::Bad(p) => bad(&p),
                    PlaceError::Twice => twice(),
                    PlaceError::Conflict(first, second) => CliError::Conflict { first, second },
                })?;
            }
            Kind::Rankfile => {
                if value.is_empty() {
                    return Err(bad("not a file path"));
                }
                let path = clean(&self.cwd.join(&value));
                let entries = super::rankfile::read(&path)?;
                set_once(&mut self.place.rankfile, (opt.to_string(), path, entries), twice)?;
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
                for item in super::output::parse(&value).map_err(bad)? {
                    match item {
                        Item::Tag => self.tag_output = true,
                        Item::Timestamp => self.timestamp_output = true,
                        Item::Merge => self.merge_stderr = true,
                        Item::Dir(d, nocopy) => {
                            set_once(&mut self.output_dir, (clean(&self.cwd.join(d)), nocopy), twice)?
                        }
                        Item::File(f, nocopy) => {
                            set_once(&mut self.output_file, (clean(&self.cwd.join(f)), nocopy), twice)?
                        }
                    }
                }
            }
            Kind::TagOutput => self.tag_output = true,
            Kind::TimestampOutput => self.timestamp_output = true,
            Kind::OutputFilename => {
                if value.is_empty() {
                    return Err(bad("not a directory path"));
                }
                set_once(&mut self.output_dir, (clean(&self.cwd.join(&value)), false), twice)?;
            }
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
            Kind::Mpi => {
                let m =
                    dvm_core::jobs::mpi::parse(&value).map_err(|_| bad("expected pmix, pmi1, pmi2, both or none"))?;
                set_once(&mut self.mpi, m, twice)?;
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
            Kind::NoQueue => self.no_queue = true,
            Kind::GetStackTraces => self.get_stack_traces = true,
            Kind::Detach => self.detach = Some(opt.to_string()),
            Kind::Attach => {
                let id = positive(&value).ok_or_else(|| bad("not a job id (a positive integer)"))?;
                set_once(&mut self.attach, (opt.to_string(), id), twice)?;
            }
            Kind::Array => {
                let range = parse_array(&value).map_err(|p| bad(&p))?;
                set_once(&mut self.array, (opt.to_string(), range.0, range.1), twice)?;
            }
            Kind::Help | Kind::Version => unreachable!("--help and --version short-circuit in parse"),
            Kind::McaOmpi | Kind::McaPrte | Kind::McaPmix => unreachable!("two-word options are parsed in parse"),
            Kind::App => unreachable!("--app is expanded before parsing"),
            Kind::Display => {
                for item in value.split(',') {
                    match item {
                        "map" => self.display.0 = true,
                        "allocation" => self.display.1 = true,
                        "bind" => self.display.2 = true,
                        _ => return Err(bad("expected map, allocation, bind, or several separated by ','")),
                    }
                }
            }
            Kind::DisplayMap => self.display.0 = true,
            Kind::DisplayAllocation => self.display.1 = true,
            Kind::ReportBindings => self.display.2 = true,
            Kind::PreloadBinary => self.preload.0 = true,
            Kind::PreloadFiles => self.preload.1.push(value),
            Kind::PreloadDestDir => set_once(&mut self.preload.2, value, twice)?,
            Kind::PreloadKeep => self.preload.3 = true,
            Kind::PreloadCompress => self.preload.4 = true,
        }
        Ok(())
    }

    /// The user's MCA parameter files ([`super::mcafile`]): each parameter not given on the
    /// command line (`--mca`, `-x`) goes to the ranks as its environment variable.
    fn mca_files(&mut self) -> Result<(), CliError> {
        for (var, value) in super::mcafile::read(self.env)? {
            if !self.global.env.iter().any(|(k, _)| *k == var) {
                self.global.env.push((var, value));
            }
        }
        Ok(())
    }

    fn finish(mut self, cwd: String) -> Result<PrunCommand, CliError> {
        self.mca_files()?;
        if self.output_dir.is_some() && self.output_file.is_some() {
            return Err(CliError::Conflict {
                first: "--output dir=".into(),
                second: "file= (or --output-filename)".into(),
            });
        }
        if let Some((attach, _)) = &self.attach {
            if self.apps.iter().any(|a| !a.argv.is_empty()) {
                return Err(CliError::Conflict { first: attach.clone(), second: "an executable".into() });
            }
        }
        let one_shot = self.local.as_ref().map(|l| &l.0);
        for (opt, other) in [(self.detach.as_ref(), one_shot), (self.attach.as_ref().map(|a| &a.0), one_shot)] {
            if let (Some(opt), Some(other)) = (opt, other) {
                return Err(CliError::Conflict { first: other.clone(), second: opt.clone() });
            }
        }
        if let (Some(detach), Some((array, ..))) = (&self.detach, &self.array) {
            return Err(CliError::Conflict { first: array.clone(), second: detach.clone() });
        }
        if let Some((array, ..)) = &self.array {
            // An array's elements wait for free slots, in order.
            for (given, other) in [(self.no_queue, "--no-queue"), (self.oversubscribe, "--oversubscribe")] {
                if given {
                    return Err(CliError::Conflict { first: array.clone(), second: other.into() });
                }
            }
        }
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
                    // An array's element is one process unless -n says otherwise.
                    np: a.np.unwrap_or(if self.array.is_some() && self.place.per_node.is_none() { 1 } else { 0 }),
                    env,
                    wdir: a.wdir.or_else(|| global.wdir.clone()).unwrap_or_default(),
                    preload_binary: false,
                }
            })
            .collect();
        let mut apps = apps;
        let (binary, files, dest_dir, keep, compress) = std::mem::take(&mut self.preload);
        let preload = super::preload::plan(&mut apps, binary, &files, dest_dir.as_deref(), self.cwd, self.env)?;
        let (stdin_target, stdin_rank) = self.stdin.unwrap_or((StdinTarget::Rank, 0));
        if stdin_target == StdinTarget::Rank && apps.iter().all(|a| a.np > 0) {
            let nprocs: u64 = apps.iter().map(|a| u64::from(a.np)).sum();
            if u64::from(stdin_rank) >= nprocs {
                return Err(CliError::StdinRankOutOfRange { rank: stdin_rank, nprocs });
            }
        }
        let (host_list, hosts) = match (self.host, &self.hostfile) {
            (Some((_, list, names)), _) => (Some(list), names),
            (None, Some((_, _, names))) => (None, names.clone()),
            (None, None) => (None, Vec::new()),
        };
        let no_over = self.place.no_oversubscribe();
        let mut spec = JobSpec {
            command: command_line(&apps),
            apps,
            oversubscribe: self.oversubscribe && !no_over,
            hosts,
            tag_output: self.tag_output,
            merge_stderr: self.merge_stderr,
            stdin_target: stdin_target as i32,
            stdin_rank,
            timeout_s: self.timeout.unwrap_or(0.0),
            mpi: self.mpi.map_or(0, |m| m as i32),
            cwd,
            enable_recovery: self.enable_recovery,
            no_queue: self.no_queue,
            get_stack_traces: self.get_stack_traces,
            display_map: self.display.0,
            display_allocation: self.display.1,
            report_bindings: self.display.2,
            detach: self.detach.is_some(),
            uid: 0,
            array: self.array.map(|(_, first, last)| ArraySpec { first, last }),
            timestamp_output: self.timestamp_output,
            preload_keep: keep && !preload.is_empty(),
            preload_compress: compress && !preload.is_empty(),
            preload,
            ..Default::default()
        };
        self.place.fill(&mut spec);
        Ok(PrunCommand {
            spec,
            dvm_uri: self.dvm_uri.map(|(_, u)| u),
            one_shot: self.local.map(|(_, daemons)| OneShot::Local { daemons, slots: self.slots.map(|(_, s)| s) }),
            hostfile: self.hostfile.map(|(_, path, _)| path),
            host_list,
            launch_sizes: self.launch_sizes,
            output_dir: self.output_dir,
            output_file: self.output_file,
            attach: self.attach.map(|(_, id)| id),
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
        output_dir: None,
        output_file: None,
        attach: None,
        help: kind == Kind::Help,
        version: kind == Kind::Version,
    }
}
