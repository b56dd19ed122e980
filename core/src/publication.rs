//! What a node publishes for each of its results, built here so that the
//! driver only writes it and the simulator scores exactly what is
//! published: the result (as the wire and `/status` carry it) and the
//! history line, with its validity rule and typed anchor kind. Pure.

use clockmesh_offsets::history::{AnchorKind, HistoryEntry};
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
}
