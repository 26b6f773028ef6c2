//! Wire forms of fence signatures, results and errors. Decoding never panics: anything
//! malformed comes back as a reason string (signatures) or a `Protocol` error (errors).

use bytes::Bytes;
use dvm_proto::grpcomm as pb;
use dvm_rml::topology::Rank;

use super::types::{FenceError, FenceSignature, Participants};

const STATUS_TIMEOUT: i32 = 1;
const STATUS_LOST: i32 = 2;
const STATUS_MISMATCH: i32 = 3;
const STATUS_NOT_PARTICIPANT: i32 = 4;
const STATUS_PROTOCOL: i32 = 5;
const STATUS_ABANDONED: i32 = 6;

pub(super) fn sig_to_wire(sig: &FenceSignature) -> pb::FenceSignature {
    match &sig.participants {
        Participants::All => pb::FenceSignature { key: sig.key.clone(), all_daemons: true, daemons: Vec::new() },
        Participants::Daemons(d) => pb::FenceSignature { key: sig.key.clone(), all_daemons: false, daemons: d.clone() },
    }
}

/// A signature off the wire must already be canonical (sorted, unique, in range).
pub(super) fn sig_from_wire(w: Option<&pb::FenceSignature>, size: u32) -> Result<FenceSignature, String> {
    let w = w.ok_or("no fence signature")?;
    let participants = if w.all_daemons {
        if !w.daemons.is_empty() {
            return Err(format!("signature is for all daemons but also lists {} daemons", w.daemons.len()));
        }
        Participants::All
    } else {
        Participants::Daemons(w.daemons.clone())
    };
    participants.check(size)?;
    Ok(FenceSignature { key: w.key.clone(), participants })
}

pub(super) fn release_msg(sig: &FenceSignature, seq: u64, result: &Result<Bytes, FenceError>) -> pb::FenceRelease {
    let (status, error, data) = match result {
        Ok(data) => (0, String::new(), data.clone()),
        Err(e) => {
            let (status, error) = error_to_wire(e);
            (status, error, Bytes::new())
        }
    };
    pb::FenceRelease { sig: Some(sig_to_wire(sig)), seq, status, error, data }
}

pub(super) fn error_to_wire(e: &FenceError) -> (i32, String) {
    match e {
        FenceError::Timeout { timeout_ns, daemon } => (STATUS_TIMEOUT, format!("{timeout_ns} {daemon}")),
        FenceError::LostConnection { lost } => {
            (STATUS_LOST, lost.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(" "))
        }
        FenceError::MovementMismatch { expected, got, daemon } => {
            (STATUS_MISMATCH, format!("{daemon}\t{expected}\t{got}"))
        }
        FenceError::NotParticipant { daemon } => (STATUS_NOT_PARTICIPANT, daemon.to_string()),
        FenceError::Protocol(text) => (STATUS_PROTOCOL, text.clone()),
        FenceError::Abandoned { daemon } => (STATUS_ABANDONED, daemon.to_string()),
    }
}

pub(super) fn error_from_wire(status: i32, text: &str) -> FenceError {
    let parsed = match status {
        STATUS_TIMEOUT => text
            .split_once(' ')
            .and_then(|(t, d)| Some(FenceError::Timeout { timeout_ns: t.parse().ok()?, daemon: d.parse().ok()? })),
        STATUS_LOST => text
            .split_whitespace()
            .map(|r| r.parse::<Rank>().ok())
            .collect::<Option<Vec<_>>>()
            .map(|lost| FenceError::LostConnection { lost }),
        STATUS_MISMATCH => {
            let mut it = text.splitn(3, '\t');
            match (it.next(), it.next(), it.next()) {
                (Some(d), Some(e), Some(g)) => d.parse().ok().map(|daemon| FenceError::MovementMismatch {
                    expected: e.to_string(),
                    got: g.to_string(),
                    daemon,
                }),
                _ => None,
            }
        }
        STATUS_NOT_PARTICIPANT => text.parse().ok().map(|daemon| FenceError::NotParticipant { daemon }),
        STATUS_PROTOCOL => Some(FenceError::Protocol(text.to_string())),
        STATUS_ABANDONED => text.parse().ok().map(|daemon| FenceError::Abandoned { daemon }),
        _ => None,
    };
    parsed.unwrap_or_else(|| FenceError::Protocol(format!("undecodable fence error (status {status}): {text:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_round_trip() {
        let all = [
            FenceError::Timeout { timeout_ns: 5_000, daemon: 7 },
            FenceError::LostConnection { lost: vec![3, 9, 12] },
            FenceError::LostConnection { lost: vec![] },
            FenceError::MovementMismatch {
                expected: "tree-gather-release".into(),
                got: "unknown movement 77".into(),
                daemon: 4,
            },
            FenceError::NotParticipant { daemon: 2 },
            FenceError::Protocol("count 3, expected 4".into()),
        ];
        for e in all {
            let (status, text) = error_to_wire(&e);
            assert_ne!(status, 0);
            assert_eq!(error_from_wire(status, &text), e);
        }
    }

    #[test]
    fn garbage_errors_become_protocol_errors() {
        for (status, text) in [(1, "x y"), (2, "1 two"), (3, "no tabs"), (4, ""), (99, "what")] {
            assert!(matches!(error_from_wire(status, text), FenceError::Protocol(_)), "{status} {text}");
        }
    }

    #[test]
    fn malformed_signatures_are_refused() {
        let sig =
            |all, daemons: Vec<Rank>| pb::FenceSignature { key: Bytes::from_static(b"k"), all_daemons: all, daemons };
        assert!(sig_from_wire(None, 4).is_err());
        assert!(sig_from_wire(Some(&sig(true, vec![1])), 4).is_err());
        assert!(sig_from_wire(Some(&sig(false, vec![])), 4).is_err());
        assert!(sig_from_wire(Some(&sig(false, vec![2, 1])), 4).is_err());
        assert!(sig_from_wire(Some(&sig(false, vec![1, 1])), 4).is_err());
        assert!(sig_from_wire(Some(&sig(false, vec![1, 4])), 4).is_err());
        assert!(sig_from_wire(Some(&sig(false, vec![0, 3])), 4).is_ok());
        assert!(sig_from_wire(Some(&sig(true, vec![])), 4).is_ok());
    }
}
