//! The agent's JSONL history, parsed for the report through the types the
//! agent writes: node and device lines (`clockmesh_offsets::history`),
//! edge lines (`clockmesh_core::report::EdgeLine`) and hand-over lines
//! (`clockmesh_core::timeline::HandOverLine`). No I/O: the caller reads
//! the files.

pub use clockmesh_core::report::EdgeLine as Edge;
pub use clockmesh_core::timeline::HandOverLine as HandOver;
use clockmesh_offsets::history::{DeviceHistoryEntry, HistoryEntry};
use serde::Deserialize;

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
    use clockmesh_core::report::{EdgeLine, FitLine};
    use clockmesh_core::time::{LocalNs, Nanos};
    use clockmesh_core::timeline::{Carry, HandOverLine};
    use clockmesh_offsets::history::NodeLine;

    fn edge_line() -> EdgeLine {
        EdgeLine {
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
            drift_windows: 2,
            stamps: "software".into(),
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
            anchor: LocalNs(1),
            offset: Nanos(2),
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
        assert_eq!(
            h.handovers[0]
                .carry()
                .unwrap()
                .offset_at(LocalNs(1_000_000_001)),
            Nanos(5)
        );
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
