//! One global timeline across leader changes. The leader's clock is the
//! reference, so without care a new leader would re-base every published
//! offset by its own offset to the old one. Instead, a node that becomes
//! leader carries its own last published offset and drift (against the
//! timeline so far) and adds them to everything it solves: the timeline
//! continues, running at the rate it ran at the hand-over. Pure: no I/O.
//!
//! A carry is an estimate: the continued timeline sits up to the carried
//! bound from the old one at the hand-over and moves away from it at up to
//! the carried drift's uncertainty plus the wander allowance after it
//! ([`Continuation`]). Every result published on the continued timeline
//! has that distance added to its bound, so a reader's bound covers its
//! distance to the timeline as it was before the hand-over, not only to
//! the one continued. The carried drift is the better of the node's own
//! last fit and the chord through its own results over up to
//! [`MAX_CARRY_AGE`] ([`OwnMarks`]): minutes of results pin the rate far
//! better than a fit over one history span. Clocks wander, so a chord's
//! mean rate is not the rate at its end, and the rate keeps moving after
//! the hand-over: the node measures how fast its rate against the timeline
//! random-walks from the same results ([`WanderRate`]) and both enter the
//! bound.
//!
//! The timeline is its origin's clock: the leader that started it. While
//! the origin is still a member, a leader that carries the timeline
//! measures it every window, so the carry is steered toward that
//! measurement ([`Continuation::steered_toward`]) instead of growing for
//! good: how far the continued timeline may be from the original is then
//! the solve's bound on the origin plus the gap still to close, whatever
//! the carried drift was.

use std::collections::VecDeque;

use clockmesh_estimator::convert::{ceil_bound_ns, round_ns, unsigned_ns_f64};
use serde::{Deserialize, Serialize};

use crate::{
    result::NodeResult,
    time::{LocalNs, Nanos},
};

/// Longest a published result is carried across a hand-over. Older, the
/// drift's error would dominate; the new leader then starts a timeline of
/// its own (recorded as a hand-over without a carry).
pub const MAX_CARRY_AGE: Nanos = Nanos::from_secs(600);

/// The new leader's offset to the timeline it continues (global − local,
/// on its own clock).
#[derive(Clone, Debug, PartialEq)]
pub struct Carry {
    /// Local time at which `offset` held.
    pub anchor: LocalNs,
    pub offset: Nanos,
    pub drift_ppb: f64,
    /// The carried result's bound, grown to the hand-over: how far the
    /// continued timeline may sit from the old one.
    pub bound_ns: u64,
    /// The timeline's reference before the hand-over.
    pub from: String,
}

impl Carry {
    /// global − local of this node at its local time `t`.
    pub fn offset_at(&self, t: LocalNs) -> Nanos {
        let dt = t.since(self.anchor).as_f64();
        self.offset + Nanos(round_ns(self.drift_ppb * 1e-9 * dt))
    }

    /// `r` (solved against this node's clock, whose local time at the solve
    /// epoch is `epoch`) moved onto the continued timeline.
    pub fn apply(&self, r: &mut NodeResult, epoch: LocalNs) {
        r.offset += self.offset_at(epoch);
        // First order: the rates add (drifts are parts per billion).
        r.drift_ppb += self.drift_ppb;
    }
}

/// Shortest chord through a node's own results that may set the carried
/// drift: shorter, the results' bounds divided by the span say little.
pub const MIN_CHORD_SPAN: Nanos = Nanos::from_secs(10);

/// Most of a node's own results kept for the chord (a span of
/// [`MAX_CARRY_AGE`] at 0.25 s windows); older ones are dropped first.
const MAX_MARKS: usize = 2_400;

/// One of this node's published results, as the chord needs it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Mark {
    anchor: LocalNs,
    offset: Nanos,
    bound_ns: u64,
    reference_id: u32,
}

/// This node's own published results of the last [`MAX_CARRY_AGE`]:
/// the chord from an old one to the latest gives the node's mean rate
/// against the timeline, with an honest bound (the two results' bounds
/// over the span, whatever their errors were).
#[derive(Clone, Debug, Default)]
pub struct OwnMarks {
    marks: VecDeque<Mark>,
}

/// A drift (ppb) and how far it may be from the truth (ppb).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub drift_ppb: f64,
    pub bound_ppb: f64,
}

/// How fast a node's rate against the timeline random-walks, ppb/√s: an
/// upper estimate (95 %) from its own results, so that wander moves a
/// rate by about `w·√t` and the phase by `w·t^1.5/√3` (rms) over `t`
/// seconds. Stated at [`WANDER_SIGMAS`] standard deviations.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct WanderRate(f64);

/// Standard deviations of the wander that the bounds cover.
pub const WANDER_SIGMAS: f64 = 3.0;

/// The wander assumed where a node has too few results to measure its own
/// (under [`MIN_WANDER_SPAN`]): the fastest the scenario family samples,
/// a free-running oscillator in a server whose temperature swings.
pub const ASSUMED_WANDER: WanderRate = WanderRate(5.0);

/// Shortest span of results the wander is measured over: six lags of
/// 10 s (shorter lags see the results' noise more than the wander).
pub const MIN_WANDER_SPAN: Nanos = Nanos::from_secs(60);

/// Lags in the span the wander is measured over: about five independent
/// rate differences, the χ² upper bound's degrees of freedom.
const WANDER_LAGS: i64 = 6;

/// √(dof / χ²₀.₀₅(dof)) for dof = [`WANDER_LAGS`] − 1: the 95 % upper
/// bound of a standard deviation estimated from that many samples.
const WANDER_UPPER_FACTOR: f64 = 2.090;

impl WanderRate {
    pub fn ppb_per_sqrt_s(self) -> f64 {
        self.0
    }

    /// How far the mean rate over the last `span` may be from the rate at
    /// its end, ppb (a random walk's mean lags its end by `w·√(span/3)`).
    pub fn mean_rate_error_ppb(self, span: Nanos) -> f64 {
        WANDER_SIGMAS * self.0 * (span.as_secs_f64().max(0.0) / 3.0).sqrt()
    }

    /// How far the rate may move `after` it was known exactly, ppb.
    pub fn rate_error_ppb(self, after: Nanos) -> f64 {
        WANDER_SIGMAS * self.0 * after.as_secs_f64().max(0.0).sqrt()
    }

    /// How far the phase may move `after` a rate known exactly, ns.
    pub fn phase_error_ns(self, after: Nanos) -> f64 {
        let t = after.as_secs_f64().max(0.0);
        WANDER_SIGMAS * self.0 * t * t.sqrt() / 3f64.sqrt()
    }

    /// How fast [`WanderRate::phase_error_ns`] grows at `after`, ppb.
    pub fn phase_growth_ppb(self, after: Nanos) -> f64 {
        1.5 * WANDER_SIGMAS * self.0 * after.as_secs_f64().max(0.0).sqrt() / 3f64.sqrt()
    }
}

impl OwnMarks {
    /// Records a published result; forgets those older than
    /// [`MAX_CARRY_AGE`] before it.
    pub fn record(&mut self, r: &NodeResult) {
        self.marks.push_back(Mark {
            anchor: r.anchor,
            offset: r.offset,
            bound_ns: r.bound_ns,
            reference_id: r.reference,
        });
        let oldest = r.anchor - MAX_CARRY_AGE;
        while self
            .marks
            .front()
            .is_some_and(|m| m.anchor < oldest || self.marks.len() > MAX_MARKS)
        {
            self.marks.pop_front();
        }
    }

    /// The tightest chord ending at `latest`, from a result under the same
    /// reference at least [`MIN_CHORD_SPAN`] before it. Its bound is the
    /// two results' bounds over the span plus how far a mean rate over the
    /// span may be from the rate at its end under `wander`: long chords
    /// average the noise out and the wander in.
    pub fn chord_to(&self, latest: &NodeResult, wander: WanderRate) -> Option<Rate> {
        self.same_reference(latest)
            .filter_map(|m| {
                let span = latest.anchor.since(m.anchor);
                (span >= MIN_CHORD_SPAN).then(|| {
                    let secs = span.as_f64();
                    Rate {
                        drift_ppb: (latest.offset - m.offset).as_f64() / secs * 1e9,
                        bound_ppb: unsigned_ns_f64(latest.bound_ns + m.bound_ns) / secs * 1e9
                            + wander.mean_rate_error_ppb(span),
                    }
                })
            })
            .min_by(|a, b| a.bound_ppb.total_cmp(&b.bound_ppb))
    }

    /// How fast this node's rate against `latest`'s timeline wanders,
    /// measured over its results under that reference (an overlapping
    /// Allan variance at a sixth of their span: the rates over successive
    /// lags differ by `w²·2τ/3` in the mean square), stated at its 95 %
    /// upper bound. The results' own noise counts as wander, which only
    /// widens the bounds. [`ASSUMED_WANDER`] with under
    /// [`MIN_WANDER_SPAN`] of results.
    pub fn wander_to(&self, latest: &NodeResult) -> WanderRate {
        let marks: Vec<&Mark> = self.same_reference(latest).collect();
        let (Some(first), Some(last)) = (marks.first(), marks.last()) else {
            return ASSUMED_WANDER;
        };
        let span = last.anchor.since(first.anchor);
        if span < MIN_WANDER_SPAN {
            return ASSUMED_WANDER;
        }
        let lag = Nanos(span.0 / WANDER_LAGS);
        let at = |t: LocalNs| marks.partition_point(|m| m.anchor < t).min(marks.len() - 1);
        let mut sum = 0.0;
        let mut count = 0.0;
        for (i, a) in marks.iter().enumerate() {
            let (j, k) = (at(a.anchor + lag), at(a.anchor + lag + lag));
            let (b, c) = (marks[j], marks[k]);
            if c.anchor < a.anchor + lag + lag {
                break; // the lags run past the latest result
            }
            if i >= j || j >= k {
                continue;
            }
            let (lag_ab, lag_bc) = (b.anchor.since(a.anchor), c.anchor.since(b.anchor));
            let rate_ab = (b.offset - a.offset).as_f64() / lag_ab.as_f64();
            let rate_bc = (c.offset - b.offset).as_f64() / lag_bc.as_f64();
            let mean_lag_s = (lag_ab.as_secs_f64() + lag_bc.as_secs_f64()) / 2.0;
            sum += 1.5 * (rate_bc - rate_ab).powi(2) / mean_lag_s;
            count += 1.0;
        }
        if count == 0.0 {
            return ASSUMED_WANDER;
        }
        WanderRate((sum / count).sqrt() * 1e9 * WANDER_UPPER_FACTOR)
    }

    fn same_reference<'a>(&'a self, latest: &'a NodeResult) -> impl Iterator<Item = &'a Mark> {
        self.marks
            .iter()
            .filter(move |m| m.reference_id == latest.reference)
    }
}

/// The drift a result's own fit gives, with its uncertainty: the published
/// drift bound, or the bound's growth less the wander allowance where that
/// is larger (a result read back from the offsets file carries no drift
/// bound of its own).
pub fn fitted_rate(own: &NodeResult, wander_ppb: f64) -> Rate {
    Rate {
        drift_ppb: own.drift_ppb,
        bound_ppb: own
            .drift_bound_ppb
            .max(own.bound_growth_ppb - wander_ppb)
            .max(0.0),
    }
}

/// How long a carried timeline steered toward its origin takes to close a
/// gap ([`Continuation::steered_toward`]): the rate changes by the gap over it,
/// so a measurement's noise moves the rate little (100 ns of software-stamp
/// noise: 3 ppb), and a rate the measurements lag (wandering clocks) leaves
/// a gap of that lag times this.
pub const SLEW_TIME: Nanos = Nanos::from_secs(32);

/// This node on the timeline as the origin's result `origin`, solved
/// against this node's clock at its local time `epoch`, places it: the
/// origin's clock is the timeline, so that result turned round, under the
/// origin as reference (a measurement of this node, not a result it
/// publishes).
pub fn through_origin(origin: &NodeResult, epoch: LocalNs) -> NodeResult {
    NodeResult {
        node: origin.reference,
        node_name: origin.reference_label(),
        reference: origin.node,
        reference_name: Some(origin.node_name.clone()),
        origin: Some(origin.node_name.clone()),
        anchor: epoch,
        offset: Nanos(-origin.offset.0),
        drift_ppb: -origin.drift_ppb,
        valid_until: epoch + origin.valid_until.since(origin.anchor),
        ..origin.clone()
    }
}

/// A carry and how far the continued timeline may sit from the old one
/// as time goes on: what every result on the continued timeline adds to
/// its bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Continuation {
    /// `carry.bound_ns` holds at `handed_over`.
    pub carry: Carry,
    /// Local time of the hand-over.
    pub handed_over: LocalNs,
    /// The carried drift's uncertainty, ppb.
    pub drift_bound_ppb: f64,
    /// How fast the continued timeline may move from the old one after the
    /// hand-over: the carried drift's uncertainty plus the estimator's
    /// wander allowance (the old reference's rate against this node's may
    /// change after the carried drift was measured), ppb.
    pub growth_ppb: f64,
    /// How fast this node's rate against the old timeline wandered before
    /// the hand-over: the phase it may gain since, beyond `growth_ppb`
    /// (grows as t^1.5).
    pub wander: WanderRate,
    /// The member whose clock the timeline is ([`NodeResult::origin`]);
    /// `None` where the carried result did not say.
    pub origin: Option<String>,
}

impl Continuation {
    /// The continuation of this node's last result `own` at local time
    /// `now` (None: too old, or from the future), its drift the tighter
    /// of its own fit's and the chord through its recent results `marks`,
    /// its bound growing with the wander measured over them.
    pub fn take(
        own: &NodeResult,
        marks: &OwnMarks,
        now: LocalNs,
        wander_ppb: f64,
    ) -> Option<Continuation> {
        let age = now.since(own.anchor);
        if !(Nanos::ZERO..=MAX_CARRY_AGE).contains(&age) {
            return None;
        }
        let wander = marks.wander_to(own);
        let fitted = fitted_rate(own, wander_ppb);
        let rate = match marks.chord_to(own, wander) {
            Some(c) if c.bound_ppb < fitted.bound_ppb => c,
            _ => fitted,
        };
        let growth_ppb = rate.bound_ppb + wander_ppb.max(0.0);
        let grown = growth_ppb * age.as_secs_f64() + wander.phase_error_ns(age);
        Some(Continuation {
            carry: Carry {
                anchor: own.anchor,
                offset: own.offset,
                drift_ppb: rate.drift_ppb,
                bound_ns: own.bound_ns.saturating_add(ceil_bound_ns(grown)),
                from: own.reference_label(),
            },
            handed_over: now,
            drift_bound_ppb: rate.bound_ppb,
            growth_ppb,
            wander,
            origin: own.origin.clone(),
        })
    }

    /// This continuation steered toward the timeline's origin as this
    /// window's solve measured it: `measured` is this node on the timeline
    /// through the origin ([`through_origin`]), `marks` every such
    /// measurement of this leadership. The origin's clock is the timeline,
    /// so the measurement says how far the continued timeline is from it
    /// (the gap) within the measurement's bound. The timeline is slewed,
    /// not stepped: it keeps its value now and runs at the measured rate
    /// (the tighter of the solve's drift and the chord through the
    /// measurements, [`Continuation::take`]) plus the gap over
    /// [`SLEW_TIME`], so readers holding results of successive windows
    /// still agree, and it closes on the origin as the measurements do.
    /// Its bound now is the tighter of the carried one and the gap plus
    /// the measurement's bound; its rate's uncertainty adds the slew.
    pub fn steered_toward(
        &self,
        measured: &NodeResult,
        marks: &OwnMarks,
        wander_ppb: f64,
    ) -> Option<Continuation> {
        let at = measured.anchor;
        let m = Continuation::take(measured, marks, at, wander_ppb)?;
        let now = self.carry.offset_at(at);
        let gap_ns = (m.carry.offset - now).as_f64();
        let slew_ppb = gap_ns / SLEW_TIME.as_f64() * 1e9;
        let bound = self
            .bound_at(at)
            .min(unsigned_ns_f64(m.carry.bound_ns) + gap_ns.abs());
        Some(Continuation {
            carry: Carry {
                anchor: at,
                offset: now,
                drift_ppb: m.carry.drift_ppb + slew_ppb,
                bound_ns: ceil_bound_ns(bound),
                from: self.carry.from.clone(),
            },
            handed_over: at,
            drift_bound_ppb: m.drift_bound_ppb + slew_ppb.abs(),
            growth_ppb: m.growth_ppb + slew_ppb.abs(),
            wander: m.wander,
            origin: self.origin.clone(),
        })
    }

    /// How long the carried rate has been extrapolated at local time `t`:
    /// since the carried result's anchor.
    fn carried_for(&self, t: LocalNs) -> Nanos {
        t.since(self.carry.anchor).max(Nanos::ZERO)
    }

    /// How far the continued timeline may be from the old one at local
    /// time `t` (at least the carried bound).
    pub fn bound_at(&self, t: LocalNs) -> f64 {
        let since = t.since(self.handed_over).max(Nanos::ZERO);
        let wandered = self.wander.phase_error_ns(self.carried_for(t))
            - self
                .wander
                .phase_error_ns(self.carried_for(self.handed_over));
        unsigned_ns_f64(self.carry.bound_ns) + self.growth_ppb * since.as_secs_f64() + wandered
    }

    /// `r` (solved against this node's clock at local epoch `epoch`)
    /// moved onto the continued timeline, its bound covering its distance
    /// to the old one: the carry's bound at the epoch is added, and the
    /// carry's growth to the rate its bound grows at as readers age it
    /// (the wander's at the end of the result's life: the phase it may
    /// gain grows ever faster).
    pub fn apply(&self, r: &mut NodeResult, epoch: LocalNs) {
        self.carry.apply(r, epoch);
        r.bound_ns = r
            .bound_ns
            .saturating_add(ceil_bound_ns(self.bound_at(epoch)));
        let end_of_life = self.carried_for(epoch) + r.valid_until.since(r.anchor).max(Nanos::ZERO);
        let growth = self.growth_ppb + self.wander.phase_growth_ppb(end_of_life);
        r.bound_growth_ppb += growth;
        r.drift_bound_ppb += self.growth_ppb + self.wander.rate_error_ppb(end_of_life);
    }
}

/// The JSONL line a new leader writes when it takes the timeline over
/// (`"type": "handover"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename = "handover")]
pub struct HandOverLine {
    /// The first window the new leader solves.
    pub window: u64,
    pub reference: String,
    /// The timeline's reference before (absent: no recent result to carry,
    /// a new timeline starts here).
    pub previous_reference: Option<String>,
    pub carried_anchor_ns: Option<i64>,
    pub carried_offset_ns: Option<i64>,
    pub carried_drift_ppb: Option<f64>,
    /// How far the continued timeline may sit from the old one.
    pub carried_bound_ns: Option<u64>,
    /// How fast the new leader's rate against the old timeline wandered
    /// (measured, upper estimate): what widens the bounds after the
    /// hand-over as t^1.5.
    #[serde(default)]
    pub carried_wander_ppb_per_sqrt_s: Option<f64>,
    /// Set where the same reference steered its carry (not a change of
    /// reference): the origin whose clock this window's solve measured
    /// ([`Continuation::steered_toward`]).
    #[serde(default)]
    pub steered_toward: Option<String>,
}

impl HandOverLine {
    /// The carry this line records, if the new leader carried one.
    pub fn carry(&self) -> Option<Carry> {
        Some(Carry {
            anchor: LocalNs(self.carried_anchor_ns?),
            offset: Nanos(self.carried_offset_ns?),
            drift_ppb: self.carried_drift_ppb?,
            bound_ns: self.carried_bound_ns?,
            from: self.previous_reference.clone().unwrap_or_default(),
        })
    }

    pub fn new(window: u64, reference: &str, carry: Option<&Carry>) -> Self {
        HandOverLine {
            window,
            reference: reference.to_owned(),
            previous_reference: carry.map(|c| c.from.clone()),
            carried_anchor_ns: carry.map(|c| c.anchor.0),
            carried_offset_ns: carry.map(|c| c.offset.0),
            carried_drift_ppb: carry.map(|c| c.drift_ppb),
            carried_bound_ns: carry.map(|c| c.bound_ns),
            carried_wander_ppb_per_sqrt_s: None,
            steered_toward: None,
        }
    }

    /// The line a carried timeline steered toward its origin writes.
    pub fn steer(window: u64, reference: &str, steered: &Continuation) -> Self {
        HandOverLine {
            carried_wander_ppb_per_sqrt_s: Some(steered.wander.ppb_per_sqrt_s()),
            steered_toward: steered.origin.clone(),
            ..HandOverLine::new(window, reference, Some(&steered.carry))
        }
    }

    /// The line in force for window `window` among one reference's
    /// `lines` (in the order written): the last at or before it.
    pub fn in_force(lines: &[HandOverLine], window: u64) -> Option<&HandOverLine> {
        Self::last_at_or_before(lines.iter(), window)
    }

    /// The line in force for window `window` of `reference` among `lines`
    /// of any references (in the order written). A later line that started
    /// a new timeline, carrying nothing, ends an earlier carry.
    pub fn in_force_of<'a>(
        lines: &'a [HandOverLine],
        reference: &str,
        window: u64,
    ) -> Option<&'a HandOverLine> {
        Self::last_at_or_before(lines.iter().filter(|h| h.reference == reference), window)
    }

    /// The last of `lines` (in the order written) at or before `window`.
    fn last_at_or_before<'a>(
        lines: impl DoubleEndedIterator<Item = &'a HandOverLine>,
        window: u64,
    ) -> Option<&'a HandOverLine> {
        lines.rev().find(|h| h.window <= window)
    }

    /// A change of reference (not the same one steering its carry).
    pub fn is_hand_over(&self) -> bool {
        self.steered_toward.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::tests::sample;

    fn own(anchor_ns: i64, offset_ns: i64, drift_ppb: f64) -> NodeResult {
        NodeResult {
            anchor: LocalNs(anchor_ns),
            offset: Nanos(offset_ns),
            drift_ppb,
            bound_ns: 100,
            bound_growth_ppb: 50.0,
            reference_name: Some("old".into()),
            ..sample(0, 0, 0.0)
        }
    }

    /// A result solved against the new leader's clock, for a carry to move.
    fn solved(offset_ns: i64, drift_ppb: f64) -> NodeResult {
        NodeResult {
            offset: Nanos(offset_ns),
            drift_ppb,
            ..sample(0, 0, 0.0)
        }
    }

    /// A node's results exactly on a line of `rate_ppb` through `latest`
    /// (which they end at), one a second for `secs` seconds, each with
    /// bound `bound_ns`: no wander to measure.
    fn marks_on_a_line(latest: &NodeResult, rate_ppb: f64, secs: i64, bound_ns: u64) -> OwnMarks {
        let mut marks = OwnMarks::default();
        for back in (0..=secs).rev() {
            marks.record(&NodeResult {
                anchor: latest.anchor - Nanos::from_secs(back),
                offset: latest.offset - Nanos((rate_ppb * back as f64).round() as i64),
                bound_ns,
                ..latest.clone()
            });
        }
        marks
    }

    #[test]
    fn a_carry_continues_the_old_timeline_at_its_rate() {
        // A minute of results on the fit's own line, too loose for a
        // chord: the fit's drift is carried, its bound grown at 50 ppb.
        let latest = own(1_000, 5_000, 2_000.0);
        let marks = marks_on_a_line(&latest, 2_000.0, 60, 10_000);
        let continuation =
            Continuation::take(&latest, &marks, LocalNs(1_000_001_000), 0.0).unwrap();
        assert_eq!(continuation.wander, WanderRate(0.0));
        let c = continuation.carry;
        assert_eq!(c.offset_at(LocalNs(1_000)).0, 5_000);
        assert_eq!(c.offset_at(LocalNs(1_000_001_000)).0, 5_000 + 2_000);
        assert_eq!(c.bound_ns, 100 + 50, "bound grown by 50 ppb over 1 s");
        let mut r = solved(-300, 10.0);
        c.apply(&mut r, LocalNs(1_000_001_000));
        assert_eq!(r.offset, Nanos(7_000 - 300));
        assert_eq!(r.drift_ppb, 2_010.0);
        let line = HandOverLine::new(3, "new", Some(&c));
        assert_eq!(line.carry(), Some(c));
        let json = serde_json::to_string(&line).unwrap();
        assert!(
            json.starts_with(r#"{"type":"handover","window":3,"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<HandOverLine>(&json).unwrap(), line);
        assert_eq!(HandOverLine::new(3, "new", None).carry(), None);
    }

    /// A result of a node with drift `drift_ppb` against the timeline, each
    /// off by `error_ns` (within its bound of 20 ns).
    fn on_timeline(anchor_s: i64, drift_ppb: f64, error_ns: i64) -> NodeResult {
        NodeResult {
            anchor: LocalNs(anchor_s * 1_000_000_000),
            offset: Nanos((drift_ppb * anchor_s as f64).round() as i64 + error_ns),
            drift_ppb: drift_ppb + 3.0, // the fit's drift, 3 ppb off
            drift_bound_ppb: 4.0,
            bound_ns: 20,
            bound_growth_ppb: 24.0,
            reference: 1,
            reference_name: Some("n1".into()),
            ..sample(0, 0, 0.0)
        }
    }

    #[test]
    fn the_chord_through_minutes_of_results_pins_the_carried_drift() {
        let mut marks = OwnMarks::default();
        for s in 0..=300 {
            marks.record(&on_timeline(s, 7.0, if s % 2 == 0 { 19 } else { -19 }));
        }
        let latest = on_timeline(300, 7.0, 19);
        let chord = marks
            .chord_to(&latest, WanderRate(0.0))
            .expect("a chord over 300 s");
        assert!((chord.bound_ppb - 40.0 / 300.0).abs() < 1e-9, "{chord:?}");
        let c = Continuation::take(&latest, &marks, LocalNs(305_000_000_000), 20.0).unwrap();
        assert!(
            (c.carry.drift_ppb - 7.0).abs() <= c.drift_bound_ppb,
            "chord drift {} ± {} against 7 ppb",
            c.carry.drift_ppb,
            c.drift_bound_ppb
        );
        assert_eq!(c.growth_ppb, c.drift_bound_ppb + 20.0);
        // Results under another reference do not make a chord; nor do
        // recent ones alone.
        let mut other = latest.clone();
        other.reference = 2;
        assert_eq!(marks.chord_to(&other, WanderRate(0.0)), None);
        let mut young = OwnMarks::default();
        young.record(&on_timeline(295, 7.0, 0));
        assert_eq!(young.chord_to(&latest, WanderRate(0.0)), None);
        // Without a chord the fit's drift and its bound are carried.
        let fitted = Continuation::take(&latest, &young, LocalNs(305_000_000_000), 20.0).unwrap();
        assert_eq!(
            (fitted.carry.drift_ppb, fitted.drift_bound_ppb),
            (10.0, 4.0)
        );
    }

    #[test]
    fn marks_older_than_the_longest_carry_are_forgotten() {
        let mut marks = OwnMarks::default();
        let step = 10;
        for s in (0..=2 * MAX_CARRY_AGE.0 / 1_000_000_000).step_by(step) {
            marks.record(&on_timeline(s, 0.0, 0));
        }
        let oldest = marks.marks.front().unwrap().anchor.0;
        let newest = marks.marks.back().unwrap().anchor.0;
        assert!(newest - oldest <= MAX_CARRY_AGE.0);
    }

    #[test]
    fn every_result_on_a_continued_timeline_carries_the_carry_s_bound_and_growth() {
        let own = on_timeline(100, 7.0, 0);
        let handed_over = 104_000_000_000;
        // A minute of results exactly on a line: no wander, no chord
        // tighter than the fit's 4 ppb.
        let marks = marks_on_a_line(&own, 7.0, 60, 400);
        let c = Continuation::take(&own, &marks, LocalNs(handed_over), 20.0).unwrap();
        assert_eq!(c.wander, WanderRate(0.0));
        // 4 s from the anchor to the hand-over at 4 + 20 ppb.
        assert_eq!(c.carry.bound_ns, 20 + 96);
        let solved = || NodeResult {
            bound_ns: 15,
            bound_growth_ppb: 21.0,
            drift_bound_ppb: 1.0,
            ..solved(-300, 1.0)
        };
        let mut at_hand_over = solved();
        c.apply(&mut at_hand_over, LocalNs(handed_over));
        assert_eq!(at_hand_over.bound_ns, 15 + 116);
        let mut later = solved();
        c.apply(&mut later, LocalNs(handed_over + 600_000_000_000));
        // 600 s at 24 ppb more: the carried drift's bound and the wander.
        assert_eq!(later.bound_ns, 15 + 116 + 14_400);
        assert_eq!(later.bound_growth_ppb, 21.0 + 24.0);
        assert_eq!(later.drift_bound_ppb, 1.0 + 24.0);
        assert_eq!(later.drift_ppb, 1.0 + 10.0);
        assert_eq!(
            later.offset,
            Nanos(-300 + c.carry.offset_at(LocalNs(handed_over + 600_000_000_000)).0)
        );
    }

    /// Results of a node whose rate against the timeline random-walks at
    /// `wander` ppb/√s (a step a second), exactly on that walk, one a
    /// second for `secs` seconds.
    fn wandering_results(wander: f64, secs: i64) -> Vec<NodeResult> {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut gaussian = || {
            // Irwin–Hall: twelve uniforms less six, close enough to normal.
            (0..12)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 11) as f64 / (1u64 << 53) as f64
                })
                .sum::<f64>()
                - 6.0
        };
        let (mut phase, mut rate) = (0.0_f64, 0.0_f64);
        (0..=secs)
            .map(|s| {
                // Its own fit's drift 3 ppb off the rate now (bound 4).
                let r = NodeResult {
                    offset: Nanos(phase.round() as i64),
                    ..on_timeline(s, rate, 0)
                };
                rate += wander * gaussian();
                phase += rate; // ppb over 1 s: ns
                r
            })
            .collect()
    }

    fn marks_of(results: &[NodeResult]) -> OwnMarks {
        let mut marks = OwnMarks::default();
        results.iter().for_each(|r| marks.record(r));
        marks
    }

    #[test]
    fn the_wander_is_measured_from_the_node_s_own_results() {
        for wander in [0.5, 3.0, 8.0] {
            let results = wandering_results(wander, 600);
            let measured = marks_of(&results).wander_to(&results[600]).ppb_per_sqrt_s();
            // An upper estimate: above the truth, and not by more than
            // the 95 % factor's worth of bad luck.
            assert!(
                (wander..=3.0 * wander).contains(&measured),
                "{measured} ppb/√s measured for {wander}"
            );
        }
        // Under a minute of results: the fastest wander is assumed.
        let results = wandering_results(0.5, 50);
        assert_eq!(marks_of(&results).wander_to(&results[50]), ASSUMED_WANDER);
    }

    #[test]
    fn a_wandering_node_s_carry_covers_the_old_timeline_as_it_goes_on_wandering() {
        // 10 minutes on the old timeline, then 10 more carried: the walk
        // goes on after the hand-over, and the bound must follow it.
        let truth = wandering_results(3.0, 1_200);
        let before = marks_of(&truth[..=600]);
        let own = &truth[600];
        let c = Continuation::take(own, &before, own.anchor, 20.0).unwrap();
        // As carried before the wander was measured: the chord with the
        // least noise (the longest), growing at its bound and 20 ppb.
        let chord = before.chord_to(own, WanderRate(0.0)).unwrap();
        let mut linear_only = c.clone();
        linear_only.wander = WanderRate(0.0);
        linear_only.carry.drift_ppb = chord.drift_ppb;
        linear_only.growth_ppb = chord.bound_ppb + 20.0;
        let outside = |c: &Continuation| {
            truth[600..]
                .iter()
                .filter(|t| {
                    let err = (c.carry.offset_at(t.anchor) - t.offset).as_f64();
                    err.abs() > c.bound_at(t.anchor)
                })
                .count()
        };
        assert_eq!(outside(&c), 0, "{c:?}");
        assert!(
            outside(&linear_only) > 100,
            "the walk leaves a linear bound on a stale chord"
        );
    }

    #[test]
    fn a_carry_steered_by_its_origin_closes_on_it_without_a_step() {
        // Truly this node sits at 1,000 ns + 7 ppb on the origin's clock;
        // its carry from a young timeline is 2 µs and 10 ppb off.
        let truth = |t: LocalNs| 1_000.0 + 7.0 * t.0 as f64 * 1e-9;
        let own = NodeResult {
            offset: Nanos(3_000),
            drift_ppb: 17.0,
            bound_ns: 2_500,
            drift_bound_ppb: 12.0,
            bound_growth_ppb: 32.0,
            ..sample(0, 0, 0.0)
        };
        let unsteered = Continuation::take(&own, &OwnMarks::default(), own.anchor, 20.0).unwrap();
        let mut c = unsteered.clone();
        let mut marks = OwnMarks::default();
        for s in 1..=200 {
            let at = LocalNs(s * 1_000_000_000);
            // The solve places the origin within its bound of 300 ns.
            let noise = if s % 2 == 0 { 60.0 } else { -60.0 };
            let measured = NodeResult {
                node: 1,
                reference: 0,
                anchor: at,
                offset: Nanos((truth(at) + noise).round() as i64),
                drift_ppb: 7.0 + noise / 20.0,
                drift_bound_ppb: 4.0,
                bound_ns: 300,
                bound_growth_ppb: 24.0,
                ..sample(0, 0, 0.0)
            };
            marks.record(&measured);
            let next = c.steered_toward(&measured, &marks, 20.0).unwrap();
            let step = (next.carry.offset_at(at) - c.carry.offset_at(at)).0;
            assert!(step.abs() <= 1, "stepped {step} ns at {s} s");
            for t in [at, at + Nanos::from_millis(999)] {
                let distance = (next.carry.offset_at(t).as_f64() - truth(t)).abs();
                assert!(
                    distance <= next.bound_at(t),
                    "{distance} ns at {t:?}: {next:?}"
                );
            }
            c = next;
        }
        let end = LocalNs(200_000_000_000);
        let gap = (c.carry.offset_at(end).as_f64() - truth(end)).abs();
        assert!(gap < 100.0, "still {gap} ns from the origin");
        assert!(c.bound_at(end) < 1_000.0, "{c:?}");
        assert!(
            unsteered.bound_at(end) > 5.0 * c.bound_at(end),
            "{unsteered:?}"
        );
        assert_eq!(c.origin, unsteered.origin);
        let line = HandOverLine::steer(200, "n1", &c);
        assert!(!line.is_hand_over());
        assert_eq!(line.carry(), Some(c.carry.clone()));
    }

    #[test]
    fn an_old_or_future_result_is_not_carried() {
        let r = own(0, 5, 0.0);
        let take = |now| Continuation::take(&r, &OwnMarks::default(), LocalNs(now), 20.0);
        assert!(take(MAX_CARRY_AGE.0 + 1).is_none());
        assert!(take(-1).is_none());
        assert!(take(MAX_CARRY_AGE.0).is_some());
    }
}
