//! The per-window exchange: edge fits to the solver, node results back
//! (`docs/coordination.md`). Each membership backend owns its side of it by
//! choosing its [`Coordination::Store`]. Every backend now chooses
//! [`NoStore`] (a type with no values): the protocol core relays fits and
//! results over UDP to and from the leader, so no store method can be
//! called at all. The shared store ([`Store`]: every agent writes its fits,
//! the leader reads them, solves and writes each node's result, each agent
//! reads its own) is what etcd carried until measured at scale; its etcd
//! implementation stays as the measured alternative (`bench-scale`).

use clockmesh_core::{fits::WindowFits, node::Exchange, result::NodeResult};

use super::{DiscoveryError, StaticDiscovery};

/// A backend's choice of how fits and results travel.
pub trait Coordination {
    /// The shared store, or [`NoStore`].
    type Store: Store;
    /// The store, if the backend has one.
    fn store(&mut self) -> Option<&mut Self::Store>;
    /// How the protocol core exchanges fits and results with this backend.
    fn exchange(&mut self) -> Exchange {
        match self.store() {
            Some(_) => Exchange::Store,
            None => Exchange::Relay,
        }
    }
    /// Whether the backend elects the leader (etcd, Kubernetes leases).
    /// `false`: it only lists members, and the protocol core decides who
    /// leads from the leader's results (`clockmesh_core::succession`).
    fn elects_leader(&self) -> bool {
        true
    }
}

/// A shared store for the window's fits and results.
pub trait Store {
    /// Replaces this node's edge fits.
    fn put_edges(
        &mut self,
        me: &str,
        fits: &WindowFits,
    ) -> impl Future<Output = Result<(), DiscoveryError>>;
    /// Every node's latest edge fits (bad records are skipped).
    fn fetch_edges(&mut self) -> impl Future<Output = Result<Vec<WindowFits>, DiscoveryError>>;
    /// Publishes the solve's per-node results.
    fn put_results(
        &mut self,
        results: &[NodeResult],
    ) -> impl Future<Output = Result<(), DiscoveryError>>;
    /// This node's latest result, if any.
    fn my_result(
        &mut self,
        me: &str,
    ) -> impl Future<Output = Result<Option<NodeResult>, DiscoveryError>>;
}

/// The store of backends that have none: it has no values, so its methods
/// can never run.
pub enum NoStore {}

impl Store for NoStore {
    async fn put_edges(&mut self, _: &str, _: &WindowFits) -> Result<(), DiscoveryError> {
        match *self {}
    }
    async fn fetch_edges(&mut self) -> Result<Vec<WindowFits>, DiscoveryError> {
        match *self {}
    }
    async fn put_results(&mut self, _: &[NodeResult]) -> Result<(), DiscoveryError> {
        match *self {}
    }
    async fn my_result(&mut self, _: &str) -> Result<Option<NodeResult>, DiscoveryError> {
        match *self {}
    }
}

/// No store: fits and results go over UDP (`docs/coordination.md`).
impl Coordination for StaticDiscovery {
    type Store = NoStore;
    fn store(&mut self) -> Option<&mut NoStore> {
        None
    }
    /// A fixed list elects nobody: the lowest-id member that is heard
    /// leads (`docs/coordination.md`, "Static membership: failover").
    fn elects_leader(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_backend_relays() {
        let mut d = StaticDiscovery::parse(&["a=198.18.0.1:1".into()]).unwrap();
        assert!(d.store().is_none());
        assert_eq!(d.exchange(), Exchange::Relay);
    }
}
