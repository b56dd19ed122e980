//! Per-window results as JSON lines in `output_dir` (`docs/agent.md` lists
//! the fields). One line per edge fit (`"type": "edge"`) and one per node
//! result (`"type": "node"`, readable by `clockmesh trace merge --history`).
//! The file is rotated at a size limit; a few old files are kept.

use std::{
    fs::{File, OpenOptions},
    io::Write,
    path::{Path, PathBuf},
};

use serde::Serialize;

/// Rotate when the file would exceed this.
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// Rotated files kept (`clockmesh.1.jsonl` is the newest).
pub const KEEP: usize = 4;

pub struct Jsonl {
    path: PathBuf,
    file: File,
    len: u64,
    max_bytes: u64,
}

impl Jsonl {
    /// Opens (appends to) `dir/clockmesh.jsonl`, creating `dir`.
    pub fn open(dir: &Path, max_bytes: u64) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("clockmesh.jsonl");
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let len = file.metadata()?.len();
        Ok(Jsonl {
            path,
            file,
            len,
            max_bytes,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record as one line (one `write`, so readers never see half a line).
    pub fn write(&mut self, record: &impl Serialize) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
        line.push(b'\n');
        if self.len > 0 && self.len + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(&line)?;
        self.len += line.len() as u64;
        Ok(())
    }

    fn rotated(&self, n: usize) -> PathBuf {
        self.path.with_extension(format!("{n}.jsonl"))
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let _ = std::fs::remove_file(self.rotated(KEEP));
        for n in (1..KEEP).rev() {
            let _ = std::fs::rename(self.rotated(n), self.rotated(n + 1));
        }
        std::fs::rename(&self.path, self.rotated(1))?;
        self.file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        self.len = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_appended_and_files_rotated() {
        let dir = std::env::temp_dir().join(format!("cm-jsonl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut j = Jsonl::open(&dir, 100).unwrap();
        for i in 0..40 {
            j.write(&serde_json::json!({"type": "edge", "i": i}))
                .unwrap();
        }
        let current = std::fs::read_to_string(j.path()).unwrap();
        assert!(current.len() <= 100);
        assert!(current.lines().all(|l| l.starts_with('{')));
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "clockmesh.1.jsonl",
                "clockmesh.2.jsonl",
                "clockmesh.3.jsonl",
                "clockmesh.4.jsonl",
                "clockmesh.jsonl"
            ]
        );
        // The newest rotated file holds the lines just before the current ones.
        let newest = std::fs::read_to_string(dir.join("clockmesh.1.jsonl")).unwrap();
        let last_rotated: serde_json::Value =
            serde_json::from_str(newest.lines().last().unwrap()).unwrap();
        let first_current: serde_json::Value =
            serde_json::from_str(current.lines().next().unwrap()).unwrap();
        assert_eq!(last_rotated["i"].as_i64().unwrap() + 1, first_current["i"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
