//! `trace merge` with GPU device-clock maps: planes in a device's own clock
//! are placed event by event through the published maps (with drift) and
//! the node's map; host-clock planes through the node's map alone (it
//! drifts here, so event by event too); every failure is closed (a clear
//! error, nothing written).

use std::path::{Path, PathBuf};

use clockmesh_offsets::PublishedDeviceMap;
use clockmesh_offsets::history::{self, DeviceHistoryEntry, HistoryEntry};
use clockmesh_proto::prost::Message;
use clockmesh_proto::xplane::{
    XEvent, XLine, XPlane, XSpace, XStat, XStatMetadata, x_event, x_stat,
};
use clockmesh_trace::synth::{SynthSpec, event_plane, task_env_plane};
use clockmesh_trace::{
    DeviceClockSpec, DeviceError, MergeError, MergeOptions, MergeReport, OffsetSource, SpecError,
    merge,
};

/// Session start of the GPU host (its CLOCK_REALTIME).
const S: i64 = 1_795_335_288_621_242_594;
const HOST: &str = "gpuhost";
/// Truth: host = device + OFF0 + DRIFT·(device − A0); the device is 3.4 s
/// ahead and slow by 21.7 ppm, like an H100's %globaltimer.
const OFF0: i64 = -3_456_789_012;
const DRIFT_PPB: f64 = 21_700.0;
const A0: u64 = (S - OFF0 - 20_000_000_000) as u64;
/// One map per 4 s window, each covering 30 s back and 2 s ahead.
const STEP: u64 = 4_000_000_000;
const MAPS: u64 = 14;
/// DRIFT · STEP, exact: each map's offset at its anchor is a whole ns.
const STEP_DRIFT_NS: i64 = 86_800;
/// The node's history entry (host REALTIME → global).
const NODE_ANCHOR: i64 = S - 5_000_000_000;
const NODE_OFF: i64 = -1_234_567;
const NODE_DRIFT_PPB: f64 = 500.0;
const NODE_BOUND: u64 = 400;
const PLANE: &str = "/custom:globaltimer:0";

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("clockmesh-devtrace-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Exact global time (ps) of a device time (ps), rounded to 1 ps.
fn truth_ps(d_ps: i128) -> i128 {
    let dev = DRIFT_PPB * 1e-9 * (d_ps - i128::from(A0) * 1000) as f64;
    host_truth_ps(d_ps + i128::from(OFF0) * 1000 + dev.round() as i128)
}

/// Exact global time (ps) of a host CLOCK_REALTIME time (ps).
fn host_truth_ps(host_ps: i128) -> i128 {
    let node = NODE_DRIFT_PPB * 1e-9 * (host_ps - i128::from(NODE_ANCHOR) * 1000) as f64;
    host_ps + i128::from(NODE_OFF) * 1000 + node.round() as i128
}

fn map_entry(i: u64, device: &str, domain: &str) -> DeviceHistoryEntry {
    let anchor = A0 + i * STEP;
    DeviceHistoryEntry {
        kind: "device".into(),
        host: HOST.into(),
        window: i,
        written_at_ns: anchor as i64,
        map: PublishedDeviceMap {
            device: device.into(),
            device_domain: domain.into(),
            source: "cuda-pingpong".into(),
            host_domain: "CLOCK_REALTIME".into(),
            anchor_device_ns: anchor,
            offset_at_anchor_ns: OFF0 + i as i64 * STEP_DRIFT_NS,
            drift_ppb: DRIFT_PPB,
            bound_ns: 1_700 + i,
            residual_rms_ns: 90.0,
            points: 300,
            valid_from_device_ns: anchor - 30_000_000_000,
            valid_until_device_ns: anchor + 2_000_000_000,
        },
    }
}

fn node_entry() -> HistoryEntry {
    HistoryEntry {
        host: HOST.into(),
        window: 7,
        anchor_ns: NODE_ANCHOR,
        offset_ns: NODE_OFF,
        drift_ppb: NODE_DRIFT_PPB,
        bound_ns: NODE_BOUND,
        valid_from_ns: Some(S - 60_000_000_000),
        valid_until_ns: Some(S + 60_000_000_000),
        reference: Some("ref".into()),
        ..HistoryEntry::default()
    }
}

/// The agent's JSONL: node and device lines (and an edge line to skip),
/// written with the real structs and read back as the CLI does.
fn write_history(dir: &Path, maps: &[DeviceHistoryEntry]) -> history::History {
    let p = dir.join("clockmesh.jsonl");
    std::fs::write(&p, "{\"type\":\"edge\",\"from\":\"a\"}\n").unwrap();
    history::append(&p, &node_entry()).unwrap();
    for m in maps {
        history::append_device(&p, m).unwrap();
    }
    let h = history::load_all(&p).unwrap();
    assert_eq!(h.nodes.len(), 1);
    assert_eq!(h.devices.len(), maps.len());
    h
}

fn ev(meta: i64, offset_ps: i64, duration_ps: i64) -> XEvent {
    XEvent {
        metadata_id: meta,
        duration_ps,
        data: Some(x_event::Data::OffsetPs(offset_ps)),
        stats: if offset_ps % 3 == 0 {
            vec![XStat {
                metadata_id: 9,
                value: Some(x_stat::Value::Int64Value(offset_ps)),
            }]
        } else {
            Vec::new()
        },
    }
}

fn line(id: i64, ts: i64, events: Vec<XEvent>) -> XLine {
    XLine {
        id,
        name: format!("stream{id}"),
        timestamp_ns: ts,
        events,
        ..Default::default()
    }
}

/// A plane in device time; `declare` = (clock_domain as str_value,
/// clock_device as ref_value, XLA's interned-string form).
fn device_plane(name: &str, declare: Option<(&str, &str)>, lines: Vec<XLine>) -> XPlane {
    let mut plane = XPlane {
        id: 77,
        name: name.into(),
        lines,
        ..Default::default()
    };
    if let Some((domain, device)) = declare {
        for (id, n) in [(1, "clock_domain"), (2, "clock_device"), (3, device)] {
            let m = XStatMetadata {
                id,
                name: n.into(),
                ..Default::default()
            };
            plane.stat_metadata.insert(id, m);
        }
        plane.stats = vec![
            XStat {
                metadata_id: 1,
                value: Some(x_stat::Value::StrValue(domain.into())),
            },
            XStat {
                metadata_id: 2,
                value: Some(x_stat::Value::RefValue(3)),
            },
        ];
    }
    plane
}

/// Lines of raw %globaltimer values: session-relative (XLA normalized
/// them), one absolute (started before the session), one with only an
/// aggregated event.
fn globaltimer_lines() -> Vec<XLine> {
    let mut l1 = line(
        1,
        4_000_000_000,
        (0..40)
            .map(|i| ev(1, i * 75_000_000_123, 1_000_000 + i * 7_777))
            .collect(),
    );
    l1.duration_ps = 3_100_000_000_000;
    vec![
        l1,
        // 5 s of events: crosses several maps' nearest-anchor boundaries.
        line(
            2,
            9_000_000_000,
            (0..40)
                .map(|i| ev(2, i * 125_000_000_321, 250_000_000 + i))
                .collect(),
        ),
        line(
            3,
            S - 1_000_000_000,
            (0..10).map(|i| ev(1, i * 1_000_000_007, 5_000)).collect(),
        ),
        line(
            4,
            6_000_000_000,
            vec![XEvent {
                metadata_id: 1,
                duration_ps: 777,
                data: Some(x_event::Data::NumOccurrences(5)),
                stats: Vec::new(),
            }],
        ),
    ]
}

struct Fixture {
    dir: PathBuf,
    inputs: Vec<PathBuf>,
    opts: MergeOptions,
}

/// gpuhost: /host:CPU, a CUPTI-style /device:GPU:0 (host time), `plane`,
/// Task Environment; node offset from the history. other: an earlier
/// host with --offset 0, so gpuhost's shift is not zero.
fn fixture(name: &str, plane: XPlane, maps: &[DeviceHistoryEntry]) -> Fixture {
    let dir = scratch(name);
    let spec = SynthSpec {
        host: HOST.into(),
        start_ns: S,
        ..SynthSpec::default()
    };
    let space = XSpace {
        planes: vec![
            event_plane(&spec, 0),
            event_plane(&spec, 1),
            plane,
            task_env_plane(&spec),
        ],
        hostnames: vec![HOST.into()],
        ..Default::default()
    };
    let gpu = dir.join(format!("{HOST}.xplane.pb"));
    std::fs::write(&gpu, space.encode_to_vec()).unwrap();
    let other_spec = SynthSpec {
        host: "other".into(),
        start_ns: S - 2_000_000_000,
        ..SynthSpec::default()
    };
    let other = dir.join("other.xplane.pb");
    let mut f = std::fs::File::create(&other).unwrap();
    clockmesh_trace::synth::write_synthetic(&mut f, &other_spec).unwrap();
    let h = write_history(&dir, maps);
    let opts = MergeOptions {
        out_dir: dir.join("out"),
        run_name: "run1".into(),
        offsets: [("other".to_string(), 0)].into_iter().collect(),
        history: h.nodes,
        device_history: h.devices,
        ..MergeOptions::default()
    };
    Fixture {
        dir,
        inputs: vec![gpu, other],
        opts,
    }
}

fn all_maps() -> Vec<DeviceHistoryEntry> {
    (0..MAPS)
        .map(|i| map_entry(i, "nvidia:0", "cuda-globaltimer"))
        .collect()
}

/// The device error inside a merge error.
fn dev(e: &MergeError) -> &DeviceError {
    match e {
        MergeError::Device(d) => d,
        other => panic!("not a device error: {other}"),
    }
}

fn decode(p: &Path) -> XSpace {
    XSpace::decode(std::fs::read(p).unwrap().as_slice()).unwrap()
}

fn plane<'a>(s: &'a XSpace, name: &str) -> &'a XPlane {
    s.planes.iter().find(|p| p.name == name).unwrap()
}

fn offset_of(e: &XEvent) -> i64 {
    match e.data {
        Some(x_event::Data::OffsetPs(o)) => o,
        None => 0,
        Some(x_event::Data::NumOccurrences(_)) => panic!("aggregated"),
    }
}

/// Device time (ps) of a stored line timestamp, as XLA wrote it.
fn line_device_ps(ts: i64) -> i128 {
    if ts.unsigned_abs() >= 1_000_000_000_000_000_000 {
        i128::from(ts) * 1000
    } else {
        (i128::from(ts) + i128::from(S)) * 1000
    }
}

fn merged(report: &MergeReport, host: &str) -> XSpace {
    decode(&report.run_dir.join(format!("{host}.xplane.pb")))
}

/// Checks every timed event of `out_plane` against the truth; returns how many.
fn assert_placed(input: &XPlane, output: &XPlane, origin: i64) -> u64 {
    assert_placed_by(input, output, origin, truth_ps)
}

/// [`assert_placed`] with the plane's own truth (device or host clock).
fn assert_placed_by(
    input: &XPlane,
    output: &XPlane,
    origin: i64,
    truth_ps: fn(i128) -> i128,
) -> u64 {
    let mut n = 0;
    for (li, lo) in input.lines.iter().zip(&output.lines) {
        assert_eq!((li.id, &li.name), (lo.id, &lo.name));
        let base = line_device_ps(li.timestamp_ns);
        let out_base = (i128::from(origin) + i128::from(lo.timestamp_ns)) * 1000;
        for (ei, eo) in li.events.iter().zip(&lo.events) {
            assert_eq!((ei.metadata_id, &ei.stats), (eo.metadata_id, &eo.stats));
            if matches!(ei.data, Some(x_event::Data::NumOccurrences(_))) {
                continue;
            }
            let start = base + i128::from(offset_of(ei));
            let end = start + i128::from(ei.duration_ps);
            let (want_start, want_end) = (truth_ps(start), truth_ps(end));
            let got = out_base + i128::from(offset_of(eo));
            assert!(offset_of(eo) >= 0, "line {}: negative offset", li.id);
            assert!(
                (got - want_start).abs() <= 2,
                "line {} event at device {start} ps: start off by {} ps",
                li.id,
                got - want_start
            );
            let dur_err = i128::from(eo.duration_ps) - (want_end - want_start);
            assert!(
                dur_err.abs() <= 2,
                "line {}: duration off by {dur_err} ps",
                li.id
            );
            n += 1;
        }
    }
    n
}

#[test]
fn declared_device_plane_lands_on_truth_and_other_planes_only_shift() {
    let input_plane = device_plane(
        PLANE,
        Some(("cuda-globaltimer", "nvidia:0")),
        globaltimer_lines(),
    );
    let fx = fixture("declared", input_plane.clone(), &all_maps());
    let report = merge(&fx.inputs, &fx.opts, &mut |_| {}).unwrap();
    let gpu = &report.hosts[0];
    assert_eq!(gpu.source, OffsetSource::History);
    let off_at_start = NODE_OFF + (NODE_DRIFT_PPB * 5.0).round() as i64;
    assert_eq!(gpu.offset_ns, off_at_start);
    let origin = S - 2_000_000_000;
    assert_eq!(report.origin_ns, origin);

    let out = merged(&report, HOST);
    let placed = assert_placed(&input_plane, plane(&out, PLANE), origin);
    assert_eq!(placed, 40 + 40 + 10);

    // The line's own duration is placed too (3.1 s of device time).
    let (li, lo) = (&input_plane.lines[0], &plane(&out, PLANE).lines[0]);
    let end = truth_ps(line_device_ps(li.timestamp_ns) + i128::from(li.duration_ps));
    let out_start = (i128::from(origin) + i128::from(lo.timestamp_ns)) * 1000;
    assert!((out_start + i128::from(lo.duration_ps) - end).abs() <= 2);
    // 3.1 s grew by 21.7 ppm (device → host: 67 270 000 ps), then by 0.5 ppm
    // (host → global: 1 550 034 ps); plus the sub-ns part of the line start,
    // which the whole-ns line timestamp drops.
    let growth = lo.duration_ps - li.duration_ps - 68_820_034;
    assert!((-2..1002).contains(&growth), "{growth}");

    // The aggregated-only line is placed at its timestamp through the node
    // map, its event untouched.
    assert_eq!(gpu.shift_ns, S + off_at_start - origin);
    let (li, lo) = (&input_plane.lines[3], &plane(&out, PLANE).lines[3]);
    let at = host_truth_ps(line_device_ps(li.timestamp_ns)).div_euclid(1000);
    assert_eq!(i128::from(lo.timestamp_ns), at - i128::from(origin));
    assert_eq!(lo.events, li.events);

    // Host and CUPTI planes are host time: every event through the node's
    // drifting map (0.5 ppm), not one shift.
    let input = decode(&fx.inputs[0]);
    let mut host_events = 0;
    for name in ["/host:CPU", "/device:GPU:0"] {
        host_events += assert_placed_by(
            plane(&input, name),
            plane(&out, name),
            origin,
            host_truth_ps,
        );
    }
    assert_eq!(gpu.events_placed, host_events);
    assert!(host_events > 0);
    // Plane stats and metadata survive, and the plane's worst bound is added.
    let (got, want) = (plane(&out, PLANE), &input_plane);
    assert_eq!(&got.stats[1..], &want.stats[..]);
    let bound_id = got.stats[0].metadata_id;
    assert_eq!(
        got.stat_metadata[&bound_id].name,
        "clock_alignment_bound_ns"
    );
    assert_eq!(
        got.stats[0].value,
        Some(x_stat::Value::Uint64Value(
            gpu.device_planes[0].worst_bound_ns
        ))
    );
    for (id, m) in &want.stat_metadata {
        assert_eq!(&got.stat_metadata[id], m);
    }

    let d = &gpu.device_planes[0];
    assert_eq!((d.plane.as_str(), d.device.as_str()), (PLANE, "nvidia:0"));
    assert_eq!(d.map_domain, "cuda-globaltimer");
    assert_eq!((d.events_mapped, d.lines_mapped), (90, 3));
    assert!(d.node_bound_known);
    // Latest times (≈ S+14 s device) go through map 8 or 9: bound 1708..1709 + node 400.
    assert!(
        (1_700 + 8 + NODE_BOUND..=1_700 + 9 + NODE_BOUND).contains(&d.worst_bound_ns),
        "{}",
        d.worst_bound_ns
    );
    assert!(report.hosts[1].device_planes.is_empty());
    // The merged output scans and re-merges structurally intact.
    let rescan = clockmesh_trace::scan_file(&report.run_dir.join("gpuhost.xplane.pb")).unwrap();
    assert_eq!(rescan.planes[2].clock_device.as_deref(), Some("nvidia:0"));
    std::fs::remove_dir_all(&fx.dir).unwrap();
}

#[test]
fn flag_opts_a_plane_in_and_overlapping_maps_pick_the_nearest_anchor() {
    // Two maps over the same 40 s; they disagree by 10 µs, so the output
    // shows which one placed each event. No drift, node offset 0 (flag).
    let x = (S + 1_000_000_000) as u64;
    let entry = |anchor_s: u64, offset: i64| {
        let mut e = map_entry(0, "nvidia:1", "cuda-globaltimer");
        e.map.anchor_device_ns = x + anchor_s * 1_000_000_000;
        e.map.offset_at_anchor_ns = offset;
        e.map.drift_ppb = 0.0;
        e.map.valid_from_device_ns = x;
        e.map.valid_until_device_ns = x + 40_000_000_000;
        e
    };
    let maps = vec![entry(25, 10_000), entry(5, 0)];
    let sec = 1_000_000_000_000i64; // ps
    // Device times after x: 6 s, 14 s, 14.9 s (+1 s, ending past the
    // midpoint: still the start's map), 16 s, 30 s.
    let events = vec![
        ev(1, 0, 1000),
        ev(1, 8 * sec, 1000),
        ev(1, 8 * sec + 900_000_000_000, sec),
        ev(1, 10 * sec, 1000),
        ev(1, 24 * sec, 1000),
    ];
    let plane_in = device_plane("/custom:timers", None, vec![line(1, 7_000_000_000, events)]);
    let mut fx = fixture("nearest", plane_in, &maps);
    fx.opts.offsets.insert(HOST.into(), 0);
    fx.opts.device_clocks = vec!["gpuhost:/custom:timers=nvidia:1".parse().unwrap()];
    let report = merge(&fx.inputs, &fx.opts, &mut |_| {}).unwrap();
    let origin = report.origin_ns;
    let out = merged(&report, HOST);
    let lo = &plane(&out, "/custom:timers").lines[0];
    let starts: Vec<i128> = lo
        .events
        .iter()
        .map(|e| {
            (i128::from(origin) + i128::from(lo.timestamp_ns)) * 1000 + i128::from(offset_of(e))
        })
        .collect();
    let at =
        |s_after_x: i128, ps: i128| (i128::from(x as i64) + s_after_x * 1_000_000_000) * 1000 + ps;
    assert_eq!(starts[0], at(6, 0), "6 s: map anchored at 5 s");
    assert_eq!(starts[1], at(14, 0), "14 s: map anchored at 5 s");
    assert_eq!(starts[2], at(14, 900_000_000_000));
    assert_eq!(
        lo.events[2].duration_ps, sec,
        "one map over the whole event"
    );
    assert_eq!(starts[3], at(16, 10_000_000), "16 s: map anchored at 25 s");
    assert_eq!(starts[4], at(30, 10_000_000));
    let d = &report.hosts[0].device_planes[0];
    assert!(!d.node_bound_known, "--offset has no bound");
    assert_eq!(d.events_mapped, 5);
    std::fs::remove_dir_all(&fx.dir).unwrap();
}

#[test]
fn time_outside_every_map_fails_closed_with_nothing_written() {
    let mut lines = globaltimer_lines();
    // Past the newest map's valid_until (A0 + 13·4 s + 2 s).
    let beyond = A0 + (MAPS - 1) * STEP + 2_000_000_001;
    lines[1]
        .events
        .push(ev(3, (beyond as i64 - S - 9_000_000_000) * 1000, 10));
    let fx = fixture(
        "outside",
        device_plane(PLANE, Some(("cuda-globaltimer", "nvidia:0")), lines),
        &all_maps(),
    );
    let err = merge(&fx.inputs, &fx.opts, &mut |_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(dev(&err), DeviceError::Unmapped { device_ns, .. } if *device_ns == i128::from(beyond)),
        "{msg}"
    );
    for needle in [
        fx.inputs[0].display().to_string(),
        PLANE.to_string(),
        "nvidia:0".into(),
        beyond.to_string(),
        "outside every published map".into(),
    ] {
        assert!(msg.contains(&needle), "{needle:?} missing from {msg}");
    }
    assert!(
        !fx.dir.join("out").exists(),
        "output written despite the error"
    );

    // Without any map of the device: refused too.
    let mut fx2 = fixture(
        "nomaps",
        device_plane(PLANE, None, globaltimer_lines()),
        &all_maps(),
    );
    fx2.opts.device_clocks = vec![format!("{PLANE}=nvidia:7").parse().unwrap()];
    let err = merge(&fx2.inputs, &fx2.opts, &mut |_| {}).unwrap_err();
    assert!(matches!(dev(&err), DeviceError::NoMaps { .. }), "{err}");
    assert!(err.to_string().contains("nvidia:7"), "{err}");
    assert!(!fx2.dir.join("out").exists());
    for dir in [fx.dir, fx2.dir] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn domain_mismatch_and_undeclared_device_are_errors() {
    let fx = fixture(
        "mismatch",
        device_plane(
            PLANE,
            Some(("amdgpu-clock-counter", "nvidia:0")),
            globaltimer_lines(),
        ),
        &all_maps(),
    );
    let err = merge(&fx.inputs, &fx.opts, &mut |_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(dev(&err), DeviceError::DomainMismatch { .. }),
        "{msg}"
    );
    assert!(
        msg.contains("amdgpu-clock-counter") && msg.contains("cuda-globaltimer"),
        "{msg}"
    );
    // The flag names the device, but the declared domain still must match.
    let mut o = fx.opts.clone();
    o.device_clocks = vec![format!("{PLANE}=nvidia:0").parse().unwrap()];
    let err = merge(&fx.inputs, &o, &mut |_| {}).unwrap_err();
    assert!(
        matches!(dev(&err), DeviceError::DomainMismatch { .. }),
        "{err}"
    );
    // --ignore-device-clocks: the plane is taken as host time, placed
    // through the node's map alone.
    o.device_clocks.clear();
    o.ignore_device_clocks = true;
    let report = merge(&fx.inputs, &o, &mut |_| {}).unwrap();
    assert!(report.hosts[0].device_planes.is_empty());
    let out = merged(&report, HOST);
    let input = decode(&fx.inputs[0]);
    let placed = assert_placed_by(
        plane(&input, PLANE),
        plane(&out, PLANE),
        report.origin_ns,
        host_truth_ps,
    );
    assert_eq!(placed, 90);

    // A device domain with no device: refused, pointing at the flag.
    let mut p = device_plane(
        PLANE,
        Some(("cuda-globaltimer", "nvidia:0")),
        globaltimer_lines(),
    );
    p.stats.truncate(1);
    let fx2 = fixture("nodevice", p, &all_maps());
    let err = merge(&fx2.inputs, &fx2.opts, &mut |_| {}).unwrap_err();
    assert!(matches!(dev(&err), DeviceError::NoDevice { .. }), "{err}");
    assert!(err.to_string().contains("--device-clock"), "{err}");
    // Declared CLOCK_REALTIME: host time, plain shift, no maps needed.
    let p = device_plane(
        PLANE,
        Some(("CLOCK_REALTIME", "nvidia:0")),
        globaltimer_lines(),
    );
    let fx3 = fixture("realtime", p, &[]);
    let report = merge(&fx3.inputs, &fx3.opts, &mut |_| {}).unwrap();
    assert!(report.hosts[0].device_planes.is_empty());
    for dir in [fx.dir, fx2.dir, fx3.dir] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn counter_clock_values_are_taken_raw() {
    // amdgpu-clock-counter: ns since GPU reset, far below any epoch value,
    // so XLA never normalized them: stored line timestamps are raw.
    let anchor = 50_000_000_000_000u64;
    let host_at_anchor = S + 3_000_000_000;
    let mut e = map_entry(0, "amd:4660", "amdgpu-clock-counter");
    e.map.anchor_device_ns = anchor;
    e.map.offset_at_anchor_ns = host_at_anchor - anchor as i64;
    e.map.drift_ppb = -5_000.0;
    e.map.valid_from_device_ns = anchor - 30_000_000_000;
    e.map.valid_until_device_ns = anchor + 2_000_000_000;
    let ts = (anchor - 1_000_000_000) as i64;
    let lines = vec![line(
        1,
        ts,
        vec![ev(1, 0, 2_000_000), ev(1, 500_000_000_000, 1_000)],
    )];
    let p = device_plane(
        "/custom:kfd",
        Some(("amdgpu-clock-counter", "amd:4660")),
        lines,
    );
    let mut fx = fixture("counter", p, &[e]);
    fx.opts.offsets.insert(HOST.into(), 0);
    let report = merge(&fx.inputs, &fx.opts, &mut |_| {}).unwrap();
    let out = merged(&report, HOST);
    let lo = &plane(&out, "/custom:kfd").lines[0];
    let start = |e: &XEvent| {
        (i128::from(report.origin_ns) + i128::from(lo.timestamp_ns)) * 1000
            + i128::from(offset_of(e))
    };
    // 1 s before the anchor at −5 ppm: host = anchor's host − 1 s + 5 µs.
    let want0 = (i128::from(host_at_anchor) - 1_000_000_000 + 5_000) * 1000;
    assert_eq!(start(&lo.events[0]), want0);
    let want1 = want0 + 500_000_000_000 - 2_500_000;
    assert_eq!(start(&lo.events[1]), want1);
    assert_eq!(lo.events[0].duration_ps, 2_000_000 - 10);
    std::fs::remove_dir_all(&fx.dir).unwrap();
}

#[test]
fn device_clock_flags_parse_and_typos_are_refused() {
    let s: DeviceClockSpec = "/device:GPU:0=nvidia:0".parse().unwrap();
    assert_eq!(
        (s.host, s.plane.as_str(), s.device.as_str()),
        (None, "/device:GPU:0", "nvidia:0")
    );
    let s: DeviceClockSpec = "host-a:/device:GPU:3=nvidia:3".parse().unwrap();
    assert_eq!(s.host.as_deref(), Some("host-a"));
    assert_eq!(s.plane, "/device:GPU:3");
    assert_eq!(s.to_string(), "host-a:/device:GPU:3=nvidia:3");
    let s: DeviceClockSpec = "gpu_timers=amd:4660".parse().unwrap();
    assert_eq!((s.host, s.plane.as_str()), (None, "gpu_timers"));
    let s: DeviceClockSpec = ":a:b=nvidia:0".parse().unwrap();
    assert_eq!((s.host.as_deref(), s.plane.as_str()), (None, "a:b"));
    assert_eq!(s.to_string(), ":a:b=nvidia:0");
    let bad = |t: &str| t.parse::<DeviceClockSpec>().unwrap_err();
    assert_eq!(
        bad("/device:GPU:0"),
        SpecError::Syntax("/device:GPU:0".into())
    );
    assert!(
        bad("/device:GPU:0")
            .to_string()
            .contains("[HOST:]PLANE=DEVICE")
    );
    assert!(matches!(bad("=nvidia:0"), SpecError::NoPlane(_)));
    assert!(matches!(bad("host-a:=nvidia:0"), SpecError::NoPlane(_)));
    assert!(matches!(bad("/device:GPU:0="), SpecError::NoDevice(_)));
    assert!(matches!(
        bad("/device:GPU:0=nvidia 0"),
        SpecError::NoDevice(_)
    ));

    // A flag naming no plane of any input is a typo: refused, nothing written.
    let mut fx = fixture(
        "typo",
        device_plane(PLANE, None, globaltimer_lines()),
        &all_maps(),
    );
    fx.opts.device_clocks = vec!["/custom:globaltimer:9=nvidia:0".parse().unwrap()];
    let err = merge(&fx.inputs, &fx.opts, &mut |_| {}).unwrap_err();
    assert!(matches!(dev(&err), DeviceError::Unused { .. }), "{err}");
    assert!(err.to_string().contains("/custom:globaltimer:9"), "{err}");
    fx.opts.device_clocks = vec![format!("nohost:{PLANE}=nvidia:0").parse().unwrap()];
    let err = merge(&fx.inputs, &fx.opts, &mut |_| {}).unwrap_err();
    assert!(err.to_string().contains("no host nohost"), "{err}");
    // Two flags giving one plane different devices.
    fx.opts.device_clocks = vec![
        format!("{PLANE}=nvidia:0").parse().unwrap(),
        format!("{PLANE}=nvidia:1").parse().unwrap(),
    ];
    let err = merge(&fx.inputs, &fx.opts, &mut |_| {}).unwrap_err();
    assert!(matches!(dev(&err), DeviceError::Conflict { .. }), "{err}");
    // A host-specific flag wins over a generic one.
    fx.opts.device_clocks = vec![
        format!("{PLANE}=nvidia:9").parse().unwrap(),
        format!("{HOST}:{PLANE}=nvidia:0").parse().unwrap(),
    ];
    let report = merge(&fx.inputs, &fx.opts, &mut |_| {}).unwrap();
    assert_eq!(report.hosts[0].device_planes[0].device, "nvidia:0");
    assert!(
        !fx.dir
            .join("out/plugins/profile")
            .read_dir()
            .unwrap()
            .any(|e| { e.unwrap().file_name().to_string_lossy().contains(".tmp") })
    );
    std::fs::remove_dir_all(&fx.dir).unwrap();
}
