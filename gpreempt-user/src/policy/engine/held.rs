//! What the engine holds and why it lets go: shared by the tick's phases and the GPUs' plans.

use super::super::{Action, Class, Decision, Lever};

/// A queue the engine suspended.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    pub(super) gpu_id: u32,
    pub(super) since_ns: u64,
    pub(super) start_time: u64,
    /// When its RESUME was last decided (retried after `min_interval` if not confirmed).
    pub(super) resume_sent_ns: Option<u64>,
}

/// Why the held queues of a GPU (or of one process) are resumed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Release {
    Idle {
        idle_ns: Option<u64>,
    },
    MaxSuspend,
    Share,
    Fenced,
    Unmanaged,
    NotOffline(Class),
    /// The GPU's lever no longer acts per episode (a reload, the lever tuner).
    Lever(Lever),
}

/// The order the controller acts in and logs: by GPU, then pid, RESUME before SUSPEND; queue
/// ids ascending.
pub(super) fn sort_decisions(out: &mut [Decision]) {
    out.sort_by_key(|d| (d.gpu_id, d.pid, d.action == Action::Suspend));
    for d in out {
        d.queues.sort_unstable();
    }
}
