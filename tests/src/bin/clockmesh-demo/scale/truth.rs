//! The simulated members' true clocks, the edge fits they would send, and
//! the scoring of the results that come back.
//!
//! A member's clock reads `T + θ + d·(T − T0)` at true time `T` (the
//! harness's CLOCK_REALTIME, `T0` its start): θ within ±2 ms and d within
//! ±2 ppm, as NTP-disciplined hosts are. An edge A→B's fit is what
//! `core::history` would publish for it: offset `clock_B − clock_A` at an
//! epoch on A's clock, drift, and a bound of about half the best round
//! trip (software stamps: 1–3 µs), its true error inside the bound (a fixed
//! path asymmetry per edge plus per-window noise).

use clockmesh_core::graph::{Neighbourhood, ProbeGraph};
use clockmesh_proto::clockmesh as pb;

/// A small, seedable generator (splitmix64): the harness needs no crate for it.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-12);
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// One directed edge's fixed properties.
#[derive(Clone, Copy, Debug)]
struct EdgeTruth {
    to: usize,
    /// Half the best round trip: the fit's margin, ns.
    margin_ns: f64,
    /// The path asymmetry's share of the offset error (fixed per edge), ns.
    asymmetry_ns: f64,
}

/// Every member's true clock and out-edges.
pub struct Truth {
    /// True time the clock model is referred to (ns, CLOCK_REALTIME).
    pub t0_ns: i64,
    theta_ns: Vec<f64>,
    drift: Vec<f64>,
    edges: Vec<Vec<EdgeTruth>>,
    /// Each member's edges in the whole graph (what its place must hold).
    places: Vec<Neighbourhood>,
}

/// Per-window noise of a fit's offset, ns (well inside every bound).
const FIT_NOISE_NS: f64 = 40.0;
/// A fit's drift error and its bound, ppb.
const FIT_DRIFT_NOISE_PPB: f64 = 2.0;
const FIT_DRIFT_BOUND_PPB: f64 = 30.0;
/// How long before the window's end a fit's epoch (its last stamp) lies.
const EPOCH_BEFORE_END_NS: i64 = 20_000_000;

impl Truth {
    /// `n` members (index = position in `ids`), out-edges from the real
    /// probe graph of `ids` at `degree`.
    pub fn generate(ids: &[u32], degree: usize, seed: u64, t0_ns: i64) -> Self {
        let mut rng = Rng::new(seed);
        let n = ids.len();
        let graph = ProbeGraph::build(ids, degree);
        let places = ids.iter().map(|&id| graph.neighbourhood(id)).collect();
        let index: std::collections::HashMap<u32, usize> =
            ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        let theta_ns = (0..n).map(|_| rng.uniform(-2e6, 2e6)).collect();
        let drift = (0..n).map(|_| rng.uniform(-2e-6, 2e-6)).collect();
        let edges = ids
            .iter()
            .map(|&id| {
                graph
                    .out_neighbours(id)
                    .iter()
                    .filter_map(|to| index.get(to).copied())
                    .map(|to| {
                        let margin_ns = rng.uniform(500.0, 1500.0);
                        EdgeTruth {
                            to,
                            margin_ns,
                            asymmetry_ns: rng.uniform(-0.6, 0.6) * margin_ns,
                        }
                    })
                    .collect()
            })
            .collect();
        Truth {
            t0_ns,
            theta_ns,
            drift,
            edges,
            places,
        }
    }

    pub fn len(&self) -> usize {
        self.theta_ns.len()
    }

    /// Member `i`'s edges in the whole probe graph.
    pub fn place(&self, i: usize) -> &Neighbourhood {
        &self.places[i]
    }

    /// Out-edges of member `i` (indices).
    pub fn out_degree(&self, i: usize) -> usize {
        self.edges[i].len()
    }

    /// Member `i`'s clock at true time `t_ns`.
    pub fn local_at(&self, i: usize, t_ns: i64) -> i64 {
        let u = (t_ns - self.t0_ns) as f64;
        t_ns + (self.theta_ns[i] + self.drift[i] * u).round() as i64
    }

    /// True time at which member `i`'s clock reads `local_ns`, as ns
    /// since `t0` (f64: exact to well below a ns over days).
    fn true_since_t0(&self, i: usize, local_ns: i64) -> f64 {
        let u = (local_ns - self.t0_ns) as f64;
        (u - self.theta_ns[i]) / (1.0 + self.drift[i])
    }

    /// `clock_b − clock_a` when a's clock reads `local_a_ns`.
    fn offset(&self, a: usize, b: usize, local_a_ns: i64) -> f64 {
        let t = self.true_since_t0(a, local_a_ns);
        let clock_b = t + self.theta_ns[b] + self.drift[b] * t;
        clock_b - (local_a_ns - self.t0_ns) as f64
    }

    /// The snapshot member `i` puts for window `k` (`window_ns` long, on
    /// its own clock), its fits drawn from the truth.
    pub fn snapshot(
        &self,
        i: usize,
        k: u64,
        window_ns: i64,
        ids: &[u32],
        names: &[String],
        rng: &mut Rng,
    ) -> pb::Snapshot {
        let end = (k as i64 + 1) * window_ns;
        let epoch = end - EPOCH_BEFORE_END_NS;
        let edges = self.edges[i]
            .iter()
            .map(|e| {
                let bound = e.margin_ns + 5.0;
                let err = (e.asymmetry_ns + FIT_NOISE_NS * rng.normal())
                    .clamp(-0.95 * bound, 0.95 * bound);
                let offset = self.offset(i, e.to, epoch) + err;
                let base = offset.floor();
                let drift = (1.0 + self.drift[e.to]) / (1.0 + self.drift[i]) - 1.0
                    + FIT_DRIFT_NOISE_PPB * 1e-9 * rng.normal();
                pb::EdgeFit {
                    from_node: names[i].clone(),
                    to_node: names[e.to].clone(),
                    anchor_ns: epoch,
                    offset_ns: base as i64,
                    drift_ppb: drift * 1e9,
                    bound_ns: bound.ceil() as u64,
                    pure_pairs: 20,
                    window: k,
                    from_id: ids[i],
                    to_id: ids[e.to],
                    offset_frac_ns: offset - base,
                    bound_exact_ns: bound,
                    drift_bound_ppb: FIT_DRIFT_BOUND_PPB,
                    margin_ns: e.margin_ns,
                    min_rtt_ns: 2.0 * e.margin_ns,
                    forward_points: 10,
                    backward_points: 10,
                    trimmed: 0,
                    span_ns: window_ns - EPOCH_BEFORE_END_NS,
                    history_share: 1.0,
                }
            })
            .collect();
        pb::Snapshot {
            window: k,
            produced_at_ns: end + 300_000_000,
            edges,
            nodes: Vec::new(),
        }
    }

    /// A result for member `i` against the truth: (|error| ns, within bound),
    /// where the reference is member `reference`. The result says
    /// `global = local + offset_ns` at its anchor (member i's clock).
    pub fn score(&self, i: usize, reference: usize, r: &pb::NodeOffset) -> (f64, bool) {
        let truth = self.offset_vs(i, reference, r.anchor_ns);
        let err = (r.offset_ns as f64 - truth).abs();
        (err, err <= r.bound_ns as f64)
    }

    /// The true offset (reference's clock − member `i`'s) when `i`'s
    /// clock reads `local_ns`.
    pub fn offset_vs(&self, i: usize, reference: usize, local_ns: i64) -> f64 {
        let t = self.true_since_t0(i, local_ns);
        let ref_clock = t + self.theta_ns[reference] + self.drift[reference] * t;
        ref_clock - (local_ns - self.t0_ns) as f64
    }
}

impl Truth {
    /// True time (ns, CLOCK_REALTIME) at which member `i`'s clock reads `local_ns`.
    pub fn true_at(&self, i: usize, local_ns: i64) -> i64 {
        self.t0_ns + self.true_since_t0(i, local_ns).round() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fit_holds_the_true_offset_within_its_bound() {
        let ids: Vec<u32> = (1..=20).collect();
        let names: Vec<String> = ids.iter().map(|i| format!("n{i}")).collect();
        let t0 = 1_700_000_000_000_000_000;
        let truth = Truth::generate(&ids, 4, 7, t0);
        let mut rng = Rng::new(1);
        let window_ns = 1_000_000_000;
        let k = (t0 / window_ns) as u64 + 5;
        let s = truth.snapshot(3, k, window_ns, &ids, &names, &mut rng);
        assert!(!s.edges.is_empty());
        for f in &s.edges {
            let to = (f.to_id - 1) as usize;
            let exact = truth.offset(3, to, f.anchor_ns);
            let fitted = f.offset_ns as f64 + f.offset_frac_ns;
            assert!(
                (fitted - exact).abs() <= f.bound_exact_ns,
                "{fitted} vs {exact}"
            );
        }
        // Local and true time map back and forth.
        let local = truth.local_at(5, t0 + 10_000_000_000);
        assert!((truth.true_at(5, local) - (t0 + 10_000_000_000)).abs() <= 1);
    }
}
