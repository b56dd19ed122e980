//! Byte offsets of kernel struct members from BTF.
//!
//! Rust eBPF programs cannot carry CO-RE relocations, so the tracing programs
//! read `sk_buff` and `net_device` fields at offsets the loader looks up here
//! in the running kernel's BTF (`/sys/kernel/btf/vmlinux`) and passes in as
//! globals. Only the parts of the format needed for that are decoded: type
//! records are walked to find a named struct, and members are searched through
//! anonymous unions/structs (e.g. `sk_buff.dev` lives inside one).
//!
//! Format: `Documentation/bpf/btf.rst` (header, type section, string section).

use thiserror::Error;

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("BTF blob is truncated or its header is invalid")]
    BadHeader,
    #[error("BTF type record at byte {0} is truncated")]
    Truncated(usize),
    #[error("BTF type kind {kind} at byte {at} is unknown")]
    UnknownKind { kind: u32, at: usize },
    #[error("struct {0} not found in BTF")]
    NoStruct(String),
    #[error("member {member} not found in struct {strukt}")]
    NoMember { strukt: String, member: String },
    #[error("member {0} is a bitfield; its byte offset is not usable")]
    Bitfield(String),
}

/// A parsed BTF blob: enough to answer "where is `S.m`?".
pub struct Btf<'a> {
    strings: &'a [u8],
    /// `types[id - 1]` is the byte range of type `id`'s record.
    types: Vec<TypeRecord>,
    type_section: &'a [u8],
}

#[derive(Clone, Copy)]
struct TypeRecord {
    start: usize,
    name_off: u32,
    info: u32,
}

impl TypeRecord {
    fn kind(&self) -> u32 {
        (self.info >> 24) & 0x1f
    }
    fn vlen(&self) -> usize {
        (self.info & 0xffff) as usize
    }
    fn kind_flag(&self) -> bool {
        self.info >> 31 == 1
    }
    fn is_aggregate(&self) -> bool {
        matches!(self.kind(), KIND_STRUCT | KIND_UNION)
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Bytes that follow the 12-byte common header of a type record, by kind.
fn trailer_len(kind: u32, vlen: usize, at: usize) -> Result<usize, BtfError> {
    Ok(match kind {
        1 | 14 | 17 => 4,          // INT, VAR, DECL_TAG
        3 => 12,                   // ARRAY
        4 | 5 => 12 * vlen,        // STRUCT, UNION members
        6 | 13 => 8 * vlen,        // ENUM values, FUNC_PROTO params
        15 | 19 => 12 * vlen,      // DATASEC vars, ENUM64 values
        2 | 7..=12 | 16 | 18 => 0, // PTR, FWD, TYPEDEF, qualifiers, FUNC, FLOAT, TYPE_TAG
        _ => return Err(BtfError::UnknownKind { kind, at }),
    })
}

impl<'a> Btf<'a> {
    /// Parses a little-endian BTF blob (the only byte order clockmesh targets).
    pub fn parse(blob: &'a [u8]) -> Result<Self, BtfError> {
        if u16_at(blob, 0) != Some(BTF_MAGIC) {
            return Err(BtfError::BadHeader);
        }
        let field = |i: usize| u32_at(blob, 4 + 4 * i).ok_or(BtfError::BadHeader);
        let hdr_len = field(0)? as usize;
        let (type_off, type_len) = (field(1)? as usize, field(2)? as usize);
        let (str_off, str_len) = (field(3)? as usize, field(4)? as usize);
        let section = |off: usize, len: usize| {
            let start = hdr_len.checked_add(off).ok_or(BtfError::BadHeader)?;
            let end = start.checked_add(len).ok_or(BtfError::BadHeader)?;
            blob.get(start..end).ok_or(BtfError::BadHeader)
        };
        let type_section = section(type_off, type_len)?;
        let strings = section(str_off, str_len)?;
        let types = index_types(type_section)?;
        Ok(Btf {
            strings,
            types,
            type_section,
        })
    }

    fn name(&self, off: u32) -> &[u8] {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    fn record(&self, id: u32) -> Option<TypeRecord> {
        self.types.get((id as usize).checked_sub(1)?).copied()
    }

    /// Byte offset of `member` in `struct strukt`, looking through anonymous
    /// unions and structs.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let record = self
            .types
            .iter()
            .find(|t| t.kind() == KIND_STRUCT && self.name(t.name_off) == strukt.as_bytes())
            .ok_or_else(|| BtfError::NoStruct(strukt.into()))?;
        match self.find_member(*record, member, 0)? {
            Some(bits) if bits % 8 == 0 => Ok(bits / 8),
            Some(_) => Err(BtfError::Bitfield(member.into())),
            None => Err(BtfError::NoMember {
                strukt: strukt.into(),
                member: member.into(),
            }),
        }
    }

    /// Bit offset of `member` within `record`, plus `base_bits`.
    fn find_member(
        &self,
        record: TypeRecord,
        member: &str,
        base_bits: u32,
    ) -> Result<Option<u32>, BtfError> {
        for i in 0..record.vlen() {
            let at = record.start + 12 + 12 * i;
            let get =
                |k: usize| u32_at(self.type_section, at + 4 * k).ok_or(BtfError::Truncated(at));
            let (name_off, type_id, raw_offset) = (get(0)?, get(1)?, get(2)?);
            // With kind_flag set, the top 8 bits hold a bitfield size.
            let bits = if record.kind_flag() {
                raw_offset & 0x00ff_ffff
            } else {
                raw_offset
            };
            if name_off != 0 {
                if self.name(name_off) == member.as_bytes() {
                    return Ok(Some(base_bits + bits));
                }
                continue;
            }
            if let Some(inner) = self.resolve_aggregate(type_id)
                && let Some(found) = self.find_member(inner, member, base_bits + bits)?
            {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Follows typedefs and qualifiers to a struct/union, if it is one.
    fn resolve_aggregate(&self, mut id: u32) -> Option<TypeRecord> {
        for _ in 0..16 {
            let rec = self.record(id)?;
            if rec.is_aggregate() {
                return Some(rec);
            }
            // TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG point at another type.
            if !matches!(rec.kind(), 8..=11 | 18) {
                return None;
            }
            id = u32_at(self.type_section, rec.start + 8)?;
        }
        None
    }
}

fn index_types(section: &[u8]) -> Result<Vec<TypeRecord>, BtfError> {
    let mut types = Vec::new();
    let mut at = 0;
    while at < section.len() {
        let name_off = u32_at(section, at).ok_or(BtfError::Truncated(at))?;
        let info = u32_at(section, at + 4).ok_or(BtfError::Truncated(at))?;
        let rec = TypeRecord {
            start: at,
            name_off,
            info,
        };
        let next = at + 12 + trailer_len(rec.kind(), rec.vlen(), at)?;
        if next > section.len() {
            return Err(BtfError::Truncated(at));
        }
        types.push(rec);
        at = next;
    }
    Ok(types)
}

/// Offsets the tracing programs need, as loader globals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOffsets {
    pub skb_head: u32,
    pub skb_data: u32,
    pub skb_network_header: u32,
    pub skb_dev: u32,
    pub netdev_ifindex: u32,
}

impl KernelOffsets {
    pub fn from_btf(btf: &Btf<'_>) -> Result<Self, BtfError> {
        Ok(KernelOffsets {
            skb_head: btf.member_offset("sk_buff", "head")?,
            skb_data: btf.member_offset("sk_buff", "data")?,
            skb_network_header: btf.member_offset("sk_buff", "network_header")?,
            skb_dev: btf.member_offset("sk_buff", "dev")?,
            netdev_ifindex: btf.member_offset("net_device", "ifindex")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a BTF blob: `struct outer { int a; union { int b; struct { int c; }; }; int d; }`
    /// with `c` at byte 12.
    fn synthetic_blob() -> Vec<u8> {
        let strings = b"\0int\0outer\0a\0b\0c\0d\0".to_vec();
        let s = |name: &str| {
            let needle = format!("\0{name}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap() as u32
                + 1
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| words.iter().for_each(|w| types.extend(w.to_le_bytes()));
        // 1: int (INT, size 4, encoding word)
        push(&[s("int"), 1 << 24, 4, 32]);
        // 2: anonymous struct { int c; } at bit 0
        push(&[0, (KIND_STRUCT << 24) | 1, 4, s("c"), 1, 0]);
        // 3: anonymous union { int b; struct {c}; }
        push(&[0, (KIND_UNION << 24) | 2, 4, s("b"), 1, 0, 0, 2, 0]);
        // 4: struct outer { int a @0; union @64; int d @128 } (kind_flag off)
        push(&[
            s("outer"),
            (KIND_STRUCT << 24) | 3,
            20,
            s("a"),
            1,
            0,
            0,
            3,
            64,
            s("d"),
            1,
            128,
        ]);
        let mut blob = Vec::new();
        blob.extend(BTF_MAGIC.to_le_bytes());
        blob.extend([1u8, 0]); // version, flags
        let hdr_len = 24u32;
        for w in [
            hdr_len,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            blob.extend(w.to_le_bytes());
        }
        blob.extend(&types);
        blob.extend(&strings);
        blob
    }

    #[test]
    fn finds_direct_and_nested_members() {
        let blob = synthetic_blob();
        let btf = Btf::parse(&blob).unwrap();
        assert_eq!(btf.member_offset("outer", "a"), Ok(0));
        assert_eq!(btf.member_offset("outer", "b"), Ok(8));
        assert_eq!(btf.member_offset("outer", "c"), Ok(8));
        assert_eq!(btf.member_offset("outer", "d"), Ok(16));
    }

    #[test]
    fn missing_names_are_errors() {
        let blob = synthetic_blob();
        let btf = Btf::parse(&blob).unwrap();
        assert!(matches!(
            btf.member_offset("nope", "a"),
            Err(BtfError::NoStruct(_))
        ));
        assert!(matches!(
            btf.member_offset("outer", "zz"),
            Err(BtfError::NoMember { .. })
        ));
    }

    #[test]
    fn truncated_or_garbage_blobs_are_errors_not_panics() {
        let blob = synthetic_blob();
        for cut in 0..blob.len() {
            let _ = Btf::parse(&blob[..cut]).map(|b| b.member_offset("outer", "c"));
        }
        assert_eq!(Btf::parse(b"garbage").err(), Some(BtfError::BadHeader));
    }

    #[test]
    fn running_kernel_offsets_are_plausible() {
        let Ok(blob) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("skipped: no /sys/kernel/btf/vmlinux");
            return;
        };
        let btf = Btf::parse(&blob).unwrap();
        let o = KernelOffsets::from_btf(&btf).unwrap();
        // `head` and `data` are adjacent pointers; `dev` sits in the first cache line.
        assert_eq!(o.skb_data, o.skb_head + 8);
        assert!(o.skb_dev < 64, "{o:?}");
        assert!(o.skb_network_header > o.skb_dev && o.skb_network_header < o.skb_head);
    }
}
