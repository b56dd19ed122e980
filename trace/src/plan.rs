//! The merge's placement vocabulary and errors, shared by the host-plane
//! merge (`merge`), the device-clock planes (`device`) and the Chrome JSON
//! writer (`perfetto`): each of those depends on this module, never on each
//! other's internals.

use clockmesh_offsets::LocalNs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clockmesh_offsets::HostMap;

use super::{FileError, TraceError};

/// Timestamps at or above this (2001-09-09 in epoch ns) are absolute epoch
/// values; session-relative ones never get near it.
pub const ABSOLUTE_THRESHOLD_NS: i64 = 1_000_000_000_000_000_000;

/// Where a host's offset came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetSource {
    /// `--offset host=ns`.
    Flag,
    /// The hook's / JAX helper's records at session start (and stop).
    Hook,
    /// The agent's JSONL history: one anchor per estimator window.
    History,
    /// None found and the caller allowed assuming 0.
    AssumedZero,
}

/// One host's placement on the global timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct HostPlacement {
    pub host: String,
    pub input: PathBuf,
    pub output: PathBuf,
    pub start_ns: i64,
    /// Session stop (`profile_stop_time`), local, if recorded.
    pub stop_ns: Option<i64>,
    /// global − local at the session start.
    pub offset_ns: i64,
    pub source: OffsetSource,
    /// The host's map local → global: every time of the host goes through it.
    pub map: Arc<HostMap>,
    /// Where the session start lands, ns after the origin.
    pub shift_ns: i64,
    pub lines_absolute: u64,
    /// Events of host-clock planes placed one by one through `map`; 0 when
    /// the map is one constant and lines are shifted whole.
    pub events_placed: u64,
    /// Worst bound of each plane (as in [`crate::Scan::planes`]); `None`
    /// for planes with nothing placed.
    pub plane_bounds: Vec<Option<u64>>,
    /// Planes placed through a GPU's device map instead of the shift.
    pub device_planes: Vec<DevicePlaneReport>,
}

impl HostPlacement {
    /// The worst bound over everything placed (the map's at the session
    /// start when nothing was); `None` when the offset has no bound.
    pub fn worst_bound_ns(&self) -> Option<u64> {
        if !self.map.bound_known() {
            return None;
        }
        let placed = self.plane_bounds.iter().flatten().copied().max();
        Some(placed.unwrap_or_else(|| self.map.to_global(LocalNs(self.start_ns)).bound_ns))
    }

    /// The offset's mean drift over the session, ppb (the first anchor's
    /// drift without a recorded stop).
    pub fn mean_drift_ppb(&self) -> f64 {
        match self.stop_ns {
            Some(stop) if stop > self.start_ns => {
                let change = self.map.offset_at(LocalNs(stop)).as_f64() - self.offset_ns as f64;
                change * 1e9 / (stop - self.start_ns) as f64
            }
            _ => self.map.anchors()[0].drift_ppb,
        }
    }

    /// Records that a placed time of plane `plane` has bound `bound_ns`.
    pub fn note_bound(&mut self, plane: usize, bound_ns: u64) {
        if let Some(slot) = self.plane_bounds.get_mut(plane) {
            *slot = Some(slot.map_or(bound_ns, |b| b.max(bound_ns)));
        }
    }
}

impl OffsetSource {
    /// How the merge summary names it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Flag => "--offset",
            Self::Hook => "hook records",
            Self::History => "history",
            Self::AssumedZero => "ASSUMED 0",
        }
    }
}

/// One device-mapped plane of a host, and what the merge did with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevicePlaneReport {
    /// Index in the host's [`Scan::planes`].
    pub plane_index: usize,
    pub plane: String,
    pub device: String,
    /// The plane's `clock_domain` stat, if it has one.
    pub declared_domain: Option<String>,
    /// The maps' `device_domain`.
    pub map_domain: String,
    /// Lines mapped through the device clock. Lines without timed events
    /// carry no device time worth mapping and are shifted like host lines.
    pub lines_mapped: u64,
    pub events_mapped: u64,
    /// Largest map bound (at its anchor) + node bound over the mapped times.
    pub worst_bound_ns: u64,
    /// False when the node offset has no bound (`--offset`, assumed 0).
    pub node_bound_known: bool,
}

/// Errors of a merge; per-file problems name the file.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("no .xplane.pb files found in {0}")]
    NoInputs(String),
    #[error(
        "{path}: no clock offset for host {host}; pass --offset {host}=NS, --history FILE, record the trace with the clockmesh hook, or --allow-missing-offsets"
    )]
    NoOffset { host: String, path: String },
    #[error(
        "host {host}: alignment bound {bound_ns} ns exceeds --max-bound {max_ns} ns; nothing was written"
    )]
    BoundExceeded {
        host: String,
        bound_ns: u64,
        max_ns: u64,
    },
    #[error(
        "host {host}: its offset ({from}) has no error bound, so --max-bound cannot be met; nothing was written"
    )]
    BoundUnknown { host: String, from: &'static str },
    #[error("{first} and {second} would both be written as {name}; merge them separately")]
    DuplicateOutput {
        name: String,
        first: String,
        second: String,
    },
    #[error("--offset names host {host}, which no input has (hosts: {hosts})")]
    UnknownOffsetHost { host: String, hosts: String },
    #[error("--perfetto {0} already exists (pass --force to replace it)")]
    PerfettoExists(String),
    #[error(
        "run name {0:?} must be one plain directory name (no '/', '.' or '..'): the run is written inside -o"
    )]
    BadRunName(String),
    #[error("output run directory {0} already exists")]
    OutputExists(String),
    #[error("writing output {path}: {error}")]
    Output { path: String, error: std::io::Error },
    #[error(transparent)]
    Device(#[from] Box<DeviceError>),
}

/// Why a device plane cannot be placed. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "{path}: plane {plane:?}: device time {device_ns} ns of {device} on host {host}: {what} ({coverage}); use --ignore-device-clocks to shift the plane by the node offset only"
    )]
    Unmapped {
        path: String,
        plane: String,
        host: String,
        device: String,
        device_ns: i128,
        what: &'static str,
        coverage: String,
    },
    #[error(
        "{path}: plane {plane:?} is in the clock of {device}, but the history has no map of {device} on host {host} (pass --history with the agent's \"device\" lines)"
    )]
    NoMaps {
        path: String,
        plane: String,
        host: String,
        device: String,
    },
    #[error(
        "{path}: plane {plane:?} declares clock_domain {declared:?}, but the maps of {device} on host {host} are in {published:?}"
    )]
    DomainMismatch {
        path: String,
        plane: String,
        host: String,
        device: String,
        declared: String,
        published: String,
    },
    #[error(
        "{path}: the maps of {device} on host {host} target {host_domain}; only {realtime} maps compose with the node offset"
    )]
    HostDomain {
        path: String,
        host: String,
        device: String,
        host_domain: String,
        realtime: &'static str,
    },
    #[error(
        "{path}: plane {plane:?} declares clock_domain {domain:?} but no clock_device stat; name its device with --device-clock {host}:{plane}=DEVICE, or pass --ignore-device-clocks"
    )]
    NoDevice {
        path: String,
        host: String,
        plane: String,
        domain: String,
    },
    #[error("--device-clock {first} and {second} both name plane {plane:?} of host {host}")]
    Conflict {
        host: String,
        plane: String,
        first: String,
        second: String,
    },
    #[error("--device-clock {spec}: no such plane in {hosts}")]
    Unused { spec: String, hosts: String },
}

pub(crate) fn file_err(path: &Path) -> impl Fn(TraceError) -> MergeError + '_ {
    move |error| {
        MergeError::File(FileError {
            path: path.display().to_string(),
            error,
        })
    }
}
