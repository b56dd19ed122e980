//! Scenario description (TOML) with defaults for every field.
use clockmesh_core::{
    node::Exchange,
    setting::{self, SettingsError},
    settings::{Settings, StampClass, estimator_config_for},
};
use clockmesh_estimator::EstimatorConfig;
use serde::{Deserialize, Serialize};

use crate::error::SimError;

/// A simulated cluster. Every table and field is optional; see each default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    /// `estimator` (default): synthetic probes straight into the estimator,
    /// fast enough for 10,000 nodes. `protocol`: every host runs the agent's
    /// own protocol state machine with the `[agent]` settings.
    pub mode: Mode,
    /// Protocol mode: the agent's settings (default: what ships). `degree`,
    /// `window_ms`, `pairs_per_second` and `[estimator]` apply to the
    /// estimator mode only; protocol mode derives them from these.
    pub agent: Settings,
    /// Protocol mode: fits and results over UDP (`relay`, the static and
    /// Kubernetes backends) or through a modelled store (`store`, etcd).
    pub exchange: Exchange,
    /// Seed of the deterministic RNG (ChaCha8).
    pub seed: u64,
    /// Number of nodes (default 64).
    pub nodes: u32,
    /// K: peers each node picks at random; edges are undirected and probed both ways (default 10).
    pub degree: u32,
    /// Windows to simulate (default 10).
    pub windows: u32,
    /// Window length (default 1000 ms).
    pub window_ms: u64,
    /// Probe pairs per second per edge per direction (default 200).
    pub pairs_per_second: f64,
    /// Reference node id (default 0).
    pub reference: u32,
    /// Windows (0-based) in which every edge of the reference is missing (default none).
    pub reference_outage_windows: Vec<u32>,
    /// Protocol mode: leadership moves to another node during the run (default never).
    pub leader_change: Option<LeaderChange>,
    /// Protocol mode: nodes cut off the network for a while, their agents
    /// running (default never); the report then tells how fast their
    /// readers are back at the no-fault level.
    pub isolation: Option<Isolation>,
    pub clock: ClockModel,
    pub link: LinkModel,
    pub queue: QueueModel,
    pub timestamps: TimestampModel,
    /// Estimator mode: the estimator's configuration. Absent (the
    /// default): the agent's, from `[agent]` and the stamps' class
    /// (`timestamps.nic`), by the function the agent uses
    /// (`clockmesh_core::settings::estimator_config_for`); a table here
    /// overrides it whole, for studies of the estimator itself.
    pub estimator: Option<EstimatorConfig>,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            name: "unnamed".into(),
            mode: Mode::Estimator,
            agent: Settings::default(),
            exchange: Exchange::Relay,
            seed: 1,
            nodes: 64,
            degree: 10,
            windows: 10,
            window_ms: 1000,
            pairs_per_second: 200.0,
            reference: 0,
            reference_outage_windows: Vec::new(),
            leader_change: None,
            isolation: None,
            clock: ClockModel::default(),
            link: LinkModel::default(),
            queue: QueueModel::default(),
            timestamps: TimestampModel::default(),
            estimator: None,
        }
    }
}

/// Leadership moves from `reference` to node `to` at the start of scored
/// window `after_window` (0-based, after the warm-up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaderChange {
    pub after_window: u32,
    pub to: u32,
}

/// Every datagram to or from `nodes` is lost from the start of scored
/// window `after_window` (0-based, after the warm-up) for `windows`
/// windows: their links are down, their agents keep running (the fault
/// bench's `link_down`, on many nodes at once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Isolation {
    pub nodes: Vec<u32>,
    pub after_window: u32,
    pub windows: u32,
}

/// What the simulator runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Estimator,
    Protocol,
}

/// Per-node clocks: `clock(t) = t + offset + ∫ frequency`, frequency = drift + random walk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClockModel {
    /// Initial offsets uniform in ±this (default 1 ms).
    pub offset_spread_ns: f64,
    /// Frequency errors uniform in ±this (default 10 ppm; Huygens saw 5–30 µs/s).
    pub drift_spread_ppm: f64,
    /// Random-walk frequency wander, σ per √s (default 1 ppb).
    pub wander_ppb_per_sqrt_s: f64,
    /// Step of the wander process (default 50 ms).
    pub wander_step_ms: u64,
}

impl Default for ClockModel {
    fn default() -> Self {
        Self {
            offset_spread_ns: 1e6,
            drift_spread_ppm: 10.0,
            wander_ppb_per_sqrt_s: 1.0,
            wander_step_ms: 50,
        }
    }
}

/// Per-link propagation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkModel {
    /// Minimum one-way delay uniform in [min, max] per link (default 1–3 µs).
    pub base_delay_ns: [f64; 2],
    /// Forward − backward minimum delay per link, normal with this σ (default 10 ns).
    pub asymmetry_ns: f64,
    /// Packet loss probability (default 0.001).
    pub loss: f64,
}

impl Default for LinkModel {
    fn default() -> Self {
        Self {
            base_delay_ns: [1_000.0, 3_000.0],
            asymmetry_ns: 10.0,
            loss: 0.001,
        }
    }
}

/// Queueing delay: with `busy_probability` a packet meets a queue of this distribution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueModel {
    pub kind: QueueKind,
    /// Probability a packet is queued (default 0.3).
    pub busy_probability: f64,
    /// Mean queueing delay when queued (default 2 µs).
    pub mean_ns: f64,
    /// Pareto shape for `kind = "pareto"` (default 1.5, heavy tail).
    pub pareto_shape: f64,
}

impl Default for QueueModel {
    fn default() -> Self {
        Self {
            kind: QueueKind::Exponential,
            busy_probability: 0.3,
            mean_ns: 2_000.0,
            pareto_shape: 1.5,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueKind {
    Exponential,
    Pareto,
}

/// Timestamping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimestampModel {
    /// Timestamp tick; readings are floored to it (default 1 ns).
    pub resolution_ns: i64,
    /// Software TX stamps are taken before the packet leaves: early by Exp(mean) (default 0).
    pub tx_early_mean_ns: f64,
    /// Software RX stamps are taken after the packet arrived: late by Exp(mean) (default 0).
    pub rx_late_mean_ns: f64,
    /// Probability a TX stamp is late (NIC quirk; default 0.001).
    pub late_tx_probability: f64,
    /// Lateness uniform in [min, max] (default 10–200 ns).
    pub late_tx_ns: [f64; 2],
    /// Protocol mode: the stamps are NIC hardware stamps (the agent then
    /// applies its NIC purity tolerance); otherwise kernel software stamps
    /// (default false).
    pub nic: bool,
}

impl TimestampModel {
    /// The class of these stamps, as the agent would see them.
    pub fn stamp_class(&self) -> StampClass {
        if self.nic {
            StampClass::Nic
        } else {
            StampClass::Software
        }
    }
}

impl Default for TimestampModel {
    fn default() -> Self {
        Self {
            resolution_ns: 1,
            tx_early_mean_ns: 0.0,
            rx_late_mean_ns: 0.0,
            late_tx_probability: 0.001,
            late_tx_ns: [10.0, 200.0],
            nic: false,
        }
    }
}

impl Scenario {
    /// Parses and validates a TOML scenario.
    pub fn from_toml_str(text: &str) -> Result<Self, SimError> {
        let s: Scenario = toml::from_str(text).map_err(|e| SimError::Parse(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    /// The estimator's configuration: `estimator`, else the agent's for
    /// these stamps, with the scenario's `reference` as the solve's
    /// reference, since the run scores every node against that one.
    pub fn estimator_config(&self) -> EstimatorConfig {
        let mut config = self
            .estimator
            .clone()
            .unwrap_or_else(|| estimator_config_for(&self.agent, self.timestamps.stamp_class()));
        config.net.reference = self.reference;
        config
    }

    /// The agent's own limits on its settings (their ranges, defined once
    /// in `clockmesh_core::setting`), plus a size the machine can hold.
    fn validate_agent(&self) -> Result<(), SimError> {
        let bad = |m: &str| Err(SimError::Invalid(m.to_string()));
        self.check_agent_ranges()
            .map_err(|e| SimError::Invalid(format!("agent.{e}")))?;
        if self.nodes > 5_000 {
            return bad(
                "protocol mode holds every node's state: at most 5000 nodes (use mode = \"estimator\" beyond)",
            );
        }
        Ok(())
    }

    /// The ranges of the settings scenarios have always been held to. The
    /// holdover ceiling, the asymmetry limit and the spacing-below-cadence
    /// rule, which [`Settings::validate`] also checks, are left out: a
    /// scenario never had them checked, and one that sets them outside the
    /// agent's limits still runs.
    fn check_agent_ranges(&self) -> Result<(), SettingsError> {
        let a = &self.agent;
        setting::PROBE_CADENCE_US.check(a.probe_cadence)?;
        setting::PACKET_SPACING_US.check(a.packet_spacing)?;
        setting::PROBE_WINDOW_S.check(a.probe_window)?;
        setting::DEGREE.check(a.degree)?;
        setting::MAX_PAIRS_PER_CADENCE.check(a.max_pairs_per_cadence)?;
        Ok(())
    }

    /// The nodes that lead during the run: the reference, and the new
    /// leader of a `leader_change`.
    pub(crate) fn leading_nodes(&self) -> impl Iterator<Item = u32> {
        std::iter::once(self.reference).chain(self.leader_change.map(|c| c.to))
    }

    /// Isolated nodes are distinct ordinary members, and the run lasts
    /// until their recovery has been watched.
    fn validate_isolation(&self, iso: &Isolation) -> Result<(), SimError> {
        let bad = |m: &str| Err(SimError::Invalid(m.to_string()));
        if self.mode != Mode::Protocol {
            return bad("isolation needs mode = \"protocol\"");
        }
        let mut nodes = iso.nodes.clone();
        nodes.sort_unstable();
        nodes.dedup();
        if iso.nodes.is_empty() || nodes.len() != iso.nodes.len() {
            return bad("isolation.nodes must name distinct nodes");
        }
        if nodes
            .iter()
            .any(|n| *n >= self.nodes || self.leading_nodes().any(|l| l == *n))
        {
            return bad(
                "isolation.nodes must be < nodes and neither the reference nor the new leader",
            );
        }
        if 2 * nodes.len() + 2 > self.nodes as usize {
            return bad(
                "isolation.nodes: at most half of the other nodes (the rest are its controls)",
            );
        }
        let recovered = u64::from(iso.after_window)
            + u64::from(iso.windows)
            + u64::from(crate::recovery::RECOVERY_WINDOWS);
        if iso.windows == 0 || recovered > u64::from(self.windows) {
            return bad("isolation: windows >= 1, and after_window + windows + 10 <= windows");
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: &str| Err(SimError::Invalid(m.to_string()));
        let net_reference = self.estimator.as_ref().map_or(0, |e| e.net.reference);
        if net_reference != 0 && net_reference != self.reference {
            return bad("estimator.net.reference differs from reference: set only `reference`");
        }
        if self.nodes < 2 {
            return bad("nodes must be >= 2");
        }
        if self.mode == Mode::Protocol {
            self.validate_agent()?;
        }
        let estimator_mode = self.mode == Mode::Estimator;
        if estimator_mode && (self.degree == 0 || self.degree >= self.nodes) {
            return bad("degree must be in 1..nodes");
        }
        if let Some(c) = self.leader_change {
            if c.to >= self.nodes || c.to == self.reference {
                return bad("leader_change.to must be another node (< nodes)");
            }
            if c.after_window >= self.windows {
                return bad("leader_change.after_window must be < windows");
            }
        }
        if let Some(iso) = &self.isolation {
            self.validate_isolation(iso)?;
        }
        if self.reference >= self.nodes {
            return bad("reference must be < nodes");
        }
        if self.windows == 0 || self.window_ms == 0 {
            return bad("windows and window_ms must be >= 1");
        }
        let pairs = self.pairs_per_second * self.window_ms as f64 / 1000.0;
        if estimator_mode && !(2.0..=1e6).contains(&pairs) {
            return bad("pairs_per_second × window must give 2..=1e6 pairs per window");
        }
        let probs = [
            self.link.loss,
            self.queue.busy_probability,
            self.timestamps.late_tx_probability,
        ];
        if probs.iter().any(|p| !(0.0..=1.0).contains(p)) {
            return bad("probabilities must be in 0..=1");
        }
        let [lo, hi] = self.link.base_delay_ns;
        if !(lo > 0.0 && hi >= lo && hi < 1e9) {
            return bad("link.base_delay_ns must be 0 < min <= max < 1 s");
        }
        let nonneg = [
            self.clock.offset_spread_ns,
            self.clock.drift_spread_ppm,
            self.clock.wander_ppb_per_sqrt_s,
            self.link.asymmetry_ns,
            self.queue.mean_ns,
            self.timestamps.tx_early_mean_ns,
            self.timestamps.rx_late_mean_ns,
        ];
        if nonneg.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
            return bad("spreads, σ and means must be finite and >= 0");
        }
        if self.clock.offset_spread_ns > 1e15 || self.clock.drift_spread_ppm > 1000.0 {
            return bad("clock spreads too large (offset <= 1e15 ns, drift <= 1000 ppm)");
        }
        if self.clock.wander_step_ms == 0 {
            return bad("clock.wander_step_ms must be >= 1");
        }
        if self.queue.kind == QueueKind::Pareto && self.queue.pareto_shape <= 1.0 {
            return bad("queue.pareto_shape must be > 1 (finite mean)");
        }
        let [l0, l1] = self.timestamps.late_tx_ns;
        if !(l0 >= 0.0 && l1 >= l0) || self.timestamps.resolution_ns < 1 {
            return bad("timestamps.late_tx_ns must be 0 <= min <= max; resolution_ns >= 1");
        }
        Ok(())
    }
}
