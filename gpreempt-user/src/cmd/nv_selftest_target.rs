//! `nv-selftest-target` (hidden): the CUDA process of our own that the NVIDIA backend's start-up
//! check pauses and resumes ([`crate::backend::nv::selftest`]).

use std::process::ExitCode;

use anyhow::Result;

pub use crate::backend::nv::selftest::TargetArgs as Args;

pub fn main(args: &Args) -> Result<ExitCode> {
    crate::backend::nv::selftest::target_main(args)
}
