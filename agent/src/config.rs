//! Agent configuration: defaults < file (TOML or JSON) < environment < flags.
//!
//! Every key has one canonical name (used in files and by `--set`), a
//! `CLOCKMESH_*` variable, and the names the earlier XLA design used
//! (`XLA_PROBE_CADENCE_US`, `NCCL_SOCKET_IFNAME`, …). Each effective value
//! remembers where it came from, so `clockmesh config` can say, and every
//! error names the key and the source of the bad value.

use std::{
    collections::BTreeMap,
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::Serialize;
use thiserror::Error;

/// Where a value came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "snake_case")]
pub enum Source {
    Default,
    File(PathBuf),
    Env(String),
    Flag(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Env(v) => write!(f, "environment variable {v}"),
            Source::Flag(n) => write!(f, "flag {n}"),
        }
    }
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error("config file {path} is not valid {format}: {reason}")]
    Syntax {
        path: PathBuf,
        format: &'static str,
        reason: String,
    },
    #[error("unknown key {key:?} in {origin}")]
    UnknownKey { key: String, origin: Source },
    #[error("invalid value {value:?} for {key} (from {origin}): {reason}")]
    Invalid {
        key: &'static str,
        value: String,
        origin: Source,
        reason: String,
    },
    #[error("{key} must be set (flag --{flag}, or {env})")]
    Missing {
        key: &'static str,
        flag: &'static str,
        env: &'static str,
    },
    #[error("--set expects KEY=VALUE, got {0:?}")]
    BadSet(String),
}

/// One configuration key.
pub struct Key {
    pub name: &'static str,
    /// Environment variables, highest priority first.
    pub env: &'static [&'static str],
    /// Other names accepted in files.
    pub file_aliases: &'static [&'static str],
    pub default: Option<&'static str>,
    pub help: &'static str,
}

/// All keys. Defaults are documented here and in `docs/configuration.md`.
pub const KEYS: &[Key] = &[
    Key {
        name: "enabled",
        env: &["CLOCKMESH_ENABLED", "XLA_ENABLE_DISTRIBUTED_PROFILING"],
        file_aliases: &[],
        default: Some("true"),
        help: "run probing at all (false: the agent idles)",
    },
    Key {
        name: "interface",
        env: &["CLOCKMESH_INTERFACE", "NCCL_SOCKET_IFNAME"],
        file_aliases: &["probe_interface"],
        default: None,
        help: "network interface probes use (the NCCL data interface)",
    },
    Key {
        name: "node_name",
        env: &["CLOCKMESH_NODE_NAME", "NODE_NAME"],
        file_aliases: &[],
        default: None,
        help: "this node's name (default: the host name)",
    },
    Key {
        name: "probe_port",
        env: &["CLOCKMESH_PROBE_PORT"],
        file_aliases: &[],
        default: Some("31900"),
        help: "UDP port this agent owns for probes",
    },
    Key {
        name: "probe_cadence_us",
        env: &["CLOCKMESH_PROBE_CADENCE_US", "XLA_PROBE_CADENCE_US"],
        file_aliases: &[],
        default: Some("100000"),
        help: "interval between coded pairs on one edge, µs",
    },
    Key {
        name: "packet_spacing_us",
        env: &["CLOCKMESH_PACKET_SPACING_US", "XLA_PACKET_SPACING_US"],
        file_aliases: &[],
        default: Some("100"),
        help: "spacing between the two probes of a pair, µs",
    },
    Key {
        name: "probe_window_s",
        env: &["CLOCKMESH_PROBE_WINDOW_S", "XLA_PROBE_WINDOW_S"],
        file_aliases: &[],
        default: Some("4"),
        help: "estimation window, s",
    },
    Key {
        name: "degree",
        env: &["CLOCKMESH_DEGREE"],
        file_aliases: &["k", "out_degree"],
        default: Some("4"),
        help: "out-neighbours each node probes (1-20)",
    },
    Key {
        name: "tracepoint_stamps",
        env: &["CLOCKMESH_TRACEPOINT_STAMPS"],
        file_aliases: &[],
        default: Some("auto"),
        help: "tp_btf stamp programs (they run for every packet on the host): auto (attached only if the socket's kernel stamps are missing), on or off",
    },
    Key {
        name: "max_path_asymmetry_ns",
        env: &["CLOCKMESH_MAX_PATH_ASYMMETRY_NS"],
        file_aliases: &[],
        default: None,
        help: "known limit on the paths' one-way delay difference, ns: replaces the ½-RTT asymmetry allowance in the bound (unset: unknown; a wrong value makes the bound lie, see docs/configuration.md)",
    },
    Key {
        name: "output_dir",
        env: &["CLOCKMESH_OUTPUT_DIR", "XLA_DIST_PROF_OUTPUT_DIR"],
        file_aliases: &[],
        default: Some("/var/lib/clockmesh"),
        help: "where per-window JSONL results go",
    },
    Key {
        name: "offsets_path",
        env: &["CLOCKMESH_OFFSETS_PATH"],
        file_aliases: &[],
        default: Some("/run/clockmesh/offsets"),
        help: "the published offsets file",
    },
    Key {
        name: "holdover_max_bound_ns",
        env: &["CLOCKMESH_HOLDOVER_MAX_BOUND_NS"],
        file_aliases: &[],
        default: Some("10000"),
        help: "holdover ceiling written into every offsets record, ns: past a result's validity readers keep answering (state holdover) while its bound, grown at the published rate, is at most this; then stale. 0: stale right past the validity",
    },
    Key {
        name: "metrics_addr",
        env: &["CLOCKMESH_METRICS_ADDR"],
        file_aliases: &[],
        default: Some("127.0.0.1:9977"),
        help: "address of /metrics, /healthz, /readyz",
    },
    Key {
        name: "snapshot_period_ms",
        env: &["CLOCKMESH_SNAPSHOT_PERIOD_MS"],
        file_aliases: &[],
        default: Some("1000"),
        help: "GPU clock snapshot period, ms",
    },
    Key {
        name: "gpu_clock",
        env: &["CLOCKMESH_GPU_CLOCK"],
        file_aliases: &[],
        default: Some("off"),
        help: "GPU clock source: off, cuda, cuda-launch, rocm or synthetic (opt-in: a CUDA context costs ~0.5 GiB of GPU memory)",
    },
    Key {
        name: "gpu_devices",
        env: &["CLOCKMESH_GPU_DEVICES"],
        file_aliases: &[],
        default: Some("all"),
        help: "GPUs whose clocks are mapped: `all` or indices, comma separated",
    },
    Key {
        name: "auth_key_file",
        env: &["CLOCKMESH_AUTH_KEY_FILE"],
        file_aliases: &[],
        default: None,
        help: "file holding the shared probe HMAC key (≥ 16 bytes); unset: no authentication",
    },
    Key {
        name: "discovery",
        env: &["CLOCKMESH_DISCOVERY"],
        file_aliases: &[],
        default: Some("static"),
        help: "membership backend: static (the `members` list), etcd or kubernetes",
    },
    Key {
        name: "members",
        env: &["CLOCKMESH_MEMBERS"],
        file_aliases: &[],
        default: None,
        help: "static members, comma separated `name=ip:port` (or `name#id=ip:port`)",
    },
    Key {
        name: "etcd_endpoints",
        env: &["CLOCKMESH_ETCD_ENDPOINTS"],
        file_aliases: &[],
        default: Some("http://127.0.0.1:2379"),
        help: "etcd client URLs, comma separated",
    },
    Key {
        name: "cluster",
        env: &["CLOCKMESH_CLUSTER"],
        file_aliases: &[],
        default: Some("default"),
        help: "cluster name: the etcd key prefix /clockmesh/<cluster>/",
    },
    Key {
        name: "kube_namespace",
        env: &["CLOCKMESH_KUBE_NAMESPACE"],
        file_aliases: &[],
        default: Some("clockmesh"),
        help: "kubernetes discovery: namespace of the agent pods and the leader Lease",
    },
    Key {
        name: "kube_selector",
        env: &["CLOCKMESH_KUBE_SELECTOR"],
        file_aliases: &[],
        default: Some("app.kubernetes.io/name=clockmesh"),
        help: "kubernetes discovery: label selector of the agent pods",
    },
    Key {
        name: "kube_lease",
        env: &["CLOCKMESH_KUBE_LEASE"],
        file_aliases: &[],
        default: Some("clockmesh-leader"),
        help: "kubernetes discovery: name of the leader Lease (coordination.k8s.io/v1)",
    },
    Key {
        name: "advertise_addr",
        env: &["CLOCKMESH_ADVERTISE_ADDR"],
        file_aliases: &[],
        default: None,
        help: "address peers probe (default: the interface's first IPv4 address)",
    },
    Key {
        name: "inject_skew",
        env: &["CLOCKMESH_INJECT_SKEW"],
        file_aliases: &[],
        default: None,
        help: "TESTING ONLY: `offset_ns,drift_ppb,epoch_ns[,wander_ppb_per_sqrt_s[,seed]]` added to every local stamp",
    },
];

/// Configuration files are looked for here unless `--config` says otherwise.
pub const CONFIG_ENV: &[&str] = &["CLOCKMESH_CONFIG", "XLA_DIST_PROF_CONFIG"];

fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter()
        .find(|k| k.name == name || k.file_aliases.contains(&name))
}

/// Raw values by canonical key, each with its source; later layers win.
#[derive(Clone, Debug, Default)]
pub struct Layers {
    values: BTreeMap<&'static str, (String, Source)>,
}

impl Layers {
    pub fn with_defaults() -> Self {
        let mut l = Layers::default();
        for k in KEYS {
            if let Some(d) = k.default {
                l.values.insert(k.name, (d.to_owned(), Source::Default));
            }
        }
        l
    }

    /// Applies a TOML (`.toml`) or JSON (anything else) file.
    pub fn apply_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Unreadable {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let table = parse_file(path, &text)?;
        for (name, value) in table {
            let source = Source::File(path.to_owned());
            let k = key(&name).ok_or_else(|| ConfigError::UnknownKey {
                key: name.clone(),
                origin: source.clone(),
            })?;
            self.values.insert(k.name, (value, source));
        }
        Ok(())
    }

    /// Applies environment variables through `lookup` (injected for tests).
    pub fn apply_env(&mut self, lookup: impl Fn(&str) -> Option<String>) {
        for k in KEYS {
            if let Some((var, v)) = k.env.iter().find_map(|v| lookup(v).map(|x| (*v, x))) {
                self.values.insert(k.name, (v, Source::Env(var.to_owned())));
            }
        }
    }

    /// Applies a flag value for `name` (canonical key name).
    pub fn apply_flag(&mut self, name: &str, value: String, flag: &str) -> Result<(), ConfigError> {
        let source = Source::Flag(flag.to_owned());
        let k = key(name).ok_or_else(|| ConfigError::UnknownKey {
            key: name.to_owned(),
            origin: source,
        })?;
        self.values
            .insert(k.name, (value, Source::Flag(flag.to_owned())));
        Ok(())
    }

    /// Applies `KEY=VALUE` from `--set`.
    pub fn apply_set(&mut self, assignment: &str) -> Result<(), ConfigError> {
        let (name, value) = assignment
            .split_once('=')
            .ok_or_else(|| ConfigError::BadSet(assignment.to_owned()))?;
        self.apply_flag(
            name.trim(),
            value.trim().to_owned(),
            &format!("--set {}", name.trim()),
        )
    }

    fn get(&self, name: &'static str) -> Option<&(String, Source)> {
        self.values.get(name)
    }

    /// Every key's raw value and where it came from (unset keys left out),
    /// in [`KEYS`] order: what `clockmesh config` shows when the typed
    /// configuration cannot be built.
    pub fn raw(&self) -> Vec<(&'static str, &str, &Source)> {
        KEYS.iter()
            .filter_map(|k| self.get(k.name).map(|(v, s)| (k.name, v.as_str(), s)))
            .collect()
    }
}

fn parse_file(path: &Path, text: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let syntax = |format, reason: String| ConfigError::Syntax {
        path: path.to_owned(),
        format,
        reason,
    };
    let is_toml = path.extension().is_some_and(|e| e == "toml");
    let value: serde_json::Value = if is_toml {
        let t: toml::Table = toml::from_str(text).map_err(|e| syntax("TOML", e.to_string()))?;
        serde_json::to_value(t).map_err(|e| syntax("TOML", e.to_string()))?
    } else {
        serde_json::from_str(text).map_err(|e| syntax("JSON", e.to_string()))?
    };
    let serde_json::Value::Object(map) = value else {
        return Err(syntax("JSON", "the top level must be an object".into()));
    };
    Ok(map.into_iter().map(|(k, v)| (k, scalar_text(&v))).collect())
}

/// File values are converted to the same text the environment would carry.
fn scalar_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(items) => {
            items.iter().map(scalar_text).collect::<Vec<_>>().join(",")
        }
        other => other.to_string(),
    }
}

/// A value and its source.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sourced<T> {
    pub value: T,
    pub source: Source,
}

/// The typed, validated configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AgentConfig {
    pub enabled: Sourced<bool>,
    pub interface: Sourced<String>,
    pub node_name: Sourced<String>,
    pub probe_port: Sourced<u16>,
    pub probe_cadence_us: Sourced<u64>,
    pub packet_spacing_us: Sourced<u64>,
    pub probe_window_s: Sourced<u64>,
    pub degree: Sourced<usize>,
    pub max_path_asymmetry_ns: Option<Sourced<u64>>,
    pub tracepoint_stamps: Sourced<TracepointStamps>,
    pub output_dir: Sourced<PathBuf>,
    pub offsets_path: Sourced<PathBuf>,
    pub holdover_max_bound_ns: Sourced<u64>,
    pub metrics_addr: Sourced<SocketAddr>,
    pub snapshot_period_ms: Sourced<u64>,
    pub gpu_clock: Sourced<GpuClockKind>,
    pub gpu_devices: Sourced<GpuDevices>,
    pub auth_key_file: Option<Sourced<PathBuf>>,
    pub discovery: Sourced<DiscoveryKind>,
    pub members: Option<Sourced<Vec<String>>>,
    pub etcd_endpoints: Sourced<Vec<String>>,
    pub cluster: Sourced<String>,
    pub kube_namespace: Sourced<String>,
    pub kube_selector: Sourced<String>,
    pub kube_lease: Sourced<String>,
    pub advertise_addr: Option<Sourced<std::net::IpAddr>>,
    pub inject_skew: Option<Sourced<InjectedSkew>>,
}

/// When the tp_btf stamp programs are attached (`tracepoint_stamps`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TracepointStamps {
    /// Only once the socket's kernel stamps turn out to be missing (a driver
    /// that does not stamp): the programs run for every packet on the host.
    Auto,
    On,
    Off,
}

fn tracepoint_stamps(s: &str) -> Result<TracepointStamps, String> {
    Ok(match s {
        "auto" => TracepointStamps::Auto,
        "on" | "true" => TracepointStamps::On,
        "off" | "false" => TracepointStamps::Off,
        _ => return Err("expected auto, on or off".into()),
    })
}

/// Which GPU clock source the agent samples (`gpu_clock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuClockKind {
    Off,
    /// `%globaltimer` through a ping-pong kernel (~2 µs brackets).
    Cuda,
    /// One kernel launch per sample (fallback; ~8 µs brackets).
    CudaLaunch,
    /// KFD `AMDKFD_IOC_GET_CLOCK_COUNTERS`.
    Rocm,
    /// A modelled clock (tests, demos).
    Synthetic,
}

/// Which GPUs to map (`gpu_devices`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuDevices {
    All,
    List(Vec<u32>),
}

/// Which membership backend the agent uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiscoveryKind {
    Static,
    Etcd,
    Kubernetes,
}

impl DiscoveryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::Etcd => "etcd",
            Self::Kubernetes => "kubernetes",
        }
    }
}

/// A known skew added to every local timestamp (tests and the demo): the
/// node then behaves as if its clock read `true + offset + drift·(t − epoch)`
/// plus, optionally, a seeded random walk of its frequency
/// ([`crate::wander`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct InjectedSkew {
    pub offset_ns: i64,
    pub drift_ppb: f64,
    pub epoch_ns: i64,
    /// Random-walk frequency wander, ppb per √s (0: none).
    pub wander_ppb_per_sqrt_s: f64,
    pub wander_seed: u64,
}

impl InjectedSkew {
    /// The skew at local time `t_ns`.
    pub fn at(&self, t_ns: i64) -> i64 {
        let age_ns = t_ns.saturating_sub(self.epoch_ns);
        let age_s = age_ns as f64 / 1e9;
        let wander = crate::wander::offset_ns(self.wander_seed, self.wander_ppb_per_sqrt_s, age_ns);
        self.offset_ns
            .saturating_add((self.drift_ppb * age_s + wander).round() as i64)
    }
}

fn gpu_clock_kind(s: &str) -> Result<GpuClockKind, String> {
    Ok(match s {
        "off" | "none" | "false" => GpuClockKind::Off,
        "cuda" => GpuClockKind::Cuda,
        "cuda-launch" => GpuClockKind::CudaLaunch,
        "rocm" => GpuClockKind::Rocm,
        "synthetic" => GpuClockKind::Synthetic,
        _ => return Err("expected off, cuda, cuda-launch, rocm or synthetic".into()),
    })
}

/// At most this many GPUs per node (the offsets file has 16 device slots).
pub const MAX_GPU_DEVICES: u32 = 16;

fn gpu_devices(s: &str) -> Result<GpuDevices, String> {
    if s == "all" {
        return Ok(GpuDevices::All);
    }
    let mut list = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let i: u32 = item
            .parse()
            .map_err(|_| format!("`{item}` is not a GPU index; expected `all` or e.g. 0,1"))?;
        if i >= MAX_GPU_DEVICES {
            return Err(format!(
                "GPU index {i} is too large (at most {})",
                MAX_GPU_DEVICES - 1
            ));
        }
        if !list.contains(&i) {
            list.push(i);
        }
    }
    if list.is_empty() {
        return Err("expected `all` or GPU indices, e.g. 0,1".into());
    }
    Ok(GpuDevices::List(list))
}

fn discovery_kind(s: &str) -> Result<DiscoveryKind, String> {
    match s.to_ascii_lowercase().as_str() {
        "static" => Ok(DiscoveryKind::Static),
        "etcd" => Ok(DiscoveryKind::Etcd),
        "kubernetes" | "k8s" => Ok(DiscoveryKind::Kubernetes),
        _ => Err("expected `static`, `etcd` or `kubernetes`".into()),
    }
}

fn list(s: &str) -> Result<Vec<String>, String> {
    let items: Vec<String> = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(str::to_owned)
        .collect();
    if items.is_empty() {
        return Err("expected a comma-separated list".into());
    }
    Ok(items)
}

/// A static member list, checked as the agent will read it (so `config`
/// refuses what `agent` would refuse).
fn static_members(s: &str) -> Result<Vec<String>, String> {
    let items = list(s)?;
    crate::discovery::StaticDiscovery::parse(&items).map_err(|e| e.to_string())?;
    Ok(items)
}

fn skew(s: &str) -> Result<InjectedSkew, String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let bad = || {
        "expected offset_ns,drift_ppb,epoch_ns[,wander_ppb_per_sqrt_s[,seed]] \
         (whole ns, ppb, whole ns, ppb/√s, whole number)"
            .to_string()
    };
    let (o, d, e, rest) = match parts[..] {
        [o, d, e] => (o, d, e, &[][..]),
        [o, d, e, ref rest @ ..] if rest.len() <= 2 => (o, d, e, rest),
        _ => return Err(bad()),
    };
    let drift_ppb: f64 = d.parse().map_err(|_| bad())?;
    if !drift_ppb.is_finite() || drift_ppb.abs() > 1e6 {
        return Err("drift_ppb must be finite and within ±1e6".into());
    }
    let wander: f64 = rest
        .first()
        .map_or(Ok(0.0), |w| w.parse().map_err(|_| bad()))?;
    if !(0.0..=1e4).contains(&wander) {
        return Err("wander_ppb_per_sqrt_s must be within 0..=10000".into());
    }
    Ok(InjectedSkew {
        offset_ns: o.parse().map_err(|_| bad())?,
        drift_ppb,
        epoch_ns: e.parse().map_err(|_| bad())?,
        wander_ppb_per_sqrt_s: wander,
        wander_seed: rest
            .get(1)
            .map_or(Ok(0), |s| s.parse().map_err(|_| bad()))?,
    })
}

fn typed<T>(
    layers: &Layers,
    name: &'static str,
    check: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<Sourced<T>>, ConfigError> {
    let Some((raw, source)) = layers.get(name) else {
        return Ok(None);
    };
    let value = check(raw.trim()).map_err(|reason| ConfigError::Invalid {
        key: name,
        value: raw.clone(),
        origin: source.clone(),
        reason,
    })?;
    Ok(Some(Sourced {
        value,
        source: source.clone(),
    }))
}

/// The agent's HTTP endpoint alone (`clockmesh status` needs nothing else,
/// so it works where the agent's other required keys are not set).
pub fn metrics_addr(layers: &Layers) -> Result<Sourced<SocketAddr>, ConfigError> {
    required(
        typed(layers, "metrics_addr", |s| {
            s.parse().map_err(|_| "expected IP:PORT".to_string())
        })?,
        "metrics_addr",
        "metrics-addr",
    )
}

fn required<T>(
    v: Option<Sourced<T>>,
    name: &'static str,
    flag: &'static str,
) -> Result<Sourced<T>, ConfigError> {
    v.ok_or(ConfigError::Missing {
        key: name,
        flag,
        env: key(name).and_then(|k| k.env.first().copied()).unwrap_or(""),
    })
}

fn int_in<T: std::str::FromStr + PartialOrd + fmt::Display + Copy>(
    lo: T,
    hi: T,
) -> impl Fn(&str) -> Result<T, String> {
    move |s| {
        let out_of_range = || format!("must be between {lo} and {hi}");
        let v: T = s.parse().map_err(|_| {
            // A whole number the type cannot hold (70000 for a port) is out
            // of range, not malformed.
            if s.parse::<i128>().is_ok() {
                out_of_range()
            } else {
                "not a whole number".to_string()
            }
        })?;
        if v < lo || v > hi {
            return Err(out_of_range());
        }
        Ok(v)
    }
}

fn boolean(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected true/false (or 1/0, yes/no, on/off)".into()),
    }
}

fn interface_name(s: &str) -> Result<String, String> {
    // NCCL_SOCKET_IFNAME may hold a list or a prefix (`^lo`, `=eth0`): take
    // the first plain name.
    let first = s.split(',').next().unwrap_or("").trim_start_matches('=');
    if first.is_empty() || first.starts_with('^') || first.len() > 15 || first.contains('/') {
        return Err("expected a network interface name (at most 15 characters)".into());
    }
    Ok(first.to_owned())
}

fn non_empty(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(s.to_owned())
    }
}

/// A Kubernetes object name: a DNS subdomain (RFC 1123), or a DNS label
/// (at most 63 characters, no dots) where `label` is set (namespaces).
fn kube_name(label: bool) -> impl Fn(&str) -> Result<String, String> {
    move |s| {
        let max = if label { 63 } else { 253 };
        let parts_ok = s.split('.').all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !p.starts_with('-')
                && !p.ends_with('-')
        });
        if s.is_empty() || s.len() > max || !parts_ok || (label && s.contains('.')) {
            let what = if label {
                "a DNS label"
            } else {
                "a DNS subdomain"
            };
            return Err(format!(
                "expected a Kubernetes name ({what}: lowercase letters, digits, '-', at most {max} characters)"
            ));
        }
        Ok(s.to_owned())
    }
}

fn path(s: &str) -> Result<PathBuf, String> {
    non_empty(s).map(PathBuf::from)
}

impl AgentConfig {
    /// Validates `layers`; `hostname` fills `node_name` when unset.
    #[expect(
        clippy::too_many_lines,
        reason = "one line per configuration key, until each key is defined in one place"
    )]
    pub fn from_layers(layers: &Layers, hostname: &str) -> Result<Self, ConfigError> {
        let host_default = Sourced {
            value: hostname.to_owned(),
            source: Source::Default,
        };
        let cfg = AgentConfig {
            enabled: required(typed(layers, "enabled", boolean)?, "enabled", "enabled")?,
            interface: required(
                typed(layers, "interface", interface_name)?,
                "interface",
                "interface",
            )?,
            node_name: typed(layers, "node_name", non_empty)?.unwrap_or(host_default),
            probe_port: required(
                typed(layers, "probe_port", int_in(1u16, u16::MAX))?,
                "probe_port",
                "probe-port",
            )?,
            probe_cadence_us: required(
                typed(layers, "probe_cadence_us", int_in(50u64, 10_000_000))?,
                "probe_cadence_us",
                "probe-cadence-us",
            )?,
            packet_spacing_us: required(
                typed(layers, "packet_spacing_us", int_in(1u64, 100_000))?,
                "packet_spacing_us",
                "packet-spacing-us",
            )?,
            probe_window_s: required(
                typed(layers, "probe_window_s", int_in(1u64, 3600))?,
                "probe_window_s",
                "probe-window-s",
            )?,
            degree: required(
                typed(
                    layers,
                    "degree",
                    int_in(1usize, crate::probe::graph::MAX_DEGREE),
                )?,
                "degree",
                "degree",
            )?,
            tracepoint_stamps: required(
                typed(layers, "tracepoint_stamps", tracepoint_stamps)?,
                "tracepoint_stamps",
                "tracepoint-stamps",
            )?,
            max_path_asymmetry_ns: typed(
                layers,
                "max_path_asymmetry_ns",
                int_in(0u64, 1_000_000_000),
            )?,
            output_dir: required(
                typed(layers, "output_dir", path)?,
                "output_dir",
                "output-dir",
            )?,
            offsets_path: required(
                typed(layers, "offsets_path", path)?,
                "offsets_path",
                "offsets-path",
            )?,
            holdover_max_bound_ns: required(
                typed(layers, "holdover_max_bound_ns", int_in(0u64, 1_000_000_000))?,
                "holdover_max_bound_ns",
                "holdover-max-bound-ns",
            )?,
            metrics_addr: metrics_addr(layers)?,
            snapshot_period_ms: required(
                typed(layers, "snapshot_period_ms", int_in(1u64, 3_600_000))?,
                "snapshot_period_ms",
                "snapshot-period-ms",
            )?,
            gpu_clock: required(
                typed(layers, "gpu_clock", gpu_clock_kind)?,
                "gpu_clock",
                "gpu-clock",
            )?,
            gpu_devices: required(
                typed(layers, "gpu_devices", gpu_devices)?,
                "gpu_devices",
                "gpu-devices",
            )?,
            auth_key_file: typed(layers, "auth_key_file", path)?,
            discovery: required(
                typed(layers, "discovery", discovery_kind)?,
                "discovery",
                "discovery",
            )?,
            members: typed(layers, "members", static_members)?,
            etcd_endpoints: required(
                typed(layers, "etcd_endpoints", list)?,
                "etcd_endpoints",
                "etcd-endpoints",
            )?,
            cluster: required(typed(layers, "cluster", non_empty)?, "cluster", "cluster")?,
            kube_namespace: required(
                typed(layers, "kube_namespace", kube_name(true))?,
                "kube_namespace",
                "kube-namespace",
            )?,
            kube_selector: required(
                typed(layers, "kube_selector", non_empty)?,
                "kube_selector",
                "kube-selector",
            )?,
            kube_lease: required(
                typed(layers, "kube_lease", kube_name(false))?,
                "kube_lease",
                "kube-lease",
            )?,
            advertise_addr: typed(layers, "advertise_addr", |s| {
                s.parse().map_err(|_| "expected an IP address".to_string())
            })?,
            inject_skew: typed(layers, "inject_skew", skew)?,
        };
        cfg.check_consistency()?;
        Ok(cfg)
    }

    /// Cross-key rules: a pair must fit in its cadence.
    fn check_consistency(&self) -> Result<(), ConfigError> {
        if self.packet_spacing_us.value >= self.probe_cadence_us.value {
            return Err(ConfigError::Invalid {
                key: "packet_spacing_us",
                value: self.packet_spacing_us.value.to_string(),
                origin: self.packet_spacing_us.source.clone(),
                reason: format!(
                    "must be less than probe_cadence_us ({}, from {})",
                    self.probe_cadence_us.value, self.probe_cadence_us.source
                ),
            });
        }
        Ok(())
    }
}

/// Where the config file comes from: `--config`, else the environment.
pub fn config_file(
    flag: Option<&Path>,
    lookup: impl Fn(&str) -> Option<String>,
) -> Option<PathBuf> {
    flag.map(Path::to_path_buf)
        .or_else(|| CONFIG_ENV.iter().find_map(|v| lookup(v)).map(PathBuf::from))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A row of docs/configuration.md's key table: key, env names, file
    /// aliases, default (`–` in the table: none).
    type DocRow = (String, Vec<String>, Vec<String>, Option<String>);

    fn doc_rows() -> Vec<DocRow> {
        let text = include_str!("../../docs/configuration.md");
        let names = |cell: &str| -> Vec<String> {
            cell.split(',')
                .map(|c| c.trim().trim_matches('`').to_string())
                .filter(|c| !c.is_empty() && c != "–")
                .collect()
        };
        text.lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let default = cells[4].trim_matches('`');
                (
                    cells[1].trim_matches('`').to_string(),
                    names(cells[2]),
                    names(cells[3]),
                    (default != "–").then(|| default.to_string()),
                )
            })
            .collect()
    }

    /// docs/configuration.md lists every key as KEYS defines it: name,
    /// environment variables, file aliases and default.
    #[test]
    fn the_configuration_docs_match_the_keys() {
        let rows = doc_rows();
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for k in KEYS {
            let row = rows.iter().find(|r| r.0 == k.name);
            let want = (
                k.name.to_string(),
                strings(k.env),
                strings(k.file_aliases),
                k.default.map(str::to_string),
            );
            assert_eq!(row, Some(&want), "docs/configuration.md, key {}", k.name);
        }
        for r in &rows {
            assert!(
                KEYS.iter().any(|k| k.name == r.0),
                "docs/configuration.md lists {}, which is no key",
                r.0
            );
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "clockmesh-config-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn precedence_is_default_file_env_flag() {
        let dir = tempdir();
        let file = write(
            &dir,
            "c.toml",
            "interface = \"eth1\"\nprobe_cadence_us = 2000\nprobe_window_s = 8\nk = 6\n",
        );
        let mut l = Layers::with_defaults();
        l.apply_file(&file).unwrap();
        l.apply_env(env(&[
            ("XLA_PROBE_CADENCE_US", "1000"),
            ("NCCL_SOCKET_IFNAME", "ib0,eth0"),
        ]));
        l.apply_flag("interface", "eth9".into(), "--interface")
            .unwrap();
        let c = AgentConfig::from_layers(&l, "node-a").unwrap();
        assert_eq!(c.interface.value, "eth9");
        assert_eq!(c.interface.source, Source::Flag("--interface".into()));
        assert_eq!(
            (c.probe_cadence_us.value, c.probe_cadence_us.source.clone()),
            (1000, Source::Env("XLA_PROBE_CADENCE_US".into()))
        );
        assert_eq!(
            (c.probe_window_s.value, c.probe_window_s.source.clone()),
            (8, Source::File(file))
        );
        assert_eq!(c.degree.value, 6, "file alias k");
        assert_eq!(
            (
                c.packet_spacing_us.value,
                c.packet_spacing_us.source.clone()
            ),
            (100, Source::Default)
        );
        assert_eq!(c.node_name.value, "node-a");
    }

    #[test]
    fn clockmesh_names_win_over_seed_names_and_nccl_lists_work() {
        let mut l = Layers::with_defaults();
        l.apply_env(env(&[
            ("CLOCKMESH_PROBE_CADENCE_US", "500"),
            ("XLA_PROBE_CADENCE_US", "900"),
            ("NCCL_SOCKET_IFNAME", "=ens5,ens6"),
        ]));
        let c = AgentConfig::from_layers(&l, "h").unwrap();
        assert_eq!(c.probe_cadence_us.value, 500);
        assert_eq!(c.interface.value, "ens5");
    }

    #[test]
    fn json_files_work_too() {
        let dir = tempdir();
        let file = write(
            &dir,
            "c.json",
            r#"{"interface": "eth0", "enabled": false, "snapshot_period_ms": 250}"#,
        );
        let mut l = Layers::with_defaults();
        l.apply_file(&file).unwrap();
        let c = AgentConfig::from_layers(&l, "h").unwrap();
        assert!(!c.enabled.value);
        assert_eq!(c.snapshot_period_ms.value, 250);
    }

    #[test]
    fn holdover_ceiling_defaults_to_10_us_and_layers_like_every_key() {
        let mut l = Layers::with_defaults();
        l.apply_set("interface=eth0").unwrap();
        let c = AgentConfig::from_layers(&l, "h").unwrap();
        assert_eq!(
            (
                c.holdover_max_bound_ns.value,
                &c.holdover_max_bound_ns.source
            ),
            (10_000, &Source::Default)
        );
        l.apply_env(env(&[("CLOCKMESH_HOLDOVER_MAX_BOUND_NS", "0")]));
        let c = AgentConfig::from_layers(&l, "h").unwrap();
        assert_eq!(c.holdover_max_bound_ns.value, 0, "0 turns holdover off");
        l.apply_flag(
            "holdover_max_bound_ns",
            "250000".into(),
            "--holdover-max-bound-ns",
        )
        .unwrap();
        let c = AgentConfig::from_layers(&l, "h").unwrap();
        assert_eq!(
            (
                c.holdover_max_bound_ns.value,
                &c.holdover_max_bound_ns.source
            ),
            (250_000, &Source::Flag("--holdover-max-bound-ns".into()))
        );
        l.apply_set("holdover_max_bound_ns=2000000000").unwrap();
        let err = AgentConfig::from_layers(&l, "h").unwrap_err().to_string();
        assert!(
            err.contains(
                "holdover_max_bound_ns (from flag --set holdover_max_bound_ns): must be between 0 and 1000000000"
            ),
            "{err}"
        );
    }

    #[test]
    fn every_error_names_key_and_source() {
        let dir = tempdir();
        let cases: Vec<(Layers, &str)> = vec![
            (
                {
                    let mut l = Layers::with_defaults();
                    l.apply_env(env(&[
                        ("NCCL_SOCKET_IFNAME", "eth0"),
                        ("XLA_PROBE_WINDOW_S", "soon"),
                    ]));
                    l
                },
                "probe_window_s (from environment variable XLA_PROBE_WINDOW_S): not a whole number",
            ),
            (
                {
                    let mut l = Layers::with_defaults();
                    l.apply_set("interface=eth0").unwrap();
                    l.apply_set("degree=50").unwrap();
                    l
                },
                "degree (from flag --set degree): must be between 1 and 20",
            ),
            (
                {
                    let mut l = Layers::with_defaults();
                    l.apply_set("interface=^lo").unwrap();
                    l
                },
                "interface (from flag --set interface)",
            ),
            (
                {
                    let mut l = Layers::with_defaults();
                    l.apply_set("interface=eth0").unwrap();
                    l.apply_set("probe_cadence_us=800").unwrap();
                    l.apply_set("packet_spacing_us=900").unwrap();
                    l
                },
                "packet_spacing_us (from flag --set packet_spacing_us): must be less than probe_cadence_us (800, from flag --set probe_cadence_us)",
            ),
            (
                Layers::with_defaults(),
                "interface must be set (flag --interface, or CLOCKMESH_INTERFACE)",
            ),
            (
                {
                    let mut l = Layers::with_defaults();
                    l.apply_set("interface=eth0").unwrap();
                    l.apply_set("enabled=maybe").unwrap();
                    l
                },
                "enabled (from flag --set enabled): expected true/false",
            ),
        ];
        for (layers, expected) in cases {
            let err = AgentConfig::from_layers(&layers, "h")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
        let mut l = Layers::with_defaults();
        let bad_toml = write(&dir, "bad.toml", "interface = ");
        assert!(
            l.apply_file(&bad_toml)
                .unwrap_err()
                .to_string()
                .contains("not valid TOML")
        );
        let unknown = write(&dir, "u.json", r#"{"probe_cadense_us": 5}"#);
        let err = l.apply_file(&unknown).unwrap_err().to_string();
        assert!(
            err.contains("unknown key \"probe_cadense_us\" in file"),
            "{err}"
        );
        let err = l
            .apply_file(&dir.join("missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read config file"), "{err}");
        assert!(
            l.apply_set("novalue")
                .unwrap_err()
                .to_string()
                .contains("KEY=VALUE")
        );
        let arr = write(&dir, "a.json", "[1]");
        assert!(
            l.apply_file(&arr)
                .unwrap_err()
                .to_string()
                .contains("must be an object")
        );
    }

    #[test]
    fn kubernetes_discovery_keys() {
        let mut l = Layers::with_defaults();
        l.apply_set("interface=eth0").unwrap();
        let c = AgentConfig::from_layers(&l, "h").unwrap();
        assert_eq!(c.kube_namespace.value, "clockmesh");
        assert_eq!(c.kube_selector.value, "app.kubernetes.io/name=clockmesh");
        assert_eq!(
            (c.kube_lease.value.as_str(), &c.kube_lease.source),
            ("clockmesh-leader", &Source::Default)
        );
        l.apply_env(env(&[
            ("CLOCKMESH_DISCOVERY", "Kubernetes"),
            ("CLOCKMESH_KUBE_NAMESPACE", "infra"),
            ("CLOCKMESH_KUBE_SELECTOR", "app=clockmesh,tier=gpu"),
            ("CLOCKMESH_KUBE_LEASE", "clockmesh.leader-2"),
        ]));
        let c = AgentConfig::from_layers(&l, "h").unwrap();
        assert_eq!(c.discovery.value, DiscoveryKind::Kubernetes);
        assert_eq!(
            (c.kube_namespace.value.as_str(), &c.kube_namespace.source),
            ("infra", &Source::Env("CLOCKMESH_KUBE_NAMESPACE".into()))
        );
        assert_eq!(c.kube_selector.value, "app=clockmesh,tier=gpu");
        assert_eq!(c.kube_lease.value, "clockmesh.leader-2");
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["discovery"]["value"], "kubernetes");
        for (set, expected) in [
            (
                "kube_namespace=Infra",
                "kube_namespace (from flag --set kube_namespace)",
            ),
            ("kube_namespace=a.b", "DNS label"),
            (
                "kube_lease=-leader",
                "kube_lease (from flag --set kube_lease)",
            ),
            (
                "kube_selector=",
                "kube_selector (from flag --set kube_selector): must not be empty",
            ),
            (
                "discovery=consul",
                "expected `static`, `etcd` or `kubernetes`",
            ),
        ] {
            let mut bad = l.clone();
            bad.apply_set(set).unwrap();
            let err = AgentConfig::from_layers(&bad, "h").unwrap_err().to_string();
            assert!(
                err.contains(expected),
                "{set}: {err:?} should contain {expected:?}"
            );
        }
    }

    #[test]
    fn config_file_from_flag_or_env() {
        let lookup = env(&[("XLA_DIST_PROF_CONFIG", "/etc/x.json")]);
        assert_eq!(
            config_file(None, &lookup),
            Some(PathBuf::from("/etc/x.json"))
        );
        assert_eq!(
            config_file(Some(Path::new("/a.toml")), &lookup),
            Some(PathBuf::from("/a.toml"))
        );
        assert_eq!(config_file(None, env(&[])), None);
    }

    #[test]
    fn shipped_example_configs_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/config");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let mut l = Layers::with_defaults();
            l.apply_file(&path).unwrap();
            AgentConfig::from_layers(&l, "h").unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
        assert!(n >= 3, "default, aggressive, conservative");
    }
}
