//! `--output-filename DIR` / `--output dir=DIR[:nocopy]`: each rank's output in its own files,
//! DIR/JOB/rank.N/stdout and stderr, as mpirun names them: bytes in the order they came,
//! binary-safe, appended (a job's files are made new when its first output arrives).
//!
//! Never fails the job: a file that cannot be written is named once on stderr, and that
//! rank's stream goes on to the terminal only.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

pub(super) struct RankFiles {
    dir: PathBuf,
    open: HashMap<(u32, u32, u32), Option<File>>,
}

impl RankFiles {
    pub(super) fn new(dir: PathBuf) -> RankFiles {
        RankFiles { dir, open: HashMap::new() }
    }

    /// Append `data` of (job, rank, stream); false when it could not be written.
    pub(super) fn write(&mut self, job: u32, rank: u32, stream: u32, data: &[u8]) -> bool {
        let dir = &self.dir;
        let f = self.open.entry((job, rank, stream)).or_insert_with(|| {
            let d = dir.join(job.to_string()).join(format!("rank.{rank}"));
            let path = d.join(if stream == 2 { "stderr" } else { "stdout" });
            match std::fs::create_dir_all(&d).and_then(|()| File::create(&path)) {
                Ok(f) => Some(f),
                Err(e) => {
                    eprintln!(
                        "prun: cannot write {}: {e}; rank {rank}'s output goes to the terminal only",
                        path.display()
                    );
                    None
                }
            }
        });
        match f {
            Some(file) => file.write_all(data).is_ok(),
            None => false,
        }
    }
}
