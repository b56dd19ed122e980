//! What a node publishes for each of its results, built here whole so that
//! the driver only writes it and the simulator scores exactly what is
//! published: the offsets file's record as readers see it, the history
//! line, and the `/status` view. The driver adds only what it alone knows:
//! the write time, the kernel clock readings and the device maps. Pure.

use clockmesh_estimator::convert::{ceil_bound_ns, round_ns};
use serde::{Deserialize, Serialize};

use clockmesh_offsets::history::{AnchorKind, HistoryEntry};
use clockmesh_offsets::{ClockStatus, DeviceMap, KernelClocks, NodeMap, Record, Snapshot, flags};

use crate::result::NodeResult;
use crate::settings::Settings;
use crate::time::{LocalNs, Nanos};

/// One published result.
#[derive(Clone, Debug, PartialEq)]
#[must_use = "a publication is written by the driver (`Action::Publish`)"]
pub struct Publication {
    /// The result as solved (global − local at its anchor).
    pub result: NodeResult,
    /// The line the history (JSONL) gets: what `trace merge` reads back.
    pub entry: HistoryEntry,
    /// The result as `/status` shows it.
    pub status: ResultStatus,
    /// What the offsets file's readers see: flags (`VALID`, `HOLDOVER`,
    /// `REFERENCE`), the end of its span, the node map, the holdover ceiling.
    pub view: Snapshot,
}

impl Publication {
    /// The publication of `result` under `settings` (window length and
    /// holdover ceiling).
    pub fn of(result: NodeResult, settings: &Settings) -> Self {
        let entry = history_entry(&result, settings.window());
        let status = ResultStatus::of(&result, settings);
        let mut view = reader_view(&result, settings.holdover_max_bound.unsigned_abs());
        if result.is_reference() {
            view.flags |= flags::REFERENCE;
        }
        Publication {
            result,
            entry,
            status,
            view,
        }
    }

    pub fn anchor_kind(&self) -> AnchorKind {
        self.result.anchor_kind
    }

    /// The offsets file's record, with what only the writer knows: its
    /// write time, the kernel clocks sampled with it and the device maps.
    /// The writer sets the epoch.
    pub fn record(
        &self,
        updated_at: LocalNs,
        clocks: KernelClocks,
        devices: Vec<DeviceMap>,
    ) -> Record {
        Record {
            flags: self.view.flags,
            epoch: 0,
            window: self.result.window.0,
            reference_id: u64::from(self.result.reference),
            updated_at_ns: updated_at.0,
            valid_until_ns: self.view.valid_until_ns,
            node: self.view.node,
            holdover_max_bound_ns: self.view.holdover_max_bound_ns,
            clocks,
            devices,
        }
    }
}

/// The history line of `r`, solved with windows of `window_ns`.
fn history_entry(r: &NodeResult, window: Nanos) -> HistoryEntry {
    HistoryEntry {
        host: r.node_name.clone(),
        window: r.window.0,
        anchor_ns: r.anchor.0,
        offset_ns: r.offset.0,
        drift_ppb: r.drift_ppb,
        bound_ns: r.bound_ns,
        valid_from_ns: Some(r.valid_from(window).0),
        valid_until_ns: Some(r.valid_until.0),
        reference: Some(r.reference_label()),
        node_id: Some(r.node),
        bound_growth_ppb: r.bound_growth_ppb,
        reference_id: Some(r.reference),
        anchor_kind: Some(r.anchor_kind),
        timeline_origin: r.origin.clone(),
    }
}

/// What readers see of `r` (without `REFERENCE`).
fn reader_view(r: &NodeResult, holdover_max_bound_ns: u64) -> Snapshot {
    let map = node_map(
        r.anchor.0,
        (r.offset.0, r.drift_ppb),
        (r.bound_ns, r.bound_growth_ppb),
    );
    view_of(r.is_holdover(), r.valid_until.0, map, holdover_max_bound_ns)
}

/// A result as the offsets file's node map carries it: at `anchor_ns`,
/// the offset and its rate (ppb, carried in ps/s), the bound and its
/// growth (ppb, carried in ps/s and rounded up: a bound must never be
/// understated).
fn node_map(
    anchor_ns: i64,
    (offset_ns, drift_ppb): (i64, f64),
    (bound_ns, growth_ppb): (u64, f64),
) -> NodeMap {
    NodeMap {
        anchor_local_ns: anchor_ns,
        offset_ns,
        drift_ps_per_s: round_ns(drift_ppb * 1e3),
        bound_ns,
        bound_growth_ps_per_s: ceil_bound_ns(growth_ppb * 1e3),
    }
}

/// The readers' view of a node map: `VALID`, and `HOLDOVER` when it was
/// placed by a previous estimate.
fn view_of(holdover: bool, valid_until_ns: i64, node: NodeMap, ceiling_ns: u64) -> Snapshot {
    let mut f = flags::VALID;
    if holdover {
        f |= flags::HOLDOVER;
    }
    Snapshot {
        flags: f,
        valid_until_ns,
        node,
        holdover_max_bound_ns: ceiling_ns,
    }
}

/// A node's clock against the global timeline as `/status` serves it (read
/// by `clockmesh status`), in the one convention of every clockmesh offset:
/// `offset_ns` = global − local, what to add to this node's clock to read
/// global time (positive: this clock is behind); `drift_ppb` is its rate.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct ResultStatus {
    pub node: String,
    pub node_id: u32,
    pub reference: String,
    pub window: u64,
    pub offset_ns: i64,
    pub drift_ppb: f64,
    pub bound_ns: u64,
    /// Local clock at which `offset_ns` holds.
    pub anchor_ns: i64,
    /// The end of the result's span; past it readers hold over up to
    /// `holdover_max_bound_ns`.
    pub valid_until_ns: i64,
    pub anchor_kind: AnchorKind,
    /// The holdover ceiling published with the result (this agent's
    /// `holdover_max_bound_ns`), ns; 0: none.
    pub holdover_max_bound_ns: u64,
    /// The result's state when `/status` was served, by the readers' rule
    /// ([`ResultStatus::state_at`]); absent until then.
    pub state: Option<ClockStatus>,
    /// How fast the bound grows with the result's age (drift uncertainty
    /// plus the assumed wander), ppb = ns per s.
    pub bound_growth_ppb: f64,
    /// Estimation window length: the update interval, ns.
    pub window_ns: i64,
    /// Bound on the drift estimate alone, ppb (without the assumed wander).
    pub drift_bound_ppb: f64,
    /// Probe-graph edges between this node and the reference.
    pub hops: u32,
    /// RMS of how far each result moved from the previous one carried to
    /// its anchor (the driver's `UpdateRms`): what chronyc calls the RMS
    /// offset, for a clock that is never steered.
    pub rms_update_ns: Option<f64>,
}

impl Default for ResultStatus {
    fn default() -> Self {
        ResultStatus {
            node: String::new(),
            node_id: 0,
            reference: String::new(),
            window: 0,
            offset_ns: 0,
            drift_ppb: 0.0,
            bound_ns: 0,
            anchor_ns: 0,
            valid_until_ns: 0,
            anchor_kind: AnchorKind::Reference,
            holdover_max_bound_ns: 0,
            state: None,
            bound_growth_ppb: 0.0,
            window_ns: 0,
            drift_bound_ppb: 0.0,
            hops: 0,
            rms_update_ns: None,
        }
    }
}

impl ResultStatus {
    /// The status view of `r` under `settings`.
    pub fn of(r: &NodeResult, settings: &Settings) -> Self {
        ResultStatus {
            node: r.node_name.clone(),
            node_id: r.node,
            reference: r.reference_label(),
            window: r.window.0,
            offset_ns: r.offset.0,
            drift_ppb: r.drift_ppb,
            bound_ns: r.bound_ns,
            anchor_ns: r.anchor.0,
            valid_until_ns: r.valid_until.0,
            anchor_kind: r.anchor_kind,
            holdover_max_bound_ns: settings.holdover_max_bound.unsigned_abs(),
            state: None,
            bound_growth_ppb: r.bound_growth_ppb,
            window_ns: settings.window().0,
            drift_bound_ppb: r.drift_bound_ppb,
            hops: r.hops,
            rms_update_ns: None,
        }
    }

    /// The result as the offsets file's readers see it (but `REFERENCE`):
    /// the same view the publication's record is made of.
    pub fn reader_view(&self) -> Snapshot {
        let map = node_map(
            self.anchor_ns,
            (self.offset_ns, self.drift_ppb),
            (self.bound_ns, self.bound_growth_ppb),
        );
        let holdover = self.anchor_kind == AnchorKind::Holdover;
        view_of(
            holdover,
            self.valid_until_ns,
            map,
            self.holdover_max_bound_ns,
        )
    }

    /// The result's state at `now`, by the rule every reader of the
    /// offsets file applies ([`Snapshot::status`]).
    pub fn state_at(&self, now: LocalNs) -> ClockStatus {
        self.reader_view().status(now)
    }
}

/// Whether a reader is better served by the result it holds, `held`, than
/// by a `new` one: on the same timeline, the held one's bound grown to a
/// window past the new anchor (about when the next result replaces
/// either) is the smaller, and the held one keeps answering for as long
/// as the new one would be valid (within its own validity, or in holdover
/// under the holdover ceiling). Both answers are honest; the reader gets
/// the tighter. A young fit after an outage or a restart (a few pairs, a
/// wide bound and an error to match) then does not replace a good record
/// that is still close; the next result, with more data, does; and keeping
/// the held one never leaves a reader without an answer that the new one
/// would have given, should the next results not come.
pub fn keeps_the_held(held: &NodeResult, new: &NodeResult, settings: &Settings) -> bool {
    if held.reference != new.reference || held.node != new.node {
        return false;
    }
    // Whether the held one still answers then: the readers' own rule on
    // the record it is published as.
    let held_view = reader_view(held, settings.holdover_max_bound.unsigned_abs());
    let answers_until = held_view.check_fresh(new.valid_until).is_ok();
    let next = new.anchor + settings.window();
    answers_until && held.bound_at(next) < new.bound_at(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::tests::sample;
    use crate::time::WindowIndex;

    fn settings(window_s: i64, holdover_max_bound_ns: i64) -> Settings {
        Settings {
            probe_window: Nanos::from_secs(window_s),
            holdover_max_bound: Nanos(holdover_max_bound_ns),
            ..Settings::default()
        }
    }

    #[test]
    fn the_history_line_carries_the_result_and_its_span() {
        let r = NodeResult {
            window: WindowIndex(7),
            anchor: LocalNs(32_000_000_000),
            offset: Nanos(-120),
            drift_ppb: 3.5,
            bound_ns: 40,
            valid_until: LocalNs(40_000_000_000),
            anchor_kind: AnchorKind::Substitute,
            ..sample(0, 0, 0.0)
        };
        let p = Publication::of(r, &settings(4, 0));
        assert_eq!(p.entry.valid_from_ns, Some(24_000_000_000));
        assert_eq!(p.entry.valid_until_ns, Some(40_000_000_000));
        assert_eq!(
            (p.entry.offset_ns, p.entry.bound_ns, p.entry.window),
            (-120, 40, 7)
        );
        assert_eq!(p.entry.anchor_kind, Some(AnchorKind::Substitute));
        assert_eq!(p.entry.reference.as_deref(), Some("n0"));
        assert_eq!(p.view.flags & flags::REFERENCE, 0);
        assert_eq!(p.status.window_ns, 4_000_000_000);
    }

    #[test]
    fn the_record_is_what_readers_see_of_the_result() {
        let r = NodeResult {
            node: 3,
            reference: 3,
            window: WindowIndex(2),
            anchor: LocalNs(8_000_000_000),
            offset: Nanos(1_234),
            drift_ppb: -2.0004,
            bound_ns: 50,
            bound_growth_ppb: 10.0001,
            valid_until: LocalNs(16_000_000_000),
            anchor_kind: AnchorKind::Holdover,
            ..sample(0, 0, 0.0)
        };
        let p = Publication::of(r, &settings(4, 10_000));
        let record = p.record(LocalNs(9_000_000_000), KernelClocks::default(), Vec::new());
        assert_eq!(
            record.flags,
            flags::VALID | flags::HOLDOVER | flags::REFERENCE
        );
        assert_eq!((record.window, record.reference_id), (2, 3));
        assert_eq!(record.updated_at_ns, 9_000_000_000);
        assert_eq!(record.valid_until_ns, 16_000_000_000);
        assert_eq!(record.holdover_max_bound_ns, 10_000);
        assert_eq!(record.node.drift_ps_per_s, -2_000);
        // A bound's growth is rounded up, never understated.
        assert_eq!(record.node.bound_growth_ps_per_s, 10_001);
        assert_eq!((record.node.offset_ns, record.node.bound_ns), (1_234, 50));
        // `/status` shows the same view readers get (but `REFERENCE`).
        assert_eq!(
            p.status.reader_view().flags | flags::REFERENCE,
            record.flags
        );
        assert_eq!(p.status.reader_view().node, record.node);
        assert_eq!(p.status.holdover_max_bound_ns, 10_000);
    }

    #[test]
    fn the_held_result_stays_while_it_answers_with_the_smaller_bound() {
        let keeps = |new: &NodeResult, ceiling| {
            keeps_the_held(&sample(0, 2_000, 100.0), new, &settings(4, ceiling))
        };
        let ceiling = 10_000;
        // Held: 2 µs at 0 s, growing 100 ns/s, valid for 12 s; at 36 + 12 s
        // (the new one's validity): 6.8 µs, in holdover under the ceiling.
        // A thin window's result after an outage: 400 µs.
        assert!(keeps(&sample(36, 400_000, 100.0), ceiling));
        // A mature one: 2.5 µs.
        assert!(!keeps(&sample(36, 2_500, 100.0), ceiling));
        // On another timeline, the new one is always published.
        let other = NodeResult {
            reference: 2,
            ..sample(36, 400_000, 100.0)
        };
        assert!(!keeps(&other, ceiling));
        // The held one would pass the ceiling (10 µs at 80 s) before the
        // new one's validity ends: the new one is published.
        assert!(!keeps(&sample(70, 400_000, 100.0), ceiling));
        assert!(!keeps(&sample(36, 400_000, 100.0), 0));
        // Valid as long as the new one, it answers whatever the ceiling.
        assert!(keeps(&sample(0, 400_000, 100.0), 0));
        // A held one whose bound does not grow is stale past its validity
        // (the readers' rule: no growth, no holdover): the new one goes out.
        assert!(!keeps_the_held(
            &sample(0, 2_000, 0.0),
            &sample(36, 400_000, 100.0),
            &settings(4, ceiling)
        ));
    }
}
