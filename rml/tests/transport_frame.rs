//! The frame codec over its input space: any frames, cut into any chunks, decode to exactly
//! the frames encoded; any bytes at all end in a frame, "need more" or an error, never a panic.
#![cfg(feature = "net")]

use bytes::{BufMut, Bytes, BytesMut};
use dvm_proto::rml::FrameHeader;
use dvm_rml::{Frame, FrameCodec, FrameError};
use proptest::prelude::*;
use tokio_util::codec::{Decoder, Encoder};

fn arb_frame() -> impl Strategy<Value = Frame> {
    (any::<u32>(), any::<u32>(), 0u32..6, any::<u64>(), any::<u64>(), prop::collection::vec(any::<u8>(), 0..3000))
        .prop_map(|(origin, dst, tag, epoch, seq, payload)| {
            Frame::new(FrameHeader { origin, dst, tag, epoch, seq }, Bytes::from(payload))
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn chunked_stream_decodes_to_the_frames_encoded(
        frames in prop::collection::vec(arb_frame(), 0..12),
        cuts in prop::collection::vec(1usize..700, 1..64),
    ) {
        let mut codec = FrameCodec::default();
        let mut wire = BytesMut::new();
        for f in &frames {
            // The writer's path (prefix, then the shared payload) equals the Encoder's.
            let mut by_parts = f.encode_prefix();
            by_parts.extend_from_slice(&f.payload.clone().into_bytes());
            let before = wire.len();
            codec.encode(f.clone(), &mut wire).unwrap();
            prop_assert_eq!(&wire[before..], &by_parts[..]);
            prop_assert_eq!(wire.len() - before, 4 + f.body_len());
        }
        let mut rx = BytesMut::new();
        let mut got = Vec::new();
        let mut pos = 0;
        let mut i = 0;
        while pos < wire.len() {
            let n = cuts[i % cuts.len()].min(wire.len() - pos);
            i += 1;
            rx.extend_from_slice(&wire[pos..pos + n]);
            pos += n;
            while let Some(f) = codec.decode(&mut rx).unwrap() {
                got.push(f);
            }
        }
        prop_assert!(rx.is_empty());
        prop_assert_eq!(got, frames);
    }

    #[test]
    fn arbitrary_bytes_never_panic(junk in prop::collection::vec(any::<u8>(), 0..2048), max in 64usize..4096) {
        let mut codec = FrameCodec::new(max);
        let mut buf = BytesMut::from(&junk[..]);
        loop {
            let before = buf.len();
            match codec.decode(&mut buf) {
                Ok(Some(f)) => {
                    prop_assert!(f.body_len() <= max);
                    prop_assert!(buf.len() < before);
                }
                Ok(None) | Err(FrameError::TooLarge { .. }) | Err(FrameError::Malformed(_)) => break,
                Err(FrameError::Io(e)) => panic!("no i/o here: {e}"),
            }
        }
    }

    #[test]
    fn size_limit_is_exact(payload_len in 0usize..2000, slack in 0usize..3) {
        let f = Frame::new(FrameHeader { origin: 1, dst: 2, tag: 1, epoch: 3, seq: 4 }, Bytes::from(vec![5u8; payload_len]));
        let body = f.body_len();
        let mut wire = BytesMut::new();
        FrameCodec::default().encode(f.clone(), &mut wire).unwrap();
        // A limit of exactly the body size admits it; one byte less refuses it at the prefix.
        prop_assert_eq!(FrameCodec::new(body + slack).decode(&mut wire.clone()).unwrap(), Some(f.clone()));
        if body >= 1 {
            let mut prefix_only = BytesMut::new();
            prefix_only.put_u32(body as u32);
            match FrameCodec::new(body - 1).decode(&mut prefix_only) {
                Err(FrameError::TooLarge { size, max }) => {
                    prop_assert_eq!(size, body as u64);
                    prop_assert_eq!(max, body - 1);
                }
                other => prop_assert!(false, "expected TooLarge, got {:?}", other),
            }
        }
        let mut out = BytesMut::new();
        let refused = matches!(
            FrameCodec::new(body.saturating_sub(1)).encode(f, &mut out),
            Err(FrameError::TooLarge { .. })
        );
        prop_assert!(refused, "the encoder refuses what the decoder would");
    }
}
