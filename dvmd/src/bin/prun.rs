//! `prun`: run a job on a DVM (a running one, or a transient one started for this job with
//! `--local N`, `--hostfile F` or `--host list`, like `prterun`/`mpirun`). Exit status: 0, or
//! the first failing process's status (signal death = 128 + signo).

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use dvm_proto::control::{job_event, JobOutput, StdinMsg};
use dvm_proto::job::StdinTarget;
use dvmd::control::Client;
use dvmd::prun_cli::{self, OneShot, PrunCommand};
use dvmd::session::{self, Discovery, DvmUri};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::signal::unix::{signal, SignalKind};

fn main() -> ExitCode {
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
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    match rt.block_on(run(cmd)) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("prun: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// A DVM started for this job only (`dvmd --private`: no other command discovers it);
/// terminated (and, failing that, killed) when dropped.
struct Transient {
    child: Option<tokio::process::Child>,
    uri: DvmUri,
}

impl Transient {
    async fn start(kind: &OneShot) -> Result<Transient> {
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
        }
        // A job is coming at once: PMIx servers start during the boot, not with the job.
        // Private to this prun: no other command discovers it.
        cmd.arg("--pmix-start").arg("eager").arg("--private");
        // Extra dvmd options for one-shot DVMs (e.g. "--radix 2 --launch-agent ...").
        if let Ok(extra) = std::env::var("PRUN_DVMD_ARGS") {
            cmd.args(shell_words(&extra));
        }
        cmd.arg("--report-uri").arg("-").stdin(Stdio::null()).stdout(Stdio::piped()).kill_on_drop(true);
        let mut child = cmd.spawn().with_context(|| format!("cannot start {}", dvmd.display()))?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut uri = None;
        while let Some(line) = lines.next_line().await? {
            if line.starts_with("dvm://") {
                uri = Some(DvmUri::parse(&line)?);
            } else if line == "DVM ready" {
                break;
            }
        }
        let Some(uri) = uri else {
            let st = child.wait().await?;
            bail!("the transient DVM failed to start ({st})");
        };
        // Keep draining dvmd's stdout.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Transient { child: Some(child), uri })
    }

    async fn stop(mut self) -> Result<()> {
        let mut client = Client::connect(self.uri.clone()).await?;
        client.terminate().await?;
        if let Some(mut child) = self.child.take() {
            match tokio::time::timeout(Duration::from_secs(15), child.wait()).await {
                Ok(st) => {
                    let st = st?;
                    if !st.success() {
                        bail!("the transient DVM ended with {st}");
                    }
                }
                Err(_) => {
                    let _ = child.kill().await;
                    bail!("the transient DVM did not stop within 15 s; killed");
                }
            }
        }
        Ok(())
    }
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

/// Writes job output: raw, or tagged per line `[job,rank]<stream>: line`.
struct Output {
    jobid: u32,
    tag: bool,
    merge: bool,
    partial: HashMap<(u32, u32), Vec<u8>>,
}

impl Output {
    fn write(&mut self, o: JobOutput) -> std::io::Result<()> {
        let stream = if self.merge { 1 } else { o.stream };
        if !self.tag {
            return if stream == 2 {
                let mut e = std::io::stderr().lock();
                e.write_all(&o.data)?;
                e.flush()
            } else {
                let mut s = std::io::stdout().lock();
                s.write_all(&o.data)?;
                s.flush()
            };
        }
        let buf = self.partial.entry((o.rank, o.stream)).or_default();
        buf.extend_from_slice(&o.data);
        let mut lines = Vec::new();
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            lines.push(buf.drain(..=nl).collect::<Vec<u8>>());
        }
        for l in lines {
            self.emit(o.rank, o.stream, stream, &l)?;
        }
        Ok(())
    }

    fn emit(&self, rank: u32, from: u32, to: u32, line: &[u8]) -> std::io::Result<()> {
        let name = if from == 2 { "stderr" } else { "stdout" };
        let mut text = format!("[{},{}]<{name}>: ", self.jobid, rank).into_bytes();
        text.extend_from_slice(line);
        if !text.ends_with(b"\n") {
            text.push(b'\n');
        }
        if to == 2 {
            let mut e = std::io::stderr().lock();
            e.write_all(&text)?;
            e.flush()
        } else {
            let mut s = std::io::stdout().lock();
            s.write_all(&text)?;
            s.flush()
        }
    }

    fn finish(&mut self) -> std::io::Result<()> {
        let rest: Vec<((u32, u32), Vec<u8>)> = self.partial.drain().filter(|(_, b)| !b.is_empty()).collect();
        for ((rank, from), line) in rest {
            let to = if self.merge { 1 } else { from };
            self.emit(rank, from, to, &line)?;
        }
        Ok(())
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
        Discovery::None { root } => match cmd.one_shot_candidate() {
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

async fn run(cmd: PrunCommand) -> Result<i32> {
    let mut transient = None;
    let uri = match choose_dvm(&cmd)? {
        Target::Attach(uri) => uri,
        Target::OneShot(one) => {
            let t = Transient::start(&one).await?;
            let u = t.uri.clone();
            transient = Some(t);
            u
        }
    };
    let result = run_job(&cmd, uri).await;
    if let Some(t) = transient {
        if let Err(e) = t.stop().await {
            eprintln!("prun: {e:#}");
            if matches!(result, Ok(0)) {
                return Ok(1);
            }
        }
    }
    result
}

async fn run_job(cmd: &PrunCommand, uri: DvmUri) -> Result<i32> {
    // Catch signals before anything is launched: a Ctrl-C that comes while the launch is in
    // flight must still end the job, not just prun.
    let (mut s_int, mut s_term) = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
    let (mut s_usr1, mut s_usr2) = (signal(SignalKind::user_defined1())?, signal(SignalKind::user_defined2())?);
    let mut client = Client::connect(uri.clone()).await?;
    let spec = cmd.spec.clone();
    if cmd.launch_sizes {
        let p = client.launch_plan(spec).await?;
        println!("job of {} procs on {} nodes, placement {}", p.nprocs, p.nodes, p.placement);
        println!("  broadcast map: {} bytes", p.map_bytes);
        println!("  scattered residuals: {} bytes in all", p.residual_bytes);
        println!("  per proc: {:.3} bytes", p.bytes_per_proc);
        println!("  most received by one daemon: {} bytes", p.max_daemon_bytes);
        return Ok(0);
    }
    let mut events = client.launch(spec.clone()).await?;
    let mut out = Output { jobid: 0, tag: spec.tag_output, merge: spec.merge_stderr, partial: HashMap::new() };
    let mut jobid = None;
    // Signals that came before the job had an id; forwarded once it has one.
    let mut pending: Vec<i32> = Vec::new();
    loop {
        let sig = tokio::select! {
            ev = events.message() => Err(ev),
            _ = s_int.recv() => Ok(libc::SIGINT),
            _ = s_term.recv() => Ok(libc::SIGTERM),
            _ = s_usr1.recv() => Ok(libc::SIGUSR1),
            _ = s_usr2.recv() => Ok(libc::SIGUSR2),
        };
        let next = match sig {
            Ok(sig) => {
                match jobid {
                    Some(j) => forward_signal(&uri, j, sig).await,
                    None => pending.push(sig),
                }
                continue;
            }
            Err(ev) => ev,
        };
        let Some(ev) = next.context("lost the DVM during the job")? else {
            bail!("the DVM ended the job's output stream without a result");
        };
        match ev.event {
            Some(job_event::Event::Started(s)) => {
                jobid = Some(s.jobid);
                out.jobid = s.jobid;
                for sig in pending.drain(..) {
                    forward_signal(&uri, s.jobid, sig).await;
                }
                if StdinTarget::try_from(spec.stdin_target).ok() != Some(StdinTarget::None) {
                    tokio::spawn(forward_stdin(uri.clone(), s.jobid));
                }
            }
            Some(job_event::Event::Output(o)) => {
                if let Err(e) = out.write(o) {
                    if let (std::io::ErrorKind::BrokenPipe, Some(j)) = (e.kind(), jobid) {
                        forward_signal(&uri, j, libc::SIGTERM).await;
                    }
                }
            }
            Some(job_event::Event::Notice(n)) => eprintln!("prun: {}", n.text),
            Some(job_event::Event::Ended(e)) => {
                let _ = out.finish();
                if jobid.is_none() && !e.message.is_empty() {
                    // Refused before launch (mapping): the message is the reason.
                    eprintln!("prun: {}", e.message);
                }
                return Ok(e.exit_code);
            }
            None => {}
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
