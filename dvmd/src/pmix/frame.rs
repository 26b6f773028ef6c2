//! Frames on the daemon <-> PMIx worker sockets: `u32 little-endian length | prost message`.
//! Both ends are this project's own processes, yet a frame is still checked before it is
//! allocated: a corrupt length is an error, never a huge allocation.

use std::io::{self, Read, Write};

use prost::Message;

/// Largest frame either side accepts: a fence result (the whole modex of a job) is the
/// biggest thing that crosses, and the RML refuses messages above its own limit long before.
pub const MAX_FRAME: usize = 1 << 30;

/// Write one message as a frame.
pub fn write_frame(w: &mut impl Write, msg: &impl Message) -> io::Result<()> {
    let len = msg.encoded_len();
    if len > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a {len}-byte frame is above {MAX_FRAME}")));
    }
    let mut buf = Vec::with_capacity(4 + len);
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    msg.encode(&mut buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    w.write_all(&buf)?;
    w.flush()
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
