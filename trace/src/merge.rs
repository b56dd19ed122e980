//! `trace merge`: place every host's events onto one global timeline and
//! write one xprof run directory (and optionally a merged Chrome JSON).
//!
//! Each host h has a map `G_h` from local CLOCK_REALTIME to global time
//! ([`HostMap`]: the agent's per-window history, the hook's start and stop
//! records, or one `--offset`). `origin = min_h G_h(S_h)` over the session
//! starts `S_h` (Task Environment `profile_start_time`). When `G_h` is one
//! constant, lines are shifted whole: a session-relative timestamp `t`
//! becomes `G_h(S_h + t) − origin`, event offsets are untouched. Otherwise
//! every event start and end goes through `G_h` at its own time
//! ([`super::device`] rewrites those lines), as events of device-clock
//! planes always do through the GPU's map first. `profile_start_time`
//! becomes `origin`, `profile_stop_time` the host's stop on the global
//! timeline, and every placed plane gets its worst bound as the stat
//! [`ALIGNMENT_BOUND_STAT`] (the Task Environment: the host's worst).

use clockmesh_offsets::{LocalNs, Nanos};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clockmesh_proto::{PROFILE_START_TIME, PROFILE_STOP_TIME, TASK_ENV_PLANE, clock_stats};

use super::device::{
    DeviceClockSpec, DeviceContext, HostDevices, check_specs_used, plan_host, resolve_planes,
};
use super::fields::{self, map_entry, xline, xplane, xstat, xstat_metadata};
use super::kineto::{self, KinetoTrace};
use super::perfetto::{PerfettoHost, TraceFormat};
use super::plan::file_err;
pub use super::plan::{
    ABSOLUTE_THRESHOLD_NS, DeviceError, DevicePlaneReport, HostPlacement, MergeError, OffsetSource,
};
use super::rewrite::{Edit, Plan, rewrite_with};
use super::scan::{ALIGNMENT_BOUND_STAT, PlaneSummary, Scan, scan_file};
use super::wire::{LEN, VARINT, WireReader, put_varint};
use super::{FileError, TraceError};
use clockmesh_offsets::history::{AnchorKind, DeviceHistoryEntry, DeviceMapIndex, HistoryEntry};
use clockmesh_offsets::{Anchor, HostMap};

/// Inputs to a merge besides the files.
#[derive(Clone, Debug, Default)]
pub struct MergeOptions {
    /// Output log directory; the run is written to `plugins/profile/<run>/`.
    pub out_dir: PathBuf,
    pub run_name: String,
    /// Explicit offsets by host (win over everything else).
    pub offsets: HashMap<String, i64>,
    pub history: Vec<HistoryEntry>,
    /// Published GPU device-clock maps (the history's `"device"` lines).
    pub device_history: Vec<DeviceHistoryEntry>,
    /// `--device-clock`: planes whose timestamps are a device's raw clock.
    pub device_clocks: Vec<DeviceClockSpec>,
    /// Apply no device map: every plane takes the node offset only.
    pub ignore_device_clocks: bool,
    /// Use offset 0 (with a warning) for hosts without any offset.
    pub allow_missing_offsets: bool,
    /// Also write a merged Chrome/Perfetto JSON here.
    pub perfetto: Option<PathBuf>,
    /// Fail (before writing) if any host's alignment bound is larger, or unknown.
    pub max_bound_ns: Option<u64>,
    /// Replace an existing `perfetto` file.
    pub overwrite_perfetto: bool,
}

#[derive(Clone, Debug)]
pub struct MergeReport {
    pub run_dir: PathBuf,
    pub origin_ns: i64,
    pub hosts: Vec<HostPlacement>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Runs `f` on every item on up to `available_parallelism` threads (at
/// most 8), results in input order. Hosts are independent: each is
/// scanned, planned and written on its own, one buffer per thread.
pub(crate) fn in_parallel<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8)
        .min(items.len().max(1));
    // Round-robin groups: thread k takes items k, k + threads, ...
    let mut groups: Vec<Vec<(usize, T)>> = (0..threads).map(|_| Vec::new()).collect();
    let n = items.len();
    for (i, item) in items.into_iter().enumerate() {
        groups[i % threads].push((i, item));
    }
    let mut slots: Vec<Option<R>> = (0..n).map(|_| None).collect();
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = groups
            .into_iter()
            .map(|g| s.spawn(move || g.into_iter().map(|(i, t)| (i, f(t))).collect::<Vec<_>>()))
            .collect();
        for h in handles {
            match h.join() {
                Ok(done) => done.into_iter().for_each(|(i, r)| slots[i] = Some(r)),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    slots.into_iter().flatten().collect()
}

/// Writes one host's output file; returns (bytes in, bytes out).
fn write_host(
    scan: &Scan,
    place: &HostPlacement,
    dev: &mut HostDevices<'_>,
    edits: Vec<Edit>,
    tmp_dir: &Path,
    progress: &mut dyn FnMut(u64),
) -> Result<(u64, u64), MergeError> {
    let plan = Plan::new(edits, dev.regions(), scan.frames());
    let out_path = tmp_dir.join(&place.output);
    let output_err = |error| MergeError::Output {
        path: out_path.display().to_string(),
        error,
    };
    let file = File::open(&scan.path).map_err(|e| file_err(&scan.path)(TraceError::io(e)))?;
    let mut r = WireReader::new(file).map_err(file_err(&scan.path))?;
    if r.file_len() != scan.file_len {
        return Err(file_err(&scan.path)(TraceError::Changed));
    }
    let out = File::create(&out_path).map_err(output_err)?;
    let mut w = BufWriter::with_capacity(1 << 20, out);
    rewrite_with(&mut r, &plan, dev, &mut w, progress).map_err(file_err(&scan.path))?;
    w.flush().map_err(output_err)?;
    tracing::debug!(host = %place.host, shift_ns = place.shift_ns, "host written");
    Ok((scan.file_len, plan.output_len(scan.file_len)))
}

/// Expands inputs: files as given (`.xplane.pb`, or PyTorch `.json`);
/// directories searched for `*.xplane.pb` and `*.pt.trace.json` (an xprof
/// log dir, a `plugins/profile/<run>` dir, a TensorBoard torch log dir).
pub fn collect_inputs(paths: &[PathBuf]) -> Result<Vec<PathBuf>, MergeError> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let before = out.len();
            find_xplanes(p, &mut out, 0).map_err(|error| {
                MergeError::File(FileError {
                    path: p.display().to_string(),
                    error: TraceError::io(error),
                })
            })?;
            if out.len() == before {
                return Err(MergeError::NoInputs(p.display().to_string()));
            }
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

fn find_xplanes(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) -> std::io::Result<()> {
    if depth > 6 {
        return Ok(());
    }
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let p = e.path();
        if e.file_type()?.is_dir() {
            find_xplanes(&p, out, depth + 1)?;
        } else if is_trace_in_dir(&p) {
            out.push(p);
        }
    }
    Ok(())
}

/// A file a directory input contributes: xprof and PyTorch traces.
fn is_trace_in_dir(p: &Path) -> bool {
    let name = p.to_string_lossy();
    name.ends_with(".xplane.pb") || name.ends_with(".pt.trace.json")
}

/// The host name of a trace file: `<host>.xplane.pb`, or
/// `<host>@<process>.xplane.pb` as a merge names one of a host's several
/// processes.
pub fn host_of(path: &Path, scan: &Scan) -> String {
    path.file_name()
        .map(|n| {
            let n = n.to_string_lossy();
            let host = n.trim_end_matches(".xplane.pb");
            host.split(PROCESS_SEPARATOR)
                .next()
                .unwrap_or(host)
                .to_string()
        })
        .filter(|h| !h.is_empty())
        .or_else(|| scan.hostnames.first().cloned())
        .unwrap_or_else(|| "host".into())
}

/// Everything a merge decides before writing anything.
pub struct Planned {
    /// The xprof inputs, scanned, and their hosts' placements.
    pub scans: Vec<Scan>,
    pub placements: Vec<HostPlacement>,
    /// The PyTorch (Kineto JSON) inputs, one per rank.
    pub torch: Vec<HostPlacement>,
    /// The global time all outputs count from: the earliest placed start.
    pub origin: i64,
}

/// Scans every input and decides where each host goes (no output yet).
pub fn plan_merge(inputs: &[PathBuf], opts: &MergeOptions) -> Result<Planned, MergeError> {
    let (torch_inputs, xplane_inputs): (Vec<PathBuf>, Vec<PathBuf>) = inputs
        .iter()
        .cloned()
        .partition(|p| kineto::is_kineto_path(p));
    let scans = scan_inputs(&xplane_inputs)?;
    // Only what planning needs of each PyTorch trace (not its events).
    let ranks = torch_inputs
        .iter()
        .map(|p| {
            let t = KinetoTrace::load(p).map_err(file_err(p))?;
            Ok((
                p,
                t.host.clone(),
                (t.start_ns, t.stop_ns),
                t.events,
                t.hook_map(),
            ))
        })
        .collect::<Result<Vec<_>, MergeError>>()?;
    let hosts: Vec<String> = scans
        .iter()
        .map(|s| host_of(&s.path, s))
        .chain(ranks.iter().map(|r| r.1.clone()))
        .collect();
    if hosts.is_empty() {
        return Err(MergeError::NoInputs("the command line".into()));
    }
    check_request(opts, &hosts)?;
    let history = group_history(&opts.history);
    let mut placements = Vec::with_capacity(scans.len());
    for (scan, host) in scans.iter().zip(hosts.iter().cloned()) {
        let start_ns = scan.profile_start_ns().expect("checked by scan_inputs");
        let stop_ns = scan.profile_stop_ns().filter(|&s| s >= start_ns);
        let anchors = history.get(host.as_str()).cloned().unwrap_or_default();
        let hook = hook_map(scan, start_ns);
        let (map, source) = map_for(&host, (start_ns, stop_ns), anchors, hook, &scan.path, opts)?;
        let mut p = placement(host, &scan.path, (start_ns, stop_ns), map, source);
        p.plane_bounds = vec![None; scan.planes.len()];
        placements.push(p);
    }
    let labels: Vec<Option<i64>> = scans
        .iter()
        .map(|s| {
            s.clock_stat_value(crate::collectives::xplane::PROCESS_INDEX)
                .and_then(|v| v.as_i64())
        })
        .collect();
    name_processes(&mut placements, &labels);
    let mut torch = Vec::with_capacity(ranks.len());
    for (path, host, (start_ns, stop_ns), events, hook) in ranks {
        let anchors = history.get(host.as_str()).cloned().unwrap_or_default();
        let span = (start_ns, Some(stop_ns));
        let (map, source) = map_for(&host, span, anchors, hook, path, opts)?;
        let mut p = placement(host, path, span, map, source);
        p.events_placed = events;
        p.plane_bounds = vec![Some(p.map.worst_bound(LocalNs(start_ns), LocalNs(stop_ns)))];
        torch.push(p);
    }
    name_processes(&mut torch, &[]);
    check_output_names(placements.iter().chain(&torch))?;
    let out_of_range = |p: &HostPlacement| {
        file_err(&p.input)(TraceError::malformed(
            0,
            "session start plus offset is out of range",
        ))
    };
    let mut origin = i64::MAX;
    for p in placements.iter().chain(&torch) {
        origin = origin.min(
            p.start_ns
                .checked_add(p.offset_ns)
                .ok_or_else(|| out_of_range(p))?,
        );
    }
    for p in placements.iter_mut().chain(torch.iter_mut()) {
        p.shift_ns = (p.start_ns + p.offset_ns)
            .checked_sub(origin)
            .ok_or_else(|| out_of_range(p))?;
    }
    resolve_device_planes(&scans, &mut placements, opts)?;
    Ok(Planned {
        scans,
        placements,
        torch,
        origin,
    })
}

/// Refuses what the inputs make meaningless: an `--offset` for a host no
/// input has (a typo would merge that host with offset 0 or none), or a
/// Chrome JSON that would replace a file.
fn check_request(opts: &MergeOptions, hosts: &[String]) -> Result<(), MergeError> {
    let hosts: std::collections::BTreeSet<&str> = hosts.iter().map(String::as_str).collect();
    let mut unknown: Vec<&String> = opts
        .offsets
        .keys()
        .filter(|h| !hosts.contains(h.as_str()))
        .collect();
    unknown.sort();
    if let Some(host) = unknown.first() {
        return Err(MergeError::UnknownOffsetHost {
            host: host.to_string(),
            hosts: hosts.into_iter().collect::<Vec<_>>().join(", "),
        });
    }
    if let Some(p) = &opts.perfetto
        && p.exists()
        && !opts.overwrite_perfetto
    {
        return Err(MergeError::PerfettoExists(p.display().to_string()));
    }
    Ok(())
}

/// A run name is one plain path component: the run stays inside `-o`.
fn check_run_name(name: &str) -> Result<(), MergeError> {
    let mut parts = Path::new(name).components();
    match (parts.next(), parts.next()) {
        (Some(std::path::Component::Normal(_)), None) if !name.contains('/') => Ok(()),
        _ => Err(MergeError::BadRunName(name.into())),
    }
}

/// Scans the xprof inputs: one file per process (several may share a
/// host), each with a session start.
fn scan_inputs(inputs: &[PathBuf]) -> Result<Vec<Scan>, MergeError> {
    let mut scans = Vec::with_capacity(inputs.len());
    for (path, scan) in inputs.iter().zip(scan_all(inputs)) {
        let scan = scan.map_err(file_err(path))?;
        if !scan.has_task_env() {
            return Err(file_err(path)(TraceError::MissingTaskEnv));
        }
        scan.profile_start_ns()
            .ok_or_else(|| file_err(path)(TraceError::MissingStart))?;
        scans.push(scan);
    }
    Ok(scans)
}

/// A host's placement before anything is placed.
fn placement(
    host: String,
    input: &Path,
    (start_ns, stop_ns): (i64, Option<i64>),
    map: HostMap,
    source: OffsetSource,
) -> HostPlacement {
    HostPlacement {
        output: PathBuf::from(input.file_name().unwrap_or_default()),
        host,
        input: input.to_path_buf(),
        start_ns,
        stop_ns,
        offset_ns: map.offset_at(LocalNs(start_ns)).0,
        source,
        map: Arc::new(map),
        shift_ns: 0,
        lines_absolute: 0,
        events_placed: 0,
        plane_bounds: Vec::new(),
        device_planes: Vec::new(),
    }
}

/// Separates a host from its process in an output's file name
/// (`n1@p0.xplane.pb`): no host name has one (RFC 1123).
pub const PROCESS_SEPARATOR: char = '@';

/// Outputs keep their input's file name; inputs that share one (the
/// processes of one host, each `<host>.xplane.pb` in its own directory)
/// are told apart by their process: `<host>@p<jax_process_index>` when
/// each has a distinct one, else `<host>@<n>`, n counting from 1 in input
/// order. `labels[i]`: input i's process index, if known.
fn name_processes(placements: &mut [HostPlacement], labels: &[Option<i64>]) {
    let mut by_name: BTreeMap<PathBuf, Vec<usize>> = BTreeMap::new();
    for (i, p) in placements.iter().enumerate() {
        by_name.entry(p.output.clone()).or_default().push(i);
    }
    for same in by_name.values().filter(|v| v.len() > 1) {
        let known: Vec<i64> = same
            .iter()
            .filter_map(|&i| labels.get(i).copied().flatten())
            .collect();
        let distinct = known.len() == same.len()
            && known
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                == known.len();
        for (n, &i) in same.iter().enumerate() {
            let label = match labels.get(i).copied().flatten() {
                Some(index) if distinct => format!("p{index}"),
                _ => (n + 1).to_string(),
            };
            placements[i].output = process_file_name(&placements[i].output, &label);
        }
    }
}

/// `<stem>@<label><suffix>` for `<stem><suffix>` (suffix: `.xplane.pb`,
/// `.pt.trace.json`, else from the first '.').
fn process_file_name(name: &Path, label: &str) -> PathBuf {
    let name = name.to_string_lossy();
    let cut = [".xplane.pb", ".pt.trace.json"]
        .iter()
        .find_map(|s| name.strip_suffix(s).map(str::len))
        .or_else(|| name.find('.'))
        .unwrap_or(name.len());
    let (stem, suffix) = name.split_at(cut);
    PathBuf::from(format!("{stem}{PROCESS_SEPARATOR}{label}{suffix}"))
}

/// Outputs keep their input's file name: two inputs may not share one.
fn check_output_names<'a>(
    placements: impl Iterator<Item = &'a HostPlacement>,
) -> Result<(), MergeError> {
    let mut seen: BTreeMap<&Path, &Path> = BTreeMap::new();
    for p in placements {
        if let Some(first) = seen.insert(&p.output, &p.input) {
            return Err(MergeError::DuplicateOutput {
                name: p.output.display().to_string(),
                first: first.display().to_string(),
                second: p.input.display().to_string(),
            });
        }
    }
    Ok(())
}

/// Decides which planes are device-mapped (flags, declared stats) and
/// checks their maps; nothing is read beyond the scans.
fn resolve_device_planes(
    scans: &[Scan],
    placements: &mut [HostPlacement],
    opts: &MergeOptions,
) -> Result<(), MergeError> {
    if opts.ignore_device_clocks {
        return Ok(());
    }
    let index = DeviceMapIndex::new(&opts.device_history);
    let mut used = vec![false; opts.device_clocks.len()];
    for (scan, p) in scans.iter().zip(placements.iter_mut()) {
        p.device_planes = resolve_planes(scan, &p.host, &opts.device_clocks, &mut used, &index)?;
    }
    let hosts: Vec<String> = placements.iter().map(|p| p.host.clone()).collect();
    check_specs_used(&opts.device_clocks, &used, &hosts)?;
    Ok(())
}

fn warn_ignored_device_planes(scans: &[Scan], placements: &[HostPlacement]) {
    for (scan, p) in scans.iter().zip(placements) {
        for plane in scan.planes.iter().filter(|pl| pl.clock_device.is_some()) {
            tracing::warn!(host = %p.host, plane = %plane.name, "device clock ignored: node offset only");
        }
    }
}

/// Scans files in parallel (each scan holds one 1 MiB buffer), results
/// in input order.
fn scan_all(inputs: &[PathBuf]) -> Vec<Result<Scan, TraceError>> {
    in_parallel(inputs.iter().collect(), |p| scan_file(p))
}

/// The history's anchors by host (detached windows are not on the global
/// timeline and are left out).
fn group_history(entries: &[HistoryEntry]) -> HashMap<&str, Vec<Anchor>> {
    let mut out: HashMap<&str, Vec<Anchor>> = HashMap::new();
    for e in entries {
        if e.anchor_kind != Some(AnchorKind::Detached) {
            out.entry(e.host.as_str())
                .or_default()
                .push(Anchor::from(e));
        }
    }
    out
}

/// How far outside the session the history's anchors may end and still
/// count as covering it: a few estimator windows.
const HISTORY_SLACK_NS: i64 = 60_000_000_000;

/// The host's map, from (in order): `--offset`; the history when it covers
/// the session; the hook's records; the history anyway (extrapolated, its
/// bound growing); 0 if allowed.
fn map_for(
    host: &str,
    (start_ns, stop_ns): (i64, Option<i64>),
    history: Vec<Anchor>,
    hook: Option<HostMap>,
    path: &Path,
    opts: &MergeOptions,
) -> Result<(HostMap, OffsetSource), MergeError> {
    if let Some(off) = opts.offsets.get(host) {
        return Ok((HostMap::fixed(Nanos(*off)), OffsetSource::Flag));
    }
    let history = HostMap::new(trim_to_session(history, start_ns, stop_ns));
    let covers = |m: &HostMap| {
        let (first, last) = (
            m.anchors()[0].at_ns,
            m.anchors()[m.anchors().len() - 1].at_ns,
        );
        first <= start_ns.saturating_add(HISTORY_SLACK_NS)
            && last >= stop_ns.unwrap_or(start_ns).saturating_sub(HISTORY_SLACK_NS)
    };
    match history {
        Some(m) if covers(&m) => return Ok((m, OffsetSource::History)),
        _ => {}
    }
    if let Some(m) = hook {
        return Ok((m, OffsetSource::Hook));
    }
    if let Some(m) = history {
        tracing::warn!(
            host,
            "the history does not cover the session; extrapolating"
        );
        return Ok((m, OffsetSource::History));
    }
    if opts.allow_missing_offsets {
        tracing::warn!(host, "no clock offset; assuming 0");
        return Ok((HostMap::fixed(Nanos(0)), OffsetSource::AssumedZero));
    }
    Err(MergeError::NoOffset {
        host: host.into(),
        path: path.display().to_string(),
    })
}

/// Keeps the anchors inside the session and the nearest one on each side:
/// all a placement inside it uses (a day of history is 21,600 anchors).
fn trim_to_session(mut anchors: Vec<Anchor>, start_ns: i64, stop_ns: Option<i64>) -> Vec<Anchor> {
    anchors.sort_by_key(|a| a.at_ns);
    let stop = stop_ns.unwrap_or(start_ns);
    let from = anchors
        .partition_point(|a| a.at_ns < start_ns)
        .saturating_sub(1);
    let until = (anchors.partition_point(|a| a.at_ns <= stop) + 1).min(anchors.len());
    anchors.truncate(until);
    anchors.drain(..from.min(anchors.len()));
    anchors
}

/// The hook's records as anchors: the start record (at
/// `profile_start_time`) and, when present, the stop record.
fn hook_map(scan: &Scan, start_ns: i64) -> Option<HostMap> {
    let f = |name| scan.clock_stat_value(name).and_then(|v| v.as_f64());
    let start_bound = scan.clock_stat(clock_stats::OFFSET_BOUND_NS);
    let start = Anchor {
        at_ns: start_ns,
        offset_ns: scan.clock_offset_ns()?,
        drift_ppb: f(clock_stats::DRIFT_PPB).unwrap_or(0.0),
        bound_ns: start_bound.unwrap_or(0).max(0) as u64,
        bound_growth_ppb: f(clock_stats::BOUND_GROWTH_PPB).unwrap_or(0.0),
    };
    let stop = || {
        Some(Anchor {
            at_ns: scan.clock_stat(clock_stats::STOP_AT_NS)?,
            offset_ns: scan.clock_stat(clock_stats::STOP_OFFSET_NS)?,
            drift_ppb: f(clock_stats::STOP_DRIFT_PPB).unwrap_or(0.0),
            bound_ns: scan.clock_stat(clock_stats::STOP_OFFSET_BOUND_NS)? as u64,
            bound_growth_ppb: f(clock_stats::STOP_BOUND_GROWTH_PPB).unwrap_or(0.0),
        })
    };
    let map = HostMap::new(std::iter::once(start).chain(stop()).collect())?;
    // A hand-made or pre-bound trace: placed, but its bound is unknown.
    Some(if start_bound.is_some() {
        map
    } else {
        map.without_bound()
    })
}

/// The edits that place one host on the global timeline.
pub fn host_edits(scan: &Scan, place: &mut HostPlacement, origin: i64) -> (Vec<Edit>, u64) {
    host_edits_except(scan, place, origin, |_| false)
}

/// [`host_edits`] for every line but those `skip` names (by index in
/// [`Scan::lines`]): lines placed event by event, rewritten whole
/// elsewhere. Notes each line's bound in `place`.
pub fn host_edits_except(
    scan: &Scan,
    place: &mut HostPlacement,
    origin: i64,
    skip: impl Fn(usize) -> bool,
) -> (Vec<Edit>, u64) {
    let mut edits = Vec::new();
    let mut absolute = 0;
    for (i, line) in scan.lines.iter().enumerate() {
        if skip(i) {
            continue;
        }
        let ts = line.timestamp_ns;
        // Wrapping: only a corrupt file gets near the i64 range, and int64
        // fields wrap in protobuf anyway; never a panic.
        let local = if ts.unsigned_abs() >= ABSOLUTE_THRESHOLD_NS as u64 {
            absolute += 1;
            ts
        } else {
            ts.wrapping_add(place.start_ns)
        };
        let g = place.map.to_global(LocalNs(local));
        place.note_bound(line.plane, g.bound_ns);
        let new = g.global().0.wrapping_sub(origin);
        if new == ts {
            continue;
        }
        if line.ts_fields.is_empty() {
            edits.push(Edit::insert_varint_field(
                line.content_start,
                xline::TIMESTAMP_NS,
                new as u64,
            ));
        }
        for f in &line.ts_fields {
            edits.push(Edit::replace_varint(f.pos, f.len, new as u64));
        }
    }
    let stop = scan
        .profile_stop_ns()
        .map(|s| place.map.to_global(LocalNs(s)).global().0);
    for plane in scan.planes.iter().filter(|p| p.name == TASK_ENV_PLANE) {
        for stat in &plane.stats {
            let new = match stat.name.as_str() {
                PROFILE_START_TIME => Some(origin),
                PROFILE_STOP_TIME => stop,
                _ => None,
            };
            if let (Some(new), Some(at)) = (new, stat.value_at) {
                edits.push(Edit::replace_varint(at.pos, at.len, new as u64));
            }
        }
    }
    (edits, absolute)
}

/// Inserts [`ALIGNMENT_BOUND_STAT`] into every placed plane (its worst
/// bound) and the Task Environment (the host's worst); none when the
/// host's offset has no bound.
pub fn alignment_stat_edits(scan: &Scan, place: &HostPlacement) -> Vec<Edit> {
    let Some(host_worst) = place.worst_bound_ns() else {
        return Vec::new();
    };
    scan.planes
        .iter()
        .zip(&place.plane_bounds)
        .filter_map(|(plane, bound)| {
            let bound = match bound {
                _ if plane.name == TASK_ENV_PLANE => host_worst,
                Some(b) => *b,
                None => return None,
            };
            Some(Edit {
                pos: plane.content_start,
                old_len: 0,
                bytes: alignment_stat_bytes(plane, bound),
            })
        })
        .collect()
}

/// `stat_metadata` entry (unless the plane has one) + `stats` entry of a
/// uint64 [`ALIGNMENT_BOUND_STAT`].
fn alignment_stat_bytes(plane: &PlaneSummary, bound_ns: u64) -> Vec<u8> {
    let id = plane.alignment_stat_id.unwrap_or(plane.max_stat_id + 1) as u64;
    let mut out = Vec::new();
    if plane.alignment_stat_id.is_none() {
        let mut metadata = Vec::new();
        varint_field(&mut metadata, xstat_metadata::ID, id);
        len_field(
            &mut metadata,
            xstat_metadata::NAME,
            ALIGNMENT_BOUND_STAT.as_bytes(),
        );
        let mut entry = Vec::new();
        varint_field(&mut entry, map_entry::KEY, id);
        len_field(&mut entry, map_entry::VALUE, &metadata);
        len_field(&mut out, xplane::STAT_METADATA, &entry);
    }
    let mut stat = Vec::new();
    varint_field(&mut stat, xstat::METADATA_ID, id);
    varint_field(&mut stat, xstat::UINT64_VALUE, bound_ns);
    len_field(&mut out, xplane::STATS, &stat);
    out
}

fn varint_field(out: &mut Vec<u8>, field: u32, value: u64) {
    out.push(fields::key(field, VARINT));
    put_varint(out, value);
}

fn len_field(out: &mut Vec<u8>, field: u32, body: &[u8]) {
    out.push(fields::key(field, LEN));
    put_varint(out, body.len() as u64);
    out.extend_from_slice(body);
}

/// `--max-bound`: every host's worst bound must be known and within it.
fn check_max_bound<'a>(
    placements: impl Iterator<Item = &'a HostPlacement>,
    max_ns: Option<u64>,
) -> Result<(), MergeError> {
    let Some(max_ns) = max_ns else {
        return Ok(());
    };
    for p in placements {
        match p.worst_bound_ns() {
            None => {
                return Err(MergeError::BoundUnknown {
                    host: p.host.clone(),
                    from: p.source.describe(),
                });
            }
            Some(b) if b > max_ns => {
                return Err(MergeError::BoundExceeded {
                    host: p.host.clone(),
                    bound_ns: b,
                    max_ns,
                });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Runs a merge: all inputs are scanned first (so bad input fails before
/// anything is written); outputs go to a temporary directory that is
/// renamed into place only when every file is complete.
pub fn merge(
    inputs: &[PathBuf],
    opts: &MergeOptions,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<MergeReport, MergeError> {
    let Planned {
        scans,
        mut placements,
        mut torch,
        origin,
    } = plan_merge(inputs, opts)?;
    if opts.ignore_device_clocks {
        warn_ignored_device_planes(&scans, &placements);
    }
    // Every time is placed (or refused) before any output exists.
    let maps = DeviceMapIndex::new(&opts.device_history);
    let ctx = DeviceContext {
        maps: &maps,
        origin_ns: origin,
    };
    let hosts: Vec<_> = scans.iter().zip(placements.iter_mut()).collect();
    let mut devices = in_parallel(hosts, |(scan, place)| plan_host(scan, place, &ctx))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let mut edits = Vec::with_capacity(scans.len());
    for ((scan, place), dev) in scans.iter().zip(placements.iter_mut()).zip(&devices) {
        let (mut e, absolute) = host_edits_except(scan, place, origin, |i| dev.is_mapped(i));
        place.lines_absolute = absolute;
        e.extend(alignment_stat_edits(scan, place));
        edits.push(e);
    }
    check_max_bound(placements.iter().chain(&torch), opts.max_bound_ns)?;
    check_run_name(&opts.run_name)?;
    let profile_dir = opts.out_dir.join("plugins").join("profile");
    let run_dir = profile_dir.join(&opts.run_name);
    if run_dir.exists() {
        return Err(MergeError::OutputExists(run_dir.display().to_string()));
    }
    let out_err = |path: &Path| {
        let path = path.display().to_string();
        move |error| MergeError::Output { path, error }
    };
    std::fs::create_dir_all(&profile_dir).map_err(out_err(&profile_dir))?;
    let tmp_dir = profile_dir.join(format!(".{}.tmp-{}", opts.run_name, std::process::id()));
    std::fs::create_dir_all(&tmp_dir).map_err(out_err(&tmp_dir))?;
    let result = write_outputs(&scans, &placements, edits, &mut devices, &tmp_dir, progress)
        .and_then(|(xin, xout)| {
            let (tin, tout) = write_torch(&mut torch, origin, &tmp_dir, progress)?;
            write_perfetto(&placements, &torch, (&tmp_dir, origin), opts)?;
            Ok((xin + tin, xout + tout))
        });
    let (bytes_in, bytes_out) = match result {
        Ok(sizes) => sizes,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp_dir);
            return Err(e);
        }
    };
    std::fs::rename(&tmp_dir, &run_dir).map_err(|e| {
        let _ = std::fs::remove_dir_all(&tmp_dir);
        out_err(&run_dir)(e)
    })?;
    placements.append(&mut torch);
    for p in &mut placements {
        p.output = run_dir.join(&p.output);
    }
    Ok(MergeReport {
        run_dir,
        origin_ns: origin,
        hosts: placements,
        bytes_in,
        bytes_out,
    })
}

/// Places and writes every PyTorch trace, one in memory at a time;
/// returns (bytes in, bytes out).
fn write_torch(
    torch: &mut [HostPlacement],
    origin: i64,
    tmp_dir: &Path,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<(u64, u64), MergeError> {
    let (mut bytes_in, mut bytes_out) = (0, 0);
    for p in torch {
        let mut t = KinetoTrace::load(&p.input).map_err(file_err(&p.input))?;
        let worst = t.place(&p.map, origin).map_err(file_err(&p.input))?;
        p.note_bound(0, worst);
        let bound = p.worst_bound_ns();
        t.note_placement(p.source.describe(), p.offset_ns, bound);
        let out = tmp_dir.join(&p.output);
        let written = t.write(&out).map_err(|error| MergeError::Output {
            path: out.display().to_string(),
            error,
        })?;
        let read = std::fs::metadata(&p.input).map_or(0, |m| m.len());
        progress(read);
        bytes_in += read;
        bytes_out += written;
    }
    Ok((bytes_in, bytes_out))
}

fn write_outputs(
    scans: &[Scan],
    placements: &[HostPlacement],
    edits: Vec<Vec<Edit>>,
    devices: &mut [HostDevices<'_>],
    tmp_dir: &Path,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<(u64, u64), MergeError> {
    let progress = std::sync::Mutex::new(progress);
    let hosts: Vec<_> = scans
        .iter()
        .zip(placements)
        .zip(devices.iter_mut())
        .zip(edits)
        .collect();
    let written = in_parallel(hosts, |(((scan, place), dev), edits)| {
        let mut report = |n| {
            if let Ok(mut p) = progress.lock() {
                (*p)(n)
            }
        };
        write_host(scan, place, dev, edits, tmp_dir, &mut report)
    });
    let (mut bytes_in, mut bytes_out) = (0, 0);
    for w in written {
        let (i, o) = w?;
        bytes_in += i;
        bytes_out += o;
    }
    Ok((bytes_in, bytes_out))
}

/// `--perfetto`: the xprof hosts and then the PyTorch ranks, from their
/// merged files in `tmp_dir`.
fn write_perfetto(
    placements: &[HostPlacement],
    torch: &[HostPlacement],
    (tmp_dir, origin): (&Path, i64),
    opts: &MergeOptions,
) -> Result<(), MergeError> {
    let Some(json) = &opts.perfetto else {
        return Ok(());
    };
    let host = |format| {
        move |p: &HostPlacement| PerfettoHost {
            host: p.host.clone(),
            path: tmp_dir.join(&p.output),
            format,
            offset_ns: p.offset_ns,
            drift_ppb: p.mean_drift_ppb(),
            bound_ns: p.worst_bound_ns(),
        }
    };
    let outputs: Vec<PerfettoHost> = (placements.iter().map(host(TraceFormat::Xplane)))
        .chain(torch.iter().map(host(TraceFormat::Kineto)))
        .collect();
    super::perfetto::write_chrome_json(&outputs, origin, json)
}
