//! clockmesh cluster simulator: synthetic clocks, links and probes with known truth, driving
//! the real estimator through the same calls the agent makes
//! ([`clockmesh_estimator::estimate_edge`] per edge, then [`Estimator::apply_fits`] per window),
//! and scoring the result against the truth.
//!
//! ```
//! let s = clockmesh_sim::Scenario::from_toml_str("nodes = 8\ndegree = 3\nwindows = 2\npairs_per_second = 50").unwrap();
//! let report = clockmesh_sim::run(&s).unwrap();
//! assert_eq!(report.overall.node_windows, 2 * 7);
//! ```
mod cluster;
mod error;
pub mod family;
mod protocol;
mod recovery;
mod report;
mod scenario;
pub mod skew;
pub mod wander;

use clockmesh_core::time::LocalNs;
use std::time::Instant;

use clockmesh_estimator::{AnchorKind, EdgeMeasurement, Estimator, NodeId, estimate_edge};

pub use cluster::READING_BASE_NS;
pub use error::SimError;
pub use protocol::{
    HandOverScore, HostTraffic, ProtocolReport, Traffic, WindowTrace, run_protocol,
};
pub use recovery::{RecoveryReport, RecoveryRule};
pub use report::{Quantiles, Report, Summary, WindowReport};
pub use scenario::{
    ClockModel, Isolation, LeaderChange, LinkModel, Mode, QueueKind, QueueModel, Scenario,
    TimestampModel,
};

use cluster::{Clocks, Noise, generate_links, probe_link, rng_from_seed};
use report::{Collector, WindowCollector};

/// Runs the scenario and scores every node-window.
pub fn run(s: &Scenario) -> Result<Report, SimError> {
    s.validate()?;
    // Independent streams: the graph does not change with the number of windows, nor the
    // probes with the clock tables' length.
    let stream = |k: u64| rng_from_seed(s.seed.wrapping_mul(4).wrapping_add(k));
    let window_ns = s.window_ms as f64 * 1e6;
    let horizon = window_ns * (s.windows as f64 + 2.0);
    let clocks = Clocks::generate(s, horizon, &mut stream(0));
    let links = generate_links(s, &mut stream(1));
    let mut rng = stream(2);
    let noise = Noise::new(s);
    let pairs = (s.pairs_per_second * window_ns / 1e9).round() as usize;
    let config = s.estimator_config();
    let spacing = config.purity.spacing_ns as f64;
    let mut est = Estimator::new(config.clone());
    let mut all = Collector::default();
    for w in 0..s.windows {
        let start = w as f64 * window_ns;
        let outage = s.reference_outage_windows.contains(&w);
        let mut wc = WindowCollector::new(w);
        let mut measurements: Vec<EdgeMeasurement> = Vec::with_capacity(links.len());
        for link in &links {
            if outage && (link.from == s.reference || link.to == s.reference) {
                continue;
            }
            let probes = probe_link(
                &clocks,
                &noise,
                link,
                (start, window_ns),
                pairs,
                spacing,
                &mut rng,
            );
            let t0 = Instant::now();
            let outcome = estimate_edge(&probes, &config.purity, &config.fit);
            wc.fit_ns.push(t0.elapsed().as_nanos() as f64);
            wc.record_edge(&outcome);
            measurements.extend(outcome.measurement());
        }
        // The agent publishes at the end of the window, on the reference clock.
        let epoch_rel = clocks.reading(s.reference, start + window_ns).floor();
        let epoch = READING_BASE_NS + epoch_rel as i64;
        // Before replacing the solution, score the previous one aged by one window.
        score_aged(&est, &clocks, s, epoch, &mut wc);
        if measurements.is_empty() {
            // No edge fitted: nothing to solve. Reported, not fatal: the
            // agent in the same spot keeps publishing its aged estimate.
            wc.unsolved = true;
            all.absorb(&wc);
            continue;
        }
        let t0 = Instant::now();
        let sol = est
            .apply_fits(LocalNs(epoch), measurements)
            .map_err(|source| SimError::Estimator { window: w, source })?;
        wc.solve_ns = t0.elapsed().as_nanos() as f64;
        wc.iterations = sol.iterations;
        wc.components = sol.components.len();
        wc.holdover = sol
            .nodes
            .iter()
            .any(|n| n.anchor_kind == AnchorKind::Holdover);
        score_solution(sol, &clocks, s, epoch, &mut wc);
        all.absorb(&wc);
    }
    Ok(all.report(s, links.len()))
}

/// True offset of `node` against `anchor` when the anchor reads `epoch` (ns, with base), and
/// the true drift d(clock_node − clock_anchor)/d(clock_anchor).
fn truth(clocks: &Clocks, anchor: NodeId, node: NodeId, epoch: i64) -> (f64, f64) {
    let reading = (epoch - READING_BASE_NS) as f64;
    let t = clocks.true_time_of(anchor, reading);
    let offset = clocks.reading(node, t) - clocks.reading(anchor, t);
    let fa = clocks.frequency(anchor, t);
    let drift = (clocks.frequency(node, t) - fa) / (1.0 + fa);
    (offset, drift)
}

fn timeline_anchor(s: &Scenario, anchor: NodeId, kind: AnchorKind) -> NodeId {
    match kind {
        AnchorKind::Reference | AnchorKind::Holdover => s.reference,
        AnchorKind::Substitute | AnchorKind::Detached => anchor,
    }
}

fn score_solution(
    sol: &clockmesh_estimator::NetworkSolution,
    clocks: &Clocks,
    s: &Scenario,
    epoch: i64,
    wc: &mut WindowCollector,
) {
    for n in &sol.nodes {
        let anchor = timeline_anchor(s, n.anchor, n.anchor_kind);
        if n.node == anchor {
            continue;
        }
        let (off, drift) = truth(clocks, anchor, n.node, epoch);
        let err = n.offset_ns() - off;
        wc.record_node(
            err,
            (n.drift - drift) * 1e9,
            n.bound_ns,
            n.asymmetry_term_ns,
        );
    }
}

fn score_aged(est: &Estimator, clocks: &Clocks, s: &Scenario, now: i64, wc: &mut WindowCollector) {
    let Some(sol) = est.solution() else { return };
    for n in &sol.nodes {
        let anchor = timeline_anchor(s, n.anchor, n.anchor_kind);
        if n.node == anchor {
            continue;
        }
        let Some(p) = est.offset_at(n.node, LocalNs(now)) else {
            continue;
        };
        let (off, _) = truth(clocks, anchor, n.node, now);
        wc.record_aged((p.offset_ns as f64 - off).abs() <= p.bound_ns);
    }
}
