//! `clockmesh-demo bench-chrony` (`cargo xtask bench-chrony`): chrony and
//! clockmesh side by side on one veth pair between two network namespaces,
//! at the same time. Both namespaces share one kernel clock, so the true
//! offset is 0 and each tool's estimate is its own error.
//!
//! chrony: Debian's `chronyd -x` (never touches the clock) as server in
//! host 0 and client in host 1, 16 Hz polling, interleaved mode, kernel
//! timestamps. clockmesh: two agents at the shipped defaults (static
//! membership; host 0 leads). After the warm-up both are sampled once per
//! second at the same instant: chrony's current tracking offset, clockmesh's
//! published map of host 1 evaluated at that instant.
//!
//! ptp4l (linuxptp, `ptp.rs`): master in host 0, a free-running slave-only
//! client in host 1, software stamps, UDPv4 unicast, 16 Hz; sampled at the
//! same instants: the latest offset it reported, negated into a correction.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clockmesh::publish::{OffsetsReader, realtime_now_ns};
use clockmesh_core::tally::StampTally;
use clockmesh_testbed::{
    cluster::{Backend, Cluster, ClusterConfig, process_cpu_seconds, quantile},
    load::{Flow, Load},
    netns::Host,
};
use serde::Serialize;

use crate::ptp::{self, ClockUntouched, PtpSamples};

#[derive(clap::Args, Debug)]
pub struct ChronyArgs {
    /// Seconds sampled per run, after the warm-up.
    #[arg(long, default_value_t = 240)]
    duration: u64,
    /// Seconds both tools run before sampling starts.
    #[arg(long, default_value_t = 40)]
    warmup: u64,
    /// Load both cores (two busy threads) and send UDP cross-traffic over the pair.
    #[arg(long)]
    load: bool,
    /// clockmesh's probe cadence, µs (default: the agent's default).
    #[arg(long)]
    cadence_us: Option<u64>,
    /// clockmesh's estimation window, s (default: the agent's default).
    #[arg(long, default_value_t = clockmesh_core::setting::PROBE_WINDOW_S.units(clockmesh_core::setting::PROBE_WINDOW_S.default_value()))]
    window_s: u64,
    /// Runs; the summary is the median over them.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
}

/// One tool's figures in one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ToolFigures {
    pub samples: usize,
    pub p50_ns: f64,
    pub p99_ns: f64,
    pub max_ns: f64,
    /// CPU of the tool's processes over the sampled period, % of one core.
    pub cpu_percent: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunFigures {
    pub chrony: ToolFigures,
    pub clockmesh: ToolFigures,
    /// ptp4l's client: the latest offset it reported before each instant.
    pub ptp4l: ToolFigures,
    /// Instants at which ptp4l's client had no offset to give.
    pub ptp4l_unavailable: usize,
    /// Age of ptp4l's latest report at the instants, s (median, max): it
    /// reports once a second.
    pub ptp4l_report_age_p50_s: f64,
    pub ptp4l_report_age_max_s: f64,
    /// Fraction of clockmesh samples whose |error| is inside the published bound.
    pub clockmesh_coverage: f64,
    pub clockmesh_median_bound_ns: f64,
    /// Samples at which clockmesh had no valid record.
    pub clockmesh_unavailable: usize,
    /// chrony p99 / clockmesh p99 (> 1: clockmesh is more accurate), a
    /// lower limit when clockmesh's p99 is below the reader's resolution.
    pub p99_ratio: f64,
    /// Which stamps host 1's agent used, by side and source (its `/status`).
    pub clockmesh_stamps: StampTally,
    /// CPU per coded pair sent (both agents' CPU over both agents' pairs),
    /// µs; the same for the bare UDP ping-pong of the same datagrams.
    pub clockmesh_cpu_us_per_pair: f64,
    pub pingpong_cpu_us_per_pair: f64,
    pub pingpong_cpu_percent: f64,
}

pub fn run(args: ChronyArgs) -> anyhow::Result<()> {
    which("chronyd")?;
    which("chronyc")?;
    which("ptp4l")?;
    let mut runs = Vec::new();
    for r in 0..args.runs.max(1) {
        eprintln!(
            "run {} of {}: warm-up {} s, then {} s sampled",
            r + 1,
            args.runs,
            args.warmup,
            args.duration
        );
        runs.push(one_run(&args)?);
    }
    let median = |f: &dyn Fn(&RunFigures) -> f64| {
        let v: Vec<f64> = runs.iter().map(f).collect();
        quantile(&v, 0.5).unwrap_or(f64::NAN)
    };
    let summary = serde_json::json!({
        "load": args.load,
        "cadence_us": args.cadence_us,
        "runs": runs,
        "median": {
            "chrony_p99_ns": median(&|r| r.chrony.p99_ns),
            "clockmesh_p99_ns": median(&|r| r.clockmesh.p99_ns),
            "ptp4l_p99_ns": median(&|r| r.ptp4l.p99_ns),
            "p99_ratio": median(&|r| r.p99_ratio),
            "clockmesh_coverage": median(&|r| r.clockmesh_coverage),
            "chrony_cpu_percent": median(&|r| r.chrony.cpu_percent),
            "clockmesh_cpu_percent": median(&|r| r.clockmesh.cpu_percent),
            "ptp4l_cpu_percent": median(&|r| r.ptp4l.cpu_percent),
            "clockmesh_cpu_us_per_pair": median(&|r| r.clockmesh_cpu_us_per_pair),
            "pingpong_cpu_us_per_pair": median(&|r| r.pingpong_cpu_us_per_pair),
        }
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    print_table(&runs);
    let m = &summary["median"];
    println!(
        "median over {} run(s): chrony p99 {:.0} ns, ptp4l p99 {:.0} ns, clockmesh p99 {:.0} ns, ratio (chrony / clockmesh) {:.2}, clockmesh coverage {:.4}",
        runs.len(),
        m["chrony_p99_ns"].as_f64().unwrap_or(f64::NAN),
        m["ptp4l_p99_ns"].as_f64().unwrap_or(f64::NAN),
        m["clockmesh_p99_ns"].as_f64().unwrap_or(f64::NAN),
        m["p99_ratio"].as_f64().unwrap_or(f64::NAN),
        m["clockmesh_coverage"].as_f64().unwrap_or(f64::NAN),
    );
    Ok(())
}

fn print_table(runs: &[RunFigures]) {
    println!("run  tool       |error| p50 / p99 / max      CPU (both processes)");
    for (i, r) in runs.iter().enumerate() {
        for (name, t) in [
            ("chrony", &r.chrony),
            ("ptp4l", &r.ptp4l),
            ("clockmesh", &r.clockmesh),
        ] {
            println!(
                "{:>4} {:>9} {:>7.0} / {:>6.0} / {:>7.0} ns  cpu {:>5.2} %  ({} samples)",
                i + 1,
                name,
                t.p50_ns,
                t.p99_ns,
                t.max_ns,
                t.cpu_percent,
                t.samples
            );
        }
        println!(
            "     clockmesh coverage {:.4}, median bound {:.0} ns, unavailable {}; chrony p99 / clockmesh p99 {} {:.2}",
            r.clockmesh_coverage,
            r.clockmesh_median_bound_ns,
            r.clockmesh_unavailable,
            ratio_relation(r.clockmesh.p99_ns),
            r.p99_ratio
        );
        println!(
            "     CPU per coded pair: clockmesh {:.1} µs, bare UDP ping-pong of the same datagrams {:.1} µs ({:.2} %), ratio {:.2}",
            r.clockmesh_cpu_us_per_pair,
            r.pingpong_cpu_us_per_pair,
            r.pingpong_cpu_percent,
            r.clockmesh_cpu_us_per_pair / r.pingpong_cpu_us_per_pair
        );
        println!(
            "     ptp4l unavailable {}, its latest report's age p50 {:.2} s, max {:.2} s",
            r.ptp4l_unavailable, r.ptp4l_report_age_p50_s, r.ptp4l_report_age_max_s
        );
        let stamps = serde_json::to_string(&r.clockmesh_stamps).unwrap_or_default();
        println!("     clockmesh stamps used: {stamps}");
    }
}

pub(crate) fn which(tool: &str) -> anyhow::Result<()> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).exists()))
        .unwrap_or(false);
    if !found {
        bail!("{tool} is missing: run cargo xtask setup (installs every prerequisite)");
    }
    Ok(())
}

fn one_run(args: &ChronyArgs) -> anyhow::Result<RunFigures> {
    let mut cfg = ClusterConfig {
        nodes: 2,
        backend: Backend::Static,
        direct_pair: true,
        inject_skew: false,
        ..ClusterConfig::default()
    };
    // The shipped defaults, unless a cadence or window is asked for.
    cfg.cadence_us = args.cadence_us.unwrap_or(
        clockmesh_core::setting::PROBE_CADENCE_US
            .units(clockmesh_core::setting::PROBE_CADENCE_US.default_value()),
    );
    cfg.window_s = args.window_s;
    let cluster = Cluster::start(cfg)?;
    let dir = cluster.dir.join("chrony");
    std::fs::create_dir_all(&dir)?;
    // chronyd refuses a command socket in a directory others can reach.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let server = Chronyd::start(cluster.bed.host(0), &dir, "server", &server_conf(&dir))?;
    let client_conf = client_conf(&dir, &cluster.bed.host(0).addr.to_string());
    let client = Chronyd::start(cluster.bed.host(1), &dir, "client", &client_conf)?;
    let clock = ClockUntouched::take()?;
    let ptp = ptp::start_pair(
        cluster.bed.host(0),
        cluster.bed.host(1),
        &cluster.dir.join("ptp"),
    )?;
    let ptp_reader = ptp[1].reader();
    let cadence_us = cluster.cfg.cadence_us;
    let pingpong = PingPong::start(&cluster, cadence_us)?;
    let load = args.load.then(|| start_load(&cluster));
    std::thread::sleep(Duration::from_secs(args.warmup));
    let offsets = cluster.node_dir(1).join("offsets");
    let reader = OffsetsReader::open(&offsets)
        .with_context(|| format!("clockmesh published nothing in {} s", args.warmup))?;
    let cpu_before = cpu(&cluster, &server, &client);
    let ptp_before = ptp::cpu_seconds(&ptp);
    let (pairs_before, pingpong_before) = (pairs_sent(&cluster), pingpong.cpu_seconds());
    let started = Instant::now();
    let mut s = Samples::default();
    while started.elapsed() < Duration::from_secs(args.duration) {
        let tick = Instant::now();
        s.take(&reader, &client);
        s.ptp4l.take(ptp_reader.reading());
        std::thread::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed()));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_after = cpu(&cluster, &server, &client);
    let ptp_after = ptp::cpu_seconds(&ptp);
    drop(ptp);
    clock.check()?;
    let (pairs_after, pingpong_after) = (pairs_sent(&cluster), pingpong.cpu_seconds());
    drop(load);
    drop(pingpong);
    let clockmesh_stamps = cluster
        .status(1)
        .map(|st| st.counters.node.stamps)
        .unwrap_or_default();
    let percent = |a: f64, b: f64| (b - a) / elapsed * 100.0;
    let mut chrony = figures(&s.chrony);
    chrony.cpu_percent = percent(cpu_before.0, cpu_after.0);
    let mut clockmesh = figures(&s.clockmesh);
    clockmesh.cpu_percent = percent(cpu_before.1, cpu_after.1);
    let mut ptp4l = figures(&s.ptp4l.errors);
    ptp4l.cpu_percent = percent(ptp_before, ptp_after);
    let age = |p| quantile(&s.ptp4l.ages_s, p).unwrap_or(f64::NAN);
    let pingpong_pairs = 2.0 * elapsed * 1e6 / cadence_us.max(1) as f64;
    let pingpong_cpu = pingpong_after - pingpong_before;
    Ok(RunFigures {
        clockmesh_cpu_us_per_pair: (cpu_after.1 - cpu_before.1) * 1e6
            / pairs_after.saturating_sub(pairs_before).max(1) as f64,
        pingpong_cpu_us_per_pair: pingpong_cpu * 1e6 / pingpong_pairs,
        pingpong_cpu_percent: pingpong_cpu / elapsed * 100.0,
        p99_ratio: p99_ratio(chrony.p99_ns, clockmesh.p99_ns),
        clockmesh_coverage: s.covered as f64 / s.clockmesh.len().max(1) as f64,
        clockmesh_median_bound_ns: quantile(&s.bounds, 0.5).unwrap_or(f64::NAN),
        clockmesh_unavailable: s.unavailable,
        clockmesh_stamps,
        ptp4l_unavailable: s.ptp4l.unavailable,
        ptp4l_report_age_p50_s: age(0.5),
        ptp4l_report_age_max_s: age(1.0),
        chrony,
        clockmesh,
        ptp4l,
    })
}

/// The reader's `to_global` gives whole nanoseconds, so a clockmesh p99 of
/// 0 means "under 1 ns": the ratio is then taken against 1 ns (a lower
/// limit), not against nothing (a ratio of 10^11 was once printed).
const READER_RESOLUTION_NS: f64 = 1.0;

fn p99_ratio(chrony_p99_ns: f64, clockmesh_p99_ns: f64) -> f64 {
    chrony_p99_ns / clockmesh_p99_ns.max(READER_RESOLUTION_NS)
}

/// `=`, or `≥` where the ratio is a lower limit.
fn ratio_relation(clockmesh_p99_ns: f64) -> &'static str {
    if clockmesh_p99_ns < READER_RESOLUTION_NS {
        "≥"
    } else {
        "="
    }
}

/// CPU seconds so far: (both chronyds, both agents).
fn cpu(cluster: &Cluster, server: &Chronyd, client: &Chronyd) -> (f64, f64) {
    let of = |pid: Option<u32>| pid.and_then(process_cpu_seconds).unwrap_or(0.0);
    let chrony = of(Some(server.child.id())) + of(Some(client.child.id()));
    let agents = of(cluster.pid(0)) + of(cluster.pid(1));
    (chrony, agents)
}

/// Coded pairs both agents sent so far (their `/status` counters).
fn pairs_sent(cluster: &Cluster) -> u64 {
    (0..2)
        .filter_map(|i| cluster.status(i).ok())
        .map(|s| s.counters.node.pairs_sent)
        .sum()
}

/// `clockmesh-demo pingpong` in both hosts, pointed at each other.
struct PingPong {
    children: Vec<Child>,
}

impl PingPong {
    const PORT: u16 = 7_100;

    fn start(cluster: &Cluster, cadence_us: u64) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut children = Vec::new();
        for (me, peer) in [(0, 1), (1, 0)] {
            let host = cluster.bed.host(me);
            let child = Command::new("ip")
                .args(["netns", "exec", &host.netns])
                .arg(&exe)
                .arg("pingpong")
                .arg(format!("--bind={}:{}", host.addr, Self::PORT))
                .arg(format!(
                    "--peer={}:{}",
                    cluster.bed.host(peer).addr,
                    Self::PORT
                ))
                .arg(format!("--cadence-us={cadence_us}"))
                .stdout(Stdio::null())
                .spawn()
                .context("starting the UDP ping-pong")?;
            children.push(child);
        }
        Ok(PingPong { children })
    }

    /// CPU seconds of both processes (`ip netns exec` execs the program,
    /// so the child's pid is the ping-pong's).
    fn cpu_seconds(&self) -> f64 {
        self.children
            .iter()
            .filter_map(|c| process_cpu_seconds(c.id()))
            .sum()
    }
}

impl Drop for PingPong {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Default)]
struct Samples {
    chrony: Vec<f64>,
    clockmesh: Vec<f64>,
    bounds: Vec<f64>,
    covered: usize,
    unavailable: usize,
    ptp4l: PtpSamples,
}

impl Samples {
    /// Both tools' estimates at (nearly) the same instant; the truth is 0.
    fn take(&mut self, reader: &OffsetsReader, client: &Chronyd) {
        let now = realtime_now_ns();
        match reader.snapshot() {
            Ok(snap) if snap.check_fresh(now).is_ok() => {
                let (global, bound) = snap.node.to_global(now);
                let error = (global - now).as_f64();
                self.clockmesh.push(error.abs());
                self.bounds.push(bound as f64);
                self.covered += usize::from(error.abs() <= bound as f64);
            }
            _ => self.unavailable += 1,
        }
        if let Some(offset) = client.tracking_offset_ns() {
            self.chrony.push(offset.abs());
        }
    }
}

fn figures(v: &[f64]) -> ToolFigures {
    let q = |p| quantile(v, p).unwrap_or(f64::NAN);
    ToolFigures {
        samples: v.len(),
        p50_ns: q(0.5),
        p99_ns: q(0.99),
        max_ns: q(1.0),
        cpu_percent: 0.0,
    }
}

pub(crate) fn server_conf(dir: &Path) -> String {
    format!(
        "# clockmesh bench: serves its own (shared) clock; never adjusts it (-x)\n\
         local stratum 8\nallow 198.18.0.0/15\n{}",
        common_conf(dir, "server")
    )
}

pub(crate) fn client_conf(dir: &Path, server: &str) -> String {
    format!(
        "# clockmesh bench: 16 Hz, interleaved, kernel timestamps; never adjusts the clock (-x)\n\
         server {server} iburst minpoll -4 maxpoll -4 xleave\n{}",
        common_conf(dir, "client")
    )
}

fn common_conf(dir: &Path, role: &str) -> String {
    format!(
        "bindcmdaddress {sock}\ncmdport 0\npidfile {pid}\nuser root\n",
        sock = dir.join(format!("{role}.sock")).display(),
        pid = dir.join(format!("{role}.pid")).display(),
    )
}

pub(crate) struct Chronyd {
    child: Child,
    /// chronyd's command socket (`chronyc -h <sock>`).
    pub(crate) sock: PathBuf,
}

impl Chronyd {
    pub(crate) fn start(host: &Host, dir: &Path, role: &str, conf: &str) -> anyhow::Result<Self> {
        let conf_path = dir.join(format!("{role}.conf"));
        std::fs::write(&conf_path, conf)?;
        let log = std::fs::File::create(dir.join(format!("{role}.log")))?;
        // -x: never adjust the clock; -d: foreground, log to stderr.
        let child = Command::new("ip")
            .args(["netns", "exec", &host.netns, "chronyd", "-x", "-d", "-f"])
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting chronyd")?;
        // Owned at once: a chronyd that never opens its socket is killed
        // (on drop) with the error, not left running.
        let chronyd = Chronyd {
            child,
            sock: dir.join(format!("{role}.sock")),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !chronyd.sock.exists() {
            if Instant::now() > deadline {
                bail!("chronyd ({role}) did not start; see {}", dir.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(chronyd)
    }

    /// chrony's current estimate of this clock's offset (`System time`).
    fn tracking_offset_ns(&self) -> Option<f64> {
        let out = Command::new("chronyc")
            .arg("-h")
            .arg(&self.sock)
            .args(["-c", "tracking"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        // CSV: ref id, name, stratum, ref time, system time (s), …
        let seconds: f64 = text.trim().split(',').nth(4)?.parse().ok()?;
        Some(seconds * 1e9)
    }
}

impl Drop for Chronyd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Both cores busy and ~20,000 datagrams of 1,200 bytes per second
/// (~190 Mbit/s) from host 0 to a receiver in host 1, over the pair.
fn start_load(cluster: &Cluster) -> Load {
    Load::start(vec![Flow {
        from: cluster.bed.host(0).clone(),
        to: (cluster.bed.host(1).addr, 9_999),
        per_10ms: 200,
        drain: Some(cluster.bed.host(1).clone()),
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clockmesh_p99_under_the_resolution_gives_a_lower_limit() {
        assert_eq!(p99_ratio(161.0, 0.0), 161.0);
        assert_eq!(ratio_relation(0.0), "≥");
        assert_eq!(p99_ratio(247.0, 7.0), 247.0 / 7.0);
        assert_eq!(ratio_relation(7.0), "=");
    }
}
