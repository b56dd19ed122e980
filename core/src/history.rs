//! Each out-edge's fit over a history of windows, its length chosen from the
//! data.
//!
//! One window holds few pairs at the shipped cadence (about 40 per
//! direction in 4 s); with software stamps the minimum delays of so few
//! samples are noisy, and so is a fit that stands between them. A longer
//! span sees more of the fast packets — but only while both clocks stay
//! affine over it. So the node keeps the raw probes of the last
//! [`MAX_WINDOWS`] windows and fits the last 1, 2, 4, 8, 16 and 32 of them. It keeps
//! the longest fit that agrees with every shorter one: their offsets at the
//! newest point differ by less than the sum of their bounds. A clock whose
//! frequency moved inside the span breaks that agreement and shortens the
//! history; a steady one lets it grow (the choice chrony makes with its runs
//! test, here made with the fits' own honest bounds).
//!
//! The agreement test cannot see frequency wander: the honest bounds of a
//! fit (half the best RTT plus the slopes that RTT allows) are far wider
//! than the tens of ns a wandering clock bends the line. So each class of
//! stamps has its own longest span ([`StampClass::max_history_windows`]):
//! 2 s with NIC stamps, whose pairs pin the line within it; 32 s with
//! software stamps, whose noise needs the long span (its tighter drift
//! bound also makes holdover last; on a fast-wandering clock 16 s would do
//! better: docs/estimator.md). Both are times, not window counts, so a
//! shorter window brings results more often from as many pairs.
//!
//! The bound stays honest over the longer span: each fit's model slack
//! grows with its span by the frequency wander the estimator assumes
//! (`holdover_wander_ppb`): a frequency change of Δf inside a span T moves
//! the clock off the best affine line by at most Δf·T/8.

use std::collections::VecDeque;

use clockmesh_estimator::{EdgeFit, EdgeOutcome, EdgeProbes, EstimatorConfig, estimate_edge};

use crate::settings::StampClass;

/// Windows of raw probes kept per out-edge (32 s at the shipped 1 s
/// windows): the longest span of any class of stamps.
pub const MAX_WINDOWS: usize = 32;
/// Spans tried, in windows, shortest first.
const SPANS: [usize; 6] = [1, 2, 4, 8, 16, 32];

/// The raw probes of one out-edge's recent windows, newest last.
#[derive(Debug, Default)]
pub struct EdgeHistory {
    windows: VecDeque<(EdgeProbes, StampClass)>,
    /// The window last pushed with [`EdgeHistory::push_window`].
    newest: Option<u64>,
}

/// The chosen fit and how many windows it spans.
pub struct HistoryFit {
    pub outcome: EdgeOutcome,
    pub windows: usize,
    /// The stamps of the span (its worst window's), which set its purity.
    pub stamps: StampClass,
}

impl EdgeHistory {
    /// Adds a window's probes, dropping the oldest beyond [`MAX_WINDOWS`].
    pub fn push(&mut self, probes: EdgeProbes, stamps: StampClass) {
        self.windows.push_back((probes, stamps));
        while self.windows.len() > MAX_WINDOWS {
            self.windows.pop_front();
        }
    }

    /// Adds window `k`'s probes (see [`EdgeHistory::push`]).
    pub fn push_window(&mut self, k: u64, probes: EdgeProbes, stamps: StampClass) {
        self.push(probes, stamps);
        self.newest = Some(k);
    }

    /// Whether window `k` is more than [`MAX_WINDOWS`] past the newest
    /// window pushed: a peer gone that long has nothing left to add.
    pub fn is_outlived_by(&self, k: u64) -> bool {
        self.newest
            .is_none_or(|newest| k.saturating_sub(newest) >= MAX_WINDOWS as u64)
    }

    /// The longest span whose fit agrees with every shorter one; `None`
    /// only before the first window. The one-window span is always tried,
    /// so a failed fit is reported when no span fits. Windows are
    /// `window_ns` long.
    pub fn fit(&self, cfg: &EstimatorConfig, window_ns: i64) -> Option<HistoryFit> {
        let mut chosen: Option<HistoryFit> = None;
        let mut accepted: Vec<EdgeFit> = Vec::new();
        // The newest window's stamps set how long a history is worth it.
        let longest = self.windows.back().map_or(MAX_WINDOWS, |(_, class)| {
            class.max_history_windows(window_ns)
        });
        let spans = SPANS
            .iter()
            .filter(|&&s| s <= self.windows.len() && s <= longest);
        for &span in spans {
            let (outcome, stamps) = self.fit_span(span, cfg);
            let Ok(fit) = &outcome.fit else {
                if chosen.is_none() {
                    chosen = Some(HistoryFit {
                        outcome,
                        windows: span,
                        stamps,
                    });
                }
                continue;
            };
            if !accepted.iter().all(|short| agree(fit, short)) {
                break; // the clocks were not affine over this span
            }
            if self.path_changed(span, fit, stamps, window_ns) {
                break; // the older windows saw another path
            }
            accepted.push(fit.clone());
            chosen = Some(HistoryFit {
                outcome,
                windows: span,
                stamps,
            });
        }
        chosen
    }

    /// Whether the newest probes' best round trip, measured along the
    /// span's fitted line, sits so far from the best of the span's older
    /// windows that those saw another path (a detour added or removed).
    /// The fit cannot tell: it keeps the fastest packets of either path,
    /// and the agreement test allows the asymmetry both fits share. The
    /// newest probes are the newest windows covering the class's
    /// [`StampClass::path_judged_ns`]: the best of fewer pairs would wander
    /// by more than the cut.
    fn path_changed(&self, span: usize, fit: &EdgeFit, stamps: StampClass, window_ns: i64) -> bool {
        let newest_windows = stamps.path_judged_windows(window_ns);
        if span <= newest_windows {
            return false;
        }
        // The best round trip of `count` windows from the `first`.
        let best = |first: usize, count: usize| {
            self.windows
                .iter()
                .skip(first)
                .take(count)
                .filter_map(|(w, _)| best_round_trip(w, fit))
                .fold(f64::INFINITY, f64::min)
        };
        let newest_first = self.windows.len() - newest_windows;
        let older = best(self.windows.len() - span, span - newest_windows);
        let newest = best(newest_first, newest_windows);
        newest.is_finite() && older.is_finite() && (newest - older).abs() > stamps.path_change_ns()
    }

    fn fit_span(&self, span: usize, cfg: &EstimatorConfig) -> (EdgeOutcome, StampClass) {
        let mut merged = EdgeProbes {
            from: self.windows[0].0.from,
            to: self.windows[0].0.to,
            forward: Vec::new(),
            backward: Vec::new(),
        };
        // The span's worst stamps set its purity.
        let mut stamps = StampClass::Nic;
        for (w, class) in self.windows.iter().skip(self.windows.len() - span) {
            merged.forward.extend_from_slice(&w.forward);
            merged.backward.extend_from_slice(&w.backward);
            stamps = stamps.max(*class);
        }
        let span_ns = time_span(&merged);
        let mut fit_cfg = cfg.fit.clone();
        fit_cfg.model_slack_ns += cfg.holdover_wander_ppb * 1e-9 * span_ns / 8.0;
        // The class's tolerance, as `settings::estimator_config_for` sets it.
        let mut purity = cfg.purity.clone();
        purity.tolerance_ns = stamps.purity_tolerance_ns();
        (estimate_edge(&merged, &purity, &fit_cfg), stamps)
    }
}

/// Whether two fits' offsets at the shorter one's epoch are within the sum
/// of their bounds there.
fn agree(long: &EdgeFit, short: &EdgeFit) -> bool {
    let t = short.epoch_ns;
    let (lb, lf) = long.offset_at(t);
    let (sb, sf) = short.offset_at(t);
    let gap = (lb - sb) as f64 + (lf - sf);
    let age = t.saturating_sub(long.epoch_ns).unsigned_abs() as f64;
    gap.abs() <= long.bound_ns + long.drift_bound * age + short.bound_ns
}

/// The smallest forward plus the smallest backward delay of one window's
/// probes, each taken against `fit`'s line (so the clocks' offset and
/// drift cancel); `None` without probes both ways.
fn best_round_trip(w: &EdgeProbes, fit: &EdgeFit) -> Option<f64> {
    // Offsets are on the `from` clock's time: TX forward, RX backward.
    let forward = w.forward.iter().map(|p| {
        let (base, rel) = fit.offset_at(p.tx_ns);
        (p.rx_ns - p.tx_ns - base) as f64 - rel
    });
    let backward = w.backward.iter().map(|p| {
        let (base, rel) = fit.offset_at(p.rx_ns);
        (p.rx_ns - p.tx_ns + base) as f64 + rel
    });
    Some(forward.reduce(f64::min)? + backward.reduce(f64::min)?)
}

/// Time covered by the probes (ns, on the `from` clock).
fn time_span(p: &EdgeProbes) -> f64 {
    let stamps = p
        .forward
        .iter()
        .map(|t| t.tx_ns)
        .chain(p.backward.iter().map(|t| t.rx_ns));
    let (lo, hi) = stamps.fold((i64::MAX, i64::MIN), |(lo, hi), t| (lo.min(t), hi.max(t)));
    if lo > hi { 0.0 } else { (hi - lo) as f64 }
}

#[cfg(test)]
mod tests {
    use clockmesh_estimator::ProbeTimestamps;

    use super::*;

    /// Probes of one window `w` of a link whose `to` clock is ahead by
    /// `offset(t)`; one-way delay 5 µs plus a per-probe jitter.
    fn window(w: i64, offset: impl Fn(i64) -> i64) -> EdgeProbes {
        window_via(w, offset, 0)
    }

    /// The tests' windows: 4 s, 40 pairs each way.
    const W_NS: i64 = 4_000_000_000;

    /// [`window`] with `detour_ns` more one-way delay forward (an extra hop).
    fn window_via(w: i64, offset: impl Fn(i64) -> i64, detour_ns: i64) -> EdgeProbes {
        window_of(W_NS, w, offset, detour_ns)
    }

    /// Window `w` of `len_ns`, a pair every 100 ms.
    fn window_of(len_ns: i64, w: i64, offset: impl Fn(i64) -> i64, detour_ns: i64) -> EdgeProbes {
        let base = 1_700_000_000_000_000_000i64 + w * len_ns;
        let pairs = len_ns / 100_000_000;
        let mut forward = Vec::new();
        let mut backward = Vec::new();
        for k in 0..pairs {
            for i in 0..2u8 {
                let t = base + k * 100_000_000 + i64::from(i) * 100_000;
                let jitter = (k * 7919 + i64::from(i) * 31) % 3_000;
                let seq = (w * pairs + k) as u64;
                forward.push(ProbeTimestamps {
                    seq,
                    pair_index: i,
                    tx_ns: t,
                    rx_ns: t + 5_000 + detour_ns + jitter + offset(t),
                });
                let tb = t + 50_000_000;
                backward.push(ProbeTimestamps {
                    seq,
                    pair_index: i,
                    tx_ns: tb + offset(tb),
                    rx_ns: tb + 5_000 + jitter,
                });
            }
        }
        EdgeProbes {
            from: 1,
            to: 2,
            forward,
            backward,
        }
    }

    fn cfg() -> EstimatorConfig {
        crate::settings::estimator_config(&crate::settings::Settings::default())
    }

    #[test]
    fn a_peer_s_history_outlives_its_absence_for_max_windows() {
        let mut h = EdgeHistory::default();
        assert!(h.is_outlived_by(0), "nothing pushed: nothing to keep");
        h.push_window(10, window(10, |_| 1_000), StampClass::Software);
        assert!(!h.is_outlived_by(10 + MAX_WINDOWS as u64 - 1));
        assert!(h.is_outlived_by(10 + MAX_WINDOWS as u64));
    }

    /// Software stamps: 32 s of history whatever the window, as far as
    /// the windows kept reach.
    #[test]
    fn a_steady_clock_uses_the_whole_history() {
        for (len_ns, windows) in [(4_000_000_000, 8), (2_000_000_000, 16), (1_000_000_000, 32)] {
            let mut h = EdgeHistory::default();
            for w in 0..MAX_WINDOWS as i64 + 2 {
                h.push(window_of(len_ns, w, |_| 1_000, 0), StampClass::Software);
            }
            let fit = h.fit(&cfg(), len_ns).unwrap();
            assert_eq!(fit.windows, windows, "{len_ns} ns windows");
            let f = fit.outcome.fit.unwrap();
            let (base, frac) = f.offset_at(f.epoch_ns);
            assert!(((base as f64 + frac) - 1_000.0).abs() <= f.bound_ns);
        }
    }

    #[test]
    fn a_frequency_step_shortens_the_history() {
        let mut h = EdgeHistory::default();
        let step = 1_700_000_000_000_000_000i64 + 6 * 4_000_000_000;
        // 50 ppm faster from window 6 on: not affine over 8 windows.
        let offset = move |t: i64| if t < step { 0 } else { (t - step) / 20_000 };
        for w in 0..8 {
            h.push(window(w, offset), StampClass::Software);
        }
        let fit = h.fit(&cfg(), W_NS).unwrap();
        assert!(fit.windows <= 2, "{} windows", fit.windows);
        let f = fit.outcome.fit.unwrap();
        let (base, frac) = f.offset_at(f.epoch_ns);
        let truth = offset(f.epoch_ns) as f64;
        assert!(((base as f64 + frac) - truth).abs() <= f.bound_ns, "{f:?}");
    }

    /// A detour on one direction (an asymmetric route) moves the offset by
    /// half of it: windows on the old path must not be fitted with the new.
    #[test]
    fn a_changed_path_cuts_the_history() {
        for (before, after) in [(0, 800), (800, 0)] {
            let mut h = EdgeHistory::default();
            for w in 0..MAX_WINDOWS as i64 - 1 {
                h.push(window_via(w, |_| 1_000, before), StampClass::Software);
            }
            let fit = h.fit(&cfg(), W_NS).unwrap();
            assert!(fit.windows > 1, "a steady path: a span of several windows");
            h.push(
                window_via(MAX_WINDOWS as i64 - 1, |_| 1_000, after),
                StampClass::Software,
            );
            let chosen = h.fit(&cfg(), W_NS).unwrap();
            let f = chosen.outcome.fit.unwrap();
            let (base, frac) = f.offset_at(f.epoch_ns);
            // The newest window's own bias: half its detour, which no
            // endpoint can see; anything beyond is the older path's.
            let error = base as f64 + frac - 1_000.0 - after as f64 / 2.0;
            eprintln!(
                "{before} -> {after}: {} windows, error {error:.0} ns",
                chosen.windows
            );
            assert_eq!(chosen.windows, 1, "{before} -> {after} ns detour");
            assert!(error.abs() < 100.0, "{before} -> {after}: {error} ns");
        }
    }

    /// A detour that came and went inside the span: the newest window is
    /// back on the old path and so are the oldest, so the path test sees no
    /// change and the span stays long. That costs nothing: the detour only
    /// slows one direction, and the fit's envelope is bound by the fastest
    /// packets, those of the path around it.
    #[test]
    fn a_detour_inside_the_span_leaves_the_fit_on_the_faster_path() {
        let mut h = EdgeHistory::default();
        let span = StampClass::Software.max_history_windows(W_NS);
        for w in 0..span as i64 {
            let detour = if (2..6).contains(&w) { 800 } else { 0 };
            h.push(window_via(w, |_| 1_000, detour), StampClass::Software);
        }
        let chosen = h.fit(&cfg(), W_NS).unwrap();
        let f = chosen.outcome.fit.unwrap();
        let (base, frac) = f.offset_at(f.epoch_ns);
        let error = base as f64 + frac - 1_000.0;
        assert_eq!(chosen.windows, span);
        assert!(error.abs() < 20.0, "{error} ns");
    }

    /// NIC stamps: 2 s of history whatever the window.
    #[test]
    fn nic_stamps_keep_a_short_history() {
        for (len_ns, windows) in [(4_000_000_000, 1), (2_000_000_000, 1), (1_000_000_000, 2)] {
            let mut h = EdgeHistory::default();
            for w in 0..MAX_WINDOWS as i64 {
                h.push(window_of(len_ns, w, |_| 1_000, 0), StampClass::Nic);
            }
            let fit = h.fit(&cfg(), len_ns).unwrap();
            assert_eq!(fit.windows, windows, "{len_ns} ns windows");
        }
    }

    /// Short windows: a path change is judged on the newest 2 s of
    /// software-stamped pairs, not on one window's few: one slow window
    /// (its pairs all queued behind other traffic) leaves the history
    /// whole; the change shows once the window before it is slow too.
    #[test]
    fn one_slow_short_window_does_not_cut_a_software_history() {
        const SHORT_NS: i64 = 1_000_000_000;
        let mut h = EdgeHistory::default();
        for w in 0..MAX_WINDOWS as i64 - 1 {
            h.push(window_of(SHORT_NS, w, |_| 1_000, 0), StampClass::Software);
        }
        h.push(
            window_of(SHORT_NS, MAX_WINDOWS as i64 - 1, |_| 1_000, 800),
            StampClass::Software,
        );
        assert_eq!(h.fit(&cfg(), SHORT_NS).unwrap().windows, MAX_WINDOWS);
        h.push(
            window_of(SHORT_NS, MAX_WINDOWS as i64, |_| 1_000, 800),
            StampClass::Software,
        );
        assert_eq!(h.fit(&cfg(), SHORT_NS).unwrap().windows, 2);
    }
}
