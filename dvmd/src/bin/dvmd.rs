//! `dvmd`: start a DVM (as its head node, the HNP) or, with `--daemon`, run one of its daemons.

use std::io::{BufRead, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use dvm_grpcomm::Topology;
use dvm_proto::rml::Contact;
use dvm_rml::{DvmSecret, Rank, Transport, TransportConfig};
use dvmd::control::{self, ControlService};
use dvmd::daemon::{Daemon, Exit, Hnp, Input};
use dvmd::hostfile::{self, HostEntry};
use dvmd::launch::{self, Agent};
use dvmd::session::{self, DvmUri, Session};
use dvmd::slurm;
use tokio::sync::{mpsc, oneshot};

#[path = "dvmd/config.rs"]
mod config;
#[path = "dvmd/daemon_side.rs"]
mod daemon_side;
use config::*;
use daemon_side::*;

#[derive(Parser, Debug)]
#[command(name = "dvmd", about = "Start a distributed virtual machine (DVM) or one of its daemons")]
struct Args {
    /// Start N daemons on this machine, each on its own loopback address.
    #[arg(long, value_name = "N", conflicts_with_all = ["hostfile", "host"])]
    local: Option<u32>,
    /// Hostfile (Open MPI format: `name slots=N`); one daemon per host.
    #[arg(long, value_name = "FILE", conflicts_with = "host")]
    hostfile: Option<PathBuf>,
    /// Comma-separated hosts (`name[:slots]`); one daemon per host.
    #[arg(long, value_name = "LIST")]
    host: Option<String>,
    /// Command prefix that starts a daemon on a host; `{host}` is replaced by the host name.
    #[arg(long, default_value = "ssh", value_name = "PREFIX")]
    launch_agent: String,
    /// Routing tree radix (at least 2).
    #[arg(long, default_value_t = 64)]
    radix: u32,
    /// Write the DVM URI to FILE, or to stdout with `-`.
    #[arg(long, value_name = "FILE|-")]
    report_uri: Option<String>,
    /// Go to the background once the DVM is ready.
    #[arg(long)]
    daemonize: bool,
    /// Seconds for every daemon to start, check in and be wired up.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    startup_timeout: f64,
    /// Address the HNP listens on (default: loopback for --local, else the address that
    /// routes to the first host).
    #[arg(long, value_name = "IP")]
    bind_address: Option<IpAddr>,
    /// Slots per daemon for --local: a number, or `auto` for the node's cores (hwthreads with
    /// --use-hwthread-cpus).
    #[arg(long, default_value = "auto", value_parser = dvmd::hostfile::parse_slots)]
    slots: u32,
    /// A node's slots, when nothing gives their number, are its hardware threads, not its cores.
    #[arg(long)]
    use_hwthread_cpus: bool,
    /// Heartbeat period on idle links in milliseconds (0: off).
    #[arg(long, default_value_t = 1000)]
    heartbeat_ms: u64,
    /// When each daemon starts its PMIx server: `lazy` with the first job that reaches it (idle
    /// daemons stay small), `eager` right after boot (a job is coming; each daemon forks its
    /// worker process as it starts).
    #[arg(long, default_value = "lazy", value_parser = ["lazy", "eager"])]
    pmix_start: String,
    /// A daemon's PMIx server runs in a worker process; once the worker has grown by this many
    /// KiB (libpmix keeps something of every rank it served) it is replaced the next time no
    /// job uses it, which keeps a long-lived DVM's memory flat (0: after every job).
    #[arg(long, default_value_t = dvmd::pmix::DEFAULT_RECYCLE_KIB, value_name = "KIB")]
    pmix_recycle_kib: u64,
    /// Heartbeats missed before a silent peer is declared lost.
    #[arg(long, default_value_t = 5)]
    heartbeat_misses: u32,
    /// How ranks are scheduled against their daemon, so that the daemon goes first when they
    /// spin on every core: `group` (each job's procs in a cpu cgroup of their own under an idle
    /// group of the DVM's, so jobs also share the node equally; `idle` where the daemon cannot
    /// make cgroups), `idle` (SCHED_IDLE), `nice:N` (N nicer, 1-19) or `same` (as the daemon). A job may choose its own with `-x DVM_RANK_PRIORITY=...` (docs/liveness.md).
    #[arg(long, default_value_t = dvmd::odls::RankPriority::DEFAULT, value_name = "group|idle|nice:N|same")]
    rank_priority: dvmd::odls::RankPriority,
    /// The interface a job's ranks get when its prun does not say (`prun --mpi`): `both` (a
    /// PMIx server for Open MPI and a PMI-1/PMI-2 fd for the MPICH family; each MPI takes its
    /// own), `pmix`, `pmi1`, `pmi2` or `none`.
    #[arg(long, default_value = "both", value_parser = dvm_core::jobs::mpi::parse, value_name = "both|pmix|pmi1|pmi2|none")]
    mpi: dvm_proto::job::MpiInterface,
    /// Largest RML message in bytes.
    #[arg(long, default_value_t = 100 << 20)]
    max_message: usize,
    /// How daemon links protect each frame after the handshake: `aead` (AES-256-GCM: integrity,
    /// order and confidentiality), `mac` (a keyed BLAKE3 tag, contents in clear) or `none` (the
    /// handshake alone: a baseline for measurement on a trusted network). The same on every
    /// daemon.
    #[arg(long, default_value_t = dvm_rml::LinkSecurity::DEFAULT, value_name = "aead|mac|none")]
    link_security: dvm_rml::LinkSecurity,
    /// How fences move: `tree` (rollup and release), `allgather` (lateral exchange for every
    /// fence) or `auto` (barriers on the tree, collecting fences on the allgather). Every
    /// daemon gets the HNP's choice. (grpcomm's own `Config::default()` stays `tree`, the
    /// baseline its unit tests and the simulator's default campaigns pin.)
    #[arg(long, default_value = "auto", value_name = "auto|tree|allgather")]
    fence_movement: dvm_grpcomm::FenceMovementMode,
    /// How broadcasts of bulk-capable messages (job launch) move: `tree` (the whole payload
    /// to every child), `bulk` (scatter-allgather: chunks down the tree, then a lateral
    /// allgather) or `auto` (bulk when the link model below says it is cheaper). Tree changes,
    /// kills and shutdown always take the tree.
    #[arg(long, default_value = "auto", value_name = "auto|tree|bulk")]
    bcast_movement: dvm_grpcomm::BcastMovementMode,
    /// Link latency α for the broadcast choice, in microseconds. Without this and
    /// `--link-bandwidth-mbps`, the HNP measures its link to a child once the DVM is ready
    /// (and uses 50 µs and 1000 MB/s until then).
    #[arg(long, value_name = "US")]
    link_latency_us: Option<f64>,
    /// Per-daemon link bandwidth for the broadcast choice, in MB/s (1 MB/s = 10^6 bytes/s).
    #[arg(long, value_name = "MBPS")]
    link_bandwidth_mbps: Option<f64>,
    /// Do not measure the link once the DVM is ready (prun's one-shot DVMs: their job comes at
    /// once, and the probe's traffic would share its links).
    #[arg(long)]
    no_link_probe: bool,

    // Internal: run as daemon `rank` of an existing DVM (the HNP passes these).
    #[arg(long, hide = true)]
    daemon: bool,
    #[arg(long, hide = true)]
    rank: Option<Rank>,
    #[arg(long, hide = true)]
    size: Option<u32>,
    #[arg(long, hide = true)]
    hnp: Option<SocketAddr>,
    #[arg(long, hide = true)]
    bind: Option<IpAddr>,
    #[arg(long, hide = true)]
    host_label: Option<String>,
    #[arg(long, hide = true)]
    daemonized_child: bool,
    /// Started by the HNP's `srun` step: the rank is 1 + `SLURM_NODEID`, the slots this
    /// list's entry for that node (`4(x3),2`), the host Slurm's name for the node.
    #[arg(long, hide = true, value_name = "COUNTS")]
    slurm_step_slots: Option<String>,
    /// A one-shot DVM that belongs to the `prun` that started it: no `uri` file in the session
    /// directory, so no other `prun`, `pterm` or `dvm-bench` discovers it.
    #[arg(long, hide = true)]
    private: bool,
    /// A one-shot DVM for one job: it terminates itself once that job has ended (or was
    /// refused), so its `prun` waits for it to end instead of asking.
    #[arg(long, hide = true)]
    one_job: bool,
}

/// SIGINT and SIGTERM, held from the first instruction of `main` until the HNP's handlers
/// exist, so a signal in the first milliseconds is handled (the boot abandoned in order, the
/// session removed) instead of killing the HNP with its session directory left behind.
fn term_signals() -> nix::sys::signal::SigSet {
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGINT);
    set.add(nix::sys::signal::Signal::SIGTERM);
    set
}

fn unblock_term_signals() {
    let _ = term_signals().thread_unblock();
}

fn main() -> ExitCode {
    let _ = term_signals().thread_block();
    // A daemon's PMIx worker (started by the daemon, never by hand): nothing else of dvmd.
    let mut argv = std::env::args();
    if let (Some(_), Some(mode), Some(fds), None) = (argv.next(), argv.next(), argv.next(), argv.next()) {
        if mode == "--pmix-worker" {
            dvmd::init_logging();
            let Some((cmd, ev)) = dvmd::pmix::worker::parse_fds(&fds) else {
                dvmd::say!("dvmd --pmix-worker: '{fds}' is not CMD_FD,EVENT_FD (this mode is started by a daemon)");
                return ExitCode::from(2);
            };
            return ExitCode::from(dvmd::pmix::worker::run(cmd, ev));
        }
    }
    dvmd::init_logging();
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(1) } else { ExitCode::SUCCESS };
        }
    };
    if let Some((rank, slots, _)) = args.daemon.then(|| daemon_identity(&args).ok()).flatten() {
        if eager_pmix(&args, slots) {
            // Its first PMIx worker, forked while this process has one thread and SIGINT/SIGTERM
            // blocked (a failure only means the worker is started by exec later).
            if let Err(e) = dvmd::pmix::prefork() {
                tracing::warn!("daemon {rank}: cannot fork its PMIx worker ahead ({e}); it starts one by exec");
            }
        }
    }
    if args.daemon || (args.daemonize && !args.daemonized_child) {
        // Daemons keep the default actions; so does the parent that only waits for a
        // daemonized HNP to be ready.
        unblock_term_signals();
    }
    if args.daemonize && !args.daemonized_child {
        return match daemonize() {
            Ok(code) => code,
            Err(e) => {
                dvmd::say!("dvmd: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    // Two workers: a PMIx call that blocks the actor for a moment never stalls the transport's
    // heartbeats (a stalled daemon looks dead to its neighbours).
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
    let result = if args.daemon { rt.block_on(run_daemon(args)) } else { rt.block_on(run_hnp(args)) };
    // A worker forked ahead for a daemon that failed before needing it.
    dvmd::pmix::discard_preforked();
    match result {
        Ok(code) => code,
        Err(e) => {
            dvmd::say!("dvmd: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Re-run ourselves in a new session; return once the child says `DVM ready`.
fn daemonize() -> Result<ExitCode> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("cannot find the dvmd executable")?;
    let mut argv: Vec<String> = std::env::args().skip(1).filter(|a| a != "--daemonize").collect();
    argv.push("--daemonized-child".into());
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&argv).stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped());
    // SAFETY: setsid is async-signal-safe; called between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the background dvmd")?;
    let out = child.stdout.take().expect("piped");
    let mut stdout = std::io::stdout();
    for line in std::io::BufReader::new(out).lines() {
        let line = line.unwrap_or_default();
        writeln!(stdout, "{line}")?;
        stdout.flush()?;
        if line == "DVM ready" {
            return Ok(ExitCode::SUCCESS);
        }
    }
    let status = child.wait()?;
    Ok(ExitCode::from(status.code().unwrap_or(1).clamp(1, 255) as u8))
}

async fn run_hnp(args: Args) -> Result<ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};
    // The handlers first, then the signals held since `main` are let through to them.
    let signals = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()));
    unblock_term_signals();
    validate_common(&args)?;
    // Nodes: rank 0 is this machine; then one daemon per host (or N-1 more local ones), from
    // --local, --hostfile, --host, or else the Slurm allocation this runs in.
    let me =
        || nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "localhost".into());
    let mut slurm_job = None;
    let nodes: Vec<HostEntry> = match (&args.local, &args.hostfile, &args.host) {
        (Some(0), _, _) => bail!("--local 0: a DVM needs at least one daemon"),
        // Every local daemon gets its own name, so messages say which one.
        (Some(n), _, _) => (0..*n).map(|r| HostEntry { name: format!("{}-{r}", me()), slots: args.slots }).collect(),
        (None, Some(f), _) => [vec![HostEntry { name: me(), slots: 0 }], hostfile::read(f)?].concat(),
        (None, None, Some(h)) => [vec![HostEntry { name: me(), slots: 0 }], hostfile::parse_host_list(h)?].concat(),
        (None, None, None) => match slurm::allocation(|v| std::env::var(v).ok())? {
            Some(alloc) => {
                let (own, rest) = slurm::split_for_hnp(&alloc, &slurm::own_node_name());
                tracing::info!(job = %alloc.job_id, nodes = alloc.nodes.len(), hnp = %own.name, "Slurm allocation");
                slurm_job = Some(alloc.job_id);
                [vec![own], rest].concat()
            }
            None => bail!("say where to run: --local N, --hostfile FILE or --host a,b,c (or run inside a Slurm job)"),
        },
    };
    let local = args.local.is_some();
    let size = nodes.len() as u32;
    let topo = Topology::new(0, args.radix, size).map_err(|e| anyhow!("--radix {}: {e}", args.radix))?;
    let agent = match (local, &slurm_job) {
        (true, _) => Agent::Local,
        (false, Some(_)) => Agent::Srun,
        (false, None) => Agent::Prefix(args.launch_agent.clone()),
    };

    let hnp_ip: IpAddr = match (args.bind_address, local) {
        (Some(ip), _) => ip,
        (None, true) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        // A one-node Slurm allocation: the HNP is the whole DVM.
        (None, false) if size == 1 => IpAddr::V4(Ipv4Addr::LOCALHOST),
        (None, false) => {
            let first = &nodes[1].name;
            let resolved = std::net::ToSocketAddrs::to_socket_addrs(&(first.as_str(), 1))
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| {
                    anyhow!("cannot resolve host '{first}' to choose the HNP address; pass --bind-address IP")
                })?;
            launch::source_addr_toward(resolved)
                .ok_or_else(|| anyhow!("no route to host '{first}' ({resolved}); pass --bind-address IP"))?
        }
    };

    session::sweep_stale();
    let mut session = Session::create("dvm")?;
    let secret = DvmSecret::generate();
    secret.write_file(&session.secret_path()).context("cannot store the DVM secret")?;
    if args.daemonized_child {
        redirect_stderr(&session.dir().join("dvmd.log"));
    }

    let epoch = dvmd::daemon::new_epoch();
    let mut cfg = transport_config(&args, 0, epoch, SocketAddr::new(hnp_ip, 0), secret.clone());
    cfg.dial_via = dial_via_from_env()?;
    let (transport, events) =
        Transport::bind(cfg).await.with_context(|| format!("cannot start the HNP listener on {hnp_ip}"))?;
    let hnp_addr = transport.local_addr();
    let control_listener = tokio::net::TcpListener::bind(control::control_bind(hnp_addr, local))
        .await
        .context("cannot bind the control API listener")?;
    let uri = DvmUri { control: control_listener.local_addr()?, session: session.dir().to_path_buf() };

    let hw = dvmd::hwtopo::discover();
    let own_slots = dvmd::hostfile::resolve_slots(nodes[0].slots, hw.as_ref(), args.use_hwthread_cpus);
    let own = Contact {
        rank: 0,
        host: nodes[0].name.clone(),
        addr: hnp_addr.to_string(),
        pid: std::process::id(),
        slots: own_slots,
        epoch,
        topo: hw.as_ref().map(|t| t.to_wire()),
    };
    let mut hnp = Hnp::new(own, session.dir().display().to_string());
    hnp.one_job = args.one_job;
    let (ready_tx, ready_rx) = oneshot::channel();
    hnp.ready = Some(ready_tx);

    // Launch the other daemons.
    let (exit_tx, mut exit_rx) = mpsc::unbounded_channel();
    let exe = std::env::current_exe().context("cannot find the dvmd executable")?.display().to_string();
    let wrong_secret_rank: Option<Rank> =
        std::env::var("DVMD_FAULT_WRONG_SECRET_RANK").ok().and_then(|v| v.parse().ok());
    // Test hook: this daemon runs the other fence movement (a forced mismatch must fail
    // fences by name on every participant, never hang them).
    let other_movement_rank: Option<Rank> =
        std::env::var("DVMD_FAULT_OTHER_FENCE_MOVEMENT_RANK").ok().and_then(|v| v.parse().ok());
    let mut common = vec![
        "--daemon".to_string(),
        format!("--size={size}"),
        format!("--radix={}", args.radix),
        format!("--hnp={hnp_addr}"),
        format!("--heartbeat-ms={}", args.heartbeat_ms),
        format!("--heartbeat-misses={}", args.heartbeat_misses),
        format!("--rank-priority={}", args.rank_priority),
        format!("--mpi={}", dvm_core::jobs::mpi::name_of(args.mpi)),
        format!("--pmix-start={}", args.pmix_start),
        format!("--pmix-recycle-kib={}", args.pmix_recycle_kib),
        format!("--max-message={}", args.max_message),
        format!("--link-security={}", args.link_security),
        format!("--bcast-movement={}", args.bcast_movement),
    ];
    if args.use_hwthread_cpus {
        common.push("--use-hwthread-cpus".into());
    }
    common.extend(args.link_latency_us.map(|us| format!("--link-latency-us={us}")));
    common.extend(args.link_bandwidth_mbps.map(|m| format!("--link-bandwidth-mbps={m}")));
    let mut pids = Vec::new();
    if matches!(agent, Agent::Srun) && size > 1 {
        // One step for every daemon but the HNP; each takes its rank from SLURM_NODEID.
        let rest = &nodes[1..];
        let slots: Vec<u32> = rest.iter().map(|h| h.slots).collect();
        let dargs = [
            common.clone(),
            vec![
                format!("--slurm-step-slots={}", slurm::format_counts(&slots)),
                format!("--fence-movement={}", args.fence_movement),
            ],
        ]
        .concat();
        let argv = slurm::srun_argv(rest, &exe, &dargs);
        let what = format!("srun (the step starting daemons 1-{} on {} node(s))", size - 1, rest.len());
        match launch::spawn_daemon(launch::Started::Step, "srun", argv, secret.to_hex(), exit_tx.clone()).await {
            Ok(l) => {
                pids.extend(l.pid);
                for (r, node) in rest.iter().enumerate() {
                    hnp.launched_hosts.insert(r as Rank + 1, (node.name.clone(), l.output.clone()));
                }
                hnp.launch_step = Some((what, l.output));
            }
            Err(e) => {
                session.remove();
                return Err(e);
            }
        }
    }
    for (r, node) in nodes.iter().enumerate().skip(1).filter(|_| !matches!(agent, Agent::Srun)) {
        let r = r as Rank;
        let bind = if local { IpAddr::V4(launch::local_addr(r)) } else { IpAddr::V4(Ipv4Addr::UNSPECIFIED) };
        let dargs = [
            common.clone(),
            vec![
                format!("--rank={r}"),
                format!("--bind={bind}"),
                format!("--host-label={}", node.name),
                format!("--slots={}", dvmd::hostfile::slots_arg(node.slots)),
                format!("--fence-movement={}", other_movement(args.fence_movement, other_movement_rank == Some(r))),
            ],
        ]
        .concat();
        let argv = agent.argv(&node.name, &exe, &dargs)?;
        let secret_hex = if wrong_secret_rank == Some(r) { DvmSecret::generate().to_hex() } else { secret.to_hex() };
        match launch::spawn_daemon(launch::Started::Daemon(r), &node.name, argv, secret_hex, exit_tx.clone()).await {
            Ok(l) => {
                pids.extend(l.pid);
                hnp.launched_hosts.insert(r, (l.host, l.output));
            }
            Err(e) => {
                pids.iter().for_each(|&p| launch::kill(p));
                session.remove();
                return Err(e);
            }
        }
    }
    drop(exit_tx);

    let (ctl_tx, ctl_rx) = mpsc::channel(64);
    // SIGINT/SIGTERM on the HNP: an orderly termination, like pterm.
    let sig_tx = ctl_tx.clone();
    tokio::spawn(async move {
        let (Ok(mut int), Ok(mut term)) = signals else {
            return;
        };
        // Every signal asks again (the handlers stay installed, so none may be swallowed); the
        // HNP terminates in order, or abandons a boot that is not ready yet.
        loop {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            let (tx, _rx) = oneshot::channel();
            if sig_tx.send(dvmd::control::ControlCmd::Terminate(tx)).await.is_err() {
                return;
            }
        }
    });
    let (in_tx, in_rx) = mpsc::unbounded_channel();
    let fwd = in_tx.clone();
    tokio::spawn(async move {
        while let Some((rank, how)) = exit_rx.recv().await {
            let _ = fwd.send(Input::ChildExited(rank, how));
        }
    });
    // The boot's deadline is one of the HNP's timers.
    hnp.startup_timeout = Some(Duration::from_secs_f64(args.startup_timeout));
    // A daemon lost while TERMINATE travels is noticed within the transport's loss bound, and
    // nothing is repaired any more: give it a few bounds, then end regardless.
    let bound = Duration::from_millis(args.heartbeat_ms) * args.heartbeat_misses.max(1);
    hnp.terminate_deadline = Duration::from_secs(2) + 3 * bound;

    let mut daemon =
        Daemon::with_grpcomm(0, nodes[0].name.clone(), topo, transport, epoch, Some(hnp), grpcomm_config(&args));
    daemon.set_hardware(hw);
    if args.link_latency_us.is_none() && args.link_bandwidth_mbps.is_none() && !args.no_link_probe {
        daemon.measure_link();
    }
    start_pmix(&mut daemon, session.dir(), &args, nodes[0].slots, hnp_addr);
    if size == 1 {
        // A one-daemon DVM is wired up at once.
        daemon.wire_single();
    }
    let actor = tokio::spawn(async move {
        let exit = daemon.run(events, ctl_rx, in_rx).await;
        (exit, daemon)
    });

    // Serve the control API.
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(control::serve(control_listener, ControlService::new(secret.clone(), ctl_tx), async {
        let _ = stop_rx.await;
    }));

    let mut actor = actor;
    let ready = tokio::select! {
        r = ready_rx => r.is_ok(),
        res = &mut actor => {
            // Ended before ready.
            let (exit, daemon) = res.context("HNP actor panicked")?;
            let _ = stop_tx.send(());
            let _ = server.await;
            shutdown(daemon, &pids).await;
            session.remove();
            session::sweep_stale();
            return Ok(match exit {
                Exit::BootFailed(msg) | Exit::LostHnp(msg) | Exit::Evicted(msg) => {
                    dvmd::say!("dvmd: {msg}");
                    ExitCode::from(1)
                }
                Exit::Terminated => ExitCode::SUCCESS,
            });
        }
    };
    if ready {
        if !args.private {
            session::write_private(&session.uri_path(), &format!("{uri}\n"))?;
        }
        match args.report_uri.as_deref() {
            Some("-") => println!("{uri}"),
            Some(f) => session::write_private(std::path::Path::new(f), &format!("{uri}\n"))
                .with_context(|| format!("--report-uri {f}"))?,
            None => {}
        }
        println!("DVM ready");
        let _ = std::io::stdout().flush();
    }
    let (exit, daemon) = actor.await.context("HNP actor panicked")?;
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    shutdown(daemon, &pids).await;
    session.remove();
    session::sweep_stale();
    Ok(match exit {
        Exit::Terminated => ExitCode::SUCCESS,
        Exit::BootFailed(msg) | Exit::LostHnp(msg) | Exit::Evicted(msg) => {
            dvmd::say!("dvmd: {msg}");
            ExitCode::from(1)
        }
    })
}

/// Close every connection, give local daemons a moment to notice, then kill what is left and
/// wait (briefly) until it is gone, so the caller's sweep removes the session directories a
/// killed daemon could not.
async fn shutdown(daemon: Daemon, pids: &[u32]) {
    let t = daemon.into_transport();
    t.shutdown().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut killed = false;
    loop {
        let alive: Vec<u32> = pids.iter().copied().filter(|&p| !dvmd::session::process_gone(p)).collect();
        if alive.is_empty() {
            return;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline && !killed {
            alive.iter().for_each(|&p| launch::kill(p));
            killed = true;
        } else if now >= deadline + Duration::from_secs(2) {
            return;
        }
        // A one-shot prun waits for this: its srun step (or launch agents) ending is noticed
        // within a millisecond.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
