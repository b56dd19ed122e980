//! `clockmesh capture`: attach the eBPF programs to an interface and print
//! every probe event (one JSON object per line with `--json`) until Ctrl-C.
use std::ops::RangeInclusive;

use anyhow::Context as _;
use clockmesh::capture::{Capture, CaptureConfig, ProbeEvent};

#[derive(clap::Args, Debug)]
pub struct CaptureArgs {
    /// Probe interface (e.g. the NCCL interface, `NCCL_SOCKET_IFNAME`).
    #[arg(long, short, env = "NCCL_SOCKET_IFNAME")]
    interface: String,
    /// UDP destination port or range carrying probes, e.g. `31900` or `31900-31910`.
    #[arg(long, default_value = "31900", value_parser = parse_port_range)]
    ports: RangeInclusive<u16>,
    /// This node's id; the kernel-wide tracing programs keep only probes it
    /// sent or that are addressed to it (0 = keep all).
    #[arg(long, default_value_t = 0)]
    node: u32,
    /// Skip the tp_btf programs (tc points only).
    #[arg(long)]
    no_tracepoints: bool,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    duration: Option<f64>,
    /// One JSON object per event instead of a table row.
    #[arg(long)]
    json: bool,
}

fn parse_port_range(s: &str) -> Result<RangeInclusive<u16>, String> {
    let bad = || format!("{s:?} is not a port or a range like 31900-31910");
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let lo: u16 = lo.trim().parse().map_err(|_| bad())?;
    let hi: u16 = hi.trim().parse().map_err(|_| bad())?;
    if lo == 0 || hi < lo {
        return Err(bad());
    }
    Ok(lo..=hi)
}

pub fn run(args: CaptureArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(capture_loop(args))
}

async fn capture_loop(args: CaptureArgs) -> anyhow::Result<()> {
    let mut cfg = CaptureConfig::new(&args.interface, args.ports.clone());
    cfg.local_node = args.node;
    cfg.tracepoints = !args.no_tracepoints;
    let mut capture = Capture::attach(&cfg)?;
    if !args.json {
        crate::outln!(
            "{:>6} {:>10} {:>10} {:>8} {:>3} {:>20} {:>20} {:>20}",
            "point",
            "sender",
            "receiver",
            "seq",
            "pkt",
            "ktime (MONO ns)",
            "skb tstamp (ns)",
            "hw tstamp (ns)"
        )?;
    }
    let deadline = args
        .duration
        .map(|s| tokio::time::Instant::now() + std::time::Duration::from_secs_f64(s.max(0.0)));
    let mut events = Vec::new();
    loop {
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            n = capture.next_events(&mut events) => { n.context("reading the ring buffer")?; }
            _ = tokio::signal::ctrl_c() => break,
            _ = until_deadline => break,
        }
        for ev in events.drain(..) {
            print_event(&ev, args.json)?;
        }
    }
    eprintln!("counters: {:?}", capture.counters()?);
    capture.detach();
    Ok(())
}

fn print_event(ev: &ProbeEvent, json: bool) -> anyhow::Result<()> {
    if json {
        let value = serde_json::json!({
            "point": point_name(ev.point), "sender": ev.sender, "receiver": ev.receiver,
            "seq": ev.seq, "pair_index": ev.pair_index, "ifindex": ev.ifindex,
            "ktime_ns": ev.ktime_ns, "skb_tstamp_ns": ev.skb_tstamp_ns,
            "tstamp_type": ev.tstamp_type, "hw_tstamp_ns": ev.hw_tstamp_ns,
            "src_port": ev.src_port, "dst_port": ev.dst_port,
        });
        crate::outln!("{value}")?;
    } else {
        crate::outln!(
            "{:>6} {:>10} {:>10} {:>8} {:>3} {:>20} {:>20} {:>20}",
            point_name(ev.point),
            ev.sender,
            ev.receiver,
            ev.seq,
            ev.pair_index,
            ev.ktime_ns,
            ev.skb_tstamp_ns,
            ev.hw_tstamp_ns
        )?;
    }
    Ok(())
}

fn point_name(p: u8) -> &'static str {
    use clockmesh_common::point::*;
    match p {
        TC_EGRESS => "tc-eg",
        TC_INGRESS => "tc-in",
        TP_XMIT => "tp-tx",
        TP_RECEIVE => "tp-rx",
        TX_COMPLETION => "hw-tx",
        _ => "?",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_ranges_parse_or_explain() {
        assert_eq!(parse_port_range("31900"), Ok(31900..=31900));
        assert_eq!(parse_port_range("10-20"), Ok(10..=20));
        for bad in ["0", "20-10", "x", "70000", "1-"] {
            assert!(
                parse_port_range(bad).unwrap_err().contains("not a port"),
                "{bad}"
            );
        }
    }
}
