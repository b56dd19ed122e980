//! clockmesh node agent library.
//!
//! The data path is the module path: `capture` (eBPF load, ring buffer,
//! SO_TIMESTAMPING) → `probe` (wire format, sender/responder) →
//! `clockmesh_estimator` (pure estimation) → `publish` (offsets file) →
//! `trace` (align and merge profiler traces). `devclock` reads GPU clocks.
pub mod capture;
pub mod config;
pub mod devclock;
pub mod discovery;
pub mod probe;
pub mod publish;
pub mod runtime;
pub mod trace;
