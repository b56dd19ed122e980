#![forbid(unsafe_code)]
//! Placeholder; the estimator issue fills this crate.
pub mod device;
