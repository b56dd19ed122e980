//! `clockmesh capture` (foundation issue).
#[derive(clap::Args, Debug)]
pub struct CaptureArgs {}

pub fn run(_args: CaptureArgs) -> anyhow::Result<()> {
    anyhow::bail!("capture: not built yet")
}
