//! The control thread's bookkeeping, free of the kernel: per target which queues it has and which
//! we hold since when, the watchdog's deadlines, the fenced GPUs, the suspend rate limit, and the
//! decoding of the kernel's per-queue status bits. Time is passed in (CLOCK_MONOTONIC ns), so all
//! of it runs on a virtual clock in tests.

use std::collections::{BTreeMap, BTreeSet};

use gpreempt_common::kfd;

use crate::outcome::{OpReport, QueueOutcome, QueueResult};

/// One second in ns: the rate limit's window.
const WINDOW_NS: u64 = 1_000_000_000;

/// Suspend calls admitted in the current one-second window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RateWindow {
    /// When the window began (the first call after the previous one had lasted a second).
    start_ns: u64,
    count: u32,
}

impl RateWindow {
    /// Counts a call at `now`; false when it is past `limit` calls of the window.
    pub(super) fn admit(&mut self, now: u64, limit: u32) -> bool {
        if now.saturating_sub(self.start_ns) >= WINDOW_NS {
            *self = Self {
                start_ns: now,
                count: 0,
            };
        }
        self.count = self.count.saturating_add(1);
        self.count <= limit
    }
}

/// One target's queues and holds (everything of a target but its event pipe).
#[derive(Clone, Debug, Default)]
pub(super) struct Book {
    /// queue id -> GPU, from snapshots and QUEUE_NEW events.
    pub(super) queues: BTreeMap<u32, u32>,
    /// Queues we suspended, since when (CLOCK_MONOTONIC ns).
    pub(super) suspended: BTreeMap<u32, u64>,
    /// Suspended as a whole (with this grace period): new queues are suspended too.
    pub(super) hold_all: Option<Option<u32>>,
    /// Suspend calls in the current one-second window.
    pub(super) window: RateWindow,
}

impl Book {
    pub(super) fn gpu_of(&self, qid: u32) -> Option<u32> {
        self.queues.get(&qid).copied()
    }

    /// Replaces the queue map with a snapshot's; returns the queues not known before. Holds of
    /// queues that are gone are forgotten.
    pub(super) fn set_queues(&mut self, now: BTreeMap<u32, u32>) -> Vec<u32> {
        let fresh = now
            .keys()
            .filter(|q| !self.queues.contains_key(q))
            .copied()
            .collect();
        self.suspended.retain(|q, _| now.contains_key(q));
        self.queues = now;
        fresh
    }

    /// Queues a suspend got are held from when its call returned; a queue already held keeps
    /// its first time, so suspending it again does not put the watchdog off.
    pub(super) fn record_suspended(&mut self, report: &OpReport) {
        for q in &report.queues {
            if q.outcome == QueueOutcome::Done {
                self.suspended
                    .entry(q.queue_id)
                    .or_insert(report.returned_ns);
            }
        }
    }

    /// Queues a resume got are no longer held.
    pub(super) fn record_resumed(&mut self, report: &OpReport) {
        for q in &report.queues {
            if q.outcome == QueueOutcome::Done {
                self.suspended.remove(&q.queue_id);
            }
        }
    }

    /// The held queues on `gpu`.
    fn held_on(&self, gpu: u32) -> Vec<u32> {
        self.suspended
            .keys()
            .filter(|q| self.queues.get(q) == Some(&gpu))
            .copied()
            .collect()
    }
}

/// How long the control thread may sleep (ms): until the next watchdog deadline, at most 100 ms
/// (which also bounds a stop whose SIGCHLD was coalesced away), and at most 10 ms while anything
/// is held, to notice a destroy of a held queue soon.
pub(super) fn next_wake_ms<'a>(
    books: impl Iterator<Item = &'a Book> + Clone,
    max_suspend_ns: u64,
    now: u64,
) -> u16 {
    let next = books
        .clone()
        .flat_map(|b| b.suspended.values())
        .map(|since| since.saturating_add(max_suspend_ns).saturating_sub(now))
        .min()
        .unwrap_or(u64::MAX);
    let holding = books.into_iter().any(|b| !b.suspended.is_empty());
    (next / 1_000_000 + 1).min(if holding { 10 } else { 100 }) as u16
}

/// The queues held `max_suspend_ns` or longer at `now`, per target (targets with none left out).
pub(super) fn overdue<'a>(
    books: impl Iterator<Item = (u32, &'a Book)>,
    max_suspend_ns: u64,
    now: u64,
) -> Vec<(u32, Vec<u32>)> {
    books
        .map(|(pid, b)| {
            (
                pid,
                b.suspended
                    .iter()
                    .filter(|(_, since)| now.saturating_sub(**since) >= max_suspend_ns)
                    .map(|(q, _)| *q)
                    .collect::<Vec<_>>(),
            )
        })
        .filter(|(_, q)| !q.is_empty())
        .collect()
}

/// The queues held on `gpu`, per target (targets with none left out): what a fence resumes.
pub(super) fn held_on<'a>(
    books: impl Iterator<Item = (u32, &'a Book)>,
    gpu: u32,
) -> Vec<(u32, Vec<u32>)> {
    books
        .map(|(pid, b)| (pid, b.held_on(gpu)))
        .filter(|(_, q)| !q.is_empty())
        .collect()
}

/// The GPUs a report shows a per-queue ERROR on.
pub(super) fn error_gpus(report: &OpReport) -> BTreeSet<u32> {
    report
        .queues
        .iter()
        .filter(|q| q.outcome == QueueOutcome::Error)
        .filter_map(|q| q.gpu_id)
        .collect()
}

/// GPUs no longer preempted after a failed preemption, and why.
#[derive(Clone, Debug, Default)]
pub(super) struct Fences(BTreeMap<u32, String>);

impl Fences {
    /// Fences `gpu`; false when it already was (the first reason stays).
    pub(super) fn fence(&mut self, gpu: u32, why: &str) -> bool {
        if self.0.contains_key(&gpu) {
            return false;
        }
        self.0.insert(gpu, why.to_string());
        true
    }

    /// Why `gpu` is fenced (the control thread reports it in its notice; tests ask here).
    #[cfg(test)]
    pub(super) fn reason(&self, gpu: u32) -> Option<&str> {
        self.0.get(&gpu).map(String::as_str)
    }

    /// Splits `ids` into those to act on and those on a fenced GPU (a queue of unknown GPU is
    /// acted on: the kernel tells what it is).
    pub(super) fn split(
        &self,
        ids: &[u32],
        gpu_of: impl Fn(u32) -> Option<u32>,
    ) -> (Vec<u32>, Vec<u32>) {
        ids.iter()
            .partition(|q| gpu_of(**q).is_none_or(|g| !self.0.contains_key(&g)))
    }
}

/// An id with a status bit set would come back with that status (ERROR: the GPU is fenced), so
/// it never reaches the kernel. Callers check users' ids first; this is the last line.
pub(super) fn no_status_bits(ids: &[u32]) -> Result<(), super::types::TargetError> {
    const BITS: u32 = kfd::KFD_DBG_QUEUE_ERROR_MASK | kfd::KFD_DBG_QUEUE_INVALID_MASK;
    match ids.iter().find(|&&q| q & BITS != 0) {
        Some(q) => Err(super::types::TargetError::Other(format!(
            "queue id {q:#x} carries status bits: not sent to the kernel"
        ))),
        None => Ok(()),
    }
}

/// The kernel writes each queue's status into the high bits of its entry of the id array after
/// SUSPEND_QUEUES / RESUME_QUEUES: ERROR (the preemption failed) wins over INVALID.
pub(super) fn decode_statuses(
    entries: &[u32],
    gpu_of: impl Fn(u32) -> Option<u32>,
) -> Vec<QueueResult> {
    entries
        .iter()
        .map(|&v| {
            let queue_id = v & !(kfd::KFD_DBG_QUEUE_ERROR_MASK | kfd::KFD_DBG_QUEUE_INVALID_MASK);
            QueueResult {
                queue_id,
                gpu_id: gpu_of(queue_id),
                outcome: if v & kfd::KFD_DBG_QUEUE_ERROR_MASK != 0 {
                    QueueOutcome::Error
                } else if v & kfd::KFD_DBG_QUEUE_INVALID_MASK != 0 {
                    QueueOutcome::Invalid
                } else {
                    QueueOutcome::Done
                },
            }
        })
        .collect()
}
