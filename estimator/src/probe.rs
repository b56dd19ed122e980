//! Coded probe pairs: pairing the two packets of each pair and keeping the *pure* ones.
//!
//! A sender transmits two packets `s` ns apart (index 0, then index 1, same sequence number).
//! If the receiver sees them the same distance apart (within a tolerance), neither packet met a
//! queue the other did not, nor a late/early timestamp: the pair is *pure* and its first
//! packet is a trustworthy one-way-delay sample (or, with [`PurityConfig::best_of_pair`], the
//! faster of its two packets). Impure pairs are dropped and counted.
use serde::{Deserialize, Serialize};

use crate::EstimatorError;

/// Largest magnitude accepted for any timestamp (2^61 ns ≈ 73 years); keeps every difference
/// of two timestamps inside `i64`.
pub const MAX_ABS_TIMESTAMP_NS: i64 = 1 << 61;

/// TX and RX timestamps of one probe packet of one direction of one edge.
///
/// `tx_ns` is on the sender's clock, `rx_ns` on the receiver's clock, both integer ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeTimestamps {
    /// Pair sequence number, shared by both packets of the pair.
    pub seq: u64,
    /// 0 for the first packet of the pair, 1 for the second.
    pub pair_index: u8,
    /// Sender's transmit timestamp (ns, sender clock).
    pub tx_ns: i64,
    /// Receiver's receive timestamp (ns, receiver clock).
    pub rx_ns: i64,
}

/// The kept packet of a pure pair: one sample of `rx - tx` = one-way delay + clock offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurePoint {
    pub seq: u64,
    pub tx_ns: i64,
    pub rx_ns: i64,
}

/// Pairing and purity parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PurityConfig {
    /// Nominal send spacing `s` between the two packets of a pair (default 10 µs).
    pub spacing_ns: i64,
    /// A pair is pure when |rx gap − tx gap| ≤ this (default 40 ns: a few NIC timestamp ticks
    /// plus serialisation jitter; software timestamps need about 1 µs).
    pub tolerance_ns: i64,
    /// Pairs whose measured TX gap differs from `spacing_ns` by more than this are rejected: the
    /// sender was descheduled between the packets (default 5 µs).
    pub max_spacing_error_ns: i64,
    /// Largest accepted |rx − tx| (delay plus clock offset between the two hosts), default one
    /// day: larger values mean the two clocks are not on the same timescale.
    pub max_abs_delay_ns: i64,
    /// Keep the pure pair's packet with the smaller `rx − tx` instead of the first (default
    /// false). For stamps whose noise only ever adds delay and is drawn afresh for each packet
    /// (software stamps: TX early, RX late), the better of two is a sample nearer the floor.
    pub best_of_pair: bool,
}

impl Default for PurityConfig {
    fn default() -> Self {
        Self {
            spacing_ns: 10_000,
            tolerance_ns: 40,
            max_spacing_error_ns: 5_000,
            max_abs_delay_ns: 86_400_000_000_000,
            best_of_pair: false,
        }
    }
}

impl PurityConfig {
    fn validate(&self) -> Result<(), EstimatorError> {
        if self.spacing_ns <= 0 {
            return Err(EstimatorError::Config("spacing_ns must be > 0"));
        }
        if self.tolerance_ns < 0 || self.max_spacing_error_ns < 0 {
            return Err(EstimatorError::Config(
                "tolerance_ns and max_spacing_error_ns must be >= 0",
            ));
        }
        if self.max_abs_delay_ns <= 0 || self.max_abs_delay_ns > MAX_ABS_TIMESTAMP_NS {
            return Err(EstimatorError::Config(
                "max_abs_delay_ns must be in 1..=2^61",
            ));
        }
        Ok(())
    }
}

/// What happened to the probes of one direction of one edge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairingStats {
    pub probes: usize,
    /// Pairs with one packet missing (loss).
    pub incomplete: usize,
    /// Complete pairs whose TX gap was far from the nominal spacing.
    pub spacing_rejected: usize,
    /// Complete pairs whose RX gap did not match the TX gap.
    pub impure: usize,
    pub pure: usize,
}

/// Pure points (sorted by sequence) and the counts behind them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pairing {
    pub pure: Vec<PurePoint>,
    pub stats: PairingStats,
}

/// Pairs the probes of one direction of one edge and keeps the first packet of each pure pair
/// (the faster one with [`PurityConfig::best_of_pair`]).
///
/// Input order does not matter. Loss and reordering in the network are normal and only
/// counted; inputs that signal a bug upstream are errors: an empty slice, a duplicate
/// (sequence, index), an index other than 0/1, a pair whose second packet was not sent after
/// the first, a timestamp beyond ±2^61 ns or |rx − tx| above `max_abs_delay_ns`.
pub fn pair_probes(
    probes: &[ProbeTimestamps],
    cfg: &PurityConfig,
) -> Result<Pairing, EstimatorError> {
    cfg.validate()?;
    if probes.is_empty() {
        return Err(EstimatorError::Empty("no probes in this direction"));
    }
    for p in probes {
        check_probe(p, cfg)?;
    }
    let mut sorted = probes.to_vec();
    sorted.sort_unstable_by_key(|p| (p.seq, p.pair_index));
    let mut stats = PairingStats {
        probes: probes.len(),
        ..PairingStats::default()
    };
    let mut pure = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let first = sorted[i];
        let next = sorted.get(i + 1).copied();
        if let Some(n) = next
            && n.seq == first.seq
            && n.pair_index == first.pair_index
        {
            return Err(EstimatorError::DuplicateProbe {
                seq: n.seq,
                index: n.pair_index,
            });
        }
        match next {
            Some(second) if first.pair_index == 0 && second.seq == first.seq => {
                match classify_pair(&first, &second, cfg)? {
                    PairClass::Pure => {
                        stats.pure += 1;
                        let kept = kept_packet(&first, &second, cfg);
                        pure.push(PurePoint {
                            seq: kept.seq,
                            tx_ns: kept.tx_ns,
                            rx_ns: kept.rx_ns,
                        });
                    }
                    PairClass::Impure => stats.impure += 1,
                    PairClass::BadSpacing => stats.spacing_rejected += 1,
                }
                i += 2;
            }
            _ => {
                stats.incomplete += 1;
                i += 1;
            }
        }
    }
    Ok(Pairing { pure, stats })
}

/// The packet of a pure pair that becomes its point: the first, or with
/// [`PurityConfig::best_of_pair`] the one with the smaller `rx − tx`.
fn kept_packet<'a>(
    first: &'a ProbeTimestamps,
    second: &'a ProbeTimestamps,
    cfg: &PurityConfig,
) -> &'a ProbeTimestamps {
    let delay = |p: &ProbeTimestamps| p.rx_ns - p.tx_ns;
    if cfg.best_of_pair && delay(second) < delay(first) {
        second
    } else {
        first
    }
}

fn check_probe(p: &ProbeTimestamps, cfg: &PurityConfig) -> Result<(), EstimatorError> {
    if p.pair_index > 1 {
        return Err(EstimatorError::BadPairIndex {
            seq: p.seq,
            index: p.pair_index,
        });
    }
    for (what, value) in [("tx_ns", p.tx_ns), ("rx_ns", p.rx_ns)] {
        if !(-MAX_ABS_TIMESTAMP_NS..=MAX_ABS_TIMESTAMP_NS).contains(&value) {
            return Err(EstimatorError::Absurd { what, value });
        }
    }
    let delay = p.rx_ns - p.tx_ns;
    if delay.abs() > cfg.max_abs_delay_ns {
        return Err(EstimatorError::Absurd {
            what: "rx_ns - tx_ns",
            value: delay,
        });
    }
    Ok(())
}

enum PairClass {
    Pure,
    Impure,
    BadSpacing,
}

fn classify_pair(
    first: &ProbeTimestamps,
    second: &ProbeTimestamps,
    cfg: &PurityConfig,
) -> Result<PairClass, EstimatorError> {
    let tx_gap = second.tx_ns - first.tx_ns;
    if tx_gap <= 0 {
        return Err(EstimatorError::OutOfOrderPair {
            seq: first.seq,
            tx_gap_ns: tx_gap,
        });
    }
    if (tx_gap - cfg.spacing_ns).abs() > cfg.max_spacing_error_ns {
        return Ok(PairClass::BadSpacing);
    }
    let rx_gap = second.rx_ns - first.rx_ns;
    if (rx_gap - tx_gap).abs() <= cfg.tolerance_ns {
        Ok(PairClass::Pure)
    } else {
        Ok(PairClass::Impure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(seq: u64, pair_index: u8, tx_ns: i64, rx_ns: i64) -> ProbeTimestamps {
        ProbeTimestamps {
            seq,
            pair_index,
            tx_ns,
            rx_ns,
        }
    }

    #[test]
    fn keeps_first_packet_of_pure_pairs_only() {
        let cfg = PurityConfig::default();
        let probes = [
            probe(1, 1, 10_000, 15_010),
            probe(1, 0, 0, 5_000), // pure: rx gap 10_010 vs tx gap 10_000
            probe(2, 0, 100_000, 105_000),
            probe(2, 1, 110_000, 117_000), // impure: queued 2 µs
            probe(3, 0, 200_000, 205_000), // partner lost
            probe(4, 0, 300_000, 305_000),
            probe(4, 1, 330_000, 335_000), // sender descheduled: tx gap 30 µs
        ];
        let out = pair_probes(&probes, &cfg).unwrap();
        assert_eq!(
            out.pure,
            vec![PurePoint {
                seq: 1,
                tx_ns: 0,
                rx_ns: 5_000
            }]
        );
        assert_eq!(
            out.stats,
            PairingStats {
                probes: 7,
                incomplete: 1,
                spacing_rejected: 1,
                impure: 1,
                pure: 1
            }
        );
    }

    #[test]
    fn best_of_pair_keeps_the_packet_nearer_the_floor() {
        // Pure both (gaps 10_000 vs 10_030 and 10_000 vs 9_980): the
        // first pair's first packet is the faster, the second pair's second.
        let probes = [
            probe(1, 0, 0, 5_000),
            probe(1, 1, 10_000, 15_030),
            probe(2, 0, 100_000, 105_050),
            probe(2, 1, 110_000, 115_030),
        ];
        let first = pair_probes(&probes, &PurityConfig::default()).unwrap();
        let best = pair_probes(
            &probes,
            &PurityConfig {
                best_of_pair: true,
                ..PurityConfig::default()
            },
        )
        .unwrap();
        let delays = |p: &Pairing| p.pure.iter().map(|q| q.rx_ns - q.tx_ns).collect::<Vec<_>>();
        assert_eq!(delays(&first), vec![5_000, 5_050]);
        assert_eq!(delays(&best), vec![5_000, 5_030]);
        assert_eq!(best.pure[1].tx_ns, 110_000);
        assert_eq!(best.stats, first.stats);
    }

    #[test]
    fn lone_second_packet_counts_as_incomplete() {
        let out = pair_probes(&[probe(9, 1, 10, 20)], &PurityConfig::default()).unwrap();
        assert!(out.pure.is_empty());
        assert_eq!(out.stats.incomplete, 1);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let cfg = PurityConfig::default();
        assert!(matches!(
            pair_probes(&[], &cfg),
            Err(EstimatorError::Empty(_))
        ));
        assert!(matches!(
            pair_probes(&[probe(1, 0, 0, 5), probe(1, 0, 0, 5)], &cfg),
            Err(EstimatorError::DuplicateProbe { seq: 1, index: 0 })
        ));
        assert!(matches!(
            pair_probes(&[probe(1, 0, 10_000, 5), probe(1, 1, 0, 15)], &cfg),
            Err(EstimatorError::OutOfOrderPair { seq: 1, .. })
        ));
        assert!(matches!(
            pair_probes(&[probe(1, 2, 0, 5)], &cfg),
            Err(EstimatorError::BadPairIndex { .. })
        ));
        assert!(matches!(
            pair_probes(&[probe(1, 0, i64::MAX, 5)], &cfg),
            Err(EstimatorError::Absurd { what: "tx_ns", .. })
        ));
        assert!(matches!(
            pair_probes(&[probe(1, 0, 0, 1 << 60)], &cfg),
            Err(EstimatorError::Absurd { .. })
        ));
        let bad_cfg = PurityConfig {
            spacing_ns: 0,
            ..cfg
        };
        assert!(matches!(
            pair_probes(&[probe(1, 0, 0, 5)], &bad_cfg),
            Err(EstimatorError::Config(_))
        ));
    }
}
