//! The option table (every option's kind and spellings), looking a token up in it, and the
//! small value checks the parser shares.
//!
//! Never decides which scope (job or app) an option belongs to: that is the parser's. Do not
//! break: a name resolves to at most one kind, and `--opt=VALUE` keeps everything after the
//! first `=` as the value.

use std::path::{Path, PathBuf};

use super::command::CliError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Np,
    Export,
    Wdir,
    PerNode,
    MapBy,
    RankBy,
    BindTo,
    CpusPerRank,
    UseHwthreadCpus,
    Rankfile,
    Oversubscribe,
    Host,
    Hostfile,
    Output,
    TagOutput,
    TimestampOutput,
    OutputFilename,
    MergeStderr,
    Stdin,
    Timeout,
    /// `--mpi pmix|pmi1|pmi2|both|none`: the ranks' process-management interface.
    Mpi,
    DvmUri,
    Local,
    Slots,
    LaunchSizes,
    EnableRecovery,
    NoQueue,
    GetStackTraces,
    Detach,
    Attach,
    Array,
    /// `--mca K V` and its kin: an MCA parameter for the ranks, as an environment variable.
    McaOmpi,
    McaPrte,
    McaPmix,
    App,
    Display,
    DisplayMap,
    DisplayAllocation,
    ReportBindings,
    PreloadBinary,
    PreloadFiles,
    PreloadDestDir,
    PreloadKeep,
    PreloadCompress,
    Help,
    Version,
}

impl Kind {
    pub(super) fn takes_value(self) -> bool {
        !matches!(
            self,
            Kind::Oversubscribe
                | Kind::UseHwthreadCpus
                | Kind::TagOutput
                | Kind::TimestampOutput
                | Kind::MergeStderr
                | Kind::LaunchSizes
                | Kind::EnableRecovery
                | Kind::NoQueue
                | Kind::GetStackTraces
                | Kind::DisplayMap
                | Kind::DisplayAllocation
                | Kind::ReportBindings
                | Kind::PreloadBinary
                | Kind::PreloadKeep
                | Kind::PreloadCompress
                | Kind::Detach
                | Kind::Help
                | Kind::Version
        )
    }
    /// The environment prefix of an MCA option (it takes a name and a value).
    pub(super) fn mca_prefix(self) -> Option<&'static str> {
        match self {
            Kind::McaOmpi => Some("OMPI_MCA_"),
            Kind::McaPrte => Some("PRTE_MCA_"),
            Kind::McaPmix => Some("PMIX_MCA_"),
            _ => None,
        }
    }
    pub(super) fn is_app_option(self) -> bool {
        matches!(self, Kind::Np | Kind::Export | Kind::Wdir)
    }
}

/// Every spelling `prun` accepts (single-dash forms of the long names are derived in [`lookup`]).
pub(super) const OPTIONS: &[(Kind, &[&str])] = &[
    (Kind::Np, &["-n", "--np"]),
    (Kind::Export, &["-x"]),
    (Kind::Wdir, &["--wdir", "--wd"]),
    (Kind::PerNode, &["-N", "--npernode"]),
    (Kind::MapBy, &["--map-by"]),
    (Kind::RankBy, &["--rank-by"]),
    (Kind::BindTo, &["--bind-to"]),
    (Kind::CpusPerRank, &["--cpus-per-rank", "--cpus-per-proc"]),
    (Kind::UseHwthreadCpus, &["--use-hwthread-cpus"]),
    (Kind::Rankfile, &["--rankfile", "--rf"]),
    (Kind::Oversubscribe, &["--oversubscribe"]),
    (Kind::Host, &["-H", "--host"]),
    (Kind::Hostfile, &["--hostfile", "--machinefile"]),
    (Kind::Output, &["--output"]),
    (Kind::TagOutput, &["--tag-output"]),
    (Kind::TimestampOutput, &["--timestamp-output"]),
    (Kind::OutputFilename, &["--output-filename"]),
    (Kind::MergeStderr, &["--merge-stderr-to-stdout"]),
    (Kind::Stdin, &["--stdin"]),
    (Kind::Timeout, &["--timeout"]),
    (Kind::Mpi, &["--mpi"]),
    (Kind::DvmUri, &["--dvm-uri"]),
    (Kind::Local, &["--local"]),
    (Kind::Slots, &["--slots"]),
    (Kind::LaunchSizes, &["--launch-sizes"]),
    (Kind::EnableRecovery, &["--enable-recovery"]),
    (Kind::NoQueue, &["--no-queue"]),
    (Kind::GetStackTraces, &["--get-stack-traces", "--report-state-on-timeout"]),
    (Kind::Detach, &["--detach"]),
    (Kind::Attach, &["--attach"]),
    (Kind::Array, &["--array"]),
    (Kind::McaOmpi, &["--mca", "--gmca", "--omca"]),
    (Kind::McaPrte, &["--prtemca"]),
    (Kind::McaPmix, &["--pmixmca"]),
    (Kind::App, &["--app"]),
    (Kind::Display, &["--display"]),
    (Kind::DisplayMap, &["--display-map"]),
    (Kind::DisplayAllocation, &["--display-allocation"]),
    (Kind::ReportBindings, &["--report-bindings"]),
    (Kind::PreloadBinary, &["--preload-binary"]),
    (Kind::PreloadFiles, &["--preload-files"]),
    (Kind::PreloadDestDir, &["--preload-files-dest-dir"]),
    (Kind::PreloadKeep, &["--preload-keep"]),
    (Kind::PreloadCompress, &["--preload-compress"]),
    (Kind::Help, &["-h", "--help"]),
    (Kind::Version, &["-V", "--version"]),
];

pub(super) fn kind_of(name: &str) -> Option<Kind> {
    OPTIONS.iter().find(|(_, names)| names.contains(&name)).map(|(k, _)| *k)
}

/// Resolve an option token to its kind, its spelling (for messages) and an inline value.
pub(super) fn lookup(token: &str) -> Result<(Kind, String, Option<String>), CliError> {
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

pub(super) fn set_once<T>(slot: &mut Option<T>, value: T, twice: impl FnOnce() -> CliError) -> Result<(), CliError> {
    if slot.is_some() {
        return Err(twice());
    }
    *slot = Some(value);
    Ok(())
}

pub(super) fn positive(s: &str) -> Option<u32> {
    s.parse::<u32>().ok().filter(|&n| n > 0)
}

/// Drop `.` components lexically (no file system access; `..` is kept as given).
pub(super) fn clean(path: &Path) -> PathBuf {
    path.components().collect()
}

pub(super) fn utf8(path: &Path, what: &str) -> Result<String, CliError> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| CliError::NotUtf8 { what: what.to_string(), path: path.display().to_string() })
}

/// The command line of a job as listings show it: each app's argv, apps separated by " : ".
pub(super) fn command_line(apps: &[dvm_proto::job::AppContext]) -> String {
    apps.iter().map(|a| a.argv.join(" ")).collect::<Vec<_>>().join(" : ")
}

/// `--array A-B` (indices A to B) or `--array N` (0 to N-1), as Slurm and Flux write them.
pub(super) fn parse_array(v: &str) -> Result<(u32, u32), String> {
    let num = |t: &str| t.trim().parse::<u32>().map_err(|_| format!("'{t}' is not an index (0 to {})", u32::MAX));
    match v.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (num(a)?, num(b)?);
            if a > b {
                return Err(format!("the first index {a} is above the last {b}"));
            }
            Ok((a, b))
        }
        None => match num(v)? {
            0 => Err("an array of 0 jobs".into()),
            n => Ok((0, n - 1)),
        },
    }
}
