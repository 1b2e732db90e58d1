//! `gpreempt-ebpf doctor`: is this host ready, and what to change if not (the checks live in
//! [`crate::doctor`]).

use std::process::ExitCode;

use anyhow::Result;
use clap::Args as ClapArgs;

use super::Global;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// One JSON document: {"checks": [{name, verdict, finding, fix}], "ok", "warn", "fail"}.
    #[arg(long)]
    pub json: bool,
}

pub fn main(g: &Global, args: &Args) -> Result<ExitCode> {
    crate::doctor::main(&g.kfd_device, args.json)
}
