//! Pass 2: copies a protobuf file verbatim except for a sorted list of
//! varint edits found by pass 1. Schema-agnostic: it descends only into
//! length-delimited fields that contain an edit (fixing their length
//! prefixes) and copies everything else, unknown fields included, byte for
//! byte. Past the last edit of a message the rest is one block copy.
//!
//! Besides varint edits, a plan may hold [`Region`]s: whole messages (the
//! XLines of device-mapped planes) whose content a [`RegionWriter`]
//! produces, with a size change known in advance so that the enclosing
//! length prefixes can be written first.
//!
//! A message's new length also counts its nested messages' length prefixes
//! growing or shrinking (a line of 127 bytes that grows needs a 2-byte
//! prefix). The plan learns where nested messages are from [`Frame`]s
//! (the scan's planes and lines) and sizes them innermost first.

use std::io::Write;

use super::TraceError;
use super::wire::{LEN, VARINT, WireReader, put_varint, varint_len};

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

/// The content `[start, start + len)` of a length-delimited field that a
/// [`RegionWriter`] rewrites whole, into `len + delta` bytes. `id` is the
/// writer's own handle. No [`Edit`] may lie inside a region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub len: u64,
    pub delta: i64,
    pub id: usize,
}

/// Produces the new content of [`Region`]s.
pub trait RegionWriter {
    /// Writes the new content of `region`; `r` is at `region.start` and
    /// must be left at its end.
    fn write_region(
        &mut self,
        r: &mut WireReader,
        region: &Region,
        out: &mut dyn Write,
    ) -> Result<(), TraceError>;
}

/// A length-delimited message the plan may descend into: its content
/// `[content_start, content_end)` and the size of its stored length prefix.
/// The rewrite writes the prefix of any frame holding an edit anew
/// (minimal), so its size may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub prefix_len: u8,
    pub content_start: u64,
    pub content_end: u64,
}

impl Frame {
    pub fn new(prefix_len: u8, content_start: u64, content_end: u64) -> Self {
        Self {
            prefix_len,
            content_start,
            content_end,
        }
    }

    fn prefix_start(&self) -> u64 {
        self.content_start - u64::from(self.prefix_len)
    }
}

/// For plans without regions.
struct NoRegions;

impl RegionWriter for NoRegions {
    fn write_region(
        &mut self,
        _: &mut WireReader,
        region: &Region,
        _: &mut dyn Write,
    ) -> Result<(), TraceError> {
        Err(TraceError::malformed(region.start, "unexpected region"))
    }
}

/// Edits sorted by position, with prefix sums of their size changes; the
/// same for regions and for the frames' length prefixes.
pub struct Plan {
    edits: Vec<Edit>,
    prefix: Vec<i64>,
    regions: Vec<Region>,
    region_prefix: Vec<i64>,
    frames: Vec<Frame>,
    frame_prefix: Vec<i64>,
}

fn prefix_sums(deltas: impl Iterator<Item = i64>) -> Vec<i64> {
    let mut acc = 0;
    std::iter::once(0)
        .chain(deltas.map(|d| {
            acc += d;
            acc
        }))
        .collect()
}

impl Plan {
    /// A plan for a file whose nested messages are `frames` (every message
    /// that can hold an edit or region, e.g. [`Scan::frames`]; with
    /// messages missing, a nested prefix that changes size corrupts the
    /// output).
    ///
    /// [`Scan::frames`]: super::scan::Scan::frames
    pub fn new(mut edits: Vec<Edit>, mut regions: Vec<Region>, mut frames: Vec<Frame>) -> Self {
        edits.sort_by_key(|e| e.pos);
        regions.sort_by_key(|g| g.start);
        frames.sort_by_key(|f| f.content_start);
        let prefix = prefix_sums(edits.iter().map(Edit::delta));
        let region_prefix = prefix_sums(regions.iter().map(|g| g.delta));
        let mut plan = Self {
            edits,
            prefix,
            regions,
            region_prefix,
            frames: Vec::new(),
            frame_prefix: vec![0],
        };
        let deltas = plan.frame_deltas(&frames);
        plan.frame_prefix = prefix_sums(deltas.into_iter());
        plan.frames = frames;
        plan
    }

    /// How much each frame's length prefix grows, innermost first: a frame
    /// holding an edit gets a minimal prefix for its new length, which
    /// counts its nested frames' growth (they start after it, so are done).
    fn frame_deltas(&self, frames: &[Frame]) -> Vec<i64> {
        let mut deltas = vec![0i64; frames.len()];
        let mut suffix = vec![0i64; frames.len() + 1];
        for i in (0..frames.len()).rev() {
            let f = frames[i];
            let (cs, ce) = (f.content_start, f.content_end);
            if self.any_in(cs, ce) {
                let hi = frames.partition_point(|g| g.prefix_start() < ce).max(i + 1);
                let inner = self.delta_in(cs, ce) + suffix[i + 1] - suffix[hi];
                let new_len = ((ce - cs) as i64 + inner).max(0) as u64;
                deltas[i] = varint_len(new_len) as i64 - i64::from(f.prefix_len);
            }
            suffix[i] = deltas[i] + suffix[i + 1];
        }
        deltas
    }

    pub fn is_empty(&self) -> bool {
        self.edits.is_empty() && self.regions.is_empty()
    }

    /// Index range of the regions starting in `[cs, ce)`.
    fn region_range(&self, cs: u64, ce: u64) -> (usize, usize) {
        let lo = self.regions.partition_point(|g| g.start < cs);
        let hi = self.regions.partition_point(|g| g.start < ce);
        (lo, hi.max(lo))
    }

    /// The region whose content is exactly `[cs, cs + len)`.
    fn region_at(&self, cs: u64, len: u64) -> Option<&Region> {
        let i = self.regions.partition_point(|g| g.start < cs);
        self.regions
            .get(i)
            .filter(|g| g.start == cs && g.len == len)
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

    /// Size change of content `[cs, ce)`: its edits, regions and nested
    /// frames' prefixes.
    fn delta_in(&self, cs: u64, ce: u64) -> i64 {
        let (lo, hi) = self.range(cs, ce);
        let (rlo, rhi) = self.region_range(cs, ce);
        let flo = self.frames.partition_point(|f| f.prefix_start() < cs);
        let fhi = self
            .frames
            .partition_point(|f| f.prefix_start() < ce)
            .max(flo);
        self.prefix[hi] - self.prefix[lo] + self.region_prefix[rhi] - self.region_prefix[rlo]
            + self.frame_prefix[fhi]
            - self.frame_prefix[flo]
    }

    fn any_in(&self, cs: u64, ce: u64) -> bool {
        let (lo, hi) = self.range(cs, ce);
        let (rlo, rhi) = self.region_range(cs, ce);
        hi > lo || rhi > rlo
    }

    /// Size of the output for an input of `len` bytes.
    pub fn output_len(&self, len: u64) -> u64 {
        let last = |v: &[i64]| v.last().copied().unwrap_or(0);
        let all = last(&self.prefix) + last(&self.region_prefix) + last(&self.frame_prefix);
        (len as i64 + all) as u64
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
    rewrite_with(r, plan, &mut NoRegions, out, progress)
}

/// [`rewrite`] for plans with regions, whose content `regions` writes.
pub fn rewrite_with(
    r: &mut WireReader,
    plan: &Plan,
    regions: &mut dyn RegionWriter,
    out: &mut impl Write,
    progress: &mut dyn FnMut(u64),
) -> Result<(), TraceError> {
    r.seek_to(0)?;
    let len = r.file_len();
    let mut w = Rewriter {
        r,
        plan,
        regions,
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
    regions: &'a mut dyn RegionWriter,
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
        let (rlo, rhi) = self.plan.region_range(cs, ce);
        rlo == rhi
            && self.plan.edits[lo..hi]
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
        match self.plan.region_at(cs2, n) {
            Some(region) => self.region(out, region, new_len as u64),
            None => self.message(out, cs2, ce2),
        }
    }

    /// Lets the region writer produce a message's content, checking that
    /// it wrote what the plan promised (the length prefix is already out).
    fn region(
        &mut self,
        out: &mut impl Write,
        region: &Region,
        new_len: u64,
    ) -> Result<(), TraceError> {
        let mut counted = Counting {
            inner: out,
            written: 0,
        };
        self.regions.write_region(self.r, region, &mut counted)?;
        if counted.written != new_len || self.r.pos() != region.start + region.len {
            return Err(TraceError::malformed(
                region.start,
                "file changed between passes",
            ));
        }
        Ok(())
    }
}

/// A writer that counts what passes through it.
pub struct Counting<W> {
    pub inner: W,
    pub written: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::scan_file;
    use clockmesh_proto::prost::Message;
    use clockmesh_proto::xplane::{XLine, XPlane, XSpace};

    fn rewrite_bytes(input: &[u8], edits: Vec<Edit>, frames: Vec<Frame>) -> Vec<u8> {
        let dir =
            std::env::temp_dir().join(format!("cm-rw-{}-{}", std::process::id(), input.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("in.pb");
        std::fs::write(&p, input).unwrap();
        let mut r = WireReader::new(std::fs::File::open(&p).unwrap()).unwrap();
        let plan = Plan::new(edits, Vec::new(), frames);
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
            scan.frames(),
        );
        let got = XSpace::decode(out.as_slice()).unwrap();
        assert_eq!(got.planes[0].lines[0].timestamp_ns, 300);
        assert_eq!(got.planes[0].name, "p");
    }

    /// Replaces a region's content with `with` (it must promise its size).
    struct Fill {
        with: Vec<u8>,
    }

    impl RegionWriter for Fill {
        fn write_region(
            &mut self,
            r: &mut WireReader,
            region: &Region,
            out: &mut dyn Write,
        ) -> Result<(), TraceError> {
            r.skip(region.len)?;
            out.write_all(&self.with).map_err(TraceError::io)
        }
    }

    #[test]
    fn regions_fix_enclosing_lengths_and_a_broken_promise_is_an_error() {
        // XSpace { plane { name "p", line { id 1 } } } + trailing unknown field.
        let line = XLine {
            id: 1,
            ..Default::default()
        };
        let space = XSpace {
            planes: vec![XPlane {
                name: "p".into(),
                lines: vec![line],
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut input = space.encode_to_vec();
        input.extend_from_slice(&[0xf8, 0x06, 0x2a]);
        let dir = std::env::temp_dir().join(format!("cm-rw-region-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.pb");
        std::fs::write(&p, &input).unwrap();
        let scan = scan_file(&p).unwrap();
        let line_start = scan.lines[0].content_start;
        // The new line content: id 1 plus a 200-byte name (lengths grow to 2 bytes).
        let new_line = XLine {
            id: 1,
            name: "n".repeat(200),
            ..Default::default()
        }
        .encode_to_vec();
        let run = |promised: i64| {
            let region = Region {
                start: line_start,
                len: 2,
                delta: promised,
                id: 0,
            };
            let plan = Plan::new(Vec::new(), vec![region], scan.frames());
            let mut r = WireReader::new(std::fs::File::open(&p).unwrap()).unwrap();
            let mut fill = Fill {
                with: new_line.clone(),
            };
            let mut out = Vec::new();
            rewrite_with(&mut r, &plan, &mut fill, &mut out, &mut |_| {}).map(|()| out)
        };
        let out = run(new_line.len() as i64 - 2).unwrap();
        assert!(out.ends_with(&[0xf8, 0x06, 0x2a]));
        let got = XSpace::decode(out.as_slice()).unwrap();
        assert_eq!(got.planes[0].lines[0].name.len(), 200);
        assert_eq!(got.planes[0].name, "p");
        assert!(run(5).is_err(), "a writer that breaks its promise");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_edits_copies_verbatim_even_non_minimal_varints() {
        // Field 1 (varint) encoded non-minimally, then an unknown LEN field.
        let input = [0x08, 0x81, 0x80, 0x00, 0xfa, 0x01, 0x02, 0xaa, 0xbb];
        assert_eq!(rewrite_bytes(&input, Vec::new(), Vec::new()), input);
    }
}
