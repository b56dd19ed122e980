//! The Rust reader of the offsets file.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::host_map::HostMap;
use super::layout::{
    self, CORE_ANCHOR_WORD, CORE_WORDS, DeviceMap, NodeMap, PAYLOAD_OFFSET, PAYLOAD_WORDS, Record,
    flags,
};
use super::shm::{self, Mapping};
use super::{PublishError, realtime_now_ns};

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
    /// Serves stamps older than the ring (`with_history`).
    history: Option<HostMap>,
}

/// What a ring scan found for a stamp.
enum Pick {
    /// Nothing published yet.
    Empty,
    /// The core words of the newest record anchored at or before the stamp.
    Found([u64; CORE_WORDS]),
    /// Every record in the ring is anchored after the stamp.
    TooOld { oldest_anchor_ns: i64 },
}

/// The newest ring record anchored at or before `t` (inside a seqlock
/// read: only the anchors are loaded until the record is found).
fn pick(m: &Mapping, t: i64) -> Pick {
    let mut oldest_anchor_ns = None;
    for (_, base) in m.ring_slots() {
        let anchor = m.load(base + 8 * (1 + CORE_ANCHOR_WORD)) as i64;
        if anchor <= t {
            let mut core = [0u64; CORE_WORDS];
            m.load_words(base + 8, &mut core);
            return Pick::Found(core);
        }
        oldest_anchor_ns = Some(anchor);
    }
    match oldest_anchor_ns {
        None => Pick::Empty,
        Some(oldest_anchor_ns) => Pick::TooOld { oldest_anchor_ns },
    }
}

/// `to_global` of a ring record at the stamp's own time.
fn judge(core: &[u64; CORE_WORDS], t: i64) -> Result<(i64, u64), PublishError> {
    let (flags, valid_until_ns) = layout::decode_status(core);
    if flags & flags::VALID == 0 {
        return Err(PublishError::NoData);
    }
    if flags & flags::STALE != 0 || t > valid_until_ns {
        return Err(PublishError::Stale {
            valid_until_ns,
            now_ns: t,
            flags,
        });
    }
    Ok(layout::decode_node(core).to_global(t))
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
        self.read_words(PAYLOAD_OFFSET, &mut p)?;
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

    /// Opens and validates the header (magic, version — a v1 file is
    /// refused with `BadVersion` — and geometry).
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
        let io_err = |error: std::io::Error| match error.kind() {
            std::io::ErrorKind::UnexpectedEof => PublishError::BadFormat("file too short"),
            _ => PublishError::Io {
                path: path.display().to_string(),
                error,
            },
        };
        layout::check_header(&shm::read_header(&file).map_err(io_err)?)?;
        let map = Mapping::map(&file, false).map_err(io_err)?;
        Ok(Self {
            path,
            map,
            history: None,
        })
    }

    /// Serves stamps older than the ring's oldest record from the agent's
    /// history (e.g. `HostMap::from_history(&history::load(path)?, host)`)
    /// instead of refusing them with [`PublishError::TooOld`].
    pub fn with_history(mut self, history: HostMap) -> Self {
        self.history = Some(history);
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole record (node map, kernel clocks, devices), unchecked for
    /// freshness: callers inspecting a stale file want to see it.
    pub fn read_record(&self) -> Result<Record, PublishError> {
        let mut p = [0u64; PAYLOAD_WORDS];
        self.read_words(PAYLOAD_OFFSET, &mut p)?;
        Ok(layout::decode(&p))
    }

    /// The node map and status only (fewer words under the seqlock).
    pub fn snapshot(&self) -> Result<Snapshot, PublishError> {
        let mut p = [0u64; CORE_WORDS];
        self.read_words(PAYLOAD_OFFSET, &mut p)?;
        let (flags, valid_until_ns) = layout::decode_status(&p);
        Ok(Snapshot {
            flags,
            valid_until_ns,
            node: layout::decode_node(&p),
        })
    }

    /// Maps a local CLOCK_REALTIME stamp to `(global_ns, bound_ns)`, judged
    /// at the stamp's own time: with the newest ring record anchored at or
    /// before the stamp, if that record is valid at the stamp (`VALID`,
    /// not `STALE`, stamp ≤ its `valid_until_ns`; "now" is not read). A
    /// stamp anchored before every record in the ring is
    /// [`PublishError::TooOld`] (or served by `with_history`); one past
    /// the newest record's validity is [`PublishError::Stale`].
    pub fn to_global(&self, local_ns: i64) -> Result<(i64, u64), PublishError> {
        match self.read(|m| pick(m, local_ns))? {
            Pick::Empty => Err(PublishError::NoData),
            Pick::Found(core) => judge(&core, local_ns),
            Pick::TooOld { oldest_anchor_ns } => match &self.history {
                Some(h) => {
                    let g = h.to_global(local_ns);
                    Ok((g.global_ns(), g.bound_ns))
                }
                None => Err(PublishError::TooOld {
                    local_ns,
                    oldest_anchor_ns,
                }),
            },
        }
    }

    /// Maps a GPU clock reading of device `device_id` to the global
    /// timeline: the current record's device map gives the host
    /// CLOCK_REALTIME time ([`DeviceMap::to_host`]), judged at that time
    /// (entry `VALID`, host time ≤ its `valid_until_ns`), and `to_global`
    /// maps that; the bound is the device map's `bound_ns` plus the node
    /// map's bound there.
    pub fn device_to_global(
        &self,
        device_id: u32,
        device_ns: i64,
    ) -> Result<(i64, u64), PublishError> {
        let record = self.read_record()?;
        let d = record
            .devices
            .iter()
            .find(|d| d.device_id == device_id)
            .ok_or(PublishError::NoDevice(device_id))?;
        let host_ns = device_host_time(d, device_ns)?;
        let (global, bound) = self.to_global(host_ns)?;
        Ok((global, bound.saturating_add(d.bound_ns)))
    }

    /// Records the ring holds now (for tools and tests).
    pub fn ring(&self) -> Result<Vec<(u64, Snapshot)>, PublishError> {
        self.read(|m| {
            let mut out = Vec::new();
            for (n, base) in m.ring_slots() {
                let mut core = [0u64; CORE_WORDS];
                m.load_words(base + 8, &mut core);
                let (flags, valid_until_ns) = layout::decode_status(&core);
                out.push((
                    n,
                    Snapshot {
                        flags,
                        valid_until_ns,
                        node: layout::decode_node(&core),
                    },
                ));
            }
            out.reverse();
            out
        })
    }

    fn read_words(&self, byte_offset: usize, out: &mut [u64]) -> Result<(), PublishError> {
        self.read(|m| m.load_words(byte_offset, out))
    }

    /// A seqlock read: retries `copy` until no write overlapped it.
    fn read<R>(&self, mut copy: impl FnMut(&Mapping) -> R) -> Result<R, PublishError> {
        for _ in 0..SPIN_ATTEMPTS {
            if let Some(r) = self.map.seq_try_read(&mut copy) {
                return Ok(r);
            }
            std::hint::spin_loop();
        }
        let since = std::time::Instant::now();
        while since.elapsed() < BUSY_TIMEOUT {
            if let Some(r) = self.map.seq_try_read(&mut copy) {
                return Ok(r);
            }
            // Sleep rather than yield: a preempted writer needs the CPU.
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        Err(PublishError::Busy)
    }
}

/// A device map applied at the device stamp's own time: the host time, or
/// `NoData` (entry not `VALID`) / `Stale` (host time past the entry's
/// `valid_until_ns`).
pub fn device_host_time(d: &DeviceMap, device_ns: i64) -> Result<i64, PublishError> {
    if d.flags & layout::device_flags::VALID == 0 {
        return Err(PublishError::NoData);
    }
    let host_ns = d.to_host(device_ns);
    if host_ns > d.valid_until_ns {
        return Err(PublishError::Stale {
            valid_until_ns: d.valid_until_ns,
            now_ns: host_ns,
            flags: u32::from(d.flags),
        });
    }
    Ok(host_ns)
}
