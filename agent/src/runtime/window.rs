//! Window phases. Window `k` covers local time `[k·W, (k+1)·W)`. After it
//! ends every agent fits its out-edges and shares the fits (`FIT`); the
//! solver (the leader, or every agent with the static backend) solves the
//! network (`SOLVE`); then every agent reads its own result and publishes it
//! (`FETCH`). Delays are fractions of `W` capped at the values below, so
//! agents whose clocks differ by far less than those delays agree on `k`.

use std::time::Instant;

use clockmesh_estimator::{AnchorKind as SolveAnchor, Estimator, NodeId, estimate_edge};
use clockmesh_proto::{clockmesh as pb, prost::Message as _};
use serde::Serialize;
use tracing::{debug, warn};

use super::{
    codec,
    node::Agent,
    status::{EdgeStatus, NodeOffsetStatus},
    window_clock::Phase,
};
use crate::{
    discovery::{Coordination, Discovery},
    probe::wire,
    publish::{
        history::{AnchorKind, HistoryEntry, NodeLine},
        layout::{NodeMap, Record, flags},
        sample_kernel_clocks,
    },
};

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

impl<D: Discovery + Coordination> Agent<D> {
    pub(super) async fn run_window_phases(&mut self) {
        let now = self.local_now();
        if let Some(k) = self.windows.take_due(Phase::Fit, now) {
            self.fit_window(k).await;
        }
        let solver = self.leadership.is_me;
        if let Some(k) = self.windows.take_due(Phase::Solve, now)
            && solver
        {
            self.solve_window(k).await;
        }
        if self.windows.take_due(Phase::Fetch, now).is_some() {
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
            self.windows.record_edge(
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
            .filter(|n| {
                matches!(
                    n.anchor_kind,
                    SolveAnchor::Reference | SolveAnchor::Holdover
                )
            })
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
                    anchor_kind: published_anchor_kind(n.anchor_kind).as_str().into(),
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
            anchor_kind: AnchorKind::Reference.as_str().into(),
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
        if self.windows.take_new_result(r.window, r.anchor_ns) {
            self.publish_result(&r);
        }
    }

    fn publish_result(&mut self, r: &pb::NodeOffset) {
        let mut record_flags = flags::VALID;
        if r.node_id == r.reference_id {
            record_flags |= flags::REFERENCE;
        }
        if AnchorKind::from_name(&r.anchor_kind) == Some(AnchorKind::Holdover) {
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
        let entry = HistoryEntry {
            host: r.node.clone(),
            window: r.window,
            anchor_ns: r.anchor_ns,
            offset_ns: r.offset_ns,
            drift_ppb: r.drift_ppb,
            bound_ns: r.bound_ns,
            valid_from_ns: Some(r.anchor_ns.saturating_sub(2 * window_ns)),
            valid_until_ns: Some(r.valid_until_ns as i64),
            reference: Some(r.reference_node.clone()),
            node_id: Some(r.node_id),
            bound_growth_ppb: r.bound_growth_ppb,
            reference_id: Some(r.reference_id),
            anchor_kind: AnchorKind::from_name(&r.anchor_kind),
        };
        self.write_line(&NodeLine::new(&entry));
        self.status_extra.offset = Some(node_status(r));
    }
}

/// The estimator's anchor kind under its published name.
fn published_anchor_kind(kind: SolveAnchor) -> AnchorKind {
    match kind {
        SolveAnchor::Reference => AnchorKind::Reference,
        SolveAnchor::Substitute => AnchorKind::Substitute,
        SolveAnchor::Detached => AnchorKind::Detached,
        SolveAnchor::Holdover => AnchorKind::Holdover,
    }
}

/// Status view of a result, in the one convention: global − local.
fn node_status(r: &pb::NodeOffset) -> NodeOffsetStatus {
    NodeOffsetStatus {
        node: r.node.clone(),
        node_id: r.node_id,
        reference: r.reference_node.clone(),
        window: r.window,
        offset_ns: r.offset_ns,
        drift_ppb: r.drift_ppb,
        bound_ns: r.bound_ns,
        anchor_ns: r.anchor_ns,
        valid_until_ns: r.valid_until_ns as i64,
        anchor_kind: r.anchor_kind.clone(),
    }
}
