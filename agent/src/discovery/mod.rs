//! Membership, reference election and the window's coordination, behind one
//! trait so the agent does not care which engine runs it.
//!
//! Backends: [`StaticDiscovery`] (member list from the config file) here; etcd
//! and Kubernetes implement the same trait. Every agent computes the probe
//! graph itself from the sorted member list (`probe::graph`), so the engine
//! is never on the probing path: if it is lost, probing continues on the last
//! known membership and only election and the shared solve stop.

mod coordination;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
#[cfg(feature = "etcd")]
mod prefix_watch;

/// etcd: how long an agent that went silent stays listed by default (its
/// member lease's TTL, config `etcd_member_ttl_s`). Every member keeps its
/// lease alive every third of it: at 10,000 members a 10 s TTL cost etcd
/// about twice the CPU of 30 s (`docs/coordination.md`).
pub const ETCD_MEMBER_TTL_S: u64 = 30;

/// etcd: how long a silent candidate stays in the election (the TTL of
/// the lease its candidacy is bound to): a leader's failover takes about
/// this long. Only the three seat holders hold one, so it can be short.
pub const ETCD_CAMPAIGN_TTL_S: i64 = 10;

pub use clockmesh_core::node::{Member, Membership, Place};
pub use coordination::{Coordination, NoStore, Store};

use std::{collections::BTreeSet, future::Future, net::SocketAddr};

use clockmesh_core::graph::ProbeGraph;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum DiscoveryError {
    #[error("member {0:?} is listed twice")]
    DuplicateName(String),
    #[error("node id {id} is used by both {a:?} and {b:?}")]
    DuplicateId { id: u32, a: String, b: String },
    #[error("this node ({0:?}) is not in the member list")]
    NotAMember(String),
    #[error("invalid member entry {entry:?}: {reason}")]
    BadEntry { entry: String, reason: String },
    #[error("coordination engine unavailable: {0}")]
    Unavailable(String),
    #[error("discovery misconfigured: {0}")]
    Misconfigured(String),
}

/// Who the reference is, and whether it is us.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leadership {
    /// The elected reference/solver node.
    pub leader: Option<String>,
    pub is_me: bool,
}

/// What every backend provides. Methods are async because real engines are
/// remote; the static backend answers at once.
pub trait Discovery {
    /// Announces this node; returns it with its cluster-unique id.
    fn register(&mut self, me: &Member) -> impl Future<Output = Result<Member, DiscoveryError>>;
    /// The current members, sorted by name.
    fn members(&mut self) -> impl Future<Output = Result<Vec<Member>, DiscoveryError>>;
    /// What this agent needs of the membership: every member, or (where
    /// the backend hands places out: etcd) its place in the leader's probe
    /// graph. [`DiscoveryError::NotAMember`]: it is no longer listed.
    fn membership(&mut self) -> impl Future<Output = Result<Membership, DiscoveryError>> {
        async { Ok(Membership::All(self.members().await?)) }
    }
    /// As leader, where members follow places rather than the whole list:
    /// hands each member its place in `graph` (over `members`).
    fn hand_out(
        &mut self,
        graph: &ProbeGraph,
        members: &[Member],
    ) -> impl Future<Output = Result<(), DiscoveryError>> {
        let _ = (graph, members);
        async { Ok(()) }
    }
    /// The current leader (reference node); campaigns if none.
    fn leadership(&mut self) -> impl Future<Output = Result<Leadership, DiscoveryError>>;
    /// Leaves the cluster (releases leases and leadership).
    fn leave(&mut self) -> impl Future<Output = Result<(), DiscoveryError>>;
}

/// A member list fixed in configuration. Entries are `name=ip:port` (ids
/// follow list order, from 1) or `name#id=ip:port`. The list never changes
/// at run time. It elects nobody: the protocol core lets the lowest-id
/// member lead while its results arrive and fails over to the next one
/// (`clockmesh_core::succession`); [`Discovery::leadership`] answers the
/// lowest id, the preferred leader.
pub struct StaticDiscovery {
    members: Vec<Member>,
    me: Option<String>,
}

impl StaticDiscovery {
    pub fn parse(entries: &[String]) -> Result<Self, DiscoveryError> {
        let mut members = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            members.push(parse_entry(e, i as u32 + 1)?);
        }
        check_unique(&members)?;
        members.sort();
        Ok(StaticDiscovery { members, me: None })
    }
}

fn parse_entry(entry: &str, default_id: u32) -> Result<Member, DiscoveryError> {
    let bad = |reason: &str| DiscoveryError::BadEntry {
        entry: entry.to_owned(),
        reason: reason.to_owned(),
    };
    let (name_part, addr_part) = entry
        .split_once('=')
        .ok_or_else(|| bad("expected name=ip:port"))?;
    let (name, id) = match name_part.split_once('#') {
        Some((n, id)) => (
            n,
            id.parse::<u32>()
                .map_err(|_| bad("id after # must be a number"))?,
        ),
        None => (name_part, default_id),
    };
    if name.is_empty() || id == 0 {
        return Err(bad("name must not be empty and id must not be 0"));
    }
    let addr: SocketAddr = addr_part
        .parse()
        .map_err(|_| bad("address must be ip:port"))?;
    Ok(Member {
        name: name.to_owned(),
        id,
        addr: addr.ip(),
        probe_port: addr.port(),
        capabilities: 0,
    })
}

/// Names and ids must each be unique.
pub fn check_unique(members: &[Member]) -> Result<(), DiscoveryError> {
    let mut names = BTreeSet::new();
    let mut ids = std::collections::BTreeMap::new();
    for m in members {
        if !names.insert(m.name.as_str()) {
            return Err(DiscoveryError::DuplicateName(m.name.clone()));
        }
        if let Some(other) = ids.insert(m.id, m.name.as_str()) {
            return Err(DiscoveryError::DuplicateId {
                id: m.id,
                a: other.to_owned(),
                b: m.name.clone(),
            });
        }
    }
    Ok(())
}

impl Discovery for StaticDiscovery {
    async fn register(&mut self, me: &Member) -> Result<Member, DiscoveryError> {
        let listed = self
            .members
            .iter()
            .find(|m| m.name == me.name)
            .ok_or_else(|| DiscoveryError::NotAMember(me.name.clone()))?;
        self.me = Some(me.name.clone());
        Ok(Member {
            capabilities: me.capabilities,
            ..listed.clone()
        })
    }

    async fn members(&mut self) -> Result<Vec<Member>, DiscoveryError> {
        Ok(self.members.clone())
    }

    async fn leadership(&mut self) -> Result<Leadership, DiscoveryError> {
        // Lowest id leads: the first entry unless ids were given explicitly.
        let leader = self
            .members
            .iter()
            .min_by_key(|m| m.id)
            .map(|m| m.name.clone());
        let is_me = leader.is_some() && leader == self.me;
        Ok(Leadership { leader, is_me })
    }

    async fn leave(&mut self) -> Result<(), DiscoveryError> {
        self.me = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn static_members_ids_and_leader() {
        let mut d = StaticDiscovery::parse(&entries(&[
            "b=198.18.0.2:31900",
            "a=198.18.0.1:31900",
            "c#40=[::1]:5",
        ]))
        .unwrap();
        let members = block_on(d.members()).unwrap();
        let names: Vec<_> = members.iter().map(|m| (m.name.as_str(), m.id)).collect();
        assert_eq!(names, [("a", 2), ("b", 1), ("c", 40)]);
        let me = Member {
            capabilities: 3,
            ..members[1].clone()
        };
        let registered = block_on(d.register(&me)).unwrap();
        assert_eq!((registered.id, registered.capabilities), (1, 3));
        let l = block_on(d.leadership()).unwrap();
        assert_eq!((l.leader.as_deref(), l.is_me), (Some("b"), true));
        block_on(d.leave()).unwrap();
        assert!(!block_on(d.leadership()).unwrap().is_me);
    }

    #[test]
    fn static_errors_are_clear() {
        let err = |list: &[&str]| {
            StaticDiscovery::parse(&entries(list))
                .err()
                .unwrap()
                .to_string()
        };
        assert!(err(&["a"]).contains("expected name=ip:port"));
        assert!(err(&["a=host:1"]).contains("ip:port"));
        assert!(err(&["a#x=1.2.3.4:1"]).contains("id after #"));
        assert!(err(&["a#0=1.2.3.4:1"]).contains("id must not be 0"));
        assert!(err(&["a=1.2.3.4:1", "a=1.2.3.5:1"]).contains("listed twice"));
        assert!(err(&["a#2=1.2.3.4:1", "b=1.2.3.5:1"]).contains("node id 2"));
        let mut d = StaticDiscovery::parse(&entries(&["a=1.2.3.4:1"])).unwrap();
        let stranger = Member {
            name: "z".into(),
            id: 9,
            addr: "1.1.1.1".parse().unwrap(),
            probe_port: 1,
            capabilities: 0,
        };
        assert!(
            block_on(d.register(&stranger))
                .unwrap_err()
                .to_string()
                .contains("not in the member list")
        );
    }
}
