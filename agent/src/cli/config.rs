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
    /// Any key as KEY=VALUE (repeatable), e.g. `--set degree=8`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl ConfigFlags {
    /// Builds the layered configuration from the process environment.
    pub fn resolve(&self) -> anyhow::Result<AgentConfig> {
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
        ];
        for (key, flag, value) in flags {
            if let Some(v) = value {
                layers.apply_flag(key, v, flag)?;
            }
        }
        for s in &self.set {
            layers.apply_set(s)?;
        }
        Ok(AgentConfig::from_layers(&layers, &hostname())?)
    }
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
    let cfg = args.flags.resolve()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cfg)?);
        return Ok(());
    }
    let value = serde_json::to_value(&cfg)?;
    let serde_json::Value::Object(map) = value else {
        anyhow::bail!("configuration did not serialise to an object");
    };
    println!("{:<20} {:<28} source", "key", "value");
    for (key, entry) in map {
        let (v, src) = match &entry {
            serde_json::Value::Null => ("(unset)".to_string(), "-".to_string()),
            e => (plain(&e["value"]), describe_source(&e["source"])),
        };
        println!("{key:<20} {v:<28} {src}");
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
