//! `clockmesh gpu-clock ...` (device-clock issue).
#[derive(clap::Args, Debug)]
pub struct GpuArgs {}

pub fn run(_args: GpuArgs) -> anyhow::Result<()> {
    anyhow::bail!("gpu-clock: not built yet")
}
