//! Starting one proc: resolve the executable, check the working directory, and start the
//! child (vfork-style) in its own process group with PDEATHSIG set and every inherited fd >= 3
//! closed.
//! Every failure is returned as the tail of a one-sentence reason ("executable './a.out' not
//! found"); the caller prefixes node, job and rank.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::unistd::{access, AccessFlags};

use super::priority::ChildPriority;
use super::{ProcSpec, TIMER_SLACK_VAR};

/// What `execvp` searches when the proc's environment has no PATH (glibc's default).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// A started child: its pid (also its process group id) and our ends of its pipes (and of
/// its PMI connection).
pub(super) struct Launched {
    pub pid: i32,
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub pmi: Option<std::os::unix::net::UnixStream>,
}

/// Start `spec` or say why not. Returns once the child has exec'd, so exec and chdir failures
/// are reported here, never as an exit status.
///
/// The child is started with `clone(CLONE_VM | CLONE_VFORK)`, as glibc's `posix_spawn` does:
/// it runs on its own stack in the daemon's memory until it execs, so starting a proc costs
/// neither a copy of the daemon's page tables nor the copy-on-write faults a fork leaves the
/// daemon with afterwards. (`posix_spawn` itself cannot set `PR_SET_PDEATHSIG`.)
pub(super) fn launch(spec: &ProcSpec, priority: ChildPriority) -> Result<Launched, String> {
    let argv0 = spec.argv.first().filter(|a| !a.is_empty()).ok_or("the command line is empty")?;
    let wdir = checked_wdir(&spec.wdir)?;
    let program = resolve(argv0, &spec.env, &wdir)?;
    let slack_us = timer_slack_us(spec)?;
    let image = Image::new(spec, &program, &wdir)?;
    let pipe = |what: &str| {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("cannot create the {what} pipe: {e}"))
    };
    let (stdin_child, stdin_ours) = if spec.stdin {
        let (r, w) = pipe("stdin")?;
        (r, Some(w))
    } else {
        let null = std::fs::File::open("/dev/null").map_err(|e| format!("cannot open /dev/null: {e}"))?;
        (OwnedFd::from(null), None)
    };
    let (stdout, stdout_child) = pipe("stdout")?;
    let (stderr, stderr_child) = pipe("stderr")?;
    // The PMI connection: a socket pair, the child's end at `pmi_fd` in the child.
    let (pmi_ours, pmi_child) = match spec.pmi_fd {
        Some(_) => {
            let (a, b) =
                std::os::unix::net::UnixStream::pair().map_err(|e| format!("cannot create the PMI connection: {e}"))?;
            (Some(a), Some(b))
        }
        None => (None, None),
    };
    let affinity = match &spec.cpus {
        Some(cpus) => Some(cpu_set(cpus)?),
        None => None,
    };
    let mut args = ChildArgs {
        image: &image,
        affinity: affinity.as_ref(),
        stdio: [stdin_child.as_raw_fd(), stdout_child.as_raw_fd(), stderr_child.as_raw_fd()],
        pmi: pmi_child.as_ref().zip(spec.pmi_fd).map(|(s, at)| (s.as_raw_fd(), at)),
        parent: std::process::id() as libc::pid_t,
        fd_limit: fd_limit(),
        timer_slack_ns: slack_us.saturating_mul(1000) as libc::c_ulong,
        failed: None,
    };
    let pid = spawn_vfork(&mut args).map_err(|e| format!("cannot create its process (clone): {e}"))?;
    let Some((step, errno)) = args.failed else {
        lower_priority(pid, priority, spec);
        return Ok(Launched { pid, stdin: stdin_ours, stdout, stderr, pmi: pmi_ours });
    };
    // The child exited without exec'ing (it wrote why first): reap it here.
    // SAFETY: waitpid on our own child, which has exited.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    let e = io::Error::from_raw_os_error(errno);
    Err(match step {
        Step::Chdir => format!("working directory '{}' is not usable: {e}", wdir.display()),
        Step::Exec => exec_error(&e, argv0, &program),
        Step::Setup(what) => format!("cannot {what} for '{argv0}': {e}"),
        Step::Bind => format!(
            "cannot bind '{argv0}' to cpus {}: {e}",
            dvm_core::jobmap::topo::list_text(spec.cpus.as_deref().unwrap_or_default())
        ),
    })
}

/// The proc runs below its daemon: set from here, once it has exec'd, never in the vfork child.
/// The daemon's thread waits for the child's exec; a child already under SCHED_IDLE on cpus
/// an ordinary process keeps busy would hold the daemon's loop (and its heartbeats) with it.
/// The proc is then in its loader: it has no other thread yet to miss the change.
pub(super) fn lower_priority(pid: libc::pid_t, p: ChildPriority, spec: &ProcSpec) {
    let (job, rank) = (spec.jobid, spec.rank);
    if let Some(more) = p.nicer {
        // SAFETY: getpriority/setpriority on this thread and on our own child.
        unsafe {
            *libc::__errno_location() = 0;
            let own = libc::getpriority(libc::PRIO_PROCESS, 0);
            let own = if own == -1 && *libc::__errno_location() != 0 { 0 } else { own };
            if libc::setpriority(libc::PRIO_PROCESS, pid as libc::id_t, (own + more).min(19)) != 0 {
                let e = io::Error::last_os_error();
                tracing::warn!(pid, "cannot lower the priority of rank {rank} of job {job} (pid {pid}): {e}");
            }
        }
    }
    if p.idle {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler on our own child with a valid parameter.
        if unsafe { libc::sched_setscheduler(pid, libc::SCHED_IDLE, &param) } != 0 {
            let e = io::Error::last_os_error();
            tracing::warn!(pid, "cannot run rank {rank} of job {job} (pid {pid}) under SCHED_IDLE: {e}");
        }
    }
}

/// The affinity mask of `cpus` (OS indices), prepared before the child exists.
fn cpu_set(cpus: &[u32]) -> Result<libc::cpu_set_t, String> {
    // SAFETY: cpu_set_t is plain bits; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    for &c in cpus {
        if c as usize >= max {
            return Err(format!("cannot bind to cpu {c}: this daemon binds to cpus below {max}"));
        }
        // SAFETY: `c` is below the set's size (checked above).
        unsafe { libc::CPU_SET(c as usize, &mut set) };
    }
    if cpus.is_empty() {
        return Err("cannot bind to an empty set of cpus".into());
    }
    Ok(set)
}

/// The timer slack the proc gets (µs): [`TIMER_SLACK_VAR`] from its environment (the last
/// setting), else what the daemon chose.
fn timer_slack_us(spec: &ProcSpec) -> Result<u64, String> {
    match spec.env.iter().rev().find(|(k, _)| k == TIMER_SLACK_VAR) {
        None => Ok(spec.timer_slack_us),
        // At most a second: a larger slack is a mistake, not a setting.
        Some((_, v)) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&us| us <= 1_000_000)
            .ok_or_else(|| format!("{TIMER_SLACK_VAR}='{v}' is not a number of microseconds from 0 to 1000000")),
    }
}

/// Where the child failed before exec (`ChildArgs::failed`).
#[derive(Clone, Copy)]
enum Step {
    /// What it was doing ("set its process group"), for the sentence.
    Setup(&'static str),
    Bind,
    Chdir,
    Exec,
}

/// Everything the child needs, prepared before it exists: it may not allocate. The pointer
/// arrays (null-terminated) point into the `CString`s kept beside them.
struct Image {
    program: CString,
    wdir: CString,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
    /// `/bin/sh program args...`: what `execvp` runs for an executable file without `#!`.
    sh_argv_ptrs: Vec<*const libc::c_char>,
    _strings: Vec<CString>,
}

impl Image {
    fn new(spec: &ProcSpec, program: &Path, wdir: &Path) -> Result<Image, String> {
        let c = |what: &str, b: &[u8]| CString::new(b).map_err(|_| format!("{what} contains a NUL byte"));
        let program = c("the executable's path", program.as_os_str().as_bytes())?;
        let argv = spec.argv.iter().map(|a| c("an argument", a.as_bytes())).collect::<Result<Vec<_>, _>>()?;
        // Like std's Command: the last setting of a variable wins.
        let mut env: Vec<(&str, &str)> = Vec::with_capacity(spec.env.len());
        for (k, v) in &spec.env {
            match env.iter_mut().find(|(name, _)| name == k) {
                Some(slot) => slot.1 = v,
                None => env.push((k, v)),
            }
        }
        let envp = env
            .iter()
            .map(|(k, v)| c(&format!("environment variable {k}"), format!("{k}={v}").as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let wdir = c("the working directory", wdir.as_os_str().as_bytes())?;
        let ptrs =
            |v: &mut dyn Iterator<Item = &CStr>| v.map(CStr::as_ptr).chain([std::ptr::null()]).collect::<Vec<_>>();
        let argv_ptrs = ptrs(&mut argv.iter().map(CString::as_c_str));
        let envp_ptrs = ptrs(&mut envp.iter().map(CString::as_c_str));
        let sh_argv_ptrs =
            ptrs(&mut [c"/bin/sh", program.as_c_str()].into_iter().chain(argv.iter().skip(1).map(CString::as_c_str)));
        // The strings' buffers stay where they are when the vectors move: the pointers hold.
        let mut strings = argv;
        strings.extend(envp);
        Ok(Image { program, wdir, argv_ptrs, envp_ptrs, sh_argv_ptrs, _strings: strings })
    }
}

/// What the child reads (and, on failure, writes) in the daemon's memory.
struct ChildArgs<'a> {
    image: &'a Image,
    /// The CPUs to bind the child to before exec (`None`: the daemon's affinity).
    affinity: Option<&'a libc::cpu_set_t>,
    stdio: [RawFd; 3],
    /// The child's end of its PMI connection, and the fd number it gets it on (>= 3).
    pmi: Option<(RawFd, RawFd)>,
    parent: libc::pid_t,
    fd_limit: libc::c_int,
    /// 0: the kernel's default (inherited).
    timer_slack_ns: libc::c_ulong,
    /// The step that failed before exec, and its errno; None if the child exec'd.
    failed: Option<(Step, i32)>,
}

/// The child's stack: it needs little (raw syscalls only) and is freed once it has exec'd.
const CHILD_STACK: usize = 256 * 1024;

/// `clone(CLONE_VM | CLONE_VFORK)` running [`child_main`]; returns once the child has exec'd
/// or exited. Every signal is blocked in this thread meanwhile, so no handler of the daemon
/// runs on the child's side before [`child_main`] has reset them. Needs glibc 2.25 or later
/// (Debian 12 has 2.36): older `clone` wrappers overwrite the calling thread's cached pid.
fn spawn_vfork(args: &mut ChildArgs<'_>) -> io::Result<libc::pid_t> {
    // SAFETY: an anonymous private mapping we unmap below; the child only uses it until exec.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            CHILD_STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: sigset operations on local values; pthread_sigmask on this thread only.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        // The stack grows down from the end of the mapping (16-byte aligned).
        let top = (stack as usize + CHILD_STACK) & !15;
        let pid = libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            args as *mut ChildArgs<'_> as *mut libc::c_void,
        );
        let err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        libc::munmap(stack, CHILD_STACK);
        if pid < 0 {
            return Err(err);
        }
        pid
    };
    Ok(pid)
}

/// The child, in the daemon's memory until exec: raw syscalls only — no allocation, no lock,
/// nothing that touches the daemon's state except `ChildArgs::failed`.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildArgs` the parent passed; the parent is suspended until this
    // process execs or exits, so nothing else uses it meanwhile.
    let args = unsafe { &mut *(arg as *mut ChildArgs<'_>) };
    let fail = |args: &mut ChildArgs<'_>, step: Step| -> libc::c_int {
        args.failed = Some((step, io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL)));
        // SAFETY: _exit never returns and runs no handler.
        unsafe { libc::_exit(127) }
    };
    // SAFETY: plain syscalls on values prepared by the parent; nothing here allocates.
    unsafe {
        // A proc starts with every signal at its default action: the daemon's handlers must
        // not run here, and what it ignores (SIGPIPE, say) is not the proc's business. A raw
        // rt_sigaction with an all-zero action (SIG_DFL, no flags, empty mask; the layout is
        // the kernel's) also reaches the signals glibc keeps for itself.
        let dfl = [0u64; 4];
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(libc::SYS_rt_sigaction, sig, dfl.as_ptr(), std::ptr::null_mut::<u64>(), 8usize);
            }
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
            return fail(args, Step::Setup("set PR_SET_PDEATHSIG"));
        }
        // The daemon may have died before prctl: then no PDEATHSIG would ever come.
        if libc::getppid() != args.parent {
            libc::_exit(1);
        }
        if args.timer_slack_ns > 0 && libc::prctl(libc::PR_SET_TIMERSLACK, args.timer_slack_ns, 0, 0, 0) != 0 {
            return fail(args, Step::Setup("set its timer slack"));
        }
        if let Some(set) = args.affinity {
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) != 0 {
                return fail(args, Step::Bind);
            }
        }
        // Its own process group: the daemon signals the whole group.
        if libc::setpgid(0, 0) != 0 {
            return fail(args, Step::Setup("give it its own process group"));
        }
        for (target, &fd) in args.stdio.iter().enumerate() {
            // dup2 clears close-on-exec on the copy; the originals close at exec.
            if libc::dup2(fd, target as libc::c_int) < 0 {
                return fail(args, Step::Setup("connect its stdin, stdout and stderr"));
            }
        }
        if libc::chdir(args.image.wdir.as_ptr()) != 0 {
            return fail(args, Step::Chdir);
        }
        // Every other fd of the daemon closes at exec (close_range(3, ~0, 0) in effect).
        if libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0 {
            // Kernel < 5.11: one fcntl per possible fd (EBADF on unused ones is fine).
            for fd in 3..args.fd_limit {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
        // Its PMI connection, the one fd past stdio it keeps (dup2 clears close-on-exec on the
        // copy; an fd already in place has it cleared by hand).
        if let Some((fd, at)) = args.pmi {
            let kept = if fd == at { libc::fcntl(at, libc::F_SETFD, 0) } else { libc::dup2(fd, at) };
            if kept < 0 {
                return fail(args, Step::Setup("give it its PMI connection"));
            }
        }
        // A proc starts with no signal blocked, whatever the daemon's thread held.
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        let image = args.image;
        libc::execve(image.program.as_ptr(), image.argv_ptrs.as_ptr(), image.envp_ptrs.as_ptr());
        let errno = *libc::__errno_location();
        if errno == libc::ENOEXEC {
            // No #!: run it under /bin/sh, as execvp does (if even that fails, the file's own
            // ENOEXEC is the reason given).
            libc::execve(image.sh_argv_ptrs[0], image.sh_argv_ptrs.as_ptr(), image.envp_ptrs.as_ptr());
        }
        args.failed = Some((Step::Exec, errno));
        libc::_exit(127)
    }
}
/// The highest fd the child could have inherited (+1), for the close_range fallback.
fn fd_limit() -> libc::c_int {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0;
    if ok && rl.rlim_cur != libc::RLIM_INFINITY {
        rl.rlim_cur.min(libc::c_int::MAX as libc::rlim_t) as libc::c_int
    } else {
        1 << 20
    }
}

/// The working directory as an absolute path, or why it cannot be used.
fn checked_wdir(wdir: &Path) -> Result<PathBuf, String> {
    let shown = wdir.display();
    match std::fs::metadata(wdir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(format!("working directory '{shown}' does not exist"))
        }
        Err(e) => return Err(format!("working directory '{shown}' is not accessible: {e}")),
        Ok(m) if !m.is_dir() => return Err(format!("working directory '{shown}' is not a directory")),
        Ok(_) => {}
    }
    if access(wdir, AccessFlags::X_OK).is_err() {
        return Err(format!("working directory '{shown}' is not accessible (permission denied)"));
    }
    std::path::absolute(wdir).map_err(|e| format!("working directory '{shown}' is not usable: {e}"))
}

/// argv[0] as the path to exec: a name with a '/' is taken relative to the working directory;
/// a bare name is searched in the PATH of the proc's own environment (not the daemon's).
fn resolve(argv0: &str, env: &[(String, String)], wdir: &Path) -> Result<PathBuf, String> {
    if argv0.contains('/') {
        // components() drops the "./" so the path shown in errors is clean.
        let path: PathBuf = wdir.join(argv0).components().collect();
        return match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => Err(format!("executable '{argv0}' is a directory")),
            Ok(_) => Ok(path),
            Err(_) if Path::new(argv0).is_relative() => {
                Err(format!("executable '{argv0}' not found (relative to '{}')", wdir.display()))
            }
            Err(_) => Err(format!("executable '{argv0}' not found")),
        };
    }
    // Like std's Command: the last setting of a variable wins.
    let path_var = env.iter().rev().find(|(k, _)| k == "PATH").map_or(DEFAULT_PATH, |(_, v)| v.as_str());
    let mut not_executable = None;
    for dir in path_var.split(':') {
        // An empty entry means the current directory, which for the proc is its wdir.
        let candidate = wdir.join(dir).join(argv0);
        match std::fs::metadata(&candidate) {
            Ok(m) if m.is_file() => {
                if access(&candidate, AccessFlags::X_OK).is_ok() {
                    return Ok(candidate);
                }
                not_executable.get_or_insert(candidate);
            }
            _ => {}
        }
    }
    match not_executable {
        Some(p) => Err(format!("executable '{argv0}' found in PATH at '{}' is not executable", p.display())),
        None => Err(format!("executable '{argv0}' not found in PATH '{path_var}'")),
    }
}

/// The reason std's spawn failed (the exec itself; wdir problems were caught before). An
/// executable file without #! is not an error: execvp runs it under /bin/sh.
fn exec_error(e: &io::Error, argv0: &str, program: &Path) -> String {
    let shown =
        if Path::new(argv0) == program { format!("'{argv0}'") } else { format!("'{argv0}' ({})", program.display()) };
    match e.kind() {
        io::ErrorKind::NotFound => format!("executable {shown} not found, or its interpreter is missing"),
        io::ErrorKind::PermissionDenied => format!("executable {shown} is not executable (permission denied)"),
        _ => format!("cannot execute {shown}: {e}"),
    }
}
