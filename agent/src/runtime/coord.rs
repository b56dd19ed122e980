//! The per-window exchange: edge fits to the solver, node results back
//! (`docs/coordination.md`).
//!
//! With etcd every agent writes its fits under `edges/<name>` (bound to its
//! lease), the leader reads the prefix, solves and writes `results/<name>`;
//! each agent reads its own result. The static backend has no shared store:
//! every agent solves with the edges it fitted itself.

use std::collections::BTreeMap;

use clockmesh_proto::{clockmesh as pb, prost::Message as _};
use etcd_client::{GetOptions, PutOptions, Txn, TxnOp};

use crate::discovery::{DiscoveryError, StaticDiscovery, etcd::EtcdDiscovery};

/// Results are written in transactions of this many puts (etcd's default
/// limit is 128 operations per transaction).
const RESULTS_PER_TXN: usize = 128;

pub trait Coordination {
    /// Whether fits are shared: `false` means every agent solves locally.
    fn shared(&self) -> bool;
    /// Replaces this node's edge fits.
    fn put_edges(
        &mut self,
        me: &str,
        snapshot: &pb::Snapshot,
    ) -> impl Future<Output = Result<(), DiscoveryError>>;
    /// Every node's latest edge fits (bad records are skipped).
    fn fetch_edges(&mut self) -> impl Future<Output = Result<Vec<pb::Snapshot>, DiscoveryError>>;
    /// Publishes the solve's per-node results.
    fn put_results(
        &mut self,
        results: &[pb::NodeOffset],
    ) -> impl Future<Output = Result<(), DiscoveryError>>;
    /// This node's latest result, if any.
    fn my_result(
        &mut self,
        me: &str,
    ) -> impl Future<Output = Result<Option<pb::NodeOffset>, DiscoveryError>>;
}

fn unavailable(e: impl std::fmt::Display) -> DiscoveryError {
    DiscoveryError::Unavailable(e.to_string())
}

impl Coordination for EtcdDiscovery {
    fn shared(&self) -> bool {
        true
    }

    async fn put_edges(&mut self, me: &str, snapshot: &pb::Snapshot) -> Result<(), DiscoveryError> {
        let key = format!("{}edges/{me}", self.prefix());
        let opts = self.lease().map(|l| PutOptions::new().with_lease(l));
        self.client()
            .put(key, snapshot.encode_to_vec(), opts)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn fetch_edges(&mut self) -> Result<Vec<pb::Snapshot>, DiscoveryError> {
        let prefix = format!("{}edges/", self.prefix());
        let resp = self
            .client()
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| pb::Snapshot::decode(kv.value()).ok())
            .collect())
    }

    async fn put_results(&mut self, results: &[pb::NodeOffset]) -> Result<(), DiscoveryError> {
        let prefix = format!("{}results/", self.prefix());
        for chunk in results.chunks(RESULTS_PER_TXN) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|r| TxnOp::put(format!("{prefix}{}", r.node), r.encode_to_vec(), None))
                .collect();
            self.client()
                .txn(Txn::new().and_then(ops))
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    async fn my_result(&mut self, me: &str) -> Result<Option<pb::NodeOffset>, DiscoveryError> {
        let key = format!("{}results/{me}", self.prefix());
        let resp = self.client().get(key, None).await.map_err(unavailable)?;
        Ok(resp
            .kvs()
            .first()
            .and_then(|kv| pb::NodeOffset::decode(kv.value()).ok()))
    }
}

/// In-process store for the static backend.
#[derive(Default)]
pub struct LocalStore {
    pub(crate) edges: BTreeMap<String, pb::Snapshot>,
    pub(crate) results: BTreeMap<String, pb::NodeOffset>,
}

impl Coordination for StaticDiscovery {
    fn shared(&self) -> bool {
        false
    }

    async fn put_edges(&mut self, me: &str, snapshot: &pb::Snapshot) -> Result<(), DiscoveryError> {
        self.store().edges.insert(me.to_owned(), snapshot.clone());
        Ok(())
    }

    async fn fetch_edges(&mut self) -> Result<Vec<pb::Snapshot>, DiscoveryError> {
        Ok(self.store().edges.values().cloned().collect())
    }

    async fn put_results(&mut self, results: &[pb::NodeOffset]) -> Result<(), DiscoveryError> {
        for r in results {
            self.store().results.insert(r.node.clone(), r.clone());
        }
        Ok(())
    }

    async fn my_result(&mut self, me: &str) -> Result<Option<pb::NodeOffset>, DiscoveryError> {
        Ok(self.store().results.get(me).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::Discovery;

    #[test]
    fn static_store_round_trips_edges_and_results() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut d = StaticDiscovery::parse(&["a=198.18.0.1:1".into()]).unwrap();
        rt.block_on(async {
            assert!(!d.shared());
            let snap = pb::Snapshot {
                window: 3,
                ..Default::default()
            };
            d.put_edges("a", &snap).await.unwrap();
            d.put_edges("a", &snap).await.unwrap();
            assert_eq!(d.fetch_edges().await.unwrap().len(), 1, "replaced");
            let r = pb::NodeOffset {
                node: "a".into(),
                offset_ns: 5,
                ..Default::default()
            };
            d.put_results(std::slice::from_ref(&r)).await.unwrap();
            assert_eq!(d.my_result("a").await.unwrap(), Some(r));
            assert_eq!(d.my_result("b").await.unwrap(), None);
            assert!(d.members().await.unwrap().len() == 1);
        });
    }
}
