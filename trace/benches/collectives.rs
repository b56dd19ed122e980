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
//! $CARGO_TARGET_DIR/bench-traces. CLOCKMESH_BENCH_FORMAT=xplane measures
//! 4 merged JAX hosts' `.xplane.pb` instead (see [`xla`]).

mod common;
use common::{cpu_seconds, parse, peak_rss_kib, run_child, target_dir};

use std::fmt::Write as _;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use clockmesh_trace::collectives::critical::{CriticalOptions, critical_paths};
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

/// Child mode: read the job and analyse it (and, `critical`, find its
/// critical paths) in a fresh process, so its peak memory is its own.
fn child(files: &[PathBuf], critical: bool) {
    measure_job(files, 0.0, critical);
}

/// Reads and analyses the job, printing what the parent parses back: times,
/// CPU seconds since `cpu0`, peak memory after reading and in all, and what
/// the analysis found.
fn measure_job(files: &[PathBuf], cpu0: f64, critical: bool) {
    let t = Instant::now();
    let job = read_job(files, false).unwrap();
    let read_s = t.elapsed().as_secs_f64();
    println!("read_peak_rss_kib={}", peak_rss_kib());
    let calls = job.calls.len();
    // critical-path keeps the calls beside the analysis, as the CLI does.
    let kept = if critical {
        job.calls.clone()
    } else {
        Vec::new()
    };
    let a = analyse(
        &job.participants,
        job.calls,
        &AnalysisOptions {
            aligned: false,
            top_preceding: 5,
        },
    );
    if critical {
        let paths = critical_paths(&a, &kept, &job.steps, &CriticalOptions::default());
        let topped_by_straggler = paths
            .steps
            .iter()
            .filter(|s| {
                s.top
                    .and_then(|i| s.segments.get(i))
                    .is_some_and(|g| a.participants[g.participant].rank == Some(STRAGGLER as u64))
            })
            .count();
        println!("critical_steps={}", paths.steps.len());
        println!("critical_topped_by_straggler={topped_by_straggler}");
    }
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
    println!("cpu_seconds={:.2}", cpu_seconds() - cpu0);
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

/// A child's wall seconds, CPU seconds and peak RSS (KiB).
fn time_cpu_rss(out: &str) -> (f64, f64, f64) {
    (
        parse(out, "seconds"),
        parse(out, "cpu_seconds"),
        parse(out, "peak_rss_kib"),
    )
}

/// `trace critical-path` on the same job in its own child, beside
/// `trace collectives`' figures (`rs` s, `rcpu` CPU-s, `rmem` KiB): one
/// path per step, and the same analysis underneath.
fn critical_beside(
    files: &[PathBuf],
    shape: &Shape,
    rs: f64,
    rcpu: f64,
    rmem: f64,
    mbps: impl Fn(f64) -> f64,
) {
    let args = std::iter::once(PathBuf::from("--critical-child")).chain(files.iter().cloned());
    let out = run_child(args);
    check("rust critical-path", &out, shape);
    assert_eq!(
        parse(&out, "critical_steps"),
        shape.steps as f64,
        "a path per step\n{out}"
    );
    let (cs, ccpu, cmem) = time_cpu_rss(&out);
    println!(
        "trace critical-path (rust): {cs:.3} s = {:.0} MB/s, {ccpu:.2} CPU-s, peak RSS {:.0} MiB; {} steps, {} topped by the late rank; vs collectives {:.2}x the time, {:.2}x the CPU, {:.2}x the peak RSS",
        mbps(cs),
        cmem / 1024.0,
        parse(&out, "critical_steps"),
        parse(&out, "critical_topped_by_straggler"),
        cs / rs,
        ccpu / rcpu,
        cmem / rmem
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(mode @ ("--collectives-child" | "--critical-child")) =
        args.get(1).map(String::as_str)
    {
        let files: Vec<PathBuf> = args[2..].iter().map(PathBuf::from).collect();
        return child(&files, mode == "--critical-child");
    }
    let mb: u64 = std::env::var("CLOCKMESH_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let None = xplane_bench(mb) else { return };
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

    let child_args = std::iter::once(PathBuf::from("--collectives-child")).chain(files.clone());
    let rust = run_child(child_args);
    check("rust", &rust, &shape);
    let (rs, rcpu, rmem) = time_cpu_rss(&rust);
    println!(
        "trace collectives (rust): {bytes} bytes in {rs:.3} s (read {:.3} s) = {:.0} MB/s, {rcpu:.2} CPU-s, peak RSS {:.0} MiB; {} calls, {} instances matched",
        parse(&rust, "read_seconds"),
        mbps(rs),
        rmem / 1024.0,
        parse(&rust, "calls"),
        parse(&rust, "matched"),
    );

    critical_beside(&files, &shape, rs, rcpu, rmem, mbps);

    let python = python();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/bench/collectives_baseline.py");
    match Command::new(&python).arg(&script).args(&files).output() {
        Ok(o) if o.status.success() => {
            let py = String::from_utf8_lossy(&o.stdout).to_string();
            check("python", &py, &shape);
            let (ps, pcpu, pmem) = time_cpu_rss(&py);
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

/// The `CLOCKMESH_BENCH_FORMAT=xplane` job: 4 merged-looking JAX hosts
/// (`n0.xplane.pb` .. `n3.xplane.pb`, `jax_process_index` 0..3, each its
/// own `profile_start_time`, the alignment bound on `/host:CPU`, the Task
/// Environment plane last) on one global clock. On `/host:CPU`: a
/// `python` line of `train_step` spans with `step_num`, the XLA client
/// line with the compute thunks and per step 4 collectives (each followed
/// by its `end:` marker), and an Eigen line with a fifth of the compute
/// and no collective. Every thunk has `hlo_op` (a string), `hlo_module` (a
/// reference), `program_id` and `run_id` (one per step, the same on every
/// host). Rank 2 enters every collective `LATE_US` late, the others within
/// `JITTER_US`. Written as a stream (each line's length counted first),
/// never whole in memory.
mod xla {
    use std::io::{self, BufWriter, Write};
    use std::path::PathBuf;

    use clockmesh_proto::prost::Message;
    use clockmesh_proto::xplane::{XPlane, XStat, XStatMetadata, x_stat};
    use clockmesh_trace::fields::{self, xline, xplane, xspace};
    use clockmesh_trace::wire::{LEN, VARINT, put_varint, varint_len};

    use super::{COMPUTE_PER_STEP, JITTER_US, LATE_US, RANKS, Rng, STRAGGLER, Shape, target_dir};

    const SHAPE: &str = "xplane-v1";
    const BASE_NS: i64 = 1_795_335_288_621_242_000;
    /// Global time of the first step, after BASE_NS.
    const LEAD_NS: i64 = 10_000_000;
    const COLLECTIVES: [&str; 4] = [
        "all-reduce.7",
        "all-gather.3",
        "all-reduce.11",
        "reduce-scatter.5",
    ];
    const COMPUTE: [&str; 12] = [
        "fusion.12",
        "dot.3",
        "tanh_fusion",
        "copy.4",
        "add.9",
        "multiply.2",
        "reduce.6",
        "broadcast.1",
        "convolution.8",
        "transpose.5",
        "exp_fusion.3",
        "dynamic-update-slice.2",
    ];
    /// Event metadata ids: compute ops from 1, collectives, their `end:`
    /// markers, the step.
    const COLL_ID: u64 = 100;
    const END_ID: u64 = 200;
    const STEP_ID: u64 = 300;
    /// Stat metadata ids (`MODULE_NAME`: the module's name, referenced).
    const HLO_OP: u64 = 1;
    const HLO_MODULE: u64 = 2;
    const PROGRAM_ID: u64 = 3;
    const RUN_ID: u64 = 4;
    const STEP_NUM: u64 = 5;
    const BOUND: u64 = 6;
    const MODULE_NAME: u64 = 7;
    const LATE_NS: i64 = (LATE_US * 1000.0) as i64;
    const JITTER_NS: i64 = JITTER_US as i64 * 1000;
    /// Lines of `/host:CPU`.
    const PYTHON: u8 = 0;
    const CLIENT: u8 = 1;
    const EIGEN: u8 = 2;

    /// Host `h`'s entry into collective `k` of step `s`, after the others
    /// could first arrive (ns).
    fn entry_ns(h: usize, s: u64, k: usize) -> i64 {
        let j = (s * 7 + k as u64 * 13 + h as u64 * 29) % 50;
        let j = j as i64 * 1000 + 125 * h as i64;
        if h == STRAGGLER { j + LATE_NS } else { j }
    }

    fn late_sum_ns(steps: u64) -> u64 {
        let mut sum = 0;
        for s in 0..steps {
            for k in 0..COLLECTIVES.len() {
                let others = (0..RANKS)
                    .filter(|&h| h != STRAGGLER)
                    .map(|h| entry_ns(h, s, k))
                    .max()
                    .unwrap();
                sum += (entry_ns(STRAGGLER, s, k) - others) as u64;
            }
        }
        sum
    }

    /// Where host `h`'s timeline starts, and its lines' offset on it.
    fn start_ns(h: usize) -> i64 {
        BASE_NS + h as i64 * 1_000_000
    }

    fn line_ts(h: usize) -> i64 {
        1_000 + h as i64
    }

    fn field(out: &mut Vec<u8>, f: u32, wire: u8) {
        out.push(fields::key(f, wire));
    }

    fn int_stat(out: &mut Vec<u8>, id: u64, field_no: u32, v: u64) {
        let mut body = vec![fields::key(1, VARINT)];
        put_varint(&mut body, id);
        field(&mut body, field_no, VARINT);
        put_varint(&mut body, v);
        field(out, 4, LEN);
        put_varint(out, body.len() as u64);
        out.extend_from_slice(&body);
    }

    fn str_stat(out: &mut Vec<u8>, id: u64, v: &str) {
        let mut body = vec![fields::key(1, VARINT)];
        put_varint(&mut body, id);
        field(&mut body, 5, LEN);
        put_varint(&mut body, v.len() as u64);
        body.extend_from_slice(v.as_bytes());
        field(out, 4, LEN);
        put_varint(out, body.len() as u64);
        out.extend_from_slice(&body);
    }

    /// One `XLine.events` field at global time `at_ns` (after BASE_NS).
    fn event(out: &mut Vec<u8>, h: usize, meta: u64, at_ns: i64, dur_ns: i64, stats: &[u8]) {
        let off_ps = (BASE_NS + at_ns - start_ns(h) - line_ts(h)) * 1000;
        let mut body = Vec::with_capacity(32 + stats.len());
        field(&mut body, 1, VARINT);
        put_varint(&mut body, meta);
        field(&mut body, 2, VARINT);
        put_varint(&mut body, off_ps as u64);
        field(&mut body, 3, VARINT);
        put_varint(&mut body, (dur_ns * 1000) as u64);
        body.extend_from_slice(stats);
        field(out, xline::EVENTS, LEN);
        put_varint(out, body.len() as u64);
        out.extend_from_slice(&body);
    }

    fn thunk_stats(op: &str, run: u64) -> Vec<u8> {
        let mut s = Vec::with_capacity(64);
        str_stat(&mut s, HLO_OP, op);
        int_stat(&mut s, HLO_MODULE, 7, MODULE_NAME);
        int_stat(&mut s, PROGRAM_ID, 4, 8);
        int_stat(&mut s, RUN_ID, 4, run);
        s
    }

    /// Step `s` of line `line` of host `h`, from global `cursor` (ns);
    /// returns the cursor after it.
    fn step(out: &mut Vec<u8>, h: usize, line: u8, s: u64, cursor: i64) -> i64 {
        let start = cursor;
        let mut cursor = cursor;
        let per = COMPUTE_PER_STEP / COLLECTIVES.len();
        let run = 1_000 + s;
        for (k, coll) in COLLECTIVES.iter().enumerate() {
            for i in 0..per {
                let mut rng = Rng((s << 24) ^ ((k * per + i) as u64) << 4 ^ h as u64);
                let op = (rng.next() % COMPUTE.len() as u64) as usize;
                let dur = 3_000 + (rng.next() % 6_500) as i64;
                let on = if i % 5 == 4 { EIGEN } else { CLIENT };
                if on == line {
                    let at = cursor + i as i64 * 10_000 + 250;
                    event(
                        out,
                        h,
                        op as u64 + 1,
                        at,
                        dur,
                        &thunk_stats(COMPUTE[op], run),
                    );
                }
            }
            let compute_end = cursor + per as i64 * 10_000;
            let enter = compute_end + 5_000 + entry_ns(h, s, k);
            let exit = compute_end + 5_000 + LATE_NS + JITTER_NS + 30_000;
            if line == CLIENT {
                let id = k as u64;
                event(
                    out,
                    h,
                    COLL_ID + id,
                    enter,
                    exit - enter,
                    &thunk_stats(coll, run),
                );
                event(out, h, END_ID + id, exit, 300, &[]);
            }
            cursor = exit + 3_000;
        }
        if line == PYTHON {
            let mut st = Vec::new();
            int_stat(&mut st, STEP_NUM, 4, s);
            event(out, h, STEP_ID, start, cursor - start, &st);
        }
        cursor + 20_000
    }

    /// Writes line `line`'s events of steps `0..steps`; returns their size.
    fn line_events(w: &mut impl Write, h: usize, line: u8, steps: u64) -> io::Result<u64> {
        let (mut cursor, mut n, mut buf) = (LEAD_NS, 0, Vec::with_capacity(1 << 16));
        for s in 0..steps {
            buf.clear();
            cursor = step(&mut buf, h, line, s, cursor);
            w.write_all(&buf)?;
            n += buf.len() as u64;
        }
        Ok(n)
    }

    /// The metadata, stats and name of host `h`'s `/host:CPU` (no lines).
    fn cpu_head(h: usize) -> Vec<u8> {
        let mut p = XPlane {
            id: 1,
            name: "/host:CPU".into(),
            ..Default::default()
        };
        let stats = [
            (HLO_OP, "hlo_op"),
            (HLO_MODULE, "hlo_module"),
            (PROGRAM_ID, "program_id"),
            (RUN_ID, "run_id"),
            (STEP_NUM, "step_num"),
            (BOUND, "clock_alignment_bound_ns"),
            (MODULE_NAME, "jit_train_step"),
        ];
        for (id, name) in stats {
            let id = id as i64;
            let m = XStatMetadata {
                id,
                name: name.into(),
                ..Default::default()
            };
            p.stat_metadata.insert(id, m);
        }
        let mut events: Vec<(u64, String)> = (0..COMPUTE.len())
            .map(|i| (i as u64 + 1, COMPUTE[i].to_string()))
            .collect();
        for (k, c) in COLLECTIVES.iter().enumerate() {
            events.push((COLL_ID + k as u64, c.to_string()));
            events.push((END_ID + k as u64, format!("end: {c}")));
        }
        events.push((STEP_ID, "train_step".into()));
        for (id, name) in events {
            let id = id as i64;
            let m = clockmesh_proto::xplane::XEventMetadata {
                id,
                name,
                ..Default::default()
            };
            p.event_metadata.insert(id, m);
        }
        p.stats.push(XStat {
            metadata_id: BOUND as i64,
            value: Some(x_stat::Value::Uint64Value(2_000 + h as u64)),
        });
        p.encode_to_vec()
    }

    fn task_env(h: usize) -> Vec<u8> {
        let mut p = XPlane {
            id: 1000,
            name: "Task Environment".into(),
            ..Default::default()
        };
        for (id, name, v) in [
            (1, "profile_start_time", start_ns(h) as u64),
            (2, "jax_process_index", h as u64),
        ] {
            let m = XStatMetadata {
                id,
                name: name.into(),
                ..Default::default()
            };
            p.stat_metadata.insert(id, m);
            p.stats.push(XStat {
                metadata_id: id,
                value: Some(x_stat::Value::Uint64Value(v)),
            });
        }
        p.encode_to_vec()
    }

    /// A length-delimited field's key and length.
    fn prefix(w: &mut impl Write, f: u32, len: u64) -> io::Result<()> {
        let mut b = vec![fields::key(f, LEN)];
        put_varint(&mut b, len);
        w.write_all(&b)
    }

    fn write_host(w: &mut impl Write, h: usize, steps: u64) -> io::Result<()> {
        let names = ["python", "tf_XLAPjRtCpuClient/1", "tf_XLACpuEigen/2"];
        let mut heads = Vec::new();
        let mut plane_len = 0;
        for (l, name) in names.iter().enumerate() {
            let events = line_events(&mut io::sink(), h, l as u8, steps)?;
            let mut head = Vec::new();
            field(&mut head, xline::ID, VARINT);
            put_varint(&mut head, l as u64 + 1);
            field(&mut head, 2, LEN);
            put_varint(&mut head, name.len() as u64);
            head.extend_from_slice(name.as_bytes());
            field(&mut head, xline::TIMESTAMP_NS, VARINT);
            put_varint(&mut head, line_ts(h) as u64);
            let len = head.len() as u64 + events;
            plane_len += 1 + varint_len(len) + len;
            heads.push((head, len));
        }
        let cpu = cpu_head(h);
        prefix(w, xspace::PLANES, cpu.len() as u64 + plane_len)?;
        w.write_all(&cpu)?;
        for (l, (head, len)) in heads.iter().enumerate() {
            prefix(w, xplane::LINES, *len)?;
            w.write_all(head)?;
            line_events(w, h, l as u8, steps)?;
        }
        let env = task_env(h);
        prefix(w, xspace::PLANES, env.len() as u64)?;
        w.write_all(&env)?;
        let host = format!("n{h}");
        prefix(w, xspace::HOSTNAMES, host.len() as u64)?;
        w.write_all(host.as_bytes())
    }

    pub fn shape(mb: u64) -> Shape {
        let one: u64 = (0..3)
            .map(|l| line_events(&mut io::sink(), 0, l, 1).unwrap())
            .sum();
        let steps = ((mb << 20) / RANKS as u64 / one).max(1);
        Shape {
            steps,
            instances: steps * COLLECTIVES.len() as u64,
            late_sum_ns: late_sum_ns(steps),
        }
    }

    pub fn inputs(mb: u64, steps: u64) -> Vec<PathBuf> {
        let dir = target_dir().join(format!("bench-traces/collectives-{SHAPE}-{mb}mb"));
        std::fs::create_dir_all(&dir).unwrap();
        (0..RANKS)
            .map(|h| {
                let p = dir.join(format!("n{h}.xplane.pb"));
                if !p.exists() {
                    let tmp = p.with_extension("tmp");
                    let file = std::fs::File::create(&tmp).unwrap();
                    let mut f = BufWriter::with_capacity(1 << 20, file);
                    write_host(&mut f, h, steps).unwrap();
                    f.flush().unwrap();
                    drop(f);
                    std::fs::rename(&tmp, &p).unwrap();
                }
                p
            })
            .collect()
    }
}

/// With `CLOCKMESH_BENCH_FORMAT=xplane` (else `None`: the Kineto job),
/// the same measurement on the [`xla`] job (no peer: the Python baseline
/// reads Kineto JSON only).
fn xplane_bench(mb: u64) -> Option<()> {
    if std::env::var("CLOCKMESH_BENCH_FORMAT").as_deref() != Ok("xplane") {
        return None;
    }
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--xplane-child") {
        let files: Vec<PathBuf> = args[2..].iter().map(PathBuf::from).collect();
        xplane_child(&files);
        return Some(());
    }
    let t = Instant::now();
    let shape = xla::shape(mb);
    let files = xla::inputs(mb, shape.steps);
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    eprintln!(
        "xplane inputs ready ({bytes} bytes, {RANKS} hosts x {} steps, {} instances) in {:.1} s",
        shape.steps,
        shape.instances,
        t.elapsed().as_secs_f64()
    );
    let child_args = std::iter::once(PathBuf::from("--xplane-child")).chain(files.clone());
    let rust = run_child(child_args);
    check("rust xplane", &rust, &shape);
    let parse_s = parse(&rust, "parse_seconds");
    println!(
        "xplane reader alone (each host read, its calls dropped): {parse_s:.3} s = {:.0} MB/s, peak RSS {:.0} MiB; after read_job (all calls held) peak RSS {:.0} MiB",
        bytes as f64 / parse_s / 1e6,
        parse(&rust, "parse_peak_rss_kib") / 1024.0,
        parse(&rust, "read_peak_rss_kib") / 1024.0,
    );
    let (secs, cpu, rss_kib) = time_cpu_rss(&rust);
    let rss_mib = rss_kib / 1024.0;
    let speed = bytes as f64 / secs / 1e6;
    println!(
        "trace collectives (xplane): {bytes} bytes in {secs:.3} s (read {:.3} s) = {speed:.0} MB/s, {cpu:.2} CPU-s, peak RSS {rss_mib:.0} MiB; {} calls, {} instances matched",
        parse(&rust, "read_seconds"),
        parse(&rust, "calls"),
        parse(&rust, "matched"),
    );
    let met = |ok: bool| if ok { "MET" } else { "NOT MET" };
    println!(
        "goal >= 300 MB/s: {} ({speed:.0} MB/s at {mb} MiB xplane input)",
        met(speed >= 300.0)
    );
    println!(
        "goal peak RSS <= 64 MiB at 1 GiB: {} ({rss_mib:.0} MiB at {mb} MiB xplane input)",
        met(rss_mib <= 64.0)
    );
    Some(())
}

/// The xplane job's child: first the reader alone (each host read and its
/// calls dropped: the reader's own memory), then what [`measure_job`]
/// measures.
fn xplane_child(files: &[PathBuf]) {
    let t = Instant::now();
    for f in files {
        drop(clockmesh_trace::collectives::xplane::read(f, false).unwrap());
    }
    println!("parse_seconds={:.3}", t.elapsed().as_secs_f64());
    println!("parse_peak_rss_kib={}", peak_rss_kib());
    measure_job(files, cpu_seconds(), false);
}
