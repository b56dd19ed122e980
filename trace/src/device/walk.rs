//! The line walks: A places every time and sizes the line, B counts a line's new length, C writes it.

use std::io::Write;

use super::event::{encode_event, event_times, new_event_len};
use super::placer::{LinePlacer, to_i64};
use super::timeline::{Tally, Timeline, Unmapped};
use crate::TraceError;
use crate::fields::{self, xline};
use crate::rewrite::{Counting, Region};
use crate::scan::LineInfo;
use crate::wire::{LEN, VARINT, WireReader, put_varint, varint_len};

/// What planning decided for one mapped line.
#[derive(Clone, Debug)]
pub(super) struct LinePlan {
    pub(super) timeline: usize,
    start: u64,
    len: u64,
    /// The stored (old) timestamp and whether a field holds it.
    old_ts_ns: i64,
    has_ts: bool,
    /// New timestamp: the earliest placed time of the line, in ns after the origin.
    new_ts_ns: i64,
    /// New `XLine.duration_ps`, when the line has one.
    new_duration_ps: Option<i64>,
}

/// Walk A's result for a line with timed events.
pub(super) struct LineSizing {
    new_ts_ns: i64,
    new_duration_ps: Option<i64>,
    /// The new content length, when walk A could count it: every event's
    /// offset was counted from the line's placed start, which turned out
    /// to be its new timestamp (no event placed before it).
    new_len: Option<u64>,
}

/// A line walk failed: bad bytes, or a time that cannot be placed.
pub(super) enum WalkError {
    Trace(TraceError),
    Unmapped(Unmapped),
}

impl From<TraceError> for WalkError {
    fn from(e: TraceError) -> Self {
        Self::Trace(e)
    }
}

impl From<Unmapped> for WalkError {
    fn from(e: Unmapped) -> Self {
        Self::Unmapped(e)
    }
}

/// Walk A: places every time of a line (fail closed), decides its new
/// timestamp and duration, and counts its new length when it can; `None`
/// when the line has no timed events.
pub(super) fn plan_line(
    r: &mut WireReader,
    line: &LineInfo,
    tl: &Timeline<'_>,
    tally: &mut Tally,
    buf: &mut Vec<u8>,
) -> Result<Option<LineSizing>, WalkError> {
    r.seek_to(line.content_start)?;
    let end = line.content_end;
    let line_ps = tl.line_start_ps(line.timestamp_ns);
    let placed_start = tl.place(tl.choose(line_ps)?, line_ps)?;
    // Events rarely start before their line: count sizes against its start.
    let guess_ts = i64::try_from(placed_start.ps.div_euclid(1000))
        .map_err(|_| Unmapped::at(line_ps, "placed time out of range"))?;
    let (mut earliest, mut timed, mut line_dur) = (i128::MAX, 0u64, None);
    let (mut dur_fields, mut dur_bytes, mut delta, mut counted) = (0u64, 0u64, 0i64, true);
    let mut line_tally = Tally::default();
    let mut placer = LinePlacer::new(tl, line_ps);
    let guess = (guess_ts, i128::from(guess_ts) * 1000);
    while r.pos() < end {
        let (field, wire) = r.read_key()?;
        match (field, wire) {
            (xline::DURATION_PS, VARINT) => {
                let at = r.pos();
                line_dur = Some(r.read_varint()? as i64);
                dur_fields += 1;
                dur_bytes += r.pos() - at;
            }
            (xline::EVENTS, LEN) => {
                let n = r.read_len(end)?;
                let t = read_event(r, n, buf, event_times)??;
                if t.aggregated {
                    continue;
                }
                let (a, (offset, duration)) = placer.event::<true>(&t, guess, &mut line_tally)?;
                earliest = earliest.min(a);
                timed += 1;
                counted &= a >= placed_start.ps;
                let new_n = new_event_len(n, &t, offset, duration);
                delta += (varint_len(new_n) + new_n) as i64 - (varint_len(n) + n) as i64;
            }
            _ => r.skip_value(wire, end)?,
        }
    }
    if timed == 0 {
        return Ok(None);
    }
    placer.finish(&mut line_tally);
    let (start, line_end) = tl.span(line_ps, line_ps + i128::from(line_dur.unwrap_or(0)))?;
    line_tally.add(start);
    let new_ts = i64::try_from(earliest.min(start.ps).div_euclid(1000))
        .map_err(|_| Unmapped::at(line_ps, "placed time out of range"))?;
    let new_dur = match line_dur {
        Some(_) => Some(to_i64(line_end.ps - i128::from(new_ts) * 1000, line_ps)?),
        None => None,
    };
    line_tally.add(line_end);
    tally.events += timed;
    tally.worst_bound_ns = tally.worst_bound_ns.max(line_tally.worst_bound_ns);
    tally.node_bound_known &= line_tally.node_bound_known;
    let new_len = (counted && new_ts == guess_ts).then(|| {
        let ts_change = if line.ts_fields.is_empty() {
            1 + varint_len(new_ts as u64) as i64
        } else {
            line.ts_fields
                .iter()
                .map(|f| varint_len(new_ts as u64) as i64 - i64::from(f.len))
                .sum()
        };
        let dur_change = new_dur.map_or(0, |d| {
            (dur_fields * varint_len(d as u64)) as i64 - dur_bytes as i64
        });
        ((end - line.content_start) as i64 + delta + ts_change + dur_change) as u64
    });
    Ok(Some(LineSizing {
        new_ts_ns: new_ts,
        new_duration_ps: new_dur,
        new_len,
    }))
}

/// Copies `[from, r.pos())` again (just parsed, still buffered).
fn recopy(r: &mut WireReader, from: u64, out: &mut Vec<u8>) -> Result<(), TraceError> {
    let n = r.pos() - from;
    r.seek_to(from)?;
    r.copy_to(n, out)
}

/// Calls `f` on the next `n` bytes (one event) and the file position of
/// the first, parsed in the reader's buffer (`buf` for one larger than it).
#[inline]
fn read_event<R>(
    r: &mut WireReader,
    n: u64,
    buf: &mut Vec<u8>,
    f: impl FnOnce(&[u8], u64) -> R,
) -> Result<R, TraceError> {
    let base = r.pos();
    if let Some(bytes) = r.peek(n)? {
        let out = f(bytes, base);
        r.consume(n);
        return Ok(out);
    }
    r.read_into(n, buf)?;
    Ok(f(buf, base))
}

/// Reusable buffers of the writing walks: an event larger than the
/// reader's buffer, and the output collected for one write.
#[derive(Default)]
pub(super) struct Scratch {
    pub(super) event: Vec<u8>,
    encoded: Vec<u8>,
}

/// Output collected before one write (a few events' worth).
const WRITE_CHUNK: usize = 64 << 10;

/// Walk C (and B, into a counter): writes the line's new content. Other
/// fields, unknown ones included, are copied byte for byte.
pub(super) fn write_line(
    r: &mut WireReader,
    plan: &LinePlan,
    tl: &Timeline<'_>,
    scratch: &mut Scratch,
    out: &mut dyn Write,
) -> Result<(), WalkError> {
    r.seek_to(plan.start)?;
    let end = plan.start + plan.len;
    let line_ps = tl.line_start_ps(plan.old_ts_ns);
    let mut placer = LinePlacer::new(tl, line_ps);
    let new_ts = (plan.new_ts_ns, i128::from(plan.new_ts_ns) * 1000);
    let mut unused = Tally::default();
    let Scratch { event, encoded } = scratch;
    let enc = encoded;
    enc.clear();
    if !plan.has_ts {
        put_varint(enc, u64::from(fields::key(xline::TIMESTAMP_NS, VARINT)));
        put_varint(enc, plan.new_ts_ns as u64);
    }
    while r.pos() < end {
        if enc.len() >= WRITE_CHUNK {
            out.write_all(enc).map_err(TraceError::io)?;
            enc.clear();
        }
        let from = r.pos();
        let (field, wire) = r.read_key()?;
        match (field, wire, plan.new_duration_ps) {
            (xline::TIMESTAMP_NS, VARINT, _) => {
                recopy(r, from, enc)?;
                r.read_varint()?;
                put_varint(enc, plan.new_ts_ns as u64);
            }
            (xline::DURATION_PS, VARINT, Some(dur)) => {
                recopy(r, from, enc)?;
                r.read_varint()?;
                put_varint(enc, dur as u64);
            }
            (xline::EVENTS, LEN, _) => {
                if r.pos() - from == 1 {
                    enc.push(fields::key(xline::EVENTS, LEN));
                } else {
                    recopy(r, from, enc)?;
                }
                let n = r.read_len(end)?;
                read_event(r, n, event, |bytes, base| {
                    write_event(bytes, base, new_ts, &mut placer, &mut unused, enc)
                })??;
            }
            _ => {
                r.skip_value(wire, end)?;
                recopy(r, from, enc)?;
            }
        }
    }
    out.write_all(enc).map_err(TraceError::io)?;
    enc.clear();
    Ok(())
}

/// Appends one event (length prefix included) with its offset and
/// duration placed relative to the new line start.
#[inline]
fn write_event(
    bytes: &[u8],
    base: u64,
    new_ts: (i64, i128),
    placer: &mut LinePlacer<'_, '_>,
    unused: &mut Tally,
    enc: &mut Vec<u8>,
) -> Result<(), WalkError> {
    let t = event_times(bytes, base)?;
    if t.aggregated {
        put_varint(enc, bytes.len() as u64);
        enc.extend_from_slice(bytes);
    } else {
        let (_, times) = placer.event::<false>(&t, new_ts, unused)?;
        encode_event(bytes, base, &t, times, enc)?;
    }
    Ok(())
}

/// The line's new length: walk A's count, or walk B, writing it into a
/// counter (a line with an event placed before its own start).
pub(super) fn size_line(
    r: &mut WireReader,
    ti: usize,
    line: &LineInfo,
    sizing: LineSizing,
    tl: &Timeline<'_>,
    scratch: &mut Scratch,
) -> Result<(LinePlan, Region), WalkError> {
    let len = line.content_end - line.content_start;
    let plan = LinePlan {
        timeline: ti,
        start: line.content_start,
        len,
        old_ts_ns: line.timestamp_ns,
        has_ts: !line.ts_fields.is_empty(),
        new_ts_ns: sizing.new_ts_ns,
        new_duration_ps: sizing.new_duration_ps,
    };
    let new_len = match sizing.new_len {
        Some(n) => n,
        None => {
            let mut counter = Counting {
                inner: std::io::sink(),
                written: 0,
            };
            write_line(r, &plan, tl, scratch, &mut counter)?;
            counter.written
        }
    };
    let region = Region {
        start: plan.start,
        len,
        delta: new_len as i64 - len as i64,
        id: 0,
    };
    Ok((plan, region))
}
