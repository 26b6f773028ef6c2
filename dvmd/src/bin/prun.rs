//! `prun`: run a job on a DVM (a running one, or a transient one started for this job with
//! `--local N`, `--hostfile F` or `--host list`, like `prterun`/`mpirun`). Exit status: 0, or
//! the first failing process's status (signal death = 128 + signo); 128 + signo when SIGINT or
//! SIGTERM reached prun before the job ended successfully; 141 when prun's stdout was closed;
//! 125 when the DVM failed under the job; 1 when prun could not run the job.

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dvm_proto::control::{job_event, JobOutput, StdinMsg};
use dvm_proto::job::StdinTarget;
use dvmd::control::Client;
use dvmd::prun_cli::{self, OneShot, PrunCommand};
use dvmd::session::{self, Discovery, DvmUri};
use nix::sys::signal::{SigSet, Signal};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::signal::unix::{signal, SignalKind};

/// Exit status when the DVM failed under the job (its head process ended, or prun lost contact
/// with it): the job's own outcome is unknown. The same status the HNP gives a job it ends
/// because the DVM is terminated: either way the DVM ended under the job.
const LOST_DVM: i32 = dvmd::jobs::TERMINATED_EXIT;
/// Exit status when prun's stdout was closed (a reader such as `head` went away), as for any
/// filter killed by SIGPIPE.
const CLOSED_STDOUT: i32 = 128 + libc::SIGPIPE;
/// How long an orderly stop of a one-shot DVM may take before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(15);

fn main() -> ExitCode {
    // Hold the signals prun handles until its handlers are in place: a Ctrl-C in the first
    // milliseconds is then handled like a later one instead of killing prun mid-boot.
    hold_signals();
    dvmd::init_logging();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let cmd = match prun_cli::parse(&args, &cwd, &|k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("prun: {e}");
            return ExitCode::from(1);
        }
    };
    if cmd.help {
        print!("{}", prun_cli::USAGE);
        return ExitCode::SUCCESS;
    }
    if cmd.version {
        println!("prun (dvm) {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("prun: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cmd)) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("prun: {e:#}");
            let code = if e.downcast_ref::<LostDvm>().is_some() { LOST_DVM } else { 1 };
            ExitCode::from(code as u8)
        }
    }
}

/// The signals prun catches: SIGINT and SIGTERM end the job, SIGUSR1 and SIGUSR2 are forwarded.
fn handled() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGUSR1, Signal::SIGUSR2] {
        set.add(s);
    }
    set
}

fn hold_signals() {
    let _ = handled().thread_block();
}

fn release_signals() {
    let _ = handled().thread_unblock();
}

/// SIGINT and SIGTERM end the job; other caught signals are forwarded to it.
fn ends_job(sig: i32) -> bool {
    sig == libc::SIGINT || sig == libc::SIGTERM
}

/// prun's signal handlers, installed once before anything starts. A signal that arrives while
/// nobody waits on it is kept until the next [`Signals::next`].
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        let s = Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
        };
        release_signals();
        Ok(s)
    }

    async fn next(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
            _ = self.usr1.recv() => libc::SIGUSR1,
            _ = self.usr2.recv() => libc::SIGUSR2,
        }
    }

    /// The next SIGINT or SIGTERM (others are dropped: there is no job to forward them to).
    async fn next_ending(&mut self) -> i32 {
        loop {
            let sig = self.next().await;
            if ends_job(sig) {
                return sig;
            }
        }
    }

    /// A SIGINT or SIGTERM that already arrived, without waiting.
    async fn ending_now(&mut self) -> Option<i32> {
        tokio::select! {
            biased;
            sig = self.next_ending() => Some(sig),
            () = std::future::ready(()) => None,
        }
    }
}

/// Where the job runs.
enum Target {
    Attach(DvmUri),
    OneShot(OneShot),
}

/// `--local` always boots a one-shot DVM; `--dvm-uri` attaches. Otherwise prun attaches to the
/// only persistent DVM of this user, boots a one-shot DVM from `--hostfile`/`--host` when none
/// runs, and refuses to guess when several run. One-shot DVMs are private to their prun and
/// never found here, so this choice never depends on another prun's job.
fn choose_dvm(cmd: &PrunCommand) -> Result<Target> {
    if let Some(one) = &cmd.one_shot {
        return Ok(Target::OneShot(one.clone()));
    }
    if cmd.dvm_uri.is_some() {
        return Ok(Target::Attach(DvmUri::resolve(cmd.dvm_uri.as_deref())?));
    }
    match session::discover() {
        Discovery::One(uri) => Ok(Target::Attach(uri)),
        Discovery::None { root } => match cmd.one_shot_candidate(dvmd::slurm::in_job()) {
            Some(one) => Ok(Target::OneShot(one)),
            None => bail!(
                "no running DVM found under {} (start one with `dvmd --local N --daemonize`, pass --dvm-uri, \
                 or give --local N for a one-shot DVM)",
                root.display()
            ),
        },
        several @ Discovery::Several { .. } => several.into_uri().map(Target::Attach),
    }
}

/// The DVM's head process as prun knows it, to say what happened when the DVM goes away.
struct Head {
    uri: DvmUri,
    /// Its pid (from the session directory's name; the HNP runs on this machine, where prun
    /// reads the DVM secret).
    pid: Option<u32>,
    one_shot: bool,
}

/// The DVM went away during the job.
#[derive(Debug)]
struct LostDvm {
    uri: DvmUri,
    pid: Option<u32>,
    host: String,
    /// The head process is gone (else prun only lost its connection to it).
    hnp_ended: bool,
    /// How the head process ended, when prun is its parent.
    how: Option<String>,
    /// What the transport said.
    detail: String,
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
    /// Why the job's event stream broke: the head process ended (waited for up to 2 s), or not.
    async fn lost(&self, detail: &str) -> LostDvm {
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

async fn run(cmd: PrunCommand) -> Result<i32> {
    let mut signals = Signals::install()?;
    let mut pending = Vec::new();
    match choose_dvm(&cmd)? {
        Target::Attach(uri) => {
            let head = Head { pid: uri.hnp_pid(), uri, one_shot: false };
            match run_job(&cmd, &head, &mut signals, pending).await {
                Ok(r) => Ok(r.code),
                Err(e) => {
                    if let Some(lost) = e.downcast_ref::<LostDvm>() {
                        // A head process that died cannot remove its own session directory.
                        if lost.hnp_ended && head.pid.is_some() {
                            let _ = std::fs::remove_dir_all(&head.uri.session);
                        }
                    }
                    Err(e)
                }
            }
        }
        Target::OneShot(kind) => {
            let mut t = match Transient::start(&kind, &mut signals, &mut pending).await? {
                Boot::Ready(t) => t,
                Boot::Interrupted(sig) => return Ok(128 + sig),
            };
            let head = Head { uri: t.uri.clone(), pid: Some(t.pgid), one_shot: true };
            let result = run_job(&cmd, &head, &mut signals, pending).await;
            let r = match result {
                Ok(r) => r,
                Err(mut e) => {
                    if let Some(lost) = e.downcast_mut::<LostDvm>() {
                        lost.how = t.how_it_ended().await;
                        t.kill_all();
                    } else if let Err(stop) = t.stop(&mut signals, true).await {
                        eprintln!("prun: {stop:#}");
                    }
                    return Err(e);
                }
            };
            if r.abandon {
                t.kill_all();
                return Ok(r.code);
            }
            // The job has ended: the DVM (`--one-job`) is terminating itself. Only a plan
            // (`--launch-sizes`) launched nothing, and the DVM is asked.
            match t.stop(&mut signals, cmd.launch_sizes).await {
                Ok(None) => Ok(r.code),
                Ok(Some(sig)) => Ok(if r.code == 0 { 128 + sig } else { r.code }),
                Err(e) => {
                    eprintln!("prun: {e:#}");
                    Ok(if r.code == 0 { 1 } else { r.code })
                }
            }
        }
    }
}

/// A one-shot DVM being booted.
enum Boot {
    Ready(Box<Transient>),
    /// SIGINT/SIGTERM came during the boot; the DVM is gone.
    Interrupted(i32),
}

/// A DVM started for this job only (`dvmd --private`: no other command discovers it). It runs
/// in its own process group, so a Ctrl-C at the terminal reaches prun alone and prun decides how
/// the job and the DVM end; the kernel kills its head process if prun dies first (its daemons
/// follow when they lose it). Until stopped in order, dropping it kills every process of it.
struct Transient {
    child: tokio::process::Child,
    /// The head process's pid, which is also the process group of every daemon it started here.
    pgid: u32,
    uri: DvmUri,
    ended: bool,
}

impl Transient {
    async fn start(kind: &OneShot, signals: &mut Signals, pending: &mut Vec<i32>) -> Result<Boot> {
        let exe = std::env::current_exe().context("cannot find prun's own path")?;
        let dvmd = exe.with_file_name("dvmd");
        let mut cmd = tokio::process::Command::new(&dvmd);
        match kind {
            OneShot::Local { daemons, slots } => {
                cmd.arg("--local").arg(daemons.to_string());
                if let Some(s) = slots {
                    cmd.arg("--slots").arg(s.to_string());
                }
            }
            OneShot::Hostfile(f) => {
                cmd.arg("--hostfile").arg(f);
            }
            OneShot::Hosts(h) => {
                cmd.arg("--host").arg(h);
            }
            // dvmd reads the allocation from the environment it inherits.
            OneShot::Slurm => {}
        }
        // A job is coming at once: PMIx servers start during the boot, not with the job. The
        // DVM ends itself when that job has ended.
        cmd.arg("--pmix-start").arg("eager").arg("--private").arg("--one-job");
        // Nor should a link probe share the links with the job.
        cmd.arg("--no-link-probe");
        // Extra dvmd options for one-shot DVMs (e.g. "--radix 2 --launch-agent ...").
        if let Ok(extra) = std::env::var("PRUN_DVMD_ARGS") {
            cmd.args(shell_words(&extra));
        }
        cmd.arg("--report-uri").arg("-").stdin(Stdio::null()).stdout(Stdio::piped()).kill_on_drop(true);
        cmd.process_group(0);
        let prun_pid = nix::unistd::getpid();
        // SAFETY: prctl and getppid are async-signal-safe; called between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if nix::unistd::getppid() != prun_pid {
                    return Err(std::io::Error::other("prun ended while starting dvmd"));
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().with_context(|| format!("cannot start {}", dvmd.display()))?;
        let Some(pgid) = child.id() else { bail!("{} ended as soon as it started", dvmd.display()) };
        let stdout = child.stdout.take().context("dvmd's stdout")?;
        let placeholder = DvmUri { control: ([127, 0, 0, 1], 0).into(), session: PathBuf::new() };
        let mut t = Transient { child, pgid, uri: placeholder, ended: false };
        let mut lines = BufReader::new(stdout).lines();
        let mut uri = None;
        loop {
            tokio::select! {
                line = lines.next_line() => match line.context("cannot read from the transient DVM")? {
                    Some(l) if l.starts_with("dvm://") => uri = Some(DvmUri::parse(&l)?),
                    Some(l) if l == "DVM ready" => break,
                    Some(_) => {}
                    None => {
                        let st = t.child.wait().await?;
                        t.ended = true;
                        t.kill_all();
                        bail!("the transient DVM failed to start ({st})");
                    }
                },
                sig = signals.next() => {
                    if ends_job(sig) {
                        t.kill_all();
                        return Ok(Boot::Interrupted(sig));
                    }
                    pending.push(sig);
                }
            }
        }
        let Some(uri) = uri else { bail!("the transient DVM said it was ready without reporting its URI") };
        t.uri = uri;
        // Keep draining dvmd's stdout.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Boot::Ready(Box::new(t)))
    }

    /// Wait until the DVM has ended in order: asked to terminate, like pterm (`ask`), or
    /// terminating itself because its job ended. A SIGINT/SIGTERM meanwhile, or a DVM that has
    /// not stopped within [`STOP_WAIT`], kills it instead. Returns the signal that came, if any.
    async fn stop(&mut self, signals: &mut Signals, ask: bool) -> Result<Option<i32>> {
        enum Stop {
            Done(std::result::Result<Result<std::process::ExitStatus>, tokio::time::error::Elapsed>),
            Signal(i32),
        }
        let stop = {
            let uri = self.uri.clone();
            let child = &mut self.child;
            let orderly = async move {
                if ask {
                    let mut client = Client::connect(uri).await?;
                    client.terminate().await?;
                }
                Ok(child.wait().await?)
            };
            tokio::select! {
                r = tokio::time::timeout(STOP_WAIT, orderly) => Stop::Done(r),
                sig = signals.next_ending() => Stop::Signal(sig),
            }
        };
        match stop {
            Stop::Done(Ok(Ok(st))) => {
                self.ended = true;
                if !st.success() {
                    bail!("the transient DVM ended with {st}");
                }
                Ok(signals.ending_now().await)
            }
            Stop::Done(Ok(Err(e))) => {
                self.kill_all();
                Err(e.context("cannot stop the transient DVM in order; killed it"))
            }
            Stop::Done(Err(_)) => {
                self.kill_all();
                bail!("the transient DVM did not stop within {} s; killed it", STOP_WAIT.as_secs())
            }
            Stop::Signal(sig) => {
                self.kill_all();
                Ok(Some(sig))
            }
        }
    }

    /// How the head process ended, if it has (waiting up to 2 s: its main thread shows as a
    /// zombie while its other threads still exit).
    async fn how_it_ended(&mut self) -> Option<String> {
        let st = tokio::time::timeout(Duration::from_secs(2), self.child.wait()).await.ok()?.ok()?;
        Some(match (st.code(), st.signal()) {
            (Some(c), _) => format!("exit status {c}"),
            (None, Some(s)) => format!("killed by signal {s}"),
            _ => "ended".to_string(),
        })
    }

    /// Kill every process of the DVM on this machine (its process group), wait until they are
    /// gone (at most 5 s), and remove the session directories they left.
    fn kill_all(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.pgid as i32);
        let _ = nix::sys::signal::killpg(group, Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !group_members(self.pgid).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.try_wait();
        self.ended = true;
        session::sweep_stale();
    }
}

impl Drop for Transient {
    fn drop(&mut self) {
        if !self.ended {
            self.kill_all();
        }
    }
}

/// Live (not zombie) processes in process group `pgid`.
fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
            let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
            fields.first().is_some_and(|state| *state != "Z") && fields.get(2) == Some(&pgid.to_string().as_str())
        })
        .collect()
}

fn shell_words(s: &str) -> Vec<String> {
    // Simple quoting: 'single' and "double" quoted words, else whitespace-separated.
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (None, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Writes job output: raw, or tagged per line `[job,rank]<stream>: line`. Once prun's stdout is
/// closed, what would go there is dropped; errors on stderr are ignored.
struct Output {
    jobid: u32,
    tag: bool,
    merge: bool,
    partial: HashMap<(u32, u32), Vec<u8>>,
    stdout_closed: bool,
}

impl Output {
    /// Write one chunk; true when this write found stdout closed.
    fn write(&mut self, o: JobOutput) -> bool {
        let to = if self.merge { 1 } else { o.stream };
        if !self.tag {
            return self.put(to, &o.data);
        }
        let buf = self.partial.entry((o.rank, o.stream)).or_default();
        buf.extend_from_slice(&o.data);
        let mut lines = Vec::new();
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            lines.push(buf.drain(..=nl).collect::<Vec<u8>>());
        }
        let mut closed = false;
        for l in lines {
            closed |= self.emit(o.rank, o.stream, to, &l);
        }
        closed
    }

    fn emit(&mut self, rank: u32, from: u32, to: u32, line: &[u8]) -> bool {
        let name = if from == 2 { "stderr" } else { "stdout" };
        let mut text = format!("[{},{}]<{name}>: ", self.jobid, rank).into_bytes();
        text.extend_from_slice(line);
        if !text.ends_with(b"\n") {
            text.push(b'\n');
        }
        self.put(to, &text)
    }

    /// Write to stream `to` (2: stderr, else stdout); true when this write found stdout closed.
    fn put(&mut self, to: u32, data: &[u8]) -> bool {
        if to == 2 {
            let mut e = std::io::stderr().lock();
            let _ = e.write_all(data).and_then(|()| e.flush());
            return false;
        }
        if self.stdout_closed {
            return false;
        }
        let mut s = std::io::stdout().lock();
        match s.write_all(data).and_then(|()| s.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.stdout_closed = true;
                true
            }
            _ => false,
        }
    }

    fn finish(&mut self) {
        let rest: Vec<((u32, u32), Vec<u8>)> = self.partial.drain().filter(|(_, b)| !b.is_empty()).collect();
        for ((rank, from), line) in rest {
            let to = if self.merge { 1 } else { from };
            self.emit(rank, from, to, &line);
        }
    }
}

/// How a job ended for prun.
struct JobResult {
    /// prun's exit status.
    code: i32,
    /// prun stops waiting (a second SIGINT/SIGTERM): a one-shot DVM is killed, not stopped.
    abandon: bool,
}

async fn run_job(cmd: &PrunCommand, head: &Head, signals: &mut Signals, mut pending: Vec<i32>) -> Result<JobResult> {
    let uri = &head.uri;
    let mut client = Client::connect(uri.clone()).await?;
    let spec = cmd.spec.clone();
    if cmd.launch_sizes {
        let p = client.launch_plan(spec).await?;
        println!("job of {} procs on {} nodes, placement {}", p.nprocs, p.nodes, p.placement);
        println!("  broadcast map: {} bytes", p.map_bytes);
        println!("  scattered residuals: {} bytes in all", p.residual_bytes);
        println!("  per proc: {:.3} bytes", p.bytes_per_proc);
        println!("  most received by one daemon: {} bytes", p.max_daemon_bytes);
        return Ok(JobResult { code: 0, abandon: false });
    }
    let mut events = client.launch(spec.clone()).await?;
    let mut out = Output {
        jobid: 0,
        tag: spec.tag_output,
        merge: spec.merge_stderr,
        partial: HashMap::new(),
        stdout_closed: false,
    };
    let mut jobid = None;
    // The first SIGINT/SIGTERM: the job is killed, and prun never reports success after it.
    let mut interrupted: Option<i32> = None;
    loop {
        let next = tokio::select! {
            ev = events.message() => ev,
            sig = signals.next() => {
                if ends_job(sig) {
                    // A second one: stop waiting, once the kill is on its way or the DVM is ours.
                    if let (Some(first), true) = (interrupted, jobid.is_some() || head.one_shot) {
                        return Ok(JobResult { code: 128 + first, abandon: true });
                    }
                    interrupted.get_or_insert(sig);
                }
                // Signals that come before the job has an id are forwarded once it has one.
                match jobid {
                    Some(j) => forward_signal(uri, j, sig).await,
                    None => pending.push(sig),
                }
                continue;
            }
        };
        let ev = match next {
            Ok(Some(ev)) => ev,
            Ok(None) => return Err(head.lost("its job event stream ended without a result").await.into()),
            Err(status) => return Err(head.lost(status.message()).await.into()),
        };
        match ev.event {
            Some(job_event::Event::Started(s)) => {
                jobid = Some(s.jobid);
                out.jobid = s.jobid;
                for sig in pending.drain(..) {
                    forward_signal(uri, s.jobid, sig).await;
                }
                if StdinTarget::try_from(spec.stdin_target).ok() != Some(StdinTarget::None) {
                    tokio::spawn(forward_stdin(uri.clone(), s.jobid));
                }
            }
            Some(job_event::Event::Output(o)) => {
                // The first write that finds stdout closed (nobody reads prun's output any
                // more) ends the job, quietly, like a filter killed by SIGPIPE.
                let closed_now = out.write(o);
                if let (true, Some(j)) = (closed_now, jobid) {
                    forward_signal(uri, j, libc::SIGTERM).await;
                }
            }
            // Quiet once stdout is closed: the job ends because prun's reader went away.
            Some(job_event::Event::Notice(n)) if !out.stdout_closed => eprintln!("prun: {}", n.text),
            Some(job_event::Event::Ended(e)) => {
                out.finish();
                if jobid.is_none() && !e.message.is_empty() {
                    // Refused before launch (mapping): the message is the reason.
                    eprintln!("prun: {}", e.message);
                }
                let code = match (out.stdout_closed, interrupted) {
                    (true, _) => CLOSED_STDOUT,
                    (false, Some(sig)) if e.exit_code == 0 => 128 + sig,
                    _ => e.exit_code,
                };
                return Ok(JobResult { code, abandon: false });
            }
            _ => {}
        }
    }
}

async fn forward_signal(uri: &DvmUri, jobid: u32, sig: i32) {
    match Client::connect(uri.clone()).await {
        Ok(mut c) => {
            if let Err(e) = c.signal(jobid, sig).await {
                eprintln!("prun: cannot forward signal {sig}: {e:#}");
            }
        }
        Err(e) => eprintln!("prun: cannot forward signal {sig}: {e:#}"),
    }
}

async fn forward_stdin(uri: DvmUri, jobid: u32) {
    let (tx, rx) = tokio::sync::mpsc::channel::<StdinMsg>(16);
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = tx.send(StdinMsg { jobid, data: Default::default(), eof: true }).await;
                    return;
                }
                Ok(n) => {
                    if tx.send(StdinMsg { jobid, data: buf[..n].to_vec().into(), eof: false }).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let result: Result<()> = async {
        let mut c = Client::connect(uri).await?;
        c.stdin(stream).await
    }
    .await;
    if let Err(e) = result {
        tracing::debug!("stdin forwarding ended: {e:#}");
    }
}
