//! `trace merge` on synthetic traces built with the prost types: exact
//! shifts, byte-for-byte preservation of everything else (unknown fields
//! included), absolute and missing line timestamps, offsets from the hook
//! stats and the history, the Chrome JSON, and per-file errors with no
//! partial output.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

mod common;

use clockmesh_offsets::history::HistoryEntry;
use clockmesh_proto::prost::Message;
use clockmesh_proto::xplane::{XLine, XSpace, x_event, x_stat};
use clockmesh_trace::synth::{SynthSpec, event_plane, task_env_plane, write_synthetic};
use clockmesh_trace::{MergeError, MergeOptions, OffsetSource, merge, scan_file};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("clockmesh-trace-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_trace(dir: &Path, spec: &SynthSpec) -> PathBuf {
    let p = dir.join(format!("{}.xplane.pb", spec.host));
    let mut f = std::fs::File::create(&p).unwrap();
    write_synthetic(&mut f, spec).unwrap();
    p
}

fn opts(out: &Path, offsets: &[(&str, i64)]) -> MergeOptions {
    MergeOptions {
        out_dir: out.to_path_buf(),
        run_name: "run1".into(),
        offsets: offsets
            .iter()
            .map(|(h, o)| (h.to_string(), *o))
            .collect::<HashMap<_, _>>(),
        ..MergeOptions::default()
    }
}

fn decode(p: &Path) -> XSpace {
    XSpace::decode(std::fs::read(p).unwrap().as_slice()).unwrap()
}

fn task_env_u64(space: &XSpace, name: &str) -> u64 {
    let plane = space
        .planes
        .iter()
        .find(|p| p.name == "Task Environment")
        .unwrap();
    let id = plane
        .stat_metadata
        .values()
        .find(|m| m.name == name)
        .unwrap()
        .id;
    match plane
        .stats
        .iter()
        .find(|s| s.metadata_id == id)
        .unwrap()
        .value
    {
        Some(x_stat::Value::Uint64Value(v)) => v,
        Some(x_stat::Value::Int64Value(v)) => v as u64,
        ref other => panic!("{other:?}"),
    }
}

#[test]
fn zero_shift_output_is_byte_identical() {
    let dir = scratch("identity");
    let input = write_trace(&dir, &SynthSpec::default());
    let report = merge(
        std::slice::from_ref(&input),
        &opts(&dir.join("out"), &[("host", 0)]),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(report.hosts[0].shift_ns, 0);
    let out = report.run_dir.join("host.xplane.pb");
    assert_eq!(std::fs::read(out).unwrap(), std::fs::read(input).unwrap());
}

#[test]
fn two_hosts_are_shifted_exactly_and_everything_else_is_kept() {
    let dir = scratch("two");
    let a = SynthSpec {
        host: "hostA".into(),
        ..SynthSpec::default()
    };
    // hostB's clock started its session 118 s later by its own clock and is
    // 2.5 ms ahead of the global timeline (offset = global - local).
    let b = SynthSpec {
        host: "hostB".into(),
        start_ns: a.start_ns + 118_000_000_000,
        ..SynthSpec::default()
    };
    let (pa, pb) = (write_trace(&dir, &a), write_trace(&dir, &b));
    let (off_a, off_b) = (1_000, -2_500_000);
    let report = merge(
        &[pa.clone(), pb.clone()],
        &opts(&dir.join("out"), &[("hostA", off_a), ("hostB", off_b)]),
        &mut |_| {},
    )
    .unwrap();
    let origin = a.start_ns + off_a;
    assert_eq!(report.origin_ns, origin);
    let shift_b = b.start_ns + off_b - origin;
    assert_eq!(report.hosts[1].shift_ns, shift_b);
    assert_eq!(report.hosts[1].source, OffsetSource::Flag);

    for (spec, input, shift, off) in [(&a, &pa, 0, off_a), (&b, &pb, shift_b, off_b)] {
        let out_path = report.run_dir.join(format!("{}.xplane.pb", spec.host));
        let (before, after) = (decode(input), decode(&out_path));
        let mut expected = before.clone();
        for plane in &mut expected.planes {
            for line in &mut plane.lines {
                line.timestamp_ns += shift;
            }
        }
        // Only timestamps and the session stats differ.
        assert_eq!(task_env_u64(&after, "profile_start_time"), origin as u64);
        assert_eq!(
            task_env_u64(&after, "profile_stop_time"),
            (spec.start_ns + spec.duration_ns + off) as u64
        );
        let te = |s: &mut XSpace| s.planes.retain(|p| p.name != "Task Environment");
        let (mut after_events, mut expected_events) = (after.clone(), expected);
        te(&mut after_events);
        te(&mut expected_events);
        assert_eq!(after_events, expected_events, "{}", spec.host);
        // Absolute event time on the global timeline:
        // profile_start_time' + ts' + offset = S + off + ts + offset.
        let ev_in = &before.planes[0].lines[1];
        let ev_out = &after.planes[0].lines[1];
        let abs = |start: i64, l: &XLine| match l.events[3].data {
            Some(x_event::Data::OffsetPs(o)) => {
                (i128::from(start) + i128::from(l.timestamp_ns)) * 1000 + i128::from(o)
            }
            _ => unreachable!(),
        };
        assert_eq!(abs(origin, ev_out), abs(spec.start_ns + off, ev_in));
    }
}

/// Appends raw fields no schema knows to messages at several depths.
fn trace_with_unknown_fields(dir: &Path) -> (PathBuf, Vec<Vec<u8>>) {
    let spec = SynthSpec {
        host: "odd".into(),
        ..SynthSpec::default()
    };
    let mut plane = event_plane(&spec, 0);
    // Line 0 has no timestamp field at all (proto3 default 0): an insert.
    plane.lines[0].timestamp_ns = 0;
    // Line 1 holds an absolute epoch value (un-normalized collector).
    plane.lines[1].timestamp_ns = spec.start_ns - 7_000;
    let markers: Vec<Vec<u8>> = vec![
        vec![0xf8, 0x06, 0x2a],                   // field 111 varint 42
        vec![0x9a, 0x07, 0x03, b'x', b'y', b'z'], // field 115 bytes "xyz"
        vec![0xa5, 0x07, 1, 2, 3, 4],             // field 116 fixed32
    ];
    let mut plane_bytes = Vec::new();
    for (i, line) in plane.lines.iter().enumerate() {
        let mut lb = line.encode_to_vec();
        if i == 2 {
            lb.extend_from_slice(&markers[0]); // unknown field inside an XLine
        }
        plane_bytes.push(0x1a);
        clockmesh_trace::wire::put_varint(&mut plane_bytes, lb.len() as u64);
        plane_bytes.extend_from_slice(&lb);
    }
    let mut rest = plane.clone();
    rest.lines.clear();
    plane_bytes.extend_from_slice(&rest.encode_to_vec());
    plane_bytes.extend_from_slice(&markers[1]); // unknown field in the XPlane
    let mut te = task_env_plane(&spec);
    te.stats.push(clockmesh_proto::xplane::XStat {
        metadata_id: 77,
        value: Some(x_stat::Value::CompressedStrValue(vec![0x1f, 0x8b, 9, 9])),
    });
    let mut file = Vec::new();
    for body in [plane_bytes, te.encode_to_vec()] {
        file.push(0x0a);
        clockmesh_trace::wire::put_varint(&mut file, body.len() as u64);
        file.extend_from_slice(&body);
    }
    file.extend_from_slice(&markers[2]); // unknown field in the XSpace
    file.extend_from_slice(&[0x22, 3, b'o', b'd', b'd']);
    let p = dir.join("odd.xplane.pb");
    std::fs::write(&p, &file).unwrap();
    (p, markers)
}

#[test]
fn unknown_fields_absolute_and_missing_timestamps() {
    let dir = scratch("unknown");
    let (input, markers) = trace_with_unknown_fields(&dir);
    let start = scan_file(&input).unwrap().profile_start_ns().unwrap();
    // A large shift changes varint lengths (and so every enclosing length).
    let off = 3_000_000_000_000i64;
    let other = SynthSpec {
        host: "ref".into(),
        start_ns: start + 5_000_000_000_000,
        ..SynthSpec::default()
    };
    let other_path = write_trace(&dir, &other);
    let report = merge(
        &[input.clone(), other_path],
        &opts(&dir.join("out"), &[("odd", off), ("ref", 0)]),
        &mut |_| {},
    )
    .unwrap();
    let origin = start + off;
    assert_eq!(report.origin_ns, origin);
    assert_eq!(report.hosts[0].lines_absolute, 1);
    let out = std::fs::read(report.run_dir.join("odd.xplane.pb")).unwrap();
    for m in &markers {
        assert!(
            out.windows(m.len()).any(|w| w == m.as_slice()),
            "marker {m:x?} lost"
        );
    }
    assert!(
        out.windows(5).any(|w| w == [0x42, 4, 0x1f, 0x8b, 9]),
        "compressed_str_value lost"
    );
    let space = XSpace::decode(out.as_slice()).unwrap();
    let lines = &space.planes[0].lines;
    assert_eq!(
        lines[0].timestamp_ns, 0,
        "relative 0 on the earliest host stays 0"
    );
    assert_eq!(
        lines[1].timestamp_ns, -7_000,
        "absolute value mapped to the origin"
    );
    assert_eq!(lines[2].timestamp_ns, 5448 + 2);
    // Re-scanning the output finds the same structure.
    let rescan = scan_file(&report.run_dir.join("odd.xplane.pb")).unwrap();
    assert_eq!(rescan.events(), scan_file(&input).unwrap().events());

    // Same file as the later host: line 0 needs an inserted timestamp.
    let report = merge(
        &[
            input,
            write_trace(
                &dir,
                &SynthSpec {
                    host: "early".into(),
                    start_ns: start - 1_000_000,
                    ..SynthSpec::default()
                },
            ),
        ],
        &MergeOptions {
            run_name: "run2".into(),
            ..opts(&dir.join("out"), &[("odd", 0), ("early", 0)])
        },
        &mut |_| {},
    )
    .unwrap();
    let out = std::fs::read(report.run_dir.join("odd.xplane.pb")).unwrap();
    let space = XSpace::decode(out.as_slice()).unwrap();
    assert_eq!(space.planes[0].lines[0].timestamp_ns, 1_000_000);
    assert_eq!(space.planes[0].lines[1].timestamp_ns, 1_000_000 - 7_000);
    for m in &markers {
        assert!(out.windows(m.len()).any(|w| w == m.as_slice()));
    }
}

#[test]
fn offsets_come_from_hook_stats_then_history() {
    let dir = scratch("sources");
    let hooked = SynthSpec {
        host: "hooked".into(),
        task_env_stats: vec![("clock_offset_ns".into(), -40_000)],
        ..SynthSpec::default()
    };
    let logged = SynthSpec {
        host: "logged".into(),
        ..SynthSpec::default()
    };
    let inputs = [write_trace(&dir, &hooked), write_trace(&dir, &logged)];
    let mut o = opts(&dir.join("out"), &[]);
    // Without any offset for "logged": a clear error naming the host, no output.
    let err = merge(&inputs, &o, &mut |_| {}).unwrap_err();
    assert!(
        matches!(err, MergeError::NoOffset { ref host, .. } if host == "logged"),
        "{err}"
    );
    assert!(!dir.join("out/plugins/profile/run1").exists());
    o.history = vec![HistoryEntry {
        host: "logged".into(),
        window: 4,
        anchor_ns: logged.start_ns - 1_000_000_000,
        offset_ns: 70_000,
        drift_ppb: 1000.0, // +1 µs over the 1 s to the session start
        bound_ns: 100,
        valid_from_ns: None,
        valid_until_ns: None,
        reference: None,
        ..HistoryEntry::default()
    }];
    let report = merge(&inputs, &o, &mut |_| {}).unwrap();
    assert_eq!(report.hosts[0].source, OffsetSource::Hook);
    assert_eq!(report.hosts[0].offset_ns, -40_000);
    assert_eq!(report.hosts[1].source, OffsetSource::History);
    assert_eq!(report.hosts[1].offset_ns, 71_000);
    assert_eq!(report.hosts[1].shift_ns, 111_000);
}

#[test]
fn bad_inputs_fail_per_file_without_partial_output() {
    let dir = scratch("bad");
    let good = write_trace(&dir, &SynthSpec::default());
    let bytes = std::fs::read(&good).unwrap();
    let truncated = dir.join("trunc.xplane.pb");
    std::fs::write(&truncated, &bytes[..bytes.len() - 20]).unwrap();
    let json = dir.join("json.xplane.pb");
    std::fs::write(&json, br#"{"traceEvents": []}"#).unwrap();
    let no_env = dir.join("noenv.xplane.pb");
    let spec = SynthSpec::default();
    let mut f = Vec::new();
    let plane = event_plane(&spec, 0).encode_to_vec();
    f.push(0x0a);
    clockmesh_trace::wire::put_varint(&mut f, plane.len() as u64);
    f.extend_from_slice(&plane);
    std::fs::write(&no_env, &f).unwrap();
    let empty = dir.join("empty.xplane.pb");
    std::fs::write(&empty, b"").unwrap();

    for (bad, needle) in [
        (&truncated, "truncated"),
        (&json, "not a valid xplane"),
        (&no_env, "Task Environment"),
        (&empty, "no planes"),
    ] {
        let out = dir.join("out");
        let err = merge(
            &[good.clone(), bad.clone()],
            &opts(&out, &[("host", 0)]),
            &mut |_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(&*bad.display().to_string()), "{err}");
        assert!(err.contains(needle), "{err}");
        let leftovers = std::fs::read_dir(out.join("plugins/profile"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(leftovers, 0, "partial output left for {}", bad.display());
    }
    // An existing run directory is never overwritten.
    let out = dir.join("out2");
    merge(
        std::slice::from_ref(&good),
        &opts(&out, &[("host", 0)]),
        &mut |_| {},
    )
    .unwrap();
    let err = merge(&[good], &opts(&out, &[("host", 0)]), &mut |_| {}).unwrap_err();
    assert!(matches!(err, MergeError::OutputExists(_)));
}

#[test]
fn perfetto_json_has_one_process_per_host_plane_and_aligned_times() {
    let dir = scratch("json");
    let a = SynthSpec {
        host: "a".into(),
        ..SynthSpec::default()
    };
    let b = SynthSpec {
        host: "b".into(),
        start_ns: a.start_ns + 1_000_000,
        ..SynthSpec::default()
    };
    let json = dir.join("merged.json");
    let mut o = opts(&dir.join("out"), &[("a", 0), ("b", 500_000)]);
    o.perfetto = Some(json.clone());
    merge(
        &[write_trace(&dir, &a), write_trace(&dir, &b)],
        &o,
        &mut |_| {},
    )
    .unwrap();
    let (v, names) = common::chrome_json(&json);
    let events = v["traceEvents"].as_array().unwrap();
    assert_eq!(
        names,
        [
            "a /host:CPU",
            "a /device:GPU:0",
            "a Task Environment",
            "b /host:CPU",
            "b /device:GPU:0",
            "b Task Environment"
        ]
    );
    let labels: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "process_labels")
        .map(|e| e["args"]["labels"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels.len(),
        6,
        "every process says how its host was placed"
    );
    assert!(
        labels[3].starts_with("b: offset 500000 ns, drift +0.0 ppb, bound "),
        "{labels:?}"
    );
    let first_ts = |pid: u64| {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == pid)
            .map(|e| e["ts"].as_f64().unwrap())
            .fold(f64::MAX, f64::min)
    };
    // b is shifted by 1 ms + 0.5 ms; same synthetic content otherwise.
    assert!((first_ts(2000) - first_ts(1000) - 1500.0).abs() < 1e-6);
    let xs = events.iter().filter(|e| e["ph"] == "X").count();
    assert_eq!(xs, 2 * 2 * 3 * 10);
}

#[test]
fn a_line_growing_past_a_varint_boundary_keeps_the_plane_length_right() {
    // Line content of exactly 127 bytes: one more byte needs a 2-byte
    // length prefix, which the plane's own length must count.
    let dir = scratch("boundary");
    let spec = SynthSpec {
        host: "h".into(),
        ..SynthSpec::default()
    };
    let line = XLine {
        id: 1,
        timestamp_ns: 1,
        name: "n".repeat(121),
        ..Default::default()
    };
    assert_eq!(line.encoded_len(), 127);
    let space = XSpace {
        planes: vec![
            clockmesh_proto::xplane::XPlane {
                name: "p".into(),
                lines: vec![line.clone(), line],
                ..Default::default()
            },
            task_env_plane(&spec),
        ],
        ..Default::default()
    };
    let input = dir.join("h.xplane.pb");
    std::fs::write(&input, space.encode_to_vec()).unwrap();
    let earlier = SynthSpec {
        host: "e".into(),
        start_ns: spec.start_ns - 1_000_000_000,
        ..SynthSpec::default()
    };
    let report = merge(
        &[input, write_trace(&dir, &earlier)],
        &opts(&dir.join("out"), &[("h", 0), ("e", 0)]),
        &mut |_| {},
    )
    .unwrap();
    let out_path = report.run_dir.join("h.xplane.pb");
    let out = decode(&out_path);
    for l in &out.planes[0].lines {
        assert_eq!(l.timestamp_ns, 1_000_000_001);
    }
    // Per line: timestamp 1 → 5 varint bytes, length prefix 1 → 2 bytes.
    let grown = std::fs::metadata(&out_path).unwrap().len() - space.encoded_len() as u64;
    assert_eq!(grown, 2 * (4 + 1));
}

/// Two JAX processes of one host, each writing `<host>.xplane.pb` into its
/// own run directory: one host map for both, outputs told apart by the
/// process (`jax_process_index` when each has one, else 1, 2, …).
#[test]
fn two_processes_of_one_host_share_its_map_and_keep_their_files() {
    let dir = scratch("processes");
    let spec = |index: Option<i64>, start_ns: i64| SynthSpec {
        host: "gpu-node".into(),
        start_ns,
        task_env_stats: index
            .map(|i| vec![("jax_process_index".to_string(), i)])
            .unwrap_or_default(),
        ..SynthSpec::default()
    };
    let a = spec(Some(0), SynthSpec::default().start_ns);
    let b = spec(Some(1), a.start_ns + 5_000_000);
    let (da, db) = (dir.join("p0"), dir.join("p1"));
    std::fs::create_dir_all(&da).unwrap();
    std::fs::create_dir_all(&db).unwrap();
    let (pa, pb) = (write_trace(&da, &a), write_trace(&db, &b));
    let off = -2_500_000;
    let report = merge(
        &[pa.clone(), pb.clone()],
        &opts(&dir.join("out"), &[("gpu-node", off)]),
        &mut |_| {},
    )
    .unwrap();
    assert!(report.hosts.iter().all(|h| h.host == "gpu-node"));
    assert!(report.hosts.iter().all(|h| h.offset_ns == off));
    assert_eq!(report.hosts[1].shift_ns, 5_000_000);
    for (name, spec) in [("gpu-node@p0.xplane.pb", &a), ("gpu-node@p1.xplane.pb", &b)] {
        let out = decode(&report.run_dir.join(name));
        assert_eq!(
            task_env_u64(&out, "profile_stop_time"),
            (spec.start_ns + spec.duration_ns + off) as u64,
            "{name}"
        );
    }
    // Without process indices: numbered in input order.
    let (c, d) = (spec(None, a.start_ns), spec(None, a.start_ns));
    let (dc, dd) = (dir.join("c"), dir.join("d"));
    std::fs::create_dir_all(&dc).unwrap();
    std::fs::create_dir_all(&dd).unwrap();
    let report = merge(
        &[write_trace(&dc, &c), write_trace(&dd, &d)],
        &opts(&dir.join("out2"), &[("gpu-node", 0)]),
        &mut |_| {},
    )
    .unwrap();
    assert!(report.run_dir.join("gpu-node@1.xplane.pb").exists());
    assert!(report.run_dir.join("gpu-node@2.xplane.pb").exists());
    assert!(!report.run_dir.join("gpu-node.xplane.pb").exists());
}
