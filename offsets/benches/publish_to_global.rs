//! `to_global` cost: the C reader (hook/include/clockmesh.h, built with
//! `cc -O2`) and the Rust reader, on a file written by the Rust writer,
//! measured in one run. Goal: C ≤ 50 ns per call. And `now()` (global time
//! now as an interval, with the clock's state) against a bare
//! `clock_gettime(CLOCK_REALTIME)` in the same process, in C and in Rust.
//! Goal: ≤ 2×. And `to_global` of a stamp as old as the ring's oldest
//! record (the worst case: a scan of all 256 slots).
//!
//! `cargo bench -p clockmesh-offsets --bench publish_to_global`

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use clockmesh_offsets::LocalNs;
use clockmesh_offsets::{
    NodeMap, OffsetsReader, OffsetsWriter, Record, flags, realtime_coarse_ns, realtime_now_ns,
};

const CALLS: u64 = 20_000_000;

#[expect(
    clippy::too_many_lines,
    reason = "the benchmark is one script of measurements printed in order"
)]
fn main() {
    let dir = std::env::temp_dir().join(format!("clockmesh-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("offsets");
    let writer = OffsetsWriter::open(&path).unwrap();
    let now = realtime_now_ns().0;
    writer
        .publish(&Record {
            flags: flags::VALID,
            valid_until_ns: now + 3_600_000_000_000,
            node: NodeMap {
                anchor_local_ns: now,
                offset_ns: -1234,
                drift_ps_per_s: 1_500,
                bound_ns: 100,
                bound_growth_ps_per_s: 10,
            },
            ..Record::default()
        })
        .unwrap();

    let hook = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hook");
    let exe = dir.join("c_reader_check");
    let cc = Command::new("cc")
        .args(["-O2", "-std=c11", "-D_GNU_SOURCE", "-I"])
        .arg(hook.join("include"))
        .arg(hook.join("tests/c_reader_check.c"))
        .arg("-o")
        .arg(&exe)
        .status()
        .unwrap();
    assert!(cc.success());
    let out = Command::new(&exe)
        .arg("bench")
        .arg(&path)
        .arg(CALLS.to_string())
        .output()
        .unwrap();
    let c_line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let c_field = |key: &str| -> f64 {
        c_line
            .split_whitespace()
            .find_map(|f| f.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let c_ns = c_field("to_global_ns_per_call=");
    let (c_now_ns, c_clock_ns) = (
        c_field("now_ns_per_call="),
        c_field("clock_gettime_ns_per_call="),
    );

    let reader = OffsetsReader::open(&path).unwrap();
    let mut sum = 0i64;
    let t = Instant::now();
    for i in 0..CALLS as i64 {
        sum = sum.wrapping_add((reader.to_global(LocalNs(now + i)).unwrap().0).0);
    }
    let rust_ns = t.elapsed().as_nanos() as f64 / CALLS as f64;
    std::hint::black_box(sum);

    let per_call = |f: &dyn Fn() -> i64| {
        let t = Instant::now();
        for _ in 0..CALLS {
            std::hint::black_box(f());
        }
        t.elapsed().as_nanos() as f64 / CALLS as f64
    };
    let precise_ns = per_call(&|| realtime_now_ns().0);
    let coarse_ns = per_call(&|| realtime_coarse_ns().0);
    let bare_ns = per_call(&|| {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME)
            .map(|t| t.tv_nsec())
            .unwrap_or(0)
    });
    let rust_now_ns = per_call(&|| reader.now().map(|n| n.latest.0).unwrap_or(0));

    println!("C reader   clockmesh_to_global: {c_ns:.1} ns/call (goal <= 50)");
    println!("Rust reader OffsetsReader::to_global: {rust_ns:.1} ns/call");
    println!(
        "  clock reads: CLOCK_REALTIME {precise_ns:.1} ns, CLOCK_REALTIME_COARSE {coarse_ns:.1} ns (to_global reads neither: judged at the stamp's time)"
    );
    println!("ratio Rust/C = {:.2}", rust_ns / c_ns);
    println!(
        "now(): C {c_now_ns:.1} ns vs clock_gettime {c_clock_ns:.1} ns = {:.2}x; Rust {rust_now_ns:.1} ns vs clock_gettime {bare_ns:.1} ns = {:.2}x (goal <= 2x)",
        c_now_ns / c_clock_ns,
        rust_now_ns / bare_ns
    );

    // A full ring (256 windows of 4 s): a stamp of the oldest record.
    let full = dir.join("offsets-full");
    let writer = OffsetsWriter::open(&full).unwrap();
    let first = now - 256 * 4_000_000_000;
    for k in 0..256 {
        let a = first + k * 4_000_000_000;
        writer
            .publish(&Record {
                flags: flags::VALID,
                window: k as u64 + 1,
                valid_until_ns: a + 12_000_000_000,
                node: NodeMap {
                    anchor_local_ns: a,
                    offset_ns: -1234 - k,
                    drift_ps_per_s: 1_500,
                    bound_ns: 100,
                    bound_growth_ps_per_s: 10,
                },
                ..Record::default()
            })
            .unwrap();
    }
    let reader = OffsetsReader::open(&full).unwrap();
    let calls = CALLS / 100;
    let t = Instant::now();
    for i in 0..calls as i64 {
        sum = sum.wrapping_add((reader.to_global(LocalNs(first + i)).unwrap().0).0);
    }
    let oldest_ns = t.elapsed().as_nanos() as f64 / calls as f64;
    std::hint::black_box(sum);
    println!("Rust to_global of a stamp of the oldest of 256 records: {oldest_ns:.1} ns/call");
    std::fs::remove_dir_all(&dir).unwrap();
}
