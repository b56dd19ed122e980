//! Merged Chrome/Perfetto JSON from already-merged `.xplane.pb` files and
//! PyTorch ranks' Kineto JSON: one process per host+plane (pid = 1000 ×
//! (host index + 1) + plane index, so a machine's planes sort together)
//! and one per PyTorch rank (pid 1000 × (index + 1), a thread per Kineto
//! (pid, tid)), labelled with the host's offset, drift and bound; one
//! thread per line, `X` events with µs timestamps relative to the global
//! origin; and flow arrows (`s`/`t`/`f`) linking each collective instance
//! across ranks, from the first rank to enter to the last one, which every
//! other rank waited for; and each step's critical path (`trace
//! critical-path`) as slices on a process of its own, pid 1, sorted first.
//! Streams events and keeps one plane's event names in memory; the flows
//! and paths read each host's collectives ([`crate::collectives::inputs`])
//! one host at a time.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::collectives::analyse::RankCall;
use super::collectives::critical::{CriticalOptions, CriticalPaths, HopOrder, critical_paths};
use super::collectives::{Analysis, AnalysisOptions, Framework, Track, analyse};
use super::fields::{map_entry, xevent, xevent_metadata, xline, xplane, xspace};
use super::plan::MergeError;
use super::wire::{LEN, VARINT, WireReader};
use super::{FileError, TraceError};

/// What a merged file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// An xprof `.xplane.pb` (one process per plane).
    Xplane,
    /// A PyTorch rank's Kineto JSON (one process, a thread per (pid, tid)).
    Kineto,
}

/// One host (xprof) or rank (PyTorch) of the merged JSON: its merged file
/// and its map at the session start, for the process labels.
#[derive(Clone, Debug)]
pub struct PerfettoHost {
    pub host: String,
    pub path: PathBuf,
    pub format: TraceFormat,
    /// global − local at the session start.
    pub offset_ns: i64,
    pub drift_ppb: f64,
    /// The worst bound its events were placed with; `None`: unknown.
    pub bound_ns: Option<u64>,
}

/// Writes `json` atomically (temp + rename) from the hosts' merged files,
/// whose timelines start at `origin_ns` (the merged `profile_start_time`).
pub fn write_chrome_json(
    inputs: &[PerfettoHost],
    origin_ns: i64,
    json: &Path,
) -> Result<(), MergeError> {
    let (flows, paths) = collective_overlays(inputs, origin_ns)?;
    let tmp = json.with_extension(format!("tmp-{}", std::process::id()));
    let out_err = |error| MergeError::Output {
        path: json.display().to_string(),
        error,
    };
    let result = (|| {
        let file = File::create(&tmp).map_err(out_err)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        w.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n")
            .map_err(out_err)?;
        let mut first = true;
        for (host_idx, host) in inputs.iter().enumerate() {
            let ferr = |error| {
                MergeError::File(FileError {
                    path: host.path.display().to_string(),
                    error,
                })
            };
            let written = match host.format {
                TraceFormat::Xplane => write_host(&mut w, host_idx, host, &mut first),
                TraceFormat::Kineto => write_kineto(&mut w, host_idx, host, origin_ns, &mut first),
            };
            written.map_err(|e| match e {
                Failure::Trace(t) => ferr(t),
                Failure::Out(o) => out_err(o),
            })?;
        }
        for flow in &flows {
            write_flow(&mut w, flow, &mut first).map_err(out_err)?;
        }
        if let Some(paths) = &paths {
            write_critical_paths(&mut w, paths, origin_ns, &mut first).map_err(out_err)?;
        }
        w.write_all(b"\n]}\n").map_err(out_err)?;
        w.flush().map_err(out_err)
    })();
    match result {
        Ok(()) => std::fs::rename(&tmp, json).map_err(out_err),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

enum Failure {
    Trace(TraceError),
    Out(std::io::Error),
}

impl From<TraceError> for Failure {
    fn from(e: TraceError) -> Self {
        Self::Trace(e)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Self::Out(e)
    }
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

/// Writes `,\n` between array elements.
fn sep(w: &mut impl Write, first: &mut bool) -> std::io::Result<()> {
    if !std::mem::take(first) {
        w.write_all(b",\n")?;
    }
    Ok(())
}

/// Picoseconds as a decimal µs string (exact, no float rounding).
fn ps_to_us(ps: i128) -> String {
    let sign = if ps < 0 { "-" } else { "" };
    let a = ps.unsigned_abs();
    format!("{sign}{}.{:06}", a / 1_000_000, a % 1_000_000)
}

/// The chrome process of plane `plane` of host `host`.
fn pid_of(host: usize, plane: u32) -> u64 {
    1000 * (host as u64 + 1) + u64::from(plane)
}

/// What the host's processes are labelled with: how it was placed.
fn host_label(h: &PerfettoHost) -> String {
    let bound = h
        .bound_ns
        .map_or_else(|| "unknown".to_string(), |b| format!("± {b} ns"));
    format!(
        "{}: offset {} ns, drift {:+.1} ppb, bound {bound} (clockmesh)",
        h.host, h.offset_ns, h.drift_ppb
    )
}

fn write_host(
    w: &mut impl Write,
    host_idx: usize,
    host: &PerfettoHost,
    first: &mut bool,
) -> Result<(), Failure> {
    let mut r = WireReader::new(File::open(&host.path).map_err(TraceError::io)?)?;
    let end = r.file_len();
    let mut plane_idx: u32 = 0;
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        if (field, wire) != (xspace::PLANES, LEN) {
            r.skip_value(wire, end)?;
            continue;
        }
        let n = r.read_len(end)?;
        let pid = pid_of(host_idx, plane_idx);
        plane_idx += 1;
        write_plane(w, &mut r, n, pid, host, first)?;
    }
    Ok(())
}

/// A PyTorch rank: one process, a thread per Kineto (pid, tid) numbered as
/// its calls' tracks are, `X` events in µs after the origin.
fn write_kineto(
    w: &mut impl Write,
    host_idx: usize,
    host: &PerfettoHost,
    origin_ns: i64,
    first: &mut bool,
) -> Result<(), Failure> {
    let pid = pid_of(host_idx, 0);
    let file = host.path.file_name().unwrap_or_default().to_string_lossy();
    write_process(w, pid, &format!("{} {file}", host.host), host, first)?;
    let origin_ps = i128::from(origin_ns) * 1000;
    // The reader's callback can only fail with a trace error: a write
    // error waits here and is what is reported.
    let mut out: Option<std::io::Error> = None;
    let read = crate::collectives::kineto::each_timed_event(&host.path, |ev| {
        let wrote = (|| {
            if let Some(label) = &ev.new_thread {
                sep(w, first)?;
                write!(
                    w,
                    "{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":{}}}}}",
                    ev.thread,
                    json_str(label)
                )?;
            }
            sep(w, first)?;
            write!(
                w,
                "{{\"ph\":\"X\",\"pid\":{pid},\"tid\":{},\"ts\":{},\"dur\":{},\"name\":{}}}",
                ev.thread,
                ps_to_us(ev.start_ps - origin_ps),
                ps_to_us(ev.dur_ps),
                json_str(ev.name)
            )
        })();
        wrote.map_err(|e| {
            out = Some(e);
            TraceError::Changed
        })
    });
    match (out, read) {
        (Some(e), _) => Err(Failure::Out(e)),
        (None, r) => Ok(r?),
    }
}

/// A process's name, sort index and label.
fn write_process(
    w: &mut impl Write,
    pid: u64,
    name: &str,
    host: &PerfettoHost,
    first: &mut bool,
) -> std::io::Result<()> {
    sep(w, first)?;
    write!(
        w,
        "{{\"ph\":\"M\",\"pid\":{pid},\"name\":\"process_name\",\"args\":{{\"name\":{}}}}},\n{{\"ph\":\"M\",\"pid\":{pid},\"name\":\"process_sort_index\",\"args\":{{\"sort_index\":{pid}}}}},\n{{\"ph\":\"M\",\"pid\":{pid},\"name\":\"process_labels\",\"args\":{{\"labels\":{}}}}}",
        json_str(name),
        json_str(&host_label(host))
    )
}

struct LineHead {
    id: i64,
    name: String,
    ts_ns: i64,
}

fn write_plane(
    w: &mut impl Write,
    r: &mut WireReader,
    n: u64,
    pid: u64,
    host: &PerfettoHost,
    first: &mut bool,
) -> Result<(), Failure> {
    let (start, end) = (r.pos(), r.pos() + n);
    // First walk: name and event names (map entries may follow the lines).
    let mut name = String::new();
    let mut names: HashMap<i64, String> = HashMap::new();
    let mut lines = Vec::new();
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        match (field, wire) {
            (xplane::NAME, LEN) => {
                let k = r.read_len(end)?;
                name = String::from_utf8_lossy(&r.read_bytes(k)?).into_owned();
            }
            (xplane::LINES, LEN) => {
                let k = r.read_len(end)?;
                lines.push((r.pos(), k));
                r.skip(k)?;
            }
            (xplane::EVENT_METADATA, LEN) => {
                let k = r.read_len(end)?;
                if let Some((id, n)) = read_event_metadata(r, k)? {
                    names.insert(id, n);
                }
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    let _ = start;
    write_process(w, pid, &format!("{} {name}", host.host), host, first)?;
    for (ls, lk) in lines {
        r.seek_to(ls)?;
        let head = read_line_head(r, lk)?;
        sep(w, first)?;
        write!(
            w,
            "{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{},\"name\":\"thread_name\",\"args\":{{\"name\":{}}}}}",
            head.id,
            json_str(&head.name)
        )?;
        r.seek_to(ls)?;
        write_events(w, r, lk, pid, &head, &names, first)?;
    }
    r.seek_to(end)?;
    Ok(())
}

fn read_event_metadata(r: &mut WireReader, k: u64) -> Result<Option<(i64, String)>, TraceError> {
    let end = r.pos() + k;
    let (mut key, mut name, mut display) = (None, None, None);
    while r.pos() < end {
        let (f, wire) = r.read_key()?;
        match (f, wire) {
            (map_entry::KEY, VARINT) => key = Some(r.read_varint()? as i64),
            (map_entry::VALUE, LEN) => {
                let m = r.read_len(end)?;
                let mend = r.pos() + m;
                while r.pos() < mend {
                    let (g, w2) = r.read_key()?;
                    match (g, w2) {
                        (xevent_metadata::NAME, LEN) | (xevent_metadata::DISPLAY_NAME, LEN) => {
                            let s = r.read_len(mend)?;
                            let v = String::from_utf8_lossy(&r.read_bytes(s)?).into_owned();
                            if g == xevent_metadata::NAME {
                                name = Some(v)
                            } else {
                                display = Some(v)
                            }
                        }
                        _ => r.skip_value(w2, mend)?,
                    }
                }
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    Ok(key.zip(display.filter(|d| !d.is_empty()).or(name)))
}

fn read_line_head(r: &mut WireReader, k: u64) -> Result<LineHead, TraceError> {
    let end = r.pos() + k;
    let mut head = LineHead {
        id: 0,
        name: String::new(),
        ts_ns: 0,
    };
    let mut display = String::new();
    while r.pos() < end {
        let (f, wire) = r.read_key()?;
        match (f, wire) {
            (xline::ID, VARINT) => head.id = r.read_varint()? as i64,
            (xline::TIMESTAMP_NS, VARINT) => head.ts_ns = r.read_varint()? as i64,
            (xline::NAME, LEN) | (xline::DISPLAY_NAME, LEN) => {
                let s = r.read_len(end)?;
                let v = String::from_utf8_lossy(&r.read_bytes(s)?).into_owned();
                if f == xline::NAME {
                    head.name = v
                } else {
                    display = v
                }
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    if !display.is_empty() {
        head.name = display;
    }
    Ok(head)
}

fn write_events(
    w: &mut impl Write,
    r: &mut WireReader,
    k: u64,
    pid: u64,
    head: &LineHead,
    names: &HashMap<i64, String>,
    first: &mut bool,
) -> Result<(), Failure> {
    let end = r.pos() + k;
    while r.pos() < end {
        let (f, wire) = r.read_key()?;
        if (f, wire) != (xline::EVENTS, LEN) {
            r.skip_value(wire, end)?;
            continue;
        }
        let m = r.read_len(end)?;
        let eend = r.pos() + m;
        let (mut meta, mut offset_ps, mut dur_ps, mut aggregated) = (0i64, 0i64, 0i64, false);
        while r.pos() < eend {
            let (g, w2) = r.read_key()?;
            match (g, w2) {
                (xevent::METADATA_ID, VARINT) => meta = r.read_varint()? as i64,
                (xevent::OFFSET_PS, VARINT) => offset_ps = r.read_varint()? as i64,
                (xevent::DURATION_PS, VARINT) => dur_ps = r.read_varint()? as i64,
                (xevent::NUM_OCCURRENCES, VARINT) => {
                    r.read_varint()?;
                    aggregated = true;
                }
                _ => r.skip_value(w2, eend)?,
            }
        }
        if aggregated {
            continue; // no timestamp (num_occurrences replaces offset_ps)
        }
        let ts_ps = i128::from(head.ts_ns) * 1000 + i128::from(offset_ps);
        let name = names
            .get(&meta)
            .map_or_else(|| format!("#{meta}"), |n| n.clone());
        sep(w, first)?;
        write!(
            w,
            "{{\"ph\":\"X\",\"pid\":{pid},\"tid\":{},\"ts\":{},\"dur\":{},\"name\":{}}}",
            head.id,
            ps_to_us(ts_ps),
            ps_to_us(i128::from(dur_ps)),
            json_str(&name)
        )?;
    }
    Ok(())
}

/// One point of an instance's flow, on a rank's call.
#[derive(Clone, Debug, PartialEq)]
struct FlowPoint {
    /// The instance's flow id (its index in the analysis, from 1).
    id: usize,
    /// Chrome's flow phase: `s` (first), `t` (on the way), `f` (last).
    phase: char,
    pid: u64,
    tid: i64,
    /// The middle of the call, ps after the origin: inside its slice,
    /// which the point binds to.
    ts_ps: i128,
    name: String,
    /// On the first point: what the instance was (`None` elsewhere).
    args: Option<serde_json::Value>,
}

/// The flows of every collective instance the hosts' and ranks' merged
/// traces share (as `trace collectives` matches them), and each step's
/// critical path (as `trace critical-path` finds it; `None` without calls).
fn collective_overlays(
    hosts: &[PerfettoHost],
    origin_ns: i64,
) -> Result<(Vec<FlowPoint>, Option<CriticalPaths>), MergeError> {
    let mut participants = Vec::new();
    let mut calls = Vec::new();
    let mut steps = Vec::new();
    for (index, h) in hosts.iter().enumerate() {
        let rank = crate::collectives::inputs::read_rank(&h.path, true)?;
        participants.push(rank.participant);
        steps.push(rank.steps);
        calls.extend(rank.calls.into_iter().map(|mut c| {
            c.participant = index;
            c
        }));
    }
    if calls.is_empty() {
        return Ok((Vec::new(), None));
    }
    let options = AnalysisOptions {
        aligned: true,
        top_preceding: 0,
    };
    let analysis = analyse(&participants, calls.clone(), &options);
    let paths = critical_paths(&analysis, &calls, &steps, &CriticalOptions::default());
    Ok((flow_points(&analysis, origin_ns), Some(paths)))
}

/// The critical paths' process: sorted before every host's (pids ≥ 1000).
const CRITICAL_PID: u64 = 1;

/// Each step's critical path as `X` slices, one per segment, named by
/// kind and op, with the rank, host and step in their args. Two threads,
/// even and odd steps: a step may begin before the previous one ended on
/// its last rank (carry-over), and slices of one thread must not overlap.
fn write_critical_paths(
    w: &mut impl Write,
    paths: &CriticalPaths,
    origin_ns: i64,
    first: &mut bool,
) -> std::io::Result<()> {
    if paths.steps.is_empty() {
        return Ok(());
    }
    sep(w, first)?;
    write!(
        w,
        "{{\"ph\":\"M\",\"pid\":{CRITICAL_PID},\"name\":\"process_name\",\"args\":{{\"name\":\"Critical path of each step (clockmesh)\"}}}},\n{{\"ph\":\"M\",\"pid\":{CRITICAL_PID},\"name\":\"process_sort_index\",\"args\":{{\"sort_index\":0}}}}"
    )?;
    for (tid, label) in [(0, "even steps"), (1, "odd steps")] {
        sep(w, first)?;
        write!(
            w,
            "{{\"ph\":\"M\",\"pid\":{CRITICAL_PID},\"tid\":{tid},\"name\":\"thread_name\",\"args\":{{\"name\":\"{label}\"}}}}"
        )?;
    }
    let origin_ps = i128::from(origin_ns) * 1000;
    for step in &paths.steps {
        for (index, seg) in step.segments.iter().enumerate() {
            let who = paths.participants.get(seg.participant);
            let args = serde_json::json!({
                "step": step.step,
                "rank": who.and_then(|p| p.rank),
                "host": who.map(|p| p.host.as_str()),
                "kind": seg.kind,
                "op": seg.op.as_ref(),
                "top": step.top == Some(index),
                "order_uncertain": seg.hop.as_ref().is_some_and(|h| matches!(h.order, HopOrder::Uncertain { .. })),
            });
            sep(w, first)?;
            write!(
                w,
                "{{\"ph\":\"X\",\"cat\":\"critical_path\",\"pid\":{CRITICAL_PID},\"tid\":{},\"ts\":{},\"dur\":{},\"name\":{},\"args\":{args}}}",
                step.step % 2,
                ps_to_us(i128::from(seg.start_ns) * 1000 - origin_ps),
                ps_to_us(i128::from(seg.duration_ns) * 1000),
                json_str(&segment_name(seg, who))
            )?;
        }
    }
    Ok(())
}

/// `work aten::mm (rank 2)`: what the segment is and whose.
fn segment_name(
    seg: &crate::collectives::critical::Segment,
    who: Option<&crate::collectives::Participant>,
) -> String {
    let kind = serde_json::to_value(seg.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let whose = match who {
        Some(p) => match p.rank {
            Some(r) => format!("rank {r}, {}", p.host),
            None => p.host.clone(),
        },
        None => "?".into(),
    };
    format!("{kind} {} ({whose})", seg.op.as_ref())
}

/// One flow per instance whose calls all have a place and a length: the
/// ranks in arrival order, so every arrow points at a later arrival and
/// the chain ends on the last arriver, which the others waited for.
fn flow_points(a: &Analysis, origin_ns: i64) -> Vec<FlowPoint> {
    let mut out = Vec::new();
    for (index, inst) in a.instances.iter().enumerate() {
        let placed: Option<Vec<(Track, &RankCall)>> = inst
            .ranks
            .iter()
            .map(|r| r.track.filter(|_| r.exit_ns > r.enter_ns).map(|t| (t, r)))
            .collect();
        let Some(placed) = placed.filter(|p| p.len() >= 2) else {
            continue;
        };
        let last = placed.len() - 1;
        for (k, (track, r)) in placed.into_iter().enumerate() {
            let middle = flow_time(inst.framework, r);
            out.push(FlowPoint {
                id: index + 1,
                phase: match k {
                    0 => 's',
                    k if k == last => 'f',
                    _ => 't',
                },
                pid: pid_of(r.participant, track.plane),
                tid: track.line,
                ts_ps: i128::from(middle - origin_ns) * 1000,
                name: inst.key.name.to_string(),
                args: (k == 0).then(|| {
                    serde_json::json!({
                        "instance": format!("{}/{}#{}", inst.key.group, inst.key.name, inst.key.ordinal),
                        "last_arriver": a.participants.get(inst.last).map(|p| p.host.as_str()),
                        "late_by_ns": inst.late_by_ns,
                        "combined_bound_ns": inst.combined_bound_ns,
                        "significant": inst.significant,
                    })
                }),
            });
        }
    }
    out
}

/// Where a rank's flow point sits: the middle of its call, which the call's
/// slice holds; for PyTorch 1 µs before its exit (or the middle when
/// shorter): a gloo call enters at its c10d op, on another thread, before
/// the worker's span on the call's track starts.
fn flow_time(framework: Framework, r: &RankCall) -> i64 {
    let half = (r.exit_ns - r.enter_ns) / 2;
    match framework {
        Framework::Xla => r.enter_ns + half,
        Framework::PyTorch => r.exit_ns - half.min(1_000),
    }
}

fn write_flow(w: &mut impl Write, f: &FlowPoint, first: &mut bool) -> std::io::Result<()> {
    sep(w, first)?;
    write!(
        w,
        "{{\"ph\":\"{}\",\"id\":{},\"cat\":\"collective\",\"name\":{},\"pid\":{},\"tid\":{},\"ts\":{}",
        f.phase,
        f.id,
        json_str(&f.name),
        f.pid,
        f.tid,
        ps_to_us(f.ts_ps)
    )?;
    if f.phase == 'f' {
        // Bound to the enclosing slice (the last arriver's call), not the next one.
        w.write_all(b",\"bp\":\"e\"")?;
    }
    if let Some(args) = &f.args {
        write!(w, ",\"args\":{args}")?;
    }
    w.write_all(b"}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collectives::{
        CollectiveCall, CollectiveKind, Framework, InstanceKey, MatchedBy, Participant,
    };

    fn participant(host: &str) -> Participant {
        Participant {
            host: host.into(),
            rank: None,
            framework: Framework::Xla,
            trace: format!("{host}.xplane.pb"),
            bound_ns: Some(100),
        }
    }

    /// Host `p`'s call of `psum.3` (run 7) on plane 2, line 5 + p.
    fn call(p: usize, enter_ns: i64, exit_ns: i64, located: bool) -> CollectiveCall {
        CollectiveCall {
            participant: p,
            kind: CollectiveKind::AllReduce,
            key: InstanceKey {
                group: "jit_step#1".into(),
                name: "psum.3".into(),
                ordinal: 7,
            },
            matched_by: MatchedBy::RunId,
            op: "psum.3".into(),
            enter_ns,
            exit_ns,
            step: None,
            group_size: None,
            elements: None,
            preceding: None,
            clock: crate::collectives::CallClock::Host,
            track: located.then_some(Track {
                plane: 2,
                line: 5 + p as i64,
            }),
        }
    }

    #[test]
    fn an_instance_flows_in_arrival_order_to_its_last_arriver_inside_each_call() {
        let hosts = [participant("a"), participant("b"), participant("c")];
        let origin = 1_000_000;
        // c arrives first, a last (500 µs late); all leave together.
        let calls = vec![
            call(0, origin + 600_000, origin + 700_000, true),
            call(1, origin + 100_000, origin + 700_000, true),
            call(2, origin + 50_000, origin + 700_000, true),
        ];
        let a = analyse(&hosts, calls, &AnalysisOptions::default());
        let flows = flow_points(&a, origin);
        let got: Vec<(char, u64, i64, i128)> = flows
            .iter()
            .map(|f| (f.phase, f.pid, f.tid, f.ts_ps))
            .collect();
        assert_eq!(
            got,
            [
                ('s', 3002, 7, 375_000_000),
                ('t', 2002, 6, 400_000_000),
                ('f', 1002, 5, 650_000_000),
            ]
        );
        assert!(flows.iter().all(|f| f.id == 1 && f.name == "psum.3"));
        let args = flows[0].args.as_ref().unwrap();
        assert_eq!(args["last_arriver"], "a");
        assert_eq!(args["late_by_ns"], 500_000);
        let mut out = Vec::new();
        let mut first = true;
        for f in &flows {
            write_flow(&mut out, f, &mut first).unwrap();
        }
        let doc: serde_json::Value =
            serde_json::from_str(&format!("[{}]", String::from_utf8(out).unwrap())).unwrap();
        assert_eq!(
            doc[2]["bp"], "e",
            "the end binds to the last arriver's call"
        );
        assert_eq!(doc[1]["ts"].as_f64(), Some(400.0));
    }

    #[test]
    fn an_instance_with_an_unlocated_call_gets_no_flow() {
        let hosts = [participant("a"), participant("b")];
        let calls = vec![call(0, 10, 20, true), call(1, 12, 20, false)];
        let a = analyse(&hosts, calls, &AnalysisOptions::default());
        assert_eq!(a.instances.len(), 1);
        assert!(flow_points(&a, 0).is_empty());
    }

    #[test]
    fn ps_to_us_is_exact() {
        assert_eq!(ps_to_us(1_234_567_891), "1234.567891");
        assert_eq!(ps_to_us(-5), "-0.000005");
        assert_eq!(ps_to_us(0), "0.000000");
    }
}
