//! Throughput of sealing and opening frames in each link-security mode, against copying the
//! same bytes (the floor every mode pays to put a frame in a socket buffer), on one core.
//!
//!   cargo bench -p dvm-rml --bench seal            # 1 MiB frames
//!   SEAL_BYTES=65536 cargo bench -p dvm-rml --bench seal
//!
//! Prints, per mode, GB/s for seal+open of one frame (written to a buffer, then decoded) and
//! the ratio of its time to `none`'s (the same path with no cipher).

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use dvm_proto::rml::{FrameHeader, Tag};
use dvm_rml::auth::{DvmSecret, Role};
use dvm_rml::link::LinkParams;
use dvm_rml::{Frame, LinkSecurity};
use tokio_util::codec::Decoder;

fn main() {
    let bytes: usize = std::env::var("SEAL_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(1 << 20);
    let reps = ((256usize << 20) / bytes).clamp(16, 100_000);
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let payload = Bytes::from(vec![0x5au8; bytes]);
    let header = FrameHeader { origin: 0, dst: 1, tag: Tag::Grpcomm as u32, epoch: 1, seq: 0 };
    let frame = Frame::new(header, payload.clone());

    // Baseline: the frame copied once into a reused buffer and out again.
    let mut buf = Vec::with_capacity(bytes + 64);
    let t = Instant::now();
    for _ in 0..reps {
        buf.clear();
        buf.extend_from_slice(&payload);
        std::hint::black_box(&buf);
    }
    let copy_s = t.elapsed().as_secs_f64() / reps as f64;
    println!("frame {bytes} B, {reps} reps, one core");
    println!("{:<6} {:>10} {:>12} {:>14}", "mode", "GB/s", "us/frame", "ratio to none");
    println!("{:<6} {:>10.2} {:>12.1} {:>14}", "copy", bytes as f64 / copy_s / 1e9, copy_s * 1e6, "-");
    let mut none_s = None;

    let secret = DvmSecret::from_bytes([9; 32]);
    let (ni, nr) = ([1u8; 32], [2u8; 32]);
    for mode in [LinkSecurity::None, LinkSecurity::Mac, LinkSecurity::Aead] {
        let p = |role| LinkParams { secret: &secret, mode, role, initiator_nonce: &ni, responder_nonce: &nr };
        let (mut sealer, _) = p(Role::Initiator).keys(bytes + 1024);
        let (_, mut opener) = p(Role::Responder).keys(bytes + 1024);
        let mut wire = Vec::with_capacity(bytes + 128);
        let mut inbox = BytesMut::with_capacity(bytes + 128);
        let t = Instant::now();
        for _ in 0..reps {
            wire.clear();
            rt.block_on(sealer.write(&mut wire, &frame)).expect("seal");
            inbox.extend_from_slice(&wire);
            let got = opener.decode(&mut inbox).expect("open").expect("a whole frame");
            assert_eq!(got.payload.len(), bytes);
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        let base = *none_s.get_or_insert(s);
        println!("{:<6} {:>10.2} {:>12.1} {:>14.2}", mode.to_string(), bytes as f64 / s / 1e9, s * 1e6, s / base);
    }
}
