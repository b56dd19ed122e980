//! The skew shim (`tests/skew_shim/clockmesh_skew.c`), built for the tests
//! that run real programs on skewed hosts.

use std::path::{Path, PathBuf};
use std::process::Command;

use clockmesh::config::InjectedSkew;

/// Builds `clockmesh_skew.so` into `dir` and returns its path.
pub fn build(dir: &Path) -> anyhow::Result<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("skew_shim/clockmesh_skew.c");
    let out = dir.join("clockmesh_skew.so");
    let status = Command::new("gcc")
        .args([
            "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o",
        ])
        .arg(&out)
        .arg(&src)
        .arg("-lm")
        .status()
        .map_err(|e| anyhow::anyhow!("gcc (cargo xtask setup installs build-essential): {e}"))?;
    anyhow::ensure!(status.success(), "building {} failed", src.display());
    Ok(out)
}

/// `CLOCKMESH_SKEW` for a process whose CLOCK_REALTIME must run as an agent
/// with `skew` sees its own clock.
pub fn spec(skew: &InjectedSkew) -> String {
    format!("{},{},{}", skew.offset_ns, skew.drift_ppb, skew.epoch_ns)
}
