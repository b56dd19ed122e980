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

mod image;

const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const EBPF_TARGET: &str = "bpfel-unknown-none";

#[derive(Parser)]
#[command(about = "clockmesh developer tasks")]
struct Args {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install missing prerequisites (LLVM 22, nightly rust-src, bpf-linker, ROCm SMI); idempotent.
    Setup,
    /// Build the eBPF object with nightly and -Z build-std=core (+ BTF).
    BuildEbpf,
    /// etcd + N netns hosts running the agent with injected skews; prints
    /// estimated vs true offsets (needs root). `-- --help` lists the options.
    Demo {
        /// Arguments passed to `clockmesh-demo` (e.g. `--nodes 8 --duration 30 --json`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run every test (needs root for the netns/eBPF tests).
    Test,
    /// rustfmt check and clippy with warnings denied.
    Lint,
    /// Benchmarks: capture path figures and criterion benches.
    Bench,
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
        Task::BuildEbpf => build_ebpf().map(|obj| println!("eBPF object: {}", obj.display())),
        Task::Demo { args } => demo(&args),
        Task::Test => test(),
        Task::Lint => lint(),
        Task::Bench => bench(),
        Task::Image { smoke } => image::image(smoke),
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
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

/// Installs what the eBPF build needs; each step is skipped when satisfied.
fn setup() -> anyhow::Result<()> {
    let llvm_config = Path::new(LLVM_PREFIX).join("bin/llvm-config");
    let polly = Path::new(LLVM_PREFIX).join("lib/libPolly.a");
    if !llvm_config.exists() || !polly.exists() {
        apt_install(&["llvm-22-dev", "libpolly-22-dev"])?;
    }
    if !output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))
    .contains("rust-src")
    {
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    let linker = output(Command::new("bpf-linker").arg("--version"));
    if !linker.contains(BPF_LINKER_VERSION) {
        run(Command::new("cargo")
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
            .args(["--no-default-features", "--features", "llvm-22"])
            .env("LLVM_PREFIX", LLVM_PREFIX))?;
    }
    // Command on PATH → Debian package providing it: netns test hosts,
    // protoc for prost/tonic code generation, etcd for discovery tests.
    let tools = [
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("protoc", "protobuf-compiler"),
        ("etcd", "etcd-server"),
    ];
    let mut missing: Vec<&str> = tools
        .iter()
        .filter(|(tool, _)| !on_path(tool))
        .map(|(_, package)| *package)
        .collect();
    missing.dedup();
    if !missing.is_empty() {
        apt_install(&missing)?;
    }
    // clockmesh's non-default `rocm-smi` feature: librocm_smi64 to link
    // (Debian's ROCm 5.2), and libclang with its headers for the bindgen run
    // of rocm_smi_lib_sys. File → Debian package providing it.
    let llvm = Path::new(LLVM_PREFIX);
    let rocm_smi_build = [
        (
            PathBuf::from("/usr/lib/librocm_smi64.so"),
            "librocm-smi-dev",
        ),
        (llvm.join("lib/libclang-22.so.1"), "libclang1-22"),
        (
            llvm.join("lib/clang/22/include/stddef.h"),
            "libclang-common-22-dev",
        ),
    ];
    let missing: Vec<&str> = rocm_smi_build
        .iter()
        .filter(|(file, _)| !file.exists())
        .map(|(_, package)| *package)
        .collect();
    if !missing.is_empty() {
        apt_install(&missing)?;
    }
    eprintln!(
        "xtask: setup complete (LLVM 22, nightly rust-src, bpf-linker {BPF_LINKER_VERSION}, iproute2, protoc, etcd, librocm-smi-dev, libclang)"
    );
    Ok(())
}

fn on_path(tool: &str) -> bool {
    env::var_os("PATH").is_some_and(|p| env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    run(Command::new("apt-get").arg("update").arg("-qq"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))
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

fn require_root(task: &str) -> anyhow::Result<()> {
    if !output(Command::new("id").arg("-u")).trim().eq("0") {
        bail!(
            "`cargo xtask {task}` creates network namespaces and loads eBPF programs: run it as root"
        );
    }
    Ok(())
}

/// Builds `clockmesh-demo` (release) after the root and setup checks.
fn build_demo(task: &str) -> anyhow::Result<PathBuf> {
    require_root(task)?;
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
    Ok(root().join("target/release/clockmesh-demo"))
}

fn demo(args: &[String]) -> anyhow::Result<()> {
    run(Command::new(build_demo("demo")?).args(args))
}

fn test() -> anyhow::Result<()> {
    require_root("test")?;
    setup()?;
    run(cargo()
        .args(["test", "--no-fail-fast"])
        .env("CLOCKMESH_REQUIRE_ROOT", "1"))?;
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
    for script in extra_test_scripts() {
        run(Command::new("bash").arg(&script).current_dir(root()))?;
    }
    Ok(())
}

/// Tests outside cargo (C reader, C++ hook, Python, Kubernetes manifests), one script each.
fn extra_test_scripts() -> Vec<PathBuf> {
    [
        "hook/test.sh",
        "python/test.sh",
        "deploy/kubernetes/test.sh",
    ]
    .iter()
    .map(|p| root().join(p))
    .filter(|p| p.exists())
    .collect()
}

fn lint() -> anyhow::Result<()> {
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo()
        .args(["clippy", "--all-targets", "--", "-D", "warnings"])
        .env("AYA_BUILD_SKIP", "1"))?;
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

fn bench() -> anyhow::Result<()> {
    run(Command::new(build_demo("bench")?).arg("bench"))?;
    run(cargo().args(["bench", "--workspace", "--exclude", "clockmesh-ebpf"]))
}
