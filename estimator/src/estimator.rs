//! The stateful estimator the agent drives: one call per window, queries at any time.
//!
//! No I/O and no system time: every query takes the current time explicitly
//! ([`Estimator::offset_at`]) or from an injected [`Clock`] ([`Estimator::offset_now`]), so
//! tests and the simulator drive it with synthetic time.
use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};

use serde::{Deserialize, Serialize};

use clockmesh_time::{LocalNs, Nanos};

use crate::convert::{ns_f64, round_ns};

use crate::{
    AnchorKind, EdgeFit, EdgeMeasurement, EstimatorError, FitConfig, NetConfig, NetworkSolution,
    NodeEstimate, NodeId, PairingStats, ProbeTimestamps, PurityConfig, fit_edge, pair_probes,
    solve_network,
};

/// Source of "now" on the reference timeline, in ns.
pub trait Clock {
    fn now(&self) -> LocalNs;
}

/// A clock that only moves when told to (tests, simulator).
#[derive(Debug, Default)]
pub struct ManualClock(Cell<LocalNs>);

impl ManualClock {
    pub fn new(now: LocalNs) -> Self {
        Self(Cell::new(now))
    }
    pub fn set(&self, now: LocalNs) {
        self.0.set(now);
    }
    pub fn advance(&self, by: Nanos) {
        self.0.set(self.0.get() + by);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> LocalNs {
        self.0.get()
    }
}

/// All estimator parameters (see each part for defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EstimatorConfig {
    pub purity: PurityConfig,
    pub fit: FitConfig,
    /// `reference` and solver settings; `epoch_ns` is set per window.
    pub net: NetConfig,
    /// Extra frequency uncertainty assumed while extrapolating (drift wander), added to the
    /// drift bound when a bound is aged (default 20 ppb).
    pub holdover_wander_ppb: f64,
    /// Estimates older than this are flagged stale (default 10 s).
    pub max_age_ns: i64,
    /// How long a node's last drift is kept as a prior for its young
    /// fits, ns (default 120 s, four software history spans): a drift
    /// solved over a long span beats a young fit's slope after an outage,
    /// a restart or a cut history, as long as it is within the wander
    /// allowance of the truth; one from further back is not relied on.
    pub drift_prior_max_age_ns: i64,
}

impl Default for EstimatorConfig {
    fn default() -> Self {
        Self {
            purity: PurityConfig::default(),
            fit: FitConfig::default(),
            net: NetConfig::default(),
            holdover_wander_ppb: 20.0,
            max_age_ns: 10_000_000_000,
            drift_prior_max_age_ns: 120_000_000_000,
        }
    }
}

/// Probes of one edge in one window. `forward`: `from` sends, `to` receives; `backward`: the
/// other way round. The fit is `clock_to − clock_from`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeProbes {
    pub from: NodeId,
    pub to: NodeId,
    pub forward: Vec<ProbeTimestamps>,
    pub backward: Vec<ProbeTimestamps>,
}

/// Pairing counts and fit (or the reason there is none) of one edge.
#[derive(Debug, Clone, PartialEq)]
pub struct EdgeOutcome {
    pub from: NodeId,
    pub to: NodeId,
    pub forward: PairingStats,
    pub backward: PairingStats,
    pub fit: Result<EdgeFit, EstimatorError>,
}

impl EdgeOutcome {
    /// The measurement for [`solve_network`], if the fit succeeded.
    pub fn measurement(&self) -> Option<EdgeMeasurement> {
        self.fit
            .as_ref()
            .ok()
            .map(|fit| EdgeMeasurement::new(self.from, self.to, fit.clone()))
    }
}

/// Pairing, purity and fit of one edge. Never fails as a whole: the fit field carries the error.
pub fn estimate_edge(edge: &EdgeProbes, purity: &PurityConfig, fit: &FitConfig) -> EdgeOutcome {
    // A direction without probes is not a malformed input here, just one-sided data: let
    // fit_edge report it with both counts.
    let pair = |probes: &[ProbeTimestamps]| match pair_probes(probes, purity) {
        Err(EstimatorError::Empty(_)) => Ok(crate::Pairing {
            pure: Vec::new(),
            stats: crate::PairingStats::default(),
        }),
        other => other,
    };
    let (fwd, bwd) = (pair(&edge.forward), pair(&edge.backward));
    let stats = |p: &Result<crate::Pairing, EstimatorError>| {
        p.as_ref().map(|p| p.stats).unwrap_or_default()
    };
    let (forward, backward) = (stats(&fwd), stats(&bwd));
    let fit = match (fwd, bwd) {
        (Ok(f), Ok(b)) => fit_edge(&f.pure, &b.pure, fit),
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    EdgeOutcome {
        from: edge.from,
        to: edge.to,
        forward,
        backward,
        fit,
    }
}

/// What the agent publishes for one node at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishedOffset {
    pub node: NodeId,
    /// clock_node − clock_reference at `now`, rounded to ns.
    pub offset_ns: i64,
    pub drift_ppb: f64,
    /// Covers the true offset at `now`: window bound + (drift bound + wander) × age.
    pub bound_ns: f64,
    /// now − window epoch (negative if `now` is before the epoch).
    pub age_ns: i64,
    pub stale: bool,
    pub anchor_kind: AnchorKind,
}

/// Window-by-window estimator state.
#[derive(Debug, Clone)]
pub struct Estimator {
    cfg: EstimatorConfig,
    current: Option<NetworkSolution>,
    /// Each directed edge's best round trip over the last
    /// [`RTT_FLOOR_AGE_NS`]: what its path takes without a detour.
    rtt_floors: HashMap<(NodeId, NodeId), RttFloor>,
    /// Each node's last drift on the reference timeline
    /// ([`Estimator::weigh_drifts_with_priors`]).
    drift_priors: HashMap<NodeId, DriftPrior>,
}

/// A node's drift (and its bound) as solved at `epoch_ns`.
#[derive(Clone, Copy, Debug)]
struct DriftPrior {
    epoch_ns: i64,
    drift: f64,
    drift_bound: f64,
}

/// How long an edge's best round trip is remembered as its floor: longer
/// than a detour is expected to last (a route flap, a failover), short
/// enough that a path that really got longer becomes the floor.
pub const RTT_FLOOR_AGE_NS: i64 = 600_000_000_000;

/// The smallest of an edge's round trips over a sliding time span: the
/// ones that may still become the smallest, oldest first (each smaller
/// than every older one kept).
#[derive(Clone, Debug, Default)]
struct RttFloor {
    kept: VecDeque<(i64, f64)>,
}

impl RttFloor {
    /// When the newest round trip kept was seen.
    fn newest_ns(&self) -> Option<i64> {
        self.kept.back().map(|&(t, _)| t)
    }

    /// Adds `rtt_ns` seen at `t_ns` and returns the floor over the span
    /// that ends there.
    fn add(&mut self, t_ns: i64, rtt_ns: f64) -> f64 {
        while self.kept.back().is_some_and(|&(_, r)| r >= rtt_ns) {
            self.kept.pop_back();
        }
        self.kept.push_back((t_ns, rtt_ns));
        let oldest = t_ns.saturating_sub(RTT_FLOOR_AGE_NS);
        while self.kept.front().is_some_and(|&(t, _)| t < oldest) {
            self.kept.pop_front();
        }
        self.kept.front().map_or(rtt_ns, |&(_, r)| r)
    }
}

impl Estimator {
    pub fn new(cfg: EstimatorConfig) -> Self {
        Self {
            cfg,
            current: None,
            rtt_floors: HashMap::new(),
            drift_priors: HashMap::new(),
        }
    }

    /// Sets each measurement's [`EdgeMeasurement::excess_rtt_ns`] against
    /// its edge's floor, which it updates (window epoch `epoch_ns`).
    /// Floors of edges unseen for [`RTT_FLOOR_AGE_NS`] are dropped: they
    /// would be forgotten on the edge's return anyway, and a leader that
    /// outlives many members must not keep every edge it ever saw.
    fn mark_detours(&mut self, epoch_ns: i64, measurements: &mut [EdgeMeasurement]) {
        for m in measurements {
            let floor = self
                .rtt_floors
                .entry((m.from, m.to))
                .or_default()
                .add(epoch_ns, m.fit.min_rtt_ns);
            m.excess_rtt_ns = (m.fit.min_rtt_ns - floor).max(0.0);
        }
        let oldest = epoch_ns.saturating_sub(RTT_FLOOR_AGE_NS);
        self.rtt_floors
            .retain(|_, floor| floor.newest_ns().is_some_and(|t| t >= oldest));
    }

    pub fn config(&self) -> &EstimatorConfig {
        &self.cfg
    }

    /// Pairs and fits every edge of a window (see [`estimate_edge`]).
    pub fn fit_edges(&self, edges: &[EdgeProbes]) -> Vec<EdgeOutcome> {
        edges
            .iter()
            .map(|e| estimate_edge(e, &self.cfg.purity, &self.cfg.fit))
            .collect()
    }

    /// Solves the window's network at `epoch_ns` (reference clock) and makes it current. If
    /// the reference is absent, the substitute component is put back on the reference timeline
    /// through the node of that component with the tightest aged bound in the previous window
    /// (ties: lowest id); its bound is added (holdover). Without a previous window the
    /// component stays flagged [`AnchorKind::Substitute`]. Takes the window's measurements
    /// to set each one's [`EdgeMeasurement::excess_rtt_ns`] from its edge's floor.
    pub fn apply_fits(
        &mut self,
        epoch: LocalNs,
        mut measurements: Vec<EdgeMeasurement>,
    ) -> Result<&NetworkSolution, EstimatorError> {
        let epoch_ns = epoch.0;
        let net = NetConfig {
            epoch_ns,
            ..self.cfg.net.clone()
        };
        self.mark_detours(epoch_ns, &mut measurements);
        let settled = nodes_with_a_full_history(&measurements);
        let mut sol = solve_network(&measurements, &net)?;
        if !sol.reference_present
            && let Some(prev) = &self.current
        {
            self.holdover(prev, &mut sol);
        }
        self.weigh_drifts_with_priors(&mut sol, &settled);
        self.current = Some(sol);
        Ok(self.current.as_ref().expect("just set"))
    }

    /// [`Estimator::fit_edges`] then [`Estimator::apply_fits`] on the edges that fitted.
    pub fn process_window(
        &mut self,
        epoch: LocalNs,
        edges: &[EdgeProbes],
    ) -> Result<(Vec<EdgeOutcome>, &NetworkSolution), EstimatorError> {
        let outcomes = self.fit_edges(edges);
        let ms: Vec<EdgeMeasurement> = outcomes.iter().filter_map(|o| o.measurement()).collect();
        let sol = self.apply_fits(epoch, ms)?;
        Ok((outcomes, sol))
    }

    pub fn solution(&self) -> Option<&NetworkSolution> {
        self.current.as_ref()
    }

    /// The node's offset, drift and bound extrapolated to `now`. `None` before the first
    /// window or when the node was not in the last window.
    pub fn offset_at(&self, node: NodeId, now: LocalNs) -> Option<PublishedOffset> {
        let sol = self.current.as_ref()?;
        let est = sol.get(node)?;
        let age_ns = now.since(LocalNs(sol.epoch_ns)).0;
        let age = ns_f64(age_ns);
        let drift_allowance = est.drift_bound + self.cfg.holdover_wander_ppb * 1e-9;
        Some(PublishedOffset {
            node,
            offset_ns: est
                .offset_base_ns
                .saturating_add(round_ns(est.offset_rel_ns + est.drift * age)),
            drift_ppb: est.drift * 1e9,
            bound_ns: est.bound_ns + drift_allowance * age.abs(),
            age_ns,
            stale: age_ns.unsigned_abs() > self.cfg.max_age_ns.unsigned_abs(),
            anchor_kind: est.anchor_kind,
        })
    }

    /// [`Estimator::offset_at`] at the injected clock's now.
    pub fn offset_now(&self, node: NodeId, clock: &dyn Clock) -> Option<PublishedOffset> {
        self.offset_at(node, clock.now())
    }

    /// Weighs the drift of each node whose edges are all young (none
    /// spans a full history, [`EdgeMeasurement::history_share`]) with its
    /// previous drift, when this window's is the looser: after an outage,
    /// a restart or a cut history, a fit over a window or two of software
    /// stamps has a slope hundreds of ppb off where the drift solved over a
    /// long span before was a few. The previous drift counts with its bound
    /// plus the wander allowance, and the two are combined by their inverse
    /// square bounds; the combined bound is the same convex combination of
    /// theirs, so it holds whenever both do. Settled nodes are left alone,
    /// NIC-stamped ones as soon as a fit's pure pairs span half a window
    /// (such fits pin the slope better than a drift that wandered through
    /// the outage; the simulator's isolation with NIC stamps got worse with
    /// the prior for them); a NIC fit over the part of a window after a
    /// peer came back, whose slope over tens of ms can be ppm off, counts
    /// as young (`clockmesh_core::history::HistoryFit::history_share`).
    /// Only nodes on the reference timeline take part; the reference's
    /// drift is 0 by definition.
    fn weigh_drifts_with_priors(&mut self, sol: &mut NetworkSolution, settled: &HashSet<NodeId>) {
        let wander = self.cfg.holdover_wander_ppb * 1e-9;
        let max_age = self.cfg.drift_prior_max_age_ns;
        for n in sol.nodes.iter_mut() {
            if !is_on_the_timeline(n.anchor_kind) || n.node == sol.reference {
                continue;
            }
            let recent = self
                .drift_priors
                .get(&n.node)
                .filter(|p| (0..=max_age).contains(&sol.epoch_ns.saturating_sub(p.epoch_ns)));
            if let Some(prior) = recent.filter(|_| !settled.contains(&n.node)) {
                combine_drift(n, prior.drift, prior.drift_bound + wander);
            }
            self.drift_priors.insert(
                n.node,
                DriftPrior {
                    epoch_ns: sol.epoch_ns,
                    drift: n.drift,
                    drift_bound: n.drift_bound,
                },
            );
        }
        let oldest = sol.epoch_ns.saturating_sub(max_age);
        self.drift_priors.retain(|_, p| p.epoch_ns >= oldest);
    }

    fn holdover(&self, prev: &NetworkSolution, sol: &mut NetworkSolution) {
        let Some(comp) = sol
            .components
            .iter()
            .position(|c| c.kind == AnchorKind::Substitute)
        else {
            return;
        };
        // Previous estimate of each candidate, aged to the new epoch.
        let pivot = sol
            .nodes
            .iter()
            .filter(|n| n.component == comp)
            .filter_map(|n| {
                let p = self.offset_at(n.node, LocalNs(sol.epoch_ns))?;
                is_on_the_timeline(p.anchor_kind).then_some((n.node, p))
            })
            .min_by(|a, b| a.1.bound_ns.total_cmp(&b.1.bound_ns).then(a.0.cmp(&b.0)));
        let Some((pivot_id, prior)) = pivot else {
            return;
        };
        let Some(pivot_now) = sol.get(pivot_id).cloned() else {
            return;
        };
        let prior_drift = prev.get(pivot_id).map_or(0.0, |p| p.drift);
        let prior_drift_bound =
            prev.get(pivot_id).map_or(0.0, |p| p.drift_bound) + self.cfg.holdover_wander_ppb * 1e-9;
        for n in sol.nodes.iter_mut().filter(|n| n.component == comp) {
            // clock_n − ref = (clock_n − clock_pivot) + (clock_pivot − ref)
            n.offset_base_ns = n
                .offset_base_ns
                .saturating_sub(pivot_now.offset_base_ns)
                .saturating_add(prior.offset_ns);
            n.offset_rel_ns -= pivot_now.offset_rel_ns;
            n.drift += prior_drift - pivot_now.drift;
            n.bound_ns += pivot_now.bound_ns + prior.bound_ns;
            n.drift_bound += pivot_now.drift_bound + prior_drift_bound;
            n.anchor = sol.reference;
            n.anchor_kind = AnchorKind::Holdover;
        }
        sol.components[comp].kind = AnchorKind::Holdover;
        sol.components[comp].anchor = sol.reference;
    }
}

/// Whether an estimate of this kind is on the reference timeline.
fn is_on_the_timeline(kind: AnchorKind) -> bool {
    matches!(kind, AnchorKind::Reference | AnchorKind::Holdover)
}

/// The nodes with an edge that spans its stamps' full history.
fn nodes_with_a_full_history(measurements: &[EdgeMeasurement]) -> HashSet<NodeId> {
    measurements
        .iter()
        .filter(|m| m.history_share >= 1.0)
        .flat_map(|m| [m.from, m.to])
        .collect()
}

/// `n`'s drift combined with `prior` (within `prior_bound`) when its own
/// bound is the wider: weights are inverse square bounds, and so is the
/// combined bound's mix of the two.
fn combine_drift(n: &mut NodeEstimate, prior: f64, prior_bound: f64) {
    let looser = n.drift_bound > prior_bound;
    if !looser || !prior.is_finite() {
        return;
    }
    let own = 1.0 / n.drift_bound.powi(2);
    let held = 1.0 / prior_bound.max(1e-15).powi(2);
    let total = own + held;
    n.drift = (own * n.drift + held * prior) / total;
    n.drift_bound = (own * n.drift_bound + held * prior_bound) / total;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::tests::edge;

    /// Three clocks in step; the 0 → 1 edge then takes a detour one way
    /// (its best round trip 1 µs above what it had, its offset half that
    /// off). The estimator that saw the edge's floor carries node 1 by the
    /// loop through node 2; one that did not weighs the biased edge by its
    /// bound alone.
    #[test]
    fn an_edge_above_its_round_trip_floor_weighs_less() {
        let window = |detour: bool| {
            let mut biased = edge(0, 1, if detour { 500.0 } else { 0.0 }, 2_000.0);
            if detour {
                biased.fit.min_rtt_ns += 1_000.0;
                biased.fit.bound_ns += 500.0;
            }
            vec![biased, edge(1, 2, 0.0, 2_000.0), edge(2, 0, 0.0, 2_000.0)]
        };
        let node_1 = |est: &mut Estimator, epoch: i64, edges: &[EdgeMeasurement]| {
            let sol = est.apply_fits(LocalNs(epoch), edges.to_vec()).unwrap();
            sol.get(1).unwrap().offset_ns()
        };
        let mut seen = Estimator::new(EstimatorConfig::default());
        for w in 0..5 {
            node_1(&mut seen, w * 1_000_000_000, &window(false));
        }
        let with_floor = node_1(&mut seen, 5_000_000_000, &window(true));
        let mut fresh = Estimator::new(EstimatorConfig::default());
        let without = node_1(&mut fresh, 5_000_000_000, &window(true));
        assert!(with_floor.abs() < 50.0, "with the floor: {with_floor} ns");
        assert!(without > 200.0, "without: {without} ns");
    }

    /// A node whose only edge restarted (one window of software stamps, a
    /// slope 800 ppb off and a bound to match) keeps to the drift it had
    /// 40 s before, within that one's bound plus the wander allowance;
    /// without that drift, with a full-history edge, or with a prior older
    /// than its age, the young fit's drift stands.
    #[test]
    fn a_young_node_s_drift_leans_on_its_previous_one() {
        let window = |drift_ppb: f64, bound_ppb: f64, share: f64| {
            let mut e = edge(0, 1, 0.0, 2_000.0);
            e.fit.drift = drift_ppb * 1e-9;
            e.fit.drift_bound = bound_ppb * 1e-9;
            vec![e.with_history_share(share)]
        };
        let drift_of = |est: &mut Estimator, epoch: i64, edges: Vec<EdgeMeasurement>| {
            let sol = est.apply_fits(LocalNs(epoch), edges).unwrap();
            let n = sol.get(1).unwrap();
            (n.drift * 1e9, n.drift_bound * 1e9)
        };
        let settled = || {
            let mut est = Estimator::new(EstimatorConfig::default());
            drift_of(&mut est, 0, window(5.0, 100.0, 1.0));
            est
        };
        let young = || window(800.0, 20_000.0, 1.0 / 32.0);
        let (drift, bound) = drift_of(&mut settled(), 40_000_000_000, young());
        assert!((drift - 5.0).abs() < 0.1, "drift {drift} ppb");
        // 100 ppb + the 20 ppb wander allowance, the young bound's share.
        assert!((120.0..121.0).contains(&bound), "bound {bound} ppb");
        let fresh = Estimator::new(EstimatorConfig::default());
        let (alone, _) = drift_of(&mut fresh.clone(), 40_000_000_000, young());
        let unchanged = |d: f64| (d - 800.0).abs() < 1e-6;
        assert!(unchanged(alone), "{alone}");
        let full = window(800.0, 20_000.0, 1.0);
        assert!(unchanged(drift_of(&mut settled(), 40_000_000_000, full).0));
        let too_old = EstimatorConfig::default().drift_prior_max_age_ns + 1;
        assert!(unchanged(drift_of(&mut settled(), too_old, young()).0));
    }

    /// A member that left takes its edges' floors with it once they are
    /// older than the floor's age; the edges still seen keep theirs.
    #[test]
    fn floors_of_edges_gone_for_the_floor_s_age_are_dropped() {
        let mut est = Estimator::new(EstimatorConfig::default());
        let triangle = [
            edge(0, 1, 0.0, 2_000.0),
            edge(1, 2, 0.0, 2_000.0),
            edge(2, 0, 0.0, 2_000.0),
        ];
        est.apply_fits(LocalNs(0), triangle.to_vec()).unwrap();
        assert_eq!(est.rtt_floors.len(), 3);
        let pair = [edge(0, 1, 0.0, 2_000.0)];
        est.apply_fits(LocalNs(RTT_FLOOR_AGE_NS), pair.to_vec())
            .unwrap();
        assert_eq!(est.rtt_floors.len(), 3, "gone for exactly the age: kept");
        est.apply_fits(LocalNs(RTT_FLOOR_AGE_NS + 1), pair.to_vec())
            .unwrap();
        let kept: Vec<_> = est.rtt_floors.keys().copied().collect();
        assert_eq!(kept, vec![(0, 1)]);
    }
}
