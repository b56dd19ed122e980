//! `clockmesh report`: the flags, and the page written to `--output`. The
//! report itself — reading the history, truth, merge summary,
//! collectives and critical-path files, and building the page — is `clockmesh_report`.
use std::path::PathBuf;

use super::files;

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
    /// What `clockmesh trace critical-path --json` printed for the job:
    /// adds what topped each step's critical path, the slowest steps, each
    /// rank's time (work, gaps, waiting, exposed communication) and the
    /// what-ifs.
    #[arg(long, value_name = "FILE")]
    critical_path: Option<PathBuf>,
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    files::refuse_overwrite(&args.output, args.force, "--output")?;
    let history = clockmesh_report::read::history(&args.history)?;
    let truth = args
        .truth
        .as_deref()
        .map(clockmesh_report::read::truth)
        .transpose()?;
    let files: Vec<String> = args
        .history
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let truth_name = args.truth.as_ref().map(|p| p.display().to_string());
    let merge = args
        .merge_summary
        .as_deref()
        .map(clockmesh_report::read::merge_summary)
        .transpose()?;
    let merge_name = args.merge_summary.as_ref().map(|p| p.display().to_string());
    let analysis = args
        .collectives
        .as_deref()
        .map(clockmesh_report::read::collectives)
        .transpose()?;
    let collectives_name = args.collectives.as_ref().map(|p| p.display().to_string());
    let critical = args
        .critical_path
        .as_deref()
        .map(clockmesh_report::read::critical_paths)
        .transpose()?;
    let critical_name = args.critical_path.as_ref().map(|p| p.display().to_string());
    let page = clockmesh_report::render(&clockmesh_report::Inputs {
        history: &history,
        files: &files,
        truth: truth_name.as_deref().zip(truth.as_ref()),
        merge: merge_name.as_deref().zip(merge.as_ref()),
        collectives: collectives_name.as_deref().zip(analysis.as_ref()),
        critical: critical_name.as_deref().zip(critical.as_ref()),
    });
    files::write_atomically(&args.output, page.as_bytes(), args.force, "--output")?;
    crate::outln!("report: {}", args.output.display())?;
    Ok(())
}
