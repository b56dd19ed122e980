//! Property tests of the per-edge fit.
mod common;

use clockmesh_estimator::{FitConfig, LocalNs, PurePoint, fit_edge};
use common::{EdgeTruth, synth_edge};
use proptest::prelude::*;

fn truth_strategy() -> impl Strategy<Value = EdgeTruth> {
    (
        -1e6..1e6f64,
        -5e-5..5e-5f64,
        200.0..10_000.0f64,
        200.0..10_000.0f64,
    )
        .prop_map(|(offset_ns, drift, f, b)| EdgeTruth {
            offset_ns,
            drift,
            delay_forward_ns: f,
            delay_backward_ns: b,
        })
}

/// Swaps the roles of A and B: B→A probes become the forward band of the edge (B, A).
fn swap(fwd: &[PurePoint], bwd: &[PurePoint]) -> (Vec<PurePoint>, Vec<PurePoint>) {
    (bwd.to_vec(), fwd.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Honest data is separable; the hard-margin line then separates the bands with its margin.
    #[test]
    fn fitted_line_separates_the_bands(truth in truth_strategy(), n in 2usize..200,
                                       noise in 0.0..5_000.0f64, seed in any::<u64>()) {
        let (fwd, bwd) = synth_edge(&truth, n, 1e9, noise, seed);
        let fit = fit_edge(&fwd, &bwd, &FitConfig::hard_margin()).unwrap();
        prop_assert!(fit.margin_ns >= -1.0, "margin {}", fit.margin_ns); // 1 ns: flooring
        let line = |t: i64| fit.offset_at_f64(LocalNs(t));
        for p in &fwd {
            let y = (p.rx_ns - p.tx_ns) as f64;
            prop_assert!(y >= line(p.tx_ns) + fit.margin_ns - 1e-6 * (1.0 + y.abs()));
        }
        for p in &bwd {
            let y = (p.tx_ns - p.rx_ns) as f64;
            prop_assert!(y <= line(p.rx_ns) - fit.margin_ns + 1e-6 * (1.0 + y.abs()));
        }
        // And the truth lies inside the bound (slack covers the flooring).
        let truth_at_epoch = truth.offset_at(fit.epoch_ns as f64);
        prop_assert!((fit.offset_at_f64(LocalNs(fit.epoch_ns)) - truth_at_epoch).abs() <= fit.bound_ns);
        prop_assert!((fit.drift - truth.drift).abs() <= fit.drift_bound + 1e-12);
    }

    /// With a clear drift (≥ 5 ppm over 1 s, against ≤ 100 ns noise) the fitted drift has its sign.
    #[test]
    fn drift_sign_is_recovered(mut truth in truth_strategy(), ppm in 5.0..50.0f64,
                               negative in any::<bool>(), seed in any::<u64>()) {
        truth.drift = if negative { -ppm * 1e-6 } else { ppm * 1e-6 };
        let (fwd, bwd) = synth_edge(&truth, 100, 1e9, 100.0, seed);
        let fit = fit_edge(&fwd, &bwd, &FitConfig::default()).unwrap();
        prop_assert_eq!(fit.drift < 0.0, negative, "drift {}", fit.drift);
    }

    /// Swapping A and B negates the offset and maps the drift β to −β/(1+β).
    #[test]
    fn swapping_ends_negates_the_fit(truth in truth_strategy(), n in 5usize..100,
                                     noise in 0.0..2_000.0f64, seed in any::<u64>()) {
        let (fwd, bwd) = synth_edge(&truth, n, 1e9, noise, seed);
        let ab = fit_edge(&fwd, &bwd, &FitConfig::hard_margin()).unwrap();
        let (f2, b2) = swap(&fwd, &bwd);
        let ba = fit_edge(&f2, &b2, &FitConfig::hard_margin()).unwrap();
        // A's clock reads clock_B + (clock_A − clock_B) at B's epoch.
        let t_a = ba.epoch_ns + ba.offset_at_f64(LocalNs(ba.epoch_ns)).round() as i64;
        let sum = ab.offset_at_f64(LocalNs(t_a)) + ba.offset_at_f64(LocalNs(ba.epoch_ns));
        prop_assert!(sum.abs() < 1.0, "offsets {} and {}", ab.offset_at_f64(LocalNs(t_a)), ba.offset_at_f64(LocalNs(ba.epoch_ns)));
        // d(A−B)/dB = −β/(1+β) exactly for d(B−A)/dA = β.
        prop_assert!((ba.drift * (1.0 + ab.drift) + ab.drift).abs() < 1e-10, "drifts {} {}", ab.drift, ba.drift);
        prop_assert!((ab.margin_ns - ba.margin_ns).abs() < 1.0);
    }

    /// Arbitrary integers never panic: either a fit or an error.
    #[test]
    fn arbitrary_points_never_panic(f in proptest::collection::vec((any::<i64>(), any::<i64>()), 0..20),
                                    b in proptest::collection::vec((any::<i64>(), any::<i64>()), 0..20)) {
        let mk = |v: &Vec<(i64, i64)>| v.iter().enumerate()
            .map(|(i, &(tx_ns, rx_ns))| PurePoint { seq: i as u64, tx_ns, rx_ns }).collect::<Vec<_>>();
        let _ = fit_edge(&mk(&f), &mk(&b), &FitConfig::default());
    }
}
