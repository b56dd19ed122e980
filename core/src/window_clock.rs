//! Window bookkeeping on the local clock: when each phase of a window
//! (fit, solve, fetch) is due, and what was done last. Pure: no I/O.

use std::collections::BTreeMap;

use clockmesh_estimator::NodeId;
use clockmesh_estimator::convert::ns_i64;

use crate::report::EdgeStatus;
use crate::time::{LocalNs, Nanos, WindowIndex};

/// Phase delays after a window ends: (cap ns, percent of the window).
/// The fit waits for the window's last reports: its last pairs settle
/// [`crate::node::SETTLE`] after its end, on the next tick
/// ([`crate::node::TICK`]), and then cross the link (300 ms at the
/// shipped 1 s windows).
const FIT_DELAY: (i64, i64) = (300_000_000, 30);
/// The leader solves once the fits are in: relayed fits arrive within
/// milliseconds of the fit phase (agents' clocks, NTP-disciplined, agree
/// far better than the 0.1 s between); fits put in a shared store (etcd)
/// get longer. Every result ages from its anchor until the next one
/// arrives, so this delay is part of what a reader sees.
const SOLVE_DELAY_RELAYED: (i64, i64) = (700_000_000, 40);
const SOLVE_DELAY_STORED: (i64, i64) = (1_500_000_000, 55);
const FETCH_DELAY: (i64, i64) = (2_500_000_000, 70);

/// Which step of a window's processing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Fit this node's out-edges.
    Fit,
    /// The leader solves the network.
    Solve,
    /// Every node fetches its result.
    Fetch,
}

/// Window bookkeeping on the local clock: which window each phase last ran
/// for, the result last published, the last fit of each out-edge.
pub struct WindowClock {
    window_ns: i64,
    solve_delay: (i64, i64),
    fitted: Option<u64>,
    solved: Option<u64>,
    fetched: Option<u64>,
    published: Option<(u64, i64)>,
    edges: BTreeMap<NodeId, EdgeStatus>,
}

impl WindowClock {
    /// Windows of `window`; `stored_fits`: fits reach the leader through
    /// a shared store rather than as datagrams.
    pub fn new(window: Nanos, stored_fits: bool) -> Self {
        WindowClock {
            window_ns: window.0.max(1),
            solve_delay: if stored_fits {
                SOLVE_DELAY_STORED
            } else {
                SOLVE_DELAY_RELAYED
            },
            fitted: None,
            solved: None,
            fetched: None,
            published: None,
            edges: BTreeMap::new(),
        }
    }

    /// The window whose `phase` is due at `now` and has not run yet;
    /// marks it run.
    pub fn take_due(&mut self, phase: Phase, now: LocalNs) -> Option<WindowIndex> {
        let (delay, done) = match phase {
            Phase::Fit => (FIT_DELAY, &mut self.fitted),
            Phase::Solve => (self.solve_delay, &mut self.solved),
            Phase::Fetch => (FETCH_DELAY, &mut self.fetched),
        };
        let k = due(self.window_ns, now.0, delay, *done)?;
        *done = Some(k);
        Some(WindowIndex(k))
    }

    /// Whether the result of `window` anchored at `anchor` is new (not the
    /// one published last); marks it published.
    pub fn take_new_result(&mut self, window: WindowIndex, anchor: LocalNs) -> bool {
        let new = self.published != Some((window.0, anchor.0));
        self.published = Some((window.0, anchor.0));
        new
    }

    pub fn record_edge(&mut self, peer: NodeId, status: EdgeStatus) {
        self.edges.insert(peer, status);
    }

    /// Whether this node has published a result since it started.
    pub fn has_published(&self) -> bool {
        self.published.is_some()
    }

    /// The window local time `now` falls in (negative before the epoch).
    pub fn index(&self, now: LocalNs) -> i64 {
        now.0.div_euclid(self.window_ns)
    }

    /// Local time at which window `k` ends.
    pub fn end(&self, k: WindowIndex) -> LocalNs {
        LocalNs(ns_i64(k.0).saturating_add(1).saturating_mul(self.window_ns))
    }

    pub fn last_fitted(&self) -> u64 {
        self.fitted.unwrap_or(0)
    }

    pub fn edge_status(&self, peer: NodeId) -> Option<EdgeStatus> {
        self.edges.get(&peer).cloned()
    }
}

/// A phase's delay after the end of a window of length `w`: its share of
/// the window, at most its cap.
fn delay_ns(w: i64, (cap, percent): (i64, i64)) -> i64 {
    cap.min(w / 100 * percent)
}

/// The window (of length `w`) that ended most recently, if `delay` has
/// passed since and it is newer than `done`.
fn due(w: i64, now_ns: i64, phase_delay: (i64, i64), done: Option<u64>) -> Option<u64> {
    let delay = delay_ns(w, phase_delay);
    let ended = now_ns.div_euclid(w) - 1;
    let since_end = now_ns - (ended + 1) * w;
    let k = u64::try_from(ended).ok()?;
    (since_end >= delay && done.is_none_or(|d| k > d)).then_some(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the shipped window the fit comes after the window's last pairs
    /// have settled on some tick, with time to cross the link: a fit
    /// before would leave them out.
    #[test]
    fn the_fit_waits_for_the_window_s_last_reports() {
        use crate::node::{SETTLE, TICK};
        let w = crate::settings::Settings::default().window().0;
        let delay = delay_ns(w, FIT_DELAY);
        assert!(delay >= SETTLE.0 + TICK.0 + 50_000_000, "{delay} ns");
    }

    #[test]
    fn phases_fire_once_per_window_after_their_delay() {
        let w = 4_000_000_000;
        let mut c = WindowClock::new(Nanos(w), false);
        assert_eq!(
            due(c.window_ns, 10 * w + 100, FIT_DELAY, None),
            None,
            "too early"
        );
        assert_eq!(
            due(c.window_ns, 10 * w + FIT_DELAY.0, FIT_DELAY, None),
            Some(9)
        );
        assert_eq!(
            c.take_due(Phase::Fit, LocalNs(10 * w + FIT_DELAY.0)),
            Some(WindowIndex(9))
        );
        assert_eq!(
            due(c.window_ns, 10 * w + 2 * FIT_DELAY.0, FIT_DELAY, c.fitted),
            None
        );
        assert_eq!(
            due(c.window_ns, 11 * w + FIT_DELAY.0, FIT_DELAY, c.fitted),
            Some(10)
        );
        // Short windows scale the delays down so every phase still fits.
        let short = WindowClock::new(Nanos::from_secs(1), false);
        assert_eq!(
            due(
                short.window_ns,
                5_000_000_000 + 700_000_000,
                FETCH_DELAY,
                None
            ),
            Some(4)
        );
        assert_eq!(
            due(
                short.window_ns,
                5_000_000_000 + 690_000_000,
                FETCH_DELAY,
                None
            ),
            None
        );
    }
}
