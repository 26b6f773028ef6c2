//! One job on a DVM: submitting it, printing its output stream, forwarding stdin and signals,
//! and turning its end into prun's exit status.
//!
//! Never boots or stops a DVM. Do not break: output lines are written in the order the DVM
//! sends them, a closed stdout ends the job with [`CLOSED_STDOUT`], and a broken event stream
//! is reported as the DVM lost (`Head::lost`), never as the job's failure.

use std::collections::HashMap;
use std::io::Write;

use anyhow::Result;
use dvm_proto::control::{job_event, JobOutput, StdinMsg};
use dvm_proto::job::StdinTarget;
use dvmd::control::Client;
use dvmd::prun_cli::PrunCommand;
use dvmd::session::DvmUri;
use tokio::io::AsyncReadExt;

use super::files::RankFiles;
use super::head::Head;
use super::signals::{ends_job, Signals};

/// Exit status when prun's stdout was closed (a reader such as `head` went away), as for any
/// filter killed by SIGPIPE.
pub(super) const CLOSED_STDOUT: i32 = 128 + libc::SIGPIPE;

/// Writes job output: raw, or per line tagged `[job,rank]<stream>: line` and/or stamped
/// `[2026-12-06T00:36:06.123456Z] line` (when the rank's daemon read it). Once prun's stdout is
/// closed, what would go there is dropped; errors on stderr are ignored.
pub(super) struct Output {
    pub(super) jobid: u32,
    pub(super) tag: bool,
    pub(super) merge: bool,
    /// A line not ended yet, and when its first bytes were read.
    pub(super) partial: HashMap<(u32, u32, u32), (Vec<u8>, u64)>,
    pub(super) stdout_closed: bool,
    /// Each rank's output in its own files; `copy`: on the terminal too.
    pub(super) files: Option<(RankFiles, bool)>,
}

/// `2026-12-06T00:36:06.123456Z`: a time in µs since 1970 as UTC (ISO 8601).
pub(super) fn utc_text(us: u64) -> String {
    let (secs, frac) = (us / 1_000_000, us % 1_000_000);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rem / 3600, rem / 60 % 60, rem % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{frac:06}Z")
}

impl Output {
    /// Write one chunk; true when this write found stdout closed.
    pub(super) fn write(&mut self, o: JobOutput) -> bool {
        let to = if self.merge { 1 } else { o.stream };
        if let Some((files, copy)) = self.files.as_mut() {
            let job = if o.jobid != 0 { o.jobid } else { self.jobid };
            if files.write(job, o.rank, to, &o.data) && !*copy {
                return false;
            }
        }
        if !self.tag && o.read_at_us == 0 {
            return self.put(to, &o.data);
        }
        let job = if o.jobid != 0 { o.jobid } else { self.jobid };
        let (buf, at) = self.partial.entry((job, o.rank, o.stream)).or_insert_with(|| (Vec::new(), o.read_at_us));
        if buf.is_empty() {
            *at = o.read_at_us;
        }
        buf.extend_from_slice(&o.data);
        let mut lines = Vec::new();
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            lines.push((buf.drain(..=nl).collect::<Vec<u8>>(), *at));
            // The next line starts in this chunk.
            *at = o.read_at_us;
        }
        let mut closed = false;
        for (l, at) in lines {
            closed |= self.emit(job, o.rank, o.stream, to, &l, at);
        }
        closed
    }

    /// One line, stamped with `at` (µs since 1970; 0: none) and tagged when asked.
    pub(super) fn emit(&mut self, job: u32, rank: u32, from: u32, to: u32, line: &[u8], at: u64) -> bool {
        let name = if from == 2 { "stderr" } else { "stdout" };
        let mut text = if at > 0 { format!("[{}] ", utc_text(at)).into_bytes() } else { Vec::new() };
        if self.tag {
            text.extend_from_slice(format!("[{job},{rank}]<{name}>: ").as_bytes());
        }
        text.extend_from_slice(line);
        if !text.ends_with(b"\n") {
            text.push(b'\n');
        }
        self.put(to, &text)
    }

    /// Write to stream `to` (2: stderr, else stdout); true when this write found stdout closed.
    pub(super) fn put(&mut self, to: u32, data: &[u8]) -> bool {
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

    pub(super) fn finish(&mut self) {
        let rest: Vec<_> = self.partial.drain().filter(|(_, (b, _))| !b.is_empty()).collect();
        for ((job, rank, from), (line, at)) in rest {
            let to = if self.merge { 1 } else { from };
            self.emit(job, rank, from, to, &line, at);
        }
    }
}

/// How a job ended for prun.
pub(super) struct JobResult {
    /// prun's exit status.
    pub(super) code: i32,
    /// prun stops waiting (a second SIGINT/SIGTERM): a one-shot DVM is killed, not stopped.
    pub(super) abandon: bool,
}

pub(super) async fn run_job(
    cmd: &PrunCommand,
    head: &Head,
    signals: &mut Signals,
    mut pending: Vec<i32>,
) -> Result<JobResult> {
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
    let mut spec = spec;
    spec.uid = dvmd::control::uid();
    if spec.array.is_some() || spec.detach || stdin_is_dev_null() {
        // An array: which element would read it? None does. Detached: prun is gone before it
        // could forward anything (the procs read /dev/null, as under sbatch or flux submit).
        // /dev/null: the procs get their own, and prun opens no second connection for it.
        spec.stdin_target = StdinTarget::None as i32;
    }
    let mut events = match cmd.attach {
        Some(id) => client.attach(id).await?,
        None => client.launch(spec.clone()).await?,
    };
    let array = spec.array.is_some();
    let t0 = std::time::Instant::now();
    let mut queued_at: Option<std::time::Instant> = None;
    let mut elements = (0u64, 0u64);
    // Its end's sentence is prun's to print when the job never started (refused, or queued
    // and then cancelled); otherwise the DVM's notices said it already.
    let mut started = cmd.attach.is_some();
    let mut out = Output {
        jobid: 0,
        tag: spec.tag_output,
        merge: spec.merge_stderr,
        partial: HashMap::new(),
        stdout_closed: false,
        files: match (&cmd.output_dir, &cmd.output_file) {
            (Some((dir, nocopy)), _) => Some((RankFiles::new(dir.clone()), !nocopy)),
            (None, Some((prefix, nocopy))) => Some((RankFiles::with_prefix(prefix.clone()), !nocopy)),
            (None, None) => None,
        },
    };
    let mut jobid = cmd.attach;
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
            // The DVM's refusal to attach is a sentence, not a lost DVM.
            Err(status) if cmd.attach.is_some() && status.code() == tonic::Code::Unavailable && head.alive() => {
                anyhow::bail!("--attach: {}", status.message())
            }
            Err(status) => return Err(head.lost(status.message()).await.into()),
        };
        match ev.event {
            Some(job_event::Event::Queued(q)) => {
                if spec.detach {
                    eprintln!("prun: job {} queued (position {}): {}", q.jobid, q.position, q.reason);
                    return Ok(detached(&mut out, uri, q.jobid, &mut pending, interrupted).await);
                }
                jobid = Some(q.jobid);
                out.jobid = q.jobid;
                queued_at.get_or_insert_with(std::time::Instant::now);
                // A signal that came before the job had an id ends it in the queue.
                for sig in pending.drain(..) {
                    forward_signal(uri, q.jobid, sig).await;
                }
                eprintln!("prun: job {} queued (position {}): {}", q.jobid, q.position, q.reason);
            }
            Some(job_event::Event::Started(s)) if array => {
                jobid.get_or_insert(s.array);
                if let Some(at) = queued_at.take() {
                    eprintln!("prun: array {} started after {:.1} s in the queue", s.array, at.elapsed().as_secs_f64());
                }
            }
            Some(job_event::Event::Started(s)) if spec.detach => {
                return Ok(detached(&mut out, uri, s.jobid, &mut pending, interrupted).await);
            }
            Some(job_event::Event::Ended(e)) if e.element => {
                elements.0 += 1;
                if e.exit_code != 0 {
                    elements.1 += 1;
                    // Quiet once stdout is closed: the array ends because prun's reader went away.
                    if !out.stdout_closed {
                        eprintln!("prun: job {} (array index {}): {}", e.jobid, e.index, e.message);
                    }
                }
            }
            Some(job_event::Event::Started(s)) => {
                started = true;
                if let Some(at) = queued_at.take() {
                    eprintln!("prun: job {} started after {:.1} s in the queue", s.jobid, at.elapsed().as_secs_f64());
                }
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
            // Quiet once stdout is closed: the job ends because prun's reader went away. Every
            // line of a notice (a map, a node's bindings) carries the prefix, for grep.
            Some(job_event::Event::Notice(n)) if !out.stdout_closed => {
                let text: String = n.text.lines().map(|l| format!("prun: {l}\n")).collect();
                eprint!("{text}");
            }
            Some(job_event::Event::Ended(e)) => {
                out.finish();
                if out.stdout_closed {
                    // Ended because prun's reader went away: nothing more to say.
                } else if let (true, Some(a)) = (elements.0 > 0, spec.array.as_ref()) {
                    // The summary, then the array's own sentence (its first failure, or why
                    // the rest never ran: cancelled, terminated, no longer fits).
                    let secs = t0.elapsed().as_secs_f64();
                    let rate = elements.0 as f64 / secs.max(1e-9);
                    let (n, failed) = elements;
                    let total = u64::from(a.last - a.first) + 1;
                    eprintln!(
                        "prun: array {}: {n} of {total} jobs ran, {failed} failed, in {secs:.2} s ({rate:.0} jobs/s)",
                        e.jobid
                    );
                    if !e.message.is_empty() {
                        eprintln!("prun: {}", e.message);
                    }
                } else if !started && !e.message.is_empty() {
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

/// A detached job has its id: prun prints it and returns. A SIGINT/SIGTERM that reached prun
/// before (a Ctrl-C in its first milliseconds) ends the job instead, as for an attached one.
async fn detached(out: &mut Output, uri: &DvmUri, jobid: u32, pending: &mut Vec<i32>, first: Option<i32>) -> JobResult {
    let signals = std::mem::take(pending);
    for &sig in &signals {
        forward_signal(uri, jobid, sig).await;
    }
    match first.or(signals.into_iter().find(|&s| ends_job(s))) {
        Some(sig) => JobResult { code: 128 + sig, abandon: false },
        None => {
            out.put(1, format!("{jobid}\n").as_bytes());
            JobResult { code: 0, abandon: false }
        }
    }
}

/// prun's stdin is /dev/null (a script's `< /dev/null`, a service, a background job).
fn stdin_is_dev_null() -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(null), Ok(stdin)) =
        (std::fs::metadata("/dev/null"), std::fs::File::open("/proc/self/fd/0").and_then(|f| f.metadata()))
    else {
        return false;
    };
    null.rdev() == stdin.rdev() && null.dev() == stdin.dev() && null.ino() == stdin.ino()
}

pub(super) async fn forward_signal(uri: &DvmUri, jobid: u32, sig: i32) {
    match Client::connect(uri.clone()).await {
        Ok(mut c) => {
            if let Err(e) = c.signal(jobid, sig).await {
                eprintln!("prun: cannot forward signal {sig}: {e:#}");
            }
        }
        Err(e) => eprintln!("prun: cannot forward signal {sig}: {e:#}"),
    }
}

pub(super) async fn forward_stdin(uri: DvmUri, jobid: u32) {
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

#[cfg(test)]
mod tests {
    use super::utc_text;

    #[test]
    fn times_read_as_utc() {
        assert_eq!(utc_text(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(utc_text(1_700_000_000_123_456), "2023-11-14T22:13:20.123456Z");
        assert_eq!(utc_text(951_782_400_000_001), "2000-02-29T00:00:00.000001Z");
    }
}
