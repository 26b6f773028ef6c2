//! Wire messages of the DVM, generated from `proto/*.proto` by prost (compiled with protox,
//! so no protoc is needed on the machine).
//!
//! Owns: the RML frame header and tags, every grpcomm message, the control API service.
//! Never: logic. Types here are plain data; decisions live in `rml` and `grpcomm`.
//! All `bytes` fields are `bytes::Bytes`, so one encoded payload is shared by many sends.

pub mod rml {
    include!(concat!(env!("OUT_DIR"), "/dvm.rml.rs"));
}
pub mod grpcomm {
    include!(concat!(env!("OUT_DIR"), "/dvm.grpcomm.rs"));
}
pub mod daemon {
    include!(concat!(env!("OUT_DIR"), "/dvm.daemon.rs"));
}
pub mod job {
    include!(concat!(env!("OUT_DIR"), "/dvm.job.rs"));
}
pub mod pmixworker {
    include!(concat!(env!("OUT_DIR"), "/dvm.pmixworker.rs"));
}
pub mod control {
    include!(concat!(env!("OUT_DIR"), "/dvm.control.rs"));
}

pub mod payload;

pub use payload::Payload;
pub use prost::Message;

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn grpcomm_round_trip() {
        let msg = grpcomm::GrpcommMsg {
            body: Some(grpcomm::grpcomm_msg::Body::Forward(grpcomm::XcastForward {
                op_id: 7,
                origin: 3,
                origin_id: 1,
                tag: 9,
                compressed: false,
                payload: Bytes::from_static(b"hello"),
                ..Default::default()
            })),
        };
        let buf = msg.encode_to_vec();
        let back = grpcomm::GrpcommMsg::decode(&buf[..]).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn header_round_trip() {
        let h = rml::FrameHeader { origin: 1, dst: 2, tag: rml::Tag::Grpcomm as u32, epoch: 5, seq: 99 };
        let back = rml::FrameHeader::decode(&h.encode_to_vec()[..]).unwrap();
        assert_eq!(back, h);
    }
}
