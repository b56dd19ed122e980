//! Device (GPU) clocks against host clocks: snapshot pairs, their fitter and a
//! synthetic source model for tests.
//!
//! A *snapshot pair* is one device-clock reading bracketed by host clock
//! reads taken just before and just after it. The true host instant of the
//! device reading lies inside the bracket, so half the bracket width bounds
//! the error of that one pair. The [`fit::DeviceClockFitter`] keeps the
//! tightest pair of each burst, fits `host - device` as a line over a sliding
//! window and maps device times to host times with an error bound, refusing
//! (failing closed) past its extrapolation cap.
//!
//! Everything here is pure: no I/O, no clock reads. Host and device times are
//! integer nanoseconds; floating point is only used for small quantities
//! relative to an anchor (residuals, slopes), where it is exact to well under
//! a nanosecond.
pub mod fit;
pub mod pair;
pub mod synthetic;

pub use fit::{
    BurstOutcome, DeviceClockFit, DeviceClockFitter, FitConfig, FitError, FitStats, MappedTime,
};
pub use pair::{
    DeviceId, DeviceReading, HostDomain, HostStamp, PairError, SnapshotPair, SourceKind, Vendor,
};
pub use synthetic::{SyntheticClockModel, SyntheticConfig, TruePoint};

#[cfg(test)]
mod tests;
