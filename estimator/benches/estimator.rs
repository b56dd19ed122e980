//! Criterion benchmarks: per-edge fit at 5,000 points, network solve at 1,000 and 10,000 nodes
//! with K = 10. `cargo bench -p clockmesh-estimator --bench estimator`.
use std::hint::black_box;
use std::time::Duration;

use clockmesh_estimator::{
    EdgeFit, EdgeMeasurement, EdgeProbes, FitConfig, NetConfig, ProbeTimestamps, PurityConfig,
    estimate_edge, fit_edge, solve_network,
};
use criterion::{Criterion, criterion_group, criterion_main};
use rand::{Rng, SeedableRng, seq::index::sample};
use rand_chacha::ChaCha8Rng;

#[path = "../tests/common/mod.rs"]
mod common;
use common::{EdgeTruth, synth_edge};

fn truth() -> EdgeTruth {
    EdgeTruth {
        offset_ns: 123_456.0,
        drift: 8e-6,
        delay_forward_ns: 2_000.0,
        delay_backward_ns: 2_100.0,
    }
}

fn bench_fit(c: &mut Criterion) {
    let mut g = c.benchmark_group("edge");
    for per_band in [2_500usize, 5_000] {
        let (f, b) = synth_edge(&truth(), per_band, 1e9, 2_000.0, 1);
        g.bench_function(format!("fit_edge/{}_points", 2 * per_band), |bench| {
            bench.iter(|| fit_edge(black_box(&f), black_box(&b), &FitConfig::default()).unwrap())
        });
    }
    // Pairing + purity + fit from raw probes: 5,000 probe timestamps per direction.
    let (f, b) = synth_edge(&truth(), 2_500, 1e9, 2_000.0, 2);
    let probes = |pts: &[clockmesh_estimator::PurePoint]| -> Vec<ProbeTimestamps> {
        pts.iter()
            .flat_map(|p| {
                [(0u8, 0i64), (1, 10_000)].map(|(pair_index, d)| ProbeTimestamps {
                    seq: p.seq,
                    pair_index,
                    tx_ns: p.tx_ns + d,
                    rx_ns: p.rx_ns + d,
                })
            })
            .collect()
    };
    let edge = EdgeProbes {
        from: 0,
        to: 1,
        forward: probes(&f),
        backward: probes(&b),
    };
    g.bench_function("estimate_edge/5000_probes_per_direction", |bench| {
        bench.iter(|| {
            estimate_edge(
                black_box(&edge),
                &PurityConfig::default(),
                &FitConfig::default(),
            )
        })
    });
    g.finish();
}

/// A random K-out graph with edge fits equal to the true offset differences plus noise.
fn network(nodes: usize, k: usize, seed: u64) -> Vec<EdgeMeasurement> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let offsets: Vec<f64> = (0..nodes).map(|_| rng.random_range(-1e6..1e6)).collect();
    let drifts: Vec<f64> = (0..nodes).map(|_| rng.random_range(-1e-5..1e-5)).collect();
    let mut edges = Vec::with_capacity(nodes * k);
    for a in 0..nodes {
        for b in sample(&mut rng, nodes - 1, k) {
            let b = if b >= a { b + 1 } else { b };
            let off = offsets[b] - offsets[a] + rng.random_range(-20.0..20.0);
            edges.push(EdgeMeasurement::new(
                a as u32,
                b as u32,
                EdgeFit {
                    epoch_ns: 0,
                    offset_base_ns: off.floor() as i64,
                    offset_rel_ns: off - off.floor(),
                    drift: drifts[b] - drifts[a] + rng.random_range(-2e-9..2e-9),
                    margin_ns: rng.random_range(1_000.0..5_000.0),
                    min_rtt_ns: 4_000.0,
                    bound_ns: rng.random_range(1_000.0..5_000.0),
                    drift_bound: rng.random_range(5e-9..5e-8),
                    forward_points: 50,
                    backward_points: 50,
                    trimmed: 0,
                    span_ns: 1_000_000_000,
                },
            ));
        }
    }
    edges
}

fn bench_network(c: &mut Criterion) {
    let mut g = c.benchmark_group("network");
    g.sample_size(10);
    for nodes in [1_000usize, 10_000] {
        let edges = network(nodes, 10, 3);
        g.bench_function(format!("solve_network/{nodes}_nodes_k10"), |bench| {
            bench.iter(|| solve_network(black_box(&edges), &NetConfig::default()).unwrap())
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = bench_fit, bench_network
}
criterion_main!(benches);
