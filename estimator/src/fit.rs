//! Per-edge fit: the maximum-margin line between the forward and backward bands (Huygens' SVM).
//!
//! For an edge A→B, `offset(t) = clock_B − clock_A` as a function of A's clock `t`.
//! A pure forward probe (A sends, B receives) gives `rx_B − tx_A = offset + delay_AB ≥ offset`:
//! an **upper** bound. A pure backward probe (B sends, A receives) gives
//! `tx_B − rx_A = offset − delay_BA ≤ offset`: a **lower** bound. Over a window the offset is a
//! line `α + β·(t − epoch)`; the fit is the line that maximises the vertical margin `m` with
//! every forward point at least `m` above it and every backward point at least `m` below it.
//! In 1-D-per-slope form the margin is `g(β) = U(β) − L(β)` with `U(β) = min(y_f − β·x_f)`
//! (support of the forward lower hull) and `L(β) = max(y_b − β·x_b)` (support of the backward
//! upper hull). `g` is concave and piecewise linear with breakpoints at hull edge slopes, so
//! the exact optimum is found by evaluating `g` at the `O(h)` breakpoints (`h` = hull size),
//! after an `O(n log n)` sort and `O(n)` monotone-chain hulls built with exact `i128` cross
//! products. Vertical and geometric margins coincide to 1e-10 at clock drifts below 1e-5.
//!
//! Soft margin: a support point whose removal widens the margin by more than
//! `outlier_gain_ns` (a late TX timestamp sits tens to hundreds of ns inside the forbidden zone
//! while genuine points crowd the band edge) is trimmed, at most `max_outliers` and at most
//! `max_outlier_fraction` of each band; trimming also continues while the bands overlap.
//!
//! Error bound: every line consistent with the (honest) points, widened by `slack` for
//! timestamp quantisation and clock wander, is a possible truth. The bound is the exact largest
//! distance, at the epoch, between the fitted line and any such line (two 2-variable LPs
//! solved on the same hulls), and likewise for the slope. It contains the unobservable path
//! asymmetry: it is never below the margin, i.e. half the best (detrended) pure RTT.
use crate::convert::{count_f64, floor_count, ns_f64, saturate_i64};
use serde::{Deserialize, Serialize};

use clockmesh_time::LocalNs;

use crate::EstimatorError;
use crate::probe::PurePoint;

/// Fit parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FitConfig {
    /// A support point is an outlier when removing it widens the margin by more than this
    /// (default 10 ns, below the 10s–100s ns of a late NIC TX timestamp).
    pub outlier_gain_ns: f64,
    /// At most this many points trimmed per band (default 16).
    pub max_outliers: usize,
    /// At most this fraction of each band trimmed (default 0.02).
    pub max_outlier_fraction: f64,
    /// Timestamp resolution; each constraint of the bound is loosened by it (default 1 ns).
    pub timestamp_resolution_ns: i64,
    /// Allowance for a clock that is not exactly affine inside the window (frequency wander),
    /// added to every constraint of the bound (default 2 ns).
    pub model_slack_ns: f64,
    /// Longest accepted time span of the points (default 60 s).
    pub max_window_ns: i64,
    /// Operator knowledge: the two directions' minimum one-way delays differ
    /// by at most this. The bound's asymmetry part (the margin, ½ the best
    /// pure RTT) is then replaced by half of it. `None` (default): unknown,
    /// the honest ½ RTT stays. Wrong values make the bound lie.
    pub max_path_asymmetry_ns: Option<f64>,
}

impl Default for FitConfig {
    fn default() -> Self {
        Self {
            outlier_gain_ns: 10.0,
            max_outliers: 16,
            max_outlier_fraction: 0.02,
            timestamp_resolution_ns: 1,
            model_slack_ns: 2.0,
            max_window_ns: 60_000_000_000,
            max_path_asymmetry_ns: None,
        }
    }
}

impl FitConfig {
    /// Configuration of the pure hard-margin fit (no trimming).
    pub fn hard_margin() -> Self {
        Self {
            max_outliers: 0,
            ..Self::default()
        }
    }

    fn validate(&self) -> Result<(), EstimatorError> {
        let finite_nonneg = |v: f64| v.is_finite() && v >= 0.0;
        if !finite_nonneg(self.outlier_gain_ns) || !finite_nonneg(self.model_slack_ns) {
            return Err(EstimatorError::Config(
                "outlier_gain_ns and model_slack_ns must be finite and >= 0",
            ));
        }
        if !(0.0..=0.5).contains(&self.max_outlier_fraction) {
            return Err(EstimatorError::Config(
                "max_outlier_fraction must be in 0..=0.5",
            ));
        }
        if self.timestamp_resolution_ns < 0 || self.max_window_ns <= 0 {
            return Err(EstimatorError::Config(
                "timestamp_resolution_ns must be >= 0 and max_window_ns > 0",
            ));
        }
        Ok(())
    }

    fn slack_ns(&self) -> f64 {
        ns_f64(self.timestamp_resolution_ns) + self.model_slack_ns
    }
}

/// Result of one edge fit: `clock_B − clock_A ≈ offset_base_ns + offset_rel_ns + drift·(t − epoch_ns)`
/// for `t` on A's clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeFit {
    /// A-clock time the offset refers to: the latest A-side timestamp of the points.
    pub epoch_ns: i64,
    /// Integer part of the offset at the epoch (exact arithmetic).
    pub offset_base_ns: i64,
    /// Small fractional remainder (|·| well below the window's delay spread).
    pub offset_rel_ns: f64,
    /// d(offset)/dt, dimensionless (multiply by 1e9 for ppb).
    pub drift: f64,
    /// Half the gap between the bands along the fitted line = ½ best detrended pure RTT.
    pub margin_ns: f64,
    /// Best detrended pure RTT, `2·margin_ns`.
    pub min_rtt_ns: f64,
    /// |fitted − true offset| at the epoch, guaranteed if the kept points are honest.
    pub bound_ns: f64,
    /// |fitted − true drift|, same guarantee.
    pub drift_bound: f64,
    /// Pure points used (after trimming).
    pub forward_points: usize,
    pub backward_points: usize,
    /// Points trimmed as outliers (both bands).
    pub trimmed: usize,
    /// Time span covered by the points (ns).
    pub span_ns: i64,
}

impl EdgeFit {
    /// Offset at A-clock time `t`, as (integer part, fraction), ns.
    pub fn offset_at(&self, t: LocalNs) -> (i64, f64) {
        let dt = t.since(LocalNs(self.epoch_ns)).as_f64();
        (self.offset_base_ns, self.offset_rel_ns + self.drift * dt)
    }

    /// Offset at `t` as one f64, ns (loses precision for offsets beyond 2^53 ns).
    pub fn offset_at_f64(&self, t: LocalNs) -> f64 {
        let (base, rel) = self.offset_at(t);
        ns_f64(base) + rel
    }

    /// Error bound at A-clock time `t`, ns: the epoch bound plus the drift bound times the age.
    pub fn bound_at(&self, t: LocalNs) -> f64 {
        let dt = t.since(LocalNs(self.epoch_ns)).abs().as_f64();
        self.bound_ns + self.drift_bound * dt
    }
}

/// Fits one edge and window. `forward`: pure A→B points (tx on A, rx on B); `backward`: pure
/// B→A points (tx on B, rx on A). Errors on empty or one-sided data, points that do not
/// overlap in time, spans beyond `max_window_ns`, absurd values, and bands that still overlap
/// after trimming.
pub fn fit_edge(
    forward: &[PurePoint],
    backward: &[PurePoint],
    cfg: &FitConfig,
) -> Result<EdgeFit, EstimatorError> {
    cfg.validate()?;
    let bands = Bands::new(forward, backward, cfg)?;
    let mut fwd_keep = vec![true; bands.forward.len()];
    let mut bwd_keep = vec![true; bands.backward.len()];
    let budget = |n: usize| {
        let by_fraction = floor_count(cfg.max_outlier_fraction * count_f64(n));
        cfg.max_outliers.min(by_fraction)
    };
    let (fwd_budget, bwd_budget) = (budget(bands.forward.len()), budget(bands.backward.len()));
    let (mut fwd_trimmed, mut bwd_trimmed) = (0, 0);
    let mut fwd_hull = Hull::lower(&bands.forward, &fwd_keep);
    let mut bwd_hull = Hull::lower(&bands.backward, &bwd_keep);
    let mut opt = max_margin(&fwd_hull, &bwd_hull)?;
    loop {
        let mut best: Option<(Side, usize, f64)> = None;
        let sides = [
            (Side::Forward, fwd_trimmed < fwd_budget),
            (Side::Backward, bwd_trimmed < bwd_budget),
        ];
        for (side, allowed) in sides {
            if !allowed {
                continue;
            }
            let (hull, other, pts, keep) = match side {
                Side::Forward => (&fwd_hull, &bwd_hull, &bands.forward, &fwd_keep),
                Side::Backward => (&bwd_hull, &fwd_hull, &bands.backward, &bwd_keep),
            };
            let beta_for_side = side.hull_beta(opt.beta);
            for idx in hull.support_points(beta_for_side) {
                let mut trial_keep = keep.clone();
                trial_keep[idx] = false;
                if trial_keep.iter().all(|k| !k) {
                    continue;
                }
                let trial = Hull::lower(pts, &trial_keep);
                let trial_opt = match side {
                    Side::Forward => max_margin(&trial, other),
                    Side::Backward => max_margin(other, &trial),
                };
                if let Ok(t) = trial_opt {
                    let gain = t.margin() - opt.margin();
                    if best.as_ref().is_none_or(|b| gain > b.2) {
                        best = Some((side, idx, gain));
                    }
                }
            }
        }
        let Some((side, idx, gain)) = best else { break };
        let overlapping = opt.margin() < 0.0;
        if gain <= cfg.outlier_gain_ns && !(overlapping && gain > 0.0) {
            break;
        }
        match side {
            Side::Forward => {
                fwd_keep[idx] = false;
                fwd_trimmed += 1;
                fwd_hull = Hull::lower(&bands.forward, &fwd_keep);
            }
            Side::Backward => {
                bwd_keep[idx] = false;
                bwd_trimmed += 1;
                bwd_hull = Hull::lower(&bands.backward, &bwd_keep);
            }
        }
        opt = max_margin(&fwd_hull, &bwd_hull)?;
    }
    let trimmed = fwd_trimmed + bwd_trimmed;
    let slack = cfg.slack_ns();
    if opt.gap + 2.0 * slack < 0.0 {
        return Err(EstimatorError::BandsOverlap {
            overlap_ns: -opt.gap,
            trimmed,
        });
    }
    let range = feasible_range(&fwd_hull, &bwd_hull, &opt, slack)?;
    let alpha = opt.alpha();
    Ok(EdgeFit {
        epoch_ns: bands.epoch_ns,
        offset_base_ns: bands.y_base,
        offset_rel_ns: alpha,
        drift: opt.beta,
        margin_ns: opt.margin(),
        min_rtt_ns: opt.gap,
        bound_ns: with_known_asymmetry(
            (range.offset_hi - alpha).max(alpha - range.offset_lo),
            opt.margin(),
            cfg.max_path_asymmetry_ns,
        ),
        drift_bound: (range.beta_hi - opt.beta).max(opt.beta - range.beta_lo),
        forward_points: bands.forward.len() - fwd_trimmed,
        backward_points: bands.backward.len() - bwd_trimmed,
        trimmed,
        span_ns: bands.span_ns,
    })
}

/// The bound with its asymmetry part (the margin: any split of the best
/// RTT is possible) replaced by half the operator's asymmetry limit, when
/// that is smaller. The rest of the bound (drift, slack) stays.
fn with_known_asymmetry(bound_ns: f64, margin_ns: f64, max_asymmetry_ns: Option<f64>) -> f64 {
    match max_asymmetry_ns {
        Some(a) if a >= 0.0 => bound_ns.min((bound_ns - margin_ns).max(0.0) + a / 2.0),
        _ => bound_ns,
    }
}

#[derive(Debug, Clone, Copy)]
enum Side {
    Forward,
    Backward,
}

impl Side {
    /// Both bands are stored as lower hulls; the backward band is stored with `y` negated, so
    /// its support at slope β is queried at −β.
    fn hull_beta(self, beta: f64) -> f64 {
        match self {
            Side::Forward => beta,
            Side::Backward => -beta,
        }
    }
}

/// Both bands as integer points relative to the epoch (x) and an integer base (y), sorted by x.
/// The backward band is stored with y negated so that both bands use lower hulls.
struct Bands {
    epoch_ns: i64,
    y_base: i64,
    span_ns: i64,
    forward: Vec<(i64, i64)>,
    backward: Vec<(i64, i64)>,
}

/// Largest |y − y_base| accepted: keeps f64 exact on relative values (2^50 ns ≈ 13 days).
const MAX_REL_NS: i64 = 1 << 50;

impl Bands {
    fn new(
        forward: &[PurePoint],
        backward: &[PurePoint],
        cfg: &FitConfig,
    ) -> Result<Self, EstimatorError> {
        if forward.is_empty() && backward.is_empty() {
            return Err(EstimatorError::Empty("no pure points in either direction"));
        }
        if forward.is_empty() || backward.is_empty() {
            return Err(EstimatorError::OneSided {
                forward: forward.len(),
                backward: backward.len(),
            });
        }
        for p in forward.iter().chain(backward) {
            for (what, value) in [("tx_ns", p.tx_ns), ("rx_ns", p.rx_ns)] {
                if value.unsigned_abs() > crate::probe::MAX_ABS_TIMESTAMP_NS as u64 {
                    return Err(EstimatorError::Absurd { what, value });
                }
            }
        }
        // A-side time and upper/lower bound value of each point.
        let fwd: Vec<(i64, i64)> = forward
            .iter()
            .map(|p| (p.tx_ns, p.rx_ns - p.tx_ns))
            .collect();
        let bwd: Vec<(i64, i64)> = backward
            .iter()
            .map(|p| (p.rx_ns, p.tx_ns - p.rx_ns))
            .collect();
        let all_t = fwd.iter().chain(&bwd).map(|p| p.0);
        let (t_min, t_max) = all_t.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
        let span_ns = t_max - t_min;
        if span_ns > cfg.max_window_ns {
            return Err(EstimatorError::WindowTooLong {
                span_ns,
                max_ns: cfg.max_window_ns,
            });
        }
        let fwd_min = fwd.iter().map(|p| p.1).min().unwrap_or(0);
        let bwd_max = bwd.iter().map(|p| p.1).max().unwrap_or(0);
        let y_base = saturate_i64((i128::from(fwd_min) + i128::from(bwd_max)) / 2);
        let relative =
            |pts: Vec<(i64, i64)>, sign: i64| -> Result<Vec<(i64, i64)>, EstimatorError> {
                let mut out = Vec::with_capacity(pts.len());
                for (t, y) in pts {
                    // |y|, |y_base| ≤ 2^62: the difference needs i128 before the range check.
                    let rel = y as i128 - y_base as i128;
                    if rel.abs() > MAX_REL_NS as i128 {
                        return Err(EstimatorError::Absurd {
                            what: "one-way delay spread within the window",
                            value: saturate_i64(rel),
                        });
                    }
                    out.push((t - t_max, sign * saturate_i64(rel)));
                }
                out.sort_unstable();
                Ok(out)
            };
        Ok(Self {
            epoch_ns: t_max,
            y_base,
            span_ns,
            forward: relative(fwd, 1)?,
            backward: relative(bwd, -1)?,
        })
    }
}

/// Lower convex hull of the kept points (sorted by x), with edge slopes.
#[derive(Debug, Clone)]
struct Hull {
    /// (x, y, index into the band)
    vertices: Vec<(i64, i64, usize)>,
    /// slopes[k] = slope of the edge from vertex k to k+1, increasing.
    slopes: Vec<f64>,
}

impl Hull {
    fn lower(points: &[(i64, i64)], keep: &[bool]) -> Self {
        let mut v: Vec<(i64, i64, usize)> = Vec::new();
        for (idx, &(x, y)) in points.iter().enumerate() {
            if !keep[idx] {
                continue;
            }
            // Same x: the sort put the lowest y first; higher ones can never be on the hull.
            if let Some(last) = v.last()
                && last.0 == x
            {
                continue;
            }
            while v.len() >= 2 && cross(v[v.len() - 2], v[v.len() - 1], (x, y)) <= 0 {
                v.pop();
            }
            v.push((x, y, idx));
        }
        let slopes = v
            .windows(2)
            .map(|w| ns_f64(w[1].1 - w[0].1) / ns_f64(w[1].0 - w[0].0))
            .collect();
        Self {
            vertices: v,
            slopes,
        }
    }

    /// Index of the vertex minimising y − βx.
    fn active(&self, beta: f64) -> usize {
        self.slopes.partition_point(|&s| s < beta)
    }

    /// min over points of (y − βx).
    fn support(&self, beta: f64) -> f64 {
        let (x, y, _) = self.vertices[self.active(beta)];
        ns_f64(y) - beta * ns_f64(x)
    }

    /// Band indices of the points attaining the support at β (one or two vertices).
    fn support_points(&self, beta: f64) -> Vec<usize> {
        let best = self.support(beta);
        let tol = 1e-6 * (1.0 + best.abs());
        let k = self.active(beta);
        let lo = k.saturating_sub(1);
        let hi = (k + 1).min(self.vertices.len() - 1);
        (lo..=hi)
            .map(|i| self.vertices[i])
            .filter(|&(x, y, _)| ns_f64(y) - beta * ns_f64(x) <= best + tol)
            .map(|v| v.2)
            .collect()
    }

    fn x_min(&self) -> i64 {
        self.vertices[0].0
    }

    fn x_max(&self) -> i64 {
        self.vertices[self.vertices.len() - 1].0
    }
}

fn cross(o: (i64, i64, usize), a: (i64, i64, usize), b: (i64, i64)) -> i128 {
    let (ox, oy) = (o.0 as i128, o.1 as i128);
    (a.0 as i128 - ox) * (b.1 as i128 - oy) - (a.1 as i128 - oy) * (b.0 as i128 - ox)
}

/// Optimum of the hard-margin problem.
#[derive(Debug, Clone, Copy)]
struct Optimum {
    beta: f64,
    upper: f64,
    lower: f64,
    /// g(β*) = U − L = 2·margin
    gap: f64,
}

impl Optimum {
    fn margin(&self) -> f64 {
        self.gap / 2.0
    }

    fn alpha(&self) -> f64 {
        (self.upper + self.lower) / 2.0
    }
}

/// U(β) of the forward band and L(β) of the backward band (stored negated).
fn upper_fn(fwd: &Hull, beta: f64) -> f64 {
    fwd.support(beta)
}

fn lower_fn(bwd: &Hull, beta: f64) -> f64 {
    -bwd.support(-beta)
}

fn gap_fn(fwd: &Hull, bwd: &Hull, beta: f64) -> f64 {
    upper_fn(fwd, beta) - lower_fn(bwd, beta)
}

/// All breakpoints of g, sorted and deduplicated.
fn breakpoints(fwd: &Hull, bwd: &Hull) -> Vec<f64> {
    let mut b: Vec<f64> = fwd
        .slopes
        .iter()
        .copied()
        .chain(bwd.slopes.iter().map(|s| -s))
        .collect();
    b.sort_by(f64::total_cmp);
    b.dedup();
    b
}

/// Slope of g to the right of all breakpoints (β → +∞) and to the left (β → −∞).
/// g'(β) = x of the active backward vertex − x of the active forward vertex.
fn tail_slopes(fwd: &Hull, bwd: &Hull) -> (f64, f64) {
    let right = ns_f64(bwd.x_min() - fwd.x_max());
    let left = ns_f64(bwd.x_max() - fwd.x_min());
    (left, right)
}

fn max_margin(fwd: &Hull, bwd: &Hull) -> Result<Optimum, EstimatorError> {
    let (left_slope, right_slope) = tail_slopes(fwd, bwd);
    if left_slope < 0.0 || right_slope > 0.0 {
        return Err(EstimatorError::Degenerate(
            "forward and backward points do not overlap in time; the drift is unbounded",
        ));
    }
    let bps = breakpoints(fwd, bwd);
    if bps.is_empty() {
        return Err(EstimatorError::Degenerate(
            "all points at one instant; need at least two distinct times",
        ));
    }
    let values: Vec<f64> = bps.iter().map(|&b| gap_fn(fwd, bwd, b)).collect();
    let best = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let tol = 1e-9 * (1.0 + best.abs());
    // Concavity makes the maximisers contiguous; a flat top takes its midpoint.
    let first = values.iter().position(|&v| v >= best - tol).unwrap_or(0);
    let last = values
        .iter()
        .rposition(|&v| v >= best - tol)
        .unwrap_or(first);
    let beta = (bps[first] + bps[last]) / 2.0;
    let upper = upper_fn(fwd, beta);
    let lower = lower_fn(bwd, beta);
    Ok(Optimum {
        beta,
        upper,
        lower,
        gap: upper - lower,
    })
}

/// Range of offsets at the epoch and of slopes over all lines consistent with the bands
/// loosened by `slack` on every constraint.
#[derive(Debug, Clone, Copy)]
struct FeasibleRange {
    offset_lo: f64,
    offset_hi: f64,
    beta_lo: f64,
    beta_hi: f64,
}

fn feasible_range(
    fwd: &Hull,
    bwd: &Hull,
    opt: &Optimum,
    slack: f64,
) -> Result<FeasibleRange, EstimatorError> {
    let bps = breakpoints(fwd, bwd);
    let (left_slope, right_slope) = tail_slopes(fwd, bwd);
    let slack_gap = |b: f64| gap_fn(fwd, bwd, b) + 2.0 * slack;
    let beta_hi = slope_limit(&bps, opt.beta, &slack_gap, right_slope, Direction::Right)?;
    let beta_lo = slope_limit(&bps, opt.beta, &slack_gap, left_slope, Direction::Left)?;
    let inside = |b: &&f64| **b > beta_lo && **b < beta_hi;
    // U is concave: its maximum over [lo, hi] is at an endpoint or a forward breakpoint.
    let offset_hi = fwd
        .slopes
        .iter()
        .filter(inside)
        .copied()
        .chain([beta_lo, beta_hi])
        .map(|b| upper_fn(fwd, b))
        .fold(f64::NEG_INFINITY, f64::max)
        + slack;
    // L is convex: its minimum is at an endpoint or a backward breakpoint.
    let offset_lo = bwd
        .slopes
        .iter()
        .map(|s| -s)
        .filter(|b| b > &beta_lo && b < &beta_hi)
        .chain([beta_lo, beta_hi])
        .map(|b| lower_fn(bwd, b))
        .fold(f64::INFINITY, f64::min)
        - slack;
    Ok(FeasibleRange {
        offset_lo,
        offset_hi,
        beta_lo,
        beta_hi,
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Left,
    Right,
}

/// Walks from β* along the breakpoints until the loosened gap turns negative and returns the
/// exact root (g is linear between breakpoints).
fn slope_limit(
    bps: &[f64],
    start: f64,
    slack_gap: &dyn Fn(f64) -> f64,
    tail_slope: f64,
    dir: Direction,
) -> Result<f64, EstimatorError> {
    let mut prev = start;
    let mut prev_val = slack_gap(start);
    let ahead: Box<dyn Iterator<Item = &f64>> = match dir {
        Direction::Right => Box::new(bps.iter().filter(|&&b| b > start)),
        Direction::Left => Box::new(bps.iter().rev().filter(|&&b| b < start)),
    };
    for &b in ahead {
        let val = slack_gap(b);
        if val < 0.0 {
            let t = prev_val / (prev_val - val);
            return Ok(prev + t * (b - prev));
        }
        prev = b;
        prev_val = val;
    }
    if tail_slope == 0.0 {
        return Err(EstimatorError::Degenerate(
            "forward and backward points meet only at one instant; the drift is unbounded",
        ));
    }
    // Tail: g(β) = prev_val + tail_slope·(β − prev) (tail_slope < 0 on the right, > 0 on the left).
    Ok(prev - prev_val / tail_slope)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forward/backward points of a known clock: offset(t) = o + d·t (t on A's clock),
    /// constant delays.
    pub(crate) fn synth(
        n: usize,
        offset: i64,
        drift_ppb: i64,
        delay_f: i64,
        delay_b: i64,
    ) -> (Vec<PurePoint>, Vec<PurePoint>) {
        let off = |t: i64| offset + t * drift_ppb / 1_000_000_000;
        let fwd = (0..n as i64)
            .map(|i| {
                let t = i * 1_000_000;
                PurePoint {
                    seq: i as u64,
                    tx_ns: t,
                    rx_ns: t + delay_f + off(t),
                }
            })
            .collect();
        let bwd = (0..n as i64)
            .map(|i| {
                let t_a = i * 1_000_000 + 500_000;
                PurePoint {
                    seq: i as u64,
                    tx_ns: t_a - delay_b + off(t_a),
                    rx_ns: t_a,
                }
            })
            .collect();
        (fwd, bwd)
    }

    #[test]
    fn noiseless_symmetric_recovers_offset_and_drift_exactly() {
        // drift 0 ppb keeps integer points exact; offset 1234 ns, delays 5 µs both ways.
        let (f, b) = synth(100, 1_234, 0, 5_000, 5_000);
        let fit = fit_edge(&f, &b, &FitConfig::default()).unwrap();
        let (base, rel) = fit.offset_at(LocalNs(fit.epoch_ns));
        assert!((base as f64 + rel - 1_234.0).abs() < 1e-6, "{fit:?}");
        assert!(fit.drift.abs() < 1e-15);
        assert!((fit.margin_ns - 5_000.0).abs() < 1e-6);
        assert_eq!(fit.trimmed, 0);
        assert!(fit.bound_ns >= fit.margin_ns);
    }

    #[test]
    fn noiseless_with_drift_recovers_drift() {
        let (f, b) = synth(200, -7_000, 10_000, 3_000, 3_000); // 10 ppm
        let fit = fit_edge(&f, &b, &FitConfig::default()).unwrap();
        assert!(
            (fit.drift * 1e9 - 10_000.0).abs() < 2.0,
            "drift {}",
            fit.drift * 1e9
        );
        let truth = -7_000.0 + fit.epoch_ns as f64 * 1e-5;
        assert!((fit.offset_at_f64(LocalNs(fit.epoch_ns)) - truth).abs() < 2.0);
    }

    #[test]
    fn late_tx_outlier_does_not_move_fit() {
        let (mut f, b) = synth(500, 100, 0, 2_000, 2_000);
        let clean = fit_edge(&f, &b, &FitConfig::default()).unwrap();
        // A forward TX stamp 300 ns late lowers rx − tx by 300 ns: inside the forbidden zone's
        // approach, 150 ns shift of a hard-margin fit.
        f[250].tx_ns += 300;
        let hard = fit_edge(&f, &b, &FitConfig::hard_margin()).unwrap();
        let soft = fit_edge(&f, &b, &FitConfig::default()).unwrap();
        let at = |fit: &EdgeFit| fit.offset_at_f64(LocalNs(clean.epoch_ns));
        assert!(
            (at(&hard) - at(&clean)).abs() > 100.0,
            "hard margin must be pulled"
        );
        assert!(
            (at(&soft) - at(&clean)).abs() < 1e-6,
            "soft margin must ignore it"
        );
        assert_eq!(soft.trimmed, 1);
    }

    #[test]
    fn one_sided_and_degenerate_inputs_are_errors() {
        let (f, b) = synth(10, 0, 0, 1_000, 1_000);
        let cfg = FitConfig::default();
        assert!(matches!(
            fit_edge(&f, &[], &cfg),
            Err(EstimatorError::OneSided {
                forward: 10,
                backward: 0
            })
        ));
        assert!(matches!(
            fit_edge(&[], &[], &cfg),
            Err(EstimatorError::Empty(_))
        ));
        // Backward points all after forward points: no overlap in time.
        let late_b: Vec<PurePoint> = b
            .iter()
            .map(|p| PurePoint {
                rx_ns: p.rx_ns + 1_000_000_000,
                tx_ns: p.tx_ns + 1_000_000_000,
                ..*p
            })
            .collect();
        assert!(matches!(
            fit_edge(&f, &late_b, &cfg),
            Err(EstimatorError::Degenerate(_))
        ));
        assert!(matches!(
            fit_edge(&f[..1], &b[..1], &cfg),
            Err(EstimatorError::Degenerate(_))
        ));
    }

    #[test]
    fn overlapping_bands_are_an_error() {
        // Backward points above forward points everywhere: no affine clock explains them.
        let (f, mut b) = synth(50, 0, 0, 1_000, 1_000);
        for p in &mut b {
            p.tx_ns += 5_000;
        }
        assert!(matches!(
            fit_edge(&f, &b, &FitConfig::default()),
            Err(EstimatorError::BandsOverlap { .. })
        ));
    }

    #[test]
    fn too_long_window_is_an_error() {
        let (mut f, b) = synth(10, 0, 0, 1_000, 1_000);
        f[0].tx_ns -= 100_000_000_000;
        f[0].rx_ns -= 100_000_000_000;
        assert!(matches!(
            fit_edge(&f, &b, &FitConfig::default()),
            Err(EstimatorError::WindowTooLong { .. })
        ));
    }

    #[test]
    fn extreme_delay_spread_is_an_error_not_an_overflow() {
        let lim = crate::probe::MAX_ABS_TIMESTAMP_NS;
        // Forward y spans [−2^62, 2^62] and the backward maximum is −2^62: y − base = 2^63.
        let f = [
            PurePoint {
                seq: 0,
                tx_ns: 0,
                rx_ns: lim,
            },
            PurePoint {
                seq: 1,
                tx_ns: 5,
                rx_ns: -lim,
            },
        ];
        let b = [PurePoint {
            seq: 0,
            tx_ns: -lim,
            rx_ns: 3,
        }];
        // Before the i128 fix this overflowed (a panic in debug builds).
        let r = fit_edge(&f, &b, &FitConfig::default());
        assert!(matches!(r, Err(EstimatorError::Absurd { .. })), "{r:?}");
    }

    #[test]
    fn huge_clock_offsets_keep_exactness() {
        // Clocks 1.7e18 ns apart (PHC from boot vs TAI): f64 of the raw values would lose ~200 ns.
        let (f, b) = synth(50, 1_700_000_000_123_456_789, 0, 4_000, 4_000);
        let fit = fit_edge(&f, &b, &FitConfig::default()).unwrap();
        let (base, rel) = fit.offset_at(LocalNs(fit.epoch_ns));
        assert_eq!(base + rel.round() as i64, 1_700_000_000_123_456_789);
    }

    #[test]
    fn a_known_asymmetry_limit_replaces_the_half_rtt_in_the_bound() {
        let (f, b) = synth(100, 1_234, 0, 500, 500);
        let honest = fit_edge(&f, &b, &FitConfig::default()).unwrap();
        assert!(honest.bound_ns >= 500.0, "{honest:?}");
        let cfg = FitConfig {
            max_path_asymmetry_ns: Some(100.0),
            ..FitConfig::default()
        };
        let known = fit_edge(&f, &b, &cfg).unwrap();
        let rest = honest.bound_ns - honest.margin_ns;
        assert!((known.bound_ns - (rest + 50.0)).abs() < 1e-6, "{known:?}");
        assert_eq!(
            known.offset_rel_ns, honest.offset_rel_ns,
            "only the bound changes"
        );
        let loose = FitConfig {
            max_path_asymmetry_ns: Some(1e9),
            ..FitConfig::default()
        };
        assert_eq!(fit_edge(&f, &b, &loose).unwrap().bound_ns, honest.bound_ns);
    }
}
