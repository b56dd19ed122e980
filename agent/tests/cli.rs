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

/// Two synthetic hosts' traces, "a" and "b", in a fresh directory.
fn two_traces(name: &str) -> std::path::PathBuf {
    use clockmesh::trace::synth::{SynthSpec, write_synthetic};
    let dir = std::env::temp_dir().join(format!("cm-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("in")).unwrap();
    for host in ["a", "b"] {
        let spec = SynthSpec {
            host: host.into(),
            ..SynthSpec::default()
        };
        let mut f = std::fs::File::create(dir.join(format!("in/{host}.xplane.pb"))).unwrap();
        write_synthetic(&mut f, &spec).unwrap();
    }
    dir
}

#[test]
fn trace_merge_refuses_requests_the_inputs_make_meaningless() {
    let dir = two_traces("merge-checks");
    let d = |p: &str| dir.join(p).display().to_string();
    let merge = |extra: &[&str]| {
        let mut args = vec!["trace", "merge"];
        let (input, out) = (d("in"), d("out"));
        args.extend([input.as_str(), "-o", out.as_str()]);
        args.extend(extra);
        run(&mut clockmesh(&args))
    };
    // --run escaping -o: refused, nothing created beside it.
    for bad in ["../escape", "/tmp/abs", "a/b", ".."] {
        let (out, _, err) = merge(&["--offset", "a=1,b=2", "--run", bad]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        assert!(err.contains("one plain directory name"), "{bad}: {err}");
    }
    assert!(!dir.join("escape").exists());
    // An --offset for a host no input has (a typo): refused.
    let (out, _, err) = merge(&["--offset", "a=1,typo=2", "--run", "r"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains("names host typo") && err.contains("a, b"),
        "{err}"
    );
    // Comma-separated offsets are two hosts.
    let (out, text, err) = merge(&["--offset", "a=1,b=2", "--run", "r"]);
    assert!(out.status.success(), "{err}");
    assert!(text.contains("--offset"), "{text}");
    // --perfetto never replaces a file unless --force.
    std::fs::write(dir.join("keep.json"), "mine").unwrap();
    let (out, _, err) = merge(&[
        "--offset",
        "a=1,b=2",
        "--run",
        "r2",
        "--perfetto",
        &d("keep.json"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("--force"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.join("keep.json")).unwrap(),
        "mine"
    );
    assert!(
        !dir.join("out/plugins/profile/r2").exists(),
        "nothing written"
    );
    let (out, _, err) = merge(&[
        "--offset",
        "a=1,b=2",
        "--run",
        "r3",
        "--perfetto",
        &d("keep.json"),
        "--force",
    ]);
    assert!(out.status.success(), "{err}");
    assert!(
        std::fs::read_to_string(dir.join("keep.json"))
            .unwrap()
            .contains("traceEvents")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// One node line per host of `two_traces`, anchored at their session
/// start: a history that covers both sessions.
fn history_for_two_traces(path: &std::path::Path) {
    history_of(path, &[("a", 1_000), ("b", -250_000)]);
}

/// One node line per (host, offset), anchored at the synthetic session
/// start.
fn history_of(path: &std::path::Path, hosts: &[(&str, i64)]) {
    use clockmesh::publish::history::{HistoryEntry, NodeLine};
    let start = clockmesh::trace::synth::SynthSpec::default().start_ns;
    let mut text = String::new();
    for &(host, offset_ns) in hosts {
        let entry = HistoryEntry {
            host: host.into(),
            window: 1,
            anchor_ns: start,
            offset_ns,
            drift_ppb: 0.0,
            bound_ns: 120,
            valid_from_ns: Some(start - 1_000_000_000),
            valid_until_ns: Some(start + 1_000_000_000),
            reference: Some("a".into()),
            ..HistoryEntry::default()
        };
        text += &serde_json::to_string(&NodeLine::new(&entry)).unwrap();
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

#[test]
fn trace_merge_summary_is_json_that_the_report_shows() {
    let dir = two_traces("merge-summary");
    let d = |p: &str| dir.join(p).display().to_string();
    history_for_two_traces(&dir.join("h.jsonl"));
    let merge = |run_name: &str, extra: &[&str]| {
        let (input, out, history) = (d("in"), d("out"), d("h.jsonl"));
        let mut args = vec!["trace", "merge", &input, "-o", &out, "--history", &history];
        args.extend(["--run", run_name, "--summary"]);
        args.extend(extra);
        run(&mut clockmesh(&args))
    };
    let (out, text, err) = merge("r1", &[&d("s.json")]);
    assert!(out.status.success(), "{err}");
    assert!(text.contains("summary JSON: "), "{text}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("s.json")).unwrap()).unwrap();
    let hosts = summary["hosts"].as_array().unwrap();
    let b = hosts.iter().find(|h| h["host"] == "b").unwrap();
    assert_eq!(b["offset_ns"], -250_000);
    assert_eq!(b["source"], "history");
    assert_eq!(b["worst_bound_ns"], 120);
    // An existing summary is kept, and nothing is merged, without --force.
    let (out, _, err) = merge("r2", &[&d("s.json")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("--force"), "{err}");
    assert!(!dir.join("out/plugins/profile/r2").exists());
    // The report shows it beside the history.
    let page = d("r.html");
    let (out, _, err) = run(&mut clockmesh(&[
        "report",
        "--history",
        &d("h.jsonl"),
        "--merge-summary",
        &d("s.json"),
        "-o",
        &page,
    ]));
    assert!(out.status.success(), "{err}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains(
            r#"data-host="b" data-offset-ns="-250000" data-drift-ppb="0" data-bound-ns="120""#
        ),
        "{html}"
    );
    // Not a summary: one line that says so.
    let (out, _, err) = run(&mut clockmesh(&[
        "report",
        "--history",
        &d("h.jsonl"),
        "--merge-summary",
        &d("h.jsonl"),
        "-o",
        &d("r2.html"),
    ]));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains("not a `clockmesh trace merge --summary` file"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What a user has after a job: one history per host in a directory.
/// Both commands read it whole, a history file given as an input is
/// refused with how to pass it, and `trace collectives` names the user's
/// inputs, not the scratch merge it removes.
#[test]
fn trace_commands_take_a_directory_of_histories_and_name_the_inputs() {
    let dir = two_traces("history-dir");
    let d = |p: &str| dir.join(p).display().to_string();
    std::fs::create_dir_all(dir.join("hist")).unwrap();
    history_of(&dir.join("hist/a.jsonl"), &[("a", 1_000)]);
    history_of(&dir.join("hist/b.jsonl"), &[("b", -250_000)]);
    let (input, out, hist) = (d("in"), d("out"), d("hist"));
    let summary = d("s.json");
    let (o, _, err) = run(&mut clockmesh(&[
        "trace",
        "merge",
        &input,
        "-o",
        &out,
        "--history",
        &hist,
        "--summary",
        &summary,
    ]));
    assert!(o.status.success(), "{err}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(field_of_each(&s["hosts"], "source"), ["history", "history"]);
    // The shell's `--history hist/*.jsonl`: the second file lands among
    // the inputs.
    let b = d("hist/b.jsonl");
    let (o, _, err) = run(&mut clockmesh(&[
        "trace",
        "merge",
        &input,
        &b,
        "-o",
        &out,
        "--history",
        &d("hist/a.jsonl"),
    ]));
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("--history DIR"), "{err}");
    let (o, json, err) = run(&mut clockmesh(&[
        "trace",
        "collectives",
        &input,
        "--history",
        &hist,
        "--json",
    ]));
    assert!(o.status.success(), "{err}");
    let a: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        field_of_each(&a["participants"], "trace"),
        [d("in/a.xplane.pb"), d("in/b.xplane.pb")]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The string `field` of each element of a JSON array.
fn field_of_each<'a>(array: &'a serde_json::Value, field: &str) -> Vec<&'a str> {
    let items = array.as_array().unwrap().iter();
    items.map(|v| v[field].as_str().unwrap()).collect()
}

/// `trace critical-path` on the real PyTorch NCCL fixture (two ranks of one
/// host, merged with offset 0): steps 5 and 6 are topped by rank 1's gap
/// before its all-reduce (its planted 20 ms sleep); a what-if runs; a rank
/// the inputs lack, and a malformed --what-if, are refused with why.
#[test]
fn trace_critical_path_names_rank_1_s_sleep_and_refuses_unknown_ranks() {
    let fixture = |r: &str| {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../trace/tests/data/gpu/torch")
            .join(r)
            .display()
            .to_string()
    };
    let (r0, r1) = (
        fixture("rank0.pt.trace.json"),
        fixture("rank1.pt.trace.json"),
    );
    let base = [
        "trace",
        "critical-path",
        &r0,
        &r1,
        "--offset",
        "rank0=0,rank1=0",
    ];
    let with = |more: &[&str]| clockmesh(&[&base[..], more].concat());
    let (o, json, err) = run(&mut with(&["--json", "--what-if", "1:aten::div"]));
    assert!(o.status.success(), "{err}");
    let c: serde_json::Value = serde_json::from_str(&json).unwrap();
    for step in c["steps"].as_array().unwrap() {
        if matches!(step["step"].as_u64(), Some(5 | 6)) {
            let top = &step["segments"][step["top"].as_u64().unwrap() as usize];
            assert_eq!(top["participant"], 1, "{step}");
            assert_eq!(top["kind"], "gap", "{step}");
            assert!(top["duration_ns"].as_u64().unwrap() > 19_000_000, "{step}");
        }
    }
    assert_eq!(c["what_if"][0]["what_if"]["op"], "aten::div");
    let (o, table, err) = run(&mut with(&[]));
    assert!(o.status.success(), "{err}");
    assert!(table.contains("Critical path of step"), "{table}");
    let (o, _, err) = run(&mut with(&["--what-if", "7:aten::div"]));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("no rank \"7\"") && err.contains("#1 (rank 1"),
        "{err}"
    );
    let (o, _, err) = run(&mut with(&["--what-if", "aten::div"]));
    assert_eq!(o.status.code(), Some(2));
    assert!(err.contains("RANK:OP"), "{err}");
}
