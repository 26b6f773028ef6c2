//! Frames on the daemon <-> PMIx worker sockets: `u32 little-endian length | prost message`.
//! Both ends are this project's own processes, yet a frame is still checked before it is
//! allocated: a corrupt length is an error, never a huge allocation.

use std::io::{self, Read, Write};

use prost::Message;

/// Largest frame either side accepts: a fence result (the whole modex of a job) is the
/// biggest thing that crosses, and the RML refuses messages above its own limit long before.
pub const MAX_FRAME: usize = 1 << 30;

/// Write one message as a frame. The message is encoded straight into `w` through a small
/// buffer: a fence result of tens of MiB is never copied whole into a frame first.
pub fn write_frame(w: &mut impl Write, msg: &impl Message) -> io::Result<()> {
    let len = msg.encoded_len();
    if len > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a {len}-byte frame is above {MAX_FRAME}")));
    }
    let mut out = Streaming { w, buf: Vec::with_capacity(STREAM_CHUNK), err: None };
    out.buf.extend_from_slice(&(len as u32).to_le_bytes());
    msg.encode(&mut out).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    out.drain();
    match out.err {
        Some(e) => Err(e),
        None => out.w.flush(),
    }
}

/// The buffer through which [`write_frame`] encodes.
const STREAM_CHUNK: usize = 64 * 1024;

/// A `BufMut` that passes what is put into it on to a writer, a buffer at a time. A write
/// error is kept (a `BufMut` cannot fail) and everything after it is dropped.
struct Streaming<'a, W: Write> {
    w: &'a mut W,
    buf: Vec<u8>,
    err: Option<io::Error>,
}

impl<W: Write> Streaming<'_, W> {
    fn drain(&mut self) {
        if self.err.is_none() {
            if let Err(e) = self.w.write_all(&self.buf) {
                self.err = Some(e);
            }
        }
        self.buf.clear();
    }
}

// SAFETY: `chunk_mut` returns the buffer's spare capacity, never empty (a full buffer is
// drained first), and `advance_mut` only counts bytes the caller initialised in it.
unsafe impl<W: Write> bytes::BufMut for Streaming<'_, W> {
    fn remaining_mut(&self) -> usize {
        usize::MAX - self.buf.len()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        let len = self.buf.len() + cnt;
        assert!(len <= self.buf.capacity(), "advanced past the chunk handed out");
        // SAFETY: the caller initialised `cnt` bytes of the spare capacity (checked above).
        unsafe { self.buf.set_len(len) };
        if self.buf.len() == self.buf.capacity() {
            self.drain();
        }
    }

    fn chunk_mut(&mut self) -> &mut bytes::buf::UninitSlice {
        if self.buf.len() == self.buf.capacity() {
            self.drain();
        }
        bytes::buf::UninitSlice::uninit(self.buf.spare_capacity_mut())
    }
}

/// Read one frame; `Ok(None)` at a clean end of stream (between frames).
pub fn read_frame<M: Message + Default>(r: &mut impl Read) -> io::Result<Option<M>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame announced {len} bytes (limit {MAX_FRAME})"),
        ));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    // From Bytes, so large bytes fields are slices of this buffer rather than copies of it.
    M::decode(bytes::Bytes::from(buf)).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dvm_proto::pmixworker::{worker_cmd::Body, DeregisterNspace, WorkerCmd};

    #[test]
    fn round_trip_and_clean_end() {
        let msg = WorkerCmd { body: Some(Body::DeregisterNspace(DeregisterNspace { nspace: "ns".into() })) };
        let mut buf = Vec::new();
        write_frame(&mut buf, &msg).unwrap();
        write_frame(&mut buf, &msg).unwrap();
        let mut r = &buf[..];
        assert_eq!(read_frame::<WorkerCmd>(&mut r).unwrap(), Some(msg.clone()));
        assert_eq!(read_frame::<WorkerCmd>(&mut r).unwrap(), Some(msg));
        assert_eq!(read_frame::<WorkerCmd>(&mut r).unwrap(), None);
    }

    #[test]
    fn a_large_message_streams_through_the_small_buffer() {
        use dvm_proto::pmixworker::Complete;
        // Larger than the buffer and not a multiple of it.
        let data: Vec<u8> = (0..3 * STREAM_CHUNK + 12_345).map(|i| (i * 7 + i / 251) as u8).collect();
        let msg = WorkerCmd { body: Some(Body::Complete(Complete { reply: 9, status: -3, data: data.into() })) };
        let mut buf = Vec::new();
        write_frame(&mut buf, &msg).unwrap();
        let mut whole = (msg.encoded_len() as u32).to_le_bytes().to_vec();
        whole.extend_from_slice(&msg.encode_to_vec());
        assert_eq!(buf, whole, "the same bytes as encoding it whole");
        assert_eq!(read_frame::<WorkerCmd>(&mut &buf[..]).unwrap(), Some(msg));
    }

    #[test]
    fn a_write_error_is_returned() {
        struct Full(usize);
        impl Write for Full {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    return Err(io::Error::new(io::ErrorKind::StorageFull, "full"));
                }
                let n = b.len().min(self.0);
                self.0 -= n;
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let msg = WorkerCmd {
            body: Some(Body::Complete(dvm_proto::pmixworker::Complete {
                reply: 1,
                status: 0,
                data: vec![1u8; 200_000].into(),
            })),
        };
        let err = write_frame(&mut Full(100_000), &msg).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
    }

    #[test]
    fn huge_length_is_refused_before_allocation() {
        let buf = u32::MAX.to_le_bytes();
        let err = read_frame::<WorkerCmd>(&mut &buf[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("announced"), "{err}");
    }

    #[test]
    fn truncated_frame_is_an_error_not_an_end() {
        let msg = WorkerCmd { body: Some(Body::DeregisterNspace(DeregisterNspace { nspace: "nspace".into() })) };
        let mut buf = Vec::new();
        write_frame(&mut buf, &msg).unwrap();
        buf.truncate(buf.len() - 2);
        assert!(read_frame::<WorkerCmd>(&mut &buf[..]).is_err());
    }
}
