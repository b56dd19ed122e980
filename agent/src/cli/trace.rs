//! `clockmesh trace ...` (publication issue).
#[derive(clap::Args, Debug)]
pub struct TraceArgs {}

pub fn run(_args: TraceArgs) -> anyhow::Result<()> {
    anyhow::bail!("trace: not built yet")
}
