//! Builds the eBPF programs (crate `clockmesh-ebpf`) with nightly and
//! `-Z build-std=core` through aya-build, so the agent binary embeds a fresh
//! object. `AYA_BUILD_SKIP=1` skips that (clippy, docs, work that does not
//! load programs): an empty object is embedded and loading fails clearly.
use std::{env, fs, path::PathBuf};

use anyhow::{Context as _, anyhow};

const EBPF_PACKAGE: &str = "clockmesh-ebpf";
/// Name of the eBPF binary target (see ebpf/Cargo.toml).
const EBPF_BIN: &str = "clockmesh";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    if skip_requested() {
        let out = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
        fs::write(out.join(EBPF_BIN), []).context("writing empty eBPF placeholder")?;
        return Ok(());
    }
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == EBPF_PACKAGE)
        .ok_or_else(|| anyhow!("package {EBPF_PACKAGE} not in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    let package = aya_build::Package {
        name: EBPF_PACKAGE,
        root_dir: root_dir.as_str(),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::default())
}

fn skip_requested() -> bool {
    env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}
