//! A synthetic device clock with known truth, for tests and CI.
#![expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    reason = "a test clock whose values stay in range by construction: 53-bit uniforms, ns within a run, read latencies of µs"
)]
//!
//! The device clock runs at `1 - drift` against the host clock with an
//! initial offset; its drift performs a random walk (wander). A read takes a
//! random latency to reach the device and another to come back, so the host
//! brackets it; the device answers in whole ticks. Faults can be injected:
//! huge brackets (preemption) and device times that go backwards. All
//! randomness comes from a seeded generator, and host time is supplied by the
//! caller, so runs are reproducible and need no real clock.
use clockmesh_time::LocalNs;

use super::pair::{DeviceId, DeviceReading, HostStamp, SnapshotPair, SourceKind, Vendor};

/// Parameters of the synthetic clock. Defaults resemble an H100's
/// `%globaltimer` read by a ping-pong kernel (see docs/gpu-clocks.md).
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticConfig {
    pub seed: u64,
    pub device_index: u32,
    /// `host - device` at host time 0 of the model (ns).
    pub initial_offset_ns: i64,
    /// Initial d(host - device)/d(host) in ppb (H100: ~ +21700).
    pub drift_ppb: f64,
    /// Random-walk step of the drift, ppb per sqrt(second).
    pub wander_ppb_per_sqrt_s: f64,
    /// Deterministic change of the drift (ppb per second) while the model's
    /// host time is before `ramp_until_s` seconds from the start: a GPU
    /// heating up under load (H100: ~2.4 ppm within ~40 s).
    pub drift_ramp_ppb_per_s: f64,
    pub ramp_until_s: f64,
    /// Host-to-device latency: fixed part and uniform jitter (ns).
    pub latency_to_device_ns: u64,
    pub jitter_to_device_ns: u64,
    /// Device-to-host latency: fixed part and uniform jitter (ns). A
    /// difference from the to-device latency is the invisible asymmetry.
    pub latency_from_device_ns: u64,
    pub jitter_from_device_ns: u64,
    /// Device tick (ns); readings are floored to it (H100: 32).
    pub tick_ns: u64,
    /// If set, readings are reported as ticks of this rate instead of ns.
    pub tick_hz: Option<u64>,
    /// Probability that a read is delayed by `spike_ns` on the way back.
    pub spike_probability: f64,
    pub spike_ns: u64,
    /// Probability that a reading is `backwards_ns` too early (bad reading).
    pub backwards_probability: f64,
    pub backwards_ns: u64,
    /// MONOTONIC = REALTIME - this; BOOTTIME = MONOTONIC + `suspended_ns`.
    pub realtime_minus_monotonic_ns: i64,
    pub suspended_ns: i64,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        SyntheticConfig {
            seed: 1,
            device_index: 0,
            initial_offset_ns: 500_000,
            drift_ppb: 21_700.0,
            wander_ppb_per_sqrt_s: 1.0,
            drift_ramp_ppb_per_s: 0.0,
            ramp_until_s: 0.0,
            latency_to_device_ns: 700,
            jitter_to_device_ns: 300,
            latency_from_device_ns: 800,
            jitter_from_device_ns: 300,
            tick_ns: 32,
            tick_hz: None,
            spike_probability: 0.0,
            spike_ns: 200_000,
            backwards_probability: 0.0,
            backwards_ns: 1_000_000,
            realtime_minus_monotonic_ns: 1_700_000_000_000_000_000,
            suspended_ns: 0,
        }
    }
}

/// The true instant of one device read: host REALTIME and exact device ns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TruePoint {
    pub host_realtime_ns: i64,
    /// Device time before tick flooring (ns, fractional part dropped).
    pub device_ns: u64,
}

/// SplitMix64: small, seedable, good enough for test noise.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % (n + 1) }
    }

    fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(f64::MIN_POSITIVE);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// The synthetic device clock and its truth.
#[derive(Debug, Clone)]
pub struct SyntheticClockModel {
    config: SyntheticConfig,
    rng: Rng,
    start_host_ns: i64,
    /// Host time of the state below; offsets relative to the initial one.
    state_host_ns: i64,
    offset_rel_ns: f64,
    drift_ppb: f64,
    seq: u64,
}

impl SyntheticClockModel {
    /// The model's truth from host time (this host's CLOCK_REALTIME) `start`.
    pub fn new(config: SyntheticConfig, start: LocalNs) -> Self {
        let start_host_ns = start.0;
        SyntheticClockModel {
            rng: Rng(config.seed),
            start_host_ns,
            state_host_ns: start_host_ns,
            offset_rel_ns: 0.0,
            drift_ppb: config.drift_ppb,
            seq: 0,
            config,
        }
    }

    pub fn device_id(&self) -> DeviceId {
        DeviceId {
            vendor: Vendor::Synthetic,
            index: self.config.device_index,
        }
    }

    pub fn config(&self) -> &SyntheticConfig {
        &self.config
    }

    /// Current true drift (ppb).
    pub fn drift_ppb(&self) -> f64 {
        self.drift_ppb
    }

    /// Advance the truth to host time `host` (never backwards) and return the
    /// true device time there. The wander is applied per advance as a random walk.
    pub fn advance_to(&mut self, host: LocalNs) -> u64 {
        let host_ns = host.0;
        let dt_ns = (host_ns - self.state_host_ns).max(0) as f64;
        if dt_ns > 0.0 {
            let dt_s = dt_ns * 1e-9;
            // Trapezoid: the drift changes linearly across the step.
            let mut step = self.config.wander_ppb_per_sqrt_s * dt_s.sqrt() * self.rng.normal();
            let since_start_s = (self.state_host_ns - self.start_host_ns) as f64 * 1e-9;
            if since_start_s < self.config.ramp_until_s {
                step += self.config.drift_ramp_ppb_per_s * dt_s;
            }
            let new_drift = self.drift_ppb + step;
            self.offset_rel_ns += 0.5 * (self.drift_ppb + new_drift) * 1e-9 * dt_ns;
            self.drift_ppb = new_drift;
            self.state_host_ns = host_ns;
        }
        self.true_device_ns()
    }

    fn true_device_ns(&self) -> u64 {
        // device = host - offset. Host ns near 1.7e18 would lose precision in
        // f64, so only the (small) offset is floating point.
        let offset = (self.config.initial_offset_ns as f64 + self.offset_rel_ns).floor();
        let device = i128::from(self.state_host_ns) - offset as i128;
        u64::try_from(device.max(0)).unwrap_or(u64::MAX)
    }

    fn stamp(&self, realtime_ns: i64) -> HostStamp {
        let monotonic_ns = realtime_ns - self.config.realtime_minus_monotonic_ns;
        HostStamp {
            realtime_ns,
            monotonic_ns,
            boottime_ns: monotonic_ns + self.config.suspended_ns,
        }
    }

    /// Take one snapshot pair whose host bracket starts at `host_before`.
    /// Returns the pair and the truth of the device read.
    pub fn sample(&mut self, host_before: LocalNs, burst: u64) -> (SnapshotPair, TruePoint) {
        let host_before_ns = host_before.0;
        let c = &self.config;
        let to_dev = c.latency_to_device_ns + self.rng.below(c.jitter_to_device_ns);
        let mut from_dev = c.latency_from_device_ns + self.rng.below(c.jitter_from_device_ns);
        if self.rng.unit() < c.spike_probability {
            from_dev += c.spike_ns;
        }
        let read_at = host_before_ns + to_dev as i64;
        let true_dev = self.advance_to(LocalNs(read_at));
        let tick = self.config.tick_ns.max(1);
        let mut dev_reported = true_dev / tick * tick;
        if self.rng.unit() < self.config.backwards_probability {
            dev_reported = dev_reported.saturating_sub(self.config.backwards_ns);
        }
        let reading = match self.config.tick_hz {
            Some(hz) => DeviceReading::Ticks {
                ticks: (u128::from(dev_reported) * u128::from(hz) / 1_000_000_000) as u64,
                hz,
            },
            None => DeviceReading::Ns(dev_reported),
        };
        let pair = SnapshotPair {
            device: self.device_id(),
            source: SourceKind::Synthetic,
            reading,
            before: self.stamp(host_before_ns),
            after: self.stamp(read_at + from_dev as i64),
            in_call_boottime_ns: None,
            seq: self.seq,
            burst,
        };
        self.seq += 1;
        let truth = TruePoint {
            host_realtime_ns: read_at,
            device_ns: true_dev,
        };
        (pair, truth)
    }

    /// Take a burst of `n` pairs back to back starting at `host_ns`; returns
    /// the pairs, their truths and the host time after the burst.
    pub fn burst(
        &mut self,
        host_ns: i64,
        n: usize,
        burst: u64,
    ) -> (Vec<SnapshotPair>, Vec<TruePoint>, i64) {
        let mut pairs = Vec::with_capacity(n);
        let mut truths = Vec::with_capacity(n);
        let mut now = host_ns;
        for _ in 0..n {
            let (p, t) = self.sample(LocalNs(now), burst);
            now = p.after.realtime_ns + 100;
            pairs.push(p);
            truths.push(t);
        }
        (pairs, truths, now)
    }
}
