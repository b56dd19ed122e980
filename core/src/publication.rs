//! What a node publishes for each of its results, built here so that the
//! driver only writes it and the simulator scores exactly what is
//! published: the result (as the wire and `/status` carry it) and the
//! history line, with its validity rule and typed anchor kind. Pure.

use clockmesh_offsets::history::{AnchorKind, HistoryEntry};
use clockmesh_offsets::{NodeMap, Snapshot, flags};
use clockmesh_proto::clockmesh as pb;

/// One published result.
#[derive(Clone, Debug, PartialEq)]
#[must_use = "a publication is written by the driver (`Action::Publish`)"]
pub struct Publication {
    /// The result as solved (global − local at its anchor).
    pub result: pb::NodeOffset,
    /// The line the history (JSONL) gets: what `trace merge` reads back.
    pub entry: HistoryEntry,
}

impl Publication {
    /// The publication of `result`, solved with windows of `window_ns`.
    pub fn of(result: pb::NodeOffset, window_ns: i64) -> Self {
        let entry = HistoryEntry {
            host: result.node.clone(),
            window: result.window,
            anchor_ns: result.anchor_ns,
            offset_ns: result.offset_ns,
            drift_ppb: result.drift_ppb,
            bound_ns: result.bound_ns,
            valid_from_ns: Some(valid_from_ns(result.anchor_ns, window_ns)),
            valid_until_ns: Some(result.valid_until_ns as i64),
            reference: Some(result.reference_node.clone()),
            node_id: Some(result.node_id),
            bound_growth_ppb: result.bound_growth_ppb,
            reference_id: Some(result.reference_id),
            anchor_kind: AnchorKind::from_name(&result.anchor_kind),
        };
        Publication { result, entry }
    }

    /// This node is the timeline's reference.
    pub fn is_reference(&self) -> bool {
        self.result.node_id == self.result.reference_id
    }

    pub fn anchor_kind(&self) -> Option<AnchorKind> {
        self.entry.anchor_kind
    }

    /// The offsets file's record as its readers see it: flags (`VALID`,
    /// `HOLDOVER` for a result placed by the previous window's estimate,
    /// `REFERENCE`), the end of its span, the node map, and the holdover
    /// ceiling it is published with. The driver adds what only it knows
    /// (epoch, write time, kernel clocks, device maps).
    pub fn record_view(&self, holdover_max_bound_ns: u64) -> Snapshot {
        let r = &self.result;
        let mut view = reader_view(
            r.anchor_kind == AnchorKind::Holdover.as_str(),
            r.valid_until_ns as i64,
            node_map(
                r.anchor_ns,
                r.offset_ns,
                r.drift_ppb,
                r.bound_ns,
                r.bound_growth_ppb,
            ),
            holdover_max_bound_ns,
        );
        if self.is_reference() {
            view.flags |= flags::REFERENCE;
        }
        view
    }
}

/// A result as the offsets file's node map carries it (drift and bound
/// growth in ps/s).
pub fn node_map(
    anchor_ns: i64,
    offset_ns: i64,
    drift_ppb: f64,
    bound_ns: u64,
    bound_growth_ppb: f64,
) -> NodeMap {
    NodeMap {
        anchor_local_ns: anchor_ns,
        offset_ns,
        drift_ps_per_s: (drift_ppb * 1e3).round() as i64,
        bound_ns,
        // Rounded up: a bound must never be understated.
        bound_growth_ps_per_s: (bound_growth_ppb * 1e3).ceil().max(0.0) as u64,
    }
}

/// What readers see of a result (without `REFERENCE`): `VALID`, and
/// `HOLDOVER` when it was placed by a previous estimate.
pub fn reader_view(
    holdover: bool,
    valid_until_ns: i64,
    node: NodeMap,
    holdover_max_bound_ns: u64,
) -> Snapshot {
    let mut f = flags::VALID;
    if holdover {
        f |= flags::HOLDOVER;
    }
    Snapshot {
        flags: f,
        valid_until_ns,
        node,
        holdover_max_bound_ns,
    }
}

/// Whether a reader is better served by the result it holds, `held`, than
/// by a `new` one: on the same timeline, the held one's bound grown to a
/// window past the new anchor (about when the next result replaces
/// either) is the smaller, and the held one keeps answering for as long
/// as the new one would be valid (within its own validity, or in holdover
/// under the ceiling `holdover_max_bound_ns`). Both answers are honest;
/// the reader gets the tighter. A young fit after an outage or a restart
/// (a few pairs, a wide bound and an error to match) then does not replace
/// a good record that is still close; the next result, with more data,
/// does; and keeping the held one never leaves a reader without an answer
/// that the new one would have given, should the next results not come.
pub fn keeps_the_held(
    held: &pb::NodeOffset,
    new: &pb::NodeOffset,
    window_ns: i64,
    holdover_max_bound_ns: u64,
) -> bool {
    if held.reference_id != new.reference_id || held.node_id != new.node_id {
        return false;
    }
    // Whether the held one still answers then: the readers' own rule on
    // the record it is published as.
    let held_view = Publication::of(held.clone(), window_ns).record_view(holdover_max_bound_ns);
    let answers_until = held_view.check_fresh(new.valid_until_ns as i64).is_ok();
    let next = new.anchor_ns.saturating_add(window_ns);
    answers_until && bound_at(held, next) < bound_at(new, next)
}

/// `r`'s bound at local time `t_ns`, grown at its published rate.
fn bound_at(r: &pb::NodeOffset, t_ns: i64) -> f64 {
    let age_s = t_ns.saturating_sub(r.anchor_ns).unsigned_abs() as f64 / 1e9;
    r.bound_ns as f64 + r.bound_growth_ppb.max(0.0) * age_s
}

/// The start of the span a result describes: its fits cover the window
/// that ends at the anchor and the one before it.
pub fn valid_from_ns(anchor_ns: i64, window_ns: i64) -> i64 {
    anchor_ns.saturating_sub(window_ns.saturating_mul(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_line_carries_the_result_and_its_span() {
        let r = pb::NodeOffset {
            node: "n1".into(),
            node_id: 1,
            reference_node: "n0".into(),
            reference_id: 0,
            window: 7,
            anchor_ns: 32_000_000_000,
            offset_ns: -120,
            drift_ppb: 3.5,
            bound_ns: 40,
            valid_until_ns: 40_000_000_000,
            anchor_kind: AnchorKind::Substitute.as_str().into(),
            ..Default::default()
        };
        let p = Publication::of(r, 4_000_000_000);
        assert_eq!(p.entry.valid_from_ns, Some(24_000_000_000));
        assert_eq!(p.entry.valid_until_ns, Some(40_000_000_000));
        assert_eq!(
            (p.entry.offset_ns, p.entry.bound_ns, p.entry.window),
            (-120, 40, 7)
        );
        assert_eq!(p.anchor_kind(), Some(AnchorKind::Substitute));
        assert_eq!(p.entry.reference.as_deref(), Some("n0"));
        assert!(!p.is_reference());
    }

    #[test]
    fn the_record_is_what_readers_see_of_the_result() {
        let r = pb::NodeOffset {
            node_id: 3,
            reference_id: 3,
            anchor_ns: 8_000_000_000,
            offset_ns: 1_234,
            drift_ppb: -2.0004,
            bound_ns: 50,
            bound_growth_ppb: 10.0001,
            valid_until_ns: 16_000_000_000,
            anchor_kind: AnchorKind::Holdover.as_str().into(),
            ..Default::default()
        };
        let view = Publication::of(r, 4_000_000_000).record_view(10_000);
        assert_eq!(
            view.flags,
            flags::VALID | flags::HOLDOVER | flags::REFERENCE
        );
        assert_eq!(view.valid_until_ns, 16_000_000_000);
        assert_eq!(view.holdover_max_bound_ns, 10_000);
        assert_eq!(view.node.drift_ps_per_s, -2_000);
        // A bound's growth is rounded up, never understated.
        assert_eq!(view.node.bound_growth_ps_per_s, 10_001);
        assert_eq!((view.node.offset_ns, view.node.bound_ns), (1_234, 50));
    }

    fn result(anchor_s: i64, bound_ns: u64, growth_ppb: f64) -> pb::NodeOffset {
        pb::NodeOffset {
            node_id: 1,
            reference_id: 0,
            anchor_ns: anchor_s * 1_000_000_000,
            valid_until_ns: (anchor_s as u64 + 12) * 1_000_000_000,
            bound_ns,
            bound_growth_ppb: growth_ppb,
            ..Default::default()
        }
    }

    #[test]
    fn the_held_result_stays_while_it_answers_with_the_smaller_bound() {
        let (w, ceiling) = (4_000_000_000, 10_000);
        let keeps = |new: &pb::NodeOffset, ceiling| {
            keeps_the_held(&result(0, 2_000, 100.0), new, w, ceiling)
        };
        // Held: 2 µs at 0 s, growing 100 ns/s, valid for 12 s; at 36 + 12 s
        // (the new one's validity): 6.8 µs, in holdover under the ceiling.
        // A thin window's result after an outage: 400 µs.
        assert!(keeps(&result(36, 400_000, 100.0), ceiling));
        // A mature one: 2.5 µs.
        assert!(!keeps(&result(36, 2_500, 100.0), ceiling));
        // On another timeline, the new one is always published.
        let other = pb::NodeOffset {
            reference_id: 2,
            ..result(36, 400_000, 100.0)
        };
        assert!(!keeps(&other, ceiling));
        // The held one would pass the ceiling (10 µs at 80 s) before the
        // new one's validity ends: the new one is published.
        assert!(!keeps(&result(70, 400_000, 100.0), ceiling));
        assert!(!keeps(&result(36, 400_000, 100.0), 0));
        // Valid as long as the new one, it answers whatever the ceiling.
        assert!(keeps(&result(0, 400_000, 100.0), 0));
        // A held one whose bound does not grow is stale past its validity
        // (the readers' rule: no growth, no holdover): the new one goes out.
        let still = result(0, 2_000, 0.0);
        assert!(!keeps_the_held(
            &still,
            &result(36, 400_000, 100.0),
            w,
            ceiling
        ));
    }
}
