//! One host's planning: its device-mapped (and per-event host-clock) lines placed, and the regions the rewrite writes.

use std::fs::File;
use std::io::Write;

use super::timeline::{Tally, Timeline, timeline};
use super::walk::{LinePlan, Scratch, WalkError, plan_line, size_line, write_line};
use crate::plan::{DeviceError, HostPlacement, MergeError};
use crate::rewrite::{Region, RegionWriter};
use crate::scan::Scan;
use crate::wire::WireReader;
use crate::{FileError, TraceError};
use clockmesh_offsets::history::DeviceMapIndex;

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
