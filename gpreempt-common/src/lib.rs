//! Shared between the eBPF programs (`gpreempt-ebpf`, bpfel) and user space: the fixed-size records
//! the programs emit, the maps' key/value types, and every KFD ABI fact (`kfd`), and the ROCr queue layout (`aql`).
#![no_std]

#[cfg(test)]
extern crate std;

pub mod aql;
pub mod kfd;
pub mod kprobe;
pub mod nv;
pub mod record;
pub mod vfs;
