//! Every timestamp of an event, tagged with its clock domain, and brought to
//! the node's REALTIME through measured [`ClockMap`]s.

use clockmesh_common::{ProbeEvent, point};
use serde::Serialize;

use super::clocks::{ClockDomain, ClockMap};

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
        ns: ev.ktime_ns as i64,
    }];
    let rx_software = ev.point == point::TC_INGRESS && ev.tstamp_type == TSTAMP_UNSPEC;
    if rx_software && ev.skb_tstamp_ns != 0 {
        stamps.push(Stamp {
            domain: ClockDomain::Realtime,
            ns: ev.skb_tstamp_ns as i64,
        });
    }
    if let (Some(index), true) = (phc, ev.hw_tstamp_ns != 0) {
        stamps.push(Stamp {
            domain: ClockDomain::Phc(index),
            ns: ev.hw_tstamp_ns as i64,
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
