//! The vendor seam. The model, the policy and the controller's loop are vendor-neutral; each
//! backend knows how to act on its driver's queues and how a controller death is undone:
//!
//! - AMD ([`KfdBackend`]): DBG_TRAP suspend/resume from a control thread of its own; the kernel
//!   resumes every queue of a debugger that exits, however it exits.
//! - NVIDIA ([`NvBackend`]): FIFO_DISABLE_CHANNELS through the target's own RM client, from a
//!   worker thread (an RM call can block for a second: acts return [`Acted::Later`] and their
//!   results come back as [`Arrival`]s); nothing in the driver undoes a pause, so a guardian
//!   process holds the way back (and a heartbeat lease covers a controller that hangs instead of
//!   dying, or a driver call that does not return).
//!
//! Which backend acts on a process follows from its queues in the model ([`Process::vendor`]).

use std::{collections::BTreeMap, path::Path, time::Duration};

use anyhow::Result;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::{
    lever::Offers,
    observe::model::{State, Vendor},
    outcome::OpReport,
};

pub mod error;
pub mod freezer;
pub mod guardian;
pub mod kfd;
pub mod nv;
pub mod queue_ids;
mod seam;
pub use error::{ActError, HostBusy, TargetError};
pub use kfd::KfdBackend;
pub use nv::NvBackend;
pub use seam::{Acted, Arrival, Backend, BoxFut, Ticket};

/// The backends this host needs (none for a dry run), and the one channel through which what
/// their threads do comes back (the KFD control thread's notices, the NVIDIA worker's results
/// and notices).
pub struct Backends {
    pub list: Vec<Box<dyn Backend>>,
    pub arrivals: UnboundedReceiver<Arrival>,
}

impl Backends {
    /// `list`, with a channel nothing sends on (its receiver answers `None` at once): for a dry
    /// run (an empty list) and for backends that act at once.
    pub fn of(list: Vec<Box<dyn Backend>>) -> Self {
        let (_, arrivals) = unbounded_channel();
        Self { list, arrivals }
    }

    /// The receiver, for a loop that selects on it beside calls on the backends (which borrow
    /// them); what is left here answers `None` at once.
    pub fn take_arrivals(&mut self) -> UnboundedReceiver<Arrival> {
        std::mem::replace(&mut self.arrivals, unbounded_channel().1)
    }

    /// AMD when a KFD device exists (or no NVIDIA one does: then its absence is the error the
    /// operator needs), NVIDIA when `/dev/nvidiactl` exists.
    pub async fn for_host(
        kfd_device: &Path,
        nvidiactl: &Path,
        dir: &Path,
        max_suspend: Duration,
    ) -> Result<Self> {
        let nvidia = nvidiactl.exists();
        let mut list: Vec<Box<dyn Backend>> = Vec::new();
        let (tx, arrivals) = unbounded_channel();
        if kfd_device.exists() || !nvidia {
            let b = KfdBackend::start(kfd_device, dir, max_suspend, tx.clone()).await?;
            list.push(Box::new(b));
        }
        if nvidia {
            list.push(Box::new(NvBackend::start(dir, max_suspend, tx)?));
        }
        Ok(Self { list, arrivals })
    }

    /// Only the KFD backend: for a controller without a model of the host (`suspend`, or `top`
    /// acting on a key), which acts on a process by pid (KFD can seize any process).
    pub async fn by_pid(kfd_device: &Path, dir: &Path, max_suspend: Duration) -> Result<Self> {
        let (tx, arrivals) = unbounded_channel();
        let b = KfdBackend::start(kfd_device, dir, max_suspend, tx).await?;
        Ok(Self {
            list: vec![Box::new(b)],
            arrivals,
        })
    }

    /// What each vendor's backend offers: this host's backends', and for vendors without one
    /// (a dry run) what their backend would offer.
    pub fn offers(&self) -> BTreeMap<Vendor, Offers> {
        let mut out = catalog();
        for b in &self.list {
            out.insert(b.vendor(), b.offers());
        }
        out
    }

    /// Resumes everything every backend holds and lets go; the reports of what was resumed.
    pub async fn shutdown(&mut self) -> Vec<OpReport> {
        let mut out = Vec::new();
        for b in std::mem::take(&mut self.list) {
            out.extend(b.shutdown().await);
        }
        out
    }

    /// The backend that acts on `pid`: its queues' vendor; AMD for a process without known
    /// queues (KFD can seize any process).
    pub fn for_pid(&mut self, state: &State, pid: u32) -> Result<&mut Box<dyn Backend>, ActError> {
        if self.list.is_empty() {
            return Err(ActError::DryRun);
        }
        let vendor = state
            .procs
            .get(&pid)
            .and_then(|p| p.vendor())
            .unwrap_or(Vendor::Amd);
        self.list
            .iter_mut()
            .find(|b| b.vendor() == vendor)
            .ok_or(ActError::NoDriver(vendor))
    }
}

/// What each vendor's backend offers.
pub fn catalog() -> BTreeMap<Vendor, Offers> {
    BTreeMap::from([(Vendor::Amd, kfd::OFFERS), (Vendor::Nvidia, nv::OFFERS)])
}

/// `anyhow` context for a backend's self-test failure.
pub fn refuse(vendor: Vendor, e: anyhow::Error) -> anyhow::Error {
    e.context(format!(
        "the {vendor} backend failed its self-test: refusing to control anything (nothing was \
         changed; `gpreempt-ebpf doctor` checks this host)"
    ))
}

#[cfg(test)]
mod tests;
