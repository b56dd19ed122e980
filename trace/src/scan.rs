//! Pass 1: walks an `.xplane.pb` at the wire level and records what the
//! merge needs (where every `XLine.timestamp_ns` is, session timestamps,
//! clock stats) and what `trace info` shows. Memory is proportional to the
//! number of lines and planes, never to the number of events.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use clockmesh_proto::{PROFILE_START_TIME, PROFILE_STOP_TIME, TASK_ENV_PLANE, clock_stats};

use super::TraceError;
use super::fields::{self, map_entry, xline, xplane, xspace, xstat, xstat_metadata};
use super::rewrite::Frame;
use super::wire::{I64, LEN, VARINT, WireReader};

/// Plane carrying JAX `set_metadata` values (another place the hook's stats may be).
pub const HOST_METADATA_PLANE: &str = "/host:metadata";

/// Plane stat (string) naming the clock domain of the plane's timestamps:
/// a device domain such as "cuda-globaltimer", or "CLOCK_REALTIME".
pub const CLOCK_DOMAIN_STAT: &str = "clock_domain";
/// Plane stat (string) naming the device whose clock the plane uses ("nvidia:0").
pub const CLOCK_DEVICE_STAT: &str = "clock_device";
/// Plane stat (uint64) the merge writes: the plane's worst alignment bound
/// on the global timeline, ns (on the Task Environment: the host's worst).
pub const ALIGNMENT_BOUND_STAT: &str = "clock_alignment_bound_ns";

/// Where one `timestamp_ns` field's value lies in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VarintAt {
    pub pos: u64,
    pub len: u8,
}

/// One XLine: its content range and its timestamp field(s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineInfo {
    /// Index of the line's plane in [`Scan::planes`].
    pub plane: usize,
    /// Bytes of the line's length prefix as stored (maybe non-minimal).
    pub prefix_len: u8,
    pub content_start: u64,
    pub content_end: u64,
    /// Effective value (last occurrence wins, 0 when absent).
    pub timestamp_ns: i64,
    /// Every occurrence of field 3 (normally exactly one).
    pub ts_fields: Vec<VarintAt>,
}

/// A stat's value as stored.
#[derive(Clone, Debug, PartialEq)]
pub enum StatValue {
    Int(i64),
    Uint(u64),
    Double(f64),
    Str(String),
    Other,
}

impl std::fmt::Display for StatValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Int(v) => write!(f, "{v}"),
            Self::Uint(v) => write!(f, "{v}"),
            Self::Double(v) => write!(f, "{v}"),
            Self::Str(s) => write!(f, "{s:?}"),
            Self::Other => f.write_str("<bytes>"),
        }
    }
}

impl StatValue {
    /// Integer view (strings are parsed: JAX `set_metadata` stores strings).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Self::Int(v) => Some(*v),
            Self::Uint(v) => i64::try_from(*v).ok(),
            Self::Double(v) => Some(*v as i64),
            Self::Str(s) => s.trim().parse().ok(),
            Self::Other => None,
        }
    }

    /// Floating view (strings parsed, as for [`Self::as_i64`]).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Self::Int(v) => Some(*v as f64),
            Self::Uint(v) => Some(*v as f64),
            Self::Double(v) => Some(*v),
            Self::Str(s) => s.trim().parse().ok(),
            Self::Other => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct StatInfo {
    pub name: String,
    pub value: StatValue,
    /// Where an integer value's varint lies (for in-place rewrites).
    pub value_at: Option<VarintAt>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlaneSummary {
    /// Where the plane's content lies and its length prefix's size.
    pub content_start: u64,
    pub content_end: u64,
    pub prefix_len: u8,
    pub id: i64,
    pub name: String,
    pub lines: u64,
    pub events: u64,
    pub event_metadata: u64,
    /// Decoded only for the Task Environment and `/host:metadata` planes.
    pub stats: Vec<StatInfo>,
    /// The plane's [`CLOCK_DOMAIN_STAT`], on any plane.
    pub clock_domain: Option<String>,
    /// The plane's [`CLOCK_DEVICE_STAT`], on any plane.
    pub clock_device: Option<String>,
    /// Largest `stat_metadata` id: a new stat takes the next one.
    pub max_stat_id: i64,
    /// The id of an existing [`ALIGNMENT_BOUND_STAT`] (a merged input).
    pub alignment_stat_id: Option<i64>,
}

/// Everything pass 1 learned about one file.
#[derive(Clone, Debug, Default)]
pub struct Scan {
    pub path: PathBuf,
    pub file_len: u64,
    pub hostnames: Vec<String>,
    pub planes: Vec<PlaneSummary>,
    pub lines: Vec<LineInfo>,
}

impl Scan {
    fn stat(&self, plane: &str, name: &str) -> Option<&StatValue> {
        self.planes
            .iter()
            .filter(|p| p.name == plane)
            .flat_map(|p| p.stats.iter())
            .rev()
            .find(|s| s.name == name)
            .map(|s| &s.value)
    }

    pub fn has_task_env(&self) -> bool {
        self.planes.iter().any(|p| p.name == TASK_ENV_PLANE)
    }

    /// Session start, CLOCK_REALTIME epoch ns (Task Environment).
    pub fn profile_start_ns(&self) -> Option<i64> {
        self.stat(TASK_ENV_PLANE, PROFILE_START_TIME)?.as_i64()
    }

    pub fn profile_stop_ns(&self) -> Option<i64> {
        self.stat(TASK_ENV_PLANE, PROFILE_STOP_TIME)?.as_i64()
    }

    /// A clock stat written by the clockmesh hook (Task Environment), or by
    /// the JAX helper through `set_metadata` (`/host:metadata`).
    pub fn clock_stat_value(&self, name: &str) -> Option<&StatValue> {
        self.stat(TASK_ENV_PLANE, name)
            .or_else(|| self.stat(HOST_METADATA_PLANE, name))
    }

    /// Integer view of [`Self::clock_stat_value`].
    pub fn clock_stat(&self, name: &str) -> Option<i64> {
        self.clock_stat_value(name)?.as_i64()
    }

    pub fn clock_offset_ns(&self) -> Option<i64> {
        self.clock_stat(clock_stats::OFFSET_NS)
    }

    /// Names of all `clock_*` stats present.
    pub fn clock_stat_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .planes
            .iter()
            .flat_map(|p| p.stats.iter())
            .map(|s| s.name.as_str())
            .filter(|n| n.starts_with("clock_"))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    pub fn events(&self) -> u64 {
        self.planes.iter().map(|p| p.events).sum()
    }

    /// Every plane and line as a rewrite [`Frame`]: messages whose length
    /// prefix the rewrite may resize. Their stats (≤ 22 bytes) never
    /// change prefix size, so they need none.
    pub fn frames(&self) -> Vec<Frame> {
        let planes = self
            .planes
            .iter()
            .map(|p| Frame::new(p.prefix_len, p.content_start, p.content_end));
        let lines = self
            .lines
            .iter()
            .map(|l| Frame::new(l.prefix_len, l.content_start, l.content_end));
        planes.chain(lines).collect()
    }
}

/// Key byte of `XLine.events` (field 4, length-delimited).
const EVENT_KEY: u8 = fields::key(xline::EVENTS, LEN);

/// Longest string (plane or stat name) read into memory.
const MAX_NAME: u64 = 1 << 20;

/// Scans a file. Errors name the byte offset of the problem.
pub fn scan_file(path: &Path) -> Result<Scan, TraceError> {
    let file = File::open(path).map_err(TraceError::io)?;
    let mut r = WireReader::new(file)?;
    let end = r.file_len();
    let mut scan = Scan {
        path: path.to_path_buf(),
        file_len: end,
        ..Scan::default()
    };
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        match (field, wire) {
            (xspace::PLANES, LEN) => {
                let at = r.pos();
                let n = r.read_len(end)?;
                let index = scan.planes.len();
                let mut plane = scan_plane(&mut r, n, index, &mut scan.lines)?;
                plane.prefix_len = (plane.content_start - at) as u8;
                scan.planes.push(plane);
            }
            (xspace::HOSTNAMES, LEN) => {
                let n = r.read_len(end)?;
                scan.hostnames.push(read_string(&mut r, n)?);
            }
            (xspace::PLANES..=xspace::HOSTNAMES, _) => {
                return Err(TraceError::malformed(
                    r.pos(),
                    "XSpace field has the wrong wire type",
                ));
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    if scan.planes.is_empty() {
        return Err(TraceError::NotXPlane("no planes".into()));
    }
    Ok(scan)
}

fn read_string(r: &mut WireReader, n: u64) -> Result<String, TraceError> {
    if n > MAX_NAME {
        r.skip(n)?;
        return Ok(String::from("<too long>"));
    }
    let b = r.read_bytes(n)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

fn scan_plane(
    r: &mut WireReader,
    n: u64,
    index: usize,
    lines: &mut Vec<LineInfo>,
) -> Result<PlaneSummary, TraceError> {
    let end = r.pos() + n;
    let mut plane = PlaneSummary {
        content_start: r.pos(),
        content_end: end,
        ..PlaneSummary::default()
    };
    let mut stat_names: HashMap<i64, String> = HashMap::new();
    let mut stat_ranges: Vec<(u64, u64)> = Vec::new();
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        match (field, wire) {
            (xplane::ID, VARINT) => plane.id = r.read_varint()? as i64,
            (xplane::NAME, LEN) => {
                let n = r.read_len(end)?;
                plane.name = read_string(r, n)?;
            }
            (xplane::LINES, LEN) => {
                let at = r.pos();
                let n = r.read_len(end)?;
                let mut line = scan_line(r, n, index, &mut plane.events)?;
                line.prefix_len = (line.content_start - at) as u8;
                plane.lines += 1;
                lines.push(line);
            }
            (xplane::EVENT_METADATA, LEN) => {
                plane.event_metadata += 1;
                r.skip_value(wire, end)?;
            }
            (xplane::STAT_METADATA, LEN) => {
                let n = r.read_len(end)?;
                if let Some((id, name)) = read_stat_metadata_entry(r, n)? {
                    stat_names.insert(id, name);
                }
            }
            (xplane::STATS, LEN) => {
                let n = r.read_len(end)?;
                stat_ranges.push((r.pos(), n));
                r.skip(n)?;
            }
            (xplane::ID..=xplane::STATS, _) => {
                return Err(TraceError::malformed(
                    r.pos(),
                    "XPlane field has the wrong wire type",
                ));
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    check_end(r, end)?;
    plane.max_stat_id = stat_names.keys().copied().max().unwrap_or(0);
    plane.alignment_stat_id = stat_names
        .iter()
        .find(|(_, n)| *n == ALIGNMENT_BOUND_STAT)
        .map(|(id, _)| *id);
    let keep_all = plane.name == TASK_ENV_PLANE || plane.name == HOST_METADATA_PLANE;
    // Other planes' stats are decoded only when they may declare a clock.
    let declares = stat_names
        .values()
        .any(|n| n == CLOCK_DOMAIN_STAT || n == CLOCK_DEVICE_STAT);
    if keep_all || declares {
        for (start, n) in stat_ranges {
            r.seek_to(start)?;
            let stat = read_named_stat(r, n, &stat_names)?;
            take_clock_stat(&mut plane, &stat);
            if keep_all {
                plane.stats.push(stat);
            }
        }
        r.seek_to(end)?;
    }
    Ok(plane)
}

fn read_named_stat(
    r: &mut WireReader,
    n: u64,
    names: &HashMap<i64, String>,
) -> Result<StatInfo, TraceError> {
    let (id, value, value_at) = read_stat(r, n, names)?;
    let name = names.get(&id).cloned().unwrap_or_else(|| format!("#{id}"));
    Ok(StatInfo {
        name,
        value,
        value_at,
    })
}

/// Records a `clock_domain` / `clock_device` string stat (last one wins).
fn take_clock_stat(plane: &mut PlaneSummary, stat: &StatInfo) {
    let StatValue::Str(v) = &stat.value else {
        return;
    };
    match stat.name.as_str() {
        CLOCK_DOMAIN_STAT => plane.clock_domain = Some(v.clone()),
        CLOCK_DEVICE_STAT => plane.clock_device = Some(v.clone()),
        _ => {}
    }
}

fn check_end(r: &WireReader, end: u64) -> Result<(), TraceError> {
    if r.pos() != end {
        return Err(TraceError::malformed(
            r.pos(),
            "field runs past the end of its message",
        ));
    }
    Ok(())
}

fn scan_line(
    r: &mut WireReader,
    n: u64,
    plane: usize,
    events: &mut u64,
) -> Result<LineInfo, TraceError> {
    let start = r.pos();
    let end = start + n;
    let mut line = LineInfo {
        plane,
        prefix_len: 0,
        content_start: start,
        content_end: end,
        timestamp_ns: 0,
        ts_fields: Vec::new(),
    };
    while r.pos() < end {
        // Events are nearly all of a line: skip runs of them in one call.
        *events += r.skip_run(EVENT_KEY, end)?;
        if r.pos() >= end {
            break;
        }
        let (field, wire) = r.read_key()?;
        match (field, wire) {
            (xline::TIMESTAMP_NS, VARINT) => {
                let pos = r.pos();
                line.timestamp_ns = r.read_varint()? as i64;
                line.ts_fields.push(VarintAt {
                    pos,
                    len: (r.pos() - pos) as u8,
                });
            }
            (xline::TIMESTAMP_NS, _) => {
                return Err(TraceError::malformed(
                    r.pos(),
                    "XLine.timestamp_ns is not a varint",
                ));
            }
            (xline::EVENTS, LEN) => {
                *events += 1;
                r.skip_value(wire, end)?;
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    check_end(r, end)?;
    Ok(line)
}

/// One `map<int64, XStatMetadata>` entry: (key, name).
fn read_stat_metadata_entry(
    r: &mut WireReader,
    n: u64,
) -> Result<Option<(i64, String)>, TraceError> {
    let end = r.pos() + n;
    let (mut key, mut name, mut inner_id) = (None, None, None);
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        match (field, wire) {
            (map_entry::KEY, VARINT) => key = Some(r.read_varint()? as i64),
            (map_entry::VALUE, LEN) => {
                let m = r.read_len(end)?;
                let mend = r.pos() + m;
                while r.pos() < mend {
                    let (f, w) = r.read_key()?;
                    match (f, w) {
                        (xstat_metadata::ID, VARINT) => inner_id = Some(r.read_varint()? as i64),
                        (xstat_metadata::NAME, LEN) => {
                            let k = r.read_len(mend)?;
                            name = Some(read_string(r, k)?);
                        }
                        _ => r.skip_value(w, mend)?,
                    }
                }
                check_end(r, mend)?;
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    check_end(r, end)?;
    Ok(key.or(inner_id).zip(name))
}

/// A field of XStat's `value` oneof (double_value ..= compressed_str_value).
fn is_stat_value(field: u32) -> bool {
    (xstat::DOUBLE_VALUE..=xstat::COMPRESSED_STR_VALUE).contains(&field)
}

/// One XStat: (metadata_id, value, position of an integer value). A
/// `ref_value` (XLA's interned strings) becomes the string it refers to:
/// the name of that stat metadata entry.
fn read_stat(
    r: &mut WireReader,
    n: u64,
    names: &HashMap<i64, String>,
) -> Result<(i64, StatValue, Option<VarintAt>), TraceError> {
    let end = r.pos() + n;
    let (mut id, mut value, mut at) = (0i64, StatValue::Other, None);
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        match (field, wire) {
            (xstat::METADATA_ID, VARINT) => id = r.read_varint()? as i64,
            (xstat::DOUBLE_VALUE, I64) => {
                value = StatValue::Double(f64::from_bits(r.read_fixed64(end)?))
            }
            (xstat::UINT64_VALUE | xstat::INT64_VALUE, VARINT) => {
                let pos = r.pos();
                let v = r.read_varint()?;
                at = Some(VarintAt {
                    pos,
                    len: (r.pos() - pos) as u8,
                });
                value = if field == xstat::UINT64_VALUE {
                    StatValue::Uint(v)
                } else {
                    StatValue::Int(v as i64)
                };
                continue;
            }
            (xstat::STR_VALUE, LEN) => {
                let k = r.read_len(end)?;
                value = StatValue::Str(read_string(r, k)?);
            }
            (xstat::REF_VALUE, VARINT) => {
                let v = r.read_varint()? as i64;
                value = names
                    .get(&v)
                    .map_or(StatValue::Other, |s| StatValue::Str(s.clone()));
            }
            _ => {
                if is_stat_value(field) {
                    value = StatValue::Other;
                }
                r.skip_value(wire, end)?;
            }
        }
        if is_stat_value(field) && field != xstat::UINT64_VALUE && field != xstat::INT64_VALUE {
            at = None;
        }
    }
    check_end(r, end)?;
    Ok((id, value, at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh_proto::prost::Message;
    use clockmesh_proto::xplane::{XEvent, XLine, XPlane, XSpace, XStat, x_stat};

    #[test]
    fn event_runs_crossing_the_buffer_and_eof_are_counted_exactly() {
        // Events of many sizes, one larger than the 1 MiB read buffer, so
        // the fast path meets every boundary case; the line ends the file.
        let sizes = (0..40_000usize).map(|i| i % 300).chain([1 << 21, 3, 0]);
        let events: Vec<XEvent> = sizes
            .map(|n| XEvent {
                metadata_id: 1,
                stats: vec![XStat {
                    metadata_id: 2,
                    value: Some(x_stat::Value::BytesValue(vec![7; n])),
                }],
                ..Default::default()
            })
            .collect();
        let n_events = events.len() as u64;
        let space = XSpace {
            planes: vec![XPlane {
                name: "p".into(),
                lines: vec![XLine {
                    timestamp_ns: 9,
                    events,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let bytes = space.encode_to_vec();
        let dir = std::env::temp_dir().join(format!("cm-scan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("big.xplane.pb");
        std::fs::write(&p, &bytes).unwrap();
        let scan = scan_file(&p).unwrap();
        assert_eq!(scan.events(), n_events);
        assert_eq!(scan.lines[0].timestamp_ns, 9);
        // Truncated anywhere inside the events: an error, never a panic.
        for cut in [
            bytes.len() - 1,
            bytes.len() - 5,
            bytes.len() / 2,
            1 << 20,
            17,
        ] {
            std::fs::write(&p, &bytes[..cut]).unwrap();
            assert!(scan_file(&p).is_err(), "cut at {cut}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
