//! An encoded message in pieces: the small encoded bytes of its fields, and the large `bytes`
//! fields it carries, shared with the message instead of copied into the encoding.
//!
//! Owns: [`Payload`] and the encoder that builds it. Never: a change of the wire format. The
//! pieces written in order are exactly the bytes `Message::encode_to_vec` gives, so a receiver
//! reads one contiguous frame as before.
//!
//! Why: a daemon relaying a 48 MiB fence result to its children encoded it once per relay into
//! a fresh buffer, a second copy of every large payload it moved.

use bytes::buf::UninitSlice;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

/// A `bytes` field at least this long is shared, not copied, by [`Payload::encode`].
pub const SHARE_MIN: usize = 16 * 1024;

/// The bytes of one frame's payload, in order, as one or more pieces.
#[derive(Clone, Debug, Default)]
pub struct Payload {
    parts: Vec<Bytes>,
    len: usize,
}

impl Payload {
    /// `msg` encoded, its `bytes` fields of [`SHARE_MIN`] bytes or more shared, not copied.
    pub fn encode<M: Message>(msg: &M) -> Payload {
        let mut w = Pieces { cur: BytesMut::with_capacity(msg.encoded_len().min(SHARE_MIN)), out: Payload::default() };
        msg.encode_raw(&mut w);
        w.flush();
        w.out
    }

    /// Bytes in all pieces.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces, in order.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// The payload as one `Bytes`: as it is when it is one piece, else a copy of the pieces.
    pub fn into_bytes(mut self) -> Bytes {
        match self.parts.len() {
            0 => Bytes::new(),
            1 => self.parts.pop().unwrap_or_default(),
            _ => {
                let mut all = BytesMut::with_capacity(self.len);
                for p in &self.parts {
                    all.extend_from_slice(p);
                }
                all.freeze()
            }
        }
    }

    fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.len += b.len();
            self.parts.push(b);
        }
    }
}

impl From<Bytes> for Payload {
    fn from(b: Bytes) -> Payload {
        let mut p = Payload::default();
        p.push(b);
        p
    }
}

/// Equal when the bytes are, however they are cut.
impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        self.len == other.len && self.parts.iter().flat_map(|p| p.iter()).eq(other.parts.iter().flat_map(|p| p.iter()))
    }
}

impl Eq for Payload {}

impl PartialEq<Bytes> for Payload {
    fn eq(&self, other: &Bytes) -> bool {
        self.len == other.len() && self.parts.iter().flat_map(|p| p.iter()).eq(other.iter())
    }
}

/// The encoder behind [`Payload::encode`]: small writes gather in `cur`; a large `Bytes` put
/// by prost for a `bytes` field ends the current piece and becomes a piece of its own.
struct Pieces {
    cur: BytesMut,
    out: Payload,
}

impl Pieces {
    fn flush(&mut self) {
        let done = self.cur.split().freeze();
        self.out.push(done);
    }
}

// SAFETY: every method that touches uninitialised memory is `BytesMut`'s own, delegated as is.
unsafe impl BufMut for Pieces {
    fn remaining_mut(&self) -> usize {
        self.cur.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.cur.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.cur.chunk_mut()
    }

    fn put<T: Buf>(&mut self, mut src: T)
    where
        Self: Sized,
    {
        let n = src.remaining();
        if n >= SHARE_MIN {
            // For a `Bytes` (every `bytes` field here) this is a slice of it, not a copy.
            self.flush();
            let shared = src.copy_to_bytes(n);
            self.out.push(shared);
        } else {
            while src.has_remaining() {
                let c = src.chunk();
                let k = c.len();
                self.cur.extend_from_slice(c);
                src.advance(k);
            }
        }
    }

    fn put_slice(&mut self, src: &[u8]) {
        self.cur.extend_from_slice(src);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpcomm::{grpcomm_msg::Body, FenceBlock, FenceRelease, GrpcommMsg, XcastForward};

    fn concat(p: &Payload) -> Vec<u8> {
        p.parts().iter().flat_map(|b| b.iter().copied()).collect()
    }

    #[test]
    fn pieces_are_the_encoding_and_large_fields_are_shared() {
        let big = Bytes::from((0..200_000u32).map(|x| x as u8).collect::<Vec<u8>>());
        let (b1, b2) = (big.slice(..50_000), big.slice(100_000..));
        // Each message with the large fields that must be pieces of their own, not copies.
        let msgs = [
            (
                GrpcommMsg {
                    body: Some(Body::Forward(XcastForward {
                        op_id: 7,
                        tag: 9,
                        payload: big.clone(),
                        total_len: 200_000,
                        ..Default::default()
                    })),
                },
                vec![big.clone()],
            ),
            (
                GrpcommMsg {
                    body: Some(Body::Release(FenceRelease { data: big.slice(..SHARE_MIN - 1), ..Default::default() })),
                },
                vec![],
            ),
            (
                GrpcommMsg {
                    body: Some(Body::Block(FenceBlock {
                        step: 3,
                        blocks: vec![b1.clone(), Bytes::from_static(b"small"), b2.clone()],
                        ..Default::default()
                    })),
                },
                vec![b1, b2],
            ),
            (GrpcommMsg::default(), vec![]),
        ];
        for (m, shared) in msgs {
            let p = Payload::encode(&m);
            assert_eq!(concat(&p), m.encode_to_vec());
            assert_eq!(p.len(), m.encoded_len());
            assert_eq!(GrpcommMsg::decode(p.clone().into_bytes()).unwrap(), m);
            for field in &shared {
                assert!(
                    p.parts().iter().any(|b| b.as_ptr() == field.as_ptr() && b.len() == field.len()),
                    "a large field was copied"
                );
            }
            assert!(p.parts().len() <= 2 * shared.len() + 1, "small pieces gathered between shared ones");
        }
    }

    #[test]
    fn equality_ignores_where_the_pieces_are_cut() {
        let mut a = Payload::from(Bytes::from_static(b"abc"));
        a.push(Bytes::from_static(b"def"));
        assert_eq!(a, Payload::from(Bytes::from_static(b"abcdef")));
        assert_ne!(a, Payload::from(Bytes::from_static(b"abcdeg")));
        assert_eq!(a.into_bytes(), Bytes::from_static(b"abcdef"));
        assert!(Payload::from(Bytes::new()).parts().is_empty());
    }
}
