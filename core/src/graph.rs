//! The directed probe graph, computed identically by every agent from the
//! same member list (no coordination on the probing path).
//!
//! Each node probes `k` out-neighbours:
//! - its successor on a ring ordered by a hash of the node id, so the graph
//!   is always strongly connected (a ring alone already is);
//! - `k - 1` more chosen by rendezvous (highest-random-weight) hashing over
//!   all other members: a random k-out graph, an expander with high
//!   probability, and a member joining or leaving changes only the edges it
//!   wins or held.
//!
//! In-neighbours are derived from everyone's out-lists.
//!
//! Building the graph needs the whole member list. Where reading that list
//! on every agent costs O(N²) (etcd at thousands of members), the leader
//! builds it once and hands each member its [`Neighbourhood`]; the member
//! probes from [`ProbeGraph::seen_from`], the same edges the whole graph
//! gives it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Largest supported out-degree.
pub const MAX_DEGREE: usize = 20;

/// SplitMix64 finaliser: a fixed, portable 64-bit mix (the graph must be the
/// same on every agent and every build).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn ring_key(node: u32) -> u64 {
    mix(u64::from(node) ^ 0x5249_4e47) // "RING"
}

fn rendezvous_weight(from: u32, to: u32) -> u64 {
    mix((u64::from(from) << 32 | u64::from(to)) ^ mix(u64::from(from)))
}

/// One member's edges: whom it probes and who probes it (ids, sorted).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Neighbourhood {
    pub out: Vec<u32>,
    #[serde(rename = "in")]
    pub inn: Vec<u32>,
}

impl Neighbourhood {
    /// Every member it exchanges probes with, once each, sorted.
    pub fn peers(&self) -> Vec<u32> {
        let mut all: Vec<u32> = self.out.iter().chain(&self.inn).copied().collect();
        all.sort_unstable();
        all.dedup();
        all
    }
}

/// Out- and in-neighbours of every member.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeGraph {
    out: BTreeMap<u32, Vec<u32>>,
    inn: BTreeMap<u32, Vec<u32>>,
}

impl ProbeGraph {
    /// The graph over `members` (any order, duplicates ignored) with
    /// out-degree `min(k, n - 1)`, `k` clamped to 1..=[`MAX_DEGREE`].
    pub fn build(members: &[u32], k: usize) -> Self {
        let nodes: BTreeSet<u32> = members.iter().copied().collect();
        let k = k.clamp(1, MAX_DEGREE).min(nodes.len().saturating_sub(1));
        let mut ring: Vec<u32> = nodes.iter().copied().collect();
        ring.sort_by_key(|&n| (ring_key(n), n));
        let mut graph = ProbeGraph::default();
        for (i, &node) in ring.iter().enumerate() {
            let successor = ring[(i + 1) % ring.len()];
            let out = out_neighbours(node, successor, &nodes, k);
            for &to in &out {
                graph.inn.entry(to).or_default().push(node);
            }
            graph.out.insert(node, out);
        }
        for list in graph.inn.values_mut() {
            list.sort_unstable();
        }
        graph
    }

    /// The graph as `me` knows it from its [`Neighbourhood`] alone: its
    /// own edges both ways, nobody else's.
    pub fn seen_from(me: u32, place: &Neighbourhood) -> Self {
        let mut graph = ProbeGraph::default();
        let sorted = |ids: &[u32]| {
            let mut v = ids.to_vec();
            v.sort_unstable();
            v.dedup();
            v.retain(|&n| n != me);
            v
        };
        graph.out.insert(me, sorted(&place.out));
        for from in sorted(&place.inn) {
            graph.out.entry(from).or_default().push(me);
        }
        for to in sorted(&place.out) {
            graph.inn.entry(to).or_default().push(me);
        }
        graph.inn.insert(me, sorted(&place.inn));
        graph
    }

    /// `node`'s edges (empty for a node not in the graph).
    pub fn neighbourhood(&self, node: u32) -> Neighbourhood {
        Neighbourhood {
            out: self.out_neighbours(node).to_vec(),
            inn: self.in_neighbours(node).to_vec(),
        }
    }

    pub fn out_neighbours(&self, node: u32) -> &[u32] {
        self.out.get(&node).map_or(&[], Vec::as_slice)
    }

    pub fn in_neighbours(&self, node: u32) -> &[u32] {
        self.inn.get(&node).map_or(&[], Vec::as_slice)
    }

    /// Every directed edge `(from, to)`, sorted.
    pub fn edges(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.out
            .iter()
            .flat_map(|(&from, tos)| tos.iter().map(move |&to| (from, to)))
    }

    pub fn node_count(&self) -> usize {
        self.out.len()
    }
}

fn out_neighbours(node: u32, successor: u32, nodes: &BTreeSet<u32>, k: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    let mut ranked: Vec<u32> = nodes
        .iter()
        .copied()
        .filter(|&v| v != node && v != successor)
        .collect();
    // Only the k − 1 heaviest are needed: select them in O(n) rather than
    // sorting all n (every agent builds the whole graph, n times over).
    let key = |&v: &u32| (std::cmp::Reverse(rendezvous_weight(node, v)), v);
    let wanted = (k - 1).min(ranked.len());
    if wanted > 0 && wanted < ranked.len() {
        ranked.select_nth_unstable_by_key(wanted - 1, key);
    }
    ranked.truncate(wanted);
    let mut out = vec![successor];
    out.extend(ranked);
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// Agents of different versions meet during a rolling upgrade: selecting
    /// the heaviest peers must give exactly what sorting them all gave.
    #[test]
    fn selection_matches_a_full_sort() {
        let nodes: BTreeSet<u32> = (0..300u32).map(|i| i * 7 + 3).collect();
        for k in [1, 2, 4, 10, 20] {
            for &node in nodes.iter().take(40) {
                let successor = node + 7;
                let mut ranked: Vec<u32> = nodes
                    .iter()
                    .copied()
                    .filter(|&v| v != node && v != successor)
                    .collect();
                ranked.sort_by_key(|&v| (std::cmp::Reverse(rendezvous_weight(node, v)), v));
                let mut expected = vec![successor];
                expected.extend(ranked.into_iter().take(k - 1));
                expected.sort_unstable();
                assert_eq!(out_neighbours(node, successor, &nodes, k), expected);
            }
        }
    }

    fn reachable_from(g: &ProbeGraph, start: u32) -> BTreeSet<u32> {
        let mut seen = BTreeSet::from([start]);
        let mut queue = VecDeque::from([start]);
        while let Some(n) = queue.pop_front() {
            for &m in g.out_neighbours(n) {
                if seen.insert(m) {
                    queue.push_back(m);
                }
            }
        }
        seen
    }

    #[test]
    fn same_members_any_order_same_graph() {
        let a: Vec<u32> = (1..=50).collect();
        let mut b = a.clone();
        b.reverse();
        b.push(7); // duplicate
        assert_eq!(ProbeGraph::build(&a, 4), ProbeGraph::build(&b, 4));
    }

    #[test]
    fn degrees_and_no_self_loops() {
        let members: Vec<u32> = (100..300).collect();
        let g = ProbeGraph::build(&members, 10);
        for &n in &members {
            let out = g.out_neighbours(n);
            assert_eq!(out.len(), 10);
            assert!(!out.contains(&n));
            assert!(out.windows(2).all(|w| w[0] < w[1]), "sorted, unique");
        }
        let in_total: usize = members.iter().map(|&n| g.in_neighbours(n).len()).sum();
        assert_eq!(in_total, 200 * 10);
        assert_eq!(g.edges().count(), 2000);
    }

    #[test]
    fn small_clusters_use_everyone_and_k_is_clamped() {
        let g = ProbeGraph::build(&[1, 2, 3], 4);
        assert_eq!(g.out_neighbours(1).len(), 2);
        let g = ProbeGraph::build(&[1, 2], 50);
        assert_eq!(
            (g.out_neighbours(1), g.out_neighbours(2)),
            (&[2][..], &[1][..])
        );
        assert_eq!(ProbeGraph::build(&[1], 4).out_neighbours(1).len(), 0);
        assert_eq!(ProbeGraph::build(&[], 4).node_count(), 0);
        let big: Vec<u32> = (0..100).collect();
        assert_eq!(
            ProbeGraph::build(&big, 99).out_neighbours(0).len(),
            MAX_DEGREE
        );
    }

    /// A member that knows only its neighbourhood probes, and expects
    /// probes from, exactly whom the whole graph says.
    #[test]
    fn a_neighbourhood_gives_the_same_edges_as_the_whole_graph() {
        let members: Vec<u32> = (1..=200).map(|i| i * 13 + 5).collect();
        let whole = ProbeGraph::build(&members, 4);
        for &me in &members {
            let place = whole.neighbourhood(me);
            let seen = ProbeGraph::seen_from(me, &place);
            assert_eq!(seen.out_neighbours(me), whole.out_neighbours(me));
            assert_eq!(seen.in_neighbours(me), whole.in_neighbours(me));
            assert_eq!(seen.neighbourhood(me), place);
            let mine: Vec<(u32, u32)> =
                whole.edges().filter(|&(a, b)| a == me || b == me).collect();
            assert_eq!(seen.edges().collect::<Vec<_>>(), mine);
        }
        let json = serde_json::to_string(&whole.neighbourhood(members[0])).unwrap();
        assert!(json.contains("\"in\":"), "{json}");
    }

    #[test]
    fn strongly_connected_for_every_size() {
        for n in 2..60u32 {
            let members: Vec<u32> = (0..n).map(|i| i * 7919 + 3).collect();
            let g = ProbeGraph::build(&members, 2);
            assert_eq!(reachable_from(&g, members[0]).len(), n as usize, "n={n}");
        }
    }

    #[test]
    fn a_join_changes_few_edges() {
        let before: Vec<u32> = (1..=200).collect();
        let mut after = before.clone();
        after.push(10_000);
        let (g0, g1) = (ProbeGraph::build(&before, 8), ProbeGraph::build(&after, 8));
        let e0: BTreeSet<_> = g0.edges().collect();
        let e1: BTreeSet<_> = g1
            .edges()
            .filter(|&(f, t)| f != 10_000 && t != 10_000)
            .collect();
        let changed = e0.symmetric_difference(&e1).count();
        // Only edges the newcomer wins (≈ k per node it beats) and one ring edge move.
        assert!(changed < 40, "{changed} edges changed of {}", e0.len());
    }
}
