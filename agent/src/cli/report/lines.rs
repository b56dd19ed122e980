//! The agent's JSONL history, parsed for the report: node and device lines
//! through their own types (`clockmesh_offsets::history`), edge and
//! hand-over lines through read views of `clockmesh_core::report::EdgeLine`
//! and `clockmesh_core::timeline::HandOverLine`. Those two are written, never
//! read, by the agent (`Serialize` only, with `&'static str` fields), so the
//! views below name the fields the report uses; a unit test serializes the
//! real types and reads them back here, so the two cannot drift apart.
//! No I/O: the caller reads the files.

use clockmesh::publish::history::{DeviceHistoryEntry, HistoryEntry};
use serde::Deserialize;

/// An edge line (`"type": "edge"`): one out-edge's fit for one window.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Edge {
    pub window: u64,
    pub from: String,
    pub to: String,
    pub probes_forward: usize,
    pub probes_backward: usize,
    pub pure_forward: usize,
    pub pure_backward: usize,
    pub stamps: String,
    pub fit: Option<EdgeFit>,
    pub error: Option<String>,
}

/// The parts of an edge line's fit the report shows.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct EdgeFit {
    /// On the `from` node's clock.
    pub anchor_ns: i64,
    pub min_rtt_ns: f64,
    pub bound_ns: f64,
}

impl Edge {
    /// Pure first packets over complete probes, both directions; `None`
    /// without probes.
    pub fn pure_ratio(&self) -> Option<f64> {
        let probes = self.probes_forward + self.probes_backward;
        let pure = self.pure_forward + self.pure_backward;
        (probes > 0).then(|| pure as f64 / probes as f64)
    }
}

/// A hand-over line (`"type": "handover"`): a new leader took the global
/// timeline over, carrying its own last offset (global − local) and drift.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct HandOver {
    pub window: u64,
    pub reference: String,
    pub previous_reference: Option<String>,
    pub carried_anchor_ns: Option<i64>,
    pub carried_offset_ns: Option<i64>,
    pub carried_drift_ppb: Option<f64>,
}

impl HandOver {
    /// The carried offset at the new leader's local time `local_ns`, if
    /// it carried one.
    pub fn carried_offset_at(&self, local_ns: i64) -> Option<f64> {
        let (anchor, offset) = (self.carried_anchor_ns?, self.carried_offset_ns?);
        let drift = self.carried_drift_ppb.unwrap_or(0.0);
        Some(offset as f64 + drift * 1e-9 * (local_ns - anchor) as f64)
    }
}

/// Every line of one or more history files, in file order.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub nodes: Vec<HistoryEntry>,
    pub edges: Vec<Edge>,
    pub devices: Vec<DeviceHistoryEntry>,
    pub handovers: Vec<HandOver>,
    /// Lines of other types (kept for the summary, otherwise ignored).
    pub other: usize,
}

/// A history that cannot be reported on.
#[derive(Debug, thiserror::Error)]
pub enum LinesError {
    #[error("{file}:{line}: not a JSON object: {error}")]
    NotJson {
        file: String,
        line: usize,
        error: serde_json::Error,
    },
    #[error("{file}:{line}: malformed {kind} line: {error}")]
    Malformed {
        file: String,
        line: usize,
        kind: &'static str,
        error: serde_json::Error,
    },
    #[error("{file}: empty (no history lines; is it the agent's clockmesh.jsonl?)")]
    Empty { file: String },
    #[error("{files}: no node or edge lines to report on")]
    NothingToReport { files: String },
}

impl History {
    /// Adds the lines of one file, named `file` in errors. Blank lines are
    /// skipped; a file with nothing else is an error.
    pub fn add_file(&mut self, file: &str, text: &str) -> Result<(), LinesError> {
        let mut seen = false;
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            seen = true;
            self.add_line(line).map_err(|e| e.at(file, i + 1))?;
        }
        if !seen {
            return Err(LinesError::Empty { file: file.into() });
        }
        Ok(())
    }

    /// Checks that there is something to draw; `files` names the inputs.
    pub fn check_reportable(&self, files: &str) -> Result<(), LinesError> {
        if self.nodes.is_empty() && self.edges.is_empty() {
            return Err(LinesError::NothingToReport {
                files: files.into(),
            });
        }
        Ok(())
    }

    fn add_line(&mut self, line: &str) -> Result<(), LineError> {
        let value: serde_json::Value = serde_json::from_str(line).map_err(LineError::NotJson)?;
        if !value.is_object() {
            return Err(LineError::NotJson(serde::de::Error::custom(
                "expected an object",
            )));
        }
        // Like `clockmesh_offsets::history`: a line without a type is a node line.
        let kind = value.get("type").and_then(|t| t.as_str()).unwrap_or("node");
        match kind {
            "node" => self.nodes.push(typed("node", value)?),
            "edge" => self.edges.push(typed("edge", value)?),
            "device" => self.devices.push(typed("device", value)?),
            "handover" => self.handovers.push(typed("handover", value)?),
            _ => self.other += 1,
        }
        Ok(())
    }
}

fn typed<T: for<'de> Deserialize<'de>>(
    kind: &'static str,
    value: serde_json::Value,
) -> Result<T, LineError> {
    serde_json::from_value(value).map_err(|error| LineError::Malformed { kind, error })
}

/// A line's error before it knows its file and number.
enum LineError {
    NotJson(serde_json::Error),
    Malformed {
        kind: &'static str,
        error: serde_json::Error,
    },
}

impl LineError {
    fn at(self, file: &str, line: usize) -> LinesError {
        let file = file.to_string();
        match self {
            Self::NotJson(error) => LinesError::NotJson { file, line, error },
            Self::Malformed { kind, error } => LinesError::Malformed {
                file,
                line,
                kind,
                error,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh::publish::history::NodeLine;
    use clockmesh_core::report::{EdgeLine, FitLine};
    use clockmesh_core::timeline::{Carry, HandOverLine};

    fn edge_line() -> EdgeLine {
        EdgeLine {
            kind: "edge",
            window: 7,
            node: "a".into(),
            from: "a".into(),
            to: "b".into(),
            from_id: 1,
            to_id: 2,
            probes_forward: 30,
            probes_backward: 10,
            pure_forward: 12,
            pure_backward: 8,
            incomplete: 0,
            spacing_rejected: 0,
            impure: 20,
            history_windows: 2,
            stamps: "software",
            purity_tolerance_ns: 10_000,
            fit: Some(FitLine {
                anchor_ns: 5,
                offset_ns: 6,
                offset_frac_ns: 0.5,
                drift_ppb: 1.5,
                bound_ns: 80.25,
                drift_bound_ppb: 2.0,
                margin_ns: 3.0,
                min_rtt_ns: 41_000.5,
                forward_points: 12,
                backward_points: 8,
                trimmed: 0,
                span_ns: 4_000_000_000,
            }),
            error: None,
        }
    }

    #[test]
    fn the_agents_own_lines_read_back() {
        let node = HistoryEntry {
            host: "b".into(),
            window: 7,
            anchor_ns: 100,
            offset_ns: -42,
            bound_ns: 9,
            ..HistoryEntry::default()
        };
        let carry = Carry {
            anchor_ns: 1,
            offset_ns: 2,
            drift_ppb: 3.0,
            bound_ns: 4,
            from: "a".into(),
        };
        let text = [
            serde_json::to_string(&edge_line()).unwrap(),
            serde_json::to_string(&NodeLine::new(&node)).unwrap(),
            serde_json::to_string(&HandOverLine::new(8, "b", Some(&carry))).unwrap(),
            String::new(),
            r#"{"type":"future","x":1}"#.into(),
        ]
        .join("\n");
        let mut h = History::default();
        h.add_file("h.jsonl", &text).unwrap();
        assert_eq!(h.nodes, vec![node]);
        let e = &h.edges[0];
        assert_eq!((e.from.as_str(), e.to.as_str(), e.window), ("a", "b", 7));
        assert_eq!(e.fit.as_ref().unwrap().min_rtt_ns, 41_000.5);
        assert_eq!(e.pure_ratio(), Some(0.5));
        assert_eq!(h.handovers[0].carried_offset_at(1_000_000_001), Some(5.0));
        assert_eq!(h.other, 1);
        h.check_reportable("h.jsonl").unwrap();
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let mut h = History::default();
        let err =
            |h: &mut History, text: &str| h.add_file("x.jsonl", text).unwrap_err().to_string();
        assert_eq!(
            err(&mut h, "\n  \n"),
            "x.jsonl: empty (no history lines; is it the agent's clockmesh.jsonl?)"
        );
        let e = err(&mut h, "{\"type\":\"edge\"}\n");
        assert!(
            e.starts_with("x.jsonl:1: malformed edge line: missing field"),
            "{e}"
        );
        let e = err(&mut h, "\n\n{\"host\": \"a\", \"window\": 1\n");
        assert!(e.starts_with("x.jsonl:3: not a JSON object"), "{e}");
        let e = err(&mut h, "[1]\n");
        assert!(e.starts_with("x.jsonl:1: not a JSON object"), "{e}");
        let e = err(&mut h, "{\"host\": \"a\"}\n");
        assert!(e.starts_with("x.jsonl:1: malformed node line"), "{e}");
        let mut h = History::default();
        h.add_file("y.jsonl", "{\"type\":\"other\"}").unwrap();
        let e = h.check_reportable("y.jsonl").unwrap_err().to_string();
        assert_eq!(e, "y.jsonl: no node or edge lines to report on");
    }
}
