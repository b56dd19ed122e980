//! Device-clock lines rewritten end to end, the line placer against `place_event`, and the event encoding.

use clockmesh_offsets::Nanos;
use std::fs::File;
use std::sync::Arc;

use super::event::{EventTimes, encode_event, event_times, new_event_len};
use super::placer::{LinePlacer, place_event};
use super::timeline::{Tally, Timeline};
use super::*;
use crate::merge::host_edits_except;
use crate::plan::{DevicePlaneReport, HostPlacement};
use crate::rewrite::{Plan, rewrite_with};
use crate::scan::{Scan, scan_file};
use crate::synth::{SynthSpec, task_env_plane};
use crate::wire::{WireReader, put_varint, varint_len};
use clockmesh_offsets::history::{DeviceHistoryEntry, DeviceMapIndex};
use clockmesh_offsets::{HostMap, PublishedDeviceMap};
use clockmesh_proto::prost::Message;
use clockmesh_proto::xplane::{XEvent, XLine, XPlane, XSpace, x_event};

const S: i64 = 1_795_335_288_621_242_594;
/// Host = device + 2^40 ns: the line timestamp grows from 5 to 6
/// varint bytes.
const OFF: i64 = 1 << 40;

fn len_field(out: &mut Vec<u8>, num: u64, body: &[u8]) {
    put_varint(out, (num << 3) | 2);
    put_varint(out, body.len() as u64);
    out.extend_from_slice(body);
}

fn event(offset: Option<i64>, duration_ps: i64) -> XEvent {
    XEvent {
        metadata_id: 1,
        duration_ps,
        data: offset.map(x_event::Data::OffsetPs),
        stats: Vec::new(),
    }
}

/// One device line: an event without an offset field, one at −5 ns
/// (10-byte varint), one at +1 ps, an aggregated one, and one with an
/// unknown field.
fn trace_bytes() -> (Vec<u8>, Vec<u8>) {
    let line = XLine {
        id: 1,
        timestamp_ns: 1_000_000_000,
        events: vec![
            event(None, 700),
            event(Some(-5_000), 300),
            event(Some(1), 0),
            XEvent {
                metadata_id: 2,
                duration_ps: 9,
                data: Some(x_event::Data::NumOccurrences(3)),
                stats: Vec::new(),
            },
        ],
        ..Default::default()
    };
    let mut line_bytes = line.encode_to_vec();
    let unknown = vec![0xf8, 0x06, 0x2a]; // field 111 = 42
    let mut ev = event(Some(2_000), 50).encode_to_vec();
    ev.extend_from_slice(&unknown);
    len_field(&mut line_bytes, 4, &ev);
    let mut plane = XPlane {
        id: 5,
        name: "dev".into(),
        ..Default::default()
    }
    .encode_to_vec();
    len_field(&mut plane, 3, &line_bytes);
    let mut file = Vec::new();
    len_field(&mut file, 1, &plane);
    let spec = SynthSpec {
        start_ns: S,
        ..SynthSpec::default()
    };
    len_field(&mut file, 1, &task_env_plane(&spec).encode_to_vec());
    (file, unknown)
}

fn map() -> DeviceHistoryEntry {
    let anchor = (S + 1_000_000_000) as u64;
    DeviceHistoryEntry {
        kind: "device".into(),
        host: "h".into(),
        window: 1,
        written_at_ns: 0,
        map: PublishedDeviceMap {
            device: "nvidia:0".into(),
            device_domain: "cuda-globaltimer".into(),
            source: "cuda-pingpong".into(),
            host_domain: "CLOCK_REALTIME".into(),
            anchor_device_ns: anchor,
            offset_at_anchor_ns: OFF,
            drift_ppb: 0.0,
            bound_ns: 10,
            residual_rms_ns: 1.0,
            points: 10,
            valid_from_device_ns: anchor - 1_000_000,
            valid_until_device_ns: anchor + 1_000_000,
        },
    }
}

/// Host "h" of the file at `path`, placed through `map`, nothing done yet.
fn test_placement(path: &std::path::Path, scan: &Scan, map: Arc<HostMap>) -> HostPlacement {
    HostPlacement {
        host: "h".into(),
        input: path.to_path_buf(),
        output: "h.xplane.pb".into(),
        start_ns: S,
        stop_ns: None,
        offset_ns: 0,
        source: crate::OffsetSource::Flag,
        map,
        shift_ns: 0,
        lines_absolute: 0,
        events_placed: 0,
        plane_bounds: vec![None; scan.planes.len()],
        device_planes: Vec::new(),
    }
}

#[test]
fn device_line_rewrite_resizes_varints_and_keeps_everything_else() {
    let (input, unknown) = trace_bytes();
    let dir = std::env::temp_dir().join(format!("cm-dev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("h.xplane.pb");
    std::fs::write(&path, &input).unwrap();
    let scan = scan_file(&path).unwrap();
    let entries = [map()];
    let maps = DeviceMapIndex::new(&entries);
    let mut place = HostPlacement {
        device_planes: vec![DevicePlaneReport {
            plane_index: 0,
            plane: "dev".into(),
            device: "nvidia:0".into(),
            declared_domain: None,
            map_domain: "cuda-globaltimer".into(),
            lines_mapped: 0,
            events_mapped: 0,
            worst_bound_ns: 0,
            node_bound_known: true,
        }],
        ..test_placement(&path, &scan, Arc::new(HostMap::fixed(Nanos(0))))
    };
    let ctx = DeviceContext {
        maps: &maps,
        origin_ns: S,
    };
    let mut dev = plan_host(&scan, &mut place, &ctx).unwrap();
    assert_eq!(place.device_planes[0].events_mapped, 4);
    let (edits, _) = host_edits_except(&scan, &mut place, S, |i| dev.is_mapped(i));
    let plan = Plan::new(edits, dev.regions(), scan.frames());
    let mut r = WireReader::new(File::open(&path).unwrap()).unwrap();
    let mut out = Vec::new();
    rewrite_with(&mut r, &plan, &mut dev, &mut out, &mut |_| {}).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.len() as u64, plan.output_len(input.len() as u64));
    // +1 (timestamp) −9 (−5000 → 0) +3 (inserted offset) +1 (1 → 5001).
    assert_eq!(out.len(), input.len() - 4);

    let space = XSpace::decode(out.as_slice()).unwrap();
    let line = &space.planes[0].lines[0];
    // Earliest event: device S + 1 s − 5 ns → host + 2^40 ns.
    assert_eq!(line.timestamp_ns, 1_000_000_000 + OFF - 5);
    let offsets: Vec<_> = line.events.iter().map(|e| e.data).collect();
    assert_eq!(
        offsets,
        [
            Some(x_event::Data::OffsetPs(5_000)), // inserted field
            Some(x_event::Data::OffsetPs(0)),     // 10 bytes -> 1
            Some(x_event::Data::OffsetPs(5_001)),
            Some(x_event::Data::NumOccurrences(3)),
            Some(x_event::Data::OffsetPs(7_000)),
        ]
    );
    let durations: Vec<_> = line.events.iter().map(|e| e.duration_ps).collect();
    assert_eq!(durations, [700, 300, 0, 9, 50], "no drift: durations kept");
    assert!(
        out.windows(unknown.len()).any(|w| w == unknown.as_slice()),
        "unknown event field lost"
    );
    assert_eq!(space.planes[1].name, "Task Environment");
}

/// A host clock drifting at −50 ppm with anchors 4 s apart whose
/// offsets, bounds and bound growth all differ.
fn drifting_map() -> HostMap {
    let a = |k: i64, offset_ns, bound_ns, bound_growth_ppb| clockmesh_offsets::Anchor {
        at_ns: S + k * 4_000_000_000,
        offset_ns,
        drift_ppb: -50_000.0,
        bound_ns,
        bound_growth_ppb,
    };
    HostMap::new(vec![
        a(-1, -123_000_000, 100, 10.0),
        a(0, -123_000_201, 150, 20.0),
        a(1, -123_000_399, 90, 0.0),
        a(2, -123_000_602, 300, 1e3),
    ])
    .unwrap()
}

/// The line placer's i64 path, its next-piece and long-way fallbacks
/// and its deferred bound rounding give `place_event`'s values, errors
/// and worst bound exactly.
#[test]
fn the_line_placer_agrees_with_place_event_everywhere() {
    let wild = clockmesh_offsets::Anchor {
        at_ns: S,
        offset_ns: 7,
        drift_ppb: 10.0,
        bound_ns: 5,
        bound_growth_ppb: f64::INFINITY, // NaN bound at the anchor itself
    };
    let maps = [
        drifting_map(),
        HostMap::new(vec![wild]).unwrap(),
        drifting_map().without_bound(),
    ];
    let s4 = 4_000_000_000_000i64; // one window, ps
    let mut offsets = vec![0, 1, -1, 999, s4 - 1, s4, -s4, 1 << 62, -(1 << 62)];
    offsets.extend([i64::MAX, i64::MIN, i64::MAX - 5, i64::MIN + 5]);
    // Back and forth across the pieces, in uneven steps.
    offsets.extend((0..200).map(|k| (k * 7_919 % 200 - 60) * 123_456_789_011));
    let durations = [0, 1, -5, 2 * s4 + 3, i64::MAX, i64::MIN];
    for map in maps {
        let tl = Timeline::host(Arc::new(map), Some(S), S - 5);
        for line_ts in [0, 3_999_999_999, -2_000_000_000_000, S + 17] {
            let line_ps = tl.line_start_ps(line_ts);
            let new_ts_ns = line_ts - 7;
            let new_ts = (new_ts_ns, i128::from(new_ts_ns) * 1000);
            let mut placer = LinePlacer::new(&tl, line_ps);
            let mut unbound = LinePlacer::new(&tl, line_ps);
            let (mut fast, mut slow, mut none) =
                (Tally::default(), Tally::default(), Tally::default());
            let mut ok = 0;
            for &offset_ps in &offsets {
                for &duration_ps in &durations {
                    let t = EventTimes {
                        offset_ps,
                        duration_ps,
                        ..EventTimes::default()
                    };
                    let want = place_event(&t, line_ps, new_ts_ns, &tl);
                    let at = format!("line {line_ts}, event {offset_ps} + {duration_ps}");
                    let got = unbound.event::<false>(&t, new_ts, &mut none);
                    assert_eq!(got.is_ok(), want.is_ok(), "{at}");
                    match want {
                        Ok((a, b, times)) => {
                            assert_eq!(got.unwrap(), (a.ps, times), "{at}");
                            let got = placer.event::<true>(&t, new_ts, &mut fast).unwrap();
                            assert_eq!(got, (a.ps, times), "{at}");
                            slow.add(a);
                            slow.add(b);
                            ok += 1;
                        }
                        // A refused event fails the merge: its bounds
                        // never count, so try it on a copy.
                        Err(_) => {
                            let mut copy = placer.clone();
                            assert!(
                                copy.event::<true>(&t, new_ts, &mut Tally::default())
                                    .is_err()
                            );
                        }
                    }
                }
            }
            assert!(ok > 1000, "{ok}");
            placer.finish(&mut fast);
            assert_eq!(fast.worst_bound_ns, slow.worst_bound_ns, "line {line_ts}");
            assert_eq!(fast.node_bound_known, slow.node_bound_known);
        }
    }
}

/// A drifting host-clock line longer than the write chunk and the
/// reader's buffer, with an event larger than that buffer: every
/// event lands where the host map puts its start and end, and every
/// other byte is kept.
#[test]
fn a_long_drifting_line_with_an_event_larger_than_the_buffer() {
    let step = 123_456_789; // ps: 100k events span 12.3 s, four pieces
    let mut events: Vec<XEvent> = (0..100_000i64)
        .map(|k| event((k % 3 != 0).then_some(k * step), k % 1_000 * 997))
        .collect();
    let big = vec![0x5a; 1_300_000];
    events[50_000].stats.push(clockmesh_proto::xplane::XStat {
        metadata_id: 1,
        value: Some(clockmesh_proto::xplane::x_stat::Value::BytesValue(
            big.clone(),
        )),
    });
    let line = XLine {
        id: 1,
        timestamp_ns: 2_000_000_000,
        duration_ps: 12_400_000_000_000,
        events,
        ..Default::default()
    };
    let plane = XPlane {
        id: 1,
        name: "/host:CPU".into(),
        lines: vec![line.clone()],
        ..Default::default()
    };
    let spec = SynthSpec {
        start_ns: S,
        ..SynthSpec::default()
    };
    let space = XSpace {
        planes: vec![plane, task_env_plane(&spec)],
        ..Default::default()
    };
    let input = space.encode_to_vec();
    let dir = std::env::temp_dir().join(format!("cm-long-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("h.xplane.pb");
    std::fs::write(&path, &input).unwrap();
    let scan = scan_file(&path).unwrap();
    let map = Arc::new(drifting_map());
    let mut place = test_placement(&path, &scan, map.clone());
    let origin = S - 200_000_000;
    let entries = [];
    let maps = DeviceMapIndex::new(&entries);
    let ctx = DeviceContext {
        maps: &maps,
        origin_ns: origin,
    };
    let mut dev = plan_host(&scan, &mut place, &ctx).unwrap();
    assert_eq!(place.events_placed, 100_000);
    let (edits, _) = host_edits_except(&scan, &mut place, origin, |i| dev.is_mapped(i));
    let plan = Plan::new(edits, dev.regions(), scan.frames());
    let mut r = WireReader::new(File::open(&path).unwrap()).unwrap();
    let mut out = Vec::new();
    rewrite_with(&mut r, &plan, &mut dev, &mut out, &mut |_| {}).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.len() as u64, plan.output_len(input.len() as u64));

    let placed = |local_ps: i128| map.to_global_ps(local_ps).global_ps - i128::from(origin) * 1000;
    let line_ps = i128::from(S + line.timestamp_ns) * 1000;
    let got = &XSpace::decode(out.as_slice()).unwrap().planes[0].lines[0];
    let new_ps = i128::from(got.timestamp_ns) * 1000;
    assert_eq!(new_ps, placed(line_ps).div_euclid(1000) * 1000);
    assert_eq!(
        i128::from(got.duration_ps),
        placed(line_ps + 12_400_000_000_000) - new_ps
    );
    let mut stretched = 0;
    for (old, new) in line.events.iter().zip(&got.events) {
        // An offset of 0 absent before stays absent.
        let o = match new.data {
            Some(x_event::Data::OffsetPs(o)) => o,
            None => 0,
            other => panic!("{other:?}"),
        };
        let old_offset = match old.data {
            Some(x_event::Data::OffsetPs(o)) => o,
            _ => 0,
        };
        let start = line_ps + i128::from(old_offset);
        let end = start + i128::from(old.duration_ps);
        assert_eq!(new_ps + i128::from(o), placed(start));
        assert_eq!(i128::from(new.duration_ps), placed(end) - placed(start));
        stretched += usize::from(new.duration_ps != old.duration_ps);
        assert_eq!((new.metadata_id, &new.stats), (old.metadata_id, &old.stats));
    }
    assert!(stretched > 1_000, "{stretched}");
}

#[test]
fn event_times_last_field_wins_and_bad_wire_types_are_refused() {
    // offset 7, then num_occurrences: aggregated; then offset again: timed.
    let bytes = [0x10, 7, 0x28, 3, 0x10, 9, 0x18, 4];
    assert!(event_times(&bytes[..4], 0).unwrap().aggregated);
    let t = event_times(&bytes, 0).unwrap();
    assert!(!t.aggregated);
    assert_eq!((t.offset_ps, t.duration_ps, t.offset_fields), (9, 4, 2));
    let e = event_times(&[0x12, 1, 0], 100).unwrap_err(); // offset_ps as bytes
    assert!(e.to_string().contains("byte 101"), "{e}");
    // A field running past the event: refused, not read beyond it.
    assert!(event_times(&[0x1a, 5, 0], 0).is_err());
    assert!(event_times(&[0x10, 0x80], 0).is_err());
}

#[test]
fn counted_event_lengths_match_the_encoding() {
    let events: [&[u8]; 4] = [
        &[0x08, 1, 0x10, 7, 0x18, 4],          // id, offset, duration
        &[0x08, 1],                            // no times at all
        &[0x10, 0x80, 0x01, 0x10, 2, 0x18, 0], // two offsets, zero duration
        &[0x18, 9, 0x22, 2, 1, 2],             // duration and a stat
    ];
    for bytes in events {
        let t = event_times(bytes, 0).unwrap();
        for times in [(0, 0), (1, 1), (300, 1 << 40), (0, 5)] {
            let mut out = Vec::new();
            encode_event(bytes, 0, &t, times, &mut out).unwrap();
            let n = new_event_len(bytes.len() as u64, &t, times.0, times.1);
            assert_eq!(out.len() as u64, varint_len(n) + n, "{bytes:?} {times:?}");
        }
    }
}
