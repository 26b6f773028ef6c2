//! The `dvm-sim` command as a shell user runs it: a reader that has gone away
//! (`dvm-sim ... | head -1`) ends it quietly, with nothing on stderr.

use std::io::Read;
use std::process::{Command, Stdio};

#[test]
fn a_closed_stdout_ends_it_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dvm-sim"))
        .args(["stage", "--n", "16", "--mib", "1", "--markdown"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dvm-sim starts");
    // The reader is gone before anything was written: every write of it fails.
    drop(child.stdout.take());
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    assert!(err.is_empty(), "dvm-sim wrote to stderr: {err}");
    // Ended by SIGPIPE, as `cat` would be: never a panic (101).
    assert_ne!(status.code(), Some(101), "{status:?}");
}
