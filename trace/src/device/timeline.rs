//! A plane's clock to global time: a device's maps to host time, then the host's map, with each time's bound.

use std::cell::RefCell;
use std::sync::Arc;

use super::DevResult;
use super::host::DeviceContext;
use crate::plan::{ABSOLUTE_THRESHOLD_NS, DeviceError, DevicePlaneReport};
use crate::scan::Scan;
use clockmesh_offsets::history::{DeviceHistoryEntry, DeviceMaps};
use clockmesh_offsets::{GlobalTime, HostMap, PublishedDeviceMap, Segment};

/// The device map one time (and the end of its event) goes through;
/// `None` on a host-clock plane.
type Choice<'a> = Option<&'a DeviceHistoryEntry>;

/// A time that cannot be placed, and why.
#[derive(Debug)]
pub(super) struct Unmapped {
    pub(super) device_ns: i128,
    pub(super) what: &'static str,
}

impl Unmapped {
    pub(super) fn at(device_ps: i128, what: &'static str) -> Self {
        Self {
            device_ns: device_ps.div_euclid(1000),
            what,
        }
    }
}

/// A placed time: ps after the global origin, and its error bound.
#[derive(Clone, Copy, Debug)]
pub(super) struct Placed {
    pub(super) ps: i128,
    pub(super) bound_ns: u64,
    pub(super) node_bound_known: bool,
}

/// A plane's clock → global time: through a device's maps to host time
/// (device planes), then the host's map (every plane).
pub(super) struct Timeline<'a> {
    /// `None`: the plane is already in host CLOCK_REALTIME.
    pub(super) maps: Option<&'a DeviceMaps<'a>>,
    pub(super) node: Arc<HostMap>,
    /// The piece of `node` used last: a line's events are close in time.
    piece: RefCell<Option<Segment>>,
    /// What XLA subtracted from line timestamps at or after the session
    /// start (`profile_start_time`); `None` for clocks whose values never
    /// reach it (counters), which XLA leaves raw.
    session_start_ns: Option<i64>,
    pub(super) origin_ps: i128,
}

const OUTSIDE: &str = "outside every published map";

impl<'a> Timeline<'a> {
    /// A host-clock plane's timeline.
    pub(super) fn host(node: Arc<HostMap>, session_start_ns: Option<i64>, origin_ns: i64) -> Self {
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
    pub(super) fn line_start_ps(&self, ts_ns: i64) -> i128 {
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
    pub(super) fn choose(&self, device_ps: i128) -> Result<Choice<'a>, Unmapped> {
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
    pub(super) fn place(&self, c: Choice<'a>, time_ps: i128) -> Result<Placed, Unmapped> {
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
    pub(super) fn span(&self, start_ps: i128, end_ps: i128) -> Result<(Placed, Placed), Unmapped> {
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
    pub(super) fn coverage(&self) -> String {
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
pub(super) struct Tally {
    pub(super) lines: u64,
    pub(super) events: u64,
    pub(super) worst_bound_ns: u64,
    pub(super) node_bound_known: bool,
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
    pub(super) fn add(&mut self, p: Placed) {
        self.worst_bound_ns = self.worst_bound_ns.max(p.bound_ns);
        self.node_bound_known &= p.node_bound_known;
    }
}

pub(super) fn timeline<'a>(
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
