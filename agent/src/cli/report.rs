//! `clockmesh report`: the flags, and the page written to `--output`. The
//! report itself — reading the history, truth, merge summary,
//! collectives and critical-path files, and building the page — is `clockmesh_report`.
use std::path::{Path, PathBuf};

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
    use clockmesh_report::read;
    files::refuse_overwrite(&args.output, args.force, "--output")?;
    let history = read::history(&args.history)?;
    let files: Vec<String> = args
        .history
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let truth = named(args.truth.as_deref(), read::truth)?;
    let merge = named(args.merge_summary.as_deref(), read::merge_summary)?;
    let collectives = named(args.collectives.as_deref(), read::collectives)?;
    let critical = named(args.critical_path.as_deref(), read::critical_paths)?;
    let page = clockmesh_report::render(&clockmesh_report::Inputs {
        history: &history,
        files: &files,
        truth: as_input(&truth),
        merge: as_input(&merge),
        collectives: as_input(&collectives),
        critical: as_input(&critical),
    });
    files::write_atomically(&args.output, page.as_bytes(), args.force, "--output")?;
    crate::outln!("report: {}", args.output.display())?;
    Ok(())
}

/// An optional input file read, with the name the page gives it.
fn named<T>(
    path: Option<&Path>,
    read: fn(&Path) -> Result<T, clockmesh_report::read::ReadError>,
) -> anyhow::Result<Option<(String, T)>> {
    let Some(path) = path else { return Ok(None) };
    Ok(Some((path.display().to_string(), read(path)?)))
}

fn as_input<T>(named: &Option<(String, T)>) -> Option<(&str, &T)> {
    named.as_ref().map(|(name, v)| (name.as_str(), v))
}
