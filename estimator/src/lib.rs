#![forbid(unsafe_code)]
#![warn(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap,
    clippy::cast_precision_loss
)]
// Test fixtures cast freely; the library build above is what is held to it.
#![cfg_attr(
    test,
    allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_possible_wrap,
        clippy::cast_precision_loss
    )
)]
//! clockmesh's estimation engine, with no I/O and no unsafe code.
//!
//! Pipeline per window (the agent and the simulator call exactly this):
//! 1. [`pair_probes`] turns the TX/RX timestamps of one direction of an edge into pure points
//!    (coded probe pairs whose receive spacing matches the send spacing);
//! 2. [`fit_edge`] fits `clock_B − clock_A = α + β·t` as the maximum-margin line between the
//!    forward (upper-bound) and backward (lower-bound) bands, with an error bound;
//! 3. [`solve_network`] combines all edge fits into per-node offsets, drifts and bounds against
//!    a reference (weighted least squares over the graph, the Huygens "network effect");
//! 4. [`Estimator`] keeps the current window and answers "offset and bound of node n now",
//!    with `now` passed in or read from an injected [`Clock`].
//!
//! See `docs/estimator.md` for the model, defaults, guarantees and measured figures.
pub mod convert;
pub mod device;
mod error;
mod estimator;
mod fit;
mod network;
mod probe;

pub use clockmesh_time::{LocalNs, Nanos};
pub use error::EstimatorError;
pub use estimator::{
    Clock, EdgeOutcome, EdgeProbes, Estimator, EstimatorConfig, ManualClock, PublishedOffset,
    estimate_edge,
};
pub use fit::{EdgeFit, FitConfig, fit_edge};
pub use network::{
    AnchorKind, ComponentInfo, EdgeMeasurement, NetConfig, NetworkSolution, NodeEstimate, NodeId,
    solve_network,
};
pub use probe::{
    MAX_ABS_TIMESTAMP_NS, Pairing, PairingStats, ProbeTimestamps, PurePoint, PurityConfig,
    pair_probes,
};
