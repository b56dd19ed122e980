//! Walking a plane's lines: each line's collective calls and steps in a first pass, then what the calls followed.

use super::calls::{OpCache, call_of};
use super::event::{Ev, parse_event, span};
use super::plane::{PlaneHead, Role};
use super::preceding::preceding_pass;
use super::source::{Cur, Src};
use crate::TraceError;
use crate::collectives::Timed;
use crate::collectives::model::{CollectiveCall, Track};
use crate::fields::xline;
use crate::wire::{LEN, VARINT};

/// Walks one plane's lines for its collective calls (each with what it
/// followed) and, on the host plane, its steps.
pub(super) struct PlaneWalk<'h> {
    head: &'h PlaneHead,
    index: usize,
    start_ns: i64,
    want_steps: bool,
    /// Name what preceded each call by its XLA op name where it has one
    /// (device planes: their events are named by kernel).
    op_names: bool,
    pub(super) calls: Vec<CollectiveCall>,
    pub(super) steps: Vec<Timed<u64>>,
}

impl<'h> PlaneWalk<'h> {
    /// `want_steps`: the host plane (its steps; its events are named by
    /// op); else a device plane.
    pub(super) fn new(head: &'h PlaneHead, index: usize, start_ns: i64, want_steps: bool) -> Self {
        Self {
            head,
            index,
            start_ns,
            want_steps,
            op_names: !want_steps,
            calls: Vec::new(),
            steps: Vec::new(),
        }
    }

    pub(super) fn run<R: Src>(
        &mut self,
        r: &mut R,
        cache: &mut OpCache,
        want_calls: bool,
    ) -> Result<(), TraceError> {
        if !want_calls && !self.want_steps {
            return Ok(());
        }
        let mut scratch = Vec::new();
        // A device plane's streams: what its calls followed is looked up on
        // all of them, once every line's calls are known.
        let mut streams = Vec::new();
        for &(pos, len) in &self.head.lines {
            let first = self.calls.len();
            let (start_ns, id) = self.first_pass(r, cache, &mut scratch, (pos, len), want_calls)?;
            if self.op_names {
                if !is_derived_line(id) {
                    streams.push((pos, len, start_ns));
                }
                continue;
            }
            let line = &mut self.calls[first..];
            if !line.is_empty() {
                let names = &mut cache.1;
                let lines = [(pos, len, start_ns)];
                preceding_pass(
                    r,
                    self.head,
                    &lines,
                    line,
                    &mut scratch,
                    names,
                    self.op_names,
                )?;
            }
        }
        if !self.calls.is_empty() && !streams.is_empty() {
            preceding_pass(
                r,
                self.head,
                &streams,
                &mut self.calls,
                &mut scratch,
                &mut cache.1,
                self.op_names,
            )?;
        }
        Ok(())
    }

    /// Adds the line's calls (without what preceded them) and steps;
    /// returns where the line starts (epoch ns) and its id.
    fn first_pass<R: Src>(
        &mut self,
        r: &mut R,
        cache: &mut OpCache,
        scratch: &mut Vec<u8>,
        (pos, len): (u64, u64),
        want_calls: bool,
    ) -> Result<(i64, i64), TraceError> {
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
        Ok((start_ns, id))
    }
}

/// The first id of the lines a profiler derives from the others (xprof's
/// `kThreadIdDerivedMin`: "Steps", "XLA Modules", "XLA Ops", "Framework
/// Ops", …, which repeat the streams' kernels as ops), as written into
/// the line's int64 id from a C `int` (wrapped) or not.
const DERIVED_LINE_MIN: u32 = 0xdead_beef;

/// Whether a device plane's line is a derived one, not a stream: its
/// events are no work of their own. xprof numbers them upwards from
/// [`DERIVED_LINE_MIN`] (a few dozen; 1,024 leaves room).
pub(super) fn is_derived_line(id: i64) -> bool {
    let at = |min: i64| (min..min + 1024).contains(&id);
    at(i64::from(DERIVED_LINE_MIN)) || at(i64::from(DERIVED_LINE_MIN as i32))
}

/// One field of a line, as [`walk_line`] hands it on.
pub(super) enum Item<'a> {
    Id(u64),
    Ts(u64),
    Event(Cur<'a>),
}

/// Hands `f` each field of the line at `(pos, len)` that it cares for. Whole
/// fields are taken straight from the reader's buffer; one that crosses
/// its end (or does not parse) goes through the reader field by field,
/// which tells a truncation or damage from a buffer boundary. `f` may be
/// handed an event again after it failed on it.
pub(super) fn walk_line<R: Src>(
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
