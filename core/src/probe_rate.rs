//! How often this node sends coded pairs to each peer: the configured
//! cadence, or a few times faster on a NIC-stamped direction that busy
//! queues leave short of pure pairs.
//!
//! A pair is pure only when neither packet met a queue, (1 − busy)² of the
//! pairs: with queues busy 0.7 of the time, about 2 of the 20 pairs a
//! direction gets in the 2 s a NIC fit spans at the shipped cadence. The
//! fit then stands on a couple of points, and growing its span
//! ([`crate::settings::NIC_STARVED_HISTORY_NS`]) trades that for the
//! clocks' wander. More pairs over the same span are the better cure:
//! each node judges its own direction to every peer from the complete
//! pairs it holds (its TX stamps and the peer's RX reports) and sends up
//! to `max_pairs_per_cadence` ([`crate::setting::MAX_PAIRS_PER_CADENCE`])
//! pairs a cadence while the pure share is low
//! (docs/estimator.md §8, "Probing faster where pure pairs are few").
//! Software-stamped directions keep the cadence: their purity tolerance
//! passes most pairs, and their 32 s span holds hundreds.

use std::collections::{BTreeMap, VecDeque};

use crate::settings::{NIC_HISTORY_NS, NIC_STARVED_POINTS, StampClass, windows_within};
use crate::time::Nanos;
use clockmesh_estimator::NodeId;
use clockmesh_estimator::convert::{count_f64, ns_f64};

/// Pure pairs a NIC-stamped direction should hold over the NIC fit's span
/// ([`NIC_HISTORY_NS`]): twice what makes a fit starved, so that a span
/// holds enough even when its seconds run below their average.
pub const NIC_PURE_PAIRS_WANTED: usize = 2 * NIC_STARVED_POINTS;

/// Complete pairs over the span a share is judged on, at least.
const MIN_JUDGED_PAIRS: usize = NIC_PURE_PAIRS_WANTED;

/// A rate is lowered only when the lower one would still give this many
/// times [`NIC_PURE_PAIRS_WANTED`]: the pure share measured over a couple of
/// seconds is noisy, and a rate that flips every window probes unevenly.
const LOWER_MARGIN: f64 = 1.5;

/// The rate of every peer's direction, judged window by window.
#[derive(Debug)]
pub struct ProbeRates {
    directions: BTreeMap<NodeId, DirectionRate>,
    /// Rates are powers of two up to this.
    max_pairs_per_cadence: u32,
}

#[derive(Debug)]
struct DirectionRate {
    /// (complete pairs, pure pairs) of the last windows, newest last.
    recent: VecDeque<(usize, usize)>,
    pairs_per_cadence: u32,
}

impl Default for DirectionRate {
    fn default() -> Self {
        DirectionRate {
            recent: VecDeque::new(),
            pairs_per_cadence: 1,
        }
    }
}

/// One window's complete pairs of this node's direction to a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectionWindow {
    pub complete: usize,
    pub pure: usize,
    pub stamps: StampClass,
}

impl ProbeRates {
    /// Rates up to `max_pairs_per_cadence` (the setting; 1: the cadence
    /// alone).
    pub fn new(max_pairs_per_cadence: usize) -> Self {
        ProbeRates {
            directions: BTreeMap::new(),
            max_pairs_per_cadence: u32::try_from(max_pairs_per_cadence)
                .unwrap_or(u32::MAX)
                .max(1),
        }
    }

    /// Pairs a cadence to send to `peer` (1 until a window says otherwise).
    pub fn pairs_per_cadence(&self, peer: NodeId) -> u32 {
        self.directions
            .get(&peer)
            .map_or(1, |d| d.pairs_per_cadence)
    }

    /// Takes one window of `peer`'s direction; true when its rate changed.
    /// A window without complete pairs (a link down, all lost) changes
    /// nothing: faster probing cannot help a path that carries nothing.
    pub fn observe(
        &mut self,
        peer: NodeId,
        window: DirectionWindow,
        cadence: Nanos,
        window_len: Nanos,
    ) -> bool {
        let d = self.directions.entry(peer).or_default();
        let before = d.pairs_per_cadence;
        if window.stamps != StampClass::Nic {
            *d = DirectionRate::default();
            return before != 1;
        }
        if window.complete == 0 {
            return false;
        }
        d.recent.push_back((window.complete, window.pure));
        while d.recent.len() > windows_within(Nanos(NIC_HISTORY_NS), window_len) {
            d.recent.pop_front();
        }
        let (complete, pure) = d
            .recent
            .iter()
            .fold((0, 0), |(c, p), &(wc, wp)| (c + wc, p + wp));
        if complete < MIN_JUDGED_PAIRS {
            // A few pairs (the first after a link came back) say little
            // about the share: none of three pure is no reason to probe
            // eight times as fast.
            return false;
        }
        d.pairs_per_cadence = next_rate(
            before,
            pure_share(pure, complete),
            cadence,
            self.max_pairs_per_cadence,
        );
        d.pairs_per_cadence != before
    }

    /// Forgets every direction but those to `peers` (peers that left).
    pub fn keep_only(&mut self, peers: &[NodeId]) {
        self.directions.retain(|id, _| peers.contains(id));
    }
}

fn pure_share(pure: usize, complete: usize) -> f64 {
    count_f64(pure) / count_f64(complete.max(1))
}

/// The slowest rate up to `max` whose expected pure pairs over a NIC span
/// reach the wanted count (the fastest if none does); a lower rate than
/// `current` only with [`LOWER_MARGIN`].
fn next_rate(current: u32, share: f64, cadence: Nanos, max: u32) -> u32 {
    let pairs_per_span = ns_f64(NIC_HISTORY_NS) / ns_f64(cadence.0.max(1));
    let expected = |rate: u32| share * pairs_per_span * f64::from(rate);
    let fastest = rates(max).last().unwrap_or(1);
    let slowest_with = |wanted: f64| {
        rates(max)
            .find(|&r| expected(r) >= wanted)
            .unwrap_or(fastest)
    };
    let wanted = count_f64(NIC_PURE_PAIRS_WANTED);
    let needed = slowest_with(wanted);
    if needed >= current {
        return needed;
    }
    slowest_with(LOWER_MARGIN * wanted).min(current)
}

/// 1, 2, 4, … up to `max`.
fn rates(max: u32) -> impl Iterator<Item = u32> {
    std::iter::successors(Some(1u32), |r| r.checked_mul(2)).take_while(move |&r| r <= max)
}

/// How many rounds a sender makes per cadence for these rates (powers of
/// two): as many as the fastest target needs.
pub fn rounds_per_cadence(rates: impl IntoIterator<Item = u32>) -> u32 {
    rates.into_iter().max().unwrap_or(1).max(1)
}

/// Whether a target sent `pairs_per_cadence` pairs a cadence is due in
/// round `round` of a sender making `rounds_per_cadence` rounds a cadence.
pub fn due_in_round(round: u64, pairs_per_cadence: u32, rounds_per_cadence: u32) -> bool {
    let every = (rounds_per_cadence / pairs_per_cadence.max(1)).max(1);
    round.is_multiple_of(u64::from(every))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CADENCE: Nanos = Nanos::from_millis(100);
    const WINDOW: Nanos = Nanos::from_secs(1);

    fn nic(complete: usize, pure: usize) -> DirectionWindow {
        DirectionWindow {
            complete,
            pure,
            stamps: StampClass::Nic,
        }
    }

    #[test]
    fn a_clean_nic_direction_keeps_the_cadence() {
        let mut r = ProbeRates::new(4);
        assert!(!r.observe(1, nic(10, 9), CADENCE, WINDOW));
        assert_eq!(r.pairs_per_cadence(1), 1);
    }

    #[test]
    fn a_busy_nic_direction_is_probed_faster_and_slows_once_the_queue_clears() {
        let mut r = ProbeRates::new(4);
        // Busy 0.7: about 9 % of the pairs pure.
        assert!(r.observe(1, nic(10, 1), CADENCE, WINDOW));
        assert_eq!(r.pairs_per_cadence(1), 4);
        // 40 % pure: 2 pairs a cadence give 16 in 2 s, past the margin.
        for _ in 0..2 {
            r.observe(1, nic(40, 16), CADENCE, WINDOW);
        }
        assert_eq!(r.pairs_per_cadence(1), 2);
        // A clean path again: back to the cadence.
        for _ in 0..2 {
            r.observe(1, nic(20, 20), CADENCE, WINDOW);
        }
        assert_eq!(r.pairs_per_cadence(1), 1);
    }

    #[test]
    fn the_setting_caps_the_rate() {
        let mut at_cadence = ProbeRates::new(1);
        assert!(!at_cadence.observe(1, nic(10, 0), CADENCE, WINDOW));
        assert_eq!(at_cadence.pairs_per_cadence(1), 1);
        let mut up_to_8 = ProbeRates::new(8);
        up_to_8.observe(1, nic(10, 1), CADENCE, WINDOW);
        assert_eq!(up_to_8.pairs_per_cadence(1), 8);
        let mut up_to_6 = ProbeRates::new(6);
        up_to_6.observe(1, nic(10, 1), CADENCE, WINDOW);
        assert_eq!(up_to_6.pairs_per_cadence(1), 4, "a power of two");
    }

    #[test]
    fn a_share_near_the_line_does_not_flip_the_rate() {
        let mut r = ProbeRates::new(4);
        // 45 % pure: 9 in 2 s at the cadence, below the 10 wanted.
        r.observe(1, nic(10, 4), CADENCE, WINDOW);
        r.observe(1, nic(10, 5), CADENCE, WINDOW);
        assert_eq!(r.pairs_per_cadence(1), 2);
        // 55 %: 11 at the cadence would do, but not with the margin.
        for _ in 0..4 {
            assert!(!r.observe(1, nic(20, 11), CADENCE, WINDOW));
        }
        assert_eq!(r.pairs_per_cadence(1), 2);
    }

    #[test]
    fn software_stamps_and_silent_windows_keep_the_rate() {
        let mut r = ProbeRates::new(4);
        let software = DirectionWindow {
            complete: 10,
            pure: 0,
            stamps: StampClass::Software,
        };
        assert!(!r.observe(1, software, CADENCE, WINDOW));
        assert_eq!(r.pairs_per_cadence(1), 1);
        r.observe(2, nic(10, 1), CADENCE, WINDOW);
        assert!(!r.observe(2, nic(0, 0), CADENCE, WINDOW));
        assert_eq!(r.pairs_per_cadence(2), 4);
        // A handful of pairs, none pure, is not judged.
        assert!(!r.observe(3, nic(3, 0), CADENCE, WINDOW));
        assert_eq!(r.pairs_per_cadence(3), 1);
        r.keep_only(&[1]);
        assert_eq!(r.pairs_per_cadence(2), 1);
    }

    #[test]
    fn rounds_follow_the_fastest_target_and_slower_ones_skip_rounds() {
        assert_eq!(rounds_per_cadence([]), 1);
        assert_eq!(rounds_per_cadence([1, 4, 2]), 4);
        let due = |rate| (0..8).filter(|&k| due_in_round(k, rate, 4)).count();
        assert_eq!((due(1), due(2), due(4)), (2, 4, 8));
        assert!((0..5).all(|k| due_in_round(k, 1, 1)));
    }
}
