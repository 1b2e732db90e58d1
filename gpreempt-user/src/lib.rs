//! gpreempt-ebpf: watch AMD GPU compute queues (amdkfd) with eBPF and preempt them by policy.
pub mod cli;
pub mod events;
pub mod probe;
pub mod sim;
pub mod trace;
