//! Time as types, as ntpd-rs has `NtpTimestamp` / `NtpDuration` and
//! statime `Time` / `Duration`: the unit and the clock are in the type,
//! not in a name's suffix.
//!
//! - [`LocalNs`]: an instant of a node's own clock (its CLOCK_REALTIME,
//!   not the global timeline);
//! - [`GlobalNs`]: an instant of the global timeline;
//! - [`Nanos`]: a signed span of time;
//! - [`WindowIndex`]: an estimation window's index.
//!
//! Arithmetic saturates: a clock value near the i64 limits never wraps
//! into the past. The one convention of offsets holds: global − local.
#![forbid(unsafe_code)]
#![no_std]

use core::ops::{Add, AddAssign, Neg, Sub, SubAssign};

use serde::{Deserialize, Serialize};

const NS_PER_S: i64 = 1_000_000_000;

/// A signed span of time, ns.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Nanos(pub i64);

impl Nanos {
    pub const ZERO: Nanos = Nanos(0);
    pub const MAX: Nanos = Nanos(i64::MAX);

    pub const fn from_secs(s: i64) -> Nanos {
        Nanos(s.saturating_mul(NS_PER_S))
    }

    pub const fn from_millis(ms: i64) -> Nanos {
        Nanos(ms.saturating_mul(1_000_000))
    }

    pub const fn from_micros(us: i64) -> Nanos {
        Nanos(us.saturating_mul(1_000))
    }

    /// A span given in unsigned units (a setting), saturating at the i64
    /// range.
    pub const fn from_unsigned(units: u64, ns_per_unit: i64) -> Nanos {
        let units = if units > i64::MAX as u64 {
            i64::MAX
        } else {
            units as i64
        };
        Nanos(units.saturating_mul(ns_per_unit))
    }

    /// The span in seconds, as f64 (exact below 2^53 ns, 104 days).
    #[expect(
        clippy::cast_precision_loss,
        reason = "spans are far below 2^53 ns, where f64 is exact"
    )]
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// The span in ns, as f64; see [`Nanos::as_secs_f64`].
    #[expect(
        clippy::cast_precision_loss,
        reason = "spans are far below 2^53 ns, where f64 is exact"
    )]
    pub fn as_f64(self) -> f64 {
        self.0 as f64
    }

    /// The span as a std duration (a negative span is zero).
    pub const fn to_duration(self) -> core::time::Duration {
        if self.0 <= 0 {
            core::time::Duration::ZERO
        } else {
            core::time::Duration::from_nanos(self.0 as u64)
        }
    }

    /// The span's magnitude, ns.
    pub const fn unsigned_abs(self) -> u64 {
        self.0.unsigned_abs()
    }

    pub const fn abs(self) -> Nanos {
        Nanos(self.0.saturating_abs())
    }

    pub const fn saturating_mul(self, k: i64) -> Nanos {
        Nanos(self.0.saturating_mul(k))
    }

    /// How many whole spans of `unit` fit in this one (rounded toward
    /// negative infinity; `unit` ≤ 0 counts as 1 ns).
    pub const fn div_floor(self, unit: Nanos) -> i64 {
        let unit = if unit.0 > 0 { unit.0 } else { 1 };
        self.0.div_euclid(unit)
    }
}

impl core::fmt::Display for Nanos {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.0.fmt(f)
    }
}

impl Add for Nanos {
    type Output = Nanos;
    fn add(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(rhs.0))
    }
}

impl Sub for Nanos {
    type Output = Nanos;
    fn sub(self, rhs: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(rhs.0))
    }
}

impl Neg for Nanos {
    type Output = Nanos;
    fn neg(self) -> Nanos {
        Nanos(self.0.saturating_neg())
    }
}

impl AddAssign for Nanos {
    fn add_assign(&mut self, rhs: Nanos) {
        *self = *self + rhs;
    }
}

impl SubAssign for Nanos {
    fn sub_assign(&mut self, rhs: Nanos) {
        *self = *self - rhs;
    }
}

/// An instant type: ns on one clock, with spans added and taken.
macro_rules! instant {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(
            Clone,
            Copy,
            Debug,
            Default,
            PartialEq,
            Eq,
            PartialOrd,
            Ord,
            Hash,
            Serialize,
            Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub i64);

        impl $name {
            /// The span from `earlier` to this instant (negative if
            /// `earlier` is later).
            pub const fn since(self, earlier: $name) -> Nanos {
                Nanos(self.0.saturating_sub(earlier.0))
            }

            /// Seconds from `earlier` to this instant.
            pub fn secs_since(self, earlier: $name) -> f64 {
                self.since(earlier).as_secs_f64()
            }
        }

        impl Add<Nanos> for $name {
            type Output = $name;
            fn add(self, rhs: Nanos) -> $name {
                $name(self.0.saturating_add(rhs.0))
            }
        }

        impl Sub<Nanos> for $name {
            type Output = $name;
            fn sub(self, rhs: Nanos) -> $name {
                $name(self.0.saturating_sub(rhs.0))
            }
        }

        impl Sub for $name {
            type Output = Nanos;
            fn sub(self, rhs: $name) -> Nanos {
                self.since(rhs)
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                self.0.fmt(f)
            }
        }

        impl AddAssign<Nanos> for $name {
            fn add_assign(&mut self, rhs: Nanos) {
                *self = *self + rhs;
            }
        }
    };
}

instant!(
    LocalNs,
    "An instant of a node's own clock (its CLOCK_REALTIME, not the global timeline), ns: the driver's \"now\" for every input, and where a result is anchored."
);
instant!(
    GlobalNs,
    "An instant of the global timeline (the reference's clock, continued across hand-overs), ns."
);

impl LocalNs {
    /// This local instant on the global timeline, given the offset
    /// (global − local) there.
    pub fn to_global(self, offset: Nanos) -> GlobalNs {
        GlobalNs(self.0.saturating_add(offset.0))
    }
}

/// global − local: the offset of a node's clock at an instant, the one
/// convention of every clockmesh offset.
impl Sub<LocalNs> for GlobalNs {
    type Output = Nanos;
    fn sub(self, local: LocalNs) -> Nanos {
        Nanos(self.0.saturating_sub(local.0))
    }
}

/// A window's index: window `k` covers `[k·W, (k+1)·W)` of the local
/// clock, `W` the window length.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct WindowIndex(pub u64);

impl core::fmt::Display for WindowIndex {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_and_spans_saturate_instead_of_wrapping() {
        let t = LocalNs(5_000_000_000);
        assert_eq!(t - Nanos::from_secs(2), LocalNs(3_000_000_000));
        assert_eq!(t - LocalNs(1_000_000_000), Nanos::from_secs(4));
        assert_eq!(t.secs_since(LocalNs(6_000_000_000)), -1.0);
        assert_eq!(LocalNs(i64::MAX) + Nanos(1), LocalNs(i64::MAX));
        assert_eq!(LocalNs(i64::MIN).since(LocalNs(1)), Nanos(i64::MIN));
        assert_eq!(Nanos::from_unsigned(u64::MAX, 1_000), Nanos::MAX);
        assert_eq!(Nanos::from_micros(100).div_floor(Nanos(30_000)), 3);
        assert_eq!(Nanos(-1).div_floor(Nanos::from_secs(1)), -1);
        assert_eq!(-Nanos(i64::MIN), Nanos::MAX);
        assert_eq!(
            LocalNs(10).to_global(Nanos(-3)),
            GlobalNs(7),
            "global − local = −3"
        );
        assert_eq!(GlobalNs(7) - LocalNs(10), Nanos(-3));
        assert_eq!(Nanos::from_millis(1_500).as_secs_f64(), 1.5);
    }
}
