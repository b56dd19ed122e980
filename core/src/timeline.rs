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
//! better than a fit over one history span.

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
    /// The carry from this node's own last result, if it is recent enough
    /// at local time `now`.
    pub fn from_result(own: &NodeResult, now: LocalNs) -> Option<Carry> {
        let age = now.since(own.anchor);
        if !(Nanos::ZERO..=MAX_CARRY_AGE).contains(&age) {
            return None;
        }
        let growth = own.bound_growth_ppb.max(0.0) * age.as_secs_f64();
        Some(Carry {
            anchor: own.anchor,
            offset: own.offset,
            drift_ppb: own.drift_ppb,
            bound_ns: own.bound_ns.saturating_add(ceil_bound_ns(growth)),
            from: own.reference_label(),
        })
    }

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
    /// reference at least [`MIN_CHORD_SPAN`] before it.
    pub fn chord_to(&self, latest: &NodeResult) -> Option<Rate> {
        self.marks
            .iter()
            .filter(|m| m.reference_id == latest.reference)
            .filter_map(|m| {
                let span = latest.anchor.since(m.anchor);
                (span >= MIN_CHORD_SPAN).then(|| {
                    let span = span.as_f64();
                    Rate {
                        drift_ppb: (latest.offset - m.offset).as_f64() / span * 1e9,
                        bound_ppb: unsigned_ns_f64(latest.bound_ns + m.bound_ns) / span * 1e9,
                    }
                })
            })
            .min_by(|a, b| a.bound_ppb.total_cmp(&b.bound_ppb))
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
}

impl Continuation {
    /// The continuation of this node's last result `own` at local time
    /// `now` (None: too old, or from the future), its drift the tighter
    /// of its own fit's and the chord `chord` through its recent results.
    pub fn take(
        own: &NodeResult,
        chord: Option<Rate>,
        now: LocalNs,
        wander_ppb: f64,
    ) -> Option<Continuation> {
        let age = now.since(own.anchor);
        if !(Nanos::ZERO..=MAX_CARRY_AGE).contains(&age) {
            return None;
        }
        let fitted = fitted_rate(own, wander_ppb);
        let rate = match chord {
            Some(c) if c.bound_ppb < fitted.bound_ppb => c,
            _ => fitted,
        };
        let growth_ppb = rate.bound_ppb + wander_ppb.max(0.0);
        let grown = growth_ppb * age.as_secs_f64();
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
        })
    }

    /// How far the continued timeline may be from the old one at local
    /// time `t` (at least the carried bound).
    pub fn bound_at(&self, t: LocalNs) -> f64 {
        let since_s = t.since(self.handed_over).max(Nanos::ZERO).as_secs_f64();
        unsigned_ns_f64(self.carry.bound_ns) + self.growth_ppb * since_s
    }

    /// `r` (solved against this node's clock at local epoch `epoch`)
    /// moved onto the continued timeline, its bound covering its distance
    /// to the old one: the carry's bound at the epoch is added, and the
    /// carry's growth to the rate its bound grows at as readers age it.
    pub fn apply(&self, r: &mut NodeResult, epoch: LocalNs) {
        self.carry.apply(r, epoch);
        r.bound_ns = r
            .bound_ns
            .saturating_add(ceil_bound_ns(self.bound_at(epoch)));
        r.bound_growth_ppb += self.growth_ppb;
        r.drift_bound_ppb += self.growth_ppb;
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
        }
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

    #[test]
    fn a_carry_continues_the_old_timeline_at_its_rate() {
        let c = Carry::from_result(&own(1_000, 5_000, 2_000.0), LocalNs(1_000_001_000)).unwrap();
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
        let chord = marks.chord_to(&latest).expect("a chord over 300 s");
        assert!((chord.bound_ppb - 40.0 / 300.0).abs() < 1e-9, "{chord:?}");
        let c = Continuation::take(&latest, Some(chord), LocalNs(305_000_000_000), 20.0).unwrap();
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
        assert_eq!(marks.chord_to(&other), None);
        let mut young = OwnMarks::default();
        young.record(&on_timeline(295, 7.0, 0));
        assert_eq!(young.chord_to(&latest), None);
        // Without a chord the fit's drift and its bound are carried.
        let fitted = Continuation::take(&latest, None, LocalNs(305_000_000_000), 20.0).unwrap();
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
        let c = Continuation::take(&own, None, LocalNs(handed_over), 20.0).unwrap();
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

    #[test]
    fn an_old_or_future_result_is_not_carried() {
        let r = own(0, 5, 0.0);
        assert!(Carry::from_result(&r, LocalNs(MAX_CARRY_AGE.0 + 1)).is_none());
        assert!(Carry::from_result(&r, LocalNs(-1)).is_none());
        assert!(Carry::from_result(&r, LocalNs(MAX_CARRY_AGE.0)).is_some());
    }
}
