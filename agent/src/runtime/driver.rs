//! The driver: runs one [`clockmesh_core::node::Node`] on tokio. It owns
//! the I/O — the probe socket, the eBPF capture, the sender thread, the
//! membership backend and its store, the offsets file, the JSONL history,
//! `/status` — feeds the node what happens and carries out its actions.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use clockmesh_common::{ProbeEvent, kind};
use clockmesh_core::{
    codec,
    fits::WindowFits,
    node::{Action, LocalNs, Membership, Node, NodeConfig, TICK, WindowIndex},
    publication::{Publication, ResultStatus},
    result::NodeResult,
    tally::StampTally,
    time::Nanos,
};
use serde::Serialize;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{
    RuntimeError,
    collector::{PairKey, Side},
    http::{self, SharedStatus},
    io_err,
    jsonl::{self, Jsonl},
    sender::{Sender, SenderConfig, SenderEvent},
    status::{AgentCounters, AgentDrops, IoCounters, Status, UpdateRms},
};
use crate::{
    capture::{
        Capture, CaptureConfig,
        clocks::{self, ClockDomain, ClockMap},
        stamps::{Stamp, event_stamps, stamp_source, to_realtime},
        timestamping::{self, StampMode, Stamps},
    },
    config::{AgentConfig, InjectedSkew, TracepointStamps},
    discovery::{Coordination, Discovery, DiscoveryError, Leadership, Member, Store},
    probe::wire::{AuthKey, Sent, StampSource, WireStamp},
    publish::{OffsetsWriter, history::NodeLine, realtime_now_ns, sample_kernel_clocks},
};

const MEMBERSHIP_PERIOD: Duration = Duration::from_secs(2);
const STATUS_PERIOD: Duration = Duration::from_secs(1);
const RECV_BUF: usize = 2048;

pub(super) struct Agent<D> {
    pub(super) cfg: AgentConfig,
    pub(super) node: Node,
    pub(super) discovery: D,
    skew: Option<InjectedSkew>,
    capture: Capture,
    phc: Option<u32>,
    maps: Vec<ClockMap>,
    /// The window the clock maps were last measured in.
    maps_window: Option<i64>,
    /// All capabilities given up ([`super::privileges`]).
    privileges_dropped: bool,
    sock: std::net::UdpSocket,
    sender: Sender,
    sender_rx: mpsc::UnboundedReceiver<Vec<SenderEvent>>,
    leadership: Leadership,
    pub(super) writer: OffsetsWriter,
    pub(super) jsonl: Jsonl,
    pub(super) status: SharedStatus,
    /// What only the driver knows for `/status`: this node's last result,
    /// GPU devices, the last tick.
    pub(super) status_extra: Status,
    /// What this driver counts of its own I/O.
    pub(super) io: IoCounters,
    update_rms: UpdateRms,
    /// GPU clock sampling (`gpu_clock`), its last generation seen, and the
    /// last window for which device lines were written.
    pub(super) gpu: Option<super::gpu::GpuClocks>,
    pub(super) gpu_seen: u64,
    pub(super) device_lines_window: Option<i64>,
    started_at_ns: i64,
}

/// Runs the agent until `shutdown` resolves; then leaves the offsets in
/// holdover (readers carry the last result forward up to its ceiling, and
/// a restarted agent keeps it so until its first result), leaves the
/// cluster and detaches the eBPF programs.
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

fn load_key(cfg: &AgentConfig) -> Result<Option<AuthKey>, RuntimeError> {
    match &cfg.auth_key_file {
        // The DaemonSet mounts an optional Secret: no file, no authentication.
        Some(p) if !p.value.exists() => {
            warn!(path = %p.value.display(), "auth key file absent: probes are NOT authenticated");
            Ok(None)
        }
        Some(p) => Ok(Some(super::load_auth_key(&p.value)?)),
        None => Ok(None),
    }
}

/// The probe socket's receive buffer. The leader takes every member's fits
/// in the burst of each window's fit phase — at 10,000 members tens of
/// thousands of datagrams within milliseconds — and the kernel's default
/// (about 200 KiB, a few hundred datagrams) drops the rest at the socket
/// (`docs/coordination.md`, "At scale"). The kernel charges only what
/// queues, so a quiet socket costs nothing for the size.
pub const PROBE_RCVBUF_BYTES: usize = 32 << 20;

/// Raises the probe socket's receive buffer: past `net.core.rmem_max` with
/// CAP_NET_ADMIN (the agent starts with it), else up to that limit.
pub fn raise_receive_buffer(sock: &std::net::UdpSocket) {
    use nix::sys::socket::{getsockopt, setsockopt, sockopt};
    if setsockopt(sock, sockopt::RcvBufForce, &PROBE_RCVBUF_BYTES).is_err()
        && let Err(e) = setsockopt(sock, sockopt::RcvBuf, &PROBE_RCVBUF_BYTES)
    {
        warn!("raising the probe socket's receive buffer: {e}");
    }
    // Linux reports twice the size asked for (its bookkeeping share).
    let got = getsockopt(sock, sockopt::RcvBuf).unwrap_or(0) / 2;
    if got < PROBE_RCVBUF_BYTES {
        warn!(
            bytes = got,
            wanted = PROBE_RCVBUF_BYTES,
            "probe socket receive buffer capped by net.core.rmem_max: a leader of thousands of members may drop fits"
        );
    }
}

fn bind_probe_socket(addr: SocketAddr) -> Result<std::net::UdpSocket, RuntimeError> {
    let sock = std::net::UdpSocket::bind(addr)
        .map_err(io_err(format!("binding the probe socket {addr}")))?;
    raise_receive_buffer(&sock);
    timestamping::enable_rx(&sock, StampMode::Software)
        .map_err(|e| io_err("enabling SO_TIMESTAMPING")(e.into()))?;
    sock.set_nonblocking(true).map_err(io_err("probe socket"))?;
    if !timestamping::wait_for_rx_stamping(Duration::from_secs(2)).unwrap_or(false) {
        warn!("kernel RX timestamps not active after 2 s; early probes may lack them");
    }
    Ok(sock)
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
        let key = load_key(&cfg)?;
        let port = cfg.probe_port.value;
        let sock = bind_probe_socket(SocketAddr::new(addr, port))?;
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
            tracepoints: cfg.tracepoint_stamps.value == TracepointStamps::On,
            ..CaptureConfig::new(iface.clone(), port..=port)
        })?;
        let (tx, sender_rx) = mpsc::unbounded_channel();
        let start_ns = realtime_now_ns();
        let sender = Sender::start(
            SenderConfig {
                me: me.id,
                cadence: cfg.probe_cadence_us.value.to_duration(),
                spacing: cfg.packet_spacing_us.value.to_duration(),
                key: key.clone(),
                seq_base: (start_ns.0 / 1_000) as u64,
                stamp_mode: StampMode::Software,
            },
            SocketAddr::new(addr, 0),
            tx,
        )
        .map_err(io_err("starting the probe sender"))?;
        let writer = OffsetsWriter::open(&cfg.offsets_path.value)?;
        if writer.dropped_torn_record() {
            warn!("offsets record was half-written by a previous writer; dropped it");
        }
        info!(path = %writer.path().display(), epoch = writer.epoch(), "offsets file opened for publication");
        let jsonl = Jsonl::open(&cfg.output_dir.value, jsonl::DEFAULT_MAX_BYTES).map_err(
            io_err(format!("output_dir {}", cfg.output_dir.value.display())),
        )?;
        let gpu = super::gpu::GpuClocks::start(
            cfg.gpu_clock.value,
            cfg.gpu_devices.value.clone(),
            Duration::from_millis(cfg.snapshot_period_ms.value),
        )
        .map_err(io_err("starting the GPU clock thread"))?;
        let mut node = Node::new(NodeConfig {
            me,
            settings: cfg.settings(),
            key,
            exchange: discovery.exchange(),
            nonce_base: (start_ns.0 / 1_000) as u64,
            work_clock: monotonic_ns,
        });
        if !discovery.elects_leader() {
            node.lead_by_succession();
        }
        let me = node.me();
        if let Some(mut last) = codec::result_from_record(&writer.current(), (me.id, &me.name)) {
            last.origin = jsonl.origin_of(&me.name, last.window.0);
            node.resume_from(last);
        }
        let mut agent = Agent {
            skew: cfg.inject_skew.as_ref().map(|s| s.value),
            phc: clocks::phc_index(&iface),
            maps: Vec::new(),
            maps_window: None,
            privileges_dropped: false,
            capture,
            sock,
            sender,
            sender_rx,
            node,
            leadership: Leadership::default(),
            writer,
            jsonl,
            status,
            status_extra: Status::default(),
            io: IoCounters::default(),
            update_rms: UpdateRms::default(),
            gpu,
            gpu_seen: 0,
            device_lines_window: None,
            started_at_ns: start_ns.0,
            discovery,
            cfg,
        };
        agent.measure_clock_maps();
        agent.refresh_membership().await?;
        Ok(agent)
    }

    async fn main_loop(&mut self, shutdown: impl Future<Output = ()>) -> Result<(), RuntimeError> {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(TICK.to_duration());
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
            self.drain_socket().await;
            while let Ok(batch) = self.sender_rx.try_recv() {
                batch.into_iter().for_each(|e| self.on_sender_event(e));
            }
            let now = Instant::now();
            if now >= next_membership {
                next_membership = now + MEMBERSHIP_PERIOD;
                self.refresh_membership().await?;
            }
            self.tick().await;
            self.poll_gpu();
            if now >= next_status {
                next_status = now + STATUS_PERIOD;
                self.publish_status();
            }
        }
    }

    async fn tick(&mut self) {
        let now = self.local_now();
        let window = self.window_index(now);
        if self.maps_window != Some(window) {
            self.maps_window = Some(window);
            self.measure_clock_maps(); // fresh maps for each window's stamps
            self.attach_tracepoints_if_needed();
            self.drop_privileges_once_settled();
        }
        let actions = self.node.handle_tick(now);
        self.perform(actions).await;
        if !self.discovery.elects_leader() {
            self.note_succession();
        }
        self.status_extra.last_tick_ns = realtime_now_ns().0;
    }

    /// `tracepoint_stamps = auto`: the tp_btf programs are attached once the
    /// socket's kernel stamps turn out to be missing (checked each window).
    fn attach_tracepoints_if_needed(&mut self) {
        if self.cfg.tracepoint_stamps.value != TracepointStamps::Auto
            || self.capture.tracepoints_attached()
            || !socket_stamps_missing(self.node.stamp_tally())
        {
            return;
        }
        warn!(
            "the socket gives no kernel TX or RX stamps (driver without skb_tx_timestamp?): attaching the tp_btf stamp programs"
        );
        match self.capture.attach_tracepoints() {
            Ok(()) => self.io.tracepoints_attached += 1,
            Err(e) => {
                self.io.tracepoint_attach_errors += 1;
                warn!("attaching the tp_btf programs: {e}");
            }
        }
    }

    /// Gives up every capability once nothing needs one: at once, unless
    /// `tracepoint_stamps = auto` may still attach programs; then once the
    /// socket's stamps proved present (or the programs are attached).
    fn drop_privileges_once_settled(&mut self) {
        if self.privileges_dropped {
            return;
        }
        let undecided = self.cfg.tracepoint_stamps.value == TracepointStamps::Auto
            && !self.capture.tracepoints_attached()
            && !socket_stamps_present(self.node.stamp_tally());
        if undecided {
            return;
        }
        self.privileges_dropped = true;
        let keep = self
            .capture
            .detach_needs_net_admin()
            .then_some(caps::Capability::CAP_NET_ADMIN);
        match super::privileges::drop_all_but(keep) {
            Ok(()) => {
                self.io.capabilities_dropped += 1;
                info!("programs attached and sockets bound: all capabilities dropped");
            }
            Err(e) => warn!("dropping capabilities: {e}"),
        }
    }

    async fn stop(&mut self) {
        self.writer.mark_holdover();
        if self.privileges_dropped && self.capture.detach_needs_net_admin() {
            // Netlink tc filters stay on the interface after we exit.
            if let Err(e) = super::privileges::raise(caps::Capability::CAP_NET_ADMIN) {
                warn!("raising CAP_NET_ADMIN to detach the tc filters: {e}");
            }
        }
        if let Err(e) = self.discovery.leave().await {
            warn!("leaving the cluster: {e}");
        }
        info!(node = %self.node.me().name, "stopped; offsets left in holdover");
    }

    /// Local clock: REALTIME plus the injected skew (tests, demo).
    pub(super) fn local_now(&self) -> LocalNs {
        self.skewed(realtime_now_ns())
    }

    fn skewed(&self, t: LocalNs) -> LocalNs {
        self.skew.map_or(t, |s| t + Nanos(s.at(t.0)))
    }

    pub(super) fn window_index(&self, now: LocalNs) -> i64 {
        Nanos(now.0).div_floor(self.node.settings().window())
    }

    fn measure_clock_maps(&mut self) {
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

    // ---- actions ----

    /// Carries out the node's actions, and those its answers produce.
    async fn perform(&mut self, actions: Vec<Action>) {
        let mut queue = std::collections::VecDeque::from(actions);
        while let Some(action) = queue.pop_front() {
            queue.extend(self.perform_one(action).await);
        }
    }

    async fn perform_one(&mut self, action: Action) -> Vec<Action> {
        match action {
            Action::Send { to, datagram, sent } => self.send(&datagram, to, sent),
            Action::SetTargets(targets) => self.sender.set_targets(targets),
            Action::History(line) => self.write_line(&line),
            Action::HandOver(line) if line.is_hand_over() => {
                info!(
                    reference = %line.reference,
                    previous = ?line.previous_reference,
                    carried_offset_ns = ?line.carried_offset_ns,
                    "took the global timeline over"
                );
                self.write_line(&line);
            }
            // Every window its origin is measured: not news for the log.
            Action::HandOver(steer) => {
                debug!(
                    origin = ?steer.steered_toward,
                    carried_bound_ns = ?steer.carried_bound_ns,
                    "steered the carried timeline toward its origin"
                );
                self.write_line(&steer);
            }
            Action::Publish(p) => self.publish_result(&p),
            Action::PutFits(snapshot) => self.put_fits(snapshot).await,
            Action::FetchFits { window } => return self.fetch_fits(window).await,
            Action::PutResults { window, results } => self.put_results(window, results).await,
            Action::FetchResult => return self.fetch_result().await,
        }
        Vec::new()
    }

    fn send(&mut self, datagram: &[u8], to: SocketAddr, sent: Sent) {
        match self.sock.send_to(datagram, to) {
            Ok(_) => {
                self.node.count_sent(sent);
                self.io.udp_datagrams_sent += 1;
                self.io.udp_payload_bytes_sent += datagram.len() as u64;
            }
            Err(e) => {
                self.io.send_errors += 1;
                debug!(%to, "send failed: {e}");
            }
        }
    }

    fn discovery_error(&mut self, what: &str, e: impl std::fmt::Display) {
        self.io.discovery_errors += 1;
        warn!("{what}: {e}");
    }

    async fn put_fits(&mut self, fits: WindowFits) {
        let name = self.node.me().name.clone();
        let Some(store) = self.discovery.store() else {
            return;
        };
        if let Err(e) = store.put_edges(&name, &fits).await {
            self.discovery_error(&format!("sharing edge fits of window {}", fits.window), e);
        }
    }

    async fn fetch_fits(&mut self, k: WindowIndex) -> Vec<Action> {
        let Some(store) = self.discovery.store() else {
            return Vec::new();
        };
        match store.fetch_edges().await {
            Ok(snapshots) => self.node.solve_snapshots(k, &snapshots),
            Err(e) => {
                self.discovery_error(&format!("reading edge fits for window {k}"), e);
                Vec::new()
            }
        }
    }

    async fn put_results(&mut self, k: WindowIndex, results: Vec<NodeResult>) {
        let Some(store) = self.discovery.store() else {
            return;
        };
        if let Err(e) = store.put_results(&results).await {
            self.discovery_error(&format!("publishing results of window {k}"), e);
        }
    }

    async fn fetch_result(&mut self) -> Vec<Action> {
        let name = self.node.me().name.clone();
        let Some(store) = self.discovery.store() else {
            return Vec::new();
        };
        match store.my_result(&name).await {
            Ok(r) => self.node.handle_result(r),
            Err(e) => {
                self.discovery_error("reading this node's result", e);
                Vec::new()
            }
        }
    }

    pub(super) fn write_line(&mut self, line: &impl Serialize) {
        if let Err(e) = self.jsonl.write(line) {
            self.io.jsonl_errors += 1;
            warn!(path = %self.jsonl.path().display(), "writing JSONL: {e}");
        }
    }

    /// Writes a publication: what only the driver knows (the write time,
    /// the kernel clocks, the device maps) added to the record the node made.
    fn publish_result(&mut self, p: &Publication) {
        let now = self.local_now();
        let record = p.record(now, sample_kernel_clocks(), self.device_entries());
        self.publish_record(&record);
        self.write_line(&NodeLine::new(&p.entry));
        let mut status = p.status.clone();
        status.rms_update_ns = self
            .update_rms
            .add(self.status_extra.offset.as_ref(), &status);
        self.status_extra.offset = Some(status);
    }

    // ---- membership ----

    /// This node is no longer listed (its etcd lease expired while its link
    /// was down): register again under its name. etcd keeps one id per
    /// name, so the node carries on as it was — its histories, timeline
    /// and held result, and the offsets file readers use; a backend that
    /// gives another id means a new member, so the agent exits to restart
    /// cleanly. A failed registration is tried again at the next refresh.
    async fn rejoin(&mut self) -> Result<(), RuntimeError> {
        let me = self.node.me().clone();
        warn!(node = %me.name, "no longer listed as a member (lease lost); registering again");
        let again = match self.discovery.register(&me).await {
            Ok(again) => again,
            Err(e) => {
                self.discovery_error("registering again", e);
                return Ok(());
            }
        };
        if again.id != me.id {
            return Err(RuntimeError::Deregistered(me.name));
        }
        self.io.rejoins += 1;
        info!(node = %me.name, id = me.id, "registered again under the same id");
        Ok(())
    }

    async fn refresh_membership(&mut self) -> Result<(), RuntimeError> {
        match self.discovery.membership().await {
            Ok(membership) => {
                let count = membership.total();
                let me = self.node.me();
                // Listed under another id (Kubernetes ids are computed and
                // can move): a new member; exit, so that it restarts cleanly.
                if listed_elsewhere(&membership, me) {
                    return Err(RuntimeError::Deregistered(me.name.clone()));
                }
                let Ok(actions) = self.node.handle_membership(membership, self.local_now()) else {
                    return self.rejoin().await;
                };
                if !actions.is_empty() {
                    info!(members = count, "probe graph updated");
                }
                self.perform(actions).await;
            }
            Err(DiscoveryError::NotAMember(_)) => return self.rejoin().await,
            Err(e) => self.discovery_error("membership refresh failed (keeping the last graph)", e),
        }
        if !self.discovery.elects_leader() {
            self.note_succession();
            return Ok(());
        }
        match self.discovery.leadership().await {
            Ok(l) => {
                if l != self.leadership {
                    info!(leader = ?l.leader, is_me = l.is_me, "leadership");
                }
                self.node.handle_leader(l.leader.clone());
                self.leadership = l;
            }
            Err(e) => self.discovery_error("leadership query failed", e),
        }
        if self.node.is_leader() {
            let handed = self
                .discovery
                .hand_out(self.node.graph(), self.node.members())
                .await;
            if let Err(e) = handed {
                self.discovery_error("handing out places failed (tried again next refresh)", e);
            }
        }
        Ok(())
    }

    /// Under succession the core decides who leads: logged when it changes.
    fn note_succession(&mut self) {
        // Every tick: compare before allocating (is_me follows the name).
        if self.node.leader() == self.leadership.leader.as_deref() {
            return;
        }
        let l = Leadership {
            leader: self.node.leader().map(str::to_string),
            is_me: self.node.is_leader(),
        };
        info!(leader = ?l.leader, is_me = l.is_me, "leadership (static succession)");
        self.leadership = l;
    }

    // ---- stamps ----

    /// A local stamp in REALTIME (plus the injected skew) with its source.
    fn local_stamp(&self, domain_ns: (ClockDomain, i64), source: StampSource) -> Option<WireStamp> {
        let (domain, ns) = domain_ns;
        let (rt, bound) = to_realtime(Stamp { domain, ns }, &self.maps)?;
        Some(WireStamp {
            realtime_ns: self.skewed(LocalNs(rt)).0,
            bound_ns: u32::try_from(bound).unwrap_or(u32::MAX),
            source,
        })
    }

    /// This node's side and pair of a captured probe, if it is ours.
    fn event_key(&self, ev: &ProbeEvent) -> Option<(Side, PairKey)> {
        let me = self.node.me().id;
        let tx = clockmesh_common::point_is_tx(ev.point);
        let (side, from, to) = match (tx, ev.sender == me, ev.receiver == me) {
            (true, true, _) => (Side::Tx, me, ev.receiver),
            (false, _, true) => (Side::Rx, ev.sender, me),
            _ => return None,
        };
        Some((
            side,
            PairKey {
                from,
                to,
                seq: ev.seq,
            },
        ))
    }

    fn on_capture_events(&mut self, events: &[ProbeEvent]) {
        let now = self.local_now();
        for ev in events.iter().filter(|e| e.kind == kind::PROBE) {
            let Some((side, key)) = self.event_key(ev) else {
                continue;
            };
            self.io.ebpf_events += 1;
            let stamps: Vec<WireStamp> = event_stamps(ev, self.phc)
                .into_iter()
                .filter_map(|st| {
                    let source = stamp_source(st.domain, ev.point)?;
                    self.local_stamp((st.domain, st.ns), source)
                })
                .collect();
            self.node
                .handle_stamps(side, key, ev.pair_index, &stamps, now);
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
            SenderEvent::Sent { to, seq, .. } => self.node.handle_sent(to, seq, now),
            SenderEvent::TxStamp {
                to,
                seq,
                index,
                stamps,
            } => {
                let key = PairKey {
                    from: self.node.me().id,
                    to,
                    seq,
                };
                let stamps = self.socket_stamps(stamps);
                self.node.handle_stamps(Side::Tx, key, index, &stamps, now);
            }
        }
    }

    /// Receives every queued datagram (non-blocking) and hands each to the node.
    async fn drain_socket(&mut self) {
        let mut buf = [0u8; RECV_BUF];
        loop {
            let d = match timestamping::recv_stamped(&self.sock, &mut buf) {
                Ok(d) => d,
                Err(nix::errno::Errno::EAGAIN) => return,
                Err(e) => return debug!("recv: {e}"),
            };
            let len = d.len.min(buf.len());
            let stamps = self.socket_stamps(d.stamps);
            let now = self.local_now();
            let actions = self.node.handle_datagram(&buf[..len], d.from, &stamps, now);
            self.perform(actions).await;
        }
    }

    // ---- status ----

    pub(super) fn publish_status(&mut self) {
        let mut s = self.status_extra.clone();
        let me = self.node.me().clone();
        s.node = me.name.clone();
        s.node_id = me.id;
        s.addr = me.probe_addr().to_string();
        s.version = env!("CARGO_PKG_VERSION").into();
        s.started_at_ns = self.started_at_ns;
        s.ready = true;
        s.leader = self.node.leader().map(str::to_string);
        s.is_leader = self.node.is_leader();
        s.window = self.node.last_fitted_window();
        s.peers = self.peer_status();
        let settings = self.node.settings();
        s.nodes = self
            .node
            .last_results()
            .iter()
            .map(|r| ResultStatus::of(r, settings))
            .collect();
        s.timings = self.node.timings().clone();
        s.counters = self.counters();
        s.dropped = self.dropped();
        s.ebpf = self.capture.counters().ok();
        s.config = config_summary(&self.cfg);
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    fn counters(&self) -> AgentCounters {
        use std::sync::atomic::Ordering::Relaxed;
        let stats = &self.sender.stats;
        let mut node = self.node.counters().clone();
        // Probes and warm-ups leave from the sender's socket, not as actions.
        node.sent.probes_sent = 2 * stats.pairs_sent.load(Relaxed);
        node.sent.warmups_sent = stats.warmups_sent.load(Relaxed);
        let mut io = self.io.clone();
        // The probe socket's traffic on top of the control socket's.
        io.udp_datagrams_sent += stats.datagrams_sent.load(Relaxed);
        io.udp_payload_bytes_sent += stats.payload_bytes_sent.load(Relaxed);
        let book = self.node.book_stats();
        AgentCounters {
            node,
            io,
            probe_send_errors: stats.send_errors.load(Relaxed),
            unmatched_tx_reports: stats.unmatched_tx_reports.load(Relaxed),
            tx_id_restarts: stats.tx_id_restarts.load(Relaxed),
            pairs_settled: self.node.collector_stats().settled,
            probes_completed: book.completed,
            probes_evicted_incomplete: book.evicted_incomplete,
        }
    }

    fn dropped(&self) -> AgentDrops {
        let c = self.node.collector_stats();
        AgentDrops {
            node: *self.node.dropped(),
            unconfirmed_rx: c.unconfirmed,
            evicted_pending: c.evicted,
        }
    }

    fn peer_status(&self) -> Vec<super::status::PeerStatus> {
        let now = self.local_now();
        let out_edges = self.node.graph().out_neighbours(self.node.me().id);
        self.node
            .peers()
            .map(|p| super::status::PeerStatus {
                id: p.id,
                name: p.name.clone(),
                addr: p.addr.to_string(),
                state: p.state,
                out_edge: out_edges.contains(&p.id),
                hello_attempts: p.attempts,
                last_heard_ms: u64::try_from(now.since(p.last_heard).0 / 1_000_000).ok(),
                pairs_per_cadence: self.node.pairs_per_cadence(p.id),
                edge: self.node.edge_status(p.id),
            })
            .collect()
    }
}

/// Whether `me`'s name is listed under another id.
fn listed_elsewhere(membership: &Membership, me: &Member) -> bool {
    membership
        .known()
        .iter()
        .any(|m| m.name == me.name && m.id != me.id)
}

/// Monotonic ns since the first call: the core's work clock (it times
/// its fits and solves with it and reads no clock itself).
fn monotonic_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let elapsed = START.get_or_init(std::time::Instant::now).elapsed();
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

/// Whether enough pairs settled on both sides with socket (kernel or NIC)
/// stamps: the tp_btf fallback will not be needed.
fn socket_stamps_present(stamps: &StampTally) -> bool {
    [Side::Tx, Side::Rx]
        .into_iter()
        .all(|side| stamps.settled(side).0 >= STAMP_EVIDENCE_PAIRS)
}

/// Pairs sent and received before the stamps they settled with are judged.
const STAMP_EVIDENCE_PAIRS: u64 = 20;

/// Whether enough pairs settled on one side without any socket (kernel or
/// NIC) stamp: the driver does not stamp, and the eBPF tracepoints must.
fn socket_stamps_missing(stamps: &StampTally) -> bool {
    [Side::Tx, Side::Rx].into_iter().any(|side| {
        let (socket, all) = stamps.settled(side);
        all >= STAMP_EVIDENCE_PAIRS && socket == 0
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Layers;
    use clockmesh_core::{settings::Settings, wire::StampSource};

    /// The simulator runs `Settings::default()`; it must be what the agent ships.
    #[test]
    fn shipped_defaults_are_the_cores_defaults() {
        let mut l = Layers::with_defaults();
        l.apply_flag("interface", "eth0".into(), "--interface")
            .unwrap();
        let cfg = AgentConfig::from_layers(&l, "node-a").unwrap();
        assert_eq!(cfg.settings(), Settings::default());
    }

    /// A tally of `n` settled stamps per (side, source).
    fn tally(entries: &[(Side, StampSource, u64)]) -> StampTally {
        let mut t = StampTally::default();
        for &(side, source, n) in entries {
            for _ in 0..n {
                t.add(side, source);
            }
        }
        t
    }

    #[test]
    fn tracepoints_are_needed_only_when_one_side_lacks_socket_stamps() {
        use StampSource::*;
        let kernel = tally(&[(Side::Tx, Kernel, 40), (Side::Rx, Kernel, 40)]);
        assert!(!socket_stamps_missing(&kernel));
        let tx_from_tc = tally(&[(Side::Tx, Tc, 40), (Side::Rx, Kernel, 40)]);
        assert!(socket_stamps_missing(&tx_from_tc));
        let nic = tally(&[(Side::Tx, Hardware, 40), (Side::Rx, Hardware, 40)]);
        assert!(!socket_stamps_missing(&nic));
        let too_few = tally(&[(Side::Tx, Tc, 3), (Side::Rx, Kernel, 3)]);
        assert!(!socket_stamps_missing(&too_few), "not enough evidence yet");
    }

    #[test]
    fn privileges_wait_for_socket_stamps_on_both_sides() {
        use StampSource::*;
        assert!(socket_stamps_present(&tally(&[
            (Side::Tx, Kernel, 20),
            (Side::Rx, Hardware, 20)
        ])));
        assert!(!socket_stamps_present(&tally(&[(Side::Tx, Kernel, 40)])));
        assert!(!socket_stamps_present(&tally(&[
            (Side::Tx, Kernel, 19),
            (Side::Rx, Kernel, 40)
        ])));
    }

    /// A leader's socket must hold a window's burst of fits: with
    /// CAP_NET_ADMIN (tests run as root, the agent starts with it) the
    /// buffer passes `net.core.rmem_max`.
    #[test]
    fn the_probe_socket_holds_a_burst_of_fits() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs CAP_NET_ADMIN (root)");
            return;
        }
        use nix::sys::socket::{getsockopt, sockopt};
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let before = getsockopt(&sock, sockopt::RcvBuf).unwrap() / 2;
        raise_receive_buffer(&sock);
        let after = getsockopt(&sock, sockopt::RcvBuf).unwrap() / 2;
        assert!(after >= PROBE_RCVBUF_BYTES, "{before} → {after} bytes");
        assert!(after > before);
    }
}
