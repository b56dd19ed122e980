//! Developer tasks for clockmesh: `cargo xtask <task>`.
//!
//! Every task that needs the eBPF toolchain runs `setup` first, which
//! installs what is missing and does nothing when all is there.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

mod bench_accuracy;
mod disk;
mod fresh;
mod gpu;
mod image;
mod layering;
mod setup;

use setup::{LLVM_PREFIX, setup};

const EBPF_TARGET: &str = "bpfel-unknown-none";

#[derive(Parser)]
#[command(about = "clockmesh developer tasks")]
struct Args {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install every missing prerequisite: Debian packages (compiler, LLVM 22,
    /// protobuf, etcd, iproute2, python3-venv, chrony, mmdebstrap, umoci, ...),
    /// nightly rust-src, bpf-linker. The only task that installs anything; idempotent.
    Setup,
    /// Prove the README on a new machine: a minimal Debian bookworm root
    /// (mmdebstrap), the rustup toolchains bound read-only, a fresh CARGO_HOME,
    /// a clone of this repository; runs setup, the demo (20 s) and the test
    /// command inside it and prints each step's time (needs root).
    FreshCheck(fresh::Options),
    /// Build the eBPF object with nightly and -Z build-std=core (+ BTF).
    BuildEbpf,
    /// etcd + N netns hosts running the agent with injected skews; prints
    /// estimated vs true offsets (needs root). `-- --help` lists the options.
    Demo {
        /// Arguments passed to `clockmesh-demo` (e.g. `--nodes 8 --duration 30 --json`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run every test (needs root for the netns/eBPF tests), then every fuzz
    /// target for 60 s.
    Test,
    /// Run every fuzz target (cargo-fuzz, nightly, address sanitizer) for a
    /// bounded time and print the executions per target; fails on a crash
    /// (the input is kept in fuzz/artifacts/<target>/).
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// rustfmt check, the crate layering (core/offsets/trace free of the
    /// agent's I/O crates; offsets ≤ 25 crates), clippy with warnings denied.
    Lint,
    /// Benchmarks: capture path figures and criterion benches.
    Bench,
    /// chrony, ptp4l (free-running, software stamps) and clockmesh side by
    /// side on one veth pair at the same
    /// instants (needs root). `-- --help` lists the options (--duration,
    /// --load, --cadence-us, --runs, --json).
    BenchChrony {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// chrony, ptp4l and clockmesh beside each other on 3 netns hosts through
    /// faults: asymmetric path, 30 % datagram loss, link down, agent restart,
    /// reference lost; availability, |error| and bound coverage of what a
    /// reader gets (needs root and nftables). `-- --help` lists the options
    /// (--backend static|etcd|both, --phase-s, --warmup, --json, --samples,
    /// --ptp-bridge-netfilter).
    BenchFaults {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The per-window coordination at 1,000 / 2,000 / 5,000 / 10,000
    /// simulated members on this machine: a real etcd through the agent's
    /// own etcd store, and the relay's leader on loopback; prints the table
    /// (docs/coordination.md). `-- --help` lists the options (--members,
    /// --windows, --window-s, --membership-every-s, --path, --relay-members,
    /// --relay-rcvbuf, --etcd-arg, --json).
    BenchScale {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The simulator's scenario family at the shipped settings: per class
    /// (stamps × queue tail × run length) the spread of p99 |error| at the
    /// result, aged p99 and coverage, the members whose results miss "aged ≤
    /// 1.5 × at the result" even extrapolated at the true rate (out of any
    /// drift estimate's reach), the worst members. `-- --count N
    /// --seed S --json`; `-- --gate` runs the regression gate alone.
    BenchAccuracy {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// A real two-host GPU job against the truth, on a machine with 2+
    /// NVIDIA GPUs, torch and jax (needs root): agents with injected skews in
    /// network namespaces, PyTorch NCCL and JAX jobs between them, profiler
    /// windows that differ per rank, a planted straggler; prints the
    /// straggler, bound and causality figures. `-- --bundle DIR` instead
    /// writes what a GPU machine without cargo needs to run it.
    GpuE2e {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Container image as an OCI layout in target/image/clockmesh-oci, no daemon (needs root).
    Image {
        /// Then unpack it and run the binary in it with chroot.
        #[arg(long)]
        smoke: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Args::parse().task {
        Task::Setup => setup(),
        Task::FreshCheck(options) => fresh::fresh_check(&options),
        Task::BuildEbpf => build_ebpf().map(|obj| println!("eBPF object: {}", obj.display())),
        Task::Demo { args } => demo(&args),
        Task::Test => test(),
        Task::Fuzz { seconds } => fuzz(seconds),
        Task::Lint => lint(),
        Task::Bench => bench(),
        Task::BenchChrony { args } => bench_chrony(&args),
        Task::BenchFaults { args } => bench_faults(&args),
        Task::BenchScale { args } => bench_scale(&args),
        Task::BenchAccuracy { args } if args == ["--gate"] => bench_accuracy::accuracy_gate(),
        Task::BenchAccuracy { args } => bench_accuracy::bench_accuracy(&args),
        Task::Image { smoke } => image::image(smoke),
        Task::GpuE2e { args } => gpu::gpu_e2e(&args),
    }
}

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("xtask: {}", describe(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", describe(cmd)))?;
    if !status.success() {
        bail!("{} failed ({status})", describe(cmd));
    }
    Ok(())
}

fn describe(cmd: &Command) -> String {
    let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy()).collect();
    format!("{} {}", cmd.get_program().to_string_lossy(), args.join(" "))
}

fn output(cmd: &mut Command) -> String {
    cmd.output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn cargo() -> Command {
    let mut c = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

pub(crate) fn on_path(tool: &str) -> bool {
    env::var_os("PATH").is_some_and(|p| env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// The same build aya-build runs from agent/build.rs, into target/ so the
/// object can be inspected (e.g. `bpftool btf dump file`).
fn build_ebpf() -> anyhow::Result<PathBuf> {
    setup()?;
    let flags = ["-Cdebuginfo=2", "-Clink-arg=--btf"].join("\x1f");
    // `rustup run` because the cargo running xtask cannot take `+nightly`.
    run(Command::new("rustup")
        .current_dir(root().join("ebpf"))
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env("CARGO_ENCODED_RUSTFLAGS", flags)
        .args([
            "run",
            "nightly",
            "cargo",
            "build",
            "--release",
            "--target",
            EBPF_TARGET,
        ])
        .args(["-Z", "build-std=core", "-p", "clockmesh-ebpf"])
        .args(["--target-dir", &root().join("target").to_string_lossy()]))?;
    let obj = root()
        .join("target")
        .join(EBPF_TARGET)
        .join("release/clockmesh");
    if !obj.exists() {
        bail!("expected eBPF object at {}", obj.display());
    }
    Ok(obj)
}

/// Fails unless run as root; `why` says what the task does that needs it.
pub(crate) fn require_root(task: &str, why: &str) -> anyhow::Result<()> {
    if !output(Command::new("id").arg("-u")).trim().eq("0") {
        bail!("`cargo xtask {task}` {why}: run it as root");
    }
    Ok(())
}

const NETNS_AND_EBPF: &str = "creates network namespaces and loads eBPF programs";

/// `$CARGO_TARGET_DIR` (relative to the repository root, where `cargo()`
/// runs) or `target/`.
pub(crate) fn target_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(d) if Path::new(&d).is_absolute() => PathBuf::from(d),
        Some(d) => root().join(d),
        None => root().join("target"),
    }
}

/// Builds `clockmesh-demo` (release) after the root and setup checks.
pub(crate) fn build_demo(task: &str) -> anyhow::Result<PathBuf> {
    require_root(task, NETNS_AND_EBPF)?;
    setup()?;
    run(cargo().args([
        "build",
        "--release",
        "--quiet",
        "-p",
        "clockmesh-testbed",
        "--bin",
        "clockmesh-demo",
        // The cluster demo runs the agent binary next to itself.
        "-p",
        "clockmesh",
        "--bin",
        "clockmesh",
    ]))?;
    Ok(target_dir().join("release/clockmesh-demo"))
}

fn demo(args: &[String]) -> anyhow::Result<()> {
    run(Command::new(build_demo("demo")?).args(args))
}

fn test() -> anyhow::Result<()> {
    require_root("test", NETNS_AND_EBPF)?;
    setup()?;
    run(cargo()
        .args(["test", "--no-fail-fast"])
        .env("CLOCKMESH_REQUIRE_ROOT", "1"))?;
    // The agent without its default features (static membership, no etcd,
    // Kubernetes or CUDA): built and its unit tests run.
    run(cargo()
        .args([
            "test",
            "-p",
            "clockmesh",
            "--no-default-features",
            "--lib",
            "--bins",
        ])
        .env("AYA_BUILD_SKIP", "1"))?;
    // The non-default `rocm-smi` feature (links librocm_smi64): its tests run
    // without an AMD GPU; the eBPF object is not needed for them.
    run(rocm_smi_cargo().args([
        "test",
        "-p",
        "clockmesh",
        "--features",
        "rocm-smi",
        "--lib",
        "devclock",
    ]))?;
    bench_accuracy::accuracy_gate()?;
    for script in extra_test_scripts() {
        run(Command::new("bash").arg(&script).current_dir(root()))?;
    }
    fuzz(60)
}

/// The fuzz targets, by name, as fuzz/Cargo.toml declares them.
fn fuzz_targets() -> anyhow::Result<Vec<String>> {
    let manifest = std::fs::read_to_string(root().join("fuzz/Cargo.toml"))?;
    let names: Vec<String> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .filter(|n| *n != "clockmesh-fuzz")
        .map(String::from)
        .collect();
    anyhow::ensure!(!names.is_empty(), "no fuzz targets in fuzz/Cargo.toml");
    Ok(names)
}

/// Runs each fuzz target for `seconds`; prints executions per target.
fn fuzz(seconds: u64) -> anyhow::Result<()> {
    setup()?;
    let mut report = Vec::new();
    for target in fuzz_targets()? {
        let mut cmd = nightly_cargo();
        cmd.current_dir(root().join("fuzz")).args([
            "fuzz",
            "run",
            &target,
            "--",
            &format!("-max_total_time={seconds}"),
            "-print_final_stats=1",
        ]);
        eprintln!("xtask: {}", describe(&cmd));
        let out = cmd
            .output()
            .with_context(|| format!("starting {}", describe(&cmd)))?;
        let log = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "fuzz target {target} failed ({}):\n{}",
                out.status,
                tail.join("\n")
            );
        }
        let execs = log
            .lines()
            .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .with_context(|| format!("{target}: libFuzzer printed no execution count"))?;
        report.push((target, execs));
    }
    for (target, execs) in &report {
        println!(
            "fuzz {target:<22} {execs:>12} execs in {seconds} s ({:.0}/s), no crash",
            *execs as f64 / seconds as f64
        );
    }
    Ok(())
}

/// Tests outside cargo (C reader, C++ hook, Python, Kubernetes manifests), one script each.
fn extra_test_scripts() -> Vec<PathBuf> {
    [
        "hook/test.sh",
        "python/test.sh",
        // After python/test.sh: it uses the venv with jax that script makes.
        "tests/end_to_end.sh",
        "deploy/kubernetes/test.sh",
    ]
    .iter()
    .map(|p| root().join(p))
    .filter(|p| p.exists())
    .collect()
}

fn lint() -> anyhow::Result<()> {
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    layering::check_layering()?;
    run(cargo()
        .args(["clippy", "--all-targets", "--", "-D", "warnings"])
        .env("AYA_BUILD_SKIP", "1"))?;
    run(cargo()
        .args([
            "clippy",
            "-p",
            "clockmesh",
            "--no-default-features",
            "--all-targets",
        ])
        .args(["--", "-D", "warnings"])
        .env("AYA_BUILD_SKIP", "1"))?;
    // The fuzz crate is its own workspace: without this, an API change that
    // breaks a fuzz target shows only when `test` fuzzes, at its very end.
    run(cargo().args([
        "clippy",
        "--manifest-path",
        &root().join("fuzz/Cargo.toml").to_string_lossy(),
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    setup()?;
    run(rocm_smi_cargo().args([
        "clippy",
        "-p",
        "clockmesh",
        "--all-targets",
        "--features",
        "rocm-smi",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(nightly_cargo()
        .args([
            "clippy",
            "--release",
            "--target",
            EBPF_TARGET,
            "-Z",
            "build-std=core",
        ])
        .args([
            "-p",
            "clockmesh-ebpf",
            "--target-dir",
            &root().join("target").to_string_lossy(),
        ])
        .args(["--", "-D", "warnings"]))
}

/// Cargo for clockmesh's `rocm-smi` feature (packages from `setup`): bindgen
/// pointed at LLVM 22's libclang, eBPF build skipped.
fn rocm_smi_cargo() -> Command {
    let mut c = cargo();
    c.env("AYA_BUILD_SKIP", "1")
        .env("LIBCLANG_PATH", Path::new(LLVM_PREFIX).join("lib"));
    c
}

/// Nightly cargo in ebpf/ (`rustup run`: the cargo running xtask cannot take `+nightly`).
fn nightly_cargo() -> Command {
    let mut c = Command::new("rustup");
    c.current_dir(root().join("ebpf"))
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .args(["run", "nightly", "cargo"]);
    c
}

fn bench_chrony(args: &[String]) -> anyhow::Result<()> {
    run(Command::new(build_demo("bench-chrony")?)
        .arg("bench-chrony")
        .args(args))
}

fn bench_faults(args: &[String]) -> anyhow::Result<()> {
    run(Command::new(build_demo("bench-faults")?)
        .arg("bench-faults")
        .args(args))
}

/// Needs no netns or eBPF, only etcd on PATH and root for the open-file
/// limit (two etcd connections per simulated member): built alone, without
/// the agent binary `build_demo` adds.
fn bench_scale(args: &[String]) -> anyhow::Result<()> {
    run(cargo().args([
        "build",
        "--release",
        "--quiet",
        "-p",
        "clockmesh-testbed",
        "--bin",
        "clockmesh-demo",
    ]))?;
    run(Command::new(target_dir().join("release/clockmesh-demo"))
        .arg("bench-scale")
        .args(args))
}

fn bench() -> anyhow::Result<()> {
    run(Command::new(build_demo("bench")?).arg("bench"))?;
    run(cargo().args(["bench", "--workspace", "--exclude", "clockmesh-ebpf"]))
}
