//! `trace merge`: shift every host's lines onto one global timeline and
//! write one xprof run directory (and optionally a merged Chrome JSON).
//!
//! Per host h with session start `S_h` (Task Environment
//! `profile_start_time`, local CLOCK_REALTIME) and offset `off_h`
//! (global − local): `G_h = S_h + off_h`, `origin = min_h G_h`. A
//! session-relative line timestamp `t` becomes `t + (G_h − origin)`; a line
//! still holding an absolute epoch value `a` becomes `a + off_h − origin`.
//! `profile_start_time` becomes `origin` and `profile_stop_time` the host's
//! stop on the global timeline. Event `offset_ps` is untouched, except on
//! device-clock planes ([`super::device`]), whose every event is placed
//! through the GPU's published device map and the node offset.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use clockmesh_proto::{PROFILE_START_TIME, PROFILE_STOP_TIME, TASK_ENV_PLANE};

use super::device::{
    DeviceClockSpec, DeviceContext, HostDevices, check_specs_used, plan_host, resolve_planes,
};
use super::fields::xline;
use super::plan::file_err;
pub use super::plan::{
    ABSOLUTE_THRESHOLD_NS, DeviceError, DevicePlaneReport, HostPlacement, MergeError, OffsetSource,
};
use super::rewrite::{Edit, Plan, rewrite_with};
use super::scan::{Scan, scan_file};
use super::wire::WireReader;
use super::{FileError, TraceError};
use clockmesh_offsets::history::{
    self, DeviceHistoryEntry, DeviceMapIndex, HistoryEntry, NodeIndex,
};

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
}

#[derive(Clone, Debug)]
pub struct MergeReport {
    pub run_dir: PathBuf,
    pub origin_ns: i64,
    pub hosts: Vec<HostPlacement>,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Expands inputs: `.xplane.pb` files as given; directories searched for
/// `*.xplane.pb` (an xprof log dir, a `plugins/profile/<run>` dir, ...).
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
        } else if p.to_string_lossy().ends_with(".xplane.pb") {
            out.push(p);
        }
    }
    Ok(())
}

/// The host name of a trace file: `<host>.xplane.pb`.
pub fn host_of(path: &Path, scan: &Scan) -> String {
    path.file_name()
        .map(|n| {
            n.to_string_lossy()
                .trim_end_matches(".xplane.pb")
                .to_string()
        })
        .filter(|h| !h.is_empty())
        .or_else(|| scan.hostnames.first().cloned())
        .unwrap_or_else(|| "host".into())
}

/// Scans every input and decides where each host goes (no output yet).
pub fn plan_merge(
    inputs: &[PathBuf],
    opts: &MergeOptions,
) -> Result<(Vec<Scan>, Vec<HostPlacement>, i64), MergeError> {
    let mut scans = Vec::with_capacity(inputs.len());
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    for (path, scan) in inputs.iter().zip(scan_all(inputs)) {
        let scan = scan.map_err(file_err(path))?;
        let host = host_of(path, &scan);
        if let Some(first) = seen.insert(host.clone(), path.clone()) {
            return Err(MergeError::DuplicateHost {
                host,
                first: first.display().to_string(),
                second: path.display().to_string(),
            });
        }
        if !scan.has_task_env() {
            return Err(file_err(path)(TraceError::MissingTaskEnv));
        }
        scan.profile_start_ns()
            .ok_or_else(|| file_err(path)(TraceError::MissingStart))?;
        scans.push(scan);
    }
    let mut placements = Vec::with_capacity(scans.len());
    for scan in &scans {
        let host = host_of(&scan.path, scan);
        let start_ns = scan.profile_start_ns().expect("checked above");
        let (offset_ns, source) = offset_for(&host, start_ns, scan, opts)?;
        placements.push(HostPlacement {
            output: PathBuf::from(scan.path.file_name().expect("a file")),
            host,
            input: scan.path.clone(),
            start_ns,
            offset_ns,
            source,
            shift_ns: 0,
            lines_absolute: 0,
            device_planes: Vec::new(),
        });
    }
    let out_of_range = |p: &HostPlacement| {
        file_err(&p.input)(TraceError::malformed(
            0,
            "session start plus offset is out of range",
        ))
    };
    let mut origin = i64::MAX;
    for p in &placements {
        origin = origin.min(
            p.start_ns
                .checked_add(p.offset_ns)
                .ok_or_else(|| out_of_range(p))?,
        );
    }
    if placements.is_empty() {
        return Err(MergeError::NoInputs("the command line".into()));
    }
    for p in &mut placements {
        p.shift_ns = (p.start_ns + p.offset_ns)
            .checked_sub(origin)
            .ok_or_else(|| out_of_range(p))?;
    }
    resolve_device_planes(&scans, &mut placements, opts)?;
    Ok((scans, placements, origin))
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

/// Scans files on up to `available_parallelism` threads (each scan holds
/// one 1 MiB buffer), results in input order.
fn scan_all(inputs: &[PathBuf]) -> Vec<Result<Scan, TraceError>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let mut results = Vec::with_capacity(inputs.len());
    for chunk in inputs.chunks(threads) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|p| s.spawn(move || scan_file(p)))
                .collect();
            for h in handles {
                results.push(
                    h.join()
                        .unwrap_or_else(|_| Err(TraceError::NotXPlane("scanner panicked".into()))),
                );
            }
        });
    }
    results
}

fn offset_for(
    host: &str,
    start_ns: i64,
    scan: &Scan,
    opts: &MergeOptions,
) -> Result<(i64, OffsetSource), MergeError> {
    if let Some(off) = opts.offsets.get(host) {
        return Ok((*off, OffsetSource::Flag));
    }
    if let Some(off) = scan.clock_offset_ns() {
        return Ok((off, OffsetSource::Hook));
    }
    if let Some(e) = history::lookup(&opts.history, host, start_ns) {
        return Ok((e.offset_at(start_ns), OffsetSource::History));
    }
    if opts.allow_missing_offsets {
        tracing::warn!(host, "no clock offset; assuming 0");
        return Ok((0, OffsetSource::AssumedZero));
    }
    Err(MergeError::NoOffset {
        host: host.into(),
        path: scan.path.display().to_string(),
    })
}

/// The edits that place one host on the global timeline.
pub fn host_edits(scan: &Scan, place: &HostPlacement, origin: i64) -> (Vec<Edit>, u64) {
    host_edits_except(scan, place, origin, |_| false)
}

/// [`host_edits`] for every line but those `skip` names (by index in
/// [`Scan::lines`]): device-mapped lines, rewritten whole elsewhere.
pub fn host_edits_except(
    scan: &Scan,
    place: &HostPlacement,
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
        let new = if ts.unsigned_abs() >= ABSOLUTE_THRESHOLD_NS as u64 {
            absolute += 1;
            ts.wrapping_add(place.offset_ns).wrapping_sub(origin)
        } else {
            ts.wrapping_add(place.shift_ns)
        };
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
        .map(|s| s.wrapping_add(place.offset_ns));
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

/// Runs a merge: all inputs are scanned first (so bad input fails before
/// anything is written); outputs go to a temporary directory that is
/// renamed into place only when every file is complete.
pub fn merge(
    inputs: &[PathBuf],
    opts: &MergeOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<MergeReport, MergeError> {
    let (scans, mut placements, origin) = plan_merge(inputs, opts)?;
    if opts.ignore_device_clocks {
        warn_ignored_device_planes(&scans, &placements);
    }
    // Every device time is placed (or refused) before any output exists.
    let (maps, nodes) = (
        DeviceMapIndex::new(&opts.device_history),
        NodeIndex::new(&opts.history),
    );
    let ctx = DeviceContext {
        maps: &maps,
        nodes: &nodes,
        origin_ns: origin,
    };
    let mut devices = scans
        .iter()
        .zip(placements.iter_mut())
        .map(|(scan, place)| plan_host(scan, place, &ctx))
        .collect::<Result<Vec<_>, _>>()?;
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
    let result = write_outputs(
        &scans,
        &mut placements,
        &mut devices,
        origin,
        &tmp_dir,
        opts,
        progress,
    );
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

fn write_outputs(
    scans: &[Scan],
    placements: &mut [HostPlacement],
    devices: &mut [HostDevices<'_>],
    origin: i64,
    tmp_dir: &Path,
    opts: &MergeOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<(u64, u64), MergeError> {
    let (mut bytes_in, mut bytes_out) = (0, 0);
    for ((scan, place), dev) in scans.iter().zip(placements.iter_mut()).zip(devices) {
        let (edits, absolute) = host_edits_except(scan, place, origin, |i| dev.is_mapped(i));
        place.lines_absolute = absolute;
        let plan = Plan::new(edits, dev.regions(), scan.frames());
        let out_path = tmp_dir.join(&place.output);
        let file = File::open(&scan.path).map_err(|e| file_err(&scan.path)(TraceError::io(e)))?;
        let mut r = WireReader::new(file).map_err(file_err(&scan.path))?;
        if r.file_len() != scan.file_len {
            return Err(file_err(&scan.path)(TraceError::Changed));
        }
        let out = File::create(&out_path).map_err(|e| MergeError::Output {
            path: out_path.display().to_string(),
            error: e,
        })?;
        let mut w = BufWriter::with_capacity(1 << 20, out);
        rewrite_with(&mut r, &plan, dev, &mut w, progress).map_err(file_err(&scan.path))?;
        w.flush().map_err(|e| MergeError::Output {
            path: out_path.display().to_string(),
            error: e,
        })?;
        bytes_in += scan.file_len;
        bytes_out += plan.output_len(scan.file_len);
        tracing::debug!(host = %place.host, shift_ns = place.shift_ns, "host written");
    }
    if let Some(json) = &opts.perfetto {
        let outputs: Vec<(String, PathBuf)> = placements
            .iter()
            .map(|p| (p.host.clone(), tmp_dir.join(&p.output)))
            .collect();
        super::perfetto::write_chrome_json(&outputs, json).map_err(|e| match e {
            MergeError::File(f) => MergeError::File(f),
            other => other,
        })?;
    }
    Ok((bytes_in, bytes_out))
}
