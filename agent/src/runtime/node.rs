//! The agent's state and its event handlers (datagrams, capture events,
//! sender reports, timers).

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use clockmesh_common::{ProbeEvent, kind, point};
use clockmesh_estimator::{Estimator, EstimatorConfig, NodeId, PurityConfig};
use clockmesh_proto::{clockmesh as pb, prost::Message as _};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{
    RuntimeError,
    collector::{Collector, PairKey, Settled, Side},
    http::{self, SharedStatus},
    io_err,
    jsonl::{self, Jsonl},
    peers::{HandshakeConfig, Peers},
    sender::{Sender, SenderConfig, SenderEvent, Target},
    status::Status,
    window_clock::WindowClock,
};
use crate::{
    capture::{
        Capture, CaptureConfig,
        clocks::{self, ClockDomain, ClockMap},
        stamps::{event_stamps, to_realtime},
        timestamping::{self, StampMode, Stamps},
    },
    config::{AgentConfig, InjectedSkew},
    discovery::{Coordination, Discovery, Leadership, Member},
    probe::{
        ProbeHeader,
        graph::ProbeGraph,
        pairs::PairBook,
        wire::{
            self, AuthKey, Hello, KIND_RX_REPORT, Message, ReplayWindow, StampSource, WireError,
            WireStamp,
        },
    },
    publish::{OffsetsWriter, realtime_now_ns},
};

/// The loop runs on this tick only: it drains the ring buffer, the socket
/// and the sender's reports, settles stamps, sends reports and handshakes.
/// Nothing here needs lower latency (every stamp is taken by the kernel), and
/// waking per packet costs far more CPU than the work itself.
const TICK: Duration = Duration::from_millis(50);
/// A pair is settled this long after its first stamp (two ticks).
const SETTLE_NS: i64 = 100_000_000;
/// Bounds on per-packet state (a flood cannot grow memory past these).
const MAX_PENDING_PAIRS: usize = 8192;
const MAX_PENDING_PER_DIRECTION: usize = 4096;
const MAX_REPLAY_SENDERS: usize = 4096;
const MEMBERSHIP_PERIOD: Duration = Duration::from_secs(2);
const STATUS_PERIOD: Duration = Duration::from_secs(1);
/// Software stamps: a pair is pure when its gaps agree within this.
const SOFTWARE_PURITY_NS: i64 = 10_000;
/// The sender sleeps between the packets of a pair; sleeps overshoot, so
/// TX gaps up to twice the nominal spacing are accepted (the gap is measured
/// by the TX stamps; purity compares it with the RX gap).
const MIN_SPACING_ERROR_NS: i64 = 20_000;
const RECV_BUF: usize = 2048;

pub(super) struct Agent<D> {
    pub(super) cfg: AgentConfig,
    pub(super) me: Member,
    pub(super) discovery: D,
    skew: Option<InjectedSkew>,
    key: Option<AuthKey>,
    capture: Capture,
    phc: Option<u32>,
    maps: Vec<ClockMap>,
    sock: std::net::UdpSocket,
    sender: Sender,
    sender_rx: mpsc::UnboundedReceiver<Vec<SenderEvent>>,
    pub(super) peers: Peers,
    pub(super) members: Vec<Member>,
    pub(super) graph: ProbeGraph,
    collector: Collector,
    pub(super) book: PairBook,
    replay: ReplayWindow,
    pub(super) est_cfg: EstimatorConfig,
    pub(super) estimator: Option<Estimator>,
    pub(super) leadership: Leadership,
    pub(super) writer: OffsetsWriter,
    pub(super) jsonl: Jsonl,
    pub(super) status: SharedStatus,
    pub(super) counters: BTreeMap<&'static str, u64>,
    pub(super) dropped: BTreeMap<&'static str, u64>,
    pub(super) windows: WindowClock,
    pub(super) status_extra: Status,
    /// Backends without a shared store exchange fits and results over UDP.
    pub(super) relay: Relay,
    /// GPU clock sampling (`gpu_clock`), its last generation seen, and the
    /// last window for which device lines were written.
    pub(super) gpu: Option<super::gpu::GpuClocks>,
    pub(super) gpu_seen: u64,
    pub(super) device_lines_window: Option<i64>,
    started_at_ns: i64,
}

/// Fits received by the leader and the result received from it.
#[derive(Default)]
pub(super) struct Relay {
    /// Latest fit per directed edge (bounded: edges between members only).
    pub(super) edges: BTreeMap<(NodeId, NodeId), pb::EdgeFit>,
    pub(super) result: Option<pb::NodeOffset>,
}

/// Runs the agent until `shutdown` resolves; then marks the offsets stale,
/// leaves the cluster and detaches the eBPF programs.
pub async fn run<D: Discovery + Coordination>(
    cfg: AgentConfig,
    discovery: D,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RuntimeError> {
    let status: SharedStatus = Arc::new(Mutex::new(Status::default()));
    let listener = http::bind(cfg.metrics_addr.value)
        .await
        .map_err(io_err(format!("metrics_addr {}", cfg.metrics_addr.value)))?;
    tokio::spawn(http::serve(listener, status.clone()));
    if !cfg.enabled.value {
        info!("enabled = false: not probing; serving health only");
        status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last_tick_ns = i64::MAX;
        shutdown.await;
        return Ok(());
    }
    let mut agent = Agent::start(cfg, discovery, status).await?;
    let result = agent.main_loop(shutdown).await;
    agent.stop().await;
    result
}

impl<D: Discovery + Coordination> Agent<D> {
    async fn start(
        cfg: AgentConfig,
        mut discovery: D,
        status: SharedStatus,
    ) -> Result<Self, RuntimeError> {
        let iface = cfg.interface.value.clone();
        let addr = match &cfg.advertise_addr {
            Some(a) => a.value,
            None => super::interface_ipv4(&iface).ok_or(RuntimeError::NoAddress(iface.clone()))?,
        };
        let key = match &cfg.auth_key_file {
            // The DaemonSet mounts an optional Secret: no file, no authentication.
            Some(p) if !p.value.exists() => {
                warn!(path = %p.value.display(), "auth key file absent: probes are NOT authenticated");
                None
            }
            Some(p) => Some(super::load_auth_key(&p.value)?),
            None => None,
        };
        let port = cfg.probe_port.value;
        let std_sock = std::net::UdpSocket::bind(SocketAddr::new(addr, port))
            .map_err(io_err(format!("binding the probe socket {addr}:{port}")))?;
        timestamping::enable_rx(&std_sock, StampMode::Software)
            .map_err(|e| io_err("enabling SO_TIMESTAMPING")(e.into()))?;
        std_sock
            .set_nonblocking(true)
            .map_err(io_err("probe socket"))?;
        let sock = std_sock;
        if !timestamping::wait_for_rx_stamping(Duration::from_secs(2)).unwrap_or(false) {
            warn!("kernel RX timestamps not active after 2 s; early probes may lack them");
        }
        let me = discovery
            .register(&Member {
                name: cfg.node_name.value.clone(),
                id: 0,
                addr,
                probe_port: port,
                capabilities: 0,
            })
            .await?;
        info!(node = %me.name, id = me.id, %addr, port, "registered");
        let capture = Capture::attach(&CaptureConfig {
            local_node: me.id,
            polled: true,
            ..CaptureConfig::new(iface.clone(), port..=port)
        })?;
        let (tx, sender_rx) = mpsc::unbounded_channel();
        let start_ns = realtime_now_ns();
        let sender = Sender::start(
            SenderConfig {
                me: me.id,
                cadence: Duration::from_micros(cfg.probe_cadence_us.value),
                spacing: Duration::from_micros(cfg.packet_spacing_us.value),
                key: key.clone(),
                seq_base: (start_ns / 1_000) as u64,
                stamp_mode: StampMode::Software,
            },
            SocketAddr::new(addr, 0),
            tx,
        )
        .map_err(io_err("starting the probe sender"))?;
        let writer = OffsetsWriter::open(&cfg.offsets_path.value)?;
        if writer.dropped_torn_record() {
            tracing::warn!("offsets record was half-written by a previous writer; dropped it");
        }
        tracing::info!(path = %writer.path().display(), epoch = writer.epoch(), "offsets file opened for publication");
        let jsonl = Jsonl::open(&cfg.output_dir.value, jsonl::DEFAULT_MAX_BYTES).map_err(
            io_err(format!("output_dir {}", cfg.output_dir.value.display())),
        )?;
        let gpu = super::gpu::GpuClocks::start(
            cfg.gpu_clock.value,
            cfg.gpu_devices.value.clone(),
            Duration::from_millis(cfg.snapshot_period_ms.value),
        )
        .map_err(io_err("starting the GPU clock thread"))?;
        let est_cfg = estimator_config(&cfg);
        let window_ns = cfg.probe_window_s.value as i64 * 1_000_000_000;
        let mut agent = Agent {
            skew: cfg.inject_skew.as_ref().map(|s| s.value),
            phc: clocks::phc_index(&iface),
            maps: Vec::new(),
            key,
            capture,
            sock,
            sender,
            sender_rx,
            peers: Peers::new(HandshakeConfig::default(), (start_ns / 1_000) as u64),
            members: Vec::new(),
            graph: ProbeGraph::build(&[me.id], cfg.degree.value),
            collector: Collector::new(SETTLE_NS, MAX_PENDING_PAIRS),
            book: PairBook::new(MAX_PENDING_PER_DIRECTION),
            replay: ReplayWindow::new(MAX_REPLAY_SENDERS),
            est_cfg,
            estimator: None,
            leadership: Leadership::default(),
            writer,
            jsonl,
            status,
            counters: BTreeMap::new(),
            dropped: BTreeMap::new(),
            windows: WindowClock::new(window_ns),
            status_extra: Status::default(),
            relay: Relay::default(),
            gpu,
            gpu_seen: 0,
            device_lines_window: None,
            started_at_ns: start_ns,
            me,
            discovery,
            cfg,
        };
        agent.measure_clock_maps();
        agent.refresh_membership().await?;
        Ok(agent)
    }

    async fn main_loop(&mut self, shutdown: impl Future<Output = ()>) -> Result<(), RuntimeError> {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut events: Vec<ProbeEvent> = Vec::new();
        let (mut next_membership, mut next_status) = (Instant::now(), Instant::now());
        loop {
            tokio::select! {
                _ = &mut shutdown => return Ok(()),
                _ = tick.tick() => {}
            }
            self.capture.poll_events(&mut events);
            self.on_capture_events(&events);
            events.clear();
            self.drain_socket();
            while let Ok(batch) = self.sender_rx.try_recv() {
                batch.into_iter().for_each(|e| self.on_sender_event(e));
            }
            self.on_tick();
            self.poll_gpu();
            let now = Instant::now();
            if now >= next_membership {
                next_membership = now + MEMBERSHIP_PERIOD;
                self.refresh_membership().await?;
            }
            self.run_window_phases().await;
            if now >= next_status {
                next_status = now + STATUS_PERIOD;
                self.publish_status();
            }
        }
    }

    async fn stop(&mut self) {
        self.writer.mark_stale();
        if let Err(e) = self.discovery.leave().await {
            warn!("leaving the cluster: {e}");
        }
        info!(node = %self.me.name, "stopped; offsets marked stale");
    }

    /// Local clock: REALTIME plus the injected skew (tests, demo).
    pub(super) fn local_now(&self) -> i64 {
        self.skewed(realtime_now_ns())
    }

    fn skewed(&self, t: i64) -> i64 {
        self.skew.map_or(t, |s| t.saturating_add(s.at(t)))
    }

    pub(super) fn count(&mut self, name: &'static str) {
        *self.counters.entry(name).or_default() += 1;
    }

    fn drop_msg(&mut self, reason: &'static str) {
        *self.dropped.entry(reason).or_default() += 1;
    }

    pub(super) fn measure_clock_maps(&mut self) {
        let mut maps = Vec::new();
        if let Some(m) = clocks::measure_monotonic_to_realtime(9) {
            maps.push(m);
        }
        if let Some(i) = self.phc {
            match clocks::measure_phc_to_realtime(i) {
                Ok(m) => maps.push(m),
                Err(e) => debug!(phc = i, "PHC map: {e}"),
            }
        }
        self.maps = maps;
    }

    // ---- membership and peers ----

    pub(super) async fn refresh_membership(&mut self) -> Result<(), RuntimeError> {
        match self.discovery.members().await {
            Ok(members) if members != self.members => self.apply_members(members)?,
            Ok(_) => {}
            Err(e) => {
                self.count("discovery_errors");
                warn!("membership refresh failed (keeping the last graph): {e}");
            }
        }
        match self.discovery.leadership().await {
            Ok(l) => {
                if l != self.leadership {
                    info!(leader = ?l.leader, is_me = l.is_me, "leadership");
                }
                self.leadership = l;
            }
            Err(e) => {
                self.count("discovery_errors");
                warn!("leadership query failed: {e}");
            }
        }
        Ok(())
    }

    fn apply_members(&mut self, members: Vec<Member>) -> Result<(), RuntimeError> {
        if !members.iter().any(|m| m.id == self.me.id) {
            return Err(RuntimeError::Deregistered(self.me.name.clone()));
        }
        let ids: Vec<NodeId> = members.iter().map(|m| m.id).collect();
        self.graph = ProbeGraph::build(&ids, self.cfg.degree.value);
        let me = self.me.id;
        let mut neighbours: Vec<NodeId> = self.graph.out_neighbours(me).to_vec();
        neighbours.extend_from_slice(self.graph.in_neighbours(me));
        neighbours.sort_unstable();
        neighbours.dedup();
        let wanted: Vec<(NodeId, String, SocketAddr)> = members
            .iter()
            .filter(|m| neighbours.contains(&m.id))
            .map(|m| (m.id, m.name.clone(), m.probe_addr()))
            .collect();
        let gone = self.peers.set(&wanted, self.local_now());
        for id in gone {
            self.book.forget(id);
        }
        info!(
            members = members.len(),
            peers = wanted.len(),
            "probe graph updated"
        );
        self.members = members;
        self.sync_sender_targets();
        Ok(())
    }

    fn sync_sender_targets(&self) {
        let targets = self
            .peers
            .ready()
            .map(|p| Target {
                id: p.id,
                addr: p.addr,
            })
            .collect();
        self.sender.set_targets(targets);
    }

    pub(super) fn member(&self, id: NodeId) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }

    // ---- timers ----

    fn on_tick(&mut self) {
        let now = self.local_now();
        for s in self.collector.settle(now) {
            self.on_settled(s);
        }
        let was_ready = self.peers.ready().count();
        for h in self.peers.due_hellos(now) {
            let hello = Message::Hello {
                header: control_header(kind::HELLO, self.me.id, h.id, h.nonce),
                hello: self.my_hello(),
            };
            self.send(&hello, h.addr, "hellos_sent");
        }
        if self.peers.ready().count() != was_ready {
            self.sync_sender_targets(); // a silent peer went back to the handshake
        }
        self.status_extra.last_tick_ns = realtime_now_ns();
    }

    fn my_hello(&self) -> Hello {
        Hello {
            max_version: clockmesh_common::PROBE_VERSION,
            capabilities: 0,
            probe_port: self.cfg.probe_port.value,
        }
    }

    fn send(&mut self, msg: &Message, to: SocketAddr, counter: &'static str) {
        let bytes = msg.encode(self.key.as_ref());
        match self.sock.send_to(&bytes, to) {
            Ok(_) => self.count(counter),
            Err(e) => {
                self.count("send_errors");
                debug!(%to, "send failed: {e}");
            }
        }
    }

    // ---- timestamps ----

    fn on_settled(&mut self, s: Settled) {
        let PairKey { from, to, seq } = s.key;
        let me = self.me.id;
        for st in s.stamps {
            self.count(stamp_counter(s.side, st.source));
        }
        let (peer, counter) = match s.side {
            Side::Tx => {
                for i in 0..2 {
                    self.book.tx(me, to, seq, i, s.stamps[usize::from(i)]);
                }
                (to, "follow_ups_sent")
            }
            Side::Rx => {
                for i in 0..2 {
                    self.book.rx(from, me, seq, i, s.stamps[usize::from(i)]);
                }
                (from, "rx_reports_sent")
            }
        };
        let Some(addr) = self.member(peer).map(Member::probe_addr) else {
            return;
        };
        let msg = match s.side {
            Side::Tx => Message::FollowUp {
                header: control_header(kind::FOLLOW_UP, me, peer, seq),
                tx: s.stamps,
            },
            Side::Rx => Message::RxReport {
                header: control_header(KIND_RX_REPORT, me, peer, seq),
                rx: s.stamps,
            },
        };
        self.send(&msg, addr, counter);
    }

    /// A local stamp in REALTIME (plus the injected skew) with its source.
    fn local_stamp(&self, domain_ns: (ClockDomain, i64), source: StampSource) -> Option<WireStamp> {
        let (domain, ns) = domain_ns;
        let (rt, bound) = to_realtime(clocks_stamp(domain, ns), &self.maps)?;
        Some(WireStamp {
            realtime_ns: self.skewed(rt),
            bound_ns: u32::try_from(bound).unwrap_or(u32::MAX),
            source,
        })
    }

    fn on_capture_events(&mut self, events: &[ProbeEvent]) {
        let now = self.local_now();
        let me = self.me.id;
        for ev in events.iter().filter(|e| e.kind == kind::PROBE) {
            let (side, key) = if clockmesh_common::point_is_tx(ev.point) && ev.sender == me {
                (
                    Side::Tx,
                    PairKey {
                        from: me,
                        to: ev.receiver,
                        seq: ev.seq,
                    },
                )
            } else if !clockmesh_common::point_is_tx(ev.point) && ev.receiver == me {
                (
                    Side::Rx,
                    PairKey {
                        from: ev.sender,
                        to: me,
                        seq: ev.seq,
                    },
                )
            } else {
                continue;
            };
            self.count("ebpf_events");
            for st in event_stamps(ev, self.phc) {
                let source = match (st.domain, ev.point) {
                    (ClockDomain::Realtime, _) => StampSource::Kernel,
                    (ClockDomain::Phc(_), _) => StampSource::Hardware,
                    (_, point::TP_XMIT | point::TP_RECEIVE) => StampSource::Tracepoint,
                    (_, point::TC_EGRESS | point::TC_INGRESS) => StampSource::Tc,
                    _ => continue, // completion-time ktime: not a wire time
                };
                if let Some(w) = self.local_stamp((st.domain, st.ns), source) {
                    self.collector.add(side, key, ev.pair_index, w, now);
                }
            }
        }
    }

    fn socket_stamps(&self, stamps: Stamps) -> Vec<WireStamp> {
        let mut out = Vec::new();
        if stamps.software_ns != 0 {
            out.extend(self.local_stamp(
                (ClockDomain::Realtime, stamps.software_ns),
                StampSource::Kernel,
            ));
        }
        if let (Some(i), true) = (self.phc, stamps.hardware_ns != 0) {
            out.extend(self.local_stamp(
                (ClockDomain::Phc(i), stamps.hardware_ns),
                StampSource::Hardware,
            ));
        }
        out
    }

    fn on_sender_event(&mut self, e: SenderEvent) {
        let now = self.local_now();
        match e {
            SenderEvent::Sent { to, seq, .. } => {
                self.count("pairs_sent");
                let key = PairKey {
                    from: self.me.id,
                    to,
                    seq,
                };
                self.collector.confirm(Side::Tx, key, now);
            }
            SenderEvent::TxStamp {
                to,
                seq,
                index,
                stamps,
            } => {
                let key = PairKey {
                    from: self.me.id,
                    to,
                    seq,
                };
                for w in self.socket_stamps(stamps) {
                    self.collector.add(Side::Tx, key, index, w, now);
                }
            }
        }
    }

    // ---- datagrams ----

    /// Receives every queued datagram (non-blocking).
    fn drain_socket(&mut self) {
        let mut buf = [0u8; RECV_BUF];
        loop {
            match timestamping::recv_stamped(&self.sock, &mut buf) {
                Ok(d) => {
                    let len = d.len.min(buf.len());
                    self.on_datagram(&buf[..len], d.from, d.stamps);
                }
                Err(nix::errno::Errno::EAGAIN) => return,
                Err(e) => {
                    debug!("recv: {e}");
                    return;
                }
            }
        }
    }

    fn on_datagram(&mut self, bytes: &[u8], from: Option<SocketAddr>, stamps: Stamps) {
        let msg = match wire::parse(bytes, self.key.as_ref()) {
            Ok(m) => m,
            Err(e) => return self.drop_msg(wire_drop_reason(&e)),
        };
        let h = *msg.header();
        if h.receiver != self.me.id {
            return self.drop_msg("wrong_receiver");
        }
        let from_ip: Option<IpAddr> = from.map(|a| a.ip());
        match self.member(h.sender) {
            Some(m) if Some(m.addr) == from_ip => {}
            Some(_) => return self.drop_msg("source_mismatch"),
            None => return self.drop_msg("unknown_sender"),
        }
        // Last, so messages from elsewhere cannot move a member's window.
        if self.key.is_some() && !self.replay.accept(&h) {
            return self.drop_msg("replayed");
        }
        let now = self.local_now();
        self.peers.heard(h.sender, now);
        match msg {
            Message::Probe { header } => self.on_probe(header, stamps, now),
            Message::FollowUp { header, tx } => {
                self.count("follow_ups_received");
                for i in 0..2u8 {
                    self.book
                        .tx(header.sender, self.me.id, header.seq, i, tx[usize::from(i)]);
                }
            }
            Message::RxReport { header, rx } => {
                self.count("rx_reports_received");
                for i in 0..2u8 {
                    self.book
                        .rx(self.me.id, header.sender, header.seq, i, rx[usize::from(i)]);
                }
            }
            Message::Hello { header, .. } => self.on_hello(header),
            Message::EdgeFit { header, payload } => self.on_edge_fit(header, &payload),
            Message::Result { header, payload } => self.on_result(header, &payload),
            Message::HelloAck { header, hello } => {
                let version = hello.max_version.min(clockmesh_common::PROBE_VERSION);
                if self
                    .peers
                    .acked(header.sender, header.seq, version, hello.capabilities, now)
                {
                    info!(peer = header.sender, version, "peer ready");
                    self.sync_sender_targets();
                }
            }
        }
    }

    fn on_probe(&mut self, header: ProbeHeader, stamps: Stamps, now: i64) {
        self.count("probes_received");
        let key = PairKey {
            from: header.sender,
            to: self.me.id,
            seq: header.seq,
        };
        self.collector.confirm(Side::Rx, key, now);
        for w in self.socket_stamps(stamps) {
            self.collector.add(Side::Rx, key, header.pair_index, w, now);
        }
    }

    /// A member's edge fit, for the solve (we are, or were, the leader).
    fn on_edge_fit(&mut self, header: ProbeHeader, payload: &[u8]) {
        let Ok(fit) = pb::EdgeFit::decode(payload) else {
            return self.drop_msg("malformed");
        };
        // A node reports only its own out-edges, between members.
        if fit.from_id != header.sender || self.member(fit.to_id).is_none() {
            return self.drop_msg("bad_record");
        }
        self.count("edge_fits_received");
        self.relay.edges.insert((fit.from_id, fit.to_id), fit);
    }

    /// Our result from the leader.
    fn on_result(&mut self, header: ProbeHeader, payload: &[u8]) {
        let Ok(r) = pb::NodeOffset::decode(payload) else {
            return self.drop_msg("malformed");
        };
        let from_leader = self.reference() == Some(header.sender);
        if !from_leader || r.node_id != self.me.id || r.reference_id != header.sender {
            return self.drop_msg("bad_record");
        }
        self.count("results_received");
        self.relay.result = Some(r);
    }

    /// Sends a protobuf record (edge fit or result) to member `to`.
    pub(super) fn send_record(&mut self, kind: u8, to: NodeId, seq: u64, payload: Vec<u8>) {
        let Some(addr) = self.member(to).map(Member::probe_addr) else {
            return;
        };
        let header = control_header(kind, self.me.id, to, seq);
        let msg = match kind {
            wire::KIND_EDGE_FIT => Message::EdgeFit { header, payload },
            _ => Message::Result { header, payload },
        };
        let counter = if kind == wire::KIND_EDGE_FIT {
            "edge_fits_sent"
        } else {
            "results_sent"
        };
        self.send(&msg, addr, counter);
    }

    fn on_hello(&mut self, header: ProbeHeader) {
        self.count("hellos_received");
        let Some(addr) = self.member(header.sender).map(Member::probe_addr) else {
            return;
        };
        let ack = Message::HelloAck {
            header: control_header(kind::HELLO_ACK, self.me.id, header.sender, header.seq),
            hello: self.my_hello(),
        };
        self.send(&ack, addr, "hello_acks_sent");
    }

    // ---- status ----

    pub(super) fn publish_status(&mut self) {
        let mut s = self.status_extra.clone();
        s.node = self.me.name.clone();
        s.node_id = self.me.id;
        s.addr = self.me.probe_addr().to_string();
        s.version = env!("CARGO_PKG_VERSION").into();
        s.started_at_ns = self.started_at_ns;
        s.ready = true;
        s.leader = self.leadership.leader.clone();
        s.is_leader = self.leadership.is_me;
        s.window = self.windows.last_fitted();
        s.peers = self.peer_status();
        let mut counters: BTreeMap<String, u64> = self
            .counters
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        counters.insert(
            "probes_sent".into(),
            2 * self
                .sender
                .stats
                .pairs_sent
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        counters.insert(
            "probe_send_errors".into(),
            self.sender
                .stats
                .send_errors
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        counters.insert(
            "unmatched_tx_reports".into(),
            self.sender
                .stats
                .unmatched_tx_reports
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        let c = self.collector.stats();
        counters.insert("pairs_settled".into(), c.settled);
        let b = self.book.stats();
        counters.insert("probes_completed".into(), b.completed);
        counters.insert("probes_evicted_incomplete".into(), b.evicted_incomplete);
        s.counters = counters;
        s.dropped = self
            .dropped
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        s.dropped.insert("unconfirmed_rx".into(), c.unconfirmed);
        s.dropped.insert("evicted_pending".into(), c.evicted);
        if let Ok(e) = self.capture.counters() {
            s.ebpf = [
                ("emitted", e.emitted),
                ("ringbuf_full", e.ringbuf_full),
                ("skipped", e.skipped),
                ("malformed", e.malformed),
                ("read_failed", e.read_failed),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        }
        s.config = config_summary(&self.cfg);
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    fn peer_status(&self) -> Vec<super::status::PeerStatus> {
        let now = self.local_now();
        let out_edges = self.graph.out_neighbours(self.me.id);
        self.peers
            .all()
            .map(|p| super::status::PeerStatus {
                id: p.id,
                name: p.name.clone(),
                addr: p.addr.to_string(),
                state: p.state.as_str().to_owned(),
                out_edge: out_edges.contains(&p.id),
                hello_attempts: p.attempts,
                last_heard_ms: u64::try_from((now - p.last_heard_ns) / 1_000_000).ok(),
                edge: self.windows.edge_status(p.id),
            })
            .collect()
    }
}

fn clocks_stamp(domain: ClockDomain, ns: i64) -> crate::capture::stamps::Stamp {
    crate::capture::stamps::Stamp { domain, ns }
}

/// Header of a follow-up, RX report or handshake message.
fn control_header(k: u8, sender: NodeId, receiver: NodeId, seq: u64) -> ProbeHeader {
    ProbeHeader {
        kind: k,
        ..ProbeHeader::probe(sender, receiver, seq, 0, 0)
    }
}

/// Which stamp each settled packet got, by side and source (status, metrics).
fn stamp_counter(side: Side, source: StampSource) -> &'static str {
    match (side, source) {
        (Side::Tx, StampSource::Hardware) => "tx_stamps_hardware",
        (Side::Tx, StampSource::Kernel) => "tx_stamps_kernel",
        (Side::Tx, StampSource::Tracepoint) => "tx_stamps_tracepoint",
        (Side::Tx, StampSource::Tc) => "tx_stamps_tc",
        (Side::Tx, StampSource::Missing) => "tx_stamps_missing",
        (Side::Rx, StampSource::Hardware) => "rx_stamps_hardware",
        (Side::Rx, StampSource::Kernel) => "rx_stamps_kernel",
        (Side::Rx, StampSource::Tracepoint) => "rx_stamps_tracepoint",
        (Side::Rx, StampSource::Tc) => "rx_stamps_tc",
        (Side::Rx, StampSource::Missing) => "rx_stamps_missing",
    }
}

fn wire_drop_reason(e: &WireError) -> &'static str {
    match e {
        WireError::Unauthenticated => "unauthenticated",
        WireError::BadTag => "bad_tag",
        _ => "malformed",
    }
}

fn estimator_config(cfg: &AgentConfig) -> EstimatorConfig {
    let spacing_ns = cfg.packet_spacing_us.value as i64 * 1_000;
    let window_ns = cfg.probe_window_s.value as i64 * 1_000_000_000;
    EstimatorConfig {
        purity: PurityConfig {
            spacing_ns,
            tolerance_ns: SOFTWARE_PURITY_NS,
            max_spacing_error_ns: spacing_ns.max(MIN_SPACING_ERROR_NS),
            ..PurityConfig::default()
        },
        // Results stay usable for a few missed windows, never less than 10 s.
        max_age_ns: (3 * window_ns).max(10_000_000_000),
        ..EstimatorConfig::default()
    }
}

fn config_summary(cfg: &AgentConfig) -> BTreeMap<String, String> {
    let v = serde_json::to_value(cfg).unwrap_or_default();
    let mut out = BTreeMap::new();
    if let serde_json::Value::Object(map) = v {
        for (k, e) in map {
            if let Some(val) = e.get("value") {
                let text = val.as_str().map_or_else(|| val.to_string(), str::to_owned);
                out.insert(k, text);
            }
        }
    }
    out
}
