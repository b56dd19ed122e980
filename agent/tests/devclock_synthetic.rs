//! The sampler, fitter and CLI end to end on the synthetic source (no GPU).
use clockmesh::devclock::sampler::{DeviceClockSampler, SamplerConfig};
use clockmesh::devclock::{HostDomain, SourceChoice, open_source};
use clockmesh_estimator::device::{FitConfig, SyntheticConfig};

#[test]
fn sampler_fits_and_publishes_a_synthetic_clock() {
    let choice = SourceChoice::Synthetic(SyntheticConfig {
        seed: 21,
        ..SyntheticConfig::default()
    });
    let source = open_source(&choice, 3).unwrap();
    assert_eq!(source.info().device.index, 3);
    let mut sampler = DeviceClockSampler::new(source, SamplerConfig::default()).unwrap();
    let mut last = None;
    for _ in 0..200 {
        let b = sampler.sample().unwrap();
        last = b.outcome.accepted.or(last);
    }
    let fit = sampler.fit().expect("fit after 200 bursts");
    let pair = last.unwrap();
    // The kept pair's own midpoint is within its half bracket plus the bound.
    let mapped = fit.map(pair.device_ns().unwrap()).unwrap();
    let mid = pair.midpoint_ns(HostDomain::Realtime).unwrap();
    let half = pair.bracket_ns(HostDomain::Realtime).unwrap() / 2;
    assert!((mapped.host_ns - mid).unsigned_abs() <= mapped.bound_ns + half);
    let published = sampler.published().unwrap();
    assert_eq!(published.device, "synthetic:3");
    assert_eq!(published.points, 200);
}

#[test]
fn bad_readings_through_the_sampler_are_counted() {
    let choice = SourceChoice::Synthetic(SyntheticConfig {
        seed: 4,
        spike_probability: 0.05,
        backwards_probability: 0.02,
        backwards_ns: 10_000_000_000,
        ..SyntheticConfig::default()
    });
    let config = SamplerConfig {
        burst_len: 8,
        fit: FitConfig::default(),
    };
    let mut sampler = DeviceClockSampler::new(open_source(&choice, 0).unwrap(), config).unwrap();
    for _ in 0..300 {
        sampler.sample().unwrap();
    }
    let s = sampler.stats();
    assert_eq!(s.pairs_seen, 2_400);
    assert!(s.rejected_bracket_too_wide > 60, "{s:?}");
    assert!(s.rejected_non_monotonic > 20, "{s:?}");
    assert_eq!(s.resets, 0);
    assert!(sampler.fit().is_some());
}

#[test]
fn gpu_clock_cli_reports_json_for_the_synthetic_source() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_clockmesh"))
        .args([
            "gpu-clock",
            "--source",
            "synthetic",
            "--duration",
            "1.5",
            "--period-ms",
            "10",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["host_clock"], "CLOCK_REALTIME");
    let bursts = v["stats"]["bursts"].as_u64().unwrap();
    assert!((100..=151).contains(&bursts), "bursts {bursts}");
    // The model's brackets are 1.4-2.0 us.
    let p50 = v["bracket_all_ns"]["p50"].as_f64().unwrap();
    assert!((1_400.0..=2_000.0).contains(&p50), "p50 {p50}");
    assert!(v["fit"]["drift_ppb"].as_f64().is_some());
    assert!(v["cpu"]["process_pct_of_core"].as_f64().unwrap() >= 0.0);
}

#[test]
fn gpu_clock_cli_rejects_bad_arguments_with_a_message() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_clockmesh"))
        .args(["gpu-clock", "--source", "synthetic", "--duration=-3"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--duration"));
}
