//! What the members saw of a fault during an etcd run (`--restart-etcd-at`,
//! `--kill-leader-at`): after it, did every member keep its place in the
//! probe graph and know a leader, and how long until all of them named the
//! leader that took over.

use serde::Serialize;

use super::etcd_run::Seen;

/// A fault the etcd run makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// etcd killed (SIGKILL) and started again on its data.
    EtcdRestarted,
    /// The leader's agent killed (no leave).
    LeaderKilled,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fault::EtcdRestarted => "etcd killed and restarted",
            Fault::LeaderKilled => "the leader's agent killed",
        })
    }
}

/// The members' refreshes around one fault.
#[derive(Debug, Serialize)]
pub struct FaultReport {
    pub fault: Fault,
    /// When, s after the first measured window began.
    pub at_s: f64,
    pub refreshes_after: usize,
    /// Refreshes after the fault that found the member's place (or, a seat
    /// holder's, the whole list), share.
    pub placed_share_after: f64,
    /// … that knew a leader, share.
    pub leader_known_share_after: f64,
    /// The leader the last refreshes named.
    pub final_leader: Option<String>,
    /// From the fault to the last refresh naming another leader (or none),
    /// s; 0 when none did.
    pub all_on_final_leader_after_s: f64,
    /// Per 2 s after the first window: refreshes, placed share, share that
    /// named the final leader.
    pub timeline: Vec<(f64, usize, f64, f64)>,
}

impl FaultReport {
    pub fn of(fault: Fault, fault_ns: i64, first_ns: i64, seen: &[&Seen]) -> Self {
        let after: Vec<&&Seen> = seen.iter().filter(|s| s.at_ns >= fault_ns).collect();
        let share = |f: &dyn Fn(&Seen) -> bool, of: &[&&Seen]| {
            of.iter().filter(|s| f(s)).count() as f64 / of.len().max(1) as f64
        };
        let last_ns = seen.iter().map(|s| s.at_ns).max().unwrap_or(fault_ns);
        let final_leader = most_named(seen.iter().filter(|s| s.at_ns >= last_ns - 2_000_000_000));
        let strays = after
            .iter()
            .filter(|s| s.leader != final_leader)
            .map(|s| s.at_ns - fault_ns)
            .max()
            .unwrap_or(0);
        let timeline = buckets(seen, first_ns, last_ns)
            .map(|(t, of)| {
                let on_final = share(&|s| s.leader == final_leader, &of);
                (t, of.len(), share(&|s| s.placed, &of), on_final)
            })
            .collect();
        FaultReport {
            fault,
            at_s: (fault_ns - first_ns) as f64 / 1e9,
            refreshes_after: after.len(),
            placed_share_after: share(&|s| s.placed, &after),
            leader_known_share_after: share(&|s| s.leader.is_some(), &after),
            final_leader,
            all_on_final_leader_after_s: strays as f64 / 1e9,
            timeline,
        }
    }
}

/// The leader most refreshes named.
fn most_named<'a>(seen: impl Iterator<Item = &'a &'a Seen>) -> Option<String> {
    let mut counts = std::collections::BTreeMap::new();
    for s in seen {
        *counts.entry(s.leader.clone()).or_insert(0usize) += 1;
    }
    counts.into_iter().max_by_key(|(_, n)| *n)?.0
}

/// The refreshes in 2 s buckets from `first_ns`, with each bucket's start (s).
fn buckets<'a>(
    seen: &'a [&'a Seen],
    first_ns: i64,
    last_ns: i64,
) -> impl Iterator<Item = (f64, Vec<&'a &'a Seen>)> + 'a {
    const STEP: i64 = 2_000_000_000;
    (0..=(last_ns - first_ns).max(0) / STEP).map(move |b| {
        let lo = first_ns + b * STEP;
        let of = seen
            .iter()
            .filter(|s| (lo..lo + STEP).contains(&s.at_ns))
            .collect();
        (b as f64 * 2.0, of)
    })
}
