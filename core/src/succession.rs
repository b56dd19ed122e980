//! Reference succession for static membership, where no engine elects a
//! leader: the lowest-id member leads while its results arrive; one that
//! stays silent for [`FAILOVER_WINDOWS`] windows is passed over for the
//! next id, until a result from it shows it leads again. A new leader
//! continues the global timeline from its own last result
//! ([`crate::timeline`]), so neither the hand-over nor the return of the
//! old leader moves the timeline by more than the carried bound.
//!
//! Liveness comes from what the protocol already sees: the leader sends
//! every member its result once per window. Every member watches the same
//! signal, so they pass over the same leader within a window of each
//! other; a member that lost results only on its own link hears the
//! leader's next result and goes back to it. Pure: no I/O, no clock.

use std::collections::BTreeSet;

use clockmesh_estimator::NodeId;

/// Windows without a result from the leader before it is passed over:
/// long enough that datagram loss alone rarely triggers it (at 30 % loss,
/// four results in a row are lost 0.8 % of the time), short enough that
/// readers holding over see a bound grown for about five windows at most.
pub const FAILOVER_WINDOWS: i64 = 4;

/// Who leads, from the members' ids and the leader's silence.
#[derive(Clone, Debug)]
pub struct Succession {
    me: NodeId,
    silence_ns: i64,
    /// Members passed over: silent while they led, not heard since.
    passed_over: BTreeSet<NodeId>,
    /// The leader we follow and when it was last heard (or became ours).
    following: Option<(NodeId, i64)>,
}

/// What a step of the succession changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaderChange {
    /// The same leader as before.
    Kept,
    /// `passed_over` was silent for too long; the next member leads.
    FailedOver { passed_over: NodeId },
    /// A member passed over sent a result again: it leads again.
    Returned { leader: NodeId },
}

impl Succession {
    /// For member `me`, with windows of `window_ns`.
    pub fn new(me: NodeId, window_ns: i64) -> Self {
        Succession {
            me,
            silence_ns: window_ns.saturating_mul(FAILOVER_WINDOWS),
            passed_over: BTreeSet::new(),
            following: None,
        }
    }

    /// How long the leader may be silent before it is passed over, ns.
    pub fn silence_ns(&self) -> i64 {
        self.silence_ns
    }

    /// The leader among `ids`: the lowest not passed over (never `me`).
    pub fn leader(&self, ids: &[NodeId]) -> Option<NodeId> {
        ids.iter()
            .copied()
            .filter(|id| *id == self.me || !self.passed_over.contains(id))
            .min()
    }

    /// Time passes: passes over the leader if it has been silent for too
    /// long. `ids`: the members now.
    pub fn tick(&mut self, ids: &[NodeId], now_ns: i64) -> LeaderChange {
        self.passed_over.retain(|id| ids.contains(id));
        let Some(leader) = self.leader(ids) else {
            self.following = None;
            return LeaderChange::Kept;
        };
        match self.following {
            Some((l, heard)) if l == leader => {
                if leader != self.me && now_ns.saturating_sub(heard) > self.silence_ns {
                    self.passed_over.insert(leader);
                    self.follow(ids, now_ns);
                    return LeaderChange::FailedOver {
                        passed_over: leader,
                    };
                }
                LeaderChange::Kept
            }
            _ => {
                self.following = Some((leader, now_ns));
                LeaderChange::Kept
            }
        }
    }

    /// A valid result from member `from` (its own results: it leads).
    /// Returns whether it is the leader now (the result is to be taken).
    pub fn heard_result(
        &mut self,
        from: NodeId,
        ids: &[NodeId],
        now_ns: i64,
    ) -> (bool, LeaderChange) {
        let change = if self.passed_over.remove(&from) && self.leader(ids) == Some(from) {
            self.following = Some((from, now_ns));
            LeaderChange::Returned { leader: from }
        } else {
            LeaderChange::Kept
        };
        let leads = self.leader(ids) == Some(from);
        if leads {
            self.following = Some((from, now_ns));
        }
        (leads, change)
    }

    fn follow(&mut self, ids: &[NodeId], now_ns: i64) {
        self.following = self.leader(ids).map(|l| (l, now_ns));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: i64 = 4_000_000_000;
    const IDS: [NodeId; 3] = [1, 2, 3];

    #[test]
    fn the_lowest_id_leads_while_its_results_arrive() {
        let mut s = Succession::new(3, W);
        assert_eq!(s.tick(&IDS, 0), LeaderChange::Kept);
        assert_eq!(s.leader(&IDS), Some(1));
        for k in 1..20 {
            assert_eq!(s.heard_result(1, &IDS, k * W), (true, LeaderChange::Kept));
            assert_eq!(s.tick(&IDS, k * W + W / 2), LeaderChange::Kept);
        }
        assert_eq!(s.leader(&IDS), Some(1));
    }

    #[test]
    fn a_silent_leader_is_passed_over_then_the_next_and_returns_on_its_first_result() {
        let mut s = Succession::new(3, W);
        s.tick(&IDS, 0);
        s.heard_result(1, &IDS, W);
        assert_eq!(
            s.tick(&IDS, W + FAILOVER_WINDOWS * W),
            LeaderChange::Kept,
            "not yet"
        );
        assert_eq!(
            s.tick(&IDS, W + FAILOVER_WINDOWS * W + 1),
            LeaderChange::FailedOver { passed_over: 1 }
        );
        assert_eq!(s.leader(&IDS), Some(2));
        // A late result from 1 in between would bring it back; from 3 (not
        // the leader) it is not taken.
        assert_eq!(s.heard_result(3, &IDS, 6 * W), (false, LeaderChange::Kept));
        // 2 is silent too: this node (3) leads itself and is never passed over.
        let t = W + FAILOVER_WINDOWS * W + 1;
        assert_eq!(
            s.tick(&IDS, t + FAILOVER_WINDOWS * W + 1),
            LeaderChange::FailedOver { passed_over: 2 }
        );
        assert_eq!(s.leader(&IDS), Some(3));
        assert_eq!(s.tick(&IDS, t + 100 * W), LeaderChange::Kept);
        assert_eq!(s.leader(&IDS), Some(3));
        // 1 is back and leads again.
        assert_eq!(
            s.heard_result(1, &IDS, t + 101 * W),
            (true, LeaderChange::Returned { leader: 1 })
        );
        assert_eq!(s.leader(&IDS), Some(1));
    }

    #[test]
    fn a_member_that_left_is_forgotten() {
        let mut s = Succession::new(3, W);
        s.tick(&IDS, 0);
        s.tick(&IDS, 10 * W);
        assert_eq!(s.leader(&IDS), Some(2));
        // 1 leaves the list and later comes back: it leads at once.
        s.tick(&[2, 3], 11 * W);
        assert_eq!(s.leader(&IDS), Some(1));
    }
}
