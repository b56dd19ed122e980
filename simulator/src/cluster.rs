//! Synthetic cluster with known truth: clocks, links, and the probe timestamps they produce.
use clockmesh_estimator::{EdgeProbes, NodeId, ProbeTimestamps};
use rand::{Rng, SeedableRng, seq::index::sample};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp, Normal, Pareto};
use std::collections::HashSet;

use crate::scenario::{QueueKind, Scenario};

/// All readings carry this integer base (a 2023 TAI-like epoch), so the estimator's integer
/// path is exercised: f64 of the raw readings would lose ~100 ns.
pub const READING_BASE_NS: i64 = 1_700_000_000_000_000_000;

/// Piecewise-linear clocks: reading(t) = t + off[k] + freq[k]·(t − k·step), k = ⌊t/step⌋.
pub struct Clocks {
    step_ns: f64,
    steps: usize,
    off: Vec<f64>,
    freq: Vec<f64>,
}

impl Clocks {
    pub fn generate(s: &Scenario, horizon_ns: f64, rng: &mut ChaCha8Rng) -> Self {
        let n = s.nodes as usize;
        let step_ns = s.clock.wander_step_ms as f64 * 1e6;
        let steps = (horizon_ns / step_ns).ceil() as usize + 1;
        let wander_sigma = s.clock.wander_ppb_per_sqrt_s * 1e-9 * (step_ns / 1e9).sqrt();
        let step_dist = Normal::new(0.0, wander_sigma).expect("validated σ");
        let mut off = Vec::with_capacity(n * steps);
        let mut freq = Vec::with_capacity(n * steps);
        for _ in 0..n {
            let mut o = rng.random_range(-1.0..=1.0) * s.clock.offset_spread_ns;
            let mut f = rng.random_range(-1.0..=1.0) * s.clock.drift_spread_ppm * 1e-6;
            for _ in 0..steps {
                off.push(o);
                freq.push(f);
                o += f * step_ns;
                f += step_dist.sample(rng);
            }
        }
        Self {
            step_ns,
            steps,
            off,
            freq,
        }
    }

    fn segment(&self, node: NodeId, t: f64) -> (usize, f64) {
        let k = ((t / self.step_ns).floor().max(0.0) as usize).min(self.steps - 1);
        (node as usize * self.steps + k, t - k as f64 * self.step_ns)
    }

    /// Reading of `node` at true time `t`, minus [`READING_BASE_NS`].
    pub fn reading(&self, node: NodeId, t: f64) -> f64 {
        let (i, dt) = self.segment(node, t);
        t + self.off[i] + self.freq[i] * dt
    }

    /// Frequency error of `node` at true time `t`.
    pub fn frequency(&self, node: NodeId, t: f64) -> f64 {
        self.freq[self.segment(node, t).0]
    }

    /// True time at which `node` reads `reading` (relative to the base).
    pub fn true_time_of(&self, node: NodeId, reading: f64) -> f64 {
        let mut t = reading;
        for _ in 0..4 {
            t = reading - (self.reading(node, t) - t);
        }
        t
    }
}

/// An undirected edge, probed both ways: `from` picked `to` as a peer.
pub struct Link {
    pub from: NodeId,
    pub to: NodeId,
    pub delay_forward_ns: f64,
    pub delay_backward_ns: f64,
}

/// Each node picks `degree` distinct random peers; duplicates (both picked each other) merge.
pub fn generate_links(s: &Scenario, rng: &mut ChaCha8Rng) -> Vec<Link> {
    let n = s.nodes as usize;
    let asym = Normal::new(0.0, s.link.asymmetry_ns).expect("validated σ");
    let [lo, hi] = s.link.base_delay_ns;
    let mut seen = HashSet::new();
    let mut links = Vec::with_capacity(n * s.degree as usize);
    for a in 0..n {
        for b in sample(rng, n - 1, s.degree as usize) {
            let b = if b >= a { b + 1 } else { b };
            if !seen.insert((a.min(b), a.max(b))) {
                continue;
            }
            let base = if hi > lo {
                rng.random_range(lo..=hi)
            } else {
                lo
            };
            let half = asym.sample(rng) / 2.0;
            links.push(Link {
                from: a as NodeId,
                to: b as NodeId,
                delay_forward_ns: (base + half).max(1.0),
                delay_backward_ns: (base - half).max(1.0),
            });
        }
    }
    links
}

/// Samples queueing and timestamp errors of the scenario.
pub struct Noise {
    busy: f64,
    queue: QueueSampler,
    loss: f64,
    tx_early: Option<Exp<f64>>,
    rx_late: Option<Exp<f64>>,
    late_p: f64,
    late: [f64; 2],
    resolution: i64,
}

enum QueueSampler {
    Exp(Exp<f64>),
    Pareto(Pareto<f64>),
    None,
}

impl Noise {
    pub fn new(s: &Scenario) -> Self {
        let exp = |mean: f64| (mean > 0.0).then(|| Exp::new(1.0 / mean).expect("mean > 0"));
        let q = &s.queue;
        let queue = match (q.kind, q.mean_ns > 0.0) {
            (_, false) => QueueSampler::None,
            (QueueKind::Exponential, true) => QueueSampler::Exp(exp(q.mean_ns).expect("mean > 0")),
            (QueueKind::Pareto, true) => {
                let scale = q.mean_ns * (q.pareto_shape - 1.0) / q.pareto_shape;
                QueueSampler::Pareto(Pareto::new(scale, q.pareto_shape).expect("validated"))
            }
        };
        Self {
            busy: q.busy_probability,
            queue,
            loss: s.link.loss,
            tx_early: exp(s.timestamps.tx_early_mean_ns),
            rx_late: exp(s.timestamps.rx_late_mean_ns),
            late_p: s.timestamps.late_tx_probability,
            late: s.timestamps.late_tx_ns,
            resolution: s.timestamps.resolution_ns,
        }
    }

    pub(crate) fn queueing(&self, rng: &mut ChaCha8Rng) -> f64 {
        if rng.random::<f64>() >= self.busy {
            return 0.0;
        }
        match &self.queue {
            QueueSampler::Exp(d) => d.sample(rng),
            QueueSampler::Pareto(d) => d.sample(rng),
            QueueSampler::None => 0.0,
        }
    }

    pub(crate) fn tx_error(&self, rng: &mut ChaCha8Rng) -> f64 {
        let early = self.tx_early.map_or(0.0, |d| d.sample(rng));
        let late = if self.late_p > 0.0 && rng.random::<f64>() < self.late_p {
            rng.random_range(self.late[0]..=self.late[1])
        } else {
            0.0
        };
        late - early
    }

    pub(crate) fn rx_error(&self, rng: &mut ChaCha8Rng) -> f64 {
        self.rx_late.map_or(0.0, |d| d.sample(rng))
    }

    /// Whether a datagram is lost on the link.
    pub(crate) fn lost(&self, rng: &mut ChaCha8Rng) -> bool {
        self.loss > 0.0 && rng.random::<f64>() < self.loss
    }

    pub(crate) fn quantize(&self, reading: f64) -> i64 {
        let ticks = (reading / self.resolution as f64).floor() as i64;
        READING_BASE_NS + ticks * self.resolution
    }
}

/// Probe timestamps of one direction of a link during `[start, start + len)` (true time).
#[allow(clippy::too_many_arguments)]
pub fn probe_direction(
    clocks: &Clocks,
    noise: &Noise,
    sender: NodeId,
    receiver: NodeId,
    delay_ns: f64,
    start: f64,
    len: f64,
    pairs: usize,
    spacing_ns: f64,
    rng: &mut ChaCha8Rng,
) -> Vec<ProbeTimestamps> {
    let mut out = Vec::with_capacity(2 * pairs);
    let slot = len / pairs as f64;
    for k in 0..pairs {
        let t0 = start + (k as f64 + rng.random::<f64>()) * slot;
        let mut prev_tx = i64::MIN;
        for index in 0..2u8 {
            let t_send = t0 + index as f64 * spacing_ns;
            let t_recv = t_send + delay_ns + noise.queueing(rng);
            // One host stamps its TX packets in send order: the second stamp never precedes
            // the first even when the (early) software stamp error varies.
            let tx = noise
                .quantize(clocks.reading(sender, t_send) + noise.tx_error(rng))
                .max(prev_tx.saturating_add(noise.resolution));
            prev_tx = tx;
            let rx = clocks.reading(receiver, t_recv) + noise.rx_error(rng);
            // Loss is drawn after the stamps so the RNG stream does not depend on it.
            if noise.loss > 0.0 && rng.random::<f64>() < noise.loss {
                continue;
            }
            out.push(ProbeTimestamps {
                seq: k as u64,
                pair_index: index,
                tx_ns: tx,
                rx_ns: noise.quantize(rx),
            });
        }
    }
    out
}

/// Both directions of one link in one window.
pub fn probe_link(
    clocks: &Clocks,
    noise: &Noise,
    link: &Link,
    window: (f64, f64),
    pairs: usize,
    spacing_ns: f64,
    rng: &mut ChaCha8Rng,
) -> EdgeProbes {
    let (start, len) = window;
    let mut dir =
        |s, r, d| probe_direction(clocks, noise, s, r, d, start, len, pairs, spacing_ns, rng);
    let forward = dir(link.from, link.to, link.delay_forward_ns);
    let backward = dir(link.to, link.from, link.delay_backward_ns);
    EdgeProbes {
        from: link.from,
        to: link.to,
        forward,
        backward,
    }
}

pub fn rng_from_seed(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}
