//! Clock domains, the maps between them, and each probe event's stamps
//! brought to the node's CLOCK_REALTIME — pure: the agent measures the maps
//! (`agent/src/capture/clocks.rs`: bracketed clock reads, the PTP ioctl) and
//! reads the events; this is what it does with them.
//!
//! Each eBPF field has its own domain: `bpf_ktime_get_ns` is MONOTONIC,
//! `__sk_buff.tstamp` is REALTIME (RX software stamp), `hwtstamp` is the
//! NIC's PHC. A map from bracketed reads (REALTIME, the other clock,
//! REALTIME) errs by at most half the bracket; the tightest bracket wins.

use clockmesh_common::{ProbeEvent, point};
use clockmesh_estimator::convert::ns_i64;
use serde::Serialize;

use crate::wire::StampSource;

/// Where a timestamp came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ClockDomain {
    Monotonic,
    Realtime,
    /// A NIC's PTP hardware clock, `/dev/ptp<N>`.
    Phc(u32),
}

/// `to = from + offset_ns`, valid near `anchor_from_ns`, within `bound_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ClockMap {
    pub from: ClockDomain,
    pub to: ClockDomain,
    pub anchor_from_ns: i64,
    pub offset_ns: i64,
    /// Half the width of the tightest bracket: the map's worst-case error.
    pub bound_ns: i64,
}

impl ClockMap {
    pub fn apply(&self, from_ns: i64) -> i64 {
        from_ns + self.offset_ns
    }
}

/// One bracketed read: `to` clock before and after, `from` clock in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bracket {
    pub to_before: i64,
    pub from: i64,
    pub to_after: i64,
}

/// The map from the tightest bracket; `None` for no valid bracket (a `to`
/// clock that ran backwards inside a bracket makes it invalid).
pub fn map_from_brackets(
    from: ClockDomain,
    to: ClockDomain,
    brackets: &[Bracket],
) -> Option<ClockMap> {
    let best = brackets
        .iter()
        .filter(|b| b.to_after >= b.to_before)
        .min_by_key(|b| b.to_after - b.to_before)?;
    let width = best.to_after - best.to_before;
    // Midpoint without overflow, in exact integers.
    let mid = best.to_before + width / 2;
    Some(ClockMap {
        from,
        to,
        anchor_from_ns: best.from,
        offset_ns: mid - best.from,
        bound_ns: width - width / 2,
    })
}

/// A timestamp and the clock it was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Stamp {
    pub domain: ClockDomain,
    pub ns: i64,
}

/// `__sk_buff.tstamp_type` values (uapi `BPF_SKB_TSTAMP_*`).
const TSTAMP_UNSPEC: u8 = 0;

/// The stamps an event carries: `bpf_ktime_get_ns` (MONOTONIC) always; the
/// skb RX stamp (REALTIME) at tc ingress when the kernel set one and it is a
/// receive stamp (`tstamp_type` 0); the NIC stamp when non-zero, in the PHC
/// domain of `phc` (the probe interface's PHC index, if known).
pub fn event_stamps(ev: &ProbeEvent, phc: Option<u32>) -> Vec<Stamp> {
    let mut stamps = vec![Stamp {
        domain: ClockDomain::Monotonic,
        ns: ns_i64(ev.ktime_ns),
    }];
    let rx_software = ev.point == point::TC_INGRESS && ev.tstamp_type == TSTAMP_UNSPEC;
    if rx_software && ev.skb_tstamp_ns != 0 {
        stamps.push(Stamp {
            domain: ClockDomain::Realtime,
            ns: ns_i64(ev.skb_tstamp_ns),
        });
    }
    if let (Some(index), true) = (phc, ev.hw_tstamp_ns != 0) {
        stamps.push(Stamp {
            domain: ClockDomain::Phc(index),
            ns: ns_i64(ev.hw_tstamp_ns),
        });
    }
    stamps
}

/// A stamp in REALTIME with the error added by the conversion (0 if it
/// already was REALTIME); `None` if no map covers its domain.
pub fn to_realtime(stamp: Stamp, maps: &[ClockMap]) -> Option<(i64, i64)> {
    if stamp.domain == ClockDomain::Realtime {
        return Some((stamp.ns, 0));
    }
    let map = maps
        .iter()
        .find(|m| m.from == stamp.domain && m.to == ClockDomain::Realtime)?;
    Some((map.apply(stamp.ns), map.bound_ns))
}

/// How good a stamp is, from its domain and where it was taken; `None` for
/// a completion-time `ktime` that is no wire time.
pub fn stamp_source(domain: ClockDomain, at: u8) -> Option<StampSource> {
    Some(match (domain, at) {
        (ClockDomain::Realtime, _) => StampSource::Kernel,
        (ClockDomain::Phc(_), _) => StampSource::Hardware,
        (_, point::TP_XMIT | point::TP_RECEIVE) => StampSource::Tracepoint,
        (_, point::TC_EGRESS | point::TC_INGRESS) => StampSource::Tc,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(to_before: i64, from: i64, to_after: i64) -> Bracket {
        Bracket {
            to_before,
            from,
            to_after,
        }
    }

    #[test]
    fn tightest_bracket_wins() {
        let m = map_from_brackets(
            ClockDomain::Monotonic,
            ClockDomain::Realtime,
            &[b(1000, 10, 1100), b(2000, 1010, 2010), b(3000, 2000, 3400)],
        )
        .unwrap();
        assert_eq!((m.anchor_from_ns, m.offset_ns, m.bound_ns), (1010, 995, 5));
        assert_eq!(m.apply(1010), 2005);
    }

    #[test]
    fn backwards_brackets_are_ignored() {
        let only_bad = [b(2000, 5, 1000)];
        assert_eq!(
            map_from_brackets(ClockDomain::Phc(0), ClockDomain::Realtime, &only_bad),
            None
        );
        assert_eq!(
            map_from_brackets(ClockDomain::Phc(0), ClockDomain::Realtime, &[]),
            None
        );
    }

    #[test]
    fn odd_width_bound_covers_both_ends() {
        let m = map_from_brackets(ClockDomain::Monotonic, ClockDomain::Realtime, &[b(0, 0, 7)])
            .unwrap();
        // True `to` at `from` lies in [0, 7]; estimate 3 ± 4 covers it.
        assert_eq!((m.offset_ns, m.bound_ns), (3, 4));
    }

    fn ingress(ktime: u64, tstamp: u64, tstamp_type: u8, hw: u64) -> ProbeEvent {
        ProbeEvent {
            point: point::TC_INGRESS,
            ktime_ns: ktime,
            skb_tstamp_ns: tstamp,
            tstamp_type,
            hw_tstamp_ns: hw,
            ..ProbeEvent::default()
        }
    }

    #[test]
    fn domains_follow_the_fields() {
        let s = event_stamps(&ingress(10, 20, 0, 30), Some(2));
        let domains: Vec<_> = s.iter().map(|s| s.domain).collect();
        assert_eq!(
            domains,
            [
                ClockDomain::Monotonic,
                ClockDomain::Realtime,
                ClockDomain::Phc(2)
            ]
        );
        assert_eq!(s.iter().map(|s| s.ns).collect::<Vec<_>>(), [10, 20, 30]);
    }

    #[test]
    fn delivery_times_and_unknown_phc_are_not_rx_stamps() {
        // tstamp_type 1 (MONO delivery time) is a forwarded TX time, not an RX stamp.
        assert_eq!(event_stamps(&ingress(10, 20, 1, 0), None).len(), 1);
        // A hardware stamp without a known PHC has no usable domain.
        assert_eq!(event_stamps(&ingress(10, 0, 0, 30), None).len(), 1);
        let egress = ProbeEvent {
            point: point::TC_EGRESS,
            skb_tstamp_ns: 5,
            ..ingress(10, 0, 0, 0)
        };
        assert_eq!(event_stamps(&egress, None).len(), 1);
    }

    #[test]
    fn conversion_adds_the_map_bound() {
        let map = ClockMap {
            from: ClockDomain::Monotonic,
            to: ClockDomain::Realtime,
            anchor_from_ns: 0,
            offset_ns: 1_000,
            bound_ns: 7,
        };
        let mono = Stamp {
            domain: ClockDomain::Monotonic,
            ns: 5,
        };
        assert_eq!(to_realtime(mono, &[map]), Some((1_005, 7)));
        let rt = Stamp {
            domain: ClockDomain::Realtime,
            ns: 5,
        };
        assert_eq!(to_realtime(rt, &[]), Some((5, 0)));
        let phc = Stamp {
            domain: ClockDomain::Phc(0),
            ns: 5,
        };
        assert_eq!(to_realtime(phc, &[map]), None);
    }

    #[test]
    fn sources_follow_domain_and_point() {
        assert_eq!(
            stamp_source(ClockDomain::Realtime, point::TC_INGRESS),
            Some(StampSource::Kernel)
        );
        assert_eq!(
            stamp_source(ClockDomain::Phc(1), point::TC_INGRESS),
            Some(StampSource::Hardware)
        );
        assert_eq!(
            stamp_source(ClockDomain::Monotonic, point::TP_XMIT),
            Some(StampSource::Tracepoint)
        );
        assert_eq!(
            stamp_source(ClockDomain::Monotonic, point::TC_EGRESS),
            Some(StampSource::Tc)
        );
        assert_eq!(stamp_source(ClockDomain::Monotonic, 0), None);
    }
}
