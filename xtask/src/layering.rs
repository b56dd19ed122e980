//! `cargo xtask lint` checks the crate layering the architecture promises:
//! the pure libraries never pull in the agent's I/O stack, and what a reader
//! of the offsets file builds stays small. Read from `cargo tree` (the
//! committed lock file; nothing is built).

use std::collections::BTreeSet;

use anyhow::{Context as _, bail};

use super::{cargo, describe};

/// Crates that only the agent (I/O) may depend on.
const AGENT_ONLY: &[&str] = &["aya", "tokio", "kube", "etcd-client", "cudarc", "clockmesh"];
/// The libraries that must stay free of them.
const PURE_LIBRARIES: &[&str] = &["clockmesh-core", "clockmesh-offsets", "clockmesh-trace"];
/// What a program that only reads the offsets file may build, at most.
const OFFSETS_MAX_CRATES: usize = 25;

/// The distinct crates (names) `package` depends on at run time, itself included.
fn normal_dependencies(package: &str) -> anyhow::Result<BTreeSet<String>> {
    let mut cmd = cargo();
    cmd.args(["tree", "-p", package, "-e", "normal", "--prefix", "none"]);
    let out = cmd
        .output()
        .with_context(|| format!("starting {}", describe(&cmd)))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            describe(&cmd),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

pub fn check_layering() -> anyhow::Result<()> {
    for library in PURE_LIBRARIES {
        let deps = normal_dependencies(library)?;
        let forbidden: Vec<&str> = AGENT_ONLY
            .iter()
            .copied()
            .filter(|c| deps.contains(*c))
            .collect();
        if !forbidden.is_empty() {
            bail!(
                "{library} depends on {} (agent-only crates): keep I/O in the agent",
                forbidden.join(", ")
            );
        }
        if *library == "clockmesh-offsets" && deps.len() > OFFSETS_MAX_CRATES {
            bail!(
                "clockmesh-offsets builds {} crates, more than {OFFSETS_MAX_CRATES}: a reader must stay cheap",
                deps.len()
            );
        }
        eprintln!(
            "xtask: layering: {library} builds {} crates, none of {}",
            deps.len(),
            AGENT_ONLY.join(", ")
        );
    }
    Ok(())
}
