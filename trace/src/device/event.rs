//! One XEvent's time fields: read from its bytes, and the event re-encoded with new ones.

use crate::TraceError;
use crate::fields::{self, xevent};
use crate::wire::{SliceReader, VARINT, put_varint, varint_len};

/// The time fields of one XEvent (last occurrence wins, as in protobuf).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct EventTimes {
    pub(super) offset_ps: i64,
    pub(super) duration_ps: i64,
    /// `num_occurrences` came last in the oneof: no time.
    pub(super) aggregated: bool,
    pub(super) offset_fields: u64,
    pub(super) offset_bytes: u64,
    pub(super) duration_fields: u64,
    pub(super) duration_bytes: u64,
    /// Where the (last) offset and duration values lie in the event:
    /// with one of each, the rewrite copies around them without parsing.
    pub(super) offset_at: usize,
    pub(super) duration_at: usize,
}

/// Reads an event's time fields from its bytes (`base`: their file position).
pub(super) fn event_times(bytes: &[u8], base: u64) -> Result<EventTimes, TraceError> {
    let mut r = SliceReader::new(bytes, base);
    let mut t = EventTimes::default();
    while !r.is_done() {
        let (field, wire) = r.read_key()?;
        let at = r.at();
        match (field, wire) {
            (xevent::OFFSET_PS, VARINT) => {
                t.offset_ps = r.read_varint()? as i64;
                t.aggregated = false;
                t.offset_fields += 1;
                t.offset_bytes += (r.at() - at) as u64;
                t.offset_at = at;
            }
            (xevent::DURATION_PS, VARINT) => {
                t.duration_ps = r.read_varint()? as i64;
                t.duration_fields += 1;
                t.duration_bytes += (r.at() - at) as u64;
                t.duration_at = at;
            }
            (xevent::NUM_OCCURRENCES, VARINT) => {
                r.read_varint()?;
                t.aggregated = true;
            }
            (xevent::OFFSET_PS | xevent::DURATION_PS | xevent::NUM_OCCURRENCES, _) => {
                return Err(TraceError::malformed(
                    base + at as u64,
                    "XEvent time field is not a varint",
                ));
            }
            _ => r.skip_value(wire)?,
        }
    }
    Ok(t)
}

/// Whether a time field absent from the event must be added.
fn inserted(fields: u64, value: i64) -> bool {
    fields == 0 && value != 0
}

/// The encoded length of an event of `n` bytes once its times are
/// `offset` and `duration`.
pub(super) fn new_event_len(n: u64, t: &EventTimes, offset: i64, duration: i64) -> u64 {
    let field_len = |v: i64| varint_len(v as u64);
    n - t.offset_bytes - t.duration_bytes
        + t.offset_fields * field_len(offset)
        + t.duration_fields * field_len(duration)
        + u64::from(inserted(t.offset_fields, offset)) * (1 + field_len(offset))
        + u64::from(inserted(t.duration_fields, duration)) * (1 + field_len(duration))
}

/// Appends the event, length prefix included, with its times replaced;
/// every other field is copied byte for byte.
pub(super) fn encode_event(
    bytes: &[u8],
    base: u64,
    t: &EventTimes,
    (offset, duration): (i64, i64),
    out: &mut Vec<u8>,
) -> Result<(), TraceError> {
    put_varint(out, new_event_len(bytes.len() as u64, t, offset, duration));
    if inserted(t.offset_fields, offset) {
        out.push(fields::key(xevent::OFFSET_PS, VARINT));
        put_varint(out, offset as u64);
    }
    if inserted(t.duration_fields, duration) {
        out.push(fields::key(xevent::DURATION_PS, VARINT));
        put_varint(out, duration as u64);
    }
    if t.offset_fields <= 1 && t.duration_fields <= 1 {
        splice_times(bytes, t, offset, duration, out);
        return Ok(());
    }
    let mut r = SliceReader::new(bytes, base);
    while !r.is_done() {
        let from = r.at();
        let (field, wire) = r.read_key()?;
        let new = match (field, wire) {
            (xevent::OFFSET_PS, VARINT) => Some(offset),
            (xevent::DURATION_PS, VARINT) => Some(duration),
            _ => None,
        };
        match new {
            Some(v) => {
                out.extend_from_slice(&bytes[from..r.at()]);
                r.read_varint()?;
                put_varint(out, v as u64);
            }
            None => {
                r.skip_value(wire)?;
                out.extend_from_slice(&bytes[from..r.at()]);
            }
        }
    }
    Ok(())
}

/// [`encode_event`]'s body for an event with at most one offset and one
/// duration field (XLA writes one of each): the bytes around them copied,
/// the values replaced, no second parse.
fn splice_times(bytes: &[u8], t: &EventTimes, offset: i64, duration: i64, out: &mut Vec<u8>) {
    let mut values = [
        (t.offset_fields, t.offset_at, t.offset_bytes, offset),
        (t.duration_fields, t.duration_at, t.duration_bytes, duration),
    ];
    values.sort_by_key(|v| v.1);
    let mut copied = 0;
    for (fields, at, len, value) in values {
        if fields == 1 {
            out.extend_from_slice(&bytes[copied..at]);
            put_varint(out, value as u64);
            copied = at + len as usize;
        }
    }
    out.extend_from_slice(&bytes[copied..]);
}
