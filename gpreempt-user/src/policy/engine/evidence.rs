//! Online evidence: what makes a GPU's online work count as busy (the priority and timeslice
//! strategies, with `window`), and the strict kind the adaptive tuner measures bursts with.

use super::super::Policy;
use crate::observe::model::{Activity, Process, SampleStatus};

/// Why online work counts as busy on a GPU (the first evidence, by pid then queue).
#[derive(Clone, Copy, Debug)]
pub(super) struct Evidence {
    pub(super) pid: u32,
    pub(super) qid: u32,
    pub(super) what: BusyBy,
    /// The sample time of the evidence.
    pub(super) at_ns: u64,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum BusyBy {
    Backlog(u64),
    Launched {
        ago_ns: u64,
    },
    Busy,
    /// A launch hint (uprobe) newer than the last sample.
    LaunchHint {
        ago_ns: u64,
    },
}

/// Strict evidence of online work on one queue, and when: a launch hint newer than the last
/// sample, a backlog in a readable sample, or a write pointer that moved in the latest sample.
/// Unlike [`online_evidence`] nothing lasts a `window`, so a burst ends when the work does.
/// A hint counts for `window` at most: without samples (NVIDIA) nothing else ends it.
pub(super) fn strict_work(
    policy: &Policy,
    p: &Process,
    a: &Activity,
    changed_ns: Option<u64>,
    now: u64,
) -> Option<u64> {
    let hint = p.last_launch_ns.filter(|&t| {
        policy.launch_hints && t > a.sample_ns && now.saturating_sub(t) < policy.window_ns
    });
    let backlog = a.status == SampleStatus::Valid && a.backlog.is_some_and(|n| n > 0);
    hint.or_else(|| (backlog || changed_ns == Some(a.sample_ns)).then_some(a.sample_ns))
}

/// Online evidence on one queue of an online process, and when it was observed: a launch hint
/// newer than the last sample, a backlog, a write pointer that moved within `window`, or the
/// busy flag of a sample within `window`, in that order.
pub(super) fn online_evidence(
    policy: &Policy,
    p: &Process,
    a: &Activity,
    changed_ns: Option<u64>,
    now: u64,
) -> Option<(BusyBy, u64)> {
    let recent = |t: u64| now.saturating_sub(t) < policy.window_ns;
    // A backlog counts only from a readable sample: a stale one (the queue's memory gone
    // unreadable, e.g. the process exiting) would pin offline suspended.
    let backlog = a
        .backlog
        .filter(|&n| n > 0 && a.status == SampleStatus::Valid);
    let hint = p
        .last_launch_ns
        .filter(|&t| policy.launch_hints && recent(t) && t > a.sample_ns);
    if let Some(t) = hint {
        Some((
            BusyBy::LaunchHint {
                ago_ns: now.saturating_sub(t),
            },
            t,
        ))
    } else if let Some(n) = backlog {
        Some((BusyBy::Backlog(n), a.sample_ns))
    } else if let Some(t) = changed_ns.filter(|&t| recent(t)) {
        Some((
            BusyBy::Launched {
                ago_ns: now.saturating_sub(t),
            },
            t,
        ))
    } else if a.busy == Some(true) && recent(a.sample_ns) {
        Some((BusyBy::Busy, a.sample_ns))
    } else {
        None
    }
}
