//! The agent's writer of the offsets file.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::layout::{self, FILE_LEN, HEADER_LEN, MAX_DEVICES, PAYLOAD_WORDS, Record, flags};
use super::shm::Mapping;
use super::{PublishError, realtime_now_ns};

/// Owns the offsets file; one per node (enforced with an exclusive lock).
pub struct OffsetsWriter {
    path: PathBuf,
    map: Mapping,
    epoch: u64,
    dropped_torn_record: bool,
    // Holds the advisory lock for the writer's lifetime.
    _file: File,
}

impl OffsetsWriter {
    /// Opens the file for publication, creating it atomically if missing or
    /// unreadable. An existing valid record is kept, marked
    /// [`flags::STALE`], and the agent epoch is incremented.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, PublishError> {
        let path = path.as_ref().to_path_buf();
        let io_err = |error| PublishError::Io {
            path: path.display().to_string(),
            error,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io_err)?;
        }
        if !existing_file_is_usable(&path) {
            create_atomically(&path).map_err(io_err)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err)?;
        file.try_lock().map_err(|e| match e {
            std::fs::TryLockError::WouldBlock => PublishError::Locked,
            std::fs::TryLockError::Error(error) => io_err(error),
        })?;
        let map = Mapping::map(&file, true).map_err(io_err)?;
        let (epoch, dropped_torn_record) = restart_record(&map);
        Ok(Self {
            path,
            map,
            epoch,
            dropped_torn_record,
            _file: file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The agent epoch this writer stamps on every record.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether `open` found a record a killed writer left half-written
    /// (and dropped it rather than keep it as stale): worth a warning.
    pub fn dropped_torn_record(&self) -> bool {
        self.dropped_torn_record
    }

    /// Publishes a record (seqlock write; never blocks). The record's
    /// `epoch` is overwritten with this writer's epoch.
    pub fn publish(&self, record: &Record) -> Result<(), PublishError> {
        if record.devices.len() > MAX_DEVICES {
            return Err(PublishError::TooManyDevices(record.devices.len()));
        }
        let mut r = record.clone();
        r.epoch = self.epoch;
        self.map.seq_write(&layout::encode(&r));
        Ok(())
    }

    /// Flags the current record stale (e.g. the estimator lost sync).
    pub fn mark_stale(&self) {
        let mut r = self.current();
        r.flags |= flags::STALE;
        self.map.seq_write(&layout::encode(&r));
    }

    /// The record as currently published.
    pub fn current(&self) -> Record {
        let mut p = [0u64; PAYLOAD_WORDS];
        // Only this writer stores, so one attempt is consistent.
        let _ = self.map.seq_try_read(&mut p);
        layout::decode(&p)
    }
}

/// True when `path` exists with the right size, magic and version.
fn existing_file_is_usable(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    let Ok(map) = Mapping::map(&file, false) else {
        return false;
    };
    layout::check_header(map.load(0), map.load(8)).is_ok()
}

/// Writes a fresh file (header, empty record) beside `path` and renames it
/// into place, so readers see either no file or a complete one.
fn create_atomically(path: &Path) -> std::io::Result<()> {
    let mut bytes = vec![0u8; FILE_LEN];
    for (i, w) in layout::header_words(realtime_now_ns()).iter().enumerate() {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    debug_assert_eq!(HEADER_LEN, 64);
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = File::create(&tmp)?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// On (re)start: keep the last record but flag it stale; a record that a
/// killed writer left half-written (odd sequence) is dropped instead.
/// Returns the new epoch and whether a torn record was dropped.
fn restart_record(map: &Mapping) -> (u64, bool) {
    let mut p = [0u64; PAYLOAD_WORDS];
    let consistent = map.seq() & 1 == 0 && map.seq_try_read(&mut p);
    let mut r = layout::decode(&p);
    if !consistent {
        r = Record {
            epoch: r.epoch,
            ..Record::default()
        };
    }
    if r.flags & flags::VALID != 0 {
        r.flags |= flags::STALE;
    }
    r.epoch = r.epoch.wrapping_add(1);
    map.seq_write(&layout::encode(&r));
    (r.epoch, !consistent)
}

/// Samples the REALTIME−MONOTONIC and REALTIME−BOOTTIME offsets, taking the
/// tightest of a few bracketing reads.
pub fn sample_kernel_clocks() -> layout::KernelClocks {
    use nix::time::{ClockId, clock_gettime};
    let ns = |c: ClockId| {
        clock_gettime(c)
            .map(|t| t.tv_sec() * 1_000_000_000 + t.tv_nsec())
            .unwrap_or(0)
    };
    let mut best = (i64::MAX, layout::KernelClocks::default());
    for _ in 0..5 {
        let r0 = ns(ClockId::CLOCK_REALTIME);
        let mono = ns(ClockId::CLOCK_MONOTONIC);
        let boot = ns(ClockId::CLOCK_BOOTTIME);
        let r1 = ns(ClockId::CLOCK_REALTIME);
        let mid = r0 + (r1 - r0) / 2;
        if r1 - r0 < best.0 {
            best = (
                r1 - r0,
                layout::KernelClocks {
                    realtime_minus_monotonic_ns: mid - mono,
                    realtime_minus_boottime_ns: mid - boot,
                    sampled_at_ns: mid,
                },
            );
        }
    }
    best.1
}
