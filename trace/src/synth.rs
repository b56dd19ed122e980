//! Synthetic `.xplane.pb` traces shaped like XLA's (a `/host:CPU`-style
//! plane per "thread group", a `Task Environment` plane), for tests,
//! benchmarks and fuzz seeds. Written plane by plane, so a multi-GB trace
//! needs only one plane in memory.

use std::collections::BTreeMap;
use std::io::Write;

use clockmesh_proto::prost::Message;
use clockmesh_proto::xplane::{
    XEvent, XEventMetadata, XLine, XPlane, XStat, XStatMetadata, x_event, x_stat,
};
use clockmesh_proto::{PROFILE_START_TIME, PROFILE_STOP_TIME, TASK_ENV_PLANE};

use super::fields::{self, xspace};
use super::wire::{LEN, put_varint};

/// Shape of a synthetic trace.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub host: String,
    pub start_ns: i64,
    pub duration_ns: i64,
    pub planes: usize,
    pub lines_per_plane: usize,
    pub events_per_line: usize,
    /// Extra Task Environment int64 stats (e.g. clock stats from the hook).
    pub task_env_stats: Vec<(String, i64)>,
}

impl Default for SynthSpec {
    fn default() -> Self {
        Self {
            host: "host".into(),
            start_ns: 1_795_335_288_621_242_594,
            duration_ns: 10_000_000,
            planes: 2,
            lines_per_plane: 3,
            events_per_line: 10,
            task_env_stats: Vec::new(),
        }
    }
}

/// The `i`-th event plane (deterministic contents).
pub fn event_plane(spec: &SynthSpec, i: usize) -> XPlane {
    let names = ["PjitFunction", "ThunkExecutor", "ynn_fusion", "python"];
    let event_metadata: BTreeMap<i64, XEventMetadata> = (0..names.len() as i64)
        .map(|id| {
            let m = XEventMetadata {
                id: id + 1,
                name: names[id as usize].into(),
                ..Default::default()
            };
            (id + 1, m)
        })
        .collect();
    let step = (spec.duration_ns.max(1) * 1000) / (spec.events_per_line.max(1) as i64 + 1);
    let lines = (0..spec.lines_per_plane)
        .map(|l| XLine {
            id: l as i64 + 1,
            name: format!("line{l}"),
            timestamp_ns: 5448 + l as i64,
            events: (0..spec.events_per_line)
                .map(|e| XEvent {
                    metadata_id: (e % names.len()) as i64 + 1,
                    duration_ps: step / 2,
                    data: Some(x_event::Data::OffsetPs(step * e as i64 + 2_500_000)),
                    stats: if e % 8 == 0 {
                        vec![XStat {
                            metadata_id: 1,
                            value: Some(x_stat::Value::Int64Value(e as i64)),
                        }]
                    } else {
                        Vec::new()
                    },
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    XPlane {
        id: i as i64 + 1,
        name: if i == 0 {
            "/host:CPU".into()
        } else {
            format!("/device:GPU:{}", i - 1)
        },
        lines,
        event_metadata,
        stat_metadata: BTreeMap::from([(
            1,
            XStatMetadata {
                id: 1,
                name: "step".into(),
                ..Default::default()
            },
        )]),
        ..Default::default()
    }
}

/// The Task Environment plane with session times and extra int stats.
pub fn task_env_plane(spec: &SynthSpec) -> XPlane {
    let mut names = vec![
        (PROFILE_START_TIME.to_string(), spec.start_ns),
        (
            PROFILE_STOP_TIME.to_string(),
            spec.start_ns + spec.duration_ns,
        ),
    ];
    names.extend(spec.task_env_stats.iter().cloned());
    let stat_metadata = names
        .iter()
        .enumerate()
        .map(|(i, (n, _))| {
            let id = i as i64 + 1;
            (
                id,
                XStatMetadata {
                    id,
                    name: n.clone(),
                    ..Default::default()
                },
            )
        })
        .collect();
    let stats = names
        .iter()
        .enumerate()
        .map(|(i, (_, v))| XStat {
            metadata_id: i as i64 + 1,
            value: Some(if i < 2 {
                x_stat::Value::Uint64Value(*v as u64)
            } else {
                x_stat::Value::Int64Value(*v)
            }),
        })
        .collect();
    XPlane {
        id: 1000,
        name: TASK_ENV_PLANE.into(),
        stat_metadata,
        stats,
        ..Default::default()
    }
}

/// Writes `XSpace.planes` fields one at a time, then the hostname.
pub fn write_synthetic(out: &mut impl Write, spec: &SynthSpec) -> std::io::Result<u64> {
    let mut written = 0;
    let put = |out: &mut dyn Write, field: u32, body: &[u8]| -> std::io::Result<u64> {
        let mut head = Vec::with_capacity(11);
        put_varint(&mut head, u64::from(fields::key(field, LEN)));
        put_varint(&mut head, body.len() as u64);
        out.write_all(&head)?;
        out.write_all(body)?;
        Ok((head.len() + body.len()) as u64)
    };
    for i in 0..spec.planes {
        written += put(out, xspace::PLANES, &event_plane(spec, i).encode_to_vec())?;
    }
    written += put(out, xspace::PLANES, &task_env_plane(spec).encode_to_vec())?;
    written += put(out, xspace::HOSTNAMES, spec.host.as_bytes())?;
    Ok(written)
}
