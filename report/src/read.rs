//! Reading the report's input files: histories, the truth, a merge
//! summary, a collectives analysis and critical paths.

use std::path::{Path, PathBuf};

use clockmesh_trace::MergeSummary;
use clockmesh_trace::collectives::Analysis;
use clockmesh_trace::collectives::critical::CriticalPaths;
use serde::de::DeserializeOwned;

use crate::lines::{History, LinesError};
use crate::truth::{Truth, TruthError};

/// Why an input file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading {what} {path}")]
    Io {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a `{producer}` file")]
    NotJson {
        path: String,
        producer: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Lines(#[from] LinesError),
    #[error(transparent)]
    Truth(#[from] TruthError),
}

fn read_text(what: &'static str, path: &Path) -> Result<String, ReadError> {
    std::fs::read_to_string(path).map_err(|source| ReadError::Io {
        what,
        path: path.display().to_string(),
        source,
    })
}

/// A JSON file that `producer` (a clockmesh command line) wrote.
fn read_json<T: DeserializeOwned>(
    what: &'static str,
    producer: &'static str,
    path: &Path,
) -> Result<T, ReadError> {
    let text = read_text(what, path)?;
    serde_json::from_str(&text).map_err(|source| ReadError::NotJson {
        path: path.display().to_string(),
        producer,
        source,
    })
}

/// Every line of the history files, in the order given; an error names the
/// file and line, or all files when there is nothing to report on.
pub fn history(paths: &[PathBuf]) -> Result<History, ReadError> {
    let mut history = History::default();
    for path in paths {
        let text = read_text("history", path)?;
        history.add_file(&path.display().to_string(), &text)?;
    }
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    history.check_reportable(&names.join(", "))?;
    Ok(history)
}

/// A `clockmesh trace merge --summary` file.
pub fn merge_summary(path: &Path) -> Result<MergeSummary, ReadError> {
    read_json("merge summary", "clockmesh trace merge --summary", path)
}

/// What `clockmesh trace collectives --json` printed.
pub fn collectives(path: &Path) -> Result<Analysis, ReadError> {
    read_json("collectives", "clockmesh trace collectives --json", path)
}

/// What `clockmesh trace critical-path --json` printed.
pub fn critical_paths(path: &Path) -> Result<CriticalPaths, ReadError> {
    read_json(
        "critical paths",
        "clockmesh trace critical-path --json",
        path,
    )
}

/// The `--truth` file of injected skews.
pub fn truth(path: &Path) -> Result<Truth, ReadError> {
    let text = read_text("truth", path)?;
    Ok(Truth::parse(&path.display().to_string(), &text)?)
}
