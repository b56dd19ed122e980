//! What can go wrong in a simulation.

/// Simulator errors.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("scenario parse error: {0}")]
    Parse(String),
    #[error("invalid scenario: {0}")]
    Invalid(String),
    #[error("estimator failed in window {window}: {source}")]
    Estimator {
        window: u32,
        source: clockmesh_estimator::EstimatorError,
    },
}
