//! Per-window results as JSON lines in `output_dir` (`docs/agent.md` lists
//! the fields). One line per edge fit (`"type": "edge"`) and one per node
//! result (`"type": "node"`, readable by `clockmesh trace merge --history`).
//! The file is rotated at a size limit; a few old files are kept.

use std::{
    fs::{File, OpenOptions},
    io::{Read, Seek, SeekFrom, Write},
    path::{Path, PathBuf},
};

use clockmesh_offsets::history::HistoryEntry;
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

    /// The timeline origin that `host`'s node line of `window` named,
    /// looked for in the newest [`ORIGIN_TAIL_BYTES`] of the history: what
    /// a restarted agent's last result, read back from the offsets file
    /// (which does not carry it), was on. `None` when no such line is
    /// there (another agent's file, a history rotated or removed since).
    pub fn origin_of(&self, host: &str, window: u64) -> Option<String> {
        let tail = read_tail(&self.path, ORIGIN_TAIL_BYTES).ok()?;
        String::from_utf8_lossy(&tail)
            .lines()
            .rev()
            .find_map(|line| {
                let entry: HistoryEntry = serde_json::from_str(line).ok()?;
                let mine = entry.host == host && entry.window == window;
                mine.then_some(entry.timeline_origin).flatten()
            })
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

/// How much of the history's end [`Jsonl::origin_of`] reads: several
/// windows of a large node's edge lines.
const ORIGIN_TAIL_BYTES: u64 = 1 << 20;

/// The last `bytes` of `path` (all of it if shorter); the first line may
/// be cut.
fn read_tail(path: &Path, bytes: u64) -> std::io::Result<Vec<u8>> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(bytes)))?;
    let mut tail = Vec::new();
    f.read_to_end(&mut tail)?;
    Ok(tail)
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

    /// A restarted agent finds the origin its last result named in its own
    /// node line of that window, the newest such line, and nothing in
    /// other hosts' lines, other windows or lines that name none.
    #[test]
    fn the_origin_of_a_result_is_read_back_from_its_node_line() {
        use clockmesh_offsets::history::NodeLine;
        let dir = std::env::temp_dir().join(format!("cm-jsonl-origin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut j = Jsonl::open(&dir, DEFAULT_MAX_BYTES).unwrap();
        let line = |host: &str, window, origin: Option<&str>| HistoryEntry {
            host: host.into(),
            window,
            timeline_origin: origin.map(Into::into),
            ..HistoryEntry::default()
        };
        for entry in [
            line("n1", 7, Some("n0")),
            line("n1", 8, Some("n0")),
            line("n2", 8, Some("n5")),
            line("n1", 8, Some("n2")),
            line("n1", 9, None),
        ] {
            j.write(&NodeLine::new(&entry)).unwrap();
            j.write(&serde_json::json!({"type": "edge", "window": 8}))
                .unwrap();
        }
        assert_eq!(j.origin_of("n1", 8).as_deref(), Some("n2"));
        assert_eq!(j.origin_of("n1", 7).as_deref(), Some("n0"));
        assert_eq!(j.origin_of("n2", 8).as_deref(), Some("n5"));
        assert_eq!(
            j.origin_of("n1", 9),
            None,
            "an older agent's line names none"
        );
        assert_eq!(j.origin_of("n3", 8), None);
        assert_eq!(j.origin_of("n1", 10), None);
        // Only the end is read: a cut first line is skipped, not an error.
        let tail = read_tail(j.path(), 40).unwrap();
        assert_eq!(tail.len(), 40);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
