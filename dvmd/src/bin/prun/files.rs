//! `--output-filename DIR` / `--output dir=DIR[:nocopy]`: each rank's output in its own files,
//! DIR/JOB/rank.N/stdout and stderr, as mpirun names them; `--output file=PREFIX[:nocopy]`:
//! both streams of rank N in PREFIX.N. Bytes in the order they came, binary-safe, appended (a
//! file is made new when this prun first writes it; an array's elements append).
//!
//! Never fails the job: a file that cannot be written is named once on stderr, and that
//! rank's stream goes on to the terminal only.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

pub(super) struct RankFiles {
    dir: PathBuf,
    /// `file=PREFIX`: `dir` is the prefix, one file per rank.
    prefix: bool,
    open: HashMap<(u32, u32, u32), Option<File>>,
}

impl RankFiles {
    pub(super) fn new(dir: PathBuf) -> RankFiles {
        RankFiles { dir, prefix: false, open: HashMap::new() }
    }

    pub(super) fn with_prefix(prefix: PathBuf) -> RankFiles {
        RankFiles { dir: prefix, prefix: true, open: HashMap::new() }
    }

    /// Append `data` of (job, rank, stream); false when it could not be written.
    pub(super) fn write(&mut self, job: u32, rank: u32, stream: u32, data: &[u8]) -> bool {
        // file=PREFIX: one file per rank, shared by the streams and by an array's elements.
        let key = if self.prefix { (0, rank, 0) } else { (job, rank, stream) };
        let first = !self.open.contains_key(&key);
        let (dir, prefix) = (&self.dir, self.prefix);
        let f = self.open.entry(key).or_insert_with(|| {
            let path = if prefix {
                let mut name = dir.clone().into_os_string();
                name.push(format!(".{rank}"));
                PathBuf::from(name)
            } else {
                dir.join(job.to_string()).join(format!("rank.{rank}")).join(if stream == 2 {
                    "stderr"
                } else {
                    "stdout"
                })
            };
            let opened = path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| OpenOptions::new().create(true).write(true).truncate(first).open(&path));
            match opened {
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
        f.as_mut().is_some_and(|file| file.write_all(data).is_ok())
    }
}
