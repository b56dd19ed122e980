//! A cluster of `clockmesh agent` processes, one per test host, with etcd in
//! the switch namespace and a known clock skew injected into every agent.
//!
//! All test hosts share one kernel clock, so the injected skew is the exact
//! truth: node `i` behaves as if its clock read `t + skew_i(t)`, and the
//! offset the agents should find for node `i` is `skew_i − skew_reference`.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clockmesh::{
    config::InjectedSkew,
    runtime::{http, status::Status},
};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde::{Deserialize, Serialize};

use crate::{
    etcd::EtcdServer,
    netns::{HOST_IFACE, NETNS_DIR, Testbed},
};

pub const PROBE_PORT: u16 = 31_900;
pub const METRICS_PORT: u16 = 9_977;

/// A cluster's directory (agent logs, JSONL histories, `report.html`) is
/// `<temp dir>/<RUN_DIR_PREFIX><host 0's namespace>`.
const RUN_DIR_PREFIX: &str = "clockmesh-cluster-";
/// Finished runs' directories kept for reading afterwards; older ones are
/// removed when a cluster starts, so that runs do not pile up.
const KEPT_FINISHED_RUNS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Etcd,
    Static,
}

#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub nodes: usize,
    pub backend: Backend,
    pub cadence_us: u64,
    pub window_s: u64,
    pub degree: usize,
    /// Inject the per-node skews of [`skew_of`]; otherwise the truth is 0.
    pub inject_skew: bool,
    /// Shared HMAC key for every agent.
    pub auth_key: Option<Vec<u8>>,
    /// Two nodes only: one veth pair instead of a bridge (the lowest-noise
    /// path); etcd then runs in host 0's namespace.
    pub direct_pair: bool,
    /// Appended to every agent's command line.
    pub extra_args: Vec<String>,
    /// With `inject_skew`: each node's frequency also wanders (a seeded
    /// random walk, ppb per √s; 0 = none).
    pub wander_ppb_per_sqrt_s: f64,
    /// With `inject_skew`: (offset ns, drift ppb) per node instead of
    /// [`skew_of`]'s.
    pub skews: Vec<(i64, f64)>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            nodes: 4,
            backend: Backend::Etcd,
            cadence_us: 10_000,
            window_s: 2,
            degree: 4,
            inject_skew: true,
            auth_key: None,
            direct_pair: false,
            extra_args: Vec::new(),
            wander_ppb_per_sqrt_s: 0.0,
            skews: Vec::new(),
        }
    }
}

/// A deterministic skew for node `i`: offset within ±1 ms, drift within ±20 ppm.
pub fn skew_of(i: usize, epoch_ns: i64) -> InjectedSkew {
    let i = i as i64;
    InjectedSkew {
        offset_ns: ((i * 7919 + 311) % 2001 - 1000) * 1_000,
        drift_ppb: (((i * 104_729 + 17) % 41) - 20) as f64 * 1_000.0,
        epoch_ns,
        wander_ppb_per_sqrt_s: 0.0,
        wander_seed: i as u64 + 1,
    }
}

pub struct Cluster {
    pub cfg: ClusterConfig,
    pub bed: Testbed,
    pub dir: PathBuf,
    pub skews: Vec<InjectedSkew>,
    agents: Vec<Option<Child>>,
    bin: PathBuf,
    // Dropped last: agents leave etcd before it stops.
    etcd: Option<EtcdServer>,
}

/// A node result line of an agent's JSONL: the one type the agent writes
/// and `trace merge` reads.
pub use clockmesh::publish::history::HistoryEntry as NodeLine;

/// One node-window checked against the truth. Offsets are global − local
/// (the reference's clock minus this node's), as everywhere in clockmesh.
#[derive(Clone, Debug, Serialize)]
pub struct Checked {
    pub node: String,
    pub window: u64,
    pub reference: String,
    pub estimated_ns: i64,
    pub true_ns: f64,
    pub error_ns: f64,
    pub bound_ns: u64,
}

impl Checked {
    pub fn covered(&self) -> bool {
        self.error_ns.abs() <= self.bound_ns as f64
    }
}

/// The `clockmesh` binary next to this executable (`target/<profile>/`), or `CLOCKMESH_BIN`.
pub fn agent_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("CLOCKMESH_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("executable has no directory")?;
    if dir.ends_with("deps") {
        dir = dir.parent().context("deps has no parent")?;
    }
    let bin = dir.join("clockmesh");
    anyhow::ensure!(
        bin.exists(),
        "{} not built (cargo build -p clockmesh)",
        bin.display()
    );
    Ok(bin)
}

impl Cluster {
    /// Creates the hosts and etcd (if asked) and starts every agent.
    pub fn start(cfg: ClusterConfig) -> anyhow::Result<Self> {
        let bed = if cfg.direct_pair && cfg.nodes == 2 {
            Testbed::pair()?
        } else {
            Testbed::switched(cfg.nodes)?
        };
        let etcd = match cfg.backend {
            Backend::Etcd => Some(EtcdServer::start_in(
                &bed.switch_host().unwrap_or_else(|| bed.host(0).clone()),
            )?),
            Backend::Static => None,
        };
        let tmp = std::env::temp_dir();
        prune_finished_runs(&tmp, Path::new(NETNS_DIR), KEPT_FINISHED_RUNS);
        let dir = tmp.join(format!("{RUN_DIR_PREFIX}{}", bed.host(0).netns));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        if let Some(key) = &cfg.auth_key {
            std::fs::write(dir.join("auth.key"), key)?;
        }
        let epoch = clockmesh::publish::realtime_now_ns().0;
        let skews = (0..cfg.nodes)
            .map(|i| {
                if cfg.inject_skew {
                    let mut s = InjectedSkew {
                        wander_ppb_per_sqrt_s: cfg.wander_ppb_per_sqrt_s,
                        ..skew_of(i, epoch)
                    };
                    if let Some(&(offset_ns, drift_ppb)) = cfg.skews.get(i) {
                        (s.offset_ns, s.drift_ppb) = (offset_ns, drift_ppb);
                    }
                    s
                } else {
                    InjectedSkew {
                        offset_ns: 0,
                        drift_ppb: 0.0,
                        epoch_ns: epoch,
                        wander_ppb_per_sqrt_s: 0.0,
                        wander_seed: 0,
                    }
                }
            })
            .collect();
        let mut cluster = Cluster {
            agents: (0..cfg.nodes).map(|_| None).collect(),
            bin: agent_binary()?,
            cfg,
            bed,
            dir,
            skews,
            etcd,
        };
        for i in 0..cluster.cfg.nodes {
            cluster.start_agent(i)?;
        }
        Ok(cluster)
    }

    pub fn name(i: usize) -> String {
        format!("n{i}")
    }

    pub fn node_dir(&self, i: usize) -> PathBuf {
        self.dir.join(Self::name(i))
    }

    fn metrics_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::new(self.bed.host(i).addr.into(), METRICS_PORT)
    }

    /// The agent command line for node `i`.
    pub fn agent_args(&self, i: usize) -> Vec<String> {
        let c = &self.cfg;
        let node_dir = self.node_dir(i);
        let mut args: Vec<String> = vec![
            "agent".into(),
            "--interface".into(),
            HOST_IFACE.into(),
            "--node-name".into(),
            Self::name(i),
            "--probe-cadence-us".into(),
            c.cadence_us.to_string(),
            "--probe-window-s".into(),
            c.window_s.to_string(),
            "--degree".into(),
            c.degree.to_string(),
            "--output-dir".into(),
            node_dir.display().to_string(),
            "--offsets-path".into(),
            node_dir.join("offsets").display().to_string(),
            "--metrics-addr".into(),
            self.metrics_addr(i).to_string(),
        ];
        match (&self.etcd, c.backend) {
            (Some(e), Backend::Etcd) => args.extend([
                "--discovery".into(),
                "etcd".into(),
                "--etcd-endpoints".into(),
                format!("http://{}", e.endpoint),
                "--cluster".into(),
                "test".into(),
                // The tests wait for killed and cut-off agents to drop out
                // of the list: a 10 s member lease keeps them short (the
                // default 30 s saves etcd work at thousands of members).
                "--etcd-member-ttl-s".into(),
                "10".into(),
            ]),
            _ => {
                let members: Vec<String> = (0..c.nodes)
                    .map(|j| format!("{}={}:{PROBE_PORT}", Self::name(j), self.bed.host(j).addr))
                    .collect();
                args.extend(["--members".into(), members.join(",")]);
            }
        }
        if c.inject_skew {
            let s = self.skews[i];
            args.extend([
                "--inject-skew".into(),
                format!(
                    "{},{},{},{},{}",
                    s.offset_ns, s.drift_ppb, s.epoch_ns, s.wander_ppb_per_sqrt_s, s.wander_seed
                ),
            ]);
        }
        if c.auth_key.is_some() {
            args.extend([
                "--auth-key-file".into(),
                self.dir.join("auth.key").display().to_string(),
            ]);
        }
        args.extend(c.extra_args.iter().cloned());
        args
    }

    /// Starts (or restarts) the agent of node `i`; its log goes to `<dir>/n<i>.log`.
    pub fn start_agent(&mut self, i: usize) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", Self::name(i))))?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.bed.host(i).netns])
            .arg(&self.bin)
            .args(self.agent_args(i))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting clockmesh agent")?;
        self.agents[i] = Some(child);
        Ok(())
    }

    /// Sends `signal` to agent `i` and waits for it to exit (SIGKILL after 10 s).
    pub fn stop_agent(&mut self, i: usize, signal: Signal) -> anyhow::Result<()> {
        let Some(mut child) = self.agents[i].take() else {
            return Ok(());
        };
        let _ = kill(Pid::from_raw(child.id() as i32), signal);
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    pub fn pid(&self, i: usize) -> Option<u32> {
        self.agents[i].as_ref().map(Child::id)
    }

    /// `true` while agent `i` runs.
    pub fn running(&mut self, i: usize) -> bool {
        self.agents[i]
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// GET `path` from agent `i`'s HTTP endpoint (from inside its namespace).
    pub fn http_get(&self, i: usize, path: &str) -> anyhow::Result<(u16, String)> {
        let addr = self.metrics_addr(i);
        let path = path.to_owned();
        Ok(self.bed.host(i).run(move || http::get(addr, &path))??)
    }

    pub fn status(&self, i: usize) -> anyhow::Result<Status> {
        let (code, body) = self.http_get(i, "/status")?;
        anyhow::ensure!(code == 200, "/status answered {code}");
        Ok(serde_json::from_str(&body)?)
    }

    /// Every node line agent `i` wrote.
    pub fn node_lines(&self, i: usize) -> Vec<NodeLine> {
        jsonl_records(&self.node_dir(i).join("clockmesh.jsonl"), "node")
    }

    /// Every hand-over line agent `i` wrote (it took the timeline over).
    pub fn hand_overs(&self, i: usize) -> Vec<HandOver> {
        jsonl_records(&self.node_dir(i).join("clockmesh.jsonl"), "handover")
    }

    /// The carry reference `r` published window `window` under: its last
    /// hand-over line (a hand-over, or a pin to the timeline's origin) at
    /// or before it, if it carried one.
    pub fn carry_in_force(&self, r: usize, window: u64) -> Option<HandOver> {
        HandOver::in_force(&self.hand_overs(r), window)
            .filter(|h| h.carried_offset_ns.is_some())
            .cloned()
    }

    /// What reference `r` carried when it last took the timeline over, if
    /// it did.
    fn carry_of(&self, r: usize) -> Option<HandOver> {
        self.hand_overs(r)
            .into_iter()
            .rev()
            .find(|h| h.is_hand_over() && h.carried_offset_ns.is_some())
    }

    /// How far the timeline stepped when agent `new` took it over from
    /// agent `old` (true values at the hand-over), and the bound `new`
    /// carried; `None` if `new` carried nothing.
    pub fn hand_over_step(&self, new: usize, old: usize) -> Option<(f64, u64)> {
        let h = self.carry_of(new)?;
        let local = h.carried_anchor_ns? + self.cfg.window_s as i64 * 1_000_000_000;
        let t = local - self.skews[new].at(local);
        let new_timeline = self.skews[new].at(t) as f64 + carried_offset_at(&h, local);
        let old_timeline = self.skews[old].at(t) as f64;
        Some((new_timeline - old_timeline, h.carried_bound_ns?))
    }

    /// Checks every node line of every agent (except the reference's own)
    /// against the injected truth.
    pub fn check_all(&self) -> Vec<Checked> {
        let index: BTreeMap<String, usize> =
            (0..self.cfg.nodes).map(|i| (Self::name(i), i)).collect();
        let mut out = Vec::new();
        for i in 0..self.cfg.nodes {
            for l in self.node_lines(i) {
                let Some(&r) = l.reference.as_ref().and_then(|name| index.get(name)) else {
                    continue;
                };
                if r == i {
                    continue; // the reference's offset is 0 by definition
                }
                out.push(self.check(i, r, &l));
            }
        }
        out
    }

    fn check(&self, i: usize, r: usize, l: &NodeLine) -> Checked {
        // The anchor is on node i's clock; undo its skew to get true time.
        let local = l.anchor_ns;
        let t = local - self.skews[i].at(local);
        // global − local, global being the reference's clock plus what it
        // carried in that window (docs/coordination.md).
        let reference_local = t + self.skews[r].at(t);
        let carried = self
            .carry_in_force(r, l.window)
            .map_or(0.0, |h| carried_offset_at(&h, reference_local));
        let truth = (self.skews[r].at(t) - self.skews[i].at(t)) as f64 + carried;
        let estimated = l.offset_ns;
        Checked {
            node: l.host.clone(),
            window: l.window,
            reference: l.reference.clone().unwrap_or_default(),
            estimated_ns: estimated,
            true_ns: truth,
            error_ns: estimated as f64 - truth,
            bound_ns: l.bound_ns,
        }
    }

    /// Waits until `pred` holds (polling every 500 ms) or `timeout` passes.
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        what: &str,
        mut pred: impl FnMut(&mut Self) -> bool,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if pred(self) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!(
            "timed out after {timeout:?} waiting for {what}; logs in {}",
            self.dir.display()
        )
    }

    /// CPU seconds (user + system) and RSS (KiB) of agent `i`.
    pub fn usage(&self, i: usize) -> Option<(f64, u64)> {
        let pid = self.pid(i)?;
        let cpu = process_cpu_seconds(pid)?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let rss = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())?;
        Some((cpu, rss))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.agents.len() {
            let _ = self.stop_agent(i, Signal::SIGTERM);
        }
    }
}

/// Removes the directories of finished runs under `tmp` but the `keep`
/// newest. A run is finished once its host 0's namespace is gone from
/// `netns_dir` (its testbed deletes it on drop; a crashed run's is removed
/// by the next testbed), so a run still going keeps its directory.
fn prune_finished_runs(tmp: &Path, netns_dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let mut finished: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let netns = name.strip_prefix(RUN_DIR_PREFIX)?;
            if netns_dir.join(netns).exists() {
                return None;
            }
            Some((e.metadata().ok()?.modified().ok()?, e.path()))
        })
        .collect();
    finished.sort_by_key(|(modified, _)| std::cmp::Reverse(*modified));
    for (_, dir) in finished.into_iter().skip(keep) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// CPU seconds (user + system) process `pid` has used so far.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    let used = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(used as f64 / ticks as f64)
}

/// Records of one `type` from a JSONL file (missing file: none).
pub fn jsonl_records<T: for<'de> Deserialize<'de>>(path: &Path, kind: &str) -> Vec<T> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == kind)
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect()
}

/// A `"type": "handover"` line (the agent's own type): a new leader
/// continued the global timeline by adding its own last offset (global −
/// local) and drift.
pub use clockmesh_core::timeline::HandOverLine as HandOver;

/// The carried offset at the new leader's local time `local_ns`, computed
/// here from the line's fields rather than by the core's `Carry`, so a
/// wrong formula there cannot pass both sides of the check.
pub fn carried_offset_at(h: &HandOver, local_ns: i64) -> f64 {
    let (Some(anchor), Some(offset)) = (h.carried_anchor_ns, h.carried_offset_ns) else {
        return 0.0;
    };
    let drift = h.carried_drift_ppb.unwrap_or(0.0);
    offset as f64 + drift * 1e-9 * (local_ns - anchor) as f64
}

/// p-quantile (0..=1) of `v` by nearest rank; `None` when empty.
pub fn quantile(v: &[f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
    Some(s[rank - 1])
}

/// True CLOCK_REALTIME (ns) at which a clock skewed by `skew` read `local`
/// (the skew inverted by fixed-point iteration; it changes by ppm).
pub fn true_time(skew: &InjectedSkew, local: i64) -> i64 {
    let mut t = local - skew.at(local);
    for _ in 0..3 {
        t = local - skew.at(t);
    }
    t
}

/// The exit status, or `None` (and the process killed) past `limit`: a
/// rank whose peer died would wait for it forever.
pub fn wait_at_most(
    child: &mut Child,
    limit: Duration,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait()? {
            return Ok(Some(s));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    fn run_dir(tmp: &Path, netns: &str, age_s: u64) -> PathBuf {
        let dir = tmp.join(format!("{RUN_DIR_PREFIX}{netns}"));
        std::fs::create_dir_all(dir.join("n0")).unwrap();
        let modified = SystemTime::now() - Duration::from_secs(age_s);
        std::fs::File::open(&dir)
            .unwrap()
            .set_modified(modified)
            .unwrap();
        dir
    }

    #[test]
    fn finished_runs_beyond_the_newest_kept_are_removed_and_running_ones_stay() {
        let root = std::env::temp_dir().join(format!("cm-prune-test-{}", std::process::id()));
        let (tmp, netns) = (root.join("tmp"), root.join("netns"));
        std::fs::create_dir_all(&netns).unwrap();
        let finished: Vec<PathBuf> = (0..5)
            .map(|i| run_dir(&tmp, &format!("cmtb-1-{i}-h0"), 100 * (i + 1)))
            .collect();
        // The oldest of all, but its namespace is still there: running.
        let running = run_dir(&tmp, "cmtb-2-0-h0", 10_000);
        std::fs::write(netns.join("cmtb-2-0-h0"), b"").unwrap();
        let unrelated = tmp.join("some-other-dir");
        std::fs::create_dir_all(&unrelated).unwrap();

        prune_finished_runs(&tmp, &netns, 3);

        let kept: Vec<bool> = finished.iter().map(|d| d.exists()).collect();
        assert_eq!(kept, [true, true, true, false, false], "the 3 newest stay");
        assert!(running.exists(), "a running cluster keeps its directory");
        assert!(unrelated.exists(), "only run directories are touched");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
