//! clockmesh-offsets: this node's published clock offsets — what a reader
//! depends on, nothing more (no agent, no eBPF, no async runtime).
//!
//! - [`OffsetsWriter`]: the agent's side. A fixed-layout, versioned,
//!   little-endian file (default [`DEFAULT_PATH`]), memory-mapped and updated
//!   with a seqlock: readers never see a torn record and never block the
//!   writer. Created atomically (temp file + rename). On restart the last
//!   record stays readable, flagged holdover, until fresh data arrives.
//! - [`OffsetsReader`]: the Rust reader; `to_global` places a stamp with the
//!   ring record that covers it, at its own time, and fails closed
//!   (missing, bad format/version, no data, stale, too old), like fbclock's
//!   `DATA_STALE`. Past a record's validity it answers in holdover, the
//!   bound growing at the published rate, up to the record's ceiling
//!   ([`Snapshot::status`]: the one state rule, shared with `now()`).
//! - [`history`]: per-window results as JSON lines, for offline trace merge.
//! - [`HostMap`]: a host's time-varying map local → global from anchors
//!   (history entries, or a hook's start and stop records);
//!   [`HostMap::to_global`] places a stamp at its own time.
//!
//! The byte layout is specified in `docs/offsets-format.md`; the C reader
//! (`hook/include/clockmesh.h`) and the Python reader (`python/clockmesh`)
//! implement the same spec.

pub mod checksum;
pub mod device_map;
pub mod history;
pub mod host_map;
pub mod layout;
mod reader;
mod shm;
mod writer;

pub use device_map::PublishedDeviceMap;
pub use host_map::{Anchor, GlobalTime, HostMap, Segment};
pub use layout::{
    DeviceKind, DeviceMap, KernelClocks, MAX_DEVICES, NodeMap, Record, device_flags, flags,
};
pub use reader::{ClockStatus, Now, OffsetsReader, Snapshot, device_host_time};
pub use writer::{OffsetsWriter, sample_kernel_clocks};

/// Time as types: local and global instants, spans.
pub use clockmesh_time::{GlobalNs, LocalNs, Nanos};

/// Where the agent publishes by default.
pub const DEFAULT_PATH: &str = "/run/clockmesh/offsets";

/// Errors of the publication path. Readers map each to a fail-closed code.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("offsets file {path} is missing (is the clockmesh agent running?)")]
    Missing { path: String },
    #[error("offsets file is not a clockmesh offsets file: {0}")]
    BadFormat(&'static str),
    #[error("offsets file has layout version {found}, this reader understands {expected}")]
    BadVersion { found: u32, expected: u32 },
    #[error("offsets file holds no estimate yet")]
    NoData,
    #[error(
        "offsets are stale (valid until {valid_until_ns} ns, now {now_ns} ns, flags {flags:#x})"
    )]
    Stale {
        valid_until_ns: i64,
        now_ns: i64,
        flags: u32,
    },
    #[error("offsets record kept changing during the read (writer too busy)")]
    Busy,
    #[error(
        "stamp {local_ns} ns is older than the oldest record the offsets file keeps (anchored at {oldest_anchor_ns} ns)"
    )]
    TooOld {
        local_ns: i64,
        oldest_anchor_ns: i64,
    },
    #[error("offsets record has no map for device {0}")]
    NoDevice(u32),
    #[error("record has {0} device maps, at most {MAX_DEVICES} fit")]
    TooManyDevices(usize),
    #[error("offsets file is locked by another writer (another agent running?)")]
    Locked,
    #[error("offsets file I/O on {path}: {error}")]
    Io { path: String, error: std::io::Error },
}

/// CLOCK_REALTIME at tick resolution (1-4 ms), for freshness checks: much
/// cheaper than a precise read, and `valid_until` lies seconds ahead.
pub fn realtime_coarse_ns() -> LocalNs {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_REALTIME_COARSE)
        .map(|t| LocalNs(t.tv_sec() * 1_000_000_000 + t.tv_nsec()))
        .unwrap_or_else(|_| realtime_now_ns())
}

/// CLOCK_REALTIME now, ns since the epoch (one vDSO `clock_gettime`).
pub fn realtime_now_ns() -> LocalNs {
    use nix::time::{ClockId, clock_gettime};
    match clock_gettime(ClockId::CLOCK_REALTIME) {
        Ok(t) => LocalNs(t.tv_sec() * 1_000_000_000 + t.tv_nsec()),
        Err(_) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            LocalNs(i64::try_from(now.as_nanos()).unwrap_or(i64::MAX))
        }
    }
}
