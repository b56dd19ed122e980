//! `cargo xtask fresh-check`: proves the README's two commands on a new
//! machine of this project's kind, from this repository alone.
//!
//! 1. `mmdebstrap` builds a minimal Debian bookworm root (variant `minbase`)
//!    from the Debian suites apt uses on this machine (security updates
//!    included). Besides `minbase` the root gets only what a Rust toolchain
//!    itself needs to build any crate — a C linker (`gcc`, `libc6-dev`) and
//!    CA certificates for crates.io; everything else must come from
//!    `cargo xtask setup`.
//! 2. The committed `HEAD` is cloned into the root (uncommitted changes are
//!    not checked).
//! 3. In a mount namespace of its own (so nothing stays mounted when the
//!    check ends or fails): `/proc`, `/sys` with bpffs, `/dev`, a fresh
//!    `/dev/shm`, a tmpfs `/run`; the rustup toolchains (`RUSTUP_HOME`)
//!    bound read-only; a fresh, writable `CARGO_HOME` holding only the
//!    rustup proxies (so cargo-installed tools such as bpf-linker must come
//!    from setup). The download caches of apt, cargo's registry and pip are
//!    shared with this machine to save time; nothing else is.
//! 4. Inside, with a clean environment: `cargo xtask demo -- --duration 20`
//!    and `cargo xtask test` (every test; `cargo xtask image --smoke` is not
//!    part of the test command and needs a chroot of its own, so it is not
//!    run), each step timed.
//!
//! The root lives in `<target>/fresh-check` and is removed afterwards
//! (`--keep` keeps it for a look; the next run removes it first). The check
//! refuses to start with less than [`NEEDS_GIB`] free there, and prints how
//! much disk it used at most. `CARGO_INCREMENTAL`, when set, is passed in.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use super::{disk, require_root, root, run, setup::require_packages, target_dir};

/// Free space the check needs on the target directory's filesystem: the
/// root's packages, its build, the test venvs (torch's wheels bring CUDA
/// libraries) and pip's cache, at the peak its `disk:` line reports (the
/// measured figure, dated, is in README.md), plus a margin.
const NEEDS_GIB: f64 = 24.0;
/// Where the repository is cloned inside the new root.
const REPO_IN_ROOT: &str = "/work/clockmesh";
/// The new root's own CARGO_HOME (fresh; its bin/ holds the rustup proxies).
const CARGO_HOME_IN_ROOT: &str = "/root/.cargo";
/// Where the host's RUSTUP_HOME is bound read-only inside the root.
const RUSTUP_HOME_IN_ROOT: &str = "/opt/rustup";
/// What the root gets besides `minbase`: what rustup's toolchains need to
/// build anything at all (a C linker and libc's development files) and to
/// reach crates.io (CA certificates).
const ROOT_PACKAGES: &str = "gcc,libc6-dev,ca-certificates";
/// Where Debian's ca-certificates takes local (site) CAs from.
const LOCAL_CAS: &str = "/usr/local/share/ca-certificates";
/// The rustup proxies a rustup install puts in `$CARGO_HOME/bin`.
const RUSTUP_PROXIES: &[&str] = &[
    "cargo",
    "rustc",
    "rustdoc",
    "rustfmt",
    "cargo-fmt",
    "cargo-clippy",
    "clippy-driver",
    "rust-gdb",
    "rust-lldb",
];

#[derive(clap::Args)]
pub struct Options {
    /// Only setup, the build and the demo in the new root (no test command).
    #[arg(long)]
    quick: bool,
    /// Keep the new root afterwards (under <target>/fresh-check/root).
    #[arg(long)]
    keep: bool,
    /// Internal: the part that runs inside the private mount namespace.
    #[arg(long, hide = true)]
    inside: Option<PathBuf>,
}

pub fn fresh_check(options: &Options) -> anyhow::Result<()> {
    if let Some(new_root) = &options.inside {
        return inside_namespace(new_root, options.quick);
    }
    require_root("fresh-check", "builds a Debian root and mounts into it")?;
    require_packages(&["mmdebstrap", "git"])?;
    let base = fresh_dir();
    let new_root = base.join("root");
    let mut steps = Steps::default();
    remove_root(&new_root)?;
    fs::create_dir_all(&base)?;
    disk::require_free(
        &base,
        NEEDS_GIB,
        "fresh-check",
        "`cargo clean` frees this checkout's build and test venvs (11-12 GiB measured after `cargo xtask test`)",
    )?;
    let disk = disk::Watch::start(&base)?;
    steps.time("mmdebstrap: minimal bookworm root", || make_root(&new_root))?;
    steps.time("clone the repository (HEAD)", || clone_repo(&new_root))?;
    let result = steps.time("inside the new root (own mount namespace)", || {
        run_inside_namespace(&new_root, options.quick)
    });
    if !options.keep {
        remove_root(&new_root)?;
    }
    steps.print();
    println!(
        "  disk: at most {:.1} GiB in use at once ({:.1} GiB free at the lowest)",
        disk::gib(disk.peak_use()),
        disk::gib(disk.lowest_free())
    );
    result?;
    println!("fresh-check: ok");
    Ok(())
}

fn fresh_dir() -> PathBuf {
    target_dir().join("fresh-check")
}

/// Step timings, printed as they finish and once more at the end.
#[derive(Default)]
struct Steps(Vec<(String, f64, bool)>);

impl Steps {
    fn time<T>(
        &mut self,
        name: &str,
        step: impl FnOnce() -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        eprintln!("fresh-check: >>> {name}");
        let start = Instant::now();
        let result = step();
        let secs = start.elapsed().as_secs_f64();
        let ok = result.is_ok();
        eprintln!(
            "fresh-check: <<< {name}: {} in {secs:.0} s",
            if ok { "ok" } else { "FAILED" }
        );
        self.0.push((name.to_owned(), secs, ok));
        result
    }

    fn print(&self) {
        println!("fresh-check steps:");
        for (name, secs, ok) in &self.0 {
            let mark = if *ok { "ok" } else { "FAILED" };
            println!("  {secs:>7.0} s  {mark:<6}  {name}");
        }
        let total: f64 = self.0.iter().map(|(_, s, _)| s).sum();
        println!("  {total:>7.0} s  total");
    }
}

/// Removes a root left by an earlier run. Its mounts lived in a namespace
/// that is gone; should anything still be mounted below it (mounted by hand),
/// refuse rather than delete through the mount into the host's files.
fn remove_root(new_root: &Path) -> anyhow::Result<()> {
    if !new_root.exists() {
        return Ok(());
    }
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = new_root.to_string_lossy().into_owned();
    if let Some(line) = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&prefix)))
    {
        bail!(
            "{} still has a mount below it ({line}); unmount it, then run fresh-check again",
            new_root.display()
        );
    }
    fs::remove_dir_all(new_root).with_context(|| format!("removing {}", new_root.display()))
}

/// The Debian sources apt uses on this machine (one-line or deb822 files),
/// handed to mmdebstrap as they are: the same suites, mirrors and keys.
fn host_debian_sources() -> anyhow::Result<Vec<PathBuf>> {
    let mut sources = Vec::new();
    let list = PathBuf::from("/etc/apt/sources.list");
    if fs::read_to_string(&list)
        .is_ok_and(|s| s.lines().any(|l| l.trim_start().starts_with("deb ")))
    {
        sources.push(list);
    }
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut files: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.to_string_lossy();
                (name.ends_with(".list") || name.ends_with(".sources"))
                    && fs::read_to_string(p).is_ok_and(|s| s.contains("debian"))
            })
            .collect();
        files.sort();
        sources.extend(files);
    }
    if sources.is_empty() {
        bail!("no Debian apt sources found in /etc/apt/sources.list{{,.d/}}");
    }
    Ok(sources)
}

fn make_root(new_root: &Path) -> anyhow::Result<()> {
    let mut cmd = Command::new("mmdebstrap");
    cmd.args(["--variant=minbase", "--mode=root", "--quiet"])
        .arg(format!("--include={ROOT_PACKAGES}"))
        // Keep downloaded packages out of the root (the shared apt cache is
        // bound in later); the root's own apt keeps its lists.
        .arg("--skip=cleanup/apt/lists")
        .arg("bookworm")
        .arg(new_root);
    for source in host_debian_sources()? {
        cmd.arg(source);
    }
    run(&mut cmd)?;
    trust_local_cas(new_root)
}

/// The machine's own CA certificates (`/usr/local/share/ca-certificates`,
/// e.g. a TLS-inspecting egress proxy's): part of the network a machine of
/// this kind sits on, not something the project installs. Without them
/// cargo and pip cannot reach the registries from the new root.
fn trust_local_cas(new_root: &Path) -> anyhow::Result<()> {
    let local = Path::new(LOCAL_CAS);
    let Ok(entries) = fs::read_dir(local) else {
        return Ok(());
    };
    let dest = new_root.join(LOCAL_CAS.trim_start_matches('/'));
    fs::create_dir_all(&dest)?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "crt") {
            fs::copy(&path, dest.join(entry.file_name()))
                .with_context(|| format!("copying {}", path.display()))?;
        }
    }
    run(Command::new("chroot")
        .arg(new_root)
        .args(["update-ca-certificates"]))
}

fn clone_repo(new_root: &Path) -> anyhow::Result<()> {
    let dest = new_root.join(REPO_IN_ROOT.trim_start_matches('/'));
    fs::create_dir_all(dest.parent().context("clone path has no parent")?)?;
    run(Command::new("git")
        .args(["clone", "--quiet", "--no-hardlinks"])
        .arg(root())
        .arg(&dest))
}

/// Runs this same task again, under `unshare --mount --propagation private`:
/// every mount below is made in that namespace and vanishes with it.
fn run_inside_namespace(new_root: &Path, quick: bool) -> anyhow::Result<()> {
    let me = env::current_exe().context("finding the xtask binary")?;
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--"])
        .arg(me)
        .arg("fresh-check")
        .arg("--inside")
        .arg(new_root);
    if quick {
        cmd.arg("--quick");
    }
    run(&mut cmd)
}

fn inside_namespace(new_root: &Path, quick: bool) -> anyhow::Result<()> {
    mount_everything(new_root)?;
    install_rustup_proxies(new_root)?;
    let mut steps = Steps::default();
    let demo = steps.time("cargo xtask demo -- --duration 20", || {
        in_root(new_root, "cargo xtask demo -- --duration 20")
    });
    let test = if quick || demo.is_err() {
        Ok(())
    } else {
        steps.time("cargo xtask test", || in_root(new_root, "cargo xtask test"))
    };
    steps.print();
    demo.and(test)
}

fn mount(args: &[&str], target: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(target).with_context(|| format!("creating {}", target.display()))?;
    run(Command::new("mount").args(args).arg(target))
}

fn bind(source: &Path, target: &Path, read_only: bool) -> anyhow::Result<()> {
    fs::create_dir_all(source).with_context(|| format!("creating {}", source.display()))?;
    mount(&["--rbind", &source.to_string_lossy()], target)?;
    if read_only {
        mount(&["-o", "remount,bind,ro"], target)?;
    }
    Ok(())
}

fn rustup_home() -> PathBuf {
    env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".rustup"))
}

fn cargo_home() -> PathBuf {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cargo"))
}

fn home() -> PathBuf {
    env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
}

fn mount_everything(new_root: &Path) -> anyhow::Result<()> {
    let at = |p: &str| new_root.join(p.trim_start_matches('/'));
    // The root itself a mount point, as `/` is on a machine: `ip netns exec`
    // runs `mount --make-rslave /`, which fails on a plain directory.
    mount(&["--bind", &new_root.to_string_lossy()], new_root)?;
    mount(&["-t", "proc", "proc"], &at("/proc"))?;
    mount(&["-t", "sysfs", "sysfs"], &at("/sys"))?;
    mount(&["-t", "bpf", "bpffs"], &at("/sys/fs/bpf"))?;
    bind(Path::new("/dev"), &at("/dev"), false)?;
    mount(&["-t", "tmpfs", "-o", "mode=1777", "shm"], &at("/dev/shm"))?;
    mount(&["-t", "tmpfs", "-o", "mode=755", "run"], &at("/run"))?;
    bind(&rustup_home(), &at(RUSTUP_HOME_IN_ROOT), true)?;
    // Download caches only: shared to save time, never the tools.
    bind(
        &cargo_home().join("registry"),
        &at(&format!("{CARGO_HOME_IN_ROOT}/registry")),
        false,
    )?;
    bind(
        Path::new("/var/cache/apt/archives"),
        &at("/var/cache/apt/archives"),
        false,
    )?;
    bind(&home().join(".cache/pip"), &at("/root/.cache/pip"), false)?;
    for file in ["/etc/resolv.conf", "/etc/hosts"] {
        fs::copy(file, at(file)).with_context(|| format!("copying {file}"))?;
    }
    Ok(())
}

/// What rustup-init leaves in a new CARGO_HOME: `bin/rustup` and the
/// proxies (links to it). Nothing cargo-installed comes along.
fn install_rustup_proxies(new_root: &Path) -> anyhow::Result<()> {
    let bin = new_root
        .join(CARGO_HOME_IN_ROOT.trim_start_matches('/'))
        .join("bin");
    fs::create_dir_all(&bin)?;
    let rustup = cargo_home().join("bin/rustup");
    fs::copy(&rustup, bin.join("rustup"))
        .with_context(|| format!("copying {}", rustup.display()))?;
    for proxy in RUSTUP_PROXIES {
        let link = bin.join(proxy);
        if !link.exists() {
            std::os::unix::fs::symlink("rustup", &link)
                .with_context(|| format!("linking {}", link.display()))?;
        }
    }
    Ok(())
}

/// One command inside the new root: chroot, clean environment (what a new
/// login shell of root has, plus the toolchain and proxy variables).
fn in_root(new_root: &Path, script: &str) -> anyhow::Result<()> {
    let path = format!(
        "{CARGO_HOME_IN_ROOT}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    );
    let mut cmd = Command::new("chroot");
    cmd.env_clear()
        .env("PATH", path)
        .env("HOME", "/root")
        .env("LANG", "C.UTF-8")
        .env("TERM", "dumb")
        .env("RUSTUP_HOME", RUSTUP_HOME_IN_ROOT)
        .env("CARGO_HOME", CARGO_HOME_IN_ROOT)
        .env("CARGO_TERM_COLOR", "never")
        .env("CI", env::var("CI").unwrap_or_default());
    // CI builds each tree once: incremental caches would only cost disk.
    if let Some(incremental) = env::var_os("CARGO_INCREMENTAL") {
        cmd.env("CARGO_INCREMENTAL", incremental);
    }
    for (key, value) in env::vars() {
        if key.to_ascii_lowercase().ends_with("_proxy") {
            cmd.env(key, value);
        }
    }
    cmd.arg(new_root)
        .args(["bash", "-c"])
        .arg(format!("cd {REPO_IN_ROOT} && {script}"));
    run(&mut cmd)
}
