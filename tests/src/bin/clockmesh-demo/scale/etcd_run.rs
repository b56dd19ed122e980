//! N simulated members on one real etcd, each through the agent's own
//! etcd backend (`clockmesh::discovery::etcd::EtcdDiscovery`: its own
//! connections, lease kept alive, campaign, `Store` puts and reads), on
//! the agent's window schedule; the leader is a real `core::Node` driven
//! by ticks at its phases, fetching, solving and publishing through the
//! same store.

use std::{
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clockmesh::discovery::{
    Discovery as _, DiscoveryError, ETCD_CAMPAIGN_TTL_S, Member, Membership, Store as _,
    etcd::{EtcdConfig, EtcdDiscovery},
};
use clockmesh_core::{
    codec,
    node::{Action, Exchange, LocalNs, Node, NodeConfig, WindowIndex},
    settings::Settings,
};
use clockmesh_proto::{clockmesh as pb, prost::Message as _};
use clockmesh_testbed::etcd::EtcdServer;
use serde::Serialize;
use tokio::sync::Semaphore;
use tracing::{info, warn};

use clockmesh_core::graph::{Neighbourhood, ProbeGraph};

use super::{
    fault_view::{Fault, FaultReport},
    metrics::{self, EtcdMetrics, Quantiles},
    realtime_ns, sleep_until_realtime,
    truth::{Rng, Truth},
};

/// What one etcd run is asked to do.
#[derive(Clone, Debug)]
pub struct EtcdRunCfg {
    pub members: usize,
    pub windows: u64,
    /// Leading windows left out of the accuracy figures (the solve's start).
    pub warmup: u64,
    /// Windows before etcd's and the harness's counters are first read
    /// (more: the steady state without the members' first reads).
    pub settle_windows: u64,
    pub window_s: u64,
    /// Every member also reads the member list and the leader this often,
    /// as the agent's runtime does every 2 s; 0: not (coordination only).
    pub membership_every_s: u64,
    pub degree: usize,
    pub seed: u64,
    pub etcd_args: Vec<String>,
    /// Registrations in flight at once while the members start.
    pub start_concurrency: usize,
    /// Members sharing one member's two etcd connections (1: none shared).
    pub members_per_connection: usize,
    /// Fits and results through etcd (the store the agent used before),
    /// or over the relay (what it ships: etcd then carries membership and
    /// the election only, and the per-window figures come from the relay
    /// run).
    pub exchange: Exchange,
    /// Faults (the relay exchange), windows after the first measured one:
    /// etcd killed and started again on its data; the leader's agent
    /// killed (its lease then runs out, and a seat holder takes over).
    pub restart_etcd_at: Option<u64>,
    pub kill_leader_at: Option<u64>,
    /// TTL of each member's lease, s (the agent's `etcd_member_ttl_s`).
    pub member_ttl_s: u64,
}

/// Phase delays after a window's end at 1 s windows (`core/src/window_clock.rs`):
/// fit and put +0.3 s, solve +0.55 s, read +0.7 s; longer windows cap them
/// at 0.3 / 1.5 / 2.5 s.
fn phases_ns(window_ns: i64) -> (i64, i64, i64) {
    let share = |cap: i64, pct: i64| cap.min(window_ns / 100 * pct);
    (
        share(300_000_000, 30),
        share(1_500_000_000, 55),
        share(2_500_000_000, 70),
    )
}

/// One member's result for one window, as its read at the fetch phase found it.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    /// The window's result: ms after the window's end (member's clock),
    /// |error| ns, within its bound.
    Got {
        after_end_ms: f64,
        err_ns: f64,
        covered: bool,
    },
    /// An older result or none: this window's result came too late.
    Missed,
}

/// What one member saw.
#[derive(Default)]
struct MemberLog {
    put_ms: Vec<f64>,
    /// Puts that completed after the leader's solve phase.
    late_puts: usize,
    get_ms: Vec<f64>,
    refresh_ms: Vec<f64>,
    outcomes: Vec<(u64, Outcome)>,
    errors: usize,
    put_bytes: u64,
    /// Registered again after its lease lapsed.
    rejoins: usize,
    get_bytes: u64,
    refresh_bytes: u64,
    /// Refreshes that found the whole list (a seat holder's), its place,
    /// or nothing yet.
    full_lists: usize,
    places: usize,
    pending: usize,
    /// The refresh (1st, 2nd, …) that first found its place.
    first_place_refresh: Option<usize>,
    /// Whether the last place it found had its edges in the whole graph.
    place_right: Option<bool>,
    /// What each refresh found (the fault runs' timeline).
    seen: Vec<Seen>,
    /// Its hand-outs as leader (after a failover), ms.
    led: Vec<f64>,
}

/// One refresh's view: when, whether it held a place (or the whole list),
/// and the leader it knew.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at_ns: i64,
    pub placed: bool,
    pub leader: Option<String>,
}

/// What the leader saw, per window.
#[derive(Default)]
struct LeaderLog {
    fetch_ms: Vec<f64>,
    fetch_bytes: Vec<f64>,
    fetched_snapshots: Vec<f64>,
    solve_ms: Vec<f64>,
    publish_ms: Vec<f64>,
    results: Vec<f64>,
    /// From the solve phase's start to the last result written, ms.
    solve_to_published_ms: Vec<f64>,
    errors: usize,
    cpu_s: f64,
    own: MemberLog,
    /// The relay exchange: the leader's refresh (its whole list, read by
    /// its watch) and its hand-out of the places that changed, ms.
    lead_refresh_ms: Vec<f64>,
    hand_out_ms: Vec<f64>,
    /// When its agent was killed (`--kill-leader-at`).
    killed_at_ns: Option<i64>,
}

/// The table's figures for one member count.
#[derive(Debug, Serialize)]
pub struct EtcdReport {
    /// `relay` or `store`: how fits and results travelled.
    pub exchange: &'static str,
    pub members: usize,
    pub windows: u64,
    pub window_s: u64,
    pub membership_every_s: u64,
    /// TTL of each member's lease, s.
    pub member_ttl_s: u64,
    pub members_per_connection: usize,
    pub etcd_connections: usize,
    pub degree: usize,
    pub mean_out_edges: f64,
    pub start_s: f64,
    /// Per window: requests etcd handled (grpc_server_handled_total), by method.
    pub etcd_requests_per_window: f64,
    pub etcd_requests_by_method_per_window: std::collections::BTreeMap<String, f64>,
    /// etcd's gRPC bytes in and out per window.
    pub etcd_rx_bytes_per_window: f64,
    pub etcd_tx_bytes_per_window: f64,
    /// Payload bytes the harness counted (keys + values), per window.
    pub harness_put_bytes_per_window: f64,
    pub harness_read_bytes_per_window: f64,
    pub put_edges_ms: Quantiles,
    pub read_result_ms: Quantiles,
    pub members_refresh_ms: Quantiles,
    pub fetch_ms: Quantiles,
    pub fetch_bytes: f64,
    pub solve_ms: Quantiles,
    pub put_results_ms: Quantiles,
    pub put_results_txns: usize,
    pub solve_start_to_published_ms: Quantiles,
    pub leader_cpu_cores: f64,
    pub late_puts_per_window: f64,
    /// Every member's result after its window's end, ms (those that got it).
    pub result_after_end_ms: Quantiles,
    /// Member-windows whose read found an older result (or none), share.
    pub missed_share: f64,
    pub member_windows: usize,
    pub abs_error_ns: Quantiles,
    pub coverage: f64,
    pub request_errors: usize,
    pub register_retries: usize,
    /// The relay exchange: the places the leader handed out.
    #[serde(flatten)]
    pub places: PlacesReport,
    /// etcd was restarted in the run: its counters (requests, bytes,
    /// fsyncs, CPU) cover only what followed.
    pub etcd_restarted: bool,
    /// The faults injected, as the members saw them (etcd's counters
    /// restart with it: its request figures then cover what followed).
    pub faults: Vec<FaultReport>,
    /// Members whose lease lapsed (a failed keep-alive) and that registered again.
    pub rejoins: usize,
    /// Mean WAL fsync and fsyncs per window.
    pub etcd_wal_fsync_ms: f64,
    pub etcd_wal_fsyncs_per_window: f64,
    pub etcd_backend_commit_ms: f64,
    pub etcd_cpu_cores: f64,
    pub etcd_rss_mib: f64,
    pub etcd_db_mib_start: f64,
    pub etcd_db_mib_end: f64,
    pub etcd_db_growth_mib_per_window: f64,
    pub etcd_keys: f64,
    pub etcd_compactions: f64,
    pub etcd_quota_mib: f64,
    pub harness_cpu_cores: f64,
    pub harness_rss_mib: f64,
}

/// The places the leader handed out (the relay exchange).
#[derive(Debug, Default, Serialize)]
pub struct PlacesReport {
    /// Members that ended the run holding the place the whole graph gives
    /// them (or, seat holders, the whole list).
    pub members_placed_right: usize,
    pub members_placed_wrong: usize,
    pub members_without_place: usize,
    pub seat_holders: usize,
    /// Which of a member's refreshes first found its place (1 = its first).
    pub refreshes_to_place: Quantiles,
    pub leader_refresh_ms: Quantiles,
    pub leader_hand_out_ms: Quantiles,
    /// Hand-outs by a seat holder that came to lead, ms.
    pub successor_hand_out_ms: Quantiles,
}

impl PlacesReport {
    fn of(logs: &[MemberLog], lead_refresh_ms: &[f64], hand_out_ms: &[f64]) -> Self {
        // Members that refreshed at all (not the leader's own log).
        let count = |f: &dyn Fn(&MemberLog) -> bool| {
            logs.iter()
                .filter(|l| !l.refresh_ms.is_empty() && f(l))
                .count()
        };
        PlacesReport {
            members_placed_right: count(&|l| l.place_right == Some(true)),
            members_placed_wrong: count(&|l| l.place_right == Some(false)),
            members_without_place: count(&|l| l.place_right.is_none() && l.full_lists == 0),
            seat_holders: count(&|l| l.place_right.is_none() && l.full_lists > 0),
            refreshes_to_place: Quantiles::of(
                logs.iter()
                    .filter_map(|l| l.first_place_refresh)
                    .map(|r| r as f64)
                    .collect(),
            ),
            leader_refresh_ms: Quantiles::of(lead_refresh_ms.to_vec()),
            leader_hand_out_ms: Quantiles::of(hand_out_ms.to_vec()),
            successor_hand_out_ms: Quantiles::default(),
        }
    }
}

/// A registered member and its etcd client.
struct Started {
    member: Member,
    disc: EtcdDiscovery,
}

fn member_name(i: usize) -> String {
    format!("node-{i:05}")
}

/// What a member announces (its probe address is never used here).
fn announced(i: usize) -> Member {
    let i = i as u32;
    Member {
        name: member_name(i as usize),
        id: 0,
        addr: std::net::Ipv4Addr::new(127, 78, (i >> 8) as u8, i as u8).into(),
        probe_port: 31900,
        capabilities: 0,
    }
}

/// A member's etcd settings: the agent's, but for the member lease's TTL
/// (`--member-ttl-s`; the agent's default unless asked).
fn etcd_cfg(endpoint: &str, cfg: &EtcdRunCfg) -> EtcdConfig {
    EtcdConfig {
        endpoints: vec![endpoint.to_owned()],
        cluster: "scale".into(),
        member_ttl_s: i64::try_from(cfg.member_ttl_s).unwrap_or(i64::MAX),
        campaign_ttl_s: ETCD_CAMPAIGN_TTL_S,
    }
}

async fn start_member(etcd: EtcdConfig, i: usize) -> anyhow::Result<Started> {
    let mut disc = EtcdDiscovery::connect(etcd)
        .await
        .with_context(|| format!("member {i}: connecting"))?;
    let member = register(&mut disc, i).await?;
    Ok(Started { member, disc })
}

/// Registrations that failed and were tried again (etcd overloaded by
/// the start: "request timed out"), over the run.
static REGISTER_RETRIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Registers member `i`, trying again after a failure as the agent does
/// at its next refresh (2 s), up to 10 times.
async fn register(disc: &mut EtcdDiscovery, i: usize) -> anyhow::Result<Member> {
    let mut tries = 0;
    loop {
        match disc.register(&announced(i)).await {
            Ok(m) => return Ok(m),
            Err(e) if tries < 10 => {
                tries += 1;
                REGISTER_RETRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                warn!(member = i, "registering failed, again in 2 s: {e}");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("member {i}: registering")),
        }
    }
}

/// Runs the bench for one member count against a fresh etcd.
pub fn run(cfg: &EtcdRunCfg) -> anyhow::Result<EtcdReport> {
    anyhow::ensure!(
        cfg.members >= 2,
        "--members: at least 2 (a leader and one more)"
    );
    let etcd = Arc::new(std::sync::Mutex::new(EtcdServer::start_with(
        &cfg.etcd_args,
    )?));
    let endpoint = etcd.lock().expect("etcd").endpoint.clone();
    let pid = || etcd.lock().map_or(0, |e| e.pid());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started_at = Instant::now();
    // The leader registers first, so its campaign wins, and runs on its own
    // thread: its solve is not scheduled behind the members' tasks.
    let (to_leader, leader_rx) = tokio::sync::oneshot::channel::<LeaderPlan>();
    let (leader_ready, from_leader) = mpsc::channel::<anyhow::Result<Member>>();
    let leader_etcd = etcd_cfg(&endpoint, cfg);
    let leader_cfg = cfg.clone();
    let leader = std::thread::Builder::new()
        .name("scale-leader".into())
        .spawn(move || leader_thread(leader_etcd, leader_cfg, leader_ready, leader_rx))?;
    let leader_member = from_leader
        .recv()
        .context("the leader thread ended before registering")??;
    let members = rt.block_on(start_members(&endpoint, cfg))?;
    let start_s = started_at.elapsed().as_secs_f64();
    info!(members = cfg.members, start_s, "all members registered");

    let mut all: Vec<Member> = members.iter().map(|s| s.member.clone()).collect();
    let leader_member_id = leader_member.id;
    all.push(leader_member);
    all.sort();
    let ids: Arc<Vec<u32>> = Arc::new(all.iter().map(|m| m.id).collect());
    let names: Arc<Vec<String>> = Arc::new(all.iter().map(|m| m.name.clone()).collect());
    let window_ns = i64::try_from(cfg.window_s)?.saturating_mul(1_000_000_000);
    let truth = Arc::new(Truth::generate(&ids, cfg.degree, cfg.seed, realtime_ns()));
    // Two windows of slack for the tasks to start.
    let first = (realtime_ns() / window_ns + 2) as u64;
    let last = first + cfg.windows - 1;
    let plan = Schedule {
        first,
        last,
        window_ns,
        truth: truth.clone(),
        ids: ids.clone(),
        names: names.clone(),
        warmup: cfg.warmup,
        membership_every_s: cfg.membership_every_s,
        exchange: cfg.exchange,
        degree: cfg.degree,
        kill_leader_at: cfg.kill_leader_at,
        places_after_kill: cfg
            .kill_leader_at
            .map(|_| Arc::new(places_without(&ids, leader_member_id, cfg.degree))),
    };
    to_leader
        .send(LeaderPlan {
            members: all.clone(),
            schedule: plan.clone(),
        })
        .map_err(|_| anyhow::anyhow!("the leader thread ended early"))?;

    let span_start = (first + cfg.settle_windows.clamp(1, cfg.windows - 1)) as i64 * window_ns;
    let restart = cfg
        .restart_etcd_at
        .map(|at| restart_at(etcd.clone(), plan.end_ns(first + at)));
    // The members run from the first window on; the counters are read
    // meanwhile (a member started late would run its windows back to back).
    let members_run = {
        let plan = plan.clone();
        rt.spawn(async move { run_members(members, &plan).await })
    };
    let before = rt.block_on(async {
        sleep_until_realtime(span_start - 20_000_000).await;
        Snapshot::take(&endpoint, pid())
    })?;
    let logs = rt.block_on(members_run)??;
    let after = Snapshot::take(&endpoint, pid())?;
    let leader_log = leader
        .join()
        .map_err(|_| anyhow::anyhow!("the leader thread panicked"))??;
    let faults = faults_seen(restart, &leader_log, &logs, plan.end_ns(first - 1))?;
    let took_over: Vec<f64> = logs.iter().flat_map(|l| l.led.iter().copied()).collect();
    drop(rt);
    let mut r = report(cfg, &truth, start_s, &before, &after, logs, leader_log);
    r.etcd_restarted = cfg.restart_etcd_at.is_some();
    r.faults = faults;
    r.places.successor_hand_out_ms = Quantiles::of(took_over);
    Ok(r)
}

/// Kills etcd at `when_ns` (realtime) and starts it again; the time it did.
fn restart_at(
    etcd: Arc<std::sync::Mutex<EtcdServer>>,
    when_ns: i64,
) -> std::thread::JoinHandle<anyhow::Result<i64>> {
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_nanos((when_ns - realtime_ns()).max(0) as u64));
        let at_ns = realtime_ns();
        let mut server = etcd.lock().map_err(|_| anyhow::anyhow!("etcd lock"))?;
        server.restart().map(|()| at_ns)
    })
}

/// Each fault of the run, as the members' refreshes saw it.
fn faults_seen(
    restart: Option<std::thread::JoinHandle<anyhow::Result<i64>>>,
    leader: &LeaderLog,
    logs: &[MemberLog],
    first_ns: i64,
) -> anyhow::Result<Vec<FaultReport>> {
    let mut faults = Vec::new();
    if let Some(r) = restart {
        let at_ns = r
            .join()
            .map_err(|_| anyhow::anyhow!("the restart thread panicked"))??;
        faults.push((Fault::EtcdRestarted, at_ns));
    }
    if let Some(at_ns) = leader.killed_at_ns {
        faults.push((Fault::LeaderKilled, at_ns));
    }
    let seen: Vec<&Seen> = logs.iter().flat_map(|l| &l.seen).collect();
    Ok(faults
        .into_iter()
        .map(|(what, at)| FaultReport::of(what, at, first_ns, &seen))
        .collect())
}

/// Registers members 1..N, `start_concurrency` groups at a time; each
/// group of `members_per_connection` shares one member's two connections
/// (1: every member its own, as agents have).
async fn start_members(endpoint: &str, cfg: &EtcdRunCfg) -> anyhow::Result<Vec<Started>> {
    let gate = Arc::new(Semaphore::new(cfg.start_concurrency.max(1)));
    let mut set = tokio::task::JoinSet::new();
    let per = cfg.members_per_connection.max(1);
    let ids: Vec<usize> = (1..cfg.members).collect();
    for group in ids.chunks(per) {
        let gate = gate.clone();
        let etcd = etcd_cfg(endpoint, cfg);
        let group = group.to_vec();
        set.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            start_group(etcd, group).await
        });
    }
    let mut started = Vec::with_capacity(cfg.members);
    while let Some(r) = set.join_next().await {
        started.extend(r??);
    }
    Ok(started)
}

/// The group's first member connects; the others register on its connections.
async fn start_group(etcd: EtcdConfig, group: Vec<usize>) -> anyhow::Result<Vec<Started>> {
    let Some((&first, rest)) = group.split_first() else {
        return Ok(Vec::new());
    };
    let head = start_member(etcd, first).await?;
    let mut out = Vec::with_capacity(group.len());
    for &i in rest {
        let mut disc = head.disc.share_connections();
        let member = register(&mut disc, i).await?;
        out.push(Started { member, disc });
    }
    out.push(head);
    Ok(out)
}

/// Each member's edges in the graph of `ids` without `gone`.
fn places_without(ids: &[u32], gone: u32, degree: usize) -> Vec<Neighbourhood> {
    let living: Vec<u32> = ids.iter().copied().filter(|&id| id != gone).collect();
    let graph = ProbeGraph::build(&living, degree);
    ids.iter().map(|&id| graph.neighbourhood(id)).collect()
}

/// The windows every member runs, and what it needs to make its fits.
#[derive(Clone)]
struct Schedule {
    first: u64,
    last: u64,
    window_ns: i64,
    truth: Arc<Truth>,
    ids: Arc<Vec<u32>>,
    names: Arc<Vec<String>>,
    warmup: u64,
    membership_every_s: u64,
    exchange: Exchange,
    degree: usize,
    kill_leader_at: Option<u64>,
    /// With the leader killed: each member's edges in the graph without it
    /// (its successor hands those out).
    places_after_kill: Option<Arc<Vec<Neighbourhood>>>,
}

impl Schedule {
    /// Whether `edges` are member `i`'s in the whole graph (or, after the
    /// leader's agent was killed, in the graph without it).
    fn placed_right(&self, i: usize, edges: &Neighbourhood) -> bool {
        *edges == *self.truth.place(i)
            || self
                .places_after_kill
                .as_ref()
                .is_some_and(|after| *edges == after[i])
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.names.binary_search_by(|n| n.as_str().cmp(name)).ok()
    }

    fn end_ns(&self, k: u64) -> i64 {
        (k as i64 + 1) * self.window_ns
    }

    /// Sleeps until member `i`'s clock reads `local_ns`.
    async fn sleep_until_local(&self, i: usize, local_ns: i64) {
        sleep_until_realtime(self.truth.true_at(i, local_ns)).await;
    }

    fn local_now(&self, i: usize) -> i64 {
        self.truth.local_at(i, realtime_ns())
    }

    /// Windows between a member's list-and-leader reads (0: none).
    fn refresh_every_windows(&self) -> u64 {
        let every_ns = self.membership_every_s as i64 * 1_000_000_000;
        (every_ns / self.window_ns.max(1)).max(1) as u64
    }
}

struct LeaderPlan {
    members: Vec<Member>,
    schedule: Schedule,
}

async fn run_members(started: Vec<Started>, plan: &Schedule) -> anyhow::Result<Vec<MemberLog>> {
    let mut set = tokio::task::JoinSet::new();
    for s in started {
        let i = plan
            .index_of(&s.member.name)
            .context("a member missing from the list")?;
        let plan = plan.clone();
        set.spawn(async move { member_loop(s.disc, i, &plan).await });
    }
    let mut logs = Vec::new();
    while let Some(r) = set.join_next().await {
        logs.push(r?);
    }
    Ok(logs)
}

/// One member's windows: put its fits at the fit phase, read its result
/// at the fetch phase, and (if asked) the member list and the leader at
/// its own phase, as the agent's runtime does.
async fn member_loop(disc: EtcdDiscovery, i: usize, plan: &Schedule) -> MemberLog {
    if plan.exchange == Exchange::Relay {
        return membership_loop(disc, i, plan).await;
    }
    store_loop(disc, i, plan).await
}

/// A member of the relay exchange, as etcd sees it: its lease kept alive,
/// its campaign, and its membership refresh (the member list and the
/// leader, read through the watches) every `membership_every_s`.
async fn membership_loop(mut disc: EtcdDiscovery, i: usize, plan: &Schedule) -> MemberLog {
    let mut log = MemberLog::default();
    let mut rng = Rng::new(plan.ids[i] as u64 ^ 0xA5A5);
    let every = plan.refresh_every_windows();
    let refresh_at = (rng.unit() * plan.window_ns as f64) as i64;
    let mut lead = Lead::default();
    for k in plan.first..=plan.last {
        if (k + i as u64).is_multiple_of(every) {
            plan.sleep_until_local(i, plan.end_ns(k) + refresh_at).await;
            let list = refresh(&mut disc, i, plan, &mut log).await;
            lead.hand_out_if_leader(&mut disc, list, plan, &mut log)
                .await;
        }
    }
    log
}

/// What the driver does as leader at each refresh, for the harness's
/// leader and for a seat holder that comes to lead (the leader's agent
/// killed): the graph of its whole list (built again only when the list
/// changes), every place handed out where it changed.
#[derive(Default)]
struct Lead {
    graph: Option<(Vec<Member>, ProbeGraph)>,
}

impl Lead {
    /// Hands out the places of `members`' graph; how long it took, ms
    /// (`errors` counts a failure).
    async fn hand_out(
        &mut self,
        disc: &mut EtcdDiscovery,
        members: Vec<Member>,
        plan: &Schedule,
        errors: &mut usize,
    ) -> f64 {
        if self.graph.as_ref().is_none_or(|(m, _)| *m != members) {
            let ids: Vec<u32> = members.iter().map(|m| m.id).collect();
            let graph = ProbeGraph::build(&ids, plan.degree);
            self.graph = Some((members, graph));
        }
        let t = Instant::now();
        if let Some((members, graph)) = &self.graph
            && let Err(e) = disc.hand_out(graph, members).await
        {
            *errors += 1;
            warn!("handing out places: {e}");
        }
        t.elapsed().as_secs_f64() * 1e3
    }

    /// A member's part: hands out if its refresh found it leading.
    async fn hand_out_if_leader(
        &mut self,
        disc: &mut EtcdDiscovery,
        list: Option<(Vec<Member>, bool)>,
        plan: &Schedule,
        log: &mut MemberLog,
    ) {
        if let Some((members, true)) = list {
            let ms = self.hand_out(disc, members, plan, &mut log.errors).await;
            log.led.push(ms);
        }
    }
}

/// A member of the store exchange: its fits put and its result read every
/// window, its refresh too if asked.
async fn store_loop(mut disc: EtcdDiscovery, i: usize, plan: &Schedule) -> MemberLog {
    let mut log = MemberLog::default();
    let mut rng = Rng::new(plan.ids[i] as u64 ^ 0xA5A5);
    let (fit, solve, fetch) = phases_ns(plan.window_ns);
    // Between this window's read and the next window's put, spread over
    // the members (an agent's refresh timer is not tied to the windows;
    // its loop is sequential, so a refresh never overlaps its own phases).
    let refresh_at = fetch
        + 50_000_000
        + (rng.unit() * (plan.window_ns + fit - fetch - 100_000_000) as f64) as i64;
    let every = plan.refresh_every_windows();
    let name = plan.names[i].clone();
    let reference = 0;
    for k in plan.first..=plan.last {
        let end = plan.end_ns(k);
        let snapshot = plan
            .truth
            .snapshot(i, k, plan.window_ns, &plan.ids, &plan.names, &mut rng);
        plan.sleep_until_local(i, end + fit).await;
        if !put_fits(&mut disc, &name, &snapshot, &mut log).await {
            // Its lease lapsed (a keep-alive stream that failed is not
            // restarted): the agent notices at its next membership refresh
            // and registers again under its id; so does the member here.
            if register(&mut disc, i).await.is_ok() {
                log.rejoins += 1;
            }
        }
        if plan.local_now(i) > end + solve {
            log.late_puts += 1;
        }
        plan.sleep_until_local(i, end + fetch).await;
        read_result(&mut disc, i, k, reference, plan, &mut log).await;
        if plan.membership_every_s > 0 && (k + i as u64).is_multiple_of(every) {
            plan.sleep_until_local(i, end + refresh_at).await;
            refresh(&mut disc, i, plan, &mut log).await;
        }
    }
    log
}

/// Puts the member's fits; false if its lease is gone.
async fn put_fits(
    disc: &mut EtcdDiscovery,
    name: &str,
    s: &pb::Snapshot,
    log: &mut MemberLog,
) -> bool {
    let t = Instant::now();
    match disc.put_edges(name, &codec::window_fits_from_pb(s)).await {
        Ok(()) => {
            log.put_ms.push(t.elapsed().as_secs_f64() * 1e3);
            log.put_bytes += (s.encoded_len() + name.len() + 22) as u64;
            true
        }
        Err(e) => {
            log.errors += 1;
            warn!(member = name, "put_edges: {e}");
            !e.to_string().contains("lease not found")
        }
    }
}

async fn read_result(
    disc: &mut EtcdDiscovery,
    i: usize,
    k: u64,
    reference: usize,
    plan: &Schedule,
    log: &mut MemberLog,
) {
    let t = Instant::now();
    let got = disc.my_result(&plan.names[i]).await;
    let after_end_ms = (plan.local_now(i) - plan.end_ns(k)) as f64 / 1e6;
    let r = match got {
        Ok(r) => {
            log.get_ms.push(t.elapsed().as_secs_f64() * 1e3);
            r
        }
        Err(e) => {
            log.errors += 1;
            warn!(member = %plan.names[i], "my_result: {e}");
            None
        }
    };
    log.get_bytes += r.as_ref().map_or(0, |r| codec::encode_result(r).len()) as u64;
    if k < plan.first + plan.warmup {
        return;
    }
    let outcome = match r.filter(|r| r.window == WindowIndex(k)) {
        Some(r) => {
            let (err_ns, covered) = plan.truth.score(i, reference, &codec::result_to_pb(&r));
            Outcome::Got {
                after_end_ms,
                err_ns,
                covered,
            }
        }
        None => Outcome::Missed,
    };
    log.outcomes.push((k, outcome));
}

/// The agent's membership refresh: what it needs of the membership (the
/// whole list, or its place), then the leader. The whole list, if it got
/// it, and whether it leads.
async fn refresh(
    disc: &mut EtcdDiscovery,
    i: usize,
    plan: &Schedule,
    log: &mut MemberLog,
) -> Option<(Vec<Member>, bool)> {
    let t = Instant::now();
    let mut list = None;
    match disc.membership().await {
        Ok(Membership::All(members)) => {
            list = Some(members.clone());
            note_membership(Membership::All(members), i, plan, log);
        }
        Ok(m) => note_membership(m, i, plan, log),
        // No longer listed: registers again, as the agent's driver does.
        Err(DiscoveryError::NotAMember(_)) => {
            if register(disc, i).await.is_ok() {
                log.rejoins += 1;
            }
        }
        Err(e) => {
            log.errors += 1;
            warn!("membership: {e}");
        }
    }
    let leadership = disc.leadership().await;
    if leadership.is_err() {
        log.errors += 1;
    }
    log.refresh_ms.push(t.elapsed().as_secs_f64() * 1e3);
    let leader = leadership.ok().and_then(|l| l.leader);
    log.seen.push(Seen {
        at_ns: realtime_ns(),
        placed: log.place_right == Some(true) || list.is_some(),
        leader: leader.clone(),
    });
    let me = &plan.names[i];
    list.map(|l| (l, leader.as_ref() == Some(me)))
}

fn note_membership(m: Membership, i: usize, plan: &Schedule, log: &mut MemberLog) {
    let refreshes = log.refresh_ms.len() + 1;
    match m {
        Membership::All(list) => {
            log.full_lists += 1;
            log.refresh_bytes += list.len() as u64 * 110;
        }
        Membership::Place(p) => {
            log.places += 1;
            log.refresh_bytes += p.members.len() as u64 * 110;
            log.first_place_refresh.get_or_insert(refreshes);
            log.place_right = Some(plan.placed_right(i, &p.edges));
        }
        Membership::Pending => log.pending += 1,
    }
}

/// The leader: its own thread and runtime, a real `core::Node` with the
/// store exchange ticked at its phases; the store actions it asks for are
/// carried out through its `EtcdDiscovery` as the agent's driver does.
fn leader_thread(
    etcd: EtcdConfig,
    cfg: EtcdRunCfg,
    ready: mpsc::Sender<anyhow::Result<Member>>,
    plan: tokio::sync::oneshot::Receiver<LeaderPlan>,
) -> anyhow::Result<LeaderLog> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let registered = rt.block_on(async {
        let mut s = start_member(etcd, 0).await?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !s.disc.leadership().await?.is_me {
            anyhow::ensure!(
                Instant::now() < deadline,
                "member 0 was not elected in 20 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(s)
    });
    let Started { member, mut disc } = match registered {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(anyhow::anyhow!("{e:#}")));
            return Err(e);
        }
    };
    let _ = ready.send(Ok(member.clone()));
    // Waited for on the runtime: its lease's keep-alive runs meanwhile
    // (the other members take a minute to start at 10,000).
    let LeaderPlan { members, schedule } = rt.block_on(plan).context("no plan for the leader")?;
    let settings = Settings {
        probe_window: clockmesh_core::time::Nanos::from_unsigned(cfg.window_s, 1_000_000_000),
        degree: cfg.degree,
        ..Settings::default()
    };
    let mut node = Node::new(NodeConfig {
        me: member.clone(),
        settings,
        key: None,
        exchange: Exchange::Store,
        nonce_base: 1 << 40,
        work_clock: monotonic_ns,
    });
    let i = schedule
        .index_of(&member.name)
        .context("the leader missing from the list")?;
    let _ = node
        .handle_members(members, LocalNs(schedule.local_now(i)))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    node.handle_leader(Some(member.name.clone()));
    let cpu0 = metrics::thread_cpu_s();
    let mut log = rt.block_on(leader_windows(&mut node, &mut disc, i, &schedule));
    log.cpu_s = metrics::thread_cpu_s() - cpu0;
    Ok(log)
}

fn monotonic_ns() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

async fn leader_windows(
    node: &mut Node,
    disc: &mut EtcdDiscovery,
    i: usize,
    plan: &Schedule,
) -> LeaderLog {
    let mut log = LeaderLog::default();
    if plan.exchange == Exchange::Relay {
        // Nothing per window through etcd: it follows the list and hands
        // out places, as the agent's driver does at each refresh.
        lead_membership(disc, i, plan, &mut log).await;
        if log.killed_at_ns.is_none() {
            plan.sleep_until_local(i, plan.end_ns(plan.last) + plan.window_ns)
                .await;
        }
        return log;
    }
    let (fit, solve, fetch) = phases_ns(plan.window_ns);
    let mut rng = Rng::new(0x1EAD);
    for k in plan.first..=plan.last {
        let end = plan.end_ns(k);
        for at in [fit, solve, fetch] {
            plan.sleep_until_local(i, end + at + 1_000_000).await;
            let started = Instant::now();
            let actions = node.handle_tick(LocalNs(plan.local_now(i)));
            let mut ctx = LeaderCtx {
                disc,
                i,
                plan,
                rng: &mut rng,
                log: &mut log,
            };
            ctx.perform(node, actions).await;
            if at == solve {
                log.solve_to_published_ms
                    .push(started.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    log
}

/// The leader's refreshes: its whole list, the graph it gives, every
/// member's place written where it changed (`Discovery::hand_out`).
async fn lead_membership(disc: &mut EtcdDiscovery, i: usize, plan: &Schedule, log: &mut LeaderLog) {
    let mut lead = Lead::default();
    let every = plan.refresh_every_windows();
    for k in (plan.first..=plan.last).filter(|k| k.is_multiple_of(every)) {
        plan.sleep_until_local(i, plan.end_ns(k) + 50_000_000).await;
        if plan.kill_leader_at.is_some_and(|at| k >= plan.first + at) {
            // Killed: no leave; its lease runs out after its TTL.
            log.killed_at_ns = Some(realtime_ns());
            return;
        }
        let t = Instant::now();
        let list = match disc.membership().await {
            Ok(Membership::All(members)) => Some(members),
            Ok(_) => None,
            Err(e) => {
                log.errors += 1;
                warn!("leader's membership: {e}");
                None
            }
        };
        if disc.leadership().await.is_err() {
            log.errors += 1;
        }
        log.lead_refresh_ms.push(t.elapsed().as_secs_f64() * 1e3);
        // A failed refresh hands out from the last list, as the driver does.
        let last = || lead.graph.as_ref().map(|(m, _)| m.clone());
        if let Some(members) = list.or_else(last) {
            let ms = lead.hand_out(disc, members, plan, &mut log.errors).await;
            log.hand_out_ms.push(ms);
        }
    }
}

struct LeaderCtx<'a> {
    disc: &'a mut EtcdDiscovery,
    i: usize,
    plan: &'a Schedule,
    rng: &'a mut Rng,
    log: &'a mut LeaderLog,
}

impl LeaderCtx<'_> {
    /// The agent driver's `perform`: the node's actions, and those their
    /// answers produce. Datagrams (handshakes to its probe peers) and
    /// history lines go nowhere here.
    async fn perform(&mut self, node: &mut Node, actions: Vec<Action>) {
        let mut queue = std::collections::VecDeque::from(actions);
        while let Some(a) = queue.pop_front() {
            queue.extend(self.perform_one(node, a).await);
        }
    }

    async fn perform_one(&mut self, node: &mut Node, action: Action) -> Vec<Action> {
        let name = node.me().name.clone();
        match action {
            // The leader's own fits are the truth's, like every member's.
            Action::PutFits(s) => {
                let snapshot = self.plan.truth.snapshot(
                    self.i,
                    s.window.0,
                    self.plan.window_ns,
                    &self.plan.ids,
                    &self.plan.names,
                    self.rng,
                );
                let _ = put_fits(self.disc, &name, &snapshot, &mut self.log.own).await;
            }
            Action::FetchFits { window } => {
                let t = Instant::now();
                let snapshots = match self.disc.fetch_edges().await {
                    Ok(s) => s,
                    Err(e) => {
                        self.log.errors += 1;
                        warn!("fetch_edges: {e}");
                        return Vec::new();
                    }
                };
                self.log.fetch_ms.push(t.elapsed().as_secs_f64() * 1e3);
                let bytes: usize = snapshots
                    .iter()
                    .map(|s| codec::encode_window_fits(s).len())
                    .sum();
                self.log.fetch_bytes.push(bytes as f64);
                self.log.fetched_snapshots.push(snapshots.len() as f64);
                let t = Instant::now();
                let actions = node.solve_snapshots(window, &snapshots);
                self.log.solve_ms.push(t.elapsed().as_secs_f64() * 1e3);
                return actions;
            }
            Action::PutResults { results, .. } => {
                let t = Instant::now();
                match self.disc.put_results(&results).await {
                    Ok(()) => {
                        self.log.publish_ms.push(t.elapsed().as_secs_f64() * 1e3);
                        self.log.results.push(results.len() as f64);
                    }
                    Err(e) => {
                        self.log.errors += 1;
                        warn!("put_results: {e}");
                    }
                }
            }
            Action::FetchResult => match self.disc.my_result(&name).await {
                Ok(r) => return node.handle_result(r),
                Err(e) => {
                    self.log.errors += 1;
                    warn!("leader's my_result: {e}");
                }
            },
            _ => {}
        }
        Vec::new()
    }
}

/// etcd's and the harness's counters at one instant.
struct Snapshot {
    etcd: EtcdMetrics,
    etcd_cpu_s: f64,
    harness_cpu_s: f64,
    etcd_rss_mib: f64,
    at: Instant,
}

impl Snapshot {
    fn take(endpoint: &str, pid: u32) -> anyhow::Result<Self> {
        Ok(Snapshot {
            etcd: EtcdMetrics::scrape(endpoint)?,
            etcd_cpu_s: metrics::cpu_s(&format!("/proc/{pid}/stat"))?,
            harness_cpu_s: metrics::cpu_s("/proc/self/stat")?,
            etcd_rss_mib: metrics::rss_mib(pid)?,
            at: Instant::now(),
        })
    }
}

/// The results members got (ms after the window's end, |error| ns, within
/// the bound), and how many member-windows missed theirs.
fn got_and_missed(logs: &[MemberLog]) -> (Vec<(f64, f64, bool)>, usize) {
    let outcomes: Vec<Outcome> = logs
        .iter()
        .flat_map(|l| l.outcomes.iter().map(|o| o.1))
        .collect();
    let got: Vec<(f64, f64, bool)> = outcomes
        .iter()
        .filter_map(|o| match *o {
            Outcome::Got {
                after_end_ms,
                err_ns,
                covered,
            } => Some((after_end_ms, err_ns, covered)),
            Outcome::Missed => None,
        })
        .collect();
    let missed = outcomes.len() - got.len();
    (got, missed)
}

#[allow(clippy::too_many_arguments)]
fn report(
    cfg: &EtcdRunCfg,
    truth: &Truth,
    start_s: f64,
    before: &Snapshot,
    after: &Snapshot,
    mut logs: Vec<MemberLog>,
    leader: LeaderLog,
) -> EtcdReport {
    let windows = cfg.windows as f64;
    let wall_s = after.at.duration_since(before.at).as_secs_f64().max(1e-3);
    // Counters are per window over the span the windows ran in.
    let per_window = |v: f64| v / wall_s * cfg.window_s as f64;
    let delta = |name: &str| EtcdMetrics::delta(&before.etcd, &after.etcd, name);
    let mut by_method = std::collections::BTreeMap::new();
    for (m, v) in &after.etcd.handled_by_method {
        let d = v - before.etcd.handled_by_method.get(m).copied().unwrap_or(0.0);
        if d > 0.0 {
            by_method.insert(m.clone(), per_window(d));
        }
    }
    logs.push(leader.own);
    let collect = |f: &dyn Fn(&MemberLog) -> &Vec<f64>| -> Vec<f64> {
        logs.iter().flat_map(|l| f(l).iter().copied()).collect()
    };
    let (got, missed) = got_and_missed(&logs);
    let db = |m: &EtcdMetrics| m.get("etcd_mvcc_db_total_size_in_bytes") / (1 << 20) as f64;
    let sum_u = |f: &dyn Fn(&MemberLog) -> u64| logs.iter().map(f).sum::<u64>() as f64;
    let txns = cfg.members.div_ceil(128);
    EtcdReport {
        exchange: match cfg.exchange {
            Exchange::Relay => "relay",
            Exchange::Store => "store",
        },
        members: cfg.members,
        windows: cfg.windows,
        window_s: cfg.window_s,
        membership_every_s: cfg.membership_every_s,
        member_ttl_s: cfg.member_ttl_s,
        members_per_connection: cfg.members_per_connection,
        etcd_connections: 2 * (cfg.members - 1).div_ceil(cfg.members_per_connection.max(1)) + 2,
        degree: cfg.degree,
        mean_out_edges: (0..truth.len()).map(|i| truth.out_degree(i)).sum::<usize>() as f64
            / truth.len().max(1) as f64,
        start_s,
        etcd_requests_per_window: per_window(delta("grpc_server_handled_total")),
        etcd_requests_by_method_per_window: by_method,
        etcd_rx_bytes_per_window: per_window(delta(
            "etcd_network_client_grpc_received_bytes_total",
        )),
        etcd_tx_bytes_per_window: per_window(delta("etcd_network_client_grpc_sent_bytes_total")),
        harness_put_bytes_per_window: sum_u(&|l| l.put_bytes) / windows,
        harness_read_bytes_per_window: (sum_u(&|l| l.get_bytes + l.refresh_bytes)
            + leader.fetch_bytes.iter().sum::<f64>())
            / windows,
        put_edges_ms: Quantiles::of(collect(&|l| &l.put_ms)),
        read_result_ms: Quantiles::of(collect(&|l| &l.get_ms)),
        members_refresh_ms: Quantiles::of(collect(&|l| &l.refresh_ms)),
        fetch_ms: Quantiles::of(leader.fetch_ms.clone()),
        fetch_bytes: mean(&leader.fetch_bytes),
        solve_ms: Quantiles::of(leader.solve_ms.clone()),
        put_results_ms: Quantiles::of(leader.publish_ms.clone()),
        put_results_txns: txns,
        solve_start_to_published_ms: Quantiles::of(leader.solve_to_published_ms.clone()),
        leader_cpu_cores: leader.cpu_s / wall_s,
        late_puts_per_window: logs.iter().map(|l| l.late_puts).sum::<usize>() as f64 / windows,
        result_after_end_ms: Quantiles::of(got.iter().map(|g| g.0).collect()),
        missed_share: missed as f64 / (got.len() + missed).max(1) as f64,
        member_windows: got.len() + missed,
        abs_error_ns: Quantiles::of(got.iter().map(|g| g.1).collect()),
        coverage: got.iter().filter(|g| g.2).count() as f64 / got.len().max(1) as f64,
        request_errors: logs.iter().map(|l| l.errors).sum::<usize>() + leader.errors,
        rejoins: logs.iter().map(|l| l.rejoins).sum(),
        places: PlacesReport::of(&logs, &leader.lead_refresh_ms, &leader.hand_out_ms),
        etcd_restarted: false,
        faults: Vec::new(),
        register_retries: REGISTER_RETRIES.swap(0, std::sync::atomic::Ordering::Relaxed),
        etcd_wal_fsync_ms: ms_per(
            delta("etcd_disk_wal_fsync_duration_seconds_sum"),
            delta("etcd_disk_wal_fsync_duration_seconds_count"),
        ),
        etcd_wal_fsyncs_per_window: per_window(delta("etcd_disk_wal_fsync_duration_seconds_count")),
        etcd_backend_commit_ms: ms_per(
            delta("etcd_disk_backend_commit_duration_seconds_sum"),
            delta("etcd_disk_backend_commit_duration_seconds_count"),
        ),
        etcd_cpu_cores: (after.etcd_cpu_s - before.etcd_cpu_s) / wall_s,
        etcd_rss_mib: after.etcd_rss_mib,
        etcd_db_mib_start: db(&before.etcd),
        etcd_db_mib_end: db(&after.etcd),
        etcd_db_growth_mib_per_window: per_window(db(&after.etcd) - db(&before.etcd)),
        etcd_keys: after.etcd.get("etcd_debugging_mvcc_keys_total"),
        etcd_compactions: delta("etcd_debugging_mvcc_db_compaction_keys_total"),
        etcd_quota_mib: after.etcd.get("etcd_server_quota_backend_bytes") / (1 << 20) as f64,
        harness_cpu_cores: (after.harness_cpu_s - before.harness_cpu_s) / wall_s,
        harness_rss_mib: metrics::rss_mib(std::process::id()).unwrap_or(0.0),
    }
}

fn ms_per(sum_s: f64, count: f64) -> f64 {
    if count > 0.0 {
        sum_s / count * 1e3
    } else {
        0.0
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}
