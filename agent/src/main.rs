//! The `clockmesh` binary: thin CLI over the `clockmesh` library.
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

/// clockmesh: clock offsets between GPU nodes from eBPF-timestamped probe
/// pairs, published for profilers and used to merge multi-host traces.
#[derive(Parser, Debug)]
#[command(name = "clockmesh", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the node agent (probing, estimation, publication) until SIGTERM.
    Agent(cli::agent::AgentArgs),
    /// Show what the local agent knows, like `chronyc tracking`: reference,
    /// state, offset ± bound, drift, last update.
    Status(cli::status::StatusArgs),
    /// List the local agent's peers, like `chronyc sources`: state, stamps,
    /// min RTT, pure pairs, each edge's last fit.
    Sources(cli::status::StatusArgs),
    /// Print the published offsets file as readers see it (node and GPU maps).
    Offsets(cli::offsets::OffsetsArgs),
    /// Attach the eBPF programs to an interface and print probe timestamps.
    Capture(cli::capture::CaptureArgs),
    /// Print the effective configuration and where each value came from.
    Config(cli::config::ConfigArgs),
    /// Run the estimator on a simulated cluster with known truth.
    Simulate(cli::simulate::SimulateArgs),
    /// Inspect and merge profiler traces (xprof, PyTorch) onto one timeline.
    Trace(cli::trace::TraceArgs),
    /// Sample a GPU device clock against the host clocks.
    GpuClock(cli::gpu::GpuArgs),
    /// Write one self-contained HTML report from the agent's JSONL history.
    ///
    /// One page, nothing fetched when viewed (inline SVG and CSS): each
    /// node's offset (global − local) ± bound and drift over time, each
    /// edge's min RTT and pure ratio, the probe graph, GPU device maps, and
    /// with --truth the error of every estimate against the injected skew.
    /// Every plotted point carries its exact values as data-* attributes.
    /// Give each node's history (and rotated files) with its own --history.
    Report(cli::report::ReportArgs),
}

fn main() -> ExitCode {
    init_logging();
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader closed the pipe (`… | head`): nothing left to say.
        Err(e)
            if e.downcast_ref::<cli::out::StdoutError>()
                .is_some_and(cli::out::StdoutError::is_closed_pipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) if e.is::<cli::trace::CausalityViolated>() => {
            eprintln!("clockmesh: {e}");
            ExitCode::from(cli::trace::CausalityViolated::EXIT)
        }
        Err(e) => {
            // One line with the cause chain; no backtrace for users.
            eprintln!("clockmesh: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Agent(a) => cli::agent::run(a),
        Command::Status(a) => cli::status::run(a),
        Command::Sources(a) => cli::sources::run(a),
        Command::Offsets(a) => cli::offsets::run(a),
        Command::Capture(a) => cli::capture::run(a),
        Command::Config(a) => cli::config::run(a),
        Command::Simulate(a) => cli::simulate::run(a),
        Command::Trace(a) => cli::trace::run(a),
        Command::GpuClock(a) => cli::gpu::run(a),
        Command::Report(a) => cli::report::run(a),
    }
}

/// Logs go to stderr, filtered by `RUST_LOG` (default `info`); colours only
/// when stderr is a terminal (not in log files or `kubectl logs`).
fn init_logging() {
    use std::io::IsTerminal as _;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}
