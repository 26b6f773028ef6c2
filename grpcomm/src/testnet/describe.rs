//! Names and one-line descriptions of grpcomm messages, for counters and event logs.
//!
//! Never prints payload bytes; pure functions of the message.

use dvm_proto::grpcomm::{grpcomm_msg::Body, GrpcommMsg};

/// A message's kind, for counters.
pub fn kind(msg: &GrpcommMsg) -> &'static str {
    match &msg.body {
        Some(Body::Relay(_)) => "relay",
        Some(Body::Forward(_)) => "forward",
        Some(Body::Ack(_)) => "ack",
        Some(Body::Done(_)) => "done",
        Some(Body::Contrib(_)) => "contrib",
        Some(Body::Release(_)) => "release",
        Some(Body::Block(_)) => "block",
        Some(Body::Xblock(_)) => "xblock",
        Some(Body::Scatter(_)) => "scatter",
        None => "empty",
    }
}

/// One line describing a message, without payload bytes (for event logs).
pub fn describe(msg: &GrpcommMsg) -> String {
    let key = |s: &Option<dvm_proto::grpcomm::FenceSignature>| {
        s.as_ref().map(|s| String::from_utf8_lossy(&s.key).into_owned()).unwrap_or_default()
    };
    match &msg.body {
        Some(Body::Relay(m)) => format!("Relay{{origin {} id {} tag {}}}", m.origin, m.origin_id, m.tag),
        Some(Body::Forward(m)) => format!(
            "Forward{{op {} origin {} id {} tag {} mv {} chunks {:?} {} bytes}}",
            m.op_id,
            m.origin,
            m.origin_id,
            m.tag,
            m.movement,
            m.chunks.iter().map(|c| c.owner).collect::<Vec<_>>(),
            m.payload.len()
        ),
        Some(Body::Xblock(m)) => format!(
            "XBlock{{op {} step {} first {} from {} {} blocks ready {}}}",
            m.op_id,
            m.step,
            m.first,
            m.sender,
            m.blocks.len(),
            m.ready
        ),
        Some(Body::Ack(m)) => format!("Ack{{held {} ack_id {} request {}}}", m.held, m.ack_id, m.is_request),
        Some(Body::Done(m)) => format!("Done{{id {} op {}}}", m.origin_id, m.op_id),
        Some(Body::Contrib(m)) => format!(
            "Contrib{{key {:?} seq {} mv {} epoch {} count {} entries {:?} status {} {}}}",
            key(&m.sig),
            m.seq,
            m.movement,
            m.topo_epoch,
            m.count,
            m.entries.iter().map(|e| e.daemon).collect::<Vec<_>>(),
            m.status,
            m.error
        ),
        Some(Body::Release(m)) => format!(
            "Release{{key {:?} seq {} status {} {} {} bytes}}",
            key(&m.sig),
            m.seq,
            m.status,
            m.error,
            m.data.len()
        ),
        Some(Body::Scatter(m)) => format!("Scatter{{{}:{} {} slices}}", m.origin, m.scatter_id, m.slices.len()),
        Some(Body::Block(m)) => format!(
            "Block{{key {:?} seq {} mv {} step {} first {} {} blocks}}",
            key(&m.sig),
            m.seq,
            m.movement,
            m.step,
            m.first,
            m.blocks.len()
        ),
        None => "empty".into(),
    }
}
