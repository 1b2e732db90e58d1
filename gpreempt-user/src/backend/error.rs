//! Why the seam could not act: one type for every backend, so callers (the controller's loop,
//! the socket, `top`) decide by cause, not by parsing text.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::observe::model::Vendor;

#[derive(Clone, Debug, PartialEq)]
pub enum ActError {
    /// The controller runs with `--dry-run`.
    DryRun,
    /// The process's queues belong to a driver this host does not have.
    NoDriver(Vendor),
    /// The backend's verdict on the target (gone, traced, not permitted...).
    Target(TargetError),
    /// An earlier act on this process failed; the driver is not asked again yet.
    BackingOff { retry_in_ms: u64 },
    /// The driver call failed (its message, with context).
    Driver(String),
}

impl fmt::Display for ActError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DryRun => write!(f, "the controller runs with --dry-run: it acts on nothing"),
            Self::NoDriver(v) => write!(f, "no {v} GPU driver on this host"),
            Self::Target(e) => e.fmt(f),
            Self::BackingOff { retry_in_ms } => write!(
                f,
                "backing off after a failed pause: next try in {retry_in_ms} ms"
            ),
            Self::Driver(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for ActError {}

impl ActError {
    /// A short kind for what cannot be controlled ([`crate::observe::model::Uncontrollable::kind`]).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::DryRun => "dry_run",
            Self::NoDriver(_) => "no_driver",
            Self::Target(t) => match t {
                TargetError::Gone | TargetError::Reused { .. } => "gone",
                TargetError::Traced { .. } => "traced",
                TargetError::AlreadyDebugged => "debugged",
                TargetError::NotPermitted(_) => "not_permitted",
                TargetError::NoDebugApi(_) => "no_debug_api",
                TargetError::Unsupported(_) => "unsupported",
                TargetError::Fenced(_) => "fenced",
                TargetError::RateLimited => "rate_limited",
                TargetError::Other(_) => "other",
            },
            Self::BackingOff { .. } => "backing_off",
            Self::Driver(_) => "driver",
        }
    }
}

impl From<TargetError> for ActError {
    fn from(e: TargetError) -> Self {
        Self::Target(e)
    }
}

impl From<anyhow::Error> for ActError {
    fn from(e: anyhow::Error) -> Self {
        Self::Driver(format!("{e:#}"))
    }
}

/// A self-test could not tell whether its backend can act because the host was too busy for the
/// observer (records lost in the kernel while it waited): no verdict on the driver, so `run`
/// tries again later instead of refusing.
#[derive(Debug)]
pub struct HostBusy(pub String);

impl fmt::Display for HostBusy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HostBusy {}

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
    /// driver's debug API (on AMD: EPERM with its runtime disabled, ROCm before 5.7).
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
