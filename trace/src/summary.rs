//! What a merge did, per host, as JSON (`clockmesh trace merge --summary
//! FILE`): the text summary's figures for tools — `clockmesh report
//! --merge-summary` shows them beside the agents' history.

use serde::{Deserialize, Serialize};

use crate::merge::MergeReport;
use crate::plan::HostPlacement;

/// The summary of one merge.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MergeSummary {
    /// The merged run directory.
    pub run_dir: String,
    /// Global time of the merged run's zero, ns.
    pub origin_ns: i64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub hosts: Vec<HostSummary>,
}

/// One host of a merge.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostSummary {
    pub host: String,
    /// Where the host's map came from: `history`, `hook records`,
    /// `--offset` or `ASSUMED 0`.
    pub source: String,
    /// global − local at the session start, ns.
    pub offset_ns: i64,
    /// The offset's mean drift over the session, ppb.
    pub drift_ppb: f64,
    /// Worst alignment bound over the session; `None`: no bound (`--offset`).
    pub worst_bound_ns: Option<u64>,
    /// Anchors of the host's map (history entries or hook records).
    pub anchors: usize,
    /// Events placed one by one (0: lines shifted whole).
    pub events_placed: u64,
    pub device_planes: Vec<DevicePlaneSummary>,
}

/// One plane placed through a GPU's device map.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DevicePlaneSummary {
    pub plane: String,
    pub device: String,
    pub events_mapped: u64,
    /// Device map bound plus node bound, worst over the mapped times.
    pub worst_bound_ns: u64,
}

impl MergeSummary {
    pub fn of(report: &MergeReport) -> Self {
        Self {
            run_dir: report.run_dir.display().to_string(),
            origin_ns: report.origin_ns,
            bytes_in: report.bytes_in,
            bytes_out: report.bytes_out,
            hosts: report.hosts.iter().map(HostSummary::of).collect(),
        }
    }
}

impl HostSummary {
    fn of(h: &HostPlacement) -> Self {
        Self {
            host: h.host.clone(),
            source: h.source.describe().into(),
            offset_ns: h.offset_ns,
            drift_ppb: h.mean_drift_ppb(),
            worst_bound_ns: h.worst_bound_ns(),
            anchors: h.map.anchors().len(),
            events_placed: h.events_placed,
            device_planes: h
                .device_planes
                .iter()
                .map(|d| DevicePlaneSummary {
                    plane: d.plane.clone(),
                    device: d.device.clone(),
                    events_mapped: d.events_mapped,
                    worst_bound_ns: d.worst_bound_ns,
                })
                .collect(),
        }
    }
}
