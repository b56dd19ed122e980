//! What publication needs of one GPU's fitted clock map.
//!
//! The map is `host_ns = device_ns + offset_at_anchor_ns + drift_ppb * 1e-9 *
//! (device_ns - anchor_device_ns)` in `host_domain`, valid for device times
//! in `[valid_from_device_ns, valid_until_device_ns]` with error at most
//! `bound_ns` at the anchor (the bound grows when extrapolating; the
//! estimator's `DeviceClockFit::bound_ns` gives it at any device time).
//! Composing with the node's own offset (host REALTIME -> global) is the
//! publisher's job.
use clockmesh_estimator::device::{DeviceClockFit, HostDomain, SourceKind, Vendor};
use serde::{Deserialize, Serialize};

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

pub fn source_name(kind: SourceKind) -> &'static str {
    match kind {
        SourceKind::CudaPingPong => "cuda-pingpong",
        SourceKind::CudaLaunchPerSample => "cuda-launch-per-sample",
        SourceKind::KfdIoctl => "kfd-ioctl",
        SourceKind::Synthetic => "synthetic",
    }
}

pub fn host_domain_name(domain: HostDomain) -> &'static str {
    match domain {
        HostDomain::Realtime => "CLOCK_REALTIME",
        HostDomain::Monotonic => "CLOCK_MONOTONIC",
        HostDomain::Boottime => "CLOCK_BOOTTIME",
    }
}

impl PublishedDeviceMap {
    pub fn from_fit(fit: &DeviceClockFit) -> Self {
        let vendor = match fit.device.vendor {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
            Vendor::Synthetic => "synthetic",
        };
        PublishedDeviceMap {
            device: format!("{vendor}:{}", fit.device.index),
            device_domain: fit.source.device_domain().into(),
            source: source_name(fit.source).into(),
            host_domain: host_domain_name(fit.domain).into(),
            anchor_device_ns: fit.anchor_device_ns,
            // The fractional ns is dropped: publication is in whole ns.
            offset_at_anchor_ns: fit.offset_at_anchor_ns,
            drift_ppb: fit.drift_ppb,
            bound_ns: fit.bound_at_anchor_ns(),
            residual_rms_ns: fit.residual_rms_ns,
            points: fit.points,
            valid_from_device_ns: fit.valid_from_device_ns(),
            valid_until_device_ns: fit.valid_until_device_ns(),
        }
    }

    /// Map a device time with the published fields alone (what a reader of
    /// the offsets file does); `None` outside the valid range.
    pub fn map(&self, device_ns: u64) -> Option<i64> {
        if device_ns < self.valid_from_device_ns || device_ns > self.valid_until_device_ns {
            return None;
        }
        let dx = (i128::from(device_ns) - i128::from(self.anchor_device_ns)) as f64;
        let host = i128::from(device_ns)
            + i128::from(self.offset_at_anchor_ns)
            + (self.drift_ppb * 1e-9 * dx).round() as i128;
        i64::try_from(host).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh_estimator::device::{
        DeviceClockFitter, FitConfig, SyntheticClockModel, SyntheticConfig,
    };

    #[test]
    fn published_fields_reproduce_the_fit_within_a_nanosecond() {
        let start = 1_763_800_000_000_000_000;
        let mut model = SyntheticClockModel::new(SyntheticConfig::default(), start);
        let mut fitter = DeviceClockFitter::new(
            model.device_id(),
            SourceKind::Synthetic,
            FitConfig::default(),
        )
        .unwrap();
        let mut now = start;
        for b in 0..400 {
            fitter.push_burst(&model.burst(now, 8, b).0).unwrap();
            now += 100_000_000;
        }
        let fit = fitter.fit().unwrap();
        let published = PublishedDeviceMap::from_fit(fit);
        assert_eq!(published.device, "synthetic:0");
        assert_eq!(published.host_domain, "CLOCK_REALTIME");
        for dt in [-20_000_000_000i64, -1, 0, 1_000_000_000, 2_000_000_000] {
            let d = (fit.anchor_device_ns as i64 + dt) as u64;
            let exact = fit.map(d).unwrap().host_ns;
            let from_file = published.map(d).unwrap();
            assert!(
                (exact - from_file).abs() <= 1,
                "dt {dt}: {exact} vs {from_file}"
            );
        }
        assert!(published.map(published.valid_until_device_ns + 1).is_none());
        let json = serde_json::to_string(&published).unwrap();
        assert!(json.contains("\"device_domain\":\"synthetic\""));
    }
}
