//! The vendor-neutral result of one suspend / resume: what happened to each queue, and when.

use serde::{Deserialize, Serialize};

/// What happened to one queue of a SUSPEND / RESUME (the kernel's per-entry status bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueOutcome {
    /// Suspended / resumed (or already so).
    Done,
    /// Not acted on: no such queue, a new queue whose QUEUE_NEW is not cleared yet, or a queue
    /// being destroyed.
    Invalid,
    /// The preemption failed: the GPU may be in trouble.
    Error,
    /// Not attempted: its GPU is fenced after an earlier error.
    Fenced,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueResult {
    pub queue_id: u32,
    pub gpu_id: Option<u32>,
    pub outcome: QueueOutcome,
}

/// The result of one SUSPEND / RESUME call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpReport {
    pub pid: u32,
    /// The ioctl's return value (queues counted by the kernel), or None when no call was needed.
    pub ret: Option<i32>,
    pub queues: Vec<QueueResult>,
    /// CLOCK_MONOTONIC when the ioctl was issued and when it returned.
    pub issued_ns: u64,
    pub returned_ns: u64,
}

impl OpReport {
    /// The queue ids that changed state.
    pub fn done(&self) -> Vec<u32> {
        self.queues
            .iter()
            .filter(|q| q.outcome == QueueOutcome::Done)
            .map(|q| q.queue_id)
            .collect()
    }
}
