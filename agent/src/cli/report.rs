//! `clockmesh report`: one self-contained HTML page from the agent's JSONL
//! history — offset ± bound and drift per node, min RTT and pure ratio
//! per edge, the probe graph, GPU device maps, and, given the injected
//! truth, estimated − true; with a trace merge's summary and a collectives
//! analysis, what the merge did per host and who arrived last at each
//! collective. Reading and writing files happens here; the page itself is
//! built without I/O (`report::html`).
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::files;

mod collectives;
mod html;
mod lines;
mod svg;
mod truth;

use lines::History;
use truth::Truth;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// A JSONL history file (the agent's clockmesh.jsonl; repeat for
    /// several nodes or rotated files).
    #[arg(long, value_name = "FILE", required = true)]
    history: Vec<PathBuf>,
    /// The HTML file to write (refused if it exists, unless --force).
    #[arg(
        short,
        long,
        value_name = "FILE",
        default_value = "clockmesh-report.html"
    )]
    output: PathBuf,
    /// Replace an existing output file.
    #[arg(long)]
    force: bool,
    /// The injected skews (JSON: {"nodes": {NAME: {"offset_ns", "drift_ppb",
    /// "epoch_ns"}}}, as --inject-skew OFFSET,DRIFT,EPOCH; docs/report.md):
    /// adds estimated − true per node.
    #[arg(long, value_name = "FILE")]
    truth: Option<PathBuf>,
    /// A `clockmesh trace merge --summary` file: adds the offset, drift and
    /// worst bound each host's trace was placed with.
    #[arg(long, value_name = "FILE")]
    merge_summary: Option<PathBuf>,
    /// What `clockmesh trace collectives --json` printed for one job's
    /// merged traces: adds who arrived last at each collective, by how much
    /// ± the combined bound, the wait it caused, and the causality check.
    #[arg(long, value_name = "FILE")]
    collectives: Option<PathBuf>,
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    files::refuse_overwrite(&args.output, args.force, "--output")?;
    let history = read_history(&args.history)?;
    let truth = args.truth.as_deref().map(read_truth).transpose()?;
    let files: Vec<String> = args
        .history
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let truth_name = args.truth.as_ref().map(|p| p.display().to_string());
    let merge = args
        .merge_summary
        .as_deref()
        .map(read_merge_summary)
        .transpose()?;
    let merge_name = args.merge_summary.as_ref().map(|p| p.display().to_string());
    let analysis = args
        .collectives
        .as_deref()
        .map(read_collectives)
        .transpose()?;
    let collectives_name = args.collectives.as_ref().map(|p| p.display().to_string());
    let page = html::render(&html::Inputs {
        history: &history,
        files: &files,
        truth: truth_name.as_deref().zip(truth.as_ref()),
        merge: merge_name.as_deref().zip(merge.as_ref()),
        collectives: collectives_name.as_deref().zip(analysis.as_ref()),
    });
    files::write_atomically(&args.output, page.as_bytes(), args.force, "--output")?;
    crate::outln!("report: {}", args.output.display())?;
    Ok(())
}

fn read_history(paths: &[PathBuf]) -> anyhow::Result<History> {
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

fn read_merge_summary(path: &Path) -> anyhow::Result<clockmesh::trace::MergeSummary> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading merge summary {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a `clockmesh trace merge --summary` file",
            path.display()
        )
    })
}

fn read_collectives(path: &Path) -> anyhow::Result<clockmesh::trace::collectives::Analysis> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading collectives {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a `clockmesh trace collectives --json` file",
            path.display()
        )
    })
}

fn read_truth(path: &Path) -> anyhow::Result<Truth> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading truth {}", path.display()))?;
    Ok(Truth::parse(&path.display().to_string(), &text)?)
}
