//! `trace collectives` analysis throughput and peak memory on a synthetic
//! PyTorch (Kineto JSON) job, against a Python peer that does what
//! TraceLens-style tools do (`json.load` each rank, pick the collective
//! events, group them into instances, find each instance's last arriver),
//! measured in the same run.
//!
//! The job: 4 ranks (`rank0.pt.trace.json` .. `rank3.pt.trace.json`),
//! gloo shaped as PyTorch 2.15 writes it (see `collectives/kineto.rs`): per
//! step a `ProfilerStep#N` span and mostly `cpu_op` compute events on the
//! main thread; per collective a `c10d::*` op on the main thread holding a
//! `record_param_comms` with PyTorch's collective metadata (`Process Group
//! Name`, `Seq`, ...), and the work's `gloo:*` span on gloo's worker
//! thread, which carries no sequence number (matched by occurrence). Rank
//! 2 enters every collective `LATE_US` later than the others, who enter
//! within `JITTER_US` of each other; each rank has its own
//! `baseTimeNanoseconds`. Both tools must find every instance matched with
//! rank 2 last and the same total lateness (checked, so the bench cannot
//! silently measure nothing).
//!
//! `cargo bench -p clockmesh-trace --bench collectives`
//! Env: CLOCKMESH_BENCH_MB total input size (default 1024, split over 4
//! ranks); CLOCKMESH_PYTHON the python for the peer (default
//! $CARGO_TARGET_DIR/pyvenv/bin/python, else target/pyvenv/bin/python of
//! the workspace, made by python/test.sh; stdlib only; skipped with a
//! message when missing). Inputs are cached in
//! $CARGO_TARGET_DIR/bench-traces.

mod common;
use common::{cpu_seconds, parse, peak_rss_kib, target_dir};

use std::fmt::Write as _;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use clockmesh_trace::collectives::inputs::read_job;
use clockmesh_trace::collectives::{AnalysisOptions, analyse};

const RANKS: usize = 4;
/// The rank that enters every collective late.
const STRAGGLER: usize = 2;
/// How much later it enters (µs), and the others' spread (µs, < LATE_US).
const LATE_US: f64 = 400.0;
const JITTER_US: u64 = 50;
/// Compute events per step, spread over the step's collectives.
const COMPUTE_PER_STEP: usize = 640;
/// Each step's collectives: (c10d op, gloo span, record_param_comms name).
const COLLECTIVES: [(&str, &str, &str); 4] = [
    ("c10d::allreduce_", "gloo:all_reduce", "allreduce"),
    ("c10d::allgather_", "gloo:all_gather", "allgather"),
    ("c10d::allreduce_", "gloo:all_reduce", "allreduce"),
    ("c10d::barrier", "gloo:barrier", "barrier"),
];
const COMPUTE_OPS: [&str; 12] = [
    "aten::mm",
    "aten::add",
    "aten::relu",
    "aten::linear",
    "aten::addmm",
    "aten::t",
    "aten::empty",
    "aten::copy_",
    "aten::sum",
    "aten::mul",
    "aten::native_layer_norm",
    "autograd::engine::evaluate_function: MmBackward0",
];
const BASE_NS: i64 = 1_795_335_288_621_242_000;
const PID: u64 = 2_912_345;
const GLOO_TID: u64 = 2_912_371;
/// Inputs' shape version: bump when the generator changes (cache key).
const SHAPE: &str = "v1";

/// Deterministic pseudo-random numbers (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A rank's entry offset into collective `k` of step `s` (µs, multiples
/// of 1/8 so every time is exact in f64 and in ns).
fn entry_offset_us(rank: usize, s: u64, k: usize) -> f64 {
    let j = (s * 7 + k as u64 * 13 + rank as u64 * 29) % JITTER_US;
    let j = j as f64 + 0.125 * rank as f64;
    if rank == STRAGGLER { j + LATE_US } else { j }
}

/// One Kineto `X` event, laid out as Kineto writes it.
fn event(
    w: &mut impl Write,
    cat: &str,
    name: &str,
    tid: u64,
    ts: f64,
    dur: f64,
    args: &str,
) -> std::io::Result<()> {
    write!(
        w,
        "  {{\n    \"ph\": \"X\", \"cat\": \"{cat}\", \"name\": \"{name}\", \"pid\": {PID}, \"tid\": {tid},\n    \"ts\": {ts:.3}, \"dur\": {dur:.3}"
    )?;
    if !args.is_empty() {
        write!(w, ",\n    \"args\": {{\n      {args}\n    }}")?;
    }
    w.write_all(b"\n  },\n")
}

/// The straggler's lateness over the second-last arriver (ns), summed over
/// the instances of steps `0..steps`.
fn late_sum_ns(steps: u64) -> u64 {
    let mut sum = 0;
    for s in 0..steps {
        for k in 0..COLLECTIVES.len() {
            let others = (0..RANKS)
                .filter(|&r| r != STRAGGLER)
                .map(|r| entry_offset_us(r, s, k))
                .fold(f64::MIN, f64::max);
            sum += ((entry_offset_us(STRAGGLER, s, k) - others) * 1000.0) as u64;
        }
    }
    sum
}

/// Writes steps `0..steps` of `rank`'s trace events.
fn write_steps(w: &mut impl Write, rank: usize, steps: u64) -> std::io::Result<()> {
    let mut rng = Rng(0xC10C_0000 + rank as u64);
    let shift_us = rank as f64 * 1000.0; // this rank's base is 1 ms later per rank
    let mut cursor = 10_000.0f64; // global µs
    let mut ext = 1u64;
    let mut seq = 0u64;
    let per = COMPUTE_PER_STEP / COLLECTIVES.len();
    let mut args = String::new();
    for s in 0..steps {
        let step_start = cursor;
        let mut body = Vec::with_capacity(256 * 1024);
        for (k, (c10d, gloo, coll)) in COLLECTIVES.iter().enumerate() {
            for i in 0..per {
                let name = COMPUTE_OPS[(rng.next() % COMPUTE_OPS.len() as u64) as usize];
                let dur = 3.0 + (rng.next() % 6500) as f64 / 1000.0;
                args.clear();
                let _ = write!(
                    args,
                    "\"External id\": {ext},\"Record function id\": 0, \"Ev Idx\": {}",
                    ext - 1
                );
                if i % 4 == 0 {
                    let _ = write!(
                        args,
                        ", \"Sequence number\": {}, \"Fwd thread id\": 0",
                        ext / 2
                    );
                }
                ext += 1;
                let ts = cursor + i as f64 * 10.0 + 0.25 - shift_us;
                event(&mut body, "cpu_op", name, PID, ts, dur, &args)?;
            }
            let compute_end = cursor + per as f64 * 10.0;
            let enter = compute_end + 5.0 + entry_offset_us(rank, s, k);
            let exit = compute_end + 5.0 + LATE_US + JITTER_US as f64 + 30.0;
            args.clear();
            let _ = write!(
                args,
                "\"External id\": {ext},\"Record function id\": 0, \"Ev Idx\": {}",
                ext - 1
            );
            ext += 1;
            event(&mut body, "cpu_op", c10d, PID, enter - shift_us, 8.0, &args)?;
            args.clear();
            let _ = write!(
                args,
                "\"External id\": {ext},\"Record function id\": 0, \"Collective name\": \"{coll}\", \"Process Group Name\": \"0\", \"Process Group Description\": \"default_pg\", \"Process Group Ranks\": \"[0, 1, 2, 3]\", \"Rank\": {rank}, \"Seq\": {seq}, \"In msg nelems\": 262144, \"Out msg nelems\": 262144, \"In split size\": \"[]\", \"Out split size\": \"[]\", \"Global rank start\": 0, \"Global rank stride\": 1, \"Group size\": 4, \"dtype\": \"Float\", \"Ev Idx\": {}",
                ext - 1
            );
            ext += 1;
            seq += 1;
            event(
                &mut body,
                "cpu_op",
                "record_param_comms",
                PID,
                enter + 1.0 - shift_us,
                5.0,
                &args,
            )?;
            let start = enter + 2.0;
            event(
                &mut body,
                "user_annotation",
                gloo,
                GLOO_TID,
                start - shift_us,
                exit - start,
                "",
            )?;
            cursor = exit + 3.0;
        }
        let mut step_args = String::new();
        let _ = write!(
            step_args,
            "\"External id\": {ext},\"Record function id\": 0, \"Ev Idx\": {}",
            ext - 1
        );
        ext += 1;
        event(
            w,
            "user_annotation",
            &format!("ProfilerStep#{s}"),
            PID,
            step_start - shift_us,
            cursor - step_start,
            &step_args,
        )?;
        w.write_all(&body)?;
        cursor += 20.0;
    }
    Ok(())
}

fn write_rank(w: &mut impl Write, rank: usize, steps: u64) -> std::io::Result<()> {
    write!(
        w,
        "{{\n  \"schemaVersion\": 1,\n  \"deviceProperties\": [],\n  \"distributedInfo\": {{\"backend\": \"gloo\", \"rank\": {rank}, \"world_size\": {RANKS}, \"pg_count\": 1, \"pg_config\": [{{\"pg_name\": \"0\", \"pg_desc\": \"default_pg\", \"backend_config\": \"cpu:gloo\", \"pg_size\": {RANKS}, \"ranks\": [0, 1, 2, 3]}}], \"nccl_version\": \"\"}},\n  \"record_shapes\": 0,\n  \"with_stack\": 0,\n  \"trace_id\": \"4E1B7A40C8D54F{rank:02}\",\n  \"displayTimeUnit\": \"ms\",\n  \"baseTimeNanoseconds\": {},\n  \"traceEvents\": [\n",
        BASE_NS + rank as i64 * 1_000_000
    )?;
    write_steps(w, rank, steps)?;
    write!(
        w,
        "  {{\n    \"name\": \"process_name\", \"ph\": \"M\", \"ts\": 0.000, \"pid\": {PID}, \"tid\": 0,\n    \"args\": {{\n      \"name\": \"python3\"\n    }}\n  }},\n  {{\n    \"name\": \"thread_name\", \"ph\": \"M\", \"ts\": 0.000, \"pid\": {PID}, \"tid\": {GLOO_TID},\n    \"args\": {{\n      \"name\": \"thread {GLOO_TID} (gloo)\"\n    }}\n  }}\n  ],\n  \"traceName\": \"rank{rank}.pt.trace.json\"\n}}\n"
    )
}

/// The job's shape at `mb`: steps per rank, instances, total lateness (ns).
struct Shape {
    steps: u64,
    instances: u64,
    late_sum_ns: u64,
}

fn shape(mb: u64) -> Shape {
    let mut one = Vec::new();
    write_steps(&mut one, 0, 1).unwrap();
    let steps = ((mb << 20) / RANKS as u64 / one.len() as u64).max(1);
    Shape {
        steps,
        instances: steps * COLLECTIVES.len() as u64,
        late_sum_ns: late_sum_ns(steps),
    }
}

fn inputs(mb: u64, steps: u64) -> Vec<PathBuf> {
    let dir = target_dir().join(format!("bench-traces/collectives-{SHAPE}-{mb}mb"));
    std::fs::create_dir_all(&dir).unwrap();
    (0..RANKS)
        .map(|r| {
            let p = dir.join(format!("rank{r}.pt.trace.json"));
            if !p.exists() {
                let tmp = p.with_extension("tmp");
                let mut f = BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp).unwrap());
                write_rank(&mut f, r, steps).unwrap();
                f.flush().unwrap();
                drop(f);
                std::fs::rename(&tmp, &p).unwrap();
            }
            p
        })
        .collect()
}

/// Child mode: read the job and analyse it in a fresh process, so its
/// peak memory is its own.
fn child(files: &[PathBuf]) {
    let t = Instant::now();
    let job = read_job(files, false).unwrap();
    let read_s = t.elapsed().as_secs_f64();
    let calls = job.calls.len();
    let a = analyse(
        &job.participants,
        job.calls,
        &AnalysisOptions {
            aligned: false,
            top_preceding: 5,
        },
    );
    let secs = t.elapsed().as_secs_f64();
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    let straggler_last = a
        .instances
        .iter()
        .filter(|i| a.participants[i.last].rank == Some(STRAGGLER as u64))
        .count();
    let late_sum: u64 = a.instances.iter().map(|i| i.late_by_ns).sum();
    println!("seconds={secs:.3}");
    println!("read_seconds={read_s:.3}");
    println!("cpu_seconds={:.2}", cpu_seconds());
    println!("bytes={bytes}");
    println!("peak_rss_kib={}", peak_rss_kib());
    println!("calls={calls}");
    println!("matched={}", a.summary.matched);
    println!("unmatched={}", a.summary.unmatched);
    println!("straggler_last={straggler_last}");
    println!("late_sum_ns={late_sum}");
}

/// The peer's python: CLOCKMESH_PYTHON, else the venv python/test.sh makes
/// (under $CARGO_TARGET_DIR, else the workspace's target/).
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("CLOCKMESH_PYTHON") {
        return PathBuf::from(p);
    }
    let own = target_dir().join("pyvenv/bin/python");
    if own.exists() {
        return own;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/pyvenv/bin/python")
}

/// Both tools must have analysed the whole job: every instance matched,
/// rank 2 last in each, the generator's total lateness.
fn check(tool: &str, out: &str, shape: &Shape) {
    let expected = shape.instances as f64;
    assert_eq!(parse(out, "matched"), expected, "{tool}: matched\n{out}");
    assert_eq!(parse(out, "unmatched"), 0.0, "{tool}: unmatched\n{out}");
    assert_eq!(
        parse(out, "straggler_last"),
        expected,
        "{tool}: straggler last\n{out}"
    );
    assert_eq!(
        parse(out, "late_sum_ns"),
        shape.late_sum_ns as f64,
        "{tool}: total lateness\n{out}"
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--collectives-child") {
        let files: Vec<PathBuf> = args[2..].iter().map(PathBuf::from).collect();
        return child(&files);
    }
    let mb: u64 = std::env::var("CLOCKMESH_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let t = Instant::now();
    let shape = shape(mb);
    let files = inputs(mb, shape.steps);
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    eprintln!(
        "inputs ready ({bytes} bytes, {RANKS} ranks x {} steps, {} instances) in {:.1} s",
        shape.steps,
        shape.instances,
        t.elapsed().as_secs_f64()
    );
    let mbps = |s: f64| bytes as f64 / s / 1e6;

    let out = Command::new(std::env::current_exe().unwrap())
        .arg("--collectives-child")
        .args(&files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rust = String::from_utf8_lossy(&out.stdout).to_string();
    check("rust", &rust, &shape);
    let (rs, rcpu, rmem) = (
        parse(&rust, "seconds"),
        parse(&rust, "cpu_seconds"),
        parse(&rust, "peak_rss_kib"),
    );
    println!(
        "trace collectives (rust): {bytes} bytes in {rs:.3} s (read {:.3} s) = {:.0} MB/s, {rcpu:.2} CPU-s, peak RSS {:.0} MiB; {} calls, {} instances matched",
        parse(&rust, "read_seconds"),
        mbps(rs),
        rmem / 1024.0,
        parse(&rust, "calls"),
        parse(&rust, "matched"),
    );

    let python = python();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/bench/collectives_baseline.py");
    match Command::new(&python).arg(&script).args(&files).output() {
        Ok(o) if o.status.success() => {
            let py = String::from_utf8_lossy(&o.stdout).to_string();
            check("python", &py, &shape);
            let (ps, pcpu, pmem) = (
                parse(&py, "seconds"),
                parse(&py, "cpu_seconds"),
                parse(&py, "peak_rss_kib"),
            );
            println!(
                "python json baseline: {ps:.3} s = {:.0} MB/s, {pcpu:.2} CPU-s, peak RSS {:.0} MiB; {} calls, {} instances matched",
                mbps(ps),
                pmem / 1024.0,
                parse(&py, "calls"),
                parse(&py, "matched"),
            );
            println!(
                "rust/python: {:.1}x throughput (wall), {:.1}x less CPU, {:.2}x the peak RSS",
                ps / rs,
                pcpu / rcpu,
                rmem / pmem
            );
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

    let (speed, rss_mib) = (mbps(rs), rmem / 1024.0);
    let met = |ok: bool| if ok { "MET" } else { "NOT MET" };
    println!(
        "goal >= 300 MB/s: {} ({speed:.0} MB/s at {mb} MiB input)",
        met(speed >= 300.0)
    );
    let at = if mb == 1024 {
        String::new()
    } else {
        format!("; the goal is stated at 1024 MiB, this run is {mb} MiB")
    };
    println!(
        "goal peak RSS <= 64 MiB at 1 GiB: {} ({rss_mib:.0} MiB at {mb} MiB input{at})",
        met(rss_mib <= 64.0)
    );
}
