//! Collective calls of one XLA host (xprof `.xplane.pb`: JAX, TensorFlow).
//!
//! XLA's runtimes trace each executed HLO op (thunk) as an event named by
//! the op, with the stats `hlo_op`, `hlo_module`, `program_id` and
//! `run_id` (JAX 0.10 on CPU: `psum.7`, `all_gather.7` on the
//! `tf_XLAPjRtCpuClient` line; on GPU the device planes hold the
//! collective kernels). The run id is the one XLA's own rendezvous keys a
//! collective by, the same on every process of one launch, so an instance
//! is (module, op, run id); without a run id, the n-th execution of the op.
//! Device planes (`/device:*`) are used when they hold collectives, else
//! the host plane: one call is never counted twice. The rank is the
//! `jax_process_index` stat that `clockmesh.jax_profiler` writes on the
//! Task Environment plane (xprof's own `process_id` is the OS pid).
//!
//! Read as a stream of protobuf fields ([`crate::wire`]), never decoded
//! whole: the planes are located first (the Task Environment may come
//! last), each plane's metadata is read in a first walk, then its lines
//! twice by seeking: once for the collective calls and steps (few), once,
//! only on lines holding calls, for what each call followed. Memory is the
//! metadata and the calls, not the events.

use std::collections::HashMap;
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::Path;

use super::classify::classify;
use super::model::{
    CallClock, CollectiveCall, CollectiveKind, Framework, InstanceKey, Interner, MatchedBy, Name,
    Participant, Preceding, Track,
};
use super::{RankTrace, Timed, preceding_before, step_begun_before, step_spans};
use crate::TraceError;
use crate::fields::{map_entry, xevent, xevent_metadata, xline, xplane, xspace, xstat};
use crate::scan::ALIGNMENT_BOUND_STAT;
use crate::wire::{LEN, SliceReader, VARINT, WireReader};

const TASK_ENV: &str = "Task Environment";
const HOST_PLANE: &str = "/host:CPU";
/// Task Environment stat `clockmesh.jax_profiler` writes: the job's
/// process index (`jax.process_index()`).
pub const PROCESS_INDEX: &str = "jax_process_index";
/// At most this many distinct `hlo_op` strings keep their classification.
const OP_CACHE_MAX: usize = 1 << 16;
/// How much of a line is parsed straight from the reader's buffer at once
/// (the reader's buffer size).
const CHUNK: u64 = 1 << 20;
/// Metadata ids below this are looked up in a table, others hashed.
const DENSE_IDS: i64 = 1 << 16;

/// Reads one host's collective calls. `aligned`: the file is a clockmesh
/// merge's output and its stated bound applies.
pub fn read(path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
    let file = File::open(path).map_err(TraceError::io)?;
    read_from(&mut WireReader::new(file)?, path, aligned)
}

/// [`read`] of a trace already in memory (`path` names it): the same
/// reader over the bytes.
pub fn parse(bytes: &[u8], path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
    read_from(&mut MemReader { bytes, pos: 0 }, path, aligned)
}

/// Whether a file is a clockmesh merge's output (its host plane states
/// the alignment bound).
pub fn is_merged(path: &Path) -> Result<bool, TraceError> {
    let scan = crate::scan_file(path)?;
    Ok(scan
        .planes
        .iter()
        .any(|p| p.stats.iter().any(|s| s.name == ALIGNMENT_BOUND_STAT)))
}

fn read_from<R: Src>(r: &mut R, path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
    let planes = locate_planes(r)?;
    let env_at = planes.iter().position(|p| p.name == TASK_ENV);
    let env = plane_head(r, &planes[env_at.ok_or(TraceError::MissingTaskEnv)?])?;
    let start_ns = env
        .stat_i64("profile_start_time")
        .ok_or(TraceError::MissingStart)?;
    // xprof's `process_id` is the OS pid; the JAX helper records the
    // job's process index.
    let rank = env
        .stat_i64(PROCESS_INDEX)
        .and_then(|r| u64::try_from(r).ok());
    let host_at = planes.iter().position(|p| p.name == HOST_PLANE);
    let host = host_at.map(|i| plane_head(r, &planes[i])).transpose()?;
    let bound_ns = host
        .as_ref()
        .and_then(|h| h.stat_i64(ALIGNMENT_BOUND_STAT))
        .and_then(|b| u64::try_from(b).ok())
        .filter(|_| aligned);
    let participant = Participant {
        host: super::file_host(path, ".xplane.pb"),
        rank,
        framework: Framework::Xla,
        trace: path.display().to_string(),
        bound_ns,
    };
    let mut cache = OpCache::default();
    let mut calls = Vec::new();
    for (index, p) in planes.iter().enumerate() {
        if p.name.starts_with("/device:") {
            let head = plane_head(r, p)?;
            let mut walk = PlaneWalk::new(&head, index, start_ns, false);
            walk.run(r, &mut cache, true)?;
            calls.extend(walk.calls.into_iter().map(|c| CollectiveCall {
                clock: CallClock::Gpu,
                ..c
            }));
        }
    }
    let mut steps = Vec::new();
    if let (Some(index), Some(head)) = (host_at, &host) {
        let mut walk = PlaneWalk::new(head, index, start_ns, true);
        walk.run(r, &mut cache, calls.is_empty())?;
        if calls.is_empty() {
            calls = walk.calls;
        }
        steps = walk.steps;
    }
    steps.sort_by_key(|t| t.start_ns);
    for c in &mut calls {
        c.step = step_begun_before(&steps, c.enter_ns);
    }
    number_occurrences(&mut calls);
    Ok(RankTrace {
        participant,
        calls,
        steps: step_spans(&steps),
    })
}

/// The protobuf reader both entry points share: a file ([`WireReader`])
/// or bytes in memory ([`MemReader`]).
trait Src {
    fn pos(&self) -> u64;
    fn file_len(&self) -> u64;
    fn read_key(&mut self) -> Result<(u32, u8), TraceError>;
    fn read_varint(&mut self) -> Result<u64, TraceError>;
    /// A length prefix whose content must end by `end`.
    fn read_len(&mut self, end: u64) -> Result<u64, TraceError>;
    fn skip(&mut self, n: u64) -> Result<(), TraceError>;
    fn skip_value(&mut self, wire: u8, end: u64) -> Result<(), TraceError>;
    fn seek_to(&mut self, pos: u64) -> Result<(), TraceError>;
    /// Hands `f` the next bytes buffered, at most `left` (and their
    /// position), and consumes as many as it says it used.
    fn with_chunk(
        &mut self,
        left: u64,
        f: impl FnOnce(&[u8], u64) -> Result<u64, TraceError>,
    ) -> Result<u64, TraceError>;
    /// Hands the next `n` bytes (one small message) and their position to
    /// `f`, and consumes them.
    fn with_bytes<T>(
        &mut self,
        n: u64,
        scratch: &mut Vec<u8>,
        f: impl FnOnce(&[u8], u64) -> Result<T, TraceError>,
    ) -> Result<T, TraceError>;
}

impl Src for WireReader {
    fn pos(&self) -> u64 {
        WireReader::pos(self)
    }
    fn file_len(&self) -> u64 {
        WireReader::file_len(self)
    }
    #[inline]
    fn read_key(&mut self) -> Result<(u32, u8), TraceError> {
        WireReader::read_key(self)
    }
    fn read_varint(&mut self) -> Result<u64, TraceError> {
        WireReader::read_varint(self)
    }
    #[inline]
    fn read_len(&mut self, end: u64) -> Result<u64, TraceError> {
        WireReader::read_len(self, end)
    }
    fn skip(&mut self, n: u64) -> Result<(), TraceError> {
        WireReader::skip(self, n)
    }
    fn skip_value(&mut self, wire: u8, end: u64) -> Result<(), TraceError> {
        WireReader::skip_value(self, wire, end)
    }
    fn seek_to(&mut self, pos: u64) -> Result<(), TraceError> {
        WireReader::seek_to(self, pos)
    }
    fn with_chunk(
        &mut self,
        left: u64,
        f: impl FnOnce(&[u8], u64) -> Result<u64, TraceError>,
    ) -> Result<u64, TraceError> {
        let at = self.pos();
        let Some(b) = self.peek(left.min(CHUNK))? else {
            return Ok(0);
        };
        let used = f(b, at)?;
        self.consume(used);
        Ok(used)
    }
    #[inline]
    fn with_bytes<T>(
        &mut self,
        n: u64,
        scratch: &mut Vec<u8>,
        f: impl FnOnce(&[u8], u64) -> Result<T, TraceError>,
    ) -> Result<T, TraceError> {
        let at = self.pos();
        if let Some(b) = self.peek(n)? {
            let t = f(b, at)?;
            self.consume(n);
            return Ok(t);
        }
        self.read_into(n, scratch)?;
        f(scratch, at)
    }
}

/// [`Src`] over bytes in memory, with [`WireReader`]'s checks.
struct MemReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl MemReader<'_> {
    fn slice(&self) -> SliceReader<'_> {
        SliceReader::new(&self.bytes[self.pos..], self.pos as u64)
    }

    fn left(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }
}

impl Src for MemReader<'_> {
    fn pos(&self) -> u64 {
        self.pos as u64
    }
    fn file_len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_key(&mut self) -> Result<(u32, u8), TraceError> {
        let mut s = self.slice();
        let k = s.read_key()?;
        self.pos += s.at();
        Ok(k)
    }
    fn read_varint(&mut self) -> Result<u64, TraceError> {
        let mut s = self.slice();
        let v = s.read_varint()?;
        self.pos += s.at();
        Ok(v)
    }
    fn read_len(&mut self, end: u64) -> Result<u64, TraceError> {
        let at = self.pos();
        let n = self.read_varint()?;
        if n > end.saturating_sub(self.pos()) {
            return Err(if n > self.left() {
                TraceError::truncated(at)
            } else {
                TraceError::malformed(at, "length runs past the enclosing message")
            });
        }
        Ok(n)
    }
    fn skip(&mut self, n: u64) -> Result<(), TraceError> {
        if n > self.left() {
            return Err(TraceError::truncated(self.pos()));
        }
        self.pos += n as usize;
        Ok(())
    }
    fn skip_value(&mut self, wire: u8, end: u64) -> Result<(), TraceError> {
        let n = match wire {
            VARINT => return self.read_varint().map(drop),
            LEN => self.read_len(end)?,
            crate::wire::I64 => 8,
            _ => 4,
        };
        if n > end.saturating_sub(self.pos()) {
            return Err(TraceError::malformed(
                self.pos(),
                "fixed-size value runs past its message",
            ));
        }
        self.skip(n)
    }
    fn seek_to(&mut self, pos: u64) -> Result<(), TraceError> {
        if pos > self.file_len() {
            return Err(TraceError::truncated(pos));
        }
        self.pos = pos as usize;
        Ok(())
    }
    fn with_chunk(
        &mut self,
        left: u64,
        f: impl FnOnce(&[u8], u64) -> Result<u64, TraceError>,
    ) -> Result<u64, TraceError> {
        let n = left.min(self.left()) as usize;
        let used = f(&self.bytes[self.pos..self.pos + n], self.pos as u64)?;
        self.pos += used as usize;
        Ok(used)
    }
    fn with_bytes<T>(
        &mut self,
        n: u64,
        _scratch: &mut Vec<u8>,
        f: impl FnOnce(&[u8], u64) -> Result<T, TraceError>,
    ) -> Result<T, TraceError> {
        if n > self.left() {
            return Err(TraceError::truncated(self.pos()));
        }
        let (at, n) = (self.pos, n as usize);
        let t = f(&self.bytes[at..at + n], at as u64)?;
        self.pos += n;
        Ok(t)
    }
}

/// A cursor over one small message in memory (an event, a stat).
struct Cur<'a> {
    bytes: &'a [u8],
    at: usize,
    base: u64,
}

impl<'a> Cur<'a> {
    fn new(bytes: &'a [u8], base: u64) -> Self {
        Self { bytes, at: 0, base }
    }

    #[inline]
    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    #[inline]
    fn reader(&self) -> SliceReader<'a> {
        SliceReader::new(&self.bytes[self.at..], self.base + self.at as u64)
    }

    #[inline(always)]
    fn key(&mut self) -> Result<(u32, u8), TraceError> {
        // One-byte keys of fields 1-15 and a known wire type.
        if let Some(&b) = self.bytes.get(self.at)
            && (8..0x80).contains(&b)
            && (b & 7 == VARINT || b & 7 == LEN)
        {
            self.at += 1;
            return Ok((u32::from(b >> 3), b & 7));
        }
        let mut s = self.reader();
        let k = s.read_key()?;
        self.at += s.at();
        Ok(k)
    }

    #[inline(always)]
    fn varint(&mut self) -> Result<u64, TraceError> {
        if let Some(&b) = self.bytes.get(self.at)
            && b < 0x80
        {
            self.at += 1;
            return Ok(u64::from(b));
        }
        let mut s = self.reader();
        let v = s.read_varint()?;
        self.at += s.at();
        Ok(v)
    }

    #[inline]
    fn skip(&mut self, wire: u8) -> Result<(), TraceError> {
        let mut s = self.reader();
        s.skip_value(wire)?;
        self.at += s.at();
        Ok(())
    }

    /// The content of a length-delimited field.
    #[inline]
    fn sub(&mut self) -> Result<Cur<'a>, TraceError> {
        let n = self.varint()?;
        if n > (self.bytes.len() - self.at) as u64 {
            return Err(TraceError::malformed(
                self.base + self.at as u64,
                "field runs past the end of its message",
            ));
        }
        let start = self.at;
        self.at += n as usize;
        Ok(Cur::new(
            &self.bytes[start..self.at],
            self.base + start as u64,
        ))
    }
}

/// `XEvent.stats`.
const EVENT_STATS: u32 = 4;

/// A table by metadata id: dense for the small ids profilers use.
struct IdMap<T> {
    dense: Vec<Option<T>>,
    sparse: HashMap<i64, T>,
}

impl<T> Default for IdMap<T> {
    fn default() -> Self {
        Self {
            dense: Vec::new(),
            sparse: HashMap::new(),
        }
    }
}

impl<T> IdMap<T> {
    fn insert(&mut self, id: i64, v: T) {
        if (0..DENSE_IDS).contains(&id) {
            let i = id as usize;
            if self.dense.len() <= i {
                self.dense.resize_with(i + 1, || None);
            }
            self.dense[i] = Some(v);
        } else {
            self.sparse.insert(id, v);
        }
    }

    #[inline]
    fn get(&self, id: i64) -> Option<&T> {
        if (0..DENSE_IDS).contains(&id) {
            self.dense.get(id as usize)?.as_ref()
        } else {
            self.sparse.get(&id)
        }
    }
}

/// The event stats the reader looks at, by their metadata's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    HloOp = 0,
    HloModule,
    ProgramId,
    RunId,
    StepNum,
}

const ROLES: [(&str, Role); 5] = [
    ("hlo_op", Role::HloOp),
    ("hlo_module", Role::HloModule),
    ("program_id", Role::ProgramId),
    ("run_id", Role::RunId),
    ("step_num", Role::StepNum),
];

/// An event's metadata: its name and what the name says.
struct EvMeta {
    name: String,
    /// The collective the name denotes.
    class: Option<CollectiveKind>,
    /// `end: <op>`: neither a call nor work.
    end_marker: bool,
    /// Not work (`end: `, thread-pool regions).
    marker: bool,
}

impl EvMeta {
    fn new(name: String) -> Self {
        Self {
            class: classify(&name),
            end_marker: name.starts_with("end: "),
            marker: name.starts_with("end: ") || name.starts_with("ThreadpoolListener::"),
            name,
        }
    }
}

/// One plane of the file: where its message is, and its name.
struct PlaneAt {
    name: String,
    start: u64,
    len: u64,
}

/// A plane's first walk: its metadata, own stats and lines' places.
#[derive(Default)]
struct PlaneHead {
    events: IdMap<EvMeta>,
    stat_names: HashMap<i64, String>,
    roles: IdMap<Role>,
    /// The plane's stats: (metadata id, integer value).
    stats: Vec<(i64, Option<i64>)>,
    /// (content start, length) of each line.
    lines: Vec<(u64, u64)>,
}

impl PlaneHead {
    /// The first plane stat named `name`, if an integer.
    fn stat_i64(&self, name: &str) -> Option<i64> {
        self.stats
            .iter()
            .find(|(id, _)| self.stat_names.get(id).map(String::as_str) == Some(name))
            .and_then(|(_, v)| *v)
    }

    fn event_name(&self, id: i64) -> &str {
        self.events.get(id).map_or("", |m| m.name.as_str())
    }
}

/// The planes of the file, in order, with their names.
fn locate_planes<R: Src>(r: &mut R) -> Result<Vec<PlaneAt>, TraceError> {
    let end = r.file_len();
    let mut planes = Vec::new();
    let mut scratch = Vec::new();
    r.seek_to(0)?;
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        if (field, wire) != (xspace::PLANES, LEN) {
            r.skip_value(wire, end)?;
            continue;
        }
        let len = r.read_len(end)?;
        let start = r.pos();
        let pend = start + len;
        let mut name = String::new();
        while r.pos() < pend {
            let (f, w) = r.read_key()?;
            if (f, w) == (xplane::NAME, LEN) {
                let n = r.read_len(pend)?;
                name = read_string(r, n, &mut scratch)?;
            } else {
                r.skip_value(w, pend)?;
            }
        }
        planes.push(PlaneAt { name, start, len });
    }
    Ok(planes)
}

fn read_string<R: Src>(r: &mut R, n: u64, scratch: &mut Vec<u8>) -> Result<String, TraceError> {
    r.with_bytes(n, scratch, |b, _| {
        Ok(String::from_utf8_lossy(b).into_owned())
    })
}

fn plane_head<R: Src>(r: &mut R, p: &PlaneAt) -> Result<PlaneHead, TraceError> {
    r.seek_to(p.start)?;
    let end = p.start + p.len;
    let mut head = PlaneHead::default();
    let mut scratch = Vec::new();
    while r.pos() < end {
        let (f, w) = r.read_key()?;
        match (f, w) {
            (xplane::LINES, LEN) => {
                let n = r.read_len(end)?;
                head.lines.push((r.pos(), n));
                r.skip(n)?;
            }
            (xplane::EVENT_METADATA, LEN) => {
                let n = r.read_len(end)?;
                let (id, name) = map_entry_name(r, n, &mut scratch)?;
                head.events.insert(id, EvMeta::new(name));
            }
            (xplane::STAT_METADATA, LEN) => {
                let n = r.read_len(end)?;
                let (id, name) = map_entry_name(r, n, &mut scratch)?;
                head.stat_names.insert(id, name);
            }
            (xplane::STATS, LEN) => {
                let n = r.read_len(end)?;
                let (id, v) = r.with_bytes(n, &mut scratch, |b, at| {
                    parse_stat(Cur::new(b, at)).map(|(id, v)| (id, v.as_i64()))
                })?;
                head.stats.push((id, v));
            }
            _ => r.skip_value(w, end)?,
        }
    }
    for (id, name) in &head.stat_names {
        if let Some((_, role)) = ROLES.iter().find(|(n, _)| n == name) {
            head.roles.insert(*id, *role);
        }
    }
    Ok(head)
}

/// A `map<int64, XEventMetadata | XStatMetadata>` entry: (key, name),
/// both 0 / empty when absent, the value's other fields (an HLO proto, say)
/// skipped unread.
fn map_entry_name<R: Src>(
    r: &mut R,
    n: u64,
    scratch: &mut Vec<u8>,
) -> Result<(i64, String), TraceError> {
    let end = r.pos() + n;
    let (mut key, mut name) = (0i64, String::new());
    while r.pos() < end {
        let (f, w) = r.read_key()?;
        match (f, w) {
            (map_entry::KEY, VARINT) => key = r.read_varint()? as i64,
            (map_entry::VALUE, LEN) => {
                let m = r.read_len(end)?;
                let vend = r.pos() + m;
                while r.pos() < vend {
                    let (g, w2) = r.read_key()?;
                    // Both metadata messages name themselves in field 2.
                    if (g, w2) == (xevent_metadata::NAME, LEN) {
                        let s = r.read_len(vend)?;
                        name = read_string(r, s, scratch)?;
                    } else {
                        r.skip_value(w2, vend)?;
                    }
                }
            }
            _ => r.skip_value(w, end)?,
        }
    }
    Ok((key, name))
}

/// A stat's value, as far as the reader cares.
#[derive(Clone, Copy, Debug, Default)]
enum Val<'a> {
    /// No stat of this role on the event.
    #[default]
    Absent,
    /// A value of another type, or none.
    Other,
    Int(i64),
    Uint(u64),
    Str(&'a [u8]),
    Ref(u64),
}

impl Val<'_> {
    fn as_i64(self) -> Option<i64> {
        match self {
            Val::Int(v) => Some(v),
            Val::Uint(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }
}

/// One `XStat`: (metadata id, value); the last of repeated fields wins.
#[inline(always)]
fn parse_stat(mut c: Cur<'_>) -> Result<(i64, Val<'_>), TraceError> {
    let (mut id, mut v) = (0i64, Val::Other);
    while !c.done() {
        let (f, w) = c.key()?;
        match (f, w) {
            (xstat::METADATA_ID, VARINT) => id = c.varint()? as i64,
            (xstat::UINT64_VALUE, VARINT) => v = Val::Uint(c.varint()?),
            (xstat::INT64_VALUE, VARINT) => v = Val::Int(c.varint()? as i64),
            (xstat::REF_VALUE, VARINT) => v = Val::Ref(c.varint()?),
            (xstat::STR_VALUE, LEN) => v = Val::Str(c.sub()?.bytes),
            (xstat::DOUBLE_VALUE..=xstat::COMPRESSED_STR_VALUE, _) => {
                c.skip(w)?;
                v = Val::Other;
            }
            _ => c.skip(w)?,
        }
    }
    Ok((id, v))
}

/// One `XEvent`: its metadata, offset (`None`: aggregated, or no time),
/// duration and the first stat of each role.
struct Ev<'a> {
    meta: i64,
    offset_ps: Option<i64>,
    duration_ps: i64,
    stats: [Val<'a>; 5],
}

impl Ev<'_> {
    fn new() -> Self {
        Self {
            meta: 0,
            offset_ps: None,
            duration_ps: 0,
            stats: [Val::Absent; 5],
        }
    }
}

/// Parses an event into `ev` (reset first); its stats only with `roles`.
#[inline(always)]
fn parse_event<'a>(
    mut c: Cur<'a>,
    roles: Option<&IdMap<Role>>,
    ev: &mut Ev<'a>,
) -> Result<(), TraceError> {
    ev.meta = 0;
    ev.offset_ps = None;
    ev.duration_ps = 0;
    if roles.is_some() {
        ev.stats = [Val::Absent; 5];
    }
    while !c.done() {
        let (f, w) = c.key()?;
        match (f, w) {
            (xevent::METADATA_ID, VARINT) => ev.meta = c.varint()? as i64,
            (xevent::OFFSET_PS, VARINT) => ev.offset_ps = Some(c.varint()? as i64),
            (xevent::NUM_OCCURRENCES, VARINT) => {
                c.varint()?;
                ev.offset_ps = None;
            }
            (xevent::DURATION_PS, VARINT) => ev.duration_ps = c.varint()? as i64,
            (EVENT_STATS, LEN) => {
                let Some(roles) = roles else {
                    c.skip(w)?;
                    continue;
                };
                let (id, v) = parse_stat(c.sub()?)?;
                if let Some(&role) = roles.get(id)
                    && matches!(ev.stats[role as usize], Val::Absent)
                {
                    ev.stats[role as usize] = v;
                }
            }
            _ => c.skip(w)?,
        }
    }
    Ok(())
}

/// FNV-1a, for the short op names of the classification cache.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// What each `hlo_op` string names (bounded: past `OP_CACHE_MAX` names,
/// classified each time).
#[derive(Default)]
struct OpCache(
    HashMap<Box<[u8]>, Option<CollectiveKind>, BuildHasherDefault<Fnv>>,
    /// The calls' names, shared.
    Interner,
);

impl OpCache {
    #[inline]
    fn classify(&mut self, op: &[u8]) -> Option<CollectiveKind> {
        if let Some(k) = self.0.get(op) {
            return *k;
        }
        let k = classify(&String::from_utf8_lossy(op));
        if self.0.len() < OP_CACHE_MAX {
            self.0.insert(op.into(), k);
        }
        k
    }
}

/// A string stat: its bytes, a ref's stat name; `None` otherwise.
fn str_of<'a>(head: &'a PlaneHead, v: Val<'a>) -> Option<&'a [u8]> {
    match v {
        Val::Str(s) => Some(s),
        Val::Ref(r) => i64::try_from(r)
            .ok()
            .and_then(|r| head.stat_names.get(&r))
            .map(String::as_bytes),
        _ => None,
    }
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Absolute (start, end) ns of an event at `offset_ps` on a line starting
/// at `line_start`.
#[inline]
fn span(line_start: i64, offset_ps: i64, duration_ps: i64) -> (i64, i64) {
    let start = line_start.saturating_add(offset_ps.div_euclid(1000));
    (start, start.saturating_add(duration_ps.div_euclid(1000)))
}

/// Walks one plane's lines for its collective calls (each with what it
/// followed) and, on the host plane, its steps.
struct PlaneWalk<'h> {
    head: &'h PlaneHead,
    index: usize,
    start_ns: i64,
    want_steps: bool,
    calls: Vec<CollectiveCall>,
    steps: Vec<Timed<u64>>,
}

impl<'h> PlaneWalk<'h> {
    fn new(head: &'h PlaneHead, index: usize, start_ns: i64, want_steps: bool) -> Self {
        Self {
            head,
            index,
            start_ns,
            want_steps,
            calls: Vec::new(),
            steps: Vec::new(),
        }
    }

    fn run<R: Src>(
        &mut self,
        r: &mut R,
        cache: &mut OpCache,
        want_calls: bool,
    ) -> Result<(), TraceError> {
        if !want_calls && !self.want_steps {
            return Ok(());
        }
        let mut scratch = Vec::new();
        for &(pos, len) in &self.head.lines {
            let first = self.calls.len();
            let start_ns = self.first_pass(r, cache, &mut scratch, (pos, len), want_calls)?;
            let line = &mut self.calls[first..];
            if !line.is_empty() {
                let names = &mut cache.1;
                preceding_pass(
                    r,
                    self.head,
                    (pos, len),
                    start_ns,
                    line,
                    &mut scratch,
                    names,
                )?;
            }
        }
        Ok(())
    }

    /// Adds the line's calls (without what preceded them) and steps;
    /// returns where the line starts (epoch ns).
    fn first_pass<R: Src>(
        &mut self,
        r: &mut R,
        cache: &mut OpCache,
        scratch: &mut Vec<u8>,
        (pos, len): (u64, u64),
        want_calls: bool,
    ) -> Result<i64, TraceError> {
        let (mut id, mut ts) = (0i64, 0i64);
        // The line's calls go to `self.calls` from `first`, their enter and
        // exit first holding the offset and duration (ps): times wait for
        // the line's timestamp, which may come after its events.
        let (first, mut steps) = (self.calls.len(), Vec::new());
        let (head, want_steps, calls) = (self.head, self.want_steps, &mut self.calls);
        walk_line(r, (pos, len), scratch, |item| {
            let c = match item {
                Item::Id(v) => {
                    id = v as i64;
                    return Ok(());
                }
                Item::Ts(v) => {
                    ts = v as i64;
                    return Ok(());
                }
                Item::Event(c) => c,
            };
            // Parsed whole before anything is kept: an event that fails
            // is handed on again, to fail for good.
            let mut ev = Ev::new();
            parse_event(c, Some(&head.roles), &mut ev)?;
            let Some(off) = ev.offset_ps else {
                return Ok(());
            };
            let step = ev.stats[Role::StepNum as usize].as_i64();
            if want_steps && let Some(n) = step.and_then(|n| u64::try_from(n).ok()) {
                steps.push((n, off, ev.duration_ps));
            }
            if want_calls && let Some(mut call) = call_of(head, cache, &ev) {
                (call.enter_ns, call.exit_ns) = (off, ev.duration_ps);
                calls.push(call);
            }
            Ok(())
        })?;
        let start_ns = self.start_ns.saturating_add(ts);
        let plane = u32::try_from(self.index).unwrap_or(u32::MAX);
        for c in &mut self.calls[first..] {
            (c.enter_ns, c.exit_ns) = span(start_ns, c.enter_ns, c.exit_ns);
            c.track = Some(Track { plane, line: id });
        }
        self.steps.extend(steps.into_iter().map(|(name, off, dur)| {
            let (start_ns, end_ns) = span(start_ns, off, dur);
            Timed {
                name,
                start_ns,
                end_ns,
            }
        }));
        Ok(start_ns)
    }
}

/// One field of a line, as [`walk_line`] hands it on.
enum Item<'a> {
    Id(u64),
    Ts(u64),
    Event(Cur<'a>),
}

/// Hands `f` each field of the line at `(pos, len)` that it cares for. Whole
/// fields are taken straight from the reader's buffer; one that crosses
/// its end (or does not parse) goes through the reader field by field,
/// which tells a truncation or damage from a buffer boundary. `f` may be
/// handed an event again after it failed on it.
fn walk_line<R: Src>(
    r: &mut R,
    (pos, len): (u64, u64),
    scratch: &mut Vec<u8>,
    mut f: impl FnMut(Item<'_>) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    r.seek_to(pos)?;
    let end = pos + len;
    while r.pos() < end {
        let left = end - r.pos();
        if r.with_chunk(left, |b, base| Ok(whole_fields(b, base, &mut f)))? > 0 {
            continue;
        }
        let (field, wire) = r.read_key()?;
        match (field, wire) {
            (xline::EVENTS, LEN) => {
                let n = r.read_len(end)?;
                r.with_bytes(n, scratch, |b, at| f(Item::Event(Cur::new(b, at))))?;
            }
            (xline::ID, VARINT) => f(Item::Id(r.read_varint()?))?,
            (xline::TIMESTAMP_NS, VARINT) => f(Item::Ts(r.read_varint()?))?,
            _ => r.skip_value(wire, end)?,
        }
    }
    Ok(())
}

/// The fields wholly in `b` that `f` takes: how many bytes they were.
#[inline]
fn whole_fields(
    b: &[u8],
    base: u64,
    f: &mut impl FnMut(Item<'_>) -> Result<(), TraceError>,
) -> u64 {
    let mut c = Cur::new(b, base);
    let mut used = 0;
    while !c.done() && one_field(&mut c, f).is_ok() {
        used = c.at;
    }
    used as u64
}

#[inline]
fn one_field(
    c: &mut Cur<'_>,
    f: &mut impl FnMut(Item<'_>) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    match c.key()? {
        (xline::EVENTS, LEN) => f(Item::Event(c.sub()?)),
        (xline::ID, VARINT) => f(Item::Id(c.varint()?)),
        (xline::TIMESTAMP_NS, VARINT) => f(Item::Ts(c.varint()?)),
        (_, w) => c.skip(w),
    }
}

/// The call an event is, if a collective (times, step, track and
/// preceding filled in later).
#[inline]
fn call_of(head: &PlaneHead, cache: &mut OpCache, ev: &Ev<'_>) -> Option<CollectiveCall> {
    let meta = head.events.get(ev.meta);
    if meta.is_some_and(|m| m.end_marker) {
        return None;
    }
    let op = str_of(head, ev.stats[Role::HloOp as usize]);
    let kind = match (op, meta) {
        // XLA names a thunk's event by its op: no lookup.
        (Some(b), Some(m)) if b == m.name.as_bytes() => m.class,
        (Some(b), _) => cache.classify(b),
        (None, _) => meta.and_then(|m| m.class),
    }?;
    let name = meta.map_or("", |m| m.name.as_str());
    let module =
        str_of(head, ev.stats[Role::HloModule as usize]).map_or_else(|| "xla".into(), lossy);
    let group = match ev.stats[Role::ProgramId as usize].as_i64() {
        Some(id) => format!("{module}#{id}"),
        None => module,
    };
    let run = ev.stats[Role::RunId as usize].as_i64();
    Some(CollectiveCall {
        participant: 0,
        kind,
        key: InstanceKey {
            group: cache.1.name(&group),
            name: match op {
                Some(b) => cache.1.name(&String::from_utf8_lossy(b)),
                None => cache.1.name(name),
            },
            // Run ids are i64 in XLA; kept bit for bit.
            ordinal: run.map_or(0, |r| r as u64),
        },
        matched_by: if run.is_some() {
            MatchedBy::RunId
        } else {
            MatchedBy::Occurrence
        },
        op: cache.1.name(name),
        enter_ns: 0,
        exit_ns: 0,
        step: None,
        group_size: None,
        elements: None,
        preceding: None,
        clock: CallClock::Host,
        track: None,
    })
}

/// A work event that may have preceded calls: `seq` is its place on the line.
#[derive(Clone, Copy)]
struct Cand {
    seq: u64,
    meta: i64,
    start: i64,
    end: i64,
}

/// Whether `a` is what preceded rather than `b`: the later end, then the
/// earlier start (the enclosing op), then the earlier on the line.
fn better(a: Cand, b: Option<Cand>) -> bool {
    use std::cmp::Reverse;
    b.is_none_or(|b| {
        (a.end, Reverse(a.start), Reverse(a.seq)) > (b.end, Reverse(b.start), Reverse(b.seq))
    })
}

/// Fills in what each of a line's calls followed: the work event that
/// ended last at or before its enter (as [`super::preceding_before`]).
/// Each event goes to the first call entered at or after its end, where
/// only the best of each call's events is kept: memory of the calls only.
fn preceding_pass<R: Src>(
    r: &mut R,
    head: &PlaneHead,
    (pos, len): (u64, u64),
    line_start: i64,
    calls: &mut [CollectiveCall],
    scratch: &mut Vec<u8>,
    names: &mut Interner,
) -> Result<(), TraceError> {
    let mut enters: Vec<i64> = calls.iter().map(|c| c.enter_ns).collect();
    enters.sort_unstable();
    let mut best: Vec<Option<Cand>> = vec![None; enters.len()];
    let (mut seq, mut hint) = (0u64, 0usize);
    walk_line(r, (pos, len), scratch, |item| {
        let Item::Event(c) = item else {
            return Ok(());
        };
        let mut ev = Ev::new();
        parse_event(c, None, &mut ev)?;
        seq += 1;
        let Some(off) = ev.offset_ps else {
            return Ok(());
        };
        let (start, end) = span(line_start, off, ev.duration_ps);
        if end <= start || head.events.get(ev.meta).is_some_and(|m| m.marker) {
            return Ok(());
        }
        // Lines are mostly in time order: the last event's bucket first.
        let fits = |i: usize| {
            i.checked_sub(1).is_none_or(|p| enters[p] < end)
                && enters.get(i).is_none_or(|&t| t >= end)
        };
        if !fits(hint) {
            hint = enters.partition_point(|&t| t < end);
        }
        let i = hint;
        if let Some(slot) = best.get_mut(i) {
            let c = Cand {
                seq,
                meta: ev.meta,
                start,
                end,
            };
            if better(c, *slot) {
                *slot = Some(c);
            }
        }
        Ok(())
    })?;
    // The buckets' winners: for a call, those of its own and earlier
    // buckets are exactly the ones that ended by its enter.
    let mut winners: Vec<Timed<(u64, i64)>> = best
        .into_iter()
        .flatten()
        .map(|c| Timed {
            name: (c.seq, c.meta),
            start_ns: c.start,
            end_ns: c.end,
        })
        .collect();
    winners.sort_by_key(|t| (t.end_ns, t.start_ns, t.name.0));
    for c in calls.iter_mut() {
        c.preceding = preceding_before(&winners, c.enter_ns).map(|t| Preceding {
            name: names.name(head.event_name(t.name.1)),
            start_ns: t.start_ns,
            end_ns: t.end_ns,
        });
    }
    Ok(())
}

/// Calls without a run id: the n-th execution of each op, in time order.
fn number_occurrences(calls: &mut [CollectiveCall]) {
    // Mostly in order already (one line): no sort, and no sort's buffer.
    if !calls.is_sorted_by_key(|c| c.enter_ns) {
        calls.sort_by_key(|c| c.enter_ns);
    }
    let mut seen: HashMap<(Name, Name), u64> = HashMap::new();
    for c in calls
        .iter_mut()
        .filter(|c| c.matched_by == MatchedBy::Occurrence)
    {
        let n = seen
            .entry((c.key.group.clone(), c.key.name.clone()))
            .or_insert(0);
        c.key.ordinal = *n;
        *n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clockmesh_proto::prost::Message;
    use clockmesh_proto::xplane::{
        XEvent, XEventMetadata, XLine, XPlane, XSpace, XStat, XStatMetadata, x_event, x_stat,
    };

    /// The reader by prost decoding that this module replaced, kept to
    /// check the streaming reader against.
    mod oracle {
        use std::path::Path;

        use clockmesh_proto::prost::Message;
        use clockmesh_proto::xplane::{XPlane, XSpace, x_event, x_stat};

        use super::super::{HOST_PLANE, PROCESS_INDEX, TASK_ENV, number_occurrences};
        use crate::TraceError;
        use crate::collectives::classify::classify;
        use crate::collectives::model::{
            CollectiveCall, Framework, InstanceKey, MatchedBy, Participant, Preceding, Track,
        };
        use crate::collectives::{RankTrace, Timed, preceding_before, step_begun_before};
        use crate::scan::ALIGNMENT_BOUND_STAT;

        /// The decoding reader this module had: the streaming one must agree.
        pub fn parse(bytes: &[u8], path: &Path, aligned: bool) -> Result<RankTrace, TraceError> {
            let space = XSpace::decode(bytes)
                .map_err(|e| TraceError::NotXPlane(format!("not an xplane file: {e}")))?;
            let env = plane(&space, TASK_ENV).ok_or(TraceError::MissingTaskEnv)?;
            let start_ns =
                stat_i64(env, &env.stats, "profile_start_time").ok_or(TraceError::MissingStart)?;
            let host = plane(&space, HOST_PLANE);
            let bound_ns = host
                .and_then(|p| stat_i64(p, &p.stats, ALIGNMENT_BOUND_STAT))
                .and_then(|b| u64::try_from(b).ok())
                .filter(|_| aligned);
            // xprof's `process_id` is the OS pid; the JAX helper records the
            // job's process index.
            let rank = stat_i64(env, &env.stats, PROCESS_INDEX).and_then(|r| u64::try_from(r).ok());
            let participant = Participant {
                host: crate::collectives::file_host(path, ".xplane.pb"),
                rank,
                framework: Framework::Xla,
                trace: path.display().to_string(),
                bound_ns,
            };
            let steps = host.map(|p| steps(p, start_ns)).unwrap_or_default();
            let mut calls = Vec::new();
            for (index, p) in space.planes.iter().enumerate() {
                if p.name.starts_with("/device:") {
                    calls.extend(
                        plane_calls(p, index, start_ns, &steps)
                            .into_iter()
                            .map(|c| CollectiveCall {
                                clock: crate::collectives::CallClock::Gpu,
                                ..c
                            }),
                    );
                }
            }
            if calls.is_empty()
                && let Some(index) = space.planes.iter().position(|p| p.name == HOST_PLANE)
            {
                calls = plane_calls(&space.planes[index], index, start_ns, &steps);
            }
            number_occurrences(&mut calls);
            Ok(RankTrace {
                participant,
                calls,
                steps: Vec::new(),
            })
        }

        fn plane<'a>(space: &'a XSpace, name: &str) -> Option<&'a XPlane> {
            space.planes.iter().find(|p| p.name == name)
        }

        fn stat_name(p: &XPlane, id: i64) -> Option<&str> {
            p.stat_metadata.get(&id).map(|m| m.name.as_str())
        }

        fn stat_i64(
            p: &XPlane,
            stats: &[clockmesh_proto::xplane::XStat],
            name: &str,
        ) -> Option<i64> {
            stats
                .iter()
                .find(|s| stat_name(p, s.metadata_id) == Some(name))
                .and_then(|s| match s.value {
                    Some(x_stat::Value::Int64Value(v)) => Some(v),
                    Some(x_stat::Value::Uint64Value(v)) => i64::try_from(v).ok(),
                    _ => None,
                })
        }

        fn stat_str<'a>(
            p: &'a XPlane,
            stats: &'a [clockmesh_proto::xplane::XStat],
            name: &str,
        ) -> Option<&'a str> {
            let s = stats
                .iter()
                .find(|s| stat_name(p, s.metadata_id) == Some(name))?;
            match &s.value {
                Some(x_stat::Value::StrValue(v)) => Some(v),
                Some(x_stat::Value::RefValue(r)) => {
                    i64::try_from(*r).ok().and_then(|r| stat_name(p, r))
                }
                _ => None,
            }
        }

        /// One event's name, start and end (epoch ns); `None` for events given as
        /// a count (aggregated) rather than an offset.
        fn event_span<'a>(
            p: &'a XPlane,
            line_start_ns: i64,
            ev: &clockmesh_proto::xplane::XEvent,
        ) -> Option<(&'a str, i64, i64)> {
            let Some(x_event::Data::OffsetPs(off)) = ev.data else {
                return None;
            };
            let name = p
                .event_metadata
                .get(&ev.metadata_id)
                .map_or("", |m| m.name.as_str());
            let start = line_start_ns.saturating_add(off.div_euclid(1000));
            let end = start.saturating_add(ev.duration_ps.div_euclid(1000));
            Some((name, start, end))
        }

        /// The training steps (`StepTraceAnnotation`: events with `step_num`).
        fn steps(p: &XPlane, start_ns: i64) -> Vec<Timed<u64>> {
            let mut out = Vec::new();
            for line in &p.lines {
                let line_start = start_ns.saturating_add(line.timestamp_ns);
                for ev in &line.events {
                    let Some(n) =
                        stat_i64(p, &ev.stats, "step_num").and_then(|n| u64::try_from(n).ok())
                    else {
                        continue;
                    };
                    if let Some((_, s, e)) = event_span(p, line_start, ev) {
                        out.push(Timed {
                            name: n,
                            start_ns: s,
                            end_ns: e,
                        });
                    }
                }
            }
            out.sort_by_key(|t| t.start_ns);
            out
        }

        /// Markers XLA writes that are not work (`end: <op>`, thread-pool regions).
        fn is_marker(name: &str, start: i64, end: i64) -> bool {
            name.starts_with("end: ") || name.starts_with("ThreadpoolListener::") || end <= start
        }

        /// The collective calls of plane `p`, the `index`-th of its file.
        fn plane_calls(
            p: &XPlane,
            index: usize,
            start_ns: i64,
            steps: &[Timed<u64>],
        ) -> Vec<CollectiveCall> {
            let mut calls = Vec::new();
            for line in &p.lines {
                let line_start = start_ns.saturating_add(line.timestamp_ns);
                let mut work: Vec<Timed<&str>> = line
                    .events
                    .iter()
                    .filter_map(|ev| event_span(p, line_start, ev))
                    .filter(|(n, s, e)| !is_marker(n, *s, *e))
                    .map(|(name, start_ns, end_ns)| Timed {
                        name,
                        start_ns,
                        end_ns,
                    })
                    .collect();
                work.sort_by_key(|t| (t.end_ns, t.start_ns));
                for ev in &line.events {
                    let Some((name, enter, exit)) = event_span(p, line_start, ev) else {
                        continue;
                    };
                    if name.starts_with("end: ") {
                        continue;
                    }
                    let op = stat_str(p, &ev.stats, "hlo_op").unwrap_or(name);
                    let Some(kind) = classify(op) else {
                        continue;
                    };
                    let module = stat_str(p, &ev.stats, "hlo_module").unwrap_or("xla");
                    let program = stat_i64(p, &ev.stats, "program_id");
                    let group = match program {
                        Some(id) => format!("{module}#{id}"),
                        None => module.to_string(),
                    };
                    let run = stat_i64(p, &ev.stats, "run_id");
                    calls.push(CollectiveCall {
                        participant: 0,
                        kind,
                        key: InstanceKey {
                            group: group.into(),
                            name: op.into(),
                            // Run ids are i64 in XLA; kept bit for bit.
                            ordinal: run.map_or(0, |r| r as u64),
                        },
                        matched_by: if run.is_some() {
                            MatchedBy::RunId
                        } else {
                            MatchedBy::Occurrence
                        },
                        op: name.into(),
                        enter_ns: enter,
                        exit_ns: exit,
                        step: step_begun_before(steps, enter),
                        group_size: None,
                        elements: None,
                        preceding: preceding_before(&work, enter).map(|t| Preceding {
                            name: t.name.into(),
                            start_ns: t.start_ns,
                            end_ns: t.end_ns,
                        }),
                        clock: crate::collectives::CallClock::Host,
                        track: Some(Track {
                            plane: u32::try_from(index).unwrap_or(u32::MAX),
                            line: line.id,
                        }),
                    });
                }
            }
            calls
        }
    }

    fn stat(id: i64, v: x_stat::Value) -> XStat {
        XStat {
            metadata_id: id,
            value: Some(v),
        }
    }

    /// The shape JAX 0.10 writes on CPU (see the module doc).
    #[expect(
        clippy::too_many_lines,
        reason = "the recorded JAX shape, written out event by event"
    )]
    fn host(process: u64, bound: Option<u64>, psum_at_ps: i64) -> XSpace {
        let mut cpu = XPlane {
            name: HOST_PLANE.into(),
            ..Default::default()
        };
        for (id, name) in [
            (1, "hlo_op"),
            (2, "hlo_module"),
            (3, "program_id"),
            (4, "run_id"),
            (5, "step_num"),
            (6, ALIGNMENT_BOUND_STAT),
        ] {
            cpu.stat_metadata.insert(
                id,
                XStatMetadata {
                    id,
                    name: name.into(),
                    ..Default::default()
                },
            );
        }
        for (id, name) in [
            (1, "tanh_fusion"),
            (2, "psum.7"),
            (3, "end: psum.7"),
            (4, "train"),
            (5, "all_gather.7"),
        ] {
            cpu.event_metadata.insert(
                id,
                XEventMetadata {
                    id,
                    name: name.into(),
                    ..Default::default()
                },
            );
        }
        if let Some(b) = bound {
            cpu.stats.push(stat(6, x_stat::Value::Uint64Value(b)));
        }
        let op = |m: i64, name: &str, at: i64, dur: i64, run: i64| XEvent {
            metadata_id: m,
            data: Some(x_event::Data::OffsetPs(at)),
            duration_ps: dur,
            stats: vec![
                stat(1, x_stat::Value::StrValue(name.into())),
                stat(2, x_stat::Value::StrValue("jit_step".into())),
                stat(3, x_stat::Value::Int64Value(8)),
                stat(4, x_stat::Value::Int64Value(run)),
            ],
        };
        cpu.lines.push(XLine {
            name: "python".into(),
            timestamp_ns: 1_000,
            events: vec![XEvent {
                metadata_id: 4,
                data: Some(x_event::Data::OffsetPs(0)),
                duration_ps: 50_000_000,
                stats: vec![stat(5, x_stat::Value::Int64Value(3))],
            }],
            ..Default::default()
        });
        cpu.lines.push(XLine {
            name: "tf_XLAPjRtCpuClient/1".into(),
            timestamp_ns: 1_000,
            events: vec![
                op(1, "tanh_fusion", 1_000_000, 2_000_000, -5),
                op(2, "psum.7", psum_at_ps, 4_000_000, -5),
                XEvent {
                    metadata_id: 3,
                    data: Some(x_event::Data::OffsetPs(psum_at_ps + 4_000_000)),
                    duration_ps: 300_000,
                    stats: vec![],
                },
                op(5, "all_gather.7", psum_at_ps + 5_000_000, 1_000_000, -5),
            ],
            ..Default::default()
        });
        let mut env = XPlane {
            name: TASK_ENV.into(),
            ..Default::default()
        };
        env.stat_metadata.insert(
            1,
            XStatMetadata {
                id: 1,
                name: "profile_start_time".into(),
                ..Default::default()
            },
        );
        env.stats
            .push(stat(1, x_stat::Value::Uint64Value(1_000_000_000)));
        env.stat_metadata.insert(
            2,
            XStatMetadata {
                id: 2,
                name: PROCESS_INDEX.into(),
                ..Default::default()
            },
        );
        env.stats.push(stat(2, x_stat::Value::Uint64Value(process)));
        // xprof's own process id (the OS pid) is not the rank.
        let mut md = XPlane {
            name: "/host:metadata".into(),
            ..Default::default()
        };
        md.stat_metadata.insert(
            1,
            XStatMetadata {
                id: 1,
                name: "process_id".into(),
                ..Default::default()
            },
        );
        md.stats.push(stat(1, x_stat::Value::Int64Value(4242)));
        XSpace {
            planes: vec![md, cpu, env],
            ..Default::default()
        }
    }

    fn write(name: &str, s: &XSpace) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("cm-coll-xplane-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, s.encode_to_vec()).unwrap();
        p
    }

    #[test]
    fn xla_collective_thunks_are_calls_keyed_by_run_id() {
        let t = read(&write("n1.xplane.pb", &host(1, Some(700), 5_000_000)), true).unwrap();
        assert_eq!(t.participant.host, "n1");
        assert_eq!(t.participant.rank, Some(1));
        assert_eq!(t.participant.bound_ns, Some(700));
        assert_eq!(
            t.calls.len(),
            2,
            "psum and all_gather; `end:` markers are not calls"
        );
        let c = &t.calls[0];
        assert_eq!(&*c.op, "psum.7");
        assert_eq!(c.matched_by, MatchedBy::RunId);
        assert_eq!(&*c.key.group, "jit_step#8");
        assert_eq!(c.key.ordinal, (-5i64) as u64);
        let t0 = 1_000_000_000 + 1_000;
        assert_eq!((c.enter_ns, c.exit_ns), (t0 + 5_000, t0 + 9_000));
        assert_eq!(c.step, Some(3));
        let p = c.preceding.as_ref().unwrap();
        assert_eq!((&*p.name, p.end_ns), ("tanh_fusion", t0 + 3_000));
        // The all-gather came after psum's `end:` marker, which is no work.
        assert_eq!(
            t.calls[1].preceding.as_ref().unwrap().name.as_ref(),
            "psum.7"
        );
        let raw = read(
            &write("n1raw.xplane.pb", &host(1, Some(700), 5_000_000)),
            false,
        )
        .unwrap();
        assert_eq!(raw.participant.bound_ns, None, "raw clocks have no bound");
    }

    #[test]
    fn a_file_that_is_not_an_xplane_is_an_error() {
        let dir = std::env::temp_dir().join(format!("cm-coll-xplane-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("junk.xplane.pb");
        std::fs::write(&p, [0xff, 0xff, 0xff]).unwrap();
        assert!(read(&p, true).is_err());
        let mut s = host(0, None, 5_000_000);
        s.planes.retain(|p| p.name != TASK_ENV);
        assert!(matches!(
            read(&write("noenv.xplane.pb", &s), true),
            Err(TraceError::MissingTaskEnv)
        ));
    }

    /// What a call is, in full, for comparing readers.
    fn same(a: &RankTrace, b: &RankTrace, what: &str) {
        assert_eq!(a.participant, b.participant, "{what}");
        assert_eq!(a.calls, b.calls, "{what}");
    }

    /// Variations of the recorded shape: the planes in another order, no
    /// run ids, `hlo_op` by reference, aggregated and unknown events,
    /// events out of order with ties on what came before, a device plane,
    /// an event larger than the reader's buffer.
    fn variants() -> Vec<XSpace> {
        let mut out = vec![
            host(1, Some(700), 5_000_000),
            host(0, None, 2_500_000),
            host(2, Some(5), 500_000),
        ];
        let mut s = host(3, Some(9), 5_000_000);
        s.planes.reverse();
        out.push(s);
        let mut s = host(1, None, 5_000_000);
        for ev in s.planes[1].lines.iter_mut().flat_map(|l| &mut l.events) {
            ev.stats.retain(|st| st.metadata_id != 4);
        }
        out.push(s);
        let mut s = host(1, None, 5_000_000);
        let cpu = &mut s.planes[1];
        cpu.stat_metadata.insert(
            20,
            XStatMetadata {
                id: 20,
                name: "all-reduce.3".into(),
                ..Default::default()
            },
        );
        for st in cpu.lines[1].events[1].stats.iter_mut() {
            if st.metadata_id == 1 {
                st.value = Some(x_stat::Value::RefValue(20));
            }
        }
        let line = &mut cpu.lines[1].events;
        line.push(XEvent {
            metadata_id: 99,
            data: Some(x_event::Data::OffsetPs(9_000_000)),
            duration_ps: 1_000,
            stats: vec![],
        });
        line.push(XEvent {
            metadata_id: 2,
            data: Some(x_event::Data::NumOccurrences(3)),
            ..Default::default()
        });
        // An op enclosing tanh_fusion (same end), a twin of it, and an
        // event ending exactly at the psum's enter.
        for (m, at, dur) in [
            (4, 500_000, 2_500_000),
            (1, 500_000, 2_500_000),
            (4, 4_000_000, 1_000_000),
        ] {
            line.push(XEvent {
                metadata_id: m,
                data: Some(x_event::Data::OffsetPs(at)),
                duration_ps: dur,
                stats: vec![],
            });
        }
        line.reverse();
        out.push(s);
        let mut s = host(1, Some(700), 5_000_000);
        let mut dev = s.planes[1].clone();
        dev.name = "/device:GPU:0".into();
        dev.stats.clear();
        dev.lines.remove(0);
        s.planes.insert(1, dev);
        out.push(s);
        out.push(long_line());
        let mut s = host(1, Some(700), 5_000_000);
        s.planes[1].lines[1].events[0]
            .stats
            .push(stat(6, x_stat::Value::StrValue("x".repeat(3 << 20))));
        out.push(s);
        out
    }

    /// A line of a few MB (past the reader's buffer), in time order but
    /// for some swapped pairs, with a collective every 1,000 events.
    fn long_line() -> XSpace {
        let mut s = host(1, Some(700), 5_000_000);
        let line = &mut s.planes[1].lines[1];
        let (work, call) = (line.events[0].clone(), line.events[1].clone());
        for i in 0..60_000i64 {
            let at = 10_000_000 + i * 2_000_000;
            let mut e = work.clone();
            e.data = Some(x_event::Data::OffsetPs(at + (i % 7) * 1_000));
            e.duration_ps = 1_000_000 + (i % 5) * 500_000;
            line.events.push(e);
            if i % 1_000 == 999 {
                let mut c = call.clone();
                c.data = Some(x_event::Data::OffsetPs(at + 1_500_000));
                for st in &mut c.stats {
                    if st.metadata_id == 4 {
                        st.value = Some(x_stat::Value::Int64Value(i));
                    }
                }
                line.events.push(c);
            }
        }
        for i in (0..line.events.len() - 1).step_by(3) {
            line.events.swap(i, i + 1);
        }
        s
    }

    #[test]
    fn the_streaming_readers_agree_with_decoding_the_whole_file() {
        for (i, s) in variants().iter().enumerate() {
            let bytes = s.encode_to_vec();
            let path = write(&format!("v{i}.xplane.pb"), s);
            for aligned in [true, false] {
                let want = oracle::parse(&bytes, &path, aligned).unwrap();
                assert!(!want.calls.is_empty(), "variant {i} has calls");
                let what = format!("variant {i}, aligned {aligned}");
                same(&parse(&bytes, &path, aligned).unwrap(), &want, &what);
                same(&read(&path, aligned).unwrap(), &want, &what);
            }
        }
    }

    #[test]
    fn a_truncated_or_damaged_file_is_an_error_not_a_panic() {
        let s = host(1, Some(700), 5_000_000);
        let bytes = s.encode_to_vec();
        let path = Path::new("t.xplane.pb");
        for k in 0..bytes.len() {
            let r = parse(&bytes[..k], path, true);
            assert!(r.is_err(), "{k} of {} bytes", bytes.len());
        }
        let cut = write("cut.xplane.pb", &s);
        std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
        let err = read(&cut, true).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
        for i in 0..bytes.len() {
            for x in [0xff, 0x80, 0x01] {
                let mut b = bytes.clone();
                b[i] ^= x;
                let _ = parse(&b, path, true);
            }
        }
    }
}
