//! `clockmesh agent`: run the node agent until SIGTERM or Ctrl-C.
use anyhow::Context as _;
#[cfg(feature = "etcd")]
use clockmesh::discovery::etcd::{EtcdConfig, EtcdDiscovery};
#[cfg(feature = "kubernetes")]
use clockmesh::discovery::kubernetes::{KubeConfig, KubeDiscovery};
use clockmesh::{
    config::DiscoveryKind,
    discovery::StaticDiscovery,
    runtime::{self, RuntimeError},
};
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

use super::config::ConfigFlags;

#[derive(clap::Args, Debug)]
#[command(
    long_about = "Run the clockmesh node agent: register with the membership backend, probe the \
    neighbours the probe graph assigns with eBPF-timestamped coded pairs, fit every out-edge each \
    window, solve the network on the leader and publish this node's offset to the offsets file, \
    the JSONL history and /metrics. Needs root or CAP_BPF+CAP_PERFMON+CAP_NET_ADMIN. Stops on \
    SIGTERM/SIGINT: the offsets file is marked stale, the node leaves the cluster and the eBPF \
    programs are detached.\n\nEvery setting can come from defaults < config file < environment < \
    flags; `clockmesh config` shows the effective values."
)]
pub struct AgentArgs {
    #[command(flatten)]
    flags: ConfigFlags,
}

pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    let cfg = args.flags.resolve()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = shutdown_signal()?;
        match cfg.discovery.value {
            DiscoveryKind::Static => {
                let members = cfg.members.as_ref().ok_or(RuntimeError::NoMembers)?;
                let d = StaticDiscovery::parse(&members.value)
                    .with_context(|| format!("members (from {})", members.source))?;
                runtime::run(cfg, d, shutdown).await?;
            }
            #[cfg(feature = "etcd")]
            DiscoveryKind::Etcd => {
                let d = EtcdDiscovery::connect(EtcdConfig {
                    endpoints: cfg.etcd_endpoints.value.clone(),
                    cluster: cfg.cluster.value.clone(),
                    member_ttl_s: i64::try_from(cfg.etcd_member_ttl_s.value).unwrap_or(i64::MAX),
                    campaign_ttl_s: clockmesh::discovery::ETCD_CAMPAIGN_TTL_S,
                })
                .await?;
                runtime::run(cfg, d, shutdown).await?;
            }
            #[cfg(feature = "kubernetes")]
            DiscoveryKind::Kubernetes => {
                let d = KubeDiscovery::connect(KubeConfig {
                    namespace: cfg.kube_namespace.value.clone(),
                    selector: cfg.kube_selector.value.clone(),
                    lease: cfg.kube_lease.value.clone(),
                    probe_port: cfg.probe_port.value,
                    pod_name: None,
                })
                .await?;
                runtime::run(cfg, d, shutdown).await?;
            }
            #[cfg(not(all(feature = "etcd", feature = "kubernetes")))]
            other => anyhow::bail!(
                "discovery = {} needs a clockmesh built with the `{}` cargo feature (part of the default build)",
                other.as_str(),
                other.as_str()
            ),
        }
        Ok(())
    })
}

fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()>> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: shutting down"),
            _ = int.recv() => info!("SIGINT: shutting down"),
        }
    })
}
