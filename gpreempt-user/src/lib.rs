//! gpreempt-ebpf: watch GPU compute queues (amdkfd; NVIDIA RM) with eBPF and preempt them by policy.
//!
//! The data flows one way (docs/architecture.md):
//! kernel -> [`observe`] (load probes, decode records, the vendors' readers, the pure host
//! model, watch the host) -> [`tui`] / [`trace`] / [`policy`] (pure decisions) -> [`backend`]
//! (the seam, and each vendor's control beside it). [`controller`] runs the acting side, [`cmd`]
//! holds one file per command, [`doctor`] checks the host. Folders import only down the layers
//! of docs/architecture.md (checked by `tests/tests/layers.rs`).
pub mod backend;
pub mod cli;
pub mod clock;
pub mod cmd;
pub mod controller;
pub mod doctor;
#[cfg(test)]
mod fuzz_tests;
pub mod lever;
pub mod observe;
pub mod outcome;
pub mod policy;
pub mod rundir;
pub mod term;
pub mod trace;
pub mod tui;
