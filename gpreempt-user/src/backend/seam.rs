//! The seam itself: what the controller needs from a vendor's backend ([`Backend`]) and what
//! comes back from it. Below every backend: they implement it, and `mod.rs` builds the host's
//! set of them on top.

use std::{
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::atomic::{AtomicU64, Ordering},
};

use anyhow::Result;

use crate::{
    backend::error::ActError,
    lever::{Lever, Offers},
    observe::model::{State, Vendor},
    observe::watch::Watcher,
    outcome::{EscapeKind, Notice, OpReport},
    policy::{Class, Policy},
};

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
/// ([`Backends::arrivals`](crate::backend::Backends::arrivals)), so a new vendor adds variants here at most, not receivers.
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

    /// `pid`, held, escaped its hold (`kind`, seen by the observer): hold it again, and with
    /// `escalate` more firmly (a freeze, where the policy allows it and it stops nobody else).
    /// What was done (nothing: this backend holds nothing of it).
    fn rehold<'a>(
        &'a mut self,
        _state: &'a State,
        _pid: u32,
        _kind: EscapeKind,
        _escalate: bool,
    ) -> BoxFut<'a, Result<Vec<OpReport>, ActError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

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
