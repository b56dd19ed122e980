//! `trace merge` on a host whose clock drifts: every event start and end of
//! every host-clock plane goes through the host's time-varying map at its
//! own time (the agent's per-window history, or the hook's start and stop
//! records), each placed plane carries its worst bound, and `--max-bound`
//! fails closed before anything is written.

use std::path::{Path, PathBuf};

use clockmesh_offsets::history::HistoryEntry;
use clockmesh_proto::prost::Message;
use clockmesh_proto::xplane::{XPlane, XSpace, x_event, x_stat};
use clockmesh_trace::synth::{SynthSpec, write_synthetic};
use clockmesh_trace::{MergeError, MergeOptions, OffsetSource, merge};

/// Session start of both hosts (local clocks).
const S: i64 = 1_795_335_288_621_242_594;
/// An 11 s session, like the JAX run.
const SESSION_NS: i64 = 11_000_000_000;
/// The drifting host: global − local = THETA0 + DRIFT·(local − E).
const THETA0: i64 = -123_000_000;
const DRIFT_PPB: i64 = -50_000; // runs 50 ppm fast
const E: i64 = S - 2_000_000_000;
const WINDOW_NS: i64 = 4_000_000_000;
const BOUND_NS: u64 = 100;
const GROWTH_PPB: f64 = 10.0;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clockmesh-drift-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Exact offset (ps) of the drifting host at local time `t_ps`.
fn theta_ps(t_ps: i128) -> i128 {
    i128::from(THETA0) * 1000
        + (t_ps - i128::from(E) * 1000) * i128::from(DRIFT_PPB) / 1_000_000_000
}

fn spec(host: &str, stats: Vec<(String, i64)>) -> SynthSpec {
    SynthSpec {
        host: host.into(),
        start_ns: S,
        duration_ns: SESSION_NS,
        lines_per_plane: 2,
        events_per_line: 40,
        task_env_stats: stats,
        ..SynthSpec::default()
    }
}

fn write(dir: &Path, spec: &SynthSpec) -> PathBuf {
    let p = dir.join(format!("{}.xplane.pb", spec.host));
    write_synthetic(&mut std::fs::File::create(&p).unwrap(), spec).unwrap();
    p
}

/// One node line per window, as the agent writes them: exact offset at the
/// anchor, the drift, a bound and its growth.
fn history(host: &str, drift: bool) -> Vec<HistoryEntry> {
    (-2..5)
        .map(|k| {
            let at = E + k * WINDOW_NS;
            HistoryEntry {
                host: host.into(),
                window: k as u64,
                anchor_ns: at,
                offset_ns: if drift {
                    (theta_ps(i128::from(at) * 1000) / 1000) as i64
                } else {
                    0
                },
                drift_ppb: if drift { DRIFT_PPB as f64 } else { 0.0 },
                bound_ns: BOUND_NS,
                bound_growth_ppb: if drift { GROWTH_PPB } else { 0.0 },
                ..HistoryEntry::default()
            }
        })
        .collect()
}

fn decode(p: &Path) -> XSpace {
    XSpace::decode(std::fs::read(p).unwrap().as_slice()).unwrap()
}

fn bound_stat(plane: &XPlane) -> Option<u64> {
    let id = plane
        .stat_metadata
        .values()
        .find(|m| m.name == "clock_alignment_bound_ns")?
        .id;
    plane
        .stats
        .iter()
        .find(|s| s.metadata_id == id)
        .and_then(|s| match s.value {
            Some(x_stat::Value::Uint64Value(v)) => Some(v),
            _ => None,
        })
}

/// Largest |placed − true| (ps) over every event start and end of the
/// drifting host's event planes; `origin` is the merged run's.
fn worst_error_ps(input: &XSpace, output: &XSpace, origin: i64) -> i128 {
    let mut worst = 0;
    for (pi, po) in input.planes.iter().zip(&output.planes) {
        for (li, lo) in pi.lines.iter().zip(&po.lines) {
            let local_base = (i128::from(li.timestamp_ns) + i128::from(S)) * 1000;
            let out_base = (i128::from(lo.timestamp_ns) + i128::from(origin)) * 1000;
            for (ei, eo) in li.events.iter().zip(&lo.events) {
                let (Some(x_event::Data::OffsetPs(a)), Some(x_event::Data::OffsetPs(b))) =
                    (ei.data, eo.data)
                else {
                    panic!("synthetic events all have offsets");
                };
                let start = local_base + i128::from(a);
                let end = start + i128::from(ei.duration_ps);
                let (got_start, got_end) = (
                    out_base + i128::from(b),
                    out_base + i128::from(b + eo.duration_ps),
                );
                worst = worst
                    .max((got_start - (start + theta_ps(start))).abs())
                    .max((got_end - (end + theta_ps(end))).abs());
            }
        }
    }
    worst
}

#[test]
fn history_places_every_event_of_a_drifting_host_at_its_own_time() {
    let dir = scratch("history");
    let inputs = [
        write(&dir, &spec("drifting", Vec::new())),
        write(&dir, &spec("steady", Vec::new())),
    ];
    let mut entries = history("drifting", true);
    entries.extend(history("steady", false));
    let opts = MergeOptions {
        out_dir: dir.join("out"),
        run_name: "run".into(),
        history: entries,
        ..MergeOptions::default()
    };
    let report = merge(&inputs, &opts, &mut |_| {}).unwrap();
    let (drifting, steady) = (&report.hosts[0], &report.hosts[1]);
    assert_eq!(drifting.source, OffsetSource::History);
    // 2 event planes × 2 lines × 40 events, each start and end on its own.
    assert_eq!(drifting.events_placed, 160);
    assert_eq!(steady.events_placed, 0, "a constant map shifts lines whole");
    assert!((drifting.mean_drift_ppb() - DRIFT_PPB as f64).abs() < 0.01);

    let out = decode(&report.run_dir.join("drifting.xplane.pb"));
    let err = worst_error_ps(&decode(&inputs[0]), &out, report.origin_ns);
    // The same events shifted by one offset would be 550 µs off at the end.
    assert!(err <= 2, "worst placement error {err} ps");

    // Each placed plane carries its worst bound: the anchors' 100 ns plus
    // 10 ppb over at most half a window (2 s) from the nearest anchor.
    let worst = drifting.worst_bound_ns().unwrap();
    assert!((BOUND_NS + 1..=BOUND_NS + 20).contains(&worst), "{worst}");
    for plane in &out.planes {
        let stat = bound_stat(plane).expect(&plane.name);
        assert!(stat <= worst, "{}: {stat}", plane.name);
        if plane.name == "Task Environment" {
            assert_eq!(stat, worst);
        }
    }
    let steady_out = decode(&report.run_dir.join("steady.xplane.pb"));
    assert!(
        steady_out
            .planes
            .iter()
            .all(|p| bound_stat(p) == Some(BOUND_NS))
    );

    // --max-bound below the worst: refused before anything is written.
    let tight = MergeOptions {
        run_name: "tight".into(),
        max_bound_ns: Some(worst - 1),
        ..opts.clone()
    };
    let e = merge(&inputs, &tight, &mut |_| {}).unwrap_err();
    assert!(
        matches!(e, MergeError::BoundExceeded { ref host, bound_ns, .. } if host == "drifting" && bound_ns == worst),
        "{e}"
    );
    assert!(!dir.join("out/plugins/profile/tight").exists());
    let loose = MergeOptions {
        run_name: "loose".into(),
        max_bound_ns: Some(worst),
        ..opts.clone()
    };
    merge(&inputs, &loose, &mut |_| {}).unwrap();
    // An offset given by hand has no bound: --max-bound cannot be met.
    let mut by_hand = MergeOptions {
        run_name: "by_hand".into(),
        max_bound_ns: Some(u64::MAX),
        ..opts
    };
    by_hand.offsets.insert("steady".into(), 0);
    let e = merge(&inputs, &by_hand, &mut |_| {}).unwrap_err();
    assert!(
        matches!(e, MergeError::BoundUnknown { ref host, .. } if host == "steady"),
        "{e}"
    );
    assert!(!dir.join("out/plugins/profile/by_hand").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The hook's stats: a record at session start and one at session stop.
fn hook_stats(stop: bool) -> Vec<(String, i64)> {
    let at = |t: i64| (theta_ps(i128::from(t) * 1000) / 1000) as i64;
    let stop_ns = S + SESSION_NS;
    let mut stats = vec![
        ("clock_offset_ns".to_string(), at(S)),
        ("clock_offset_bound_ns".to_string(), BOUND_NS as i64),
        // Drift as the agent saw it at the start: 1 ppm off the truth.
        ("clock_drift_ppb".to_string(), DRIFT_PPB + 1_000),
        ("clock_bound_growth_ppb".to_string(), 1_000),
    ];
    if stop {
        stats.extend([
            ("clock_stop_at_ns".to_string(), stop_ns),
            ("clock_stop_offset_ns".to_string(), at(stop_ns)),
            ("clock_stop_offset_bound_ns".to_string(), BOUND_NS as i64),
            ("clock_stop_drift_ppb".to_string(), DRIFT_PPB),
            ("clock_stop_bound_growth_ppb".to_string(), 1_000),
        ]);
    }
    stats
}

#[test]
fn the_hooks_start_and_stop_records_are_interpolated() {
    let dir = scratch("hook");
    let merge_one = |stop: bool, run: &str| {
        let input = write(&dir, &spec("hooked", hook_stats(stop)));
        let opts = MergeOptions {
            out_dir: dir.join("out"),
            run_name: run.into(),
            ..MergeOptions::default()
        };
        let report = merge(std::slice::from_ref(&input), &opts, &mut |_| {}).unwrap();
        let host = report.hosts[0].clone();
        assert_eq!(host.source, OffsetSource::Hook);
        let out = decode(&report.run_dir.join("hooked.xplane.pb"));
        let err = worst_error_ps(&decode(&input), &out, report.origin_ns);
        (
            err,
            host.worst_bound_ns().unwrap(),
            host.map.anchors().len(),
        )
    };
    // Both records: the chord between them is the truth (constant drift).
    let (err, bound, anchors) = merge_one(true, "both");
    assert_eq!(anchors, 2);
    assert!(err <= 1_000, "worst error {err} ps");
    // Bound: 100 ns + 1 ppm × 5.5 s at the midpoint.
    assert!((5_600..=5_601).contains(&bound), "{bound}");
    // The start record alone extrapolates its (1 ppm wrong) drift: 11 µs
    // off at the end, still inside its bound (100 ns + 1 ppm × 11 s).
    let (err, bound, anchors) = merge_one(false, "start");
    assert_eq!(anchors, 1);
    assert!(err > 10_000_000, "{err} ps");
    assert!(err / 1000 <= i128::from(bound), "{err} ps vs {bound} ns");
    std::fs::remove_dir_all(&dir).unwrap();
}
