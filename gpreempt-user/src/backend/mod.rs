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

use std::{
    collections::BTreeMap,
    future::Future,
    path::Path,
    pin::Pin,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use anyhow::Result;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::{
    lever::{Lever, Offers},
    observe::model::{State, Vendor},
    observe::watch::Watcher,
    outcome::Notice,
    outcome::OpReport,
    policy::{Class, Policy},
};

pub mod error;
pub mod freezer;
pub mod guardian;
pub mod kfd;
pub mod nv;
pub mod queue_ids;
pub use error::{ActError, HostBusy, TargetError};
pub use kfd::KfdBackend;
pub use nv::NvBackend;

pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Names an act handed to a backend's worker thread, whose result comes later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub u64);

impl Ticket {
    pub fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// What a suspend or resume came to when the backend returned.
#[derive(Debug)]
pub enum Acted {
    /// Done (or refused) already.
    Now(Result<OpReport, ActError>),
    /// Handed to the backend's worker thread: the result comes back as [`Arrival::Done`] with
    /// this ticket, through [`Backends::arrivals`].
    Later(Ticket),
}

impl Acted {
    /// The result, for a caller whose backends all act at once (KFD only: `suspend`, `resume`,
    /// `top`): a hand-over is an error there.
    pub fn now(self) -> Result<OpReport, ActError> {
        match self {
            Self::Now(r) => r,
            Self::Later(_) => Err(ActError::Driver(
                "internal: handed to a worker this controller does not wait for".into(),
            )),
        }
    }
}

/// What a backend's thread sends the controller's loop: every backend sends into one channel
/// ([`Backends::arrivals`]), so a new vendor adds variants here at most, not receivers.
#[derive(Debug)]
pub enum Arrival {
    /// The result of an act handed over earlier ([`Acted::Later`]).
    Done {
        ticket: Ticket,
        result: Result<OpReport, ActError>,
    },
    /// A process handed over by `classed` cannot be controlled, and why.
    Refused { pid: u32, error: ActError },
    /// What the worker did or found on its own.
    Notice(Notice),
}

/// What the controller needs from a vendor.
pub trait Backend {
    fn vendor(&self) -> Vendor;

    /// The levers it offers on its GPUs: the policy engine and its tuner choose among them.
    fn offers(&self) -> Offers;

    /// `pid` got `class`: get ready to act on it fast (or let it go). Err: it cannot be
    /// controlled, and why.
    fn classed<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        class: Class,
    ) -> BoxFut<'a, Result<(), ActError>>;

    /// Suspends `queues` of `pid` (None: all of them). `grace` (us) where the vendor has one.
    /// A backend that acts from a worker thread returns at once ([`Acted::Later`]); acts on one
    /// process are done in the order they were asked.
    fn suspend<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
    ) -> BoxFut<'a, Acted>;

    /// The policy engine's suspend (not an operator's): a backend whose lever is not a pause
    /// (NVIDIA `dynamic`) acts on it its own way. The same as [`Self::suspend`] by default.
    fn policy_suspend<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
    ) -> BoxFut<'a, Acted> {
        self.suspend(state, pid, queues, grace)
    }

    /// Resumes `queues` of `pid` (None: every queue this backend holds suspended when the
    /// resume is done).
    fn resume<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
    ) -> BoxFut<'a, Acted>;

    /// The process is gone: drop what is kept for it.
    fn forget(&mut self, pid: u32);

    /// Called on every controller tick: watchdogs and heartbeats of backends that keep them in
    /// the controller's loop. Returns what it did on its own.
    fn upkeep(&mut self, state: &State, now_ns: u64) -> Vec<Notice>;

    /// Proves, before the controller relies on it, that this backend can suspend and resume on
    /// this host. Ok(Some(line)): what was checked.
    fn self_test<'a>(&'a mut self, _w: &'a mut Watcher) -> BoxFut<'a, Result<Option<String>>> {
        Box::pin(async { Ok(None) })
    }

    /// The policy (at start and after every reload): the parts a backend acts on by itself.
    fn set_policy(&mut self, _policy: &Policy) {}

    /// The lever tuner's choice per GPU (of this backend's offers), over the policy's lever
    /// there; empty: the policy's everywhere.
    fn set_gpu_levers(&mut self, _levers: &BTreeMap<u32, Lever>) {}

    /// Hardware timeslices this backend changed: (pid, queue, original us, current us).
    fn timeslices(&self) -> Vec<(u32, u32, u64, u64)> {
        Vec::new()
    }

    /// Resumes everything and lets go (the controller is stopping).
    fn shutdown(self: Box<Self>) -> BoxFut<'static, Vec<OpReport>>;
}

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
    pub async fn kfd_only(kfd_device: &Path, dir: &Path, max_suspend: Duration) -> Result<Self> {
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
