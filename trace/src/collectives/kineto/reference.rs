//! The implementation this one replaced (the whole file through serde,
//! every event kept), as the reference the tests compare against.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::TraceError;
use crate::collectives::classify::{classify, classify_comms_arg};
use crate::collectives::model::{CollectiveCall, CollectiveKind, Preceding};
use crate::collectives::{RankTrace, Timed, preceding_before, step_at};

// The trace-level metadata is read alike; what this reference checks is
// the events.
use super::event::Seq;
use super::lanes::LaneKey;
use super::link::{CommsOp, Launch, Links};
use super::{
    CallArgs, ClockmeshInfo, DistributedInfo, Found, Step, call, default_group, default_world,
    epoch, epoch_steps, issued_calls, participant, tier,
};
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
    #[serde(rename = "External id")]
    external_id: Option<u64>,
    #[serde(rename = "correlation")]
    correlation: Option<u64>,
    #[serde(rename = "In msg nelems")]
    in_nelems: Option<u64>,
}

impl Args<'_> {
    fn seq(&self) -> Option<Seq> {
        self.seq.as_ref().map(|v| {
            Seq(v
                .as_u64()
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok())))
        })
    }

    fn call_args(&self) -> CallArgs {
        CallArgs {
            collective: self.collective.as_deref().map(str::to_string),
            group: self.group.as_deref().map(str::to_string),
            seq: self.seq(),
            group_size: self.group_size,
            external_id: self.external_id,
            correlation: self.correlation,
            in_nelems: self.in_nelems,
        }
    }
}

/// One timed event, as the analysis needs it.
struct Span<'a> {
    name: Cow<'a, str>,
    thread: usize,
    /// Its device (numbered by pid), when it ran on a GPU.
    device: Option<usize>,
    start_ns: i64,
    end_ns: i64,
}

fn malformed(what: &'static str) -> TraceError {
    TraceError::Malformed { at: 0, what }
}

/// What the calls are made of: every timed event, the candidate calls,
/// the comms ops, the launches and the steps (times relative to the base).
#[derive(Default)]
struct Kept<'a> {
    spans: Vec<Span<'a>>,
    found: Vec<Found>,
    comms: Vec<CommsOp>,
    launches: HashMap<u64, Launch>,
    steps: Vec<Step>,
}

/// The implementation before streaming: the whole document through serde.
pub fn parse(bytes: &[u8], path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
    let doc: Doc = serde_json::from_slice(bytes)
        .map_err(|e| TraceError::NotXPlane(format!("not a PyTorch (Kineto) JSON trace: {e}")))?;
    let base_ns = doc.base_ns.unwrap_or(0);
    let mut threads: HashMap<(Option<Id>, Option<Id>), usize> = HashMap::new();
    let mut devices: HashMap<Option<Id>, usize> = HashMap::new();
    let mut kept = Kept::default();
    for ev in doc.events {
        if ev.ph.as_deref() != Some("X") {
            continue;
        }
        let (Some(name), Some(ts)) = (ev.name, ev.ts) else {
            continue;
        };
        let start = rel_ns(ts)?;
        let end = start + rel_ns(ev.dur.unwrap_or(0.0))?;
        epoch_ns(base_ns, start)?;
        let next = threads.len();
        let cat = ev.cat.as_deref();
        let device = super::lanes::is_gpu(cat).then(|| {
            let next = devices.len();
            *devices.entry(ev.pid.clone()).or_insert(next)
        });
        let thread = *threads.entry((ev.pid, ev.tid)).or_insert(next);
        let args = ev.args.unwrap_or_default();
        if let Some((corr, l)) = launch(cat, thread, start, &args) {
            kept.launches.insert(corr, l);
        }
        if name == "record_param_comms" {
            kept.comms.push(CommsOp {
                thread,
                start,
                end,
                args: args.call_args(),
            });
        }
        if let Some(kind) = classify_event(&name, &args) {
            kept.found.push(Found {
                name: name.to_string(),
                kind,
                tier: tier(&name, cat),
                thread,
                device,
                start,
                end,
                args: args.call_args(),
            });
        }
        if let Some(Ok(n)) = name.strip_prefix("ProfilerStep#").map(str::parse)
            && cat != Some("gpu_user_annotation")
        {
            kept.steps.push(Step { n, start, end });
        }
        kept.spans.push(Span {
            name,
            thread,
            device,
            start_ns: epoch_ns(base_ns, start)?,
            end_ns: epoch_ns(base_ns, start)?.saturating_add(
                i64::try_from(end - start)
                    .map_err(|_| malformed("an event time is out of range"))?,
            ),
        });
    }
    let participant = participant(
        path,
        &doc.clockmesh,
        doc.host_name,
        &doc.distributed,
        aligned,
    );
    let calls = calls(&kept, base_ns, doc.distributed.as_ref());
    Ok(RankTrace {
        participant,
        calls,
        steps: Vec::new(),
    })
}

/// The launch `launch::Launch::of` finds, from the whole event.
fn launch(cat: Option<&str>, thread: usize, start: i128, a: &Args) -> Option<(u64, Launch)> {
    let cat = cat?;
    if !(cat.ends_with("_runtime") || cat.ends_with("_driver")) {
        return None;
    }
    Some((
        a.correlation?,
        Launch {
            external_id: a.external_id,
            thread,
            start,
        },
    ))
}

fn classify_event(name: &str, args: &Args) -> Option<CollectiveKind> {
    if name == "record_param_comms" {
        // Wraps the dispatcher op; the backend's span or kernel is the call.
        return None;
    }
    classify(name).or_else(|| {
        // Kernels named by the backend only (RCCL builds) carry the
        // collective's name in their args.
        args.collective
            .as_deref()
            .filter(|_| args.seq.is_some())
            .and_then(classify_comms_arg)
    })
}

/// µs as written → ns relative to the base.
fn rel_ns(us: f64) -> Result<i128, TraceError> {
    Ok(us_to_ps(us)?.div_euclid(1000))
}

/// ns relative to the base → epoch ns.
fn epoch_ns(base_ns: i64, rel: i128) -> Result<i64, TraceError> {
    i64::try_from(i128::from(base_ns) + rel).map_err(|_| malformed("an event time is out of range"))
}

fn calls(kept: &Kept, base_ns: i64, dist: Option<&DistributedInfo>) -> Vec<CollectiveCall> {
    let Some(issued) = issued_calls(&kept.found) else {
        return Vec::new();
    };
    // What each thread, and each device on all its streams, did, for
    // `preceding`.
    let mut by_thread: HashMap<LaneKey, Vec<Timed<&str>>> = HashMap::new();
    for s in kept
        .spans
        .iter()
        .filter(|s| !s.name.starts_with("ProfilerStep#"))
    {
        let t = Timed {
            name: s.name.as_ref(),
            start_ns: s.start_ns,
            end_ns: s.end_ns,
        };
        if let Some(d) = s.device {
            by_thread.entry(LaneKey::Device(d)).or_default().push(t);
        }
        by_thread
            .entry(LaneKey::Thread(s.thread))
            .or_default()
            .push(t);
    }
    for v in by_thread.values_mut() {
        v.sort_by_key(|t| (t.end_ns, t.start_ns));
    }
    let steps = epoch_steps(&kept.steps, base_ns);
    let links = Links::new(&kept.comms, &kept.found, &kept.launches);
    let group = default_group(dist);
    let world = default_world(dist);
    let mut occurrences: HashMap<String, u64> = HashMap::new();
    issued
        .into_iter()
        .map(|(f, issue)| {
            let link = links.of(f, issue);
            let (thread, t) = super::work_point(f, issue);
            let at = base_ns as i128 + t;
            let preceding = by_thread
                .get(&thread)
                .and_then(|v| preceding_before(v, at as i64))
                .map(|t| Preceding {
                    name: (*t.name).into(),
                    start_ns: t.start_ns,
                    end_ns: t.end_ns,
                });
            let mut call = call(f, issue, &link, &group, world, &mut occurrences, base_ns);
            call.step = step_at(&steps, epoch(base_ns, link.issued_at));
            call.preceding = preceding;
            call
        })
        .collect()
}
