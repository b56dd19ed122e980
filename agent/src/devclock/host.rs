//! Host clock reads for snapshot brackets.
//!
//! Before the device read the clocks are read BOOTTIME, MONOTONIC, REALTIME
//! and after it REALTIME, MONOTONIC, BOOTTIME, so the REALTIME bracket (the
//! domain most traces use) is the tightest; the others are wider by a few
//! clock reads (~40 ns each in a VM).
use clockmesh_estimator::device::HostStamp;
use nix::time::{ClockId, clock_gettime};

use super::DevClockError;

fn read(clock: ClockId) -> Result<i64, DevClockError> {
    let ts = clock_gettime(clock).map_err(|e| DevClockError::HostClock(e.to_string()))?;
    Ok(ts.tv_sec() * 1_000_000_000 + ts.tv_nsec())
}

/// Stamp taken just before asking the device.
#[inline]
pub fn stamp_before() -> Result<HostStamp, DevClockError> {
    let boottime_ns = read(ClockId::CLOCK_BOOTTIME)?;
    let monotonic_ns = read(ClockId::CLOCK_MONOTONIC)?;
    let realtime_ns = read(ClockId::CLOCK_REALTIME)?;
    Ok(HostStamp {
        realtime_ns,
        monotonic_ns,
        boottime_ns,
    })
}

/// Stamp taken just after the device answered.
#[inline]
pub fn stamp_after() -> Result<HostStamp, DevClockError> {
    let realtime_ns = read(ClockId::CLOCK_REALTIME)?;
    let monotonic_ns = read(ClockId::CLOCK_MONOTONIC)?;
    let boottime_ns = read(ClockId::CLOCK_BOOTTIME)?;
    Ok(HostStamp {
        realtime_ns,
        monotonic_ns,
        boottime_ns,
    })
}

/// CPU time consumed so far by this process (all threads) and by the
/// calling thread, in ns: the CPU cost of sampling.
pub fn cpu_time_ns() -> Result<(i64, i64), DevClockError> {
    Ok((
        read(ClockId::CLOCK_PROCESS_CPUTIME_ID)?,
        read(ClockId::CLOCK_THREAD_CPUTIME_ID)?,
    ))
}

/// CLOCK_REALTIME now (ns).
pub fn realtime_ns() -> Result<i64, DevClockError> {
    read(ClockId::CLOCK_REALTIME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bracket_is_ordered_and_realtime_innermost() {
        let b = stamp_before().unwrap();
        let a = stamp_after().unwrap();
        assert!(a.realtime_ns >= b.realtime_ns);
        assert!(a.monotonic_ns >= b.monotonic_ns);
        assert!(a.boottime_ns >= b.boottime_ns);
        // BOOTTIME is read outermost, so its bracket contains MONOTONIC's.
        assert!(a.boottime_ns - b.boottime_ns >= a.monotonic_ns - b.monotonic_ns);
    }
}
