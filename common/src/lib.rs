//! Types shared by clockmesh's eBPF programs and userspace.
//!
//! Everything here is `#[repr(C)]`, fixed size and free of pointers, so the
//! kernel side can write it into a ring buffer and userspace can read it back
//! byte for byte. Multi-byte fields of the probe header are little-endian on
//! the wire (see `docs/protocol.md`).
#![no_std]

/// First four payload bytes of every clockmesh UDP message: `b"CMPB"`.
pub const PROBE_MAGIC: [u8; 4] = *b"CMPB";
/// Wire version understood by this build. Bumped on incompatible changes.
pub const PROBE_VERSION: u8 = 1;
/// Largest UDP payload the eBPF programs accept on the probe ports; larger
/// datagrams are counted as malformed (a probe is small by design).
pub const MAX_PROBE_PAYLOAD: u16 = 512;

/// Message kinds carried in [`ProbeHeader::kind`].
pub mod kind {
    /// A timed probe packet (one of the two of a coded pair).
    pub const PROBE: u8 = 1;
    /// Follow-up carrying timestamps of earlier probes (not timed).
    pub const FOLLOW_UP: u8 = 2;
    /// Handshake request / reply (not timed).
    pub const HELLO: u8 = 3;
    pub const HELLO_ACK: u8 = 4;
    /// Receiver → sender: RX stamps of a pair (not seen by the eBPF programs,
    /// nor are the kinds below).
    pub const RX_REPORT: u8 = 5;
    /// An edge fit sent to the leader (backends without a shared store).
    pub const EDGE_FIT: u8 = 6;
    /// A node result sent by the leader.
    pub const RESULT: u8 = 7;
    /// A warm-up datagram (probe-sized, untimed).
    pub const WARMUP: u8 = 8;
    /// A batch of follow-ups and RX reports for one peer.
    pub const STAMP_BATCH: u8 = 9;
}

/// Fixed 32-byte header at the start of every clockmesh UDP payload.
///
/// The eBPF programs read exactly this struct (little-endian fields) and
/// nothing after it; the full message codec lives in `agent/probe`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeHeader {
    pub magic: [u8; 4],
    pub version: u8,
    pub kind: u8,
    /// 0 for the first packet of a coded pair, 1 for the second.
    pub pair_index: u8,
    pub flags: u8,
    pub sender: u32,
    pub receiver: u32,
    /// Per-edge sequence number of the pair.
    pub seq: u64,
    /// Intended spacing between the two packets of the pair, in ns.
    pub spacing_ns: u32,
    pub reserved: u32,
}

/// Size of [`ProbeHeader`] on the wire.
pub const PROBE_HEADER_LEN: usize = core::mem::size_of::<ProbeHeader>();

/// Where in the stack an event was taken. Each point stamps in its own clock
/// domain; see [`ProbeEvent`].
pub mod point {
    /// tc (TCX) egress classifier, before the qdisc.
    pub const TC_EGRESS: u8 = 1;
    /// tc (TCX) ingress classifier.
    pub const TC_INGRESS: u8 = 2;
    /// tp_btf `net_dev_start_xmit`: last software point before the driver.
    pub const TP_XMIT: u8 = 3;
    /// tp_btf `netif_receive_skb`: first point of the core receive path.
    pub const TP_RECEIVE: u8 = 4;
    /// fentry `__skb_tstamp_tx`: TX completion with the NIC hardware stamp.
    pub const TX_COMPLETION: u8 = 5;
}

/// Event direction, derived from the point.
pub const fn point_is_tx(p: u8) -> bool {
    matches!(p, point::TC_EGRESS | point::TP_XMIT | point::TX_COMPLETION)
}

/// One timestamped probe packet, as emitted to the ring buffer (64 bytes).
///
/// Clock domains: `ktime_ns` is CLOCK_MONOTONIC (`bpf_ktime_get_ns`);
/// `skb_tstamp_ns` is `__sk_buff.tstamp` (CLOCK_REALTIME on ingress once RX
/// software timestamping is enabled, 0 otherwise, see `tstamp_type`);
/// `hw_tstamp_ns` is the NIC PHC stamp (0 without hardware support).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeEvent {
    pub ktime_ns: u64,
    pub skb_tstamp_ns: u64,
    pub hw_tstamp_ns: u64,
    pub seq: u64,
    pub sender: u32,
    pub receiver: u32,
    pub ifindex: u32,
    /// One of [`point`].
    pub point: u8,
    pub pair_index: u8,
    /// `__sk_buff.tstamp_type` (0 = unspecified/RX stamp, 1 = MONO delivery time, 2 = TAI).
    pub tstamp_type: u8,
    /// Message kind from the header (see [`kind`]).
    pub kind: u8,
    pub src_port: u16,
    pub dst_port: u16,
    pub reserved: [u32; 3],
}

pub const PROBE_EVENT_LEN: usize = core::mem::size_of::<ProbeEvent>();

/// Indices of the per-CPU counter array `COUNTERS`.
pub mod counter {
    /// Events written to the ring buffer.
    pub const EMITTED: u32 = 0;
    /// Ring buffer full: event lost.
    pub const RINGBUF_FULL: u32 = 1;
    /// Packets that are not clockmesh probes (other ports or protocols).
    pub const SKIPPED: u32 = 2;
    /// Packets on a probe port that failed the header checks.
    pub const MALFORMED: u32 = 3;
    /// Kernel memory reads that failed in tracing programs.
    pub const READ_FAILED: u32 = 4;
    pub const COUNT: u32 = 5;
}

/// Names of the `.rodata` globals the loader sets before loading.
pub mod globals {
    /// Lowest UDP destination port treated as a probe port (u16).
    pub const PORT_MIN: &str = "PORT_MIN";
    /// Highest UDP destination port treated as a probe port (u16).
    pub const PORT_MAX: &str = "PORT_MAX";
    /// This node's id; tracing programs (global, not per interface) keep only
    /// TX events it sent and RX events addressed to it. 0 keeps all (u32).
    pub const LOCAL_NODE: &str = "LOCAL_NODE";
    /// Non-zero: submit events without waking the reader (`BPF_RB_NO_WAKEUP`);
    /// the reader polls on its own schedule. Each wake-up is an irq_work
    /// (a self-IPI, costly in VMs); the agent batches on a timer anyway (u32).
    pub const RB_NO_WAKEUP: &str = "RB_NO_WAKEUP";
    /// Byte offsets inside kernel structs, read from the running kernel's BTF
    /// by the loader (Rust eBPF cannot emit CO-RE relocations).
    pub const SKB_HEAD_OFF: &str = "SKB_HEAD_OFF";
    pub const SKB_DATA_OFF: &str = "SKB_DATA_OFF";
    pub const SKB_NETWORK_HEADER_OFF: &str = "SKB_NETWORK_HEADER_OFF";
    pub const SKB_DEV_OFF: &str = "SKB_DEV_OFF";
    pub const NETDEV_IFINDEX_OFF: &str = "NETDEV_IFINDEX_OFF";
}

/// Checks done by every program on the first bytes of a UDP payload.
/// Returns `true` when the header is a clockmesh message of this version.
#[inline(always)]
pub fn header_is_valid(h: &ProbeHeader) -> bool {
    h.magic[0] == PROBE_MAGIC[0]
        && h.magic[1] == PROBE_MAGIC[1]
        && h.magic[2] == PROBE_MAGIC[2]
        && h.magic[3] == PROBE_MAGIC[3]
        && h.version == PROBE_VERSION
        && h.pair_index <= 1
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: both are #[repr(C)], contain only integers and byte arrays,
    // have no padding (asserted below), so every bit pattern is valid.
    unsafe impl aya::Pod for super::ProbeEvent {}
    unsafe impl aya::Pod for super::ProbeHeader {}
}

const _: () = assert!(PROBE_EVENT_LEN == 64);
const _: () = assert!(PROBE_HEADER_LEN == 32);

/// Decodes one ring-buffer record (little-endian, as the kernel wrote it).
/// Returns `None` if `bytes` is not exactly one event.
pub fn decode_event(bytes: &[u8]) -> Option<ProbeEvent> {
    if bytes.len() != PROBE_EVENT_LEN {
        return None;
    }
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap_or([0; 4]));
    let u16_at = |i: usize| u16::from_le_bytes(bytes[i..i + 2].try_into().unwrap_or([0; 2]));
    Some(ProbeEvent {
        ktime_ns: u64_at(0),
        skb_tstamp_ns: u64_at(8),
        hw_tstamp_ns: u64_at(16),
        seq: u64_at(24),
        sender: u32_at(32),
        receiver: u32_at(36),
        ifindex: u32_at(40),
        point: bytes[44],
        pair_index: bytes[45],
        tstamp_type: bytes[46],
        kind: bytes[47],
        src_port: u16_at(48),
        dst_port: u16_at(50),
        reserved: [u32_at(52), u32_at(56), u32_at(60)],
    })
}

impl ProbeHeader {
    /// The header as sent on the wire (little-endian fields).
    pub fn to_bytes(&self) -> [u8; PROBE_HEADER_LEN] {
        let mut b = [0u8; PROBE_HEADER_LEN];
        b[0..4].copy_from_slice(&self.magic);
        b[4] = self.version;
        b[5] = self.kind;
        b[6] = self.pair_index;
        b[7] = self.flags;
        b[8..12].copy_from_slice(&self.sender.to_le_bytes());
        b[12..16].copy_from_slice(&self.receiver.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..28].copy_from_slice(&self.spacing_ns.to_le_bytes());
        b[28..32].copy_from_slice(&self.reserved.to_le_bytes());
        b
    }

    /// Parses the first [`PROBE_HEADER_LEN`] bytes; `None` if too short.
    /// Validity (magic, version) is checked separately by [`header_is_valid`].
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        let b: &[u8; PROBE_HEADER_LEN] = b.get(..PROBE_HEADER_LEN)?.try_into().ok()?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[16..24]);
        Some(ProbeHeader {
            magic: [b[0], b[1], b[2], b[3]],
            version: b[4],
            kind: b[5],
            pair_index: b[6],
            flags: b[7],
            sender: u32_at(8),
            receiver: u32_at(12),
            seq: u64::from_le_bytes(seq),
            spacing_ns: u32_at(24),
            reserved: u32_at(28),
        })
    }

    /// A timed probe header of this wire version.
    pub fn probe(sender: u32, receiver: u32, seq: u64, pair_index: u8, spacing_ns: u32) -> Self {
        ProbeHeader {
            magic: PROBE_MAGIC,
            version: PROBE_VERSION,
            kind: kind::PROBE,
            pair_index,
            flags: 0,
            sender,
            receiver,
            seq,
            spacing_ns,
            reserved: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_validates() {
        let h = ProbeHeader::probe(7, 9, 0x0102_0304_0506_0708, 1, 100_000);
        let b = h.to_bytes();
        assert_eq!(&b[0..4], b"CMPB");
        assert_eq!(ProbeHeader::from_bytes(&b), Some(h));
        assert!(header_is_valid(&h));
        assert_eq!(ProbeHeader::from_bytes(&b[..31]), None);
        let mut bad = h;
        bad.version = 2;
        assert!(!header_is_valid(&bad));
        bad = h;
        bad.pair_index = 2;
        assert!(!header_is_valid(&bad));
    }

    #[test]
    fn event_decodes_from_le_bytes() {
        let mut b = [0u8; PROBE_EVENT_LEN];
        b[0..8].copy_from_slice(&123u64.to_le_bytes());
        b[16..24].copy_from_slice(&456u64.to_le_bytes());
        b[32..36].copy_from_slice(&5u32.to_le_bytes());
        b[44] = point::TC_INGRESS;
        b[50..52].copy_from_slice(&4242u16.to_le_bytes());
        let ev = decode_event(&b).unwrap();
        assert_eq!((ev.ktime_ns, ev.hw_tstamp_ns, ev.sender), (123, 456, 5));
        assert_eq!((ev.point, ev.dst_port), (point::TC_INGRESS, 4242));
        assert_eq!(decode_event(&b[..63]), None);
    }
}
