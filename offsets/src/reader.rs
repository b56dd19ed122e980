//! The Rust reader of the offsets file.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::host_map::HostMap;
use super::layout::{
    self, CORE_ANCHOR_WORD, CORE_WORDS, DeviceMap, HOLDOVER_MAX_BOUND_WORD, NodeMap,
    PAYLOAD_OFFSET, PAYLOAD_WORDS, Record, SLOT_HOLDOVER_WORD, STATE_WORDS, flags,
};
use super::shm::{self, Mapping};
use super::{GlobalNs, LocalNs, Nanos, PublishError, realtime_now_ns};

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
    /// The newest record anchored at or before the stamp.
    Found(Snapshot),
    /// Every record in the ring is anchored after the stamp.
    TooOld { oldest_anchor_ns: i64 },
}

/// The newest ring record anchored at or before `t` (inside a seqlock
/// read: only the anchors are loaded until the record is found).
fn pick(m: &Mapping, t: LocalNs) -> Pick {
    let mut oldest_anchor_ns = None;
    for (_, base) in m.ring_slots() {
        let anchor = m.load(base + 8 * (1 + CORE_ANCHOR_WORD)) as i64;
        if anchor <= t.0 {
            return Pick::Found(slot_snapshot(m, base));
        }
        oldest_anchor_ns = Some(anchor);
    }
    match oldest_anchor_ns {
        None => Pick::Empty,
        Some(oldest_anchor_ns) => Pick::TooOld { oldest_anchor_ns },
    }
}

/// The record in the ring slot at `base` (inside a seqlock read): its
/// core words and its holdover ceiling.
fn slot_snapshot(m: &Mapping, base: usize) -> Snapshot {
    let mut core = [0u64; CORE_WORDS];
    m.load_words(base + 8, &mut core);
    Snapshot::from_words(&core, m.load(base + 8 * SLOT_HOLDOVER_WORD))
}

/// A consistent copy of the node map with its status and holdover
/// ceiling: all that `to_global` and the clock's state need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub flags: u32,
    pub valid_until_ns: i64,
    pub node: NodeMap,
    /// Past `valid_until_ns` the record answers in holdover while its
    /// grown bound is at most this (0: never).
    pub holdover_max_bound_ns: u64,
}

impl Snapshot {
    /// From a record's core words and its holdover ceiling.
    fn from_words(core: &[u64], holdover_max_bound_ns: u64) -> Self {
        let (flags, valid_until_ns) = layout::decode_status(core);
        Snapshot {
            flags,
            valid_until_ns,
            node: layout::decode_node(core),
            holdover_max_bound_ns,
        }
    }

    /// The record's state at local time `t` — the one rule of every reader
    /// (docs/offsets-format.md, "The state of a record"): unknown without
    /// `VALID`; stale when flagged `STALE`; up to `valid_until_ns`
    /// holdover if flagged `HOLDOVER`, else synchronised; past it holdover
    /// while the bound grown to `t` is at most `holdover_max_bound_ns`
    /// (which must be set, and the bound must grow), then stale.
    pub fn status(&self, t: LocalNs) -> ClockStatus {
        self.status_with(t, || self.node.to_global(t).1)
    }

    /// [`Snapshot::status`] with the bound at `t` computed by `bound_at_t`
    /// only when it is needed (`now()` has it already).
    fn status_with(&self, t: LocalNs, bound_at_t: impl FnOnce() -> u64) -> ClockStatus {
        if self.flags & flags::VALID == 0 {
            ClockStatus::Unknown
        } else if self.flags & flags::STALE != 0 {
            ClockStatus::Stale
        } else if t.0 <= self.valid_until_ns {
            if self.flags & flags::HOLDOVER != 0 {
                ClockStatus::Holdover
            } else {
                ClockStatus::Synchronised
            }
        } else if self.holdover_max_bound_ns != 0
            && self.node.bound_growth_ps_per_s != 0
            && bound_at_t() <= self.holdover_max_bound_ns
        {
            ClockStatus::Holdover
        } else {
            ClockStatus::Stale
        }
    }

    /// Fails closed unless the record answers at `now`: `NoData`
    /// (unknown) or `Stale`; synchronised and holdover are answers.
    pub fn check_fresh(&self, now: LocalNs) -> Result<(), PublishError> {
        self.answer(now, self.status(now))
    }

    /// The error of a state that is no answer.
    fn answer(&self, t: LocalNs, status: ClockStatus) -> Result<(), PublishError> {
        match status {
            ClockStatus::Unknown => Err(PublishError::NoData),
            ClockStatus::Stale => Err(PublishError::Stale {
                valid_until_ns: self.valid_until_ns,
                now_ns: t.0,
                flags: self.flags,
            }),
            ClockStatus::Synchronised | ClockStatus::Holdover => Ok(()),
        }
    }

    /// `to_global` with this record at the stamp's own time: the map's
    /// global time and bound if the record answers at `t`
    /// ([`Snapshot::status`]), else `NoData` / `Stale`.
    pub fn to_global(&self, t: LocalNs) -> Result<(GlobalNs, u64), PublishError> {
        let (global, bound) = self.node.to_global(t);
        self.answer(t, self.status_with(t, || bound))?;
        Ok((global, bound))
    }
}

/// The clock's state, as ClockBound's and fbclock's; the same values as
/// the C reader's `enum clockmesh_clock_status` and the Python reader's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(i32)]
pub enum ClockStatus {
    /// Nothing published yet: no interval.
    Unknown = 0,
    /// A current solve.
    Synchronised = 1,
    /// Carried forward without a current solve (the reference unreachable,
    /// no update within the record's validity, or the agent restarted):
    /// the bound grows at the published rate, up to the record's ceiling.
    Holdover = 2,
    /// Flagged stale, or past its validity with the grown bound above the
    /// holdover ceiling: no answer.
    Stale = 3,
}

impl ClockStatus {
    /// The name every tool prints (`clockmesh status`, `/status`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Synchronised => "synchronised",
            Self::Holdover => "holdover",
            Self::Stale => "stale",
        }
    }
}

/// Global time now as an interval holding the true global time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// global(now) − bound(now); `i64::MIN` when the status is unknown.
    pub earliest: GlobalNs,
    /// global(now) + bound(now); `i64::MAX` when the status is unknown.
    pub latest: GlobalNs,
    pub status: ClockStatus,
    /// The agent restart counter of the record.
    pub epoch: u64,
}

impl OffsetsReader {
    /// Global time now: reads CLOCK_REALTIME and the record, and returns
    /// [global − bound, global + bound] at this instant (the bound grown
    /// over the record's age) with the clock's state
    /// ([`Snapshot::status`]). Holdover and stale records still give their
    /// widening interval; only a file that cannot be read is an error.
    pub fn now(&self) -> Result<Now, PublishError> {
        let mut p = [0u64; STATE_WORDS];
        self.read_words(PAYLOAD_OFFSET, &mut p)?;
        let now = realtime_now_ns();
        let snapshot = Snapshot::from_words(&p, p[HOLDOVER_MAX_BOUND_WORD]);
        let epoch = layout::decode_epoch(&p);
        let (global, bound) = snapshot.node.to_global(now);
        let status = snapshot.status_with(now, || bound);
        if status == ClockStatus::Unknown {
            return Ok(Now {
                earliest: GlobalNs(i64::MIN),
                latest: GlobalNs(i64::MAX),
                status,
                epoch,
            });
        }
        let bound = Nanos(i64::try_from(bound).unwrap_or(i64::MAX));
        Ok(Now {
            earliest: global - bound,
            latest: global + bound,
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

    /// The node map, status and holdover ceiling of the current record
    /// (fewer words under the seqlock).
    pub fn snapshot(&self) -> Result<Snapshot, PublishError> {
        let mut p = [0u64; STATE_WORDS];
        self.read_words(PAYLOAD_OFFSET, &mut p)?;
        Ok(Snapshot::from_words(&p, p[HOLDOVER_MAX_BOUND_WORD]))
    }

    /// Maps a local CLOCK_REALTIME stamp to `(global_ns, bound_ns)`, judged
    /// at the stamp's own time ("now" is not read): with the newest ring
    /// record anchored at or before the stamp, if that record answers at
    /// the stamp ([`Snapshot::status`] synchronised or holdover: `VALID`,
    /// not `STALE`, and the stamp within its validity or its holdover
    /// ceiling). A stamp anchored before every record in the ring is
    /// [`PublishError::TooOld`] (or served by `with_history`); one past
    /// the record's validity and ceiling is [`PublishError::Stale`].
    pub fn to_global(&self, local: LocalNs) -> Result<(GlobalNs, u64), PublishError> {
        match self.read(|m| pick(m, local))? {
            Pick::Empty => Err(PublishError::NoData),
            Pick::Found(snapshot) => snapshot.to_global(local),
            Pick::TooOld { oldest_anchor_ns } => match &self.history {
                Some(h) => {
                    let g = h.to_global(local);
                    Ok((g.global(), g.bound_ns))
                }
                None => Err(PublishError::TooOld {
                    local_ns: local.0,
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
    ) -> Result<(GlobalNs, u64), PublishError> {
        let record = self.read_record()?;
        let d = record
            .devices
            .iter()
            .find(|d| d.device_id == device_id)
            .ok_or(PublishError::NoDevice(device_id))?;
        let host = device_host_time(d, device_ns)?;
        let (global, bound) = self.to_global(host)?;
        Ok((global, bound.saturating_add(d.bound_ns)))
    }

    /// Records the ring holds now (for tools and tests).
    pub fn ring(&self) -> Result<Vec<(u64, Snapshot)>, PublishError> {
        self.read(|m| {
            let mut out = Vec::new();
            for (n, base) in m.ring_slots() {
                out.push((n, slot_snapshot(m, base)));
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
pub fn device_host_time(d: &DeviceMap, device_ns: i64) -> Result<LocalNs, PublishError> {
    if d.flags & layout::device_flags::VALID == 0 {
        return Err(PublishError::NoData);
    }
    let host = d.to_host(device_ns);
    if host.0 > d.valid_until_ns {
        return Err(PublishError::Stale {
            valid_until_ns: d.valid_until_ns,
            now_ns: host.0,
            flags: u32::from(d.flags),
        });
    }
    Ok(host)
}
