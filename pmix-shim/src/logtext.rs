//! Best-effort text of a PMIx_Log request. Open MPI 4.1 sends its show_help output as a
//! byte object holding an Open MPI DSS buffer whose last string is the rendered message.
//! DSS packs a string as a big-endian u32 length (including the NUL) followed by the bytes
//! and the NUL; type tags and other fields sit between strings.

use crate::types::{Info, InfoValue};

/// The rendered text of a log request: string values verbatim, byte values reduced to the last
/// DSS string they hold (or their last printable run). Several pieces are joined by newlines.
pub fn log_text(data: &[Info]) -> Option<String> {
    let parts: Vec<String> = data
        .iter()
        .filter_map(|i| match &i.value {
            InfoValue::String(s) if !s.is_empty() => Some(s.clone()),
            InfoValue::Bytes(b) => last_dss_string(b).or_else(|| last_printable_run(b)),
            _ => None,
        })
        .collect();
    if parts.is_empty() {
        None
    } else {
        Some(parts.join("\n"))
    }
}

fn is_text(b: &[u8]) -> bool {
    std::str::from_utf8(b).is_ok_and(|s| s.chars().all(|c| !c.is_control() || c == '\n' || c == '\t' || c == '\r'))
}

/// The DSS-packed string that ends last in `buf` (ties: the longest), if any.
pub fn last_dss_string(buf: &[u8]) -> Option<String> {
    let mut best: Option<(usize, usize)> = None; // (start of text, end incl. NUL)
    for i in 0..buf.len().saturating_sub(4) {
        let len = u32::from_be_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]) as usize;
        if len < 2 || len > buf.len() - i - 4 {
            continue;
        }
        let start = i + 4;
        let end = start + len;
        let text = &buf[start..end - 1];
        if buf[end - 1] != 0 || text.contains(&0) || !is_text(text) {
            continue;
        }
        let better = match best {
            None => true,
            Some((s, e)) => end > e || (end == e && start < s),
        };
        if better {
            best = Some((start, end));
        }
    }
    best.map(|(s, e)| String::from_utf8_lossy(&buf[s..e - 1]).into_owned())
}

/// The last run of at least 4 printable bytes.
fn last_printable_run(buf: &[u8]) -> Option<String> {
    buf.split(|b| *b == 0 || (b.is_ascii_control() && !matches!(*b, b'\n' | b'\t' | b'\r')))
        .rfind(|run| run.len() >= 4 && is_text(run))
        .map(|run| String::from_utf8_lossy(run).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An independent DSS-like packer: type byte, then length-prefixed NUL-terminated strings.
    fn pack(fields: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in fields {
            out.push(3u8); // OPAL_STRING type tag
            out.extend_from_slice(&1i32.to_be_bytes()); // count
            out.extend_from_slice(&((f.len() + 1) as u32).to_be_bytes());
            out.extend_from_slice(f.as_bytes());
            out.push(0);
            out.extend_from_slice(&[9, 0, 0, 0, 1]); // an int32 field in between
        }
        out
    }

    #[test]
    fn last_string_of_a_dss_buffer_is_the_message() {
        let msg = "--------\nIt looks like MPI_INIT failed...\n  getting local rank failed\n  --> Returned value Not found (-13)\n--------\n";
        for fields in [vec!["help-mpi-runtime.txt", "mpi_init:startup:internal-failure", msg], vec![msg]] {
            let buf = pack(&fields);
            assert_eq!(last_dss_string(&buf).as_deref(), Some(msg));
            let info = vec![Info::new("orte.show.help", InfoValue::Bytes(buf))];
            assert_eq!(log_text(&info).as_deref(), Some(msg));
        }
    }

    #[test]
    fn strings_pass_through_and_garbage_gives_none() {
        let info = vec![Info::new("pmix.log.stderr", InfoValue::String("hello".into()))];
        assert_eq!(log_text(&info).as_deref(), Some("hello"));
        assert_eq!(last_dss_string(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]), None);
        assert_eq!(log_text(&[Info::new("k", InfoValue::Bytes(vec![0, 1, 2]))]), None);
    }

    #[test]
    fn truncated_length_prefix_is_not_trusted() {
        // Length says 4096 but only 5 bytes follow: not a string; fall back to printable run.
        let mut buf = 4096u32.to_be_bytes().to_vec();
        buf.extend_from_slice(b"abcd\0");
        assert_eq!(last_dss_string(&buf), None);
        assert_eq!(log_text(&[Info::new("k", InfoValue::Bytes(buf))]).as_deref(), Some("abcd"));
    }

    /// The layout captured from Open MPI 4.1.4's `pmix.log.msg` (see tests/mpi_log.rs):
    /// count + length-prefixed file, count + topic, a count + bool, count + rendered text.
    #[test]
    fn open_mpi_4_1_layout() {
        let msg = "-----\n  getting local rank failed\n  --> Returned value Not found (-13)\n-----\n";
        let mut buf = Vec::new();
        for s in ["help-orte-runtime.txt", "orte_init:startup:internal-failure"] {
            buf.extend_from_slice(&1u32.to_be_bytes());
            buf.extend_from_slice(&((s.len() + 1) as u32).to_be_bytes());
            buf.extend_from_slice(s.as_bytes());
            buf.push(0);
        }
        buf.extend_from_slice(&[0, 0, 0, 1, 1]);
        buf.extend_from_slice(&1u32.to_be_bytes());
        buf.extend_from_slice(&((msg.len() + 1) as u32).to_be_bytes());
        buf.extend_from_slice(msg.as_bytes());
        buf.push(0);
        assert_eq!(last_dss_string(&buf).as_deref(), Some(msg));
    }
}
