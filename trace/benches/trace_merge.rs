//! `trace merge` throughput on a synthetic multi-host trace, against a
//! Python baseline using the `protobuf` package on the same input, measured
//! in one run; peak memory of both.
//!
//! Two placements, each against the Python peer doing the same work:
//! `shift` (one constant offset per host: line timestamps only) and
//! `drift` (each host's clock drifts; the agent's history gives an anchor
//! every 4 s and every event start and end is placed at its own time).
//!
//! `cargo bench -p clockmesh-trace --bench trace_merge`
//! Env: CLOCKMESH_BENCH_MB total input size (default 1024, split over 4
//! hosts); CLOCKMESH_BENCH_MODE shift, drift or both (default both); CLOCKMESH_PYTHON a python with `protobuf` (default
//! $CARGO_TARGET_DIR/pyvenv/bin/python, made by python/test.sh; the baseline
//! is skipped with a message when it is missing). Inputs are cached in
//! $CARGO_TARGET_DIR/bench-traces.

mod common;
use common::{cpu_seconds, parse, peak_rss_kib, run_child, target_dir};

use std::collections::HashMap;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use clockmesh_offsets::history::HistoryEntry;
use clockmesh_trace::synth::{SynthSpec, write_synthetic};
use clockmesh_trace::{MergeOptions, merge};

const HOSTS: usize = 4;

fn spec(host: usize, mb: u64) -> SynthSpec {
    // ~18 bytes per event; 4 planes x 64 lines per host.
    let events = (mb << 20) / HOSTS as u64 / 18 / (4 * 64);
    SynthSpec {
        host: format!("host{host}"),
        start_ns: 1_795_335_288_621_242_594 + host as i64 * 7_000_000,
        duration_ns: 60_000_000_000,
        planes: 4,
        lines_per_plane: 64,
        events_per_line: events as usize,
        task_env_stats: Vec::new(),
    }
}

fn inputs(mb: u64) -> Vec<PathBuf> {
    let dir = target_dir().join(format!("bench-traces/{mb}mb"));
    std::fs::create_dir_all(&dir).unwrap();
    (0..HOSTS)
        .map(|h| {
            let s = spec(h, mb);
            let p = dir.join(format!("{}.xplane.pb", s.host));
            if !p.exists() {
                let tmp = p.with_extension("tmp");
                let mut f = BufWriter::new(std::fs::File::create(&tmp).unwrap());
                write_synthetic(&mut f, &s).unwrap();
                drop(f);
                std::fs::rename(&tmp, &p).unwrap();
            }
            p
        })
        .collect()
}

fn offsets() -> HashMap<String, i64> {
    (0..HOSTS)
        .map(|h| (format!("host{h}"), (h as i64 - 1) * 3_000_000))
        .collect()
}

/// Drift of each host's offset in `drift` mode: 10-40 ppm, whole ns per 4 s.
fn drift_ppb(host: usize) -> i64 {
    (host as i64 + 1) * 10_000
}

const WINDOW_NS: i64 = 4_000_000_000;

/// The agent's history for `drift` mode: per host an anchor every 4 s
/// from 8 s before to 8 s after the session, exact on the line
/// offset + drift × (t − session start).
fn drift_history(mb: u64) -> Vec<HistoryEntry> {
    let offs = offsets();
    let mut out = Vec::new();
    for h in 0..HOSTS {
        let s = spec(h, mb);
        let host = format!("host{h}");
        for k in -2..(s.duration_ns / WINDOW_NS + 3) {
            out.push(HistoryEntry {
                host: host.clone(),
                window: k as u64,
                anchor_ns: s.start_ns + k * WINDOW_NS,
                offset_ns: offs[&host] + drift_ppb(h) * k * WINDOW_NS / 1_000_000_000,
                drift_ppb: drift_ppb(h) as f64,
                bound_ns: 100,
                ..HistoryEntry::default()
            });
        }
    }
    out
}

/// Child mode: one merge in a fresh process, so its peak memory is its own.
fn merge_child(out: &Path, mode: &str, mb: u64, files: &[PathBuf]) {
    let mut opts = MergeOptions {
        out_dir: out.to_path_buf(),
        run_name: "bench".into(),
        ..MergeOptions::default()
    };
    match mode {
        "drift" => opts.history = drift_history(mb),
        _ => opts.offsets = offsets(),
    }
    let t = Instant::now();
    let report = merge(files, &opts, &mut |_| {}).unwrap();
    println!("seconds={:.3}", t.elapsed().as_secs_f64());
    println!("cpu_seconds={:.2}", cpu_seconds());
    println!("bytes={}", report.bytes_in);
    println!("peak_rss_kib={}", peak_rss_kib());
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mb: u64 = std::env::var("CLOCKMESH_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    if args.get(1).map(String::as_str) == Some("--merge-child") {
        let files: Vec<PathBuf> = args[4..].iter().map(PathBuf::from).collect();
        return merge_child(Path::new(&args[2]), &args[3], mb, &files);
    }
    let t = Instant::now();
    let files = inputs(mb);
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    eprintln!(
        "inputs ready ({bytes} bytes) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let mode = std::env::var("CLOCKMESH_BENCH_MODE").unwrap_or_else(|_| "both".into());
    for m in ["shift", "drift"] {
        if mode == m || mode == "both" {
            bench_mode(m, mb, bytes, &files);
        }
    }
}

fn bench_mode(mode: &str, mb: u64, bytes: u64, files: &[PathBuf]) {
    let work = target_dir().join("bench-traces/out");
    let _ = std::fs::remove_dir_all(&work);
    let mut child_args = vec![
        PathBuf::from("--merge-child"),
        work.join("rust"),
        PathBuf::from(mode),
    ];
    child_args.extend(files.iter().cloned());
    let rust = run_child(child_args);
    let (rs, rmem) = (parse(&rust, "seconds"), parse(&rust, "peak_rss_kib"));
    let rcpu = parse(&rust, "cpu_seconds");
    let mbps = |s: f64| bytes as f64 / s / 1e6;
    println!(
        "[{mode}] trace merge (rust): {bytes} bytes in {rs:.3} s = {:.0} MB/s, {rcpu:.2} CPU-s, peak RSS {:.0} MiB",
        mbps(rs),
        rmem / 1024.0
    );

    let python = std::env::var_os("CLOCKMESH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("pyvenv/bin/python"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/bench/merge_baseline.py");
    let offs = offsets();
    let jobs: Vec<String> = files
        .iter()
        .enumerate()
        .map(|(h, f)| {
            let host = format!("host{h}");
            let map = match mode {
                "drift" => format!("{},{},{}", offs[&host], drift_ppb(h), spec(h, mb).start_ns),
                _ => offs[&host].to_string(),
            };
            format!("{host}={map}:{}", f.display())
        })
        .collect();
    let py = Command::new(&python)
        .arg(&script)
        .arg(work.join("python"))
        .args(&jobs)
        .output();
    match py {
        Ok(o) if o.status.success() => {
            let py = String::from_utf8_lossy(&o.stdout).to_string();
            let (ps, pmem) = (parse(&py, "seconds"), parse(&py, "peak_rss_kib"));
            let pcpu = parse(&py, "cpu_seconds");
            println!(
                "[{mode}] python protobuf baseline: {ps:.3} s = {:.0} MB/s, {pcpu:.2} CPU-s, peak RSS {:.0} MiB",
                mbps(ps),
                pmem / 1024.0
            );
            println!(
                "[{mode}] speedup rust/python = {:.1}x wall, {:.1}x CPU; memory python/rust = {:.1}x",
                ps / rs,
                pcpu / rcpu,
                pmem / rmem
            );
            check_same_timestamps(&work);
        }
        Ok(o) => println!(
            "python baseline failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => println!(
            "python baseline skipped ({}: {e}); run python/test.sh first",
            python.display()
        ),
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// Both merges must agree on every line timestamp (same algorithm).
fn check_same_timestamps(work: &Path) {
    use clockmesh_trace::scan_file;
    for h in 0..HOSTS {
        let name = format!("host{h}.xplane.pb");
        let a = scan_file(&work.join("rust/plugins/profile/bench").join(&name)).unwrap();
        let b = scan_file(&work.join("python").join(&name)).unwrap();
        let ts =
            |s: &clockmesh_trace::Scan| s.lines.iter().map(|l| l.timestamp_ns).collect::<Vec<_>>();
        assert_eq!(ts(&a), ts(&b), "{name}: rust and python merges disagree");
        assert_eq!(a.profile_start_ns(), b.profile_start_ns());
    }
    println!("rust and python outputs agree on all line timestamps");
}
