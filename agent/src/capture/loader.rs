//! Loading and attaching the eBPF programs, and streaming their events.
//!
//! One [`Capture`] per probe interface: tc (TCX) egress/ingress on that
//! interface, the tp_btf programs (global, filtered to this node by
//! `LOCAL_NODE`) and, where the kernel allows fentry, the TX-completion hook.
//! Dropping a `Capture` detaches everything: TCX links die with their
//! programs, and no qdisc is created on kernels with TCX (≥ 6.6).

use std::{
    ops::RangeInclusive,
    path::{Path, PathBuf},
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, FEntry, ProgramError, SchedClassifier, TcAttachType},
    util::KernelVersion,
};
use clockmesh_common::{ProbeEvent, counter, globals};
use tokio::io::{Interest, unix::AsyncFd};
use tracing::{debug, info};

use super::{
    CaptureError,
    btf::{self, KernelOffsets},
    privileges,
};

/// The eBPF object built by agent/build.rs, embedded so one binary is all a node needs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/clockmesh"));

/// The embedded eBPF object (empty when built with `AYA_BUILD_SKIP`).
pub fn embedded_object() -> &'static [u8] {
    EBPF_OBJECT
}

pub const PROG_TC_EGRESS: &str = "clockmesh_tc_egress";
pub const PROG_TC_INGRESS: &str = "clockmesh_tc_ingress";
const PROG_TP_XMIT: &str = "clockmesh_tp_xmit";
const PROG_TP_RECEIVE: &str = "clockmesh_tp_receive";
pub const PROG_TX_COMPLETION: &str = "clockmesh_tx_completion";
const DEFAULT_BTF: &str = "/sys/kernel/btf/vmlinux";

/// What to attach, where.
#[derive(Clone, Debug)]
pub struct CaptureConfig {
    /// Probe interface (tc programs attach here).
    pub interface: String,
    /// UDP destination ports that carry probes.
    pub ports: RangeInclusive<u16>,
    /// This node's id: tracing programs keep TX it sent and RX sent to it.
    /// 0 keeps every probe on the host.
    pub local_node: u32,
    /// Attach the tp_btf programs (`net_dev_start_xmit`, `netif_receive_skb`).
    pub tracepoints: bool,
    /// Try fentry on `__skb_tstamp_tx` for NIC TX stamps (falls back if refused).
    pub tx_completion: bool,
    /// Kernel BTF; the tracing programs need it.
    pub btf_path: PathBuf,
    /// Events do not wake the reader; it must poll ([`Capture::poll_events`])
    /// on its own schedule. Saves a wake-up (and in VMs an IPI) per packet.
    pub polled: bool,
}

impl CaptureConfig {
    pub fn new(interface: impl Into<String>, ports: RangeInclusive<u16>) -> Self {
        CaptureConfig {
            interface: interface.into(),
            ports,
            local_node: 0,
            tracepoints: true,
            tx_completion: true,
            btf_path: PathBuf::from(DEFAULT_BTF),
            polled: false,
        }
    }
}

/// Where NIC hardware TX timestamps come from on this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxStampSource {
    /// fentry on `__skb_tstamp_tx` is attached.
    Fentry,
    /// fentry refused or not requested: SO_TIMESTAMPING's error queue.
    ErrQueue,
}

/// Event counters summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Counters {
    pub emitted: u64,
    pub ringbuf_full: u64,
    pub skipped: u64,
    pub malformed: u64,
    pub read_failed: u64,
}

/// Attached programs and the event stream of one interface.
pub struct Capture {
    // Field order matters on drop: the ring buffer fd before the object.
    events: AsyncFd<RingBuf<MapData>>,
    counters: PerCpuArray<MapData, u64>,
    tx_stamps: TxStampSource,
    interface: String,
    btf_path: PathBuf,
    tracepoints: bool,
    netlink_tc: bool,
    ebpf: Ebpf,
}

impl Capture {
    /// Loads the embedded programs and attaches them as `config` says.
    /// Must run inside a tokio runtime (the ring buffer is polled by it).
    pub fn attach(config: &CaptureConfig) -> Result<Self, CaptureError> {
        check_prerequisites(config)?;
        // Read the kernel BTF once: our offset parser and aya's loader share it.
        let no_btf = |reason: String| CaptureError::NoBtf {
            path: config.btf_path.clone(),
            reason,
        };
        let blob = std::fs::read(&config.btf_path).map_err(|e| no_btf(e.to_string()))?;
        let offsets = KernelOffsets::from_btf(&btf::Btf::parse(&blob)?)?;
        let mut ebpf = load_object(config, &offsets)?;
        let netlink_tc = attach_tc(&mut ebpf, &config.interface)?;
        let kernel_btf = Btf::parse(&blob, aya::Endianness::default()).map_err(|e| e.to_string());
        if config.tracepoints {
            let btf = kernel_btf.as_ref().map_err(|e| no_btf(e.clone()))?;
            attach_tracepoints(&mut ebpf, btf)?;
        }
        let tx_stamps = if config.tx_completion {
            attach_tx_completion(&mut ebpf, kernel_btf.as_ref().map_err(String::clone))
        } else {
            TxStampSource::ErrQueue
        };
        let mut capture = Self::from_loaded(ebpf, &config.interface, tx_stamps)?;
        capture.btf_path.clone_from(&config.btf_path);
        capture.tracepoints = config.tracepoints;
        capture.netlink_tc = netlink_tc;
        Ok(capture)
    }

    /// Attaches the tp_btf programs now (the agent's `tracepoint_stamps =
    /// auto` does, once the socket's kernel stamps turn out to be missing).
    pub fn attach_tracepoints(&mut self) -> Result<(), CaptureError> {
        if self.tracepoints {
            return Ok(());
        }
        let no_btf = |reason: String| CaptureError::NoBtf {
            path: self.btf_path.clone(),
            reason,
        };
        let blob = std::fs::read(&self.btf_path).map_err(|e| no_btf(e.to_string()))?;
        let btf =
            Btf::parse(&blob, aya::Endianness::default()).map_err(|e| no_btf(e.to_string()))?;
        attach_tracepoints(&mut self.ebpf, &btf)?;
        self.tracepoints = true;
        info!(interface = %self.interface, "tp_btf stamp programs attached");
        Ok(())
    }

    pub fn tracepoints_attached(&self) -> bool {
        self.tracepoints
    }

    fn from_loaded(
        mut ebpf: Ebpf,
        interface: &str,
        tx_stamps: TxStampSource,
    ) -> Result<Self, CaptureError> {
        let ring =
            RingBuf::try_from(take_map(&mut ebpf, "EVENTS")?).map_err(aya::EbpfError::from)?;
        let events = register_ring(ring)?;
        let counters = PerCpuArray::try_from(take_map(&mut ebpf, "COUNTERS")?)
            .map_err(aya::EbpfError::from)?;
        info!(interface, ?tx_stamps, "eBPF capture attached");
        Ok(Capture {
            events,
            counters,
            tx_stamps,
            interface: interface.to_owned(),
            btf_path: PathBuf::from(DEFAULT_BTF),
            tracepoints: false,
            netlink_tc: false,
            ebpf,
        })
    }

    pub fn tx_stamp_source(&self) -> TxStampSource {
        self.tx_stamps
    }

    pub fn interface(&self) -> &str {
        &self.interface
    }

    /// Waits until events are available, then appends all of them to `out`.
    pub async fn next_events(&mut self, out: &mut Vec<ProbeEvent>) -> std::io::Result<usize> {
        loop {
            let mut guard = self.events.readable_mut().await?;
            let n = drain(guard.get_inner_mut(), out);
            guard.clear_ready();
            if n > 0 {
                return Ok(n);
            }
        }
    }

    /// Appends whatever events are ready now, without waiting.
    pub fn poll_events(&mut self, out: &mut Vec<ProbeEvent>) -> usize {
        drain(self.events.get_mut(), out)
    }

    /// The per-CPU counters, summed.
    pub fn counters(&self) -> Result<Counters, CaptureError> {
        let read = |i: u32| -> Result<u64, CaptureError> {
            let per_cpu = self.counters.get(&i, 0).map_err(aya::EbpfError::from)?;
            Ok(per_cpu.iter().sum())
        };
        Ok(Counters {
            emitted: read(counter::EMITTED)?,
            ringbuf_full: read(counter::RINGBUF_FULL)?,
            skipped: read(counter::SKIPPED)?,
            malformed: read(counter::MALFORMED)?,
            read_failed: read(counter::READ_FAILED)?,
        })
    }

    /// A loaded tc classifier, for `BPF_PROG_TEST_RUN` (tests and benchmarks).
    pub fn classifier(&self, name: &str) -> Option<&SchedClassifier> {
        self.ebpf.program(name)?.try_into().ok()
    }

    /// The classifiers went through netlink tc (no TCX): detaching them
    /// needs CAP_NET_ADMIN, TCX and tracing links need no capability.
    pub fn detach_needs_net_admin(&self) -> bool {
        self.netlink_tc
    }

    /// Detaches everything (same as dropping, with a log line).
    pub fn detach(self) {
        info!(interface = %self.interface, "eBPF capture detached");
    }
}

fn drain(ring: &mut RingBuf<MapData>, out: &mut Vec<ProbeEvent>) -> usize {
    let mut n = 0;
    while let Some(item) = ring.next() {
        if let Some(ev) = clockmesh_common::decode_event(&item) {
            out.push(ev);
            n += 1;
        }
    }
    n
}

fn register_ring(ring: RingBuf<MapData>) -> Result<AsyncFd<RingBuf<MapData>>, CaptureError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(CaptureError::RingBuffer(std::io::Error::other(
            "Capture::attach must run inside a tokio runtime",
        )));
    }
    // SAFETY: the ring buffer owns its map fd; it stays open and refers to the
    // same map until the AsyncFd (which owns the RingBuf) is dropped.
    unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| CaptureError::RingBuffer(e.into()))
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, CaptureError> {
    ebpf.take_map(name).ok_or(CaptureError::MissingMap(name))
}

fn check_prerequisites(config: &CaptureConfig) -> Result<(), CaptureError> {
    if EBPF_OBJECT.is_empty() {
        return Err(CaptureError::NotBuilt);
    }
    if config.ports.is_empty() || *config.ports.start() == 0 {
        return Err(CaptureError::BadPorts(config.ports.clone()));
    }
    nix::net::if_::if_nametoindex(config.interface.as_str())
        .map_err(|_| CaptureError::NoSuchInterface(config.interface.clone()))?;
    if !Path::new(&config.btf_path).exists() {
        return Err(CaptureError::NoBtf {
            path: config.btf_path.clone(),
            reason: "file does not exist (kernel built without CONFIG_DEBUG_INFO_BTF?)".into(),
        });
    }
    privileges::require_bpf_capabilities()
}

fn load_object(config: &CaptureConfig, o: &KernelOffsets) -> Result<Ebpf, CaptureError> {
    let (port_min, port_max) = (*config.ports.start(), *config.ports.end());
    let no_wakeup = u32::from(config.polled);
    let mut loader = EbpfLoader::new();
    loader
        .override_global(globals::PORT_MIN, &port_min, true)
        .override_global(globals::PORT_MAX, &port_max, true)
        .override_global(globals::LOCAL_NODE, &config.local_node, true)
        .override_global(globals::RB_NO_WAKEUP, &no_wakeup, true)
        .override_global(globals::SKB_HEAD_OFF, &o.skb_head, true)
        .override_global(globals::SKB_DATA_OFF, &o.skb_data, true)
        .override_global(globals::SKB_NETWORK_HEADER_OFF, &o.skb_network_header, true)
        .override_global(globals::SKB_DEV_OFF, &o.skb_dev, true)
        .override_global(globals::NETDEV_IFINDEX_OFF, &o.netdev_ifindex, true);
    loader.load(EBPF_OBJECT).map_err(CaptureError::from_load)
}

/// Attaches the classifiers; true where they went through netlink tc (a
/// clsact qdisc, kernels before TCX), whose filters outlive the process and
/// need CAP_NET_ADMIN to be removed.
fn attach_tc(ebpf: &mut Ebpf, interface: &str) -> Result<bool, CaptureError> {
    let has_tcx = KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0));
    if !has_tcx {
        // Legacy netlink tc needs a clsact qdisc; TCX (≥ 6.6) needs none.
        let _ = aya::programs::tc::qdisc_add_clsact(interface);
    }
    for (name, direction) in [
        (PROG_TC_EGRESS, TcAttachType::Egress),
        (PROG_TC_INGRESS, TcAttachType::Ingress),
    ] {
        let prog: &mut SchedClassifier = program_mut(ebpf, name)?;
        prog.load().map_err(|e| CaptureError::program(name, e))?;
        prog.attach(interface, direction)
            .map_err(|e| CaptureError::program(name, e))?;
    }
    Ok(!has_tcx)
}

fn attach_tracepoints(ebpf: &mut Ebpf, btf: &Btf) -> Result<(), CaptureError> {
    for (name, tracepoint) in [
        (PROG_TP_XMIT, "net_dev_start_xmit"),
        (PROG_TP_RECEIVE, "netif_receive_skb"),
    ] {
        let prog: &mut BtfTracePoint = program_mut(ebpf, name)?;
        prog.load(tracepoint, btf)
            .map_err(|e| CaptureError::program(name, e))?;
        prog.attach().map_err(|e| CaptureError::program(name, e))?;
    }
    Ok(())
}

/// fentry is optional: some kernels (this project's CI among them) refuse it
/// with EPERM. Log one line and fall back to the SO_TIMESTAMPING error queue.
fn attach_tx_completion(ebpf: &mut Ebpf, btf: Result<&Btf, String>) -> TxStampSource {
    let result = (|| -> Result<(), String> {
        let btf = btf?;
        let prog: &mut FEntry = program_mut(ebpf, PROG_TX_COMPLETION).map_err(|e| e.to_string())?;
        prog.load("__skb_tstamp_tx", btf)
            .map_err(|e| e.to_string())?;
        prog.attach().map_err(|e| e.to_string())?;
        Ok(())
    })();
    match result {
        Ok(()) => TxStampSource::Fentry,
        Err(reason) => {
            info!(
                "fentry on __skb_tstamp_tx unavailable ({reason}); NIC TX timestamps will come from the SO_TIMESTAMPING error queue"
            );
            TxStampSource::ErrQueue
        }
    }
}

fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, CaptureError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let prog = ebpf
        .program_mut(name)
        .ok_or(CaptureError::MissingProgram(name))?;
    debug!(name, "loading program");
    prog.try_into().map_err(|e| CaptureError::program(name, e))
}
