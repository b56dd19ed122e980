//! The agent's writer of the offsets file.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::checksum;
use super::layout::{
    self, CORE_WORDS, FILE_LEN, HEADER_LEN, MAX_DEVICES, PAYLOAD_OFFSET, PAYLOAD_WORDS,
    RECORD_CHECKSUM_OFFSET, RING_HEAD_OFFSET, RING_SLOTS, Record, SLOT_WORDS, flags,
};
use super::shm::{self, Mapping};
use super::{PublishError, realtime_now_ns};

/// How long `open` waits for a lock someone else holds before it reports
/// [`PublishError::Locked`]. The lock belongs to an open file description,
/// which outlives its writer briefly: in a child forked by any thread of
/// the process until that child's `exec` closes it, and in a previous agent
/// until the kernel has finished tearing it down. Another live agent holds
/// it for good, so the wait only delays that error.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn lock_exclusively(file: &File) -> Result<(), std::fs::TryLockError> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match file.try_lock() {
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            result => return result,
        }
    }
}

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
    /// unreadable (another layout version included: a v1 file is replaced).
    /// An existing valid record is kept, marked [`flags::HOLDOVER`] (with
    /// the newest ring record, the same map): readers go on answering
    /// with it, its bound growing, until its validity and holdover ceiling
    /// run out or this writer publishes. The agent epoch in the current
    /// record is incremented, so readers see the restart; the ring's
    /// intact records are kept.
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
        lock_exclusively(&file).map_err(|e| match e {
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
    /// `epoch` is overwritten with this writer's epoch. It becomes the
    /// current record and the newest of the ring: a new ring entry when its
    /// map (window, node map, epoch) differs from the newest one, else the
    /// newest entry is updated in place (flags, validity), so republishing
    /// a window with new device maps does not use up the ring.
    pub fn publish(&self, record: &Record) -> Result<(), PublishError> {
        if record.devices.len() > MAX_DEVICES {
            return Err(PublishError::TooManyDevices(record.devices.len()));
        }
        let mut r = record.clone();
        r.epoch = self.epoch;
        self.write(&r);
        Ok(())
    }

    /// Flags the current record (and the newest ring entry, the same map)
    /// stale: readers refuse it at once, holdover or not (the estimate must
    /// not be used). Older ring entries keep serving stamps of their own
    /// spans.
    pub fn mark_stale(&self) {
        let mut r = self.current();
        r.flags |= flags::STALE;
        self.write(&r);
    }

    /// Flags the current record (and the newest ring entry, the same map)
    /// holdover: no update will follow from this writer (the agent is
    /// stopping). Readers carry it forward while the state rule allows —
    /// within its validity, then while its grown bound is within its
    /// holdover ceiling — and a restarted writer keeps it so until its
    /// first result. Nothing to do without an estimate, or when it is
    /// flagged holdover already.
    pub fn mark_holdover(&self) {
        let mut r = self.current();
        if r.flags & flags::VALID == 0 || r.flags & flags::HOLDOVER != 0 {
            return;
        }
        r.flags |= flags::HOLDOVER;
        self.write(&r);
    }

    /// The record as currently published.
    pub fn current(&self) -> Record {
        let mut p = [0u64; PAYLOAD_WORDS];
        // Only this writer stores, so one attempt is consistent.
        let _ = self
            .map
            .seq_try_read(|m| m.load_words(PAYLOAD_OFFSET, &mut p));
        layout::decode(&p)
    }

    /// Records in the ring now (at most [`RING_SLOTS`]).
    pub fn ring_len(&self) -> usize {
        self.map.ring_slots().count()
    }

    fn write(&self, r: &Record) {
        let payload = layout::encode(r);
        let sum = checksum::of_words(&payload);
        let head = self.map.load(RING_HEAD_OFFSET);
        let mut newest = [0u64; SLOT_WORDS];
        if head != 0 {
            self.map.load_words(layout::slot_offset(head), &mut newest);
        }
        let core = &payload[..CORE_WORDS];
        let newest_core = &newest[1..=CORE_WORDS];
        let same_map = head != 0
            && newest[0] == head
            && layout::decode_window(newest_core) == r.window
            && layout::decode_epoch(newest_core) == r.epoch
            && layout::decode_node(newest_core) == r.node;
        let n = if same_map { head } else { head + 1 };
        let slot = layout::encode_slot(n, core, r.holdover_max_bound_ns);
        self.map.seq_write(&[
            (PAYLOAD_OFFSET, &payload),
            (RECORD_CHECKSUM_OFFSET, &[sum]),
            (layout::slot_offset(n), &slot),
            (RING_HEAD_OFFSET, &[n]),
        ]);
    }
}

/// True when `path` exists with the right size, magic and version.
fn existing_file_is_usable(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    shm::read_header(&file).is_ok_and(|h| layout::check_header(&h).is_ok())
        && file.metadata().is_ok_and(|m| m.len() >= FILE_LEN as u64)
}

/// Writes a fresh file (header, empty record) beside `path` and renames it
/// into place, so readers see either no file or a complete one.
fn create_atomically(path: &Path) -> std::io::Result<()> {
    let mut bytes = vec![0u8; FILE_LEN];
    for (i, w) in layout::header_words(realtime_now_ns().0).iter().enumerate() {
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

/// On (re)start: keep the last record but flag it holdover (readers keep
/// answering with it while the state rule allows: within its validity,
/// then its holdover ceiling); a record that a killed writer left
/// half-written (odd sequence, or a checksum that does not match) is
/// dropped instead. Ring entries that are not intact (torn, or out of
/// place) are cleared and the head moved to the newest intact one, which
/// is flagged holdover like the current record. A record flagged stale
/// stays stale. Returns the new epoch and whether a torn record was
/// dropped.
fn restart_record(map: &Mapping) -> (u64, bool) {
    let mut p = [0u64; PAYLOAD_WORDS];
    let mut sum = 0;
    let read = map
        .seq_try_read(|m| {
            m.load_words(PAYLOAD_OFFSET, &mut p);
            sum = m.load(RECORD_CHECKSUM_OFFSET);
        })
        .is_some();
    // A file never written holds zeros (no checksum yet): empty, not torn.
    let never_written = sum == 0 && p.iter().all(|&w| w == 0);
    let consistent = read && (never_written || sum == checksum::of_words(&p));
    let mut r = layout::decode(&p);
    if !consistent {
        r = Record {
            epoch: r.epoch,
            ..Record::default()
        };
    }
    if r.flags & flags::VALID != 0 {
        r.flags |= flags::HOLDOVER;
    }
    r.epoch = r.epoch.wrapping_add(1);
    let payload = layout::encode(&r);

    // The ring: only this process writes now (it holds the lock).
    let head = map.load(RING_HEAD_OFFSET);
    let mut newest = 0;
    let mut slots = vec![[0u64; SLOT_WORDS]; RING_SLOTS];
    for (i, s) in slots.iter_mut().enumerate() {
        map.load_words(layout::RING_OFFSET + i * layout::SLOT_LEN, s);
        let n = s[0];
        let in_place =
            n != 0 && layout::slot_offset(n) == layout::RING_OFFSET + i * layout::SLOT_LEN;
        let live = n <= head && head - n < RING_SLOTS as u64;
        if in_place && live && layout::slot_is_intact(s, n) {
            newest = newest.max(n);
        } else {
            *s = [0; SLOT_WORDS];
        }
    }
    let mut parts: Vec<(usize, Vec<u64>)> = Vec::new();
    for (i, s) in slots.iter().enumerate() {
        let mut s = *s;
        if s[0] != 0 && s[0] == newest && s[1] as u32 & flags::VALID != 0 {
            s[1] |= u64::from(flags::HOLDOVER);
            s = layout::encode_slot(newest, &s[1..=CORE_WORDS], s[layout::SLOT_HOLDOVER_WORD]);
        }
        parts.push((layout::RING_OFFSET + i * layout::SLOT_LEN, s.to_vec()));
    }
    let sum = checksum::of_words(&payload);
    let mut all: Vec<(usize, &[u64])> = vec![
        (PAYLOAD_OFFSET, &payload),
        (RECORD_CHECKSUM_OFFSET, std::slice::from_ref(&sum)),
    ];
    all.extend(parts.iter().map(|(o, s)| (*o, s.as_slice())));
    all.push((RING_HEAD_OFFSET, std::slice::from_ref(&newest)));
    map.seq_write(&all);
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
