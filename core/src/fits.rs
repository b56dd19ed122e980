//! What each node shares with the solver every window: its out-edges'
//! fits, as domain types (the relay and the store carry them as protobuf,
//! converted only in [`crate::codec`]).

use clockmesh_estimator::{EdgeMeasurement, NodeId};

use crate::time::{LocalNs, WindowIndex};

/// One out-edge's fit of one window: `clock_to − clock_from` on the `from`
/// node's clock, with the share of its full history it spans.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedFit {
    pub window: WindowIndex,
    pub from_name: String,
    pub to_name: String,
    pub measurement: EdgeMeasurement,
}

impl SharedFit {
    pub fn from(&self) -> NodeId {
        self.measurement.from
    }

    pub fn to(&self) -> NodeId {
        self.measurement.to
    }
}

/// Every fit one node shares for one window: the store's record of it.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowFits {
    pub window: WindowIndex,
    /// The producing node's clock when it was made.
    pub produced_at: LocalNs,
    pub fits: Vec<SharedFit>,
}
