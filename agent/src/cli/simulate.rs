//! `clockmesh simulate`: run a cluster scenario and score it against the
//! simulated truth — through the estimator alone (`mode = "estimator"`), or
//! with every host running the agent's own protocol core (`mode =
//! "protocol"`, the agent's settings and defaults).
use std::path::PathBuf;

use anyhow::Context;
use clockmesh_sim::{Mode, Scenario};

/// Simulate a cluster (synthetic clocks, links, probes with known truth) and report the
/// estimator's accuracy, bound coverage and timings.
#[derive(clap::Args, Debug)]
pub struct SimulateArgs {
    /// Scenario file (TOML); see examples/scenarios/ and docs/estimator.md.
    #[arg(long, value_name = "FILE")]
    pub scenario: PathBuf,
    /// Print the full report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Override the scenario's RNG seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Override the number of windows.
    #[arg(long)]
    pub windows: Option<u32>,
    /// Print one line per window in the table output.
    #[arg(long)]
    pub per_window: bool,
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.scenario)
        .with_context(|| format!("reading scenario {}", args.scenario.display()))?;
    let mut scenario = Scenario::from_toml_str(&text)
        .with_context(|| format!("scenario {}", args.scenario.display()))?;
    if let Some(seed) = args.seed {
        scenario.seed = seed;
    }
    if let Some(windows) = args.windows {
        scenario.windows = windows;
    }
    tracing::info!(scenario = %scenario.name, nodes = scenario.nodes, "simulating");
    if scenario.mode == Mode::Protocol {
        let report = clockmesh_sim::run_protocol(&scenario)?;
        if args.json {
            crate::outln!("{}", serde_json::to_string_pretty(&report)?)?;
        } else {
            crate::out!("{}", report.table())?;
            print_peak_rss()?;
        }
        return Ok(());
    }
    let report = clockmesh_sim::run(&scenario)?;
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        crate::out!("{}", report.table(args.per_window))?;
        print_peak_rss()?;
    }
    Ok(())
}

fn print_peak_rss() -> Result<(), super::out::StdoutError> {
    match peak_rss_kib() {
        Some(kib) => crate::outln!("peak RSS          {:.1} MiB", kib as f64 / 1024.0),
        None => Ok(()),
    }
}

/// Peak resident set size from /proc (Linux); None elsewhere.
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}
