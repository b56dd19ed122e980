//! Protocol mode: how fast a node's readers are back at the no-fault level
//! after its links come back (`isolation`).
//!
//! The fault bench (`cargo xtask bench-faults`) asks this of one host on a
//! noisy VM; here many nodes are cut off at once, with NIC or software
//! stamps and the truth known. The isolated nodes' readers, and as many
//! control nodes' that saw no fault, are read at the same instants
//! ([`SAMPLES_PER_WINDOW`] a window) for [`RECOVERY_WINDOWS`] windows from
//! the end of the isolation. The no-fault level is the controls' p99 over
//! those instants; a node is back within `k` windows when every later
//! reading of its reader lies within that level — the bench's rule, also
//! applied to the controls, which shows how often it fails without a
//! fault.

use serde::{Deserialize, Serialize};

/// Windows after the isolation ends over which readers are read.
pub const RECOVERY_WINDOWS: u32 = 10;
/// Reader readings per window.
pub const SAMPLES_PER_WINDOW: u32 = 4;
/// The bench's rule: back at the no-fault level within this many windows.
const BACK_WITHIN_WINDOWS: f64 = 2.0;

/// One reader's answer at one instant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    /// Windows since the isolation ended.
    pub since_end: f64,
    /// |error| and the bound the reader stated; `None`: no result to answer from.
    pub answer: Option<(f64, f64)>,
}

/// The readings of the isolated nodes and of the controls, per node.
#[derive(Debug, Default)]
pub(crate) struct RecoveryScores {
    pub isolated: Vec<NodeReadings>,
    pub controls: Vec<NodeReadings>,
    /// Per isolated node: windows from the end to its first result about
    /// a window after it.
    resumed: Vec<Option<f64>>,
}

impl RecoveryScores {
    /// `isolated` hosts, and as many controls: the first hosts that are
    /// neither isolated nor in `excluded` (the reference, a new leader).
    pub fn new(nodes: usize, isolated: &[usize], excluded: &[usize]) -> Self {
        let controls = (0..nodes)
            .filter(|i| !isolated.contains(i) && !excluded.contains(i))
            .take(isolated.len());
        Self {
            isolated: isolated.iter().map(|&i| (i, Vec::new())).collect(),
            controls: controls.map(|i| (i, Vec::new())).collect(),
            resumed: vec![None; isolated.len()],
        }
    }

    /// Isolated host `host` published a result about a window after the
    /// end, `since_end` windows after it (only its first counts).
    pub fn resumed(&mut self, host: usize, since_end: f64) {
        if let Some(k) = self.isolated.iter().position(|(i, _)| *i == host) {
            self.resumed[k].get_or_insert(since_end);
        }
    }

    /// Every host read at this instant, with `answer(host)`.
    pub fn read_all(
        &mut self,
        since_end: f64,
        mut answer: impl FnMut(usize) -> Option<(f64, f64)>,
    ) {
        for (host, readings) in self.isolated.iter_mut().chain(self.controls.iter_mut()) {
            readings.push(Reading {
                since_end,
                answer: answer(*host),
            });
        }
    }

    pub fn report(&self, windows_down: u32) -> RecoveryReport {
        let level_ns = crate::Quantiles::of(&mut errors(&self.controls)).p99;
        let per_window = (0..RECOVERY_WINDOWS)
            .map(|w| {
                [
                    worst_in_window(&self.isolated, w),
                    worst_in_window(&self.controls, w),
                ]
            })
            .collect();
        let isolated: Vec<&Reading> = self.isolated.iter().flat_map(|(_, r)| r).collect();
        let answered: Vec<(f64, f64)> = isolated.iter().filter_map(|r| r.answer).collect();
        RecoveryReport {
            isolated_nodes: self.isolated.len(),
            resumed_within_windows: self
                .resumed
                .iter()
                .map(|r| r.unwrap_or(f64::INFINITY))
                .fold(0.0, f64::max),
            windows_down,
            level_ns,
            max_abs_error_ns: per_window,
            back_within_2_windows: count_back(&self.isolated, level_ns),
            controls_within_level: count_back(&self.controls, level_ns),
            unanswered: isolated.len() - answered.len(),
            coverage: answered.iter().filter(|(e, b)| e <= b).count() as f64
                / answered.len().max(1) as f64,
        }
    }
}

/// One node's readings: its host index and what its reader answered.
type NodeReadings = (usize, Vec<Reading>);

/// Every |error| the nodes' readers answered.
fn errors(nodes: &[NodeReadings]) -> Vec<f64> {
    nodes
        .iter()
        .flat_map(|(_, r)| r.iter().filter_map(|x| x.answer.map(|a| a.0)))
        .collect()
}

/// The largest |error| any of the nodes' readers answered in window `w` after the end.
fn worst_in_window(nodes: &[NodeReadings], w: u32) -> f64 {
    let in_window = |x: &&Reading| x.since_end >= f64::from(w) && x.since_end < f64::from(w + 1);
    nodes
        .iter()
        .flat_map(|(_, r)| r.iter().filter(in_window))
        .filter_map(|x| x.answer.map(|a| a.0))
        .fold(0.0, f64::max)
}

/// How many of the nodes were back at `level_ns` within the bench's 2 windows.
fn count_back(nodes: &[NodeReadings], level_ns: f64) -> usize {
    nodes
        .iter()
        .filter(|(_, r)| back_within(r, BACK_WITHIN_WINDOWS, level_ns))
        .count()
}

/// Whether every reading from `windows` after the end on answered within `level_ns`.
fn back_within(readings: &[Reading], windows: f64, level_ns: f64) -> bool {
    readings
        .iter()
        .filter(|r| r.since_end >= windows)
        .all(|r| r.answer.is_some_and(|(e, _)| e <= level_ns))
}

/// Readers after an isolation ended, against controls read at the same instants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecoveryReport {
    pub isolated_nodes: usize,
    pub windows_down: u32,
    /// Windows from the end until every isolated node had published a
    /// result about a window after it (infinite: one never did).
    pub resumed_within_windows: f64,
    /// The controls' p99 |error| over the recovery span: the no-fault level.
    pub level_ns: f64,
    /// Per window since the end: the largest |error| an isolated node's
    /// reader answered, and a control's.
    pub max_abs_error_ns: Vec<[f64; 2]>,
    /// Isolated nodes whose reader answered within the level from 2 windows after the end on.
    pub back_within_2_windows: usize,
    /// Controls that did, by the same rule.
    pub controls_within_level: usize,
    /// Isolated nodes' readings with no result to answer from.
    pub unanswered: usize,
    /// Isolated nodes' readings whose error lay within the stated bound.
    pub coverage: f64,
}

impl RecoveryReport {
    pub fn table(&self) -> String {
        let per_window: Vec<String> = self
            .max_abs_error_ns
            .iter()
            .enumerate()
            .map(|(w, [i, c])| format!("w{w} {i:.0}/{c:.0}"))
            .collect();
        format!(
            "isolation         {} nodes cut off for {} windows; new results within {:.2} windows of the end; readers after it, max |error| ns per window (isolated/control):\n  {}\n  no-fault level {:.1} ns (controls' p99); back within 2 windows: {} of {} isolated, {} of {} controls; coverage {:.5}, unanswered {}\n",
            self.isolated_nodes,
            self.windows_down,
            self.resumed_within_windows,
            per_window.join("  "),
            self.level_ns,
            self.back_within_2_windows,
            self.isolated_nodes,
            self.controls_within_level,
            self.isolated_nodes,
            self.coverage,
            self.unanswered,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(since_end: f64, err: f64) -> Reading {
        Reading {
            since_end,
            answer: Some((err, 1e3)),
        }
    }

    #[test]
    fn a_node_is_back_when_every_reading_from_2_windows_on_is_within_the_level() {
        let late_spike = [reading(0.5, 900.0), reading(2.0, 10.0), reading(5.0, 60.0)];
        assert!(!back_within(&late_spike, 2.0, 50.0));
        assert!(back_within(&late_spike, 2.0, 60.0));
        let unanswered = [Reading {
            since_end: 3.0,
            answer: None,
        }];
        assert!(!back_within(&unanswered, 2.0, 1e9));
    }

    #[test]
    fn controls_are_other_nodes_than_the_isolated_and_the_excluded() {
        let s = RecoveryScores::new(10, &[0, 3], &[1]);
        let controls: Vec<usize> = s.controls.iter().map(|c| c.0).collect();
        assert_eq!(controls, vec![2, 4]);
    }
}
