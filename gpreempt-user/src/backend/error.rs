//! Why the seam could not act: one type for every backend, so callers (the controller's loop,
//! the socket, `top`) decide by cause, not by parsing text.

use std::fmt;

use crate::{backend::kfd::control::TargetError, observe::model::Vendor};

#[derive(Clone, Debug, PartialEq)]
pub enum ActError {
    /// The controller runs with `--dry-run`.
    DryRun,
    /// The process's queues belong to a driver this host does not have.
    NoDriver(Vendor),
    /// KFD: the control thread's verdict on the target (gone, traced, not permitted...).
    Target(TargetError),
    /// NVIDIA: an earlier pause of this process failed; the driver is not asked again yet.
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
