//! The snapshot pair record: one device reading bracketed by host reads.
use std::fmt;

/// GPU vendor of a device clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    Nvidia,
    Amd,
    /// A modelled device (tests, `--source synthetic`).
    Synthetic,
}

/// Which device a reading came from: vendor plus the index the source uses
/// (CUDA ordinal, ordinal among KFD GPU nodes, synthetic index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId {
    pub vendor: Vendor,
    pub index: u32,
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = match self.vendor {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
            Vendor::Synthetic => "synthetic",
        };
        write!(f, "{v}:{}", self.index)
    }
}

/// How the pair was taken; also names the device clock domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceKind {
    /// CUDA kernel that stays resident for a burst and answers host pings
    /// with `%globaltimer` (Unix-epoch ns, 32 ns steps on H100).
    CudaPingPong,
    /// One CUDA kernel launch per sample, writing `%globaltimer`.
    CudaLaunchPerSample,
    /// AMD KFD ioctl `AMDKFD_IOC_GET_CLOCK_COUNTERS` (GPU counter ticks).
    KfdIoctl,
    /// The synthetic model.
    Synthetic,
}

impl SourceKind {
    /// Name of the device clock domain this source reads.
    pub fn device_domain(self) -> &'static str {
        match self {
            SourceKind::CudaPingPong | SourceKind::CudaLaunchPerSample => "cuda-globaltimer",
            SourceKind::KfdIoctl => "amdgpu-clock-counter",
            SourceKind::Synthetic => "synthetic",
        }
    }
}

/// The host clock a device clock is mapped onto.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HostDomain {
    /// CLOCK_REALTIME: CUPTI's default, what xprof/XLA host planes use.
    #[default]
    Realtime,
    /// CLOCK_MONOTONIC.
    Monotonic,
    /// CLOCK_BOOTTIME: what ROCm runtimes and rocprofiler stamp in.
    Boottime,
}

/// Host clocks read together. The source reads them in the order that puts
/// REALTIME nearest the device read (before: BOOTTIME, MONOTONIC, REALTIME;
/// after: the reverse), so the REALTIME bracket is the tightest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostStamp {
    pub realtime_ns: i64,
    pub monotonic_ns: i64,
    pub boottime_ns: i64,
}

impl HostStamp {
    pub fn get(&self, domain: HostDomain) -> i64 {
        match domain {
            HostDomain::Realtime => self.realtime_ns,
            HostDomain::Monotonic => self.monotonic_ns,
            HostDomain::Boottime => self.boottime_ns,
        }
    }
}

/// The raw device reading: either ticks of a counter with a known rate, or
/// nanoseconds directly (`%globaltimer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceReading {
    Ns(u64),
    Ticks { ticks: u64, hz: u64 },
}

impl DeviceReading {
    /// Device time in ns, exact (floor) in integer arithmetic.
    pub fn to_ns(&self) -> Result<u64, PairError> {
        match *self {
            DeviceReading::Ns(ns) => Ok(ns),
            DeviceReading::Ticks { hz: 0, .. } => Err(PairError::ZeroFrequency),
            DeviceReading::Ticks { ticks, hz } => {
                let ns = u128::from(ticks) * 1_000_000_000 / u128::from(hz);
                u64::try_from(ns).map_err(|_| PairError::DeviceTimeOverflow)
            }
        }
    }

    /// Resolution of one reading in ns (at least 1).
    pub fn quantum_ns(&self) -> u64 {
        match *self {
            DeviceReading::Ns(_) => 1,
            DeviceReading::Ticks { hz: 0, .. } => 1,
            DeviceReading::Ticks { hz, .. } => 1_000_000_000u64.div_ceil(hz).max(1),
        }
    }
}

/// One correlated sample of a device clock against the host clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotPair {
    pub device: DeviceId,
    pub source: SourceKind,
    pub reading: DeviceReading,
    /// Host clocks read just before asking the device.
    pub before: HostStamp,
    /// Host clocks read just after the answer arrived.
    pub after: HostStamp,
    /// BOOTTIME stamped by the kernel inside the call, where the source has
    /// one (KFD's `system_clock_counter`); kept for audits, not fitted.
    pub in_call_boottime_ns: Option<i64>,
    /// Running sample number of this source.
    pub seq: u64,
    /// Burst the sample belongs to; the fitter keeps the tightest per burst.
    pub burst: u64,
}

/// Why a pair cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    #[error("device counter frequency is zero")]
    ZeroFrequency,
    #[error("device time does not fit in 64-bit nanoseconds")]
    DeviceTimeOverflow,
    #[error("host clock went backwards across the bracket ({width_ns} ns)")]
    NegativeBracket { width_ns: i64 },
    #[error("host/device difference overflows 64-bit nanoseconds")]
    OffsetOverflow,
}

impl SnapshotPair {
    /// Bracket width in `domain`: the error bound of this pair is half of it.
    pub fn bracket_ns(&self, domain: HostDomain) -> Result<u64, PairError> {
        let width = self
            .after
            .get(domain)
            .saturating_sub(self.before.get(domain));
        u64::try_from(width).map_err(|_| PairError::NegativeBracket { width_ns: width })
    }

    /// Host time of the bracket's midpoint in `domain` (floor; overflow-free).
    pub fn midpoint_ns(&self, domain: HostDomain) -> Result<i64, PairError> {
        let width = self.bracket_ns(domain)?;
        let half = i64::try_from(width / 2).map_err(|_| PairError::OffsetOverflow)?;
        Ok(self.before.get(domain) + half)
    }

    /// Device time in ns.
    pub fn device_ns(&self) -> Result<u64, PairError> {
        self.reading.to_ns()
    }

    /// `host midpoint - device time`, the quantity the fitter models.
    pub fn offset_ns(&self, domain: HostDomain) -> Result<i64, PairError> {
        let diff = i128::from(self.midpoint_ns(domain)?) - i128::from(self.device_ns()?);
        i64::try_from(diff).map_err(|_| PairError::OffsetOverflow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(t: i64) -> HostStamp {
        HostStamp {
            realtime_ns: t,
            monotonic_ns: t - 1_000,
            boottime_ns: t - 900,
        }
    }

    fn pair(before: i64, after: i64, reading: DeviceReading) -> SnapshotPair {
        SnapshotPair {
            device: DeviceId {
                vendor: Vendor::Synthetic,
                index: 0,
            },
            source: SourceKind::Synthetic,
            reading,
            before: stamp(before),
            after: stamp(after),
            in_call_boottime_ns: None,
            seq: 0,
            burst: 0,
        }
    }

    #[test]
    fn ticks_convert_exactly_with_integer_floor() {
        // 100 MHz counter (AMD s_memrealtime / KFD counter): 10 ns per tick.
        let r = DeviceReading::Ticks {
            ticks: 123_456_789_012,
            hz: 100_000_000,
        };
        assert_eq!(r.to_ns().unwrap(), 1_234_567_890_120);
        assert_eq!(r.quantum_ns(), 10);
        // 3 ticks at 7 Hz is 428571428.57 ns: floor.
        let r = DeviceReading::Ticks { ticks: 3, hz: 7 };
        assert_eq!(r.to_ns().unwrap(), 428_571_428);
    }

    #[test]
    fn zero_frequency_and_overflow_are_errors_not_panics() {
        let r = DeviceReading::Ticks { ticks: 1, hz: 0 };
        assert_eq!(r.to_ns(), Err(PairError::ZeroFrequency));
        let r = DeviceReading::Ticks {
            ticks: u64::MAX,
            hz: 1,
        };
        assert_eq!(r.to_ns(), Err(PairError::DeviceTimeOverflow));
    }

    #[test]
    fn bracket_midpoint_and_offset() {
        let p = pair(1_000_000, 1_001_801, DeviceReading::Ns(999_000));
        assert_eq!(p.bracket_ns(HostDomain::Realtime).unwrap(), 1_801);
        assert_eq!(p.midpoint_ns(HostDomain::Realtime).unwrap(), 1_000_900);
        assert_eq!(p.offset_ns(HostDomain::Realtime).unwrap(), 1_900);
        assert_eq!(p.offset_ns(HostDomain::Monotonic).unwrap(), 900);
    }

    #[test]
    fn negative_bracket_is_an_error() {
        let p = pair(2_000, 1_000, DeviceReading::Ns(5));
        assert!(matches!(
            p.bracket_ns(HostDomain::Realtime),
            Err(PairError::NegativeBracket { width_ns: -1000 })
        ));
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let mut p = pair(0, 1, DeviceReading::Ns(u64::MAX));
        p.before.realtime_ns = i64::MIN;
        p.after.realtime_ns = i64::MAX;
        // Width saturates, offset does not fit: errors, no panic.
        assert!(p.bracket_ns(HostDomain::Realtime).is_ok());
        assert!(p.offset_ns(HostDomain::Realtime).is_err());
    }
}
