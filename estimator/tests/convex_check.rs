//! The hull-based max-margin fit and its feasible-range bound against a general convex solver
//! (clarabel, interior point) on random instances.
mod common;

use clarabel::algebra::CscMatrix;
use clarabel::solver::{
    DefaultSettingsBuilder, DefaultSolver, IPSolver, NonnegativeConeT, SolverStatus,
};
use clockmesh_estimator::{FitConfig, PurePoint, fit_edge};
use common::{EdgeTruth, synth_edge};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Constraint rows over (α, β per second, m) with x in seconds relative to the epoch and y
/// relative to `y0`: forward α + βx + m·k ≤ y, backward −α − βx + m·k ≤ −y.
fn rows(
    fwd: &[PurePoint],
    bwd: &[PurePoint],
    epoch: i64,
    y0: i64,
    with_m: bool,
) -> (Vec<Vec<f64>>, Vec<f64>) {
    let mut a = Vec::new();
    let mut b = Vec::new();
    let k = if with_m { 1.0 } else { 0.0 };
    for p in fwd {
        let x = (p.tx_ns - epoch) as f64 / 1e9;
        a.push(vec![1.0, x, k]);
        b.push((p.rx_ns - p.tx_ns - y0) as f64);
    }
    for p in bwd {
        let x = (p.rx_ns - epoch) as f64 / 1e9;
        a.push(vec![-1.0, -x, k]);
        b.push(-((p.tx_ns - p.rx_ns - y0) as f64));
    }
    (a, b)
}

/// Minimises q·v subject to rows·v ≤ b; v = (α, β, m).
fn lp(a: &[Vec<f64>], b: &[f64], q: [f64; 3]) -> Vec<f64> {
    let n = 3;
    let p = CscMatrix::<f64>::zeros((n, n));
    let mut a_full: Vec<Vec<f64>> = a.to_vec();
    let mut b_full = b.to_vec();
    if q[2] == 0.0 {
        // m is unused: pin it to 0.
        a_full.push(vec![0.0, 0.0, 1.0]);
        b_full.push(0.0);
        a_full.push(vec![0.0, 0.0, -1.0]);
        b_full.push(0.0);
    }
    let a_csc = CscMatrix::from(a_full.iter().map(|r| r.as_slice()));
    let cones = [NonnegativeConeT(b_full.len())];
    let settings = DefaultSettingsBuilder::default()
        .verbose(false)
        .tol_gap_abs(1e-10)
        .tol_gap_rel(1e-10)
        .tol_feas(1e-10)
        .build()
        .unwrap();
    let mut solver = DefaultSolver::new(&p, &q, &a_csc, &b_full, &cones, settings).unwrap();
    solver.solve();
    assert!(
        matches!(
            solver.solution.status,
            SolverStatus::Solved | SolverStatus::AlmostSolved
        ),
        "clarabel: {:?}",
        solver.solution.status
    );
    solver.solution.x.clone()
}

fn random_instance(rng: &mut ChaCha8Rng) -> (Vec<PurePoint>, Vec<PurePoint>) {
    let truth = EdgeTruth {
        offset_ns: rng.random_range(-50_000.0..50_000.0),
        drift: rng.random_range(-3e-5..3e-5),
        delay_forward_ns: rng.random_range(500.0..5_000.0),
        delay_backward_ns: rng.random_range(500.0..5_000.0),
    };
    let n = rng.random_range(3..80);
    let noise = rng.random_range(0.0..3_000.0);
    synth_edge(&truth, n, 1e9, noise, rng.random())
}

#[test]
fn hull_fit_matches_convex_solver_on_random_instances() {
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let cfg = FitConfig {
        timestamp_resolution_ns: 0,
        model_slack_ns: 0.0,
        ..FitConfig::hard_margin()
    };
    for case in 0..200 {
        let (fwd, bwd) = random_instance(&mut rng);
        let fit = fit_edge(&fwd, &bwd, &cfg).unwrap();
        let epoch = fit.epoch_ns;
        let y0 = fit.offset_base_ns;
        // Max margin.
        let (a, b) = rows(&fwd, &bwd, epoch, y0, true);
        let v = lp(&a, &b, [0.0, 0.0, -1.0]);
        let tol = 1e-3 + 1e-7 * fit.margin_ns.abs();
        assert!(
            (v[2] - fit.margin_ns).abs() < tol,
            "case {case}: margin {} vs clarabel {}",
            fit.margin_ns,
            v[2]
        );
        // The hull line attains its margin on every point.
        for (row, rhs) in a.iter().zip(&b) {
            let lhs =
                row[0] * fit.offset_rel_ns + row[1] * fit.drift * 1e9 + row[2] * fit.margin_ns;
            assert!(
                lhs <= rhs + 1e-6 * (1.0 + rhs.abs()),
                "case {case}: violated"
            );
        }
        // Feasible range of the offset at the epoch and of the slope (no slack here).
        let (a, b) = rows(&fwd, &bwd, epoch, y0, false);
        let hi = lp(&a, &b, [-1.0, 0.0, 0.0])[0];
        let lo = lp(&a, &b, [1.0, 0.0, 0.0])[0];
        let want = (hi - fit.offset_rel_ns).max(fit.offset_rel_ns - lo);
        assert!(
            (fit.bound_ns - want).abs() < 1e-3 + 1e-6 * want,
            "case {case}: bound {} vs clarabel {want}",
            fit.bound_ns
        );
        let beta_hi = lp(&a, &b, [0.0, -1.0, 0.0])[1] / 1e9;
        let beta_lo = lp(&a, &b, [0.0, 1.0, 0.0])[1] / 1e9;
        let want = (beta_hi - fit.drift).max(fit.drift - beta_lo);
        assert!(
            (fit.drift_bound - want).abs() < 1e-12 + 1e-6 * want,
            "case {case}: drift bound {} vs clarabel {want}",
            fit.drift_bound
        );
    }
}
