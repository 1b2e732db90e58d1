//! The GPU engine's state kept in the model's structs (a queue's `Exec`, a GPU's `GpuExec`, the
//! `Completion`s waiting for their signals): plain data, so the model can hold it without
//! depending on the engine (gpu.rs) that advances it.

/// Per-queue execution state.
#[derive(Debug, Default, Clone)]
pub struct Exec {
    /// Packets consumed: the read_dispatch_id written back to the queue.
    pub read_id: u64,
    /// The last write_dispatch_id read from the queue, and when.
    pub write_id: u64,
    pub polled_at: u64,
    /// The poll before that: packets below `seen_write` existed at `seen_at`.
    pub seen_write: u64,
    pub seen_at: u64,
    pub kernel: Option<Kernel>,
    pub mapped_since: u64,
}

/// A dispatch on the GPU.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub seq: u64,
    pub demand: u32,
    pub alloc: u32,
    /// Solo-speed ns of work left.
    pub remaining: f64,
    /// No progress before this time (CWSR restore).
    pub resume_at: u64,
    /// Saved by CWSR while its queue was off the hardware.
    pub saved: bool,
    /// The packet's completion signal (an `amd_signal_t` address in the process; 0: none).
    pub completion_signal: u64,
}

/// A packet that completed with a completion signal: the signal's value is decremented and its
/// event mailbox written (`gpu::finish_completions`), outside the model's lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub pid: u32,
    pub signal: u64,
}

/// Per-GPU execution state.
#[derive(Debug, Default, Clone)]
pub struct GpuExec {
    pub last: u64,
    pub seq: u64,
}
