//! Builds the published form of one GPU's fitted clock map
//! ([`PublishedDeviceMap`], defined in `clockmesh-offsets`) from the
//! estimator's fit: names for sources and host clock domains.
use clockmesh_estimator::device::{DeviceClockFit, HostDomain, SourceKind, Vendor};
use clockmesh_offsets::{PublishedDeviceMap, device_map};

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
        HostDomain::Realtime => device_map::HOST_REALTIME,
        HostDomain::Monotonic => device_map::HOST_MONOTONIC,
        HostDomain::Boottime => device_map::HOST_BOOTTIME,
    }
}

/// The published form of a fit.
pub fn published_map(fit: &DeviceClockFit) -> PublishedDeviceMap {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh_core::time::LocalNs;
    use clockmesh_estimator::device::{
        DeviceClockFitter, FitConfig, SyntheticClockModel, SyntheticConfig,
    };

    #[test]
    fn published_fields_reproduce_the_fit_within_a_nanosecond() {
        let start = 1_763_800_000_000_000_000;
        let mut model = SyntheticClockModel::new(SyntheticConfig::default(), LocalNs(start));
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
        let published = published_map(fit);
        assert_eq!(published.device, "synthetic:0");
        assert_eq!(published.host_domain, "CLOCK_REALTIME");
        for dt in [-20_000_000_000i64, -1, 0, 1_000_000_000, 2_000_000_000] {
            let d = (fit.anchor_device_ns as i64 + dt) as u64;
            let exact = fit.map(d).unwrap().host_ns;
            let from_file = published.map(d).unwrap();
            assert!(
                (exact - from_file.0).abs() <= 1,
                "dt {dt}: {exact} vs {from_file}"
            );
        }
        assert!(published.map(published.valid_until_device_ns + 1).is_none());
        let json = serde_json::to_string(&published).unwrap();
        assert!(json.contains("\"device_domain\":\"synthetic\""));
    }
}
