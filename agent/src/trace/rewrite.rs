//! Pass 2: copies a protobuf file verbatim except for a sorted list of
//! varint edits found by pass 1. Schema-agnostic: it descends only into
//! length-delimited fields that contain an edit (fixing their length
//! prefixes) and copies everything else, unknown fields included, byte for
//! byte. Past the last edit of a message the rest is one block copy.

use std::io::Write;

use super::TraceError;
use super::wire::{LEN, VARINT, WireReader, put_varint};

/// Replace the varint value at `pos` (`old_len` bytes) with `bytes`, or,
/// when `old_len` is 0, insert `bytes` at `pos`, which must be the content
/// start of the message that receives the new field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edit {
    pub pos: u64,
    pub old_len: u8,
    pub bytes: Vec<u8>,
}

impl Edit {
    pub fn replace_varint(pos: u64, old_len: u8, value: u64) -> Self {
        let mut bytes = Vec::with_capacity(10);
        put_varint(&mut bytes, value);
        Self {
            pos,
            old_len,
            bytes,
        }
    }

    /// Inserts varint field `field` = `value` at a message's content start.
    pub fn insert_varint_field(content_start: u64, field: u32, value: u64) -> Self {
        let mut bytes = Vec::with_capacity(11);
        put_varint(&mut bytes, u64::from(field) << 3);
        put_varint(&mut bytes, value);
        Self {
            pos: content_start,
            old_len: 0,
            bytes,
        }
    }

    fn delta(&self) -> i64 {
        self.bytes.len() as i64 - i64::from(self.old_len)
    }

    fn is_insert(&self) -> bool {
        self.old_len == 0
    }
}

/// Edits sorted by position, with prefix sums of their size changes.
pub struct Plan {
    edits: Vec<Edit>,
    prefix: Vec<i64>,
}

impl Plan {
    pub fn new(mut edits: Vec<Edit>) -> Self {
        edits.sort_by_key(|e| e.pos);
        let mut prefix = Vec::with_capacity(edits.len() + 1);
        let mut acc = 0;
        prefix.push(0);
        for e in &edits {
            acc += e.delta();
            prefix.push(acc);
        }
        Self { edits, prefix }
    }

    pub fn is_empty(&self) -> bool {
        self.edits.is_empty()
    }

    /// Index range of the edits inside message content `[cs, ce)`; inserts
    /// at `ce` count too (they belong to an empty last child).
    fn range(&self, cs: u64, ce: u64) -> (usize, usize) {
        let lo = self.edits.partition_point(|e| e.pos < cs);
        let mut hi = self.edits.partition_point(|e| e.pos < ce);
        while hi < self.edits.len() && self.edits[hi].pos == ce && self.edits[hi].is_insert() {
            hi += 1;
        }
        (lo, hi.max(lo))
    }

    fn delta_in(&self, cs: u64, ce: u64) -> i64 {
        let (lo, hi) = self.range(cs, ce);
        self.prefix[hi] - self.prefix[lo]
    }

    fn any_in(&self, cs: u64, ce: u64) -> bool {
        let (lo, hi) = self.range(cs, ce);
        hi > lo
    }

    /// Size of the output for an input of `len` bytes.
    pub fn output_len(&self, len: u64) -> u64 {
        (len as i64 + self.prefix.last().copied().unwrap_or(0)) as u64
    }
}

/// Rewrites the whole file behind `r` into `out`. `progress` gets the number
/// of input bytes consumed, in chunks.
pub fn rewrite(
    r: &mut WireReader,
    plan: &Plan,
    out: &mut impl Write,
    progress: &mut dyn FnMut(u64),
) -> Result<(), TraceError> {
    r.seek_to(0)?;
    let len = r.file_len();
    let mut w = Rewriter {
        r,
        plan,
        progress,
        reported: 0,
    };
    w.message(out, 0, len)?;
    let left = w.r.pos() - w.reported;
    (w.progress)(left);
    Ok(())
}

struct Rewriter<'a> {
    r: &'a mut WireReader,
    plan: &'a Plan,
    progress: &'a mut dyn FnMut(u64),
    reported: u64,
}

/// Report progress about every 4 MiB.
const PROGRESS_STEP: u64 = 4 << 20;

impl Rewriter<'_> {
    fn copy(&mut self, n: u64, out: &mut impl Write) -> Result<(), TraceError> {
        self.r.copy_to(n, out)?;
        let done = self.r.pos() - self.reported;
        if done >= PROGRESS_STEP {
            (self.progress)(done);
            self.reported = self.r.pos();
        }
        Ok(())
    }

    /// Copies bytes `[from, r.pos())` again from the input (they were just
    /// parsed; the seek stays inside the buffer).
    fn recopy(&mut self, from: u64, out: &mut impl Write) -> Result<(), TraceError> {
        let n = self.r.pos() - from;
        self.r.seek_to(from)?;
        self.copy(n, out)
    }

    fn message(&mut self, out: &mut impl Write, cs: u64, ce: u64) -> Result<(), TraceError> {
        let (lo, _) = self.plan.range(cs, ce);
        for e in self.plan.edits[lo..]
            .iter()
            .take_while(|e| e.pos == cs && e.is_insert())
        {
            out.write_all(&e.bytes).map_err(TraceError::io)?;
        }
        while self.r.pos() < ce {
            let pos = self.r.pos();
            // Inserts at `cs` are done; anything else still pending?
            let pending = self.plan.any_in(pos, ce) && !(pos == cs && self.only_inserts_at(cs, ce));
            if !pending {
                return self.copy(ce - pos, out);
            }
            let (_, wire) = self.r.read_key()?;
            self.recopy(pos, out)?;
            match wire {
                VARINT => self.varint(out)?,
                LEN => self.length_delimited(out, ce)?,
                _ => {
                    let from = self.r.pos();
                    self.r.skip_value(wire, ce)?;
                    self.recopy(from, out)?;
                }
            }
        }
        if self.r.pos() != ce {
            return Err(TraceError::malformed(
                self.r.pos(),
                "field runs past the end of its message",
            ));
        }
        Ok(())
    }

    fn only_inserts_at(&self, cs: u64, ce: u64) -> bool {
        let (lo, hi) = self.plan.range(cs, ce);
        self.plan.edits[lo..hi]
            .iter()
            .all(|e| e.pos == cs && e.is_insert())
    }

    fn varint(&mut self, out: &mut impl Write) -> Result<(), TraceError> {
        let from = self.r.pos();
        let (lo, _) = self.plan.range(from, from + 1);
        match self.plan.edits.get(lo) {
            Some(e) if e.pos == from && !e.is_insert() => {
                self.r.read_varint()?;
                if self.r.pos() - from != u64::from(e.old_len) {
                    return Err(TraceError::malformed(from, "file changed between passes"));
                }
                out.write_all(&e.bytes).map_err(TraceError::io)
            }
            _ => {
                self.r.read_varint()?;
                self.recopy(from, out)
            }
        }
    }

    fn length_delimited(&mut self, out: &mut impl Write, ce: u64) -> Result<(), TraceError> {
        let len_at = self.r.pos();
        let n = self.r.read_len(ce)?;
        let (cs2, ce2) = (self.r.pos(), self.r.pos() + n);
        if !self.plan.any_in(cs2, ce2) {
            self.r.seek_to(len_at)?;
            return self.copy(ce2 - len_at, out);
        }
        let new_len = n as i64 + self.plan.delta_in(cs2, ce2);
        let mut prefix = Vec::with_capacity(10);
        put_varint(&mut prefix, new_len as u64);
        out.write_all(&prefix).map_err(TraceError::io)?;
        self.message(out, cs2, ce2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::scan::scan_file;
    use clockmesh_proto::prost::Message;
    use clockmesh_proto::xplane::{XLine, XPlane, XSpace};

    fn rewrite_bytes(input: &[u8], edits: Vec<Edit>) -> Vec<u8> {
        let dir =
            std::env::temp_dir().join(format!("cm-rw-{}-{}", std::process::id(), input.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("in.pb");
        std::fs::write(&p, input).unwrap();
        let mut r = WireReader::new(std::fs::File::open(&p).unwrap()).unwrap();
        let plan = Plan::new(edits);
        let mut out = Vec::new();
        let mut seen = 0;
        rewrite(&mut r, &plan, &mut out, &mut |n| seen += n).unwrap();
        assert_eq!(seen, input.len() as u64, "progress covers the input");
        assert_eq!(plan.output_len(input.len() as u64), out.len() as u64);
        std::fs::remove_dir_all(&dir).unwrap();
        out
    }

    #[test]
    fn insert_into_an_empty_last_line_of_the_last_plane() {
        let space = XSpace {
            planes: vec![XPlane {
                name: "p".into(),
                lines: vec![XLine::default()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let input = space.encode_to_vec();
        let dir = std::env::temp_dir().join(format!("cm-rw-scan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("x.pb"), &input).unwrap();
        let scan = scan_file(&dir.join("x.pb")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let line = &scan.lines[0];
        assert_eq!(line.content_start, line.content_end);
        assert_eq!(
            line.content_end,
            input.len() as u64,
            "empty line ends the file"
        );
        let out = rewrite_bytes(
            &input,
            vec![Edit::insert_varint_field(line.content_start, 3, 300)],
        );
        let got = XSpace::decode(out.as_slice()).unwrap();
        assert_eq!(got.planes[0].lines[0].timestamp_ns, 300);
        assert_eq!(got.planes[0].name, "p");
    }

    #[test]
    fn no_edits_copies_verbatim_even_non_minimal_varints() {
        // Field 1 (varint) encoded non-minimally, then an unknown LEN field.
        let input = [0x08, 0x81, 0x80, 0x00, 0xfa, 0x01, 0x02, 0xaa, 0xbb];
        assert_eq!(rewrite_bytes(&input, Vec::new()), input);
    }
}
