//! Candidate timestamps of each probe packet, settled into one stamp per packet.
//!
//! A packet can be stamped several times (NIC, kernel socket stamp, tp_btf,
//! tc) and the candidates arrive by different paths (ring buffer, socket
//! error queue, RX control messages) at slightly different times. Each pair
//! waits its settle time after its first candidate, then the best candidate of
//! each packet is chosen ([`crate::pairs::best`]).
//!
//! Received probes are only believed once the datagram itself passed the
//! checks (membership, source address, authentication, replay): an eBPF RX
//! event alone proves nothing about who sent it. Unconfirmed pairs are
//! dropped at settle time and counted. Memory is bounded by `max_pairs`.

use std::collections::{BTreeMap, HashMap};

use clockmesh_estimator::NodeId;
use serde::Serialize;

use crate::{
    pairs::best,
    time::{LocalNs, Nanos},
    wire::{StampSource, WireStamp},
};

/// Which end of the path a stamp belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    Tx,
    Rx,
}

/// One coded pair on one directed edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PairKey {
    pub from: NodeId,
    pub to: NodeId,
    pub seq: u64,
}

#[derive(Default)]
struct Pending {
    first_seen: LocalNs,
    candidates: [Vec<WireStamp>; 2],
    confirmed: bool,
}

/// A settled pair: the best stamp of each of its two packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settled {
    pub side: Side,
    pub key: PairKey,
    pub stamps: [WireStamp; 2],
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CollectorStats {
    pub settled: u64,
    /// RX pairs whose datagrams never passed the checks (forged or lost).
    pub unconfirmed: u64,
    /// Pairs pushed out by the memory bound before settling.
    pub evicted: u64,
}

/// Most candidates kept per packet (there are at most five stamp points).
const MAX_CANDIDATES: usize = 6;

pub struct Collector {
    settle: Nanos,
    max_pairs: usize,
    pending: HashMap<(Side, PairKey), Pending>,
    /// Arrival order, for settling and eviction.
    order: BTreeMap<(LocalNs, Side, PairKey), ()>,
    stats: CollectorStats,
}

impl Collector {
    pub fn new(settle: Nanos, max_pairs: usize) -> Self {
        Collector {
            settle,
            max_pairs: max_pairs.max(1),
            pending: HashMap::new(),
            order: BTreeMap::new(),
            stats: CollectorStats::default(),
        }
    }

    /// Adds a candidate stamp of packet `index` (0 or 1) of a pair.
    pub fn add(&mut self, side: Side, key: PairKey, index: u8, stamp: WireStamp, now: LocalNs) {
        if index > 1 || stamp.source == StampSource::Missing {
            return;
        }
        let entry = self.entry(side, key, now);
        let slot = &mut entry.candidates[usize::from(index)];
        if slot.len() < MAX_CANDIDATES {
            slot.push(stamp);
        }
    }

    /// Marks a pair as genuine: our own TX, or an RX datagram that passed the checks.
    pub fn confirm(&mut self, side: Side, key: PairKey, now: LocalNs) {
        self.entry(side, key, now).confirmed = true;
    }

    fn entry(&mut self, side: Side, key: PairKey, now: LocalNs) -> &mut Pending {
        if !self.pending.contains_key(&(side, key)) {
            while self.pending.len() >= self.max_pairs {
                self.evict_oldest();
            }
            self.order.insert((now, side, key), ());
            self.pending.insert(
                (side, key),
                Pending {
                    first_seen: now,
                    ..Pending::default()
                },
            );
        }
        self.pending.get_mut(&(side, key)).expect("just inserted")
    }

    fn evict_oldest(&mut self) {
        if let Some(((_, side, key), ())) = self.order.pop_first() {
            self.pending.remove(&(side, key));
            self.stats.evicted += 1;
        }
    }

    /// Pairs whose settle time has passed, confirmed ones with their best stamps.
    pub fn settle(&mut self, now: LocalNs) -> Vec<Settled> {
        let mut out = Vec::new();
        while let Some((&(t, side, key), ())) = self.order.first_key_value() {
            if now.since(t) < self.settle {
                break;
            }
            self.order.pop_first();
            let Some(p) = self.pending.remove(&(side, key)) else {
                continue;
            };
            debug_assert_eq!(p.first_seen, t);
            if !p.confirmed {
                self.stats.unconfirmed += 1;
                continue;
            }
            self.stats.settled += 1;
            out.push(Settled {
                side,
                key,
                stamps: [best(&p.candidates[0]), best(&p.candidates[1])],
            });
        }
        out
    }

    pub fn stats(&self) -> CollectorStats {
        self.stats
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(ns: i64, source: StampSource) -> WireStamp {
        WireStamp {
            realtime_ns: ns,
            bound_ns: 0,
            source,
        }
    }

    const KEY: PairKey = PairKey {
        from: 1,
        to: 2,
        seq: 7,
    };

    #[test]
    fn best_candidate_wins_after_settling() {
        let mut c = Collector::new(Nanos(100), 16);
        c.add(Side::Tx, KEY, 0, st(10, StampSource::Tc), LocalNs(0));
        c.add(Side::Tx, KEY, 0, st(12, StampSource::Kernel), LocalNs(5));
        c.add(
            Side::Tx,
            KEY,
            1,
            st(20, StampSource::Tracepoint),
            LocalNs(6),
        );
        c.confirm(Side::Tx, KEY, LocalNs(7));
        assert!(c.settle(LocalNs(99)).is_empty(), "not settled yet");
        let s = c.settle(LocalNs(100));
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].stamps[0].realtime_ns, 12);
        assert_eq!(s[0].stamps[1].source, StampSource::Tracepoint);
        assert!(c.is_empty());
    }

    #[test]
    fn unconfirmed_pairs_are_dropped_and_counted() {
        let mut c = Collector::new(Nanos(10), 16);
        c.add(Side::Rx, KEY, 0, st(10, StampSource::Kernel), LocalNs(0));
        assert!(c.settle(LocalNs(50)).is_empty());
        assert_eq!(c.stats().unconfirmed, 1);
    }

    #[test]
    fn memory_is_bounded() {
        let mut c = Collector::new(Nanos(1_000), 8);
        for seq in 0..1_000 {
            let key = PairKey { seq, ..KEY };
            c.add(
                Side::Rx,
                key,
                0,
                st(1, StampSource::Kernel),
                LocalNs(seq as i64),
            );
        }
        assert_eq!(c.len(), 8);
        assert_eq!(c.stats().evicted, 992);
        // Bad index and missing stamps are ignored.
        c.add(Side::Rx, KEY, 2, st(1, StampSource::Kernel), LocalNs(0));
        c.add(Side::Rx, KEY, 0, WireStamp::MISSING, LocalNs(0));
        assert_eq!(c.len(), 8);
    }
}
