//! Scores: |error| quantiles, drift error, bound coverage, bound width, timings.
use clockmesh_estimator::EdgeOutcome;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::scenario::Scenario;

/// p50 / p99 / max of a sample (0 when empty).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Quantiles {
    pub fn of(values: &mut [f64]) -> Self {
        let [p50, p99, max] = quantiles(values, [0.5, 0.99, 1.0]);
        Self { p50, p99, max }
    }
}

/// The `ps` quantiles of `values` (nearest rank; sorts them; 0 when empty).
pub(crate) fn quantiles<const N: usize>(values: &mut [f64], ps: [f64; N]) -> [f64; N] {
    if values.is_empty() {
        return [0.0; N];
    }
    values.sort_by(f64::total_cmp);
    ps.map(|p| values[((values.len() - 1) as f64 * p).round() as usize])
}

/// Scores of one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowReport {
    pub window: u32,
    pub node_windows: usize,
    pub abs_error_ns: Quantiles,
    pub abs_drift_error_ppb: Quantiles,
    pub coverage: f64,
    pub median_bound_ns: f64,
    pub edges_fitted: usize,
    pub edges_failed: usize,
    pub fit_us_mean: f64,
    pub solve_ms: f64,
    pub cg_iterations: (usize, usize),
    pub components: usize,
    pub holdover: bool,
    /// No edge was fitted in this window, so nothing was solved: its nodes
    /// got no new estimate.
    #[serde(default)]
    pub unsolved: bool,
}

/// Scores over all windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Node-windows scored (every node except the anchor, every window).
    pub node_windows: usize,
    pub abs_error_ns: Quantiles,
    pub abs_drift_error_ppb: Quantiles,
    /// Fraction of node-windows whose true error lies inside the bound.
    pub coverage: f64,
    pub violations: usize,
    /// Same, for the previous window's estimate extrapolated one window ahead (drift × age).
    pub aged_coverage: f64,
    pub aged_node_windows: usize,
    pub median_bound_ns: f64,
    pub median_abs_error_ns: f64,
    /// median bound / median |error|.
    pub bound_to_error_ratio: f64,
    /// Median of the asymmetry part of the bound (Σ ½ best pure RTT along the bound's path).
    pub median_asymmetry_term_ns: f64,
    /// Median of the rest of the bound (fit range beyond the margin, residuals, slack).
    pub median_non_asymmetry_part_ns: f64,
    /// Diagnostic only, not a guarantee: fraction of node-windows inside the bound with the
    /// asymmetry part removed (how much the unobservable-asymmetry allowance is needed here).
    pub coverage_without_asymmetry_term: f64,
    pub edges_fitted: usize,
    pub edges_failed: usize,
    /// Why edges failed: error message kind → count.
    pub edge_failures: BTreeMap<String, usize>,
    /// Pure pairs / complete pairs.
    pub pure_fraction: f64,
    pub mean_pure_points_per_direction: f64,
    pub points_trimmed: usize,
    /// Pairing + fit time per edge (µs).
    pub fit_us: Quantiles,
    pub fit_us_mean: f64,
    /// Network solve time per window (ms).
    pub solve_ms: Quantiles,
    /// Windows in which no edge was fitted (nothing to solve).
    #[serde(default)]
    pub windows_unsolved: usize,
}

/// Full simulator output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub scenario: String,
    pub nodes: u32,
    pub degree: u32,
    pub edges: usize,
    pub windows: Vec<WindowReport>,
    pub overall: Summary,
}

pub(crate) struct WindowCollector {
    window: u32,
    errors: Vec<f64>,
    drift_errors: Vec<f64>,
    bounds: Vec<f64>,
    asym: Vec<f64>,
    covered: usize,
    covered_without_asym: usize,
    aged: Vec<bool>,
    pub fit_ns: Vec<f64>,
    pub solve_ns: f64,
    pub iterations: (usize, usize),
    pub components: usize,
    pub holdover: bool,
    /// No edge was fitted: the window was not solved.
    pub unsolved: bool,
    fitted: usize,
    failures: BTreeMap<String, usize>,
    pure: usize,
    complete: usize,
    trimmed: usize,
}

impl WindowCollector {
    pub fn new(window: u32) -> Self {
        Self {
            window,
            errors: Vec::new(),
            drift_errors: Vec::new(),
            bounds: Vec::new(),
            asym: Vec::new(),
            covered: 0,
            covered_without_asym: 0,
            aged: Vec::new(),
            fit_ns: Vec::new(),
            solve_ns: 0.0,
            iterations: (0, 0),
            components: 0,
            holdover: false,
            unsolved: false,
            fitted: 0,
            failures: BTreeMap::new(),
            pure: 0,
            complete: 0,
            trimmed: 0,
        }
    }

    pub fn record_edge(&mut self, o: &EdgeOutcome) {
        for st in [o.forward, o.backward] {
            self.pure += st.pure;
            self.complete += st.pure + st.impure + st.spacing_rejected;
        }
        match &o.fit {
            Ok(f) => {
                self.fitted += 1;
                self.trimmed += f.trimmed;
            }
            Err(e) => {
                let kind = format!("{e:?}");
                let kind = kind
                    .split(['(', ' ', '{'])
                    .next()
                    .unwrap_or("?")
                    .to_string();
                *self.failures.entry(kind).or_default() += 1;
            }
        }
    }

    pub fn record_node(&mut self, err: f64, drift_err_ppb: f64, bound: f64, asym: f64) {
        if err.abs() <= bound {
            self.covered += 1;
        }
        if err.abs() <= bound - asym {
            self.covered_without_asym += 1;
        }
        self.errors.push(err.abs());
        self.drift_errors.push(drift_err_ppb.abs());
        self.bounds.push(bound);
        self.asym.push(asym);
    }

    pub fn record_aged(&mut self, covered: bool) {
        self.aged.push(covered);
    }
}

#[derive(Default)]
pub(crate) struct Collector {
    windows: Vec<WindowReport>,
    errors: Vec<f64>,
    drift_errors: Vec<f64>,
    bounds: Vec<f64>,
    bounds_raw: Vec<f64>,
    asym: Vec<f64>,
    covered: usize,
    covered_without_asym: usize,
    aged_total: usize,
    aged_covered: usize,
    fit_ns: Vec<f64>,
    solve_ns: Vec<f64>,
    fitted: usize,
    failures: BTreeMap<String, usize>,
    pure: usize,
    complete: usize,
    trimmed: usize,
    directions: usize,
    windows_unsolved: usize,
}

fn median(v: &mut [f64]) -> f64 {
    Quantiles::of(v).p50
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

impl Collector {
    pub fn absorb(&mut self, w: &WindowCollector) {
        let failed: usize = w.failures.values().sum();
        self.windows.push(WindowReport {
            window: w.window,
            node_windows: w.errors.len(),
            abs_error_ns: Quantiles::of(&mut w.errors.clone()),
            abs_drift_error_ppb: Quantiles::of(&mut w.drift_errors.clone()),
            coverage: ratio(w.covered, w.errors.len()),
            median_bound_ns: median(&mut w.bounds.clone()),
            edges_fitted: w.fitted,
            edges_failed: failed,
            fit_us_mean: mean(&w.fit_ns) / 1e3,
            solve_ms: w.solve_ns / 1e6,
            cg_iterations: w.iterations,
            components: w.components,
            holdover: w.holdover,
            unsolved: w.unsolved,
        });
        self.windows_unsolved += usize::from(w.unsolved);
        self.errors.extend(&w.errors);
        self.drift_errors.extend(&w.drift_errors);
        self.bounds.extend(&w.bounds);
        self.bounds_raw.extend(&w.bounds);
        self.asym.extend(&w.asym);
        self.covered += w.covered;
        self.covered_without_asym += w.covered_without_asym;
        self.aged_total += w.aged.len();
        self.aged_covered += w.aged.iter().filter(|c| **c).count();
        self.fit_ns.extend(&w.fit_ns);
        self.solve_ns.push(w.solve_ns);
        self.fitted += w.fitted;
        for (k, v) in &w.failures {
            *self.failures.entry(k.clone()).or_default() += v;
        }
        self.pure += w.pure;
        self.complete += w.complete;
        self.trimmed += w.trimmed;
        self.directions += 2 * w.fit_ns.len();
    }

    pub fn report(mut self, s: &Scenario, edges: usize) -> Report {
        let median_bound = median(&mut self.bounds);
        let median_err = median(&mut self.errors.clone());
        let n = self.errors.len();
        let overall = Summary {
            node_windows: n,
            abs_error_ns: Quantiles::of(&mut self.errors),
            abs_drift_error_ppb: Quantiles::of(&mut self.drift_errors),
            coverage: ratio(self.covered, n),
            violations: n - self.covered,
            aged_coverage: ratio(self.aged_covered, self.aged_total),
            aged_node_windows: self.aged_total,
            median_bound_ns: median_bound,
            median_abs_error_ns: median_err,
            bound_to_error_ratio: if median_err > 0.0 {
                median_bound / median_err
            } else {
                f64::INFINITY
            },
            median_asymmetry_term_ns: median(&mut self.asym.clone()),
            median_non_asymmetry_part_ns: median(
                &mut self
                    .bounds_raw
                    .iter()
                    .zip(&self.asym)
                    .map(|(b, a)| b - a)
                    .collect::<Vec<_>>(),
            ),
            coverage_without_asymmetry_term: ratio(self.covered_without_asym, n),
            edges_fitted: self.fitted,
            edges_failed: self.failures.values().sum(),
            edge_failures: self.failures,
            pure_fraction: ratio(self.pure, self.complete),
            mean_pure_points_per_direction: if self.directions > 0 {
                self.pure as f64 / self.directions as f64
            } else {
                0.0
            },
            points_trimmed: self.trimmed,
            fit_us_mean: mean(&self.fit_ns) / 1e3,
            fit_us: Quantiles::of(&mut self.fit_ns.iter().map(|v| v / 1e3).collect::<Vec<_>>()),
            solve_ms: Quantiles::of(&mut self.solve_ns.iter().map(|v| v / 1e6).collect::<Vec<_>>()),
            windows_unsolved: self.windows_unsolved,
        };
        Report {
            scenario: s.name.clone(),
            nodes: s.nodes,
            degree: s.degree,
            edges,
            windows: self.windows,
            overall,
        }
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 1.0 } else { a as f64 / b as f64 }
}

impl Report {
    /// Human-readable summary (and one line per window if asked).
    pub fn table(&self, per_window: bool) -> String {
        let r = self;
        use std::fmt::Write;
        let o = &r.overall;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "scenario {}: {} nodes, K={}, {} edges, {} windows",
            r.scenario,
            r.nodes,
            r.degree,
            r.edges,
            r.windows.len()
        );
        if per_window {
            let _ = writeln!(
                s,
                "{:>6} {:>9} {:>9} {:>9} {:>11} {:>9} {:>10} {:>8} {:>8}",
                "window",
                "p50 ns",
                "p99 ns",
                "max ns",
                "drift p99",
                "coverage",
                "bound p50",
                "fit µs",
                "solve ms"
            );
            for w in &r.windows {
                let _ = writeln!(
                    s,
                    "{:>6} {:>9.2} {:>9.2} {:>9.2} {:>11.2} {:>9.5} {:>10.1} {:>8.1} {:>8.2}{}",
                    w.window,
                    w.abs_error_ns.p50,
                    w.abs_error_ns.p99,
                    w.abs_error_ns.max,
                    w.abs_drift_error_ppb.p99,
                    w.coverage,
                    w.median_bound_ns,
                    w.fit_us_mean,
                    w.solve_ms,
                    if w.unsolved {
                        "  no fitted edge: not solved"
                    } else if w.holdover {
                        "  holdover"
                    } else {
                        ""
                    }
                );
            }
        }
        let q = |q: &Quantiles| format!("p50 {:.2}  p99 {:.2}  max {:.2}", q.p50, q.p99, q.max);
        let _ = writeln!(s, "node-windows      {}", o.node_windows);
        let _ = writeln!(s, "|offset error| ns {}", q(&o.abs_error_ns));
        let _ = writeln!(s, "|drift error| ppb {}", q(&o.abs_drift_error_ppb));
        let _ = writeln!(
            s,
            "bound coverage    {:.6} ({} violations); aged one window: {:.6} of {}",
            o.coverage, o.violations, o.aged_coverage, o.aged_node_windows
        );
        let _ = writeln!(
            s,
            "bound             median {:.1} ns (asymmetry part {:.1} ns), median |error| {:.2} ns, ratio {:.1}",
            o.median_bound_ns,
            o.median_asymmetry_term_ns,
            o.median_abs_error_ns,
            o.bound_to_error_ratio
        );
        let _ = writeln!(
            s,
            "bound minus asym  median {:.1} ns; it alone would cover {:.6} (diagnostic, not a guarantee)",
            o.median_non_asymmetry_part_ns, o.coverage_without_asymmetry_term
        );
        let _ = writeln!(
            s,
            "edges             {} fitted, {} failed {:?}; pure fraction {:.3}, {:.1} pure points per direction, {} trimmed",
            o.edges_fitted,
            o.edges_failed,
            o.edge_failures,
            o.pure_fraction,
            o.mean_pure_points_per_direction,
            o.points_trimmed
        );
        let _ = writeln!(
            s,
            "fit per edge µs   mean {:.1}  {}",
            o.fit_us_mean,
            q(&o.fit_us)
        );
        let _ = writeln!(s, "solve per window  ms {}", q(&o.solve_ms));
        if o.windows_unsolved > 0 {
            let _ = writeln!(
                s,
                "unsolved windows  {} of {} had no fitted edge (see edge failures above)",
                o.windows_unsolved,
                r.windows.len()
            );
        }
        s
    }
}
