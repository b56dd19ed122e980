//! Device-clock planes: planes whose timestamps are raw readings of a GPU's
//! own clock (in-kernel `%globaltimer`, AMD `s_memrealtime`, KFD counters),
//! placed on the global timeline through the agent's published device maps
//! (device → host REALTIME) composed with the node offset (host → global).
//!
//! Only planes named with `--device-clock` or declaring their clock with
//! the `clock_domain` + `clock_device` plane stats qualify: CUPTI and
//! roctracer `/device:GPU:N` planes are already in host time.
//!
//! Per mapped line the merge does three walks over the line's bytes, all
//! before or while writing and none holding more than one event: (A) map
//! every time, fail closed, find the new line start; (B) the same writer as
//! (C) into a byte counter, for the new length; (C) the rewrite itself.
//! Memory stays O(lines). Design and limits: `docs/trace-merge.md`.

use std::fmt;
use std::fs::File;
use std::io::Write;
use std::str::FromStr;

use clockmesh_proto::clock_stats;

use super::fields::{self, xevent, xline};
use super::plan::{
    ABSOLUTE_THRESHOLD_NS, DeviceError, DevicePlaneReport, HostPlacement, MergeError, OffsetSource,
};
use super::rewrite::{Counting, Region, RegionWriter};
use super::scan::{LineInfo, PlaneSummary, Scan};
use super::wire::{LEN, VARINT, WireReader, put_varint, varint_len};
use super::{FileError, TraceError};
use clockmesh_offsets::PublishedDeviceMap;
use clockmesh_offsets::device_map::HOST_REALTIME;
use clockmesh_offsets::history::{
    DeviceHistoryEntry, DeviceMapIndex, DeviceMaps, HistoryEntry, NodeIndex,
};

/// `--device-clock [HOST:]PLANE=DEVICE`: PLANE's timestamps are raw
/// readings of DEVICE's clock (on HOST, or on every host).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceClockSpec {
    pub host: Option<String>,
    pub plane: String,
    pub device: String,
}

impl fmt::Display for DeviceClockSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(h) = &self.host {
            write!(f, "{h}:")?;
        } else if !self.plane.starts_with('/') && self.plane.contains(':') {
            f.write_str(":")?;
        }
        write!(f, "{}={}", self.plane, self.device)
    }
}

/// A `--device-clock` value that does not parse.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("expected [HOST:]PLANE=DEVICE (e.g. \"/device:GPU:0=nvidia:0\"), got {0:?}")]
    Syntax(String),
    #[error("no plane name in {0:?} (expected [HOST:]PLANE=DEVICE)")]
    NoPlane(String),
    #[error("no device in {0:?} (expected a device such as nvidia:0 after '=')")]
    NoDevice(String),
}

impl FromStr for DeviceClockSpec {
    type Err = SpecError;

    /// The device is after the last '='. A plane name starting with '/'
    /// (XLA's `/device:GPU:0`) has no host prefix; otherwise text before
    /// the first ':' is the host (empty: every host).
    fn from_str(s: &str) -> Result<Self, SpecError> {
        let (lhs, device) = s
            .rsplit_once('=')
            .ok_or_else(|| SpecError::Syntax(s.into()))?;
        let device = device.trim();
        if device.is_empty() || device.contains(char::is_whitespace) {
            return Err(SpecError::NoDevice(s.into()));
        }
        let (host, plane) = match lhs.split_once(':') {
            Some((h, p)) if !lhs.starts_with('/') => ((!h.is_empty()).then_some(h), p),
            _ => (None, lhs),
        };
        if plane.is_empty() {
            return Err(SpecError::NoPlane(s.into()));
        }
        Ok(Self {
            host: host.map(str::to_string),
            plane: plane.into(),
            device: device.into(),
        })
    }
}

/// Errors are cold and large: boxed.
type DevResult<T> = Result<T, Box<DeviceError>>;

/// Resolves which planes of one host are device-mapped and checks their
/// maps. `used[i]` is set for every spec that matched a plane.
pub fn resolve_planes(
    scan: &Scan,
    host: &str,
    specs: &[DeviceClockSpec],
    used: &mut [bool],
    maps: &DeviceMapIndex<'_>,
) -> DevResult<Vec<DevicePlaneReport>> {
    let path = scan.path.display().to_string();
    let mut out = Vec::new();
    for (index, plane) in scan.planes.iter().enumerate() {
        let spec = spec_for(host, &plane.name, specs, used)?;
        let Some(device) = device_of(&path, host, plane, spec)? else {
            continue;
        };
        let map_domain = check_maps(&path, host, plane, &device, maps)?;
        out.push(DevicePlaneReport {
            plane_index: index,
            plane: plane.name.clone(),
            device,
            declared_domain: plane.clock_domain.clone(),
            map_domain,
            lines_mapped: 0,
            events_mapped: 0,
            worst_bound_ns: 0,
            node_bound_known: true,
        });
    }
    Ok(out)
}

/// The spec naming this plane: host-specific before generic.
fn spec_for<'s>(
    host: &str,
    plane: &str,
    specs: &'s [DeviceClockSpec],
    used: &mut [bool],
) -> DevResult<Option<&'s DeviceClockSpec>> {
    let mut found: [Option<(usize, &DeviceClockSpec)>; 2] = [None, None];
    for (i, s) in specs.iter().enumerate() {
        if s.plane != plane || s.host.as_deref().is_some_and(|h| h != host) {
            continue;
        }
        let slot = &mut found[usize::from(s.host.is_none())];
        match slot {
            Some((_, first)) if first.device != s.device => {
                return Err(Box::new(DeviceError::Conflict {
                    host: host.into(),
                    plane: plane.into(),
                    first: first.to_string(),
                    second: s.to_string(),
                }));
            }
            Some(_) => used[i] = true,
            None => *slot = Some((i, s)),
        }
    }
    let chosen = found[0].or(found[1]);
    for (i, _) in found.iter().flatten() {
        used[*i] = true;
    }
    Ok(chosen.map(|(_, s)| s))
}

/// The device whose clock a plane is in, if any: the flag's, else the one
/// the plane declares (with a device `clock_domain`).
fn device_of(
    path: &str,
    host: &str,
    plane: &PlaneSummary,
    spec: Option<&DeviceClockSpec>,
) -> DevResult<Option<String>> {
    if let Some(s) = spec {
        return Ok(Some(s.device.clone()));
    }
    let realtime = HOST_REALTIME;
    match (plane.clock_domain.as_deref(), &plane.clock_device) {
        (None, Some(device)) => {
            tracing::warn!(
                plane = %plane.name,
                device,
                "plane has clock_device but no clock_domain; shifted by the node offset only"
            );
            Ok(None)
        }
        (None, None) => Ok(None),
        (Some(d), _) if d == realtime => Ok(None),
        (Some(_), Some(device)) => Ok(Some(device.clone())),
        (Some(domain), None) => Err(Box::new(DeviceError::NoDevice {
            path: path.into(),
            host: host.into(),
            plane: plane.name.clone(),
            domain: domain.into(),
        })),
    }
}

/// Checks a device's maps exist, target REALTIME and, when the plane
/// declares its domain, are in that domain; returns their device domain.
fn check_maps(
    path: &str,
    host: &str,
    plane: &PlaneSummary,
    device: &str,
    index: &DeviceMapIndex<'_>,
) -> DevResult<String> {
    let maps = index
        .maps(host, device)
        .ok_or_else(|| DeviceError::NoMaps {
            path: path.into(),
            plane: plane.name.clone(),
            host: host.into(),
            device: device.into(),
        })?;
    let realtime = HOST_REALTIME;
    for e in maps.entries() {
        if e.map.host_domain != realtime {
            return Err(Box::new(DeviceError::HostDomain {
                path: path.into(),
                host: host.into(),
                device: device.into(),
                host_domain: e.map.host_domain.clone(),
                realtime,
            }));
        }
        match plane.clock_domain.as_deref() {
            Some(declared) if declared != e.map.device_domain => {
                return Err(Box::new(DeviceError::DomainMismatch {
                    path: path.into(),
                    plane: plane.name.clone(),
                    host: host.into(),
                    device: device.into(),
                    declared: declared.into(),
                    published: e.map.device_domain.clone(),
                }));
            }
            _ => {}
        }
    }
    let first = maps.entries().first();
    Ok(first
        .map(|e| e.map.device_domain.clone())
        .unwrap_or_default())
}

/// Specs that matched no plane of any input are typos: refuse them.
pub fn check_specs_used(
    specs: &[DeviceClockSpec],
    used: &[bool],
    hosts: &[String],
) -> DevResult<()> {
    match specs.iter().zip(used).find(|(_, u)| !**u) {
        Some((s, _)) => Err(Box::new(DeviceError::Unused {
            spec: s.to_string(),
            hosts: match &s.host {
                Some(h) if !hosts.contains(h) => format!("the inputs (no host {h})"),
                Some(h) => format!("host {h}"),
                None => "any host".into(),
            },
        })),
        None => Ok(()),
    }
}

/// The node offset (global − local) for device times: one value (from
/// `--offset`, the hook's stat, or assumed) or the history at each host time.
enum NodeClock<'a> {
    Fixed {
        offset_ns: i64,
        bound_ns: Option<u64>,
    },
    History {
        host: String,
        index: &'a NodeIndex<'a>,
    },
}

/// The map and node entry one time (and the end of its event) goes through.
#[derive(Clone, Copy)]
struct Choice<'a> {
    map: &'a DeviceHistoryEntry,
    node: Option<&'a HistoryEntry>,
}

/// A device time that cannot be placed, and why.
#[derive(Debug)]
struct Unmapped {
    device_ns: i128,
    what: &'static str,
}

impl Unmapped {
    fn at(device_ps: i128, what: &'static str) -> Self {
        Self {
            device_ns: device_ps.div_euclid(1000),
            what,
        }
    }
}

/// A placed time: ps after the global origin, and its error bound.
#[derive(Clone, Copy, Debug)]
struct Placed {
    ps: i128,
    bound_ns: u64,
    node_bound_known: bool,
}

/// Device time → global time for one device plane of one host.
struct Timeline<'a> {
    maps: &'a DeviceMaps<'a>,
    node: NodeClock<'a>,
    /// What XLA subtracted from line timestamps at or after the session
    /// start (`profile_start_time`); `None` for clocks whose values never
    /// reach it (counters), which XLA leaves raw.
    session_start_ns: Option<i64>,
    origin_ps: i128,
}

const OUTSIDE: &str = "outside every published map";

impl<'a> Timeline<'a> {
    /// The device time (ps) of a stored line timestamp (inverse of XLA's
    /// `NormalizeTimestamps`, as for host lines).
    fn line_start_ps(&self, ts_ns: i64) -> i128 {
        let ts = i128::from(ts_ns);
        match self.session_start_ns {
            Some(s) if ts_ns.unsigned_abs() < ABSOLUTE_THRESHOLD_NS as u64 => {
                (ts + i128::from(s)) * 1000
            }
            _ => ts * 1000,
        }
    }

    fn device_ns(device_ps: i128) -> Result<u64, Unmapped> {
        u64::try_from(device_ps.div_euclid(1000))
            .map_err(|_| Unmapped::at(device_ps, "not a device clock value"))
    }

    /// The nearest-anchor map covering the time, and the node entry at its host time.
    fn choose(&self, device_ps: i128) -> Result<Choice<'a>, Unmapped> {
        let d = Self::device_ns(device_ps)?;
        let map = self
            .maps
            .lookup(d)
            .ok_or_else(|| Unmapped::at(device_ps, OUTSIDE))?;
        let node = match &self.node {
            NodeClock::Fixed { .. } => None,
            NodeClock::History { host, index } => {
                let host_ns = map
                    .map
                    .map(d)
                    .ok_or_else(|| Unmapped::at(device_ps, OUTSIDE))?;
                let e = index
                    .lookup(host, host_ns)
                    .ok_or_else(|| Unmapped::at(device_ps, "no node offset in the history"))?;
                Some(e)
            }
        };
        Ok(Choice { map, node })
    }

    /// Places a device time through `c`'s map and node entry, both
    /// evaluated in ps (the maps' own formulas, without rounding to ns).
    fn place(&self, c: Choice<'a>, device_ps: i128) -> Result<Placed, Unmapped> {
        let d = Self::device_ns(device_ps)?;
        if c.map.map.map(d).is_none() {
            return Err(Unmapped::at(device_ps, OUTSIDE));
        }
        let host_ps = map_ps(&c.map.map, device_ps);
        let (offset_ps, node_bound) = match (&self.node, c.node) {
            (
                NodeClock::Fixed {
                    offset_ns,
                    bound_ns,
                },
                _,
            ) => (i128::from(*offset_ns) * 1000, *bound_ns),
            (NodeClock::History { .. }, Some(e)) => (e.offset_at_ps(host_ps), Some(e.bound_ns)),
            (NodeClock::History { .. }, None) => {
                return Err(Unmapped::at(device_ps, "no node offset in the history"));
            }
        };
        Ok(Placed {
            ps: host_ps
                .saturating_add(offset_ps)
                .saturating_sub(self.origin_ps),
            bound_ns: c.map.map.bound_ns.saturating_add(node_bound.unwrap_or(0)),
            node_bound_known: node_bound.is_some(),
        })
    }

    /// Places `[start, end]`; the end goes through the start's map and
    /// node entry when that map covers it, so a duration sees one drift.
    fn span(&self, start_ps: i128, end_ps: i128) -> Result<(Placed, Placed), Unmapped> {
        let c = self.choose(start_ps)?;
        let start = self.place(c, start_ps)?;
        let same = Self::device_ns(end_ps).is_ok_and(|d| c.map.map.map(d).is_some());
        let c_end = if same { c } else { self.choose(end_ps)? };
        Ok((start, self.place(c_end, end_ps)?))
    }

    /// "N map(s) cover A..B ns" for error messages.
    fn coverage(&self) -> String {
        let e = self.maps.entries();
        let from = e.iter().map(|e| e.map.valid_from_device_ns).min();
        let until = e.iter().map(|e| e.map.valid_until_device_ns).max();
        match (from, until) {
            (Some(f), Some(u)) => format!("its {} map(s) span {f}..{u} ns", e.len()),
            _ => "no maps".into(),
        }
    }
}

/// `PublishedDeviceMap::map` in ps: `host = device + offset_at_anchor +
/// drift_ppb·1e-9·(device − anchor)`. Saturating: maps come from files.
fn map_ps(m: &PublishedDeviceMap, device_ps: i128) -> i128 {
    let dx = device_ps - i128::from(m.anchor_device_ns) * 1000;
    let drift = (m.drift_ppb * 1e-9 * dx as f64).round() as i128;
    device_ps
        .saturating_add(i128::from(m.offset_at_anchor_ns) * 1000)
        .saturating_add(drift)
}

/// Mapped events and bounds, accumulated while planning.
#[derive(Clone, Copy, Debug)]
struct Tally {
    events: u64,
    worst_bound_ns: u64,
    node_bound_known: bool,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            events: 0,
            worst_bound_ns: 0,
            node_bound_known: true,
        }
    }
}

impl Tally {
    fn add(&mut self, p: Placed) {
        self.worst_bound_ns = self.worst_bound_ns.max(p.bound_ns);
        self.node_bound_known &= p.node_bound_known;
    }
}

/// The time fields of one XEvent (last occurrence wins, as in protobuf).
#[derive(Clone, Copy, Debug, Default)]
struct EventTimes {
    offset_ps: i64,
    duration_ps: i64,
    /// `num_occurrences` came last in the oneof: no time.
    aggregated: bool,
    offset_fields: u64,
    offset_bytes: u64,
    duration_fields: u64,
    duration_bytes: u64,
}

/// Reads an event's time fields; `r` ends at the event's end.
fn read_event_times(r: &mut WireReader, n: u64) -> Result<EventTimes, TraceError> {
    let end = r.pos() + n;
    let mut t = EventTimes::default();
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        let at = r.pos();
        match (field, wire) {
            (xevent::OFFSET_PS, VARINT) => {
                t.offset_ps = r.read_varint()? as i64;
                t.aggregated = false;
                t.offset_fields += 1;
                t.offset_bytes += r.pos() - at;
            }
            (xevent::DURATION_PS, VARINT) => {
                t.duration_ps = r.read_varint()? as i64;
                t.duration_fields += 1;
                t.duration_bytes += r.pos() - at;
            }
            (xevent::NUM_OCCURRENCES, VARINT) => {
                r.read_varint()?;
                t.aggregated = true;
            }
            (xevent::OFFSET_PS | xevent::DURATION_PS | xevent::NUM_OCCURRENCES, _) => {
                return Err(TraceError::malformed(
                    at,
                    "XEvent time field is not a varint",
                ));
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    if r.pos() != end {
        return Err(TraceError::malformed(
            r.pos(),
            "field runs past the end of its message",
        ));
    }
    Ok(t)
}

/// What planning decided for one mapped line.
#[derive(Clone, Debug)]
struct LinePlan {
    timeline: usize,
    start: u64,
    len: u64,
    /// The stored (old) timestamp and whether a field holds it.
    old_ts_ns: i64,
    has_ts: bool,
    /// New timestamp: the earliest placed time of the line, in ns after the origin.
    new_ts_ns: i64,
    /// New `XLine.duration_ps`, when the line has one.
    new_duration_ps: Option<i64>,
}

/// A line walk failed: bad bytes, or a time that cannot be placed.
enum WalkError {
    Trace(TraceError),
    Unmapped(Unmapped),
}

impl From<TraceError> for WalkError {
    fn from(e: TraceError) -> Self {
        Self::Trace(e)
    }
}

impl From<Unmapped> for WalkError {
    fn from(e: Unmapped) -> Self {
        Self::Unmapped(e)
    }
}

/// Walk A: places every time of a line (fail closed) and decides its new
/// timestamp and duration; `None` when the line has no timed events.
fn plan_line(
    r: &mut WireReader,
    line: &LineInfo,
    tl: &Timeline<'_>,
    tally: &mut Tally,
) -> Result<Option<(i64, Option<i64>)>, WalkError> {
    r.seek_to(line.content_start)?;
    let end = line.content_end;
    let line_ps = tl.line_start_ps(line.timestamp_ns);
    let (mut earliest, mut timed, mut line_dur) = (i128::MAX, 0u64, None);
    let mut line_tally = Tally::default();
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        match (field, wire) {
            (xline::DURATION_PS, VARINT) => line_dur = Some(r.read_varint()? as i64),
            (xline::EVENTS, LEN) => {
                let n = r.read_len(end)?;
                let t = read_event_times(r, n)?;
                if t.aggregated {
                    continue;
                }
                let s = line_ps + i128::from(t.offset_ps);
                let (a, b) = tl.span(s, s + i128::from(t.duration_ps))?;
                earliest = earliest.min(a.ps);
                line_tally.add(a);
                line_tally.add(b);
                timed += 1;
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    if timed == 0 {
        return Ok(None);
    }
    let (start, line_end) = tl.span(line_ps, line_ps + i128::from(line_dur.unwrap_or(0)))?;
    line_tally.add(start);
    let new_ts = i64::try_from(earliest.min(start.ps).div_euclid(1000))
        .map_err(|_| Unmapped::at(line_ps, "placed time out of range"))?;
    let new_dur = match line_dur {
        Some(_) => Some(to_i64(line_end.ps - i128::from(new_ts) * 1000, line_ps)?),
        None => None,
    };
    line_tally.add(line_end);
    tally.events += timed;
    tally.worst_bound_ns = tally.worst_bound_ns.max(line_tally.worst_bound_ns);
    tally.node_bound_known &= line_tally.node_bound_known;
    Ok(Some((new_ts, new_dur)))
}

fn to_i64(ps: i128, device_ps: i128) -> Result<i64, Unmapped> {
    i64::try_from(ps.max(0)).map_err(|_| Unmapped::at(device_ps, "placed time out of range"))
}

/// Copies `[from, r.pos())` again (just parsed, still buffered).
fn recopy(r: &mut WireReader, from: u64, out: &mut dyn Write) -> Result<(), TraceError> {
    let n = r.pos() - from;
    r.seek_to(from)?;
    r.copy_to(n, &mut &mut *out)
}

fn put(out: &mut dyn Write, value: u64) -> Result<(), TraceError> {
    let mut b = Vec::with_capacity(10);
    put_varint(&mut b, value);
    out.write_all(&b).map_err(TraceError::io)
}

/// Walks B and C: writes the line's new content. Other fields, unknown
/// ones included, are copied byte for byte.
fn write_line(
    r: &mut WireReader,
    plan: &LinePlan,
    tl: &Timeline<'_>,
    out: &mut dyn Write,
) -> Result<(), WalkError> {
    r.seek_to(plan.start)?;
    let end = plan.start + plan.len;
    let line_ps = tl.line_start_ps(plan.old_ts_ns);
    if !plan.has_ts {
        put(out, u64::from(fields::key(xline::TIMESTAMP_NS, VARINT)))?;
        put(out, plan.new_ts_ns as u64)?;
    }
    while r.pos() < end {
        let from = r.pos();
        let (field, wire) = r.read_key()?;
        match (field, wire, plan.new_duration_ps) {
            (xline::TIMESTAMP_NS, VARINT, _) => {
                recopy(r, from, out)?;
                r.read_varint()?;
                put(out, plan.new_ts_ns as u64)?;
            }
            (xline::DURATION_PS, VARINT, Some(dur)) => {
                recopy(r, from, out)?;
                r.read_varint()?;
                put(out, dur as u64)?;
            }
            (xline::EVENTS, LEN, _) => {
                recopy(r, from, out)?;
                let n = r.read_len(end)?;
                write_event(r, n, line_ps, plan.new_ts_ns, tl, out)?;
            }
            _ => {
                r.skip_value(wire, end)?;
                recopy(r, from, out)?;
            }
        }
    }
    Ok(())
}

/// Writes one event (length prefix included) with its offset and duration
/// placed on the global timeline relative to the new line start.
fn write_event(
    r: &mut WireReader,
    n: u64,
    line_ps: i128,
    new_ts_ns: i64,
    tl: &Timeline<'_>,
    out: &mut dyn Write,
) -> Result<(), WalkError> {
    let start = r.pos();
    let t = read_event_times(r, n)?;
    r.seek_to(start)?;
    if t.aggregated {
        put(out, n)?;
        return Ok(r.copy_to(n, &mut &mut *out)?);
    }
    let s = line_ps + i128::from(t.offset_ps);
    let (a, b) = tl.span(s, s + i128::from(t.duration_ps))?;
    let offset = to_i64(a.ps - i128::from(new_ts_ns) * 1000, s)?;
    let duration = to_i64(b.ps - a.ps, s)?;
    let insert = |fields: u64, v: i64| fields == 0 && v != 0;
    let (ins_off, ins_dur) = (
        insert(t.offset_fields, offset),
        insert(t.duration_fields, duration),
    );
    let field_len = |v: i64| varint_len(v as u64);
    let new_len = n - t.offset_bytes - t.duration_bytes
        + t.offset_fields * field_len(offset)
        + t.duration_fields * field_len(duration)
        + u64::from(ins_off) * (1 + field_len(offset))
        + u64::from(ins_dur) * (1 + field_len(duration));
    put(out, new_len)?;
    if ins_off {
        put(out, u64::from(fields::key(xevent::OFFSET_PS, VARINT)))?;
        put(out, offset as u64)?;
    }
    if ins_dur {
        put(out, u64::from(fields::key(xevent::DURATION_PS, VARINT)))?;
        put(out, duration as u64)?;
    }
    let end = start + n;
    while r.pos() < end {
        let from = r.pos();
        let (field, wire) = r.read_key()?;
        let new = match (field, wire) {
            (xevent::OFFSET_PS, VARINT) => Some(offset),
            (xevent::DURATION_PS, VARINT) => Some(duration),
            _ => None,
        };
        match new {
            Some(v) => {
                recopy(r, from, out)?;
                r.read_varint()?;
                put(out, v as u64)?;
            }
            None => {
                r.skip_value(wire, end)?;
                recopy(r, from, out)?;
            }
        }
    }
    Ok(())
}

/// One host's device-mapped lines: the rewrite's regions and their writer.
#[derive(Default)]
pub struct HostDevices<'a> {
    timelines: Vec<Timeline<'a>>,
    lines: Vec<LinePlan>,
    regions: Vec<Region>,
    /// Per scan line: rewritten as a region (else shifted like host lines).
    mapped: Vec<bool>,
}

impl HostDevices<'_> {
    pub fn regions(&self) -> Vec<Region> {
        self.regions.clone()
    }

    /// Whether scan line `i` is rewritten here (and so takes no other edit).
    pub fn is_mapped(&self, i: usize) -> bool {
        self.mapped.get(i).copied().unwrap_or(false)
    }
}

impl RegionWriter for HostDevices<'_> {
    fn write_region(
        &mut self,
        r: &mut WireReader,
        region: &Region,
        out: &mut dyn Write,
    ) -> Result<(), TraceError> {
        let plan = self
            .lines
            .get(region.id)
            .ok_or_else(|| TraceError::malformed(region.start, "unknown region"))?;
        let tl = &self.timelines[plan.timeline];
        write_line(r, plan, tl, out).map_err(|e| match e {
            WalkError::Trace(t) => t,
            // Planning placed every time already: only a changed file gets here.
            WalkError::Unmapped(_) => TraceError::Changed,
        })
    }
}

/// Inputs of [`plan_host`] shared by all hosts.
pub struct DeviceContext<'a> {
    pub maps: &'a DeviceMapIndex<'a>,
    pub nodes: &'a NodeIndex<'a>,
    pub origin_ns: i64,
}

/// Plans one host's device-mapped planes (walks A and B): every device
/// time is placed here, before any output exists, so a time outside the
/// maps fails the merge with nothing written.
pub fn plan_host<'a>(
    scan: &Scan,
    place: &mut HostPlacement,
    ctx: &DeviceContext<'a>,
) -> Result<HostDevices<'a>, MergeError> {
    let mut out = HostDevices {
        mapped: vec![false; scan.lines.len()],
        ..HostDevices::default()
    };
    if place.device_planes.is_empty() {
        return Ok(out);
    }
    let path = scan.path.display().to_string();
    let file_err = |error| {
        MergeError::File(FileError {
            path: path.clone(),
            error,
        })
    };
    let file = File::open(&scan.path).map_err(|e| file_err(TraceError::io(e)))?;
    let mut r = WireReader::new(file).map_err(file_err)?;
    let host = place.host.as_str();
    for report in &mut place.device_planes {
        let tl = timeline(scan, host, place.source, place.offset_ns, report, ctx)
            .map_err(MergeError::Device)?;
        let ti = out.timelines.len();
        let mut tally = Tally::default();
        for (li, line) in scan.lines.iter().enumerate() {
            if line.plane != report.plane_index {
                continue;
            }
            let planned = plan_line(&mut r, line, &tl, &mut tally)
                .and_then(|p| p.map(|p| size_line(&mut r, ti, line, p, &tl)).transpose());
            match planned {
                Ok(Some((plan, region))) => {
                    out.mapped[li] = true;
                    report.lines_mapped += 1;
                    out.regions.push(Region {
                        id: out.lines.len(),
                        ..region
                    });
                    out.lines.push(plan);
                }
                Ok(None) => {}
                Err(WalkError::Trace(e)) => return Err(file_err(e)),
                Err(WalkError::Unmapped(u)) => {
                    return Err(MergeError::Device(Box::new(DeviceError::Unmapped {
                        path: path.clone(),
                        plane: report.plane.clone(),
                        host: host.into(),
                        device: report.device.clone(),
                        device_ns: u.device_ns,
                        what: u.what,
                        coverage: tl.coverage(),
                    })));
                }
            }
        }
        report.events_mapped = tally.events;
        report.worst_bound_ns = tally.worst_bound_ns;
        report.node_bound_known = tally.node_bound_known;
        out.timelines.push(tl);
    }
    Ok(out)
}

/// Walk B: the line's new length, by writing it into a counter.
fn size_line(
    r: &mut WireReader,
    ti: usize,
    line: &LineInfo,
    (new_ts_ns, new_duration_ps): (i64, Option<i64>),
    tl: &Timeline<'_>,
) -> Result<(LinePlan, Region), WalkError> {
    let len = line.content_end - line.content_start;
    let plan = LinePlan {
        timeline: ti,
        start: line.content_start,
        len,
        old_ts_ns: line.timestamp_ns,
        has_ts: !line.ts_fields.is_empty(),
        new_ts_ns,
        new_duration_ps,
    };
    let mut counter = Counting {
        inner: std::io::sink(),
        written: 0,
    };
    write_line(r, &plan, tl, &mut counter)?;
    let region = Region {
        start: plan.start,
        len,
        delta: counter.written as i64 - len as i64,
        id: 0,
    };
    Ok((plan, region))
}

fn timeline<'a>(
    scan: &Scan,
    host: &str,
    source: OffsetSource,
    offset_ns: i64,
    report: &DevicePlaneReport,
    ctx: &DeviceContext<'a>,
) -> DevResult<Timeline<'a>> {
    let maps = ctx
        .maps
        .maps(host, &report.device)
        .ok_or_else(|| DeviceError::NoMaps {
            path: scan.path.display().to_string(),
            plane: report.plane.clone(),
            host: host.into(),
            device: report.device.clone(),
        })?;
    let node = match source {
        OffsetSource::History => NodeClock::History {
            host: host.into(),
            index: ctx.nodes,
        },
        OffsetSource::Hook => NodeClock::Fixed {
            offset_ns,
            bound_ns: scan
                .clock_stat(clock_stats::OFFSET_BOUND_NS)
                .and_then(|b| u64::try_from(b).ok()),
        },
        OffsetSource::Flag | OffsetSource::AssumedZero => NodeClock::Fixed {
            offset_ns,
            bound_ns: None,
        },
    };
    // A counter clock (all maps below epoch-like values) never reaches the
    // session start, so XLA left its values raw.
    let counter = maps
        .entries()
        .iter()
        .all(|e| e.map.valid_until_device_ns < ABSOLUTE_THRESHOLD_NS as u64);
    Ok(Timeline {
        maps,
        node,
        session_start_ns: (!counter).then(|| scan.profile_start_ns()).flatten(),
        origin_ps: i128::from(ctx.origin_ns) * 1000,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::host_edits_except;
    use crate::rewrite::{Plan, rewrite_with};
    use crate::scan::scan_file;
    use crate::synth::{SynthSpec, task_env_plane};
    use clockmesh_proto::prost::Message;
    use clockmesh_proto::xplane::{XEvent, XLine, XPlane, XSpace, x_event};

    const S: i64 = 1_795_335_288_621_242_594;
    /// Host = device + 2^40 ns: the line timestamp grows from 5 to 6
    /// varint bytes.
    const OFF: i64 = 1 << 40;

    fn len_field(out: &mut Vec<u8>, num: u64, body: &[u8]) {
        put_varint(out, (num << 3) | 2);
        put_varint(out, body.len() as u64);
        out.extend_from_slice(body);
    }

    fn event(offset: Option<i64>, duration_ps: i64) -> XEvent {
        XEvent {
            metadata_id: 1,
            duration_ps,
            data: offset.map(x_event::Data::OffsetPs),
            stats: Vec::new(),
        }
    }

    /// One device line: an event without an offset field, one at −5 ns
    /// (10-byte varint), one at +1 ps, an aggregated one, and one with an
    /// unknown field.
    fn trace_bytes() -> (Vec<u8>, Vec<u8>) {
        let line = XLine {
            id: 1,
            timestamp_ns: 1_000_000_000,
            events: vec![
                event(None, 700),
                event(Some(-5_000), 300),
                event(Some(1), 0),
                XEvent {
                    metadata_id: 2,
                    duration_ps: 9,
                    data: Some(x_event::Data::NumOccurrences(3)),
                    stats: Vec::new(),
                },
            ],
            ..Default::default()
        };
        let mut line_bytes = line.encode_to_vec();
        let unknown = vec![0xf8, 0x06, 0x2a]; // field 111 = 42
        let mut ev = event(Some(2_000), 50).encode_to_vec();
        ev.extend_from_slice(&unknown);
        len_field(&mut line_bytes, 4, &ev);
        let mut plane = XPlane {
            id: 5,
            name: "dev".into(),
            ..Default::default()
        }
        .encode_to_vec();
        len_field(&mut plane, 3, &line_bytes);
        let mut file = Vec::new();
        len_field(&mut file, 1, &plane);
        let spec = SynthSpec {
            start_ns: S,
            ..SynthSpec::default()
        };
        len_field(&mut file, 1, &task_env_plane(&spec).encode_to_vec());
        (file, unknown)
    }

    fn map() -> DeviceHistoryEntry {
        let anchor = (S + 1_000_000_000) as u64;
        DeviceHistoryEntry {
            kind: "device".into(),
            host: "h".into(),
            window: 1,
            written_at_ns: 0,
            map: PublishedDeviceMap {
                device: "nvidia:0".into(),
                device_domain: "cuda-globaltimer".into(),
                source: "cuda-pingpong".into(),
                host_domain: "CLOCK_REALTIME".into(),
                anchor_device_ns: anchor,
                offset_at_anchor_ns: OFF,
                drift_ppb: 0.0,
                bound_ns: 10,
                residual_rms_ns: 1.0,
                points: 10,
                valid_from_device_ns: anchor - 1_000_000,
                valid_until_device_ns: anchor + 1_000_000,
            },
        }
    }

    #[test]
    fn device_line_rewrite_resizes_varints_and_keeps_everything_else() {
        let (input, unknown) = trace_bytes();
        let dir = std::env::temp_dir().join(format!("cm-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.xplane.pb");
        std::fs::write(&path, &input).unwrap();
        let scan = scan_file(&path).unwrap();
        let entries = [map()];
        let (maps, nodes) = (DeviceMapIndex::new(&entries), NodeIndex::default());
        let mut place = HostPlacement {
            host: "h".into(),
            input: path.clone(),
            output: "h.xplane.pb".into(),
            start_ns: S,
            offset_ns: 0,
            source: OffsetSource::Flag,
            shift_ns: 0,
            lines_absolute: 0,
            device_planes: vec![DevicePlaneReport {
                plane_index: 0,
                plane: "dev".into(),
                device: "nvidia:0".into(),
                declared_domain: None,
                map_domain: "cuda-globaltimer".into(),
                lines_mapped: 0,
                events_mapped: 0,
                worst_bound_ns: 0,
                node_bound_known: true,
            }],
        };
        let ctx = DeviceContext {
            maps: &maps,
            nodes: &nodes,
            origin_ns: S,
        };
        let mut dev = plan_host(&scan, &mut place, &ctx).unwrap();
        assert_eq!(place.device_planes[0].events_mapped, 4);
        let (edits, _) = host_edits_except(&scan, &place, S, |i| dev.is_mapped(i));
        let plan = Plan::new(edits, dev.regions(), scan.frames());
        let mut r = WireReader::new(File::open(&path).unwrap()).unwrap();
        let mut out = Vec::new();
        rewrite_with(&mut r, &plan, &mut dev, &mut out, &mut |_| {}).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(out.len() as u64, plan.output_len(input.len() as u64));
        // +1 (timestamp) −9 (−5000 → 0) +3 (inserted offset) +1 (1 → 5001).
        assert_eq!(out.len(), input.len() - 4);

        let space = XSpace::decode(out.as_slice()).unwrap();
        let line = &space.planes[0].lines[0];
        // Earliest event: device S + 1 s − 5 ns → host + 2^40 ns.
        assert_eq!(line.timestamp_ns, 1_000_000_000 + OFF - 5);
        let offsets: Vec<_> = line.events.iter().map(|e| e.data).collect();
        assert_eq!(
            offsets,
            [
                Some(x_event::Data::OffsetPs(5_000)), // inserted field
                Some(x_event::Data::OffsetPs(0)),     // 10 bytes -> 1
                Some(x_event::Data::OffsetPs(5_001)),
                Some(x_event::Data::NumOccurrences(3)),
                Some(x_event::Data::OffsetPs(7_000)),
            ]
        );
        let durations: Vec<_> = line.events.iter().map(|e| e.duration_ps).collect();
        assert_eq!(durations, [700, 300, 0, 9, 50], "no drift: durations kept");
        assert!(
            out.windows(unknown.len()).any(|w| w == unknown.as_slice()),
            "unknown event field lost"
        );
        assert_eq!(space.planes[1].name, "Task Environment");
    }

    #[test]
    fn event_times_last_field_wins_and_bad_wire_types_are_refused() {
        // offset 7, then num_occurrences: aggregated; then offset again: timed.
        let bytes = [0x10, 7, 0x28, 3, 0x10, 9, 0x18, 4];
        let dir = std::env::temp_dir().join(format!("cm-dev-ev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("e");
        std::fs::write(&p, bytes).unwrap();
        let mut r = WireReader::new(File::open(&p).unwrap()).unwrap();
        let t = read_event_times(&mut r, 4).unwrap();
        assert!(t.aggregated);
        r.seek_to(0).unwrap();
        let t = read_event_times(&mut r, bytes.len() as u64).unwrap();
        assert!(!t.aggregated);
        assert_eq!((t.offset_ps, t.duration_ps, t.offset_fields), (9, 4, 2));
        std::fs::write(&p, [0x12, 1, 0]).unwrap(); // offset_ps as bytes
        let mut r = WireReader::new(File::open(&p).unwrap()).unwrap();
        assert!(read_event_times(&mut r, 3).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
