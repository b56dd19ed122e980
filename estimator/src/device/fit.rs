//! Windowed, weighted line fit of `host - device` against device time.
//!
//! Per burst the tightest valid pair is kept. Over a sliding window the
//! offset `host_mid - device` is fitted as a line in device time, each point
//! weighted by `1 / (half bracket + tick)^2`. The error bound of a mapped
//! time is the worst case of the brackets carried through the fit's linear
//! weights (the true reading lies inside each bracket), plus three residual
//! rms for un-modelled wander, plus the gap between a quadratic and the line
//! over the same window (the line's lag when the drift itself is changing,
//! as when a GPU heats up under load), plus a quadratic allowance for drift
//! wander past the newest point. Past the extrapolation cap the map refuses.
#![expect(
    clippy::cast_precision_loss,
    reason = "the fit's floats are device/host ns differences within a window, far below 2^53"
)]
use std::collections::VecDeque;

use crate::convert::{ceil_bound_ns, round_ns};

/// Device ns from `x0`, signed, as f64. Window spans are far below 2^63
/// ns, so the wrapping difference read as i64 is exact (and avoids a slow
/// i128-to-float conversion on every point of every refit).
#[expect(
    clippy::cast_possible_wrap,
    reason = "two's-complement reading of a wrapping difference: spans are far below 2^63"
)]
fn signed_since(device_ns: u64, x0: u64) -> f64 {
    device_ns.wrapping_sub(x0) as i64 as f64
}

use super::pair::{DeviceId, HostDomain, SnapshotPair, SourceKind};

/// Fitter settings. Defaults suit a GPU timer sampled every 100 ms.
#[derive(Debug, Clone, PartialEq)]
pub struct FitConfig {
    /// Host clock the device is mapped onto.
    pub domain: HostDomain,
    /// Sliding window length (device ns).
    pub window_ns: u64,
    /// Pairs with a wider bracket are rejected (preempted, page-faulted...).
    pub max_bracket_ns: u64,
    /// Points needed before a fit is offered.
    pub min_points: usize,
    /// Memory cap on points kept in the window.
    pub max_points: usize,
    /// Outlier threshold in robust standard deviations of the residuals.
    pub outlier_sigmas: f64,
    /// Residual scale below which nothing is called an outlier (ns); keeps a
    /// near-perfect fit from rejecting tick-quantisation noise.
    pub outlier_floor_ns: f64,
    /// How far (device ns) past the newest (or before the oldest) point the
    /// map may extrapolate; beyond, it fails closed. 2 s: on an H100 whose
    /// load started or stopped, the bound held to 2 s ahead and failed from
    /// 3 s (the drift moved by ~3.7 ppm within ~45 s).
    pub extrapolation_cap_ns: u64,
    /// Assumed worst rate of change of drift (ppb per second), for the
    /// extrapolation term of the bound. H100: ~1 ppb/s in steady state, up
    /// to ~5 ppb/s in the first minute after the GPU wakes (measured).
    pub wander_ppb_per_s: f64,
    /// Also fit only the newest `short_window_ns` of the window and keep
    /// whichever fit states the smaller bound a quarter of the cap ahead:
    /// when the drift changes fast (a GPU heating under load: +3.7 ppm in
    /// ~45 s on an H100) the long line lags and the short one wins; in
    /// steady state the long one wins. 0 disables.
    pub short_window_ns: u64,
    /// After this many consecutive bursts rejected as non-monotonic or as
    /// outliers the device clock is taken to have stepped or reset: the
    /// window is cleared and fitting restarts.
    pub reset_after_bursts: u32,
}

impl Default for FitConfig {
    fn default() -> Self {
        FitConfig {
            domain: HostDomain::Realtime,
            window_ns: 30_000_000_000,
            max_bracket_ns: 50_000,
            min_points: 8,
            max_points: 4096,
            outlier_sigmas: 6.0,
            outlier_floor_ns: 50.0,
            extrapolation_cap_ns: 2_000_000_000,
            wander_ppb_per_s: 5.0,
            short_window_ns: 7_500_000_000,
            reset_after_bursts: 20,
        }
    }
}

/// Why a fit or a map is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    #[error("not enough points to fit: have {have}, need {need}")]
    NotEnoughPoints { have: usize, need: usize },
    #[error("points span no device time; cannot fit a slope")]
    Degenerate,
    #[error(
        "device time {device_ns} ns is outside the fit's valid range \
         [{valid_from_ns}, {valid_until_ns}] (extrapolation cap)"
    )]
    BeyondExtrapolationCap {
        device_ns: u64,
        valid_from_ns: u64,
        valid_until_ns: u64,
    },
    #[error("mapped time overflows 64-bit nanoseconds")]
    Overflow,
    #[error("invalid fitter configuration: {0}")]
    BadConfig(&'static str),
    #[error("pair from {got} fed to the fitter of {expected}")]
    WrongDevice { expected: DeviceId, got: DeviceId },
}

/// Counters of what the fitter did with its input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FitStats {
    pub bursts: u64,
    pub empty_bursts: u64,
    pub pairs_seen: u64,
    pub accepted: u64,
    /// Valid pairs that lost to a tighter one in their burst.
    pub not_tightest: u64,
    pub rejected_bracket_too_wide: u64,
    pub rejected_invalid: u64,
    pub rejected_non_monotonic: u64,
    pub rejected_outlier: u64,
    /// Points dropped from the window by the robust post-fit check.
    pub pruned_outliers: u64,
    pub resets: u64,
}

impl FitStats {
    pub fn rejected_total(&self) -> u64 {
        self.rejected_bracket_too_wide
            + self.rejected_invalid
            + self.rejected_non_monotonic
            + self.rejected_outlier
    }
}

#[derive(Debug, Clone, Copy)]
struct Point {
    device_ns: u64,
    offset_ns: i64,
    /// Half bracket plus tick: this point's worst-case error.
    err_ns: u64,
}

/// A fitted map from device time to host time, valid in a device-time range.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceClockFit {
    pub device: DeviceId,
    pub source: SourceKind,
    pub domain: HostDomain,
    /// Device time of the newest point: the anchor of the map.
    pub anchor_device_ns: u64,
    /// `host - device` at the anchor, integer part (floor).
    pub offset_at_anchor_ns: i64,
    /// Fractional ns of the offset at the anchor, in [0, 1).
    pub offset_frac_ns: f64,
    /// d(host - device)/d(device) in parts per billion. A device timer that
    /// runs slow against the host has positive drift.
    pub drift_ppb: f64,
    /// Rms of the fit residuals (ns).
    pub residual_rms_ns: f64,
    /// Points in the fit.
    pub points: usize,
    pub oldest_device_ns: u64,
    pub extrapolation_cap_ns: u64,
    wander_ppb_per_s: f64,
    /// Bracket term of the bound at: oldest - cap, oldest, anchor, anchor + cap.
    bracket_term_ns: [f64; 4],
    /// Quadratic-minus-line over the window, `d0 + d1 u + d2 u^2` with `u`
    /// in seconds from `curve_center_ns`: the lag bias of the line when the
    /// drift itself is changing (a GPU warming up under load).
    curve_center_ns: u64,
    curve: [f64; 3],
}

/// A device time mapped to host time, with its error bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedTime {
    pub host_ns: i64,
    pub bound_ns: u64,
}

impl DeviceClockFit {
    /// Last device time the map may be used for.
    pub fn valid_until_device_ns(&self) -> u64 {
        self.anchor_device_ns
            .saturating_add(self.extrapolation_cap_ns)
    }

    /// First device time the map may be used for.
    pub fn valid_from_device_ns(&self) -> u64 {
        self.oldest_device_ns
            .saturating_sub(self.extrapolation_cap_ns)
    }

    /// Error bound at the anchor (ns).
    pub fn bound_at_anchor_ns(&self) -> u64 {
        self.bound_ns(self.anchor_device_ns).unwrap_or(u64::MAX)
    }

    fn check_range(&self, device_ns: u64) -> Result<(), FitError> {
        let (from, until) = (self.valid_from_device_ns(), self.valid_until_device_ns());
        if device_ns < from || device_ns > until {
            return Err(FitError::BeyondExtrapolationCap {
                device_ns,
                valid_from_ns: from,
                valid_until_ns: until,
            });
        }
        Ok(())
    }

    /// Signed device ns from the anchor, exact.
    fn since_anchor(&self, device_ns: u64) -> i128 {
        i128::from(device_ns) - i128::from(self.anchor_device_ns)
    }

    /// Map a device time to host time in the fit's domain; fails closed past
    /// the extrapolation cap.
    pub fn map(&self, device_ns: u64) -> Result<MappedTime, FitError> {
        self.check_range(device_ns)?;
        let dx = self.since_anchor(device_ns) as f64;
        let correction = i128::from(round_ns(self.offset_frac_ns + self.drift_ppb * 1e-9 * dx));
        let host = i128::from(device_ns) + i128::from(self.offset_at_anchor_ns) + correction;
        let host_ns = i64::try_from(host).map_err(|_| FitError::Overflow)?;
        Ok(MappedTime {
            host_ns,
            bound_ns: self.bound_ns(device_ns)?,
        })
    }

    /// Error bound of `map(device_ns)`.
    pub fn bound_ns(&self, device_ns: u64) -> Result<u64, FitError> {
        self.check_range(device_ns)?;
        let [before, oldest, anchor, after] = self.bracket_term_ns;
        let cap = self.extrapolation_cap_ns as f64;
        let t = device_ns as f64;
        let (t_old, t_anchor) = (self.oldest_device_ns as f64, self.anchor_device_ns as f64);
        // The bracket term is convex piecewise-linear in t, so the chord
        // between the precomputed knots bounds it from above.
        let bracket = if t >= t_anchor {
            chord(anchor, after, (t - t_anchor) / cap.max(1.0))
        } else if t >= t_old {
            chord(oldest, anchor, (t - t_old) / (t_anchor - t_old).max(1.0))
        } else {
            chord(oldest, before, (t_old - t) / cap.max(1.0))
        };
        let outside_s = if t > t_anchor {
            (t - t_anchor) * 1e-9
        } else if t < t_old {
            (t_old - t) * 1e-9
        } else {
            0.0
        };
        let wander = 0.5 * self.wander_ppb_per_s * outside_s * outside_s;
        let u = (i128::from(device_ns) - i128::from(self.curve_center_ns)) as f64 * 1e-9;
        let [d0, d1, d2] = self.curve;
        let curvature = (d0 + d1 * u + d2 * u * u).abs();
        Ok(ceil_bound_ns(
            bracket + 3.0 * self.residual_rms_ns + wander + curvature,
        ))
    }
}

fn chord(a: f64, b: f64, frac: f64) -> f64 {
    a + (b - a) * frac.clamp(0.0, 1.0)
}

/// Line fit over the window's points, relative to the first point.
struct LineFit {
    /// Reference device time and offset (exact integers).
    x0: u64,
    y0: i64,
    weights: Vec<f64>,
    xs: Vec<f64>,
    sum_w: f64,
    mean_x: f64,
    mean_y: f64,
    sxx: f64,
    slope: f64,
}

impl LineFit {
    fn new(points: &[Point]) -> Result<Self, FitError> {
        let first = points
            .first()
            .ok_or(FitError::NotEnoughPoints { have: 0, need: 2 })?;
        let (x0, y0) = (first.device_ns, first.offset_ns);
        let xs: Vec<f64> = points
            .iter()
            .map(|p| signed_since(p.device_ns, x0))
            .collect();
        let ys: Vec<f64> = points
            .iter()
            .map(|p| p.offset_ns.wrapping_sub(y0) as f64)
            .collect();
        let weights: Vec<f64> = points
            .iter()
            .map(|p| 1.0 / ((p.err_ns.max(1)) as f64).powi(2))
            .collect();
        let sum_w: f64 = weights.iter().sum();
        let mean_x = weighted_mean(&weights, &xs, sum_w);
        let mean_y = weighted_mean(&weights, &ys, sum_w);
        let (mut sxx, mut sxy) = (0.0, 0.0);
        for ((w, x), y) in weights.iter().zip(&xs).zip(&ys) {
            sxx += w * (x - mean_x) * (x - mean_x);
            sxy += w * (x - mean_x) * (y - mean_y);
        }
        if sxx <= 0.0 || !sxx.is_finite() {
            return Err(FitError::Degenerate);
        }
        Ok(LineFit {
            x0,
            y0,
            weights,
            xs,
            sum_w,
            mean_x,
            mean_y,
            sxx,
            slope: sxy / sxx,
        })
    }

    /// Device ns relative to `x0` ([`signed_since`]).
    fn x_of(&self, device_ns: u64) -> f64 {
        signed_since(device_ns, self.x0)
    }

    /// Fitted offset relative to `y0` at device time `device_ns`.
    fn predict_rel(&self, device_ns: u64) -> f64 {
        self.mean_y + self.slope * (self.x_of(device_ns) - self.mean_x)
    }

    fn residual(&self, p: &Point) -> f64 {
        p.offset_ns.wrapping_sub(self.y0) as f64 - self.predict_rel(p.device_ns)
    }

    /// Weighted quadratic over the same points minus this line, as
    /// coefficients in `u` = seconds from the weighted mean. `None` when the
    /// 3x3 system is singular (too few distinct times).
    fn curvature(&self, points: &[Point]) -> Option<[f64; 3]> {
        let mut s = [0.0f64; 5];
        let mut t = [0.0f64; 3];
        for ((w, x), p) in self.weights.iter().zip(&self.xs).zip(points) {
            let u = (x - self.mean_x) * 1e-9;
            let y = p.offset_ns.wrapping_sub(self.y0) as f64 - self.mean_y;
            let mut uk = 1.0;
            for (k, sk) in s.iter_mut().enumerate() {
                *sk += w * uk;
                if k < 3 {
                    t[k] += w * y * uk;
                }
                uk *= u;
            }
        }
        let q = solve3(
            [[s[0], s[1], s[2]], [s[1], s[2], s[3]], [s[2], s[3], s[4]]],
            t,
        )?;
        // The line in the same coordinates: mean_y + slope * (x - mean_x),
        // i.e. 0 + slope*1e9 * u relative to mean_y.
        Some([q[0], q[1] - self.slope * 1e9, q[2]])
    }

    /// Worst case at `device_ns` of the point errors carried through the
    /// fit's linear weights: sum |c_i| err_i.
    fn bracket_term(&self, points: &[Point], device_ns: u64) -> f64 {
        let dt = self.x_of(device_ns) - self.mean_x;
        self.weights
            .iter()
            .zip(&self.xs)
            .zip(points)
            .map(|((w, x), p)| {
                let c = w / self.sum_w + w * (x - self.mean_x) * dt / self.sxx;
                c.abs() * p.err_ns as f64
            })
            .sum()
    }
}

/// Solve a 3x3 linear system by Cramer's rule; `None` if (near) singular.
fn solve3(a: [[f64; 3]; 3], b: [f64; 3]) -> Option<[f64; 3]> {
    let det = |m: [[f64; 3]; 3]| {
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    };
    let d = det(a);
    let scale = a.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
    if !d.is_finite() || d.abs() <= 1e-12 * scale.powi(3) {
        return None;
    }
    let mut x = [0.0; 3];
    for (col, xc) in x.iter_mut().enumerate() {
        let mut m = a;
        for row in 0..3 {
            m[row][col] = b[row];
        }
        *xc = det(m) / d;
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

fn weighted_mean(w: &[f64], v: &[f64], sum_w: f64) -> f64 {
    w.iter().zip(v).map(|(w, v)| w * v).sum::<f64>() / sum_w
}

fn rms(values: impl Iterator<Item = f64>) -> f64 {
    let (mut sum, mut n) = (0.0, 0usize);
    for v in values {
        sum += v * v;
        n += 1;
    }
    if n == 0 { 0.0 } else { (sum / n as f64).sqrt() }
}

/// Upper median in O(n) (selection, not a sort: this runs on every refit).
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mid = v.len() / 2;
    *v.select_nth_unstable_by(mid, f64::total_cmp).1
}

/// Fits one device's clock against one host clock. Feed it bursts of pairs.
#[derive(Debug, Clone)]
pub struct DeviceClockFitter {
    config: FitConfig,
    device: DeviceId,
    source: SourceKind,
    points: VecDeque<Point>,
    last_device_ns: Option<u64>,
    consecutive_bad_bursts: u32,
    stats: FitStats,
    fit: Option<DeviceClockFit>,
}

/// What happened to one burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BurstOutcome {
    /// The tightest valid pair, if it was accepted into the window.
    pub accepted: Option<SnapshotPair>,
    /// Pairs of this burst rejected as bad readings (bracket, invalid,
    /// non-monotonic, outlier).
    pub rejected: u32,
    /// Whether this burst made the fitter clear its window (clock reset).
    pub reset: bool,
}

enum Verdict {
    Valid(Point),
    TooWide,
    Invalid,
    NonMonotonic,
}

impl DeviceClockFitter {
    pub fn new(device: DeviceId, source: SourceKind, config: FitConfig) -> Result<Self, FitError> {
        validate_config(&config)?;
        Ok(DeviceClockFitter {
            config,
            device,
            source,
            points: VecDeque::new(),
            last_device_ns: None,
            consecutive_bad_bursts: 0,
            stats: FitStats::default(),
            fit: None,
        })
    }

    pub fn config(&self) -> &FitConfig {
        &self.config
    }

    pub fn stats(&self) -> FitStats {
        self.stats
    }

    /// The current fit, if the window holds enough points.
    pub fn fit(&self) -> Option<&DeviceClockFit> {
        self.fit.as_ref()
    }

    /// Points currently in the window.
    pub fn window_len(&self) -> usize {
        self.points.len()
    }

    fn judge(&self, pair: &SnapshotPair, floor_ns: Option<u64>) -> Verdict {
        let domain = self.config.domain;
        let (Ok(bracket), Ok(device_ns), Ok(offset_ns)) = (
            pair.bracket_ns(domain),
            pair.device_ns(),
            pair.offset_ns(domain),
        ) else {
            return Verdict::Invalid;
        };
        if bracket > self.config.max_bracket_ns {
            return Verdict::TooWide;
        }
        if floor_ns.is_some_and(|floor| device_ns < floor) {
            return Verdict::NonMonotonic;
        }
        Verdict::Valid(Point {
            device_ns,
            offset_ns,
            err_ns: bracket.div_ceil(2) + pair.reading.quantum_ns(),
        })
    }

    /// Feed one burst (pairs in the order they were taken). Bad readings are
    /// rejected and counted, never an error; a pair of another device is.
    pub fn push_burst(&mut self, pairs: &[SnapshotPair]) -> Result<BurstOutcome, FitError> {
        if let Some(p) = pairs.iter().find(|p| p.device != self.device) {
            return Err(FitError::WrongDevice {
                expected: self.device,
                got: p.device,
            });
        }
        self.stats.bursts += 1;
        self.stats.pairs_seen += pairs.len() as u64;
        let mut outcome = BurstOutcome::default();
        let mut floor = self.last_device_ns.map(|d| d.saturating_add(1));
        let mut best: Option<(Point, SnapshotPair)> = None;
        let mut any_non_monotonic = false;
        for pair in pairs {
            match self.judge(pair, floor) {
                Verdict::Valid(point) => {
                    floor = Some(point.device_ns);
                    if let Some((b, _)) = &best {
                        self.stats.not_tightest += 1;
                        if b.err_ns <= point.err_ns {
                            continue;
                        }
                    }
                    best = Some((point, *pair));
                }
                Verdict::TooWide => self.reject(&mut outcome, |s| &mut s.rejected_bracket_too_wide),
                Verdict::Invalid => self.reject(&mut outcome, |s| &mut s.rejected_invalid),
                Verdict::NonMonotonic => {
                    any_non_monotonic = true;
                    self.reject(&mut outcome, |s| &mut s.rejected_non_monotonic)
                }
            }
        }
        let Some((point, pair)) = best else {
            self.stats.empty_bursts += 1;
            if any_non_monotonic {
                outcome.reset = self.count_bad_burst();
            }
            return Ok(outcome);
        };
        if self.is_outlier(&point) {
            self.reject(&mut outcome, |s| &mut s.rejected_outlier);
            outcome.reset = self.count_bad_burst();
            if !outcome.reset {
                return Ok(outcome);
            }
            // A step that persisted: restart from this point.
        } else {
            self.consecutive_bad_bursts = 0;
        }
        self.stats.accepted += 1;
        self.last_device_ns = Some(point.device_ns);
        self.points.push_back(point);
        self.trim_window();
        self.refit();
        outcome.accepted = Some(pair);
        Ok(outcome)
    }

    fn reject(&mut self, outcome: &mut BurstOutcome, counter: fn(&mut FitStats) -> &mut u64) {
        *counter(&mut self.stats) += 1;
        outcome.rejected += 1;
    }

    /// Returns true when enough bad bursts in a row mean the clock reset.
    fn count_bad_burst(&mut self) -> bool {
        self.consecutive_bad_bursts += 1;
        if self.consecutive_bad_bursts < self.config.reset_after_bursts {
            return false;
        }
        self.consecutive_bad_bursts = 0;
        self.points.clear();
        self.last_device_ns = None;
        self.fit = None;
        self.stats.resets += 1;
        true
    }

    fn is_outlier(&self, point: &Point) -> bool {
        let Some(fit) = &self.fit else {
            return false;
        };
        let Ok(predicted) = fit.map(point.device_ns) else {
            // Past the cap (a long gap): the point cannot be judged.
            return false;
        };
        let offset_pred = i128::from(predicted.host_ns) - i128::from(point.device_ns);
        let residual = (i128::from(point.offset_ns) - offset_pred).unsigned_abs() as f64;
        let scale = fit.residual_rms_ns.max(self.config.outlier_floor_ns);
        let allowed =
            self.config.outlier_sigmas * scale + point.err_ns as f64 + predicted.bound_ns as f64;
        residual > allowed
    }

    fn trim_window(&mut self) {
        let Some(newest) = self.points.back().map(|p| p.device_ns) else {
            return;
        };
        let start = newest.saturating_sub(self.config.window_ns);
        while self.points.front().is_some_and(|p| p.device_ns < start)
            || self.points.len() > self.config.max_points
        {
            self.points.pop_front();
        }
    }

    fn refit(&mut self) {
        self.fit = self.compute_fit().ok();
    }

    fn compute_fit(&mut self) -> Result<DeviceClockFit, FitError> {
        let need = self.config.min_points;
        if self.points.len() < need {
            return Err(FitError::NotEnoughPoints {
                have: self.points.len(),
                need,
            });
        }
        let mut points: Vec<Point> = self.points.iter().copied().collect();
        let mut line = LineFit::new(&points)?;
        // One robust pass: drop points far outside the residual scale (median
        // absolute deviation), then refit.
        let residuals: Vec<f64> = points.iter().map(|p| line.residual(p)).collect();
        let mad = median(residuals.iter().map(|r| r.abs()).collect());
        let scale = (1.4826 * mad).max(self.config.outlier_floor_ns);
        let keep: Vec<bool> = points
            .iter()
            .zip(&residuals)
            .map(|(p, r)| r.abs() <= self.config.outlier_sigmas * scale + p.err_ns as f64)
            .collect();
        let dropped = keep.iter().filter(|k| !**k).count();
        if dropped > 0 && points.len() - dropped >= need {
            let mut it = keep.iter();
            self.points.retain(|_| *it.next().unwrap_or(&true));
            points = self.points.iter().copied().collect();
            line = LineFit::new(&points)?;
            self.stats.pruned_outliers += dropped as u64;
        }
        let full = self.build_fit(&points, &line);
        Ok(self.maybe_shorter(&points, full))
    }

    /// The short-window fit if it states a smaller bound ahead (see
    /// [`FitConfig::short_window_ns`]), else `full`.
    fn maybe_shorter(&self, points: &[Point], full: DeviceClockFit) -> DeviceClockFit {
        let short_ns = self.config.short_window_ns;
        if short_ns == 0 || short_ns >= self.config.window_ns {
            return full;
        }
        let start = full.anchor_device_ns.saturating_sub(short_ns);
        let first = points.partition_point(|p| p.device_ns < start);
        let recent = &points[first..];
        if first == 0 || recent.len() < self.config.min_points {
            return full;
        }
        let Ok(line) = LineFit::new(recent) else {
            return full;
        };
        let short = self.build_fit(recent, &line);
        let ahead = full
            .anchor_device_ns
            .saturating_add(self.config.extrapolation_cap_ns / 4);
        match (short.bound_ns(ahead), full.bound_ns(ahead)) {
            (Ok(s), Ok(f)) if s < f => short,
            _ => full,
        }
    }

    fn build_fit(&self, points: &[Point], line: &LineFit) -> DeviceClockFit {
        let oldest = points[0].device_ns;
        let anchor = points[points.len() - 1].device_ns;
        let cap = self.config.extrapolation_cap_ns;
        let rel = line.predict_rel(anchor);
        let floor = rel.floor();
        let offset_at_anchor_ns = line.y0.saturating_add(round_ns(floor));
        let knots = [
            oldest.saturating_sub(cap),
            oldest,
            anchor,
            anchor.saturating_add(cap),
        ];
        DeviceClockFit {
            device: self.device,
            source: self.source,
            domain: self.config.domain,
            anchor_device_ns: anchor,
            offset_at_anchor_ns,
            offset_frac_ns: rel - floor,
            drift_ppb: line.slope * 1e9,
            residual_rms_ns: rms(points.iter().map(|p| line.residual(p))),
            points: points.len(),
            oldest_device_ns: oldest,
            extrapolation_cap_ns: cap,
            wander_ppb_per_s: self.config.wander_ppb_per_s,
            bracket_term_ns: knots.map(|k| line.bracket_term(points, k)),
            curve_center_ns: line.x0.wrapping_add_signed(round_ns(line.mean_x)),
            curve: line.curvature(points).unwrap_or([0.0; 3]),
        }
    }
}

fn validate_config(c: &FitConfig) -> Result<(), FitError> {
    if c.min_points < 2 {
        return Err(FitError::BadConfig("min_points must be at least 2"));
    }
    if c.max_points < c.min_points {
        return Err(FitError::BadConfig("max_points must be >= min_points"));
    }
    if c.window_ns == 0 {
        return Err(FitError::BadConfig("window must be positive"));
    }
    if !(c.outlier_sigmas.is_finite() && c.outlier_sigmas > 0.0) {
        return Err(FitError::BadConfig("outlier_sigmas must be positive"));
    }
    if !(c.outlier_floor_ns.is_finite() && c.outlier_floor_ns >= 0.0) {
        return Err(FitError::BadConfig("outlier_floor_ns must be >= 0"));
    }
    if !(c.wander_ppb_per_s.is_finite() && c.wander_ppb_per_s >= 0.0) {
        return Err(FitError::BadConfig("wander_ppb_per_s must be >= 0"));
    }
    if c.reset_after_bursts == 0 {
        return Err(FitError::BadConfig("reset_after_bursts must be positive"));
    }
    Ok(())
}
