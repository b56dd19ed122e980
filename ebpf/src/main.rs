//! clockmesh kernel programs: timestamp clockmesh probe packets and nothing
//! else. Each program recognises a probe cheaply (UDP destination port in the
//! loader-set range, then magic/version of the 32-byte header), copies its
//! identity and the kernel's timestamps into a fixed-size event and emits it to
//! one ring buffer. All pairing and math happen in userspace.
//!
//! Points (see `clockmesh_common::point`):
//! - tc (TCX) egress / ingress classifiers, per interface: `bpf_ktime_get_ns`
//!   plus `__sk_buff.tstamp`, `tstamp_type` and `hwtstamp` (NIC RX stamp);
//! - tp_btf `net_dev_start_xmit` / `netif_receive_skb`, global: the software
//!   points closest to the driver, filtered to this node by `LOCAL_NODE`;
//! - fentry `__skb_tstamp_tx`: NIC TX completion stamp, where the kernel
//!   allows fentry (optional; the loader falls back to SO_TIMESTAMPING).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::TC_ACT_PIPE,
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{btf_tracepoint, classifier, fentry, map},
    maps::{PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, FEntryContext, TcContext},
};
use clockmesh_common::{
    MAX_PROBE_PAYLOAD, PROBE_HEADER_LEN, ProbeEvent, ProbeHeader, counter, header_is_valid, kind,
    point,
};

/// 4096 events of 64 bytes (+8 bytes ring header each): room for bursts
/// while userspace is descheduled.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 19, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

// Loader-set globals (`EbpfLoader::set_global`); read through `global()` so
// the compiler cannot fold the defaults.
#[unsafe(no_mangle)]
static PORT_MIN: u16 = 0;
#[unsafe(no_mangle)]
static PORT_MAX: u16 = 0;
#[unsafe(no_mangle)]
static LOCAL_NODE: u32 = 0;
#[unsafe(no_mangle)]
static RB_NO_WAKEUP: u32 = 0;
#[unsafe(no_mangle)]
static SKB_HEAD_OFF: u32 = 0;
#[unsafe(no_mangle)]
static SKB_DATA_OFF: u32 = 0;
#[unsafe(no_mangle)]
static SKB_NETWORK_HEADER_OFF: u32 = 0;
#[unsafe(no_mangle)]
static SKB_DEV_OFF: u32 = 0;
#[unsafe(no_mangle)]
static NETDEV_IFINDEX_OFF: u32 = 0;

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const IPPROTO_UDP: u8 = 17;
const IPV6_HLEN: usize = 40;
const UDP_HLEN: usize = 8;

#[inline(always)]
fn global<T: Copy>(v: &'static T) -> T {
    // SAFETY: `v` is a valid static; the volatile read keeps the loader's value.
    unsafe { core::ptr::read_volatile(v) }
}

#[inline(always)]
fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
fn is_probe_port(dst_port: u16) -> bool {
    dst_port >= global(&PORT_MIN) && dst_port <= global(&PORT_MAX)
}

/// The UDP header fields programs need, in host order.
#[derive(Clone, Copy)]
struct Udp {
    src_port: u16,
    dst_port: u16,
    payload_len: u16,
}

impl Udp {
    #[inline(always)]
    fn from_wire(raw: [u8; UDP_HLEN]) -> Self {
        let len = u16::from_be_bytes([raw[4], raw[5]]);
        Udp {
            src_port: u16::from_be_bytes([raw[0], raw[1]]),
            dst_port: u16::from_be_bytes([raw[2], raw[3]]),
            payload_len: len.saturating_sub(UDP_HLEN as u16),
        }
    }
}

/// Outcome of classifying a packet: a probe header to stamp, or the counter
/// to bump instead.
enum Verdict {
    Probe(Udp, ProbeHeader),
    Skip(u32),
}

/// Port and length checks on the UDP header: `Err(counter)` if not a probe.
#[inline(always)]
fn check_udp(udp: Udp) -> Result<(), u32> {
    if !is_probe_port(udp.dst_port) {
        return Err(counter::SKIPPED);
    }
    if udp.payload_len < PROBE_HEADER_LEN as u16 || udp.payload_len > MAX_PROBE_PAYLOAD {
        return Err(counter::MALFORMED);
    }
    Ok(())
}

/// Header checks, after the header was read (`None`: read failed).
#[inline(always)]
fn check_probe(udp: Udp, header: Option<ProbeHeader>) -> Verdict {
    let Some(h) = header else {
        return Verdict::Skip(counter::MALFORMED);
    };
    if !header_is_valid(&h) {
        return Verdict::Skip(counter::MALFORMED);
    }
    if h.kind != kind::PROBE {
        return Verdict::Skip(counter::SKIPPED); // control messages are not timed
    }
    Verdict::Probe(udp, h)
}

#[inline(always)]
fn emit(ev: ProbeEvent) {
    match EVENTS.reserve::<ProbeEvent>(0) {
        Some(mut slot) => {
            slot.write(ev);
            // BPF_RB_NO_WAKEUP = 1: the reader polls on a timer.
            slot.submit(if global(&RB_NO_WAKEUP) != 0 { 1 } else { 0 });
            count(counter::EMITTED);
        }
        None => count(counter::RINGBUF_FULL),
    }
}

#[inline(always)]
fn event(pt: u8, udp: Udp, h: &ProbeHeader, ifindex: u32) -> ProbeEvent {
    ProbeEvent {
        // SAFETY: helper without preconditions.
        ktime_ns: unsafe { bpf_ktime_get_ns() },
        seq: h.seq,
        sender: h.sender,
        receiver: h.receiver,
        ifindex,
        point: pt,
        pair_index: h.pair_index,
        kind: h.kind,
        src_port: udp.src_port,
        dst_port: udp.dst_port,
        ..ProbeEvent::default()
    }
}

// ---------------------------------------------------------------- tc (TCX)

#[classifier]
pub fn clockmesh_tc_egress(ctx: TcContext) -> i32 {
    on_tc(&ctx, point::TC_EGRESS);
    TC_ACT_PIPE
}

#[classifier]
pub fn clockmesh_tc_ingress(ctx: TcContext) -> i32 {
    on_tc(&ctx, point::TC_INGRESS);
    TC_ACT_PIPE
}

#[inline(always)]
fn on_tc(ctx: &TcContext, pt: u8) {
    match classify_tc(ctx) {
        Verdict::Probe(udp, h) => {
            let skb = ctx.skb.skb;
            // SAFETY: `skb` is the program's context; these are UAPI fields
            // the verifier rewrites (tstamp_type ≥ 5.18, hwtstamp ≥ 5.16).
            let (ifindex, tstamp, tstamp_type, hwtstamp) = unsafe {
                (
                    (*skb).ifindex,
                    (*skb).tstamp,
                    (*skb).tstamp_type,
                    (*skb).hwtstamp,
                )
            };
            let mut ev = event(pt, udp, &h, ifindex);
            ev.skb_tstamp_ns = tstamp;
            ev.tstamp_type = tstamp_type;
            ev.hw_tstamp_ns = hwtstamp;
            emit(ev);
        }
        Verdict::Skip(c) => count(c),
    }
}

#[inline(always)]
fn classify_tc(ctx: &TcContext) -> Verdict {
    let Some(udp_off) = tc_udp_offset(ctx) else {
        return Verdict::Skip(counter::SKIPPED);
    };
    let Ok(raw) = ctx.load::<[u8; UDP_HLEN]>(udp_off) else {
        return Verdict::Skip(counter::SKIPPED);
    };
    let udp = Udp::from_wire(raw);
    if let Err(c) = check_udp(udp) {
        return Verdict::Skip(c);
    }
    check_probe(udp, ctx.load::<ProbeHeader>(udp_off + UDP_HLEN).ok())
}

/// Offset of the UDP header in an Ethernet frame, or None if not UDP (or a
/// non-first IPv4 fragment).
#[inline(always)]
fn tc_udp_offset(ctx: &TcContext) -> Option<usize> {
    let ethertype = u16::from_be(ctx.load::<u16>(12).ok()?);
    match ethertype {
        ETH_P_IP => {
            let ip: [u8; 20] = ctx.load(ETH_HLEN).ok()?;
            ipv4_udp_offset(&ip).map(|o| ETH_HLEN + o)
        }
        ETH_P_IPV6 => {
            let next_header: u8 = ctx.load(ETH_HLEN + 6).ok()?;
            (next_header == IPPROTO_UDP).then_some(ETH_HLEN + IPV6_HLEN)
        }
        _ => None,
    }
}

/// UDP offset from the start of an IPv4 header; fragments are not probes.
#[inline(always)]
fn ipv4_udp_offset(ip: &[u8; 20]) -> Option<usize> {
    let ihl = (ip[0] & 0x0f) as usize * 4;
    let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff;
    (ip[0] >> 4 == 4 && ip[9] == IPPROTO_UDP && ihl >= 20 && frag == 0).then_some(ihl)
}

// ------------------------------------------------ tp_btf and fentry (global)

#[btf_tracepoint(function = "net_dev_start_xmit")]
pub fn clockmesh_tp_xmit(ctx: BtfTracePointContext) -> i32 {
    let skb: *const u8 = ctx.arg(0);
    let dev: *const u8 = ctx.arg(1);
    on_kernel_skb(skb, network_header(skb), dev, point::TP_XMIT, 0);
    0
}

#[btf_tracepoint(function = "netif_receive_skb")]
pub fn clockmesh_tp_receive(ctx: BtfTracePointContext) -> i32 {
    let skb: *const u8 = ctx.arg(0);
    // eth_type_trans() already pulled the MAC header: data is the IP header.
    let data = read_at::<*const u8>(skb, global(&SKB_DATA_OFF));
    let dev = read_at::<*const u8>(skb, global(&SKB_DEV_OFF)).unwrap_or(core::ptr::null());
    on_kernel_skb(skb, data, dev, point::TP_RECEIVE, 0);
    0
}

#[fentry(function = "__skb_tstamp_tx")]
pub fn clockmesh_tx_completion(ctx: FEntryContext) -> u32 {
    let skb: *const u8 = ctx.arg(0);
    let hwtstamps: *const u64 = ctx.arg(2);
    if hwtstamps.is_null() {
        return 0; // software TX stamp: userspace has it from the error queue
    }
    // `skb_shared_hwtstamps.hwtstamp` is the first member (ktime_t, ns).
    // SAFETY: bpf_probe_read_kernel checks the address.
    let Ok(hw) = (unsafe { bpf_probe_read_kernel(hwtstamps) }) else {
        count(counter::READ_FAILED);
        return 0;
    };
    on_kernel_skb(
        skb,
        network_header(skb),
        core::ptr::null(),
        point::TX_COMPLETION,
        hw,
    );
    0
}

/// `skb->head + skb->network_header`, with offsets from the running kernel's BTF.
#[inline(always)]
fn network_header(skb: *const u8) -> Option<*const u8> {
    let head = read_at::<*const u8>(skb, global(&SKB_HEAD_OFF))?;
    let nh = read_at::<u16>(skb, global(&SKB_NETWORK_HEADER_OFF))?;
    Some(head.wrapping_add(nh as usize))
}

#[inline(always)]
fn read_at<T>(base: *const u8, off: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel validates the address; failure is an Err.
    let r = unsafe { bpf_probe_read_kernel(base.wrapping_add(off as usize) as *const T) };
    if r.is_err() {
        count(counter::READ_FAILED);
    }
    r.ok()
}

#[inline(always)]
fn on_kernel_skb(skb: *const u8, l3: Option<*const u8>, dev: *const u8, pt: u8, hw: u64) {
    if skb.is_null() {
        return;
    }
    let Some(l3) = l3 else { return };
    match classify_kernel(l3) {
        Verdict::Probe(udp, h) if is_for_this_node(pt, &h) => {
            let ifindex = if dev.is_null() {
                0
            } else {
                read_at::<u32>(dev, global(&NETDEV_IFINDEX_OFF)).unwrap_or(0)
            };
            let mut ev = event(pt, udp, &h, ifindex);
            ev.hw_tstamp_ns = hw;
            emit(ev);
        }
        Verdict::Probe(..) => count(counter::SKIPPED),
        Verdict::Skip(c) => count(c),
    }
}

/// Tracing programs see every packet of the host (all namespaces): keep TX
/// sent by this node and RX addressed to it.
#[inline(always)]
fn is_for_this_node(pt: u8, h: &ProbeHeader) -> bool {
    let me = global(&LOCAL_NODE);
    me == 0
        || (pt == point::TP_RECEIVE && h.receiver == me)
        || (pt != point::TP_RECEIVE && h.sender == me)
}

#[inline(always)]
fn classify_kernel(l3: *const u8) -> Verdict {
    let Some(udp_off) = kernel_udp_offset(l3) else {
        return Verdict::Skip(counter::SKIPPED);
    };
    let udp_ptr = l3.wrapping_add(udp_off);
    // SAFETY: bpf_probe_read_kernel validates the address.
    let Ok(raw) = (unsafe { bpf_probe_read_kernel(udp_ptr as *const [u8; UDP_HLEN]) }) else {
        return Verdict::Skip(counter::SKIPPED);
    };
    let udp = Udp::from_wire(raw);
    if let Err(c) = check_udp(udp) {
        return Verdict::Skip(c);
    }
    // SAFETY: as above.
    let header =
        unsafe { bpf_probe_read_kernel(udp_ptr.wrapping_add(UDP_HLEN) as *const ProbeHeader) }.ok();
    check_probe(udp, header)
}

#[inline(always)]
fn kernel_udp_offset(l3: *const u8) -> Option<usize> {
    // SAFETY: bpf_probe_read_kernel validates the address.
    let first: u8 = unsafe { bpf_probe_read_kernel(l3) }.ok()?;
    match first >> 4 {
        4 => {
            // SAFETY: as above.
            let ip: [u8; 20] = unsafe { bpf_probe_read_kernel(l3 as *const [u8; 20]) }.ok()?;
            ipv4_udp_offset(&ip)
        }
        6 => {
            // SAFETY: as above.
            let nh: u8 = unsafe { bpf_probe_read_kernel(l3.wrapping_add(6)) }.ok()?;
            (nh == IPPROTO_UDP).then_some(IPV6_HLEN)
        }
        _ => None,
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
