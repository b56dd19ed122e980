//! A node's result, the thing clockmesh exists to produce, as a domain
//! type: the leader's solve makes it, the relay and the store carry it
//! (converted to and from protobuf only in [`crate::codec`]), and the node
//! publishes it ([`crate::publication`]). Offsets are global − local.

use clockmesh_estimator::NodeId;
use clockmesh_estimator::convert::unsigned_ns_f64;
use clockmesh_offsets::history::AnchorKind;

use crate::time::{LocalNs, Nanos, WindowIndex};

/// One node's clock against the global timeline for one window.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeResult {
    /// The node the result is about.
    pub node: NodeId,
    pub node_name: String,
    /// The timeline's reference (the leader that solved it).
    pub reference: NodeId,
    /// The reference's name; `None` where only its id is known (a result
    /// read back from the offsets file after a restart).
    pub reference_name: Option<String>,
    /// The member whose clock the timeline is: the leader that started it,
    /// kept by every leader that continues it ([`crate::timeline`]).
    /// `None` where unknown: an older agent's result, or one read back
    /// from the offsets file.
    pub origin: Option<String>,
    pub window: WindowIndex,
    /// The node's local time at which `offset` holds.
    pub anchor: LocalNs,
    /// global − local at the anchor.
    pub offset: Nanos,
    /// The rate of `offset`, ppb.
    pub drift_ppb: f64,
    pub bound_ns: u64,
    /// How fast the bound widens away from the anchor (drift uncertainty
    /// plus the assumed wander), ppb.
    pub bound_growth_ppb: f64,
    /// Bound on the drift estimate alone, ppb.
    pub drift_bound_ppb: f64,
    /// Probe-graph edges on the path that bounds the offset (0: the
    /// reference itself).
    pub hops: u32,
    /// The end of the result's span; past it readers hold over.
    pub valid_until: LocalNs,
    pub anchor_kind: AnchorKind,
}

impl NodeResult {
    /// The result is the reference's own.
    pub fn is_reference(&self) -> bool {
        self.node == self.reference
    }

    /// Placed by a previous window's estimate, not by this window's solve.
    pub fn is_holdover(&self) -> bool {
        self.anchor_kind == AnchorKind::Holdover
    }

    /// global − local at local time `t`, extrapolated with the drift.
    pub fn offset_at(&self, t: LocalNs) -> f64 {
        self.offset.as_f64() + self.drift_ppb * t.secs_since(self.anchor)
    }

    /// The bound at local time `t`, grown at its published rate either
    /// side of the anchor.
    pub fn bound_at(&self, t: LocalNs) -> f64 {
        unsigned_ns_f64(self.bound_ns)
            + self.bound_growth_ppb.max(0.0) * t.secs_since(self.anchor).abs()
    }

    /// The start of the span the result describes: its fits cover the
    /// window that ends at the anchor and the one before it.
    pub fn valid_from(&self, window: Nanos) -> LocalNs {
        self.anchor - window.saturating_mul(2)
    }

    /// The reference's name, or its id where the name is not known.
    pub fn reference_label(&self) -> String {
        self.reference_name
            .clone()
            .unwrap_or_else(|| self.reference.to_string())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A result of node 1 against reference 0, for tests.
    pub(crate) fn sample(anchor_s: i64, bound_ns: u64, growth_ppb: f64) -> NodeResult {
        NodeResult {
            node: 1,
            node_name: "n1".into(),
            reference: 0,
            reference_name: Some("n0".into()),
            origin: Some("n0".into()),
            window: WindowIndex(0),
            anchor: LocalNs(anchor_s * 1_000_000_000),
            offset: Nanos(0),
            drift_ppb: 0.0,
            bound_ns,
            bound_growth_ppb: growth_ppb,
            drift_bound_ppb: 0.0,
            hops: 1,
            valid_until: LocalNs((anchor_s + 12) * 1_000_000_000),
            anchor_kind: AnchorKind::Reference,
        }
    }

    #[test]
    fn a_result_ages_with_its_drift_and_bound_growth() {
        let r = NodeResult {
            offset: Nanos(100),
            drift_ppb: 10.0,
            ..sample(10, 50, 20.0)
        };
        let later = LocalNs(12_000_000_000);
        assert_eq!(r.offset_at(later), 120.0);
        assert_eq!(r.bound_at(later), 90.0);
        // Before the anchor too: a bound grows either side.
        assert_eq!(r.bound_at(LocalNs(8_000_000_000)), 90.0);
        assert_eq!(r.valid_from(Nanos::from_secs(4)), LocalNs(2_000_000_000));
        assert_eq!(r.reference_label(), "n0");
        let read_back = NodeResult {
            reference_name: None,
            ..r
        };
        assert_eq!(read_back.reference_label(), "0");
    }
}
