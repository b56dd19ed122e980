//! Collective calls of one XLA host (xprof `.xplane.pb`: JAX, TensorFlow).
//!
//! XLA's runtimes trace each executed HLO op (thunk) as an event named by
//! the op, with the stats `hlo_op`, `hlo_module`, `program_id` and
//! `run_id` (JAX 0.10 on CPU: `psum.7`, `all_gather.7` on the
//! `tf_XLAPjRtCpuClient` line; on GPU the device planes hold the
//! collective kernels). The run id is the one XLA's own rendezvous keys a
//! collective by, the same on every process of one launch, so an instance
//! is (module, op, run id); without a run id, the n-th execution of the op.
//! Device planes (`/device:*`) are used when they hold collectives, else
//! the host plane: one call is never counted twice. The rank is the
//! `jax_process_index` stat that `clockmesh.jax_profiler` writes on the
//! Task Environment plane (xprof's own `process_id` is the OS pid).

use std::collections::HashMap;
use std::path::Path;

use clockmesh_proto::prost::Message;
use clockmesh_proto::xplane::{XPlane, XSpace, x_event, x_stat};

use super::classify::classify;
use super::model::{
    CollectiveCall, Framework, InstanceKey, MatchedBy, Participant, Preceding, Track,
};
use super::{RankTrace, Timed, preceding_before, step_at};
use crate::TraceError;
use crate::scan::ALIGNMENT_BOUND_STAT;

const TASK_ENV: &str = "Task Environment";
const HOST_PLANE: &str = "/host:CPU";
/// Task Environment stat `clockmesh.jax_profiler` writes: the job's
/// process index (`jax.process_index()`).
pub const PROCESS_INDEX: &str = "jax_process_index";

/// Reads one host's collective calls. `aligned`: the file is a clockmesh
/// merge's output and its stated bound applies.
pub fn read(path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
    let bytes = std::fs::read(path).map_err(TraceError::io)?;
    parse(&bytes, path, aligned)
}

/// [`read`] of a trace already in memory (`path` names it).
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
        host: super::file_host(path, ".xplane.pb"),
        rank,
        framework: Framework::Xla,
        trace: path.display().to_string(),
        bound_ns,
    };
    let steps = host.map(|p| steps(p, start_ns)).unwrap_or_default();
    let mut calls = Vec::new();
    for (index, p) in space.planes.iter().enumerate() {
        if p.name.starts_with("/device:") {
            calls.extend(plane_calls(p, index, start_ns, &steps));
        }
    }
    if calls.is_empty()
        && let Some(index) = space.planes.iter().position(|p| p.name == HOST_PLANE)
    {
        calls = plane_calls(&space.planes[index], index, start_ns, &steps);
    }
    number_occurrences(&mut calls);
    Ok(RankTrace { participant, calls })
}

/// Whether a file is a clockmesh merge's output (its host plane states
/// the alignment bound).
pub fn is_merged(path: &Path) -> Result<bool, TraceError> {
    let scan = crate::scan_file(path)?;
    Ok(scan
        .planes
        .iter()
        .any(|p| p.stats.iter().any(|s| s.name == ALIGNMENT_BOUND_STAT)))
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
        Some(x_stat::Value::RefValue(r)) => i64::try_from(*r).ok().and_then(|r| stat_name(p, r)),
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
            let Some(n) = stat_i64(p, &ev.stats, "step_num").and_then(|n| u64::try_from(n).ok())
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

/// The collective calls of plane `p`, the `index`-th of its file.
fn plane_calls(
    p: &XPlane,
    index: usize,
    start_ns: i64,
    steps: &[Timed<u64>],
) -> Vec<CollectiveCall> {
    let mut calls = Vec::new();
    for line in &p.lines {
        let line_start = start_ns.saturating_add(line.timestamp_ns);
        let mut work: Vec<Timed<&str>> = line
            .events
            .iter()
            .filter_map(|ev| event_span(p, line_start, ev))
            .filter(|(n, s, e)| !is_marker(n, *s, *e))
            .map(|(name, start_ns, end_ns)| Timed {
                name,
                start_ns,
                end_ns,
            })
            .collect();
        work.sort_by_key(|t| (t.end_ns, t.start_ns));
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
                    group,
                    name: op.to_string(),
                    // Run ids are i64 in XLA; kept bit for bit.
                    ordinal: run.map_or(0, |r| r as u64),
                },
                matched_by: if run.is_some() {
                    MatchedBy::RunId
                } else {
                    MatchedBy::Occurrence
                },
                op: name.to_string(),
                enter_ns: enter,
                exit_ns: exit,
                step: step_at(steps, enter),
                group_size: None,
                preceding: preceding_before(&work, enter).map(|t| Preceding {
                    name: t.name.to_string(),
                    start_ns: t.start_ns,
                    end_ns: t.end_ns,
                }),
                track: Some(Track {
                    plane: u32::try_from(index).unwrap_or(u32::MAX),
                    line: line.id,
                }),
            });
        }
    }
    calls
}

/// Calls without a run id: the n-th execution of each op, in time order.
fn number_occurrences(calls: &mut [CollectiveCall]) {
    calls.sort_by_key(|c| c.enter_ns);
    let mut seen: HashMap<(String, String), u64> = HashMap::new();
    for c in calls
        .iter_mut()
        .filter(|c| c.matched_by == MatchedBy::Occurrence)
    {
        let n = seen
            .entry((c.key.group.clone(), c.key.name.clone()))
            .or_insert(0);
        c.key.ordinal = *n;
        *n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh_proto::xplane::{XEvent, XEventMetadata, XLine, XStat, XStatMetadata};

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
        assert_eq!(c.op, "psum.7");
        assert_eq!(c.matched_by, MatchedBy::RunId);
        assert_eq!(c.key.group, "jit_step#8");
        assert_eq!(c.key.ordinal, (-5i64) as u64);
        let t0 = 1_000_000_000 + 1_000;
        assert_eq!((c.enter_ns, c.exit_ns), (t0 + 5_000, t0 + 9_000));
        assert_eq!(c.step, Some(3));
        let p = c.preceding.as_ref().unwrap();
        assert_eq!((p.name.as_str(), p.end_ns), ("tanh_fusion", t0 + 3_000));
        // The all-gather came after psum's `end:` marker, which is no work.
        assert_eq!(t.calls[1].preceding.as_ref().unwrap().name, "psum.7");
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
}
