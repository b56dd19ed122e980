//! Network effect: all edge fits of a window → per-node offset and drift against a reference.
//!
//! Weighted least squares over the probe graph: `min Σ_k w_k (θ_to − θ_from − Δ_k)²` with the
//! anchor pinned to 0, i.e. the projection of the measured edge offsets onto the cut space —
//! the loop-surplus spreading of Huygens generalised to any graph (with equal weights the
//! surplus of a loop is spread evenly). Weights are `1/bound²` of each edge (offset) and
//! `1/drift_bound²` (drift), so edges with short RTTs, many pure points and a tight fit count
//! more. Precision: an integer first guess is propagated along a BFS tree, and the solver only
//! sees the small f64 residuals against it. The normal equations (a graph Laplacian) are solved
//! by Jacobi-preconditioned conjugate gradients with `nalgebra` vectors: `O(E)` memory and
//! time per iteration, all components at once.
//!
//! Bound: for any path P from the anchor to node n, `θ̂_n = Σ_P (Δ_k − r_k)` with `r_k` the
//! WLS residuals, so `|θ̂_n − θ_n| ≤ Σ_P (b_k + |r_k|)` where `b_k` bounds edge k's error. The
//! published bound is the minimum of that sum over all paths (Dijkstra). It inherits each
//! edge's asymmetry term (≥ ½ best pure RTT), so it is never below the sum of half the best
//! pure RTTs along the chosen path.
//!
//! Anchoring (deterministic): the component holding `reference` is anchored there. Every
//! other component is anchored at its lowest node id and flagged [`AnchorKind::Detached`]. If
//! the reference has no edge in this window, the largest component (ties: lowest node id) is
//! anchored at its lowest node id and flagged [`AnchorKind::Substitute`]; the stateful
//! [`crate::Estimator`] then carries the previous window's estimate across (holdover).
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use nalgebra::DVector;
use serde::{Deserialize, Serialize};

use crate::convert::{ns_f64, round_ns};
use clockmesh_time::{LocalNs, Nanos};

use crate::{EdgeFit, EstimatorError};

/// A node's or an edge's index in the solve's arrays, as u32.
#[expect(
    clippy::cast_possible_truncation,
    reason = "graphs have far fewer than 2^32 nodes and edges"
)]
fn index_u32(i: usize) -> u32 {
    i as u32
}

/// Node identifier (the agent maps hosts to ids).
pub type NodeId = u32;

/// One fitted edge of the window: `fit` is `clock_to − clock_from` on `from`'s clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeMeasurement {
    pub from: NodeId,
    pub to: NodeId,
    pub fit: EdgeFit,
    /// How far the fit's best round trip sits above the best this edge
    /// has had lately (ns, ≥ 0; [`crate::Estimator`] sets it): a detour
    /// on one direction, whose extra delay biases the offset by up to half
    /// of it. Lowers the edge's weight in the solve
    /// ([`NetConfig::detour_scale_ns`]), never its bound.
    #[serde(default)]
    pub excess_rtt_ns: f64,
    /// The share, in (0, 1], of its stamps' full history the fit spans
    /// when a shorter history means a noisier offset (the caller knows
    /// which stamps those are; 1 otherwise). Its square scales the edge's
    /// weight in the offset solve, never its bound: with software stamps
    /// the bound is mostly half the best round trip, as wide for a fit of
    /// one window as for one of 32, while the one-window offset scatters
    /// several times more. An edge whose history restarted (its node's
    /// agent did) or was cut (its path changed) then leaves its node to
    /// the edges that kept theirs.
    #[serde(default = "full_history")]
    pub history_share: f64,
}

fn full_history() -> f64 {
    1.0
}

impl EdgeMeasurement {
    /// A fitted edge with no known detour and a full history: only the
    /// leader's [`crate::Estimator`], which keeps each edge's round-trip
    /// floor, sets [`Self::excess_rtt_ns`]; the fit's history sets
    /// [`Self::history_share`] ([`Self::with_history_share`]).
    pub fn new(from: NodeId, to: NodeId, fit: EdgeFit) -> Self {
        Self {
            from,
            to,
            fit,
            excess_rtt_ns: 0.0,
            history_share: full_history(),
        }
    }

    /// The same edge fitted over `share` of a full history.
    pub fn with_history_share(self, share: f64) -> Self {
        Self {
            history_share: share,
            ..self
        }
    }
}

/// Network solve parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetConfig {
    /// The node whose clock is the timeline (offset 0, drift 0).
    pub reference: NodeId,
    /// Reference-clock time the node offsets refer to (e.g. the end of the window).
    pub epoch_ns: i64,
    /// Conjugate-gradient stop: relative residual (default 1e-10).
    pub cg_tolerance: f64,
    /// Conjugate-gradient iteration cap (default 10 000).
    pub max_iterations: usize,
    /// Edge bounds below this are clamped when turned into weights (default 0.5 ns).
    pub weight_floor_ns: f64,
    /// An edge whose best round trip is `x` above its floor
    /// ([`EdgeMeasurement::excess_rtt_ns`]) weighs `1 + (x / 2 / this)²`
    /// times less in the offset solve (default 100 ns: about the
    /// asymmetry of two equal paths, so a detour's half is judged against
    /// it). The loop through the other edges then carries the node, as
    /// Huygens' network effect would put it; bounds are not changed.
    pub detour_scale_ns: f64,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            reference: 0,
            epoch_ns: 0,
            cg_tolerance: 1e-10,
            max_iterations: 10_000,
            weight_floor_ns: 0.5,
            detour_scale_ns: 100.0,
        }
    }
}

/// How a node's offsets are anchored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AnchorKind {
    /// Anchored at the configured reference.
    Reference,
    /// The reference was absent from this window; anchored at the lowest node id of the
    /// largest component.
    Substitute,
    /// A component not connected to the anchor; anchored at its own lowest node id.
    Detached,
    /// Set by [`crate::Estimator`]: a substitute anchor placed on the reference timeline by the
    /// previous window's estimate (bound widened by drift × age).
    Holdover,
}

/// Estimate of one node: `clock_node − clock_anchor ≈ offset_base_ns + offset_rel_ns` at the
/// epoch, changing at `drift`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeEstimate {
    pub node: NodeId,
    /// Index into [`NetworkSolution::components`].
    pub component: usize,
    pub anchor: NodeId,
    pub anchor_kind: AnchorKind,
    pub offset_base_ns: i64,
    pub offset_rel_ns: f64,
    /// Dimensionless (×1e9 = ppb).
    pub drift: f64,
    /// |estimated − true offset| at the epoch, guaranteed when every edge bound holds.
    pub bound_ns: f64,
    pub drift_bound: f64,
    /// Hops on the path that gives the bound.
    pub hops: u32,
    /// Sum of the edge margins (½ best pure RTT) along that path: the asymmetry part.
    pub asymmetry_term_ns: f64,
}

impl NodeEstimate {
    /// Offset as one f64 (exact below 2^53 ns).
    pub fn offset_ns(&self) -> f64 {
        ns_f64(self.offset_base_ns) + self.offset_rel_ns
    }

    /// Offset rounded to an integer ns, computed without going through a large f64.
    pub fn offset_rounded(&self) -> Nanos {
        Nanos(
            self.offset_base_ns
                .saturating_add(round_ns(self.offset_rel_ns)),
        )
    }
}

/// One connected component of the window's graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentInfo {
    pub anchor: NodeId,
    pub kind: AnchorKind,
    pub nodes: usize,
    pub edges: usize,
}

/// Result of [`solve_network`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkSolution {
    pub epoch_ns: i64,
    pub reference: NodeId,
    pub reference_present: bool,
    /// Sorted by node id.
    pub nodes: Vec<NodeEstimate>,
    pub components: Vec<ComponentInfo>,
    /// CG iterations (offset solve, drift solve).
    pub iterations: (usize, usize),
}

impl NetworkSolution {
    pub fn get(&self, node: NodeId) -> Option<&NodeEstimate> {
        self.nodes
            .binary_search_by_key(&node, |n| n.node)
            .ok()
            .map(|i| &self.nodes[i])
    }
}

/// Solves the window's graph. Errors: no edges, self loops, non-finite or non-positive
/// bounds, and (never on a well-formed graph) a CG that does not converge.
pub fn solve_network(
    edges: &[EdgeMeasurement],
    cfg: &NetConfig,
) -> Result<NetworkSolution, EstimatorError> {
    validate(edges, cfg)?;
    let graph = Graph::new(edges);
    let comps = graph.components(cfg.reference);
    let theta0 = graph.integer_guess(edges, &comps, cfg.epoch_ns)?;
    let n = graph.ids.len();
    let mut lin = Linear {
        from: Vec::with_capacity(edges.len()),
        to: Vec::with_capacity(edges.len()),
        n,
        pinned: comps.anchor_index.clone(),
    };
    let mut off_d = Vec::with_capacity(edges.len());
    let mut off_w = Vec::with_capacity(edges.len());
    let mut off_b = Vec::with_capacity(edges.len());
    let mut drift_d = Vec::with_capacity(edges.len());
    let mut drift_w = Vec::with_capacity(edges.len());
    let mut drift_b = Vec::with_capacity(edges.len());
    let mut margins = Vec::with_capacity(edges.len());
    for e in edges {
        let (i, j) = (graph.index[&e.from], graph.index[&e.to]);
        lin.from.push(index_u32(i));
        lin.to.push(index_u32(j));
        let t_from = cfg.epoch_ns.saturating_add(theta0[i]);
        let (base, rel) = e.fit.offset_at(LocalNs(t_from));
        let int_part = base
            .checked_sub(theta0[j])
            .and_then(|v| v.checked_add(theta0[i]))
            .ok_or(EstimatorError::Absurd {
                what: "edge offset",
                value: base,
            })?;
        off_d.push(ns_f64(int_part) + rel);
        let b = e.fit.bound_at(LocalNs(t_from));
        off_b.push(b);
        off_w.push(offset_weight(b, e, cfg));
        drift_d.push(e.fit.drift);
        drift_b.push(e.fit.drift_bound);
        drift_w.push(1.0 / e.fit.drift_bound.max(1e-12).powi(2));
        margins.push(e.fit.margin_ns);
    }
    let (corr, it_off) = lin.solve(&off_w, &off_d, cfg)?;
    let (drift, it_drift) = lin.solve(&drift_w, &drift_d, cfg)?;
    let off_cost = lin.path_costs(&corr, &off_d, &off_b);
    let drift_cost = lin.path_costs(&drift, &drift_d, &drift_b);
    let off_paths = graph.shortest_paths(&lin, &off_cost, &margins, &comps.anchor_index);
    let drift_paths = graph.shortest_paths(&lin, &drift_cost, &margins, &comps.anchor_index);
    let nodes = (0..n)
        .map(|i| {
            let c = comps.of_node[i];
            NodeEstimate {
                node: graph.ids[i],
                component: c,
                anchor: comps.info[c].anchor,
                anchor_kind: comps.info[c].kind,
                offset_base_ns: theta0[i],
                offset_rel_ns: corr[i],
                drift: drift[i],
                bound_ns: off_paths[i].cost,
                drift_bound: drift_paths[i].cost,
                hops: off_paths[i].hops,
                asymmetry_term_ns: off_paths[i].margin_sum,
            }
        })
        .collect();
    let mut components = comps.info;
    for &f in &lin.from {
        components[comps.of_node[f as usize]].edges += 1;
    }
    Ok(NetworkSolution {
        epoch_ns: cfg.epoch_ns,
        reference: cfg.reference,
        reference_present: graph.index.contains_key(&cfg.reference),
        nodes,
        components,
        iterations: (it_off, it_drift),
    })
}

/// An edge's weight in the offset solve: the inverse square of its bound
/// (`bound_ns`, at the solve's epoch), lowered by the detour its round
/// trip shows and by the share of a full history it lacks.
fn offset_weight(bound_ns: f64, e: &EdgeMeasurement, cfg: &NetConfig) -> f64 {
    let detour = e.excess_rtt_ns / 2.0 / cfg.detour_scale_ns;
    e.history_share.powi(2) / (bound_ns.max(cfg.weight_floor_ns).powi(2) * (1.0 + detour * detour))
}

fn validate(edges: &[EdgeMeasurement], cfg: &NetConfig) -> Result<(), EstimatorError> {
    if edges.is_empty() {
        return Err(EstimatorError::Empty("no edges in this window"));
    }
    if !(cfg.cg_tolerance > 0.0 && cfg.cg_tolerance < 1.0) || cfg.max_iterations == 0 {
        return Err(EstimatorError::Config(
            "cg_tolerance must be in (0, 1) and max_iterations > 0",
        ));
    }
    if !(cfg.weight_floor_ns.is_finite() && cfg.weight_floor_ns > 0.0) {
        return Err(EstimatorError::Config("weight_floor_ns must be > 0"));
    }
    if !(cfg.detour_scale_ns.is_finite() && cfg.detour_scale_ns > 0.0) {
        return Err(EstimatorError::Config("detour_scale_ns must be > 0"));
    }
    for e in edges {
        if e.from == e.to {
            return Err(EstimatorError::SelfLoop(e.from));
        }
        let bad = |what| EstimatorError::BadEdge {
            from: e.from,
            to: e.to,
            what,
        };
        let f = &e.fit;
        if !(f.bound_ns.is_finite() && f.bound_ns > 0.0) {
            return Err(bad("bound_ns"));
        }
        if !(f.drift_bound.is_finite() && f.drift_bound > 0.0) {
            return Err(bad("drift_bound"));
        }
        if !f.offset_rel_ns.is_finite() || !f.drift.is_finite() || !f.margin_ns.is_finite() {
            return Err(bad("offset, drift or margin"));
        }
        if !(e.excess_rtt_ns.is_finite() && e.excess_rtt_ns >= 0.0) {
            return Err(bad("excess_rtt_ns"));
        }
        if !(e.history_share > 0.0 && e.history_share <= 1.0) {
            return Err(bad("history_share"));
        }
    }
    Ok(())
}

struct Graph {
    /// Sorted node ids; index = position.
    ids: Vec<NodeId>,
    index: HashMap<NodeId, usize>,
    /// CSR adjacency: neighbours of i are adj[start[i]..start[i+1]] as (node, edge).
    start: Vec<usize>,
    adj: Vec<(u32, u32)>,
}

struct Components {
    of_node: Vec<usize>,
    info: Vec<ComponentInfo>,
    /// Node index of each component's anchor.
    anchor_index: Vec<usize>,
}

impl Graph {
    fn new(edges: &[EdgeMeasurement]) -> Self {
        let mut ids: Vec<NodeId> = edges.iter().flat_map(|e| [e.from, e.to]).collect();
        ids.sort_unstable();
        ids.dedup();
        let index: HashMap<NodeId, usize> =
            ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
        let mut degree = vec![0usize; ids.len() + 1];
        for e in edges {
            degree[index[&e.from]] += 1;
            degree[index[&e.to]] += 1;
        }
        let mut start = vec![0usize; ids.len() + 1];
        for i in 0..ids.len() {
            start[i + 1] = start[i] + degree[i];
        }
        let mut fill = start.clone();
        let mut adj = vec![(0u32, 0u32); start[ids.len()]];
        for (k, e) in edges.iter().enumerate() {
            let (i, j) = (index[&e.from], index[&e.to]);
            adj[fill[i]] = (index_u32(j), index_u32(k));
            fill[i] += 1;
            adj[fill[j]] = (index_u32(i), index_u32(k));
            fill[j] += 1;
        }
        Self {
            ids,
            index,
            start,
            adj,
        }
    }

    fn neighbours(&self, i: usize) -> &[(u32, u32)] {
        &self.adj[self.start[i]..self.start[i + 1]]
    }

    /// Labels components (in order of their lowest node id) and picks their anchors.
    fn components(&self, reference: NodeId) -> Components {
        let n = self.ids.len();
        let mut of_node = vec![usize::MAX; n];
        let mut sizes = Vec::new();
        for root in 0..n {
            if of_node[root] != usize::MAX {
                continue;
            }
            let c = sizes.len();
            let mut count = 0;
            let mut queue = VecDeque::from([root]);
            of_node[root] = c;
            while let Some(u) = queue.pop_front() {
                count += 1;
                for &(v, _) in self.neighbours(u) {
                    if of_node[v as usize] == usize::MAX {
                        of_node[v as usize] = c;
                        queue.push_back(v as usize);
                    }
                }
            }
            sizes.push((root, count));
        }
        // Roots are the lowest index (= lowest id) of each component.
        let ref_comp = self.index.get(&reference).map(|&i| of_node[i]);
        let substitute = match ref_comp {
            Some(_) => None,
            // max_by_key returns the last maximum; iterate reversed so ties go to the lowest id.
            None => sizes
                .iter()
                .enumerate()
                .rev()
                .max_by_key(|(_, (_, size))| *size)
                .map(|(c, _)| c),
        };
        let mut info = Vec::with_capacity(sizes.len());
        let mut anchor_index = Vec::with_capacity(sizes.len());
        for (c, &(root, size)) in sizes.iter().enumerate() {
            let (anchor, kind) = if Some(c) == ref_comp {
                (self.index[&reference], AnchorKind::Reference)
            } else if Some(c) == substitute {
                (root, AnchorKind::Substitute)
            } else {
                (root, AnchorKind::Detached)
            };
            anchor_index.push(anchor);
            info.push(ComponentInfo {
                anchor: self.ids[anchor],
                kind,
                nodes: size,
                edges: 0,
            });
        }
        Components {
            of_node,
            info,
            anchor_index,
        }
    }

    /// Integer offsets along BFS trees from each anchor (exact, no large f64).
    fn integer_guess(
        &self,
        edges: &[EdgeMeasurement],
        comps: &Components,
        epoch_ns: i64,
    ) -> Result<Vec<i64>, EstimatorError> {
        let n = self.ids.len();
        let mut theta = vec![0i64; n];
        let mut seen = vec![false; n];
        let overflow = |value| EstimatorError::Absurd {
            what: "accumulated offset",
            value,
        };
        for &anchor in &comps.anchor_index {
            seen[anchor] = true;
            let mut queue = VecDeque::from([anchor]);
            while let Some(u) = queue.pop_front() {
                for &(v, k) in self.neighbours(u) {
                    let v = v as usize;
                    if seen[v] {
                        continue;
                    }
                    seen[v] = true;
                    let e = &edges[k as usize];
                    let forward = self.index[&e.from] == u;
                    // Evaluate at the from-node's clock; when walking backwards its offset is
                    // not known yet, and θ_u − Δ is close enough for the evaluation time.
                    let from_theta = if forward {
                        theta[u]
                    } else {
                        theta[u].saturating_sub(e.fit.offset_base_ns)
                    };
                    let (base, rel) = e
                        .fit
                        .offset_at(LocalNs(epoch_ns.saturating_add(from_theta)));
                    let delta = base.checked_add(round_ns(rel)).ok_or(overflow(base))?;
                    theta[v] = if forward {
                        theta[u].checked_add(delta)
                    } else {
                        theta[u].checked_sub(delta)
                    }
                    .ok_or(overflow(delta))?;
                    queue.push_back(v);
                }
            }
        }
        Ok(theta)
    }

    fn shortest_paths(
        &self,
        lin: &Linear,
        cost: &[f64],
        margins: &[f64],
        anchors: &[usize],
    ) -> Vec<PathInfo> {
        let n = self.ids.len();
        let mut best = vec![
            PathInfo {
                cost: f64::INFINITY,
                hops: 0,
                margin_sum: 0.0
            };
            n
        ];
        let mut heap = BinaryHeap::new();
        for &a in anchors {
            best[a].cost = 0.0;
            heap.push(HeapItem(0.0, a));
        }
        while let Some(HeapItem(c, u)) = heap.pop() {
            if c > best[u].cost {
                continue;
            }
            for &(v, k) in self.neighbours(u) {
                let (v, k) = (v as usize, k as usize);
                debug_assert!(lin.from[k] as usize == u || lin.to[k] as usize == u);
                let nc = c + cost[k];
                if nc < best[v].cost {
                    best[v] = PathInfo {
                        cost: nc,
                        hops: best[u].hops + 1,
                        margin_sum: best[u].margin_sum + margins[k],
                    };
                    heap.push(HeapItem(nc, v));
                }
            }
        }
        best
    }
}

#[derive(Debug, Clone, Copy)]
struct PathInfo {
    cost: f64,
    hops: u32,
    margin_sum: f64,
}

/// Min-heap item on a finite f64 cost.
struct HeapItem(f64, usize);

impl PartialEq for HeapItem {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for HeapItem {}
impl PartialOrd for HeapItem {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for HeapItem {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.total_cmp(&self.0).then(other.1.cmp(&self.1))
    }
}

/// The weighted-Laplacian system of the graph with anchors pinned to zero.
struct Linear {
    from: Vec<u32>,
    to: Vec<u32>,
    n: usize,
    pinned: Vec<usize>,
}

impl Linear {
    fn laplacian_mul(&self, w: &[f64], x: &DVector<f64>, out: &mut DVector<f64>, pinned: &[bool]) {
        out.fill(0.0);
        for ((&i, &j), &wk) in self.from.iter().zip(&self.to).zip(w) {
            let (i, j) = (i as usize, j as usize);
            let flow = wk * (x[i] - x[j]);
            out[i] += flow;
            out[j] -= flow;
        }
        for (i, &p) in pinned.iter().enumerate() {
            if p {
                out[i] = x[i];
            }
        }
    }

    /// Weighted least squares for node values with pinned anchors; returns values, iterations.
    fn solve(
        &self,
        w: &[f64],
        d: &[f64],
        cfg: &NetConfig,
    ) -> Result<(DVector<f64>, usize), EstimatorError> {
        let n = self.n;
        let mut pinned = vec![false; n];
        for &p in &self.pinned {
            pinned[p] = true;
        }
        let mut rhs = DVector::zeros(n);
        let mut diag = DVector::zeros(n);
        for (k, (&i, &j)) in self.from.iter().zip(&self.to).enumerate() {
            let (i, j) = (i as usize, j as usize);
            rhs[j] += w[k] * d[k];
            rhs[i] -= w[k] * d[k];
            diag[i] += w[k];
            diag[j] += w[k];
        }
        for (i, &p) in pinned.iter().enumerate() {
            if p {
                rhs[i] = 0.0;
                diag[i] = 1.0;
            }
        }
        let inv_diag = diag.map(|v: f64| 1.0 / v);
        let mut x = DVector::zeros(n);
        let b_norm = rhs.norm();
        if b_norm == 0.0 {
            return Ok((x, 0));
        }
        let mut r = rhs.clone();
        let mut z = r.component_mul(&inv_diag);
        let mut p = z.clone();
        let mut rz = r.dot(&z);
        let mut ap = DVector::zeros(n);
        for it in 1..=cfg.max_iterations {
            self.laplacian_mul(w, &p, &mut ap, &pinned);
            let alpha = rz / p.dot(&ap);
            x.axpy(alpha, &p, 1.0);
            r.axpy(-alpha, &ap, 1.0);
            let res = r.norm() / b_norm;
            if res <= cfg.cg_tolerance {
                return Ok((x, it));
            }
            z = r.component_mul(&inv_diag);
            let rz_new = r.dot(&z);
            p.axpy(1.0, &z, rz_new / rz);
            rz = rz_new;
        }
        Err(EstimatorError::NoConvergence {
            iterations: cfg.max_iterations,
            residual: r.norm() / b_norm,
        })
    }

    /// Per-edge path cost: edge bound + |WLS residual|.
    fn path_costs(&self, x: &DVector<f64>, d: &[f64], b: &[f64]) -> Vec<f64> {
        (0..self.from.len())
            .map(|k| {
                let fitted = x[self.to[k] as usize] - x[self.from[k] as usize];
                b[k] + (d[k] - fitted).abs()
            })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An edge fit with a given offset at epoch 0, zero drift, and bound/margin.
    pub(crate) fn edge(from: NodeId, to: NodeId, offset: f64, bound: f64) -> EdgeMeasurement {
        EdgeMeasurement::new(
            from,
            to,
            EdgeFit {
                epoch_ns: 0,
                offset_base_ns: offset.floor() as i64,
                offset_rel_ns: offset - offset.floor(),
                drift: 0.0,
                margin_ns: bound / 2.0,
                min_rtt_ns: bound,
                bound_ns: bound,
                drift_bound: 1e-9,
                forward_points: 10,
                backward_points: 10,
                trimmed: 0,
                span_ns: 1_000_000_000,
            },
        )
    }

    #[test]
    fn huygens_three_node_loop_spreads_surplus_evenly() {
        // A=0, B=1, C=2: AB = 20, BC = -15, CA = 5; loop surplus 10, equal weights.
        let edges = [
            edge(0, 1, 20.0, 10.0),
            edge(1, 2, -15.0, 10.0),
            edge(2, 0, 5.0, 10.0),
        ];
        let sol = solve_network(&edges, &NetConfig::default()).unwrap();
        let b = sol.get(1).unwrap().offset_ns();
        let c = sol.get(2).unwrap().offset_ns();
        assert!(
            (b - (20.0 - 10.0 / 3.0)).abs() < 1e-6,
            "AB corrected to {b}"
        );
        assert!((c - b - (-15.0 - 10.0 / 3.0)).abs() < 1e-6);
        assert!((0.0 - c - (5.0 - 10.0 / 3.0)).abs() < 1e-6);
        assert_eq!(sol.get(0).unwrap().bound_ns, 0.0);
        // Bound: min over paths of Σ (b + |r|): direct edge 10 + 10/3.
        assert!((sol.get(1).unwrap().bound_ns - (10.0 + 10.0 / 3.0)).abs() < 1e-6);
    }

    #[test]
    fn weights_shift_surplus_to_the_loose_edge() {
        // The CA edge is 10× looser: it absorbs almost all the surplus.
        let edges = [
            edge(0, 1, 20.0, 1.0),
            edge(1, 2, -15.0, 1.0),
            edge(2, 0, 5.0, 10.0),
        ];
        let sol = solve_network(&edges, &NetConfig::default()).unwrap();
        let b = sol.get(1).unwrap().offset_ns();
        assert!((b - 20.0).abs() < 0.1, "{b}");
    }

    #[test]
    fn an_edge_of_a_short_history_absorbs_the_surplus_at_equal_bounds() {
        // A restarted history: CA fitted over 1 of 32 windows, the others
        // over all 32, all with the same (round-trip-dominated) bound.
        let edges = [
            edge(0, 1, 20.0, 2000.0),
            edge(1, 2, -15.0, 2000.0),
            edge(2, 0, -5.0 + 100.0, 2000.0).with_history_share(1.0 / 32.0),
        ];
        let sol = solve_network(&edges, &NetConfig::default()).unwrap();
        let b = sol.get(1).unwrap().offset_ns();
        let c = sol.get(2).unwrap().offset_ns();
        // 1024 times less weight: under 0.1 % of the 100 ns surplus stays on AB and BC.
        assert!((b - 20.0).abs() < 0.1, "AB corrected to {b}");
        assert!((c - 5.0).abs() < 0.2, "AC {c}");
        // Bounds are not weights: node 1's is still its direct edge's and more.
        assert!(sol.get(1).unwrap().bound_ns >= 2000.0);
        // At a full history the surplus is spread evenly again.
        let even = [edges[0].clone(), edges[1].clone(), edge(2, 0, 95.0, 2000.0)];
        let b = solve_network(&even, &NetConfig::default())
            .unwrap()
            .get(1)
            .unwrap()
            .offset_ns();
        assert!((b - (20.0 - 100.0 / 3.0)).abs() < 1e-6, "{b}");
    }

    #[test]
    fn a_history_share_outside_0_1_is_refused() {
        for share in [0.0, -0.5, 1.5, f64::NAN] {
            let edges = [edge(0, 1, 20.0, 10.0).with_history_share(share)];
            assert!(
                solve_network(&edges, &NetConfig::default()).is_err(),
                "{share}"
            );
        }
    }

    #[test]
    fn conjugate_gradient_matches_dense_solve() {
        use nalgebra::DMatrix;
        // A small irregular graph with distinct weights.
        let spec = [
            (0, 1, 3.0, 2.0),
            (1, 2, -4.0, 1.0),
            (2, 3, 7.5, 3.0),
            (3, 0, -5.0, 1.5),
            (1, 3, 4.0, 2.5),
            (4, 2, 1.0, 1.0),
            (4, 0, -2.0, 4.0),
        ];
        let edges: Vec<_> = spec.iter().map(|&(a, b, o, w)| edge(a, b, o, w)).collect();
        let sol = solve_network(&edges, &NetConfig::default()).unwrap();
        // Dense normal equations with node 0 removed.
        let n = 5;
        let mut l = DMatrix::<f64>::zeros(n, n);
        let mut rhs = DVector::<f64>::zeros(n);
        for &(a, b, o, bound) in &spec {
            let (a, b) = (a as usize, b as usize);
            let w = 1.0 / (bound * bound);
            l[(a, a)] += w;
            l[(b, b)] += w;
            l[(a, b)] -= w;
            l[(b, a)] -= w;
            rhs[b] += w * o;
            rhs[a] -= w * o;
        }
        let reduced = l.view((1, 1), (n - 1, n - 1)).into_owned();
        let x = reduced
            .cholesky()
            .unwrap()
            .solve(&rhs.rows(1, n - 1).into_owned());
        for i in 1..n {
            let got = sol.get(i as NodeId).unwrap().offset_ns();
            assert!(
                (got - x[i - 1]).abs() < 1e-6,
                "node {i}: {got} vs {}",
                x[i - 1]
            );
        }
    }

    #[test]
    fn disconnected_and_missing_reference_are_flagged() {
        let edges = [
            edge(0, 1, 5.0, 1.0),
            edge(7, 8, 3.0, 1.0),
            edge(8, 9, 1.0, 1.0),
        ];
        let sol = solve_network(&edges, &NetConfig::default()).unwrap();
        assert_eq!(sol.components.len(), 2);
        assert_eq!(sol.get(1).unwrap().anchor_kind, AnchorKind::Reference);
        let n9 = sol.get(9).unwrap();
        assert_eq!((n9.anchor, n9.anchor_kind), (7, AnchorKind::Detached));
        assert!((n9.offset_ns() - 4.0).abs() < 1e-9);
        // Reference 0 gone: the larger component {7,8,9} takes over, anchored at 7.
        let cfg = NetConfig::default();
        let sol = solve_network(&edges[1..], &cfg).unwrap();
        assert!(!sol.reference_present);
        assert_eq!(sol.get(8).unwrap().anchor_kind, AnchorKind::Substitute);
        assert_eq!(sol.get(8).unwrap().anchor, 7);
    }

    #[test]
    fn bad_graphs_are_errors() {
        let cfg = NetConfig::default();
        assert!(matches!(
            solve_network(&[], &cfg),
            Err(EstimatorError::Empty(_))
        ));
        assert!(matches!(
            solve_network(&[edge(3, 3, 1.0, 1.0)], &cfg),
            Err(EstimatorError::SelfLoop(3))
        ));
        let mut e = edge(0, 1, 1.0, 1.0);
        e.fit.bound_ns = f64::NAN;
        assert!(matches!(
            solve_network(&[e], &cfg),
            Err(EstimatorError::BadEdge { .. })
        ));
        for excess in [f64::NAN, f64::INFINITY, -1.0] {
            let mut e = edge(0, 1, 1.0, 1.0);
            e.excess_rtt_ns = excess;
            assert!(
                matches!(
                    solve_network(&[e], &cfg),
                    Err(EstimatorError::BadEdge {
                        what: "excess_rtt_ns",
                        ..
                    })
                ),
                "excess {excess}"
            );
        }
    }
}
