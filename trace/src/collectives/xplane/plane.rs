//! The planes of a file and each plane's first walk: its event and stat metadata, its own stats, its lines' places.

use std::collections::HashMap;

use super::event::parse_stat;
use super::source::{Cur, Src};
use crate::TraceError;
use crate::collectives::classify::classify;
use crate::collectives::model::CollectiveKind;
use crate::fields::{map_entry, xevent_metadata, xplane, xspace};
use crate::wire::{LEN, VARINT};

/// Metadata ids below this are looked up in a table, others hashed.
const DENSE_IDS: i64 = 1 << 16;

/// A table by metadata id: dense for the small ids profilers use.
pub(super) struct IdMap<T> {
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
    pub(super) fn get(&self, id: i64) -> Option<&T> {
        if (0..DENSE_IDS).contains(&id) {
            self.dense.get(id as usize)?.as_ref()
        } else {
            self.sparse.get(&id)
        }
    }
}

/// The event stats the reader looks at, by their metadata's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    HloOp = 0,
    HloModule,
    ProgramId,
    RunId,
    StepNum,
    /// XLA's op name of a device event (`jit(step)/forward/dot_general`:
    /// the framework op with its name scopes), where the event is named by
    /// its kernel.
    OpName,
}

/// How many roles an event's stats are read for.
pub(super) const N_ROLES: usize = 6;

const ROLES: [(&str, Role); N_ROLES] = [
    ("hlo_op", Role::HloOp),
    ("hlo_module", Role::HloModule),
    ("program_id", Role::ProgramId),
    ("run_id", Role::RunId),
    ("step_num", Role::StepNum),
    ("name", Role::OpName),
];

/// An event's metadata: its name and what the name says.
pub(super) struct EvMeta {
    pub(super) name: String,
    /// The collective the name denotes.
    pub(super) class: Option<CollectiveKind>,
    /// `end: <op>`: neither a call nor work.
    pub(super) end_marker: bool,
    /// Not work (`end: `, thread-pool regions).
    pub(super) marker: bool,
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
pub(super) struct PlaneAt {
    pub(super) name: String,
    start: u64,
    len: u64,
}

/// A plane's first walk: its metadata, own stats and lines' places.
#[derive(Default)]
pub(super) struct PlaneHead {
    pub(super) events: IdMap<EvMeta>,
    pub(super) stat_names: HashMap<i64, String>,
    pub(super) roles: IdMap<Role>,
    /// The plane's stats: (metadata id, integer value).
    stats: Vec<(i64, Option<i64>)>,
    /// (content start, length) of each line.
    pub(super) lines: Vec<(u64, u64)>,
}

impl PlaneHead {
    /// The first plane stat named `name`, if an integer.
    pub(super) fn stat_i64(&self, name: &str) -> Option<i64> {
        self.stats
            .iter()
            .find(|(id, _)| self.stat_names.get(id).map(String::as_str) == Some(name))
            .and_then(|(_, v)| *v)
    }

    pub(super) fn event_name(&self, id: i64) -> &str {
        self.events.get(id).map_or("", |m| m.name.as_str())
    }
}

/// The planes of the file, in order, with their names.
pub(super) fn locate_planes<R: Src>(r: &mut R) -> Result<Vec<PlaneAt>, TraceError> {
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

pub(super) fn plane_head<R: Src>(r: &mut R, p: &PlaneAt) -> Result<PlaneHead, TraceError> {
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
