//! Protobuf wire format over a seekable file, read with a large buffer and
//! tracked absolute positions. Used by the scanner (pass 1) and the rewriter
//! (pass 2); neither ever holds more than one buffer of the trace.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};

use super::TraceError;

const BUF_LEN: usize = 1 << 20;

/// Protobuf wire types.
pub const VARINT: u8 = 0;
pub const I64: u8 = 1;
pub const LEN: u8 = 2;
pub const I32: u8 = 5;

/// A buffered reader that knows its absolute position and can skip.
pub struct WireReader {
    file: File,
    buf: Box<[u8]>,
    /// Valid bytes are `buf[head..tail]`; `buf[head]` is at file offset `pos`.
    head: usize,
    tail: usize,
    pos: u64,
    len: u64,
}

impl WireReader {
    pub fn new(file: File) -> Result<Self, TraceError> {
        let len = file.metadata().map_err(TraceError::io)?.len();
        Ok(Self {
            file,
            buf: vec![0u8; BUF_LEN].into_boxed_slice(),
            head: 0,
            tail: 0,
            pos: 0,
            len,
        })
    }

    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// Length of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.len
    }

    /// Ensures at least `want` (≤ BUF_LEN) bytes are buffered unless EOF.
    fn fill(&mut self, want: usize) -> Result<usize, TraceError> {
        if self.tail - self.head >= want {
            return Ok(self.tail - self.head);
        }
        self.buf.copy_within(self.head..self.tail, 0);
        self.tail -= self.head;
        self.head = 0;
        while self.tail < want {
            let n = self
                .file
                .read(&mut self.buf[self.tail..])
                .map_err(TraceError::io)?;
            if n == 0 {
                break;
            }
            self.tail += n;
        }
        Ok(self.tail)
    }

    #[inline]
    pub fn read_varint(&mut self) -> Result<u64, TraceError> {
        // Keys, ids and small values are one byte: the common case.
        if let Some(&b) = self.buf[self.head..self.tail].first()
            && b < 0x80
        {
            self.head += 1;
            self.pos += 1;
            return Ok(u64::from(b));
        }
        if self.tail - self.head < 10 {
            self.fill(10)?;
        }
        let avail = &self.buf[self.head..self.tail];
        let mut v = 0u64;
        for (i, b) in avail.iter().take(10).enumerate() {
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                if i == 9 && *b > 1 {
                    return Err(TraceError::malformed(self.pos, "varint overflows 64 bits"));
                }
                self.head += i + 1;
                self.pos += i as u64 + 1;
                return Ok(v);
            }
        }
        if avail.len() < 10 {
            Err(TraceError::truncated(self.pos))
        } else {
            Err(TraceError::malformed(
                self.pos,
                "varint longer than 10 bytes",
            ))
        }
    }

    /// Reads a field key; returns (field number, wire type).
    #[inline]
    pub fn read_key(&mut self) -> Result<(u32, u8), TraceError> {
        let at = self.pos;
        split_key(self.read_varint()?, at)
    }

    /// Reads a length prefix and checks the content fits in `[pos, end)`.
    #[inline]
    pub fn read_len(&mut self, end: u64) -> Result<u64, TraceError> {
        let at = self.pos;
        let n = self.read_varint()?;
        if n > end.saturating_sub(self.pos) {
            // `n` comes from the file: up to u64::MAX.
            return Err(
                if end >= self.len && self.pos.saturating_add(n) > self.len {
                    TraceError::truncated(at)
                } else {
                    TraceError::malformed(at, "length runs past the enclosing message")
                },
            );
        }
        Ok(n)
    }

    pub fn skip(&mut self, n: u64) -> Result<(), TraceError> {
        if n > self.len - self.pos {
            return Err(TraceError::truncated(self.pos));
        }
        let buffered = (self.tail - self.head) as u64;
        if n <= buffered {
            self.head += n as usize;
        } else {
            self.file
                .seek(SeekFrom::Start(self.pos + n))
                .map_err(TraceError::io)?;
            self.head = 0;
            self.tail = 0;
        }
        self.pos += n;
        Ok(())
    }

    /// Skips a run of length-delimited fields whose one-byte key is `key`
    /// (e.g. `XLine.events`), stopping at any other key or at `end`; returns
    /// how many it skipped. The hot loop of the scanner: it parses straight
    /// from the buffer instead of field by field.
    pub fn skip_run(&mut self, key: u8, end: u64) -> Result<u64, TraceError> {
        let mut count = 0;
        loop {
            if self.pos >= end {
                return Ok(count);
            }
            if self.tail - self.head < 11 {
                self.fill(11)?;
            }
            // At EOF the caller's next read reports the truncation.
            if self.head == self.tail || self.buf[self.head] != key {
                return Ok(count);
            }
            let buf = &self.buf[self.head..self.tail];
            let (mut i, mut pos) = (0usize, self.pos);
            while pos < end && i + 11 <= buf.len() && buf[i] == key {
                let Some((n, used)) = slice_varint(&buf[i + 1..]) else {
                    return Err(TraceError::malformed(
                        pos + 1,
                        "varint longer than 10 bytes",
                    ));
                };
                let total = (1 + used as u64).saturating_add(n);
                if total > end - pos {
                    return Err(if end >= self.len {
                        TraceError::truncated(pos)
                    } else {
                        TraceError::malformed(pos, "length runs past the enclosing message")
                    });
                }
                if total > (buf.len() - i) as u64 {
                    break; // crosses the buffer end: the slow path below
                }
                i += total as usize;
                pos += total;
                count += 1;
            }
            self.head += i;
            self.pos = pos;
            if i == 0 {
                // One field the fast loop cannot take (it crosses the buffer
                // end, or fewer than 11 bytes remain).
                self.read_key()?;
                let n = self.read_len(end)?;
                self.skip(n)?;
                count += 1;
            }
        }
    }

    /// Skips the value of a field of wire type `wire`, staying within `end`.
    pub fn skip_value(&mut self, wire: u8, end: u64) -> Result<(), TraceError> {
        match wire {
            VARINT => self.read_varint().map(drop),
            I64 => self.skip_checked(8, end),
            I32 => self.skip_checked(4, end),
            _ => {
                let n = self.read_len(end)?;
                self.skip(n)
            }
        }
    }

    fn skip_checked(&mut self, n: u64, end: u64) -> Result<(), TraceError> {
        if self.pos + n > end {
            return Err(TraceError::malformed(
                self.pos,
                "fixed-size value runs past its message",
            ));
        }
        self.skip(n)
    }

    /// The next `n` bytes, buffered, without consuming them ([`Self::consume`]
    /// does): one event to parse in place. `None` when `n` exceeds the
    /// buffer ([`Self::read_into`] then).
    #[inline]
    pub fn peek(&mut self, n: u64) -> Result<Option<&[u8]>, TraceError> {
        if n > self.len - self.pos {
            return Err(TraceError::truncated(self.pos));
        }
        if n > BUF_LEN as u64 {
            return Ok(None);
        }
        let n = n as usize;
        if self.tail - self.head < n {
            self.fill(n)?;
            if self.tail - self.head < n {
                return Err(TraceError::truncated(self.pos));
            }
        }
        Ok(Some(&self.buf[self.head..self.head + n]))
    }

    /// Consumes `n` bytes that [`Self::peek`] returned.
    #[inline]
    pub fn consume(&mut self, n: u64) {
        debug_assert!(n <= (self.tail - self.head) as u64);
        self.head += n as usize;
        self.pos += n;
    }

    /// Reads `n` bytes into `out` (cleared first, capacity reused): one small
    /// message (an event) to parse from a slice.
    pub fn read_into(&mut self, n: u64, out: &mut Vec<u8>) -> Result<(), TraceError> {
        if n > self.len - self.pos {
            return Err(TraceError::truncated(self.pos));
        }
        out.clear();
        let mut left = n as usize;
        while left > 0 {
            if self.head == self.tail {
                self.fill(left.min(BUF_LEN))?;
                if self.head == self.tail {
                    return Err(TraceError::truncated(self.pos));
                }
            }
            let take = left.min(self.tail - self.head);
            out.extend_from_slice(&self.buf[self.head..self.head + take]);
            self.head += take;
            self.pos += take as u64;
            left -= take;
        }
        Ok(())
    }

    /// Reads `n` bytes (small values: names, metadata).
    pub fn read_bytes(&mut self, n: u64) -> Result<Vec<u8>, TraceError> {
        if n > self.len - self.pos {
            return Err(TraceError::truncated(self.pos));
        }
        let mut out = Vec::with_capacity(n as usize);
        let mut left = n as usize;
        while left > 0 {
            if self.head == self.tail {
                self.fill(1)?;
                if self.head == self.tail {
                    return Err(TraceError::truncated(self.pos));
                }
            }
            let take = left.min(self.tail - self.head);
            out.extend_from_slice(&self.buf[self.head..self.head + take]);
            self.head += take;
            self.pos += take as u64;
            left -= take;
        }
        Ok(out)
    }

    pub fn read_fixed64(&mut self, end: u64) -> Result<u64, TraceError> {
        if self.pos + 8 > end {
            return Err(TraceError::malformed(
                self.pos,
                "fixed64 runs past its message",
            ));
        }
        let b = self.read_bytes(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// Copies `n` bytes verbatim to `out`.
    pub fn copy_to(&mut self, n: u64, out: &mut impl Write) -> Result<(), TraceError> {
        if n > self.len - self.pos {
            return Err(TraceError::truncated(self.pos));
        }
        let mut left = n;
        while left > 0 {
            if self.head == self.tail {
                self.fill(BUF_LEN)?;
                if self.head == self.tail {
                    return Err(TraceError::truncated(self.pos));
                }
            }
            let take = (left as usize).min(self.tail - self.head);
            out.write_all(&self.buf[self.head..self.head + take])
                .map_err(TraceError::io)?;
            self.head += take;
            self.pos += take as u64;
            left -= take as u64;
        }
        Ok(())
    }

    pub fn seek_to(&mut self, pos: u64) -> Result<(), TraceError> {
        if pos >= self.pos - self.head as u64 && pos <= self.pos + (self.tail - self.head) as u64 {
            // Within the buffer.
            let base = self.pos - self.head as u64;
            self.head = (pos - base) as usize;
            self.pos = pos;
            return Ok(());
        }
        self.file
            .seek(SeekFrom::Start(pos))
            .map_err(TraceError::io)?;
        self.head = 0;
        self.tail = 0;
        self.pos = pos;
        Ok(())
    }
}

/// A varint at the start of `b`: (value, bytes used); None if longer than 10.
fn slice_varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, byte) in b.iter().take(10).enumerate() {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// The protobuf wire format over bytes in memory (one event), with the
/// file position of its first byte for error messages.
pub struct SliceReader<'a> {
    bytes: &'a [u8],
    at: usize,
    base: u64,
}

impl<'a> SliceReader<'a> {
    #[inline]
    pub fn new(bytes: &'a [u8], base: u64) -> Self {
        Self { bytes, at: 0, base }
    }

    /// Offset in the slice.
    #[inline]
    pub fn at(&self) -> usize {
        self.at
    }

    #[inline]
    pub fn is_done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn pos(&self) -> u64 {
        self.base + self.at as u64
    }

    #[inline]
    pub fn read_varint(&mut self) -> Result<u64, TraceError> {
        let rest = &self.bytes[self.at..];
        if let Some(&b) = rest.first()
            && b < 0x80
        {
            self.at += 1;
            return Ok(u64::from(b));
        }
        match slice_varint(rest) {
            Some((v, n)) if n < 10 || rest[9] <= 1 => {
                self.at += n;
                Ok(v)
            }
            Some(_) => Err(TraceError::malformed(
                self.pos(),
                "varint overflows 64 bits",
            )),
            None if rest.len() < 10 => Err(TraceError::malformed(
                self.pos(),
                "field runs past the end of its message",
            )),
            None => Err(TraceError::malformed(
                self.pos(),
                "varint longer than 10 bytes",
            )),
        }
    }

    /// A field key: (field number, wire type), checked as [`WireReader::read_key`].
    #[inline]
    pub fn read_key(&mut self) -> Result<(u32, u8), TraceError> {
        // One-byte keys (fields 1-15) cannot be field 0 or out of range.
        if let Some(&b) = self.bytes.get(self.at)
            && (8..0x80).contains(&b)
            && matches!(b & 7, VARINT | I64 | LEN | I32)
        {
            self.at += 1;
            return Ok((u32::from(b >> 3), b & 7));
        }
        let at = self.pos();
        split_key(self.read_varint()?, at)
    }

    /// Skips a value of wire type `wire`, which must end inside the slice.
    #[inline]
    pub fn skip_value(&mut self, wire: u8) -> Result<(), TraceError> {
        let n = match wire {
            VARINT => return self.read_varint().map(drop),
            I64 => 8,
            I32 => 4,
            _ => self.read_varint()?,
        };
        if n > (self.bytes.len() - self.at) as u64 {
            return Err(TraceError::malformed(
                self.pos(),
                "field runs past the end of its message",
            ));
        }
        self.at += n as usize;
        Ok(())
    }
}

/// A field key read at file position `at` as (field number, wire type):
/// field 0, numbers past 2^29 and group wire types are refused.
fn split_key(key: u64, at: u64) -> Result<(u32, u8), TraceError> {
    let (field, wire) = (key >> 3, (key & 7) as u8);
    if field == 0 || field > u64::from(u32::MAX >> 3) {
        return Err(TraceError::malformed(at, "invalid field number"));
    }
    if !matches!(wire, VARINT | I64 | LEN | I32) {
        return Err(TraceError::malformed(
            at,
            "unsupported wire type (groups are not used by xplane)",
        ));
    }
    Ok((field as u32, wire))
}

/// Encoded length of a varint.
#[inline]
pub fn varint_len(v: u64) -> u64 {
    u64::from((64 - (v | 1).leading_zeros()).div_ceil(7))
}

/// Appends `v` as a varint.
#[inline]
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_len_matches_encoding() {
        for v in [0u64, 1, 127, 128, 16383, 16384, u64::MAX, (-5i64) as u64] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(varint_len(v), b.len() as u64, "{v}");
        }
    }

    /// Found by the xplane_rewrite fuzz target: a length of u64::MAX made
    /// the truncation check overflow.
    #[test]
    fn a_huge_length_is_an_error_not_an_overflow() {
        let mut bytes = Vec::new();
        put_varint(&mut bytes, u64::MAX);
        bytes.extend_from_slice(b"abc");
        let path = std::env::temp_dir().join(format!("cm-wire-len-{}", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let mut r = WireReader::new(File::open(&path).unwrap()).unwrap();
        let err = r.read_len(bytes.len() as u64).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}
