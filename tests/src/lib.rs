//! Test hosts for clockmesh (network namespaces joined by veth pairs) and the
//! two-host probe exchange used by the integration tests and the demo.
pub mod cluster;
pub mod etcd;
pub mod exchange;
pub mod firewall;
pub mod load;
pub mod netns;
pub mod shim;

/// Integration tests need root (netns, eBPF). Where `CLOCKMESH_REQUIRE_ROOT`
/// is set (CI, `cargo xtask test`) a non-root run fails; elsewhere it skips.
pub fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CLOCKMESH_REQUIRE_ROOT").is_none(),
        "{test}: needs root (CLOCKMESH_REQUIRE_ROOT is set)"
    );
    eprintln!("{test}: skipped, needs root");
    false
}

/// Runs a command; its stdout, or an error with its stderr.
pub fn sh(argv: &[&str]) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let out = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("starting {}", argv[0]))?;
    if !out.status.success() {
        anyhow::bail!(
            "`{}` failed: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`sh`] inside network namespace `netns` (`ip netns exec`).
pub fn sh_in(netns: &str, argv: &[&str]) -> anyhow::Result<String> {
    let mut full = vec!["ip", "netns", "exec", netns];
    full.extend_from_slice(argv);
    sh(&full)
}
