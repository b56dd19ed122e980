//! `clockmesh-demo`: by default a cluster of `clockmesh agent`s on netns
//! hosts with etcd and injected skews, printing estimated vs true offsets;
//! `clockmesh-demo exchange` shows the raw eBPF timestamps of two hosts;
//! `clockmesh-demo bench` measures the capture path;
//! `clockmesh-demo bench-chrony` compares clockmesh with chrony on one link;
//! `clockmesh-demo bench-faults` compares them through faults on a bridge;
//! `clockmesh-demo bench-scale` measures the coordination at 1,000–10,000 members.
//! Run through `cargo xtask demo` (needs root).

use std::time::Duration;

use clap::{Parser, Subcommand};
use clockmesh_common::point;
use clockmesh_testbed::{
    exchange::{self, ExchangeConfig, HostRecord, Summary},
    netns::Testbed,
};
use serde::Serialize;

mod bench;
mod chrony;
mod cluster;
mod faults;
mod gpu;
mod pingpong;
mod ptp;
mod scale;

#[derive(Parser, Debug)]
#[command(
    about = "clockmesh demo: N netns hosts run the agent with etcd and known skews; prints estimated vs true offsets"
)]
struct Args {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    cluster: cluster::ClusterArgs,
}

#[derive(clap::Args, Debug)]
struct ExchangeArgs {
    /// Coded pairs each host sends.
    #[arg(long, default_value_t = 10)]
    pairs: u64,
    /// Spacing between the two packets of a pair, µs.
    #[arg(long, default_value_t = 100)]
    spacing_us: u64,
    /// Print a machine-readable summary instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Two netns hosts exchange probes; prints eBPF timestamps and one-way delays.
    Exchange(ExchangeArgs),
    /// Benchmarks: tc program cost per packet, sustained event rate, delay
    /// distributions per timestamp point.
    Bench(bench::BenchArgs),
    /// chrony, ptp4l and clockmesh side by side on one veth pair, at the
    /// same instants: |error| p50/p99/max, CPU, clockmesh's bound coverage.
    BenchChrony(chrony::ChronyArgs),
    /// chrony, ptp4l and clockmesh beside each other on 3 hosts through faults
    /// (asymmetric path, 30 % loss, link down, agent restart, reference
    /// lost): what a reader gets, availability, |error|, bound coverage.
    BenchFaults(faults::FaultsArgs),
    /// A real two-host GPU job against the truth (needs 2 NVIDIA GPUs, torch
    /// and jax): agents in network namespaces with injected skews, PyTorch
    /// NCCL and JAX jobs between them under the skew shim, profiler windows
    /// that differ per rank, a planted straggler; merged and analysed.
    GpuE2e(gpu::GpuArgs),
    /// The coordination at 1,000–10,000 simulated members: a real etcd
    /// through the agent's own etcd code, and the relay's leader (a real
    /// core::Node) on loopback; requests, bytes, CPU, latencies, accuracy
    /// against the truth (docs/coordination.md, "At scale").
    ///
    /// Every simulated member has its own EtcdDiscovery (two connections,
    /// one lease kept alive, a campaign) and refreshes the member list and
    /// the leader every 2 s, as the agent does. With `--exchange relay`
    /// (what the agent ships) that is all etcd carries; the relay run sends
    /// N members' fit datagrams into a real core::Node leader on one UDP
    /// socket (its receive buffer set as the agent sets it), counts what
    /// the socket drops and scores every result against the truth. With
    /// `--exchange store` (the agent's design before) each member also puts
    /// its fits at +0.3 s and reads its result at +0.7 s, and the elected
    /// leader, a real core::Node, fetches, solves and writes the results
    /// through etcd. Loopback only; needs etcd on PATH. Everything shares
    /// this machine's cores.
    BenchScale(scale::ScaleArgs),
    /// The bare UDP floor of bench-chrony's CPU-per-pair comparison.
    #[command(hide = true)]
    Pingpong(pingpong::PingPongArgs),
}

/// One-way delay distributions (ns) per timestamp point, both directions.
#[derive(Serialize)]
struct DelaySummary {
    tc: Option<Summary>,
    tp_btf: Option<Summary>,
    so_timestamping: Option<Summary>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match args.command {
        Some(Cmd::Bench(b)) => bench::run(b),
        Some(Cmd::Exchange(e)) => exchange_demo(e),
        Some(Cmd::BenchChrony(c)) => chrony::run(c),
        Some(Cmd::BenchFaults(f)) => faults::run(f),
        Some(Cmd::Pingpong(p)) => pingpong::run(p),
        Some(Cmd::GpuE2e(g)) => gpu::run(g),
        Some(Cmd::BenchScale(s)) => scale::run(s),
        None => cluster::run(args.cluster),
    }
}

fn exchange_demo(args: ExchangeArgs) -> anyhow::Result<()> {
    let bed = Testbed::pair()?;
    let cfg = ExchangeConfig {
        pairs: args.pairs,
        spacing: Duration::from_micros(args.spacing_us),
        ..ExchangeConfig::default()
    };
    let [a, b] = exchange::run(&bed, &cfg)?;
    let summary = delay_summary(&a, &b);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    println!(
        "clockmesh demo: hosts {} ({}) and {} ({}) on veth, {} coded pairs each way, spacing {} µs",
        a.node,
        bed.host(0).addr,
        b.node,
        bed.host(1).addr,
        cfg.pairs,
        args.spacing_us
    );
    println!(
        "timestamps: tc = tc egress/ingress, tp = tp_btf net_dev_start_xmit/netif_receive_skb (both CLOCK_MONOTONIC), sock = SO_TIMESTAMPING software (CLOCK_REALTIME)\n"
    );
    print_probe_table(&a, &b);
    print_probe_table(&b, &a);
    println!("\none-way delay, ns (min / median / p99 / max over both directions):");
    for (name, s) in [
        ("tc", summary.tc),
        ("tp_btf", summary.tp_btf),
        ("SO_TIMESTAMPING", summary.so_timestamping),
    ] {
        match s {
            Some(s) => println!(
                "  {name:<16} {:>7} / {:>7} / {:>7} / {:>7}  (n={})",
                s.min, s.median, s.p99, s.max, s.count
            ),
            None => println!("  {name:<16} no samples"),
        }
    }
    println!(
        "\ncounters: host {}: {:?}\n          host {}: {:?}",
        a.node, a.counters, b.node, b.counters
    );
    Ok(())
}

fn delay_summary(a: &HostRecord, b: &HostRecord) -> DelaySummary {
    DelaySummary {
        tc: exchange::both_directions(a, b, point::TC_EGRESS, point::TC_INGRESS),
        tp_btf: exchange::both_directions(a, b, point::TP_XMIT, point::TP_RECEIVE),
        so_timestamping: exchange::socket_both_directions(a, b),
    }
}

fn print_probe_table(tx: &HostRecord, rx: &HostRecord) {
    println!("probes {} -> {}", tx.node, rx.node);
    println!(
        "  {:>4} {:>4} {:>20} {:>20} {:>8} {:>8} {:>8}",
        "seq", "pkt", "tx tc egress (ns)", "rx tc ingress (ns)", "owd tc", "owd tp", "owd sock"
    );
    let mut egress: Vec<_> = tx
        .events
        .iter()
        .filter(|e| e.point == point::TC_EGRESS && e.sender == tx.node)
        .collect();
    egress.sort_by_key(|e| (e.seq, e.pair_index));
    for e in egress {
        let at = |host: &HostRecord, pt| {
            exchange::find(&host.events, pt, e.sender, e.seq, e.pair_index)
                .next()
                .map(|x| x.ktime_ns as i64)
        };
        let owd = |t: Option<i64>, r: Option<i64>| {
            t.zip(r).map_or("-".into(), |(t, r)| (r - t).to_string())
        };
        let sock = socket_delay(tx, rx, e.seq, e.pair_index);
        println!(
            "  {:>4} {:>4} {:>20} {:>20} {:>8} {:>8} {:>8}",
            e.seq,
            e.pair_index,
            e.ktime_ns,
            at(rx, point::TC_INGRESS).map_or("-".into(), |v| v.to_string()),
            owd(Some(e.ktime_ns as i64), at(rx, point::TC_INGRESS)),
            owd(at(tx, point::TP_XMIT), at(rx, point::TP_RECEIVE)),
            sock.map_or("-".into(), |v| v.to_string()),
        );
    }
}

fn socket_delay(tx: &HostRecord, rx: &HostRecord, seq: u64, idx: u8) -> Option<i64> {
    let id = exchange::tx_report_id(seq, idx);
    let sent = tx.tx_reports.iter().find(|r| r.id == id)?;
    let (_, got) = rx
        .received
        .iter()
        .find(|(h, _)| h.sender == tx.node && h.seq == seq && h.pair_index == idx)?;
    Some(got.stamps.software_ns - sent.stamps.software_ns)
}
