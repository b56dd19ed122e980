//! `solve_network` on arbitrary edge fits (any ids, offsets, drifts, bounds, including NaN and
//! extremes): a solution or an `Err`, never a panic.
#![no_main]

use clockmesh_estimator::{EdgeFit, EdgeMeasurement, NetConfig, solve_network};
use libfuzzer_sys::fuzz_target;

fn f64_from(bytes: &[u8], i: usize) -> f64 {
    let mut b = [0u8; 8];
    for (k, slot) in b.iter_mut().enumerate() {
        *slot = bytes.get(i + k).copied().unwrap_or(0);
    }
    f64::from_le_bytes(b)
}

fn i64_from(bytes: &[u8], i: usize) -> i64 {
    f64_from(bytes, i).to_bits() as i64
}

/// One edge from a record of `REC` bytes: ids, anchor, offset, drift, bound and
/// the detour excess and history share (its weight) all arbitrary.
fn edge_from(c: &[u8]) -> EdgeMeasurement {
    let fit = EdgeFit {
        epoch_ns: i64_from(c, 2),
        offset_base_ns: i64_from(c, 10),
        offset_rel_ns: f64_from(c, 18),
        drift: f64_from(c, 26) * 1e-300,
        margin_ns: 1.0,
        min_rtt_ns: 2.0,
        bound_ns: f64_from(c, 34).abs(),
        drift_bound: 1e-8,
        forward_points: 1,
        backward_points: 1,
        trimmed: 0,
        span_ns: 1,
    };
    let from = u32::from(c[0] % 16);
    let to = u32::from(c.get(1).copied().unwrap_or(0) % 16);
    let mut edge = EdgeMeasurement::new(from, to, fit);
    edge.excess_rtt_ns = f64_from(c, 42);
    edge.with_history_share(f64_from(c, 50))
}

const REC: usize = 58;

fuzz_target!(|data: &[u8]| {
    let edges: Vec<EdgeMeasurement> = data.chunks(REC).take(64).map(edge_from).collect();
    let cfg = NetConfig {
        reference: u32::from(data.first().copied().unwrap_or(0) % 16),
        epoch_ns: i64_from(data, 3),
        max_iterations: 500,
        ..NetConfig::default()
    };
    let _ = solve_network(&edges, &cfg);
});
