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
