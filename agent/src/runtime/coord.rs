//! The per-window exchange: edge fits to the solver, node results back
//! (`docs/coordination.md`).
//!
//! With etcd every agent writes its fits under `edges/<name>` (bound to its
//! lease), the leader reads the prefix, solves and writes `results/<name>`;
//! each agent reads its own result. Backends without a shared store (static,
//! Kubernetes) keep the defaults: the runtime then relays fits and results
//! over UDP to and from the leader and never calls the store methods.

use clockmesh_proto::{clockmesh as pb, prost::Message as _};
use etcd_client::{GetOptions, PutOptions, Txn, TxnOp};

use crate::discovery::{DiscoveryError, StaticDiscovery, etcd::EtcdDiscovery};

/// Results are written in transactions of this many puts (etcd's default
/// limit is 128 operations per transaction).
const RESULTS_PER_TXN: usize = 128;

pub trait Coordination {
    /// Whether the backend has a shared store for fits and results. `false`
    /// (the default): the runtime relays them over UDP instead.
    fn shared(&self) -> bool {
        false
    }
    /// Replaces this node's edge fits.
    fn put_edges(
        &mut self,
        _me: &str,
        _snapshot: &pb::Snapshot,
    ) -> impl Future<Output = Result<(), DiscoveryError>> {
        async { Err(no_store()) }
    }
    /// Every node's latest edge fits (bad records are skipped).
    fn fetch_edges(&mut self) -> impl Future<Output = Result<Vec<pb::Snapshot>, DiscoveryError>> {
        async { Err(no_store()) }
    }
    /// Publishes the solve's per-node results.
    fn put_results(
        &mut self,
        _results: &[pb::NodeOffset],
    ) -> impl Future<Output = Result<(), DiscoveryError>> {
        async { Err(no_store()) }
    }
    /// This node's latest result, if any.
    fn my_result(
        &mut self,
        _me: &str,
    ) -> impl Future<Output = Result<Option<pb::NodeOffset>, DiscoveryError>> {
        async { Err(no_store()) }
    }
}

fn no_store() -> DiscoveryError {
    DiscoveryError::Unavailable("this membership backend has no shared store".into())
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

/// No store: fits and results go over UDP (`docs/coordination.md`).
impl Coordination for StaticDiscovery {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::Discovery;

    #[test]
    fn static_backend_has_no_store() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut d = StaticDiscovery::parse(&["a=198.18.0.1:1".into()]).unwrap();
        rt.block_on(async {
            assert!(!d.shared());
            let err = d.fetch_edges().await.unwrap_err().to_string();
            assert!(err.contains("no shared store"), "{err}");
            assert!(d.my_result("a").await.is_err());
            assert!(d.members().await.unwrap().len() == 1);
        });
    }
}
