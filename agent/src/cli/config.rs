//! `clockmesh config`: print the effective configuration and where each value
//! came from (default, file, environment variable, flag). The same flags are
//! accepted by every command that runs the agent.
use std::path::PathBuf;

use clockmesh::config::{self, AgentConfig, Layers};

/// Configuration flags (highest priority; see `docs/configuration.md`):
/// `--config`, `--set`, and one flag per configuration key, made from
/// [`config::KEYS`] (its name with dashes, value name and help).
#[derive(Debug, Default)]
pub struct ConfigFlags {
    /// Config file, TOML (`.toml`) or JSON.
    pub config: Option<PathBuf>,
    /// Each key given as a flag: (key, flag, value), in command-line order.
    pub keys: Vec<(&'static str, String, String)>,
    /// `--set KEY=VALUE`, in order.
    pub set: Vec<String>,
}

/// The id of a key's flag in clap's matches: the key's name.
fn key_arg(k: &config::Key) -> clap::Arg {
    let mut help = k.help.to_owned();
    let env = k.env.join(", ");
    help.push_str(&format!(" [env: {env}]"));
    if let Some(r) = k.range_text() {
        help.push_str(&format!(" [range: {r}]"));
    }
    if let Some(d) = k.default_text() {
        help.push_str(&format!(" [default: {d}]"));
    }
    clap::Arg::new(k.name)
        .long(k.long_name())
        .value_name(k.value_name)
        .allow_hyphen_values(k.hyphen_values)
        .action(clap::ArgAction::Set)
        .help(help)
}

impl clap::Args for ConfigFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let cmd = cmd
            .arg(
                clap::Arg::new("config")
                    .long("config")
                    .value_name("FILE")
                    .value_parser(clap::value_parser!(PathBuf))
                    .help(format!(
                        "Config file, TOML (`.toml`) or JSON [env: {}]",
                        config::CONFIG_ENV.join(", ")
                    )),
            )
            .arg(
                clap::Arg::new("set")
                    .long("set")
                    .value_name("KEY=VALUE")
                    .action(clap::ArgAction::Append)
                    .help("Any key as KEY=VALUE (repeatable), e.g. `--set degree=8`"),
            );
        config::KEYS.iter().fold(cmd, |cmd, k| cmd.arg(key_arg(k)))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for ConfigFlags {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = ConfigFlags::default();
        flags.update_from_arg_matches(m)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        if let Some(p) = m.get_one::<PathBuf>("config") {
            self.config = Some(p.clone());
        }
        if let Some(v) = m.get_many::<String>("set") {
            self.set.extend(v.cloned());
        }
        let mut given: Vec<(usize, &config::Key, String)> = config::KEYS
            .iter()
            .filter_map(|k| {
                let value = m.get_one::<String>(k.name)?.clone();
                let at = m.index_of(k.name).unwrap_or(usize::MAX);
                Some((at, k, value))
            })
            .collect();
        given.sort_by_key(|(at, ..)| *at);
        self.keys.extend(
            given
                .into_iter()
                .map(|(_, k, value)| (k.name, k.flag(), value)),
        );
        Ok(())
    }
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
        for (key, flag, value) in &self.keys {
            layers.apply_flag(key, value.clone(), flag)?;
        }
        for s in &self.set {
            layers.apply_set(s)?;
        }
        Ok(layers)
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
