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
    codec,
    node::{Action, Exchange, LocalNs, Member, Node, NodeConfig},
    publication::ResultStatus,
    result::NodeResult,
    settings::Settings,
    wire::{self, Message, Sent},
};
use clockmesh_offsets::ClockStatus;
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
    /// The leader killed at the end of this window (after the first);
    /// member 1, a seat holder following its results as a member, leads
    /// `takeover_s` later (its etcd lease, then a refresh: the etcd run
    /// measures it) and continues the timeline from its own last result.
    pub kill_leader_at: Option<u64>,
    pub takeover_s: u64,
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
    /// Every member's reader (members 2..N: the newest result it holds,
    /// aged by its drift and bound growth, by the offsets readers' own
    /// rule), checked once a window against the first leader's timeline.
    pub readers: ReaderReport,
}

/// What the members' readers answered, checked once a window.
#[derive(Debug, Default, Serialize)]
pub struct ReaderReport {
    pub checks: u64,
    /// Checks that got an answer (not stale, not unknown), share.
    pub available: f64,
    /// Answers within their bound of the first leader's timeline, share.
    pub coverage: f64,
    pub abs_error_ns: Quantiles,
    pub bound_ns: Quantiles,
    /// Checks in holdover (the window's result missing), share.
    pub holdover: f64,
    /// With the leader killed: the successor's first result, s after the
    /// kill, and the results it sent.
    pub successor_first_result_s: Option<f64>,
    pub successor_results: u64,
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
    let socks = member_sockets(cfg.members, port)?;
    let first = (realtime_ns() / window_ns + 2) as u64;
    let last = first + cfg.windows - 1;
    let settings = Settings {
        probe_window: clockmesh_core::time::Nanos::from_unsigned(cfg.window_s, 1_000_000_000),
        degree: cfg.degree,
        ..Settings::default()
    };
    let kill_end_ns = cfg
        .kill_leader_at
        .map(|k| (first + k + 1) as i64 * window_ns);
    let plan = Plan {
        first,
        last,
        window_ns,
        truth: truth.clone(),
        ids,
        names,
        settings,
        takeover_ns: kill_end_ns.map(|t| t + cfg.takeover_s as i64 * 1_000_000_000),
    };
    let leader_addr = SocketAddrV4::new(member_ip(0), port);
    let drops0 = metrics::udp_socket_drops(leader_addr)?;
    let snmp0 = metrics::udp_snmp()?;
    let (done_tx, done_rx) = mpsc::channel();
    let leader = {
        let plan = plan.clone();
        let node = node_of(&all, 0, 0, &plan)?;
        let until = kill_end_ns.unwrap_or(plan.end_ns(plan.last) + plan.window_ns);
        // The socket outlives a killed leader's loop: the members' fits to
        // it vanish as on a network (a closed loopback port would answer
        // each with an ICMP error, seconds of the senders' time at 5,000).
        std::thread::Builder::new()
            .name("relay-leader".into())
            .spawn(move || {
                let log = node_loop(&leader_sock, node, &plan, (until, None), done_rx);
                (log, leader_sock)
            })?
    };
    let successor = spawn_successor(&plan, &all, &socks)?;
    let leaders = [leader_addr.into(), all[1].probe_addr()];
    let senders = senders_loop(&socks, leaders, &plan, cfg.warmup)?;
    let _ = done_tx.send(());
    let (leader, _closed_now) = leader
        .join()
        .map_err(|_| anyhow::anyhow!("the relay leader panicked"))?;
    let leader = leader?;
    let successor = match successor {
        Some((t, _keep)) => Some(
            t.join()
                .map_err(|_| anyhow::anyhow!("the relay successor panicked"))??,
        ),
        None => None,
    };
    let drops = leader.socket_drops.saturating_sub(drops0);
    let snmp1 = metrics::udp_snmp()?;
    let w = cfg.windows as f64;
    let wall = (cfg.windows as f64) * cfg.window_s as f64;
    let readers = senders.readers.report(successor.as_ref(), kill_end_ns);
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
        readers,
    })
}

/// Every member's socket, bound to its own address and the leader's port
/// (the leader's own fits leave from a second socket on its address).
fn member_sockets(n: usize, port: u16) -> anyhow::Result<Vec<UdpSocket>> {
    (0..n)
        .map(|i| {
            let port = if i == 0 { 0 } else { port };
            let s = UdpSocket::bind(SocketAddrV4::new(member_ip(i), port))?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .collect::<std::io::Result<_>>()
        .context("binding the members' loopback sockets (127.78.x.y)")
}

/// With the leader to be killed: member 1's node on its socket, a member
/// until it leads at the takeover (and the sender that keeps it running).
#[allow(clippy::type_complexity)]
fn spawn_successor(
    plan: &Plan,
    all: &[Member],
    socks: &[UdpSocket],
) -> anyhow::Result<
    Option<(
        std::thread::JoinHandle<anyhow::Result<LeaderLog>>,
        mpsc::Sender<()>,
    )>,
> {
    let Some(at) = plan.takeover_ns else {
        return Ok(None);
    };
    let plan = plan.clone();
    let sock = socks[1].try_clone()?;
    clockmesh::runtime::raise_receive_buffer(&sock);
    let node = node_of(all, 1, 0, &plan)?;
    let until = plan.end_ns(plan.last) + plan.window_ns;
    let (keep, never) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("relay-successor".into())
        .spawn(move || node_loop(&sock, node, &plan, (until, Some(at)), never))?;
    Ok(Some((thread, keep)))
}

/// Member `i`'s node, following `leader`'s results (itself: it leads).
fn node_of(all: &[Member], i: usize, leader: usize, plan: &Plan) -> anyhow::Result<Node> {
    let mut node = Node::new(NodeConfig {
        me: all[i].clone(),
        settings: plan.settings.clone(),
        key: None,
        exchange: Exchange::Relay,
        nonce_base: (i as u64 + 1) << 40,
        work_clock: clockmesh_core::node::no_work_clock,
    });
    let now = LocalNs(plan.truth.local_at(i, realtime_ns()));
    let _ = node
        .handle_members(all.to_vec(), now)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    node.handle_leader(Some(all[leader].name.clone()));
    Ok(node)
}

#[derive(Clone)]
struct Plan {
    first: u64,
    last: u64,
    window_ns: i64,
    truth: Arc<Truth>,
    ids: Arc<Vec<u32>>,
    names: Arc<Vec<String>>,
    settings: Settings,
    /// When member 1 leads (the leader killed), realtime ns.
    takeover_ns: Option<i64>,
}

impl Plan {
    fn end_ns(&self, k: u64) -> i64 {
        (k as i64 + 1) * self.window_ns
    }

    /// Who leads when window `k`'s fits are sent: 0, or its successor 1
    /// once it has taken over (members learn it from their places).
    fn leader_at(&self, k: u64, fit_at: i64) -> usize {
        usize::from(
            self.takeover_ns
                .is_some_and(|t| self.end_ns(k) + fit_at >= t),
        )
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
    /// When it sent its first result (realtime ns).
    first_result_ns: Option<i64>,
}

/// The agent driver's loop for a node: a tick every 100 ms drains the
/// socket into the node, then runs its timers (as leader, the solve at
/// +0.4 s of 1 s windows), sending what it asks; until `until_ns`
/// (realtime), leading from `lead_at_ns` if given (a successor).
fn node_loop(
    sock: &UdpSocket,
    mut node: Node,
    plan: &Plan,
    (until_ns, lead_at_ns): (i64, Option<i64>),
    done: mpsc::Receiver<()>,
) -> anyhow::Result<LeaderLog> {
    sock.set_nonblocking(true)?;
    let i = plan.names.binary_search(&node.me().name).unwrap_or(0);
    let local = |plan: &Plan| LocalNs(plan.truth.local_at(i, realtime_ns()));
    let mut log = LeaderLog::default();
    let cpu0 = metrics::thread_cpu_s();
    let received0 = node.counters().edge_fits_received;
    let mut buf = [0u8; 2048];
    let tick_ns = clockmesh_core::node::TICK.0;
    let mut next = (realtime_ns() / tick_ns + 1) * tick_ns;
    let mut to_lead = lead_at_ns;
    while realtime_ns() < until_ns && done.try_recv().is_err() {
        sleep_until(next);
        next += tick_ns;
        if to_lead.is_some_and(|at| realtime_ns() >= at) {
            to_lead = None;
            node.handle_leader(Some(node.me().name.clone()));
        }
        let t = Instant::now();
        loop {
            let (len, from) = match sock.recv_from(&mut buf) {
                Ok(x) => x,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => continue,
                Err(e) => return Err(e.into()),
            };
            let actions = node.handle_datagram(&buf[..len], Some(from), &[], local(plan));
            send_all(sock, &mut node, actions, (i, plan), &mut log);
        }
        log.drain_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let solves = node.timings().solves;
        let t = Instant::now();
        let actions = node.handle_tick(local(plan));
        let solve_ms = t.elapsed().as_secs_f64() * 1e3;
        send_all(sock, &mut node, actions, (i, plan), &mut log);
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
    (i, plan): (usize, &Plan),
    log: &mut LeaderLog,
) {
    for a in actions {
        if let Action::Send { to, datagram, sent } = a {
            let result = sent == Sent::Result;
            if sock.send_to(&datagram, to).is_ok() {
                node.count_sent(sent);
                if result {
                    log.results_sent += 1;
                    log.first_result_ns.get_or_insert(realtime_ns());
                    let now = plan.truth.local_at(i, realtime_ns());
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
    readers: Readers,
}

/// Every member's reader: the newest result it holds.
#[derive(Default)]
struct Readers {
    held: Vec<Option<NodeResult>>,
    checks: u64,
    available: u64,
    covered: u64,
    holdover: u64,
    errors_ns: Vec<f64>,
    bounds_ns: Vec<f64>,
}

impl Readers {
    /// Member `i`'s reader asked now, scored against member 0's clock
    /// (the timeline a successor continues).
    fn check(&mut self, i: usize, plan: &Plan) {
        self.checks += 1;
        let Some(r) = self.held.get(i).and_then(Option::as_ref) else {
            return;
        };
        let now = LocalNs(plan.truth.local_at(i, realtime_ns()));
        match ResultStatus::of(r, &plan.settings).state_at(now) {
            ClockStatus::Synchronised => {}
            ClockStatus::Holdover => self.holdover += 1,
            ClockStatus::Stale | ClockStatus::Unknown => return,
        }
        self.available += 1;
        let err = (r.offset_at(now) - plan.truth.offset_vs(i, 0, now.0)).abs();
        let bound = r.bound_at(now);
        self.errors_ns.push(err);
        self.bounds_ns.push(bound);
        self.covered += u64::from(err <= bound);
    }

    fn report(self, successor: Option<&LeaderLog>, kill_ns: Option<i64>) -> ReaderReport {
        let share = |n: u64| n as f64 / self.checks.max(1) as f64;
        ReaderReport {
            checks: self.checks,
            available: share(self.available),
            coverage: self.covered as f64 / self.available.max(1) as f64,
            abs_error_ns: Quantiles::of(self.errors_ns),
            bound_ns: Quantiles::of(self.bounds_ns),
            holdover: share(self.holdover),
            successor_first_result_s: successor
                .and_then(|s| s.first_result_ns)
                .zip(kill_ns)
                .map(|(at, kill)| (at - kill) as f64 / 1e9),
            successor_results: successor.map_or(0, |s| s.results_sent),
        }
    }
}

/// Every member's fits at the fit phase (+0.3 s), one datagram per fit as
/// the node sends them, to whoever leads then; at +0.95 s every member's
/// socket is read for its result, and its reader asked.
fn senders_loop(
    socks: &[UdpSocket],
    leaders: [SocketAddr; 2],
    plan: &Plan,
    warmup: u64,
) -> anyhow::Result<SenderLog> {
    let mut log = SenderLog::default();
    log.readers.held = vec![None; socks.len()];
    let mut rng = Rng::new(0x5E4D);
    let cpu0 = metrics::thread_cpu_s();
    let fit_at = plan.window_ns / 100 * 30;
    let read_at = plan.window_ns / 100 * 95;
    for k in plan.first..=plan.last {
        let leader = plan.leader_at(k, fit_at);
        // Snapshots made before the burst: the harness's fit generation
        // is not part of what the leader receives.
        let datagrams: Vec<(usize, Vec<u8>)> = (0..socks.len())
            .flat_map(|i| {
                let s = plan
                    .truth
                    .snapshot(i, k, plan.window_ns, &plan.ids, &plan.names, &mut rng);
                let to = plan.ids[leader];
                s.edges
                    .into_iter()
                    .enumerate()
                    .map(move |(j, fit)| (i, fit_datagram(&fit, to, k, j)))
                    .collect::<Vec<_>>()
            })
            .collect();
        sleep_until(plan.end_ns(k) + fit_at);
        let t = Instant::now();
        for (i, d) in &datagrams {
            log.fits += 1;
            log.fit_bytes += d.len() as u64;
            if socks[*i].send_to(d, leaders[leader]).is_err() {
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

/// Each member's socket holds at most this window's result (and its
/// peers' handshakes). Member 1's socket is its successor node's when the
/// leader is to be killed: it is read there.
fn read_results(socks: &[UdpSocket], plan: &Plan, k: u64, scored: bool, log: &mut SenderLog) {
    let mut buf = [0u8; 2048];
    let skip = if plan.takeover_ns.is_some() { 2 } else { 1 };
    for (i, s) in socks.iter().enumerate().skip(skip) {
        let mut got = None;
        while let Ok((len, _)) = s.recv_from(&mut buf) {
            if let Ok(Message::Result { payload, .. }) = wire::parse(&buf[..len], None)
                && let Ok(r) = pb::NodeOffset::decode(payload.as_slice())
            {
                log.results += 1;
                if let Ok(held) = codec::decode_result(&payload) {
                    log.readers.held[i] = Some(held);
                }
                got = Some(r);
            }
        }
        if !scored {
            continue;
        }
        log.readers.check(i, plan);
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
