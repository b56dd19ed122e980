//! Per-peer handshake state: a peer is probed only after it answered a
//! hello (it runs a responder and speaks our version). Unanswered hellos are
//! retried with exponential backoff, capped at a second; a ready peer that
//! falls silent goes back to the handshake. A peer is a known member, so
//! asking a silent one once a second costs a small datagram, and a link that
//! comes back is probed again within a second: the readers of a node whose
//! links were down are back at their level within a few windows only if the
//! pairs flow from the link's first second. A message from a peer we are
//! handshaking with again shows the way is open: our next hello goes at
//! once.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use clockmesh_estimator::NodeId;
use serde::Serialize;

use crate::time::{LocalNs, Nanos};

/// Handshake timing.
#[derive(Clone, Copy, Debug)]
pub struct HandshakeConfig {
    pub first_retry: Nanos,
    pub max_retry: Nanos,
    /// A ready peer silent for this long is handshaken again.
    pub silence: Nanos,
}

impl Default for HandshakeConfig {
    fn default() -> Self {
        HandshakeConfig {
            first_retry: Nanos::from_millis(250),
            max_retry: Nanos::from_secs(1),
            silence: Nanos::from_secs(15),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerState {
    /// Hello sent, waiting for the answer.
    #[default]
    Connecting,
    /// Answered: probes flow.
    Ready,
}

impl PeerState {
    pub fn as_str(self) -> &'static str {
        match self {
            PeerState::Connecting => "connecting",
            PeerState::Ready => "ready",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Peer {
    pub id: NodeId,
    pub name: String,
    pub addr: SocketAddr,
    pub state: PeerState,
    /// Version agreed in the handshake (0 before).
    pub version: u8,
    pub capabilities: u32,
    /// Hellos sent without an answer since the last success.
    pub attempts: u32,
    #[serde(skip)]
    next_hello: LocalNs,
    /// When the last hello went (`i64::MIN` before the first).
    #[serde(skip)]
    hello_sent: LocalNs,
    #[serde(skip)]
    pub last_heard: LocalNs,
    /// Hello nonce we expect echoed back.
    #[serde(skip)]
    nonce: u64,
}

/// What the caller must do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloDue {
    pub id: NodeId,
    pub addr: SocketAddr,
    pub nonce: u64,
}

pub struct Peers {
    cfg: HandshakeConfig,
    peers: BTreeMap<NodeId, Peer>,
    next_nonce: u64,
}

impl Peers {
    pub fn new(cfg: HandshakeConfig, nonce_base: u64) -> Self {
        Peers {
            cfg,
            peers: BTreeMap::new(),
            next_nonce: nonce_base,
        }
    }

    /// Makes the peer set equal to `wanted`; returns the ids that left.
    /// Peers that stay keep their state (no re-handshake on graph changes).
    pub fn set(&mut self, wanted: &[(NodeId, String, SocketAddr)], now: LocalNs) -> Vec<NodeId> {
        let gone: Vec<NodeId> = self
            .peers
            .keys()
            .filter(|id| !wanted.iter().any(|w| w.0 == **id))
            .copied()
            .collect();
        for id in &gone {
            self.peers.remove(id);
        }
        for (id, name, addr) in wanted {
            let changed = self.peers.get(id).is_some_and(|p| p.addr != *addr);
            if changed || !self.peers.contains_key(id) {
                self.peers.insert(
                    *id,
                    Peer {
                        id: *id,
                        name: name.clone(),
                        addr: *addr,
                        state: PeerState::Connecting,
                        version: 0,
                        capabilities: 0,
                        attempts: 0,
                        next_hello: now,
                        hello_sent: LocalNs(i64::MIN),
                        last_heard: now,
                        nonce: 0,
                    },
                );
            }
        }
        gone
    }

    /// Hellos to send now; schedules their retries with backoff.
    pub fn due_hellos(&mut self, now: LocalNs) -> Vec<HelloDue> {
        let cfg = self.cfg;
        let mut out = Vec::new();
        for p in self.peers.values_mut() {
            if p.state == PeerState::Ready && now.since(p.last_heard) > cfg.silence {
                p.state = PeerState::Connecting;
                p.attempts = 0;
                p.next_hello = now;
            }
            if p.state != PeerState::Connecting || now < p.next_hello {
                continue;
            }
            let backoff = cfg
                .first_retry
                .saturating_mul(1 << p.attempts.min(20))
                .min(cfg.max_retry);
            p.attempts += 1;
            p.next_hello = now + backoff;
            p.hello_sent = now;
            self.next_nonce += 1;
            p.nonce = self.next_nonce;
            out.push(HelloDue {
                id: p.id,
                addr: p.addr,
                nonce: p.nonce,
            });
        }
        out
    }

    /// A hello answer arrived; `true` if it matched an outstanding hello.
    pub fn acked(
        &mut self,
        id: NodeId,
        nonce: u64,
        version: u8,
        capabilities: u32,
        now: LocalNs,
    ) -> bool {
        let Some(p) = self.peers.get_mut(&id) else {
            return false;
        };
        if p.state != PeerState::Connecting || p.nonce != nonce {
            return false;
        }
        p.state = PeerState::Ready;
        p.version = version;
        p.capabilities = capabilities;
        p.attempts = 0;
        p.last_heard = now;
        true
    }

    /// Any valid message from the peer shows it is alive; one from a peer
    /// we are handshaking with brings our next hello forward to now — unless
    /// one went within the first retry, whose answer may still be on its
    /// way (a new hello's nonce would turn that answer stale).
    pub fn heard(&mut self, id: NodeId, now: LocalNs) {
        let first_retry = self.cfg.first_retry;
        if let Some(p) = self.peers.get_mut(&id) {
            p.last_heard = now;
            let answer_due = now.since(p.hello_sent) < first_retry;
            if p.state == PeerState::Connecting && !answer_due {
                p.next_hello = p.next_hello.min(now);
            }
        }
    }

    pub fn get(&self, id: NodeId) -> Option<&Peer> {
        self.peers.get(&id)
    }

    /// Peers to probe now.
    pub fn ready(&self) -> impl Iterator<Item = &Peer> {
        self.peers.values().filter(|p| p.state == PeerState::Ready)
    }

    pub fn all(&self) -> impl Iterator<Item = &Peer> {
        self.peers.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ns: i64) -> LocalNs {
        LocalNs(ns)
    }

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([198, 18, 0, i], 31_900))
    }

    fn peers() -> Peers {
        let mut p = Peers::new(HandshakeConfig::default(), 1000);
        p.set(&[(2, "b".into(), addr(2)), (3, "c".into(), addr(3))], at(0));
        p
    }

    #[test]
    fn hello_retries_back_off_until_answered() {
        let mut p = peers();
        let first = p.due_hellos(at(0));
        assert_eq!(first.len(), 2);
        assert!(p.due_hellos(at(249_999_999)).is_empty());
        assert_eq!(p.due_hellos(at(250_000_000)).len(), 2, "first retry");
        assert!(
            p.due_hellos(at(700_000_000)).is_empty(),
            "second waits 500 ms"
        );
        let again = p.due_hellos(at(750_000_000));
        assert_eq!(again.len(), 2);
        // A stale nonce is not an answer; the current one is.
        assert!(!p.acked(2, first[0].nonce, 1, 0, at(1)));
        assert!(p.acked(2, again[0].nonce, 1, 3, at(1)));
        assert_eq!(p.ready().map(|x| x.id).collect::<Vec<_>>(), [2]);
        // Backoff is capped at a second: a link that comes back is
        // handshaken again within one.
        for k in 0..40 {
            p.due_hellos(at(1_000_000_000 * k));
        }
        let c = p.get(3).unwrap();
        assert!(c.next_hello.since(at(39_000_000_000)) <= Nanos::from_secs(1));
    }

    #[test]
    fn a_message_from_a_silent_peer_brings_our_hello_forward() {
        let mut p = peers();
        let h = p.due_hellos(at(0));
        p.acked(2, h[0].nonce, 1, 0, at(0));
        // Silent for 16 s: handshaken again, unanswered (the link is down).
        assert!(p.due_hellos(at(16_000_000_000)).iter().any(|d| d.id == 2));
        assert!(p.due_hellos(at(16_300_000_000)).iter().any(|d| d.id == 2));
        // Its hello gets through 100 ms after ours went: ours may still be
        // answered, so the next waits for its backoff.
        p.heard(2, at(16_400_000_000));
        assert!(p.due_hellos(at(16_400_000_000)).iter().all(|d| d.id != 2));
        // Later, a message from it sends ours at once.
        p.heard(2, at(16_600_000_000));
        let now = p.due_hellos(at(16_600_000_000));
        let again = now
            .iter()
            .find(|d| d.id == 2)
            .expect("hello brought forward");
        assert!(p.acked(2, again.nonce, 1, 0, at(16_600_100_000)));
        assert_eq!(p.get(2).unwrap().state, PeerState::Ready);
        // A ready peer's messages bring nothing forward.
        p.heard(2, at(17_000_000_000));
        assert!(p.due_hellos(at(17_000_000_000)).iter().all(|d| d.id != 2));
    }

    #[test]
    fn silent_peers_handshake_again_and_departures_are_reported() {
        let mut p = peers();
        let h = p.due_hellos(at(0));
        p.acked(2, h[0].nonce, 1, 0, at(0));
        p.heard(2, at(10_000_000_000));
        assert!(p.due_hellos(at(20_000_000_000)).iter().all(|d| d.id != 2));
        let later = p.due_hellos(at(26_000_000_000));
        assert!(later.iter().any(|d| d.id == 2), "silent > 15 s");
        assert_eq!(p.get(2).unwrap().state, PeerState::Connecting);
        assert_eq!(
            serde_json::to_value(PeerState::Connecting).unwrap(),
            PeerState::Connecting.as_str()
        );
        let gone = p.set(&[(3, "c".into(), addr(3))], at(0));
        assert_eq!(gone, [2]);
        assert!(p.get(2).is_none());
    }
}
