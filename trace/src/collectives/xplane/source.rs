//! The protobuf reader the entry points share (a file or bytes in memory) and a cursor over one small message.

use crate::TraceError;
use crate::wire::{LEN, SliceReader, VARINT, WireReader};

/// How much of a line is parsed straight from the reader's buffer at once
/// (the reader's buffer size).
const CHUNK: u64 = 1 << 20;

/// The protobuf reader both entry points share: a file ([`WireReader`])
/// or bytes in memory ([`MemReader`]).
pub(super) trait Src {
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
pub(super) struct MemReader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) pos: usize,
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
pub(super) struct Cur<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) at: usize,
    base: u64,
}

impl<'a> Cur<'a> {
    pub(super) fn new(bytes: &'a [u8], base: u64) -> Self {
        Self { bytes, at: 0, base }
    }

    #[inline]
    pub(super) fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    #[inline]
    fn reader(&self) -> SliceReader<'a> {
        SliceReader::new(&self.bytes[self.at..], self.base + self.at as u64)
    }

    #[inline(always)]
    pub(super) fn key(&mut self) -> Result<(u32, u8), TraceError> {
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
    pub(super) fn varint(&mut self) -> Result<u64, TraceError> {
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
    pub(super) fn skip(&mut self, wire: u8) -> Result<(), TraceError> {
        let mut s = self.reader();
        s.skip_value(wire)?;
        self.at += s.at();
        Ok(())
    }

    /// The content of a length-delimited field.
    #[inline]
    pub(super) fn sub(&mut self) -> Result<Cur<'a>, TraceError> {
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
