//! Placeholder; the estimator issue fills this crate.
