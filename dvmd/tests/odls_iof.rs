//! odls: output forwarding under the per-job window, and stdin. Real processes.

mod odls_common;

use dvmd::odls::{ExitKind, OdlsEvent};
use odls_common::{pseudo_random, sh, spec, Harness, TempDir};

const MIB: usize = 1024 * 1024;

/// Two ranks of one job each write 10 MiB of random bytes to stdout and 1 MiB to stderr at the
/// same time (tee'd into files: the oracle). The test acks only when the window is full, in
/// odd-sized slices with a pause: the unacked bytes must never exceed the window, the window
/// must be used to the byte (otherwise this loop would stall), and every stream must arrive
/// byte-exact.
#[tokio::test]
async fn ten_mib_of_binary_output_under_a_64k_window_with_slow_acks() {
    const WINDOW: usize = 64 * 1024;
    let mut h = Harness::new(WINDOW);
    h.auto_ack = false;
    let tmp = TempDir::new("iof");
    let script = format!(
        "(head -c {} /dev/urandom | tee out.bin) & (head -c {} /dev/urandom | tee err.bin >&2) & wait",
        10 * MIB,
        MIB
    );
    for rank in 0..2u32 {
        let dir = tmp.path().join(format!("r{rank}"));
        std::fs::create_dir(&dir).unwrap();
        let mut s = sh(1, rank, &script);
        s.wdir = dir;
        h.odls.spawn(s);
    }
    let (mut unacked, mut max_unacked, mut acks) = (0usize, 0usize, 0usize);
    let slices = [1usize, 4099, 32771];
    let keys = [(1, 0), (1, 1)];
    while !keys.iter().all(|k| h.procs.get(k).is_some_and(|p| p.done())) {
        if let OdlsEvent::Output { data, .. } = h.next().await {
            unacked += data.len();
            max_unacked = max_unacked.max(unacked);
            assert!(unacked <= WINDOW, "{unacked} bytes unacked with a window of {WINDOW}");
            assert!(h.odls.unacked_output(1) <= WINDOW);
        }
        if unacked == WINDOW {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            let ack = slices[acks % slices.len()].min(unacked);
            acks += 1;
            h.odls.ack_output(1, ack);
            unacked -= ack;
        }
    }
    h.odls.ack_output(1, unacked);
    assert_eq!(h.odls.unacked_output(1), 0);
    assert_eq!(max_unacked, WINDOW, "the window was the limit");
    for rank in 0..2u32 {
        let p = &h.procs[&(1, rank)];
        assert_eq!(p.status, Some(ExitKind::Code(0)), "rank {rank}: {:?}", String::from_utf8_lossy(&p.err));
        let dir = tmp.path().join(format!("r{rank}"));
        let (out, err) = (std::fs::read(dir.join("out.bin")).unwrap(), std::fs::read(dir.join("err.bin")).unwrap());
        assert_eq!((out.len(), err.len()), (10 * MIB, MIB));
        assert!(p.out == out, "rank {rank}: stdout differs from what the proc wrote");
        assert!(p.err == err, "rank {rank}: stderr differs from what the proc wrote");
    }
    assert!(acks > (22 * MIB) / 32771, "slow acks: {acks}");
}

/// An ack larger than what is outstanding must not widen the window.
#[tokio::test]
async fn over_acks_do_not_widen_the_window() {
    const WINDOW: usize = 1000;
    let mut h = Harness::new(WINDOW);
    h.auto_ack = false;
    h.odls.ack_output(1, 1 << 30); // before anything was emitted
    h.odls.spawn(sh(1, 0, "head -c 100000 /dev/zero"));
    let mut unacked = 0;
    while !h.procs.get(&(1, 0)).is_some_and(|p| p.done()) {
        if let OdlsEvent::Output { data, .. } = h.next().await {
            unacked += data.len();
            assert!(unacked <= WINDOW, "{unacked} unacked");
        }
        if unacked == WINDOW {
            h.odls.ack_output(1, 10 * WINDOW); // more than outstanding: clamped
            unacked = 0;
        }
    }
    assert_eq!(h.procs[&(1, 0)].out.len(), 100000);
}

/// Bytes written with write_stdin reach the proc in order (cat echoes them), binary-safe and
/// larger than a pipe buffer; close_stdin gives it EOF.
#[tokio::test]
async fn stdin_bytes_reach_the_proc_in_order() {
    let mut h = Harness::new(64 * 1024);
    let payload = pseudo_random(MIB + 12345, 7);
    let mut s = spec(1, 0, &["cat"]);
    s.stdin = true;
    h.odls.spawn(s);
    let mut at = 0;
    for (i, len) in [1usize, 7, 0, 65536, 100_000, 3].iter().cycle().enumerate() {
        if at == payload.len() {
            break;
        }
        let end = (at + len * (i % 5 + 1)).min(payload.len());
        h.odls.write_stdin(1, 0, bytes::Bytes::copy_from_slice(&payload[at..end]));
        at = end;
    }
    h.odls.close_stdin(1, 0);
    h.wait_done(&[(1, 0)]).await;
    let p = &h.procs[&(1, 0)];
    assert_eq!(p.status, Some(ExitKind::Code(0)));
    assert!(p.out == payload, "stdin came back different ({} of {} bytes)", p.out.len(), payload.len());
    // After the exit: dropped quietly.
    h.odls.write_stdin(1, 0, bytes::Bytes::from_static(b"late"));
    h.odls.close_stdin(1, 0);
    h.odls.write_stdin(9, 9, bytes::Bytes::from_static(b"nobody"));
}

/// Without a stdin pipe the proc reads /dev/null (cat ends at once), and stdin writes to it
/// are dropped.
#[tokio::test]
async fn stdin_is_dev_null_unless_requested() {
    let mut h = Harness::new(4096);
    h.odls.spawn(spec(1, 0, &["sh", "-c", "cat; readlink /proc/self/fd/0 >&2"]));
    h.odls.write_stdin(1, 0, bytes::Bytes::from_static(b"ignored"));
    h.wait_done(&[(1, 0)]).await;
    let p = &h.procs[&(1, 0)];
    assert_eq!(
        (p.out.as_slice(), p.err.as_slice(), p.status),
        (&b""[..], &b"/dev/null\n"[..], Some(ExitKind::Code(0)))
    );
}

/// A proc that dies with unread stdin queued: the writer drops it quietly, nothing hangs.
#[tokio::test]
async fn stdin_to_a_proc_that_stops_reading_is_dropped() {
    let mut h = Harness::new(4096);
    let mut s = sh(1, 0, "head -c 10 >/dev/null; exit 4");
    s.stdin = true;
    h.odls.spawn(s);
    h.odls.write_stdin(1, 0, bytes::Bytes::from(vec![b'x'; 4 * MIB]));
    assert_eq!(h.run_to_end((1, 0)).await, ExitKind::Code(4));
}

/// The consumer stopped acking (prun gone) and the job is killed: the procs die of SIGTERM
/// with output still unread in their pipes. After the grace the window is closed and that
/// output discarded, so the exits are still reported.
#[tokio::test]
async fn kill_job_reports_exits_even_when_output_is_never_acked() {
    const WINDOW: usize = 1000;
    let mut h = Harness::new(WINDOW);
    h.auto_ack = false;
    h.odls.spawn(sh(1, 0, "exec head -c 1000000 /dev/zero"));
    h.odls.spawn(sh(1, 1, "exec head -c 1000000 /dev/zero >&2"));
    let mut unacked = 0;
    while unacked < WINDOW {
        if let OdlsEvent::Output { data, .. } = h.next().await {
            unacked += data.len();
        }
    }
    assert_eq!(h.odls.unacked_output(1), WINDOW);
    h.odls.kill_job(1, std::time::Duration::from_millis(100));
    h.wait_done(&[(1, 0), (1, 1)]).await;
    let (r0, r1) = (&h.procs[&(1, 0)], &h.procs[&(1, 1)]);
    assert_eq!((r0.status, r1.status), (Some(ExitKind::Signal(libc::SIGTERM)), Some(ExitKind::Signal(libc::SIGTERM))));
    assert_eq!(r0.out.len() + r1.err.len(), WINDOW, "no output beyond the window");
    assert_eq!(h.odls.live(1), 0);
}
