//! Protocol mode: every simulated host runs the agent's own state machine
//! ([`clockmesh_core::node::Node`]) with the agent's settings
//! (`[agent]`, default: what ships). Datagrams — probes, follow-ups, RX
//! reports, handshakes, relayed fits and results — travel over simulated
//! links with the scenario's delays, queues and loss; stamps are readings of
//! the simulated clocks with the scenario's stamp errors. The store of the
//! etcd exchange is modelled in memory. Each published result is scored
//! against the truth, and every message and byte is counted.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap, HashMap},
    net::{IpAddr, Ipv4Addr, SocketAddr},
};

use clockmesh_common::ProbeHeader;
use clockmesh_core::{
    codec,
    collector::{PairKey, Side},
    node::{Action, Exchange, LocalNs, Member, Node, NodeConfig, TICK, Target, targets_in_round},
    probe_rate::rounds_per_cadence,
    result::NodeResult,
    tally::{DropCounts, NodeCounters},
    time::Nanos,
    timeline::{Carry, HandOverLine},
    wire::{Message, StampSource, WireStamp, kind},
};
use clockmesh_estimator::NodeId;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use crate::{
    cluster::{Clocks, Noise, READING_BASE_NS, rng_from_seed},
    error::SimError,
    recovery::{Answer, RecoveryReport, RecoveryRule, RecoveryScores, SAMPLES_PER_WINDOW},
    report::Quantiles,
    scenario::Scenario,
};

/// Time before scoring starts: handshakes, the first partial window and
/// the first short histories (8 s: two windows of 4 s, four of 2 s), the
/// same stretch whatever the window, so that windows of any length are
/// scored over the same steady state.
const WARMUP_NS: i64 = 8_000_000_000;

/// [`WARMUP_NS`] in windows of `window_ns` (rounded up, at least 2).
fn warmup_windows(window_ns: i64) -> u32 {
    let windows = clockmesh_core::settings::windows_covering(Nanos(WARMUP_NS), Nanos(window_ns));
    u32::try_from(windows).unwrap_or(u32::MAX).max(2)
}

/// Probe port of every simulated agent.
const PORT: u16 = 31900;

/// Messages and bytes of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Traffic {
    pub messages: f64,
    pub bytes: f64,
}

impl Traffic {
    fn add(&mut self, bytes: usize) {
        self.messages += 1.0;
        self.bytes += bytes as f64;
    }

    fn scaled(self, by: f64) -> Self {
        Traffic {
            messages: self.messages * by,
            bytes: self.bytes * by,
        }
    }
}

/// What one host sent and received, by flow.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostTraffic {
    /// Probes, follow-ups, RX reports, handshakes.
    pub probing_out: Traffic,
    pub probing_in: Traffic,
    /// Fits and results: relayed datagrams, or store requests and answers.
    pub coordination_out: Traffic,
    pub coordination_in: Traffic,
}

impl HostTraffic {
    fn scaled(&self, by: f64) -> Self {
        HostTraffic {
            probing_out: self.probing_out.scaled(by),
            probing_in: self.probing_in.scaled(by),
            coordination_out: self.coordination_out.scaled(by),
            coordination_in: self.coordination_in.scaled(by),
        }
    }
}

/// The result of a protocol-mode run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProtocolReport {
    pub scenario: String,
    pub nodes: u32,
    pub exchange: Exchange,
    pub settings: clockmesh_core::settings::Settings,
    /// Windows whose results were scored (after the warm-up).
    pub windows: usize,
    /// Results published after the warm-up, over all non-reference nodes.
    pub results: usize,
    /// Non-reference nodes that published no result after the warm-up.
    pub nodes_without_result: usize,
    /// |published offset − true offset| at the result's anchor.
    pub abs_error_ns: Quantiles,
    /// Fraction of results whose true error lies inside the published bound.
    pub coverage: f64,
    pub median_bound_ns: f64,
    /// Results on a continued timeline (after a hand-over), judged against
    /// the original one (the first reference's clock): how many, and the
    /// fraction within their published bound of it, at the anchor.
    #[serde(default)]
    pub continued_results: usize,
    #[serde(default)]
    pub coverage_vs_original: f64,
    /// Their |error| against the original timeline over their bound: how
    /// much of the bound the distance uses (≤ 1 when covered).
    #[serde(default)]
    pub error_to_bound_vs_original: Quantiles,
    /// Their published bounds: what the carry (or the pin to the origin)
    /// adds to every bound on a continued timeline.
    #[serde(default)]
    pub bound_vs_original_ns: Quantiles,
    /// |error| when the result was published (what a reader sees first:
    /// the result is anchored at its window's end and published later).
    pub published_abs_error_ns: Quantiles,
    /// |published drift − true drift| at the anchor, ppb: what ages the
    /// result between updates.
    pub drift_abs_error_ppb: Quantiles,
    /// A result just before the next replaced it, bound grown by its growth rate.
    pub aged_abs_error_ns: Quantiles,
    /// The same aged |error| for an oracle that knew the true offset and
    /// rate at each result's anchor: what the clocks' wander alone adds by
    /// the time the next result replaces it. The best prediction from
    /// anything known at the anchor, so no estimator's aged error is lower
    /// on average; the floor under the aged figure.
    #[serde(default)]
    pub aged_floor_abs_error_ns: Quantiles,
    /// The aged |error| of each result had its drift been the true rate at
    /// its anchor: its own offset error there plus the wander after it.
    /// What the result's offsets allow aged, whatever the drift estimate;
    /// the aged figure's excess over it is the drift estimate's share.
    #[serde(default)]
    pub aged_true_rate_abs_error_ns: Quantiles,
    pub aged_coverage: f64,
    /// Per window, at the leader.
    pub leader_traffic: HostTraffic,
    /// Per window, mean over the other nodes.
    pub node_traffic: HostTraffic,
    /// Per window, the busiest other node's coordination traffic in + out.
    pub node_coordination_max: Traffic,
    /// The nodes' own counters, summed.
    pub counters: NodeCounters,
    /// The leader's solves.
    pub solves: u64,
    /// Datagrams the nodes dropped, by reason, summed.
    pub dropped: DropCounts,
    /// Leader changes (`leader_change`): how far the continued timeline
    /// stepped from the old one, against the bound the new leader carried.
    pub hand_overs: Vec<HandOverScore>,
    /// `isolation`: the isolated nodes' readers after it, against controls.
    pub recovery: Option<RecoveryReport>,
    /// Per scored window: its results' |error| at the anchor and the
    /// worst node (does an error grow with time, and whose?).
    pub per_window: Vec<WindowTrace>,
    pub datagrams_lost: u64,
    pub events: u64,
    pub wall_ms: f64,
}

/// One scored window's results at their anchor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowTrace {
    pub window: u64,
    pub results: usize,
    pub abs_error_ns: Quantiles,
    pub drift_abs_error_ppb: Quantiles,
    /// The host of the window's largest |error|.
    pub worst_node: usize,
}

impl WindowTrace {
    fn of(window: u64, results: &[(usize, f64, f64)]) -> Self {
        let worst = results.iter().max_by(|a, b| a.1.total_cmp(&b.1));
        WindowTrace {
            window,
            results: results.len(),
            abs_error_ns: Quantiles::of(&mut results.iter().map(|r| r.1).collect::<Vec<_>>()),
            drift_abs_error_ppb: Quantiles::of(
                &mut results.iter().map(|r| r.2).collect::<Vec<_>>(),
            ),
            worst_node: worst.map_or(0, |w| w.0),
        }
    }
}

/// One hand-over of the global timeline, against the truth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HandOverScore {
    /// The new leader carried the old timeline (false: a new one started).
    pub carried: bool,
    /// New timeline − old timeline at the hand-over (true values), ns.
    pub step_ns: f64,
    pub carried_bound_ns: f64,
    /// The new leader's measured wander against the old timeline, ppb/√s.
    #[serde(default)]
    pub carried_wander_ppb_per_sqrt_s: f64,
}

/// How the global timeline relates to the simulated clocks: a node's
/// reading, plus (after a hand-over) the carry that continues the old one.
#[derive(Clone, Debug)]
struct TimelineDef {
    node: NodeId,
    carry: Option<Carry>,
}

#[derive(Debug)]
enum Event {
    Tick(usize),
    /// One round of coded pairs from a host to every target.
    SendRound(usize),
    /// Leadership moves to this host (`leader_change`).
    LeaderChange(usize),
    /// The isolated nodes' and the controls' readers are read (`isolation`).
    ReadReaders,
    Deliver {
        to: usize,
        from: SocketAddr,
        datagram: Vec<u8>,
        /// Probes carry the receiver's stamp, taken on arrival.
        probe: bool,
    },
}

struct Scheduled {
    at: i64,
    order: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.order) == (o.at, o.order)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(o.at, o.order))
    }
}

struct Host {
    node: Node,
    /// Probed every round, as the agent's sender does.
    targets: Vec<Target>,
    rounds: usize,
    next_seq: u64,
    last_result: Option<NodeResult>,
    traffic: HostTraffic,
}

/// The modelled shared store (etcd exchange).
#[derive(Default)]
struct StoreModel {
    /// As the agent's store keeps them: encoded by the codec.
    edges: BTreeMap<String, Vec<u8>>,
    results: BTreeMap<String, Vec<u8>>,
}

#[derive(Default)]
struct Scores {
    windows: std::collections::BTreeSet<u64>,
    errors: Vec<f64>,
    bounds: Vec<f64>,
    covered: usize,
    aged_errors: Vec<f64>,
    aged_floor_errors: Vec<f64>,
    aged_true_rate_errors: Vec<f64>,
    aged_covered: usize,
    /// Results on a continued timeline, and those within their bound of
    /// the original timeline.
    continued: usize,
    continued_covered: usize,
    /// Their |error| against the original timeline over their bound.
    continued_error_to_bound: Vec<f64>,
    continued_bound: Vec<f64>,
    published_errors: Vec<f64>,
    drift_errors: Vec<f64>,
    /// Per window: each result's host, |error| and |drift error| (ppb).
    by_window: BTreeMap<u64, Vec<(usize, f64, f64)>>,
}

struct Sim<'a> {
    s: &'a Scenario,
    clocks: Clocks,
    noise: Noise,
    rng: ChaCha8Rng,
    hosts: Vec<Host>,
    by_addr: HashMap<IpAddr, usize>,
    delays: HashMap<(usize, usize), (f64, f64)>,
    queue: BinaryHeap<Reverse<Scheduled>>,
    order: u64,
    now: i64,
    score_from: i64,
    store: StoreModel,
    scores: Scores,
    /// The timeline each reference's results are on, by reference id.
    timelines: HashMap<NodeId, TimelineDef>,
    /// Member id of the node whose timeline results are on now.
    current_reference: NodeId,
    hand_overs: Vec<HandOverScore>,
    /// `isolation`: its nodes are cut off between these true times, ns.
    isolated_span: (i64, i64),
    recovery: RecoveryScores,
    lost: u64,
    events: u64,
}

/// Runs the scenario with the real protocol.
pub fn run_protocol(s: &Scenario) -> Result<ProtocolReport, SimError> {
    s.validate()?;
    let started = std::time::Instant::now();
    let window_ns = s.agent.window().0;
    let warmup = warmup_windows(window_ns);
    let total_windows = s.windows + warmup;
    // One more window so the last scored window's result is fetched.
    let end = window_ns * (i64::from(total_windows) + 1);
    let mut sim = Sim::new(s, end as f64 + window_ns as f64);
    sim.score_from = window_ns * i64::from(warmup);
    sim.start()?;
    if let Some(c) = s.leader_change {
        let at = window_ns * i64::from(warmup + c.after_window);
        sim.schedule(at, Event::LeaderChange(c.to as usize));
    }
    sim.isolate(warmup);
    while let Some(Reverse(next)) = sim.queue.pop() {
        if next.at > end {
            break;
        }
        sim.now = next.at;
        sim.events += 1;
        sim.handle(next.event);
    }
    Ok(sim.report(started.elapsed().as_secs_f64() * 1e3))
}

fn member(i: usize) -> Member {
    let id = i as u32 + 1;
    Member {
        name: format!("node-{i:05}"),
        id,
        // 198.18.0.0/15, the benchmarking range the tests use.
        addr: IpAddr::V4(Ipv4Addr::from(0xC612_0000u32 + id)),
        probe_port: PORT,
        capabilities: 0,
    }
}

/// Real monotonic ns: the cost of the hosts' own work (fits, solves).
fn real_monotonic_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let elapsed = START.get_or_init(std::time::Instant::now).elapsed();
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

impl<'a> Sim<'a> {
    fn new(s: &'a Scenario, horizon_ns: f64) -> Self {
        let stream = |k: u64| rng_from_seed(s.seed.wrapping_mul(4).wrapping_add(k));
        let clocks = Clocks::generate(s, horizon_ns, &mut stream(0));
        let members: Vec<Member> = (0..s.nodes as usize).map(member).collect();
        let hosts = members
            .iter()
            .map(|m| Host {
                node: Node::new(NodeConfig {
                    me: m.clone(),
                    settings: s.agent.clone(),
                    key: None,
                    exchange: s.exchange,
                    nonce_base: u64::from(m.id) << 32,
                    // The hosts' own work is not simulated time: its real
                    // cost is what the report's fit and solve times show.
                    work_clock: real_monotonic_ns,
                }),
                targets: Vec::new(),
                rounds: 0,
                next_seq: 1,
                last_result: None,
                traffic: HostTraffic::default(),
            })
            .collect();
        Sim {
            s,
            clocks,
            noise: Noise::new(s),
            rng: stream(2),
            hosts,
            by_addr: members
                .iter()
                .enumerate()
                .map(|(i, m)| (m.addr, i))
                .collect(),
            delays: HashMap::new(),
            queue: BinaryHeap::new(),
            order: 0,
            now: 0,
            score_from: 0,
            store: StoreModel::default(),
            scores: Scores::default(),
            timelines: HashMap::new(),
            current_reference: s.reference + 1,
            hand_overs: Vec::new(),
            isolated_span: (0, 0),
            recovery: RecoveryScores::default(),
            lost: 0,
            events: 0,
        }
    }

    fn start(&mut self) -> Result<(), SimError> {
        let mut members: Vec<Member> = (0..self.s.nodes as usize).map(member).collect();
        members.sort();
        let leader = member(self.s.reference as usize).name;
        for i in 0..self.hosts.len() {
            let now = self.local_now(i);
            let host = &mut self.hosts[i];
            host.node.handle_leader(Some(leader.clone()));
            let actions = host
                .node
                .handle_members(members.clone(), LocalNs(now))
                .map_err(|e| SimError::Invalid(e.to_string()))?;
            self.perform(i, actions);
            let phase = self.rng.random_range(0..TICK.0);
            self.schedule(phase, Event::Tick(i));
            let cadence = self.s.agent.cadence().0.max(1);
            let phase = self.rng.random_range(0..cadence);
            self.schedule(phase, Event::SendRound(i));
        }
        Ok(())
    }

    /// Cuts the scenario's isolated nodes off for their span and schedules
    /// their readers' (and the controls') readings after it.
    fn isolate(&mut self, warmup: u32) {
        let Some(iso) = &self.s.isolation else {
            return;
        };
        let window_ns = self.s.agent.window().0;
        let from = window_ns * i64::from(warmup + iso.after_window);
        let until = from + window_ns * i64::from(iso.windows);
        self.isolated_span = (from, until);
        let isolated: Vec<usize> = iso.nodes.iter().map(|&n| n as usize).collect();
        let leaders: Vec<usize> = self.s.leading_nodes().map(|n| n as usize).collect();
        self.recovery = RecoveryScores::new(self.hosts.len(), &isolated, &leaders);
        let step = window_ns / i64::from(SAMPLES_PER_WINDOW);
        let readings = self.recovery_rule().reading_windows() * SAMPLES_PER_WINDOW;
        for k in 0..i64::from(readings) {
            self.schedule(until + k * step, Event::ReadReaders);
        }
    }

    /// The restated recovery rule for the scenario's isolation.
    fn recovery_rule(&self) -> RecoveryRule {
        let down = self.s.isolation.as_ref().map_or(0, |iso| iso.windows);
        let stamps = self.s.timestamps.stamp_class();
        RecoveryRule::for_fault(stamps, down, self.s.agent.window().0)
    }

    /// Whether the link between hosts `i` and `j` is cut now (`isolation`).
    fn cut_off(&self, i: usize, j: usize) -> bool {
        self.is_isolated(i) || self.is_isolated(j)
    }

    /// Whether host `i` is cut off the network now, the store included.
    fn is_isolated(&self, i: usize) -> bool {
        let (from, until) = self.isolated_span;
        (from..until).contains(&self.now)
            && self
                .s
                .isolation
                .as_ref()
                .is_some_and(|iso| iso.nodes.contains(&(i as u32)))
    }

    /// An isolated host's first result about a window after its links
    /// came back.
    fn note_resumed(&mut self, i: usize, r: &NodeResult) {
        let until = self.isolated_span.1;
        let window_ns = self.s.agent.window().0;
        // Local clocks are within a few ms of true time; windows are seconds.
        let about_after = r.anchor.0 - READING_BASE_NS > until + window_ns / 2;
        if about_after {
            let since_end = (self.now - until) as f64 / window_ns as f64;
            self.recovery.resumed(i, since_end);
        }
    }

    /// Every watched reader answers from its node's last result, as the
    /// published file would (the value a reader extrapolates, and its
    /// bound grown at the published rate).
    fn read_readers(&mut self) {
        let since_end = (self.now - self.isolated_span.1) as f64 / self.s.agent.window().0 as f64;
        let mut recovery = std::mem::take(&mut self.recovery);
        recovery.read_all(since_end, |i| {
            let r = self.hosts[i].last_result.as_ref()?;
            let (err, bound) = self.error_at(i, r, self.local_now(i));
            let (at_anchor, _) = self.error_at(i, r, r.anchor.0);
            Some(Answer {
                error_ns: err.abs(),
                bound_ns: bound,
                at_anchor_ns: at_anchor.abs(),
            })
        });
        self.recovery = recovery;
    }

    fn schedule(&mut self, at: i64, event: Event) {
        self.order += 1;
        self.queue.push(Reverse(Scheduled {
            at,
            order: self.order,
            event,
        }));
    }

    /// Host `i`'s clock now, as the agent reads it (ns since the epoch).
    fn local_now(&self, i: usize) -> i64 {
        READING_BASE_NS + self.clocks.reading(i as NodeId, self.now as f64).floor() as i64
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Tick(i) => {
                let now = self.local_now(i);
                let actions = self.hosts[i].node.handle_tick(LocalNs(now));
                self.perform(i, actions);
                self.schedule(self.now + TICK.0, Event::Tick(i));
            }
            Event::SendRound(i) => self.send_round(i),
            Event::ReadReaders => self.read_readers(),
            Event::LeaderChange(to) => {
                let name = member(to).name;
                for h in &mut self.hosts {
                    h.node.handle_leader(Some(name.clone()));
                }
            }
            Event::Deliver {
                to,
                from,
                datagram,
                probe,
            } => self.deliver(to, from, &datagram, probe),
        }
    }

    fn deliver(&mut self, to: usize, from: SocketAddr, datagram: &[u8], probe: bool) {
        let stamps: Vec<WireStamp> = if probe {
            let reading = self.clocks.reading(to as NodeId, self.now as f64)
                + self.noise.rx_error(&mut self.rng);
            vec![self.stamp(self.noise.quantize(reading))]
        } else {
            Vec::new()
        };
        let flow = flow_of(datagram);
        account(&mut self.hosts[to].traffic, flow, false, datagram.len());
        let now = self.local_now(to);
        let actions =
            self.hosts[to]
                .node
                .handle_datagram(datagram, Some(from), &stamps, LocalNs(now));
        self.perform(to, actions);
    }

    /// A pair to every target of host `i` due in this round, the first
    /// one rotating, and the next round ±20 % jittered around the cadence
    /// shared by the rounds a cadence the fastest target needs, as the
    /// agent's sender does.
    fn send_round(&mut self, i: usize) {
        let targets = self.hosts[i].targets.clone();
        let rounds = rounds_per_cadence(targets.iter().map(|t| t.pairs_per_cadence));
        if !targets.is_empty() {
            self.hosts[i].rounds += 1;
        }
        for target in targets_in_round(&targets, self.hosts[i].rounds as u64) {
            self.send_pair(i, target);
        }
        let cadence = self.s.agent.cadence().0 as f64 / f64::from(rounds);
        let next = self.now + (cadence * self.rng.random_range(0.8..1.2)) as i64;
        self.schedule(next, Event::SendRound(i));
    }

    /// One coded pair from host `i`, as the agent's sender sends it.
    fn send_pair(&mut self, i: usize, target: Target) {
        let seq = self.hosts[i].next_seq;
        self.hosts[i].next_seq += 1;
        let me = self.hosts[i].node.me().id;
        let spacing = self.s.agent.spacing().0;
        let mut prev_tx = i64::MIN;
        for index in 0..2u8 {
            let t_send = self.now as f64 + f64::from(index) * spacing as f64;
            let header = ProbeHeader::probe(me, target.id, seq, index, spacing as u32);
            let datagram = Message::Probe { header }.encode(None);
            // One host stamps its TX packets in send order.
            let reading =
                self.clocks.reading(i as NodeId, t_send) + self.noise.tx_error(&mut self.rng);
            let tx = self.noise.quantize(reading).max(prev_tx.saturating_add(1));
            prev_tx = tx;
            let key = PairKey {
                from: me,
                to: target.id,
                seq,
            };
            let now = self.local_now(i);
            let stamp = self.stamp(tx);
            self.hosts[i]
                .node
                .handle_stamps(Side::Tx, key, index, &[stamp], LocalNs(now));
            self.transmit(i, target.addr, datagram, t_send as i64, true);
        }
        let now = self.local_now(i);
        self.hosts[i].node.handle_sent(target.id, seq, LocalNs(now));
    }

    /// Puts a datagram on the link from host `i` to `to`.
    fn transmit(&mut self, i: usize, to: SocketAddr, datagram: Vec<u8>, at: i64, probe: bool) {
        account(
            &mut self.hosts[i].traffic,
            flow_of(&datagram),
            true,
            datagram.len(),
        );
        let Some(&j) = self.by_addr.get(&to.ip()) else {
            return;
        };
        if self.noise.lost(&mut self.rng) || self.cut_off(i, j) {
            self.lost += 1;
            return;
        }
        let delay = self.link_delay(i, j) + self.noise.queueing(&mut self.rng);
        let from = self.hosts[i].node.me().probe_addr();
        self.schedule(
            at + delay.round() as i64,
            Event::Deliver {
                to: j,
                from,
                datagram,
                probe,
            },
        );
    }

    /// Minimum one-way delay `i → j`: drawn once per link, with the
    /// scenario's per-link asymmetry (forward − backward).
    fn link_delay(&mut self, i: usize, j: usize) -> f64 {
        let key = (i.min(j), i.max(j));
        let (forward, backward) = match self.delays.get(&key) {
            Some(d) => *d,
            None => {
                let [lo, hi] = self.s.link.base_delay_ns;
                let base = self.rng.random_range(lo..=hi);
                let half = Normal::new(0.0, self.s.link.asymmetry_ns)
                    .map_or(0.0, |d| d.sample(&mut self.rng))
                    / 2.0;
                let d = ((base + half).max(1.0), (base - half).max(1.0));
                self.delays.insert(key, d);
                d
            }
        };
        if i < j { forward } else { backward }
    }

    fn perform(&mut self, i: usize, actions: Vec<Action>) {
        let mut queue = std::collections::VecDeque::from(actions);
        while let Some(action) = queue.pop_front() {
            queue.extend(self.perform_one(i, action));
        }
    }

    fn perform_one(&mut self, i: usize, action: Action) -> Vec<Action> {
        match action {
            Action::Send { to, datagram, sent } => {
                self.hosts[i].node.count_sent(sent);
                self.transmit(i, to, datagram, self.now, false);
            }
            Action::SetTargets(targets) => self.set_targets(i, targets),
            Action::History(_) => {}
            Action::HandOver(line) => self.hand_over(i, &line),
            Action::Publish(p) => self.score(i, p.result),
            Action::PutFits(_) | Action::FetchResult if self.is_isolated(i) => {}
            Action::PutFits(fits) => {
                let name = self.hosts[i].node.me().name.clone();
                let value = codec::encode_window_fits(&fits);
                let t = &mut self.hosts[i].traffic;
                t.coordination_out.add(value.len() + name.len());
                self.store.edges.insert(name, value);
            }
            Action::FetchFits { window } => {
                let bytes: usize = self.store.edges.values().map(Vec::len).sum();
                let t = &mut self.hosts[i].traffic;
                t.coordination_out.add(0);
                t.coordination_in.add(bytes);
                let stored: Vec<_> = self
                    .store
                    .edges
                    .values()
                    .filter_map(|v| codec::decode_window_fits(v).ok())
                    .collect();
                return self.hosts[i].node.solve_snapshots(window, &stored);
            }
            Action::PutResults { results, .. } => {
                for chunk in results.chunks(128) {
                    let bytes: usize = chunk
                        .iter()
                        .map(|r| codec::encode_result(r).len() + r.node_name.len())
                        .sum();
                    self.hosts[i].traffic.coordination_out.add(bytes);
                }
                for r in results {
                    self.store
                        .results
                        .insert(r.node_name.clone(), codec::encode_result(&r));
                }
            }
            Action::FetchResult => {
                let name = self.hosts[i].node.me().name.clone();
                let stored = self.store.results.get(&name);
                let bytes = stored.map_or(0, Vec::len);
                let r = stored.and_then(|v| codec::decode_result(v).ok());
                let t = &mut self.hosts[i].traffic;
                t.coordination_out.add(name.len());
                t.coordination_in.add(bytes);
                return self.hosts[i].node.handle_result(r);
            }
        }
        Vec::new()
    }

    fn set_targets(&mut self, i: usize, targets: Vec<Target>) {
        self.hosts[i].targets = targets;
    }

    /// Scores a published result against the truth, and the previous
    /// result as it stood just before this one replaced it.
    fn score(&mut self, i: usize, r: NodeResult) {
        // The reference's own result on its own timeline is exact by definition.
        let on_own_clock = self.timeline_of_reference(r.reference).carry.is_none();
        if r.is_reference() && on_own_clock {
            return;
        }
        self.note_resumed(i, &r);
        let aged = self.hosts[i].last_result.replace(r.clone());
        if self.now < self.score_from {
            return;
        }
        let (err, bound) = self.error_at(i, &r, r.anchor.0);
        let (err_1s, _) = self.error_at(i, &r, r.anchor.0 + 1_000_000_000);
        self.scores.drift_errors.push((err_1s - err).abs());
        let trace = self.scores.by_window.entry(r.window.0).or_default();
        trace.push((i, err.abs(), (err_1s - err).abs()));
        let (published, _) = self.error_at(i, &r, self.local_now(i));
        self.scores.published_errors.push(published.abs());
        self.scores.windows.insert(r.window.0);
        self.scores.errors.push(err.abs());
        self.scores.bounds.push(bound);
        self.scores.covered += usize::from(err.abs() <= bound);
        self.score_against_the_original(i, &r);
        // The same results at their anchors and aged: a result of the
        // warm-up windows is scored neither way.
        if let Some(old) = aged.filter(|old| self.is_scored(old)) {
            let (err, bound) = self.error_at(i, &old, self.local_now(i));
            self.scores.aged_errors.push(err.abs());
            let (floor, true_rate) = self.aged_at_true_rate(i, &old, self.local_now(i));
            self.scores.aged_floor_errors.push(floor.abs());
            self.scores.aged_true_rate_errors.push(true_rate.abs());
            self.scores.aged_covered += usize::from(err.abs() <= bound);
        }
    }

    /// A result on a continued timeline, at its anchor, against the
    /// timeline as it was before any hand-over: the first reference's
    /// clock. Its bound must cover that distance too.
    fn score_against_the_original(&mut self, i: usize, r: &NodeResult) {
        if self.timeline_of_reference(r.reference).carry.is_none() {
            return;
        }
        let original = TimelineDef {
            node: self.s.reference,
            carry: None,
        };
        let reading = (r.anchor.0 - READING_BASE_NS) as f64;
        let t = self.clocks.true_time_of(i as NodeId, reading);
        let truth = self.timeline_value(&original, t) - self.clocks.reading(i as NodeId, t);
        let err = r.offset.as_f64() - truth;
        self.scores.continued += 1;
        self.scores.continued_covered += usize::from(err.abs() <= r.bound_ns as f64);
        self.scores
            .continued_error_to_bound
            .push(err.abs() / (r.bound_ns as f64).max(1.0));
        self.scores.continued_bound.push(r.bound_ns as f64);
    }

    /// Whether `r` was scored at its anchor when it was published.
    fn is_scored(&self, r: &NodeResult) -> bool {
        self.scores.windows.contains(&r.window.0)
    }

    /// Host `i` took the timeline over: from now on results solved
    /// against its clock are on the timeline it carries; scores the step.
    fn hand_over(&mut self, i: usize, line: &HandOverLine) {
        let node = i as NodeId;
        let new = TimelineDef {
            node,
            carry: line.carry(),
        };
        let t = self.now as f64;
        let old = self.timeline_of_reference(self.current_reference);
        let id = node + 1;
        if id != self.current_reference {
            self.current_reference = id;
            self.hand_overs.push(HandOverScore {
                carried: new.carry.is_some(),
                step_ns: self.timeline_value(&new, t) - self.timeline_value(&old, t),
                carried_bound_ns: new.carry.as_ref().map_or(0.0, |c| c.bound_ns as f64),
                carried_wander_ppb_per_sqrt_s: line.carried_wander_ppb_per_sqrt_s.unwrap_or(0.0),
            });
        }
        self.timelines.insert(id, new);
    }

    /// The timeline results solved against member id `reference` are on.
    fn timeline_of_reference(&self, reference: NodeId) -> TimelineDef {
        self.timelines
            .get(&reference)
            .cloned()
            .unwrap_or(TimelineDef {
                node: reference.saturating_sub(1),
                carry: None,
            })
    }

    /// The timeline's value (as a reading, ns) at true time `t`.
    fn timeline_value(&self, def: &TimelineDef, t: f64) -> f64 {
        let reading = self.clocks.reading(def.node, t);
        let carried = def.carry.as_ref().map_or(0.0, |c| {
            c.offset_at(LocalNs(READING_BASE_NS + reading.floor() as i64))
                .as_f64()
        });
        reading + carried
    }

    /// The truth (global − local) for node `i` on `r`'s timeline when its
    /// clock reads `reading` (after [`READING_BASE_NS`]), and its rate
    /// against that clock there: the timeline's rate (the reference's clock,
    /// a carry's drift on it) over the node's, both true derivatives (a
    /// difference of the truths would lose the rate in their rounding).
    fn truth_and_rate_at(&self, i: usize, r: &NodeResult, reading: f64) -> (f64, f64) {
        let node = i as NodeId;
        let t = self.clocks.true_time_of(node, reading);
        let timeline = self.timeline_of_reference(r.reference);
        let truth = self.timeline_value(&timeline, t) - self.clocks.reading(node, t);
        let carried = timeline.carry.as_ref().map_or(0.0, |c| c.drift_ppb * 1e-9);
        let timeline_rate = (1.0 + self.clocks.frequency(timeline.node, t)) * (1.0 + carried);
        let node_rate = 1.0 + self.clocks.frequency(node, t);
        (truth, timeline_rate / node_rate - 1.0)
    }

    /// At local time `at`, with the true rate at `r`'s anchor: how far the
    /// truth sits from the truth at the anchor extrapolated at that rate
    /// (the wander floor), and the error of `r`'s offset at its anchor
    /// extrapolated at that rate instead of `r`'s drift.
    fn aged_at_true_rate(&self, i: usize, r: &NodeResult, at: i64) -> (f64, f64) {
        let anchor = (r.anchor.0 - READING_BASE_NS) as f64;
        let at = (at - READING_BASE_NS) as f64;
        let (at_anchor, rate) = self.truth_and_rate_at(i, r, anchor);
        let (now, _) = self.truth_and_rate_at(i, r, at);
        let moved = rate * (at - anchor);
        (now - (at_anchor + moved), r.offset.as_f64() + moved - now)
    }

    /// Error and bound of result `r` (global − local) used at local time `at`.
    fn error_at(&self, i: usize, r: &NodeResult, at: i64) -> (f64, f64) {
        let (truth, _) = self.truth_and_rate_at(i, r, (at - READING_BASE_NS) as f64);
        (r.offset_at(LocalNs(at)) - truth, r.bound_at(LocalNs(at)))
    }

    fn report(mut self, wall_ms: f64) -> ProtocolReport {
        let leader = self.s.reference as usize;
        let others = self.hosts.len().saturating_sub(1).max(1) as f64;
        let warmup = warmup_windows(self.s.agent.window().0);
        let per_window = 1.0 / f64::from(self.s.windows + warmup + 1);
        let mut node_sum = HostTraffic::default();
        let mut coordination_max = Traffic::default();
        for (_, h) in self.hosts.iter().enumerate().filter(|(i, _)| *i != leader) {
            let t = &h.traffic;
            for (sum, x) in [
                (&mut node_sum.probing_out, t.probing_out),
                (&mut node_sum.probing_in, t.probing_in),
                (&mut node_sum.coordination_out, t.coordination_out),
                (&mut node_sum.coordination_in, t.coordination_in),
            ] {
                sum.messages += x.messages;
                sum.bytes += x.bytes;
            }
            let c = Traffic {
                messages: t.coordination_out.messages + t.coordination_in.messages,
                bytes: t.coordination_out.bytes + t.coordination_in.bytes,
            };
            if c.bytes > coordination_max.bytes {
                coordination_max = c;
            }
        }
        let without = self
            .hosts
            .iter()
            .enumerate()
            .filter(|(i, h)| *i != leader && h.last_result.is_none())
            .count();
        let mut counters = NodeCounters::default();
        let mut dropped = DropCounts::default();
        for h in &self.hosts {
            counters.merge(h.node.counters());
            dropped.merge(h.node.dropped());
        }
        let solves = self.hosts[leader].node.timings().solves;
        let rule = self.recovery_rule();
        let results = self.scores.errors.len();
        let aged = self.scores.aged_errors.len();
        let ratio = |k: usize, n: usize| if n == 0 { 0.0 } else { k as f64 / n as f64 };
        ProtocolReport {
            scenario: self.s.name.clone(),
            nodes: self.s.nodes,
            exchange: self.s.exchange,
            settings: self.s.agent.clone(),
            windows: self.scores.windows.len(),
            results,
            nodes_without_result: without,
            coverage: ratio(self.scores.covered, results),
            median_bound_ns: Quantiles::of(&mut self.scores.bounds).p50,
            continued_results: self.scores.continued,
            coverage_vs_original: ratio(self.scores.continued_covered, self.scores.continued),
            error_to_bound_vs_original: Quantiles::of(&mut self.scores.continued_error_to_bound),
            bound_vs_original_ns: Quantiles::of(&mut self.scores.continued_bound),
            abs_error_ns: Quantiles::of(&mut self.scores.errors),
            aged_coverage: ratio(self.scores.aged_covered, aged),
            aged_abs_error_ns: Quantiles::of(&mut self.scores.aged_errors),
            aged_floor_abs_error_ns: Quantiles::of(&mut self.scores.aged_floor_errors),
            aged_true_rate_abs_error_ns: Quantiles::of(&mut self.scores.aged_true_rate_errors),
            published_abs_error_ns: Quantiles::of(&mut self.scores.published_errors),
            drift_abs_error_ppb: Quantiles::of(&mut self.scores.drift_errors),
            leader_traffic: self.hosts[leader].traffic.scaled(per_window),
            node_traffic: node_sum.scaled(per_window / others),
            node_coordination_max: coordination_max.scaled(per_window),
            counters,
            solves,
            dropped,
            hand_overs: self.hand_overs,
            recovery: self
                .s
                .isolation
                .as_ref()
                .map(|iso| self.recovery.report(iso.windows, rule)),
            per_window: self
                .scores
                .by_window
                .iter()
                .map(|(w, results)| WindowTrace::of(*w, results))
                .collect(),
            datagrams_lost: self.lost,
            events: self.events,
            wall_ms,
        }
    }
}

impl Sim<'_> {
    /// A stamp as the agent's capture labels it: NIC or kernel.
    fn stamp(&self, realtime_ns: i64) -> WireStamp {
        let source = if self.s.timestamps.nic {
            StampSource::Hardware
        } else {
            StampSource::Kernel
        };
        WireStamp {
            realtime_ns,
            bound_ns: 0,
            source,
        }
    }
}

#[derive(Clone, Copy)]
enum Flow {
    Probing,
    Coordination,
}

/// The flow of a datagram, from its header's `kind` (byte 5).
fn flow_of(datagram: &[u8]) -> Flow {
    match datagram.get(5).copied() {
        Some(kind::EDGE_FIT | kind::RESULT) => Flow::Coordination,
        _ => Flow::Probing, // probes, follow-ups, RX reports, handshakes
    }
}

fn account(t: &mut HostTraffic, flow: Flow, out: bool, bytes: usize) {
    let slot = match (flow, out) {
        (Flow::Probing, true) => &mut t.probing_out,
        (Flow::Probing, false) => &mut t.probing_in,
        (Flow::Coordination, true) => &mut t.coordination_out,
        (Flow::Coordination, false) => &mut t.coordination_in,
    };
    slot.add(bytes);
}

impl ProtocolReport {
    /// One line per scored window: its results' |error| and the worst node.
    pub fn window_table(&self) -> String {
        use std::fmt::Write;
        let mut s =
            String::from("window  results   p50 ns   p99 ns   max ns  drift p99 ppb  worst node\n");
        for w in &self.per_window {
            let e = &w.abs_error_ns;
            let _ = writeln!(
                s,
                "{:>6} {:>8} {:>8.1} {:>8.1} {:>8.1} {:>14.1} {:>11}",
                w.window, w.results, e.p50, e.p99, e.max, w.drift_abs_error_ppb.p99, w.worst_node
            );
        }
        s
    }

    /// A human-readable summary.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let a = &self.settings;
        let _ = writeln!(
            s,
            "scenario {} (protocol): {} nodes, K={}, cadence {} µs, spacing {} µs, window {} s, {:?} exchange",
            self.scenario,
            self.nodes,
            a.degree,
            a.probe_cadence.0 / 1_000,
            a.packet_spacing.0 / 1_000,
            a.probe_window.0 / 1_000_000_000,
            self.exchange
        );
        let q = |x: &Quantiles| format!("p50 {:.1}  p99 {:.1}  max {:.1}", x.p50, x.p99, x.max);
        let _ = writeln!(
            s,
            "results           {} over {} windows ({} nodes without one)",
            self.results, self.windows, self.nodes_without_result
        );
        let _ = writeln!(s, "|error| ns        {}", q(&self.abs_error_ns));
        let _ = writeln!(
            s,
            "coverage          {:.5}  (median bound {:.0} ns)",
            self.coverage, self.median_bound_ns
        );
        let _ = writeln!(s, "at publication    {}", q(&self.published_abs_error_ns));
        let _ = writeln!(s, "aged |error| ns   {}", q(&self.aged_abs_error_ns));
        let _ = writeln!(s, "aged wander floor {}", q(&self.aged_floor_abs_error_ns));
        let _ = writeln!(
            s,
            "aged, true rate   {}",
            q(&self.aged_true_rate_abs_error_ns)
        );
        let _ = writeln!(s, "|drift error| ppb {}", q(&self.drift_abs_error_ppb));
        let _ = writeln!(s, "aged coverage     {:.5}", self.aged_coverage);
        let _ = writeln!(s, "per window        messages      bytes  (out + in)");
        let rows = [
            (
                "leader probing",
                self.leader_traffic.probing_out,
                self.leader_traffic.probing_in,
            ),
            (
                "leader coordination",
                self.leader_traffic.coordination_out,
                self.leader_traffic.coordination_in,
            ),
            (
                "node probing",
                self.node_traffic.probing_out,
                self.node_traffic.probing_in,
            ),
            (
                "node coordination",
                self.node_traffic.coordination_out,
                self.node_traffic.coordination_in,
            ),
        ];
        for (name, out, inn) in rows {
            let _ = writeln!(
                s,
                "  {name:<20} {:>10.0} {:>10.0}",
                out.messages + inn.messages,
                out.bytes + inn.bytes
            );
        }
        let _ = writeln!(
            s,
            "  {:<20} {:>10.0} {:>10.0}",
            "busiest node coord.",
            self.node_coordination_max.messages,
            self.node_coordination_max.bytes
        );
        if let Some(r) = &self.recovery {
            s.push_str(&r.table());
        }
        let _ = writeln!(
            s,
            "datagrams lost    {}; {} events in {:.0} ms",
            self.datagrams_lost, self.events, self.wall_ms
        );
        s
    }
}
