//! The implementation this one replaced (the whole file through serde,
//! every event kept), as the reference the tests compare against.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::TraceError;
use crate::collectives::classify::{classify, classify_comms_arg};
use crate::collectives::model::{
    CollectiveCall, CollectiveKind, InstanceKey, MatchedBy, Preceding,
};
use crate::collectives::{RankTrace, Timed, preceding_before, step_at};

// The trace-level metadata is read alike; what this reference checks is
// the events.
use super::{ClockmeshInfo, DistributedInfo, default_group, default_world, participant};
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

/// The implementation before streaming: the whole document through serde.
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
    let world = default_world(dist);
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
                    name: (*t.name).into(),
                    start_ns: t.start_ns,
                    end_ns: t.end_ns,
                });
            let (key, matched_by, group_size) = key(&f, span, &group, world, &mut occurrences);
            CollectiveCall {
                participant: 0,
                kind: f.kind,
                key,
                matched_by,
                op: (*span.name).into(),
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
            group: group.into(),
            name: name.into(),
            ordinal: seq,
        };
        return (key, MatchedBy::Sequence, f.args.group_size);
    }
    let n = occurrences.entry(span.name.to_string()).or_insert(0);
    let key = InstanceKey {
        group: default_group.into(),
        name: (*span.name).into(),
        ordinal: *n,
    };
    *n += 1;
    (key, MatchedBy::Occurrence, f.args.group_size.or(world))
}
