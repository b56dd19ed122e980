//! `clockmesh config`: print the effective configuration and where each value
//! came from (default, file, environment variable, flag). The same flags are
//! accepted by every command that runs the agent.
use std::path::PathBuf;

use clockmesh::config::{self, AgentConfig, Layers};

/// Configuration flags (highest priority; see `docs/configuration.md`).
#[derive(clap::Args, Debug, Default)]
pub struct ConfigFlags {
    /// Config file, TOML (`.toml`) or JSON; default from CLOCKMESH_CONFIG or XLA_DIST_PROF_CONFIG.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Probe interface (also CLOCKMESH_INTERFACE, NCCL_SOCKET_IFNAME).
    #[arg(long)]
    pub interface: Option<String>,
    /// This node's name (default: host name).
    #[arg(long)]
    pub node_name: Option<String>,
    /// UDP port this agent owns for probes.
    #[arg(long)]
    pub probe_port: Option<u16>,
    /// Interval between coded pairs on one edge, µs.
    #[arg(long)]
    pub probe_cadence_us: Option<u64>,
    /// Estimation window, seconds.
    #[arg(long)]
    pub probe_window_s: Option<u64>,
    /// Spacing between the two packets of a coded pair, µs.
    #[arg(long)]
    pub packet_spacing_us: Option<u64>,
    /// Out-neighbours each node probes (1–20).
    #[arg(long)]
    pub degree: Option<usize>,
    /// Known limit on the paths' one-way delay difference, ns: replaces the
    /// ½-RTT asymmetry allowance in the bound. Unset: unknown (honest). A
    /// wrong value makes every bound lie.
    #[arg(long, value_name = "NS")]
    pub max_path_asymmetry_ns: Option<u64>,
    /// tp_btf stamp programs, which run for every packet on the host:
    /// `auto` (attached only if the socket's kernel stamps are missing), `on`, `off`.
    #[arg(long, value_name = "auto|on|off")]
    pub tracepoint_stamps: Option<String>,
    /// Directory for the per-window JSONL results.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// The offsets file readers (XLA hook, Python) map.
    #[arg(long, value_name = "FILE")]
    pub offsets_path: Option<PathBuf>,
    /// Holdover ceiling, ns: past a result's validity readers keep
    /// answering (holdover) while its grown bound is at most this; 0: off.
    #[arg(long, value_name = "NS")]
    pub holdover_max_bound_ns: Option<u64>,
    /// Local HTTP endpoint for /metrics, /healthz, /readyz, /status.
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_addr: Option<String>,
    /// GPU clock snapshot period, ms.
    #[arg(long)]
    pub snapshot_period_ms: Option<u64>,
    /// GPU clock source: off, cuda, cuda-launch, rocm or synthetic (opt-in).
    #[arg(long)]
    pub gpu_clock: Option<String>,
    /// GPUs whose clocks are mapped: `all` or indices, e.g. `0,1`.
    #[arg(long)]
    pub gpu_devices: Option<String>,
    /// File with the shared probe HMAC key (≥ 16 bytes).
    #[arg(long, value_name = "FILE")]
    pub auth_key_file: Option<PathBuf>,
    /// Membership backend: static, etcd or kubernetes.
    #[arg(long)]
    pub discovery: Option<String>,
    /// Static members, `name=ip:port,...`.
    #[arg(long)]
    pub members: Option<String>,
    /// etcd client URLs, comma separated.
    #[arg(long)]
    pub etcd_endpoints: Option<String>,
    /// Cluster name (etcd key prefix).
    #[arg(long)]
    pub cluster: Option<String>,
    /// Kubernetes discovery: namespace of the agent pods and the Lease.
    #[arg(long)]
    pub kube_namespace: Option<String>,
    /// Kubernetes discovery: label selector of the agent pods.
    #[arg(long)]
    pub kube_selector: Option<String>,
    /// Kubernetes discovery: name of the leader Lease.
    #[arg(long)]
    pub kube_lease: Option<String>,
    /// Address peers probe (default: the interface's first IPv4).
    #[arg(long)]
    pub advertise_addr: Option<String>,
    /// TESTING ONLY: add a known skew `offset_ns,drift_ppb,epoch_ns` to every local timestamp.
    #[arg(
        long,
        value_name = "OFFSET_NS,DRIFT_PPB,EPOCH_NS",
        allow_hyphen_values = true
    )]
    pub inject_skew: Option<String>,
    /// Any key as KEY=VALUE (repeatable), e.g. `--set degree=8`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl ConfigFlags {
    /// Builds the layered configuration from the process environment.
    pub fn resolve(&self) -> anyhow::Result<AgentConfig> {
        let layers = self.layers()?;
        Ok(AgentConfig::from_layers(&layers, &hostname())?)
    }

    /// The layers (defaults, file, environment, flags), not yet checked as
    /// a whole.
    pub fn layers(&self) -> anyhow::Result<Layers> {
        let lookup = |v: &str| std::env::var(v).ok();
        let mut layers = Layers::with_defaults();
        if let Some(file) = config::config_file(self.config.as_deref(), lookup) {
            layers.apply_file(&file)?;
        }
        layers.apply_env(lookup);
        let flags = [
            ("interface", "--interface", self.interface.clone()),
            ("node_name", "--node-name", self.node_name.clone()),
            (
                "probe_port",
                "--probe-port",
                self.probe_port.map(|v| v.to_string()),
            ),
            (
                "probe_cadence_us",
                "--probe-cadence-us",
                self.probe_cadence_us.map(|v| v.to_string()),
            ),
            (
                "probe_window_s",
                "--probe-window-s",
                self.probe_window_s.map(|v| v.to_string()),
            ),
            (
                "packet_spacing_us",
                "--packet-spacing-us",
                self.packet_spacing_us.map(|v| v.to_string()),
            ),
            ("degree", "--degree", self.degree.map(|v| v.to_string())),
            (
                "tracepoint_stamps",
                "--tracepoint-stamps",
                self.tracepoint_stamps.clone(),
            ),
            (
                "max_path_asymmetry_ns",
                "--max-path-asymmetry-ns",
                self.max_path_asymmetry_ns.map(|v| v.to_string()),
            ),
            ("output_dir", "--output-dir", path_text(&self.output_dir)),
            (
                "offsets_path",
                "--offsets-path",
                path_text(&self.offsets_path),
            ),
            (
                "holdover_max_bound_ns",
                "--holdover-max-bound-ns",
                self.holdover_max_bound_ns.map(|v| v.to_string()),
            ),
            ("metrics_addr", "--metrics-addr", self.metrics_addr.clone()),
            (
                "snapshot_period_ms",
                "--snapshot-period-ms",
                self.snapshot_period_ms.map(|v| v.to_string()),
            ),
            ("gpu_clock", "--gpu-clock", self.gpu_clock.clone()),
            ("gpu_devices", "--gpu-devices", self.gpu_devices.clone()),
            (
                "auth_key_file",
                "--auth-key-file",
                path_text(&self.auth_key_file),
            ),
            ("discovery", "--discovery", self.discovery.clone()),
            ("members", "--members", self.members.clone()),
            (
                "etcd_endpoints",
                "--etcd-endpoints",
                self.etcd_endpoints.clone(),
            ),
            ("cluster", "--cluster", self.cluster.clone()),
            (
                "kube_namespace",
                "--kube-namespace",
                self.kube_namespace.clone(),
            ),
            (
                "kube_selector",
                "--kube-selector",
                self.kube_selector.clone(),
            ),
            ("kube_lease", "--kube-lease", self.kube_lease.clone()),
            (
                "advertise_addr",
                "--advertise-addr",
                self.advertise_addr.clone(),
            ),
            ("inject_skew", "--inject-skew", self.inject_skew.clone()),
        ];
        for (key, flag, value) in flags {
            if let Some(v) = value {
                layers.apply_flag(key, v, flag)?;
            }
        }
        for s in &self.set {
            layers.apply_set(s)?;
        }
        Ok(layers)
    }
}

fn path_text(p: &Option<PathBuf>) -> Option<String> {
    p.as_ref().map(|p| p.display().to_string())
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

#[derive(clap::Args, Debug)]
pub struct ConfigArgs {
    #[command(flatten)]
    flags: ConfigFlags,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: ConfigArgs) -> anyhow::Result<()> {
    let layers = args.flags.layers()?;
    let cfg = match AgentConfig::from_layers(&layers, &hostname()) {
        Ok(cfg) => cfg,
        // Still show what is set, then say why an agent could not run.
        Err(e) => {
            print_raw(&layers, args.json)?;
            anyhow::bail!("not a configuration an agent can run with: {e}");
        }
    };
    if args.json {
        crate::outln!("{}", serde_json::to_string_pretty(&cfg)?)?;
        return Ok(());
    }
    let value = serde_json::to_value(&cfg)?;
    let serde_json::Value::Object(map) = value else {
        anyhow::bail!("configuration did not serialise to an object");
    };
    crate::outln!("{:<20} {:<28} source", "key", "value")?;
    for (key, entry) in map {
        let (v, src) = match &entry {
            serde_json::Value::Null => ("(unset)".to_string(), "-".to_string()),
            e => (plain(&e["value"]), describe_source(&e["source"])),
        };
        crate::outln!("{key:<20} {v:<28} {src}")?;
    }
    Ok(())
}

/// The layered values as they are, for a configuration that does not check.
fn print_raw(layers: &Layers, json: bool) -> anyhow::Result<()> {
    let raw = layers.raw();
    if json {
        let map: serde_json::Map<String, serde_json::Value> = raw
            .iter()
            .map(|(k, v, s)| {
                let entry = serde_json::json!({"value": v, "source": s.to_string()});
                ((*k).to_owned(), entry)
            })
            .collect();
        crate::outln!("{}", serde_json::to_string_pretty(&map)?)?;
        return Ok(());
    }
    crate::outln!("{:<20} {:<28} source", "key", "value")?;
    for (k, v, s) in raw {
        crate::outln!("{k:<20} {v:<28} {s}")?;
    }
    Ok(())
}

fn plain(v: &serde_json::Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

fn describe_source(s: &serde_json::Value) -> String {
    match (s["kind"].as_str(), s.get("name")) {
        (Some(kind), Some(name)) => format!("{kind} {}", plain(name)),
        (Some(kind), None) => kind.to_owned(),
        _ => s.to_string(),
    }
}
