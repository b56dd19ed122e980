//! What publication needs of one GPU's fitted clock map.
//!
//! The map is `host_ns = device_ns + offset_at_anchor_ns + drift_ppb * 1e-9 *
//! (device_ns - anchor_device_ns)` in `host_domain`, valid for device times
//! in `[valid_from_device_ns, valid_until_device_ns]` with error at most
//! `bound_ns` at the anchor (the bound grows when extrapolating; the
//! estimator's `DeviceClockFit::bound_ns` gives it at any device time).
//! Composing with the node's own offset (host REALTIME -> global) is the
//! publisher's job; the agent builds these maps from the estimator's fits.
use serde::{Deserialize, Serialize};

/// `host_domain` names: the host clock a device map targets.
pub const HOST_REALTIME: &str = "CLOCK_REALTIME";
pub const HOST_MONOTONIC: &str = "CLOCK_MONOTONIC";
pub const HOST_BOOTTIME: &str = "CLOCK_BOOTTIME";

/// One GPU's device-to-host clock map, ready to publish.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishedDeviceMap {
    /// "nvidia:0", "amd:<gpu_id>", "synthetic:0".
    pub device: String,
    /// Device clock domain: "cuda-globaltimer", "amdgpu-clock-counter", ...
    pub device_domain: String,
    /// Source that produced the pairs: "cuda-pingpong", "kfd-ioctl", ...
    pub source: String,
    /// Host clock the map targets: "CLOCK_REALTIME", "CLOCK_MONOTONIC",
    /// "CLOCK_BOOTTIME".
    pub host_domain: String,
    pub anchor_device_ns: u64,
    pub offset_at_anchor_ns: i64,
    /// d(host - device)/d(device), ppb.
    pub drift_ppb: f64,
    /// Error bound at the anchor (ns).
    pub bound_ns: u64,
    pub residual_rms_ns: f64,
    pub points: usize,
    pub valid_from_device_ns: u64,
    /// Past this device time the map must not be used (fail closed).
    pub valid_until_device_ns: u64,
}

impl PublishedDeviceMap {
    /// Map a device time with the published fields alone (what a reader of
    /// the offsets file does); `None` outside the valid range.
    pub fn map(&self, device_ns: u64) -> Option<crate::LocalNs> {
        if device_ns < self.valid_from_device_ns || device_ns > self.valid_until_device_ns {
            return None;
        }
        let dx = (i128::from(device_ns) - i128::from(self.anchor_device_ns)) as f64;
        let host = i128::from(device_ns)
            + i128::from(self.offset_at_anchor_ns)
            + (self.drift_ppb * 1e-9 * dx).round() as i128;
        i64::try_from(host).ok().map(crate::LocalNs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> PublishedDeviceMap {
        PublishedDeviceMap {
            device: "synthetic:0".into(),
            device_domain: "synthetic".into(),
            source: "synthetic".into(),
            host_domain: "CLOCK_REALTIME".into(),
            anchor_device_ns: 1_000_000_000,
            offset_at_anchor_ns: 500,
            drift_ppb: 1_000.0,
            bound_ns: 10,
            residual_rms_ns: 1.0,
            points: 8,
            valid_from_device_ns: 0,
            valid_until_device_ns: 3_000_000_000,
        }
    }

    #[test]
    fn maps_with_offset_and_drift_inside_the_valid_range_only() {
        let m = map();
        assert_eq!(m.map(1_000_000_000), Some(crate::LocalNs(1_000_000_500)));
        // 1 s after the anchor at 1 ppm: 1 µs more.
        assert_eq!(m.map(2_000_000_000), Some(crate::LocalNs(2_000_001_500)));
        assert_eq!(m.map(3_000_000_001), None);
    }
}
