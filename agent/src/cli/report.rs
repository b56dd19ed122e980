//! `clockmesh report`: one self-contained HTML page from the agent's JSONL
//! history — offset ± bound and drift per node, min RTT and pure ratio
//! per edge, the probe graph, GPU device maps, and, given the injected
//! truth, estimated − true. Reading and writing files happens here; the
//! page itself is built without I/O (`report::html`).
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

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
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    refuse_overwrite(&args.output, args.force)?;
    let history = read_history(&args.history)?;
    let truth = args.truth.as_deref().map(read_truth).transpose()?;
    let files: Vec<String> = args
        .history
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let truth_name = args.truth.as_ref().map(|p| p.display().to_string());
    let page = html::render(&html::Inputs {
        history: &history,
        files: &files,
        truth: truth_name.as_deref().zip(truth.as_ref()),
    });
    write_atomically(&args.output, page.as_bytes(), args.force)?;
    crate::outln!("report: {}", args.output.display())?;
    Ok(())
}

fn refuse_overwrite(output: &Path, force: bool) -> anyhow::Result<()> {
    if !force && output.exists() {
        anyhow::bail!(
            "{} exists; give another --output or --force to replace it",
            output.display()
        );
    }
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

fn read_truth(path: &Path) -> anyhow::Result<Truth> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading truth {}", path.display()))?;
    Ok(Truth::parse(&path.display().to_string(), &text)?)
}

/// Writes a temporary file beside `output`, then moves it into place, so
/// readers never see a partial page. Without `force` the move is a hard
/// link, which fails rather than replace a file created meanwhile.
fn write_atomically(output: &Path, bytes: &[u8], force: bool) -> anyhow::Result<()> {
    let dir = match output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = output
        .file_name()
        .with_context(|| format!("{} names no file", output.display()))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = write_new(&tmp, bytes).and_then(|()| move_into_place(&tmp, output, force));
    let _ = std::fs::remove_file(&tmp);
    result
}

fn write_new(tmp: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))
}

fn move_into_place(tmp: &Path, output: &Path, force: bool) -> anyhow::Result<()> {
    if force {
        return std::fs::rename(tmp, output)
            .with_context(|| format!("moving the report to {}", output.display()));
    }
    match std::fs::hard_link(tmp, output) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => anyhow::bail!(
            "{} exists; give another --output or --force to replace it",
            output.display()
        ),
        // A file system without hard links: the check above the render must do.
        Err(_) if !output.exists() => std::fs::rename(tmp, output)
            .with_context(|| format!("moving the report to {}", output.display())),
        r => r.with_context(|| format!("writing the report to {}", output.display())),
    }
}
