//! gpreempt-sim: an emulated AMD GPU (KFD) that real processes drive through real syscalls.
//!
//! A FUSE-served `/dev/kfd` answers KFD ioctls with upstream amdkfd's semantics (`model`), emulated
//! `/sys/class/kfd` and `/sys/kernel/debug/kfd` trees show the state in the kernel's formats
//! (`views`), and a GPU model runs the AQL packets workloads write into their own memory (`gpu`).
//! `sim` mounts all of it at the real paths inside a private mount namespace and runs a command
//! there; `workload` replays measured kernel timelines as online or offline jobs. Every figure it
//! produces is emulated.

pub mod aql;
pub mod codeobj;
pub mod cpu;
pub mod device;
pub mod drm;
pub mod exec;
pub mod gpu;
pub mod host;
pub mod launchbench;
pub mod mmap;
pub mod model;
pub mod run;
pub mod spec;
pub mod topology;
pub mod views;
pub mod workload;
