//! `cargo xtask setup`: the one place that installs what this project needs
//! on a machine — Debian packages, nightly `rust-src` and `bpf-linker`.
//! Every other task and every test script only checks, and names this
//! command when something is missing. Idempotent: a step whose result is
//! already there is skipped, so a second run installs nothing.
//!
//! Python packages are not system packages: the test scripts install them
//! into their own virtual environments from the pinned files
//! (`python/requirements-test.txt`, `deploy/kubernetes/requirements.txt`).

use std::{fs, path::Path, process::Command};

use anyhow::Context as _;

use super::{on_path, output, run};

pub const BPF_LINKER_VERSION: &str = "0.13.0";
/// `cargo xtask fuzz` (run by `cargo xtask test`).
pub const CARGO_FUZZ_VERSION: &str = "0.13.1";
pub const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// Every Debian package the build, the tests, the demo, the benchmarks and
/// the other tasks use, with the reason. A Debian 12 machine with only the
/// Rust toolchains (and what rustup itself needs: a C linker and CA
/// certificates) gets everything else from here.
pub const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    (
        "build-essential",
        "cc/c++/make/objcopy: Rust's linker, C reader and C++ hook tests",
    ),
    ("pkg-config", "build scripts that look up system libraries"),
    ("ca-certificates", "HTTPS to crates.io and PyPI"),
    (
        "git",
        "cargo git metadata, image labels, fresh-check's clone",
    ),
    (
        "llvm-22-dev",
        "bpf-linker links LLVM 22 (the nightly's LLVM)",
    ),
    ("libpolly-22-dev", "bpf-linker's static LLVM link"),
    ("libclang1-22", "bindgen for the rocm-smi feature"),
    (
        "libclang-common-22-dev",
        "clang headers for that bindgen run",
    ),
    ("librocm-smi-dev", "librocm_smi64 for the rocm-smi feature"),
    (
        "protobuf-compiler",
        "protoc: prost/tonic code generation, hook test",
    ),
    (
        "libprotobuf-dev",
        "google/protobuf/*.proto for etcd-client's build; C++ protobuf for the hook test",
    ),
    ("iproute2", "ip/tc: network-namespace test hosts"),
    ("etcd-server", "etcd discovery backend: tests and demo"),
    ("python3", "test scripts"),
    (
        "python3-venv",
        "the Python tests' own virtual environments (jax, xprof, kubernetes-validate)",
    ),
    (
        "chrony",
        "the side-by-side accuracy benchmark (never started as a service)",
    ),
    (
        "linuxptp",
        "ptp4l beside chrony in bench-chrony and bench-faults (free-running: never steers the clock)",
    ),
    ("nftables", "nft: datagram loss in bench-faults"),
    (
        "mmdebstrap",
        "cargo xtask fresh-check builds a new Debian root",
    ),
    ("umoci", "cargo xtask image writes the OCI layout"),
    (
        "chromium",
        "headless rendering of `clockmesh report` pages in their test",
    ),
];

/// Installs what is missing; prints one line saying what is in place.
pub fn setup() -> anyhow::Result<()> {
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .map(|(package, _)| *package)
        .filter(|package| !deb_installed(package))
        .collect();
    if !missing.is_empty() {
        apt_install(&missing)?;
    }
    ensure_nightly_rust_src()?;
    ensure_bpf_linker()?;
    ensure_cargo_fuzz()?;
    eprintln!(
        "xtask: setup complete ({} Debian packages, nightly rust-src, bpf-linker {BPF_LINKER_VERSION}, cargo-fuzz {CARGO_FUZZ_VERSION})",
        DEBIAN_PACKAGES.len()
    );
    Ok(())
}

fn deb_installed(package: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .ends_with("install ok installed")
}

fn ensure_nightly_rust_src() -> anyhow::Result<()> {
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]));
    if installed.contains("rust-src") {
        return Ok(());
    }
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

fn ensure_bpf_linker() -> anyhow::Result<()> {
    // `--locked`: bpf-linker's own lock file, so a new release of one of its
    // dependencies cannot change what this step builds.
    ensure_cargo_install(
        "bpf-linker",
        BPF_LINKER_VERSION,
        &["--no-default-features", "--features", "llvm-22"],
        &[("LLVM_PREFIX", LLVM_PREFIX)],
    )
}

fn ensure_cargo_fuzz() -> anyhow::Result<()> {
    ensure_cargo_install("cargo-fuzz", CARGO_FUZZ_VERSION, &[], &[])
}

/// `cargo install --locked TOOL --version VERSION` unless that version is
/// already on PATH.
fn ensure_cargo_install(
    tool: &str,
    version: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<()> {
    if on_path(tool) && output(Command::new(tool).arg("--version")).contains(version) {
        return Ok(());
    }
    run(Command::new("cargo")
        .args(["install", "--locked", tool, "--version", version])
        .args(args)
        .envs(env.iter().copied()))
}

/// `apt-get install` without starting any service: etcd and chrony ship
/// init scripts, and a chronyd started here would steer the clock and poll
/// public servers. A policy-rc.d that refuses every start is put in place
/// for the install unless one already exists.
pub fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    let _guard = NoServiceStarts::install()?;
    run(Command::new("apt-get").arg("update").arg("-qq"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

/// Removes the policy-rc.d it created when dropped (also on error).
struct NoServiceStarts {
    created: bool,
}

impl NoServiceStarts {
    fn install() -> anyhow::Result<Self> {
        let path = Path::new(POLICY_RC_D);
        if path.exists() {
            return Ok(Self { created: false });
        }
        fs::write(
            path,
            "#!/bin/sh\n# cargo xtask setup: start no service while installing\nexit 101\n",
        )
        .with_context(|| format!("writing {POLICY_RC_D}"))?;
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(path, fs::Permissions::from_mode(0o755))
            .with_context(|| format!("chmod {POLICY_RC_D}"))?;
        Ok(Self { created: true })
    }
}

impl Drop for NoServiceStarts {
    fn drop(&mut self) {
        if self.created {
            let _ = fs::remove_file(POLICY_RC_D);
        }
    }
}

/// For scripts and tasks that need a package: the error names setup.
pub fn require_packages(packages: &[&str]) -> anyhow::Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|package| !deb_installed(package))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "missing Debian package(s) {}: run `cargo xtask setup`",
        missing.join(" ")
    )
}
