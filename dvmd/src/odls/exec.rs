//! fork/exec of one proc: resolve the executable, check the working directory, and start the
//! child in its own process group with PDEATHSIG set and every inherited fd >= 3 closed.
//! Every failure is returned as the tail of a one-sentence reason ("executable './a.out' not
//! found"); the caller prefixes node, job and rank.

use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::unistd::{access, AccessFlags};

use super::ProcSpec;

/// What `execvp` searches when the proc's environment has no PATH (glibc's default).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// A started child: its pid (also its process group id) and our ends of its pipes.
pub(super) struct Launched {
    pub pid: i32,
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// Start `spec` or say why not. Returns once the child has exec'd (std's CLOEXEC error pipe),
/// so exec and chdir failures are reported here, never as an exit status.
pub(super) fn launch(spec: &ProcSpec) -> Result<Launched, String> {
    let argv0 = spec.argv.first().filter(|a| !a.is_empty()).ok_or("the command line is empty")?;
    let wdir = checked_wdir(&spec.wdir)?;
    let program = resolve(argv0, &spec.env, &wdir)?;

    let mut cmd = Command::new(&program);
    cmd.arg0(argv0)
        .args(&spec.argv[1..])
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (OsStr::new(k), OsStr::new(v))))
        .current_dir(&wdir)
        .stdin(if spec.stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // setpgid(0, 0) in the child: the daemon signals the whole group.
        .process_group(0);
    let parent = std::process::id() as libc::pid_t;
    let fd_limit = fd_limit();
    // SAFETY: `child_setup` only makes raw syscalls (async-signal-safe, no allocation).
    unsafe { cmd.pre_exec(move || child_setup(parent, fd_limit)) };

    let mut child = cmd.spawn().map_err(|e| exec_error(&e, argv0, &program))?;
    let pid = child.id() as i32;
    let stdin = child.stdin.take().map(OwnedFd::from);
    let stdout = OwnedFd::from(child.stdout.take().expect("stdout is piped"));
    let stderr = OwnedFd::from(child.stderr.take().expect("stderr is piped"));
    // Dropping std's Child neither waits nor kills: the caller reaps `pid`.
    drop(child);
    Ok(Launched { pid, stdin, stdout, stderr })
}

/// Runs in the forked child before exec. Async-signal-safe: raw syscalls only.
fn child_setup(parent: libc::pid_t, fd_limit: libc::c_int) -> io::Result<()> {
    // SAFETY: plain syscalls on values we own; nothing here allocates or takes a lock.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        // The daemon may have died between fork and prctl: then no PDEATHSIG would ever come.
        if libc::getppid() != parent {
            libc::_exit(1);
        }
        // A proc starts with no signal blocked, whatever the forking thread held (the HNP
        // holds SIGINT/SIGTERM on its runtime threads from its first instruction).
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // Mark (not close) fds >= 3 close-on-exec: std's exec-error pipe is one of them and must
        // stay open until exec so a failed exec is still reported. At exec the effect is the
        // same as close_range(3, ~0, 0).
        if libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) != 0 {
            // Kernel < 5.11: one fcntl per possible fd (EBADF on unused ones is fine).
            for fd in 3..fd_limit {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
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
