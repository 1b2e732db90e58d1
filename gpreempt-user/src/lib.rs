//! gpreempt-ebpf: watch GPU compute queues (amdkfd; NVIDIA RM) with eBPF and preempt them by policy.
//!
//! The data flows one way (docs/architecture.md):
//! kernel -> [`observe`] (load probes, decode records, watch the host) -> [`model`] (the pure
//! host model) -> [`tui`] / [`trace`] / [`policy`] (pure decisions) -> [`backend`] (the seam) ->
//! [`kfd`] / [`nv`] (vendor control). [`controller`] runs the acting side, [`cmd`] holds one
//! file per command, [`doctor`] checks the host.
pub mod backend;
pub mod cli;
pub mod clock;
pub mod cmd;
pub mod controller;
pub mod doctor;
#[cfg(test)]
mod fuzz_tests;
pub mod kfd;
pub mod model;
pub mod nv;
pub mod observe;
pub mod outcome;
pub mod policy;
pub mod rundir;
pub mod trace;
pub mod tui;
