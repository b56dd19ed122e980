//! `cargo xtask image [--smoke]`: the agent's container image, as an OCI
//! image layout in `<target>/image/clockmesh-oci`, built without a container
//! daemon or a registry (neither is reachable here, and CI has neither).
//!
//! The image is one layer on an empty base, in the spirit of distroless/cc:
//! the release `clockmesh` binary (no debug info, no symbols), the
//! shared libraries `ldd` names for it (glibc, libgcc_s, the dynamic loader),
//! `/etc/passwd`, `/etc/group`, `/etc/nsswitch.conf`, and the directories the
//! DaemonSet mounts over. umoci (Debian package) writes the layout: `init`,
//! `new`, `unpack` the empty image, copy the tree in, `repack`, `config`.
//!
//! `--smoke` then unpacks the finished image and runs the binary in it with
//! `chroot` (running containers does not work in this environment), and
//! checks the image configuration: entrypoint, user 0, OCI labels.
//!
//! Push the result with skopeo, e.g.
//! `skopeo copy oci:target/image/clockmesh-oci:0.1.0 docker://REGISTRY/clockmesh:0.1.0`.
//! `Containerfile` at the repository root builds the same image with a
//! container engine (docs/kubernetes.md).

use std::{
    env, fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use super::{cargo, output, require_root, root, run, setup, setup::require_packages, target_dir};

const BINARY: &str = "/usr/local/bin/clockmesh";
const LAYOUT: &str = "clockmesh-oci";

pub fn image(smoke: bool) -> anyhow::Result<()> {
    require_root(
        "image",
        "unpacks image layers with their owners (and --smoke chroots)",
    )?;
    require_packages(&["umoci"])?;
    let binary = build_binary()?;
    let version = binary_version(&binary)?;
    let dir = target_dir().join("image");
    let layout = dir.join(LAYOUT);
    let stage = dir.join("rootfs");
    stage_rootfs(&binary, &stage)?;
    build_layout(&layout, &stage, &version, &dir.join("bundle"))?;
    report_size(&layout, &stage, &version);
    if smoke {
        smoke_test(&layout, &version, &dir.join("smoke"))?;
    }
    Ok(())
}

fn build_binary() -> anyhow::Result<PathBuf> {
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        eprintln!(
            "xtask: AYA_BUILD_SKIP is set: the image's agent embeds NO eBPF programs \
             (fine for the smoke test, useless on a cluster)"
        );
    } else {
        setup()?; // agent/build.rs builds the eBPF object: nightly, bpf-linker
    }
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "clockmesh",
        "--bin",
        "clockmesh",
    ]))?;
    let binary = target_dir().join("release/clockmesh");
    if !binary.exists() {
        bail!("expected the agent binary at {}", binary.display());
    }
    Ok(binary)
}

/// "clockmesh 0.1.0" → "0.1.0": the version the binary itself reports.
fn binary_version(binary: &Path) -> anyhow::Result<String> {
    let text = output(Command::new(binary).arg("--version"));
    match text.split_whitespace().collect::<Vec<_>>()[..] {
        ["clockmesh", v] => Ok(v.to_string()),
        _ => bail!("{} --version printed {text:?}", binary.display()),
    }
}

/// The image's file tree, made afresh in `stage`.
fn stage_rootfs(binary: &Path, stage: &Path) -> anyhow::Result<()> {
    if stage.exists() {
        fs::remove_dir_all(stage).with_context(|| format!("removing {}", stage.display()))?;
    }
    let at = |p: &str| stage.join(p.trim_start_matches('/'));
    for (d, mode) in [
        ("usr/local/bin", 0o755),
        ("etc/clockmesh", 0o755),
        ("run/clockmesh", 0o755),
        ("var/lib/clockmesh", 0o755),
        ("tmp", 0o1777),
    ] {
        fs::create_dir_all(at(d))?;
        fs::set_permissions(at(d), fs::Permissions::from_mode(mode))?;
    }

    // The release profile strips debug info and symbols: the binary goes in
    // as built.
    let dest = at(BINARY);
    fs::copy(binary, &dest)?;
    fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))?;

    for lib in shared_libraries(binary)? {
        let dest = at(&lib.to_string_lossy());
        fs::create_dir_all(dest.parent().context("library path has no parent")?)?;
        // fs::copy follows symlinks: the loader path /lib64/ld-linux-x86-64.so.2
        // becomes the file itself, as the binary's PT_INTERP expects.
        fs::copy(&lib, &dest).with_context(|| format!("copying {}", lib.display()))?;
    }

    // Root only (the DaemonSet runs as uid 0 with a few capabilities); glibc
    // 2.34+ has the files and dns NSS modules built in.
    fs::write(
        at("etc/passwd"),
        "root:x:0:0:root:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n",
    )?;
    fs::write(at("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
    fs::write(
        at("etc/nsswitch.conf"),
        "passwd: files\ngroup: files\nhosts: files dns\n",
    )?;
    Ok(())
}

/// Absolute paths of the shared objects the binary loads, from `ldd`.
fn shared_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("not a dynamic executable") || text.contains("statically linked") {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        bail!(
            "ldd {} failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.contains("not found") {
            bail!("{}: missing shared library: {line}", binary.display());
        }
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)",
        // "/lib64/ld-linux-x86-64.so.2 (0x…)", "linux-vdso.so.1 (0x…)" (skipped).
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

/// One line `KEY = "value"` of the workspace Cargo.toml (xtask has no TOML parser).
fn workspace_value(key: &str) -> Option<String> {
    let text = fs::read_to_string(root().join("Cargo.toml")).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

fn build_layout(layout: &Path, stage: &Path, version: &str, bundle: &Path) -> anyhow::Result<()> {
    for d in [layout, bundle] {
        if d.exists() {
            fs::remove_dir_all(d).with_context(|| format!("removing {}", d.display()))?;
        }
    }
    let image = format!("{}:{version}", layout.display());
    run(Command::new("umoci").args(["init", "--layout"]).arg(layout))?;
    run(Command::new("umoci").args(["new", "--image", &image]))?;
    run(Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(bundle))?;
    // cp -a keeps modes (tmp's sticky bit) and owners (root).
    run(Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", stage.display()))
        .arg(bundle.join("rootfs")))?;
    run(Command::new("umoci")
        .args(["repack", "--image", &image])
        .arg(bundle))?;
    fs::remove_dir_all(bundle)?;

    let source = workspace_value("repository").unwrap_or_default();
    let license = workspace_value("license").unwrap_or_default();
    let revision = output(
        Command::new("git")
            .current_dir(root())
            .args(["rev-parse", "HEAD"]),
    );
    let labels = [
        ("org.opencontainers.image.title", "clockmesh"),
        (
            "org.opencontainers.image.description",
            "clockmesh node agent: clock offsets between GPU nodes from eBPF-timestamped probes",
        ),
        ("org.opencontainers.image.source", &source),
        ("org.opencontainers.image.version", version),
        ("org.opencontainers.image.licenses", &license),
        ("org.opencontainers.image.revision", revision.trim()),
    ];
    let mut config = Command::new("umoci");
    config
        .args(["config", "--image", &image])
        .args(["--config.entrypoint", BINARY])
        .args(["--config.cmd", "agent"])
        .args(["--config.user", "0"])
        .args(["--config.workingdir", "/"])
        .args(["--config.env", "PATH=/usr/local/bin:/usr/bin:/bin"])
        .args(["--config.exposedports", "31900/udp"])
        .args(["--config.exposedports", "9977/tcp"])
        .args([
            "--history.comment",
            "clockmesh agent binary and its shared libraries",
        ]);
    for (k, v) in labels.iter().filter(|(_, v)| !v.is_empty()) {
        config.args(["--config.label", &format!("{k}={v}")]);
    }
    run(&mut config)?;
    run(Command::new("umoci").args(["tag", "--image", &image, "latest"]))?;
    run(Command::new("umoci").args(["gc", "--layout"]).arg(layout))?;
    Ok(())
}

fn tree_size(p: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(p) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    fs::read_dir(p)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| tree_size(&e.path()))
        .sum()
}

fn report_size(layout: &Path, stage: &Path, version: &str) {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "image: {}:{version} (also :latest): {:.1} MiB as stored/pushed (gzip), {:.1} MiB unpacked",
        layout.display(),
        mib(tree_size(&layout.join("blobs"))),
        mib(tree_size(stage)),
    );
}

/// The first `"digest":"sha256:…"` in a compact JSON document.
fn first_digest(json: &str) -> Option<&str> {
    let start = json.find("\"digest\":\"sha256:")? + "\"digest\":\"".len();
    let len = json[start..].find('"')?;
    Some(&json[start..start + len])
}

fn blob(layout: &Path, digest: &str) -> anyhow::Result<String> {
    let path = layout.join("blobs").join(digest.replacen(':', "/", 1));
    fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

fn smoke_test(layout: &Path, version: &str, bundle: &Path) -> anyhow::Result<()> {
    // Image configuration: index → manifest → config (umoci writes compact
    // JSON; a manifest names its config before its layers).
    let index = fs::read_to_string(layout.join("index.json"))?;
    let manifest = blob(
        layout,
        first_digest(&index).context("no manifest in index.json")?,
    )?;
    let config = blob(
        layout,
        first_digest(&manifest).context("no config in manifest")?,
    )?;
    for want in [
        format!("\"Entrypoint\":[\"{BINARY}\"]"),
        "\"User\":\"0\"".to_string(),
        format!("\"org.opencontainers.image.version\":\"{version}\""),
        "\"org.opencontainers.image.source\":\"".to_string(),
    ] {
        if !config.contains(&want) {
            bail!("image config lacks {want}: {config}");
        }
        println!("smoke: image config has {want}");
    }

    if bundle.exists() {
        fs::remove_dir_all(bundle)?;
    }
    let image = format!("{}:{version}", layout.display());
    run(Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(bundle))?;
    let rootfs = bundle.join("rootfs");
    // Looked up here: with env_clear, Command would search the child's PATH.
    let chroot = env::var_os("PATH")
        .and_then(|p| {
            env::split_paths(&p)
                .map(|d| d.join("chroot"))
                .find(|c| c.is_file())
        })
        .context("chroot not found on PATH")?;
    // As the container would run it: only the image's files, a bare environment.
    let in_image = |args: &[&str]| -> anyhow::Result<String> {
        let out = Command::new(&chroot)
            .arg(&rootfs)
            .arg(BINARY)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .output()
            .context("running chroot")?;
        if !out.status.success() {
            bail!(
                "clockmesh {} in the image failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        println!("smoke: clockmesh {} ok", args.join(" "));
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let reported = in_image(&["--version"])?;
    if reported.trim() != format!("clockmesh {version}") {
        bail!("the image's clockmesh --version printed {reported:?}");
    }
    let help = in_image(&["--help"])?;
    // The DaemonSet runs `clockmesh agent`. The check is skipped only while
    // the subcommand does not exist yet (it lands with issue 7's agent
    // work); once `--help` lists it, `agent --help` must succeed.
    if help.lines().any(|l| l.trim_start().starts_with("agent ")) {
        in_image(&["agent", "--help"])?;
    } else {
        println!("smoke: SKIP clockmesh agent --help: this build has no `agent` subcommand yet");
    }
    fs::remove_dir_all(bundle)?;
    println!("smoke: ok");
    Ok(())
}
