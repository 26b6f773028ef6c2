//! Fuzz targets of the network and user edge (proptest, stable): the RML frame decoder, the
//! sealed-frame decoder (link security), the connection handshake, the hostfile parser and
//! prun's command line. The daemon's message handlers are fuzzed in `dvm-core`
//! (`fuzz_core_message_handlers`), the jobmap wire decoder in `jobmap_wire`.
//!
//! Oracles, not only "no panic": a decoder never hands out a frame that differs from one the
//! sender sealed; a handshake never succeeds from bytes that do not hold the secret; parsers
//! answer `Ok` or a named error. Inputs: `dvm_tests::fuzz` (a slice in `cargo test`,
//! millions from scripts/fuzz.sh).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use dvm_proto::rml::{AuthHello, AuthProof, FrameHeader};
use dvm_proto::Message;
use dvm_rml::auth::{self, Local, Role};
use dvm_rml::link::{LinkParams, Opener, CHUNK};
use dvm_rml::{DvmSecret, Frame, FrameCodec, LinkSecurity};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::{Decoder, Encoder};

const MAX: usize = 4096;

fn frame(seq: u64, tag: u32, payload: Vec<u8>) -> Frame {
    Frame::new(FrameHeader { origin: 1, dst: 2, tag, epoch: 3, seq }, Bytes::from(payload))
}

fn frames() -> impl Strategy<Value = Vec<Frame>> {
    proptest::collection::vec((0u32..6, proptest::collection::vec(any::<u8>(), 0..200)), 1..5)
        .prop_map(|v| v.into_iter().enumerate().map(|(i, (tag, p))| frame(i as u64, tag, p)).collect())
}

/// Edits to a byte string: (position, xor mask), a cut and bytes spliced in.
fn edits() -> impl Strategy<Value = (Vec<(usize, u8)>, Option<usize>, Vec<u8>)> {
    (
        proptest::collection::vec((any::<usize>(), 1u8..=255), 0..4),
        proptest::option::of(any::<usize>()),
        proptest::collection::vec(any::<u8>(), 0..8),
    )
}

fn edit(mut b: Vec<u8>, (flips, cut, splice): &(Vec<(usize, u8)>, Option<usize>, Vec<u8>)) -> Vec<u8> {
    let n = b.len();
    for &(at, x) in flips.iter().filter(|_| n > 0) {
        b[at % n] ^= x;
    }
    if let Some(c) = cut {
        b.truncate(c % (b.len() + 1));
    }
    let at = flips.first().map_or(b.len(), |(a, _)| a % (b.len() + 1));
    b.splice(at..at, splice.iter().copied());
    b
}

/// Feed `bytes` to `decoder` in chunks of `chunk` bytes; the frames out, and whether it ended
/// in an error.
fn decode_all<D: Decoder<Item = Frame>>(decoder: &mut D, bytes: &[u8], chunk: usize) -> (Vec<Frame>, bool) {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in bytes.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(f)) => out.push(f),
                Ok(None) => break,
                Err(_) => return (out, true),
            }
            // A refused size never grows the buffer past what arrived.
        }
        assert!(buf.capacity() <= 4 * 1024 * 1024, "decoder buffered {} bytes", buf.capacity());
    }
    (out, false)
}

fn secret() -> DvmSecret {
    DvmSecret::from_bytes([0x5a; 32])
}

fn params(mode: LinkSecurity, role: Role) -> (DvmSecret, LinkSecurity, Role) {
    (secret(), mode, role)
}

fn opener(mode: LinkSecurity) -> Opener {
    let (s, m, r) = params(mode, Role::Responder);
    Opener::new(&LinkParams { secret: &s, mode: m, role: r, initiator_nonce: &[1; 32], responder_nonce: &[2; 32] }, MAX)
}

fn sealed(mode: LinkSecurity, fs: &[Frame]) -> Vec<u8> {
    sealed_max(mode, fs, MAX)
}

fn sealed_max(mode: LinkSecurity, fs: &[Frame], max: usize) -> Vec<u8> {
    let (s, m, r) = params(mode, Role::Initiator);
    let p = LinkParams { secret: &s, mode: m, role: r, initiator_nonce: &[1; 32], responder_nonce: &[2; 32] };
    let mut sealer = p.keys(max).0;
    let mut out = Vec::new();
    rt().block_on(async {
        for f in fs {
            sealer.write(&mut out, f).await.unwrap();
        }
    });
    out
}

fn rt() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap())
}

proptest! {
    #![proptest_config(dvm_tests::fuzz::config(500))]

    /// Plain frames, mutated, in any chunking: every frame out is well-formed and within the
    /// limit; nothing buffers past the limit.
    #[test]
    fn fuzz_frame_decoder(fs in frames(), e in edits(), chunk in 1usize..300, raw in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut buf = BytesMut::new();
        for f in &fs {
            FrameCodec::new(MAX).encode(f.clone(), &mut buf).unwrap();
        }
        let bytes = if raw.len() % 5 == 0 { raw } else { edit(buf.to_vec(), &e) };
        let (out, _) = decode_all(&mut FrameCodec::new(MAX), &bytes, chunk);
        for f in out {
            prop_assert!(f.body_len() <= MAX);
        }
    }

    /// Sealed frames, mutated: the decoder hands out only frames the sender sealed, in order,
    /// and stops at the first that fails (mac and aead).
    #[test]
    fn fuzz_sealed_decoder(fs in frames(), e in edits(), chunk in 1usize..300, aead in any::<bool>()) {
        let mode = if aead { LinkSecurity::Aead } else { LinkSecurity::Mac };
        let good = sealed(mode, &fs);
        let bytes = edit(good.clone(), &e);
        let (out, _) = decode_all(&mut opener(mode), &bytes, chunk);
        prop_assert!(out.len() <= fs.len());
        for (got, want) in out.iter().zip(&fs) {
            prop_assert_eq!(got, want, "a frame the sender did not seal was accepted");
        }
        if bytes == good {
            prop_assert_eq!(out.len(), fs.len());
        }
    }

    /// Sealed `aead` frames of several 64 KiB chunks, mutated (a byte in any chunk or tag, a
    /// cut, bytes spliced in): only frames the sender sealed come out, in order.
    #[test]
    fn fuzz_sealed_chunks(lens in proptest::collection::vec(0usize..3 * CHUNK, 1..3), fill in any::<u8>(), e in edits(), chunk in 1000usize..70_000) {
        let fs: Vec<Frame> = lens.iter().enumerate().map(|(i, &n)| frame(i as u64, 1, vec![fill.wrapping_add(i as u8); n])).collect();
        let good = sealed_max(LinkSecurity::Aead, &fs, 4 * CHUNK);
        let bytes = edit(good.clone(), &e);
        let (s, m, r) = params(LinkSecurity::Aead, Role::Responder);
        let mut o = Opener::new(&LinkParams { secret: &s, mode: m, role: r, initiator_nonce: &[1; 32], responder_nonce: &[2; 32] }, 4 * CHUNK);
        let (out, _) = decode_all(&mut o, &bytes, chunk);
        prop_assert!(out.len() <= fs.len());
        for (got, want) in out.iter().zip(&fs) {
            prop_assert_eq!(got, want, "a frame the sender did not seal was accepted");
        }
        if bytes == good {
            prop_assert_eq!(out.len(), fs.len());
        }
    }

    /// The responder's side of a handshake fed a peer transcript (a genuine one from a peer
    /// holding another secret, mutated, or raw bytes): it never succeeds, never panics, ends.
    #[test]
    fn fuzz_handshake(e in edits(), raw in proptest::collection::vec(any::<u8>(), 0..96), which in 0u8..3) {
        let own = secret();
        let transcript = match which {
            0 => raw,
            _ => {
                let mut t = Vec::new();
                let hello = AuthHello { nonce: vec![9; 32].into(), rank: 4, epoch: 5, link_security: LinkSecurity::Aead.wire() };
                t.extend_from_slice(&(hello.encoded_len() as u32).to_be_bytes());
                hello.encode(&mut t).unwrap();
                let proof = AuthProof { mac: vec![which; 32].into() };
                t.extend_from_slice(&(proof.encoded_len() as u32).to_be_bytes());
                proof.encode(&mut t).unwrap();
                edit(t, &e)
            }
        };
        let result = rt().block_on(async {
            let (mut a, mut b) = tokio::io::duplex(1 << 16);
            b.write_all(&transcript).await.unwrap();
            // End of input: the handshake ends with an error instead of waiting.
            drop(b.shutdown().await);
            let mut sink = Vec::new();
            let me = Local { secret: &own, role: Role::Responder, rank: 0, epoch: 1, mode: LinkSecurity::Aead };
            let r = auth::handshake(&mut a, me, Duration::from_secs(5)).await.map(|e| e.peer);
            let _ = tokio::time::timeout(Duration::from_millis(1), a.read_to_end(&mut sink)).await;
            r
        });
        prop_assert!(result.is_err(), "a handshake without the secret succeeded: {result:?}");
    }

    /// Hostfile text from a line grammar (and raw text): parsed or refused by name.
    #[test]
    fn fuzz_hostfile_parser(lines in proptest::collection::vec(hostfile_line(), 0..8), raw in ".{0,40}") {
        let text = if raw.len() % 4 == 0 { raw } else { lines.join("\n") };
        match dvmd::hostfile::parse(&text, "fuzz-hosts") {
            Ok(hosts) => {
                prop_assert!(!hosts.is_empty());
                for h in hosts {
                    prop_assert!(!h.name.is_empty() && !h.name.contains(char::is_whitespace), "{h:?}");
                }
            }
            Err(e) => prop_assert!(e.to_string().starts_with("fuzz-hosts") || e.to_string().contains("fuzz-hosts"), "{e}"),
        }
        let _ = dvmd::hostfile::parse_host_list(&text);
    }

    /// prun command lines from its own vocabulary (and arbitrary words): parsed or refused
    /// with a message, never a panic.
    #[test]
    fn fuzz_prun_command_line(words in proptest::collection::vec(prun_word(), 0..12)) {
        let cwd = std::path::Path::new("/");
        let env = |k: &str| (k == "HOME").then(|| "/root".to_string());
        if let Err(e) = dvmd::prun_cli::parse(&words, cwd, &env) {
            prop_assert!(!e.to_string().is_empty());
        }
    }
}

fn hostfile_line() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c]{1,3}".prop_map(|h| h),
        (
            "[a-c]{1,3}",
            prop_oneof![
                Just("0".to_string()),
                Just("4".to_string()),
                Just("99999999999".to_string()),
                "[0-9a-z]{0,3}".prop_map(|s| s)
            ]
        )
            .prop_map(|(h, s)| format!("{h} slots={s}")),
        ("[a-c]{1,2}", "[a-z=]{1,8}").prop_map(|(h, kv)| format!("{h} {kv}")),
        Just("# comment".to_string()),
        Just(String::new()),
        "[ \t#=a-z0-9]{0,12}".prop_map(|s| s),
    ]
}

fn prun_word() -> impl Strategy<Value = String> {
    let vocab = [
        "-n",
        "--np",
        "-N",
        "--map-by",
        "slot",
        "node",
        "ppr:2:node",
        "ppr:0:node",
        "ppr:2:node:oversubscribe",
        "--host",
        "a,b:2",
        "--hostfile",
        "/nonexistent",
        "-x",
        "A=b",
        "HOME",
        "--wdir",
        "/tmp",
        "--output",
        "tag",
        "merge-stderr-to-stdout",
        "--stdin",
        "all",
        "none",
        "rank",
        "--timeout",
        "0",
        "-1",
        "1e309",
        "--dvm-uri",
        "file:/nonexistent",
        "--local",
        "--slots",
        "--launch-sizes",
        ":",
        "true",
        "./a.out",
        "4",
        "0",
        "4294967296",
        "--",
        "-",
        "--help",
    ];
    prop_oneof![
        4 => proptest::sample::select(vocab.to_vec()).prop_map(str::to_string),
        1 => ".{0,8}".prop_map(|s| s),
    ]
}

/// A PMI word: the vocabulary of PMI-1 lines and PMI-2 frames, and noise.
fn pmi_piece() -> impl Strategy<Value = Vec<u8>> {
    let cmd = prop_oneof![
        Just("init pmi_version=1 pmi_subversion=1"),
        Just("init pmi_version=2 pmi_subversion=0"),
        Just("get_maxes"),
        Just("get_appnum"),
        Just("get_my_kvsname"),
        Just("get_universe_size"),
        Just("put kvsname=k key=a value=b"),
        Just("get kvsname=k key=a"),
        Just("barrier_in"),
        Just("finalize"),
        Just("abort exitcode=3"),
        Just("publish_name service=s port=p"),
        Just("lookup_name service=s"),
    ];
    prop_oneof![
        cmd.prop_map(|c| format!("cmd={c}\n").into_bytes()),
        "[a-z_=;0-9 ]{0,30}\n?".prop_map(String::into_bytes),
        ("[a-z-]{1,12}", "[a-z=;]{0,20}").prop_map(|(c, rest)| {
            let body = format!("cmd={c};{rest}");
            format!("{:<6}{body}", body.len()).into_bytes()
        }),
        Just(b"mcmd=spawn\nnprocs=1\nexecname=x\n".to_vec()),
        Just(b"endcmd\n".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..64),
    ]
}

proptest! {
    #![proptest_config(dvm_tests::fuzz::config(500))]

    /// PMI bytes in any chunking: the decoder answers requests or one named error, never
    /// panics, and never holds more than a line or a frame's worth.
    #[test]
    fn fuzz_pmi_decoder(pieces in proptest::collection::vec(pmi_piece(), 0..16), cut in 1usize..17) {
        use dvm_core::pmi::wire::{Decoder, MAX_FRAME, MAX_LINE};
        let stream: Vec<u8> = pieces.concat();
        let mut d = Decoder::default();
        let mut failed = false;
        for chunk in stream.chunks(cut) {
            d.push(chunk);
            loop {
                match d.next_request() {
                    Ok(Some(r)) => prop_assert!(!failed, "a request after an error: {r:?}"),
                    Ok(None) => break,
                    Err(e) => {
                        prop_assert!(!e.to_string().is_empty());
                        failed = true;
                    }
                }
            }
            prop_assert!(d.pending() <= MAX_FRAME.max(MAX_LINE) + 6 + cut, "{} bytes held", d.pending());
        }
    }

    /// The same bytes from ranks into a DVM of 2 daemons: jobs may fail, the daemons never do,
    /// and the next job runs.
    #[test]
    fn fuzz_pmi_server(pieces in proptest::collection::vec(pmi_piece(), 0..12), rank in 0u32..2) {
        use dvm_core::harness::{job, Net, Program};
        let mut net = Net::boot(2, 2, 1);
        net.launch(job(2, Program::Hang.argv()));
        net.run();
        for p in &pieces {
            net.pmi_send(rank, 1, rank, p);
            net.run();
        }
        prop_assert!(net.alive(0) && net.alive(1));
        // Job 1 ends (if what it sent did not end it), and the next job runs.
        let cancel = dvm_proto::control::CancelRequest { jobids: vec![1], all: false, uid: 0 };
        net.control(dvm_core::node::Control::Cancel(cancel));
        net.run();
        let next = net.launch(job(2, Program::Exit { code: 0, after_ns: 1000 }.argv()));
        net.run_for(60_000_000_000);
        prop_assert!(net.ended(next).is_some(), "the next job did not end");
    }
}
