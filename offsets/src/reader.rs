//! The Rust reader of the offsets file.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::layout::{self, CORE_WORDS, NodeMap, PAYLOAD_WORDS, Record, flags};
use super::shm::Mapping;
use super::{PublishError, realtime_coarse_ns, realtime_now_ns};

/// Spinning attempts before the reader starts yielding and watching time.
const SPIN_ATTEMPTS: usize = 64;
/// How long a reader waits for a writer that is mid-write (it may have been
/// preempted, or killed mid-write) before failing closed with
/// [`PublishError::Busy`].
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(50);

/// A read-only mapping of a published offsets file.
pub struct OffsetsReader {
    path: PathBuf,
    map: Mapping,
}

/// A consistent copy of the node map with its status, enough for
/// `to_global`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub flags: u32,
    pub valid_until_ns: i64,
    pub node: NodeMap,
}

impl Snapshot {
    /// Fails closed unless the record holds fresh data at `now_ns`.
    pub fn check_fresh(&self, now_ns: i64) -> Result<(), PublishError> {
        if self.flags & flags::VALID == 0 {
            return Err(PublishError::NoData);
        }
        if self.flags & flags::STALE != 0 || now_ns > self.valid_until_ns {
            return Err(PublishError::Stale {
                valid_until_ns: self.valid_until_ns,
                now_ns,
                flags: self.flags,
            });
        }
        Ok(())
    }
}

/// The clock's state, as ClockBound's and fbclock's; the same values as
/// the C reader's `enum clockmesh_clock_status` and the Python reader's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum ClockStatus {
    /// Nothing published yet: no interval.
    Unknown = 0,
    /// A current solve.
    Synchronised = 1,
    /// Carried forward: the reference was unreachable.
    Holdover = 2,
    /// Past its validity or flagged stale: free-running.
    Stale = 3,
}

impl ClockStatus {
    /// The state of a record with `flags` valid until `valid_until_ns`, at `now_ns`.
    pub fn of(flags: u32, now_ns: i64, valid_until_ns: i64) -> Self {
        if flags & flags::VALID == 0 {
            Self::Unknown
        } else if flags & flags::STALE != 0 || now_ns > valid_until_ns {
            Self::Stale
        } else if flags & flags::HOLDOVER != 0 {
            Self::Holdover
        } else {
            Self::Synchronised
        }
    }
}

/// Global time now as an interval holding the true global time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// global(now) − bound(now); `i64::MIN` when the status is unknown.
    pub earliest_ns: i64,
    /// global(now) + bound(now); `i64::MAX` when the status is unknown.
    pub latest_ns: i64,
    pub status: ClockStatus,
    /// The agent restart counter of the record.
    pub epoch: u64,
}

impl OffsetsReader {
    /// Global time now: reads CLOCK_REALTIME and the record, and returns
    /// [global − bound, global + bound] at this instant (the bound grown
    /// over the record's age) with the clock's state. Holdover and stale
    /// records still give their widening interval; only a file that cannot
    /// be read is an error.
    pub fn now(&self) -> Result<Now, PublishError> {
        let mut p = [0u64; CORE_WORDS];
        self.read_words(&mut p)?;
        let now_ns = realtime_now_ns();
        let (flags, valid_until_ns) = layout::decode_status(&p);
        let status = ClockStatus::of(flags, now_ns, valid_until_ns);
        let epoch = layout::decode_epoch(&p);
        if status == ClockStatus::Unknown {
            return Ok(Now {
                earliest_ns: i64::MIN,
                latest_ns: i64::MAX,
                status,
                epoch,
            });
        }
        let (global, bound) = layout::decode_node(&p).to_global(now_ns);
        let bound = i64::try_from(bound).unwrap_or(i64::MAX);
        Ok(Now {
            earliest_ns: global.saturating_sub(bound),
            latest_ns: global.saturating_add(bound),
            status,
            epoch,
        })
    }

    /// Opens and validates the header (magic, version).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, PublishError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|error| {
            if error.kind() == std::io::ErrorKind::NotFound {
                PublishError::Missing {
                    path: path.display().to_string(),
                }
            } else {
                PublishError::Io {
                    path: path.display().to_string(),
                    error,
                }
            }
        })?;
        let map = Mapping::map(&file, false).map_err(|error| match error.kind() {
            std::io::ErrorKind::UnexpectedEof => PublishError::BadFormat("file too short"),
            _ => PublishError::Io {
                path: path.display().to_string(),
                error,
            },
        })?;
        layout::check_header(map.load(0), map.load(8))?;
        Ok(Self { path, map })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole record (node map, kernel clocks, devices), unchecked for
    /// freshness: callers inspecting a stale file want to see it.
    pub fn read_record(&self) -> Result<Record, PublishError> {
        let mut p = [0u64; PAYLOAD_WORDS];
        self.read_words(&mut p)?;
        Ok(layout::decode(&p))
    }

    /// The node map and status only (fewer words under the seqlock).
    pub fn snapshot(&self) -> Result<Snapshot, PublishError> {
        let mut p = [0u64; CORE_WORDS];
        self.read_words(&mut p)?;
        let (flags, valid_until_ns) = layout::decode_status(&p);
        Ok(Snapshot {
            flags,
            valid_until_ns,
            node: layout::decode_node(&p),
        })
    }

    /// Maps a local CLOCK_REALTIME stamp to `(global_ns, bound_ns)`, failing
    /// closed when the published data is missing or stale now (checked
    /// with [`realtime_coarse_ns`]).
    pub fn to_global(&self, local_ns: i64) -> Result<(i64, u64), PublishError> {
        let snap = self.snapshot()?;
        snap.check_fresh(realtime_coarse_ns())?;
        Ok(snap.node.to_global(local_ns))
    }

    fn read_words(&self, out: &mut [u64]) -> Result<(), PublishError> {
        for _ in 0..SPIN_ATTEMPTS {
            if self.map.seq_try_read(out) {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        let since = std::time::Instant::now();
        while since.elapsed() < BUSY_TIMEOUT {
            if self.map.seq_try_read(out) {
                return Ok(());
            }
            // Sleep rather than yield: a preempted writer needs the CPU.
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        Err(PublishError::Busy)
    }
}
