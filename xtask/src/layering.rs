//! `cargo xtask lint` checks the crate layering the architecture promises:
//! the pure libraries and the analysis front ends never pull in the agent's
//! I/O stack (nor the agent), no crate depends on one of a higher layer, and
//! what a reader of the offsets file builds stays small. Read from `cargo
//! tree` (the committed lock file; nothing is built).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context as _, bail};

use super::{cargo, describe};

/// Crates that only the agent (I/O) may depend on.
const AGENT_ONLY: &[&str] = &["aya", "tokio", "kube", "etcd-client", "cudarc", "clockmesh"];
/// The libraries that must stay free of them: the pure ones, the simulator
/// and the analysis front ends (the report) built on them.
const PURE_LIBRARIES: &[&str] = &[
    "clockmesh-core",
    "clockmesh-offsets",
    "clockmesh-trace",
    "clockmesh-sim",
    "clockmesh-report",
];
/// The workspace's crates in layers, bottom up: none depends on a crate of a
/// higher layer. The analysis front ends read what the pure libraries
/// define; the node agent (whose CLI calls the front ends) sits on both.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "pure libraries",
        &[
            "clockmesh-common",
            "clockmesh-time",
            "clockmesh-proto",
            "clockmesh-estimator",
            "clockmesh-offsets",
            "clockmesh-core",
            "clockmesh-trace",
            "clockmesh-sim",
        ],
    ),
    ("analysis front ends", &["clockmesh-report"]),
    ("node agent", &["clockmesh"]),
];
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
    let mut deps_of = BTreeMap::new();
    for (_, crates) in LAYERS {
        for krate in *crates {
            deps_of.insert(*krate, normal_dependencies(krate)?);
        }
    }
    for library in PURE_LIBRARIES {
        let deps = match deps_of.get(library) {
            Some(deps) => deps,
            None => &normal_dependencies(library)?,
        };
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
    check_layers(&deps_of)
}

/// No crate of a layer depends on a crate of a higher one.
fn check_layers(deps_of: &BTreeMap<&str, BTreeSet<String>>) -> anyhow::Result<()> {
    for (i, (layer, crates)) in LAYERS.iter().enumerate() {
        for krate in *crates {
            let above = LAYERS[i + 1..].iter().flat_map(|(name, higher)| {
                higher
                    .iter()
                    .filter(|h| deps_of[krate].contains(**h))
                    .map(move |h| (*name, *h))
            });
            if let Some((higher_layer, higher)) = above.into_iter().next() {
                bail!(
                    "{krate} ({layer}) depends on {higher} ({higher_layer}): a crate depends only on its own layer and those below"
                );
            }
        }
        eprintln!(
            "xtask: layering: {layer} ({}): no dependency on a higher layer",
            crates.join(", ")
        );
    }
    Ok(())
}
