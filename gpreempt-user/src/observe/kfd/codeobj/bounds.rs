//! Bounds on what reading a process's code objects may cost: the loader list and the symbol
//! reader both spend from one [`Limits`].

use std::cell::Cell;
use std::time::{Duration, Instant};

/// Bounds on what a (possibly hostile or half-updated) process can make us read.
pub(super) const MAX_ENTRIES: usize = 4096;
pub(super) const MAX_URI: usize = 4096;
/// Per code object, and for all the bytes one call reads.
pub(super) const MAX_OBJECT_BYTES: u64 = 256 << 20;
pub(super) const READ_BUDGET: u64 = 256 << 20;
/// Kernels named by one call, at most (past it the rest are left unnamed), and the length of one
/// name (a longer one is cut, ending in `…`): a hostile code object cannot make the names cost
/// more than about 64 MiB.
pub const MAX_KERNELS: usize = 65_536;
pub const MAX_NAME_BYTES: usize = 1024;
/// How long one call may spend reading code objects (checked at every read; an open has its
/// own bound, [`target_file::OPEN_TIMEOUT`](crate::observe::target_file::OPEN_TIMEOUT)). What is left is skipped with this reason.
pub const READ_TIME: Duration = Duration::from_secs(2);

/// What one call may still spend.
pub(super) struct Limits {
    pub(super) bytes: Cell<u64>,
    pub(super) kernels: Cell<usize>,
    /// The kernel bound cut a code object's names short (they are then not shared).
    pub(super) cut: Cell<bool>,
    pub(super) deadline: Instant,
}

impl Limits {
    pub(super) fn new() -> Self {
        Limits {
            bytes: Cell::new(READ_BUDGET),
            kernels: Cell::new(MAX_KERNELS),
            cut: Cell::new(false),
            deadline: Instant::now() + READ_TIME,
        }
    }
}
