//! Collective calls of one PyTorch rank (Kineto Chrome JSON).
//!
//! Which events stand for a call, best first (the best tier the trace has
//! is used, so one call is never counted twice):
//! 1. GPU kernels of NCCL/RCCL (`ncclDevKernel_*`, `ncclKernel_*`): the
//!    kernel starts when the stream reaches it and spins until every peer
//!    has joined, so its start is the rank's arrival;
//! 2. the backend's own spans (`gloo:all_reduce` on gloo's worker thread,
//!    `nccl:all_reduce`): from the rank's call (the dispatcher op that
//!    issued the work) to the work's completion;
//! 3. the `c10d::*` dispatcher ops, which with an asynchronous backend end
//!    at enqueue (so their exit says little).
//!
//! Instances are matched across ranks by the profiler's collective
//! metadata (`Process Group Name` + `Seq`) of the call or of the
//! `record_param_comms` op that issued it ([`link`]), else by occurrence:
//! the n-th call of the same op on each rank, which the analysis aligns
//! across ranks whose captures start and stop at different calls.
//!
//! The file is streamed, never held whole: it is read in chunks (1 MiB),
//! the top level object by hand and each element of `traceEvents` from
//! the chunk, borrowing its strings: by hand when it has the plain shape
//! Kineto writes, else (escapes, exponents, anything wrong) through serde,
//! which also words the errors. Only the candidate calls of
//! every tier, the `ProfilerStep#` spans and, per thread, what may come
//! "before" a call are kept, so memory does not grow with the compute
//! events. Times are kept as written (µs relative to `baseTimeNanoseconds`,
//! which may come after the events) and placed at the end. What came
//! before a call is found in the same pass when the thread's events come
//! in time order (as Kineto writes them); a call that the pass could not
//! answer exactly is answered by a second pass over the file.

mod event;
mod json;
mod lanes;
mod link;
mod pass;
mod quick;
#[cfg(test)]
#[allow(dead_code)]
mod reference;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::path::Path;

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::model::{
    CallClock, CollectiveCall, CollectiveKind, Framework, InstanceKey, MatchedBy, Participant,
    Preceding, Track,
};
use super::{RankTrace, Timed, step_at, step_spans};
use crate::TraceError;
use event::{Args, Seq};
use json::{Source, Top, event, one, walk};
use lanes::{Before, Lane, LaneKey, Threads, Work};
use link::{Link, Links};
use pass::{Again, Pass};

/// How much of the file is read at a time (the buffer grows only for a
/// single value larger than this).
const CHUNK: usize = 1 << 20;

#[derive(Deserialize)]
struct DistributedInfo {
    rank: Option<u64>,
    world_size: Option<u32>,
    #[serde(default)]
    pg_config: Vec<PgConfig>,
}

#[derive(Deserialize)]
struct PgConfig {
    pg_name: Option<String>,
    pg_desc: Option<String>,
}

#[derive(Deserialize)]
struct ClockmeshInfo {
    host: Option<String>,
    alignment_bound_ns: Option<u64>,
    merged_source: Option<String>,
}

/// [`Args`] of a kept event.
#[derive(Default)]
struct CallArgs {
    collective: Option<String>,
    group: Option<String>,
    seq: Option<Seq>,
    group_size: Option<u32>,
    external_id: Option<u64>,
    correlation: Option<u64>,
    in_nelems: Option<u64>,
}

impl CallArgs {
    fn of(a: Option<Args>) -> Self {
        a.map(|a| Self {
            collective: a.collective.map(|t| t.0.into_owned()),
            group: a.group.map(|t| t.0.into_owned()),
            seq: a.seq,
            group_size: a.group_size,
            external_id: a.external_id,
            correlation: a.correlation,
            in_nelems: a.in_nelems,
        })
        .unwrap_or_default()
    }

    /// The instance this names: (group, collective, sequence number),
    /// when it has all three (the name falls back to `op`).
    fn sequence<'a>(&'a self, op: &'a str) -> Option<(&'a str, &'a str, u64)> {
        let seq = self.seq.and_then(|s| s.0)?;
        let group = self.group.as_deref()?;
        Some((group, self.collective.as_deref().unwrap_or(op), seq))
    }
}

/// The source tiers of module doc, best first.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Tier {
    Kernel,
    Backend,
    Dispatcher,
}

fn tier(name: &str, cat: Option<&str>) -> Tier {
    if name.starts_with("ncclDevKernel") || name.starts_with("ncclKernel") || cat == Some("kernel")
    {
        Tier::Kernel
    } else if name.starts_with("c10d::") {
        Tier::Dispatcher
    } else {
        Tier::Backend
    }
}

/// A collective event found in the trace (times: ns relative to the
/// trace's base, as written).
struct Found {
    name: String,
    kind: CollectiveKind,
    tier: Tier,
    thread: usize,
    /// Its device, for an event that ran on a GPU ([`lanes::is_gpu`]).
    device: Option<usize>,
    start: i128,
    end: i128,
    args: CallArgs,
}

/// A `ProfilerStep#N` span (relative ns).
struct Step {
    n: u64,
    start: i128,
    end: i128,
}

fn malformed(what: &'static str) -> TraceError {
    TraceError::Malformed { at: 0, what }
}

fn not_kineto(what: impl fmt::Display) -> TraceError {
    TraceError::NotXPlane(format!("not a PyTorch (Kineto) JSON trace: {what}"))
}

/// Reads one rank's collective calls. `aligned`: the trace is a clockmesh
/// merge's output and its stated bound applies (else raw host clock, no
/// bound).
pub fn read(path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
    let open = || std::fs::File::open(path).map_err(TraceError::io);
    read_with(open, CHUNK, path, aligned)
}

/// [`read`] of a trace already in memory (`path` names it).
pub fn parse(bytes: &[u8], path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
    // Read as a file is (the bytes are copied a chunk at a time).
    read_with(|| Ok(bytes), CHUNK.min(bytes.len() + 1), path, aligned)
}

/// Whether a file looks like a clockmesh merge's output.
pub fn is_merged(path: &Path) -> Result<bool, TraceError> {
    let file = std::fs::File::open(path).map_err(TraceError::io)?;
    let mut src = Source::new(file, CHUNK);
    let top = walk(&mut src, false, |b| {
        one::<IgnoredAny>(b).map(|(_, n)| (Ok(()), n))
    })?;
    Ok(top.clockmesh.is_some_and(|c| c.merged_source.is_some()))
}

/// [`read`] from what `open` opens (once, or twice when a second pass is
/// needed), `chunk` bytes at a time.
fn read_with<R: Read>(
    mut open: impl FnMut() -> Result<R, TraceError>,
    chunk: usize,
    path: &Path,
    aligned: bool,
) -> Result<RankTrace, TraceError> {
    let (mut pass, top) = first_pass(open()?, chunk)?;
    let participant = participant(
        path,
        &top.clockmesh,
        top.host_name,
        &top.distributed,
        aligned,
    );
    let Some(calls) = issued_calls(&pass.found) else {
        return Ok(RankTrace {
            participant,
            calls: Vec::new(),
            steps: step_spans(&epoch_steps(&pass.steps, top.base_ns.unwrap_or(0))),
        });
    };
    let links = Links::new(&pass.comms, &pass.found, &pass.launches);
    let linked: Vec<Link> = calls.iter().map(|(f, i)| links.of(f, i)).collect();
    let points: Vec<(LaneKey, i128)> = calls
        .iter()
        .map(|(f, issue)| work_point(f, issue))
        .collect();
    let answers = answer(
        &mut open,
        chunk,
        &mut pass.threads,
        (&pass.lanes, &pass.devices),
        pass.seen,
        &points,
    )?;
    let base = top.base_ns.unwrap_or(0);
    let placed = Placed {
        steps: epoch_steps(&pass.steps, base),
        base,
    };
    let calls = place(
        calls,
        &linked,
        &points,
        &answers,
        &placed,
        top.distributed.as_ref(),
    );
    let steps = step_spans(&placed.steps);
    Ok(RankTrace {
        participant,
        calls,
        steps,
    })
}

/// The first pass over the file: what it kept, and the trace's fields.
fn first_pass<R: Read>(reader: R, chunk: usize) -> Result<(Pass, Top), TraceError> {
    let mut pass = Pass::default();
    let top = {
        let mut src = Source::new(reader, chunk);
        walk(&mut src, true, |b| event(b, |ev| pass.event(ev)))?
    };
    pass.lanes.iter_mut().for_each(Lane::finish);
    pass.devices.iter_mut().for_each(Lane::finish);
    let base = top.base_ns.unwrap_or(0);
    if let Some((lo, hi)) = pass.range {
        // Every event's time must be a time (checked here: the base may
        // come after the events).
        for t in [lo, hi] {
            i64::try_from(i128::from(base) + t)
                .map_err(|_| malformed("an event time is out of range"))?;
        }
    }
    Ok((pass, top))
}

/// The calls (those of the best tier found; `None` when there are none),
/// in time order, each with where it was issued: the dispatcher op of the
/// same kind before a backend span (gloo's spans run on a worker thread;
/// what the thread that called did before is the rank's "before"), else
/// the call itself.
fn issued_calls(found: &[Found]) -> Option<Vec<(&Found, &Found)>> {
    let best = found.iter().map(|f| f.tier).min()?;
    let dispatcher: Vec<&Found> = found
        .iter()
        .filter(|f| f.tier == Tier::Dispatcher)
        .collect();
    let mut calls: Vec<(&Found, &Found)> = found
        .iter()
        .filter(|f| f.tier == best)
        .map(|f| {
            let issue = (best == Tier::Backend)
                .then(|| issuing_op(&dispatcher, f.kind, f.start))
                .flatten()
                .unwrap_or(f);
            (f, issue)
        })
        .collect();
    calls.sort_by_key(|(f, _)| f.start);
    Some(calls)
}

/// Where what a rank did before a call is: for a kernel, its device at
/// its start, every stream together — the GPU ran the rank's work there,
/// while the CPU only queued it and may be far ahead (its ops before the
/// launch last microseconds; counting from them made the GPU's compute
/// look like a host gap, and no what-if could reach it); and not its own
/// stream only: NCCL runs on a stream of its own (ProcessGroupNCCL, DDP),
/// made to wait for the compute stream by a CUDA event, so there the span
/// before a collective kernel is the previous collective, and the compute
/// it waited for looked like a gap. A kernel the trace places on no GPU
/// row is read on its own thread; any other call on the issuing thread at
/// the issue (the dispatcher op before a backend span).
fn work_point(f: &Found, issue: &Found) -> (LaneKey, i128) {
    match (f.tier, f.device) {
        (Tier::Kernel, Some(d)) => (LaneKey::Device(d), f.start),
        (Tier::Kernel, None) => (LaneKey::Thread(f.thread), f.start),
        _ => (LaneKey::Thread(issue.thread), issue.start),
    }
}

/// The first pass's lanes: one a thread, one a device.
type FirstLanes<'p> = (&'p [Lane], &'p [Lane]);

fn first_lane<'p>((threads, devices): FirstLanes<'p>, key: LaneKey) -> &'p Lane {
    match key {
        LaneKey::Thread(i) => &threads[i],
        LaneKey::Device(i) => &devices[i],
    }
}

/// What came before each call's issue: from the first pass (`first`)
/// where it could say, else from `second`.
struct Answers<'p> {
    first: FirstLanes<'p>,
    second: HashMap<LaneKey, Lane>,
}

impl Answers<'_> {
    /// The span that came before `t` on lane `key`, if any.
    fn before(&self, (key, t): (LaneKey, i128)) -> Option<&Work> {
        match first_lane(self.first, key).before(t) {
            Before::Unknown => self.second.get(&key).and_then(|l| l.before(t).span()),
            answered => answered.span(),
        }
    }
}

/// Answers what came before each call's issue: the first pass's lanes
/// (`first`, of `threads`, over `seen` events), and a second pass over
/// what `open` opens for the issues they could not answer.
fn answer<'p, R: Read>(
    open: impl FnOnce() -> Result<R, TraceError>,
    chunk: usize,
    threads: &mut Threads,
    first: FirstLanes<'p>,
    seen: u64,
    points: &[(LaneKey, i128)],
) -> Result<Answers<'p>, TraceError> {
    let mut second: HashMap<LaneKey, Lane> = HashMap::new();
    for &(key, t) in points {
        if matches!(first_lane(first, key).before(t), Before::Unknown) {
            second.entry(key).or_default().ask(t);
        }
    }
    if !second.is_empty() {
        let mut src = Source::new(open()?, chunk);
        let mut again = Again {
            threads,
            lanes: &mut second,
            seen: 0,
        };
        walk(&mut src, true, |b| event(b, |ev| again.event(ev)))?;
        if again.seen != seen {
            return Err(TraceError::Changed);
        }
        second.values_mut().for_each(Lane::finish);
    }
    Ok(Answers { first, second })
}

/// What placing the calls needs of the trace: its steps on the epoch
/// timeline and its base time.
struct Placed {
    steps: Vec<Timed<u64>>,
    base: i64,
}

/// The calls as the model has them: epoch times (`base` + relative),
/// their instance keys, their steps and what came before them (on the
/// thread and at the time each was issued: `points`).
fn place(
    calls: Vec<(&Found, &Found)>,
    links: &[Link],
    points: &[(LaneKey, i128)],
    answers: &Answers,
    placed: &Placed,
    dist: Option<&DistributedInfo>,
) -> Vec<CollectiveCall> {
    let base = placed.base;
    let group = default_group(dist);
    let world = default_world(dist);
    let mut occurrences: HashMap<String, u64> = HashMap::new();
    calls
        .into_iter()
        .zip(links.iter().zip(points))
        .map(|((f, issue), (link, &point))| {
            let preceding = answers.before(point).map(|w| Preceding {
                name: w.name.as_str().into(),
                start_ns: epoch(base, w.start),
                end_ns: epoch(base, w.end),
            });
            let mut call = call(f, issue, link, &group, world, &mut occurrences, base);
            call.step = step_at(&placed.steps, epoch(base, link.issued_at));
            call.preceding = preceding;
            call
        })
        .collect()
}

/// The `ProfilerStep#` spans on the epoch timeline, by start (the trace
/// may write them in any order).
fn epoch_steps(steps: &[Step], base: i64) -> Vec<Timed<u64>> {
    let mut steps: Vec<Timed<u64>> = steps
        .iter()
        .map(|s| Timed {
            name: s.n,
            start_ns: epoch(base, s.start),
            end_ns: epoch(base, s.end),
        })
        .collect();
    steps.sort_by_key(|s| (s.start_ns, s.end_ns));
    steps
}

/// One call as the model has it (no step, nothing before it yet).
/// A backend span's rank arrived when it issued the call (the dispatcher
/// op: gloo's worker starts the work later); it leaves when the work
/// completes. A kernel arrives when it starts on the GPU.
fn call(
    f: &Found,
    issue: &Found,
    link: &Link,
    default_group: &str,
    world: Option<u32>,
    occurrences: &mut HashMap<String, u64>,
    base: i64,
) -> CollectiveCall {
    let comms = link.comms.map(|c| &c.args);
    let (key, matched_by, group_size) = key(f, comms, default_group, world, occurrences);
    let enter = if f.tier == Tier::Backend {
        issue.start.min(f.start)
    } else {
        f.start
    };
    CollectiveCall {
        participant: 0,
        kind: f.kind,
        key,
        matched_by,
        op: f.name.as_str().into(),
        enter_ns: epoch(base, enter),
        exit_ns: epoch(base, f.end),
        step: None,
        group_size,
        elements: f.args.in_nelems.or(comms.and_then(|c| c.in_nelems)),
        preceding: None,
        clock: if f.tier == Tier::Kernel {
            CallClock::Gpu
        } else {
            CallClock::Host
        },
        track: Some(Track {
            plane: 0,
            line: f.thread as i64,
        }),
    }
}

/// A timed (`X`) event of a rank's trace, for the merged Chrome JSON.
pub(crate) struct ChromeEvent<'a> {
    /// Its thread, numbered as the calls' [`Track`] lines number them:
    /// (pid, tid) in order of first appearance.
    pub(crate) thread: usize,
    /// `pid P tid T` on the thread's first event, to name it.
    pub(crate) new_thread: Option<String>,
    pub(crate) name: &'a str,
    /// Its start (epoch ps) and duration (ps).
    pub(crate) start_ps: i128,
    pub(crate) dur_ps: i128,
}

/// Streams a rank's timed events, in file order, to `each` (two passes:
/// the base time may follow the events).
pub(crate) fn each_timed_event(
    path: &Path,
    mut each: impl FnMut(ChromeEvent) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    let open = || std::fs::File::open(path).map_err(TraceError::io);
    let top = walk(&mut Source::new(open()?, CHUNK), true, |b| {
        event(b, |_| Ok(()))
    })?;
    let base_ps = i128::from(top.base_ns.unwrap_or(0)) * 1000;
    let mut threads = Threads::default();
    let mut named = 0;
    walk(&mut Source::new(open()?, CHUNK), true, |b| {
        event(b, |mut ev| {
            if ev.ph.as_deref() != Some("X") {
                return Ok(());
            }
            let (Some(ts), Some(name)) = (ev.ts, ev.name.take()) else {
                return Ok(());
            };
            let thread = threads.index(ev.pid.as_ref(), ev.tid.as_ref());
            let new_thread = (thread == named).then(|| {
                named += 1;
                format!("pid {} tid {}", show_id(&ev.pid), show_id(&ev.tid))
            });
            each(ChromeEvent {
                thread,
                new_thread,
                name: &name,
                start_ps: base_ps + crate::kineto::us_to_ps(ts)?,
                dur_ps: crate::kineto::us_to_ps(ev.dur.unwrap_or(0.0))?,
            })
        })
    })?;
    Ok(())
}

fn show_id(id: &Option<event::Id>) -> String {
    match id {
        Some(event::Id::Num(n)) => n.to_string(),
        Some(event::Id::Text(t)) => t.to_string(),
        None => "-".into(),
    }
}

/// A time relative to the base as epoch ns, saturated (starts are in
/// range, checked against the extremes; an end is its start plus its
/// duration, saturated).
fn epoch(base: i64, rel_ns: i128) -> i64 {
    let t = i128::from(base) + rel_ns;
    i64::try_from(t).unwrap_or(if t < 0 { i64::MIN } else { i64::MAX })
}

fn participant(
    path: &Path,
    cm: &Option<ClockmeshInfo>,
    host_name: Option<String>,
    dist: &Option<DistributedInfo>,
    aligned: bool,
) -> Participant {
    let host = cm
        .as_ref()
        .and_then(|c| c.host.clone())
        .or(host_name)
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| crate::kineto::file_host(path));
    Participant {
        host,
        rank: dist.as_ref().and_then(|d| d.rank),
        framework: Framework::PyTorch,
        trace: path.display().to_string(),
        bound_ns: if aligned {
            cm.as_ref().and_then(|c| c.alignment_bound_ns)
        } else {
            None
        },
    }
}

/// The default group's name when the trace has one group (gloo's spans do
/// not say which group they belong to).
fn default_group(dist: Option<&DistributedInfo>) -> String {
    dist.filter(|d| d.pg_config.len() == 1)
        .and_then(|d| {
            let pg = &d.pg_config[0];
            pg.pg_desc.clone().or_else(|| pg.pg_name.clone())
        })
        .unwrap_or_else(|| "default_pg".into())
}

/// The world size, where the trace has one group (so the group is the
/// world).
fn default_world(dist: Option<&DistributedInfo>) -> Option<u32> {
    dist.filter(|d| d.pg_config.len() <= 1)
        .and_then(|d| d.world_size)
}

/// The latest dispatcher op of the same kind that started at or before
/// `start`: the op that enqueued the backend's work.
fn issuing_op<'f>(
    dispatcher: &[&'f Found],
    kind: CollectiveKind,
    start: i128,
) -> Option<&'f Found> {
    dispatcher
        .iter()
        .filter(|f| f.kind == kind && f.start <= start)
        .max_by_key(|f| f.start)
        .copied()
}

/// The call's instance key: by sequence, from its own metadata or its
/// comms op's; else by occurrence (the n-th call of the op, aligned
/// across ranks by the analysis).
fn key(
    f: &Found,
    comms: Option<&CallArgs>,
    default_group: &str,
    world: Option<u32>,
    occurrences: &mut HashMap<String, u64>,
) -> (InstanceKey, MatchedBy, Option<u32>) {
    let own = f.args.sequence(&f.name).map(|k| (k, f.args.group_size));
    let linked = || comms.and_then(|c| Some((c.sequence(&f.name)?, c.group_size)));
    if let Some(((group, name, seq), size)) = own.or_else(linked) {
        let key = InstanceKey {
            group: group.into(),
            name: name.into(),
            ordinal: seq,
        };
        let size = size.or(comms.and_then(|c| c.group_size));
        return (key, MatchedBy::Sequence, size);
    }
    // Without a sequence number the group still keeps the process groups'
    // calls apart (PyTorch 2.11 writes no `Seq`).
    let group = (f.args.group.as_deref())
        .or(comms.and_then(|c| c.group.as_deref()))
        .unwrap_or(default_group);
    let n = occurrences.entry(f.name.clone()).or_insert(0);
    let key = InstanceKey {
        group: group.into(),
        name: f.name.as_str().into(),
        ordinal: *n,
    };
    *n += 1;
    let size = f.args.group_size.or(comms.and_then(|c| c.group_size));
    (key, MatchedBy::Occurrence, size.or(world))
}
