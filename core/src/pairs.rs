//! Assembling complete probe timestamps for the estimator.
//!
//! A probe's TX stamp is known to its sender and its RX stamp to its
//! receiver; follow-ups (TX → receiver) and RX reports (RX → sender) carry the
//! missing halves, so both ends of an edge end up with complete pairs of both
//! directions. Each packet may have several candidate stamps (NIC, kernel,
//! tp_btf, tc); [`best`] keeps the one nearest the wire (`docs/timestamps.md`).
//!
//! Memory is bounded: at most `max_pending` incomplete probes per direction;
//! the oldest are dropped first and counted.

use std::collections::{BTreeMap, HashMap};

use clockmesh_estimator::{EdgeProbes, NodeId, ProbeTimestamps};

use super::{
    settings::StampClass,
    wire::{StampSource, WireStamp},
};

/// Preference between candidate stamps of one packet: NIC first, tc last.
fn rank(source: StampSource) -> u8 {
    match source {
        StampSource::Hardware => 0,
        StampSource::Kernel => 1,
        StampSource::Tracepoint => 2,
        StampSource::Tc => 3,
        StampSource::Missing => u8::MAX,
    }
}

/// The best of a packet's candidate stamps, or `WireStamp::MISSING`.
pub fn best(candidates: &[WireStamp]) -> WireStamp {
    candidates
        .iter()
        .filter(|s| s.source != StampSource::Missing)
        .min_by_key(|s| rank(s.source))
        .copied()
        .unwrap_or(WireStamp::MISSING)
}

/// Both halves of one probe packet.
#[derive(Clone, Copy, Debug, Default)]
struct Halves {
    tx: Option<WireStamp>,
    rx: Option<WireStamp>,
}

/// One direction `from → to` of an edge.
type Direction = (NodeId, NodeId);

#[derive(Default)]
struct DirectionBook {
    /// (seq, pair_index) → halves; ordered so the oldest is evicted first.
    pending: BTreeMap<(u64, u8), Halves>,
    complete: Vec<ProbeTimestamps>,
    /// A complete probe since the last take had a side without a NIC stamp.
    software: bool,
}

/// Counters of what the book did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PairBookStats {
    pub completed: u64,
    pub evicted_incomplete: u64,
    /// Halves whose TX and RX sources differ in kind (e.g. NIC TX, kernel RX):
    /// kept, but a mix adds asymmetry, so it is worth watching.
    pub mixed_sources: u64,
}

/// Collects halves per direction and hands out complete probes per window.
pub struct PairBook {
    max_pending: usize,
    books: HashMap<Direction, DirectionBook>,
    stats: PairBookStats,
}

impl PairBook {
    pub fn new(max_pending: usize) -> Self {
        PairBook {
            max_pending: max_pending.max(2),
            books: HashMap::new(),
            stats: PairBookStats::default(),
        }
    }

    /// Records the TX stamp of probe (`seq`, `pair_index`) sent `from → to`.
    pub fn tx(&mut self, from: NodeId, to: NodeId, seq: u64, pair_index: u8, stamp: WireStamp) {
        self.record(from, to, seq, pair_index, |h| h.tx = Some(stamp));
    }

    /// Records the RX stamp of probe (`seq`, `pair_index`) sent `from → to`.
    pub fn rx(&mut self, from: NodeId, to: NodeId, seq: u64, pair_index: u8, stamp: WireStamp) {
        self.record(from, to, seq, pair_index, |h| h.rx = Some(stamp));
    }

    fn record(
        &mut self,
        from: NodeId,
        to: NodeId,
        seq: u64,
        idx: u8,
        set: impl FnOnce(&mut Halves),
    ) {
        if idx > 1 {
            return;
        }
        let book = self.books.entry((from, to)).or_default();
        let halves = book.pending.entry((seq, idx)).or_default();
        set(halves);
        if let (Some(tx), Some(rx)) = (halves.tx, halves.rx) {
            book.pending.remove(&(seq, idx));
            if tx.source == StampSource::Missing || rx.source == StampSource::Missing {
                return; // a side had no usable stamp: nothing to fit
            }
            if (tx.source == StampSource::Hardware) != (rx.source == StampSource::Hardware) {
                self.stats.mixed_sources += 1;
            }
            book.software |=
                tx.source != StampSource::Hardware || rx.source != StampSource::Hardware;
            book.complete.push(ProbeTimestamps {
                seq,
                pair_index: idx,
                tx_ns: tx.realtime_ns,
                rx_ns: rx.realtime_ns,
            });
            self.stats.completed += 1;
        }
        while book.pending.len() > self.max_pending {
            book.pending.pop_first();
            self.stats.evicted_incomplete += 1;
        }
    }

    /// Takes every complete probe of edge `a ↔ b` (forward = `a → b`).
    pub fn take_edge(&mut self, a: NodeId, b: NodeId) -> EdgeProbes {
        let mut take = |d: Direction| {
            self.books
                .get_mut(&d)
                .map(|book| std::mem::take(&mut book.complete))
                .unwrap_or_default()
        };
        EdgeProbes {
            from: a,
            to: b,
            forward: take((a, b)),
            backward: take((b, a)),
        }
    }

    /// Like [`PairBook::take_edge`], with the class of the stamps the probes
    /// carry: NIC only if every side of every probe had a NIC stamp. A
    /// window without probes has nothing to class and is called software;
    /// [`crate::history::EdgeHistory::push_window`] gives it its edge's class.
    pub fn take_edge_classified(&mut self, a: NodeId, b: NodeId) -> (EdgeProbes, StampClass) {
        let mut software = false;
        for d in [(a, b), (b, a)] {
            if let Some(book) = self.books.get_mut(&d) {
                software |= std::mem::take(&mut book.software);
            }
        }
        let probes = self.take_edge(a, b);
        let empty = probes.forward.is_empty() && probes.backward.is_empty();
        let class = if software || empty {
            StampClass::Software
        } else {
            StampClass::Nic
        };
        (probes, class)
    }

    /// The complete probes of direction `from → to` not yet taken, with the
    /// class of their stamps (as [`PairBook::take_edge_classified`] judges
    /// an edge); `None` without any.
    pub fn complete(&self, from: NodeId, to: NodeId) -> Option<(&[ProbeTimestamps], StampClass)> {
        let book = self
            .books
            .get(&(from, to))
            .filter(|b| !b.complete.is_empty())?;
        let class = if book.software {
            StampClass::Software
        } else {
            StampClass::Nic
        };
        Some((&book.complete, class))
    }

    /// Drops every complete probe not taken (directions this node does not fit).
    pub fn clear_complete(&mut self) {
        for book in self.books.values_mut() {
            book.complete.clear();
            book.software = false;
        }
    }

    /// Forgets directions involving `node` (it left the membership).
    pub fn forget(&mut self, node: NodeId) {
        self.books.retain(|&(f, t), _| f != node && t != node);
    }

    pub fn stats(&self) -> PairBookStats {
        self.stats
    }

    /// Incomplete probes held now, all directions.
    pub fn pending(&self) -> usize {
        self.books.values().map(|b| b.pending.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ns: i64, source: StampSource) -> WireStamp {
        WireStamp {
            realtime_ns: ns,
            bound_ns: 10,
            source,
        }
    }

    #[test]
    fn best_prefers_the_stamp_nearest_the_wire() {
        let c = [
            s(3, StampSource::Tc),
            s(2, StampSource::Tracepoint),
            s(1, StampSource::Kernel),
        ];
        assert_eq!(best(&c).realtime_ns, 1);
        assert_eq!(
            best(&[s(9, StampSource::Tc), s(5, StampSource::Hardware)]).realtime_ns,
            5
        );
        assert_eq!(best(&[]).source, StampSource::Missing);
        assert_eq!(best(&[WireStamp::MISSING]).source, StampSource::Missing);
    }

    #[test]
    fn halves_in_any_order_make_complete_probes_of_both_directions() {
        let mut book = PairBook::new(64);
        book.rx(1, 2, 7, 0, s(1_100, StampSource::Kernel)); // report arrives first
        book.tx(1, 2, 7, 0, s(1_000, StampSource::Kernel));
        book.tx(2, 1, 7, 1, s(2_000, StampSource::Kernel));
        book.rx(2, 1, 7, 1, s(2_090, StampSource::Kernel));
        book.tx(1, 2, 8, 0, s(3_000, StampSource::Kernel)); // incomplete
        let e = book.take_edge(1, 2);
        assert_eq!(
            e.forward,
            vec![ProbeTimestamps {
                seq: 7,
                pair_index: 0,
                tx_ns: 1_000,
                rx_ns: 1_100
            }]
        );
        assert_eq!(
            e.backward,
            vec![ProbeTimestamps {
                seq: 7,
                pair_index: 1,
                tx_ns: 2_000,
                rx_ns: 2_090
            }]
        );
        assert_eq!(book.pending(), 1);
        assert!(book.take_edge(1, 2).forward.is_empty(), "taken once");
        assert_eq!(book.stats().completed, 2);
    }

    #[test]
    fn missing_sides_and_bad_indices_never_complete() {
        let mut book = PairBook::new(8);
        book.tx(1, 2, 1, 0, WireStamp::MISSING);
        book.rx(1, 2, 1, 0, s(5, StampSource::Kernel));
        book.tx(1, 2, 1, 3, s(5, StampSource::Kernel));
        assert!(book.take_edge(1, 2).forward.is_empty());
        assert_eq!(book.pending(), 0);
    }

    #[test]
    fn memory_is_bounded_and_departures_forgotten() {
        let mut book = PairBook::new(100);
        for seq in 0..10_000 {
            book.tx(1, 2, seq, 0, s(seq as i64, StampSource::Kernel));
        }
        assert_eq!(book.pending(), 100);
        assert_eq!(book.stats().evicted_incomplete, 9_900);
        // The newest survive: their RX halves still complete them.
        book.rx(1, 2, 9_999, 0, s(10_050, StampSource::Kernel));
        assert_eq!(book.take_edge(1, 2).forward.len(), 1);
        book.forget(2);
        assert_eq!(book.pending(), 0);
    }

    #[test]
    fn mixed_hardware_and_software_halves_are_counted() {
        let mut book = PairBook::new(8);
        book.tx(1, 2, 1, 0, s(5, StampSource::Hardware));
        book.rx(1, 2, 1, 0, s(9, StampSource::Kernel));
        assert_eq!(book.stats().mixed_sources, 1);
    }
}
