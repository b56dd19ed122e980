//! One global timeline across leader changes. The leader's clock is the
//! reference, so without care a new leader would re-base every published
//! offset by its own offset to the old one. Instead, a node that becomes
//! leader carries its own last published offset and drift (against the
//! timeline so far) and adds them to everything it solves: the timeline
//! continues, running at the rate it ran at the hand-over. Pure: no I/O.

use serde::{Deserialize, Serialize};

use clockmesh_proto::clockmesh as pb;

/// Longest a published result is carried across a hand-over. Older, the
/// drift's error would dominate; the new leader then starts a timeline of
/// its own (recorded as a hand-over without a carry).
pub const MAX_CARRY_AGE_NS: i64 = 600_000_000_000;

/// The new leader's offset to the timeline it continues (global − local,
/// on its own clock).
#[derive(Clone, Debug, PartialEq)]
pub struct Carry {
    /// Local time at which `offset_ns` held.
    pub anchor_ns: i64,
    pub offset_ns: i64,
    pub drift_ppb: f64,
    /// The carried result's bound, grown to the hand-over: how far the
    /// continued timeline may sit from the old one.
    pub bound_ns: u64,
    /// The timeline's reference before the hand-over.
    pub from: String,
}

impl Carry {
    /// The carry from this node's own last result, if it is recent enough
    /// at local time `now_ns`.
    pub fn from_result(own: &pb::NodeOffset, now_ns: i64) -> Option<Carry> {
        let age = now_ns.saturating_sub(own.anchor_ns);
        if !(0..=MAX_CARRY_AGE_NS).contains(&age) {
            return None;
        }
        let growth = own.bound_growth_ppb.max(0.0) * age as f64 / 1e9;
        Some(Carry {
            anchor_ns: own.anchor_ns,
            offset_ns: own.offset_ns,
            drift_ppb: own.drift_ppb,
            bound_ns: own.bound_ns.saturating_add(growth.ceil() as u64),
            from: own.reference_node.clone(),
        })
    }

    /// global − local of this node at its local time `t_ns`.
    pub fn offset_at(&self, t_ns: i64) -> i64 {
        let dt = t_ns.saturating_sub(self.anchor_ns) as f64;
        self.offset_ns
            .saturating_add((self.drift_ppb * 1e-9 * dt).round() as i64)
    }

    /// `r` (solved against this node's clock, whose local time at the solve
    /// epoch is `epoch_ns`) moved onto the continued timeline.
    pub fn apply(&self, r: &mut pb::NodeOffset, epoch_ns: i64) {
        r.offset_ns = r.offset_ns.saturating_add(self.offset_at(epoch_ns));
        // First order: the rates add (drifts are parts per billion).
        r.drift_ppb += self.drift_ppb;
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
            anchor_ns: self.carried_anchor_ns?,
            offset_ns: self.carried_offset_ns?,
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
            carried_anchor_ns: carry.map(|c| c.anchor_ns),
            carried_offset_ns: carry.map(|c| c.offset_ns),
            carried_drift_ppb: carry.map(|c| c.drift_ppb),
            carried_bound_ns: carry.map(|c| c.bound_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(anchor_ns: i64, offset_ns: i64, drift_ppb: f64) -> pb::NodeOffset {
        pb::NodeOffset {
            anchor_ns,
            offset_ns,
            drift_ppb,
            bound_ns: 100,
            bound_growth_ppb: 50.0,
            reference_node: "old".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_carry_continues_the_old_timeline_at_its_rate() {
        let c = Carry::from_result(&own(1_000, 5_000, 2_000.0), 1_000_001_000).unwrap();
        assert_eq!(c.offset_at(1_000), 5_000);
        assert_eq!(c.offset_at(1_000_001_000), 5_000 + 2_000);
        assert_eq!(c.bound_ns, 100 + 50, "bound grown by 50 ppb over 1 s");
        let mut r = pb::NodeOffset {
            offset_ns: -300,
            drift_ppb: 10.0,
            ..Default::default()
        };
        c.apply(&mut r, 1_000_001_000);
        assert_eq!(r.offset_ns, 7_000 - 300);
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

    #[test]
    fn an_old_or_future_result_is_not_carried() {
        let r = own(0, 5, 0.0);
        assert!(Carry::from_result(&r, MAX_CARRY_AGE_NS + 1).is_none());
        assert!(Carry::from_result(&r, -1).is_none());
        assert!(Carry::from_result(&r, MAX_CARRY_AGE_NS).is_some());
    }
}
