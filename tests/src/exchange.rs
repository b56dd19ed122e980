//! Two test hosts probing each other with real eBPF capture on both ends.
//!
//! Used by the integration tests and by the demo. Every host gets node id
//! `index + 1`, attaches capture to its link, enables SO_TIMESTAMPING on its
//! probe socket, sends `pairs` coded pairs to the other host (and, if asked,
//! non-probe UDP to another port), and returns everything it recorded.

use std::{
    net::{SocketAddr, UdpSocket},
    sync::{Arc, Barrier},
    thread,
    time::Duration,
};

use clockmesh::{
    capture::{
        Capture, CaptureConfig, Counters, ProbeEvent,
        clocks::{self, ClockMap},
        timestamping::{self, RxDatagram, StampMode, TxReport},
    },
    probe::{self, ProbeHeader},
};

use crate::netns::{Host, Testbed};

#[derive(Clone, Debug)]
pub struct ExchangeConfig {
    pub pairs: u64,
    pub spacing: Duration,
    /// Pause between pairs.
    pub interval: Duration,
    pub port: u16,
    /// Also send one non-probe datagram to this port per pair.
    pub noise_port: Option<u16>,
    /// Attach the tp_btf programs too.
    pub tracepoints: bool,
}

impl Default for ExchangeConfig {
    fn default() -> Self {
        ExchangeConfig {
            pairs: 50,
            spacing: probe::DEFAULT_PACKET_SPACING,
            interval: Duration::from_millis(2),
            port: probe::DEFAULT_PROBE_PORT,
            noise_port: None,
            tracepoints: true,
        }
    }
}

/// What one host saw.
#[derive(Clone, Debug)]
pub struct HostRecord {
    pub node: u32,
    pub events: Vec<ProbeEvent>,
    /// SO_TIMESTAMPING TX reports; `id` = n-th probe datagram sent (2 per pair).
    pub tx_reports: Vec<TxReport>,
    /// Probes received on the socket, with their SO_TIMESTAMPING RX stamps.
    pub received: Vec<(ProbeHeader, RxDatagram)>,
    pub counters: Counters,
    pub mono_to_realtime: ClockMap,
}

/// Runs the exchange between hosts 0 and 1 of `bed`.
pub fn run(bed: &Testbed, cfg: &ExchangeConfig) -> anyhow::Result<[HostRecord; 2]> {
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|i| {
            let (me, peer) = (bed.host(i).clone(), bed.host(1 - i).clone());
            let (cfg, barrier) = (cfg.clone(), barrier.clone());
            me.clone()
                .spawn(move || run_host(i as u32 + 1, &me, &peer, &cfg, &barrier))
        })
        .collect();
    let mut records = Vec::new();
    for h in handles {
        let joined = h
            .join()
            .map_err(|_| anyhow::anyhow!("host thread panicked"))?;
        records.push(joined??);
    }
    let [a, b]: [HostRecord; 2] = records
        .try_into()
        .map_err(|_| anyhow::anyhow!("two hosts"))?;
    Ok([a, b])
}

fn run_host(
    node: u32,
    me: &Host,
    peer: &Host,
    cfg: &ExchangeConfig,
    barrier: &Barrier,
) -> anyhow::Result<HostRecord> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _entered = rt.enter();
    let mut capture_cfg = CaptureConfig::new(me.iface, cfg.port..=cfg.port);
    capture_cfg.local_node = node;
    capture_cfg.tracepoints = cfg.tracepoints;
    let attached = Capture::attach(&capture_cfg);
    // Meet even on failure so the peer does not wait forever.
    barrier.wait();
    let mut capture = attached?;
    let sock = UdpSocket::bind(SocketAddr::new(me.addr.into(), cfg.port))?;
    timestamping::enable(&sock, StampMode::Software)?;
    if !timestamping::wait_for_rx_stamping(Duration::from_secs(2))? {
        anyhow::bail!("kernel RX timestamping did not become active");
    }
    let noise = cfg.noise_port.map(|p| noise_sockets(me, p)).transpose()?;
    barrier.wait();

    let peer_addr = SocketAddr::new(peer.addr.into(), cfg.port);
    let mut record = HostRecord {
        node,
        events: Vec::new(),
        tx_reports: Vec::new(),
        received: Vec::new(),
        counters: Counters::default(),
        mono_to_realtime: clocks::measure_monotonic_to_realtime(100)
            .ok_or_else(|| anyhow::anyhow!("clock bracket failed"))?,
    };
    for seq in 0..cfg.pairs {
        probe::send_coded_pair(&sock, peer_addr, node, 3 - node, seq, cfg.spacing)?;
        if let (Some((tx, _rx)), Some(port)) = (&noise, cfg.noise_port) {
            tx.send_to(b"not a probe", SocketAddr::new(peer.addr.into(), port))?;
        }
        thread::sleep(cfg.interval);
        drain(&sock, &mut capture, &mut record)?;
    }
    // Let the peer finish sending while we are still attached.
    barrier.wait();
    thread::sleep(Duration::from_millis(50));
    drain(&sock, &mut capture, &mut record)?;
    record.counters = capture.counters()?;
    barrier.wait();
    Ok(record)
}

/// A sender and a receiver bound to `port`, so noise is not answered by ICMP.
fn noise_sockets(me: &Host, port: u16) -> std::io::Result<(UdpSocket, UdpSocket)> {
    let rx = UdpSocket::bind(SocketAddr::new(me.addr.into(), port))?;
    let tx = UdpSocket::bind(SocketAddr::new(me.addr.into(), 0))?;
    Ok((tx, rx))
}

fn drain(sock: &UdpSocket, capture: &mut Capture, record: &mut HostRecord) -> anyhow::Result<()> {
    capture.poll_events(&mut record.events);
    timestamping::drain_tx_reports(sock, &mut record.tx_reports)?;
    let mut buf = [0u8; 2048];
    loop {
        match timestamping::recv_stamped(sock, &mut buf) {
            Ok(d) => {
                if let Some(h) = ProbeHeader::from_bytes(&buf[..d.len]) {
                    record.received.push((h, d));
                }
            }
            Err(nix::errno::Errno::EAGAIN) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Events of one point for one probe identity.
pub fn find(
    events: &[ProbeEvent],
    point: u8,
    sender: u32,
    seq: u64,
    pair_index: u8,
) -> impl Iterator<Item = &ProbeEvent> {
    events.iter().filter(move |e| {
        e.point == point && e.sender == sender && e.seq == seq && e.pair_index == pair_index
    })
}

/// One-way delays `rx - tx` (ns, MONOTONIC both) of every probe `tx_host`
/// sent, between the given points. Probes missing an event are skipped.
pub fn one_way_delays(
    tx_host: &HostRecord,
    rx_host: &HostRecord,
    tx_point: u8,
    rx_point: u8,
) -> Vec<i64> {
    tx_host
        .events
        .iter()
        .filter(|e| e.point == tx_point && e.sender == tx_host.node)
        .filter_map(|tx| {
            let rx = find(&rx_host.events, rx_point, tx.sender, tx.seq, tx.pair_index).next()?;
            Some(rx.ktime_ns as i64 - tx.ktime_ns as i64)
        })
        .collect()
}

/// SO_TIMESTAMPING `OPT_ID` of a probe: the probe socket sends nothing but
/// probes, two per pair, so the n-th datagram is (seq n / 2, packet n % 2).
pub fn tx_report_id(seq: u64, pair_index: u8) -> u32 {
    (seq * 2 + u64::from(pair_index)) as u32
}

/// Inverse of [`tx_report_id`].
pub fn probe_of_tx_report(id: u32) -> (u64, u8) {
    (u64::from(id / 2), (id % 2) as u8)
}

/// Summary of the one-way delays between two points, both directions pooled.
pub fn both_directions(
    a: &HostRecord,
    b: &HostRecord,
    tx_point: u8,
    rx_point: u8,
) -> Option<Summary> {
    let mut d = one_way_delays(a, b, tx_point, rx_point);
    d.extend(one_way_delays(b, a, tx_point, rx_point));
    summarize(&d)
}

/// Summary of the SO_TIMESTAMPING one-way delays, both directions pooled.
pub fn socket_both_directions(a: &HostRecord, b: &HostRecord) -> Option<Summary> {
    let mut d = socket_one_way_delays(a, b);
    d.extend(socket_one_way_delays(b, a));
    summarize(&d)
}

/// One-way delays from SO_TIMESTAMPING software stamps (REALTIME both ends).
pub fn socket_one_way_delays(tx_host: &HostRecord, rx_host: &HostRecord) -> Vec<i64> {
    rx_host
        .received
        .iter()
        .filter(|(h, _)| h.sender == tx_host.node)
        .filter_map(|(h, d)| {
            let id = tx_report_id(h.seq, h.pair_index);
            let tx = tx_host.tx_reports.iter().find(|r| r.id == id)?;
            Some(d.stamps.software_ns - tx.stamps.software_ns)
        })
        .collect()
}

/// min / median / p99 / max of a sample, in its units.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Summary {
    pub count: usize,
    pub min: i64,
    pub median: i64,
    pub p99: i64,
    pub max: i64,
}

pub fn summarize(values: &[i64]) -> Option<Summary> {
    let mut v = values.to_vec();
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (!v.is_empty()).then(|| Summary {
        count: v.len(),
        min: v[0],
        median: at(0.5),
        p99: at(0.99),
        max: v[v.len() - 1],
    })
}

/// Per packet: SO_TIMESTAMPING driver TX stamp minus the tp_btf
/// `net_dev_start_xmit` stamp brought to REALTIME (ns).
pub fn xmit_to_socket_tx_gaps(host: &HostRecord) -> Vec<i64> {
    host.tx_reports
        .iter()
        .filter_map(|r| {
            let (seq, idx) = probe_of_tx_report(r.id);
            let ev = find(
                &host.events,
                clockmesh_common::point::TP_XMIT,
                host.node,
                seq,
                idx,
            )
            .next()?;
            Some(r.stamps.software_ns - host.mono_to_realtime.apply(ev.ktime_ns as i64))
        })
        .collect()
}

/// Per packet: socket RX stamp minus the tc ingress `skb->tstamp` (ns).
pub fn ingress_to_socket_rx_gaps(host: &HostRecord) -> Vec<i64> {
    host.received
        .iter()
        .filter_map(|(h, d)| {
            let point = clockmesh_common::point::TC_INGRESS;
            let ev = find(&host.events, point, h.sender, h.seq, h.pair_index).next()?;
            Some(d.stamps.software_ns - ev.skb_tstamp_ns as i64)
        })
        .collect()
}
