//! Collective calls of one PyTorch rank (Kineto Chrome JSON).
//!
//! Which events stand for a call, best first (the best tier the trace has
//! is used, so one call is never counted twice):
//! 1. GPU kernels of NCCL/RCCL (`ncclDevKernel_*`, `ncclKernel_*`): the
//!    kernel starts when the stream reaches it and spins until every peer
//!    has joined, so its start is the rank's arrival;
//! 2. the backend's own spans (`gloo:all_reduce` on gloo's worker thread,
//!    `nccl:all_reduce`): from the work's start to its completion;
//! 3. the `c10d::*` dispatcher ops, which with an asynchronous backend end
//!    at enqueue (so their exit says little).
//!
//! Instances are matched across ranks by the profiler's collective
//! metadata (`Process Group Name` + `Seq`, as PyTorch writes it for NCCL)
//! where the event has it, else by occurrence: the n-th call of the same
//! op on each rank (gloo's spans carry no sequence number in PyTorch 2.15).
//! Occurrence matching needs every rank's session to start at the same
//! collective; the analysis reports instances whose ranks disagree.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::classify::{classify, classify_comms_arg};
use super::model::{
    CollectiveCall, CollectiveKind, Framework, InstanceKey, MatchedBy, Participant, Preceding,
};
use super::{RankTrace, Timed, preceding_before, step_at};
use crate::TraceError;
use crate::kineto::us_to_ps;

#[derive(Deserialize)]
struct Doc<'a> {
    #[serde(rename = "traceEvents", borrow)]
    events: Vec<Event<'a>>,
    #[serde(rename = "baseTimeNanoseconds")]
    base_ns: Option<i64>,
    #[serde(rename = "distributedInfo")]
    distributed: Option<DistributedInfo>,
    #[serde(rename = "clockmesh")]
    clockmesh: Option<ClockmeshInfo>,
    host_name: Option<String>,
}

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

/// A thread or process id: Kineto writes numbers, and strings for its own
/// rows ("Trace PyTorch Profiler").
#[derive(Deserialize, Clone, PartialEq, Eq, Hash)]
#[serde(untagged)]
enum Id<'a> {
    Num(i64),
    Text(#[serde(borrow)] Cow<'a, str>),
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow)]
    ph: Option<Cow<'a, str>>,
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    cat: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pid: Option<Id<'a>>,
    #[serde(borrow)]
    tid: Option<Id<'a>>,
    ts: Option<f64>,
    dur: Option<f64>,
    #[serde(borrow)]
    args: Option<Args<'a>>,
}

/// The collective metadata PyTorch writes into an event's args.
#[derive(Deserialize, Default)]
struct Args<'a> {
    #[serde(rename = "Collective name", borrow)]
    collective: Option<Cow<'a, str>>,
    #[serde(rename = "Process Group Name", borrow)]
    group: Option<Cow<'a, str>>,
    #[serde(rename = "Seq")]
    seq: Option<Value>,
    #[serde(rename = "Group size")]
    group_size: Option<u32>,
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

/// One timed event, as the analysis needs it.
struct Span<'a> {
    name: Cow<'a, str>,
    thread: usize,
    start_ns: i64,
    end_ns: i64,
}

/// A collective event found in the trace.
struct Found<'a> {
    span: usize,
    kind: CollectiveKind,
    tier: Tier,
    args: Args<'a>,
}

fn malformed(what: &'static str) -> TraceError {
    TraceError::Malformed { at: 0, what }
}

/// Reads one rank's collective calls. `aligned`: the trace is a clockmesh
/// merge's output and its stated bound applies (else raw host clock, no
/// bound).
pub fn read(path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
    let bytes = std::fs::read(path).map_err(TraceError::io)?;
    parse(&bytes, path, aligned)
}

/// [`read`] of a trace already in memory (`path` names it).
pub fn parse(bytes: &[u8], path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
    let doc: Doc = serde_json::from_slice(bytes)
        .map_err(|e| TraceError::NotXPlane(format!("not a PyTorch (Kineto) JSON trace: {e}")))?;
    let base_ns = doc.base_ns.unwrap_or(0);
    let mut threads: HashMap<(Option<Id>, Option<Id>), usize> = HashMap::new();
    let mut spans = Vec::new();
    let mut found = Vec::new();
    for ev in doc.events {
        if ev.ph.as_deref() != Some("X") {
            continue;
        }
        let (Some(name), Some(ts)) = (ev.name, ev.ts) else {
            continue;
        };
        let start_ns = epoch_ns(base_ns, ts)?;
        let end_ns = start_ns.saturating_add(epoch_ns(0, ev.dur.unwrap_or(0.0))?);
        let next = threads.len();
        let thread = *threads.entry((ev.pid, ev.tid)).or_insert(next);
        if let Some(kind) = classify_event(&name, ev.args.as_ref()) {
            found.push(Found {
                span: spans.len(),
                kind,
                tier: tier(&name, ev.cat.as_deref()),
                args: ev.args.unwrap_or_default(),
            });
        }
        spans.push(Span {
            name,
            thread,
            start_ns,
            end_ns,
        });
    }
    let participant = participant(
        path,
        &doc.clockmesh,
        doc.host_name,
        &doc.distributed,
        aligned,
    );
    let calls = calls(&spans, found, doc.distributed.as_ref());
    Ok(RankTrace { participant, calls })
}

/// Whether a file looks like a clockmesh merge's output.
pub fn is_merged(path: &Path) -> Result<bool, TraceError> {
    let bytes = std::fs::read(path).map_err(TraceError::io)?;
    #[derive(Deserialize)]
    struct Top {
        #[serde(rename = "clockmesh")]
        clockmesh: Option<ClockmeshInfo>,
    }
    let top: Top = serde_json::from_slice(&bytes)
        .map_err(|e| TraceError::NotXPlane(format!("not a PyTorch (Kineto) JSON trace: {e}")))?;
    Ok(top.clockmesh.is_some_and(|c| c.merged_source.is_some()))
}

fn classify_event(name: &str, args: Option<&Args>) -> Option<CollectiveKind> {
    if name == "record_param_comms" {
        // Wraps the dispatcher op; the backend's span or kernel is the call.
        return None;
    }
    classify(name).or_else(|| {
        // Kernels named by the backend only (RCCL builds) carry the
        // collective's name in their args.
        let a = args?;
        a.collective
            .as_deref()
            .filter(|_| a.seq.is_some())
            .and_then(classify_comms_arg)
    })
}

/// µs as written (relative to `base_ns`, or epoch µs) → epoch ns.
fn epoch_ns(base_ns: i64, us: f64) -> Result<i64, TraceError> {
    let ps = us_to_ps(us)?;
    i64::try_from(i128::from(base_ns) + ps.div_euclid(1000))
        .map_err(|_| malformed("an event time is out of range"))
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
        .unwrap_or_else(|| super::file_host(path, ".pt.trace.json"));
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

fn calls(
    spans: &[Span],
    mut found: Vec<Found>,
    dist: Option<&DistributedInfo>,
) -> Vec<CollectiveCall> {
    let Some(best) = found.iter().map(|f| f.tier).min() else {
        return Vec::new();
    };
    // Steps (ProfilerStep#N), and what each thread did, for `preceding`.
    let steps: Vec<Timed<u64>> = spans
        .iter()
        .filter_map(|s| {
            let n = s.name.strip_prefix("ProfilerStep#")?.parse().ok()?;
            Some(Timed {
                name: n,
                start_ns: s.start_ns,
                end_ns: s.end_ns,
            })
        })
        .collect();
    let mut by_thread: HashMap<usize, Vec<Timed<&str>>> = HashMap::new();
    for s in spans
        .iter()
        .filter(|s| !s.name.starts_with("ProfilerStep#"))
    {
        by_thread.entry(s.thread).or_default().push(Timed {
            name: s.name.as_ref(),
            start_ns: s.start_ns,
            end_ns: s.end_ns,
        });
    }
    for v in by_thread.values_mut() {
        v.sort_by_key(|t| (t.end_ns, t.start_ns));
    }
    let dispatcher: Vec<(CollectiveKind, &Span)> = found
        .iter()
        .filter(|f| f.tier == Tier::Dispatcher)
        .map(|f| (f.kind, &spans[f.span]))
        .collect();
    found.retain(|f| f.tier == best);
    found.sort_by_key(|f| spans[f.span].start_ns);
    let group = default_group(dist);
    let world = dist.and_then(|d| {
        if d.pg_config.len() <= 1 {
            d.world_size
        } else {
            None
        }
    });
    let mut occurrences: HashMap<String, u64> = HashMap::new();
    found
        .into_iter()
        .map(|f| {
            let span = &spans[f.span];
            // The call is issued where the dispatcher op ran (gloo's spans
            // run on a worker thread); what that thread did before is the
            // rank's "before".
            let issue = (best == Tier::Backend)
                .then(|| issuing_op(&dispatcher, f.kind, span.start_ns))
                .flatten()
                .unwrap_or(span);
            let preceding = by_thread
                .get(&issue.thread)
                .and_then(|v| preceding_before(v, issue.start_ns))
                .map(|t| Preceding {
                    name: t.name.to_string(),
                    start_ns: t.start_ns,
                    end_ns: t.end_ns,
                });
            let (key, matched_by, group_size) = key(&f, span, &group, world, &mut occurrences);
            CollectiveCall {
                participant: 0,
                kind: f.kind,
                key,
                matched_by,
                op: span.name.to_string(),
                enter_ns: span.start_ns,
                exit_ns: span.end_ns,
                step: step_at(&steps, issue.start_ns),
                group_size,
                preceding,
                track: None,
            }
        })
        .collect()
}

/// The latest dispatcher op of the same kind that started at or before
/// `start_ns`: the op that enqueued the backend's work.
fn issuing_op<'s>(
    dispatcher: &[(CollectiveKind, &'s Span<'s>)],
    kind: CollectiveKind,
    start_ns: i64,
) -> Option<&'s Span<'s>> {
    dispatcher
        .iter()
        .filter(|(k, s)| *k == kind && s.start_ns <= start_ns)
        .max_by_key(|(_, s)| s.start_ns)
        .map(|(_, s)| *s)
}

fn key(
    f: &Found,
    span: &Span,
    default_group: &str,
    world: Option<u32>,
    occurrences: &mut HashMap<String, u64>,
) -> (InstanceKey, MatchedBy, Option<u32>) {
    let seq = f.args.seq.as_ref().and_then(|v| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
    });
    if let (Some(seq), Some(group)) = (seq, f.args.group.as_deref()) {
        let name = f
            .args
            .collective
            .as_deref()
            .unwrap_or(&span.name)
            .to_string();
        let key = InstanceKey {
            group: group.to_string(),
            name,
            ordinal: seq,
        };
        return (key, MatchedBy::Sequence, f.args.group_size);
    }
    let n = occurrences.entry(span.name.to_string()).or_insert(0);
    let key = InstanceKey {
        group: default_group.to_string(),
        name: span.name.to_string(),
        ordinal: *n,
    };
    *n += 1;
    (key, MatchedBy::Occurrence, f.args.group_size.or(world))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write(name: &str, v: &Value) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("cm-coll-kineto-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, serde_json::to_vec(v).unwrap()).unwrap();
        p
    }

    /// The shape PyTorch 2.15 writes for gloo: the dispatcher op on the
    /// main thread, the work on a gloo thread, no sequence numbers.
    #[test]
    fn gloo_spans_are_the_calls_and_the_main_thread_says_what_came_before() {
        let base = 1_000_000_000_000i64;
        let doc = json!({
            "baseTimeNanoseconds": base,
            "distributedInfo": {"backend": "gloo", "rank": 2, "world_size": 3,
                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 3}]},
            "clockmesh": {"host": "n2", "alignment_bound_ns": 900, "merged_source": "history"},
            "traceEvents": [
                {"ph": "X", "name": "ProfilerStep#7", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
                {"ph": "X", "cat": "cpu_op", "name": "aten::sum", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0},
                {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 10.0, "dur": 1.0},
                {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 9, "ts": 10.5, "dur": 20.25},
                {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 40.0, "dur": 1.0},
                {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 8, "ts": 40.5, "dur": 5.0},
                {"ph": "M", "name": "thread_name", "pid": 1, "tid": 9, "args": {"name": "x"}}
            ]
        });
        let t = read(&write("n2.pt.trace.json", &doc), true).unwrap();
        assert_eq!(t.participant.host, "n2");
        assert_eq!(t.participant.rank, Some(2));
        assert_eq!(t.participant.bound_ns, Some(900));
        assert_eq!(
            t.calls.len(),
            2,
            "one call per gloo span, none for c10d ops"
        );
        let c = &t.calls[0];
        assert_eq!(c.kind, CollectiveKind::AllReduce);
        assert_eq!((c.enter_ns, c.exit_ns), (base + 10_500, base + 30_750));
        assert_eq!(c.key.group, "default_pg");
        assert_eq!((c.key.ordinal, t.calls[1].key.ordinal), (0, 1));
        assert_eq!(c.matched_by, MatchedBy::Occurrence);
        assert_eq!(c.group_size, Some(3));
        assert_eq!(c.step, Some(7));
        let p = c.preceding.as_ref().unwrap();
        assert_eq!((p.name.as_str(), p.end_ns), ("aten::sum", base + 3_000));
        // The second call's issuing op came after the first dispatcher op.
        assert_eq!(
            t.calls[1].preceding.as_ref().unwrap().name,
            "c10d::allreduce_"
        );
        // Raw clocks: no bound.
        let raw = read(&write("n2b.pt.trace.json", &doc), false).unwrap();
        assert_eq!(raw.participant.bound_ns, None);
    }

    #[test]
    fn nccl_kernels_with_sequence_metadata_are_matched_by_sequence() {
        let doc = json!({
            "traceEvents": [
                {"ph": "X", "cat": "cpu_op", "name": "c10d::allgather_", "pid": 1, "tid": 1, "ts": 5.0, "dur": 1.0},
                {"ph": "X", "cat": "user_annotation", "name": "nccl:all_gather", "pid": 1, "tid": 1, "ts": 5.2, "dur": 0.5},
                {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 "pid": 0, "tid": 7, "ts": 9.0, "dur": 3.0,
                 "args": {"Collective name": "_allgather_base", "Process Group Name": "1", "Seq": 41, "Group size": 8}}
            ]
        });
        let t = read(&write("h.pt.trace.json", &doc), true).unwrap();
        assert_eq!(t.calls.len(), 1, "the kernel tier wins");
        let c = &t.calls[0];
        assert_eq!(c.matched_by, MatchedBy::Sequence);
        assert_eq!(c.key.group, "1");
        assert_eq!(c.key.ordinal, 41);
        assert_eq!(c.group_size, Some(8));
        assert_eq!(c.kind, CollectiveKind::AllGather);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for v in [
            json!([1, 2]),
            json!({"traceEvents": 3}),
            json!({"traceEvents": [{"ph": "X", "name": "a", "ts": 1e300}]}),
        ] {
            assert!(read(&write("bad.pt.trace.json", &v), true).is_err(), "{v}");
        }
        let p = write("trunc.pt.trace.json", &json!({}));
        std::fs::write(&p, b"{\"traceEvents\": [{\"ph\": \"X\", \"na").unwrap();
        assert!(read(&p, true).is_err());
    }
}
