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
//!
//! Read as a stream of protobuf fields ([`crate::wire`]), never decoded
//! whole: the planes are located first (the Task Environment may come
//! last), each plane's metadata is read in a first walk, then its lines
//! twice by seeking: once for the collective calls and steps (few), once,
//! only on lines holding calls, for what each call followed. Memory is the
//! metadata and the calls, not the events.

mod calls;
mod event;
mod plane;
mod preceding;
mod source;
#[cfg(test)]
mod tests;
mod walk;

use std::fs::File;
use std::path::Path;

use super::model::{CallClock, CollectiveCall, Framework, Participant};
use super::{RankTrace, step_begun_before, step_spans};
use crate::TraceError;
use crate::scan::ALIGNMENT_BOUND_STAT;
use crate::wire::WireReader;
use calls::{OpCache, number_occurrences};
use plane::{locate_planes, plane_head};
use source::{MemReader, Src};
use walk::PlaneWalk;

const TASK_ENV: &str = "Task Environment";
const HOST_PLANE: &str = "/host:CPU";
/// Task Environment stat `clockmesh.jax_profiler` writes: the job's
/// process index (`jax.process_index()`).
pub const PROCESS_INDEX: &str = "jax_process_index";

/// Reads one host's collective calls. `aligned`: the file is a clockmesh
/// merge's output and its stated bound applies.
pub fn read(path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
    let file = File::open(path).map_err(TraceError::io)?;
    read_from(&mut WireReader::new(file)?, path, aligned)
}

/// [`read`] of a trace already in memory (`path` names it): the same
/// reader over the bytes.
pub fn parse(bytes: &[u8], path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
    read_from(&mut MemReader { bytes, pos: 0 }, path, aligned)
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

fn read_from<R: Src>(r: &mut R, path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
    let planes = locate_planes(r)?;
    let env_at = planes.iter().position(|p| p.name == TASK_ENV);
    let env = plane_head(r, &planes[env_at.ok_or(TraceError::MissingTaskEnv)?])?;
    let start_ns = env
        .stat_i64("profile_start_time")
        .ok_or(TraceError::MissingStart)?;
    // xprof's `process_id` is the OS pid; the JAX helper records the
    // job's process index.
    let rank = env
        .stat_i64(PROCESS_INDEX)
        .and_then(|r| u64::try_from(r).ok());
    let host_at = planes.iter().position(|p| p.name == HOST_PLANE);
    let host = host_at.map(|i| plane_head(r, &planes[i])).transpose()?;
    let bound_ns = host
        .as_ref()
        .and_then(|h| h.stat_i64(ALIGNMENT_BOUND_STAT))
        .and_then(|b| u64::try_from(b).ok())
        .filter(|_| aligned);
    let participant = Participant {
        host: super::file_host(path, ".xplane.pb"),
        rank,
        framework: Framework::Xla,
        trace: path.display().to_string(),
        bound_ns,
    };
    let mut cache = OpCache::default();
    let mut calls = Vec::new();
    for (index, p) in planes.iter().enumerate() {
        if p.name.starts_with("/device:") {
            let head = plane_head(r, p)?;
            let mut walk = PlaneWalk::new(&head, index, start_ns, false);
            walk.run(r, &mut cache, true)?;
            calls.extend(walk.calls.into_iter().map(|c| CollectiveCall {
                clock: CallClock::Gpu,
                ..c
            }));
        }
    }
    let mut steps = Vec::new();
    if let (Some(index), Some(head)) = (host_at, &host) {
        let mut walk = PlaneWalk::new(head, index, start_ns, true);
        walk.run(r, &mut cache, calls.is_empty())?;
        if calls.is_empty() {
            calls = walk.calls;
        }
        steps = walk.steps;
    }
    steps.sort_by_key(|t| t.start_ns);
    for c in &mut calls {
        c.step = step_begun_before(&steps, c.enter_ns);
    }
    number_occurrences(&mut calls);
    Ok(RankTrace {
        participant,
        calls,
        steps: step_spans(&steps),
    })
}
