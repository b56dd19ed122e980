//! The `clockmesh` binary on bad input and failing output, as a user runs
//! it: clear errors and exit codes, never a panic.

use std::process::{Command, Output, Stdio};

fn clockmesh(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_clockmesh"));
    c.args(args);
    for var in [
        "CLOCKMESH_CONFIG",
        "XLA_DIST_PROF_CONFIG",
        "CLOCKMESH_INTERFACE",
        "NCCL_SOCKET_IFNAME",
    ] {
        c.env_remove(var);
    }
    c
}

fn run(c: &mut Command) -> (Output, String, String) {
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (out, stdout, stderr)
}

#[test]
fn status_needs_no_agent_configuration() {
    let (out, _, err) = run(clockmesh(&["status"]).env("CLOCKMESH_METRICS_ADDR", "127.0.0.1:1"));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains("no clockmesh agent answers on 127.0.0.1:1"),
        "{err}"
    );
    let (_, help, _) = run(&mut clockmesh(&["status", "--help"]));
    assert!(
        help.contains("--addr") && !help.contains("--inject-skew"),
        "{help}"
    );
}

#[test]
fn config_shows_an_incomplete_configuration_and_says_what_is_missing() {
    let (out, table, err) = run(&mut clockmesh(&["config"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        table.contains("probe_port") && table.contains("31900"),
        "{table}"
    );
    assert!(err.contains("interface must be set"), "{err}");
}

#[test]
fn config_refuses_what_the_agent_would_refuse() {
    let (out, _, err) = run(&mut clockmesh(&[
        "config",
        "--interface",
        "lo",
        "--members",
        "garbage",
    ]));
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("expected name=ip:port"), "{err}");
    let (_, _, err) = run(&mut clockmesh(&[
        "config",
        "--interface",
        "lo",
        "--set",
        "probe_port=70000",
    ]));
    assert!(err.contains("must be between 1 and 65535"), "{err}");
}

#[test]
fn a_full_disk_is_an_error_and_a_closed_pipe_is_not() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let (out, _, err) = run(clockmesh(&["config", "--interface", "lo"]).stdout(full));
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("writing to standard output"), "{err}");

    let mut child = clockmesh(&["config", "--interface", "lo"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader goes away before the first line
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

#[test]
fn logs_to_a_file_carry_no_colour_codes() {
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/scenarios/protocol-4.toml"
    );
    let (out, _, err) =
        run(clockmesh(&["simulate", "--scenario", scenario]).env("RUST_LOG", "info"));
    assert!(out.status.success(), "{err}");
    assert!(err.contains("simulating"), "{err}");
    assert!(!err.contains('\u{1b}'), "ANSI escape in {err:?}");
}

#[test]
fn offsets_says_what_is_wrong_with_the_path() {
    let (out, _, err) = run(&mut clockmesh(&["offsets", "--path", "/tmp"]));
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("/tmp is a directory"), "{err}");
    let (_, _, err) = run(&mut clockmesh(&[
        "offsets",
        "--path",
        "/nonexistent/offsets",
    ]));
    assert!(
        err.contains("no offsets file at /nonexistent/offsets"),
        "{err}"
    );
}
