//! `nv-guardian` (hidden): the guardian process a controller starts for itself; it resumes what
//! the controller paused when the controller goes ([`crate::backend::guardian`]).

use std::process::ExitCode;

use anyhow::Result;

pub use crate::backend::guardian::Args;

pub fn main(args: &Args) -> Result<ExitCode> {
    crate::backend::guardian::main(args)
}
