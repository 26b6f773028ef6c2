//! RML wire frames and their tokio-util codec.
//!
//! On the wire: `u32 BE total | varint header_len | FrameHeader (prost) | payload`, where
//! `total` counts every byte after itself. The payload is a [`Payload`] (pieces of `Bytes`), so
//! one encoded payload, and the large fields inside it, are shared by every send that carries
//! them; the decoder hands the payload out as one zero-copy slice of the receive buffer.
//!
//! Trap: the size limit is checked on the length prefix, before any byte of the body is
//! buffered, so an oversized frame never costs memory; the caller closes the connection.

use bytes::{Buf, BufMut, BytesMut};
use dvm_proto::rml::{FrameHeader, Tag};
use dvm_proto::Payload;
use prost::Message;
use tokio_util::codec::{Decoder, Encoder};

/// Default largest frame (everything after the length prefix) a connection accepts: 100 MiB.
pub const DEFAULT_MAX_FRAME: usize = 100 * 1024 * 1024;

/// Bytes of the length prefix.
pub const LEN_PREFIX: usize = 4;

/// One RML message: routing header plus opaque payload (its type is fixed by `header.tag`).
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub header: FrameHeader,
    pub payload: Payload,
}

impl Frame {
    pub fn new(header: FrameHeader, payload: impl Into<Payload>) -> Self {
        Frame { header, payload: payload.into() }
    }

    /// The transport's keep-alive frame from `origin` to `dst` (empty payload).
    pub fn heartbeat(origin: u32, dst: u32, epoch: u64) -> Self {
        let header = FrameHeader { origin, dst, tag: Tag::Heartbeat as u32, epoch, seq: 0 };
        Frame { header, payload: Payload::default() }
    }

    pub fn is_heartbeat(&self) -> bool {
        self.header.tag == Tag::Heartbeat as u32
    }

    /// Value of the length prefix: bytes after it (varint header length, header, payload).
    pub fn body_len(&self) -> usize {
        self.header.encoded_len() + prost::length_delimiter_len(self.header.encoded_len()) + self.payload.len()
    }

    /// The length prefix and the length-delimited header, i.e. every byte of the frame except
    /// the payload. Writers send this and then the shared payload, so the payload is never
    /// copied per destination.
    pub fn encode_prefix(&self) -> BytesMut {
        let hlen = self.header.encoded_len();
        let mut out = BytesMut::with_capacity(LEN_PREFIX + 10 + hlen);
        // body_len() <= u32::MAX is checked by every caller that enforces a max frame size.
        out.put_u32(self.body_len() as u32);
        self.header.encode_length_delimited(&mut out).expect("BytesMut grows on demand");
        out
    }
}

/// Why a byte stream did not yield a frame.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {size} bytes exceeds the max message size of {max} bytes")]
    TooLarge { size: u64, max: usize },
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Length-prefixed RML frame codec with a max frame size.
#[derive(Debug, Clone, Copy)]
pub struct FrameCodec {
    max_frame: usize,
}

impl FrameCodec {
    /// `max_frame` bounds the length prefix (everything after it); at most `u32::MAX`.
    pub fn new(max_frame: usize) -> Self {
        FrameCodec { max_frame: max_frame.min(u32::MAX as usize) }
    }

    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// Refuse a frame this codec's peer would refuse, before it is queued.
    pub fn check_size(&self, frame: &Frame) -> Result<(), FrameError> {
        let size = frame.body_len();
        if size > self.max_frame {
            return Err(FrameError::TooLarge { size: size as u64, max: self.max_frame });
        }
        Ok(())
    }
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec::new(DEFAULT_MAX_FRAME)
    }
}

impl FrameCodec {
    /// Split the next whole frame body (everything after its length prefix) off `src`, once
    /// it has fully arrived. `extra` is what a sealed frame carries beyond the plain body (its
    /// tag); the prefix is checked against `max_frame + extra` before anything is buffered.
    pub fn take_body(&self, src: &mut BytesMut, extra: usize) -> Result<Option<BytesMut>, FrameError> {
        let Some(body) = announced(src) else { return Ok(None) };
        if body > self.max_frame.saturating_add(extra) {
            // The size of the frame inside the seal, as the sender counted it.
            return Err(FrameError::TooLarge { size: (body - extra) as u64, max: self.max_frame });
        }
        let total = LEN_PREFIX + body;
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        let mut body = src.split_to(total);
        body.advance(LEN_PREFIX);
        Ok(Some(body))
    }

    /// Parse a plain frame body: `varint header_len | header | payload`.
    pub fn parse_body(mut body: BytesMut) -> Result<Frame, FrameError> {
        let hlen = prost::decode_length_delimiter(&mut body)
            .map_err(|e| FrameError::Malformed(format!("header length: {e}")))?;
        if hlen > body.len() {
            return Err(FrameError::Malformed(format!(
                "header length {hlen} exceeds the {} bytes left in the frame",
                body.len()
            )));
        }
        let header =
            FrameHeader::decode(body.split_to(hlen)).map_err(|e| FrameError::Malformed(format!("header: {e}")))?;
        Ok(Frame { header, payload: body.freeze().into() })
    }
}

/// The body length the frame at the head of `src` announces, once its prefix has arrived.
pub fn announced(src: &[u8]) -> Option<usize> {
    let prefix: [u8; LEN_PREFIX] = src.get(..LEN_PREFIX)?.try_into().ok()?;
    Some(u32::from_be_bytes(prefix) as usize)
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        match self.take_body(src, 0)? {
            Some(body) => Ok(Some(FrameCodec::parse_body(body)?)),
            None => Ok(None),
        }
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        self.check_size(&frame)?;
        dst.reserve(LEN_PREFIX + frame.body_len());
        dst.extend_from_slice(&frame.encode_prefix());
        for part in frame.payload.parts() {
            dst.extend_from_slice(part);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(seq: u64, payload: &'static [u8]) -> Frame {
        let header = FrameHeader { origin: 3, dst: 9, tag: Tag::Grpcomm as u32, epoch: 7, seq };
        Frame::new(header, bytes::Bytes::from_static(payload))
    }

    #[test]
    fn prefix_counts_every_byte_after_itself() {
        let f = frame(1, b"abc");
        let mut buf = BytesMut::new();
        FrameCodec::default().encode(f.clone(), &mut buf).unwrap();
        let len = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
        assert_eq!(len, buf.len() - LEN_PREFIX);
        assert_eq!(len, f.body_len());
    }

    #[test]
    fn oversized_prefix_is_refused_before_the_body_arrives() {
        let mut codec = FrameCodec::new(16);
        let mut buf = BytesMut::from(&17u32.to_be_bytes()[..]);
        match codec.decode(&mut buf) {
            Err(FrameError::TooLarge { size: 17, max: 16 }) => {}
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }

    #[test]
    fn header_length_past_the_frame_is_malformed() {
        let mut buf = BytesMut::new();
        buf.put_u32(2);
        buf.put_u8(50); // header claims 50 bytes, frame holds 1
        buf.put_u8(0);
        assert!(matches!(FrameCodec::default().decode(&mut buf), Err(FrameError::Malformed(_))));
    }
}
