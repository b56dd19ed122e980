//! Kubernetes backend: membership from the agent pods, election through a
//! `coordination.k8s.io/v1` Lease (`docs/kubernetes.md`).
//!
//! * **Members** are the pods in `kube_namespace` selected by
//!   `kube_selector` that are `Running`, `Ready=True` and not being deleted.
//!   A member's name is the pod's `spec.nodeName`; its probe address is the
//!   pod's `clockmesh.io/probe-addr` annotation (each agent writes it on its
//!   own pod in [`Discovery::register`], because the address it probes from
//!   may be on the NCCL NIC, not the node's), else `status.hostIP` with the
//!   configured probe port. This agent itself is always a member (its pod
//!   turns Ready only after it has registered and started probing).
//! * **Node ids** are derived from node names ([`assign_ids`]), so every
//!   agent computes the same ids from the same pod list without writing
//!   anything.
//! * A **watch** on the pods runs in a background task and keeps a local
//!   cache: [`Discovery::members`] never waits for the API server. If the
//!   API server is unreachable the cache keeps the last known pods (a
//!   warning says so) and the watch reconnects with backoff.
//! * **Election**: a Lease named `kube_lease`, held by node name, 15 s
//!   long, renewed every 5 s in a background task; [`Discovery::leadership`]
//!   answers from what that task saw last.
//! * The per-window exchange does not go through the API server: like the
//!   static backend, this one has no shared store, and the runtime relays
//!   fits and results over UDP to and from the leader.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::Pod,
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{
    Api, Client, Config,
    api::{Patch, PatchParams, PostParams},
    runtime::{
        WatchStreamExt as _,
        utils::Backoff,
        watcher::{self, Event},
    },
};
use tokio::{sync::watch as signal, task::JoinHandle};
use tracing::{debug, info, warn};

use super::Coordination;
use super::{Discovery, DiscoveryError, Leadership, Member, check_unique};

/// Annotation with the address peers probe (`ip:port`), written by each
/// agent on its own pod.
pub const PROBE_ADDR_ANNOTATION: &str = "clockmesh.io/probe-addr";
/// Annotation with the agent's `probe::wire::capability` bits (decimal).
pub const CAPABILITIES_ANNOTATION: &str = "clockmesh.io/capabilities";

/// What the backend needs from the agent's configuration.
#[derive(Clone, Debug)]
pub struct KubeConfig {
    /// Namespace of the agent pods and of the Lease (`kube_namespace`).
    pub namespace: String,
    /// Label selector of the agent pods (`kube_selector`).
    pub selector: String,
    /// Name of the leader Lease (`kube_lease`).
    pub lease: String,
    /// Probe port assumed for pods without the probe-address annotation.
    pub probe_port: u16,
    /// This agent's pod; `None`: from `POD_NAME`, else `HOSTNAME`.
    pub pod_name: Option<String>,
}

impl KubeConfig {
    fn pod_name(&self) -> Result<String, DiscoveryError> {
        self.pod_name
            .clone()
            .or_else(|| std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()))
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
            .ok_or_else(|| {
                DiscoveryError::Misconfigured(
                    "cannot tell this agent's pod: set POD_NAME from the downward API \
                     (fieldRef metadata.name)"
                        .into(),
                )
            })
    }
}

/// Periods and limits (fixed in production; short in the tests).
#[derive(Clone, Debug)]
pub struct Timing {
    /// `leaseDurationSeconds` of the Lease, and how long a holder's record
    /// must stay unchanged before another agent takes it over.
    pub lease_duration: Duration,
    /// How often the Lease is read and renewed (or campaigned for).
    pub renew_period: Duration,
    /// Limit on one API request of the lease loop and of `register`.
    pub request_timeout: Duration,
    /// How long `register` waits for the first complete pod list.
    pub sync_timeout: Duration,
    /// Reconnect backoff of the pod watch: first delay, doubling to the cap.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_period: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            sync_timeout: Duration::from_secs(60),
            backoff_min: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
        }
    }
}

/// What the cache keeps of one agent pod.
#[derive(Clone, Debug, PartialEq)]
struct PodView {
    node: Option<String>,
    /// Running, Ready=True, not being deleted.
    ready: bool,
    terminating: bool,
    probe_addr: Option<SocketAddr>,
    host_ip: Option<IpAddr>,
    capabilities: u32,
}

impl PodView {
    fn of(pod: &Pod) -> PodView {
        let annotations = pod.metadata.annotations.as_ref();
        let annotation = |k: &str| annotations.and_then(|a| a.get(k)).map(|v| v.trim());
        let status = pod.status.as_ref();
        let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
        let ready_condition = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let terminating = pod.metadata.deletion_timestamp.is_some();
        PodView {
            node: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            ready: running && ready_condition && !terminating,
            terminating,
            probe_addr: annotation(PROBE_ADDR_ANNOTATION).and_then(|v| v.parse().ok()),
            host_ip: status
                .and_then(|s| s.host_ip.as_deref())
                .and_then(|v| v.parse().ok()),
            capabilities: annotation(CAPABILITIES_ANNOTATION)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        }
    }
}

/// State the background tasks update and the trait methods read.
#[derive(Default)]
struct Shared {
    /// Agent pods by pod name: the last complete list plus the watch events since.
    pods: BTreeMap<String, PodView>,
    /// The last request to the API server that failed / succeeded (watch
    /// and lease loop); unreachable while the failure is the later one.
    last_error: Option<(Instant, String)>,
    last_ok: Option<Instant>,
    /// The Lease holder as last seen; whether we hold it (our last acquire
    /// or renew succeeded).
    leader: Option<String>,
    holding: bool,
}

impl Shared {
    fn ok(&mut self) {
        self.last_ok = Some(Instant::now());
    }

    fn failed(&mut self, what: &str, e: impl std::fmt::Display) {
        self.last_error = Some((Instant::now(), format!("{what}: {e}")));
    }

    /// Since when, and why, the API server has been unreachable.
    fn outage(&self) -> Option<(Instant, &str)> {
        let (at, why) = self.last_error.as_ref()?;
        match self.last_ok {
            Some(ok) if ok >= *at => None,
            _ => Some((*at, why.as_str())),
        }
    }
}

type SharedState = Arc<Mutex<Shared>>;

fn lock(s: &SharedState) -> MutexGuard<'_, Shared> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct KubeDiscovery {
    client: Client,
    cfg: KubeConfig,
    timing: Timing,
    shared: SharedState,
    me: Option<Member>,
    watch_task: Option<JoinHandle<()>>,
    lease_task: Option<JoinHandle<()>>,
    /// Whether the current outage has been logged by `members()`.
    outage_logged: bool,
}

impl Drop for KubeDiscovery {
    fn drop(&mut self) {
        self.stop_tasks();
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> DiscoveryError {
    DiscoveryError::Unavailable(format!("Kubernetes API: {what}: {e}"))
}

impl KubeDiscovery {
    /// Connects with the in-cluster configuration when running in a pod
    /// (`KUBERNETES_SERVICE_HOST` set), else with the kubeconfig
    /// (`KUBECONFIG` or `~/.kube/config`).
    pub async fn connect(cfg: KubeConfig) -> Result<Self, DiscoveryError> {
        let config = if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            Config::incluster().map_err(|e| unavailable("in-cluster configuration", e))?
        } else {
            Config::infer()
                .await
                .map_err(|e| unavailable("kubeconfig", e))?
        };
        let client = Client::try_from(config).map_err(|e| unavailable("client", e))?;
        Ok(Self::with_client(client, cfg, Timing::default()))
    }

    /// A backend on an existing client (tests pass a mock API server).
    pub fn with_client(client: Client, cfg: KubeConfig, timing: Timing) -> Self {
        KubeDiscovery {
            client,
            cfg,
            timing,
            shared: SharedState::default(),
            me: None,
            watch_task: None,
            lease_task: None,
            outage_logged: false,
        }
    }

    fn stop_tasks(&mut self) {
        for task in [self.watch_task.take(), self.lease_task.take()]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
    }

    /// Starts the pod watch; the receiver turns `true` at the first complete list.
    fn start_watch(&mut self) -> signal::Receiver<bool> {
        let (synced_tx, synced_rx) = signal::channel(false);
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.cfg.namespace);
        let config = watcher::Config::default().labels(&self.cfg.selector);
        let backoff = CappedBackoff::new(self.timing.backoff_min, self.timing.backoff_max);
        let shared = self.shared.clone();
        self.watch_task = Some(tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher::watcher(api, config).backoff(backoff));
            // Objects of a relist, swapped in whole at InitDone.
            let mut relist: BTreeMap<String, PodView> = BTreeMap::new();
            while let Some(event) = stream.next().await {
                let mut s = lock(&shared);
                match event {
                    Ok(Event::Init) => relist.clear(),
                    Ok(Event::InitApply(pod)) => {
                        relist.insert(pod_name(&pod), PodView::of(&pod));
                    }
                    Ok(Event::InitDone) => {
                        s.pods = std::mem::take(&mut relist);
                        s.ok();
                        debug!(pods = s.pods.len(), "agent pods listed");
                        synced_tx.send_replace(true);
                    }
                    Ok(Event::Apply(pod)) => {
                        s.pods.insert(pod_name(&pod), PodView::of(&pod));
                        s.ok();
                    }
                    Ok(Event::Delete(pod)) => {
                        s.pods.remove(&pod_name(&pod));
                        s.ok();
                    }
                    Err(e) => {
                        debug!("pod watch: {e}");
                        s.failed("pod watch", e);
                    }
                }
            }
        }));
        synced_rx
    }

    /// The members the cache shows now (always including this agent).
    fn current_members(&self) -> Result<Vec<Member>, DiscoveryError> {
        let s = lock(&self.shared);
        let me = self.me.as_ref();
        // Ids over every scheduled pod, ready or not, so that readiness
        // flaps never move an id.
        let names = s
            .pods
            .values()
            .filter(|p| !p.terminating)
            .filter_map(|p| p.node.as_deref())
            .chain(me.map(|m| m.name.as_str()));
        let ids = assign_ids(names);
        let mut members: BTreeMap<&str, Member> = BTreeMap::new();
        for p in s.pods.values().filter(|p| p.ready) {
            let (Some(node), false) = (p.node.as_deref(), p.terminating) else {
                continue;
            };
            let Some(&id) = ids.get(node) else {
                continue;
            };
            let Some(addr) = p
                .probe_addr
                .or_else(|| p.host_ip.map(|ip| SocketAddr::new(ip, self.cfg.probe_port)))
            else {
                continue;
            };
            members.insert(
                node,
                Member {
                    name: node.to_owned(),
                    id,
                    addr: addr.ip(),
                    probe_port: addr.port(),
                    capabilities: p.capabilities,
                },
            );
        }
        if let Some(me) = me {
            members.insert(
                &me.name,
                Member {
                    id: ids[&me.name],
                    ..me.clone()
                },
            );
        }
        let members: Vec<Member> = members.into_values().collect();
        check_unique(&members)?;
        Ok(members)
    }

    fn lease_api(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.cfg.namespace)
    }

    fn elector(&self, me: &str) -> Elector {
        Elector {
            api: self.lease_api(),
            lease: self.cfg.lease.clone(),
            me: me.to_owned(),
            timing: self.timing.clone(),
            observed: None,
            shared: self.shared.clone(),
        }
    }

    /// Writes this agent's probe address and capabilities on its pod and
    /// checks that the pod is on the node this agent calls itself.
    async fn annotate_own_pod(&self, me: &Member) -> Result<(), DiscoveryError> {
        let pod = self.cfg.pod_name()?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &self.cfg.namespace);
        let patch = serde_json::json!({"metadata": {"annotations": {
            PROBE_ADDR_ANNOTATION: me.probe_addr().to_string(),
            CAPABILITIES_ANNOTATION: me.capabilities.to_string(),
        }}});
        let patched = tokio::time::timeout(
            self.timing.request_timeout,
            api.patch(&pod, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        .map_err(|_| unavailable(&format!("annotating pod {pod}"), "timed out"))?;
        let ns = &self.cfg.namespace;
        let patched = match patched {
            Ok(p) => p,
            Err(kube::Error::Api(s)) if s.is_not_found() => {
                return Err(DiscoveryError::Misconfigured(format!(
                    "pod {pod:?} not found in namespace {ns:?}: set POD_NAME from the downward \
                     API (fieldRef metadata.name) and kube_namespace to the pod's namespace"
                )));
            }
            Err(kube::Error::Api(s)) if s.is_forbidden() => {
                return Err(DiscoveryError::Misconfigured(format!(
                    "not allowed to patch pod {pod:?} in {ns:?} ({}): the agent's Role needs \
                     pods get/list/watch/patch (deploy/kubernetes/rbac.yaml)",
                    s.message
                )));
            }
            Err(e) => return Err(unavailable(&format!("annotating pod {pod}"), e)),
        };
        let node = patched.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if let Some(node) = node.filter(|n| *n != me.name) {
            return Err(DiscoveryError::Misconfigured(format!(
                "node_name is {:?} but pod {pod:?} runs on node {node:?}: set \
                 CLOCKMESH_NODE_NAME from the downward API (fieldRef spec.nodeName)",
                me.name
            )));
        }
        Ok(())
    }
}

fn pod_name(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

/// 32-bit FNV-1a of a node name.
pub fn name_hash(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Node ids from node names, the same on every agent that sees the same
/// names: in name order, each name takes [`name_hash`] of itself, or the next
/// free value after it if an earlier name has it (0 is never used). A name's
/// id changes only if a name sorting before it joins or leaves *and* their
/// hashes collide: a joining name meets one of n hashes with probability
/// n/2³² (2·10⁻⁷ at 1,000 nodes).
pub fn assign_ids<'a>(names: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, u32> {
    assign_ids_by(names, name_hash)
}

fn assign_ids_by<'a>(
    names: impl IntoIterator<Item = &'a str>,
    hash: impl Fn(&str) -> u32,
) -> BTreeMap<String, u32> {
    let sorted: BTreeSet<&str> = names.into_iter().collect();
    let mut used = BTreeSet::new();
    let mut ids = BTreeMap::new();
    for name in sorted {
        let mut id = hash(name);
        while id == 0 || used.contains(&id) {
            id = id.wrapping_add(1);
        }
        used.insert(id);
        ids.insert(name.to_owned(), id);
    }
    ids
}

/// Exponential backoff with a cap, restarting from the minimum after a
/// successful event (kube-runtime resets it).
struct CappedBackoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl CappedBackoff {
    fn new(min: Duration, max: Duration) -> Self {
        CappedBackoff {
            min,
            max,
            next: min,
        }
    }
}

impl Iterator for CappedBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        Some(d)
    }
}

impl Backoff for CappedBackoff {
    fn reset(&mut self) {
        self.next = self.min;
    }
}

/// The Lease loop's state: one [`Elector::step`] per renew period.
///
/// Expiry is judged as client-go does: by how long *this* agent has seen the
/// record unchanged (its `resourceVersion`), on its own monotonic clock, not
/// by comparing the record's `renewTime` with the local wall clock: node
/// clocks are what clockmesh measures, and they may be off.
struct Elector {
    api: Api<Lease>,
    lease: String,
    me: String,
    timing: Timing,
    /// The record's resourceVersion and when we first saw it.
    observed: Option<(String, Instant)>,
    shared: SharedState,
}

impl Elector {
    /// Reads the Lease; renews it if ours, takes it if free or expired.
    async fn step(&mut self, now: Instant) {
        let outcome = tokio::time::timeout(self.timing.request_timeout, self.try_step(now)).await;
        let mut s = lock(&self.shared);
        match outcome {
            Ok(Ok(Some(holder))) => {
                s.ok();
                let holding = holder == self.me;
                if holding && !s.holding {
                    info!(lease = %self.lease, "acquired the leader Lease");
                }
                s.holding = holding;
                s.leader = Some(holder).filter(|h| !h.is_empty());
            }
            Ok(Ok(None)) => {
                s.ok();
                s.holding = false;
                s.leader = None;
            }
            Ok(Err(e)) => {
                // A failed renew: stop claiming at once (another agent may
                // take the Lease once it looks expired to it). The last seen
                // holder stays the reference.
                if s.holding {
                    warn!(lease = %self.lease, "renewing the leader Lease failed: {e}");
                }
                s.holding = false;
                s.failed("leader Lease", e);
            }
            Err(_) => {
                if s.holding {
                    warn!(lease = %self.lease, "renewing the leader Lease timed out");
                }
                s.holding = false;
                s.failed("leader Lease", "timed out");
            }
        }
    }

    /// The holder after this step (`None`: free and not taken by us).
    async fn try_step(&mut self, now: Instant) -> Result<Option<String>, kube::Error> {
        let Some(lease) = self.api.get_opt(&self.lease).await? else {
            return self.create(now).await;
        };
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        let seen_at = match &self.observed {
            Some((seen, at)) if *seen == rv => *at,
            _ => {
                self.observed = Some((rv.clone(), now));
                now
            }
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let duration = spec
            .lease_duration_seconds
            .map_or(self.timing.lease_duration, |s| {
                Duration::from_secs(s.max(0) as u64)
            });
        let ours = holder.as_deref() == Some(self.me.as_str());
        let expired = holder.is_none() || now.saturating_duration_since(seen_at) >= duration;
        if !ours && !expired {
            return Ok(holder);
        }
        let stamp = Some(MicroTime(Timestamp::now()));
        let transitions = spec.lease_transitions.unwrap_or(0);
        let spec = LeaseSpec {
            holder_identity: Some(self.me.clone()),
            lease_duration_seconds: Some(self.timing.lease_duration.as_secs() as i32),
            renew_time: stamp.clone(),
            acquire_time: if ours { spec.acquire_time } else { stamp },
            lease_transitions: Some(if ours { transitions } else { transitions + 1 }),
            ..spec
        };
        let updated = self.replace_spec(lease, spec).await?;
        if !ours {
            info!(lease = %self.lease, previous = ?holder, "taking over the leader Lease");
        }
        self.observed = Some((updated.metadata.resource_version.unwrap_or_default(), now));
        Ok(Some(self.me.clone()))
    }

    async fn create(&mut self, now: Instant) -> Result<Option<String>, kube::Error> {
        let stamp = Some(MicroTime(Timestamp::now()));
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.lease.clone()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/name".to_owned(),
                    "clockmesh".to_owned(),
                )])),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.me.clone()),
                lease_duration_seconds: Some(self.timing.lease_duration.as_secs() as i32),
                acquire_time: stamp.clone(),
                renew_time: stamp,
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(created) => {
                info!(lease = %self.lease, "created the leader Lease");
                self.observed = Some((created.metadata.resource_version.unwrap_or_default(), now));
                Ok(Some(self.me.clone()))
            }
            // Another agent created it first: read it next time.
            Err(kube::Error::Api(s)) if s.is_already_exists() || s.code == 409 => {
                Ok(lock(&self.shared).leader.clone())
            }
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if we hold it, as client-go does: no holder,
    /// `leaseDurationSeconds: 1`, so the next candidate takes it at once.
    async fn release(&mut self) -> Result<bool, kube::Error> {
        let Some(lease) = self.api.get_opt(&self.lease).await? else {
            return Ok(false);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.me.as_str()) {
            return Ok(false);
        }
        let stamp = Some(MicroTime(Timestamp::now()));
        let spec = LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            acquire_time: stamp.clone(),
            renew_time: stamp,
            ..spec
        };
        self.replace_spec(lease, spec).await?;
        Ok(true)
    }

    /// Writes `spec` into the Lease as read; its resourceVersion makes a
    /// concurrent change fail with 409 Conflict (optimistic concurrency).
    async fn replace_spec(&self, lease: Lease, spec: LeaseSpec) -> Result<Lease, kube::Error> {
        let lease = Lease {
            spec: Some(spec),
            ..lease
        };
        self.api
            .replace(&self.lease, &PostParams::default(), &lease)
            .await
    }
}

impl Discovery for KubeDiscovery {
    async fn register(&mut self, me: &Member) -> Result<Member, DiscoveryError> {
        self.annotate_own_pod(me).await?;
        let mut synced = self.start_watch();
        let waited = tokio::time::timeout(self.timing.sync_timeout, synced.wait_for(|s| *s)).await;
        if !matches!(waited, Ok(Ok(_))) {
            let why = lock(&self.shared)
                .last_error
                .as_ref()
                .map_or_else(|| "no answer".to_owned(), |(_, e)| e.clone());
            self.stop_tasks();
            return Err(unavailable(
                &format!(
                    "no list of pods {:?} in {:?} within {:?}",
                    self.cfg.selector, self.cfg.namespace, self.timing.sync_timeout
                ),
                why,
            ));
        }
        let pod = self.cfg.pod_name()?;
        if !lock(&self.shared).pods.contains_key(&pod) {
            warn!(
                %pod,
                selector = %self.cfg.selector,
                "this agent's pod is not selected by kube_selector: the other agents will not see this node"
            );
        }
        self.me = Some(me.clone());
        let me = self
            .current_members()?
            .into_iter()
            .find(|m| m.name == me.name)
            .expect("this agent is always a member");
        self.me = Some(me.clone());
        // One election step now, so leadership is known before the first window.
        let mut elector = self.elector(&me.name);
        elector.step(Instant::now()).await;
        let period = self.timing.renew_period;
        self.lease_task = Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                elector.step(Instant::now()).await;
            }
        }));
        info!(
            node = %me.name,
            id = me.id,
            namespace = %self.cfg.namespace,
            selector = %self.cfg.selector,
            lease = %self.cfg.lease,
            "registered with the Kubernetes API"
        );
        Ok(me)
    }

    async fn members(&mut self) -> Result<Vec<Member>, DiscoveryError> {
        let members = self.current_members()?;
        let outage = lock(&self.shared)
            .outage()
            .map(|(at, why)| (at.elapsed(), why.to_owned()));
        match outage {
            Some((age, why)) if !self.outage_logged => {
                self.outage_logged = true;
                warn!(
                    members = members.len(),
                    "Kubernetes API unreachable ({why}, {age:.0?} ago): using the last known \
                     members; membership and election are frozen, probing continues"
                );
            }
            Some(_) => {}
            None if self.outage_logged => {
                self.outage_logged = false;
                info!("Kubernetes API reachable again");
            }
            None => {}
        }
        Ok(members)
    }

    async fn leadership(&mut self) -> Result<Leadership, DiscoveryError> {
        let s = lock(&self.shared);
        Ok(Leadership {
            leader: s.leader.clone(),
            is_me: s.holding && self.me.is_some(),
        })
    }

    async fn leave(&mut self) -> Result<(), DiscoveryError> {
        self.stop_tasks();
        let Some(me) = self.me.take() else {
            return Ok(());
        };
        let held = {
            let mut s = lock(&self.shared);
            let held = s.holding || s.leader.as_deref() == Some(me.name.as_str());
            s.holding = false;
            held
        };
        if !held {
            return Ok(());
        }
        let mut elector = self.elector(&me.name);
        match tokio::time::timeout(self.timing.request_timeout, elector.release()).await {
            Ok(Ok(released)) => {
                if released {
                    info!(lease = %self.cfg.lease, "released the leader Lease");
                    lock(&self.shared).leader = None;
                }
                Ok(())
            }
            Ok(Err(e)) => Err(unavailable("releasing the leader Lease", e)),
            Err(_) => Err(unavailable("releasing the leader Lease", "timed out")),
        }
    }
}

/// No shared store: the API server carries no per-window traffic; fits and
/// results go over UDP (`docs/coordination.md`).
impl Coordination for KubeDiscovery {
    type Store = super::NoStore;
    fn store(&mut self) -> Option<&mut super::NoStore> {
        None
    }
}

#[cfg(test)]
mod tests;
