//! `cargo xtask bench`: tracer overhead and ring-buffer throughput, measured side by side in one run.
use anyhow::Result;

#[derive(clap::Args)]
pub struct BenchArgs {}

pub fn run(_args: &BenchArgs) -> Result<()> {
    anyhow::bail!("the benchmark is being written")
}
