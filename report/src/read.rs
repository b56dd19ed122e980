//! Reading the report's input files: histories, the truth, a merge summary and a collectives analysis.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clockmesh_trace::MergeSummary;
use clockmesh_trace::collectives::Analysis;

use crate::lines::History;
use crate::truth::Truth;

/// Every line of the history files, in the order given; an error names the
/// file and line, or all files when there is nothing to report on.
pub fn history(paths: &[PathBuf]) -> anyhow::Result<History> {
    let mut history = History::default();
    for path in paths {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading history {}", path.display()))?;
        history.add_file(&path.display().to_string(), &text)?;
    }
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    history.check_reportable(&names.join(", "))?;
    Ok(history)
}

/// A `clockmesh trace merge --summary` file.
pub fn merge_summary(path: &Path) -> anyhow::Result<MergeSummary> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading merge summary {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a `clockmesh trace merge --summary` file",
            path.display()
        )
    })
}

/// What `clockmesh trace collectives --json` printed.
pub fn collectives(path: &Path) -> anyhow::Result<Analysis> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading collectives {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a `clockmesh trace collectives --json` file",
            path.display()
        )
    })
}

/// The `--truth` file of injected skews.
pub fn truth(path: &Path) -> anyhow::Result<Truth> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading truth {}", path.display()))?;
    Ok(Truth::parse(&path.display().to_string(), &text)?)
}
