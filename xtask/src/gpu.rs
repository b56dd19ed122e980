//! `cargo xtask gpu-e2e`: the real two-host GPU job of `clockmesh-demo
//! gpu-e2e`, on this machine (it needs 2 NVIDIA GPUs, torch and jax), or,
//! with `--bundle DIR`, everything a GPU machine without cargo or iproute2
//! needs to run it: the stripped release binaries, the skew shim, and `ip`
//! with its libraries behind a wrapper (docs/gpu-clocks.md, "A real
//! multi-host GPU job").

use std::{path::Path, process::Command};

use anyhow::Context as _;

use crate::{build_demo, run, target_dir};

/// Libraries of Debian's `ip` that a GPU image may lack.
const IP_LIBRARIES: [&str; 7] = [
    "libbpf.so.1",
    "libelf.so.1",
    "libmnl.so.0",
    "libbsd.so.0",
    "libcap.so.2",
    "libz.so.1",
    "libmd.so.0",
];

/// The wrapper keeps LD_LIBRARY_PATH out of the programs `ip netns exec`
/// starts: the loader is told where the libraries are.
const IP_WRAPPER: &str = r#"#!/bin/sh
d=$(dirname "$(readlink -f "$0")")/../lib
exec /lib64/ld-linux-x86-64.so.2 --library-path "$d" "$d/ip.real" "$@"
"#;

pub fn gpu_e2e(args: &[String]) -> anyhow::Result<()> {
    let demo = build_demo("gpu-e2e")?;
    if let Some(i) = args.iter().position(|a| a == "--bundle") {
        let dir = args.get(i + 1).context("--bundle DIR")?;
        return bundle(Path::new(dir));
    }
    run(Command::new(demo).arg("gpu-e2e").args(args))
}

fn bundle(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join("bin"))?;
    std::fs::create_dir_all(dir.join("lib"))?;
    let release = target_dir().join("release");
    for bin in ["clockmesh", "clockmesh-demo"] {
        std::fs::copy(release.join(bin), dir.join(bin))
            .with_context(|| format!("copying {bin}"))?;
    }
    run(Command::new("gcc")
        .args([
            "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o",
        ])
        .arg(dir.join("clockmesh_skew.so"))
        .arg(crate::root().join("tests/skew_shim/clockmesh_skew.c"))
        .arg("-lm"))?;
    std::fs::copy("/usr/sbin/ip", dir.join("lib/ip.real")).context("copying /usr/sbin/ip")?;
    for lib in IP_LIBRARIES {
        std::fs::copy(
            Path::new("/lib/x86_64-linux-gnu").join(lib),
            dir.join("lib").join(lib),
        )
        .with_context(|| format!("copying {lib}"))?;
    }
    let wrapper = dir.join("bin/ip");
    std::fs::write(&wrapper, IP_WRAPPER)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    println!(
        "bundle in {}: on the GPU machine, from the repository root:\n  PATH={}/bin:$PATH {}/clockmesh-demo gpu-e2e --shim {}/clockmesh_skew.so",
        dir.display(),
        dir.display(),
        dir.display(),
        dir.display()
    );
    Ok(())
}
