//! Payload compression, decided once at the origin of an xcast.

use bytes::Bytes;
use flate2::{read::DeflateDecoder, write::DeflateEncoder, Compression};
use std::io::{Read, Write};

/// Deflate `payload` if it is at least `threshold` bytes and compression actually helps.
/// Returns (bytes to send, compressed flag).
pub(crate) fn maybe_compress(payload: Bytes, threshold: usize) -> (Bytes, bool) {
    if payload.len() < threshold {
        return (payload, false);
    }
    let mut enc = DeflateEncoder::new(Vec::with_capacity(payload.len() / 4), Compression::fast());
    if enc.write_all(&payload).is_err() {
        return (payload, false);
    }
    match enc.finish() {
        Ok(z) if z.len() < payload.len() => (Bytes::from(z), true),
        _ => (payload, false),
    }
}

/// Inflate a payload received with the compressed flag; never panics on bad input.
/// `limit` bounds the inflated size.
pub(crate) fn decompress(data: &[u8], limit: usize) -> Result<Bytes, String> {
    let mut out = Vec::new();
    let mut dec = DeflateDecoder::new(data).take(limit as u64 + 1);
    dec.read_to_end(&mut out).map_err(|e| format!("corrupt compressed payload: {e}"))?;
    if out.len() > limit {
        return Err(format!("compressed payload inflates beyond {limit} bytes"));
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_threshold() {
        let big = Bytes::from(vec![7u8; 100_000]);
        let (z, c) = maybe_compress(big.clone(), 1024);
        assert!(c && z.len() < big.len());
        assert_eq!(decompress(&z, 1 << 20).unwrap(), big);
        let small = Bytes::from_static(b"abc");
        assert_eq!(maybe_compress(small.clone(), 1024), (small, false));
        assert!(decompress(b"\xff\xfe garbage", 1 << 20).is_err());
        assert!(decompress(&z, 1000).is_err());
    }
}
