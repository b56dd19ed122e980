//! Measuring the maps that bring every probe timestamp into the node's
//! CLOCK_REALTIME (the clock XLA stamps traces with); the domain and map
//! types are pure and live in `clockmesh_core::stamps`.
//!
//! Each eBPF field has its own domain: `bpf_ktime_get_ns` is MONOTONIC,
//! `__sk_buff.tstamp` is REALTIME (RX software stamp), `hwtstamp` is the NIC's
//! PHC. The agent measures MONOTONIC→REALTIME (and PHC→REALTIME where a PHC
//! exists) by bracketed reads: read REALTIME, the other clock, REALTIME; the
//! other clock's instant lies inside the bracket, so the map's error is at
//! most half the bracket width. The tightest of many brackets wins.

use std::{fs, os::fd::AsRawFd, path::Path};

use nix::time::{ClockId, clock_gettime};

pub use clockmesh_core::stamps::{Bracket, ClockDomain, ClockMap, map_from_brackets};

pub fn now_ns(clock: ClockId) -> i64 {
    // clock_gettime cannot fail for these clock ids on Linux.
    clock_gettime(clock)
        .map(|t| t.tv_sec() * 1_000_000_000 + t.tv_nsec())
        .unwrap_or(0)
}

/// MONOTONIC → REALTIME from `samples` bracketed reads (a few hundred ns wide).
pub fn measure_monotonic_to_realtime(samples: usize) -> Option<ClockMap> {
    let brackets: Vec<Bracket> = (0..samples)
        .map(|_| Bracket {
            to_before: now_ns(ClockId::CLOCK_REALTIME),
            from: now_ns(ClockId::CLOCK_MONOTONIC),
            to_after: now_ns(ClockId::CLOCK_REALTIME),
        })
        .collect();
    map_from_brackets(ClockDomain::Monotonic, ClockDomain::Realtime, &brackets)
}

/// The PHC index of `interface`'s NIC, if it has one (`/sys/class/net/<if>/device/ptp/ptp<N>`).
pub fn phc_index(interface: &str) -> Option<u32> {
    let dir = Path::new("/sys/class/net")
        .join(interface)
        .join("device/ptp");
    fs::read_dir(dir).ok()?.find_map(|e| {
        let name = e.ok()?.file_name();
        name.to_str()?.strip_prefix("ptp")?.parse().ok()
    })
}

/// PHC → REALTIME through `PTP_SYS_OFFSET_EXTENDED` (sys, phc, sys triplets
/// taken by the driver as close together as it can).
pub fn measure_phc_to_realtime(index: u32) -> std::io::Result<ClockMap> {
    let dev = fs::File::open(format!("/dev/ptp{index}"))?;
    let triplets = phc_ioctl::sys_offset_extended(dev.as_raw_fd())?;
    let brackets: Vec<Bracket> = triplets
        .iter()
        .map(|[before, phc, after]| Bracket {
            to_before: *before,
            from: *phc,
            to_after: *after,
        })
        .collect();
    map_from_brackets(ClockDomain::Phc(index), ClockDomain::Realtime, &brackets)
        .ok_or_else(|| std::io::Error::other("PHC returned no valid sample"))
}

/// The one ioctl of this module; all its `unsafe` is here.
mod phc_ioctl {
    use std::os::fd::RawFd;

    pub const PTP_MAX_SAMPLES: usize = 25;

    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    pub struct PtpClockTime {
        pub sec: i64,
        pub nsec: u32,
        pub reserved: u32,
    }

    /// `struct ptp_sys_offset_extended` (linux/ptp_clock.h).
    #[repr(C)]
    pub struct PtpSysOffsetExtended {
        pub n_samples: u32,
        /// `clockid` since 6.12 (0 = CLOCK_REALTIME), reserved before.
        pub clockid: i32,
        pub rsv: [u32; 2],
        pub ts: [[PtpClockTime; 3]; PTP_MAX_SAMPLES],
    }

    nix::ioctl_readwrite!(ptp_sys_offset_extended_raw, b'=', 9, PtpSysOffsetExtended);

    pub fn sys_offset_extended(fd: RawFd) -> std::io::Result<Vec<[i64; 3]>> {
        let mut req = PtpSysOffsetExtended {
            n_samples: PTP_MAX_SAMPLES as u32,
            clockid: 0,
            rsv: [0; 2],
            ts: [[PtpClockTime::default(); 3]; PTP_MAX_SAMPLES],
        };
        // SAFETY: `req` is a valid, exclusively borrowed struct of the layout
        // the kernel expects for this request number; fd is owned by the caller.
        unsafe { ptp_sys_offset_extended_raw(fd, &mut req) }.map_err(std::io::Error::from)?;
        let ns = |t: PtpClockTime| t.sec * 1_000_000_000 + i64::from(t.nsec);
        let n = (req.n_samples as usize).min(PTP_MAX_SAMPLES);
        Ok(req.ts[..n]
            .iter()
            .map(|s| [ns(s[0]), ns(s[1]), ns(s[2])])
            .collect())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn layout_matches_uapi() {
            // 16-byte header + 25 × 3 × 16-byte ptp_clock_time.
            assert_eq!(std::mem::size_of::<PtpSysOffsetExtended>(), 1216);
            // _IOWR('=', 9, 1216) = dir 3 << 30 | size << 16 | '=' << 8 | 9
            let expected = (3u64 << 30) | (1216 << 16) | (0x3d << 8) | 9;
            let code: u64 = nix::request_code_readwrite!(b'=', 9, 1216);
            assert_eq!(code, expected);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_monotonic_map_is_tight_and_consistent() {
        let m = measure_monotonic_to_realtime(200).unwrap();
        assert!(m.bound_ns < 50_000, "bracket too wide: {m:?}");
        let realtime = now_ns(ClockId::CLOCK_REALTIME);
        let predicted = m.apply(now_ns(ClockId::CLOCK_MONOTONIC));
        // No clock step expected during the test; allow the bound plus scheduling.
        assert!((predicted - realtime).abs() < m.bound_ns + 1_000_000);
    }

    #[test]
    fn missing_phc_is_an_error_not_a_panic() {
        assert_eq!(phc_index("no-such-if0"), None);
        assert!(measure_phc_to_realtime(4095).is_err());
    }
}
