//! Window phases. Window `k` covers local time `[k·W, (k+1)·W)`. After it
//! ends every agent fits its out-edges and shares the fits (`FIT`); the
//! solver (the leader, or every agent with the static backend) solves the
//! network (`SOLVE`); then every agent reads its own result and publishes it
//! (`FETCH`). Delays are fractions of `W` capped at the values below, so
//! agents whose clocks differ by far less than those delays agree on `k`.

use std::{collections::BTreeMap, time::Instant};

use clockmesh_estimator::{AnchorKind, Estimator, NodeId, estimate_edge};
use clockmesh_proto::{clockmesh as pb, prost::Message as _};
use serde::Serialize;
use tracing::{debug, warn};

use super::{
    codec,
    coord::Coordination,
    node::Agent,
    status::{EdgeStatus, NodeOffsetStatus},
};
use crate::{
    discovery::Discovery,
    probe::wire,
    publish::{
        layout::{NodeMap, Record, flags},
        sample_kernel_clocks,
    },
};

/// Phase delays after a window ends: (cap ns, eighths of the window).
const FIT_DELAY: (i64, i64) = (300_000_000, 1);
const SOLVE_DELAY: (i64, i64) = (1_500_000_000, 3);
const FETCH_DELAY: (i64, i64) = (2_500_000_000, 5);

pub(super) struct WindowClock {
    window_ns: i64,
    fitted: Option<u64>,
    solved: Option<u64>,
    fetched: Option<u64>,
    published: Option<(u64, i64)>,
    edges: BTreeMap<NodeId, EdgeStatus>,
}

impl WindowClock {
    pub(super) fn new(window_ns: i64) -> Self {
        WindowClock {
            window_ns: window_ns.max(1),
            fitted: None,
            solved: None,
            fetched: None,
            published: None,
            edges: BTreeMap::new(),
        }
    }

    /// The window that ended most recently, if `delay` has passed since.
    fn due(&self, now_ns: i64, (cap, eighths): (i64, i64), done: Option<u64>) -> Option<u64> {
        let w = self.window_ns;
        let delay = cap.min(w / 8 * eighths);
        let ended = now_ns.div_euclid(w) - 1;
        let since_end = now_ns - (ended + 1) * w;
        let k = u64::try_from(ended).ok()?;
        (since_end >= delay && done.is_none_or(|d| k > d)).then_some(k)
    }

    /// Whether this node has published a result since it started.
    pub(super) fn has_published(&self) -> bool {
        self.published.is_some()
    }

    /// The window local time `now_ns` falls in.
    pub(super) fn index(&self, now_ns: i64) -> i64 {
        now_ns.div_euclid(self.window_ns)
    }

    /// Local time at which window `k` ends.
    pub(super) fn end_ns(&self, k: u64) -> i64 {
        (k as i64).saturating_add(1).saturating_mul(self.window_ns)
    }

    pub(super) fn last_fitted(&self) -> u64 {
        self.fitted.unwrap_or(0)
    }

    pub(super) fn edge_status(&self, peer: NodeId) -> Option<EdgeStatus> {
        self.edges.get(&peer).cloned()
    }
}

/// One JSONL line per edge fit.
#[derive(Serialize)]
struct EdgeLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    window: u64,
    node: &'a str,
    from: &'a str,
    to: &'a str,
    from_id: NodeId,
    to_id: NodeId,
    probes_forward: usize,
    probes_backward: usize,
    pure_forward: usize,
    pure_backward: usize,
    /// Pairs rejected: a packet missing, TX gap off the nominal spacing, RX gap ≠ TX gap.
    incomplete: usize,
    spacing_rejected: usize,
    impure: usize,
    fit: Option<FitLine>,
    error: Option<String>,
}

/// The fit of an edge line: `clock_to − clock_from = offset_ns + offset_frac_ns
/// + drift_ppb·(t − anchor_ns)/1e9`, `t` on the `from` clock.
#[derive(Serialize)]
struct FitLine {
    anchor_ns: i64,
    offset_ns: i64,
    offset_frac_ns: f64,
    drift_ppb: f64,
    bound_ns: f64,
    drift_bound_ppb: f64,
    margin_ns: f64,
    min_rtt_ns: f64,
    forward_points: u32,
    backward_points: u32,
    trimmed: u32,
    span_ns: i64,
}

impl From<&pb::EdgeFit> for FitLine {
    fn from(f: &pb::EdgeFit) -> Self {
        FitLine {
            anchor_ns: f.anchor_ns,
            offset_ns: f.offset_ns,
            offset_frac_ns: f.offset_frac_ns,
            drift_ppb: f.drift_ppb,
            bound_ns: f.bound_exact_ns,
            drift_bound_ppb: f.drift_bound_ppb,
            margin_ns: f.margin_ns,
            min_rtt_ns: f.min_rtt_ns,
            forward_points: f.forward_points,
            backward_points: f.backward_points,
            trimmed: f.trimmed,
            span_ns: f.span_ns,
        }
    }
}

/// One JSONL line per node result; also a `clockmesh trace merge --history` entry.
#[derive(Serialize)]
struct NodeLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    host: &'a str,
    node_id: NodeId,
    window: u64,
    anchor_ns: i64,
    /// global − local at the anchor.
    offset_ns: i64,
    drift_ppb: f64,
    bound_ns: u64,
    bound_growth_ppb: f64,
    valid_from_ns: i64,
    valid_until_ns: i64,
    reference: &'a str,
    reference_id: NodeId,
    anchor_kind: &'a str,
}

impl<D: Discovery + Coordination> Agent<D> {
    pub(super) async fn run_window_phases(&mut self) {
        let now = self.local_now();
        if let Some(k) = self.windows.due(now, FIT_DELAY, self.windows.fitted) {
            self.windows.fitted = Some(k);
            self.fit_window(k).await;
        }
        let solver = self.leadership.is_me;
        if let Some(k) = self.windows.due(now, SOLVE_DELAY, self.windows.solved) {
            self.windows.solved = Some(k);
            if solver {
                self.solve_window(k).await;
            }
        }
        if let Some(k) = self.windows.due(now, FETCH_DELAY, self.windows.fetched) {
            self.windows.fetched = Some(k);
            self.fetch_result().await;
        }
    }

    async fn fit_window(&mut self, k: u64) {
        self.measure_clock_maps();
        let started = Instant::now();
        let me = self.me.clone();
        let mut fits = Vec::new();
        let mut lines = Vec::new();
        for peer in self.graph.out_neighbours(me.id).to_vec() {
            let edge = self.book.take_edge(me.id, peer);
            let outcome = estimate_edge(&edge, &self.est_cfg.purity, &self.est_cfg.fit);
            let peer_name = self
                .member(peer)
                .map_or_else(|| peer.to_string(), |m| m.name.clone());
            let fit = outcome
                .fit
                .as_ref()
                .ok()
                .map(|f| codec::edge_to_pb(k, (me.id, &me.name), (peer, &peer_name), f));
            let probes = (outcome.forward.probes + outcome.backward.probes) as u64;
            let pure = (outcome.forward.pure + outcome.backward.pure) as u64;
            self.windows.edges.insert(
                peer,
                EdgeStatus {
                    window: k,
                    offset_ns: fit.as_ref().map(|f| f.offset_ns),
                    drift_ppb: fit.as_ref().map(|f| f.drift_ppb),
                    bound_ns: fit.as_ref().map(|f| f.bound_exact_ns),
                    min_rtt_ns: fit.as_ref().map(|f| f.min_rtt_ns),
                    probes,
                    pure,
                    error: outcome.fit.as_ref().err().map(|e| e.to_string()),
                },
            );
            lines.push((peer_name, outcome, fit.clone()));
            fits.extend(fit);
        }
        // Directions of edges other agents fit are not ours to keep.
        self.book.clear_complete();
        self.status_extra.timings.last_fit_us = started.elapsed().as_micros() as u64;
        self.status_extra.timings.windows += 1;
        for (peer_name, o, fit) in &lines {
            let line = EdgeLine {
                kind: "edge",
                window: k,
                node: &me.name,
                from: &me.name,
                to: peer_name,
                from_id: o.from,
                to_id: o.to,
                probes_forward: o.forward.probes,
                probes_backward: o.backward.probes,
                pure_forward: o.forward.pure,
                pure_backward: o.backward.pure,
                incomplete: o.forward.incomplete + o.backward.incomplete,
                spacing_rejected: o.forward.spacing_rejected + o.backward.spacing_rejected,
                impure: o.forward.impure + o.backward.impure,
                fit: fit.as_ref().map(FitLine::from),
                error: o.fit.as_ref().err().map(|e| e.to_string()),
            };
            self.write_line(&line);
        }
        if !self.discovery.shared() {
            return self.relay_fits(k, fits);
        }
        let snapshot = pb::Snapshot {
            window: k,
            produced_at_ns: self.local_now(),
            edges: fits,
            nodes: Vec::new(),
        };
        if let Err(e) = self.discovery.put_edges(&me.name, &snapshot).await {
            self.count("discovery_errors");
            warn!("sharing edge fits of window {k}: {e}");
        }
    }

    /// Without a shared store: fits go to the leader over UDP, one per datagram.
    fn relay_fits(&mut self, k: u64, fits: Vec<pb::EdgeFit>) {
        let Some(leader) = self.reference() else {
            return;
        };
        for (i, fit) in fits.into_iter().enumerate() {
            if leader == self.me.id {
                self.relay.edges.insert((fit.from_id, fit.to_id), fit);
            } else {
                let seq = k.saturating_mul(64).saturating_add(i as u64);
                self.send_record(wire::KIND_EDGE_FIT, leader, seq, fit.encode_to_vec());
            }
        }
    }

    /// The window's fits: from etcd, or those relayed to us.
    async fn window_fits(&mut self, k: u64) -> Option<Vec<pb::EdgeFit>> {
        let fresh = |w: u64| w + 1 >= k; // this window's, or the previous one's
        if !self.discovery.shared() {
            self.relay.edges.retain(|_, f| fresh(f.window));
            return Some(self.relay.edges.values().cloned().collect());
        }
        match self.discovery.fetch_edges().await {
            Ok(s) => Some(
                s.into_iter()
                    .filter(|s| fresh(s.window))
                    .flat_map(|s| s.edges)
                    .collect(),
            ),
            Err(e) => {
                self.count("discovery_errors");
                warn!("reading edge fits for window {k}: {e}");
                None
            }
        }
    }

    pub(super) fn write_line(&mut self, line: &impl Serialize) {
        if let Err(e) = self.jsonl.write(line) {
            self.count("jsonl_errors");
            warn!(path = %self.jsonl.path().display(), "writing JSONL: {e}");
        }
    }

    /// The reference: the leader's id (Lease or etcd election, or the lowest
    /// id of a static list).
    pub(super) fn reference(&self) -> Option<NodeId> {
        let leader = self.leadership.leader.as_deref()?;
        self.members.iter().find(|m| m.name == leader).map(|m| m.id)
    }

    async fn solve_window(&mut self, k: u64) {
        let Some(reference) = self.reference() else {
            return;
        };
        if self.members.len() == 1 {
            // A lone node is its own reference: nothing to solve, but its
            // offsets file (and the GPU maps in it) must still be published.
            let lone = self.lone_result(k, reference);
            return self.share_results(k, vec![lone]).await;
        }
        let Some(fits) = self.window_fits(k).await else {
            return;
        };
        let is_member = |id: NodeId| self.members.iter().any(|m| m.id == id);
        let measurements: Vec<_> = fits
            .iter()
            .filter_map(codec::edge_from_pb)
            .filter(|m| is_member(m.from) && is_member(m.to))
            .collect();
        if self.est_cfg.net.reference != reference || self.estimator.is_none() {
            self.est_cfg.net.reference = reference;
            self.estimator = Some(Estimator::new(self.est_cfg.clone()));
        }
        // Anchor at the window's end (reference clock): the fits' epochs lie
        // there, so the result carries no extrapolation of its own.
        let epoch = self.windows.end_ns(k);
        let started = Instant::now();
        let estimator = self.estimator.as_mut().expect("set above");
        let solution = match estimator.apply_fits(epoch, &measurements) {
            Ok(s) => s.clone(),
            Err(e) => {
                self.count("solve_errors");
                return debug!("window {k}: no network solution: {e}");
            }
        };
        self.status_extra.timings.last_solve_us = started.elapsed().as_micros() as u64;
        self.status_extra.timings.solves += 1;
        let wander = self.est_cfg.holdover_wander_ppb * 1e-9;
        let valid_for = self.est_cfg.max_age_ns;
        let name_of = |id: NodeId| {
            self.members
                .iter()
                .find(|m| m.id == id)
                .map_or_else(|| id.to_string(), |m| m.name.clone())
        };
        let results: Vec<pb::NodeOffset> = solution
            .nodes
            .iter()
            .filter(|n| matches!(n.anchor_kind, AnchorKind::Reference | AnchorKind::Holdover))
            .map(|n| {
                let off = n.offset_ns_rounded();
                let anchor = epoch.saturating_add(off);
                pb::NodeOffset {
                    node: name_of(n.node),
                    anchor_ns: anchor,
                    offset_ns: -off,
                    drift_ppb: -n.drift * 1e9,
                    bound_ns: n.bound_ns.ceil() as u64,
                    reference_node: name_of(reference),
                    window: k,
                    valid_until_ns: anchor.saturating_add(valid_for) as u64,
                    devices: Vec::new(),
                    bound_growth_ppb: (n.drift_bound + wander) * 1e9,
                    node_id: n.node,
                    reference_id: reference,
                    anchor_kind: format!("{:?}", n.anchor_kind).to_lowercase(),
                }
            })
            .collect();
        self.share_results(k, results).await;
    }

    fn lone_result(&self, k: u64, me: NodeId) -> pb::NodeOffset {
        let anchor = self.windows.end_ns(k);
        pb::NodeOffset {
            node: self.me.name.clone(),
            anchor_ns: anchor,
            reference_node: self.me.name.clone(),
            window: k,
            valid_until_ns: anchor.saturating_add(self.est_cfg.max_age_ns) as u64,
            node_id: me,
            reference_id: me,
            anchor_kind: "reference".into(),
            ..Default::default()
        }
    }

    /// Hands the leader's results to every node (shared store or UDP).
    async fn share_results(&mut self, k: u64, results: Vec<pb::NodeOffset>) {
        self.status_extra.nodes = results.iter().map(node_status).collect();
        if !self.discovery.shared() {
            for r in results {
                if r.node_id == self.me.id {
                    self.relay.result = Some(r);
                } else {
                    self.send_record(wire::KIND_RESULT, r.node_id, k, r.encode_to_vec());
                }
            }
            return;
        }
        if let Err(e) = self.discovery.put_results(&results).await {
            self.count("discovery_errors");
            warn!("publishing results of window {k}: {e}");
        }
    }

    async fn fetch_result(&mut self) {
        let name = self.me.name.clone();
        let fetched = if self.discovery.shared() {
            self.discovery.my_result(&name).await
        } else {
            Ok(self.relay.result.clone())
        };
        let r = match fetched {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                self.count("discovery_errors");
                return warn!("reading this node's result: {e}");
            }
        };
        if self.windows.published == Some((r.window, r.anchor_ns)) {
            return;
        }
        self.windows.published = Some((r.window, r.anchor_ns));
        self.publish_result(&r);
    }

    fn publish_result(&mut self, r: &pb::NodeOffset) {
        let mut record_flags = flags::VALID;
        if r.node_id == r.reference_id {
            record_flags |= flags::REFERENCE;
        }
        if r.anchor_kind == "holdover" {
            record_flags |= flags::HOLDOVER;
        }
        let record = Record {
            flags: record_flags,
            epoch: 0,
            window: r.window,
            reference_id: u64::from(r.reference_id),
            updated_at_ns: self.local_now(),
            valid_until_ns: r.valid_until_ns as i64,
            node: NodeMap {
                anchor_local_ns: r.anchor_ns,
                offset_ns: r.offset_ns,
                drift_ps_per_s: (r.drift_ppb * 1e3).round() as i64,
                bound_ns: r.bound_ns,
                bound_growth_ps_per_s: (r.bound_growth_ppb * 1e3).ceil().max(0.0) as u64,
            },
            clocks: sample_kernel_clocks(),
            devices: self.device_entries(),
        };
        self.publish_record(&record);
        self.count("results_published");
        let window_ns = self.cfg.probe_window_s.value as i64 * 1_000_000_000;
        let line = NodeLine {
            kind: "node",
            host: &r.node,
            node_id: r.node_id,
            window: r.window,
            anchor_ns: r.anchor_ns,
            offset_ns: r.offset_ns,
            drift_ppb: r.drift_ppb,
            bound_ns: r.bound_ns,
            bound_growth_ppb: r.bound_growth_ppb,
            valid_from_ns: r.anchor_ns.saturating_sub(2 * window_ns),
            valid_until_ns: r.valid_until_ns as i64,
            reference: &r.reference_node,
            reference_id: r.reference_id,
            anchor_kind: &r.anchor_kind,
        };
        self.write_line(&line);
        self.status_extra.offset = Some(node_status(r));
    }
}

/// Status view of a result: the node's clock minus the reference's.
fn node_status(r: &pb::NodeOffset) -> NodeOffsetStatus {
    NodeOffsetStatus {
        node: r.node.clone(),
        node_id: r.node_id,
        reference: r.reference_node.clone(),
        window: r.window,
        offset_ns: -r.offset_ns,
        drift_ppb: -r.drift_ppb,
        bound_ns: r.bound_ns,
        anchor_ns: r.anchor_ns,
        valid_until_ns: r.valid_until_ns as i64,
        anchor_kind: r.anchor_kind.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_fire_once_per_window_after_their_delay() {
        let w = 4_000_000_000;
        let mut c = WindowClock::new(w);
        assert_eq!(c.due(10 * w + 100, FIT_DELAY, None), None, "too early");
        assert_eq!(c.due(10 * w + FIT_DELAY.0, FIT_DELAY, None), Some(9));
        c.fitted = Some(9);
        assert_eq!(c.due(10 * w + 2 * FIT_DELAY.0, FIT_DELAY, c.fitted), None);
        assert_eq!(c.due(11 * w + FIT_DELAY.0, FIT_DELAY, c.fitted), Some(10));
        // Short windows scale the delays down so every phase still fits.
        let short = WindowClock::new(1_000_000_000);
        assert_eq!(
            short.due(5_000_000_000 + 625_000_000, FETCH_DELAY, None),
            Some(4)
        );
        assert_eq!(
            short.due(5_000_000_000 + 600_000_000, FETCH_DELAY, None),
            None
        );
    }
}
