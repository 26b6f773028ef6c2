//! The "simple PMI" wire, as bytes: PMI-1 lines (`cmd=put kvsname=k key=x value=y\n`, and
//! the multi-line `mcmd=spawn` … `endcmd`) and PMI-2 frames (a 6-character decimal length,
//! then `cmd=kvs-put;key=x;value=y;` with `;;` standing for a `;` inside a value), both on one
//! fd: a PMI-2 client opens with a PMI-1 `init` line and then switches.
//!
//! Owns: cutting a byte stream into requests and writing answers. Never: a decision, or a
//! buffer that grows without bound (a line past [`MAX_LINE`] or a frame past [`MAX_FRAME`] is
//! an error at once, before the rest of it is read). Every error names what was wrong in a
//! phrase the caller puts after "rank R on node N sent …".

use std::fmt;

/// The longest PMI-1 line accepted (with its newline): a `put` of the longest value we
/// announce ([`VALLEN_MAX`]) with the longest key and name, and room to spare.
pub const MAX_LINE: usize = 4096;
/// The longest PMI-2 frame body accepted.
pub const MAX_FRAME: usize = 64 * 1024;
/// Longest key (`get_maxes`' `keylen_max`).
pub const KEYLEN_MAX: usize = 64;
/// Longest value (`vallen_max`).
pub const VALLEN_MAX: usize = 1024;
/// Longest kvs name (`kvsname_max`).
pub const KVSNAME_MAX: usize = 256;
/// Lines a `mcmd=spawn` block may hold before its `endcmd`.
const MAX_SPAWN_LINES: usize = 4096;

/// Which form a request came in (and its answer goes back in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    V1,
    V2,
}

/// One request: its command and its attributes, in the order sent (a spawn's lines included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub form: Form,
    pub cmd: String,
    pub args: Vec<(String, String)>,
}

impl Request {
    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.args.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// What was wrong with the bytes a rank sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// A PMI-1 line or PMI-2 frame longer than the protocol allows.
    TooLong { limit: usize },
    /// A PMI-2 length field that is not a number.
    BadLength(String),
    /// Not `key=value` where one was due.
    NotKeyValue(String),
    /// No `cmd=` (or `mcmd=`) first.
    NoCommand(String),
    /// Not UTF-8.
    NotText,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::TooLong { limit } => write!(f, "a PMI message longer than {limit} bytes"),
            WireError::BadLength(s) => write!(f, "a PMI-2 frame whose length '{s}' is not a number"),
            WireError::NotKeyValue(s) => write!(f, "a malformed PMI message: '{s}' is not key=value"),
            WireError::NoCommand(s) => write!(f, "a PMI message without a command: '{s}'"),
            WireError::NotText => write!(f, "a PMI message that is not text"),
        }
    }
}

impl std::error::Error for WireError {}

/// Cuts one connection's bytes into requests.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// The lines of a `mcmd=spawn` block read so far.
    spawn: Option<Vec<(String, String)>>,
    /// The stream failed: nothing more is decoded.
    failed: bool,
}

impl Decoder {
    /// Take bytes from the connection.
    pub fn push(&mut self, data: &[u8]) {
        if !self.failed {
            self.buf.extend_from_slice(data);
        }
    }

    /// The next whole request, None when more bytes are needed. After an error the stream is
    /// dead (the rank's job fails): every later call returns None.
    pub fn next_request(&mut self) -> Result<Option<Request>, WireError> {
        if self.failed {
            return Ok(None);
        }
        let r = self.decode();
        if r.is_err() {
            self.failed = true;
            self.buf.clear();
        }
        r
    }

    /// Bytes held that make no whole request yet.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    fn decode(&mut self) -> Result<Option<Request>, WireError> {
        loop {
            let Some(&first) = self.buf.first() else { return Ok(None) };
            if self.spawn.is_none() && (first.is_ascii_digit() || first == b' ') {
                return self.frame();
            }
            let Some(line) = self.line()? else { return Ok(None) };
            if let Some(lines) = self.spawn.as_mut() {
                if line == "endcmd" {
                    let args = self.spawn.take().unwrap_or_default();
                    return Ok(Some(Request { form: Form::V1, cmd: "spawn".into(), args }));
                }
                let (k, v) = line.split_once('=').ok_or_else(|| WireError::NotKeyValue(line.clone()))?;
                if lines.len() >= MAX_SPAWN_LINES {
                    return Err(WireError::TooLong { limit: MAX_SPAWN_LINES * MAX_LINE });
                }
                lines.push((k.to_owned(), v.to_owned()));
                continue;
            }
            if line.trim().is_empty() {
                continue;
            }
            if line.trim() == "mcmd=spawn" {
                self.spawn = Some(Vec::new());
                continue;
            }
            return parse_v1(&line).map(Some);
        }
    }

    /// One PMI-1 line, without its newline.
    fn line(&mut self) -> Result<Option<String>, WireError> {
        let Some(end) = self.buf.iter().position(|&b| b == b'\n') else {
            if self.buf.len() >= MAX_LINE {
                return Err(WireError::TooLong { limit: MAX_LINE });
            }
            return Ok(None);
        };
        if end + 1 > MAX_LINE {
            return Err(WireError::TooLong { limit: MAX_LINE });
        }
        let line: Vec<u8> = self.buf.drain(..=end).collect();
        let text = std::str::from_utf8(&line[..end]).map_err(|_| WireError::NotText)?;
        Ok(Some(text.trim_end_matches('\r').to_owned()))
    }

    /// One PMI-2 frame.
    fn frame(&mut self) -> Result<Option<Request>, WireError> {
        if self.buf.len() < 6 {
            return Ok(None);
        }
        let field = String::from_utf8_lossy(&self.buf[..6]).into_owned();
        let len: usize = field.trim().parse().map_err(|_| WireError::BadLength(field.clone()))?;
        if len > MAX_FRAME {
            return Err(WireError::TooLong { limit: MAX_FRAME });
        }
        if self.buf.len() < 6 + len {
            return Ok(None);
        }
        let body: Vec<u8> = self.buf.drain(..6 + len).skip(6).collect();
        let text = std::str::from_utf8(&body).map_err(|_| WireError::NotText)?;
        parse_v2(text).map(Some)
    }
}

/// `cmd=NAME k=v k=v`: attributes are separated by spaces, so a value cannot hold one.
fn parse_v1(line: &str) -> Result<Request, WireError> {
    let mut args = Vec::new();
    for tok in line.split(' ').filter(|t| !t.is_empty()) {
        let (k, v) = tok.split_once('=').ok_or_else(|| WireError::NotKeyValue(tok.to_owned()))?;
        args.push((k.to_owned(), v.to_owned()));
    }
    take_cmd(Form::V1, args, line)
}

/// `cmd=NAME;k=v;…;` with `;;` inside a value for a `;`.
fn parse_v2(body: &str) -> Result<Request, WireError> {
    let mut args = Vec::new();
    let mut chars = body.chars().peekable();
    while chars.peek().is_some() {
        let mut key = String::new();
        let mut has_eq = false;
        for c in chars.by_ref() {
            if c == '=' {
                has_eq = true;
                break;
            }
            if c == ';' {
                break;
            }
            key.push(c);
        }
        if !has_eq || key.is_empty() {
            return Err(WireError::NotKeyValue(key));
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            if c == ';' {
                if chars.peek() == Some(&';') {
                    chars.next();
                    value.push(';');
                    continue;
                }
                break;
            }
            value.push(c);
        }
        args.push((key, value));
    }
    take_cmd(Form::V2, args, body)
}

fn take_cmd(form: Form, mut args: Vec<(String, String)>, shown: &str) -> Result<Request, WireError> {
    match args.first() {
        Some((k, _)) if k == "cmd" => {
            let (_, cmd) = args.remove(0);
            Ok(Request { form, cmd, args })
        }
        _ => Err(WireError::NoCommand(shown.chars().take(80).collect())),
    }
}

/// An answer in the form its request came in.
pub fn encode(form: Form, cmd: &str, args: &[(&str, &str)]) -> Vec<u8> {
    match form {
        Form::V1 => {
            let mut s = format!("cmd={cmd}");
            for (k, v) in args {
                s.push(' ');
                s.push_str(k);
                s.push('=');
                s.push_str(v);
            }
            s.push('\n');
            s.into_bytes()
        }
        Form::V2 => {
            let mut body = format!("cmd={cmd};");
            for (k, v) in args {
                body.push_str(k);
                body.push('=');
                body.push_str(&v.replace(';', ";;"));
                body.push(';');
            }
            let mut out = format!("{:<6}", body.len()).into_bytes();
            out.extend_from_slice(body.as_bytes());
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(d: &mut Decoder) -> Vec<Request> {
        let mut v = Vec::new();
        while let Some(r) = d.next_request().expect("valid") {
            v.push(r);
        }
        v
    }

    #[test]
    fn v1_lines_split_at_any_byte_give_the_same_requests() {
        let text = b"cmd=init pmi_version=1 pmi_subversion=1\ncmd=put kvsname=k key=a value=x=y\ncmd=barrier_in\n";
        for cut in 0..text.len() {
            let mut d = Decoder::default();
            d.push(&text[..cut]);
            let mut got = all(&mut d);
            d.push(&text[cut..]);
            got.extend(all(&mut d));
            assert_eq!(got.len(), 3, "cut at {cut}");
            assert_eq!(got[1].cmd, "put");
            // A value keeps everything after its first '='.
            assert_eq!(got[1].get("value"), Some("x=y"));
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn v2_frames_round_trip_through_encode_with_semicolons_in_values() {
        let frame = encode(Form::V2, "kvs-put", &[("key", "a;b"), ("value", "c;;d;")]);
        let mut d = Decoder::default();
        d.push(b"cmd=init pmi_version=2 pmi_subversion=0\n");
        d.push(&frame);
        let got = all(&mut d);
        assert_eq!(got[0].form, Form::V1);
        assert_eq!((got[1].form, got[1].cmd.as_str()), (Form::V2, "kvs-put"));
        assert_eq!(got[1].get("key"), Some("a;b"));
        assert_eq!(got[1].get("value"), Some("c;;d;"));
    }

    #[test]
    fn a_spawn_block_is_one_request_whose_lines_may_hold_spaces() {
        let mut d = Decoder::default();
        d.push(b"mcmd=spawn\nnprocs=2\nexecname=./child\narg1=a b\nendcmd\ncmd=get_appnum\n");
        let got = all(&mut d);
        assert_eq!(got[0].cmd, "spawn");
        assert_eq!(got[0].get("arg1"), Some("a b"));
        assert_eq!(got[1].cmd, "get_appnum");
    }

    #[test]
    fn bad_input_is_named_and_ends_the_stream() {
        let cases: [(&[u8], &str); 5] = [
            (b"cmd=put kvsname=k key=a value=two words\n", "'words' is not key=value"),
            (b"hello there\n", "'hello' is not key=value"),
            (b"key=a\n", "without a command"),
            (b"00x9  cmd=x;", "is not a number"),
            (b"\xff\xfe=1\n", "not text"),
        ];
        for (bytes, says) in cases {
            let mut d = Decoder::default();
            d.push(bytes);
            let e = d.next_request().expect_err("refused");
            assert!(e.to_string().contains(says), "{e}");
            d.push(b"cmd=barrier_in\n");
            assert_eq!(d.next_request(), Ok(None), "nothing after an error");
        }
    }

    #[test]
    fn an_overlong_line_or_frame_is_refused_before_it_is_whole() {
        let mut d = Decoder::default();
        d.push(&vec![b'c'; MAX_LINE]);
        assert_eq!(d.next_request(), Err(WireError::TooLong { limit: MAX_LINE }));
        let mut d = Decoder::default();
        d.push(format!("{:<6}", MAX_FRAME + 1).as_bytes());
        assert_eq!(d.next_request(), Err(WireError::TooLong { limit: MAX_FRAME }));
    }

    #[test]
    fn v1_answers_are_one_line() {
        let a = encode(Form::V1, "get_result", &[("rc", "0"), ("value", "v")]);
        assert_eq!(a, b"cmd=get_result rc=0 value=v\n");
        let b = encode(Form::V2, "kvs-fence-response", &[("rc", "0")]);
        assert_eq!(b, b"28    cmd=kvs-fence-response;rc=0;");
    }
}
