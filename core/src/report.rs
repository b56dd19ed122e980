//! What a node reports about its work: the last fit of each out-edge
//! (`/status`), the JSONL edge line, and how long fits and solves took.

use clockmesh_estimator::convert::{count_f64, count_u32, unsigned_ns_f64};
use clockmesh_estimator::{EdgeMeasurement, NodeId};
use serde::{Deserialize, Serialize};

/// The last window's fit of an out-edge (`clock_peer − clock_self`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct EdgeStatus {
    pub window: u64,
    pub offset_ns: Option<i64>,
    pub drift_ppb: Option<f64>,
    pub bound_ns: Option<f64>,
    pub min_rtt_ns: Option<f64>,
    pub probes: u64,
    pub pure: u64,
    pub error: Option<String>,
    /// Windows of probes the fit spans (its history, `core/src/history.rs`).
    pub history_windows: usize,
    /// Windows its drift spans: `history_windows`, or more with NIC stamps.
    pub drift_windows: usize,
    /// `nic` or `software`: the stamps the fit used, which set its purity.
    pub stamps: String,
    pub purity_tolerance_ns: i64,
}

impl EdgeStatus {
    /// Pure pairs over pairs received, 0 when none.
    pub fn pure_ratio(&self) -> f64 {
        if self.probes == 0 {
            0.0
        } else {
            unsigned_ns_f64(self.pure) / unsigned_ns_f64(self.probes)
        }
    }
}

/// How long the node's own work took (CPU, not time of day).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct Timings {
    pub last_fit_us: u64,
    pub last_solve_us: u64,
    pub windows: u64,
    pub solves: u64,
}

/// One JSONL line per edge fit (`"type": "edge"`; written by the agent,
/// read back by `clockmesh report`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename = "edge")]
pub struct EdgeLine {
    pub window: u64,
    pub node: String,
    pub from: String,
    pub to: String,
    pub from_id: NodeId,
    pub to_id: NodeId,
    pub probes_forward: usize,
    pub probes_backward: usize,
    pub pure_forward: usize,
    pub pure_backward: usize,
    /// Pairs rejected: a packet missing, TX gap off the nominal spacing, RX gap ≠ TX gap.
    pub incomplete: usize,
    pub spacing_rejected: usize,
    pub impure: usize,
    /// Windows of probes the fit spans (its history).
    pub history_windows: usize,
    /// Windows its drift spans: `history_windows`, or more with NIC stamps
    /// (0 in lines written before it was recorded).
    #[serde(default)]
    pub drift_windows: usize,
    /// `nic` or `software`: the stamps the fit used, which set its purity.
    pub stamps: String,
    pub purity_tolerance_ns: i64,
    pub fit: Option<FitLine>,
    pub error: Option<String>,
}

/// The fit of an edge line: `clock_to − clock_from = offset_ns + offset_frac_ns
/// + drift_ppb·(t − anchor_ns)/1e9`, `t` on the `from` clock.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FitLine {
    pub anchor_ns: i64,
    pub offset_ns: i64,
    pub offset_frac_ns: f64,
    pub drift_ppb: f64,
    pub bound_ns: f64,
    pub drift_bound_ppb: f64,
    pub margin_ns: f64,
    pub min_rtt_ns: f64,
    pub forward_points: u32,
    pub backward_points: u32,
    pub trimmed: u32,
    pub span_ns: i64,
}

impl EdgeLine {
    /// Pure first packets over complete probes, both directions; `None`
    /// without probes.
    pub fn pure_ratio(&self) -> Option<f64> {
        let probes = self.probes_forward + self.probes_backward;
        let pure = self.pure_forward + self.pure_backward;
        (probes > 0).then(|| count_f64(pure) / count_f64(probes))
    }
}

impl From<&EdgeMeasurement> for FitLine {
    fn from(m: &EdgeMeasurement) -> Self {
        let f = &m.fit;
        FitLine {
            anchor_ns: f.epoch_ns,
            offset_ns: f.offset_base_ns,
            offset_frac_ns: f.offset_rel_ns,
            drift_ppb: f.drift * 1e9,
            bound_ns: f.bound_ns,
            drift_bound_ppb: f.drift_bound * 1e9,
            margin_ns: f.margin_ns,
            min_rtt_ns: f.min_rtt_ns,
            forward_points: count_u32(f.forward_points),
            backward_points: count_u32(f.backward_points),
            trimmed: count_u32(f.trimmed),
            span_ns: f.span_ns,
        }
    }
}
