//! Reading the JSON in chunks: the top level object by hand, each event
//! by the quick reader or else serde.

use std::borrow::Cow;
use std::fmt;
use std::io::Read;

use serde::Deserialize;
use serde::de::{self, IgnoredAny};

use super::event::Event;
use super::quick::quick_event;
use super::{ClockmeshInfo, DistributedInfo, not_kineto};
use crate::TraceError;

/// A window onto the file: `buf[pos..end]` is read and not yet parsed.
pub(super) struct Source<R> {
    reader: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    eof: bool,
    /// The file offset of `buf[0]`.
    base: u64,
}

impl<R: Read> Source<R> {
    pub(super) fn new(reader: R, chunk: usize) -> Self {
        Self {
            reader,
            buf: vec![0; chunk.max(1)],
            pos: 0,
            end: 0,
            eof: false,
            base: 0,
        }
    }

    /// Reads more after what is unparsed (moved to the front; the buffer
    /// doubles when it is all unparsed).
    fn fill(&mut self) -> Result<(), TraceError> {
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        if self.end == self.buf.len() {
            self.buf.resize(self.buf.len() * 2, 0);
        }
        while self.end < self.buf.len() {
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => self.end += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(TraceError::io(e)),
            }
        }
        Ok(())
    }

    /// The next byte that is not whitespace (not consumed); `None` at the
    /// end of the file.
    fn peek(&mut self) -> Result<Option<u8>, TraceError> {
        loop {
            while let Some(&b) = self.buf[..self.end].get(self.pos) {
                if !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                    return Ok(Some(b));
                }
                self.pos += 1;
            }
            if self.eof {
                return Ok(None);
            }
            self.fill()?;
        }
    }

    /// Consumes `want` (after whitespace), else an error saying `what`.
    fn expect(&mut self, want: u8, what: &str) -> Result<(), TraceError> {
        match self.peek()? {
            Some(b) if b == want => {
                self.pos += 1;
                Ok(())
            }
            Some(_) => Err(self.error(format_args!("expected {what}"))),
            None => Err(self.error(format_args!("the file ends where {what} should be"))),
        }
    }

    /// Parses the value that starts here with `f`, which says how many
    /// bytes it took; reads more and parses again while the value runs
    /// past what is read.
    fn value<U>(
        &mut self,
        mut f: impl FnMut(&[u8]) -> Result<(U, usize), serde_json::Error>,
    ) -> Result<U, TraceError> {
        match self.peek()? {
            Some(b'{' | b'[' | b'"') => {}
            // A number or literal ends only where something else starts.
            Some(_) => loop {
                let token = self.buf[self.pos..self.end].iter().position(
                    |b| !matches!(b, b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' | b'+' | b'-' | b'.'),
                );
                if token.is_some() || self.eof {
                    break;
                }
                self.fill()?;
            },
            None => return Err(self.error("the file ends where a value should be")),
        }
        loop {
            match f(&self.buf[self.pos..self.end]) {
                Ok((u, n)) => {
                    self.pos += n;
                    return Ok(u);
                }
                Err(e) if !self.eof && self.runs_past_the_read(&e) => self.fill()?,
                Err(e) => return Err(self.json_error(&e)),
            }
        }
    }

    /// Whether serde stopped because the value runs on past what is read:
    /// it says "EOF", or (skipping a number cut at `-`, `1.` or `1e`)
    /// "invalid number" at the last byte read.
    fn runs_past_the_read(&self, e: &serde_json::Error) -> bool {
        let read = self.end - self.pos;
        e.is_eof() || self.error_offset(e) + 1 >= read
    }

    /// Where in `buf[pos..end]` serde's error (line and column from
    /// `pos`) lies.
    fn error_offset(&self, e: &serde_json::Error) -> usize {
        let rest = &self.buf[self.pos..self.end];
        let mut at = 0;
        for _ in 1..e.line() {
            match rest[at..].iter().position(|&b| b == b'\n') {
                Some(i) => at += i + 1,
                None => break,
            }
        }
        (at + e.column().saturating_sub(1)).min(rest.len())
    }

    /// An error at the current position.
    fn error(&self, what: impl fmt::Display) -> TraceError {
        not_kineto(format_args!(
            "{what} at byte {}",
            self.base + self.pos as u64
        ))
    }

    /// serde's error in the value at the current position (its line and
    /// column count from there): placed in the file.
    fn json_error(&self, e: &serde_json::Error) -> TraceError {
        let text = e.to_string();
        let what = text.rfind(" at line ").map_or(&text[..], |i| &text[..i]);
        let at = self.error_offset(e);
        not_kineto(format_args!(
            "{what} at byte {}",
            self.base + (self.pos + at) as u64
        ))
    }
}

/// The value at the start of `bytes`, and how many bytes it took.
pub(super) fn one<'a, T: Deserialize<'a>>(
    bytes: &'a [u8],
) -> Result<(T, usize), serde_json::Error> {
    let mut values = serde_json::Deserializer::from_slice(bytes).into_iter::<T>();
    match values.next() {
        Some(Ok(v)) => Ok((v, values.byte_offset())),
        Some(Err(e)) => Err(e),
        // Only whitespace: the value is still to be read.
        None => Err(serde_json::from_slice::<IgnoredAny>(b"").unwrap_err()),
    }
}

/// What `f` makes of the event at the start of `bytes`, and how many
/// bytes it took.
#[inline(always)]
pub(super) fn event<U>(
    bytes: &[u8],
    f: impl FnOnce(Event<'_>) -> U,
) -> Result<(U, usize), serde_json::Error> {
    let (ev, n) = match quick_event(bytes) {
        Some(quick) => quick,
        None => one(bytes)?,
    };
    Ok((f(ev), n))
}

/// [`one`] of a value that borrows nothing.
fn owned<T: de::DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize), serde_json::Error> {
    one(bytes)
}

/// The top level object's fields (other than `traceEvents`).
#[derive(Default)]
pub(super) struct Top {
    pub(super) base_ns: Option<i64>,
    pub(super) distributed: Option<DistributedInfo>,
    pub(super) clockmesh: Option<ClockmeshInfo>,
    pub(super) host_name: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Events,
    Base,
    Distributed,
    Clockmesh,
    HostName,
    Other,
}

impl Field {
    fn of(key: &str) -> Self {
        match key {
            "traceEvents" => Self::Events,
            "baseTimeNanoseconds" => Self::Base,
            "distributedInfo" => Self::Distributed,
            "clockmesh" => Self::Clockmesh,
            "host_name" => Self::HostName,
            _ => Self::Other,
        }
    }

    fn key(self) -> &'static str {
        match self {
            Self::Events => "traceEvents",
            Self::Base => "baseTimeNanoseconds",
            Self::Distributed => "distributedInfo",
            Self::Clockmesh => "clockmesh",
            Self::HostName => "host_name",
            Self::Other => "",
        }
    }
}

/// Reads the top level object, each element of `traceEvents` through
/// `event` (which parses it from the bytes it starts, like [`one`]).
/// `full`: the trace's fields are read and `traceEvents` must be there,
/// an array; else (is it merged?) only `clockmesh` is.
pub(super) fn walk<R: Read>(
    src: &mut Source<R>,
    full: bool,
    mut event: impl FnMut(&[u8]) -> Result<(Result<(), TraceError>, usize), serde_json::Error>,
) -> Result<Top, TraceError> {
    let mut top = Top::default();
    let mut seen: Vec<Field> = Vec::new();
    src.expect(b'{', "a JSON object (the trace)")?;
    if src.peek()? == Some(b'}') {
        src.pos += 1;
    } else {
        loop {
            if src.peek()? != Some(b'"') {
                src.expect(b'"', "a field name")?;
            }
            let field = src.value(|b| one::<Cow<str>>(b).map(|(k, n)| (Field::of(&k), n)))?;
            src.expect(b':', "`:` after a field name")?;
            let field = match field {
                Field::Other => Field::Other,
                f if full || f == Field::Clockmesh || f == Field::Events => f,
                _ => Field::Other,
            };
            if field != Field::Other && (full || field != Field::Events) {
                if seen.contains(&field) {
                    return Err(src.error(format_args!("duplicate field `{}`", field.key())));
                }
                seen.push(field);
            }
            match field {
                Field::Events => events(src, full, &mut event)?,
                Field::Base => top.base_ns = src.value(owned)?,
                Field::Distributed => top.distributed = src.value(owned)?,
                Field::Clockmesh => top.clockmesh = src.value(owned)?,
                Field::HostName => top.host_name = src.value(owned)?,
                Field::Other => src.value(|b| one::<IgnoredAny>(b)).map(|_| ())?,
            }
            match src.peek()? {
                Some(b',') => src.pos += 1,
                Some(b'}') => {
                    src.pos += 1;
                    break;
                }
                Some(_) => return Err(src.error("expected `,` or `}` after a field")),
                None => return Err(src.error("the file ends inside the trace's object")),
            }
        }
    }
    if src.peek()?.is_some() {
        return Err(src.error("trailing characters after the trace's object"));
    }
    if full && !seen.contains(&Field::Events) {
        return Err(not_kineto("missing field `traceEvents`"));
    }
    Ok(top)
}

/// The `traceEvents` array, element by element.
fn events<R: Read>(
    src: &mut Source<R>,
    full: bool,
    event: &mut impl FnMut(&[u8]) -> Result<(Result<(), TraceError>, usize), serde_json::Error>,
) -> Result<(), TraceError> {
    if src.peek()? != Some(b'[') {
        if full {
            src.expect(b'[', "an array of events (traceEvents)")?;
        }
        return src.value(|b| one::<IgnoredAny>(b)).map(|_| ());
    }
    src.pos += 1;
    if src.peek()? == Some(b']') {
        src.pos += 1;
        return Ok(());
    }
    loop {
        src.value(&mut *event)??;
        match src.peek()? {
            Some(b',') => src.pos += 1,
            Some(b']') => {
                src.pos += 1;
                return Ok(());
            }
            Some(_) => return Err(src.error("expected `,` or `]` after an event")),
            None => return Err(src.error("the file ends inside traceEvents")),
        }
    }
}
