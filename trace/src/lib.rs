//! Profiler traces (`.xplane.pb`) onto one global timeline.
//!
//! The merge never decodes a trace into messages: pass 1 ([`scan`]) walks
//! the protobuf wire format and records where each `XLine.timestamp_ns`
//! lives; pass 2 ([`rewrite`]) copies the file byte for byte, replacing
//! only those varints and fixing the enclosing length prefixes. Unknown
//! fields (newer XLA, `compressed_str_value`, anything) survive verbatim,
//! and memory stays bounded by the number of lines, not events. Planes in a
//! GPU's own clock ([`device`]) also get every event's offset and duration
//! rewritten, through the agent's published device maps. PyTorch
//! profiler traces (Kineto JSON, [`kineto`]) are placed through the same
//! host maps in the same merge.
//! Design and limits: `docs/trace-merge.md`.

pub mod collectives;
pub mod device;
pub mod fields;
pub mod kineto;
pub mod merge;
pub mod perfetto;
pub mod plan;
pub mod rewrite;
pub mod scan;
pub mod summary;
pub mod synth;
pub mod wire;

pub use device::{DeviceClockSpec, SpecError};
pub use merge::{
    HostPlacement, MergeError, MergeOptions, MergeReport, OffsetSource, collect_inputs, merge,
};
pub use plan::{DeviceError, DevicePlaneReport};
pub use scan::{Scan, scan_file};
pub use summary::MergeSummary;

/// What is wrong with one trace file.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("I/O: {0}")]
    Io(std::io::Error),
    #[error("truncated at byte {at} (file ends inside a field)")]
    Truncated { at: u64 },
    #[error("not a valid xplane at byte {at}: {what}")]
    Malformed { at: u64, what: &'static str },
    #[error("not an xplane file: {0}")]
    NotXPlane(String),
    #[error("no \"Task Environment\" plane (was the trace exported by XLA's profiler?)")]
    MissingTaskEnv,
    #[error("Task Environment has no profile_start_time")]
    MissingStart,
    #[error("file changed while merging")]
    Changed,
}

impl TraceError {
    pub fn io(e: std::io::Error) -> Self {
        Self::Io(e)
    }

    pub fn truncated(at: u64) -> Self {
        Self::Truncated { at }
    }

    pub fn malformed(at: u64, what: &'static str) -> Self {
        Self::Malformed { at, what }
    }
}

/// A [`TraceError`] with the file it came from.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {error}")]
pub struct FileError {
    pub path: String,
    pub error: TraceError,
}
