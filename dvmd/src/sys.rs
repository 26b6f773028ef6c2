//! The daemon's own process figures: resident memory, and giving freed memory back.
//! A leaf: it imports nothing of the crate.

/// Give the heap's free pages back to the system (glibc's `malloc_trim`). Freed memory
/// otherwise stays resident in the allocator's arenas, scattered between live allocations, and
/// a long-lived daemon's RSS creeps up with every job although nothing is kept (docs/soak.md).
pub fn trim_heap() {
    // SAFETY: malloc_trim only returns free memory to the system; it is safe at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Resident set size of this process in KiB (Linux).
pub fn rss_kib() -> u64 {
    rss_kib_of("/proc/self/status").unwrap_or(0)
}

/// `VmRSS` in KiB from a `/proc/<pid>/status` file; None when the process is gone.
pub fn rss_kib_of(status_file: &str) -> Option<u64> {
    std::fs::read_to_string(status_file).ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    })
}
