//! gpreempt-ebpf: watch AMD GPU compute queues (amdkfd) with eBPF and preempt them by policy.
pub mod cli;
pub mod clock;
pub mod events;
pub mod kfd;
pub mod probe;
pub mod procinfo;
pub mod queues;
pub mod sampler;
pub mod sim;
pub mod state;
pub mod top;
pub mod trace;
pub mod tui;
pub mod watch;
