//! Reference succession for static membership, where no engine elects a
//! leader: the lowest-id member leads while its results arrive; one that
//! stays silent for [`results_silence`] (four windows, at least 8 s) is
//! passed over for the next id, until a result from it shows it leads again. A new leader
//! continues the global timeline from its own last result
//! ([`crate::timeline`]), so neither the hand-over nor the return of the
//! old leader moves the timeline by more than the carried bound.
//!
//! Liveness comes from what the protocol already sees. The leader sends
//! every member its result once per window: a leader whose results stop
//! for [`results_silence`] is passed over by every member. Its
//! probe peers know sooner: a live peer sends tens of datagrams a window
//! (probes, stamp reports), so a leader that has sent a peer nothing at
//! all for [`PEER_SILENCE`] — no result either — while other
//! members were heard is passed over then (a member whose own link is
//! down hears nobody and waits for the longer rule, and never leads
//! itself while it hears nobody: it holds over, and the silence it could
//! not hear counts again once it hears others). A member that passed
//! the leader over only because of its own link's loss hears the leader's
//! next result and goes back to it. Pure: no I/O, no clock.

use std::collections::BTreeSet;

use clockmesh_estimator::NodeId;

use crate::time::{LocalNs, Nanos};

/// Windows without a result from the leader before it is passed over (at
/// least [`FAILOVER_MIN`]): long enough that datagram loss alone rarely
/// triggers it (at 30 % loss, four results in a row are lost 0.8 % of the
/// time), short enough that readers holding over see a bound grown for
/// about five windows at most at windows of 2 s and longer.
pub const FAILOVER_WINDOWS: i64 = 4;

/// The shortest silence the results rule waits for, whatever the window:
/// 8 s, four windows of 2 s. With 1 s windows four results in a row would
/// be lost at 30 % loss once a window in 120, enough for a spurious
/// failover in most minutes of such loss (the fault bench saw one); eight
/// are lost once in 15,000. A dead leader's probe peers pass it over
/// sooner ([`PEER_SILENCE`]).
pub const FAILOVER_MIN: Nanos = Nanos::from_secs(8);

/// How long the leader's results may stop before it is passed over, with
/// windows of `window_ns`: [`FAILOVER_WINDOWS`] windows, at least
/// [`FAILOVER_MIN`].
pub fn results_silence(window: Nanos) -> Nanos {
    window.saturating_mul(FAILOVER_WINDOWS).max(FAILOVER_MIN)
}

/// How long a leader that is a probe peer of this member may send it
/// nothing at all (no probe, report or result) while other members are
/// heard, before it is passed over (at least a window). A live peer sends
/// at least a stamp report a second and its result every window (with the
/// 100 ms cadence, tens of probes a second), so at 30 % datagram loss a
/// live leader goes unheard for 4 s at most 0.3^5 ≈ 0.2 % of the time, and
/// its next result then brings it back; a dead one is passed over about
/// 4 s after it died instead of after [`results_silence`].
pub const PEER_SILENCE: Nanos = Nanos::from_secs(4);

/// Who leads, from the members' ids and the leader's silence.
#[derive(Clone, Debug)]
pub struct Succession {
    me: NodeId,
    silence: Nanos,
    peer_silence: Nanos,
    /// Members passed over: silent while they led, not heard since.
    passed_over: BTreeSet<NodeId>,
    /// The leader we follow and when it was last heard (or became ours).
    following: Option<(NodeId, LocalNs)>,
}

/// What a step of the succession changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaderChange {
    /// The same leader as before.
    Kept,
    /// `passed_over` was silent for too long; the next member leads.
    FailedOver { passed_over: NodeId, why: Silence },
    /// A member passed over sent a result again: it leads again.
    Returned { leader: NodeId },
}

/// Which silence passed a leader over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Silence {
    /// No result for [`results_silence`].
    Results,
    /// A probe peer that sent nothing for [`PEER_SILENCE`] while
    /// other members were heard.
    Peer,
}

impl Succession {
    /// For member `me`, with windows of `window`.
    pub fn new(me: NodeId, window: Nanos) -> Self {
        Succession {
            me,
            silence: results_silence(window),
            peer_silence: PEER_SILENCE.max(window),
            passed_over: BTreeSet::new(),
            following: None,
        }
    }

    /// How long the leader may be silent before it is passed over.
    pub fn leader_silence(&self) -> Nanos {
        self.silence
    }

    /// The leader among `ids`: the lowest not passed over (never `me`).
    pub fn leader(&self, ids: &[NodeId]) -> Option<NodeId> {
        self.leader_passing_over(ids, None)
    }

    /// The leader among `ids` if `also` were passed over as well.
    fn leader_passing_over(&self, ids: &[NodeId], also: Option<NodeId>) -> Option<NodeId> {
        ids.iter()
            .copied()
            .filter(|id| *id == self.me || (Some(*id) != also && !self.passed_over.contains(id)))
            .min()
    }

    /// Whether member `id` was heard on the probe path within the peer
    /// silence; `None` for a member this node exchanges no probes with.
    fn heard_lately(
        &self,
        id: NodeId,
        now: LocalNs,
        heard: impl Fn(NodeId) -> Option<LocalNs>,
    ) -> Option<bool> {
        heard(id).map(|t| now.since(t) <= self.peer_silence)
    }

    /// Time passes: passes over the leader if it has been silent for too
    /// long. `ids`: the members now; `heard(id)`: when member `id` was last
    /// heard on the probe path (any valid datagram), `None` for members
    /// this node exchanges no probes with.
    pub fn tick(
        &mut self,
        ids: &[NodeId],
        now: LocalNs,
        heard: impl Fn(NodeId) -> Option<LocalNs>,
    ) -> LeaderChange {
        self.passed_over.retain(|id| ids.contains(id));
        let Some(leader) = self.leader(ids) else {
            self.following = None;
            return LeaderChange::Kept;
        };
        match self.following {
            Some((l, result_at)) if l == leader => {
                let Some(why) = self.silence(leader, result_at, ids, now, &heard) else {
                    return LeaderChange::Kept;
                };
                if self.would_lead_alone(leader, ids, now, &heard) {
                    // Cut off, this member learns nothing of the leader:
                    // its silence counts again from when others are heard,
                    // so the leader's next result, not the first probe of
                    // another member, decides once the link is back.
                    self.following = Some((leader, now));
                    return LeaderChange::Kept;
                }
                self.passed_over.insert(leader);
                self.follow(ids, LocalNs(now.0));
                LeaderChange::FailedOver {
                    passed_over: leader,
                    why,
                }
            }
            _ => {
                self.following = Some((leader, now));
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
        now: LocalNs,
    ) -> (bool, LeaderChange) {
        let change = if self.passed_over.remove(&from) && self.leader(ids) == Some(from) {
            self.following = Some((from, now));
            LeaderChange::Returned { leader: from }
        } else {
            LeaderChange::Kept
        };
        let leads = self.leader(ids) == Some(from);
        if leads {
            self.following = Some((from, now));
        }
        (leads, change)
    }

    /// Whether `leader`, last heard leading at `result_at`, is silent
    /// enough to be passed over, and by which rule.
    fn silence(
        &self,
        leader: NodeId,
        result_at: LocalNs,
        ids: &[NodeId],
        now: LocalNs,
        heard: impl Fn(NodeId) -> Option<LocalNs>,
    ) -> Option<Silence> {
        if leader == self.me {
            return None;
        }
        let without_result = now.since(result_at);
        if without_result > self.silence {
            return Some(Silence::Results);
        }
        let lately = |id: NodeId| self.heard_lately(id, now, &heard);
        let others_heard = ids
            .iter()
            .filter(|id| **id != leader && **id != self.me)
            .any(|id| lately(*id) == Some(true));
        let peer_silent = without_result > self.peer_silence && lately(leader) == Some(false);
        (peer_silent && others_heard).then_some(Silence::Peer)
    }

    /// Whether passing `leader` over would leave this member leading while
    /// it hears no other member at all: cut off by its own link, or the
    /// last member left. Leading, it would publish its own clock as the
    /// timeline with its own bound, which says nothing of how far that
    /// drifts from the timeline the others keep; holding the last result
    /// over keeps answering with the honest, growing bound instead.
    fn would_lead_alone(
        &self,
        leader: NodeId,
        ids: &[NodeId],
        now: LocalNs,
        heard: impl Fn(NodeId) -> Option<LocalNs>,
    ) -> bool {
        let hears_someone = ids
            .iter()
            .any(|id| *id != self.me && self.heard_lately(*id, now, &heard) == Some(true));
        self.leader_passing_over(ids, Some(leader)) == Some(self.me) && !hears_someone
    }

    fn follow(&mut self, ids: &[NodeId], now: LocalNs) {
        self.following = self.leader(ids).map(|l| (l, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The succession driven with plain ns (the tests' arithmetic).
    fn tick(
        s: &mut Succession,
        ids: &[NodeId],
        now: i64,
        heard: impl Fn(NodeId) -> Option<i64>,
    ) -> LeaderChange {
        s.tick(ids, LocalNs(now), |id| heard(id).map(LocalNs))
    }

    fn heard_result(
        s: &mut Succession,
        from: NodeId,
        ids: &[NodeId],
        now: i64,
    ) -> (bool, LeaderChange) {
        s.heard_result(from, ids, LocalNs(now))
    }

    const W: i64 = 4_000_000_000;
    const IDS: [NodeId; 3] = [1, 2, 3];

    /// Node 3 following node 1, whose result it last heard at `W`.
    fn following_1_heard_at_w() -> Succession {
        let mut s = Succession::new(3, Nanos(W));
        tick(&mut s, &IDS, 0, no_peers);
        heard_result(&mut s, 1, &IDS, W);
        s
    }

    /// Short windows: the results rule still waits [`FAILOVER_MIN.0`],
    /// not four windows, so loss alone rarely passes a live leader over.
    #[test]
    fn short_windows_wait_the_minimum_silence_for_results() {
        const SHORT: i64 = 1_000_000_000;
        let mut s = Succession::new(3, Nanos(SHORT));
        tick(&mut s, &IDS, 0, no_peers);
        heard_result(&mut s, 1, &IDS, SHORT);
        let four_windows = SHORT + FAILOVER_WINDOWS * SHORT + 1;
        assert_eq!(
            tick(&mut s, &IDS, four_windows, no_peers),
            LeaderChange::Kept
        );
        assert_eq!(
            tick(&mut s, &IDS, SHORT + FAILOVER_MIN.0 + 1, no_peers),
            LeaderChange::FailedOver {
                passed_over: 1,
                why: Silence::Results
            }
        );
    }

    /// No member is a probe peer: only results tell liveness.
    fn no_peers(_: NodeId) -> Option<i64> {
        None
    }

    #[test]
    fn the_lowest_id_leads_while_its_results_arrive() {
        let mut s = Succession::new(3, Nanos(W));
        assert_eq!(tick(&mut s, &IDS, 0, no_peers), LeaderChange::Kept);
        assert_eq!(s.leader(&IDS), Some(1));
        for k in 1..20 {
            assert_eq!(
                heard_result(&mut s, 1, &IDS, k * W),
                (true, LeaderChange::Kept)
            );
            assert_eq!(
                tick(&mut s, &IDS, k * W + W / 2, no_peers),
                LeaderChange::Kept
            );
        }
        assert_eq!(s.leader(&IDS), Some(1));
    }

    #[test]
    fn a_silent_leader_is_passed_over_then_the_next_and_returns_on_its_first_result() {
        let mut s = following_1_heard_at_w();
        assert_eq!(
            tick(&mut s, &IDS, W + FAILOVER_WINDOWS * W, no_peers),
            LeaderChange::Kept,
            "not yet"
        );
        assert_eq!(
            tick(&mut s, &IDS, W + FAILOVER_WINDOWS * W + 1, no_peers),
            LeaderChange::FailedOver {
                passed_over: 1,
                why: Silence::Results
            }
        );
        assert_eq!(s.leader(&IDS), Some(2));
        // A late result from 1 in between would bring it back; from 3 (not
        // the leader) it is not taken.
        assert_eq!(
            heard_result(&mut s, 3, &IDS, 6 * W),
            (false, LeaderChange::Kept)
        );
        // 2 sends no results either (it still probes): this node (3) leads
        // itself and is never passed over.
        let t = W + FAILOVER_WINDOWS * W + 1;
        let now = t + FAILOVER_WINDOWS * W + 1;
        assert_eq!(
            tick(&mut s, &IDS, now, |id| (id == 2).then_some(now)),
            LeaderChange::FailedOver {
                passed_over: 2,
                why: Silence::Results
            }
        );
        assert_eq!(s.leader(&IDS), Some(3));
        assert_eq!(
            tick(&mut s, &IDS, t + 100 * W, no_peers),
            LeaderChange::Kept
        );
        assert_eq!(s.leader(&IDS), Some(3));
        // 1 is back and leads again.
        assert_eq!(
            heard_result(&mut s, 1, &IDS, t + 101 * W),
            (true, LeaderChange::Returned { leader: 1 })
        );
        assert_eq!(s.leader(&IDS), Some(1));
    }

    #[test]
    fn a_member_that_left_is_forgotten() {
        let mut s = Succession::new(3, Nanos(W));
        tick(&mut s, &IDS, 0, no_peers);
        tick(&mut s, &IDS, 10 * W, no_peers);
        assert_eq!(s.leader(&IDS), Some(2));
        // 1 leaves the list and later comes back: it leads at once.
        tick(&mut s, &[2, 3], 11 * W, no_peers);
        assert_eq!(s.leader(&IDS), Some(1));
    }

    /// Peers 1 and 2 as this node (3) heard them: 1 last at `one`, 2 at `two`.
    fn peers_heard(one: i64, two: i64) -> impl Fn(NodeId) -> Option<i64> {
        move |id| match id {
            1 => Some(one),
            2 => Some(two),
            _ => None,
        }
    }

    #[test]
    fn a_leader_its_probe_peers_stop_hearing_is_passed_over_on_its_silence() {
        let mut s = following_1_heard_at_w();
        // 1 died at 1.5 W; 2 goes on probing this node.
        let died = W + W / 2;
        let later = |t: i64| peers_heard(died, t);
        assert_eq!(
            tick(&mut s, &IDS, died + PEER_SILENCE.0, later(died + W)),
            LeaderChange::Kept,
            "not yet"
        );
        assert_eq!(
            tick(&mut s, &IDS, died + PEER_SILENCE.0 + 1, later(died + W)),
            LeaderChange::FailedOver {
                passed_over: 1,
                why: Silence::Peer
            }
        );
        assert_eq!(s.leader(&IDS), Some(2));
        // The new leader gets a window of its own before the same rule
        // applies to it: 2 is heard, so it stays.
        let t = died + 3 * W;
        assert_eq!(tick(&mut s, &IDS, t, later(t)), LeaderChange::Kept);
        assert_eq!(s.leader(&IDS), Some(2));
    }

    #[test]
    fn a_member_that_hears_nobody_waits_for_the_results_rule_and_never_leads_itself() {
        // This node's own link is down: 1 and 2 both fall silent at 1.5 W.
        let mut s = following_1_heard_at_w();
        let down = W + W / 2;
        let nobody = peers_heard(down, down);
        for t in [3 * W, 4 * W, W + FAILOVER_WINDOWS * W] {
            assert_eq!(tick(&mut s, &IDS, t, &nobody), LeaderChange::Kept, "at {t}");
        }
        assert_eq!(
            tick(&mut s, &IDS, W + FAILOVER_WINDOWS * W + 1, &nobody),
            LeaderChange::FailedOver {
                passed_over: 1,
                why: Silence::Results
            }
        );
        // 2 sends nothing either, but this node never leads itself while
        // it hears nobody: it holds its last result over.
        for k in 2..40 {
            let t = W + k * FAILOVER_WINDOWS * W + 1;
            assert_eq!(tick(&mut s, &IDS, t, &nobody), LeaderChange::Kept, "at {t}");
        }
        assert_eq!(s.leader(&IDS), Some(2));
        // The link is back: 2's probes arrive before any result. It is not
        // passed over for a silence this node could not hear, so this node
        // does not lead itself.
        let up = W + 39 * FAILOVER_WINDOWS * W + 1 + W / 2;
        for t in [up, up + W / 4, up + W] {
            assert_eq!(
                tick(&mut s, &IDS, t, peers_heard(down, t)),
                LeaderChange::Kept
            );
            assert_eq!(s.leader(&IDS), Some(2), "at {t}");
        }
        // 1's next result is taken.
        assert_eq!(
            heard_result(&mut s, 1, &IDS, up + W),
            (true, LeaderChange::Returned { leader: 1 })
        );
    }

    #[test]
    fn a_leader_still_heard_on_the_probe_path_keeps_leading_while_results_are_lost() {
        let mut s = following_1_heard_at_w();
        // Its results are lost (or late) for three windows; its probes arrive.
        for k in 2..=FAILOVER_WINDOWS {
            let t = k * W + W / 2;
            assert_eq!(tick(&mut s, &IDS, t, peers_heard(t, t)), LeaderChange::Kept);
        }
        assert_eq!(s.leader(&IDS), Some(1));
    }
}
