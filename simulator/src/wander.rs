//! A seeded random walk of clock frequency, for `--inject-skew` (testing
//! only): a clock whose rate moves, as real oscillators' do, so the netns
//! runs and the demo test the fit's history length against a clock that
//! does not stay on one line. A shared kernel clock with a constant
//! injected drift would always reward the longest history.
//!
//! The frequency steps once per second by a Gaussian of σ = `ppb_per_sqrt_s`
//! (Allan deviation growing as √τ); the offset is its integral. Each
//! (seed, σ) walk is computed once per thread and extended as time goes on,
//! so the agent and the test harness that checks it agree exactly.

use std::{cell::RefCell, collections::HashMap};

const STEP_NS: i64 = 1_000_000_000;

/// Frequency (ppb) at the start of each step and the offset (ns) there.
#[derive(Default)]
struct Walk {
    freq_ppb: Vec<f64>,
    offset_ns: Vec<f64>,
}

thread_local! {
    static WALKS: RefCell<HashMap<(u64, u64), Walk>> = RefCell::new(HashMap::new());
}

/// The walk's offset (ns) `age_ns` after its start (0 before it).
pub fn offset_ns(seed: u64, ppb_per_sqrt_s: f64, age_ns: i64) -> f64 {
    if age_ns <= 0 || ppb_per_sqrt_s == 0.0 {
        return 0.0;
    }
    let step = usize::try_from(age_ns / STEP_NS).unwrap_or(usize::MAX);
    // Beyond ~3 years of steps the walk stops growing (memory stays bounded).
    let step = step.min(100_000_000);
    WALKS.with(|walks| {
        let mut walks = walks.borrow_mut();
        let walk = walks.entry((seed, ppb_per_sqrt_s.to_bits())).or_default();
        extend(walk, seed, ppb_per_sqrt_s, step);
        let within = (age_ns - step as i64 * STEP_NS) as f64 / 1e9;
        walk.offset_ns[step] + walk.freq_ppb[step] * within
    })
}

fn extend(walk: &mut Walk, seed: u64, sigma: f64, step: usize) {
    if walk.freq_ppb.is_empty() {
        walk.freq_ppb.push(0.0);
        walk.offset_ns.push(0.0);
    }
    while walk.freq_ppb.len() <= step {
        let k = walk.freq_ppb.len() - 1;
        let (f, o) = (walk.freq_ppb[k], walk.offset_ns[k]);
        walk.offset_ns.push(o + f); // one second at f ppb = f ns
        walk.freq_ppb.push(f + sigma * gaussian(seed, k as u64));
    }
}

/// A standard normal draw, a pure function of (seed, index) (Box–Muller on
/// two SplitMix64 outputs).
fn gaussian(seed: u64, index: u64) -> f64 {
    let u = |salt: u64| {
        let z = mix(seed ^ mix(index.wrapping_mul(2).wrapping_add(salt)));
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (-2.0 * u(0).ln()).sqrt() * (std::f64::consts::TAU * u(1)).cos()
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_continuous_seeded_and_grows_like_a_random_walk() {
        assert_eq!(offset_ns(7, 1.0, -5), 0.0);
        assert_eq!(offset_ns(7, 0.0, 10 * STEP_NS), 0.0);
        // Continuous across a step boundary.
        let before = offset_ns(7, 1.0, 50 * STEP_NS - 1);
        let after = offset_ns(7, 1.0, 50 * STEP_NS);
        assert!((before - after).abs() < 1e-3, "{before} {after}");
        // Same seed, same walk; another seed, another walk.
        assert_eq!(
            offset_ns(7, 1.0, 99 * STEP_NS),
            offset_ns(7, 1.0, 99 * STEP_NS)
        );
        assert_ne!(
            offset_ns(7, 1.0, 99 * STEP_NS),
            offset_ns(8, 1.0, 99 * STEP_NS)
        );
        // Frequency after n steps has σ ≈ √n ppb: over many seeds, the
        // offset after 400 s (∝ n^1.5) is mostly far from a straight line.
        let far = (0..200u64)
            .filter(|&s| offset_ns(s, 1.0, 400 * STEP_NS).abs() > 100.0)
            .count();
        assert!(far > 100, "{far} of 200 walks moved > 100 ns in 400 s");
    }
}
