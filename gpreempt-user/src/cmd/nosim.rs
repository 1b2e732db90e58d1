//! `sim` in a build without the emulator (the packaged binary): it says so, and how to get one.

use std::process::ExitCode;

use anyhow::Result;

use super::Global;

/// What `sim` says in a build without the `sim` feature.
pub const ABSENT: &str = "this build of gpreempt-ebpf has no emulator: `sim` is a build \
    feature that the packaged binary leaves out. From the source tree, `sudo cargo xtask demo` \
    builds one and runs the demo, or `cargo build --release --features gpreempt-user/sim` builds \
    target/release/gpreempt-ebpf with it (docs/sim.md)";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Whatever `sim` would take; this build has no emulator to give it to.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    pub args: Vec<String>,
}

pub fn main(_g: &Global, _args: &Args) -> Result<ExitCode> {
    anyhow::bail!(ABSENT)
}
