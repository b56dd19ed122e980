//! Capture-path benchmarks (figures, not pass/fail):
//! - cost per packet of the tc classifier (BPF_PROG_TEST_RUN with repeat):
//!   probe (event emitted), other port (skipped), bad magic (malformed);
//! - sustained event rate into userspace without ring-buffer loss;
//! - one-way delay distribution on veth per timestamp point.

use std::{
    net::{SocketAddr, UdpSocket},
    sync::mpsc,
    time::{Duration, Instant},
};

use aya::programs::{TestRun, TestRunOptions};
use clockmesh::{
    capture::{Capture, CaptureConfig, loader},
    probe::{self, ProbeHeader},
};
use clockmesh_testbed::{
    exchange::{self, ExchangeConfig},
    netns::Testbed,
};
use serde::Serialize;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Pairs per direction for the delay distributions.
    #[arg(long, default_value_t = 2000)]
    pairs: u64,
    /// Offered probe rates (packets/s) for the sustained-rate test.
    #[arg(long, value_delimiter = ',', default_values_t = [20_000u64, 50_000, 100_000, 200_000])]
    rates: Vec<u64>,
}

#[derive(Serialize)]
struct ProgramCost {
    probe_ns: u64,
    other_port_ns: u64,
    malformed_ns: u64,
}

#[derive(Serialize)]
struct RateResult {
    offered_pps: u64,
    sent: u64,
    events_received: u64,
    ringbuf_full: u64,
    events_per_s: f64,
}

#[derive(Serialize)]
struct Report {
    tc_cost_per_packet: ProgramCost,
    sustained: Vec<RateResult>,
    one_way_delay_ns: serde_json::Value,
    ebpf_vs_so_timestamping_ns: serde_json::Value,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let bed = Testbed::pair()?;
    let cost = bed.host(0).run(program_cost)??;
    let mut sustained = Vec::new();
    for &rate in &args.rates {
        sustained.push(sustained_rate(&bed, rate)?);
    }
    let cfg = ExchangeConfig {
        pairs: args.pairs,
        interval: Duration::from_millis(1),
        port: 31_950,
        ..ExchangeConfig::default()
    };
    let [a, b] = exchange::run(&bed, &cfg)?;
    use clockmesh_common::point::*;
    let both = |tp, rp| exchange::both_directions(&a, &b, tp, rp);
    let delays = serde_json::json!({
        "tc": both(TC_EGRESS, TC_INGRESS),
        "tp_btf": both(TP_XMIT, TP_RECEIVE),
        "tc_egress_to_tp_receive": both(TC_EGRESS, TP_RECEIVE),
        "tp_xmit_to_tc_ingress": both(TP_XMIT, TC_INGRESS),
        "so_timestamping": exchange::socket_both_directions(&a, &b),
    });
    let gaps = |f: fn(&exchange::HostRecord) -> Vec<i64>| {
        let mut g = f(&a);
        g.extend(f(&b));
        exchange::summarize(&g)
    };
    let agreement = serde_json::json!({
        "socket_tx_minus_tp_xmit": gaps(exchange::xmit_to_socket_tx_gaps),
        "socket_rx_minus_tc_ingress_tstamp": gaps(exchange::ingress_to_socket_rx_gaps),
    });
    let report = Report {
        tc_cost_per_packet: cost,
        sustained,
        one_way_delay_ns: delays,
        ebpf_vs_so_timestamping_ns: agreement,
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

fn frame(port: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    f.extend(0x0800u16.to_be_bytes());
    let total = (28 + payload.len()) as u16;
    f.extend([0x45, 0]);
    f.extend(total.to_be_bytes());
    f.extend([0, 0, 0, 0, 64, 17, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2]);
    f.extend(40_000u16.to_be_bytes());
    f.extend(port.to_be_bytes());
    f.extend((8 + payload.len() as u16).to_be_bytes());
    f.extend([0, 0]);
    f.extend(payload);
    f
}

/// Median of `rounds` kernel-timed runs of `repeat` packets each, in ns/packet.
fn cost(cap: &mut Capture, data: &[u8], repeat: u32, rounds: usize) -> anyhow::Result<u64> {
    let mut per_round = Vec::new();
    let mut sink = Vec::new();
    for _ in 0..rounds {
        let prog = cap
            .classifier(loader::PROG_TC_INGRESS)
            .ok_or_else(|| anyhow::anyhow!("no tc program"))?;
        let opts = TestRunOptions {
            data_in: Some(data),
            repeat,
            ..TestRunOptions::default()
        };
        per_round.push(prog.test_run(opts)?.duration.as_nanos() as u64);
        cap.poll_events(&mut sink); // keep the ring buffer from filling
        sink.clear();
    }
    per_round.sort_unstable();
    Ok(per_round[per_round.len() / 2])
}

fn program_cost() -> anyhow::Result<ProgramCost> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _g = rt.enter();
    let port = 31_940;
    let mut cfg = CaptureConfig::new("eth0", port..=port);
    cfg.tracepoints = false;
    let mut cap = Capture::attach(&cfg)?;
    let probe = probe::encode_probe(&ProbeHeader::probe(1, 2, 3, 0, 100));
    let mut bad = probe;
    bad[0] = b'X';
    Ok(ProgramCost {
        // ≤ 4000 probes per round: the ring buffer holds ~7000 events.
        probe_ns: cost(&mut cap, &frame(port, &probe), 4000, 25)?,
        other_port_ns: cost(&mut cap, &frame(port + 1, &probe), 100_000, 11)?,
        malformed_ns: cost(&mut cap, &frame(port, &bad), 100_000, 11)?,
    })
}

/// Offers `rate` probes/s from host 0 to host 1 for one second while host 1
/// drains its ring buffer through tokio.
fn sustained_rate(bed: &Testbed, rate: u64) -> anyhow::Result<RateResult> {
    let port = 31_960;
    let dst = SocketAddr::new(bed.host(1).addr.into(), port);
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let receiver = bed.host(1).spawn(move || -> anyhow::Result<(u64, u64)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            let mut cfg = CaptureConfig::new("eth0", port..=port);
            cfg.tracepoints = false;
            let mut cap = Capture::attach(&cfg)?;
            let _sink = UdpSocket::bind(dst)?;
            ready_tx.send(())?;
            let mut received = 0u64;
            let mut buf = Vec::with_capacity(8192);
            loop {
                let wait =
                    tokio::time::timeout(Duration::from_millis(200), cap.next_events(&mut buf));
                match wait.await {
                    Ok(n) => received += n? as u64,
                    Err(_) if done_rx.try_recv().is_ok() => break,
                    Err(_) => {}
                }
                buf.clear();
            }
            Ok((received, cap.counters()?.ringbuf_full))
        })
    });
    ready_rx.recv()?;
    let sent = bed.host(0).run(move || offer(dst, rate))??;
    done_tx.send(())?;
    let (received, full) = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("receiver panicked"))???;
    Ok(RateResult {
        offered_pps: rate,
        sent,
        events_received: received,
        ringbuf_full: full,
        events_per_s: received as f64,
    })
}

fn offer(dst: SocketAddr, rate: u64) -> anyhow::Result<u64> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < Duration::from_secs(1) {
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            let h = ProbeHeader::probe(1, 2, sent, 0, 0);
            if sock.send_to(&probe::encode_probe(&h), dst).is_ok() {
                sent += 1;
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(sent)
}
