//! The cluster demo: etcd + N netns hosts, one `clockmesh agent` each with
//! real eBPF and a known injected skew; prints estimated vs true offsets
//! and writes `clockmesh report`'s HTML page of the run.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clockmesh_testbed::{
    cluster::{Backend, Checked, Cluster, ClusterConfig, agent_binary, quantile},
    load::{Flow, Load},
};
use serde::Serialize;
use serde_json::json;

#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Number of nodes (netns hosts), 2–64.
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Seconds to measure after the warm-up windows.
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Print a machine-readable summary instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Probe cadence per edge, µs (default: the agent's default).
    #[arg(long)]
    pub cadence_us: Option<u64>,
    /// Estimation window, s (default: the agent's default).
    #[arg(long, default_value_t = clockmesh_core::setting::PROBE_WINDOW_S.units(clockmesh_core::setting::PROBE_WINDOW_S.default_value()))]
    pub window_s: u64,
    /// Out-neighbours per node.
    #[arg(long, default_value_t = 4)]
    pub degree: usize,
    /// Membership backend: etcd (default) or static.
    #[arg(long, default_value = "etcd")]
    pub backend: String,
    /// Do not inject skews (all true offsets are then 0).
    #[arg(long)]
    pub no_skew: bool,
    /// Load both CPU cores and send cross-traffic over the veths.
    #[arg(long)]
    pub load: bool,
    /// With --nodes 2: join the hosts by one veth pair instead of a bridge.
    #[arg(long)]
    pub direct: bool,
    /// Each node's injected frequency also wanders: a seeded random walk,
    /// ppb per √s (real oscillators: ~0.1–10).
    #[arg(long, default_value_t = 0.0)]
    pub wander: f64,
}

#[derive(Serialize)]
struct NodeRow {
    node: String,
    reference: String,
    window: u64,
    estimated_ns: i64,
    true_ns: f64,
    error_ns: f64,
    bound_ns: u64,
    cpu_percent: Option<f64>,
    rss_kib: Option<u64>,
    probe_bandwidth_bps: Option<f64>,
}

#[derive(Serialize)]
struct Summary {
    nodes: usize,
    backend: String,
    duration_s: u64,
    cadence_us: u64,
    window_s: u64,
    degree: usize,
    load: bool,
    node_windows: usize,
    p50_abs_error_ns: Option<f64>,
    p99_abs_error_ns: Option<f64>,
    max_abs_error_ns: Option<f64>,
    median_bound_ns: Option<f64>,
    bound_coverage: Option<f64>,
    mean_agent_cpu_percent: Option<f64>,
    max_agent_rss_kib: Option<u64>,
    mean_probe_bandwidth_bps: Option<f64>,
    per_node: Vec<NodeRow>,
}

/// Both cores busy; every host sends ~2,000 datagrams of 1,200 bytes per
/// second to the next host's port 5001, where nobody listens.
fn start_load(cluster: &Cluster) -> Load {
    let n = cluster.cfg.nodes;
    let flows = (0..n)
        .map(|i| Flow {
            from: cluster.bed.host(i).clone(),
            to: (cluster.bed.host((i + 1) % n).addr, 5001),
            per_10ms: 20,
            drain: None,
        })
        .collect();
    Load::start(flows)
}

#[expect(
    clippy::too_many_lines,
    reason = "the demo is one script, step by step"
)]
pub fn run(args: ClusterArgs) -> anyhow::Result<()> {
    anyhow::ensure!((2..=64).contains(&args.nodes), "--nodes must be 2 to 64");
    let backend = match args.backend.as_str() {
        "etcd" => Backend::Etcd,
        "static" => Backend::Static,
        other => anyhow::bail!("--backend {other}: expected etcd or static"),
    };
    let cadence_us = args.cadence_us.unwrap_or(
        clockmesh_core::setting::PROBE_CADENCE_US
            .units(clockmesh_core::setting::PROBE_CADENCE_US.default_value()),
    );
    let cfg = ClusterConfig {
        nodes: args.nodes,
        backend,
        cadence_us,
        window_s: args.window_s,
        degree: args.degree,
        inject_skew: !args.no_skew,
        auth_key: None,
        direct_pair: args.direct,
        extra_args: Vec::new(),
        wander_ppb_per_sqrt_s: args.wander,
        skews: Vec::new(),
    };
    if !args.json {
        eprintln!(
            "clockmesh demo: {} netns hosts, {:?} membership, cadence {cadence_us} µs, window {} s; warming up…",
            args.nodes, backend, args.window_s
        );
    }
    let cluster = Cluster::start(cfg)?;
    let _load = args.load.then(|| start_load(&cluster));
    let window = Duration::from_secs(args.window_s);
    // Warm-up: registration, handshakes and two full windows.
    thread::sleep(window * 3 + Duration::from_secs(2));
    let warm_window = latest_window(&cluster);
    let cpu0: Vec<_> = (0..args.nodes).map(|i| cluster.usage(i)).collect();
    let counters0: Vec<_> = (0..args.nodes)
        .map(|i| sent_wire_bytes(&cluster, i))
        .collect();
    let t0 = Instant::now();
    thread::sleep(Duration::from_secs(args.duration));
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu1: Vec<_> = (0..args.nodes).map(|i| cluster.usage(i)).collect();
    let counters1: Vec<_> = (0..args.nodes)
        .map(|i| sent_wire_bytes(&cluster, i))
        .collect();
    let checked: Vec<Checked> = cluster
        .check_all()
        .into_iter()
        .filter(|c| warm_window.is_some_and(|w| c.window > w))
        .collect();
    let mut rows = Vec::new();
    for i in 0..args.nodes {
        let name = Cluster::name(i);
        let last = checked
            .iter()
            .filter(|c| c.node == name)
            .max_by_key(|c| c.window);
        let cpu = cpu0[i]
            .zip(cpu1[i])
            .map(|(a, b)| (b.0 - a.0) / elapsed * 100.0);
        let bw = counters0[i]
            .zip(counters1[i])
            .map(|(a, b)| (b - a) as f64 * 8.0 / elapsed);
        rows.push(NodeRow {
            node: name.clone(),
            reference: last.map_or_else(|| "(self)".into(), |c| c.reference.clone()),
            window: last.map_or(0, |c| c.window),
            estimated_ns: last.map_or(0, |c| c.estimated_ns),
            true_ns: last.map_or(0.0, |c| c.true_ns),
            error_ns: last.map_or(0.0, |c| c.error_ns),
            bound_ns: last.map_or(0, |c| c.bound_ns),
            cpu_percent: cpu,
            rss_kib: cpu1[i].map(|u| u.1),
            probe_bandwidth_bps: bw,
        });
    }
    let abs: Vec<f64> = checked.iter().map(|c| c.error_ns.abs()).collect();
    let bounds: Vec<f64> = checked.iter().map(|c| c.bound_ns as f64).collect();
    let cpus: Vec<f64> = rows.iter().filter_map(|r| r.cpu_percent).collect();
    let bws: Vec<f64> = rows.iter().filter_map(|r| r.probe_bandwidth_bps).collect();
    let summary = Summary {
        nodes: args.nodes,
        backend: args.backend.clone(),
        duration_s: args.duration,
        cadence_us,
        window_s: args.window_s,
        degree: args.degree,
        load: args.load,
        node_windows: checked.len(),
        p50_abs_error_ns: quantile(&abs, 0.5),
        p99_abs_error_ns: quantile(&abs, 0.99),
        max_abs_error_ns: quantile(&abs, 1.0),
        median_bound_ns: quantile(&bounds, 0.5),
        bound_coverage: (!checked.is_empty())
            .then(|| checked.iter().filter(|c| c.covered()).count() as f64 / checked.len() as f64),
        mean_agent_cpu_percent: mean(&cpus),
        max_agent_rss_kib: rows.iter().filter_map(|r| r.rss_kib).max(),
        mean_probe_bandwidth_bps: mean(&bws),
        per_node: rows,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_table(&summary);
    }
    let report = write_report(&cluster);
    match &report {
        // stdout stays one JSON document with --json.
        Ok(path) if args.json => eprintln!("report: {}", path.display()),
        Ok(path) => println!("report: {}", path.display()),
        Err(_) => {}
    }
    anyhow::ensure!(
        summary.node_windows > 0,
        "no node results after the warm-up; agent logs are in {}",
        cluster.dir.display()
    );
    report.map(|_| ())
}

/// `clockmesh report` over every node's history (rotated files too) and
/// the injected skews (`--truth`), into `<cluster dir>/report.html`.
fn write_report(cluster: &Cluster) -> anyhow::Result<PathBuf> {
    let truth = cluster.dir.join("truth.json");
    let nodes: BTreeMap<String, _> = (0..cluster.cfg.nodes)
        .map(|i| (Cluster::name(i), cluster.skews[i]))
        .collect();
    std::fs::write(
        &truth,
        serde_json::to_vec_pretty(&json!({ "nodes": nodes }))?,
    )?;
    let out = cluster.dir.join("report.html");
    let mut cmd = Command::new(agent_binary()?);
    cmd.arg("report");
    for i in 0..cluster.cfg.nodes {
        let names = [
            "clockmesh.4.jsonl",
            "clockmesh.3.jsonl",
            "clockmesh.2.jsonl",
        ];
        let names = names
            .into_iter()
            .chain(["clockmesh.1.jsonl", "clockmesh.jsonl"]);
        let files = names.map(|n| cluster.node_dir(i).join(n));
        for f in files.filter(|f| f.exists()) {
            cmd.arg("--history").arg(f);
        }
    }
    cmd.arg("--truth")
        .arg(&truth)
        .arg("--force")
        .arg("-o")
        .arg(&out);
    let o = cmd.output().context("running clockmesh report")?;
    anyhow::ensure!(
        o.status.success(),
        "clockmesh report: {}",
        String::from_utf8_lossy(&o.stderr).trim()
    );
    Ok(out)
}

/// Bytes each datagram adds on the wire to its payload: UDP, IPv4, Ethernet.
const HEADER_BYTES: u64 = 8 + 20 + 14;

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn latest_window(c: &Cluster) -> Option<u64> {
    (0..c.cfg.nodes)
        .flat_map(|i| c.node_lines(i))
        .map(|l| l.window)
        .max()
}

/// Wire bytes agent `i` sent so far over UDP (probes, warm-ups, reports,
/// handshakes, relayed fits and results).
fn sent_wire_bytes(c: &Cluster, i: usize) -> Option<u64> {
    let s = c.status(i).ok()?;
    let io = &s.counters.io;
    Some(io.udp_payload_bytes_sent + HEADER_BYTES * io.udp_datagrams_sent)
}

fn print_table(s: &Summary) {
    println!(
        "\n{:<6} {:<9} {:>10} {:>14} {:>14} {:>10} {:>10} {:>7} {:>9} {:>11}",
        "node",
        "reference",
        "window",
        "est. g−l ns",
        "true g−l ns",
        "error ns",
        "± bound",
        "cpu %",
        "rss KiB",
        "probe kbit/s"
    );
    for r in &s.per_node {
        println!(
            "{:<6} {:<9} {:>10} {:>14} {:>14.0} {:>10.1} {:>10} {:>7} {:>9} {:>11}",
            r.node,
            r.reference,
            r.window,
            r.estimated_ns,
            r.true_ns,
            r.error_ns,
            r.bound_ns,
            r.cpu_percent.map_or("-".into(), |c| format!("{c:.2}")),
            r.rss_kib.map_or("-".into(), |v| v.to_string()),
            r.probe_bandwidth_bps
                .map_or("-".into(), |b| format!("{:.1}", b / 1e3)),
        );
    }
    let f = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.1}"));
    println!(
        "\n{} node-windows checked: |error| p50 {} ns, p99 {} ns, max {} ns; median bound {} ns; bound coverage {}",
        s.node_windows,
        f(s.p50_abs_error_ns),
        f(s.p99_abs_error_ns),
        f(s.max_abs_error_ns),
        f(s.median_bound_ns),
        s.bound_coverage
            .map_or("-".into(), |c| format!("{:.2}%", c * 100.0))
    );
    println!(
        "agent CPU {} % of one core (mean), RSS ≤ {} KiB, probe traffic {} kbit/s per node (sent)",
        f(s.mean_agent_cpu_percent),
        s.max_agent_rss_kib.map_or("-".into(), |v| v.to_string()),
        s.mean_probe_bandwidth_bps
            .map_or("-".into(), |b| format!("{:.1}", b / 1e3))
    );
}
