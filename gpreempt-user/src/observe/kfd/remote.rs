//! Reading another process's memory: the sampler and the code-object reader share it, and
//! neither depends on the other.

use std::io::IoSliceMut;

use nix::{sys::uio::RemoteIoVec, unistd::Pid};

/// Reads `remote` ranges of `pid`'s memory back to back into `buf` in one syscall; returns the
/// bytes read (the kernel stops at the first range that faults).
pub fn read_remote(pid: u32, remote: &[RemoteIoVec], buf: &mut [u8]) -> nix::Result<usize> {
    nix::sys::uio::process_vm_readv(
        Pid::from_raw(pid as i32),
        &mut [IoSliceMut::new(buf)],
        remote,
    )
}

/// The little-endian u32 at `off` of `b`.
pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
