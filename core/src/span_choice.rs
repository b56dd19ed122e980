//! Which of a full software history's two longest lines a node publishes
//! for its edges, chosen by how well each predicted the windows that
//! followed it.
//!
//! A software fit spans 32 s because its stamps' noise needs that many
//! pairs; a clock whose frequency wanders bends the 32 s line, and on such
//! a clock the line over the newest 16 s (its offset, under the 32 s
//! line's slope) is closer at the newest point. Neither is right for every
//! node (docs/estimator.md §8: the 16 s line is better on the family's
//! wandering clocks and worse on this VM's testbed, whose stamps scatter
//! more and whose clocks do not wander), and the fits' bounds cannot tell:
//! they are µs wide, the difference tens of ns.
//!
//! So a node scores both lines of its edges as they would have been
//! published. Each window, the lines fitted at the end of the previous
//! one are judged by the new window's probes, which neither line has
//! seen: the fastest packet each way, measured along a line, sit apart by
//! twice the line's offset error (plus the path's asymmetry, the same for
//! both lines). The node averages those errors over its edges before it
//! squares them, because that is what its result is made of: the network
//! solve averages away what is independent from edge to edge (the stamps'
//! noise, which the half line has more of), but not the node's own
//! wander, which bends every one of its edges' lines the same way and
//! reads to the solve as an offset of the node. The noise of the judging
//! packets is the same for both lines (they share a slope), so the mean
//! difference of the squared averages is the difference of the lines'
//! mean squared prediction errors. The half line is published unless
//! that difference has favoured the full line by more than twice its
//! standard error over at least 32 scored windows; the full line then
//! stays until it no longer leads at all.
//!
//! The half line is the default since a software pair gives its better
//! packet (docs/estimator.md §8, "The better packet of each software
//! pair"): with those cleaner points the half line's extra noise is small,
//! while a default of the full line cost medium-length runs on wandering
//! clocks the bend of their first 40–70 windows, before the score could
//! decide (the family's software members within 300 ns, 60–180 s runs:
//! 35 → 39 of 40). A node whose stamps scatter more than its clock wanders
//! returns to the full line once the score says so.

use clockmesh_estimator::EdgeFit;
use clockmesh_estimator::convert::count_f64;

/// Weight of the newest window in the running means: about the last 64
/// windows count (a minute at the shipped 1 s windows).
const WEIGHT: f64 = 1.0 / 64.0;
/// Scored windows before the full span may replace the half: one full
/// software history's worth.
const MIN_SCORED: u32 = 32;
/// Standard errors by which the full span's lead must exceed zero before
/// it replaces the half.
const LEAD_IN_ERRORS: f64 = 2.0;
/// A lead in mean squared error below this (ns²) is no lead: lines that
/// predict alike keep the half span whatever the noise says.
const MIN_LEAD_NS2: f64 = 100.0;

/// Which line a full software history publishes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SoftwareSpan {
    /// The longest span's own line.
    Full,
    /// The half span's offset under the longest span's slope: the default
    /// (see the module's documentation).
    #[default]
    Half,
}

/// One node's running score of its edges' full and half software lines.
#[derive(Debug, Default)]
pub struct SpanChoice {
    /// Running mean of (full lines' mean error)² − (half lines' mean
    /// error)², ns².
    lead: f64,
    /// Running mean of its square, for its standard error.
    lead_sq: f64,
    scored: u32,
    span: SoftwareSpan,
}

/// The two lines one window's fit of an edge offers.
#[derive(Clone, Debug)]
pub struct Candidates {
    pub full: EdgeFit,
    pub half: EdgeFit,
}

/// Both lines' offset errors as a later window's probes see them, ns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinesSeen {
    pub full: f64,
    pub half: f64,
}

impl Candidates {
    /// Both lines' errors by `seen`, a line's offset error as newer probes
    /// see it (`None`: they cannot judge it).
    pub fn seen_by(&self, seen: impl Fn(&EdgeFit) -> Option<f64>) -> Option<LinesSeen> {
        Some(LinesSeen {
            full: seen(&self.full)?,
            half: seen(&self.half)?,
        })
    }
}

impl SpanChoice {
    /// Scores one window: what its probes saw of the lines each edge
    /// offered at the end of the window before (nothing scored without).
    pub fn score(&mut self, edges: &[LinesSeen]) {
        if edges.is_empty() {
            return;
        }
        let n = count_f64(edges.len());
        let full = edges.iter().map(|e| e.full).sum::<f64>() / n;
        let half = edges.iter().map(|e| e.half).sum::<f64>() / n;
        let lead = full * full - half * half;
        if !lead.is_finite() {
            return;
        }
        self.lead += WEIGHT * (lead - self.lead);
        self.lead_sq += WEIGHT * (lead * lead - self.lead_sq);
        self.scored = self.scored.saturating_add(1);
        let full_leads = match self.span {
            SoftwareSpan::Full => self.lead < 0.0,
            SoftwareSpan::Half => {
                self.scored >= MIN_SCORED
                    && -self.lead > MIN_LEAD_NS2.max(LEAD_IN_ERRORS * self.standard_error())
            }
        };
        self.span = if full_leads {
            SoftwareSpan::Full
        } else {
            SoftwareSpan::Half
        };
    }

    /// The line full software histories publish now.
    pub fn span(&self) -> SoftwareSpan {
        self.span
    }

    /// Standard error of the running mean lead: an exponentially weighted
    /// mean has the variance of one sample times `w / (2 − w)` (the plain
    /// mean's `1 / n` while fewer than `1 / w` were scored).
    fn standard_error(&self) -> f64 {
        let variance = (self.lead_sq - self.lead * self.lead).max(0.0);
        let weight = WEIGHT.max(1.0 / f64::from(self.scored.max(1)));
        (variance * weight / (2.0 - weight)).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores `windows` windows of one edge whose full line was `full` ns
    /// off and half line `half` ns, as seen by packets `noise(k)` off.
    fn scored(
        choice: &mut SpanChoice,
        windows: u32,
        (full, half): (f64, f64),
        noise: impl Fn(u32) -> f64,
    ) {
        for k in 0..windows {
            let seen = LinesSeen {
                full: full - noise(k),
                half: half - noise(k),
            };
            choice.score(&[seen]);
        }
    }

    /// Judging noise of ±300 ns around 0 (a deterministic pattern).
    fn noise(k: u32) -> f64 {
        f64::from((k * 7919) % 601) - 300.0
    }

    #[test]
    fn the_full_line_is_chosen_once_it_predicts_better() {
        // The half line scattered 80 ns off, the full line 10 ns.
        let mut choice = SpanChoice::default();
        scored(&mut choice, MIN_SCORED - 1, (10.0, 80.0), noise);
        assert_eq!(choice.span(), SoftwareSpan::Half, "too few windows scored");
        scored(&mut choice, 200, (10.0, 80.0), noise);
        assert_eq!(choice.span(), SoftwareSpan::Full);
    }

    #[test]
    fn the_half_line_stays_when_the_full_predicts_worse_or_no_better() {
        let mut choice = SpanChoice::default();
        scored(&mut choice, 500, (80.0, 10.0), noise);
        assert_eq!(choice.span(), SoftwareSpan::Half);
        // The same error both sides: the lead is noise.
        let mut choice = SpanChoice::default();
        scored(&mut choice, 500, (40.0, -40.0), noise);
        assert_eq!(choice.span(), SoftwareSpan::Half);
    }

    #[test]
    fn the_full_line_goes_when_it_stops_leading() {
        let mut choice = SpanChoice::default();
        scored(&mut choice, 200, (10.0, 80.0), noise);
        assert_eq!(choice.span(), SoftwareSpan::Full);
        scored(&mut choice, 400, (80.0, 10.0), noise);
        assert_eq!(choice.span(), SoftwareSpan::Half);
    }

    /// Errors independent from edge to edge (noise the solve averages)
    /// cancel in the node's mean; a bend every edge shares does not.
    #[test]
    fn edges_are_averaged_before_their_errors_are_squared() {
        let mut choice = SpanChoice::default();
        for k in 0..200 {
            // Each full line 60 ns off, in opposite directions; the half
            // lines 60 ns off the same way: alike edge by edge.
            let edges = [
                LinesSeen {
                    full: 60.0 - noise(k),
                    half: 60.0 - noise(k),
                },
                LinesSeen {
                    full: -60.0 - noise(k + 1),
                    half: 60.0 - noise(k + 1),
                },
            ];
            choice.score(&edges);
        }
        assert_eq!(choice.span(), SoftwareSpan::Full);
    }

    fn line(offset_ns: f64) -> EdgeFit {
        EdgeFit {
            epoch_ns: 0,
            offset_base_ns: 0,
            offset_rel_ns: offset_ns,
            drift: 0.0,
            margin_ns: 0.0,
            min_rtt_ns: 0.0,
            bound_ns: 1_000.0,
            drift_bound: 1e-6,
            forward_points: 5,
            backward_points: 5,
            trimmed: 0,
            span_ns: 1_000_000_000,
        }
    }

    #[test]
    fn a_window_without_edges_scores_nothing() {
        let mut choice = SpanChoice::default();
        choice.score(&[]);
        assert_eq!(choice.scored, 0);
        let seen = Candidates {
            full: line(0.0),
            half: line(5.0),
        };
        assert_eq!(seen.seen_by(|_| None), None);
        let both = seen.seen_by(|l| Some(l.offset_rel_ns)).unwrap();
        assert_eq!((both.full, both.half), (0.0, 5.0));
    }
}
