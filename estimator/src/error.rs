//! The one error type of the estimator. Every bad input is reported here; nothing panics.
use crate::NodeId;

/// Why the estimator refused an input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EstimatorError {
    /// A window, edge band or graph had nothing to work with.
    #[error("empty input: {0}")]
    Empty(&'static str),
    /// Only one direction of an edge has pure points; the offset is then unbounded on one side.
    #[error(
        "one-sided data: {forward} forward and {backward} backward pure points (need at least one of each)"
    )]
    OneSided { forward: usize, backward: usize },
    /// The forward and backward points do not overlap in time, so the drift cannot be pinned.
    #[error("degenerate geometry: {0}")]
    Degenerate(&'static str),
    /// The same (sequence, index) probe appeared twice.
    #[error("duplicate probe: sequence {seq}, index {index}")]
    DuplicateProbe { seq: u64, index: u8 },
    /// A probe pair's packets carry an impossible order (second sent no later than the first).
    #[error("out-of-order probe pair {seq}: second packet sent {tx_gap_ns} ns after the first")]
    OutOfOrderPair { seq: u64, tx_gap_ns: i64 },
    /// A probe index other than 0 or 1.
    #[error("probe {seq} has index {index}; coded pairs use indices 0 and 1")]
    BadPairIndex { seq: u64, index: u8 },
    /// A timestamp or one-way delay is outside what the estimator accepts.
    #[error("absurd value: {what} = {value}")]
    Absurd { what: &'static str, value: i64 },
    /// The points span more time than the configured maximum window.
    #[error("window too long: points span {span_ns} ns, maximum {max_ns} ns")]
    WindowTooLong { span_ns: i64, max_ns: i64 },
    /// Pure points of both bands overlap even after outlier trimming: the data contradict the
    /// model (clock step inside the window, or broken timestamps). The edge must be dropped.
    #[error(
        "bands overlap by {overlap_ns:.1} ns after trimming {trimmed} outliers; data inconsistent with an affine clock"
    )]
    BandsOverlap { overlap_ns: f64, trimmed: usize },
    /// An invalid configuration value.
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    /// An edge joining a node to itself.
    #[error("edge from node {0} to itself")]
    SelfLoop(NodeId),
    /// An edge fit with a non-finite or non-positive quality value.
    #[error("edge {from}->{to}: {what} is not finite and positive")]
    BadEdge {
        from: NodeId,
        to: NodeId,
        what: &'static str,
    },
    /// The iterative solver did not reach its tolerance.
    #[error(
        "network solve did not converge: relative residual {residual:e} after {iterations} iterations"
    )]
    NoConvergence { iterations: usize, residual: f64 },
}
