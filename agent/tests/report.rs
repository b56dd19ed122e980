//! `clockmesh report` as a user runs it: a JSONL history written with the
//! agent's own line types, the binary run on it, the page rendered by
//! headless Chromium (the screenshot must not be blank) and its DOM read
//! back (every plotted value must be the history's). Chromium comes from
//! `cargo xtask setup`; without it these tests fail, they never skip.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use clockmesh::config::InjectedSkew;
use clockmesh::publish::PublishedDeviceMap;
use clockmesh::publish::history::{AnchorKind, DeviceHistoryEntry, HistoryEntry, NodeLine};
use clockmesh_core::report::{EdgeLine, FitLine};
use clockmesh_core::timeline::HandOverLine;

const WINDOW_NS: i64 = 4_000_000_000;
const WINDOWS: u64 = 12;
/// Node names as they reach the page; the third one needs escaping.
const NODES: [&str; 3] = ["n0", "n1", "n2 <&\"x\">"];

fn clockmesh(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_clockmesh"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cm-report-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The skews injected into the nodes (n0 is the reference).
fn skews(epoch_ns: i64) -> Vec<InjectedSkew> {
    [(0, 0.0), (-689_000, 3_000.0), (412_000, -12_000.0)]
        .into_iter()
        .map(|(offset_ns, drift_ppb)| InjectedSkew {
            offset_ns,
            drift_ppb,
            epoch_ns,
            wander_ppb_per_sqrt_s: 0.0,
            wander_seed: 0,
        })
        .collect()
}

/// The true global − local of node `i` at its local time `local`.
fn true_offset(s: &[InjectedSkew], i: usize, local: i64) -> f64 {
    let t = local - s[i].at(local);
    (s[0].at(t) - s[i].at(t)) as f64
}

/// A small deterministic error in −span..span.
fn noise(i: usize, k: u64, span: i64) -> i64 {
    ((i as i64 * 7_919 + k as i64 * 104_729) % (2 * span + 1)) - span
}

fn node_line(s: &[InjectedSkew], i: usize, k: u64, epoch_ns: i64) -> HistoryEntry {
    let t = epoch_ns + (k as i64 + 1) * WINDOW_NS;
    let anchor_ns = t + s[i].at(t);
    let bound_ns = 60 + 10 * k;
    let offset_ns = true_offset(s, i, anchor_ns).round() as i64 + noise(i, k, bound_ns as i64 / 2);
    HistoryEntry {
        host: NODES[i].into(),
        window: k,
        anchor_ns,
        offset_ns,
        drift_ppb: s[0].drift_ppb - s[i].drift_ppb + noise(i, k, 3) as f64 * 0.25,
        bound_ns,
        valid_from_ns: Some(anchor_ns - WINDOW_NS),
        valid_until_ns: Some(anchor_ns + WINDOW_NS),
        reference: Some(NODES[0].into()),
        node_id: Some(i as u32),
        bound_growth_ppb: 20.0,
        reference_id: Some(0),
        anchor_kind: Some(AnchorKind::Reference),
        timeline_origin: Some(NODES[0].into()),
    }
}

fn edge_line(from: usize, to: usize, k: u64, anchor_ns: i64) -> EdgeLine {
    let fit = FitLine {
        anchor_ns,
        offset_ns: 1_000 * (to as i64 - from as i64),
        offset_frac_ns: 0.25,
        drift_ppb: 0.0,
        bound_ns: 55.5,
        drift_bound_ppb: 4.0,
        margin_ns: 12.0,
        min_rtt_ns: 38_000.0 + 250.5 * (from * 3 + to) as f64 + noise(from, k, 40) as f64,
        forward_points: 14,
        backward_points: 11,
        trimmed: 0,
        span_ns: WINDOW_NS,
    };
    EdgeLine {
        window: k,
        node: NODES[from].into(),
        from: NODES[from].into(),
        to: NODES[to].into(),
        from_id: from as u32,
        to_id: to as u32,
        probes_forward: 40,
        probes_backward: 38,
        pure_forward: 14 + (k as usize % 5),
        pure_backward: 11,
        incomplete: 1,
        spacing_rejected: 0,
        impure: 52,
        history_windows: 2,
        drift_windows: 2,
        stamps: "software".into(),
        purity_tolerance_ns: 10_000,
        fit: (k != 3).then_some(fit),
        error: (k == 3).then(|| "too few pure pairs".into()),
    }
}

fn device_line(k: u64, written_at_ns: i64) -> DeviceHistoryEntry {
    let anchor = 50_000_000_000 + k * WINDOW_NS as u64;
    DeviceHistoryEntry {
        kind: "device".into(),
        host: NODES[1].into(),
        window: k,
        written_at_ns,
        map: PublishedDeviceMap {
            device: "nvidia:0".into(),
            device_domain: "cuda-globaltimer".into(),
            source: "cuda-pingpong".into(),
            host_domain: "CLOCK_REALTIME".into(),
            anchor_device_ns: anchor,
            offset_at_anchor_ns: written_at_ns - anchor as i64,
            drift_ppb: 310.0,
            bound_ns: 900,
            residual_rms_ns: 120.0,
            points: 64,
            valid_from_device_ns: anchor - 30_000_000_000,
            valid_until_device_ns: anchor + 2_000_000_000,
        },
    }
}

/// What the test wrote: one history file per node and the truth file.
struct Written {
    dir: PathBuf,
    files: Vec<PathBuf>,
    truth: PathBuf,
    nodes: Vec<HistoryEntry>,
    edges: Vec<EdgeLine>,
    skews: Vec<InjectedSkew>,
}

/// Each node's history as its agent writes it: a hand-over line from the
/// reference, then per window its out-edges' lines, its node line and (n1)
/// a GPU's device line.
fn write_histories(name: &str) -> Written {
    let dir = scratch(name);
    let epoch_ns = 1_795_335_288_621_242_594;
    let skews = skews(epoch_ns);
    let (mut nodes, mut edges, mut files) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..NODES.len() {
        let mut lines = Vec::new();
        if i == 0 {
            lines.push(serde_json::to_string(&HandOverLine::new(0, NODES[0], None)).unwrap());
        }
        for k in 0..WINDOWS {
            let node = node_line(&skews, i, k, epoch_ns);
            for to in (0..NODES.len()).filter(|&to| to != i) {
                let e = edge_line(i, to, k, node.anchor_ns - WINDOW_NS / 2);
                lines.push(serde_json::to_string(&e).unwrap());
                edges.push(e);
            }
            lines.push(serde_json::to_string(&NodeLine::new(&node)).unwrap());
            if i == 1 {
                let d = device_line(k, node.anchor_ns);
                lines.push(serde_json::to_string(&d).unwrap());
            }
            nodes.push(node);
        }
        let path = dir.join(format!("node{i}.jsonl"));
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        files.push(path);
    }
    let truth = dir.join("truth.json");
    let by_name: BTreeMap<&str, &InjectedSkew> = NODES.iter().copied().zip(&skews).collect();
    std::fs::write(
        &truth,
        serde_json::to_string(&serde_json::json!({ "nodes": by_name })).unwrap(),
    )
    .unwrap();
    Written {
        dir,
        files,
        truth,
        nodes,
        edges,
        skews,
    }
}

/// `clockmesh report` over every history file and the truth, into `out`.
fn report(w: &Written, out: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<String> = vec!["report".into()];
    for f in &w.files {
        args.extend(["--history".into(), f.display().to_string()]);
    }
    args.extend(["--truth".into(), w.truth.display().to_string()]);
    args.extend(["-o".into(), out.display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    clockmesh(&args)
}

#[test]
fn bad_histories_get_one_line_errors_naming_file_and_line() {
    let dir = scratch("errors");
    let out = dir.join("r.html");
    let o = out.display().to_string();
    let missing = dir.join("missing.jsonl").display().to_string();
    let r = clockmesh(&["report", "--history", &missing, "-o", &o]);
    assert_eq!(r.status.code(), Some(1));
    let err = text(&r.stderr);
    assert!(err.contains(&format!("reading history {missing}")), "{err}");

    let empty = dir.join("empty.jsonl");
    std::fs::write(&empty, "\n\n").unwrap();
    let e = empty.display().to_string();
    let err = text(&clockmesh(&["report", "--history", &e, "-o", &o]).stderr);
    assert_eq!(
        err.trim(),
        format!(
            "clockmesh: error: {e}: empty (no history lines; is it the agent's clockmesh.jsonl?)"
        )
    );

    let bad = dir.join("bad.jsonl");
    let good = serde_json::to_string(&NodeLine::new(&HistoryEntry::default())).unwrap();
    std::fs::write(&bad, format!("{good}\n{{\"type\":\"node\",\"host\":\n")).unwrap();
    let b = bad.display().to_string();
    let err = text(&clockmesh(&["report", "--history", &b, "-o", &o]).stderr);
    assert!(
        err.starts_with(&format!("clockmesh: error: {b}:2: not a JSON object")),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    let no_history = clockmesh(&["report", "-o", &o]);
    assert_eq!(no_history.status.code(), Some(2));
    assert!(text(&no_history.stderr).contains("--history <FILE>"));
    assert!(!out.exists(), "nothing written on errors");
    let help = text(&clockmesh(&["report", "--help"]).stdout);
    for word in [
        "--history",
        "--truth",
        "--output",
        "--force",
        "--merge-summary",
        "--collectives",
        "global − local",
    ] {
        assert!(help.contains(word), "{word} not in {help}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_existing_report_is_replaced_only_with_force() {
    let w = write_histories("force");
    let out = w.dir.join("report.html");
    std::fs::write(&out, "keep me").unwrap();
    let r = report(&w, &out, &[]);
    assert_eq!(r.status.code(), Some(1));
    assert!(text(&r.stderr).contains("exists; give another --output or --force"));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep me");
    let r = report(&w, &out, &["--force"]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    assert_eq!(text(&r.stdout), format!("report: {}\n", out.display()));
    assert!(
        std::fs::read_to_string(&out)
            .unwrap()
            .starts_with("<!DOCTYPE html>")
    );
    let left: Vec<_> = std::fs::read_dir(&w.dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    std::fs::remove_dir_all(&w.dir).unwrap();
}

#[test]
fn the_page_renders_in_chromium_and_its_dom_holds_the_historys_values() {
    let browser = chromium();
    let w = write_histories("chromium");
    let out = w.dir.join("report.html");
    let r = report(&w, &out, &[]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let page = std::fs::read_to_string(&out).unwrap();
    for external in ["http:", "https:", "<script", "<link", "@import", "url(http"] {
        let hits: Vec<_> = page.match_indices(external).collect();
        // The SVG namespace is a name, not a fetch.
        let fetched = hits
            .iter()
            .filter(|(i, _)| !page[*i..].starts_with("http://www.w3.org/2000/svg"))
            .count();
        assert_eq!(fetched, 0, "{external} in a self-contained page");
    }

    let t0 = Instant::now();
    let png = w.dir.join("shot.png");
    let shot = format!("--screenshot={}", png.display());
    run_chromium(&browser, &w.dir, &[&shot, "--window-size=1200,2000"], &out);
    let image = screenshot::decode(&std::fs::read(&png).unwrap());
    assert_eq!((image.width, image.height), (1200, 2000));
    let colours = image.distinct_colours();
    let inked = image.share_unlike_corner();
    assert!(colours >= 12, "{colours} colours: a blank page?");
    assert!(
        inked > 0.02,
        "only {inked:.4} of the pixels differ from the background"
    );

    let dom = run_chromium(&browser, &w.dir, &["--dump-dom"], &out);
    check_dom(&text(&dom.stdout), &w);
    eprintln!(
        "chromium: screenshot ({colours} colours, {:.1} % inked) and DOM in {:.1} s",
        inked * 100.0,
        t0.elapsed().as_secs_f64()
    );
    std::fs::remove_dir_all(&w.dir).unwrap();
}

/// The plotted values read back from the rendered DOM equal the history's.
fn check_dom(dom: &str, w: &Written) {
    let circles = dom::elements(dom, "circle");
    let of = |class: &str| -> Vec<&BTreeMap<String, String>> {
        circles
            .iter()
            .filter(|c| c.get("class").is_some_and(|v| v == class))
            .collect()
    };
    let key = |node: &str, window: u64, t: i64| (node.to_string(), window, t);
    let field = |c: &BTreeMap<String, String>, k: &str| c[k].clone();
    let num = |c: &BTreeMap<String, String>, k: &str| -> i64 { c[k].parse().unwrap() };

    let mut want: Vec<_> = w
        .nodes
        .iter()
        .map(|n| {
            (
                key(&n.host, n.window, n.anchor_ns),
                n.offset_ns,
                n.bound_ns as i64,
            )
        })
        .collect();
    // A node point: its node, window and anchor.
    let point_key = |c: &BTreeMap<String, String>| {
        key(
            &field(c, "data-node"),
            num(c, "data-window") as u64,
            num(c, "data-t-ns"),
        )
    };
    let mut got: Vec<_> = of("pt offset")
        .iter()
        .map(|c| {
            let k = point_key(c);
            (k, num(c, "data-offset-ns"), num(c, "data-bound-ns"))
        })
        .collect();
    want.sort();
    got.sort();
    assert_eq!(got.len(), w.nodes.len());
    assert_eq!(got, want, "offset ± bound points");

    let drifts: BTreeMap<_, f64> = of("pt drift")
        .iter()
        .map(|c| (point_key(c), c["data-drift-ppb"].parse().unwrap()))
        .collect();
    assert_eq!(drifts.len(), w.nodes.len());
    for n in &w.nodes {
        assert_eq!(drifts[&key(&n.host, n.window, n.anchor_ns)], n.drift_ppb);
    }

    check_errors(&of("pt error"), w);
    check_edges(&of("pt rtt"), w);
    let edges = dom::elements(dom, "g");
    let arrows = edges
        .iter()
        .filter(|g| g.get("class").is_some_and(|c| c == "edge"))
        .count();
    assert_eq!(
        arrows,
        NODES.len() * (NODES.len() - 1),
        "one arrow per directed edge"
    );
    let rows = dom::elements(dom, "tr");
    assert!(
        rows.iter()
            .any(|r| r.get("data-device").is_some_and(|d| d == "nvidia:0")
                && r["data-host"] == NODES[1]
                && r["data-maps"] == WINDOWS.to_string()),
        "device map row"
    );
}

fn check_errors(points: &[&BTreeMap<String, String>], w: &Written) {
    assert_eq!(points.len(), w.nodes.len(), "every node line has a truth");
    for p in points {
        let node = NODES.iter().position(|n| *n == p["data-node"]).unwrap();
        let t: i64 = p["data-t-ns"].parse().unwrap();
        let offset: i64 = p["data-offset-ns"].parse().unwrap();
        let truth = true_offset(&w.skews, node, t);
        let error: f64 = p["data-error-ns"].parse().unwrap();
        assert!(
            (error - (offset as f64 - truth)).abs() < 1e-6,
            "{p:?}: truth {truth}"
        );
        assert!(error.abs() <= p["data-bound-ns"].parse::<f64>().unwrap() / 2.0 + 1.0);
    }
}

fn check_edges(points: &[&BTreeMap<String, String>], w: &Written) {
    let mut want: Vec<_> = w
        .edges
        .iter()
        .filter_map(|e| {
            let f = e.fit.as_ref()?;
            Some((
                e.from.clone(),
                e.to.clone(),
                e.window,
                f.anchor_ns,
                f.min_rtt_ns.to_string(),
            ))
        })
        .collect();
    let mut got: Vec<_> = points
        .iter()
        .map(|p| {
            let n = |k: &str| p[k].parse::<i64>().unwrap();
            let rtt = p["data-min-rtt-ns"].parse::<f64>().unwrap().to_string();
            (
                p["data-from"].clone(),
                p["data-to"].clone(),
                n("data-window") as u64,
                n("data-t-ns"),
                rtt,
            )
        })
        .collect();
    want.sort();
    got.sort();
    assert_eq!(got, want, "min RTT points");
    for p in points {
        let r: f64 = p["data-pure-ratio"].parse().unwrap();
        assert!((0.0..=1.0).contains(&r));
    }
}

/// The ranks of the collectives job: trace file stem, host (the third
/// needs escaping), alignment bound (ns).
const RANKS: [(&str, &str, u64); 3] = [("n0", "n0", 500), ("n1", "n1", 800), ("n2", NODES[2], 300)];
/// What every rank's trace counts from (the merged timeline, epoch ns).
const JOB_BASE_NS: i64 = 1_795_335_300_000_000_000;

/// Enter and exit (µs after [`JOB_BASE_NS`]) of `rank` at all-reduce `k`:
/// rank 2 is 200 µs + 50·k µs late at 0..4; at 4 the three enter within
/// 500 ns (within the combined bound); at 5 rank 0 leaves 19 µs before
/// rank 1 enters (a causality violation); 6 is rank 0's alone (its
/// profiler stopped last: unmatched).
fn job_call(rank: usize, k: usize) -> Option<(f64, f64)> {
    let t = 1_000.0 * k as f64;
    match (k, rank) {
        (0..4, _) => {
            let late = 200.0 + 50.0 * k as f64;
            let enter = [0.0, 5.0, late][rank];
            Some((t + enter, t + late + 10.0))
        }
        (4, _) => Some((t + [0.0, 0.2, 0.5][rank], t + 30.0)),
        (5, _) => Some([(t, t + 1.0), (t + 20.0, t + 30.0), (t + 10.0, t + 30.0)][rank]),
        (6, 0) => Some((t, t + 5.0)),
        _ => None,
    }
}

/// One PyTorch (Kineto) trace per rank, as `trace merge` writes them (a
/// `clockmesh` block with the host, bound and source): per all-reduce a
/// step on the main thread, and on gloo's thread an `aten::mm` then the
/// `gloo:all_reduce` span.
fn write_job(dir: &Path) -> PathBuf {
    let run = dir.join("job");
    std::fs::create_dir_all(&run).unwrap();
    for (rank, (stem, host, bound)) in RANKS.iter().enumerate() {
        let mut events = Vec::new();
        for k in 0..7 {
            let Some((enter, exit)) = job_call(rank, k) else {
                continue;
            };
            let t = 1_000.0 * k as f64;
            events.push(serde_json::json!({"ph": "X", "cat": "user_annotation", "name": format!("ProfilerStep#{k}"),
                "pid": 1, "tid": 1, "ts": t - 50.0, "dur": 900.0}));
            events.push(
                serde_json::json!({"ph": "X", "cat": "cpu_op", "name": "aten::mm",
                "pid": 1, "tid": 2, "ts": enter - 40.0, "dur": 38.0}),
            );
            events.push(
                serde_json::json!({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce",
                "pid": 1, "tid": 2, "ts": enter, "dur": exit - enter}),
            );
        }
        let doc = serde_json::json!({
            "baseTimeNanoseconds": JOB_BASE_NS,
            "distributedInfo": {"rank": rank, "world_size": 3,
                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 3}]},
            "clockmesh": {"host": host, "alignment_bound_ns": bound, "merged_source": "history"},
            "traceEvents": events,
        });
        let path = run.join(format!("{stem}.pt.trace.json"));
        std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
    }
    run
}

/// `clockmesh trace collectives --json` over the job, written to a file.
fn analyse_job(dir: &Path) -> (PathBuf, serde_json::Value) {
    let run = write_job(dir);
    let r = clockmesh(&["trace", "collectives", &run.display().to_string(), "--json"]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let path = dir.join("collectives.json");
    std::fs::write(&path, &r.stdout).unwrap();
    (path, serde_json::from_slice(&r.stdout).unwrap())
}

#[test]
fn a_bad_collectives_or_critical_path_file_is_refused_in_one_line() {
    let w = write_histories("coll-errors");
    let out = w.dir.join("r.html");
    let missing = w.dir.join("missing.json").display().to_string();
    let inputs = [
        (
            "--collectives",
            "collectives",
            "clockmesh trace collectives --json",
        ),
        (
            "--critical-path",
            "critical paths",
            "clockmesh trace critical-path --json",
        ),
    ];
    for (flag, what, producer) in inputs {
        let r = report(&w, &out, &[flag, &missing]);
        assert_eq!(r.status.code(), Some(1));
        let err = text(&r.stderr);
        assert!(err.contains(&format!("reading {what} {missing}")), "{err}");
        for bad in ["{\"aligned\": true}", "[1, 2", "{}"] {
            let path = w.dir.join("bad.json");
            std::fs::write(&path, bad).unwrap();
            let p = path.display().to_string();
            let r = report(&w, &out, &[flag, &p]);
            assert_eq!(r.status.code(), Some(1));
            let err = text(&r.stderr);
            assert!(
                err.starts_with(&format!("clockmesh: error: {p}: not a `{producer}` file: ")),
                "{err}"
            );
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
    assert!(!out.exists(), "nothing written on errors");
    std::fs::remove_dir_all(&w.dir).unwrap();
}

#[test]
fn the_collectives_section_renders_in_chromium_with_the_analysis_values() {
    let browser = chromium();
    let dir = scratch("collectives");
    let (coll, a) = analyse_job(&dir);
    let s = &a["summary"];
    let count = |k: &str| s[k].as_u64().unwrap();
    assert_eq!((count("matched"), count("unmatched")), (6, 1), "{s}");
    assert_eq!(
        (count("significant"), count("within_alignment_error")),
        (5, 1),
        "{s}"
    );
    assert_eq!(
        (count("causality_checked"), count("causality_violations")),
        (6, 1),
        "{s}"
    );
    assert_eq!(
        a["stragglers"][0]["host"], NODES[2],
        "rank 2 caused the most wait"
    );

    // A history of one node line: the collectives section comes soon after.
    let epoch_ns = 1_795_335_288_621_242_594;
    let history = dir.join("n0.jsonl");
    let entry = node_line(&skews(epoch_ns), 0, 0, epoch_ns);
    let line = NodeLine::new(&entry);
    std::fs::write(&history, serde_json::to_string(&line).unwrap() + "\n").unwrap();
    let out = dir.join("report.html");
    let (h, c, o) = (
        history.display().to_string(),
        coll.display().to_string(),
        out.display().to_string(),
    );
    let r = clockmesh(&["report", "--history", &h, "--collectives", &c, "-o", &o]);
    assert!(r.status.success(), "{}", text(&r.stderr));

    let png = dir.join("shot.png");
    let shot = format!("--screenshot={}", png.display());
    run_chromium(&browser, &dir, &[&shot, "--window-size=1200,3200"], &out);
    let image = screenshot::decode(&std::fs::read(&png).unwrap());
    assert_eq!((image.width, image.height), (1200, 3200));
    let colours = image.distinct_colours();
    let inked = image.share_unlike_corner();
    assert!(colours >= 12, "{colours} colours: a blank page?");
    assert!(inked > 0.02, "only {inked:.4} of the pixels inked");
    // The section's own colours, painted: the wait bars and the
    // significant late points (the one-node history draws neither).
    let bars = image.count_rgb([0xff, 0x7f, 0x0e]);
    let late = image.count_rgb([0xd6, 0x27, 0x28]);
    assert!(bars > 2_000, "{bars} pixels of wait bars");
    assert!(late > 20, "{late} pixels of significant points");

    let dom = run_chromium(&browser, &dir, &["--dump-dom"], &out);
    check_collectives_dom(&text(&dom.stdout), &a);
    eprintln!(
        "chromium: collectives ({colours} colours, {bars} bar pixels, {late} late-point pixels)"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Every instance's point, every rank's bar and the violation's row carry
/// the analysis' exact values.
fn check_collectives_dom(dom: &str, a: &serde_json::Value) {
    type Attrs = BTreeMap<String, String>;
    let with_class = |tag: &str, class: &str| -> Vec<Attrs> {
        dom::elements(dom, tag)
            .into_iter()
            .filter(|e| e.get("class").is_some_and(|c| c == class))
            .collect()
    };
    let string = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        v => v.to_string(),
    };
    let participants = a["participants"].as_array().unwrap();
    let instances = a["instances"].as_array().unwrap();
    let points = with_class("circle", "pt late");
    assert_eq!(points.len(), instances.len(), "one late point per instance");
    let spreads = with_class("circle", "pt spread");
    assert_eq!(
        spreads.len(),
        instances.len(),
        "one spread point per instance"
    );
    for (n, i) in instances.iter().enumerate() {
        let p = points
            .iter()
            .find(|p| p["data-instance"] == n.to_string())
            .unwrap_or_else(|| panic!("no point for instance {n}"));
        let last = &participants[i["last"].as_u64().unwrap() as usize];
        let want = [
            ("data-last", string(&i["last"])),
            ("data-last-host", string(&last["host"])),
            ("data-last-rank", string(&last["rank"])),
            ("data-late-by-ns", string(&i["late_by_ns"])),
            ("data-combined-bound-ns", string(&i["combined_bound_ns"])),
            ("data-significant", string(&i["significant"])),
            ("data-arrival-spread-ns", string(&i["arrival_spread_ns"])),
            ("data-max-wait-ns", string(&i["max_wait_ns"])),
            ("data-kind", string(&i["kind"])),
            ("data-step", string(&i["step"])),
            ("data-ordinal", string(&i["key"]["ordinal"])),
        ];
        for (k, v) in want {
            assert_eq!(p[k], v, "instance {n}: {k}");
        }
        let s = &spreads[n];
        assert_eq!(s["data-instance"], n.to_string());
        assert_eq!(s["data-arrival-spread-ns"], string(&i["arrival_spread_ns"]));
    }
    // The within-error instance is grey, the others red.
    let fills: Vec<(bool, String)> = points
        .iter()
        .map(|p| (p["data-significant"] == "true", p["fill"].clone()))
        .collect();
    assert!(
        fills.iter().all(|(sig, f)| (f == "#d62728") == *sig),
        "{fills:?}"
    );

    let bars = with_class("rect", "bar rank");
    let stragglers = a["stragglers"].as_array().unwrap();
    assert_eq!(bars.len(), stragglers.len());
    for (b, s) in bars.iter().zip(stragglers) {
        assert_eq!(b["data-participant"], string(&s["participant"]));
        assert_eq!(b["data-host"], string(&s["host"]));
        assert_eq!(b["data-wait-caused-ns"], string(&s["wait_caused_ns"]));
        assert_eq!(b["data-times-last"], string(&s["times_last"]));
    }
    assert_eq!(bars[0]["data-host"], NODES[2]);
    assert_eq!(
        with_class("rect", "bar host").len(),
        a["hosts"].as_array().unwrap().len()
    );

    let v = &a["violations"][0];
    let rows = dom::elements(dom, "tr");
    assert!(
        rows.iter().any(
            |r| r.get("data-entered-last") == Some(&string(&v["entered_last"]))
                && r["data-instance"] == string(&v["instance"])
                && r["data-overlap-ns"] == string(&v["overlap_ns"])
                && r["data-combined-bound-ns"] == string(&v["combined_bound_ns"])
        ),
        "violation row"
    );
    let table_rows = rows
        .iter()
        .filter(|r| r.contains_key("data-late-by-ns"))
        .count();
    assert_eq!(table_rows, instances.len().min(20), "worst-instance rows");
    let summary = dom::elements(dom, "p")
        .into_iter()
        .find(|p| p.get("class").is_some_and(|c| c == "summary collectives"))
        .expect("the collectives summary");
    assert_eq!(summary["data-clocks"], "aligned");
}

/// Debian's chromium on PATH, or a failure that says how to install it.
fn chromium() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("chromium"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "chromium is not installed: run `cargo xtask setup` (it installs Debian's chromium)"
            )
        })
}

/// Runs headless Chromium on `page` with its own profile in `dir`; fails
/// after 120 s.
fn run_chromium(browser: &Path, dir: &Path, args: &[&str], page: &Path) -> Output {
    let profile = dir.join(format!("chromium-profile-{}", args[0].len()));
    let log = dir.join(format!("chromium-{}.log", args[0].len()));
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut { stdout }, &mut buf).map(|_| buf)
    });
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium {args:?} did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = child.wait_with_output().unwrap();
    out.stdout = reader.join().unwrap().unwrap();
    out.stderr = std::fs::read(&log).unwrap_or_default();
    assert!(
        out.status.success(),
        "chromium {args:?}: {}",
        text(&out.stderr)
    );
    out
}

/// A scan of start tags in serialized HTML: enough for Chromium's own
/// `--dump-dom` output, which always quotes attribute values with `"`.
mod dom {
    use std::collections::BTreeMap;

    /// The attributes of every `<tag ...>` in `html`, entities decoded.
    pub fn elements(html: &str, tag: &str) -> Vec<BTreeMap<String, String>> {
        let open = format!("<{tag} ");
        html.match_indices(&open)
            .map(|(i, _)| attributes(&html[i + open.len()..]))
            .collect()
    }

    fn attributes(mut s: &str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        loop {
            s = s.trim_start();
            if s.starts_with('>') || s.starts_with("/>") || s.is_empty() {
                return out;
            }
            let eq = s.find('=').expect("attribute without a value");
            let name = s[..eq].trim().to_string();
            let rest = s[eq + 1..].strip_prefix('"').expect("unquoted value");
            let end = rest.find('"').expect("unterminated value");
            out.insert(name, unescape(&rest[..end]));
            s = &rest[end + 1..];
        }
    }

    fn unescape(v: &str) -> String {
        v.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&nbsp;", "\u{a0}")
            .replace("&amp;", "&")
    }
}

/// Chromium's screenshot as pixels (the `png` crate decodes it).
mod screenshot {
    use std::collections::HashSet;

    pub struct Image {
        pub width: usize,
        pub height: usize,
        channels: usize,
        pixels: Vec<u8>,
    }

    impl Image {
        fn pixel(&self, i: usize) -> &[u8] {
            &self.pixels[i * self.channels..(i + 1) * self.channels]
        }

        pub fn distinct_colours(&self) -> usize {
            (0..self.width * self.height)
                .map(|i| self.pixel(i))
                .collect::<HashSet<_>>()
                .len()
        }

        /// Pixels of exactly this colour.
        pub fn count_rgb(&self, rgb: [u8; 3]) -> usize {
            (0..self.width * self.height)
                .filter(|&i| self.pixel(i)[..3] == rgb)
                .count()
        }

        /// Share of pixels unlike the top-left one (the page background).
        pub fn share_unlike_corner(&self) -> f64 {
            let bg = self.pixel(0);
            let n = self.width * self.height;
            (0..n).filter(|&i| self.pixel(i) != bg).count() as f64 / n as f64
        }
    }

    pub fn decode(file: &[u8]) -> Image {
        let mut decoder = png::Decoder::new(std::io::Cursor::new(file));
        decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
        let mut reader = decoder.read_info().expect("a PNG screenshot");
        let mut pixels = vec![0; reader.output_buffer_size().expect("a sane PNG size")];
        let frame = reader.next_frame(&mut pixels).expect("PNG pixels");
        pixels.truncate(frame.buffer_size());
        Image {
            width: frame.width as usize,
            height: frame.height as usize,
            channels: frame.color_type.samples(),
            pixels,
        }
    }
}
