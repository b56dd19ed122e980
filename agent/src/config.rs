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

use clockmesh_core::{
    setting::{self, Setting, SettingValue, SettingsError},
    settings::Settings,
    time::Nanos,
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
    #[error("{key} must be set (flag {flag}, or {env})")]
    Missing {
        key: &'static str,
        flag: String,
        env: &'static str,
    },
    #[error("--set expects KEY=VALUE, got {0:?}")]
    BadSet(String),
    /// The protocol settings as core validates them.
    #[error("invalid protocol settings: {0}")]
    Settings(SettingsError),
}

/// One configuration key, as [`config_keys!`] defines it.
pub struct Key {
    pub name: &'static str,
    /// Environment variables, highest priority first.
    pub env: &'static [&'static str],
    /// Other names accepted in files.
    pub file_aliases: &'static [&'static str],
    /// The default as the text a file, variable or flag would carry
    /// (computed from the typed default where one is defined in code).
    pub default: Option<fn() -> String>,
    /// The allowed range as text (`min–max`), for a protocol setting,
    /// whose range is defined once in `clockmesh_core::setting`.
    pub range: Option<fn() -> String>,
    /// What the flag's value looks like in `--help`.
    pub value_name: &'static str,
    /// The flag's value may start with `-` (a negative number).
    pub hyphen_values: bool,
    pub help: &'static str,
}

impl Key {
    /// The command-line flag's long name: the key's with dashes
    /// (`probe-cadence-us`).
    pub fn long_name(&self) -> String {
        self.name.replace('_', "-")
    }

    /// The command-line flag (`--probe-cadence-us`).
    pub fn flag(&self) -> String {
        format!("--{}", self.long_name())
    }

    /// The default's text, if the key has one.
    pub fn default_text(&self) -> Option<String> {
        self.default.map(|f| f())
    }

    /// The allowed range's text, if the key is a protocol setting.
    pub fn range_text(&self) -> Option<String> {
        self.range.map(|f| f())
    }
}

/// A key's default, as text: none, a protocol setting's (`setting
/// DESCRIPTOR`: its default, if it has one), or a typed value's `Display`.
macro_rules! key_default {
    () => {
        None
    };
    (setting $setting:path) => {
        match $setting.default {
            Some(_) => Some(|| {
                $setting
                    .default
                    .map_or_else(String::new, |d| $setting.units(d).to_string())
            }),
            None => None,
        }
    };
    ($value:expr) => {
        Some(|| ToString::to_string(&$value))
    };
}

/// A key's range, as text: a protocol setting's (`setting DESCRIPTOR`),
/// else none (the key's parser holds its rule).
macro_rules! key_range {
    (setting $setting:path) => {
        Some(|| $setting.range_text())
    };
    ($($other:tt)*) => {
        None
    };
}

/// The field type of a key in [`AgentConfig`].
macro_rules! key_field {
    (required, $ty:ty) => { Sourced<$ty> };
    (host_name, $ty:ty) => { Sourced<$ty> };
    (optional, $ty:ty) => { Option<Sourced<$ty>> };
}

/// A key's typed value from the layers.
macro_rules! key_value {
    (required, $layers:expr, $host:expr, $name:expr, $parse:expr) => {
        required(typed($layers, $name, $parse)?, $name)?
    };
    (host_name, $layers:expr, $host:expr, $name:expr, $parse:expr) => {
        typed($layers, $name, $parse)?.unwrap_or_else(|| Sourced {
            value: $host.to_owned(),
            source: Source::Default,
        })
    };
    (optional, $layers:expr, $host:expr, $name:expr, $parse:expr) => {
        typed($layers, $name, $parse)?
    };
}

/// Every configuration key, each defined once: its typed field in
/// [`AgentConfig`] and whether it must have a value, the parser that
/// checks it, its environment variables, file aliases, default, the
/// flag's value name and the help text. A protocol setting's default,
/// range and help come from its one definition in
/// `clockmesh_core::setting` (`default: [setting DESCRIPTOR]`, parsed by
/// [`setting_in`]), not from here. [`KEYS`] (files, environment, `--set`,
/// the flags of `clockmesh agent` and `clockmesh config`, and the docs
/// test) and [`AgentConfig::from_layers`] come from this one list.
macro_rules! config_keys {
    ($(
        $(#[$attr:meta])*
        $field:ident: $ty:ty = $presence:ident($parse:expr) {
            env: [$($env:literal),* $(,)?],
            aliases: [$($alias:literal),* $(,)?],
            default: [$($default:tt)*],
            value: $value_name:literal,
            $(hyphen_values: $hyphen:literal,)?
            help: $help:expr $(,)?
        }
    ),* $(,)?) => {
        /// All keys, in the order `clockmesh config` prints them.
        pub const KEYS: &[Key] = &[$(
            Key {
                name: stringify!($field),
                env: &[$($env),*],
                file_aliases: &[$($alias),*],
                default: key_default!($($default)*),
                range: key_range!($($default)*),
                value_name: $value_name,
                hyphen_values: false $(|| $hyphen)?,
                help: $help,
            }
        ),*];

        /// The typed, validated configuration.
        #[derive(Clone, Debug, PartialEq, Serialize)]
        pub struct AgentConfig {
            $($(#[$attr])* pub $field: key_field!($presence, $ty),)*
        }

        impl AgentConfig {
            /// Every key parsed, before the cross-key rules.
            fn parse_keys(layers: &Layers, hostname: &str) -> Result<Self, ConfigError> {
                Ok(AgentConfig {
                    $($field: key_value!(
                        $presence, layers, hostname, stringify!($field), $parse
                    ),)*
                })
            }
        }
    };
}

config_keys! {
    enabled: bool = required(boolean) {
        env: ["CLOCKMESH_ENABLED", "XLA_ENABLE_DISTRIBUTED_PROFILING"],
        aliases: [],
        default: [true],
        value: "true|false",
        help: "run probing at all (false: the agent idles)",
    },
    interface: String = required(interface_name) {
        env: ["CLOCKMESH_INTERFACE", "NCCL_SOCKET_IFNAME"],
        aliases: ["probe_interface"],
        default: [],
        value: "IFACE",
        help: "network interface probes use (the NCCL data interface)",
    },
    node_name: String = host_name(non_empty) {
        env: ["CLOCKMESH_NODE_NAME", "NODE_NAME"],
        aliases: [],
        default: [],
        value: "NAME",
        help: "this node's name (default: the host name)",
    },
    probe_port: u16 = required(int_in(1u16, u16::MAX)) {
        env: ["CLOCKMESH_PROBE_PORT"],
        aliases: [],
        default: [31900],
        value: "PORT",
        help: "UDP port this agent owns for probes",
    },
    #[serde(serialize_with = "in_units::<_, { setting::PROBE_CADENCE_US.unit.ns() }>")]
    probe_cadence_us: Nanos = required(setting_in(&setting::PROBE_CADENCE_US)) {
        env: ["CLOCKMESH_PROBE_CADENCE_US", "XLA_PROBE_CADENCE_US"],
        aliases: [],
        default: [setting setting::PROBE_CADENCE_US],
        value: "US",
        help: setting::PROBE_CADENCE_US.doc,
    },
    #[serde(serialize_with = "in_units::<_, { setting::PACKET_SPACING_US.unit.ns() }>")]
    packet_spacing_us: Nanos = required(setting_in(&setting::PACKET_SPACING_US)) {
        env: ["CLOCKMESH_PACKET_SPACING_US", "XLA_PACKET_SPACING_US"],
        aliases: [],
        default: [setting setting::PACKET_SPACING_US],
        value: "US",
        help: setting::PACKET_SPACING_US.doc,
    },
    #[serde(serialize_with = "in_units::<_, { setting::PROBE_WINDOW_S.unit.ns() }>")]
    probe_window_s: Nanos = required(setting_in(&setting::PROBE_WINDOW_S)) {
        env: ["CLOCKMESH_PROBE_WINDOW_S", "XLA_PROBE_WINDOW_S"],
        aliases: [],
        default: [setting setting::PROBE_WINDOW_S],
        value: "S",
        help: setting::PROBE_WINDOW_S.doc,
    },
    degree: usize = required(setting_in(&setting::DEGREE)) {
        env: ["CLOCKMESH_DEGREE"],
        aliases: ["k", "out_degree"],
        default: [setting setting::DEGREE],
        value: "N",
        help: setting::DEGREE.doc,
    },
    max_pairs_per_cadence: usize = required(setting_in(&setting::MAX_PAIRS_PER_CADENCE)) {
        env: ["CLOCKMESH_MAX_PAIRS_PER_CADENCE"],
        aliases: [],
        default: [setting setting::MAX_PAIRS_PER_CADENCE],
        value: "N",
        help: setting::MAX_PAIRS_PER_CADENCE.doc,
    },
    tracepoint_stamps: TracepointStamps = required(tracepoint_stamps) {
        env: ["CLOCKMESH_TRACEPOINT_STAMPS"],
        aliases: [],
        default: ["auto"],
        value: "auto|on|off",
        help: "tp_btf stamp programs, which run for every packet on the host: `auto` (attached only once the socket's kernel stamps turn out to be missing), `on`, `off`",
    },
    #[serde(serialize_with = "optional_in_units::<_, { setting::MAX_PATH_ASYMMETRY_NS.unit.ns() }>")]
    max_path_asymmetry_ns: Nanos = optional(setting_in(&setting::MAX_PATH_ASYMMETRY_NS)) {
        env: ["CLOCKMESH_MAX_PATH_ASYMMETRY_NS"],
        aliases: [],
        default: [setting setting::MAX_PATH_ASYMMETRY_NS],
        value: "NS",
        help: setting::MAX_PATH_ASYMMETRY_NS.doc,
    },
    output_dir: PathBuf = required(path) {
        env: ["CLOCKMESH_OUTPUT_DIR", "XLA_DIST_PROF_OUTPUT_DIR"],
        aliases: [],
        default: ["/var/lib/clockmesh"],
        value: "DIR",
        help: "where per-window JSONL results go",
    },
    offsets_path: PathBuf = required(path) {
        env: ["CLOCKMESH_OFFSETS_PATH"],
        aliases: [],
        default: ["/run/clockmesh/offsets"],
        value: "FILE",
        help: "the published offsets file",
    },
    #[serde(serialize_with = "in_units::<_, { setting::HOLDOVER_MAX_BOUND_NS.unit.ns() }>")]
    holdover_max_bound_ns: Nanos = required(setting_in(&setting::HOLDOVER_MAX_BOUND_NS)) {
        env: ["CLOCKMESH_HOLDOVER_MAX_BOUND_NS"],
        aliases: [],
        default: [setting setting::HOLDOVER_MAX_BOUND_NS],
        value: "NS",
        help: setting::HOLDOVER_MAX_BOUND_NS.doc,
    },
    metrics_addr: SocketAddr = required(socket_addr) {
        env: ["CLOCKMESH_METRICS_ADDR"],
        aliases: [],
        default: ["127.0.0.1:9977"],
        value: "IP:PORT",
        help: "address of /metrics, /healthz, /readyz",
    },
    snapshot_period_ms: u64 = required(int_in(1u64, 3_600_000)) {
        env: ["CLOCKMESH_SNAPSHOT_PERIOD_MS"],
        aliases: [],
        default: [1000],
        value: "MS",
        help: "GPU clock snapshot period, ms",
    },
    gpu_clock: GpuClockKind = required(gpu_clock_kind) {
        env: ["CLOCKMESH_GPU_CLOCK"],
        aliases: [],
        default: ["off"],
        value: "off|cuda|cuda-launch|rocm|synthetic",
        help: "GPU clock source: `off`, `cuda` (ping-pong kernel), `cuda-launch` (launch per sample), `rocm` (KFD ioctl) or `synthetic`; opt-in: a CUDA context costs ≈ 0.5 GiB of GPU memory per GPU",
    },
    gpu_devices: GpuDevices = required(gpu_devices) {
        env: ["CLOCKMESH_GPU_DEVICES"],
        aliases: [],
        default: ["all"],
        value: "all|0,1,…",
        help: "GPUs whose clocks are mapped: `all` (every GPU the source finds, at most 16) or indices, e.g. `0,1`",
    },
    auth_key_file: PathBuf = optional(path) {
        env: ["CLOCKMESH_AUTH_KEY_FILE"],
        aliases: [],
        default: [],
        value: "FILE",
        help: "file holding the shared probe HMAC key (≥ 16 bytes); unset or absent file: no authentication (logged)",
    },
    discovery: DiscoveryKind = required(discovery_kind) {
        env: ["CLOCKMESH_DISCOVERY"],
        aliases: [],
        default: ["static"],
        value: "static|etcd|kubernetes",
        help: "membership backend: `static` (the `members` list), `etcd` or `kubernetes`",
    },
    members: Vec<String> = optional(static_members) {
        env: ["CLOCKMESH_MEMBERS"],
        aliases: [],
        default: [],
        value: "NAME=IP:PORT,…",
        help: "static members, `name=ip:port` (or `name#id=ip:port`), comma separated or a list in the file",
    },
    etcd_endpoints: Vec<String> = required(list) {
        env: ["CLOCKMESH_ETCD_ENDPOINTS"],
        aliases: [],
        default: ["http://127.0.0.1:2379"],
        value: "URL,…",
        help: "etcd client URLs, comma separated",
    },
    cluster: String = required(non_empty) {
        env: ["CLOCKMESH_CLUSTER"],
        aliases: [],
        default: ["default"],
        value: "NAME",
        help: "cluster name: etcd key prefix `/clockmesh/<cluster>/`",
    },
    etcd_member_ttl_s: u64 = required(int_in(2u64, 3600)) {
        env: ["CLOCKMESH_ETCD_MEMBER_TTL_S"],
        aliases: [],
        default: [crate::discovery::ETCD_MEMBER_TTL_S],
        value: "S",
        help: "`discovery = etcd`: how long an agent that went silent stays listed (its member lease's TTL; a keep-alive every third of it); the seat holders' own 10 s campaign lease bounds a leader's failover",
    },
    kube_namespace: String = required(kube_name(true)) {
        env: ["CLOCKMESH_KUBE_NAMESPACE"],
        aliases: [],
        default: ["clockmesh"],
        value: "NAMESPACE",
        help: "`discovery = kubernetes`: namespace of the agent pods and of the leader Lease (a DNS label)",
    },
    kube_selector: String = required(non_empty) {
        env: ["CLOCKMESH_KUBE_SELECTOR"],
        aliases: [],
        default: ["app.kubernetes.io/name=clockmesh"],
        value: "SELECTOR",
        help: "`discovery = kubernetes`: label selector of the agent pods",
    },
    kube_lease: String = required(kube_name(false)) {
        env: ["CLOCKMESH_KUBE_LEASE"],
        aliases: [],
        default: ["clockmesh-leader"],
        value: "NAME",
        help: "`discovery = kubernetes`: name of the leader Lease (`coordination.k8s.io/v1`)",
    },
    advertise_addr: std::net::IpAddr = optional(ip_addr) {
        env: ["CLOCKMESH_ADVERTISE_ADDR"],
        aliases: [],
        default: [],
        value: "IP",
        help: "address peers probe (default: the interface's first IPv4 address)",
    },
    inject_skew: InjectedSkew = optional(skew) {
        env: ["CLOCKMESH_INJECT_SKEW"],
        aliases: [],
        default: [],
        value: "OFFSET_NS,DRIFT_PPB,EPOCH_NS",
        hyphen_values: true,
        help: "**testing only**: `offset_ns,drift_ppb,epoch_ns[,wander_ppb_per_sqrt_s[,seed]]` added to every local stamp",
    },
}

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
            if let Some(d) = k.default_text() {
                l.values.insert(k.name, (d, Source::Default));
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

/// A span setting as its key writes it: whole units of `NS` ns
/// (`probe_cadence_us` in µs, `NS` its unit's [`setting::Unit::ns`]), so
/// `clockmesh config` shows what was set.
fn in_units<S: serde::Serializer, const NS: i64>(
    v: &Sourced<Nanos>,
    s: S,
) -> Result<S::Ok, S::Error> {
    Sourced {
        value: setting::whole_units(v.value, NS),
        source: v.source.clone(),
    }
    .serialize(s)
}

/// [`in_units`] for a setting unset by default.
fn optional_in_units<S: serde::Serializer, const NS: i64>(
    v: &Option<Sourced<Nanos>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => in_units::<S, NS>(v, s),
        None => s.serialize_none(),
    }
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

/// The skew `--inject-skew` adds (tests and the demo); a pure clock model,
/// defined beside the simulator's other synthetic clocks.
pub use clockmesh_sim::skew::InjectedSkew;

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
    required(typed(layers, "metrics_addr", socket_addr)?, "metrics_addr")
}

fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| "expected IP:PORT".to_string())
}

fn ip_addr(s: &str) -> Result<std::net::IpAddr, String> {
    s.parse().map_err(|_| "expected an IP address".to_string())
}

fn required<T>(v: Option<Sourced<T>>, name: &'static str) -> Result<Sourced<T>, ConfigError> {
    v.ok_or_else(|| ConfigError::Missing {
        key: name,
        flag: key(name).map_or_else(String::new, Key::flag),
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

/// A protocol setting's parser: a whole number within its range.
/// The key is written in whole units of the setting's unit; the value is
/// typed (a [`Nanos`] span, or a count).
fn setting_in<T: SettingValue + 'static>(
    s: &Setting<T>,
) -> impl Fn(&str) -> Result<T, String> + use<T> {
    let unit = s.unit;
    let units = int_in(s.units(s.min), s.units(s.max));
    move |text| units(text).map(|v| T::from_units(v, unit))
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
    pub fn from_layers(layers: &Layers, hostname: &str) -> Result<Self, ConfigError> {
        let cfg = Self::parse_keys(layers, hostname)?;
        cfg.check_consistency()?;
        Ok(cfg)
    }

    /// The protocol settings of this configuration.
    pub fn settings(&self) -> Settings {
        Settings {
            probe_cadence: self.probe_cadence_us.value,
            packet_spacing: self.packet_spacing_us.value,
            probe_window: self.probe_window_s.value,
            degree: self.degree.value,
            max_pairs_per_cadence: self.max_pairs_per_cadence.value,
            max_path_asymmetry: self.max_path_asymmetry_ns.as_ref().map(|s| s.value),
            holdover_max_bound: self.holdover_max_bound_ns.value,
        }
    }

    /// Cross-key rules: the protocol settings as core validates them (each
    /// key's range was already checked by its parser; a pair must fit in
    /// its cadence), reported with the values' sources.
    fn check_consistency(&self) -> Result<(), ConfigError> {
        match self.settings().validate() {
            Ok(()) => Ok(()),
            Err(SettingsError::SpacingNotBelowCadence { .. }) => Err(ConfigError::Invalid {
                key: setting::PACKET_SPACING_US.key,
                value: setting::PACKET_SPACING_US
                    .units(self.packet_spacing_us.value)
                    .to_string(),
                origin: self.packet_spacing_us.source.clone(),
                reason: format!(
                    "must be less than {} ({}, from {})",
                    setting::PROBE_CADENCE_US.key,
                    setting::PROBE_CADENCE_US.units(self.probe_cadence_us.value),
                    self.probe_cadence_us.source
                ),
            }),
            // Each key's parser checked its range already; kept for
            // whatever rule core adds.
            Err(e @ SettingsError::OutOfRange { .. }) => Err(ConfigError::Settings(e)),
        }
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
    /// aliases, default (`–` in the table: none), meaning.
    type DocRow = (String, Vec<String>, Vec<String>, Option<String>, String);

    const CONFIGURATION_MD: &str = include_str!("../../docs/configuration.md");

    /// The cells of each row of the docs table whose header starts with
    /// `header`, trimmed (the row's leading and trailing `|` left out).
    fn doc_table(header: &str) -> Vec<Vec<String>> {
        CONFIGURATION_MD
            .lines()
            .skip_while(|l| !l.starts_with(header))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let inner = &cells[1..cells.len().saturating_sub(1)];
                inner.iter().map(|c| c.to_string()).collect()
            })
            .collect()
    }

    fn doc_rows() -> Vec<DocRow> {
        let names = |cell: &str| -> Vec<String> {
            cell.split(',')
                .map(|c| c.trim().trim_matches('`').to_string())
                .filter(|c| !c.is_empty() && c != "–")
                .collect()
        };
        doc_table("| key |")
            .iter()
            .map(|cells| {
                let default = cells[3].trim_matches('`');
                (
                    cells[0].trim_matches('`').to_string(),
                    names(&cells[1]),
                    names(&cells[2]),
                    (default != "–").then(|| default.to_string()),
                    cells[4].clone(),
                )
            })
            .collect()
    }

    /// docs/configuration.md's protocol-settings table gives each
    /// setting's unit and range as `clockmesh_core::setting` defines them,
    /// and every setting is a key whose default and help are the
    /// definition's.
    #[test]
    fn the_configuration_docs_match_the_protocol_settings() {
        let rows = doc_table("| setting |");
        let settings = setting::all();
        assert_eq!(
            rows.len(),
            settings.len(),
            "docs/configuration.md: one row per setting"
        );
        for s in &settings {
            let row = rows.iter().find(|r| r[0].trim_matches('`') == s.key);
            let got = row.map(|r| (r[1].as_str(), r[2].as_str()));
            assert_eq!(
                got,
                Some((s.unit.symbol(), s.range.as_str())),
                "docs/configuration.md, setting {}: unit and range",
                s.key
            );
            let k = key(s.key).unwrap_or_else(|| panic!("setting {} is no key", s.key));
            assert_eq!(k.default_text(), s.default, "key {}: default", s.key);
            assert_eq!(
                k.range_text().as_deref(),
                Some(s.range.as_str()),
                "key {}",
                s.key
            );
            assert_eq!(k.help, s.doc, "key {}: help", s.key);
        }
    }

    /// docs/configuration.md lists every key as KEYS defines it: name,
    /// environment variables, file aliases, default, and a meaning that
    /// starts with the key's help.
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
                k.default_text(),
            );
            let got = row.map(|r| (r.0.clone(), r.1.clone(), r.2.clone(), r.3.clone()));
            assert_eq!(got, Some(want), "docs/configuration.md, key {}", k.name);
            let meaning = row.map_or("", |r| r.4.as_str());
            assert!(
                meaning.starts_with(k.help),
                "docs/configuration.md, key {}: the meaning {meaning:?} does not start with \
                 the help {:?}",
                k.name,
                k.help
            );
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
            (
                Nanos::from_micros(1000),
                Source::Env("XLA_PROBE_CADENCE_US".into())
            )
        );
        assert_eq!(
            (c.probe_window_s.value, c.probe_window_s.source.clone()),
            (Nanos::from_secs(8), Source::File(file))
        );
        assert_eq!(c.degree.value, 6, "file alias k");
        assert_eq!(
            (
                c.packet_spacing_us.value,
                c.packet_spacing_us.source.clone()
            ),
            (Nanos::from_micros(100), Source::Default)
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
        assert_eq!(c.probe_cadence_us.value, Nanos::from_micros(500));
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
            (Nanos(10_000), &Source::Default)
        );
        l.apply_env(env(&[("CLOCKMESH_HOLDOVER_MAX_BOUND_NS", "0")]));
        let c = AgentConfig::from_layers(&l, "h").unwrap();
        assert_eq!(
            c.holdover_max_bound_ns.value,
            Nanos::ZERO,
            "0 turns holdover off"
        );
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
            (
                Nanos(250_000),
                &Source::Flag("--holdover-max-bound-ns".into())
            )
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
