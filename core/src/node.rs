//! One node of the protocol as a state machine, without I/O (in the manner
//! of ntpd-rs's `ntp-proto`): the caller feeds it datagrams, stamps, member
//! lists and the time on its local clock; it answers with [`Action`]s
//! (send this datagram, probe these targets, share these fits, publish this
//! result) that the caller carries out. The agent runs it over sockets and
//! eBPF; the simulator over simulated links and clocks.
//!
//! Window `k` covers local time `[k·W, (k+1)·W)`. After it ends every node
//! fits its out-edges and shares the fits; the leader solves the network;
//! every node then takes its own result and publishes it
//! ([`crate::window_clock`] says when each phase is due).
//!
//! How fits and results travel is the membership backend's choice
//! ([`Exchange`]): over UDP to and from the leader (handled here, as
//! datagrams), or through a shared store (the node asks the caller with
//! [`Action::PutFits`], [`Action::FetchFits`], [`Action::PutResults`] and
//! [`Action::FetchResult`], and the caller answers with [`Node::solve_snapshots`] and
//! [`Node::handle_result`]).

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
};

use clockmesh_common::{PROBE_VERSION, ProbeHeader, kind};
use clockmesh_estimator::convert::ceil_bound_ns;
use clockmesh_estimator::{
    AnchorKind as SolveAnchor, EdgeMeasurement, Estimator, EstimatorConfig, NodeId, pair_probes,
};
use serde::{Deserialize, Serialize};

use crate::{
    codec,
    collector::{Collector, CollectorStats, PairKey, Settled, Side},
    graph::{Neighbourhood, ProbeGraph},
    history::{EdgeHistory, HistoryFit},
    pairs::{PairBook, PairBookStats},
    peers::{HandshakeConfig, Peer, Peers},
    probe_rate::{DirectionWindow, ProbeRates, due_in_round, rounds_per_cadence},
    report::FitLine,
    settings::{Settings, StampClass, estimator_config},
    span_choice::SpanChoice,
    window_clock::{Phase, WindowClock},
    wire::{
        self, AuthKey, BatchEntry, Hello, MAX_BATCH_ENTRIES, Message, ReplayWindow, Report, Sent,
        WireError, WireStamp,
    },
};

/// The driver calls [`Node::handle_tick`] this often: it settles stamps and
/// sends reports and handshakes. Nothing needs lower latency (every stamp
/// is taken by the kernel), and waking per packet costs far more CPU.
pub const TICK: Nanos = Nanos::from_millis(100);
/// A pair is settled this long after its first stamp (two ticks).
pub const SETTLE: Nanos = Nanos::from_millis(150);
/// A report waits at most this long for others to the same peer: one
/// datagram then carries up to `MAX_BATCH_ENTRIES` of them instead of one
/// per tick. Whatever waits is sent once a window's last pairs have settled
/// too ([`SETTLE`] after its end), before the peers fit it.
pub const REPORT_DELAY: Nanos = Nanos::from_secs(1);
use crate::fits::{SharedFit, WindowFits};
use crate::publication::{self, Publication};
pub use crate::report::{EdgeLine, EdgeStatus, Timings};
use crate::result::NodeResult;
use crate::succession::{LeaderChange, Silence, Succession};
use crate::tally::{DropCounts, DropReason, NodeCounters, StampTally};
use crate::time::Nanos;
pub use crate::time::{LocalNs, WindowIndex};
use crate::timeline::{Continuation, HandOverLine, OwnMarks, through_origin};
use clockmesh_offsets::history::AnchorKind;

/// Bounds on per-packet state (a flood cannot grow memory past these).
const MAX_PENDING_PAIRS: usize = 8192;
const MAX_PENDING_PER_DIRECTION: usize = 4096;
const MAX_REPLAY_SENDERS: usize = 4096;

/// One agent as the others see it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Member {
    /// Unique, stable name (the Kubernetes node name, or the host name).
    pub name: String,
    /// Compact id carried in every probe header; unique within the cluster.
    pub id: u32,
    pub addr: IpAddr,
    pub probe_port: u16,
    /// `wire::capability` bits.
    pub capabilities: u32,
}

impl Member {
    pub fn probe_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, self.probe_port)
    }
}

/// A member's place in the probe graph, as the leader hands it out where
/// members do not read the whole list (etcd at thousands of members:
/// every agent reading every record was O(N²), `docs/coordination.md`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Place {
    /// Its edges in the leader's graph.
    pub edges: Neighbourhood,
    /// The records it needs: itself, its neighbours, and the leader's,
    /// sorted by name.
    pub members: Vec<Member>,
    /// How many members the graph has.
    pub total: usize,
}

impl Place {
    /// Every member's place in `graph` (over `members`), with the records
    /// of `leaders` (by name) besides its neighbours': what the leader
    /// hands out, in O(N × degree).
    pub fn all<'a>(
        graph: &'a ProbeGraph,
        members: &'a [Member],
        leaders: &[&str],
    ) -> impl Iterator<Item = (&'a Member, Place)> + 'a {
        let by_id: BTreeMap<NodeId, &Member> = members.iter().map(|m| (m.id, m)).collect();
        let leaders: Vec<&Member> = members
            .iter()
            .filter(|m| leaders.contains(&m.name.as_str()))
            .collect();
        members.iter().map(move |m| {
            let edges = graph.neighbourhood(m.id);
            let mut known: Vec<Member> = std::iter::once(m.id)
                .chain(edges.peers())
                .filter_map(|n| by_id.get(&n).copied())
                .chain(leaders.iter().copied())
                .cloned()
                .collect();
            known.sort();
            known.dedup();
            let place = Place {
                edges,
                members: known,
                total: members.len(),
            };
            (m, place)
        })
    }
}

/// What a node knows of the other members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Membership {
    /// Every member: the node builds the whole graph (static lists,
    /// Kubernetes, etcd's seat holders).
    All(Vec<Member>),
    /// Its place, handed out by the leader.
    Place(Place),
    /// Nothing yet (its place not handed out): the node keeps what it has.
    Pending,
}

impl Membership {
    /// The member records it carries (none while pending).
    pub fn known(&self) -> &[Member] {
        match self {
            Membership::All(members) => members,
            Membership::Place(place) => &place.members,
            Membership::Pending => &[],
        }
    }

    /// How many members there are, as far as this node knows.
    pub fn total(&self) -> usize {
        match self {
            Membership::All(m) => m.len(),
            Membership::Place(p) => p.total,
            Membership::Pending => 0,
        }
    }
}

/// How edge fits reach the leader and results come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Exchange {
    /// Over UDP: each fit in a datagram to the leader, each result in one
    /// back (static and Kubernetes membership).
    Relay,
    /// Through a shared store the caller reads and writes (etcd).
    Store,
}

/// Everything a node needs to start.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub me: Member,
    pub settings: Settings,
    pub key: Option<AuthKey>,
    pub exchange: Exchange,
    /// Start of the handshake nonces (the agent uses its start time in µs,
    /// so a restarted agent's old acks are not taken for new ones).
    pub nonce_base: u64,
    /// Monotonic ns, read only to time the node's own work (fits, solves)
    /// for its status: the core never reads a clock itself, so a
    /// simulation is in full control of time ([`no_work_clock`] when the
    /// cost does not matter).
    pub work_clock: WorkClock,
}

/// A monotonic clock in ns, for the cost of the node's work.
pub type WorkClock = fn() -> u64;

/// A [`WorkClock`] that never moves: every fit and solve costs 0 µs.
pub fn no_work_clock() -> u64 {
    0
}

/// A peer this node sends coded pairs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub id: NodeId,
    pub addr: SocketAddr,
    /// The peer takes warm-up datagrams before each pair.
    pub warmup: bool,
    /// Pairs per `probe_cadence_us`: 1, or up to
    /// `max_pairs_per_cadence` ([`crate::setting::MAX_PAIRS_PER_CADENCE`])
    /// on a NIC-stamped direction
    /// short of pure pairs; senders space them evenly
    /// ([`crate::probe_rate::rounds_per_cadence`], [`crate::probe_rate::due_in_round`]).
    pub pairs_per_cadence: u32,
}

/// The targets due in round `round` of a sender making as many rounds a
/// cadence as its fastest target needs, the first one rotating with the
/// round so that no peer always waits behind the others' packets. The
/// agent's sender and the simulator both send their rounds from it.
pub fn targets_in_round(targets: &[Target], round: u64) -> Vec<Target> {
    let rounds = rounds_per_cadence(targets.iter().map(|t| t.pairs_per_cadence));
    let due: Vec<Target> = targets
        .iter()
        .filter(|t| due_in_round(round, t.pairs_per_cadence, rounds))
        .copied()
        .collect();
    let first = usize::try_from(round % due.len().max(1) as u64).unwrap_or(0);
    due.iter()
        .cycle()
        .skip(first)
        .take(due.len())
        .copied()
        .collect()
}

/// What the caller must do.
#[derive(Clone, Debug, PartialEq)]
#[must_use = "an action not performed is a message not sent or a result not published"]
pub enum Action {
    /// Send `datagram` to `to`; on success count it with
    /// [`Node::count_sent`].
    Send {
        to: SocketAddr,
        datagram: Vec<u8>,
        sent: Sent,
    },
    /// Probe exactly these peers from now on.
    SetTargets(Vec<Target>),
    /// Store exchange: replace this node's fits in the store.
    PutFits(WindowFits),
    /// Store exchange (leader): read every node's fits and pass them to
    /// [`Node::solve_snapshots`] for `window`.
    FetchFits { window: WindowIndex },
    /// Store exchange (leader): write the solve's results.
    PutResults {
        window: WindowIndex,
        results: Vec<NodeResult>,
    },
    /// Store exchange: read this node's result and pass it to
    /// [`Node::handle_result`].
    FetchResult,
    /// Publish this node's new result (offsets file, history).
    /// (Boxed: a result and its GPU maps are by far the largest action.)
    Publish(Box<Publication>),
    /// Write an edge line to the JSONL history.
    History(EdgeLine),
    /// This node took the timeline over as leader: write the hand-over to
    /// the JSONL history.
    HandOver(HandOverLine),
}

/// The timeline a leader publishes on.
#[derive(Clone, Debug, PartialEq)]
enum LeaderTimeline {
    /// Not leading, or not solved yet since it took over.
    Undecided,
    /// Its own clock: nothing to carry (the first leader, or a carry too old).
    Own,
    /// The timeline so far, continued through its own last result.
    Carried(Continuation),
}

/// Errors that end a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("this node ({0}) is no longer registered (lease lost)")]
    Deregistered(String),
}

/// Fits relayed to the leader and the result relayed back ([`Exchange::Relay`]).
#[derive(Default)]
struct Relay {
    /// Latest fit per directed edge (bounded: edges between members only).
    edges: BTreeMap<(NodeId, NodeId), SharedFit>,
    result: Option<NodeResult>,
}

/// One node's protocol state.
pub struct Node {
    me: Member,
    settings: Settings,
    key: Option<AuthKey>,
    exchange: Exchange,
    est_cfg: EstimatorConfig,
    estimator: Option<Estimator>,
    members: Vec<Member>,
    /// Position of each member id in `members` (every datagram looks one up).
    member_index: BTreeMap<NodeId, usize>,
    leader: Option<String>,
    graph: ProbeGraph,
    /// Recent windows of each out-edge's probes (the fit's history).
    history: BTreeMap<NodeId, EdgeHistory>,
    /// Which line full software histories publish.
    span_choice: SpanChoice,
    /// How fast each peer is probed (faster where pure pairs are few).
    probe_rates: ProbeRates,
    peers: Peers,
    collector: Collector,
    book: PairBook,
    replay: ReplayWindow,
    windows: WindowClock,
    relay: Relay,
    last_results: Vec<NodeResult>,
    timings: Timings,
    counters: NodeCounters,
    dropped: DropCounts,
    /// Last stamp batch's sequence number (replay protection).
    batch_seq: u64,
    /// Reports waiting to fill a batch, per peer, with the time each was queued.
    pending_reports: BTreeMap<NodeId, Vec<(LocalNs, BatchEntry)>>,
    /// The window whose reports were all sent, settled pairs included.
    reports_sent_through: i64,
    /// This node's last published result (what it carries if it becomes leader).
    own_result: Option<NodeResult>,
    /// Its published results of the last minutes: the carried drift's chord.
    own_marks: OwnMarks,
    /// This node on the timeline measured through its origin, every window
    /// of this leadership that solved the origin (the steered rate's chord).
    origin_marks: OwnMarks,
    /// As leader: the timeline it continues, decided at its first solve.
    timeline: LeaderTimeline,
    /// Static membership: who leads is decided here, from the leader's
    /// results ([`Node::lead_by_succession`]); `None`: the engine elects.
    succession: Option<Succession>,
    work_clock: WorkClock,
}

impl Node {
    pub fn new(cfg: NodeConfig) -> Self {
        let est_cfg = estimator_config(&cfg.settings);
        Node {
            graph: ProbeGraph::build(&[cfg.me.id], cfg.settings.degree),
            history: BTreeMap::new(),
            span_choice: SpanChoice::default(),
            probe_rates: ProbeRates::new(cfg.settings.max_pairs_per_cadence),
            windows: WindowClock::new(cfg.settings.window(), cfg.exchange == Exchange::Store),
            peers: Peers::new(HandshakeConfig::default(), cfg.nonce_base),
            collector: Collector::new(SETTLE, MAX_PENDING_PAIRS),
            book: PairBook::new(MAX_PENDING_PER_DIRECTION),
            replay: ReplayWindow::new(MAX_REPLAY_SENDERS),
            est_cfg,
            estimator: None,
            members: Vec::new(),
            member_index: BTreeMap::new(),
            leader: None,
            relay: Relay::default(),
            last_results: Vec::new(),
            timings: Timings::default(),
            counters: NodeCounters::default(),
            dropped: DropCounts::default(),
            batch_seq: cfg.nonce_base,
            pending_reports: BTreeMap::new(),
            reports_sent_through: i64::MIN,
            own_result: None,
            own_marks: OwnMarks::default(),
            origin_marks: OwnMarks::default(),
            timeline: LeaderTimeline::Undecided,
            succession: None,
            work_clock: cfg.work_clock,
            me: cfg.me,
            settings: cfg.settings,
            key: cfg.key,
            exchange: cfg.exchange,
        }
    }

    // ---- inputs ----

    /// A new member list (sorted by name): rebuilds the probe graph and the
    /// peer set. Fails if this node is no longer among the members.
    #[must_use = "the actions are what the node asks its driver to do"]
    pub fn handle_members(
        &mut self,
        members: Vec<Member>,
        now: LocalNs,
    ) -> Result<Vec<Action>, NodeError> {
        if members == self.members {
            return Ok(Vec::new());
        }
        self.check_listed(&members)?;
        let ids: Vec<NodeId> = members.iter().map(|m| m.id).collect();
        let graph = ProbeGraph::build(&ids, self.settings.degree);
        Ok(self.adopt(members, graph, now))
    }

    /// What the backend knows of the members: the whole list, or this
    /// node's place handed out by the leader (or nothing new yet).
    #[must_use = "the actions are what the node asks its driver to do"]
    pub fn handle_membership(
        &mut self,
        membership: Membership,
        now: LocalNs,
    ) -> Result<Vec<Action>, NodeError> {
        match membership {
            Membership::All(members) => self.handle_members(members, now),
            Membership::Place(place) => self.handle_place(place, now),
            Membership::Pending => Ok(Vec::new()),
        }
    }

    /// This node's place, handed out by the leader: it probes, and
    /// answers, the neighbours the leader's graph gives it.
    fn handle_place(&mut self, place: Place, now: LocalNs) -> Result<Vec<Action>, NodeError> {
        self.check_listed(&place.members)?;
        let graph = ProbeGraph::seen_from(self.me.id, &place.edges);
        if place.members == self.members && graph == self.graph {
            return Ok(Vec::new());
        }
        Ok(self.adopt(place.members, graph, now))
    }

    fn check_listed(&self, members: &[Member]) -> Result<(), NodeError> {
        if members.iter().any(|m| m.id == self.me.id) {
            return Ok(());
        }
        Err(NodeError::Deregistered(self.me.name.clone()))
    }

    /// Takes `graph` (over `members`) as this node's: its peers follow.
    fn adopt(&mut self, members: Vec<Member>, graph: ProbeGraph, now: LocalNs) -> Vec<Action> {
        self.graph = graph;
        let neighbours = self.graph.neighbourhood(self.me.id).peers();
        let wanted: Vec<(NodeId, String, SocketAddr)> = members
            .iter()
            .filter(|m| neighbours.contains(&m.id))
            .map(|m| (m.id, m.name.clone(), m.probe_addr()))
            .collect();
        for id in self.peers.set(&wanted, now) {
            self.book.forget(id);
            self.pending_reports.remove(&id);
        }
        self.member_index = members.iter().enumerate().map(|(i, m)| (m.id, i)).collect();
        self.members = members;
        vec![self.targets()]
    }

    /// Static membership, where no engine elects: the lowest-id member
    /// leads while its results arrive, the next one when it falls silent
    /// ([`crate::succession`]). The driver then does not call
    /// [`Node::handle_leader`].
    pub fn lead_by_succession(&mut self) {
        self.succession = Some(Succession::new(self.me.id, self.settings.window()));
    }

    /// After a restart: this node's last published result (read back from
    /// its offsets file), which it carries if it leads before publishing
    /// again, so a returning leader continues the timeline instead of
    /// starting one of its own. Ignored if it is not this node's.
    pub fn resume_from(&mut self, last: NodeResult) {
        if last.node == self.me.id && self.own_result.is_none() {
            self.own_result = Some(last);
        }
    }

    /// The elected leader (the reference and solver), by name.
    pub fn handle_leader(&mut self, leader: Option<String>) {
        if leader != self.leader {
            self.timeline = LeaderTimeline::Undecided; // decided at the first solve as leader
        }
        self.leader = leader;
    }

    /// Local stamps of one packet (TX from the sender's socket or eBPF, RX
    /// from eBPF), already on this node's clock.
    pub fn handle_stamps(
        &mut self,
        side: Side,
        key: PairKey,
        index: u8,
        stamps: &[WireStamp],
        now: LocalNs,
    ) {
        for s in stamps {
            self.collector.add(side, key, index, *s, now);
        }
    }

    /// The sender sent both probes of pair `seq` to `to`.
    pub fn handle_sent(&mut self, to: NodeId, seq: u64, now: LocalNs) {
        self.counters.pairs_sent += 1;
        let key = PairKey {
            from: self.me.id,
            to,
            seq,
        };
        self.collector.confirm(Side::Tx, key, now);
    }

    /// A datagram from `from`, with the receive stamps its socket gave.
    #[must_use = "the actions are what the node asks its driver to do"]
    pub fn handle_datagram(
        &mut self,
        bytes: &[u8],
        from: Option<SocketAddr>,
        rx_stamps: &[WireStamp],
        now: LocalNs,
    ) -> Vec<Action> {
        let msg = match wire::parse(bytes, self.key.as_ref()) {
            Ok(m) => m,
            Err(e) => return self.drop_msg(wire_drop_reason(&e)),
        };
        let h = *msg.header();
        if h.receiver != self.me.id {
            return self.drop_msg(DropReason::WrongReceiver);
        }
        match self.member(h.sender) {
            Some(m) if Some(m.addr) == from.map(|a| a.ip()) => {}
            Some(_) => return self.drop_msg(DropReason::SourceMismatch),
            None => return self.drop_msg(DropReason::UnknownSender),
        }
        // Last, so messages from elsewhere cannot move a member's window.
        if self.key.is_some() && !self.replay.accept(&h) {
            return self.drop_msg(DropReason::Replayed);
        }
        self.peers.heard(h.sender, now);
        match msg {
            Message::Probe { header } => self.on_probe(header, rx_stamps, now),
            Message::FollowUp { header, tx } => {
                self.on_report(header.sender, Report::FollowUp, header.seq, tx)
            }
            Message::RxReport { header, rx } => {
                self.on_report(header.sender, Report::RxReport, header.seq, rx)
            }
            Message::StampBatch { header, entries } => {
                self.counters.stamp_batches_received += 1;
                for e in entries {
                    self.on_report(header.sender, e.report, e.seq, e.stamps);
                }
            }
            Message::Hello { header, .. } => return self.on_hello(header),
            Message::HelloAck { header, hello } => {
                return self.on_hello_ack(header, hello, now);
            }
            Message::Warmup { .. } => self.counters.warmups_received += 1,
            Message::EdgeFit { header, payload } => self.on_edge_fit(header, &payload),
            Message::Result { header, payload } => {
                return self.on_result(header, &payload, now);
            }
        }
        Vec::new()
    }

    /// Timers: settles stamps (follow-ups, RX reports), handshakes, and the
    /// window phases due at `now`.
    #[must_use = "the actions are what the node asks its driver to do"]
    pub fn handle_tick(&mut self, now: LocalNs) -> Vec<Action> {
        self.follow_succession(now);
        let reports: Vec<_> = self
            .collector
            .settle(now)
            .into_iter()
            .map(|s| self.on_settled(s))
            .collect();
        let mut actions = self.send_reports(reports, now);
        let was_ready = self.peers.ready().count();
        for h in self.peers.due_hellos(now) {
            let hello = Message::Hello {
                header: control_header(kind::HELLO, self.me.id, h.id, h.nonce),
                hello: self.my_hello(),
            };
            actions.push(self.send(&hello, h.addr));
        }
        if self.peers.ready().count() != was_ready {
            actions.push(self.targets()); // a silent peer went back to the handshake
        }
        self.run_window_phases(now, &mut actions);
        actions
    }

    /// The leader's solve of window `k` from the store's snapshots (every
    /// node's fits; those of older windows are left out).
    #[must_use = "the actions are what the node asks its driver to do"]
    pub fn solve_snapshots<'a>(
        &mut self,
        window: WindowIndex,
        snapshots: impl IntoIterator<Item = &'a WindowFits>,
    ) -> Vec<Action> {
        let k = window.0;
        let fits: Vec<SharedFit> = snapshots
            .into_iter()
            .filter(|s| fresh_for_solve(k, s.window.0))
            .flat_map(|s| s.fits.iter().cloned())
            .collect();
        self.solve(k, &fits)
    }

    /// The leader's solve of window `k` from every node's fits (the store's,
    /// or those relayed to it).
    fn solve(&mut self, k: u64, fits: &[SharedFit]) -> Vec<Action> {
        let Some(reference) = self.reference() else {
            return Vec::new();
        };
        let is_member = |id: NodeId| self.member_index.contains_key(&id);
        let measurements: Vec<_> = fits
            .iter()
            .map(|f| f.measurement.clone())
            .filter(|m| is_member(m.from) && is_member(m.to))
            .collect();
        if self.est_cfg.net.reference != reference || self.estimator.is_none() {
            self.est_cfg.net.reference = reference;
            self.estimator = Some(Estimator::new(self.est_cfg.clone()));
        }
        // Anchor at the window's end (reference clock): the fits' epochs lie
        // there, so the result carries no extrapolation of its own.
        let epoch = self.windows.end(WindowIndex(k)).0;
        let started = (self.work_clock)();
        let Some(estimator) = self.estimator.as_mut() else {
            return Vec::new();
        };
        let solution = match estimator.apply_fits(LocalNs(epoch), measurements) {
            Ok(s) => s.clone(),
            Err(_) => {
                self.counters.solve_errors += 1;
                return Vec::new();
            }
        };
        self.timings.last_solve_us = self.work_us_since(started);
        self.timings.solves += 1;
        let mut actions = self.steer_toward_origin(k, (reference, epoch), &solution.nodes, fits);
        let results: Vec<NodeResult> = solution
            .nodes
            .iter()
            .filter(|n| {
                matches!(
                    n.anchor_kind,
                    SolveAnchor::Reference | SolveAnchor::Holdover
                )
            })
            .map(|n| self.published_result(k, reference, epoch, n))
            .collect();
        actions.extend(self.share_results(k, results));
        actions
    }

    /// Steers a carried timeline toward its origin's clock where this
    /// window's solve placed the origin and the origin itself reported
    /// fits to it ([`Continuation::steered_toward`]). A static member that
    /// died stays a member, and its peers' histories still place it for a
    /// history span: extrapolated, not measured.
    fn steer_toward_origin(
        &mut self,
        k: u64,
        (reference, epoch): (NodeId, i64),
        solved: &[clockmesh_estimator::NodeEstimate],
        fits: &[SharedFit],
    ) -> Vec<Action> {
        let LeaderTimeline::Carried(continuation) = &self.timeline else {
            return Vec::new();
        };
        let Some(origin) = continuation
            .origin
            .as_deref()
            .and_then(|o| self.id_named(o))
        else {
            return Vec::new();
        };
        let Some(estimate) = solved
            .iter()
            .find(|n| n.node == origin && n.anchor_kind == SolveAnchor::Reference)
        else {
            return Vec::new();
        };
        if !fits.iter().any(|f| f.from() == estimate.node) {
            return Vec::new();
        }
        let solved = self.solved_result(k, reference, epoch, estimate);
        let measured = through_origin(&solved, LocalNs(epoch));
        self.origin_marks.record(&measured);
        let wander_ppb = self.est_cfg.holdover_wander_ppb;
        let Some(steered) = continuation.steered_toward(&measured, &self.origin_marks, wander_ppb)
        else {
            return Vec::new();
        };
        let line = HandOverLine::steer(k, &self.me.name, &steered);
        self.counters.timelines_steered += 1;
        self.timeline = LeaderTimeline::Carried(steered);
        vec![Action::HandOver(line)]
    }

    /// This node's latest result as the store holds it.
    #[must_use = "the actions are what the node asks its driver to do"]
    pub fn handle_result(&mut self, result: Option<NodeResult>) -> Vec<Action> {
        let Some(r) = result else {
            return Vec::new();
        };
        if r.node != self.me.id {
            return self.drop_msg(DropReason::BadRecord);
        }
        self.publish_if_new(r)
    }

    // ---- views (status) ----

    pub fn me(&self) -> &Member {
        &self.me
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn estimator_config(&self) -> &EstimatorConfig {
        &self.est_cfg
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    pub fn member(&self, id: NodeId) -> Option<&Member> {
        self.members.get(*self.member_index.get(&id)?)
    }

    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }

    pub fn is_leader(&self) -> bool {
        self.leader.as_deref() == Some(self.me.name.as_str())
    }

    /// The reference: the leader's id.
    pub fn reference(&self) -> Option<NodeId> {
        self.id_named(self.leader.as_deref()?)
    }

    /// The id of the member named `name`.
    fn id_named(&self, name: &str) -> Option<NodeId> {
        self.members.iter().find(|m| m.name == name).map(|m| m.id)
    }

    pub fn graph(&self) -> &ProbeGraph {
        &self.graph
    }

    pub fn peers(&self) -> impl Iterator<Item = &Peer> {
        self.peers.all()
    }

    pub fn edge_status(&self, peer: NodeId) -> Option<EdgeStatus> {
        self.windows.edge_status(peer)
    }

    pub fn last_fitted_window(&self) -> u64 {
        self.windows.last_fitted()
    }

    pub fn has_published(&self) -> bool {
        self.windows.has_published()
    }

    /// The leader's last results, one per node.
    pub fn last_results(&self) -> &[NodeResult] {
        &self.last_results
    }

    pub fn timings(&self) -> &Timings {
        &self.timings
    }

    pub fn counters(&self) -> &NodeCounters {
        &self.counters
    }

    /// Settled stamps by side and source: what the driver decides on.
    pub fn stamp_tally(&self) -> &StampTally {
        &self.counters.stamps
    }

    pub fn dropped(&self) -> &DropCounts {
        &self.dropped
    }

    pub fn collector_stats(&self) -> CollectorStats {
        self.collector.stats()
    }

    pub fn book_stats(&self) -> PairBookStats {
        self.book.stats()
    }

    /// A datagram of [`Action::Send`] left: counted under its kind.
    pub fn count_sent(&mut self, sent: Sent) {
        self.counters.sent.add(sent);
    }

    // ---- handshakes and probes ----

    /// Coded pairs this node sends `peer` per cadence
    /// ([`crate::probe_rate`]).
    pub fn pairs_per_cadence(&self, peer: NodeId) -> u32 {
        self.probe_rates.pairs_per_cadence(peer)
    }

    fn targets(&self) -> Action {
        Action::SetTargets(
            self.peers
                .ready()
                .map(|p| Target {
                    id: p.id,
                    addr: p.addr,
                    warmup: p.capabilities & wire::capability::WARMUP != 0,
                    pairs_per_cadence: self.probe_rates.pairs_per_cadence(p.id),
                })
                .collect(),
        )
    }

    fn my_hello(&self) -> Hello {
        Hello {
            max_version: PROBE_VERSION,
            capabilities: wire::capability::WARMUP | wire::capability::STAMP_BATCH,
            probe_port: self.me.probe_port,
        }
    }

    fn send(&self, msg: &Message, to: SocketAddr) -> Action {
        Action::Send {
            to,
            datagram: msg.encode(self.key.as_ref()),
            sent: Sent::of(msg),
        }
    }

    fn drop_msg(&mut self, reason: DropReason) -> Vec<Action> {
        self.dropped.add(reason);
        Vec::new()
    }

    fn on_hello(&mut self, header: ProbeHeader) -> Vec<Action> {
        self.counters.hellos_received += 1;
        let Some(addr) = self.member(header.sender).map(Member::probe_addr) else {
            return Vec::new();
        };
        let ack = Message::HelloAck {
            header: control_header(kind::HELLO_ACK, self.me.id, header.sender, header.seq),
            hello: self.my_hello(),
        };
        vec![self.send(&ack, addr)]
    }

    fn on_hello_ack(&mut self, header: ProbeHeader, hello: Hello, now: LocalNs) -> Vec<Action> {
        let version = hello.max_version.min(PROBE_VERSION);
        let ready = self
            .peers
            .acked(header.sender, header.seq, version, hello.capabilities, now);
        if ready {
            vec![self.targets()]
        } else {
            Vec::new()
        }
    }

    fn on_probe(&mut self, header: ProbeHeader, stamps: &[WireStamp], now: LocalNs) {
        self.counters.probes_received += 1;
        let key = PairKey {
            from: header.sender,
            to: self.me.id,
            seq: header.seq,
        };
        self.collector.confirm(Side::Rx, key, now);
        self.handle_stamps(Side::Rx, key, header.pair_index, stamps, now);
    }

    /// A settled pair: into the pair book; returns the report its stamps
    /// make for the peer (a follow-up for our TX stamps, an RX report for
    /// our RX stamps).
    fn on_settled(&mut self, s: Settled) -> (NodeId, BatchEntry) {
        let PairKey { from, to, seq } = s.key;
        let me = self.me.id;
        for st in s.stamps {
            self.counters.stamps.add(s.side, st.source);
        }
        let (peer, report) = match s.side {
            Side::Tx => {
                for (i, st) in (0u8..).zip(s.stamps) {
                    self.book.tx(me, to, seq, i, st);
                }
                (to, Report::FollowUp)
            }
            Side::Rx => {
                for (i, st) in (0u8..).zip(s.stamps) {
                    self.book.rx(from, me, seq, i, st);
                }
                (from, Report::RxReport)
            }
        };
        let entry = BatchEntry {
            report,
            seq,
            stamps: s.stamps,
        };
        (peer, entry)
    }

    /// Queues this tick's reports and sends what is due: a peer that takes
    /// batches gets full batches at once and the rest once its oldest
    /// report waited [`REPORT_DELAY`] or a window ended (its last pairs
    /// settled), so that the peer's fit of that window has all of them; a
    /// peer that does not gets one message per report now.
    fn send_reports(&mut self, reports: Vec<(NodeId, BatchEntry)>, now: LocalNs) -> Vec<Action> {
        let mut actions = Vec::new();
        for (peer, entry) in reports {
            *match entry.report {
                Report::FollowUp => &mut self.counters.follow_ups_sent,
                Report::RxReport => &mut self.counters.rx_reports_sent,
            } += 1;
            let Some(addr) = self.member(peer).map(Member::probe_addr) else {
                continue;
            };
            if self.takes_batches(peer) {
                self.pending_reports
                    .entry(peer)
                    .or_default()
                    .push((now, entry));
            } else {
                let msg = self.single_report(peer, entry);
                actions.push(self.send(&msg, addr));
            }
        }
        let settled_window = self.windows.index(now - SETTLE) - 1;
        let window_ended = settled_window > self.reports_sent_through;
        self.reports_sent_through = settled_window;
        let peers: Vec<NodeId> = self.pending_reports.keys().copied().collect();
        for peer in peers {
            actions.extend(self.flush_reports(peer, now, window_ended));
        }
        actions
    }

    fn takes_batches(&self, peer: NodeId) -> bool {
        self.peers
            .get(peer)
            .is_some_and(|p| p.capabilities & wire::capability::STAMP_BATCH != 0)
    }

    /// The full batches of `peer`'s queue, and the rest once it waited long
    /// enough or a window ended.
    fn flush_reports(&mut self, peer: NodeId, now: LocalNs, window_ended: bool) -> Vec<Action> {
        let Some(queue) = self.pending_reports.remove(&peer) else {
            return Vec::new();
        };
        let due = window_ended
            || queue
                .first()
                .is_some_and(|(queued, _)| now.since(*queued) >= REPORT_DELAY);
        let full = queue.len() / MAX_BATCH_ENTRIES * MAX_BATCH_ENTRIES;
        let send = if due { queue.len() } else { full };
        let (due_now, later) = queue.split_at(send);
        if !later.is_empty() {
            self.pending_reports.insert(peer, later.to_vec());
        }
        let Some(addr) = self.member(peer).map(Member::probe_addr) else {
            return Vec::new();
        };
        let entries: Vec<BatchEntry> = due_now.iter().map(|(_, e)| *e).collect();
        let mut actions = Vec::new();
        for chunk in entries.chunks(MAX_BATCH_ENTRIES) {
            self.batch_seq += 1;
            let header = control_header(kind::STAMP_BATCH, self.me.id, peer, self.batch_seq);
            let msg = Message::StampBatch {
                header,
                entries: chunk.to_vec(),
            };
            actions.push(self.send(&msg, addr));
        }
        actions
    }

    /// A report as its own message (peers without batches).
    fn single_report(&self, peer: NodeId, e: BatchEntry) -> Message {
        match e.report {
            Report::FollowUp => Message::FollowUp {
                header: control_header(kind::FOLLOW_UP, self.me.id, peer, e.seq),
                tx: e.stamps,
            },
            Report::RxReport => Message::RxReport {
                header: control_header(kind::RX_REPORT, self.me.id, peer, e.seq),
                rx: e.stamps,
            },
        }
    }

    /// A peer's report of pair `seq`: its TX stamps of its pair to us
    /// (follow-up) or its RX stamps of our pair to it (RX report).
    fn on_report(&mut self, peer: NodeId, report: Report, seq: u64, stamps: [WireStamp; 2]) {
        let me = self.me.id;
        match report {
            Report::FollowUp => {
                self.counters.follow_ups_received += 1;
                for (i, s) in (0u8..).zip(stamps) {
                    self.book.tx(peer, me, seq, i, s);
                }
            }
            Report::RxReport => {
                self.counters.rx_reports_received += 1;
                for (i, s) in (0u8..).zip(stamps) {
                    self.book.rx(me, peer, seq, i, s);
                }
            }
        }
    }

    // ---- windows ----

    fn run_window_phases(&mut self, now: LocalNs, actions: &mut Vec<Action>) {
        if let Some(WindowIndex(k)) = self.windows.take_due(Phase::Fit, now) {
            actions.extend(self.fit_window(k, now));
        }
        if let Some(WindowIndex(k)) = self.windows.take_due(Phase::Solve, now)
            && self.is_leader()
        {
            actions.extend(self.start_solve(k));
        }
        if self.windows.take_due(Phase::Fetch, now).is_some() {
            actions.extend(self.fetch_result());
        }
    }

    fn fit_window(&mut self, k: u64, now: LocalNs) -> Vec<Action> {
        let started = (self.work_clock)();
        let me = self.me.clone();
        let mut fits = Vec::new();
        let mut actions = Vec::new();
        if self.judge_probe_rates() {
            actions.push(self.targets());
        }
        let peers = self.graph.out_neighbours(me.id).to_vec();
        let mut seen = Vec::new();
        for &peer in &peers {
            let history = self.history.entry(peer).or_default();
            let (probes, stamps) = self.book.take_edge_classified(me.id, peer);
            history.push_window(k, probes, stamps);
            seen.extend(history.lines_seen());
        }
        self.span_choice.score(&seen);
        let software = self.span_choice.span();
        for peer in peers {
            let history = self.history.entry(peer).or_default();
            let Some(chosen) = history.fit(&self.est_cfg, self.settings.window(), software) else {
                continue;
            };
            let peer_name = self
                .member(peer)
                .map_or_else(|| peer.to_string(), |m| m.name.clone());
            let fit = chosen.outcome.fit.as_ref().ok().map(|f| SharedFit {
                window: WindowIndex(k),
                from_name: me.name.clone(),
                to_name: peer_name.clone(),
                measurement: EdgeMeasurement::new(me.id, peer, f.clone())
                    .with_history_share(chosen.history_share(self.settings.window())),
            });
            self.windows
                .record_edge(peer, edge_status(k, &chosen, fit.as_ref()));
            let line = edge_line(k, (&me.name, &peer_name), &chosen, fit.as_ref());
            actions.push(Action::History(line));
            fits.extend(fit);
        }
        // A peer that left keeps its history for a while: a member whose
        // lease lapsed comes back under its id, and its clock carried on.
        self.history.retain(|_, h| !h.is_outlived_by(k));
        // Directions of edges other nodes fit are not ours to keep.
        self.book.clear_complete();
        self.timings.last_fit_us = self.work_us_since(started);
        self.timings.windows += 1;
        actions.extend(self.share_fits(k, fits, now));
        actions
    }

    /// Judges this node's direction to every ready peer by the window's
    /// complete pairs (before the fits take them); true when a rate changed.
    /// A peer silent long enough to be handshaken again keeps its rate: its
    /// path's queues are what they were, and a history emptied by the
    /// silence needs the pure pairs most.
    fn judge_probe_rates(&mut self) -> bool {
        let me = self.me.id;
        let known: Vec<NodeId> = self.peers.all().map(|p| p.id).collect();
        self.probe_rates.keep_only(&known);
        let ready: Vec<NodeId> = self.peers.ready().map(|p| p.id).collect();
        let mut changed = false;
        for &peer in &ready {
            let Some(window) = self.direction_window(me, peer) else {
                continue;
            };
            changed |= self.probe_rates.observe(
                peer,
                window,
                self.settings.cadence(),
                self.settings.window(),
            );
        }
        changed
    }

    /// The window's complete pairs `from → to` and how many are pure
    /// (not counted for software stamps, whose rate never changes).
    fn direction_window(&self, from: NodeId, to: NodeId) -> Option<DirectionWindow> {
        let (probes, stamps) = self.book.complete(from, to)?;
        if stamps != StampClass::Nic {
            return Some(DirectionWindow {
                complete: probes.len() / 2,
                pure: 0,
                stamps,
            });
        }
        let stats = pair_probes(probes, &stamps.purity(&self.est_cfg.purity))
            .ok()?
            .stats;
        Some(DirectionWindow {
            complete: stats.pure + stats.impure + stats.spacing_rejected,
            pure: stats.pure,
            stamps,
        })
    }

    fn share_fits(&mut self, k: u64, fits: Vec<SharedFit>, now: LocalNs) -> Vec<Action> {
        if self.exchange == Exchange::Store {
            return vec![Action::PutFits(WindowFits {
                window: WindowIndex(k),
                produced_at: now,
                fits,
            })];
        }
        let Some(leader) = self.reference() else {
            return Vec::new();
        };
        let mut actions = Vec::new();
        for (i, fit) in fits.into_iter().enumerate() {
            if leader == self.me.id {
                self.relay.edges.insert((fit.from(), fit.to()), fit);
            } else {
                let seq = k.saturating_mul(64).saturating_add(i as u64);
                let payload = codec::encode_fit(&fit);
                actions.extend(self.send_record(kind::EDGE_FIT, leader, seq, payload));
            }
        }
        actions
    }

    fn start_solve(&mut self, k: u64) -> Vec<Action> {
        let Some(reference) = self.reference() else {
            return Vec::new();
        };
        let mut actions = self.take_timeline_over(k);
        if self.members.len() == 1 {
            // A lone node is its own reference: nothing to solve, but its
            // offsets file (and the GPU maps in it) must still be published.
            let lone = self.lone_result(k, reference);
            actions.extend(self.share_results(k, vec![lone]));
            return actions;
        }
        if self.exchange == Exchange::Store {
            actions.push(Action::FetchFits {
                window: WindowIndex(k),
            });
            return actions;
        }
        self.relay
            .edges
            .retain(|_, f| fresh_for_solve(k, f.window.0));
        let fits: Vec<SharedFit> = self.relay.edges.values().cloned().collect();
        actions.extend(self.solve(k, &fits));
        actions
    }

    /// At the first solve as leader: continue the timeline this node's own
    /// last result was on (see [`crate::timeline`]), and record the hand-over.
    fn take_timeline_over(&mut self, k: u64) -> Vec<Action> {
        if self.timeline != LeaderTimeline::Undecided {
            return Vec::new();
        }
        let now = self.windows.end(WindowIndex(k));
        let wander_ppb = self.est_cfg.holdover_wander_ppb;
        let continuation = self.own_result.as_ref().and_then(|r| {
            // A result read back after a restart knows its reference by id:
            // the hand-over line names it.
            let own = NodeResult {
                reference_name: Some(
                    r.reference_name
                        .clone()
                        .unwrap_or_else(|| self.name_of(r.reference)),
                ),
                ..r.clone()
            };
            Continuation::take(&own, &self.own_marks, now, wander_ppb)
        });
        let mut line = HandOverLine::new(k, &self.me.name, continuation.as_ref().map(|c| &c.carry));
        line.carried_wander_ppb_per_sqrt_s =
            continuation.as_ref().map(|c| c.wander.ppb_per_sqrt_s());
        *if continuation.is_some() {
            &mut self.counters.timelines_continued
        } else {
            &mut self.counters.timelines_started
        } += 1;
        self.timeline = continuation.map_or(LeaderTimeline::Own, LeaderTimeline::Carried);
        self.origin_marks = OwnMarks::default();
        vec![Action::HandOver(line)]
    }

    fn published_result(
        &self,
        k: u64,
        reference: NodeId,
        epoch: i64,
        n: &clockmesh_estimator::NodeEstimate,
    ) -> NodeResult {
        let mut r = self.solved_result(k, reference, epoch, n);
        self.onto_timeline(&mut r, LocalNs(epoch));
        r
    }

    /// Node estimate `n` as a result against this node's clock (whose local
    /// time at the solve epoch is `epoch`), before any carry.
    fn solved_result(
        &self,
        k: u64,
        reference: NodeId,
        epoch: i64,
        n: &clockmesh_estimator::NodeEstimate,
    ) -> NodeResult {
        let off = n.offset_rounded();
        let anchor = LocalNs(epoch) + off;
        let wander = self.est_cfg.holdover_wander_ppb * 1e-9;
        NodeResult {
            node: n.node,
            node_name: self.name_of(n.node),
            reference,
            reference_name: Some(self.name_of(reference)),
            origin: None,
            window: WindowIndex(k),
            anchor,
            offset: Nanos(-off.0),
            drift_ppb: -n.drift * 1e9,
            bound_ns: ceil_bound_ns(n.bound_ns),
            bound_growth_ppb: (n.drift_bound + wander) * 1e9,
            drift_bound_ppb: n.drift_bound * 1e9,
            hops: n.hops,
            valid_until: anchor + Nanos(self.est_cfg.max_age_ns),
            anchor_kind: published_anchor_kind(n.anchor_kind),
        }
    }

    /// A result solved against this node's clock, onto the timeline it
    /// continues, naming that timeline's origin.
    fn onto_timeline(&self, r: &mut NodeResult, epoch: LocalNs) {
        r.origin = match &self.timeline {
            LeaderTimeline::Carried(continuation) => {
                continuation.apply(r, epoch);
                continuation.origin.clone()
            }
            LeaderTimeline::Own | LeaderTimeline::Undecided => Some(self.me.name.clone()),
        };
    }

    fn name_of(&self, id: NodeId) -> String {
        self.member(id)
            .map_or_else(|| id.to_string(), |m| m.name.clone())
    }

    fn lone_result(&self, k: u64, me: NodeId) -> NodeResult {
        let anchor = self.windows.end(WindowIndex(k));
        let mut r = NodeResult {
            node: me,
            node_name: self.me.name.clone(),
            reference: me,
            reference_name: Some(self.me.name.clone()),
            origin: None,
            window: WindowIndex(k),
            anchor,
            offset: Nanos(0),
            drift_ppb: 0.0,
            bound_ns: 0,
            bound_growth_ppb: 0.0,
            drift_bound_ppb: 0.0,
            hops: 0,
            valid_until: anchor + Nanos(self.est_cfg.max_age_ns),
            anchor_kind: AnchorKind::Reference,
        };
        self.onto_timeline(&mut r, LocalNs(anchor.0));
        r
    }

    /// Hands the leader's results to every node.
    fn share_results(&mut self, k: u64, results: Vec<NodeResult>) -> Vec<Action> {
        self.last_results.clone_from(&results);
        if self.exchange == Exchange::Store {
            return vec![Action::PutResults {
                window: WindowIndex(k),
                results,
            }];
        }
        let mut actions = Vec::new();
        for r in results {
            if r.node == self.me.id {
                self.relay.result = Some(r.clone());
                actions.extend(self.publish_if_new(r));
            } else {
                let payload = codec::encode_result(&r);
                actions.extend(self.send_record(kind::RESULT, r.node, k, payload));
            }
        }
        actions
    }

    fn fetch_result(&mut self) -> Vec<Action> {
        if self.exchange == Exchange::Store {
            return vec![Action::FetchResult];
        }
        match self.relay.result.clone() {
            Some(r) => self.publish_if_new(r),
            None => Vec::new(),
        }
    }

    fn publish_if_new(&mut self, r: NodeResult) -> Vec<Action> {
        if !self.windows.take_new_result(r.window, r.anchor) {
            return Vec::new();
        }
        if let Some(held) = &self.own_result
            && publication::keeps_the_held(held, &r, &self.settings)
        {
            self.counters.results_withheld += 1;
            return Vec::new();
        }
        self.counters.results_published += 1;
        self.own_marks.record(&r);
        self.own_result = Some(r.clone());
        vec![Action::Publish(Box::new(Publication::of(
            r,
            &self.settings,
        )))]
    }

    // ---- relayed records ----

    /// A member's edge fit, for the solve (we are, or were, the leader).
    fn on_edge_fit(&mut self, header: ProbeHeader, payload: &[u8]) {
        let fit = match codec::decode_fit(payload) {
            Ok(fit) => fit,
            Err(e) => {
                self.drop_msg(record_drop(e));
                return;
            }
        };
        // A node reports only its own out-edges, between members.
        if fit.from() != header.sender || self.member(fit.to()).is_none() {
            self.drop_msg(DropReason::BadRecord);
            return;
        }
        self.counters.edge_fits_received += 1;
        self.relay.edges.insert((fit.from(), fit.to()), fit);
    }

    /// Our result from the leader.
    /// Published at once: every second between the window's end and the
    /// publication is a second more that readers extrapolate with the
    /// drift (the fetch phase then finds it published already).
    fn on_result(&mut self, header: ProbeHeader, payload: &[u8], now: LocalNs) -> Vec<Action> {
        let r = match codec::decode_result(payload) {
            Ok(r) => r,
            Err(e) => return self.drop_msg(record_drop(e)),
        };
        // Its own result, solved against the sender's clock: the sender leads.
        if r.node != self.me.id || r.reference != header.sender {
            return self.drop_msg(DropReason::BadRecord);
        }
        if !self.is_leader_heard(header.sender, now) {
            return self.drop_msg(DropReason::NotFromLeader);
        }
        self.counters.results_received += 1;
        self.relay.result = Some(r.clone());
        self.publish_if_new(r)
    }

    /// µs of work since `started` (a [`WorkClock`] reading).
    fn work_us_since(&self, started: u64) -> u64 {
        (self.work_clock)().saturating_sub(started) / 1_000
    }

    // ---- static succession ----

    fn member_ids(&self) -> Vec<NodeId> {
        self.members.iter().map(|m| m.id).collect()
    }

    /// Whether `sender`, whose result arrived, leads (under succession, a
    /// result is what shows a leader alive, or back).
    fn is_leader_heard(&mut self, sender: NodeId, now: LocalNs) -> bool {
        let ids = self.member_ids();
        let Some(s) = self.succession.as_mut() else {
            return self.reference() == Some(sender);
        };
        let (leads, change) = s.heard_result(sender, &ids, now);
        self.note_leader_change(change);
        if leads {
            self.set_leader_id(Some(sender));
        }
        leads
    }

    /// Under succession: passes over a leader silent for too long.
    fn follow_succession(&mut self, now: LocalNs) {
        if self.succession.is_none() {
            return; // an engine elects: nothing to do each tick
        }
        let ids = self.member_ids();
        let Some(s) = self.succession.as_mut() else {
            return;
        };
        let peers = &self.peers;
        let change = s.tick(&ids, now, |id| peers.get(id).map(|p| p.last_heard));
        let leader = s.leader(&ids);
        self.note_leader_change(change);
        if leader != self.reference() {
            self.set_leader_id(leader);
        }
    }

    fn note_leader_change(&mut self, change: LeaderChange) {
        match change {
            LeaderChange::Kept => {}
            LeaderChange::FailedOver { why, .. } => {
                self.counters.leader_failovers += 1;
                if why == Silence::Peer {
                    self.counters.leader_failovers_on_peer_silence += 1;
                }
            }
            LeaderChange::Returned { .. } => self.counters.leader_returns += 1,
        }
    }

    fn set_leader_id(&mut self, id: Option<NodeId>) {
        let name = id.and_then(|id| self.member(id)).map(|m| m.name.clone());
        self.handle_leader(name);
    }

    /// A protobuf record (edge fit or result) to member `to`.
    fn send_record(&self, kind: u8, to: NodeId, seq: u64, payload: Vec<u8>) -> Option<Action> {
        let addr = self.member(to).map(Member::probe_addr)?;
        let header = control_header(kind, self.me.id, to, seq);
        let msg = if kind == kind::EDGE_FIT {
            Message::EdgeFit { header, payload }
        } else {
            Message::Result { header, payload }
        };
        Some(self.send(&msg, addr))
    }
}

/// Whether fits of `window` enter the solve of window `k`: this window's,
/// or the previous one's (a node whose fits came late).
fn fresh_for_solve(k: u64, window: u64) -> bool {
    window + 1 >= k
}

fn edge_status(k: u64, h: &HistoryFit, shared: Option<&SharedFit>) -> EdgeStatus {
    let o = &h.outcome;
    let fit = shared.map(|s| &s.measurement.fit);
    EdgeStatus {
        window: k,
        offset_ns: fit.map(|f| f.offset_base_ns),
        drift_ppb: fit.map(|f| f.drift * 1e9),
        bound_ns: fit.map(|f| f.bound_ns),
        min_rtt_ns: fit.map(|f| f.min_rtt_ns),
        probes: (o.forward.probes + o.backward.probes) as u64,
        pure: (o.forward.pure + o.backward.pure) as u64,
        error: o.fit.as_ref().err().map(|e| e.to_string()),
        history_windows: h.windows,
        drift_windows: h.drift_windows,
        stamps: h.stamps.as_str().into(),
        purity_tolerance_ns: h.stamps.purity_tolerance().0,
    }
}

fn edge_line(
    k: u64,
    (me, peer): (&str, &str),
    h: &HistoryFit,
    fit: Option<&SharedFit>,
) -> EdgeLine {
    let o = &h.outcome;
    EdgeLine {
        window: k,
        node: me.to_owned(),
        from: me.to_owned(),
        to: peer.to_owned(),
        from_id: o.from,
        to_id: o.to,
        probes_forward: o.forward.probes,
        probes_backward: o.backward.probes,
        pure_forward: o.forward.pure,
        pure_backward: o.backward.pure,
        incomplete: o.forward.incomplete + o.backward.incomplete,
        spacing_rejected: o.forward.spacing_rejected + o.backward.spacing_rejected,
        impure: o.forward.impure + o.backward.impure,
        history_windows: h.windows,
        drift_windows: h.drift_windows,
        stamps: h.stamps.as_str().into(),
        purity_tolerance_ns: h.stamps.purity_tolerance().0,
        fit: fit.map(|f| FitLine::from(&f.measurement)),
        error: o.fit.as_ref().err().map(|e| e.to_string()),
    }
}

/// How a record the codec refused is counted.
fn record_drop(e: codec::RecordError) -> DropReason {
    match e {
        codec::RecordError::Malformed => DropReason::Malformed,
        codec::RecordError::Nonsense => DropReason::BadRecord,
    }
}

/// The estimator's anchor kind as published.
fn published_anchor_kind(kind: SolveAnchor) -> AnchorKind {
    match kind {
        SolveAnchor::Reference => AnchorKind::Reference,
        SolveAnchor::Substitute => AnchorKind::Substitute,
        SolveAnchor::Detached => AnchorKind::Detached,
        SolveAnchor::Holdover => AnchorKind::Holdover,
    }
}

/// Header of a follow-up, RX report, handshake or record message.
fn control_header(k: u8, sender: NodeId, receiver: NodeId, seq: u64) -> ProbeHeader {
    ProbeHeader {
        kind: k,
        ..ProbeHeader::probe(sender, receiver, seq, 0, 0)
    }
}

/// Which stamp each settled packet got, by side and source (status, metrics).
fn wire_drop_reason(e: &WireError) -> DropReason {
    match e {
        WireError::Unauthenticated => DropReason::Unauthenticated,
        WireError::BadTag => DropReason::BadTag,
        _ => DropReason::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::StampSource;
    use std::net::{IpAddr, Ipv4Addr};

    const T0: i64 = 1_700_000_000_000_000_000;

    fn member(id: u32) -> Member {
        Member {
            name: format!("n{id}"),
            id,
            addr: IpAddr::V4(Ipv4Addr::new(198, 18, 0, id as u8)),
            probe_port: 31_900,
            capabilities: 0,
        }
    }

    fn node(id: u32) -> Node {
        node_with(id, Settings::default())
    }

    fn node_with(id: u32, settings: Settings) -> Node {
        let mut n = Node::new(NodeConfig {
            me: member(id),
            settings,
            key: None,
            exchange: Exchange::Relay,
            nonce_base: 1,
            work_clock: no_work_clock,
        });
        n.handle_members(vec![member(1), member(2)], LocalNs(T0))
            .unwrap();
        n
    }

    fn datagrams(actions: &[Action]) -> Vec<Message> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send { datagram, .. } => Some(wire::parse(datagram, None).unwrap()),
                _ => None,
            })
            .collect()
    }

    /// Node 1 after its handshake with node 2, which announced `caps`.
    fn shaken(caps: u32) -> Node {
        shaken_with(caps, Settings::default())
    }

    fn shaken_with(caps: u32, settings: Settings) -> Node {
        let mut a = node_with(1, settings);
        let hello = datagrams(&a.handle_tick(LocalNs(T0)));
        let Some(Message::Hello { header, .. }) = hello.first() else {
            panic!("no hello: {hello:?}");
        };
        let ack = Message::HelloAck {
            header: control_header(kind::HELLO_ACK, 2, 1, header.seq),
            hello: Hello {
                max_version: PROBE_VERSION,
                capabilities: caps,
                probe_port: 31_900,
            },
        };
        let from = Some(member(2).probe_addr());
        let _ = a.handle_datagram(&ack.encode(None), from, &[], LocalNs(T0));
        a
    }

    /// Three of node 1's pairs to node 2 settle in one tick.
    fn reports_of_three_pairs(a: &mut Node) -> Vec<Message> {
        let stamp = |ns| WireStamp {
            realtime_ns: ns,
            bound_ns: 0,
            source: StampSource::Kernel,
        };
        for seq in 0..3 {
            let key = PairKey {
                from: 1,
                to: 2,
                seq,
            };
            a.handle_sent(2, seq, LocalNs(T0));
            a.handle_stamps(Side::Tx, key, 0, &[stamp(T0)], LocalNs(T0));
            a.handle_stamps(Side::Tx, key, 1, &[stamp(T0 + 100_000)], LocalNs(T0));
        }
        let settled = datagrams(&a.handle_tick(LocalNs(T0 + SETTLE.0 + 1)));
        let waited = datagrams(&a.handle_tick(LocalNs(T0 + SETTLE.0 + 1 + REPORT_DELAY.0)));
        [settled, waited].concat()
    }

    /// Node 3 of members 1, 2, 3 under static succession.
    fn successor() -> Node {
        successor_with(Settings::default())
    }

    fn successor_with(settings: Settings) -> Node {
        let mut n = Node::new(NodeConfig {
            me: member(3),
            settings,
            key: None,
            exchange: Exchange::Relay,
            nonce_base: 1,
            work_clock: no_work_clock,
        });
        n.handle_members(vec![member(1), member(2), member(3)], LocalNs(T0))
            .unwrap();
        n.lead_by_succession();
        n
    }

    /// `from`'s result for node 3, solved against `from`'s clock; what
    /// node 3 does with it.
    fn result_from(n: &mut Node, from: u32, window: u64, now_ns: i64) -> Vec<Action> {
        let r = NodeResult {
            window: WindowIndex(window),
            ..result_for(3, from, now_ns)
        };
        let msg = Message::Result {
            header: control_header(kind::RESULT, from, 3, window),
            payload: codec::encode_result(&r),
        };
        n.handle_datagram(
            &msg.encode(None),
            Some(member(from).probe_addr()),
            &[],
            LocalNs(now_ns),
        )
    }

    /// A result of node `node` against `reference`, anchored at `anchor_ns`.
    fn result_for(node: u32, reference: u32, anchor_ns: i64) -> NodeResult {
        NodeResult {
            node,
            node_name: format!("n{node}"),
            reference,
            reference_name: Some(format!("n{reference}")),
            origin: Some(format!("n{reference}")),
            window: WindowIndex(0),
            anchor: LocalNs(anchor_ns),
            offset: Nanos(0),
            drift_ppb: 0.0,
            bound_ns: 0,
            bound_growth_ppb: 0.0,
            drift_bound_ppb: 0.0,
            hops: 1,
            valid_until: LocalNs(anchor_ns + 12_000_000_000),
            anchor_kind: AnchorKind::Reference,
        }
    }

    fn published_windows(actions: &[Action]) -> Vec<u64> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Publish(p) => Some(p.result.window.0),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn datagrams_from_outside_are_dropped_with_their_reason() {
        let mut n = node(1);
        let from_2 = Some(member(2).probe_addr());
        let probe = |sender, receiver| {
            Message::Probe {
                header: ProbeHeader::probe(sender, receiver, 1, 0, 100_000),
            }
            .encode(None)
        };
        let cases: [(&[u8], Option<SocketAddr>, DropReason); 4] = [
            (b"not a datagram", from_2, DropReason::Malformed),
            (&probe(2, 3), from_2, DropReason::WrongReceiver),
            (&probe(9, 1), from_2, DropReason::UnknownSender),
            (
                &probe(2, 1),
                Some(SocketAddr::new(
                    IpAddr::V4(Ipv4Addr::new(198, 18, 0, 99)),
                    31_900,
                )),
                DropReason::SourceMismatch,
            ),
        ];
        for (bytes, from, reason) in cases {
            let actions = n.handle_datagram(bytes, from, &[], LocalNs(T0));
            assert!(actions.is_empty(), "{reason:?}: {actions:?}");
            assert_eq!(n.dropped().get(reason), 1, "{reason:?}");
        }
        assert_eq!(n.dropped().total(), 4);
    }

    #[test]
    fn a_member_list_without_this_node_deregisters_it() {
        let mut n = node(1);
        let err = n
            .handle_members(vec![member(2), member(3)], LocalNs(T0))
            .unwrap_err();
        assert!(
            matches!(err, NodeError::Deregistered(ref name) if name == "n1"),
            "{err}"
        );
        assert!(
            n.handle_members(vec![member(1), member(3)], LocalNs(T0))
                .is_ok()
        );
    }

    fn place_of(graph: &ProbeGraph, all: &[Member], id: NodeId, leaders: &[&str]) -> Place {
        Place::all(graph, all, leaders)
            .find(|(m, _)| m.id == id)
            .map(|(_, place)| place)
            .expect("a member")
    }

    /// A node given only its place (by the leader) probes and answers the
    /// same peers, at the same addresses, as one given every member, and
    /// finds the leader; a place without it deregisters it.
    #[test]
    fn a_handed_out_place_gives_the_peers_the_whole_list_gives() {
        let all: Vec<Member> = (1..=40).map(member).collect();
        let ids: Vec<NodeId> = all.iter().map(|m| m.id).collect();
        let graph = ProbeGraph::build(&ids, Settings::default().degree);
        let peers_of =
            |n: &Node| -> Vec<(NodeId, SocketAddr)> { n.peers().map(|p| (p.id, p.addr)).collect() };
        let bare = |id| {
            Node::new(NodeConfig {
                me: member(id),
                settings: Settings::default(),
                key: None,
                exchange: Exchange::Relay,
                nonce_base: 1,
                work_clock: no_work_clock,
            })
        };
        for me in [1, 17, 40] {
            let mut whole = bare(me);
            let _ = whole.handle_members(all.clone(), LocalNs(T0)).unwrap();
            let mut placed = bare(me);
            let place = place_of(&graph, &all, me, &["n5"]);
            assert_eq!(place.total, 40);
            assert!(place.members.len() < 20, "{}", place.members.len());
            let _ = placed
                .handle_membership(Membership::Place(place.clone()), LocalNs(T0))
                .unwrap();
            assert_eq!(peers_of(&placed), peers_of(&whole), "node {me}");
            assert!(!peers_of(&placed).is_empty());
            assert_eq!(
                placed.graph().neighbourhood(me),
                whole.graph().neighbourhood(me)
            );
            placed.handle_leader(Some("n5".into()));
            assert_eq!(placed.reference(), Some(5));
            let again = placed.handle_membership(Membership::Place(place), LocalNs(T0));
            assert!(again.unwrap().is_empty(), "the same place changes nothing");
            assert!(
                placed
                    .handle_membership(Membership::Pending, LocalNs(T0))
                    .unwrap()
                    .is_empty()
            );
            assert_eq!(peers_of(&placed), peers_of(&whole), "pending keeps them");
        }
        let elsewhere = place_of(&graph, &all, 2, &[]);
        let err = node(1)
            .handle_membership(
                Membership::Place(Place {
                    members: vec![member(2)],
                    ..elsewhere
                }),
                LocalNs(T0),
            )
            .unwrap_err();
        assert!(matches!(err, NodeError::Deregistered(_)), "{err}");
    }

    /// Node 2's hand-over line when it becomes leader, ticking through
    /// two windows from `T0`.
    fn hand_over_of(n: &mut Node) -> Option<HandOverLine> {
        n.handle_leader(Some("n2".into()));
        let w = Settings::default().window().0;
        (0..=2 * w / 100_000_000)
            .flat_map(|i| n.handle_tick(LocalNs(T0 + i * 100_000_000)))
            .find_map(|a| match a {
                Action::HandOver(line) => Some(line),
                _ => None,
            })
    }

    #[test]
    fn a_new_leader_carries_its_last_result_and_a_fresh_one_starts_a_timeline() {
        let mut fresh = node(2);
        let line = hand_over_of(&mut fresh).expect("a hand-over at the first solve");
        assert_eq!(
            (line.reference.as_str(), line.carried_offset_ns),
            ("n2", None)
        );
        assert_eq!(fresh.counters().timelines_started, 1);

        let mut resumed = node(2);
        resumed.resume_from(NodeResult {
            offset: Nanos(-5_000_000),
            drift_ppb: 20_000.0,
            bound_ns: 300,
            bound_growth_ppb: 10.0,
            ..result_for(2, 1, T0)
        });
        let line = hand_over_of(&mut resumed).expect("a hand-over at the first solve");
        assert_eq!(line.previous_reference.as_deref(), Some("n1"));
        assert_eq!(line.carried_offset_ns, Some(-5_000_000));
        assert_eq!(line.carried_drift_ppb, Some(20_000.0));
        // The bound grew at 10 ns/s from the anchor to the hand-over.
        let bound = line.carried_bound_ns.unwrap();
        assert!((300..=400).contains(&bound), "{bound}");
        assert_eq!(resumed.counters().timelines_continued, 1);
        // Another node's result is not carried.
        let mut other = node(2);
        other.resume_from(result_for(1, 0, T0));
        assert_eq!(hand_over_of(&mut other).unwrap().carried_offset_ns, None);
    }

    /// The results a node publishes while ticking every 100 ms for
    /// `seconds` from `T0`.
    fn published_over(n: &mut Node, seconds: i64) -> Vec<NodeResult> {
        (0..seconds * 10)
            .flat_map(|i| n.handle_tick(LocalNs(T0 + i * 100_000_000)))
            .filter_map(|a| match a {
                Action::Publish(p) => Some(p.result),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_new_reference_s_bound_covers_its_carry_and_grows_with_the_time_since() {
        let mut n = Node::new(NodeConfig {
            me: member(2),
            settings: Settings::default(),
            key: None,
            exchange: Exchange::Relay,
            nonce_base: 1,
            work_clock: no_work_clock,
        });
        // The last member left: it leads alone, its own result solved as 0.
        n.handle_members(vec![member(2)], LocalNs(T0)).unwrap();
        n.resume_from(NodeResult {
            offset: Nanos(4_000),
            drift_ppb: 2.0,
            bound_ns: 300,
            drift_bound_ppb: 5.0,
            bound_growth_ppb: 25.0,
            ..result_for(2, 1, T0)
        });
        n.handle_leader(Some("n2".into()));
        let published = published_over(&mut n, 120);
        assert!(published.len() > 100, "{} results", published.len());
        let wander = n.estimator_config().holdover_wander_ppb;
        let growth = 5.0 + wander;
        for r in &published {
            // The carry's bound at the anchor: never less than the
            // carried bound grown from the carried result's anchor.
            let since_s = r.anchor.secs_since(LocalNs(T0));
            assert!(
                r.bound_ns as f64 >= 300.0 + growth * since_s - 1.0,
                "window {}: bound {} after {since_s} s",
                r.window,
                r.bound_ns
            );
            assert!(r.bound_growth_ppb >= growth, "{}", r.bound_growth_ppb);
            assert_eq!(r.reference, 2);
            // The continued timeline keeps the origin it carried.
            assert_eq!(r.origin.as_deref(), Some("n1"));
        }
        let last = published.last().unwrap();
        assert!(last.bound_ns > 300 + 100 * 25, "bound {}", last.bound_ns);
        // The origin is no member: nothing to steer toward.
        assert_eq!(n.counters().timelines_steered, 0);
    }

    /// An edge fit of window `k` that puts the two members' clocks together
    /// at the window's end.
    fn fit_between(n: &Node, k: u64, (from, to): (u32, u32)) -> SharedFit {
        let fit = clockmesh_estimator::EdgeFit {
            epoch_ns: n.windows.end(WindowIndex(k)).0,
            offset_base_ns: 0,
            offset_rel_ns: 0.0,
            drift: 0.0,
            margin_ns: 0.0,
            min_rtt_ns: 2_000.0,
            bound_ns: 500.0,
            drift_bound: 1e-8,
            forward_points: 20,
            backward_points: 20,
            trimmed: 0,
            span_ns: 2_000_000_000,
        };
        SharedFit {
            window: WindowIndex(k),
            from_name: format!("n{from}"),
            to_name: format!("n{to}"),
            measurement: EdgeMeasurement::new(from, to, fit),
        }
    }

    /// The store leader's solve of the window it next asks fits for, from
    /// `fits`; the actions it returns.
    fn store_solve(n: &mut Node, t: &mut i64, fits: &[(u32, u32)]) -> Vec<Action> {
        let window = loop {
            *t += 100_000_000;
            let asked = n
                .handle_tick(LocalNs(*t))
                .into_iter()
                .find_map(|a| match a {
                    Action::FetchFits { window } => Some(window),
                    _ => None,
                });
            if let Some(w) = asked {
                break w;
            }
        };
        let snapshot = WindowFits {
            window,
            produced_at: LocalNs(*t),
            fits: fits.iter().map(|&e| fit_between(n, window.0, e)).collect(),
        };
        n.solve_snapshots(window, [&snapshot])
    }

    fn steered_toward(actions: &[Action]) -> Option<String> {
        actions.iter().find_map(|a| match a {
            Action::HandOver(line) => line.steered_toward.clone(),
            _ => None,
        })
    }

    #[test]
    fn a_carry_is_steered_toward_its_origin_only_while_the_origin_reports() {
        let mut n = Node::new(NodeConfig {
            me: member(2),
            settings: Settings::default(),
            key: None,
            exchange: Exchange::Store,
            nonce_base: 1,
            work_clock: no_work_clock,
        });
        n.handle_members(vec![member(1), member(2)], LocalNs(T0))
            .unwrap();
        // Its last result was on n1's timeline, 5 µs off (the origin n1).
        n.resume_from(NodeResult {
            offset: Nanos(5_000),
            bound_ns: 300,
            bound_growth_ppb: 10.0,
            ..result_for(2, 1, T0)
        });
        n.handle_leader(Some("n2".into()));
        let mut t = T0;
        let both = store_solve(&mut n, &mut t, &[(2, 1), (1, 2)]);
        assert_eq!(steered_toward(&both).as_deref(), Some("n1"), "{both:?}");
        assert_eq!(n.counters().timelines_steered, 1);
        // n1 silent: only n2's own fit places it, extrapolated. Not steered.
        let mine = store_solve(&mut n, &mut t, &[(2, 1)]);
        assert_eq!(steered_toward(&mine), None, "{mine:?}");
        assert!(mine.iter().any(|a| matches!(a, Action::PutResults { .. })));
        assert_eq!(n.counters().timelines_steered, 1);
    }

    #[test]
    fn under_succession_a_silent_leader_is_passed_over_and_its_return_taken_back() {
        let w = Settings::default().window().0;
        let mut n = successor();
        let _ = n.handle_tick(LocalNs(T0));
        assert_eq!(n.leader(), Some("n1"), "the lowest id leads first");
        let refused = result_from(&mut n, 2, 1, T0 + w);
        assert_eq!(
            n.dropped().get(DropReason::NotFromLeader),
            1,
            "2 does not lead yet"
        );
        assert!(published_windows(&refused).is_empty());
        let taken = result_from(&mut n, 1, 1, T0 + w);
        assert_eq!(n.counters().results_received, 1);
        assert_eq!(published_windows(&taken), [1], "published on arrival");
        // 1 falls silent: passed over after the results rule's silence.
        let silent = crate::succession::results_silence(Nanos(w)).0;
        let _ = n.handle_tick(LocalNs(T0 + w + silent));
        assert_eq!(n.leader(), Some("n1"), "not yet");
        let _ = n.handle_tick(LocalNs(T0 + w + silent + 1));
        assert_eq!(n.leader(), Some("n2"));
        assert_eq!(n.counters().leader_failovers, 1);
        // Windows of the new leader's result and of the old one's return.
        let k2 = 2 + silent / w;
        let k3 = k2 + silent / w + 2;
        result_from(&mut n, 2, k2 as u64, T0 + k2 * w);
        assert_eq!(
            n.counters().results_received,
            2,
            "the new leader's result is taken"
        );
        // 2 falls silent too, and this node hears nobody: it does not lead
        // itself (its readers hold the last result over).
        let _ = n.handle_tick(LocalNs(T0 + k2 * w + silent + 1));
        assert_eq!((n.leader(), n.is_leader()), (Some("n2"), false));
        assert_eq!(n.counters().leader_failovers, 1);
        // 1 is back: its result shows it leads again.
        result_from(&mut n, 1, k3 as u64, T0 + k3 * w);
        assert_eq!(n.leader(), Some("n1"));
        assert_eq!(n.counters().leader_returns, 1);
        assert_eq!(n.counters().results_received, 3);
    }

    #[test]
    fn under_succession_a_leader_its_peers_stop_hearing_is_passed_over_sooner() {
        // Windows long enough that the results rule (FAILOVER_WINDOWS of
        // them) comes later than the peer rule.
        let settings = Settings {
            probe_window: Nanos::from_secs(4),
            ..Settings::default()
        };
        let w = settings.window().0;
        let silence = crate::succession::PEER_SILENCE.0.max(w);
        let mut n = successor_with(settings);
        let _ = n.handle_tick(LocalNs(T0));
        result_from(&mut n, 1, 1, T0 + w);
        // 1 sends nothing more; 2 is still heard (any valid datagram).
        let _ = result_from(&mut n, 2, 2, T0 + w + silence);
        let _ = n.handle_tick(LocalNs(T0 + w + silence));
        assert_eq!(n.leader(), Some("n1"), "not yet");
        let _ = n.handle_tick(LocalNs(T0 + w + silence + 1));
        assert_eq!(n.leader(), Some("n2"));
        let c = n.counters();
        assert_eq!(
            (c.leader_failovers, c.leader_failovers_on_peer_silence),
            (1, 1)
        );
    }

    #[test]
    fn reports_to_a_peer_that_takes_batches_share_one_datagram() {
        let mut a = shaken(wire::capability::WARMUP | wire::capability::STAMP_BATCH);
        let sent = reports_of_three_pairs(&mut a);
        let [Message::StampBatch { entries, header }] = sent.as_slice() else {
            panic!("expected one batch: {sent:?}");
        };
        assert_eq!(header.receiver, 2);
        let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [0, 1, 2]);
        assert!(entries.iter().all(|e| e.report == Report::FollowUp));
        assert_eq!(a.counters().follow_ups_sent, 3);
    }

    /// Queues `n` settled-to-be pairs' TX reports (1 → 2) stamped at `at`.
    fn queue_tx_reports(a: &mut Node, n: u64, at: i64) {
        let stamp = WireStamp {
            realtime_ns: at,
            bound_ns: 0,
            source: StampSource::Kernel,
        };
        for seq in 0..n {
            let key = PairKey {
                from: 1,
                to: 2,
                seq,
            };
            a.handle_sent(2, seq, LocalNs(at));
            a.handle_stamps(Side::Tx, key, 0, &[stamp], LocalNs(at));
            a.handle_stamps(Side::Tx, key, 1, &[stamp], LocalNs(at));
        }
    }

    fn batch_sizes(actions: &[Action]) -> Vec<usize> {
        datagrams(actions)
            .iter()
            .map(|m| match m {
                Message::StampBatch { entries, .. } => entries.len(),
                other => panic!("not a batch: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_batch_waits_for_more_reports_unless_it_is_full() {
        // Windows longer than the wait, so that no window's end sends the
        // batch first.
        let settings = Settings {
            probe_window: Nanos::from_secs(4),
            ..Settings::default()
        };
        let window_ns = settings.window().0;
        let mut a = shaken_with(wire::capability::STAMP_BATCH, settings);
        // In a window (T0 starts one) past the previous one's flush, early
        // enough that no window ends in what follows.
        let base = T0 + SETTLE.0 + 50_000_000;
        assert!(base + SETTLE.0 + REPORT_DELAY.0 < T0 + window_ns);
        assert!(datagrams(&a.handle_tick(LocalNs(base))).is_empty());
        queue_tx_reports(&mut a, MAX_BATCH_ENTRIES as u64 + 3, base);
        let settled = base + SETTLE.0 + 1;
        assert_eq!(
            batch_sizes(&a.handle_tick(LocalNs(settled))),
            [MAX_BATCH_ENTRIES]
        );
        assert!(datagrams(&a.handle_tick(LocalNs(settled + REPORT_DELAY.0 - 1))).is_empty());
        assert_eq!(
            batch_sizes(&a.handle_tick(LocalNs(settled + REPORT_DELAY.0))),
            [3]
        );
    }

    #[test]
    fn a_window_s_last_reports_are_sent_before_the_peers_fit_it() {
        let mut a = shaken(wire::capability::STAMP_BATCH);
        let window_end = T0 + Settings::default().window().0;
        let last_pairs = window_end - 100_000_000;
        assert!(datagrams(&a.handle_tick(LocalNs(last_pairs))).is_empty());
        queue_tx_reports(&mut a, 3, last_pairs);
        // Settled after the window's end, but not yet the window's last pairs.
        let settled = last_pairs + SETTLE.0 + 1;
        assert!(datagrams(&a.handle_tick(LocalNs(settled))).is_empty());
        // Those settle by SETTLE.0 after the end: everything goes then,
        // long before REPORT_DELAY.0 and before the peer's fit.
        let sent = window_end + SETTLE.0;
        assert!(sent - last_pairs < REPORT_DELAY.0);
        assert_eq!(batch_sizes(&a.handle_tick(LocalNs(sent))), [3]);
    }

    #[test]
    fn a_peer_without_batches_gets_one_follow_up_per_pair() {
        let mut a = shaken(wire::capability::WARMUP);
        let sent = reports_of_three_pairs(&mut a);
        assert_eq!(sent.len(), 3, "{sent:?}");
        assert!(sent.iter().all(|m| matches!(m, Message::FollowUp { .. })));
    }

    #[test]
    fn a_batch_fills_the_pair_book_like_single_reports() {
        let mut b = node(2);
        let stamps = [WireStamp::MISSING; 2];
        let batch = Message::StampBatch {
            header: control_header(kind::STAMP_BATCH, 1, 2, 7),
            entries: vec![
                BatchEntry {
                    report: Report::FollowUp,
                    seq: 4,
                    stamps,
                },
                BatchEntry {
                    report: Report::RxReport,
                    seq: 5,
                    stamps,
                },
            ],
        };
        let from = Some(member(1).probe_addr());
        let _ = b.handle_datagram(&batch.encode(None), from, &[], LocalNs(T0));
        assert_eq!(b.counters().stamp_batches_received, 1);
        assert_eq!(b.counters().follow_ups_received, 1);
        assert_eq!(b.counters().rx_reports_received, 1);
    }
}
