//! The numeric conversions the estimator and the protocol core make on
//! purpose, each named once with why it is sound, so that the cast lints
//! (`cast_possible_truncation`, `cast_sign_loss`, `cast_possible_wrap`,
//! `cast_precision_loss`) flag every other `as` as a mistake to look at.

/// ns (a difference of timestamps, a bound, an offset) as f64 for the fit's
/// arithmetic. Exact below 2^53 ns (104 days): spans, offsets and bounds
/// stay far below that; absolute timestamps are differenced first.
#[expect(
    clippy::cast_precision_loss,
    reason = "ns differences are far below 2^53, where f64 is exact"
)]
pub fn ns_f64(ns: i64) -> f64 {
    ns as f64
}

/// An unsigned ns quantity (a bound, an age) as f64; see [`ns_f64`].
#[expect(
    clippy::cast_precision_loss,
    reason = "bounds and ages are far below 2^53 ns, where f64 is exact"
)]
pub fn unsigned_ns_f64(ns: u64) -> f64 {
    ns as f64
}

/// A count (points, windows, probes) as f64 for a ratio or a mean.
#[expect(
    clippy::cast_precision_loss,
    reason = "counts of points and windows are far below 2^53"
)]
pub fn count_f64(n: usize) -> f64 {
    n as f64
}

/// A wide intermediate (i128 sums of timestamps) as f64; see [`ns_f64`].
#[expect(
    clippy::cast_precision_loss,
    reason = "the i128 values are ns differences, far below 2^53"
)]
pub fn wide_f64(v: i128) -> f64 {
    v as f64
}

/// An f64 ns rounded to the nearest integer ns. Out-of-range values
/// saturate at the i64 limits and NaN gives 0 (Rust's float → int `as`),
/// which the callers' saturating arithmetic then keeps.
#[expect(
    clippy::cast_possible_truncation,
    reason = "float → int `as` saturates; rounding to whole ns is the point"
)]
pub fn round_ns(v: f64) -> i64 {
    v.round() as i64
}

/// An f64 bound rounded up to whole ns, never below 0: a bound must never
/// be understated. Saturates at u64::MAX; NaN gives 0.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "clamped at 0 first; float → int `as` saturates above"
)]
pub fn ceil_bound_ns(v: f64) -> u64 {
    v.ceil().max(0.0) as u64
}

/// An f64 rounded down to a count, never below 0 (saturating).
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "clamped at 0 first; float → int `as` saturates above"
)]
pub fn floor_count(v: f64) -> usize {
    v.floor().max(0.0) as usize
}

/// A count as u32 for the wire, saturating (counts of points per window
/// are far below it).
pub fn count_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// An unsigned ns quantity (kernel times, settings) as i64, saturating:
/// CLOCK values stay below 2^63 ns (292 years).
pub fn ns_i64(ns: u64) -> i64 {
    i64::try_from(ns).unwrap_or(i64::MAX)
}

/// An i128 intermediate back to i64 ns, saturating at the i64 limits.
pub fn saturate_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_saturate_and_never_understate_a_bound() {
        assert_eq!(ceil_bound_ns(10.1), 11);
        assert_eq!(ceil_bound_ns(-3.0), 0);
        assert_eq!(ceil_bound_ns(f64::NAN), 0);
        assert_eq!(ceil_bound_ns(1e300), u64::MAX);
        assert_eq!(round_ns(-2.5), -3);
        assert_eq!(round_ns(1e300), i64::MAX);
        assert_eq!(floor_count(-1.0), 0);
        assert_eq!(count_u32(usize::MAX), u32::MAX);
        assert_eq!(ns_i64(u64::MAX), i64::MAX);
        assert_eq!(saturate_i64(i128::MIN), i64::MIN);
        assert_eq!(ns_f64(-5), -5.0);
    }
}
