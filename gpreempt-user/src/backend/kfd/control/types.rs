//! What the async side and the control thread share: the requests and their errors, the limits,
//! the loop's turn counter.

use std::{fmt, time::Duration};

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

/// Why a process cannot be controlled. Each is a per-target state, never a crash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum TargetError {
    /// The process is gone (ESRCH).
    Gone,
    /// The pid names another process now (a different start time): the one asked for is gone,
    /// and the new owner is not touched.
    Reused {
        pid: u32,
    },
    /// Someone else already traces it (rocgdb, strace, gdb): it cannot be seized.
    Traced {
        tracer: u32,
        comm: String,
    },
    /// Its GPU debug trap is already enabled by another debugger (EALREADY).
    AlreadyDebugged,
    /// The kernel refused (EPERM: no permission, Yama ptrace_scope, or its runtime is not
    /// enabled yet for a suspend).
    NotPermitted(String),
    /// The kernel refused a queue operation because the target's GPU runtime never enabled the
    /// KFD debug API (EPERM with its runtime disabled: ROCm before 5.7).
    NoDebugApi(String),
    /// The GPU or kernel cannot do it (EBUSY, ENODEV, EINVAL: e.g. GWS in use, a pre-GFX9 GPU,
    /// no HWS).
    Unsupported(String),
    /// Its GPU is fenced after a preemption error.
    Fenced(String),
    /// Refused by the rate limit.
    RateLimited,
    Other(String),
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gone => write!(f, "the process is gone"),
            Self::Reused { pid } => write!(
                f,
                "pid {pid} was reused: the process it named is gone and another one has it now \
                 (that one was not touched)"
            ),
            Self::Traced { tracer, comm } => write!(
                f,
                "already traced by pid {tracer} ({comm}); a process under rocgdb, gdb or strace \
                 cannot be controlled: detach that tool first"
            ),
            Self::AlreadyDebugged => write!(
                f,
                "its GPU debug trap is already enabled by another debugger (EALREADY); \
                 end that debugger first"
            ),
            Self::NotPermitted(s) => write!(f, "not permitted: {s}"),
            Self::NoDebugApi(s) => write!(f, "not permitted: {s}"),
            Self::Unsupported(s) => write!(f, "not supported here: {s}"),
            Self::Fenced(s) => write!(f, "GPU fenced: {s}"),
            Self::RateLimited => write!(f, "rate limited: too many suspends of this process"),
            Self::Other(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for TargetError {}

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
    Snapshot(ProcId, oneshot::Sender<Result<Vec<SnapQueue>, TargetError>>),
    /// Resume + disable + detach everything, then the thread ends.
    Shutdown(oneshot::Sender<Vec<OpReport>>),
}

/// When the control thread last went round its loop (or a step of a long operation: a detach
/// waiting for its target to stop, one target of a shutdown), CLOCK_MONOTONIC ns. It turns at
/// least every 100 ms while alive: this is what the KFD lease's heartbeat watches, since this
/// thread's watchdog is what bounds every hold.
pub type Turns = std::sync::Arc<std::sync::atomic::AtomicU64>;

/// The errno of a failed syscall (0 when it carries none).
pub(super) fn errno_of(e: &std::io::Error) -> nix::errno::Errno {
    nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0))
}
