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

use std::cell::RefCell;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::str::FromStr;
use std::sync::Arc;

use super::fields::{self, xevent, xline};
use super::plan::{
    ABSOLUTE_THRESHOLD_NS, DeviceError, DevicePlaneReport, HostPlacement, MergeError,
};
use super::rewrite::{Counting, Region, RegionWriter};
use super::scan::{LineInfo, PlaneSummary, Scan};
use super::wire::{LEN, SliceReader, VARINT, WireReader, put_varint, varint_len};
use super::{FileError, TraceError};
use clockmesh_offsets::device_map::HOST_REALTIME;
use clockmesh_offsets::history::{DeviceHistoryEntry, DeviceMapIndex, DeviceMaps};
use clockmesh_offsets::host_map::{NearSegment, round_bound_ns};
use clockmesh_offsets::{GlobalTime, HostMap, PublishedDeviceMap, Segment};

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

/// The device map one time (and the end of its event) goes through;
/// `None` on a host-clock plane.
type Choice<'a> = Option<&'a DeviceHistoryEntry>;

/// A time that cannot be placed, and why.
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

/// A plane's clock → global time: through a device's maps to host time
/// (device planes), then the host's map (every plane).
struct Timeline<'a> {
    /// `None`: the plane is already in host CLOCK_REALTIME.
    maps: Option<&'a DeviceMaps<'a>>,
    node: Arc<HostMap>,
    /// The piece of `node` used last: a line's events are close in time.
    piece: RefCell<Option<Segment>>,
    /// What XLA subtracted from line timestamps at or after the session
    /// start (`profile_start_time`); `None` for clocks whose values never
    /// reach it (counters), which XLA leaves raw.
    session_start_ns: Option<i64>,
    origin_ps: i128,
}

const OUTSIDE: &str = "outside every published map";

impl<'a> Timeline<'a> {
    /// A host-clock plane's timeline.
    fn host(node: Arc<HostMap>, session_start_ns: Option<i64>, origin_ns: i64) -> Self {
        Self {
            maps: None,
            node,
            piece: RefCell::new(None),
            session_start_ns,
            origin_ps: i128::from(origin_ns) * 1000,
        }
    }

    /// The plane-clock time (ps) of a stored line timestamp (inverse of
    /// XLA's `NormalizeTimestamps`).
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

    /// The nearest-anchor device map covering the time.
    fn choose(&self, device_ps: i128) -> Result<Choice<'a>, Unmapped> {
        let Some(maps) = self.maps else {
            return Ok(None);
        };
        let d = Self::device_ns(device_ps)?;
        maps.lookup(d)
            .map(Some)
            .ok_or_else(|| Unmapped::at(device_ps, OUTSIDE))
    }

    /// Places a time through `c`'s device map (if any) and the host map,
    /// both evaluated in ps (the maps' own formulas, without rounding to ns).
    fn place(&self, c: Choice<'a>, time_ps: i128) -> Result<Placed, Unmapped> {
        let host_ps = match c {
            Some(m) => {
                let d = Self::device_ns(time_ps)?;
                if m.map.map(d).is_none() {
                    return Err(Unmapped::at(time_ps, OUTSIDE));
                }
                map_ps(&m.map, time_ps)
            }
            None => time_ps,
        };
        let g = self.node_global_ps(host_ps);
        Ok(Placed {
            ps: g.global_ps.saturating_sub(self.origin_ps),
            bound_ns: c.map_or(0, |m| m.map.bound_ns).saturating_add(g.bound_ns),
            node_bound_known: self.node.bound_known(),
        })
    }

    /// The host map at `host_ps`, through the piece used last when it holds.
    fn node_global_ps(&self, host_ps: i128) -> GlobalTime {
        // Borrowed, not copied: this runs for every event start and end.
        let mut piece = self.piece.borrow_mut();
        match piece.as_ref() {
            Some(p) if p.contains(host_ps) => p.to_global_ps(host_ps),
            _ => piece
                .insert(self.node.segment(host_ps))
                .to_global_ps(host_ps),
        }
    }

    /// Places `[start, end]`; the end goes through the start's device map
    /// when that map covers it, so a duration sees one device drift.
    fn span(&self, start_ps: i128, end_ps: i128) -> Result<(Placed, Placed), Unmapped> {
        let c = self.choose(start_ps)?;
        let start = self.place(c, start_ps)?;
        let same = match c {
            Some(m) => Self::device_ns(end_ps).is_ok_and(|d| m.map.map(d).is_some()),
            None => true,
        };
        let c_end = if same { c } else { self.choose(end_ps)? };
        Ok((start, self.place(c_end, end_ps)?))
    }

    /// "N map(s) cover A..B ns" for error messages.
    fn coverage(&self) -> String {
        let Some(maps) = self.maps else {
            return "host clock".into();
        };
        let e = maps.entries();
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
    lines: u64,
    events: u64,
    worst_bound_ns: u64,
    node_bound_known: bool,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            lines: 0,
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
    /// Where the (last) offset and duration values lie in the event:
    /// with one of each, the rewrite copies around them without parsing.
    offset_at: usize,
    duration_at: usize,
}

/// Reads an event's time fields from its bytes (`base`: their file position).
fn event_times(bytes: &[u8], base: u64) -> Result<EventTimes, TraceError> {
    let mut r = SliceReader::new(bytes, base);
    let mut t = EventTimes::default();
    while !r.is_done() {
        let (field, wire) = r.read_key()?;
        let at = r.at();
        match (field, wire) {
            (xevent::OFFSET_PS, VARINT) => {
                t.offset_ps = r.read_varint()? as i64;
                t.aggregated = false;
                t.offset_fields += 1;
                t.offset_bytes += (r.at() - at) as u64;
                t.offset_at = at;
            }
            (xevent::DURATION_PS, VARINT) => {
                t.duration_ps = r.read_varint()? as i64;
                t.duration_fields += 1;
                t.duration_bytes += (r.at() - at) as u64;
                t.duration_at = at;
            }
            (xevent::NUM_OCCURRENCES, VARINT) => {
                r.read_varint()?;
                t.aggregated = true;
            }
            (xevent::OFFSET_PS | xevent::DURATION_PS | xevent::NUM_OCCURRENCES, _) => {
                return Err(TraceError::malformed(
                    base + at as u64,
                    "XEvent time field is not a varint",
                ));
            }
            _ => r.skip_value(wire)?,
        }
    }
    Ok(t)
}

/// Whether a time field absent from the event must be added.
fn inserted(fields: u64, value: i64) -> bool {
    fields == 0 && value != 0
}

/// The encoded length of an event of `n` bytes once its times are
/// `offset` and `duration`.
fn new_event_len(n: u64, t: &EventTimes, offset: i64, duration: i64) -> u64 {
    let field_len = |v: i64| varint_len(v as u64);
    n - t.offset_bytes - t.duration_bytes
        + t.offset_fields * field_len(offset)
        + t.duration_fields * field_len(duration)
        + u64::from(inserted(t.offset_fields, offset)) * (1 + field_len(offset))
        + u64::from(inserted(t.duration_fields, duration)) * (1 + field_len(duration))
}

/// Appends the event, length prefix included, with its times replaced;
/// every other field is copied byte for byte.
fn encode_event(
    bytes: &[u8],
    base: u64,
    t: &EventTimes,
    (offset, duration): (i64, i64),
    out: &mut Vec<u8>,
) -> Result<(), TraceError> {
    put_varint(out, new_event_len(bytes.len() as u64, t, offset, duration));
    if inserted(t.offset_fields, offset) {
        out.push(fields::key(xevent::OFFSET_PS, VARINT));
        put_varint(out, offset as u64);
    }
    if inserted(t.duration_fields, duration) {
        out.push(fields::key(xevent::DURATION_PS, VARINT));
        put_varint(out, duration as u64);
    }
    if t.offset_fields <= 1 && t.duration_fields <= 1 {
        splice_times(bytes, t, offset, duration, out);
        return Ok(());
    }
    let mut r = SliceReader::new(bytes, base);
    while !r.is_done() {
        let from = r.at();
        let (field, wire) = r.read_key()?;
        let new = match (field, wire) {
            (xevent::OFFSET_PS, VARINT) => Some(offset),
            (xevent::DURATION_PS, VARINT) => Some(duration),
            _ => None,
        };
        match new {
            Some(v) => {
                out.extend_from_slice(&bytes[from..r.at()]);
                r.read_varint()?;
                put_varint(out, v as u64);
            }
            None => {
                r.skip_value(wire)?;
                out.extend_from_slice(&bytes[from..r.at()]);
            }
        }
    }
    Ok(())
}

/// [`encode_event`]'s body for an event with at most one offset and one
/// duration field (XLA writes one of each): the bytes around them copied,
/// the values replaced, no second parse.
fn splice_times(bytes: &[u8], t: &EventTimes, offset: i64, duration: i64, out: &mut Vec<u8>) {
    let mut values = [
        (t.offset_fields, t.offset_at, t.offset_bytes, offset),
        (t.duration_fields, t.duration_at, t.duration_bytes, duration),
    ];
    values.sort_by_key(|v| v.1);
    let mut copied = 0;
    for (fields, at, len, value) in values {
        if fields == 1 {
            out.extend_from_slice(&bytes[copied..at]);
            put_varint(out, value as u64);
            copied = at + len as usize;
        }
    }
    out.extend_from_slice(&bytes[copied..]);
}

/// A timed event placed relative to a line starting at `new_ts_ns`:
/// its start and end, and its new offset and duration (never negative).
fn place_event(
    t: &EventTimes,
    line_ps: i128,
    new_ts_ns: i64,
    tl: &Timeline<'_>,
) -> Result<(Placed, Placed, (i64, i64)), Unmapped> {
    let s = line_ps + i128::from(t.offset_ps);
    let (a, b) = tl.span(s, s + i128::from(t.duration_ps))?;
    let offset = to_i64(a.ps - i128::from(new_ts_ns) * 1000, s)?;
    let duration = to_i64(b.ps - a.ps, s)?;
    Ok((a, b, (offset, duration)))
}

/// Places one line's events. Host-clock planes go through the piece of
/// the host map that held last, seen from the line's start in i64 and
/// f64 ([`NearSegment`]): the same values as [`Timeline::span`], without
/// its i128 conversions, and with the bounds (walk A only, `BOUND`) kept
/// unrounded until the line's end. Device planes, and whatever leaves
/// i64, go through [`Timeline::span`].
#[derive(Clone)]
struct LinePlacer<'t, 'a> {
    tl: &'t Timeline<'a>,
    line_ps: i128,
    /// Host-clock planes: the piece used last, from `line_ps`.
    piece: Option<NearSegment>,
    /// `line_ps` + the piece's anchor offset − the origin.
    base_ps: i128,
    /// Worst unrounded bound of the times placed through `piece`.
    worst: f64,
}

impl<'t, 'a> LinePlacer<'t, 'a> {
    fn new(tl: &'t Timeline<'a>, line_ps: i128) -> Self {
        Self {
            tl,
            line_ps,
            piece: None,
            base_ps: 0,
            worst: f64::NEG_INFINITY,
        }
    }

    /// A timed event relative to a line starting at `new_ts_ps`: its
    /// placed start (ps after the origin) and its new offset and duration,
    /// as [`place_event`]. With `BOUND`, the bounds go into `tally` (or
    /// [`Self::worst`], folded in by [`Self::finish`]).
    #[inline]
    fn event<const BOUND: bool>(
        &mut self,
        t: &EventTimes,
        (new_ts_ns, new_ts_ps): (i64, i128),
        tally: &mut Tally,
    ) -> Result<(i128, (i64, i64)), Unmapped> {
        if self.tl.maps.is_some() {
            let (a, b, times) = place_event(t, self.line_ps, new_ts_ns, self.tl)?;
            if BOUND {
                tally.add(a);
                tally.add(b);
            }
            return Ok((a.ps, times));
        }
        let a = self.host::<BOUND>(t.offset_ps, tally)?;
        let b = match t.offset_ps.checked_add(t.duration_ps) {
            Some(end) => self.host::<BOUND>(end, tally)?,
            None => {
                self.host_wide::<BOUND>(i128::from(t.offset_ps) + i128::from(t.duration_ps), tally)?
            }
        };
        let s = self.line_ps + i128::from(t.offset_ps);
        Ok((a, (to_i64(a - new_ts_ps, s)?, to_i64(b - a, s)?)))
    }

    /// A host-clock time `rel` ps after the line start → ps after the origin.
    #[inline]
    fn host<const BOUND: bool>(&mut self, rel: i64, tally: &mut Tally) -> Result<i128, Unmapped> {
        match self.in_piece::<BOUND>(rel) {
            Some(ps) => Ok(ps),
            None => self.host_next::<BOUND>(rel, tally),
        }
    }

    /// `rel` through the current piece, if it holds there in i64.
    #[inline]
    fn in_piece<const BOUND: bool>(&mut self, rel: i64) -> Option<i128> {
        let p = self.piece.as_ref().filter(|p| p.contains(rel))?;
        let (step, bound) = p.eval::<BOUND>(rel)?;
        // NaN (a bound of 0) never counts, as with `f64::max`.
        if BOUND && bound > self.worst {
            self.worst = bound;
        }
        Some(self.base_ps + i128::from(rel) + i128::from(step))
    }

    /// [`Self::host`] outside the piece: the next piece, else the long way.
    #[inline(never)]
    fn host_next<const BOUND: bool>(
        &mut self,
        rel: i64,
        tally: &mut Tally,
    ) -> Result<i128, Unmapped> {
        let seg = self.tl.node.segment(self.line_ps + i128::from(rel));
        self.piece = seg.near(self.line_ps);
        if let Some(p) = &self.piece {
            self.base_ps = self.line_ps + p.anchor_offset_ps() - self.tl.origin_ps;
        }
        match self.in_piece::<BOUND>(rel) {
            Some(ps) => Ok(ps),
            None => self.host_wide::<BOUND>(i128::from(rel), tally),
        }
    }

    /// The long way: [`Timeline::place`].
    #[inline(never)]
    fn host_wide<const BOUND: bool>(
        &mut self,
        rel: i128,
        tally: &mut Tally,
    ) -> Result<i128, Unmapped> {
        let p = self.tl.place(None, self.line_ps + rel)?;
        if BOUND {
            tally.add(p);
        }
        Ok(p.ps)
    }

    /// Folds the bounds kept unrounded into `tally`.
    fn finish(&self, tally: &mut Tally) {
        if self.worst > f64::NEG_INFINITY {
            tally.add(Placed {
                ps: 0,
                bound_ns: round_bound_ns(self.worst),
                node_bound_known: self.tl.node.bound_known(),
            });
        }
    }
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

/// Walk A's result for a line with timed events.
struct LineSizing {
    new_ts_ns: i64,
    new_duration_ps: Option<i64>,
    /// The new content length, when walk A could count it: every event's
    /// offset was counted from the line's placed start, which turned out
    /// to be its new timestamp (no event placed before it).
    new_len: Option<u64>,
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

/// Walk A: places every time of a line (fail closed), decides its new
/// timestamp and duration, and counts its new length when it can; `None`
/// when the line has no timed events.
fn plan_line(
    r: &mut WireReader,
    line: &LineInfo,
    tl: &Timeline<'_>,
    tally: &mut Tally,
    buf: &mut Vec<u8>,
) -> Result<Option<LineSizing>, WalkError> {
    r.seek_to(line.content_start)?;
    let end = line.content_end;
    let line_ps = tl.line_start_ps(line.timestamp_ns);
    let placed_start = tl.place(tl.choose(line_ps)?, line_ps)?;
    // Events rarely start before their line: count sizes against its start.
    let guess_ts = i64::try_from(placed_start.ps.div_euclid(1000))
        .map_err(|_| Unmapped::at(line_ps, "placed time out of range"))?;
    let (mut earliest, mut timed, mut line_dur) = (i128::MAX, 0u64, None);
    let (mut dur_fields, mut dur_bytes, mut delta, mut counted) = (0u64, 0u64, 0i64, true);
    let mut line_tally = Tally::default();
    let mut placer = LinePlacer::new(tl, line_ps);
    let guess = (guess_ts, i128::from(guess_ts) * 1000);
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        match (field, wire) {
            (xline::DURATION_PS, VARINT) => {
                let at = r.pos();
                line_dur = Some(r.read_varint()? as i64);
                dur_fields += 1;
                dur_bytes += r.pos() - at;
            }
            (xline::EVENTS, LEN) => {
                let n = r.read_len(end)?;
                let t = read_event(r, n, buf, event_times)??;
                if t.aggregated {
                    continue;
                }
                let (a, (offset, duration)) = placer.event::<true>(&t, guess, &mut line_tally)?;
                earliest = earliest.min(a);
                timed += 1;
                counted &= a >= placed_start.ps;
                let new_n = new_event_len(n, &t, offset, duration);
                delta += (varint_len(new_n) + new_n) as i64 - (varint_len(n) + n) as i64;
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    if timed == 0 {
        return Ok(None);
    }
    placer.finish(&mut line_tally);
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
    let new_len = (counted && new_ts == guess_ts).then(|| {
        let ts_change = if line.ts_fields.is_empty() {
            1 + varint_len(new_ts as u64) as i64
        } else {
            line.ts_fields
                .iter()
                .map(|f| varint_len(new_ts as u64) as i64 - i64::from(f.len))
                .sum()
        };
        let dur_change = new_dur.map_or(0, |d| {
            (dur_fields * varint_len(d as u64)) as i64 - dur_bytes as i64
        });
        ((end - line.content_start) as i64 + delta + ts_change + dur_change) as u64
    });
    Ok(Some(LineSizing {
        new_ts_ns: new_ts,
        new_duration_ps: new_dur,
        new_len,
    }))
}

fn to_i64(ps: i128, device_ps: i128) -> Result<i64, Unmapped> {
    i64::try_from(ps.max(0)).map_err(|_| Unmapped::at(device_ps, "placed time out of range"))
}

/// Copies `[from, r.pos())` again (just parsed, still buffered).
fn recopy(r: &mut WireReader, from: u64, out: &mut Vec<u8>) -> Result<(), TraceError> {
    let n = r.pos() - from;
    r.seek_to(from)?;
    r.copy_to(n, out)
}

/// Calls `f` on the next `n` bytes (one event) and the file position of
/// the first, parsed in the reader's buffer (`buf` for one larger than it).
#[inline]
fn read_event<R>(
    r: &mut WireReader,
    n: u64,
    buf: &mut Vec<u8>,
    f: impl FnOnce(&[u8], u64) -> R,
) -> Result<R, TraceError> {
    let base = r.pos();
    if let Some(bytes) = r.peek(n)? {
        let out = f(bytes, base);
        r.consume(n);
        return Ok(out);
    }
    r.read_into(n, buf)?;
    Ok(f(buf, base))
}

/// Reusable buffers of the writing walks: an event larger than the
/// reader's buffer, and the output collected for one write.
#[derive(Default)]
struct Scratch {
    event: Vec<u8>,
    encoded: Vec<u8>,
}

/// Output collected before one write (a few events' worth).
const WRITE_CHUNK: usize = 64 << 10;

/// Walk C (and B, into a counter): writes the line's new content. Other
/// fields, unknown ones included, are copied byte for byte.
fn write_line(
    r: &mut WireReader,
    plan: &LinePlan,
    tl: &Timeline<'_>,
    scratch: &mut Scratch,
    out: &mut dyn Write,
) -> Result<(), WalkError> {
    r.seek_to(plan.start)?;
    let end = plan.start + plan.len;
    let line_ps = tl.line_start_ps(plan.old_ts_ns);
    let mut placer = LinePlacer::new(tl, line_ps);
    let new_ts = (plan.new_ts_ns, i128::from(plan.new_ts_ns) * 1000);
    let mut unused = Tally::default();
    let Scratch { event, encoded } = scratch;
    let enc = encoded;
    enc.clear();
    if !plan.has_ts {
        put_varint(enc, u64::from(fields::key(xline::TIMESTAMP_NS, VARINT)));
        put_varint(enc, plan.new_ts_ns as u64);
    }
    while r.pos() < end {
        if enc.len() >= WRITE_CHUNK {
            out.write_all(enc).map_err(TraceError::io)?;
            enc.clear();
        }
        let from = r.pos();
        let (field, wire) = r.read_key()?;
        match (field, wire, plan.new_duration_ps) {
            (xline::TIMESTAMP_NS, VARINT, _) => {
                recopy(r, from, enc)?;
                r.read_varint()?;
                put_varint(enc, plan.new_ts_ns as u64);
            }
            (xline::DURATION_PS, VARINT, Some(dur)) => {
                recopy(r, from, enc)?;
                r.read_varint()?;
                put_varint(enc, dur as u64);
            }
            (xline::EVENTS, LEN, _) => {
                if r.pos() - from == 1 {
                    enc.push(fields::key(xline::EVENTS, LEN));
                } else {
                    recopy(r, from, enc)?;
                }
                let n = r.read_len(end)?;
                read_event(r, n, event, |bytes, base| {
                    write_event(bytes, base, new_ts, &mut placer, &mut unused, enc)
                })??;
            }
            _ => {
                r.skip_value(wire, end)?;
                recopy(r, from, enc)?;
            }
        }
    }
    out.write_all(enc).map_err(TraceError::io)?;
    enc.clear();
    Ok(())
}

/// Appends one event (length prefix included) with its offset and
/// duration placed relative to the new line start.
#[inline]
fn write_event(
    bytes: &[u8],
    base: u64,
    new_ts: (i64, i128),
    placer: &mut LinePlacer<'_, '_>,
    unused: &mut Tally,
    enc: &mut Vec<u8>,
) -> Result<(), WalkError> {
    let t = event_times(bytes, base)?;
    if t.aggregated {
        put_varint(enc, bytes.len() as u64);
        enc.extend_from_slice(bytes);
    } else {
        let (_, times) = placer.event::<false>(&t, new_ts, unused)?;
        encode_event(bytes, base, &t, times, enc)?;
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
    scratch: Scratch,
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
        write_line(r, plan, tl, &mut self.scratch, out).map_err(|e| match e {
            WalkError::Trace(t) => t,
            // Planning placed every time already: only a changed file gets here.
            WalkError::Unmapped(_) => TraceError::Changed,
        })
    }
}

/// Inputs of [`plan_host`] shared by all hosts.
pub struct DeviceContext<'a> {
    pub maps: &'a DeviceMapIndex<'a>,
    pub origin_ns: i64,
}

/// Plans one host's per-event placement (walks A and B): device-mapped
/// planes always, host-clock planes when the host's map is not one
/// constant. Every time is placed here, before any output exists, so a
/// time outside the maps fails the merge with nothing written.
pub fn plan_host<'a>(
    scan: &Scan,
    place: &mut HostPlacement,
    ctx: &DeviceContext<'a>,
) -> Result<HostDevices<'a>, MergeError> {
    let mut out = HostDevices {
        mapped: vec![false; scan.lines.len()],
        ..HostDevices::default()
    };
    let per_event = !place.map.is_constant();
    if place.device_planes.is_empty() && !per_event {
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
    let mut device_planes = std::mem::take(&mut place.device_planes);
    for report in &mut device_planes {
        let tl =
            timeline(scan, &place.host, &place.map, report, ctx).map_err(MergeError::Device)?;
        let tally = match out.plan_plane(&mut r, scan, report.plane_index, tl) {
            Ok(t) => t,
            Err(WalkError::Trace(e)) => return Err(file_err(e)),
            Err(WalkError::Unmapped(u)) => {
                return Err(MergeError::Device(Box::new(DeviceError::Unmapped {
                    path: path.clone(),
                    plane: report.plane.clone(),
                    host: place.host.clone(),
                    device: report.device.clone(),
                    device_ns: u.device_ns,
                    what: u.what,
                    coverage: out
                        .timelines
                        .last()
                        .map_or_else(String::new, |t| t.coverage()),
                })));
            }
        };
        report.lines_mapped = tally.lines;
        report.events_mapped = tally.events;
        report.worst_bound_ns = tally.worst_bound_ns;
        report.node_bound_known = tally.node_bound_known;
        if tally.lines > 0 {
            place.note_bound(report.plane_index, tally.worst_bound_ns);
        }
    }
    place.device_planes = device_planes;
    if per_event {
        for index in 0..scan.planes.len() {
            if place.device_planes.iter().any(|d| d.plane_index == index) {
                continue;
            }
            let tl = Timeline::host(place.map.clone(), scan.profile_start_ns(), ctx.origin_ns);
            let tally = out
                .plan_plane(&mut r, scan, index, tl)
                .map_err(|e| match e {
                    WalkError::Trace(e) => file_err(e),
                    WalkError::Unmapped(u) => file_err(TraceError::malformed(0, u.what)),
                })?;
            place.events_placed += tally.events;
            if tally.lines > 0 {
                place.note_bound(index, tally.worst_bound_ns);
            }
        }
    }
    Ok(out)
}

impl<'a> HostDevices<'a> {
    /// Plans every line of plane `index` with timed events through `tl`
    /// (kept as this host's next timeline).
    fn plan_plane(
        &mut self,
        r: &mut WireReader,
        scan: &Scan,
        index: usize,
        tl: Timeline<'a>,
    ) -> Result<Tally, WalkError> {
        let ti = self.timelines.len();
        self.timelines.push(tl);
        let tl = &self.timelines[ti];
        let mut tally = Tally::default();
        for (li, line) in scan.lines.iter().enumerate() {
            if line.plane != index {
                continue;
            }
            let Some(p) = plan_line(r, line, tl, &mut tally, &mut self.scratch.event)? else {
                continue;
            };
            let (plan, region) = size_line(r, ti, line, p, tl, &mut self.scratch)?;
            self.mapped[li] = true;
            tally.lines += 1;
            self.regions.push(Region {
                id: self.lines.len(),
                ..region
            });
            self.lines.push(plan);
        }
        Ok(tally)
    }
}

/// The line's new length: walk A's count, or walk B, writing it into a
/// counter (a line with an event placed before its own start).
fn size_line(
    r: &mut WireReader,
    ti: usize,
    line: &LineInfo,
    sizing: LineSizing,
    tl: &Timeline<'_>,
    scratch: &mut Scratch,
) -> Result<(LinePlan, Region), WalkError> {
    let len = line.content_end - line.content_start;
    let plan = LinePlan {
        timeline: ti,
        start: line.content_start,
        len,
        old_ts_ns: line.timestamp_ns,
        has_ts: !line.ts_fields.is_empty(),
        new_ts_ns: sizing.new_ts_ns,
        new_duration_ps: sizing.new_duration_ps,
    };
    let new_len = match sizing.new_len {
        Some(n) => n,
        None => {
            let mut counter = Counting {
                inner: std::io::sink(),
                written: 0,
            };
            write_line(r, &plan, tl, scratch, &mut counter)?;
            counter.written
        }
    };
    let region = Region {
        start: plan.start,
        len,
        delta: new_len as i64 - len as i64,
        id: 0,
    };
    Ok((plan, region))
}

fn timeline<'a>(
    scan: &Scan,
    host: &str,
    node: &Arc<HostMap>,
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
    // A counter clock (all maps below epoch-like values) never reaches the
    // session start, so XLA left its values raw.
    let counter = maps
        .entries()
        .iter()
        .all(|e| e.map.valid_until_device_ns < ABSOLUTE_THRESHOLD_NS as u64);
    Ok(Timeline {
        maps: Some(maps),
        node: node.clone(),
        piece: RefCell::new(None),
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
    use crate::wire::put_varint;
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

    /// Host "h" of the file at `path`, placed through `map`, nothing done yet.
    fn test_placement(path: &std::path::Path, scan: &Scan, map: Arc<HostMap>) -> HostPlacement {
        HostPlacement {
            host: "h".into(),
            input: path.to_path_buf(),
            output: "h.xplane.pb".into(),
            start_ns: S,
            stop_ns: None,
            offset_ns: 0,
            source: crate::OffsetSource::Flag,
            map,
            shift_ns: 0,
            lines_absolute: 0,
            events_placed: 0,
            plane_bounds: vec![None; scan.planes.len()],
            device_planes: Vec::new(),
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
        let maps = DeviceMapIndex::new(&entries);
        let mut place = HostPlacement {
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
            ..test_placement(&path, &scan, Arc::new(HostMap::fixed(0)))
        };
        let ctx = DeviceContext {
            maps: &maps,
            origin_ns: S,
        };
        let mut dev = plan_host(&scan, &mut place, &ctx).unwrap();
        assert_eq!(place.device_planes[0].events_mapped, 4);
        let (edits, _) = host_edits_except(&scan, &mut place, S, |i| dev.is_mapped(i));
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

    /// A host clock drifting at −50 ppm with anchors 4 s apart whose
    /// offsets, bounds and bound growth all differ.
    fn drifting_map() -> HostMap {
        let a = |k: i64, offset_ns, bound_ns, bound_growth_ppb| clockmesh_offsets::Anchor {
            at_ns: S + k * 4_000_000_000,
            offset_ns,
            drift_ppb: -50_000.0,
            bound_ns,
            bound_growth_ppb,
        };
        HostMap::new(vec![
            a(-1, -123_000_000, 100, 10.0),
            a(0, -123_000_201, 150, 20.0),
            a(1, -123_000_399, 90, 0.0),
            a(2, -123_000_602, 300, 1e3),
        ])
        .unwrap()
    }

    /// The line placer's i64 path, its next-piece and long-way fallbacks
    /// and its deferred bound rounding give `place_event`'s values, errors
    /// and worst bound exactly.
    #[test]
    fn the_line_placer_agrees_with_place_event_everywhere() {
        let wild = clockmesh_offsets::Anchor {
            at_ns: S,
            offset_ns: 7,
            drift_ppb: 10.0,
            bound_ns: 5,
            bound_growth_ppb: f64::INFINITY, // NaN bound at the anchor itself
        };
        let maps = [
            drifting_map(),
            HostMap::new(vec![wild]).unwrap(),
            drifting_map().without_bound(),
        ];
        let s4 = 4_000_000_000_000i64; // one window, ps
        let mut offsets = vec![0, 1, -1, 999, s4 - 1, s4, -s4, 1 << 62, -(1 << 62)];
        offsets.extend([i64::MAX, i64::MIN, i64::MAX - 5, i64::MIN + 5]);
        // Back and forth across the pieces, in uneven steps.
        offsets.extend((0..200).map(|k| (k * 7_919 % 200 - 60) * 123_456_789_011));
        let durations = [0, 1, -5, 2 * s4 + 3, i64::MAX, i64::MIN];
        for map in maps {
            let tl = Timeline::host(Arc::new(map), Some(S), S - 5);
            for line_ts in [0, 3_999_999_999, -2_000_000_000_000, S + 17] {
                let line_ps = tl.line_start_ps(line_ts);
                let new_ts_ns = line_ts - 7;
                let new_ts = (new_ts_ns, i128::from(new_ts_ns) * 1000);
                let mut placer = LinePlacer::new(&tl, line_ps);
                let mut unbound = LinePlacer::new(&tl, line_ps);
                let (mut fast, mut slow, mut none) =
                    (Tally::default(), Tally::default(), Tally::default());
                let mut ok = 0;
                for &offset_ps in &offsets {
                    for &duration_ps in &durations {
                        let t = EventTimes {
                            offset_ps,
                            duration_ps,
                            ..EventTimes::default()
                        };
                        let want = place_event(&t, line_ps, new_ts_ns, &tl);
                        let at = format!("line {line_ts}, event {offset_ps} + {duration_ps}");
                        let got = unbound.event::<false>(&t, new_ts, &mut none);
                        assert_eq!(got.is_ok(), want.is_ok(), "{at}");
                        match want {
                            Ok((a, b, times)) => {
                                assert_eq!(got.unwrap(), (a.ps, times), "{at}");
                                let got = placer.event::<true>(&t, new_ts, &mut fast).unwrap();
                                assert_eq!(got, (a.ps, times), "{at}");
                                slow.add(a);
                                slow.add(b);
                                ok += 1;
                            }
                            // A refused event fails the merge: its bounds
                            // never count, so try it on a copy.
                            Err(_) => {
                                let mut copy = placer.clone();
                                assert!(
                                    copy.event::<true>(&t, new_ts, &mut Tally::default())
                                        .is_err()
                                );
                            }
                        }
                    }
                }
                assert!(ok > 1000, "{ok}");
                placer.finish(&mut fast);
                assert_eq!(fast.worst_bound_ns, slow.worst_bound_ns, "line {line_ts}");
                assert_eq!(fast.node_bound_known, slow.node_bound_known);
            }
        }
    }

    /// A drifting host-clock line longer than the write chunk and the
    /// reader's buffer, with an event larger than that buffer: every
    /// event lands where the host map puts its start and end, and every
    /// other byte is kept.
    #[test]
    fn a_long_drifting_line_with_an_event_larger_than_the_buffer() {
        let step = 123_456_789; // ps: 100k events span 12.3 s, four pieces
        let mut events: Vec<XEvent> = (0..100_000i64)
            .map(|k| event((k % 3 != 0).then_some(k * step), k % 1_000 * 997))
            .collect();
        let big = vec![0x5a; 1_300_000];
        events[50_000].stats.push(clockmesh_proto::xplane::XStat {
            metadata_id: 1,
            value: Some(clockmesh_proto::xplane::x_stat::Value::BytesValue(
                big.clone(),
            )),
        });
        let line = XLine {
            id: 1,
            timestamp_ns: 2_000_000_000,
            duration_ps: 12_400_000_000_000,
            events,
            ..Default::default()
        };
        let plane = XPlane {
            id: 1,
            name: "/host:CPU".into(),
            lines: vec![line.clone()],
            ..Default::default()
        };
        let spec = SynthSpec {
            start_ns: S,
            ..SynthSpec::default()
        };
        let space = XSpace {
            planes: vec![plane, task_env_plane(&spec)],
            ..Default::default()
        };
        let input = space.encode_to_vec();
        let dir = std::env::temp_dir().join(format!("cm-long-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("h.xplane.pb");
        std::fs::write(&path, &input).unwrap();
        let scan = scan_file(&path).unwrap();
        let map = Arc::new(drifting_map());
        let mut place = test_placement(&path, &scan, map.clone());
        let origin = S - 200_000_000;
        let entries = [];
        let maps = DeviceMapIndex::new(&entries);
        let ctx = DeviceContext {
            maps: &maps,
            origin_ns: origin,
        };
        let mut dev = plan_host(&scan, &mut place, &ctx).unwrap();
        assert_eq!(place.events_placed, 100_000);
        let (edits, _) = host_edits_except(&scan, &mut place, origin, |i| dev.is_mapped(i));
        let plan = Plan::new(edits, dev.regions(), scan.frames());
        let mut r = WireReader::new(File::open(&path).unwrap()).unwrap();
        let mut out = Vec::new();
        rewrite_with(&mut r, &plan, &mut dev, &mut out, &mut |_| {}).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(out.len() as u64, plan.output_len(input.len() as u64));

        let placed =
            |local_ps: i128| map.to_global_ps(local_ps).global_ps - i128::from(origin) * 1000;
        let line_ps = i128::from(S + line.timestamp_ns) * 1000;
        let got = &XSpace::decode(out.as_slice()).unwrap().planes[0].lines[0];
        let new_ps = i128::from(got.timestamp_ns) * 1000;
        assert_eq!(new_ps, placed(line_ps).div_euclid(1000) * 1000);
        assert_eq!(
            i128::from(got.duration_ps),
            placed(line_ps + 12_400_000_000_000) - new_ps
        );
        let mut stretched = 0;
        for (old, new) in line.events.iter().zip(&got.events) {
            // An offset of 0 absent before stays absent.
            let o = match new.data {
                Some(x_event::Data::OffsetPs(o)) => o,
                None => 0,
                other => panic!("{other:?}"),
            };
            let old_offset = match old.data {
                Some(x_event::Data::OffsetPs(o)) => o,
                _ => 0,
            };
            let start = line_ps + i128::from(old_offset);
            let end = start + i128::from(old.duration_ps);
            assert_eq!(new_ps + i128::from(o), placed(start));
            assert_eq!(i128::from(new.duration_ps), placed(end) - placed(start));
            stretched += usize::from(new.duration_ps != old.duration_ps);
            assert_eq!((new.metadata_id, &new.stats), (old.metadata_id, &old.stats));
        }
        assert!(stretched > 1_000, "{stretched}");
    }

    #[test]
    fn event_times_last_field_wins_and_bad_wire_types_are_refused() {
        // offset 7, then num_occurrences: aggregated; then offset again: timed.
        let bytes = [0x10, 7, 0x28, 3, 0x10, 9, 0x18, 4];
        assert!(event_times(&bytes[..4], 0).unwrap().aggregated);
        let t = event_times(&bytes, 0).unwrap();
        assert!(!t.aggregated);
        assert_eq!((t.offset_ps, t.duration_ps, t.offset_fields), (9, 4, 2));
        let e = event_times(&[0x12, 1, 0], 100).unwrap_err(); // offset_ps as bytes
        assert!(e.to_string().contains("byte 101"), "{e}");
        // A field running past the event: refused, not read beyond it.
        assert!(event_times(&[0x1a, 5, 0], 0).is_err());
        assert!(event_times(&[0x10, 0x80], 0).is_err());
    }

    #[test]
    fn counted_event_lengths_match_the_encoding() {
        let events: [&[u8]; 4] = [
            &[0x08, 1, 0x10, 7, 0x18, 4],          // id, offset, duration
            &[0x08, 1],                            // no times at all
            &[0x10, 0x80, 0x01, 0x10, 2, 0x18, 0], // two offsets, zero duration
            &[0x18, 9, 0x22, 2, 1, 2],             // duration and a stat
        ];
        for bytes in events {
            let t = event_times(bytes, 0).unwrap();
            for times in [(0, 0), (1, 1), (300, 1 << 40), (0, 5)] {
                let mut out = Vec::new();
                encode_event(bytes, 0, &t, times, &mut out).unwrap();
                let n = new_event_len(bytes.len() as u64, &t, times.0, times.1);
                assert_eq!(out.len() as u64, varint_len(n) + n, "{bytes:?} {times:?}");
            }
        }
    }
}
