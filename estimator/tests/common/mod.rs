//! Synthetic edges with known truth, shared by the integration tests.
#![allow(dead_code)]
use clockmesh_estimator::PurePoint;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Known truth of one edge: offset(t) = offset_ns + drift·t (t on A's clock, ns).
#[derive(Debug, Clone, Copy)]
pub struct EdgeTruth {
    pub offset_ns: f64,
    pub drift: f64,
    pub delay_forward_ns: f64,
    pub delay_backward_ns: f64,
}

impl EdgeTruth {
    pub fn offset_at(&self, t: f64) -> f64 {
        self.offset_ns + self.drift * t
    }
}

/// `n` pure points per direction over `span_ns`, each delayed by extra Exp(noise_mean) queueing.
pub fn synth_edge(
    truth: &EdgeTruth,
    n: usize,
    span_ns: f64,
    noise_mean_ns: f64,
    seed: u64,
) -> (Vec<PurePoint>, Vec<PurePoint>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let exp = |rng: &mut ChaCha8Rng| {
        if noise_mean_ns > 0.0 {
            -noise_mean_ns * (1.0 - rng.random::<f64>()).ln()
        } else {
            0.0
        }
    };
    let mut fwd = Vec::with_capacity(n);
    let mut bwd = Vec::with_capacity(n);
    for i in 0..n {
        let t = (i as f64 + rng.random::<f64>()) * span_ns / n as f64;
        let d = truth.delay_forward_ns + exp(&mut rng);
        // tx on A at t; rx on B = A-time of arrival + offset there.
        let rx = t + d + truth.offset_at(t + d);
        fwd.push(PurePoint {
            seq: i as u64,
            tx_ns: t.floor() as i64,
            rx_ns: rx.floor() as i64,
        });
        let t_rx = (i as f64 + rng.random::<f64>()) * span_ns / n as f64;
        let d = truth.delay_backward_ns + exp(&mut rng);
        let tx_b = t_rx - d + truth.offset_at(t_rx - d);
        bwd.push(PurePoint {
            seq: i as u64,
            tx_ns: tx_b.floor() as i64,
            rx_ns: t_rx.floor() as i64,
        });
    }
    (fwd, bwd)
}
