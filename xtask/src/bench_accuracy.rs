//! `cargo xtask bench-accuracy`: the simulator's scenario family at the
//! shipped settings (`clockmesh_sim::family`, run by the release-built
//! example `bench_accuracy`), and the regression gate `cargo xtask test`
//! runs: a small seeded subset against its committed baseline.

use std::process::Command;

use crate::{cargo, root, run, target_dir};

/// The gate's subset: one member of each of the 12 classes.
const GATE_SEED: &str = "99";
const GATE_COUNT: &str = "12";
/// Its committed figures (`--save-baseline` rewrites them after a change
/// that is meant to move them; say so and why in the commit).
const GATE_BASELINE: &str = "simulator/family/gate-baseline.json";

/// Builds the family's runner (release: the debug simulator is ~10× slower).
fn build_runner() -> anyhow::Result<std::path::PathBuf> {
    run(cargo().args([
        "build",
        "--release",
        "--quiet",
        "-p",
        "clockmesh-sim",
        "--example",
        "bench_accuracy",
    ]))?;
    Ok(target_dir().join("release/examples/bench_accuracy"))
}

/// Runs the family with `args` (`--count`, `--seed`, `--json`, `--only`,
/// `--write-scenarios`, `--baseline`, …: the example's header lists them).
pub fn bench_accuracy(args: &[String]) -> anyhow::Result<()> {
    let runner = build_runner()?;
    run(Command::new(runner).current_dir(root()).args(args))
}

/// The regression gate: fails on a class median > 10 % worse than the
/// baseline's or any coverage < 1.
pub fn accuracy_gate() -> anyhow::Result<()> {
    let runner = build_runner()?;
    run(Command::new(runner).current_dir(root()).args([
        "--seed",
        GATE_SEED,
        "--count",
        GATE_COUNT,
        "--worst",
        "3",
        "--baseline",
        GATE_BASELINE,
    ]))
}
