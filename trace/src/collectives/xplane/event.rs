//! One event of a line and its stats, as far as the reader cares: values by role, string stats, spans.

use super::plane::{IdMap, N_ROLES, PlaneHead, Role};
use super::source::Cur;
use crate::TraceError;
use crate::fields::{xevent, xstat};
use crate::wire::{LEN, VARINT};

/// `XEvent.stats`.
const EVENT_STATS: u32 = 4;

/// A stat's value, as far as the reader cares.
#[derive(Clone, Copy, Debug, Default)]
pub(super) enum Val<'a> {
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
    pub(super) fn as_i64(self) -> Option<i64> {
        match self {
            Val::Int(v) => Some(v),
            Val::Uint(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }
}

/// One `XStat`: (metadata id, value); the last of repeated fields wins.
#[inline(always)]
pub(super) fn parse_stat(mut c: Cur<'_>) -> Result<(i64, Val<'_>), TraceError> {
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
pub(super) struct Ev<'a> {
    pub(super) meta: i64,
    pub(super) offset_ps: Option<i64>,
    pub(super) duration_ps: i64,
    pub(super) stats: [Val<'a>; N_ROLES],
}

impl Ev<'_> {
    pub(super) fn new() -> Self {
        Self {
            meta: 0,
            offset_ps: None,
            duration_ps: 0,
            stats: [Val::Absent; N_ROLES],
        }
    }
}

/// Parses an event into `ev` (reset first); its stats only with `roles`.
#[inline(always)]
pub(super) fn parse_event<'a>(
    mut c: Cur<'a>,
    roles: Option<&IdMap<Role>>,
    ev: &mut Ev<'a>,
) -> Result<(), TraceError> {
    ev.meta = 0;
    ev.offset_ps = None;
    ev.duration_ps = 0;
    if roles.is_some() {
        ev.stats = [Val::Absent; N_ROLES];
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

/// A string stat: its bytes, a ref's stat name; `None` otherwise.
pub(super) fn str_of<'a>(head: &'a PlaneHead, v: Val<'a>) -> Option<&'a [u8]> {
    match v {
        Val::Str(s) => Some(s),
        Val::Ref(r) => i64::try_from(r)
            .ok()
            .and_then(|r| head.stat_names.get(&r))
            .map(String::as_bytes),
        _ => None,
    }
}

pub(super) fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Absolute (start, end) ns of an event at `offset_ps` on a line starting
/// at `line_start`.
#[inline]
pub(super) fn span(line_start: i64, offset_ps: i64, duration_ps: i64) -> (i64, i64) {
    let start = line_start.saturating_add(offset_ps.div_euclid(1000));
    (start, start.saturating_add(duration_ps.div_euclid(1000)))
}
