//! What the async side and the control thread share: the requests and their errors, the limits,
//! the loop's turn counter.

use std::time::Duration;

use gpreempt_common::kfd::{ec, ec_mask};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::observe::procinfo::ProcId;
use crate::outcome::OpReport;

/// The events a target reports to us: new queues (to clear QUEUE_NEW), deleted queues, and the
/// runtime's enable/disable (which blocks until we acknowledge it).
pub(super) const SUBSCRIBED: u64 =
    ec_mask(ec::QUEUE_NEW) | ec_mask(ec::DEVICE_QUEUE_DELETE) | ec_mask(ec::PROCESS_RUNTIME);

/// Hard limits the control thread enforces by itself, whatever its callers do.
#[derive(Clone, Debug)]
pub struct Limits {
    /// No queue stays suspended longer than this (the watchdog resumes it).
    pub max_suspend: Duration,
    /// At most this many SUSPEND calls per target per second (a runaway caller cannot make the
    /// firmware re-upload runlists without end).
    pub max_suspends_per_s: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_suspend: Duration::from_secs(300),
            max_suspends_per_s: 200,
        }
    }
}

/// A queue as GET_QUEUE_SNAPSHOT shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapQueue {
    pub queue_id: u32,
    pub gpu_id: u32,
    pub queue_type: u32,
    pub ring_base_address: u64,
    pub ring_size: u32,
    pub suspended: bool,
}

pub use crate::backend::error::TargetError;

/// Every request names a process by [`ProcId`]: the control thread checks it against the pid's
/// owner before it seizes, and against the target it holds on every later act.
pub(super) enum Req {
    Attach(ProcId, oneshot::Sender<Result<Vec<SnapQueue>, TargetError>>),
    Detach(ProcId, oneshot::Sender<Result<(), TargetError>>),
    Suspend {
        id: ProcId,
        /// None: every queue of the process, now and created later, until a Resume of all.
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
        reply: oneshot::Sender<Result<OpReport, TargetError>>,
    },
    Resume {
        id: ProcId,
        queues: Option<Vec<u32>>,
        reply: oneshot::Sender<Result<OpReport, TargetError>>,
    },
    /// Suspend again what is held of a target that escaped; `rearm`: take its debug session
    /// back first.
    Rehold {
        id: ProcId,
        rearm: bool,
        reply: oneshot::Sender<Result<OpReport, TargetError>>,
    },
    Snapshot(ProcId, oneshot::Sender<Result<Vec<SnapQueue>, TargetError>>),
    /// Resume + disable + detach everything, then the thread ends.
    Shutdown(oneshot::Sender<Vec<OpReport>>),
}

/// What the control thread shows of its life, for the KFD lease's heartbeat (this thread's
/// watchdog is what bounds every hold): when it last went round its loop, finished a driver call
/// or took a step of a long operation (a detach waiting for its target to stop, one target of a
/// shutdown), and when the driver call in flight began. It turns at least every 100 ms while
/// alive and idle; a driver call that is merely slow is told apart from a thread stuck elsewhere.
#[derive(Debug)]
pub struct Pulse {
    /// CLOCK_MONOTONIC ns of the last turn or finished call.
    turn: std::sync::atomic::AtomicU64,
    /// CLOCK_MONOTONIC ns when the call in flight began; 0: none.
    call: std::sync::atomic::AtomicU64,
}

impl Pulse {
    pub fn new(now: u64) -> Self {
        Self {
            turn: now.into(),
            call: 0.into(),
        }
    }

    pub fn turn(&self, now: u64) {
        self.turn.store(now, std::sync::atomic::Ordering::Relaxed);
    }

    /// A driver call begins at `now`.
    pub fn call_begins(&self, now: u64) {
        self.call
            .store(now.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    /// The call in flight returned at `now`: that is a turn.
    pub fn call_ends(&self, now: u64) {
        self.turn(now);
        self.call.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// (last turn, start of the call in flight or 0).
    pub fn read(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.turn.load(Relaxed), self.call.load(Relaxed))
    }
}

/// The control thread's [`Pulse`], shared with the lease.
pub type Turns = std::sync::Arc<Pulse>;

/// The errno of a failed syscall (0 when it carries none).
pub(super) fn errno_of(e: &std::io::Error) -> nix::errno::Errno {
    nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0))
}
