//! `clockmesh simulate` (estimator issue).
#[derive(clap::Args, Debug)]
pub struct SimulateArgs {}

pub fn run(_args: SimulateArgs) -> anyhow::Result<()> {
    anyhow::bail!("simulate: not built yet")
}
