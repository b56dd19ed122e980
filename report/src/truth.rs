//! `--truth FILE`: the skew injected into each node (what `clockmesh agent
//! --inject-skew OFFSET,DRIFT,EPOCH[,WANDER,SEED]` and the demo use), so the
//! report can plot estimated − true offsets. Format (docs/report.md):
//!
//! ```json
//! {"nodes": {"n0": {"offset_ns": -689000, "drift_ppb": 3000.0, "epoch_ns": 1795335288621242594},
//!            "n1": {"offset_ns": 250000, "drift_ppb": -12000.0, "epoch_ns": 1795335288621242594,
//!                   "wander_ppb_per_sqrt_s": 1.0, "wander_seed": 2}}}
//! ```
//!
//! A node with skew s reads `true + s(t)`, s(t) = offset_ns + drift_ppb·(t −
//! epoch_ns)/1e9 (+ the seeded wander), exactly `InjectedSkew::at`. Its true
//! offset is then, as every offset in clockmesh, global − local:
//! `s_reference(t) − s_node(t)` (plus what the reference carried if it took
//! the timeline over from another leader, read from the hand-over lines).
//! No I/O.

use clockmesh_core::time::LocalNs;
use std::collections::BTreeMap;

use clockmesh_offsets::history::HistoryEntry;
use clockmesh_sim::skew::InjectedSkew;
use serde::Deserialize;

use super::lines::HandOver;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TruthFile {
    nodes: BTreeMap<String, SkewSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SkewSpec {
    offset_ns: i64,
    drift_ppb: f64,
    epoch_ns: i64,
    #[serde(default)]
    wander_ppb_per_sqrt_s: f64,
    #[serde(default)]
    wander_seed: u64,
}

/// The injected skew of every node named in the truth file.
#[derive(Clone, Debug)]
pub struct Truth {
    skews: BTreeMap<String, InjectedSkew>,
}

#[derive(Debug, thiserror::Error)]
pub enum TruthError {
    #[error(
        "{file}: not a truth file ({{\"nodes\": {{NAME: {{offset_ns, drift_ppb, epoch_ns}}}}}}): {error}"
    )]
    Parse {
        file: String,
        error: serde_json::Error,
    },
    #[error("{file}: node {node:?}: drift_ppb must be finite")]
    Drift { file: String, node: String },
}

impl Truth {
    /// Parses the truth file's text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Truth, TruthError> {
        let parsed: TruthFile = serde_json::from_str(text).map_err(|error| TruthError::Parse {
            file: file.into(),
            error,
        })?;
        let mut skews = BTreeMap::new();
        for (node, s) in parsed.nodes {
            if !s.drift_ppb.is_finite() || !s.wander_ppb_per_sqrt_s.is_finite() {
                return Err(TruthError::Drift {
                    file: file.into(),
                    node,
                });
            }
            let skew = InjectedSkew {
                offset_ns: s.offset_ns,
                drift_ppb: s.drift_ppb,
                epoch_ns: s.epoch_ns,
                wander_ppb_per_sqrt_s: s.wander_ppb_per_sqrt_s,
                wander_seed: s.wander_seed,
            };
            skews.insert(node, skew);
        }
        Ok(Truth { skews })
    }

    /// The true global − local of the line's node at its anchor, or `None`
    /// when the node, its reference or the reference's name is unknown.
    pub fn offset_ns(&self, line: &HistoryEntry, handovers: &[HandOver]) -> Option<f64> {
        let node = self.skews.get(&line.host)?;
        let reference_name = line.reference.as_deref()?;
        let reference = self.skews.get(reference_name)?;
        // The anchor is on the node's clock: undo its skew for true time.
        let local = line.anchor_ns;
        let t = local - node.at(local);
        let reference_local = t + reference.at(t);
        let carried = HandOver::in_force_of(handovers, reference_name, line.window)
            .and_then(HandOver::carry)
            .map_or(0, |c| c.offset_at(LocalNs(reference_local)).0);
        Some((reference.at(t) - node.at(t)) as f64 + carried as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"{"nodes": {
        "r": {"offset_ns": 1000, "drift_ppb": 0.0, "epoch_ns": 0},
        "n": {"offset_ns": -500, "drift_ppb": 1000.0, "epoch_ns": 0}}}"#;

    fn line(host: &str, anchor_ns: i64, window: u64) -> HistoryEntry {
        HistoryEntry {
            host: host.into(),
            window,
            anchor_ns,
            reference: Some("r".into()),
            ..HistoryEntry::default()
        }
    }

    #[test]
    fn offsets_are_global_minus_local() {
        let truth = Truth::parse("t.json", TEXT).unwrap();
        // At true time 0, n reads −500 and r reads +1000: global − local = 1500.
        assert_eq!(truth.offset_ns(&line("n", -500, 1), &[]), Some(1500.0));
        // 10 s later n has gained 10 µs: global − local = 1500 − 10000.
        let local = 10_000_000_000 - 500 + 10_000;
        assert_eq!(truth.offset_ns(&line("n", local, 1), &[]), Some(-8500.0));
        assert_eq!(truth.offset_ns(&line("r", 7, 1), &[]), Some(0.0));
        assert_eq!(truth.offset_ns(&line("x", 7, 1), &[]), None);
    }

    #[test]
    fn a_carry_of_the_reference_counts_from_its_window_on() {
        let truth = Truth::parse("t.json", TEXT).unwrap();
        let h = HandOver {
            window: 5,
            reference: "r".into(),
            previous_reference: Some("old".into()),
            carried_anchor_ns: Some(0),
            carried_offset_ns: Some(40),
            carried_drift_ppb: Some(0.0),
            carried_bound_ns: Some(3),
            carried_wander_ppb_per_sqrt_s: None,
            steered_toward: None,
        };
        let hs = [h];
        assert_eq!(truth.offset_ns(&line("n", -500, 4), &hs), Some(1500.0));
        assert_eq!(truth.offset_ns(&line("n", -500, 5), &hs), Some(1540.0));
    }

    /// A reference that carried a timeline, lost the lead and later started
    /// a timeline of its own: from then on its own clock is the truth.
    #[test]
    fn a_later_new_timeline_of_the_reference_ends_its_carry() {
        let truth = Truth::parse("t.json", TEXT).unwrap();
        let carried = HandOver::new(5, "r", Some(&carry_of(40)));
        let other = HandOver::new(7, "x", Some(&carry_of(900)));
        let own = HandOver::new(10, "r", None);
        let hs = [carried, other, own];
        assert_eq!(truth.offset_ns(&line("n", -500, 6), &hs), Some(1540.0));
        assert_eq!(truth.offset_ns(&line("n", -500, 9), &hs), Some(1540.0));
        assert_eq!(truth.offset_ns(&line("n", -500, 10), &hs), Some(1500.0));
    }

    fn carry_of(offset_ns: i64) -> clockmesh_core::timeline::Carry {
        clockmesh_core::timeline::Carry {
            anchor: LocalNs(0),
            offset: clockmesh_core::time::Nanos(offset_ns),
            drift_ppb: 0.0,
            bound_ns: 3,
            from: "old".into(),
        }
    }

    #[test]
    fn bad_files_say_what_is_expected() {
        let e = Truth::parse("t.json", "{\"n0\": {}}")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("t.json: not a truth file ({\"nodes\":"),
            "{e}"
        );
        let e = Truth::parse(
            "t.json",
            r#"{"nodes": {"a": {"offset_ns": 1, "epoch_ns": 0}}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("missing field `drift_ppb`"), "{e}");
    }
}
