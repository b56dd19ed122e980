//! etcd backend.
//!
//! Layout under `/clockmesh/<cluster>/`:
//! - `members/<name>`: JSON [`Member`] bound to this agent's member lease
//!   (TTL `member_ttl_s`, kept alive in the background): a crashed agent
//!   vanishes from the list when its lease expires.
//! - `ids/<name>`: the name's id, the create revision of this key, which is
//!   written once and bound to no lease: cluster-unique, and the same for a
//!   restarted agent or one whose lease lapsed (a link down for longer than
//!   the TTL), so its peers' histories of its edges and its place in the
//!   probe graph carry on, as with static membership.
//! - `seats/<i>`: the [`CANDIDATES`] members that stand for leader
//!   ([`seats`]), each key bound to its holder's member lease.
//! - Each seat holder's candidacy is bound to a *campaign lease* of its own
//!   (TTL `campaign_ttl_s`): only the three seat holders keep a short lease,
//!   so a leader's failover is quick while the thousands of other members
//!   keep alive a long one (a keep-alive each every third of its TTL was
//!   half of etcd's CPU at 10,000 members, `docs/coordination.md`).
//! - `leader`: etcd's election on this name among the seat holders; the
//!   value is the leader's name. Campaigning blocks in etcd until the seat
//!   is free, so it runs in a task.
//! - `places/<name>`: each member's place in the probe graph, handed out by
//!   the leader ([`places`]); a member without a seat reads only its own.

mod places;
mod seats;

pub use seats::CANDIDATES;

use std::time::Duration;

use clockmesh_core::{
    codec, fits::WindowFits, graph::ProbeGraph, node::Membership, result::NodeResult,
};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LeaderKey, PutOptions, ResignOptions, Txn, TxnOp,
};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::{
    Coordination, Discovery, DiscoveryError, Leadership, Member, NoStore, Store, check_unique,
    prefix_watch::{Keys, Parse, PrefixWatch},
};

/// How to reach etcd and how long a silent member stays listed.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    /// Namespaces several clusters in one etcd.
    pub cluster: String,
    /// TTL of a member's lease: how long a member whose agent went silent
    /// stays listed.
    pub member_ttl_s: i64,
    /// TTL of a seat holder's campaign lease: how long a silent leader (or
    /// candidate) stays in the election, which bounds a failover.
    pub campaign_ttl_s: i64,
}

/// A lease this member holds, kept alive by a task of its own until it is
/// dropped (aborted: etcd then lets the lease run out) or etcd says the
/// lease is gone.
struct HeldLease {
    id: i64,
    keeper: JoinHandle<()>,
}

impl HeldLease {
    async fn grant(client: &mut Client, ttl_s: i64) -> Result<Self, DiscoveryError> {
        let id = client
            .lease_grant(ttl_s, None)
            .await
            .map_err(unavailable)?
            .id();
        let period = Duration::from_millis((ttl_s.max(1) as u64) * 1000 / 3);
        let stream = client.lease_keep_alive(id).await.map_err(unavailable)?;
        let keeper = tokio::spawn(keep_alive(client.clone(), id, period, stream));
        Ok(HeldLease { id, keeper })
    }

    /// etcd said the lease is gone (its keeper stops only then).
    fn lapsed(&self) -> bool {
        self.keeper.is_finished()
    }

    /// Stops keeping it alive and gives it back, so that what is bound to
    /// it goes now rather than after its TTL.
    async fn revoke(self, client: &mut Client) -> Result<(), DiscoveryError> {
        let id = self.id;
        drop(self); // its keeper stops
        client.lease_revoke(id).await.map_err(unavailable)?;
        Ok(())
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

pub struct EtcdDiscovery {
    client: Client,
    /// Campaigning blocks until elected: it needs a connection without the
    /// request timeout (etcd withdraws a candidacy whose request is cancelled).
    campaign_client: Client,
    cfg: EtcdConfig,
    me: Option<String>,
    /// The lease of this member's record.
    lease: Option<HeldLease>,
    /// The lease of its candidacy, while it campaigns or leads.
    campaign_lease: Option<HeldLease>,
    campaign: Option<JoinHandle<Option<LeaderKey>>>,
    /// Our election key once elected (to resign on leave).
    won: Option<LeaderKey>,
    /// This member's id once registered.
    my_id: Option<u32>,
    /// The member list, kept current by a watch (seat holders only).
    member_watch: Option<PrefixWatch<Member>>,
    /// Candidates' values as written (the leader's name).
    leader_watch: Option<PrefixWatch<Vec<u8>>>,
    /// The seats' holders, by seat key.
    seat_watch: Option<PrefixWatch<String>>,
    /// The seat this member holds.
    seat: Option<usize>,
    /// This member's place (members without a seat).
    place_watch: Option<PrefixWatch<places::Handed>>,
    /// Whether its place was there since it registered (gone after: its
    /// lease lapsed).
    had_place: bool,
    /// As leader: the places written.
    handed: Option<places::HandedOut>,
}

/// A JSON record (a member, a place); `None` (with a warning naming its
/// key) for one that does not parse.
fn parse_json<T: serde::de::DeserializeOwned>(key: &[u8], value: &[u8]) -> Option<T> {
    serde_json::from_slice::<T>(value)
        .map_err(|e| {
            let key = String::from_utf8_lossy(key);
            warn!(%key, "ignoring bad record: {e}");
        })
        .ok()
}

/// Keeps `lease` alive at `period` (a third of its TTL) for as long as
/// etcd knows it. A keep-alive stream that breaks (an overloaded etcd
/// drops streams; a connection that failed over) is opened again at once
/// rather than left to lapse: a lapsed lease delists the member and its
/// registering again is more load on an etcd that is already behind (at
/// 5,000 simulated members, 1,214 lapsed leases fed back that way,
/// `docs/coordination.md`, "At scale"). It stops only when etcd says the
/// lease is gone (TTL 0): the agent then registers again.
async fn keep_alive(
    mut client: Client,
    lease: i64,
    period: Duration,
    first: (etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream),
) {
    let (mut keeper, mut stream) = first;
    loop {
        let answer = match keeper.keep_alive().await {
            Ok(()) => stream.message().await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(Some(r)) if r.ttl() <= 0 => {
                warn!(lease, "etcd lease expired; membership lapsed");
                return;
            }
            Ok(Some(_)) => tokio::time::sleep(period).await,
            Ok(None) | Err(_) => {
                warn!(lease, "etcd lease keep-alive stream broke; opening another");
                tokio::time::sleep(period / 4).await;
                match client.lease_keep_alive(lease).await {
                    Ok(again) => (keeper, stream) = again,
                    Err(e) => warn!(lease, "etcd lease keep-alive: {e}"),
                }
            }
        }
    }
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
        Ok(Self::on(client, campaign_client, cfg))
    }

    /// A backend on these connections, not registered yet.
    fn on(client: Client, campaign_client: Client, cfg: EtcdConfig) -> Self {
        EtcdDiscovery {
            client,
            campaign_client,
            cfg,
            me: None,
            lease: None,
            campaign_lease: None,
            campaign: None,
            won: None,
            my_id: None,
            member_watch: None,
            leader_watch: None,
            seat_watch: None,
            seat: None,
            place_watch: None,
            had_place: false,
            handed: None,
        }
    }

    /// Another member's backend on this one's two connections, with its
    /// own registration, lease, keep-alive and campaign once it registers:
    /// for a harness that simulates more members than one process may hold
    /// connections for (`clockmesh-demo bench-scale`). An agent uses
    /// [`EtcdDiscovery::connect`].
    pub fn share_connections(&self) -> Self {
        Self::on(
            self.client.clone(),
            self.campaign_client.clone(),
            self.cfg.clone(),
        )
    }

    pub(crate) fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    pub(crate) fn lease(&self) -> Option<i64> {
        self.lease.as_ref().map(|l| l.id)
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

    /// `watch`, current: caught up, or started again (read whole) where
    /// it was lost or never started.
    async fn current<T>(
        &mut self,
        watch: fn(&mut Self) -> &mut Option<PrefixWatch<T>>,
        (keys, parse): (Keys, Parse<T>),
        what: &str,
    ) -> Result<(), DiscoveryError> {
        if watch(self).as_mut().is_some_and(|w| w.catch_up(what)) {
            return Ok(());
        }
        *watch(self) = None; // aborts a lost watch's task
        let (client, streaming) = (&mut self.client, &mut self.campaign_client);
        let started = PrefixWatch::start(client, streaming, keys, parse)
            .await
            .map_err(unavailable)?;
        *watch(self) = Some(started);
        Ok(())
    }

    /// The member list's watch, current.
    async fn members_current(&mut self) -> Result<(), DiscoveryError> {
        let prefix = self.members_prefix();
        self.current(
            |d| &mut d.member_watch,
            (Keys::Prefix(prefix), parse_json::<Member>),
            "member list",
        )
        .await
    }

    fn election(&self) -> String {
        format!("{}leader", self.prefix())
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
    /// Stands for leader if this member holds a seat, and withdraws
    /// otherwise (never once elected: a leader stays until it leaves). A
    /// campaign that ended without winning (connection trouble) is started
    /// again.
    async fn campaign_if_candidate(&mut self) {
        if self.campaign_lease.as_ref().is_some_and(HeldLease::lapsed) {
            // Silent past its TTL (etcd overloaded, or this host cut off):
            // the candidacy, or the lead, is gone; stand again.
            warn!(node = ?self.me, "campaign lease expired; campaigning again");
            self.end_campaign();
        }
        if self.campaign.as_ref().is_some_and(|c| c.is_finished())
            && let Some(c) = self.campaign.take()
        {
            match c.await {
                Ok(Some(key)) => self.won = Some(key),
                _ => warn!("campaign ended without a result"),
            }
        }
        if self.won.is_some() {
            return;
        }
        let standing = self.campaign.is_some() || self.campaign_lease.is_some();
        match (self.is_candidate(), self.campaign.is_some()) {
            (true, false) => {
                if self.campaign_lease.is_none() {
                    let ttl = self.cfg.campaign_ttl_s;
                    match HeldLease::grant(&mut self.client, ttl).await {
                        Ok(l) => self.campaign_lease = Some(l),
                        Err(e) => warn!("campaign lease: {e}"),
                    }
                }
                if let (Some(name), Some(lease)) = (self.me.clone(), self.campaign_lease()) {
                    self.start_campaign(name, lease);
                }
            }
            // Without a seat, neither a campaign nor its lease is kept.
            (false, _) if standing => self.stand_down().await,
            _ => {}
        }
    }
}

impl Discovery for EtcdDiscovery {
    async fn register(&mut self, me: &Member) -> Result<Member, DiscoveryError> {
        let id = self.id_of(&me.name).await?;
        // Registering again after a lapse: the old lease's tasks are done
        // for, and the seat went with the old lease.
        self.stand_down().await;
        self.lease = None;
        let lease = HeldLease::grant(&mut self.client, self.cfg.member_ttl_s).await?;
        let key = format!("{}{}", self.members_prefix(), me.name);
        let registered = Member { id, ..me.clone() };
        let value = serde_json::to_vec(&registered).map_err(unavailable)?;
        self.client
            .put(key, value, Some(PutOptions::new().with_lease(lease.id)))
            .await
            .map_err(unavailable)?;
        self.me = Some(me.name.clone());
        self.my_id = Some(id);
        self.lease = Some(lease);
        // The leader hands out a place again once it lists this member.
        self.had_place = false;
        Ok(registered)
    }

    /// The members as the watch has them (read whole only at the start
    /// and after a lost watch): eventually consistent, within the watch's
    /// delivery delay (milliseconds) of etcd.
    async fn members(&mut self) -> Result<Vec<Member>, DiscoveryError> {
        self.members_current().await?;
        let mut members: Vec<Member> = self
            .member_watch
            .iter()
            .flat_map(PrefixWatch::values)
            .cloned()
            .collect();
        members.sort();
        check_unique(&members)?;
        Ok(members)
    }

    /// A seat holder follows the whole list (it may have to lead); any
    /// other member only its place, as the leader handed it out.
    async fn membership(&mut self) -> Result<Membership, DiscoveryError> {
        self.seats_current().await?;
        if self.is_candidate() {
            return Ok(Membership::All(self.members().await?));
        }
        self.member_watch = None;
        self.my_place().await
    }

    async fn hand_out(
        &mut self,
        graph: &ProbeGraph,
        members: &[Member],
    ) -> Result<(), DiscoveryError> {
        self.hand_out_places(graph, members).await
    }

    /// A seat holder follows the election as the watch has it: the oldest
    /// candidate's key leads (etcd's election rule), read whole only at the
    /// start and after a lost watch. Any other member learns who leads from
    /// its place (every agent following the election was one more watch
    /// each while thousands start).
    async fn leadership(&mut self) -> Result<Leadership, DiscoveryError> {
        self.seats_current().await?;
        self.campaign_if_candidate().await;
        if !self.is_candidate() {
            self.leader_watch = None;
            let leader = self.placed_leader();
            return Ok(Leadership {
                leader,
                is_me: false,
            });
        }
        let prefix = format!("{}/", self.election());
        let as_written: Parse<Vec<u8>> = |_, value| Some(value.to_vec());
        self.current(
            |d| &mut d.leader_watch,
            (Keys::Prefix(prefix), as_written),
            "election",
        )
        .await?;
        let leader = self
            .leader_watch
            .as_ref()
            .and_then(PrefixWatch::oldest)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_owned);
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
        self.stand_down().await;
        if let Some(lease) = self.lease.take() {
            lease.revoke(&mut self.client).await?;
        }
        self.me = None;
        Ok(())
    }
}

/// Results are written in transactions of this many puts (etcd's default
/// limit is 128 operations per transaction).
const RESULTS_PER_TXN: usize = 128;

/// etcd keeps membership and the election only: fits and results travel
/// over UDP to and from the leader, as with the other backends
/// (`docs/coordination.md`, "At scale": a put and a read per member per
/// window overloaded etcd from 5,000 members on; the relay adds nothing
/// to etcd's load per window).
impl Coordination for EtcdDiscovery {
    type Store = NoStore;
    fn store(&mut self) -> Option<&mut NoStore> {
        None
    }
}

/// The shared-store exchange through etcd — fits under `edges/<name>`
/// (bound to this node's lease), results under `results/<name>` — which
/// the agent used before the relay. Kept as the measured alternative:
/// `clockmesh-demo bench-scale` drives it to show what it costs etcd.
impl Store for EtcdDiscovery {
    async fn put_edges(&mut self, me: &str, fits: &WindowFits) -> Result<(), DiscoveryError> {
        let key = format!("{}edges/{me}", self.prefix());
        let opts = self.lease().map(|l| PutOptions::new().with_lease(l));
        self.client()
            .put(key, codec::encode_window_fits(fits), opts)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn fetch_edges(&mut self) -> Result<Vec<WindowFits>, DiscoveryError> {
        let prefix = format!("{}edges/", self.prefix());
        let resp = self
            .client()
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(unavailable)?;
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| codec::decode_window_fits(kv.value()).ok())
            .collect())
    }

    async fn put_results(&mut self, results: &[NodeResult]) -> Result<(), DiscoveryError> {
        let prefix = format!("{}results/", self.prefix());
        for chunk in results.chunks(RESULTS_PER_TXN) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|r| {
                    TxnOp::put(
                        format!("{prefix}{}", r.node_name),
                        codec::encode_result(r),
                        None,
                    )
                })
                .collect();
            self.client()
                .txn(Txn::new().and_then(ops))
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    /// An unreadable record counts as none: the node holds what it has.
    async fn my_result(&mut self, me: &str) -> Result<Option<NodeResult>, DiscoveryError> {
        let key = format!("{}results/{me}", self.prefix());
        let resp = self.client().get(key, None).await.map_err(unavailable)?;
        Ok(resp
            .kvs()
            .first()
            .and_then(|kv| codec::decode_result(kv.value()).ok()))
    }
}

impl EtcdDiscovery {
    /// Stops the campaign and forgets the lead; the campaign lease's
    /// keeper stops as it drops (etcd lets the lease run out).
    fn end_campaign(&mut self) {
        if let Some(c) = self.campaign.take() {
            c.abort();
        }
        self.won = None;
        self.campaign_lease = None;
    }

    /// Ends the campaign and forgets the seat.
    fn stop_tasks(&mut self) {
        self.end_campaign();
        self.seat = None;
    }

    /// Stops campaigning (or leading) and gives the campaign lease back,
    /// so that the candidacy leaves the election now, not after its TTL
    /// (etcd's refusal is left to the TTL).
    async fn stand_down(&mut self) {
        let lease = self.campaign_lease.take();
        self.stop_tasks();
        if let Some(lease) = lease {
            let _ = lease.revoke(&mut self.client).await;
        }
    }

    /// The lease this member's candidacy is bound to.
    fn campaign_lease(&self) -> Option<i64> {
        self.campaign_lease.as_ref().map(|l| l.id)
    }
}

impl Drop for EtcdDiscovery {
    fn drop(&mut self) {
        // Without `leave`, the leases simply expire after their TTLs (their
        // keepers stop as they drop).
        self.stop_tasks();
    }
}
