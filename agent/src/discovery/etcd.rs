//! etcd backend.
//!
//! Layout under `/clockmesh/<cluster>/`:
//! - `members/<name>`: JSON [`Member`] bound to this agent's lease (TTL
//!   `lease_ttl_s`, kept alive in the background): a crashed agent vanishes
//!   from the list when its lease expires.
//! - `ids/<name>`: the name's id, the create revision of this key, which is
//!   written once and bound to no lease: cluster-unique, and the same for a
//!   restarted agent or one whose lease lapsed (a link down for longer than
//!   the TTL), so its peers' histories of its edges and its place in the
//!   probe graph carry on, as with static membership.
//! - `leader`: etcd's election on this name; the value is the leader's name.
//!   Campaigning blocks in etcd until the seat is free, so it runs in a task.

use std::time::Duration;

use clockmesh_proto::{clockmesh as pb, prost::Message as _};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LeaderKey, PutOptions, ResignOptions, Txn, TxnOp,
};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::{Coordination, Discovery, DiscoveryError, Leadership, Member, Store, check_unique};

/// How to reach etcd and how long a silent member stays listed.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    /// Namespaces several clusters in one etcd.
    pub cluster: String,
    pub lease_ttl_s: i64,
}

pub struct EtcdDiscovery {
    client: Client,
    /// Campaigning blocks until elected: it needs a connection without the
    /// request timeout (etcd withdraws a candidacy whose request is cancelled).
    campaign_client: Client,
    cfg: EtcdConfig,
    me: Option<String>,
    lease: Option<i64>,
    keepalive: Option<JoinHandle<()>>,
    campaign: Option<JoinHandle<Option<LeaderKey>>>,
    /// Our election key once elected (to resign on leave).
    won: Option<LeaderKey>,
}

fn unavailable(e: impl std::fmt::Display) -> DiscoveryError {
    DiscoveryError::Unavailable(e.to_string())
}

impl EtcdDiscovery {
    pub async fn connect(cfg: EtcdConfig) -> Result<Self, DiscoveryError> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(5));
        let mut client = Client::connect(&cfg.endpoints, Some(options))
            .await
            .map_err(|e| unavailable(format!("connecting to {:?}: {e}", cfg.endpoints)))?;
        // The channel connects lazily: ask for status so a wrong endpoint
        // fails here, with the endpoint in the message.
        client.status().await.map_err(|e| {
            unavailable(format!("etcd at {:?} does not answer: {e}", cfg.endpoints))
        })?;
        let no_timeout = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
        let campaign_client = Client::connect(&cfg.endpoints, Some(no_timeout))
            .await
            .map_err(|e| unavailable(format!("connecting to {:?}: {e}", cfg.endpoints)))?;
        Ok(EtcdDiscovery {
            client,
            campaign_client,
            cfg,
            me: None,
            lease: None,
            keepalive: None,
            campaign: None,
            won: None,
        })
    }

    /// Another member's backend on this one's two connections, with its
    /// own registration, lease, keep-alive and campaign once it registers:
    /// for a harness that simulates more members than one process may hold
    /// connections for (`clockmesh-demo bench-scale`). An agent uses
    /// [`EtcdDiscovery::connect`].
    pub fn share_connections(&self) -> Self {
        EtcdDiscovery {
            client: self.client.clone(),
            campaign_client: self.campaign_client.clone(),
            cfg: self.cfg.clone(),
            me: None,
            lease: None,
            keepalive: None,
            campaign: None,
            won: None,
        }
    }

    pub(crate) fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    pub(crate) fn lease(&self) -> Option<i64> {
        self.lease
    }

    pub(crate) fn prefix(&self) -> String {
        format!("/clockmesh/{}/", self.cfg.cluster)
    }

    fn members_prefix(&self) -> String {
        format!("{}members/", self.prefix())
    }

    /// The id of `name`: its `ids/` key's create revision, the key written
    /// by the first agent of that name (a transaction, so two agents of one
    /// name racing get the same id).
    async fn id_of(&mut self, name: &str) -> Result<u32, DiscoveryError> {
        let key = format!("{}ids/{name}", self.prefix());
        let create_once = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), name, None)]);
        self.client.txn(create_once).await.map_err(unavailable)?;
        let got = self.client.get(key, None).await.map_err(unavailable)?;
        let kv = got
            .kvs()
            .first()
            .ok_or_else(|| unavailable("id key vanished after put"))?;
        u32::try_from(kv.create_revision())
            .map_err(|_| unavailable(format!("id {} does not fit 32 bits", kv.create_revision())))
    }

    fn election(&self) -> String {
        format!("{}leader", self.prefix())
    }

    async fn grant_lease(&mut self) -> Result<i64, DiscoveryError> {
        let lease = self
            .client
            .lease_grant(self.cfg.lease_ttl_s, None)
            .await
            .map_err(unavailable)?
            .id();
        let (mut keeper, mut stream) = self
            .client
            .lease_keep_alive(lease)
            .await
            .map_err(unavailable)?;
        let period = Duration::from_millis((self.cfg.lease_ttl_s.max(1) as u64) * 1000 / 3);
        // Keep the lease alive at a third of its TTL; if etcd goes away the
        // lease lapses and the others stop listing us, as they should.
        self.keepalive = Some(tokio::spawn(async move {
            loop {
                if keeper.keep_alive().await.is_err() || stream.message().await.is_err() {
                    warn!("etcd lease keep-alive failed; membership will lapse");
                    return;
                }
                tokio::time::sleep(period).await;
            }
        }));
        Ok(lease)
    }

    fn start_campaign(&mut self, name: String, lease: i64) {
        let mut client = self.campaign_client.clone();
        let election = self.election();
        self.campaign = Some(tokio::spawn(async move {
            match client.campaign(election, name.clone(), lease).await {
                Ok(r) => {
                    info!(node = %name, "elected clockmesh leader");
                    r.leader().cloned()
                }
                Err(e) => {
                    warn!("etcd campaign ended: {e}");
                    None
                }
            }
        }));
    }
}

impl EtcdDiscovery {
    /// A campaign that ended without winning (connection trouble) is
    /// started again, so this node stays a candidate.
    async fn restart_failed_campaign(&mut self) {
        let finished = self.campaign.as_ref().is_some_and(|c| c.is_finished());
        if !finished {
            return;
        }
        let Some(c) = self.campaign.take() else {
            return;
        };
        match c.await {
            Ok(Some(key)) => self.won = Some(key),
            _ => {
                if let (Some(name), Some(lease)) = (self.me.clone(), self.lease) {
                    warn!("campaign ended without a result; campaigning again");
                    self.start_campaign(name, lease);
                }
            }
        }
    }
}

impl Discovery for EtcdDiscovery {
    async fn register(&mut self, me: &Member) -> Result<Member, DiscoveryError> {
        let id = self.id_of(&me.name).await?;
        // Registering again after a lapse: the old lease's tasks are done for.
        self.stop_tasks();
        let lease = self.grant_lease().await?;
        let key = format!("{}{}", self.members_prefix(), me.name);
        let registered = Member { id, ..me.clone() };
        let value = serde_json::to_vec(&registered).map_err(unavailable)?;
        self.client
            .put(key, value, Some(PutOptions::new().with_lease(lease)))
            .await
            .map_err(unavailable)?;
        self.me = Some(me.name.clone());
        self.lease = Some(lease);
        self.start_campaign(me.name.clone(), lease);
        Ok(registered)
    }

    async fn members(&mut self) -> Result<Vec<Member>, DiscoveryError> {
        let prefix = self.members_prefix();
        let resp = self
            .client
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        let mut members = Vec::new();
        for kv in resp.kvs() {
            match serde_json::from_slice::<Member>(kv.value()) {
                Ok(m) => members.push(m),
                Err(e) => {
                    warn!(key = %kv.key_str().unwrap_or("?"), "ignoring bad member record: {e}")
                }
            }
        }
        members.sort();
        check_unique(&members)?;
        Ok(members)
    }

    async fn leadership(&mut self) -> Result<Leadership, DiscoveryError> {
        self.restart_failed_campaign().await;
        let leader = match self.client.leader(self.election()).await {
            Ok(r) => r.kv().and_then(|kv| kv.value_str().ok()).map(str::to_owned),
            // "election: no leader" is an answer, not an outage.
            Err(e) if e.to_string().contains("no leader") => None,
            Err(e) => return Err(unavailable(e)),
        };
        let is_me = leader.is_some() && leader == self.me;
        Ok(Leadership { leader, is_me })
    }

    async fn leave(&mut self) -> Result<(), DiscoveryError> {
        if let Some(c) = self.campaign.take() {
            if c.is_finished() {
                if let Ok(Some(key)) = c.await {
                    self.won = Some(key);
                }
            } else {
                // Still campaigning: the revoked lease withdraws the candidacy.
                c.abort();
            }
        }
        if let Some(key) = self.won.take() {
            let _ = self
                .client
                .resign(Some(ResignOptions::new().with_leader(key)))
                .await;
        }
        if let Some(k) = self.keepalive.take() {
            k.abort();
        }
        if let Some(lease) = self.lease.take() {
            self.client.lease_revoke(lease).await.map_err(unavailable)?;
        }
        self.me = None;
        Ok(())
    }
}

/// Results are written in transactions of this many puts (etcd's default
/// limit is 128 operations per transaction).
const RESULTS_PER_TXN: usize = 128;

/// etcd is the shared store: fits under `edges/<name>` (bound to this
/// node's lease), results under `results/<name>` (`docs/coordination.md`).
impl Coordination for EtcdDiscovery {
    type Store = Self;
    fn store(&mut self) -> Option<&mut Self> {
        Some(self)
    }
}

impl Store for EtcdDiscovery {
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

impl EtcdDiscovery {
    fn stop_tasks(&mut self) {
        if let Some(k) = self.keepalive.take() {
            k.abort();
        }
        if let Some(c) = self.campaign.take() {
            c.abort();
        }
        self.won = None;
    }
}

impl Drop for EtcdDiscovery {
    fn drop(&mut self) {
        // Without `leave`, the lease simply expires after its TTL.
        self.stop_tasks();
    }
}
