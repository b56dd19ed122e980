//! Each member's place in the probe graph, handed out by the leader under
//! `places/<name>`: its edges, the records of its neighbours and the
//! leader's, and the leader's name. A member that holds no seat follows only
//! its own key and the seats (not the list, nor the election): at
//! N members the cluster reads O(N × degree) records rather than every
//! agent reading all N (`docs/coordination.md`, "At scale": 15 GB at
//! 10,000 members starting together). The leader writes only what
//! changed, and deletes the places of members no longer listed (which
//! tells them their lease lapsed).

use std::collections::BTreeMap;

use clockmesh_core::{
    graph::ProbeGraph,
    node::{Membership, Place},
};
use etcd_client::{GetOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use tracing::debug;

use super::{EtcdDiscovery, RESULTS_PER_TXN, parse_json, unavailable};
use crate::discovery::{
    DiscoveryError, Member,
    prefix_watch::{Keys, Parse},
};

/// A place as written: the leader that wrote it comes with it (members
/// without a seat learn who leads from their place: a new leader writes
/// every place again).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Handed {
    #[serde(flatten)]
    place: Place,
    leader: String,
}

const PLACE: Parse<Handed> = parse_json::<Handed>;

/// What the leader last wrote, to write only what changed.
#[derive(Default)]
pub(super) struct HandedOut {
    /// The list it was computed from (`None`: not all written yet).
    from: Option<Vec<Member>>,
    /// Each name's place as written; an empty value: there, content unknown.
    written: BTreeMap<String, Vec<u8>>,
}

impl EtcdDiscovery {
    fn places_prefix(&self) -> String {
        format!("{}places/", self.prefix())
    }

    /// This member's place as the leader handed it out (followed by a
    /// watch on its one key): pending until the leader has written it, an
    /// error once it was there and is gone (the leader no longer lists it).
    pub(super) async fn my_place(&mut self) -> Result<Membership, DiscoveryError> {
        let Some(me) = self.me.clone() else {
            return Ok(Membership::Pending);
        };
        let key = format!("{}{me}", self.places_prefix());
        self.current(|d| &mut d.place_watch, (Keys::Exact(key), PLACE), "place")
            .await?;
        let place = self.place_watch.as_ref().and_then(|w| w.values().next());
        match place {
            Some(h) => {
                self.had_place = true;
                Ok(Membership::Place(h.place.clone()))
            }
            None if self.had_place => Err(DiscoveryError::NotAMember(me)),
            None => Ok(Membership::Pending),
        }
    }

    /// As leader: every member's place in `graph` (over `members`), written
    /// where it changed. Does nothing on another member.
    pub(super) async fn hand_out_places(
        &mut self,
        graph: &ProbeGraph,
        members: &[Member],
    ) -> Result<(), DiscoveryError> {
        let (Some(_), Some(me)) = (&self.won, self.me.clone()) else {
            self.handed = None;
            return Ok(());
        };
        if self.handed.is_none() {
            self.handed = Some(self.places_written().await?);
        }
        let handed = self.handed.as_ref().expect("just set");
        if handed.from.as_deref() == Some(members) {
            return Ok(());
        }
        let mut puts = Vec::new();
        for (m, place) in Place::all(graph, members, &[me.as_str()]) {
            let handed_place = Handed {
                place,
                leader: me.clone(),
            };
            let value = serde_json::to_vec(&handed_place).map_err(unavailable)?;
            if handed.written.get(&m.name) != Some(&value) {
                puts.push((m.name.clone(), Some(value)));
            }
        }
        let listed: std::collections::BTreeSet<&str> =
            members.iter().map(|m| m.name.as_str()).collect();
        let gone = handed
            .written
            .keys()
            .filter(|n| !listed.contains(n.as_str()))
            .map(|n| (n.clone(), None));
        puts.extend(gone.collect::<Vec<_>>());
        debug!(
            changed = puts.len(),
            members = members.len(),
            "handing out places"
        );
        self.write_places(puts).await?;
        if let Some(h) = self.handed.as_mut() {
            h.from = Some(members.to_vec());
        }
        Ok(())
    }

    /// The leader that wrote this member's place.
    pub(super) fn placed_leader(&self) -> Option<String> {
        let w = self.place_watch.as_ref()?;
        w.values().next().map(|h| h.leader.clone())
    }

    /// The names with a place written (a new leader's first look: it
    /// rewrites every listed one and deletes the rest).
    async fn places_written(&mut self) -> Result<HandedOut, DiscoveryError> {
        let prefix = self.places_prefix();
        let resp = self
            .client
            .get(
                prefix.clone(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .map_err(unavailable)?;
        let written = resp
            .kvs()
            .iter()
            .filter_map(|kv| kv.key_str().ok()?.strip_prefix(&prefix).map(str::to_owned))
            .map(|name| (name, Vec::new()))
            .collect();
        Ok(HandedOut {
            from: None,
            written,
        })
    }

    /// Puts (`Some`) and deletes (`None`), in transactions of etcd's
    /// largest size; what was written is remembered as it lands.
    async fn write_places(
        &mut self,
        changes: Vec<(String, Option<Vec<u8>>)>,
    ) -> Result<(), DiscoveryError> {
        let prefix = self.places_prefix();
        for chunk in changes.chunks(RESULTS_PER_TXN) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|(name, value)| match value {
                    Some(v) => TxnOp::put(format!("{prefix}{name}"), v.clone(), None),
                    None => TxnOp::delete(format!("{prefix}{name}"), None),
                })
                .collect();
            self.client
                .txn(Txn::new().and_then(ops))
                .await
                .map_err(unavailable)?;
            let Some(h) = self.handed.as_mut() else {
                continue;
            };
            for (name, value) in chunk {
                match value {
                    Some(v) => h.written.insert(name.clone(), v.clone()),
                    None => h.written.remove(name),
                };
            }
        }
        Ok(())
    }
}
