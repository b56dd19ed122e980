//! The streaming reader against JAX's recorded shape and against decoding the whole file with prost.

use super::*;
use crate::collectives::model::MatchedBy;
use clockmesh_proto::prost::Message;
use clockmesh_proto::xplane::{
    XEvent, XEventMetadata, XLine, XPlane, XSpace, XStat, XStatMetadata, x_event, x_stat,
};

/// The reader by prost decoding that this module replaced, kept to
/// check the streaming reader against.
mod oracle {
    use std::path::Path;

    use clockmesh_proto::prost::Message;
    use clockmesh_proto::xplane::{XLine, XPlane, XSpace, x_event, x_stat};

    use super::super::{HOST_PLANE, PROCESS_INDEX, TASK_ENV, number_occurrences};
    use crate::TraceError;
    use crate::collectives::classify::classify;
    use crate::collectives::model::{
        CollectiveCall, Framework, InstanceKey, MatchedBy, Participant, Preceding, Track,
    };
    use crate::collectives::{RankTrace, Timed, preceding_before, step_begun_before};
    use crate::scan::ALIGNMENT_BOUND_STAT;

    /// The decoding reader this module had: the streaming one must agree.
    pub fn parse(bytes: &[u8], path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
        let space = XSpace::decode(bytes)
            .map_err(|e| TraceError::NotXPlane(format!("not an xplane file: {e}")))?;
        let env = plane(&space, TASK_ENV).ok_or(TraceError::MissingTaskEnv)?;
        let start_ns =
            stat_i64(env, &env.stats, "profile_start_time").ok_or(TraceError::MissingStart)?;
        let host = plane(&space, HOST_PLANE);
        let bound_ns = host
            .and_then(|p| stat_i64(p, &p.stats, ALIGNMENT_BOUND_STAT))
            .and_then(|b| u64::try_from(b).ok())
            .filter(|_| aligned);
        // xprof's `process_id` is the OS pid; the JAX helper records the
        // job's process index.
        let rank = stat_i64(env, &env.stats, PROCESS_INDEX).and_then(|r| u64::try_from(r).ok());
        let participant = Participant {
            host: crate::collectives::file_host(path, ".xplane.pb"),
            rank,
            framework: Framework::Xla,
            trace: path.display().to_string(),
            bound_ns,
        };
        let steps = host.map(|p| steps(p, start_ns)).unwrap_or_default();
        let mut calls = Vec::new();
        for (index, p) in space.planes.iter().enumerate() {
            if p.name.starts_with("/device:") {
                calls.extend(
                    plane_calls(p, index, start_ns, &steps, true)
                        .into_iter()
                        .map(|c| CollectiveCall {
                            clock: crate::collectives::CallClock::Gpu,
                            ..c
                        }),
                );
            }
        }
        if calls.is_empty()
            && let Some(index) = space.planes.iter().position(|p| p.name == HOST_PLANE)
        {
            calls = plane_calls(&space.planes[index], index, start_ns, &steps, false);
        }
        number_occurrences(&mut calls);
        Ok(RankTrace {
            participant,
            calls,
            steps: Vec::new(),
        })
    }

    fn plane<'a>(space: &'a XSpace, name: &str) -> Option<&'a XPlane> {
        space.planes.iter().find(|p| p.name == name)
    }

    fn stat_name(p: &XPlane, id: i64) -> Option<&str> {
        p.stat_metadata.get(&id).map(|m| m.name.as_str())
    }

    fn stat_i64(p: &XPlane, stats: &[clockmesh_proto::xplane::XStat], name: &str) -> Option<i64> {
        stats
            .iter()
            .find(|s| stat_name(p, s.metadata_id) == Some(name))
            .and_then(|s| match s.value {
                Some(x_stat::Value::Int64Value(v)) => Some(v),
                Some(x_stat::Value::Uint64Value(v)) => i64::try_from(v).ok(),
                _ => None,
            })
    }

    fn stat_str<'a>(
        p: &'a XPlane,
        stats: &'a [clockmesh_proto::xplane::XStat],
        name: &str,
    ) -> Option<&'a str> {
        let s = stats
            .iter()
            .find(|s| stat_name(p, s.metadata_id) == Some(name))?;
        match &s.value {
            Some(x_stat::Value::StrValue(v)) => Some(v),
            Some(x_stat::Value::RefValue(r)) => {
                i64::try_from(*r).ok().and_then(|r| stat_name(p, r))
            }
            _ => None,
        }
    }

    /// One event's name, start and end (epoch ns); `None` for events given as
    /// a count (aggregated) rather than an offset.
    fn event_span<'a>(
        p: &'a XPlane,
        line_start_ns: i64,
        ev: &clockmesh_proto::xplane::XEvent,
    ) -> Option<(&'a str, i64, i64)> {
        let Some(x_event::Data::OffsetPs(off)) = ev.data else {
            return None;
        };
        let name = p
            .event_metadata
            .get(&ev.metadata_id)
            .map_or("", |m| m.name.as_str());
        let start = line_start_ns.saturating_add(off.div_euclid(1000));
        let end = start.saturating_add(ev.duration_ps.div_euclid(1000));
        Some((name, start, end))
    }

    /// The training steps (`StepTraceAnnotation`: events with `step_num`).
    fn steps(p: &XPlane, start_ns: i64) -> Vec<Timed<u64>> {
        let mut out = Vec::new();
        for line in &p.lines {
            let line_start = start_ns.saturating_add(line.timestamp_ns);
            for ev in &line.events {
                let Some(n) =
                    stat_i64(p, &ev.stats, "step_num").and_then(|n| u64::try_from(n).ok())
                else {
                    continue;
                };
                if let Some((_, s, e)) = event_span(p, line_start, ev) {
                    out.push(Timed {
                        name: n,
                        start_ns: s,
                        end_ns: e,
                    });
                }
            }
        }
        out.sort_by_key(|t| t.start_ns);
        out
    }

    /// Markers XLA writes that are not work (`end: <op>`, thread-pool regions).
    fn is_marker(name: &str, start: i64, end: i64) -> bool {
        name.starts_with("end: ") || name.starts_with("ThreadpoolListener::") || end <= start
    }

    /// The work events of a line of `p`.
    fn line_work<'a>(
        p: &'a XPlane,
        line: &'a XLine,
        start_ns: i64,
        op_names: bool,
    ) -> Vec<Timed<&'a str>> {
        let line_start = start_ns.saturating_add(line.timestamp_ns);
        line.events
            .iter()
            .filter_map(|ev| event_span(p, line_start, ev).map(|s| (ev, s)))
            .filter(|(_, (n, s, e))| !is_marker(n, *s, *e))
            .map(|(ev, (name, start_ns, end_ns))| Timed {
                name: stat_str(p, &ev.stats, "name")
                    .filter(|n| op_names && !n.is_empty())
                    .unwrap_or(name),
                start_ns,
                end_ns,
            })
            .collect()
    }

    /// The collective calls of plane `p`, the `index`-th of its file;
    /// `op_names` (device planes): the work named by its `name` stat
    /// (XLA's op name) where it has one.
    fn plane_calls(
        p: &XPlane,
        index: usize,
        start_ns: i64,
        steps: &[Timed<u64>],
        op_names: bool,
    ) -> Vec<CollectiveCall> {
        let mut calls = Vec::new();
        let line_work = |line| line_work(p, line, start_ns, op_names);
        // A device plane's calls follow work on any of its streams.
        let mut device_work: Vec<Timed<&str>> = p
            .lines
            .iter()
            .filter(|l| op_names && !super::super::walk::is_derived_line(l.id))
            .flat_map(line_work)
            .collect();
        device_work.sort_by_key(|t| (t.end_ns, t.start_ns));
        for line in &p.lines {
            let line_start = start_ns.saturating_add(line.timestamp_ns);
            let work = if op_names {
                device_work.clone()
            } else {
                let mut w = line_work(line);
                w.sort_by_key(|t| (t.end_ns, t.start_ns));
                w
            };
            for ev in &line.events {
                let Some((name, enter, exit)) = event_span(p, line_start, ev) else {
                    continue;
                };
                if name.starts_with("end: ") {
                    continue;
                }
                let op = stat_str(p, &ev.stats, "hlo_op").unwrap_or(name);
                let Some(kind) = classify(op) else {
                    continue;
                };
                let module = stat_str(p, &ev.stats, "hlo_module").unwrap_or("xla");
                let program = stat_i64(p, &ev.stats, "program_id");
                let group = match program {
                    Some(id) => format!("{module}#{id}"),
                    None => module.to_string(),
                };
                let run = stat_i64(p, &ev.stats, "run_id");
                calls.push(CollectiveCall {
                    participant: 0,
                    kind,
                    key: InstanceKey {
                        group: group.into(),
                        name: op.into(),
                        // Run ids are i64 in XLA; kept bit for bit.
                        ordinal: run.map_or(0, |r| r as u64),
                    },
                    matched_by: if run.is_some() {
                        MatchedBy::RunId
                    } else {
                        MatchedBy::Occurrence
                    },
                    op: name.into(),
                    enter_ns: enter,
                    exit_ns: exit,
                    step: step_begun_before(steps, enter),
                    group_size: None,
                    elements: None,
                    preceding: preceding_before(&work, enter).map(|t| Preceding {
                        name: t.name.into(),
                        start_ns: t.start_ns,
                        end_ns: t.end_ns,
                    }),
                    clock: crate::collectives::CallClock::Host,
                    track: Some(Track {
                        plane: u32::try_from(index).unwrap_or(u32::MAX),
                        line: line.id,
                    }),
                });
            }
        }
        calls
    }
}

fn stat(id: i64, v: x_stat::Value) -> XStat {
    XStat {
        metadata_id: id,
        value: Some(v),
    }
}

/// The shape JAX 0.10 writes on CPU (see the module doc).
#[expect(
    clippy::too_many_lines,
    reason = "the recorded JAX shape, written out event by event"
)]
fn host(process: u64, bound: Option<u64>, psum_at_ps: i64) -> XSpace {
    let mut cpu = XPlane {
        name: HOST_PLANE.into(),
        ..Default::default()
    };
    for (id, name) in [
        (1, "hlo_op"),
        (2, "hlo_module"),
        (3, "program_id"),
        (4, "run_id"),
        (5, "step_num"),
        (6, ALIGNMENT_BOUND_STAT),
    ] {
        cpu.stat_metadata.insert(
            id,
            XStatMetadata {
                id,
                name: name.into(),
                ..Default::default()
            },
        );
    }
    for (id, name) in [
        (1, "tanh_fusion"),
        (2, "psum.7"),
        (3, "end: psum.7"),
        (4, "train"),
        (5, "all_gather.7"),
    ] {
        cpu.event_metadata.insert(
            id,
            XEventMetadata {
                id,
                name: name.into(),
                ..Default::default()
            },
        );
    }
    if let Some(b) = bound {
        cpu.stats.push(stat(6, x_stat::Value::Uint64Value(b)));
    }
    let op = |m: i64, name: &str, at: i64, dur: i64, run: i64| XEvent {
        metadata_id: m,
        data: Some(x_event::Data::OffsetPs(at)),
        duration_ps: dur,
        stats: vec![
            stat(1, x_stat::Value::StrValue(name.into())),
            stat(2, x_stat::Value::StrValue("jit_step".into())),
            stat(3, x_stat::Value::Int64Value(8)),
            stat(4, x_stat::Value::Int64Value(run)),
        ],
    };
    cpu.lines.push(XLine {
        name: "python".into(),
        timestamp_ns: 1_000,
        events: vec![XEvent {
            metadata_id: 4,
            data: Some(x_event::Data::OffsetPs(0)),
            duration_ps: 50_000_000,
            stats: vec![stat(5, x_stat::Value::Int64Value(3))],
        }],
        ..Default::default()
    });
    cpu.lines.push(XLine {
        name: "tf_XLAPjRtCpuClient/1".into(),
        timestamp_ns: 1_000,
        events: vec![
            op(1, "tanh_fusion", 1_000_000, 2_000_000, -5),
            op(2, "psum.7", psum_at_ps, 4_000_000, -5),
            XEvent {
                metadata_id: 3,
                data: Some(x_event::Data::OffsetPs(psum_at_ps + 4_000_000)),
                duration_ps: 300_000,
                stats: vec![],
            },
            op(5, "all_gather.7", psum_at_ps + 5_000_000, 1_000_000, -5),
        ],
        ..Default::default()
    });
    let mut env = XPlane {
        name: TASK_ENV.into(),
        ..Default::default()
    };
    env.stat_metadata.insert(
        1,
        XStatMetadata {
            id: 1,
            name: "profile_start_time".into(),
            ..Default::default()
        },
    );
    env.stats
        .push(stat(1, x_stat::Value::Uint64Value(1_000_000_000)));
    env.stat_metadata.insert(
        2,
        XStatMetadata {
            id: 2,
            name: PROCESS_INDEX.into(),
            ..Default::default()
        },
    );
    env.stats.push(stat(2, x_stat::Value::Uint64Value(process)));
    // xprof's own process id (the OS pid) is not the rank.
    let mut md = XPlane {
        name: "/host:metadata".into(),
        ..Default::default()
    };
    md.stat_metadata.insert(
        1,
        XStatMetadata {
            id: 1,
            name: "process_id".into(),
            ..Default::default()
        },
    );
    md.stats.push(stat(1, x_stat::Value::Int64Value(4242)));
    XSpace {
        planes: vec![md, cpu, env],
        ..Default::default()
    }
}

fn write(name: &str, s: &XSpace) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cm-coll-xplane-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, s.encode_to_vec()).unwrap();
    p
}

#[test]
fn xla_collective_thunks_are_calls_keyed_by_run_id() {
    let t = read(&write("n1.xplane.pb", &host(1, Some(700), 5_000_000)), true).unwrap();
    assert_eq!(t.participant.host, "n1");
    assert_eq!(t.participant.rank, Some(1));
    assert_eq!(t.participant.bound_ns, Some(700));
    assert_eq!(
        t.calls.len(),
        2,
        "psum and all_gather; `end:` markers are not calls"
    );
    let c = &t.calls[0];
    assert_eq!(&*c.op, "psum.7");
    assert_eq!(c.matched_by, MatchedBy::RunId);
    assert_eq!(&*c.key.group, "jit_step#8");
    assert_eq!(c.key.ordinal, (-5i64) as u64);
    let t0 = 1_000_000_000 + 1_000;
    assert_eq!((c.enter_ns, c.exit_ns), (t0 + 5_000, t0 + 9_000));
    assert_eq!(c.step, Some(3));
    let p = c.preceding.as_ref().unwrap();
    assert_eq!((&*p.name, p.end_ns), ("tanh_fusion", t0 + 3_000));
    // The all-gather came after psum's `end:` marker, which is no work.
    assert_eq!(
        t.calls[1].preceding.as_ref().unwrap().name.as_ref(),
        "psum.7"
    );
    let raw = read(
        &write("n1raw.xplane.pb", &host(1, Some(700), 5_000_000)),
        false,
    )
    .unwrap();
    assert_eq!(raw.participant.bound_ns, None, "raw clocks have no bound");
}

#[test]
fn a_file_that_is_not_an_xplane_is_an_error() {
    let dir = std::env::temp_dir().join(format!("cm-coll-xplane-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("junk.xplane.pb");
    std::fs::write(&p, [0xff, 0xff, 0xff]).unwrap();
    assert!(read(&p, true).is_err());
    let mut s = host(0, None, 5_000_000);
    s.planes.retain(|p| p.name != TASK_ENV);
    assert!(matches!(
        read(&write("noenv.xplane.pb", &s), true),
        Err(TraceError::MissingTaskEnv)
    ));
}

/// What a call is, in full, for comparing readers.
fn same(a: &RankTrace, b: &RankTrace, what: &str) {
    assert_eq!(a.participant, b.participant, "{what}");
    assert_eq!(a.calls, b.calls, "{what}");
}

/// Variations of the recorded shape: the planes in another order, no
/// run ids, `hlo_op` by reference, aggregated and unknown events,
/// events out of order with ties on what came before, a device plane,
/// an event larger than the reader's buffer.
fn variants() -> Vec<XSpace> {
    let mut out = vec![
        host(1, Some(700), 5_000_000),
        host(0, None, 2_500_000),
        host(2, Some(5), 500_000),
    ];
    let mut s = host(3, Some(9), 5_000_000);
    s.planes.reverse();
    out.push(s);
    let mut s = host(1, None, 5_000_000);
    for ev in s.planes[1].lines.iter_mut().flat_map(|l| &mut l.events) {
        ev.stats.retain(|st| st.metadata_id != 4);
    }
    out.push(s);
    let mut s = host(1, None, 5_000_000);
    let cpu = &mut s.planes[1];
    cpu.stat_metadata.insert(
        20,
        XStatMetadata {
            id: 20,
            name: "all-reduce.3".into(),
            ..Default::default()
        },
    );
    for st in cpu.lines[1].events[1].stats.iter_mut() {
        if st.metadata_id == 1 {
            st.value = Some(x_stat::Value::RefValue(20));
        }
    }
    let line = &mut cpu.lines[1].events;
    line.push(XEvent {
        metadata_id: 99,
        data: Some(x_event::Data::OffsetPs(9_000_000)),
        duration_ps: 1_000,
        stats: vec![],
    });
    line.push(XEvent {
        metadata_id: 2,
        data: Some(x_event::Data::NumOccurrences(3)),
        ..Default::default()
    });
    // An op enclosing tanh_fusion (same end), a twin of it, and an
    // event ending exactly at the psum's enter.
    for (m, at, dur) in [
        (4, 500_000, 2_500_000),
        (1, 500_000, 2_500_000),
        (4, 4_000_000, 1_000_000),
    ] {
        line.push(XEvent {
            metadata_id: m,
            data: Some(x_event::Data::OffsetPs(at)),
            duration_ps: dur,
            stats: vec![],
        });
    }
    line.reverse();
    out.push(s);
    let mut s = host(1, Some(700), 5_000_000);
    let mut dev = s.planes[1].clone();
    dev.name = "/device:GPU:0".into();
    dev.stats.clear();
    dev.lines.remove(0);
    s.planes.insert(1, dev);
    out.push(s);
    out.push(device_op_names());
    out.push(device_streams());
    out.push(long_line());
    let mut s = host(1, Some(700), 5_000_000);
    s.planes[1].lines[1].events[0]
        .stats
        .push(stat(6, x_stat::Value::StrValue("x".repeat(3 << 20))));
    out.push(s);
    out
}

/// The host plane's events on a GPU plane as XLA writes them there: named
/// by kernel, with the op's name in the `name` stat (by reference, and as
/// a string), and one without it.
fn device_op_names() -> XSpace {
    let mut s = host(1, Some(700), 5_000_000);
    let mut dev = s.planes[1].clone();
    dev.name = "/device:GPU:0".into();
    dev.stats.clear();
    dev.lines.remove(0);
    for (id, name) in [(7, "name"), (21, "jit(step)/forward/dot_general")] {
        dev.stat_metadata.insert(
            id,
            XStatMetadata {
                id,
                name: name.into(),
                ..Default::default()
            },
        );
    }
    dev.event_metadata.get_mut(&1).unwrap().name = "void cutlass::Kernel2<sgemm>".into();
    let line = &mut dev.lines[0].events;
    line[0].stats.push(stat(7, x_stat::Value::RefValue(21)));
    // The all-gather follows psum's `end:` marker, whose end is the latest:
    // a marker; then a kernel with its op name as a string.
    let mut late = line[0].clone();
    late.data = Some(x_event::Data::OffsetPs(5_000_000 + 4_500_000));
    late.duration_ps = 200_000;
    late.stats.retain(|st| st.metadata_id != 7);
    late.stats.push(stat(
        7,
        x_stat::Value::StrValue("jit(step)/backward/dot_general".into()),
    ));
    line.push(late);
    s.planes.insert(1, dev);
    s
}

#[test]
fn a_gpu_call_s_work_is_named_by_its_xla_op_not_its_kernel() {
    let t = read(&write("dev_ops.xplane.pb", &device_op_names()), true).unwrap();
    let names: Vec<_> = t
        .calls
        .iter()
        .map(|c| c.preceding.as_ref().map(|p| p.name.to_string()))
        .collect();
    assert_eq!(
        names,
        [
            Some("jit(step)/forward/dot_general".into()),
            Some("jit(step)/backward/dot_general".into())
        ]
    );
    // On the host plane (CPU), events are named by their op already.
    let t = read(
        &write("host_ops.xplane.pb", &host(1, Some(700), 5_000_000)),
        true,
    )
    .unwrap();
    assert_eq!(&*t.calls[0].preceding.as_ref().unwrap().name, "tanh_fusion");
}

/// [`device_op_names`] with a second stream, whose kernel ends after the
/// psum's stream's last one and before the psum (its line's timestamp
/// another), and derived lines (xprof's "XLA Ops", ids from 0xdeadbeef,
/// plain and wrapped to a C `int`) whose events end later still.
fn device_streams() -> XSpace {
    let mut s = device_op_names();
    let dev = &mut s.planes[1];
    let kernel = |at: i64, dur: i64, op: &str| {
        let mut k = dev.lines[0].events[0].clone();
        k.data = Some(x_event::Data::OffsetPs(at));
        k.duration_ps = dur;
        k.stats.retain(|st| st.metadata_id != 7);
        k.stats.push(stat(7, x_stat::Value::StrValue(op.into())));
        k
    };
    let grad = kernel(4_000_000, 1_000_000, "jit(step)/grad/dot_general");
    let derived = kernel(4_000_000, 1_400_000, "derived");
    let derived_wrapped = kernel(4_000_000, 1_450_000, "derived");
    for (id, name, ts, ev) in [
        (20, "Stream #20(Compute)", 500, grad),
        (0xdead_beef + 5, "XLA Ops", 500, derived),
        (
            i64::from(0xdead_beef_u32 as i32) + 3,
            "XLA Ops",
            500,
            derived_wrapped,
        ),
    ] {
        dev.lines.push(XLine {
            id,
            name: name.into(),
            timestamp_ns: ts,
            events: vec![ev],
            ..Default::default()
        });
    }
    s
}

/// XLA may run a collective on a stream of its own: what a GPU call
/// followed is the device's last work on any stream (not a derived line).
#[test]
fn a_gpu_call_s_work_is_the_device_s_last_on_any_stream() {
    let t = read(&write("dev_streams.xplane.pb", &device_streams()), true).unwrap();
    let before: Vec<_> = t
        .calls
        .iter()
        .map(|c| c.preceding.as_ref().map(|p| (p.name.to_string(), p.end_ns)))
        .collect();
    let at = |ns: i64| 1_000_000_000 + 500 + ns;
    assert_eq!(
        before,
        [
            Some(("jit(step)/grad/dot_general".into(), at(5_000))),
            Some(("jit(step)/backward/dot_general".into(), at(500 + 9_700))),
        ]
    );
}

/// A line of a few MB (past the reader's buffer), in time order but
/// for some swapped pairs, with a collective every 1,000 events.
fn long_line() -> XSpace {
    let mut s = host(1, Some(700), 5_000_000);
    let line = &mut s.planes[1].lines[1];
    let (work, call) = (line.events[0].clone(), line.events[1].clone());
    for i in 0..60_000i64 {
        let at = 10_000_000 + i * 2_000_000;
        let mut e = work.clone();
        e.data = Some(x_event::Data::OffsetPs(at + (i % 7) * 1_000));
        e.duration_ps = 1_000_000 + (i % 5) * 500_000;
        line.events.push(e);
        if i % 1_000 == 999 {
            let mut c = call.clone();
            c.data = Some(x_event::Data::OffsetPs(at + 1_500_000));
            for st in &mut c.stats {
                if st.metadata_id == 4 {
                    st.value = Some(x_stat::Value::Int64Value(i));
                }
            }
            line.events.push(c);
        }
    }
    for i in (0..line.events.len() - 1).step_by(3) {
        line.events.swap(i, i + 1);
    }
    s
}

#[test]
fn the_streaming_readers_agree_with_decoding_the_whole_file() {
    for (i, s) in variants().iter().enumerate() {
        let bytes = s.encode_to_vec();
        let path = write(&format!("v{i}.xplane.pb"), s);
        for aligned in [true, false] {
            let want = oracle::parse(&bytes, &path, aligned).unwrap();
            assert!(!want.calls.is_empty(), "variant {i} has calls");
            let what = format!("variant {i}, aligned {aligned}");
            same(&parse(&bytes, &path, aligned).unwrap(), &want, &what);
            same(&read(&path, aligned).unwrap(), &want, &what);
        }
    }
}

#[test]
fn a_truncated_or_damaged_file_is_an_error_not_a_panic() {
    let s = host(1, Some(700), 5_000_000);
    let bytes = s.encode_to_vec();
    let path = Path::new("t.xplane.pb");
    for k in 0..bytes.len() {
        let r = parse(&bytes[..k], path, true);
        assert!(r.is_err(), "{k} of {} bytes", bytes.len());
    }
    let cut = write("cut.xplane.pb", &s);
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    let err = read(&cut, true).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    for i in 0..bytes.len() {
        for x in [0xff, 0x80, 0x01] {
            let mut b = bytes.clone();
            b[i] ^= x;
            let _ = parse(&b, path, true);
        }
    }
}
