//! Time as types at the protocol's seams: an instant of a node's own clock
//! and a window's index. The unit is in the type, not in a field's name.

use clockmesh_estimator::convert::ns_f64;

/// An instant of this node's own CLOCK_REALTIME (local time, not the
/// global timeline), ns: the driver's "now" for every input, and where a
/// result is anchored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalNs(pub i64);

impl LocalNs {
    /// `ns` later (earlier if negative), saturating.
    pub fn plus_ns(self, ns: i64) -> LocalNs {
        LocalNs(self.0.saturating_add(ns))
    }

    /// ns from `earlier` to this instant (negative if `earlier` is later),
    /// saturating.
    pub fn ns_since(self, earlier: LocalNs) -> i64 {
        self.0.saturating_sub(earlier.0)
    }

    /// Seconds from `earlier` to this instant.
    pub fn secs_since(self, earlier: LocalNs) -> f64 {
        ns_f64(self.ns_since(earlier)) / 1e9
    }
}

/// A window's index: window `k` covers `[k·W, (k+1)·W)` of the local
/// clock, `W` the window length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WindowIndex(pub u64);

impl std::fmt::Display for WindowIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_instants_saturate_instead_of_wrapping() {
        let t = LocalNs(5_000_000_000);
        assert_eq!(t.plus_ns(-2_000_000_000), LocalNs(3_000_000_000));
        assert_eq!(t.ns_since(LocalNs(1_000_000_000)), 4_000_000_000);
        assert_eq!(t.secs_since(LocalNs(6_000_000_000)), -1.0);
        assert_eq!(LocalNs(i64::MAX).plus_ns(1), LocalNs(i64::MAX));
        assert_eq!(LocalNs(i64::MIN).ns_since(LocalNs(1)), i64::MIN);
    }
}
