//! Per-frame protection of an authenticated connection: every frame after the handshake is
//! sealed by the sender and opened (verified, and decrypted) by the receiver.
//!
//! Owns: the link-security modes, the per-connection keys and the per-direction sequence
//! numbers. Never: routing or any decision about what a frame means.
//!
//! Keys: HKDF-SHA256 over the DVM secret, salted with both handshake nonces (initiator's
//! first), expanded once per direction and mode. A connection's keys are therefore fresh even
//! when the same two daemons reconnect, and the key of one direction never opens the other.
//!
//! Sealing, with the 64-bit frame counter of the direction (from 0, never wrapping on one key)
//! in every tag:
//! - `aead`: `u32 BE len | (ciphertext | tag) per chunk`, where the plain body (`varint
//!   header_len | header | payload`) is cut into chunks of [`CHUNK`] bytes (the last shorter; an
//!   empty body is one empty chunk), each sealed with AES-256-GCM from `ring` (AES-NI and CLMUL
//!   code), the nonce `chunk index (u32 BE) | frame counter (u64 BE)` and the length prefix as
//!   associated data: routing headers and payloads are confidential. Chunks bound the sender's
//!   scratch to one chunk whatever the frame's size (a whole-frame seal held a copy of every
//!   large frame per link); a chunk cut, moved or dropped fails its tag.
//! - `mac`: `u32 BE len | varint header_len | header | payload | tag`, where the tag is keyed
//!   BLAKE3 over the counter and the whole frame, truncated to 128 bits: integrity only.
//!   (GCM's tag over associated data alone runs at a sixth of its speed over ciphertext in
//!   `ring`; BLAKE3 is faster than either: `cargo bench -p dvm-rml --bench seal`.)
//! - `none`: the frame as [`crate::frame`] writes it (the handshake alone; for measurement on a
//!   trusted network).
//!
//! Invariants: the receiver's counter advances only on a frame that verified, so a replayed,
//! dropped, reordered or altered frame fails verification and the connection is closed; a
//! frame is never handed out before it verified.
//!
//! Trap: the length prefix is checked against the max message size (plus the tag) before any
//! byte of the body is buffered, exactly as for plain frames.

use std::fmt;
use std::str::FromStr;

use bytes::BytesMut;
use hkdf::Hkdf;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_util::codec::Decoder;

use crate::auth::{DvmSecret, Role};
use crate::frame::{announced, Frame, FrameCodec, FrameError, LEN_PREFIX};

/// Bytes of the tag a sealed frame carries after its body.
pub const TAG_LEN: usize = 16;

/// Plain bytes per sealed chunk of an `aead` frame.
pub const CHUNK: usize = 64 * 1024;

/// Chunks of an `aead` frame whose plain body is `body` bytes.
fn chunks(body: usize) -> usize {
    body.div_ceil(CHUNK).max(1)
}

/// How frames are protected after the handshake. The same on every daemon of a DVM: a
/// handshake between two different modes is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkSecurity {
    /// Handshake only: frames carry no tag. For a baseline measurement on a trusted network.
    None,
    /// Every frame carries a tag (integrity and order), contents in clear.
    Mac,
    /// Every frame is encrypted and carries a tag (integrity, order, confidentiality).
    Aead,
}

impl LinkSecurity {
    /// The default: encryption. Measured (docs/security.md): barrier cost within noise, a 1 MiB
    /// broadcast ~1.06x, about what `Mac` costs, so integrity alone buys little.
    pub const DEFAULT: LinkSecurity = LinkSecurity::Aead;

    /// Value carried in the handshake hello (0 is "unspecified" and never valid).
    pub fn wire(self) -> u32 {
        match self {
            LinkSecurity::None => 1,
            LinkSecurity::Mac => 2,
            LinkSecurity::Aead => 3,
        }
    }

    /// The mode a hello's value names, if any.
    pub fn from_wire(v: u32) -> Option<LinkSecurity> {
        match v {
            1 => Some(LinkSecurity::None),
            2 => Some(LinkSecurity::Mac),
            3 => Some(LinkSecurity::Aead),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            LinkSecurity::None => "none",
            LinkSecurity::Mac => "mac",
            LinkSecurity::Aead => "aead",
        }
    }

    /// Bytes a sealed frame whose plain body is `body` bytes carries beyond the plain frame.
    pub fn overhead(self, body: usize) -> usize {
        match self {
            LinkSecurity::None => 0,
            LinkSecurity::Mac => TAG_LEN,
            LinkSecurity::Aead => TAG_LEN * chunks(body),
        }
    }
}

impl Default for LinkSecurity {
    fn default() -> Self {
        LinkSecurity::DEFAULT
    }
}

impl fmt::Display for LinkSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown `--link-security` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("link security '{0}' is not one of none, mac, aead")]
pub struct UnknownLinkSecurity(pub String);

impl FromStr for LinkSecurity {
    type Err = UnknownLinkSecurity;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(LinkSecurity::None),
            "mac" => Ok(LinkSecurity::Mac),
            "aead" => Ok(LinkSecurity::Aead),
            other => Err(UnknownLinkSecurity(other.to_string())),
        }
    }
}

/// Why a received frame was refused.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("frame {seq} failed verification (altered, replayed, dropped or reordered in flight)")]
    Verification { seq: u64 },
    #[error(transparent)]
    Frame(#[from] FrameError),
}

impl From<std::io::Error> for OpenError {
    fn from(e: std::io::Error) -> Self {
        OpenError::Frame(FrameError::Io(e))
    }
}

/// What one handshake established, from which a connection's keys are derived.
#[derive(Clone, Copy)]
pub struct LinkParams<'a> {
    pub secret: &'a DvmSecret,
    pub mode: LinkSecurity,
    /// This side of the connection.
    pub role: Role,
    pub initiator_nonce: &'a [u8],
    pub responder_nonce: &'a [u8],
}

impl LinkParams<'_> {
    /// The sealer for frames this side sends and the opener for frames it receives.
    pub fn keys(&self, max_frame: usize) -> (Sealer, Opener) {
        let send = self.key(self.role);
        let recv = self.key(self.role.peer());
        let sealer = Sealer { key: send, seq: 0, scratch: Vec::new() };
        let extra = self.mode.overhead(max_frame);
        let opener = Opener { key: recv, seq: 0, codec: FrameCodec::new(max_frame), extra };
        (sealer, opener)
    }

    /// The key of frames sent by `sender`; none for [`LinkSecurity::None`].
    fn key(&self, sender: Role) -> Option<Key> {
        if self.mode == LinkSecurity::None {
            return None;
        }
        let mut salt = Vec::with_capacity(self.initiator_nonce.len() + self.responder_nonce.len());
        salt.extend_from_slice(self.initiator_nonce);
        salt.extend_from_slice(self.responder_nonce);
        let hk = Hkdf::<Sha256>::new(Some(&salt), self.secret.as_bytes());
        let mut key = [0u8; 32];
        let info = [b"dvm-link-v2 ".as_slice(), self.mode.as_str().as_bytes(), &[b' ', sender.byte()]].concat();
        hk.expand(&info, &mut key).expect("32 bytes is a valid HKDF-SHA256 output length");
        Some(match self.mode {
            LinkSecurity::Aead => Key::Aead(Box::new(LessSafeKey::new(
                UnboundKey::new(&AES_256_GCM, &key).expect("32 bytes is an AES-256 key"),
            ))),
            LinkSecurity::Mac | LinkSecurity::None => Key::Mac(key),
        })
    }
}

/// One direction's key.
enum Key {
    /// AES-256-GCM.
    Aead(Box<LessSafeKey>),
    /// The key of keyed BLAKE3.
    Mac([u8; 32]),
}

/// The nonce of chunk `chunk` of frame `seq` of one direction: unique per key because the
/// counter never repeats on one connection, a frame has fewer than 2^32 chunks, and every
/// connection has fresh keys.
fn nonce(seq: u64, chunk: u32) -> Nonce {
    let mut n = [0u8; 12];
    n[..4].copy_from_slice(&chunk.to_be_bytes());
    n[4..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The `mac` tag of frame `seq`: keyed BLAKE3 over the counter and the frame as it goes on the
/// wire (`prefix` is the length prefix, `body` the rest), truncated to [`TAG_LEN`].
fn mac_tag(key: &[u8; 32], seq: u64, prefix: &[u8], body: &[&[u8]]) -> [u8; TAG_LEN] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(&seq.to_be_bytes());
    h.update(prefix);
    for part in body {
        h.update(part);
    }
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
    tag
}

/// Seals the frames one side sends on one connection, in order.
pub struct Sealer {
    key: Option<Key>,
    seq: u64,
    /// Reused buffer for the ciphertext of one chunk (aead).
    scratch: Vec<u8>,
}

impl Sealer {
    /// Write `frame` sealed to `w` (no flush). The frame's size was checked by the sender.
    pub async fn write<W: AsyncWrite + Unpin>(&mut self, w: &mut W, frame: &Frame) -> std::io::Result<()> {
        let Some(key) = &self.key else {
            w.write_all(&frame.encode_prefix()).await?;
            for part in frame.payload.parts() {
                w.write_all(part).await?;
            }
            return Ok(());
        };
        let seq = self.seq;
        self.seq += 1;
        let mut prefix = frame.encode_prefix();
        let body = frame.body_len();
        let len = match key {
            Key::Aead(_) => body + TAG_LEN * chunks(body),
            Key::Mac(_) => body + TAG_LEN,
        };
        let len = (len as u32).to_be_bytes();
        prefix[..LEN_PREFIX].copy_from_slice(&len);
        match key {
            Key::Aead(cipher) => {
                w.write_all(&len).await?;
                self.scratch.reserve_exact((CHUNK + TAG_LEN).saturating_sub(self.scratch.len()));
                // The plain body is the header (after the prefix) and then the payload's
                // pieces; each chunk is gathered from them into the scratch buffer.
                let mut pieces =
                    std::iter::once(&prefix[LEN_PREFIX..]).chain(frame.payload.parts().iter().map(|b| &b[..]));
                let mut rest: &[u8] = &[];
                for i in 0..chunks(body) {
                    self.scratch.clear();
                    while self.scratch.len() < CHUNK {
                        if rest.is_empty() {
                            match pieces.next() {
                                Some(p) => rest = p,
                                None => break,
                            }
                        }
                        let n = rest.len().min(CHUNK - self.scratch.len());
                        self.scratch.extend_from_slice(&rest[..n]);
                        rest = &rest[n..];
                    }
                    // The tag goes after the chunk in the same buffer: one write per chunk.
                    cipher
                        .seal_in_place_append_tag(nonce(seq, i as u32), Aad::from(len), &mut self.scratch)
                        .map_err(|_| std::io::Error::other("chunk too large to seal"))?;
                    w.write_all(&self.scratch).await?;
                }
                Ok(())
            }
            Key::Mac(k) => {
                let mut parts: Vec<&[u8]> = vec![&prefix[LEN_PREFIX..]];
                parts.extend(frame.payload.parts().iter().map(|b| &b[..]));
                let tag = mac_tag(k, seq, &prefix[..LEN_PREFIX], &parts);
                w.write_all(&prefix).await?;
                for part in frame.payload.parts() {
                    w.write_all(part).await?;
                }
                w.write_all(&tag).await
            }
        }
    }
}

/// Opens the frames one side receives on one connection: a `Decoder` of sealed frames.
pub struct Opener {
    key: Option<Key>,
    seq: u64,
    codec: FrameCodec,
    /// The most a sealed frame of the largest size carries beyond it (its tags).
    extra: usize,
}

impl Opener {
    /// An opener for a stream of sealed frames under `params`, as the decoder of the receiving
    /// side (used by tests and the fuzz harness).
    pub fn new(params: &LinkParams<'_>, max_frame: usize) -> Opener {
        params.keys(max_frame).1
    }

    /// Frames verified so far.
    pub fn verified(&self) -> u64 {
        self.seq
    }

    /// Bytes still to arrive of the frame at the head of `src`; 0 until its length prefix has.
    /// `decode` has reserved room for them, so a reader adds no room of its own (growing a
    /// buffer that holds most of a large frame would double it).
    pub fn missing(&self, src: &BytesMut) -> usize {
        announced(src).map_or(0, |body| (LEN_PREFIX + body).saturating_sub(src.len()))
    }
}

impl Decoder for Opener {
    type Item = Frame;
    type Error = OpenError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, OpenError> {
        let Some(key) = &self.key else {
            return Ok(self.codec.decode(src)?);
        };
        let mut body = match self.codec.take_body(src, self.extra) {
            Ok(Some(body)) => body,
            Ok(None) => return Ok(None),
            // Refused before the body is buffered; say the size the sender counted.
            Err(FrameError::TooLarge { size, max }) => {
                let sealed = size as usize + self.extra;
                let plain = match key {
                    Key::Aead(_) => {
                        sealed / (CHUNK + TAG_LEN) * CHUNK + (sealed % (CHUNK + TAG_LEN)).saturating_sub(TAG_LEN)
                    }
                    Key::Mac(_) => sealed - TAG_LEN,
                };
                return Err(FrameError::TooLarge { size: plain as u64, max }.into());
            }
            Err(e) => return Err(e.into()),
        };
        let sealed = body.len();
        let prefix = (sealed as u32).to_be_bytes();
        if sealed < TAG_LEN {
            return Err(OpenError::Frame(FrameError::Malformed(format!(
                "sealed frame of {sealed} bytes is shorter than its tag"
            ))));
        }
        let bad = OpenError::Verification { seq: self.seq };
        match key {
            Key::Aead(cipher) => {
                // Open each chunk where it lies and move its plain bytes down over the tags
                // before it (`open_within`), so the frame is never copied whole.
                let (mut plain, mut at) = (0, 0);
                for i in 0u32.. {
                    let take = (CHUNK + TAG_LEN).min(sealed - at);
                    if take < TAG_LEN {
                        return Err(bad);
                    }
                    cipher
                        .open_within(nonce(self.seq, i), Aad::from(prefix), &mut body[plain..at + take], at - plain..)
                        .map_err(|_| OpenError::Verification { seq: self.seq })?;
                    plain += take - TAG_LEN;
                    at += take;
                    if at == sealed {
                        break;
                    }
                }
                body.truncate(plain);
            }
            Key::Mac(k) => {
                let tag_bytes = body.split_off(sealed - TAG_LEN);
                let ok: bool = mac_tag(k, self.seq, &prefix, &[&body]).ct_eq(&tag_bytes[..]).into();
                if !ok {
                    return Err(bad);
                }
            }
        }
        if body.len() > self.codec.max_frame() {
            return Err(FrameError::TooLarge { size: body.len() as u64, max: self.codec.max_frame() }.into());
        }
        self.seq += 1;
        Ok(Some(FrameCodec::parse_body(body)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{BufMut, Bytes};
    use dvm_proto::rml::{FrameHeader, Tag as RmlTag};

    fn frame(seq: u64, payload: &[u8]) -> Frame {
        let header = FrameHeader { origin: 1, dst: 2, tag: RmlTag::Grpcomm as u32, epoch: 3, seq };
        Frame::new(header, Bytes::copy_from_slice(payload))
    }

    fn pair(mode: LinkSecurity) -> (Sealer, Opener) {
        let secret = DvmSecret::from_bytes([7; 32]);
        let (i, r) = ([1u8; 32], [2u8; 32]);
        let p = |role| LinkParams { secret: &secret, mode, role, initiator_nonce: &i, responder_nonce: &r };
        (p(Role::Initiator).keys(1 << 20).0, p(Role::Responder).keys(1 << 20).1)
    }

    fn seal(s: &mut Sealer, f: &Frame) -> Vec<u8> {
        let mut out = Vec::new();
        futures_lite_block(s.write(&mut out, f)).unwrap();
        out
    }

    /// Run a future that never waits (writes into a Vec) to completion.
    fn futures_lite_block<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    #[test]
    fn every_mode_round_trips_in_order() {
        for mode in [LinkSecurity::None, LinkSecurity::Mac, LinkSecurity::Aead] {
            let (mut s, mut o) = pair(mode);
            let frames: Vec<Frame> = (0..5).map(|i| frame(i, &vec![i as u8; 100 * i as usize])).collect();
            let mut buf = BytesMut::new();
            for f in &frames {
                buf.extend_from_slice(&seal(&mut s, f));
            }
            for f in &frames {
                assert_eq!(o.decode(&mut buf).unwrap().as_ref(), Some(f), "{mode}");
            }
            assert!(buf.is_empty());
        }
    }

    fn pair_max(mode: LinkSecurity, max: usize) -> (Sealer, Opener) {
        let secret = DvmSecret::from_bytes([7; 32]);
        let (i, r) = ([1u8; 32], [2u8; 32]);
        let p = |role| LinkParams { secret: &secret, mode, role, initiator_nonce: &i, responder_nonce: &r };
        (p(Role::Initiator).keys(max).0, p(Role::Responder).keys(max).1)
    }

    #[test]
    fn aead_frames_of_many_chunks_round_trip_and_cost_one_tag_per_chunk() {
        // Around the chunk edges, with the header straddling none, and a frame of many chunks.
        let sizes = [0, 1, CHUNK - 40, CHUNK - 20, CHUNK, CHUNK + 1, 3 * CHUNK + 12_345];
        let (mut s, mut o) = pair_max(LinkSecurity::Aead, 4 * CHUNK);
        for (k, n) in sizes.into_iter().enumerate() {
            let payload: Vec<u8> = (0..n).map(|x| (x * 7 + k) as u8).collect();
            let f = frame(k as u64, &payload);
            let sealed = seal(&mut s, &f);
            let body = f.body_len();
            assert_eq!(sealed.len(), LEN_PREFIX + body + TAG_LEN * body.div_ceil(CHUNK).max(1), "{n}");
            assert!(s.scratch.capacity() <= CHUNK + TAG_LEN, "scratch holds one chunk, not the frame");
            let mut buf = BytesMut::from(&sealed[..]);
            assert_eq!(o.decode(&mut buf).unwrap().as_ref(), Some(&f), "{n}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn aead_chunks_altered_swapped_or_cut_fail() {
        let payload: Vec<u8> = (0..3 * CHUNK).map(|x| x as u8).collect();
        let (mut s, _) = pair_max(LinkSecurity::Aead, 4 * CHUNK);
        let sealed = seal(&mut s, &frame(0, &payload));
        let c = CHUNK + TAG_LEN;
        let mut flipped = sealed.clone();
        flipped[LEN_PREFIX + c + 100] ^= 1;
        let mut swapped = sealed.clone();
        swapped[LEN_PREFIX..LEN_PREFIX + 2 * c].rotate_left(c);
        // Drop the second chunk and shorten the prefix to match.
        let mut cut = sealed[..LEN_PREFIX + c].to_vec();
        cut.extend_from_slice(&sealed[LEN_PREFIX + 2 * c..]);
        let len = (cut.len() - LEN_PREFIX) as u32;
        cut[..LEN_PREFIX].copy_from_slice(&len.to_be_bytes());
        for (what, bytes) in [("flipped", flipped), ("swapped", swapped), ("cut", cut)] {
            let (_, mut o) = pair_max(LinkSecurity::Aead, 4 * CHUNK);
            let mut buf = BytesMut::from(&bytes[..]);
            assert!(matches!(o.decode(&mut buf), Err(OpenError::Verification { seq: 0 })), "{what}");
        }
    }

    #[test]
    fn aead_hides_the_payload_and_mac_does_not() {
        let f = frame(9, b"secret launch argv secret launch argv");
        let sealed = seal(&mut pair(LinkSecurity::Aead).0, &f);
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        let sealed = seal(&mut pair(LinkSecurity::Mac).0, &f);
        assert!(sealed.windows(6).any(|w| w == b"secret"));
    }

    #[test]
    fn altered_replayed_dropped_and_reordered_frames_fail() {
        for mode in [LinkSecurity::Mac, LinkSecurity::Aead] {
            let (mut s, _) = pair(mode);
            let a = seal(&mut s, &frame(0, b"first"));
            let b = seal(&mut s, &frame(1, b"second"));
            let cases: Vec<(&str, Vec<u8>)> = vec![
                ("flipped", {
                    let mut x = a.clone();
                    x[6] ^= 1;
                    x
                }),
                ("replayed", [a.clone(), a.clone()].concat()),
                ("dropped", b.clone()),
                ("reordered", [b.clone(), a.clone()].concat()),
            ];
            for (what, bytes) in cases {
                let (_, mut o) = pair(mode);
                let mut buf = BytesMut::from(&bytes[..]);
                let mut got = Vec::new();
                let err = loop {
                    match o.decode(&mut buf) {
                        Ok(Some(f)) => got.push(f),
                        Ok(None) => panic!("{mode} {what}: accepted everything"),
                        Err(e) => break e,
                    }
                };
                assert!(matches!(err, OpenError::Verification { .. }), "{mode} {what}: {err}");
                assert!(got.len() <= 1, "{mode} {what}");
            }
        }
    }

    #[test]
    fn directions_and_connections_have_distinct_keys() {
        let secret = DvmSecret::from_bytes([7; 32]);
        let (i, r) = ([1u8; 32], [2u8; 32]);
        let mode = LinkSecurity::Aead;
        let mut s =
            LinkParams { secret: &secret, mode, role: Role::Initiator, initiator_nonce: &i, responder_nonce: &r }
                .keys(1 << 20)
                .0;
        let sealed = seal(&mut s, &frame(0, b"x"));
        // The initiator's own opener (the other direction) and a connection with other nonces
        // both refuse it.
        let other = [3u8; 32];
        for (role, rn) in [(Role::Initiator, &r), (Role::Responder, &other)] {
            let mut o =
                LinkParams { secret: &secret, mode, role, initiator_nonce: &i, responder_nonce: rn }.keys(1 << 20).1;
            let mut buf = BytesMut::from(&sealed[..]);
            assert!(matches!(o.decode(&mut buf), Err(OpenError::Verification { seq: 0 })));
        }
    }

    #[test]
    fn oversized_sealed_prefix_is_refused_before_the_body() {
        let (_, mut o) = pair(LinkSecurity::Aead);
        let mut buf = BytesMut::new();
        buf.put_u32(((1 << 20) + LinkSecurity::Aead.overhead(1 << 20) + 1) as u32);
        assert!(matches!(o.decode(&mut buf), Err(OpenError::Frame(FrameError::TooLarge { .. }))));
        assert!(buf.capacity() < 1 << 16);
    }

    #[test]
    fn mode_names_parse_and_print() {
        for m in [LinkSecurity::None, LinkSecurity::Mac, LinkSecurity::Aead] {
            assert_eq!(m.to_string().parse::<LinkSecurity>().unwrap(), m);
            assert_eq!(LinkSecurity::from_wire(m.wire()), Some(m));
        }
        assert!("tls".parse::<LinkSecurity>().is_err());
        assert_eq!(LinkSecurity::from_wire(0), None);
    }
}
