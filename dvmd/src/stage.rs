//! Staging's disk: the shell's side of [`dvm_core::stage::StageIo`].
//!
//! Owns: the HNP's open sources (each file's running hash), and on every daemon the files of a
//! transfer being received. A file is written unnamed (`O_TMPFILE` in its destination's
//! directory, so a daemon killed mid-transfer leaves nothing behind) and given its name only
//! at commit; where the filesystem has no unnamed files, a hidden temporary name is used and
//! removed on discard.
//! Never: decides a transfer's fate (the node does) or blocks on anything but the local disk.
//! Invariants: a segment's hash (BLAKE3) is checked before it is written; a file's hash is the
//! BLAKE3 of its segments' hashes in order, checked with its size when its last segment
//! arrives.

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use dvm_core::stage::{SourceFile, StageDest, StageDone, StageIo, StagePlan, StageSegment};
use flate2::{read::DeflateDecoder, write::DeflateEncoder, Compression};
use tracing::{debug, warn};

/// Where a daemon expands `%n`, `%h` and `%s` in destinations.
#[derive(Debug, Clone)]
pub struct Place {
    pub rank: u32,
    pub host: String,
    pub session: Option<PathBuf>,
}

impl Place {
    pub fn expand(&self, dest: &str) -> Result<PathBuf, String> {
        let mut out = String::new();
        let mut chars = dest.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('n') => out.push_str(&self.rank.to_string()),
                Some('h') => out.push_str(&self.host),
                Some('s') => match &self.session {
                    Some(s) => out.push_str(&s.to_string_lossy()),
                    None => return Err(format!("{dest}: this daemon has no session directory for %s")),
                },
                Some('%') => out.push('%'),
                other => return Err(format!("{dest}: unknown '%{}' (known: %n, %h, %s, %%)", other.unwrap_or(' '))),
            }
        }
        let p = PathBuf::from(out);
        if !p.is_absolute() {
            return Err(format!("{}: destinations must be absolute paths", p.display()));
        }
        Ok(p)
    }
}

/// Check a source on the HNP's node: a regular file it can read. One sentence otherwise.
pub fn check_source(src: &str, dest: &str) -> Result<SourceFile, String> {
    let path = Path::new(src);
    if !path.is_absolute() {
        return Err(format!("{src}: sources must be absolute paths on the HNP's node"));
    }
    let meta = std::fs::metadata(path).map_err(|e| format!("{src}: {}", io_text(&e)))?;
    if meta.is_dir() {
        return Err(format!("{src} is a directory, not a file"));
    }
    if !meta.is_file() {
        return Err(format!("{src} is not a regular file"));
    }
    File::open(path).map_err(|e| format!("{src}: {}", io_text(&e)))?;
    Ok(SourceFile { src: src.into(), dest: dest.into(), size: meta.len(), mode: meta.mode() & 0o7777 })
}

/// The broadcast tool's request as a plan: every source checked here, on the HNP's node.
pub fn plan_of(req: dvm_proto::control::StageRequest) -> Result<StagePlan, String> {
    if req.files.is_empty() {
        return Err("nothing to copy".into());
    }
    let segment = u64::from(req.segment_kib) << 10;
    if segment != 0 && !(dvm_core::stage::MIN_SEGMENT..=dvm_core::stage::MAX_SEGMENT).contains(&segment) {
        return Err(format!(
            "a segment of {} KiB is outside {}..={} KiB",
            req.segment_kib,
            dvm_core::stage::MIN_SEGMENT >> 10,
            dvm_core::stage::MAX_SEGMENT >> 10
        ));
    }
    let files = req.files.iter().map(|f| check_source(&f.src, &f.dest)).collect::<Result<_, _>>()?;
    if req.window as usize > dvm_core::stage::MAX_WINDOW {
        return Err(format!("a window of {} segments is above {}", req.window, dvm_core::stage::MAX_WINDOW));
    }
    let seg = if segment == 0 { dvm_core::stage::DEFAULT_SEGMENT } else { segment };
    let window = if req.window == 0 { dvm_core::stage::WINDOW as u64 } else { u64::from(req.window) };
    if window * seg > dvm_core::stage::MAX_IN_FLIGHT {
        return Err(format!(
            "{window} segments of {} KiB in flight would hold {} MiB on every node, above {} MiB",
            seg >> 10,
            (window * seg) >> 20,
            dvm_core::stage::MAX_IN_FLIGHT >> 20
        ));
    }
    Ok(StagePlan {
        files,
        hosts: req.hosts,
        compress: req.compress,
        segment,
        window: req.window as usize,
        uid: req.uid,
    })
}

/// A job's preload files, checked on the HNP's node: their sizes and modes filled in.
pub fn fill_preload(spec: &mut dvm_proto::job::JobSpec) -> Result<(), String> {
    for p in &mut spec.preload {
        let f = check_source(&p.src, &p.dest)?;
        p.size = f.size;
        p.mode = f.mode;
    }
    Ok(())
}

fn io_text(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => {
            let s = e.to_string();
            s.split(" (os error").next().unwrap_or(&s).to_lowercase()
        }
    }
}

#[derive(Debug)]
struct Source {
    file: File,
    /// The hash of the segments' hashes so far.
    list: blake3::Hasher,
}

#[derive(Debug)]
struct Incoming {
    dest: PathBuf,
    size: u64,
    mode: u32,
    file: File,
    /// The hidden name it is written under where no unnamed file could be made.
    temp: Option<PathBuf>,
    written: u64,
    list: blake3::Hasher,
}

#[derive(Debug, Default)]
struct Transfer {
    files: Vec<Incoming>,
    /// Destinations named at commit (removed on discard).
    named: Vec<PathBuf>,
}

/// One daemon's staging disk. Its errors name the path; the HNP adds the daemon and host.
#[derive(Debug)]
pub struct StageDisk {
    place: Place,
    sources: HashMap<(u64, u32), Source>,
    transfers: HashMap<u64, Transfer>,
}

impl StageDisk {
    pub fn new(place: Place) -> StageDisk {
        StageDisk { place, sources: HashMap::new(), transfers: HashMap::new() }
    }

    /// Carry out `io`; its answer, if it has one.
    pub fn apply(&mut self, io: StageIo) -> Option<StageDone> {
        Some(match io {
            StageIo::Read { id, file, path, offset, len, last, compress } => {
                StageDone::Read { id, result: self.read(id, file, &path, offset, len, last, compress) }
            }
            StageIo::ReadEnd { id } => {
                self.sources.retain(|(t, _), _| *t != id);
                return None;
            }
            StageIo::Open { id, files, uid } => {
                StageDone::Sink { id, result: self.open(id, files, uid).map(|()| false) }
            }
            StageIo::Write { id, seg } => StageDone::Sink { id, result: self.write(id, seg) },
            StageIo::Commit { id } => StageDone::Sink { id, result: self.commit(id).map(|()| true) },
            StageIo::Discard { id } => {
                let _ = self.discard(id);
                return None;
            }
            StageIo::Remove { id } => StageDone::Removed { id, result: self.discard(id) },
            StageIo::Keep { id } => {
                self.transfers.remove(&id);
                return None;
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn read(
        &mut self,
        id: u64,
        file: u32,
        path: &str,
        offset: u64,
        len: u64,
        last: bool,
        compress: bool,
    ) -> Result<StageSegment, String> {
        let src = match self.sources.entry((id, file)) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let f = File::open(path).map_err(|e| format!("cannot read {path}: {}", io_text(&e)))?;
                v.insert(Source { file: f, list: blake3::Hasher::new() })
            }
        };
        let mut data = vec![0u8; len as usize];
        src.file.read_exact_at(&mut data, offset).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => format!("{path} shrank while it was being copied"),
            _ => format!("cannot read {path}: {}", io_text(&e)),
        })?;
        let digest = blake3::hash(&data);
        src.list.update(digest.as_bytes());
        let file_hash = if last {
            let list = src.list.finalize();
            self.sources.remove(&(id, file));
            Bytes::copy_from_slice(list.as_bytes())
        } else {
            Bytes::new()
        };
        let (data, compressed) = if compress { deflate(data) } else { (data, false) };
        Ok(StageSegment {
            id,
            file,
            offset,
            data: Bytes::from(data),
            hash: Bytes::copy_from_slice(digest.as_bytes()),
            file_hash,
            compressed,
            last,
        })
    }

    fn open(&mut self, id: u64, files: Vec<StageDest>, uid: u32) -> Result<(), String> {
        let mut t = Transfer::default();
        for d in files {
            let opened =
                self.place.expand(&d.path).and_then(|dest| open_dest(dest, d.size, d.mode, uid, id, self.place.rank));
            match opened {
                Ok(f) => t.files.push(f),
                Err(e) => {
                    // The files opened before it go (unnamed ones by themselves).
                    for f in t.files.iter().filter_map(|f| f.temp.as_ref()) {
                        let _ = std::fs::remove_file(f);
                    }
                    return Err(e);
                }
            }
        }
        self.transfers.insert(id, t);
        Ok(())
    }

    fn write(&mut self, id: u64, seg: StageSegment) -> Result<bool, String> {
        let t = self.transfers.get_mut(&id).ok_or("a segment of a transfer this daemon never opened")?;
        let n = t.files.len();
        let f = t.files.get_mut(seg.file as usize).ok_or("a segment of a file the transfer does not have")?;
        let shown = f.dest.display().to_string();
        if seg.offset != f.written {
            return Err(format!("{shown}: a segment at byte {} after {} bytes", seg.offset, f.written));
        }
        let inflated;
        let data: &[u8] = if seg.compressed {
            inflated = inflate(&seg.data, dvm_core::stage::MAX_SEGMENT)?;
            &inflated
        } else {
            &seg.data
        };
        let digest = blake3::hash(data);
        if digest.as_bytes()[..] != seg.hash[..] {
            return Err(format!("{shown}: the segment at byte {} arrived corrupt (its hash differs)", seg.offset));
        }
        f.file.write_all_at(data, seg.offset).map_err(|e| format!("cannot write {shown}: {}", io_text(&e)))?;
        f.written += data.len() as u64;
        f.list.update(digest.as_bytes());
        if !seg.last {
            return Ok(false);
        }
        if f.written != f.size {
            return Err(format!("{shown}: {} bytes arrived, {} were sent", f.written, f.size));
        }
        if f.list.finalize().as_bytes()[..] != seg.file_hash[..] {
            return Err(format!("{shown}: the whole file's hash differs from the source's"));
        }
        Ok(seg.file as usize + 1 == n)
    }

    fn commit(&mut self, id: u64) -> Result<(), String> {
        let t = self.transfers.get_mut(&id).ok_or("a commit of a transfer this daemon never opened")?;
        for f in std::mem::take(&mut t.files) {
            let shown = f.dest.display().to_string();
            f.file
                .set_permissions(std::fs::Permissions::from_mode(f.mode))
                .map_err(|e| format!("cannot set the mode of {shown}: {}", io_text(&e)))?;
            let from = match &f.temp {
                Some(temp) => temp.clone(),
                None => {
                    // Name the unnamed file under a hidden name, then move it over the
                    // destination (a link cannot replace a file that exists).
                    let temp = hidden_name(&f.dest, id, self.place.rank);
                    link_unnamed(&f.file, &temp).map_err(|e| format!("cannot name {shown}: {}", io_text(&e)))?;
                    temp
                }
            };
            if let Err(e) = std::fs::rename(&from, &f.dest) {
                let _ = std::fs::remove_file(&from);
                return Err(format!("cannot name {shown}: {}", io_text(&e)));
            }
            t.named.push(f.dest);
        }
        Ok(())
    }

    /// Nothing of transfer `id` stays here; the first path that could not be removed, if any.
    fn discard(&mut self, id: u64) -> Result<(), String> {
        let Some(t) = self.transfers.remove(&id) else { return Ok(()) };
        let mut first = Ok(());
        let temps = t.files.into_iter().filter_map(|f| f.temp);
        for p in temps.chain(t.named) {
            match std::fs::remove_file(&p) {
                Ok(()) => debug!(path = %p.display(), "staged file removed"),
                // Daemons sharing a filesystem remove the same path; one of them finds it gone.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    warn!(path = %p.display(), "cannot remove a staged file: {e}");
                    if first.is_ok() {
                        first = Err(format!("cannot remove {}: {}", p.display(), io_text(&e)));
                    }
                }
            }
        }
        first
    }
}

fn hidden_name(dest: &Path, id: u64, rank: u32) -> PathBuf {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    dest.with_file_name(format!(".{name}.dvm-stage-{id}-{rank}"))
}

/// Prepare a destination: its directory exists (made if need be), the asking user may write
/// there, there is room, and a file to write it into.
fn open_dest(dest: PathBuf, size: u64, mode: u32, uid: u32, id: u64, rank: u32) -> Result<Incoming, String> {
    let shown = dest.display().to_string();
    if dest.is_dir() {
        return Err(format!("{shown} is a directory"));
    }
    let dir = dest.parent().ok_or_else(|| format!("{shown} has no directory"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {}", dir.display(), io_text(&e)))?;
    may_write(dir, uid)?;
    let free = free_bytes(dir).unwrap_or(u64::MAX);
    if free < size {
        return Err(format!("no room for {shown}: {size} bytes needed, {free} free"));
    }
    let unnamed = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_TMPFILE).mode(0o600).open(dir);
    let (file, temp) = match unnamed {
        Ok(f) => (f, None),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)) => {
            let temp = hidden_name(&dest, id, rank);
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp)
                .map_err(|e| format!("cannot write {shown}: {}", io_text(&e)))?;
            (f, Some(temp))
        }
        Err(e) => return Err(format!("cannot write {shown}: {}", io_text(&e))),
    };
    // Room is taken now, so a full disk is found before any byte moves.
    if size > 0 {
        if let Err(e) = nix::fcntl::fallocate(file.as_raw_fd(), nix::fcntl::FallocateFlags::empty(), 0, size as i64) {
            if e == nix::errno::Errno::ENOSPC {
                if let Some(t) = &temp {
                    let _ = std::fs::remove_file(t);
                }
                return Err(format!("no room for {shown}: no space left on device"));
            }
        }
    }
    Ok(Incoming { dest, size, mode, file, temp, written: 0, list: blake3::Hasher::new() })
}

/// A user other than the daemon's own may write only where the directory lets them.
fn may_write(dir: &Path, uid: u32) -> Result<(), String> {
    let me = nix::unistd::geteuid().as_raw();
    if uid == me {
        return Ok(());
    }
    let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {}", dir.display(), io_text(&e)))?;
    let mode = meta.mode();
    let allowed = (meta.uid() == uid && mode & 0o200 != 0) || mode & 0o002 != 0;
    if allowed {
        Ok(())
    } else {
        Err(format!("user {uid} may not write in {}", dir.display()))
    }
}

fn free_bytes(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(st.blocks_available() as u64 * st.fragment_size() as u64)
}

fn link_unnamed(file: &File, to: &Path) -> std::io::Result<()> {
    let from = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).expect("no NUL");
    let to = CString::new(to.as_os_str().as_bytes()).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // SAFETY: both paths are NUL-terminated strings that live across the call.
    let rc =
        unsafe { libc::linkat(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_SYMLINK_FOLLOW) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn deflate(data: Vec<u8>) -> (Vec<u8>, bool) {
    let mut enc = DeflateEncoder::new(Vec::with_capacity(data.len() / 2), Compression::fast());
    match enc.write_all(&data).and_then(|()| enc.finish()) {
        Ok(z) if z.len() < data.len() => (z, true),
        _ => (data, false),
    }
}

fn inflate(data: &[u8], limit: u64) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    DeflateDecoder::new(data)
        .take(limit + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("a compressed segment does not inflate: {e}"))?;
    if out.len() as u64 > limit {
        return Err("a compressed segment inflates beyond the largest segment".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
