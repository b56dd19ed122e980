//! `clockmesh-demo pingpong` (hidden; started by `bench-chrony`): the floor
//! a coded pair's CPU is compared with. It sends the datagrams an agent
//! sends per pair — a warm-up and two probes `spacing` apart, every
//! `cadence` — and answers each pair with one report-sized datagram, as the
//! agent's batched follow-up does; nothing is timestamped, parsed or
//! estimated. Run one in each of two namespaces, pointed at each other.

use std::{
    net::{SocketAddr, UdpSocket},
    thread,
    time::{Duration, Instant},
};

use anyhow::Context;

#[derive(clap::Args, Debug)]
pub struct PingPongArgs {
    /// Local address to bind (the peer sends here).
    #[arg(long)]
    bind: SocketAddr,
    /// The peer's address.
    #[arg(long)]
    peer: SocketAddr,
    /// Pair cadence, µs.
    #[arg(long, default_value_t = 100_000)]
    cadence_us: u64,
    /// Gap between the two probes of a pair, µs.
    #[arg(long, default_value_t = 100)]
    spacing_us: u64,
}

/// A probe's and a warm-up's size, and a one-entry stamp batch's.
const PROBE_BYTES: usize = 64;
const REPORT_BYTES: usize = 78;

pub fn run(args: PingPongArgs) -> anyhow::Result<()> {
    let sock = UdpSocket::bind(args.bind).with_context(|| format!("binding {}", args.bind))?;
    let sender = sock.try_clone()?;
    let cadence = Duration::from_micros(args.cadence_us);
    let spacing = Duration::from_micros(args.spacing_us);
    let peer = args.peer;
    thread::spawn(move || send_pairs(&sender, peer, cadence, spacing));
    answer_pairs(&sock, peer)
}

/// Warm-up, first probe, the spacing, second probe; every `cadence`.
fn send_pairs(sock: &UdpSocket, peer: SocketAddr, cadence: Duration, spacing: Duration) {
    let mut next = Instant::now();
    let mut seq: u8 = 0;
    loop {
        seq = seq.wrapping_add(1);
        let mut probe = [0u8; PROBE_BYTES];
        probe[0] = seq;
        let _ = sock.send_to(&probe, peer); // the warm-up
        let _ = sock.send_to(&probe, peer);
        thread::sleep(spacing);
        probe[1] = 1; // marks the pair's second packet
        let _ = sock.send_to(&probe, peer);
        next += cadence;
        thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

/// One report back for each pair's second probe; reports are read and dropped.
fn answer_pairs(sock: &UdpSocket, peer: SocketAddr) -> anyhow::Result<()> {
    let mut buf = [0u8; 512];
    let report = [0u8; REPORT_BYTES];
    loop {
        let (n, _) = sock.recv_from(&mut buf)?;
        if n == PROBE_BYTES && buf[1] == 1 {
            let _ = sock.send_to(&report, peer);
        }
    }
}
