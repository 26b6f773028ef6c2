//! A daemon other than the HNP: its identity from the command line (or the Slurm step), its
//! secret on stdin, its transport, check-in and run until the DVM ends for it.
//!
//! Never: decides anything about the DVM (the node does); leaves a worker or a session dir
//! behind on an early exit.

use super::*;

/// How long a daemon waits for the DVM secret its HNP writes to its stdin.
const SECRET_WAIT: Duration = Duration::from_secs(10);

pub(super) fn redirect_stderr(path: &std::path::Path) {
    use std::os::fd::AsRawFd;
    if let Ok(f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        // SAFETY: dup2 onto fd 2 of this process; both descriptors are valid.
        unsafe {
            libc::dup2(f.as_raw_fd(), 2);
        }
    }
}

/// A daemon's (`--daemon`) rank, slots and, under Slurm, its node's name: from its srun step
/// or from the arguments the HNP passed.
pub(super) fn daemon_identity(args: &Args) -> Result<(Rank, u32, Option<String>)> {
    match (&args.slurm_step_slots, args.rank) {
        (Some(list), _) => {
            let (rank, slots) = slurm::step_rank_and_slots(list).map_err(|e| anyhow!("dvmd --daemon: {e}"))?;
            Ok((rank, slots, Some(slurm::own_node_name())))
        }
        (None, Some(rank)) => Ok((rank, args.slots, None)),
        (None, None) => bail!("--daemon needs --rank, --size and --hnp (it is started by the HNP, not by hand)"),
    }
}

/// Ends the PMIx worker forked ahead, if no daemon took it, when dropped.
pub(super) struct PreforkedWorkerFirst;

impl Drop for PreforkedWorkerFirst {
    fn drop(&mut self) {
        dvmd::pmix::discard_preforked();
    }
}

pub(super) async fn run_daemon(args: Args) -> Result<ExitCode> {
    let (rank, slots, slurm_name) = daemon_identity(&args)?;
    let (Some(size), Some(hnp)) = (args.size, args.hnp) else {
        bail!("--daemon needs --rank, --size and --hnp (it is started by the HNP, not by hand)");
    };
    // The HNP writes the secret right after starting this process, but an srun step passes its
    // stdin on only once every task has started: the read waits in a thread while this daemon
    // prepares what needs no secret (its session directory, its PMIx server).
    let env_secret = std::env::var("DVM_SECRET").ok();
    let secret_line = env_secret.is_none().then(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = tx.send(std::io::stdin().read_line(&mut line).map(|_| line));
        });
        rx
    });
    let host =
        args.host_label.clone().or(slurm_name).unwrap_or_else(|| {
            nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default()
        });
    let mut session = Session::create(&format!("dvmd-r{rank}"))?;
    // Declared after the session, so dropped before it on every early return: a worker
    // started ahead (writing into the session) ends before its directory is removed.
    let _worker_first = PreforkedWorkerFirst;
    if eager_pmix(&args, slots) {
        dvmd::pmix::start_preforked(&pmix_settings(session.dir(), &args), &host);
    }
    let secret = match secret_line {
        None => DvmSecret::from_hex(env_secret.as_deref().unwrap_or_default()).context("DVM_SECRET"),
        // If the secret is not there in time the HNP died before writing it, and this daemon
        // must not linger (its stdin may never see end-of-file).
        Some(rx) => match rx.recv_timeout(SECRET_WAIT) {
            Ok(Ok(l)) if l.is_empty() => {
                Err(anyhow!("stdin closed before the DVM secret came: the HNP that started this daemon is gone"))
            }
            Ok(r) => r
                .context("cannot read the DVM secret from stdin")
                .and_then(|l| DvmSecret::from_hex(l.trim()).context("the DVM secret on stdin")),
            Err(_) => {
                Err(anyhow!("no DVM secret on stdin within {SECRET_WAIT:?}: the HNP that started this daemon is gone"))
            }
        },
    };
    let secret = secret.with_context(|| format!("daemon {rank} on host {host}"))?;
    let topo = Topology::new(rank, args.radix, size).map_err(|e| anyhow!("--radix {}: {e}", args.radix))?;
    let bind = args.bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let advertised = if bind.is_unspecified() {
        launch::source_addr_toward(hnp).ok_or_else(|| anyhow!("no route to the HNP at {hnp}"))?
    } else {
        bind
    };
    let epoch = dvmd::daemon::new_epoch();
    let (transport, events) = Transport::bind(transport_config(&args, rank, epoch, SocketAddr::new(bind, 0), secret))
        .await
        .with_context(|| format!("daemon {rank} on host {host}: cannot listen on {bind}"))?;
    let addr = SocketAddr::new(advertised, transport.local_addr().port());
    transport.set_contact(0, hnp);
    let mut daemon = Daemon::with_grpcomm(rank, host.clone(), topo, transport, epoch, None, grpcomm_config(&args));
    // Check in at once; the PMIx server starts with the first job that reaches this daemon.
    let hw = dvmd::hwtopo::discover();
    daemon.check_in(Contact {
        rank,
        host: host.clone(),
        addr: addr.to_string(),
        pid: std::process::id(),
        slots: dvmd::hostfile::resolve_slots(slots, hw.as_ref(), args.use_hwthread_cpus),
        epoch,
        topo: hw.as_ref().map(|t| t.to_wire()),
    });
    daemon.set_hardware(hw);
    start_pmix(&mut daemon, session.dir(), &args, slots, hnp);
    let (_ctl_tx, ctl_rx) = mpsc::channel(1);
    let (_in_tx, in_rx) = mpsc::unbounded_channel();
    let exit = daemon.run(events, ctl_rx, in_rx).await;
    daemon.into_transport().shutdown().await;
    session.remove();
    Ok(match exit {
        Exit::Terminated => ExitCode::SUCCESS,
        Exit::LostHnp(msg) | Exit::BootFailed(msg) | Exit::Evicted(msg) => {
            dvmd::say!("dvmd: daemon {rank} on host {host}: {msg}");
            ExitCode::from(1)
        }
    })
}
