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
/// The offsets file, its readers and the history line types live in
/// `clockmesh-offsets` (what a reader depends on); re-exported here.
pub use clockmesh_offsets as publish;
pub mod runtime;
/// The seeded frequency walk of `--inject-skew` lives in `clockmesh-sim`;
/// re-exported here.
pub use clockmesh_sim::wander;
/// Trace alignment and merge live in `clockmesh-trace`; re-exported here.
pub use clockmesh_trace as trace;
