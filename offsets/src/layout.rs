//! Byte layout of the offsets file (spec: `docs/offsets-format.md`).
//!
//! Everything is little-endian and 8-byte aligned. The record is handled as
//! an array of `u64` words so the seqlock can copy it with word-sized atomic
//! loads and stores; this module converts between words and [`Record`]
//! without any `unsafe`.

/// `"CLKMOFS1"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"CLKMOFS1");
/// Layout version; readers refuse any other value (fail closed). Version 2
/// added the record checksum and the ring of recent records.
pub const VERSION: u32 = 2;
pub const HEADER_LEN: usize = 64;
/// Byte offset of the seqlock sequence word; the record payload follows it.
pub const SEQ_OFFSET: usize = 64;
/// Byte offset of the first payload word.
pub const PAYLOAD_OFFSET: usize = 72;
pub const MAX_DEVICES: usize = 16;
pub const DEVICE_ENTRY_LEN: usize = 64;
/// Byte offset of device entry 0.
pub const DEVICES_OFFSET: usize = 192;
/// End of the record (exclusive).
pub const RECORD_END: usize = DEVICES_OFFSET + MAX_DEVICES * DEVICE_ENTRY_LEN;
/// Payload words copied under the seqlock (bytes 72..1216).
pub const PAYLOAD_WORDS: usize = (RECORD_END - PAYLOAD_OFFSET) / 8;
/// Payload words that hold everything `to_global` needs (bytes 72..160).
pub const CORE_WORDS: usize = (160 - PAYLOAD_OFFSET) / 8;
/// BLAKE2b-64 of the payload bytes 72..1216 ([`crate::checksum`]).
pub const RECORD_CHECKSUM_OFFSET: usize = RECORD_END;
/// Records ever appended to the ring (0: none); the newest is record
/// number `head`, in slot `(head - 1) % RING_SLOTS`.
pub const RING_HEAD_OFFSET: usize = RECORD_END + 8;
/// The ring of recent records starts on the second page.
pub const RING_OFFSET: usize = 4096;
/// Records the ring keeps: 256 × the 1 s default window = 256 s (4.3 min)
/// of stamps that `to_global` can still map at their own time.
pub const RING_SLOTS: usize = 256;
pub const SLOT_LEN: usize = 128;
/// Slot words: 0 the record number, 1..=11 the record's core words (as
/// payload words 0..=10), 12 BLAKE2b-64 of words 0..=11, 13 the record's
/// holdover ceiling, 14 BLAKE2b-64 of words 0..=13, 15 reserved.
pub const SLOT_WORDS: usize = SLOT_LEN / 8;
pub const SLOT_CHECKSUM_WORD: usize = 1 + CORE_WORDS;
/// The record's `holdover_max_bound_ns` (payload word
/// [`HOLDOVER_MAX_BOUND_WORD`]) in its ring slot.
pub const SLOT_HOLDOVER_WORD: usize = SLOT_CHECKSUM_WORD + 1;
/// BLAKE2b-64 of slot words 0..=13 (bytes +0..+112): covers the ceiling,
/// which the first checksum (word 12) does not. 0 together with a 0
/// ceiling in a slot written before the ceiling existed (bytes +104..+128
/// were reserved, 0): such a slot has no ceiling.
pub const SLOT_EXT_CHECKSUM_WORD: usize = SLOT_HOLDOVER_WORD + 1;
/// Payload word of `holdover_max_bound_ns` (byte 184, reserved in files
/// written before it existed, so 0 there: no holdover past validity).
pub const HOLDOVER_MAX_BOUND_WORD: usize = 14;
/// Payload words a state judgment needs: the core words and, after the
/// kernel clocks, the holdover ceiling (bytes 72..192).
pub const STATE_WORDS: usize = HOLDOVER_MAX_BOUND_WORD + 1;
/// Whole file: page 0 (header, current record) and the ring.
pub const FILE_LEN: usize = RING_OFFSET + RING_SLOTS * SLOT_LEN;

/// Index of `anchor_local_ns` among the core words (a ring scan loads it
/// alone until it finds the record that covers a stamp).
pub const CORE_ANCHOR_WORD: usize = 6;

/// Byte offset of the slot that holds record number `n` (n ≥ 1).
pub fn slot_offset(n: u64) -> usize {
    RING_OFFSET + (n.wrapping_sub(1) % RING_SLOTS as u64) as usize * SLOT_LEN
}

/// A ring slot for record number `n` with the record's core words and
/// its holdover ceiling.
pub fn encode_slot(n: u64, core: &[u64], holdover_max_bound_ns: u64) -> [u64; SLOT_WORDS] {
    let mut s = [0u64; SLOT_WORDS];
    s[0] = n;
    s[1..SLOT_CHECKSUM_WORD].copy_from_slice(&core[..CORE_WORDS]);
    s[SLOT_CHECKSUM_WORD] = crate::checksum::of_words(&s[..SLOT_CHECKSUM_WORD]);
    s[SLOT_HOLDOVER_WORD] = holdover_max_bound_ns;
    s[SLOT_EXT_CHECKSUM_WORD] = crate::checksum::of_words(&s[..SLOT_EXT_CHECKSUM_WORD]);
    s
}

/// Whether slot words hold record number `n`, untorn: both checksums
/// match (a slot with neither ceiling nor second checksum predates them).
pub fn slot_is_intact(s: &[u64; SLOT_WORDS], n: u64) -> bool {
    let ext = s[SLOT_EXT_CHECKSUM_WORD];
    n != 0
        && s[0] == n
        && s[SLOT_CHECKSUM_WORD] == crate::checksum::of_words(&s[..SLOT_CHECKSUM_WORD])
        && ((ext == 0 && s[SLOT_HOLDOVER_WORD] == 0)
            || ext == crate::checksum::of_words(&s[..SLOT_EXT_CHECKSUM_WORD]))
}

/// Record status flags (payload byte 72, low half of word 0).
pub mod flags {
    /// The record holds an estimate. Without it readers report "no data".
    pub const VALID: u32 = 1 << 0;
    /// The writer says do not use the record at all (`mark_stale`).
    pub const STALE: u32 = 1 << 1;
    /// The estimate is carried forward without a fresh solve: solved while
    /// the reference was unreachable, or kept by a restarted writer.
    pub const HOLDOVER: u32 = 1 << 2;
    /// This node is the reference of the global timeline.
    pub const REFERENCE: u32 = 1 << 3;
}

/// Device-entry flags.
pub mod device_flags {
    pub const VALID: u16 = 1 << 0;
}

/// What kind of clock a device entry maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(u16)]
pub enum DeviceKind {
    #[default]
    Unknown = 0,
    Cuda = 1,
    Rocm = 2,
    /// A modelled clock (tests and demos).
    Synthetic = 3,
}

impl DeviceKind {
    /// The name readers print (the C hook and Python use the same ones).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Cuda => "cuda",
            Self::Rocm => "rocm",
            Self::Synthetic => "synthetic",
        }
    }

    pub fn from_u16(v: u16) -> Self {
        match v {
            1 => Self::Cuda,
            2 => Self::Rocm,
            3 => Self::Synthetic,
            _ => Self::Unknown,
        }
    }
}

/// Affine map from this node's CLOCK_REALTIME to the global timeline:
/// `global = local + offset_ns + drift_ps_per_s * (local - anchor_local_ns) / 1e12`,
/// with error bound `bound_ns + bound_growth_ps_per_s * |local - anchor| / 1e12`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NodeMap {
    pub anchor_local_ns: i64,
    pub offset_ns: i64,
    /// Rate of change of the offset, picoseconds per second (= ppb × 1000).
    pub drift_ps_per_s: i64,
    pub bound_ns: u64,
    /// How fast the bound widens away from the anchor (holdover), ps/s.
    pub bound_growth_ps_per_s: u64,
}

/// Offsets between the kernel clocks at one instant, so readers can map
/// CLOCK_MONOTONIC / CLOCK_BOOTTIME stamps to CLOCK_REALTIME.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KernelClocks {
    pub realtime_minus_monotonic_ns: i64,
    pub realtime_minus_boottime_ns: i64,
    /// CLOCK_REALTIME when the three clocks were sampled.
    pub sampled_at_ns: i64,
}

/// A GPU device clock mapped onto this node's CLOCK_REALTIME:
/// `host_realtime = device + offset_ns + drift_ps_per_s * (device - device_anchor_ns) / 1e12`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DeviceMap {
    pub device_id: u32,
    pub kind: DeviceKind,
    pub flags: u16,
    pub device_anchor_ns: i64,
    pub offset_ns: i64,
    pub drift_ps_per_s: i64,
    pub bound_ns: u64,
    /// Host CLOCK_REALTIME after which this entry must not be used.
    pub valid_until_ns: i64,
}

/// One published record: everything a reader gets from one seqlock read.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Record {
    pub flags: u32,
    /// Incremented by each agent start (restart detection).
    pub epoch: u64,
    /// Estimator window counter.
    pub window: u64,
    /// Node id of the reference clock of the global timeline.
    pub reference_id: u64,
    /// Writer's CLOCK_REALTIME when the record was written.
    pub updated_at_ns: i64,
    /// The end of the record's current span. Past it readers answer in
    /// holdover while the grown bound stays within `holdover_max_bound_ns`,
    /// then fail closed (stale).
    pub valid_until_ns: i64,
    pub node: NodeMap,
    /// Holdover ceiling: past `valid_until_ns` the record still answers
    /// (state holdover) while its bound grown over the record's age is at
    /// most this. 0 (or a bound that does not grow): stale right past
    /// `valid_until_ns`.
    pub holdover_max_bound_ns: u64,
    pub clocks: KernelClocks,
    /// At most [`MAX_DEVICES`] entries; more are rejected by the writer.
    pub devices: Vec<DeviceMap>,
}

/// Payload word indices (word `i` lives at byte `PAYLOAD_OFFSET + 8 * i`).
mod w {
    pub const FLAGS_COUNT: usize = 0; // byte 72: flags u32, device_count u32
    pub const EPOCH: usize = 1; // 80
    pub const WINDOW: usize = 2; // 88
    pub const REFERENCE: usize = 3; // 96
    pub const UPDATED_AT: usize = 4; // 104
    pub const VALID_UNTIL: usize = 5; // 112
    pub const ANCHOR: usize = super::CORE_ANCHOR_WORD; // 120
    pub const OFFSET: usize = 7; // 128
    pub const DRIFT: usize = 8; // 136
    pub const BOUND: usize = 9; // 144
    pub const BOUND_GROWTH: usize = 10; // 152
    pub const RT_MINUS_MONO: usize = 11; // 160
    pub const RT_MINUS_BOOT: usize = 12; // 168
    pub const CLOCKS_AT: usize = 13; // 176
    pub const HOLDOVER_MAX_BOUND: usize = super::HOLDOVER_MAX_BOUND_WORD; // 184
    pub const DEVICES: usize = 15; // 192
    pub const DEVICE_WORDS: usize = 8;
}

pub type Payload = [u64; PAYLOAD_WORDS];

/// Serializes a record into payload words. Extra devices beyond
/// [`MAX_DEVICES`] are the caller's error (checked by the writer).
pub fn encode(r: &Record) -> Payload {
    let mut p = [0u64; PAYLOAD_WORDS];
    let count = r.devices.len().min(MAX_DEVICES) as u64;
    p[w::FLAGS_COUNT] = u64::from(r.flags) | (count << 32);
    p[w::EPOCH] = r.epoch;
    p[w::WINDOW] = r.window;
    p[w::REFERENCE] = r.reference_id;
    p[w::UPDATED_AT] = r.updated_at_ns as u64;
    p[w::VALID_UNTIL] = r.valid_until_ns as u64;
    p[w::ANCHOR] = r.node.anchor_local_ns as u64;
    p[w::OFFSET] = r.node.offset_ns as u64;
    p[w::DRIFT] = r.node.drift_ps_per_s as u64;
    p[w::BOUND] = r.node.bound_ns;
    p[w::BOUND_GROWTH] = r.node.bound_growth_ps_per_s;
    p[w::RT_MINUS_MONO] = r.clocks.realtime_minus_monotonic_ns as u64;
    p[w::RT_MINUS_BOOT] = r.clocks.realtime_minus_boottime_ns as u64;
    p[w::CLOCKS_AT] = r.clocks.sampled_at_ns as u64;
    p[w::HOLDOVER_MAX_BOUND] = r.holdover_max_bound_ns;
    for (i, d) in r.devices.iter().take(MAX_DEVICES).enumerate() {
        let b = w::DEVICES + i * w::DEVICE_WORDS;
        p[b] =
            u64::from(d.device_id) | (u64::from(d.kind as u16) << 32) | (u64::from(d.flags) << 48);
        p[b + 1] = d.device_anchor_ns as u64;
        p[b + 2] = d.offset_ns as u64;
        p[b + 3] = d.drift_ps_per_s as u64;
        p[b + 4] = d.bound_ns;
        p[b + 5] = d.valid_until_ns as u64;
    }
    p
}

/// Parses payload words. The device count is clamped to [`MAX_DEVICES`] so a
/// corrupt count cannot index out of the record.
pub fn decode(p: &Payload) -> Record {
    let count = ((p[w::FLAGS_COUNT] >> 32) as usize).min(MAX_DEVICES);
    let devices = (0..count)
        .map(|i| {
            let b = w::DEVICES + i * w::DEVICE_WORDS;
            DeviceMap {
                device_id: p[b] as u32,
                kind: DeviceKind::from_u16((p[b] >> 32) as u16),
                flags: (p[b] >> 48) as u16,
                device_anchor_ns: p[b + 1] as i64,
                offset_ns: p[b + 2] as i64,
                drift_ps_per_s: p[b + 3] as i64,
                bound_ns: p[b + 4],
                valid_until_ns: p[b + 5] as i64,
            }
        })
        .collect();
    Record {
        flags: p[w::FLAGS_COUNT] as u32,
        epoch: p[w::EPOCH],
        window: p[w::WINDOW],
        reference_id: p[w::REFERENCE],
        updated_at_ns: p[w::UPDATED_AT] as i64,
        valid_until_ns: p[w::VALID_UNTIL] as i64,
        node: decode_node(p),
        holdover_max_bound_ns: p[w::HOLDOVER_MAX_BOUND],
        clocks: KernelClocks {
            realtime_minus_monotonic_ns: p[w::RT_MINUS_MONO] as i64,
            realtime_minus_boottime_ns: p[w::RT_MINUS_BOOT] as i64,
            sampled_at_ns: p[w::CLOCKS_AT] as i64,
        },
        devices,
    }
}

/// The node map alone (the first [`CORE_WORDS`] payload words suffice).
pub fn decode_node(p: &[u64]) -> NodeMap {
    NodeMap {
        anchor_local_ns: p[w::ANCHOR] as i64,
        offset_ns: p[w::OFFSET] as i64,
        drift_ps_per_s: p[w::DRIFT] as i64,
        bound_ns: p[w::BOUND],
        bound_growth_ps_per_s: p[w::BOUND_GROWTH],
    }
}

/// The estimator window from the core words.
pub fn decode_window(p: &[u64]) -> u64 {
    p[w::WINDOW]
}

/// The agent restart counter from the core words.
pub fn decode_epoch(p: &[u64]) -> u64 {
    p[w::EPOCH]
}

/// Flags and validity limit from the core words.
pub fn decode_status(p: &[u64]) -> (u32, i64) {
    (p[w::FLAGS_COUNT] as u32, p[w::VALID_UNTIL] as i64)
}

/// The 64-byte header as words (magic, version/lengths, creation time).
pub fn header_words(created_ns: i64) -> [u64; HEADER_LEN / 8] {
    let mut h = [0u64; HEADER_LEN / 8];
    h[0] = MAGIC;
    h[1] = u64::from(VERSION) | ((HEADER_LEN as u64) << 32);
    h[2] = FILE_LEN as u64 | ((MAX_DEVICES as u64) << 32);
    h[3] = DEVICE_ENTRY_LEN as u64 | ((SEQ_OFFSET as u64) << 32);
    h[4] = created_ns as u64;
    h[5] = RING_OFFSET as u64 | ((RING_SLOTS as u64) << 32);
    h[6] = SLOT_LEN as u64;
    h
}

/// Header problems a reader must refuse: magic, then version (a v1 file
/// is `BadVersion`), then the geometry this reader was built for.
pub fn check_header(h: &[u64; HEADER_LEN / 8]) -> Result<(), super::PublishError> {
    if h[0] != MAGIC {
        return Err(super::PublishError::BadFormat("wrong magic"));
    }
    let version = h[1] as u32;
    if version != VERSION {
        return Err(super::PublishError::BadVersion {
            found: version,
            expected: VERSION,
        });
    }
    let expected = header_words(0);
    if h[1..4] != expected[1..4] || h[5..7] != expected[5..7] {
        return Err(super::PublishError::BadFormat("unexpected file geometry"));
    }
    Ok(())
}

use crate::{GlobalNs, LocalNs};

impl NodeMap {
    /// Maps a local CLOCK_REALTIME stamp to the global timeline and its bound.
    /// 128-bit arithmetic: drift × age cannot overflow.
    pub fn to_global(&self, local: LocalNs) -> (GlobalNs, u64) {
        let local_ns = local.0;
        let age = i128::from(local_ns) - i128::from(self.anchor_local_ns);
        let drift = drift_ns(self.drift_ps_per_s, age);
        let global = i128::from(local_ns) + i128::from(self.offset_ns) + drift;
        // Round up: a bound must never be understated.
        let growth = growth_ns(self.bound_growth_ps_per_s, age.abs());
        let bound = i128::from(self.bound_ns).saturating_add(growth);
        (GlobalNs(saturate_i64(global)), saturate_u64(bound))
    }
}

impl DeviceMap {
    /// Maps a device clock reading to this node's CLOCK_REALTIME (compose
    /// with [`NodeMap::to_global`] for the global timeline). Validity is
    /// the caller's check (`valid_until_ns`, flags).
    pub fn to_host(&self, device_ns: i64) -> LocalNs {
        let age = i128::from(device_ns) - i128::from(self.device_anchor_ns);
        LocalNs(saturate_i64(
            i128::from(device_ns) + i128::from(self.offset_ns) + drift_ns(self.drift_ps_per_s, age),
        ))
    }
}

/// rate (ps/s) × age (ns) / 1e12, truncated toward zero. In 64 bits when
/// the product fits (a constant divisor is then a multiply; the 128-bit
/// division is a library call), else 128 bits: the same result. The C and
/// Python readers compute it the same way.
fn drift_ns(rate_ps_per_s: i64, age: i128) -> i128 {
    match i64::try_from(age)
        .ok()
        .and_then(|a| rate_ps_per_s.checked_mul(a))
    {
        Some(product) => i128::from(product / 1_000_000_000_000),
        None => i128::from(rate_ps_per_s).saturating_mul(age) / 1_000_000_000_000,
    }
}

/// growth (ps/s) × |age| (ns) / 1e12, rounded up; 64 bits when it fits.
fn growth_ns(growth_ps_per_s: u64, abs_age: i128) -> i128 {
    let fast = u64::try_from(abs_age)
        .ok()
        .and_then(|a| growth_ps_per_s.checked_mul(a))
        .and_then(|p| p.checked_add(999_999_999_999));
    match fast {
        Some(sum) => i128::from(sum / 1_000_000_000_000),
        None => {
            i128::from(growth_ps_per_s)
                .saturating_mul(abs_age)
                .saturating_add(999_999_999_999)
                / 1_000_000_000_000
        }
    }
}

fn saturate_i64(v: i128) -> i64 {
    v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

fn saturate_u64(v: i128) -> u64 {
    v.clamp(0, i128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_64_bit_paths_give_the_128_bit_results() {
        let slow_drift = |r: i64, a: i128| i128::from(r).saturating_mul(a) / 1_000_000_000_000;
        let slow_growth = |g: u64, a: i128| {
            i128::from(g)
                .saturating_mul(a)
                .saturating_add(999_999_999_999)
                / 1_000_000_000_000
        };
        let rates = [0, 1, -1, 999, -1_500_000, 50_000_000, i64::MAX, i64::MIN];
        let ages = [
            0i128,
            1,
            -1,
            999_999_999_999,
            1_000_000_000_000,
            -4_000_000_000,
            i128::from(i64::MAX),
            i128::from(i64::MIN),
            i128::from(i64::MAX) * 3,
        ];
        for r in rates {
            for a in ages {
                assert_eq!(drift_ns(r, a), slow_drift(r, a), "{r} × {a}");
                let g = r.unsigned_abs();
                assert_eq!(growth_ns(g, a.abs()), slow_growth(g, a.abs()), "{g} × {a}");
            }
        }
    }

    use super::*;

    fn sample() -> Record {
        Record {
            flags: flags::VALID | flags::HOLDOVER,
            epoch: 3,
            window: 99,
            reference_id: 7,
            updated_at_ns: 1_700_000_000_000_000_000,
            valid_until_ns: 1_700_000_010_000_000_000,
            node: NodeMap {
                anchor_local_ns: 1_700_000_000_000_000_000,
                offset_ns: -12_345,
                drift_ps_per_s: 2_500,
                bound_ns: 80,
                bound_growth_ps_per_s: 1_000,
            },
            holdover_max_bound_ns: 5_000,
            clocks: KernelClocks {
                realtime_minus_monotonic_ns: 1_699_999_000_000_000_000,
                realtime_minus_boottime_ns: 1_699_998_000_000_000_000,
                sampled_at_ns: 1_700_000_000_000_000_001,
            },
            devices: vec![DeviceMap {
                device_id: 3,
                kind: DeviceKind::Rocm,
                flags: device_flags::VALID,
                device_anchor_ns: 55,
                offset_ns: -9,
                drift_ps_per_s: -4,
                bound_ns: 12,
                valid_until_ns: 77,
            }],
        }
    }

    #[test]
    fn layout_constants_match_the_spec() {
        assert_eq!(RECORD_END, 1216);
        assert_eq!(PAYLOAD_WORDS, 143);
        assert_eq!(CORE_WORDS, 11);
        assert_eq!(RING_HEAD_OFFSET, 1224);
        assert_eq!(FILE_LEN, 36_864);
        assert_eq!(SLOT_CHECKSUM_WORD, 12);
        assert_eq!(SLOT_HOLDOVER_WORD, 13);
        assert_eq!(SLOT_EXT_CHECKSUM_WORD, 14);
        assert_eq!(PAYLOAD_OFFSET + 8 * HOLDOVER_MAX_BOUND_WORD, 184);
        assert_eq!(STATE_WORDS, 15);
        assert_eq!(slot_offset(1), 4096);
        assert_eq!(slot_offset(256), 4096 + 255 * 128);
        assert_eq!(slot_offset(257), 4096);
        assert_eq!(&MAGIC.to_le_bytes(), b"CLKMOFS1");
    }

    #[test]
    fn a_slot_is_intact_only_with_the_ceiling_it_was_written_with() {
        let core = encode(&sample());
        let s = encode_slot(5, &core, 10_000);
        assert!(slot_is_intact(&s, 5));
        assert!(!slot_is_intact(&s, 6), "another number");
        let mut ceiling = s;
        ceiling[SLOT_HOLDOVER_WORD] = 20_000;
        assert!(!slot_is_intact(&ceiling, 5), "a ceiling of another record");
        let mut no_ext = s;
        no_ext[SLOT_EXT_CHECKSUM_WORD] = 0;
        assert!(
            !slot_is_intact(&no_ext, 5),
            "a ceiling without its checksum"
        );
        // Written before the ceiling existed: words 13 and 14 reserved, 0.
        let mut legacy = s;
        legacy[SLOT_HOLDOVER_WORD] = 0;
        legacy[SLOT_EXT_CHECKSUM_WORD] = 0;
        assert!(slot_is_intact(&legacy, 5));
        let none = encode_slot(5, &core, 0);
        assert!(slot_is_intact(&none, 5));
        assert_ne!(none[SLOT_EXT_CHECKSUM_WORD], 0, "always written");
    }

    #[test]
    fn encode_decode_round_trip() {
        let r = sample();
        assert_eq!(decode(&encode(&r)), r);
    }

    #[test]
    fn corrupt_device_count_is_clamped() {
        let mut p = encode(&sample());
        p[0] |= 0xffff_0000_0000_0000;
        assert_eq!(decode(&p).devices.len(), MAX_DEVICES);
    }

    #[test]
    fn to_global_applies_offset_drift_and_bound_growth() {
        let n = sample().node;
        // 10 s after the anchor: drift 2.5 ns/s -> +25 ns; bound +10 ns.
        let (g, b) = n.to_global(LocalNs(n.anchor_local_ns + 10_000_000_000));
        assert_eq!(
            g,
            GlobalNs(n.anchor_local_ns + 10_000_000_000 - 12_345 + 25)
        );
        assert_eq!(b, 90);
        // Before the anchor the bound grows too.
        let (g, b) = n.to_global(LocalNs(n.anchor_local_ns - 10_000_000_000));
        assert_eq!(
            g,
            GlobalNs(n.anchor_local_ns - 10_000_000_000 - 12_345 - 25)
        );
        assert_eq!(b, 90);
    }

    #[test]
    fn to_global_saturates_instead_of_overflowing() {
        let n = NodeMap {
            anchor_local_ns: i64::MIN,
            offset_ns: i64::MAX,
            drift_ps_per_s: i64::MAX,
            bound_ns: u64::MAX,
            bound_growth_ps_per_s: u64::MAX,
        };
        assert_eq!(
            n.to_global(LocalNs(i64::MAX)),
            (GlobalNs(i64::MAX), u64::MAX)
        );
    }
}
