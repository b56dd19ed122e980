//! The per-window exchange: edge fits to the solver, node results back
//! (`docs/coordination.md`). Each membership backend owns its side of it:
//! etcd's store is in `etcd.rs`; static and Kubernetes have none.
//!
//! With etcd every agent writes its fits under `edges/<name>` (bound to its
//! lease), the leader reads the prefix, solves and writes `results/<name>`;
//! each agent reads its own result. Backends without a shared store (static,
//! Kubernetes) keep the defaults: the runtime then relays fits and results
//! over UDP to and from the leader and never calls the store methods.

use clockmesh_proto::clockmesh as pb;

use super::{DiscoveryError, StaticDiscovery};

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
