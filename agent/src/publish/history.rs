//! Per-window results as JSON lines (the agent's history), for offline use:
//! `clockmesh trace merge --history FILE` looks offsets up by host and time.

use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::devclock::PublishedDeviceMap;

/// One line of the history file: one node's map for one estimator window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Hostname as it appears in trace file names / `XSpace.hostnames`.
    pub host: String,
    pub window: u64,
    /// Local CLOCK_REALTIME at which `offset_ns` holds.
    pub anchor_ns: i64,
    /// global − local at the anchor.
    pub offset_ns: i64,
    #[serde(default)]
    pub drift_ppb: f64,
    pub bound_ns: u64,
    /// Local CLOCK_REALTIME interval the window's fit covers.
    #[serde(default)]
    pub valid_from_ns: Option<i64>,
    #[serde(default)]
    pub valid_until_ns: Option<i64>,
    #[serde(default)]
    pub reference: Option<String>,
}

impl HistoryEntry {
    /// The offset (global − local) at local time `t_ns`, with drift.
    pub fn offset_at(&self, t_ns: i64) -> i64 {
        let age_s = (t_ns - self.anchor_ns) as f64 / 1e9;
        self.offset_ns + (self.drift_ppb * age_s).round() as i64
    }
}

/// One line of the history for one GPU's device-clock map (`"type":
/// "device"`), written by the agent once per window per device. The map is
/// [`PublishedDeviceMap`]: device time → this host's `host_domain` clock,
/// usable only inside its valid device-time range (fail closed outside).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceHistoryEntry {
    /// Always "device".
    #[serde(rename = "type")]
    pub kind: String,
    /// Hostname, as in node entries.
    pub host: String,
    /// Estimator window during which the map was written.
    pub window: u64,
    /// Host CLOCK_REALTIME when the line was written.
    pub written_at_ns: i64,
    #[serde(flatten)]
    pub map: PublishedDeviceMap,
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path}:{line}: not a history entry: {error}")]
    Parse {
        path: String,
        line: usize,
        error: serde_json::Error,
    },
}

/// Appends one entry as a line (`O_APPEND`, one `write` per line).
pub fn append(path: &Path, entry: &HistoryEntry) -> Result<(), HistoryError> {
    let io = |error| HistoryError::Io {
        path: path.display().to_string(),
        error,
    };
    let mut line = serde_json::to_vec(entry).expect("history entry serializes");
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    f.write_all(&line).map_err(io)
}

/// The agent's JSONL also holds other records (`"type": "edge"`); history
/// entries have no type or `"type": "node"`.
fn is_node_line(line: &str) -> bool {
    #[derive(Deserialize)]
    struct Typed {
        #[serde(rename = "type")]
        kind: Option<String>,
    }
    match serde_json::from_str::<Typed>(line) {
        Ok(t) => t.kind.is_none_or(|k| k == "node"),
        Err(_) => true, // let the full parse report it
    }
}

/// Reads all node entries; blank lines and other record types are skipped,
/// anything else must parse.
pub fn load(path: &Path) -> Result<Vec<HistoryEntry>, HistoryError> {
    let io = |error| HistoryError::Io {
        path: path.display().to_string(),
        error,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(f).lines().enumerate() {
        let line = line.map_err(io)?;
        if line.trim().is_empty() || !is_node_line(&line) {
            continue;
        }
        let e = serde_json::from_str(&line).map_err(|error| HistoryError::Parse {
            path: path.display().to_string(),
            line: i + 1,
            error,
        })?;
        out.push(e);
    }
    Ok(out)
}

/// The entry for `host` that best covers local time `t_ns`: one whose
/// validity interval contains it, else the one with the nearest anchor.
pub fn lookup<'a>(entries: &'a [HistoryEntry], host: &str, t_ns: i64) -> Option<&'a HistoryEntry> {
    let covers = |e: &&HistoryEntry| {
        e.valid_from_ns.is_none_or(|f| f <= t_ns) && e.valid_until_ns.is_some_and(|u| t_ns <= u)
    };
    let mine = || entries.iter().filter(|e| e.host == host);
    mine()
        .filter(covers)
        .min_by_key(|e| (t_ns - e.anchor_ns).unsigned_abs())
        .or_else(|| mine().min_by_key(|e| (t_ns - e.anchor_ns).unsigned_abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(host: &str, anchor: i64, off: i64, until: Option<i64>) -> HistoryEntry {
        HistoryEntry {
            host: host.into(),
            window: 1,
            anchor_ns: anchor,
            offset_ns: off,
            drift_ppb: 0.0,
            bound_ns: 10,
            valid_from_ns: None,
            valid_until_ns: until,
            reference: None,
        }
    }

    #[test]
    fn append_load_and_lookup() {
        let dir = std::env::temp_dir().join(format!("cm-hist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("h.jsonl");
        let _ = std::fs::remove_file(&p);
        append(&p, &entry("a", 100, 5, Some(200))).unwrap();
        append(&p, &entry("a", 300, 7, Some(400))).unwrap();
        append(&p, &entry("b", 100, 9, None)).unwrap();
        let all = load(&p).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(lookup(&all, "a", 150).unwrap().offset_ns, 5);
        assert_eq!(lookup(&all, "a", 350).unwrap().offset_ns, 7);
        assert_eq!(
            lookup(&all, "a", 260).unwrap().offset_ns,
            7,
            "nearest anchor"
        );
        assert_eq!(lookup(&all, "b", 0).unwrap().offset_ns, 9);
        assert!(lookup(&all, "c", 0).is_none());
        // The agent's edge lines are skipped, its node lines read.
        std::fs::write(&p, "{\"type\":\"edge\",\"from\":\"a\"}\n{\"type\":\"node\",\"host\":\"a\",\"window\":1,\"anchor_ns\":1,\"offset_ns\":2,\"bound_ns\":3}\n").unwrap();
        assert_eq!(load(&p).unwrap().len(), 1);
        std::fs::write(&p, "{\"host\":1}\n").unwrap();
        let err = load(&p).unwrap_err().to_string();
        assert!(err.contains(":1:"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn drift_moves_offset_with_time() {
        let mut e = entry("a", 0, 100, None);
        e.drift_ppb = 1000.0; // 1 µs per s
        assert_eq!(e.offset_at(2_000_000_000), 2100);
    }
}
