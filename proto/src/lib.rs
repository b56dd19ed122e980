//! Protobuf messages used by clockmesh.
//!
//! `prost` is re-exported so users encode/decode with the matching version.
//!
//! - [`xplane`]: `tensorflow.profiler` XSpace/XPlane, the trace container of
//!   XLA/TSL profilers (`<host>.xplane.pb`). Decoding with prost drops unknown
//!   fields, so the merge tool never re-encodes whole traces through these
//!   types; it uses them for inspection, tests and small planes only.
//! - [`clockmesh`]: the estimator's results (edge fits, node offsets,
//!   snapshots).

pub use prost;

/// `tensorflow.profiler` (xplane.proto).
pub mod xplane {
    include!(concat!(env!("OUT_DIR"), "/tensorflow.profiler.rs"));
}

/// `clockmesh.v1` (clockmesh.proto).
pub mod clockmesh {
    include!(concat!(env!("OUT_DIR"), "/clockmesh.v1.rs"));
}

/// Name of the plane on which XLA stores session-wide stats.
pub const TASK_ENV_PLANE: &str = "Task Environment";
/// Task Environment stat: session start, CLOCK_REALTIME epoch ns.
pub const PROFILE_START_TIME: &str = "profile_start_time";
/// Task Environment stat: session stop, CLOCK_REALTIME epoch ns.
pub const PROFILE_STOP_TIME: &str = "profile_stop_time";

/// Stat names written by the clockmesh hook on the Task Environment plane.
pub mod clock_stats {
    pub const OFFSET_NS: &str = "clock_offset_ns";
    pub const OFFSET_BOUND_NS: &str = "clock_offset_bound_ns";
    pub const DRIFT_PPB: &str = "clock_drift_ppb";
    /// How fast the start record's bound grows away from it, ppb.
    pub const BOUND_GROWTH_PPB: &str = "clock_bound_growth_ppb";
    /// The record taken at session stop: the local time it holds at
    /// (`profile_stop_time`), and its offset, bound, drift and growth there.
    pub const STOP_AT_NS: &str = "clock_stop_at_ns";
    pub const STOP_OFFSET_NS: &str = "clock_stop_offset_ns";
    pub const STOP_OFFSET_BOUND_NS: &str = "clock_stop_offset_bound_ns";
    pub const STOP_DRIFT_PPB: &str = "clock_stop_drift_ppb";
    pub const STOP_BOUND_GROWTH_PPB: &str = "clock_stop_bound_growth_ppb";
    /// Which records the hook took: "start+stop", "start" or "stop-only".
    pub const ANCHORS: &str = "clock_anchors";
    pub const REFERENCE_ID: &str = "clock_reference_id";
    pub const EPOCH: &str = "clock_agent_epoch";
    pub const ANCHOR_NS: &str = "clock_anchor_ns";
    pub const FLAGS: &str = "clock_flags";
    pub const WINDOW: &str = "clock_window";
    /// "ok", or why the hook recorded no offset.
    pub const STATUS: &str = "clock_status";
    /// Prefix of per-device stats: `clock_device_<id>_offset_ns`, ...
    pub const DEVICE_PREFIX: &str = "clock_device_";
}

#[cfg(test)]
mod tests {
    use super::xplane::{XLine, XPlane, XSpace, XStat, x_stat};
    use prost::Message;

    #[test]
    fn compressed_str_value_round_trips() {
        let space = XSpace {
            planes: vec![XPlane {
                name: "p".into(),
                stats: vec![XStat {
                    metadata_id: 3,
                    value: Some(x_stat::Value::CompressedStrValue(vec![1, 2, 3])),
                }],
                lines: vec![XLine {
                    timestamp_ns: -5,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            hostnames: vec!["h".into()],
            ..Default::default()
        };
        let bytes = space.encode_to_vec();
        // Field 8 of XStat, length-delimited: tag byte (8 << 3) | 2 = 0x42.
        assert!(bytes.windows(4).any(|w| w == [0x42, 3, 1, 2]));
        assert_eq!(XSpace::decode(bytes.as_slice()).unwrap(), space);
    }
}
