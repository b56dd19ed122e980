//! The relay's leader at N members on loopback: a real `core::Node` with
//! the relay exchange on one UDP socket, driven as the agent's driver
//! drives it (every 100 ms tick: drain the socket into `handle_datagram`,
//! then `handle_tick`, sending what it asks); N senders' fit datagrams
//! arrive in the burst the fit phase makes, from N loopback addresses
//! (127.78.x.y: the node checks each datagram's source address).

use std::{
    io::ErrorKind,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clockmesh_common::{ProbeHeader, kind};
use clockmesh_core::{
    node::{Action, Exchange, LocalNs, Member, Node, NodeConfig},
    settings::Settings,
    wire::{self, Message, Sent},
};
use clockmesh_proto::{clockmesh as pb, prost::Message as _};
use serde::Serialize;

use super::{
    metrics::{self, Quantiles},
    realtime_ns,
    truth::{Rng, Truth},
};

#[derive(Clone, Debug)]
pub struct RelayCfg {
    pub members: usize,
    pub windows: u64,
    pub warmup: u64,
    pub window_s: u64,
    pub degree: usize,
    pub seed: u64,
    /// SO_RCVBUFFORCE for the leader's socket, bytes (None: as the agent
    /// sets its probe socket's).
    pub rcvbuf: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct RelayReport {
    pub members: usize,
    pub windows: u64,
    pub rcvbuf_bytes: usize,
    pub fits_sent_per_window: f64,
    pub fit_bytes_per_window: f64,
    /// Fits the leader's node took (its `edge_fits_received`).
    pub fits_received_per_window: f64,
    /// Datagrams the kernel dropped at the leader's socket (/proc/net/udp).
    pub socket_drops_per_window: f64,
    pub udp_rcvbuf_errors_per_window: f64,
    pub send_errors: u64,
    /// How long the senders took to send one window's burst, ms.
    pub burst_ms: Quantiles,
    pub leader_drain_ms: Quantiles,
    pub solve_ms: Quantiles,
    /// The tick that solves and sends every result, ms.
    pub solve_tick_ms: Quantiles,
    pub results_sent_per_window: f64,
    pub results_received_per_window: f64,
    /// When each result left the leader, after its window's end (loopback
    /// delivers it in the send call), ms.
    pub result_after_end_ms: Quantiles,
    pub missed_share: f64,
    pub abs_error_ns: Quantiles,
    pub coverage: f64,
    pub leader_cpu_cores: f64,
    pub senders_cpu_cores: f64,
}

fn member_ip(i: usize) -> Ipv4Addr {
    if i == 0 {
        return Ipv4Addr::new(127, 77, 0, 1);
    }
    Ipv4Addr::new(127, 78, (i / 250 + 1) as u8, (i % 250 + 1) as u8)
}

fn members(n: usize, port: u16) -> Vec<Member> {
    (0..n)
        .map(|i| Member {
            name: format!("node-{i:05}"),
            id: i as u32 + 1,
            addr: member_ip(i).into(),
            probe_port: port,
            capabilities: 0,
        })
        .collect()
}

pub fn run(cfg: &RelayCfg) -> anyhow::Result<RelayReport> {
    anyhow::ensure!(
        (2..=60_000).contains(&cfg.members),
        "--relay-members: 2 to 60000"
    );
    let leader_sock = UdpSocket::bind(SocketAddrV4::new(member_ip(0), 0))?;
    let port = leader_sock.local_addr()?.port();
    match cfg.rcvbuf {
        Some(bytes) => set_rcvbuf_force(&leader_sock, bytes)?,
        // What the agent does to its probe socket.
        None => clockmesh::runtime::raise_receive_buffer(&leader_sock),
    }
    let rcvbuf_bytes = rcvbuf(&leader_sock)?;
    let all = members(cfg.members, port);
    let ids: Arc<Vec<u32>> = Arc::new(all.iter().map(|m| m.id).collect());
    let names: Arc<Vec<String>> = Arc::new(all.iter().map(|m| m.name.clone()).collect());
    let window_ns = i64::try_from(cfg.window_s)?.saturating_mul(1_000_000_000);
    let truth = Arc::new(Truth::generate(&ids, cfg.degree, cfg.seed, realtime_ns()));
    // Every member's socket, bound to its own address (the leader's fits
    // leave from a second socket on the leader's address).
    let socks: Vec<UdpSocket> = (0..cfg.members)
        .map(|i| {
            let port = if i == 0 { 0 } else { port };
            let s = UdpSocket::bind(SocketAddrV4::new(member_ip(i), port))?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .collect::<std::io::Result<_>>()
        .context("binding the members' loopback sockets (127.78.x.y)")?;
    let first = (realtime_ns() / window_ns + 2) as u64;
    let last = first + cfg.windows - 1;
    let plan = Plan {
        first,
        last,
        window_ns,
        truth: truth.clone(),
        ids,
        names,
    };
    let leader_addr = SocketAddrV4::new(member_ip(0), port);
    let drops0 = metrics::udp_socket_drops(leader_addr)?;
    let snmp0 = metrics::udp_snmp()?;
    let (done_tx, done_rx) = mpsc::channel();
    let leader = {
        let plan = plan.clone();
        let settings = Settings {
            probe_window: clockmesh_core::time::Nanos::from_unsigned(cfg.window_s, 1_000_000_000),
            degree: cfg.degree,
            ..Settings::default()
        };
        let all = all.clone();
        std::thread::Builder::new()
            .name("relay-leader".into())
            .spawn(move || leader_loop(leader_sock, all, settings, &plan, done_rx))?
    };
    let senders = senders_loop(&socks, leader_addr.into(), &plan, cfg.warmup)?;
    let _ = done_tx.send(());
    let leader = leader
        .join()
        .map_err(|_| anyhow::anyhow!("the relay leader panicked"))??;
    let drops = leader.socket_drops.saturating_sub(drops0);
    let snmp1 = metrics::udp_snmp()?;
    let w = cfg.windows as f64;
    let wall = (cfg.windows as f64) * cfg.window_s as f64;
    Ok(RelayReport {
        members: cfg.members,
        windows: cfg.windows,
        rcvbuf_bytes,
        fits_sent_per_window: senders.fits as f64 / w,
        fit_bytes_per_window: senders.fit_bytes as f64 / w,
        fits_received_per_window: leader.fits_received as f64 / w,
        socket_drops_per_window: drops as f64 / w,
        udp_rcvbuf_errors_per_window: (snmp1.1 - snmp0.1) as f64 / w,
        send_errors: senders.send_errors,
        burst_ms: Quantiles::of(senders.burst_ms),
        leader_drain_ms: Quantiles::of(leader.drain_ms),
        solve_ms: Quantiles::of(leader.solve_ms),
        solve_tick_ms: Quantiles::of(leader.solve_tick_ms),
        results_sent_per_window: leader.results_sent as f64 / w,
        results_received_per_window: senders.results as f64 / w,
        result_after_end_ms: Quantiles::of(leader.result_after_end_ms),
        missed_share: senders.missed as f64 / senders.scored.max(1) as f64,
        abs_error_ns: Quantiles::of(senders.errors_ns.clone()),
        coverage: senders.covered as f64 / senders.errors_ns.len().max(1) as f64,
        leader_cpu_cores: leader.cpu_s / wall,
        senders_cpu_cores: senders.cpu_s / wall,
    })
}

#[derive(Clone)]
struct Plan {
    first: u64,
    last: u64,
    window_ns: i64,
    truth: Arc<Truth>,
    ids: Arc<Vec<u32>>,
    names: Arc<Vec<String>>,
}

impl Plan {
    fn end_ns(&self, k: u64) -> i64 {
        (k as i64 + 1) * self.window_ns
    }
}

fn sleep_until(t_ns: i64) {
    let now = realtime_ns();
    if t_ns > now {
        std::thread::sleep(Duration::from_nanos((t_ns - now) as u64));
    }
}

#[derive(Default)]
struct LeaderLog {
    fits_received: u64,
    drain_ms: Vec<f64>,
    solve_ms: Vec<f64>,
    solve_tick_ms: Vec<f64>,
    results_sent: u64,
    result_after_end_ms: Vec<f64>,
    socket_drops: u64,
    cpu_s: f64,
}

/// The agent driver's loop for the leader: a tick every 100 ms drains the
/// socket into the node, then runs its timers (the solve at +0.4 s of 1 s
/// windows), sending what it asks.
fn leader_loop(
    sock: UdpSocket,
    members: Vec<Member>,
    settings: Settings,
    plan: &Plan,
    done: mpsc::Receiver<()>,
) -> anyhow::Result<LeaderLog> {
    sock.set_nonblocking(true)?;
    let me = members[0].clone();
    let mut node = Node::new(NodeConfig {
        me: me.clone(),
        settings,
        key: None,
        exchange: Exchange::Relay,
        nonce_base: 1 << 40,
        work_clock: clockmesh_core::node::no_work_clock,
    });
    let local = |plan: &Plan| plan.truth.local_at(0, realtime_ns());
    let _ = node
        .handle_members(members, LocalNs(local(plan)))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    node.handle_leader(Some(me.name.clone()));
    let mut log = LeaderLog::default();
    let cpu0 = metrics::thread_cpu_s();
    let received0 = node.counters().edge_fits_received;
    let mut buf = [0u8; 2048];
    let tick_ns = clockmesh_core::node::TICK.0;
    let stop = plan.end_ns(plan.last) + plan.window_ns;
    let mut next = (realtime_ns() / tick_ns + 1) * tick_ns;
    while realtime_ns() < stop && done.try_recv().is_err() {
        sleep_until(next);
        next += tick_ns;
        let t = Instant::now();
        loop {
            let (len, from) = match sock.recv_from(&mut buf) {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            };
            let actions = node.handle_datagram(&buf[..len], Some(from), &[], LocalNs(local(plan)));
            send_all(&sock, &mut node, actions, plan, &mut log);
        }
        log.drain_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let solves = node.timings().solves;
        let t = Instant::now();
        let actions = node.handle_tick(LocalNs(local(plan)));
        let solve_ms = t.elapsed().as_secs_f64() * 1e3;
        send_all(&sock, &mut node, actions, plan, &mut log);
        if node.timings().solves != solves {
            log.solve_ms.push(solve_ms);
            log.solve_tick_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    log.fits_received = node.counters().edge_fits_received - received0;
    // Read while the socket is still open (closed, it leaves the table).
    if let std::net::SocketAddr::V4(a) = sock.local_addr()? {
        log.socket_drops = metrics::udp_socket_drops(a)?;
    }
    log.cpu_s = metrics::thread_cpu_s() - cpu0;
    Ok(log)
}

fn send_all(
    sock: &UdpSocket,
    node: &mut Node,
    actions: Vec<Action>,
    plan: &Plan,
    log: &mut LeaderLog,
) {
    for a in actions {
        if let Action::Send { to, datagram, sent } = a {
            let result = sent == Sent::Result;
            if sock.send_to(&datagram, to).is_ok() {
                node.count_sent(sent);
                if result {
                    log.results_sent += 1;
                    let now = plan.truth.local_at(0, realtime_ns());
                    let end = now.div_euclid(plan.window_ns) * plan.window_ns;
                    log.result_after_end_ms.push((now - end) as f64 / 1e6);
                }
            }
        }
    }
}

#[derive(Default)]
struct SenderLog {
    fits: u64,
    fit_bytes: u64,
    send_errors: u64,
    burst_ms: Vec<f64>,
    results: u64,
    scored: u64,
    missed: u64,
    errors_ns: Vec<f64>,
    covered: u64,
    cpu_s: f64,
}

/// Every member's fits at the fit phase (+0.3 s), one datagram per fit as
/// the node sends them; at +0.95 s every member's socket is read for its
/// result.
fn senders_loop(
    socks: &[UdpSocket],
    leader: SocketAddr,
    plan: &Plan,
    warmup: u64,
) -> anyhow::Result<SenderLog> {
    let mut log = SenderLog::default();
    let mut rng = Rng::new(0x5E4D);
    let cpu0 = metrics::thread_cpu_s();
    let leader_id = plan.ids[0];
    let fit_at = plan.window_ns / 100 * 30;
    let read_at = plan.window_ns / 100 * 95;
    // Snapshots made before the burst: the harness's fit generation is
    // not part of what the leader receives.
    for k in plan.first..=plan.last {
        let datagrams: Vec<(usize, Vec<u8>)> = (0..socks.len())
            .flat_map(|i| {
                let s = plan
                    .truth
                    .snapshot(i, k, plan.window_ns, &plan.ids, &plan.names, &mut rng);
                s.edges
                    .into_iter()
                    .enumerate()
                    .map(move |(j, fit)| (i, fit_datagram(&fit, leader_id, k, j)))
                    .collect::<Vec<_>>()
            })
            .collect();
        sleep_until(plan.end_ns(k) + fit_at);
        let t = Instant::now();
        for (i, d) in &datagrams {
            log.fits += 1;
            log.fit_bytes += d.len() as u64;
            if socks[*i].send_to(d, leader).is_err() {
                log.send_errors += 1;
            }
        }
        log.burst_ms.push(t.elapsed().as_secs_f64() * 1e3);
        sleep_until(plan.end_ns(k) + read_at);
        read_results(socks, plan, k, k >= plan.first + warmup, &mut log);
    }
    log.cpu_s = metrics::thread_cpu_s() - cpu0;
    Ok(log)
}

fn fit_datagram(fit: &pb::EdgeFit, leader: u32, k: u64, j: usize) -> Vec<u8> {
    let header = ProbeHeader {
        kind: kind::EDGE_FIT,
        ..ProbeHeader::probe(fit.from_id, leader, k * 64 + j as u64, 0, 0)
    };
    Message::EdgeFit {
        header,
        payload: fit.encode_to_vec(),
    }
    .encode(None)
}

/// Each member's socket holds at most this window's result (and the
/// leader's handshakes, for its probe peers).
fn read_results(socks: &[UdpSocket], plan: &Plan, k: u64, scored: bool, log: &mut SenderLog) {
    let mut buf = [0u8; 2048];
    for (i, s) in socks.iter().enumerate().skip(1) {
        let mut got = None;
        while let Ok((len, _)) = s.recv_from(&mut buf) {
            if let Ok(Message::Result { payload, .. }) = wire::parse(&buf[..len], None)
                && let Ok(r) = pb::NodeOffset::decode(payload.as_slice())
            {
                log.results += 1;
                got = Some(r);
            }
        }
        if !scored {
            continue;
        }
        log.scored += 1;
        match got.filter(|r| r.window == k) {
            Some(r) => {
                let (err, covered) = plan.truth.score(i, 0, &r);
                log.errors_ns.push(err);
                log.covered += u64::from(covered);
            }
            None => log.missed += 1,
        }
    }
}

fn set_rcvbuf_force(sock: &UdpSocket, bytes: usize) -> anyhow::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    setsockopt(sock, sockopt::RcvBufForce, &bytes).context("SO_RCVBUFFORCE")
}

/// The socket's receive buffer, bytes (what the kernel reports: twice
/// the size asked for, its bookkeeping share included).
fn rcvbuf(sock: &UdpSocket) -> anyhow::Result<usize> {
    use nix::sys::socket::{getsockopt, sockopt};
    getsockopt(sock, sockopt::RcvBuf).context("SO_RCVBUF")
}
