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
    path::{Path, PathBuf},
    pin::Pin,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use anyhow::Result;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::{
    kfd::control::TargetError,
    kfd::control::{Control, ControlHandle, Limits},
    model::{State, Vendor},
    observe::procinfo::{self, ProcId},
    observe::watch::Watcher,
    outcome::Notice,
    outcome::OpReport,
    policy::{Class, Policy},
    rundir,
};

mod error;
pub mod freezer;
pub mod kfd_lease;
mod nv;
pub use error::ActError;
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

/// What a backend's worker thread sends the controller's loop.
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

    /// The adaptive lever tuner's choice per GPU (NVIDIA), over the policy's `[nvidia] lever`
    /// there; empty: the policy's everywhere.
    fn set_gpu_levers(
        &mut self,
        _levers: &std::collections::BTreeMap<u32, crate::policy::NvLever>,
    ) {
    }

    /// Hardware timeslices this backend changed: (pid, TSG, original us, current us).
    fn timeslices(&self) -> Vec<(u32, u32, u64, u64)> {
        Vec::new()
    }

    /// Resumes everything and lets go (the controller is stopping).
    fn shutdown(self: Box<Self>) -> BoxFut<'static, Vec<OpReport>>;
}

/// The backends this host needs (none for a dry run), and what comes back from those that act
/// from threads of their own: the KFD control thread's notices, the NVIDIA worker's arrivals.
pub struct Backends {
    pub list: Vec<Box<dyn Backend>>,
    pub notices: Option<UnboundedReceiver<Notice>>,
    pub arrivals: Option<UnboundedReceiver<Arrival>>,
}

impl Backends {
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
        let (mut notices, mut arrivals) = (None, None);
        if kfd_device.exists() || !nvidia {
            let (b, n) = KfdBackend::start(kfd_device, dir, max_suspend).await?;
            list.push(Box::new(b));
            notices = Some(n);
        }
        if nvidia {
            let (tx, rx) = unbounded_channel();
            list.push(Box::new(NvBackend::start(dir, max_suspend, tx)?));
            arrivals = Some(rx);
        }
        Ok(Self {
            list,
            notices,
            arrivals,
        })
    }

    /// Only the KFD backend: for a controller without a model of the host (`suspend`, or `top`
    /// acting on a key), which acts on a process by pid (KFD can seize any process).
    pub async fn kfd_only(kfd_device: &Path, dir: &Path, max_suspend: Duration) -> Result<Self> {
        let (b, n) = KfdBackend::start(kfd_device, dir, max_suspend).await?;
        Ok(Self {
            list: vec![Box::new(b)],
            notices: Some(n),
            arrivals: None,
        })
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

/// Resumes everything panicking code would otherwise leave suspended (before the default hook
/// prints the panic). The KFD control thread's own panics are covered by its Drop.
fn install_panic_hook(h: ControlHandle) {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() != Some("gpreempt-ctl") {
            h.shutdown_blocking(Duration::from_secs(2));
        }
        prev(info);
    }));
}

/// AMD: the KFD control thread. Offline processes are attached ahead of time, so a suspend is
/// one ioctl.
pub struct KfdBackend {
    control: Control,
    dir: PathBuf,
    /// Processes under control (attached), with their start times (the targets file).
    attached: BTreeMap<u32, u64>,
    /// Kills this controller if its loop stops beating (kfd_lease).
    lease: kfd_lease::KfdLease,
    /// `[policy] no_debug_api = "freeze"`: cgroups frozen instead of suspending queues.
    fallback: Option<freezer::Fallback>,
}

impl KfdBackend {
    pub async fn start(
        kfd_device: &Path,
        dir: &Path,
        max_suspend: Duration,
    ) -> Result<(Self, UnboundedReceiver<Notice>)> {
        let (control, notices) = Control::start(
            kfd_device,
            Limits {
                max_suspend,
                ..Limits::default()
            },
        )?;
        if let Some(h) = control.handle() {
            install_panic_hook(h);
        }
        recover(&control, dir).await;
        let lease = kfd_lease::KfdLease::start(dir, max_suspend, control.turns())?;
        Ok((
            Self {
                control,
                dir: dir.to_path_buf(),
                attached: BTreeMap::new(),
                lease,
                fallback: None,
            },
            notices,
        ))
    }

    /// The process `pid` names for this controller: the model's (the one the policy classified,
    /// by its start time), else the one attached at first sight (a controller without a
    /// model), else whoever has the pid now (a request's first sight). The control thread checks
    /// it against the pid's owner before every act.
    fn identity(&self, state: &State, pid: u32) -> Result<ProcId, ActError> {
        if let Some(p) = state.procs.get(&pid) {
            if p.exited_ns.is_some() {
                return Err(TargetError::Gone.into());
            }
            if let Some(i) = &p.info {
                return Ok(ProcId {
                    pid,
                    start_time: i.start_time,
                });
            }
        }
        if let Some(&start_time) = self.attached.get(&pid) {
            return Ok(ProcId { pid, start_time });
        }
        ProcId::now(Path::new("/proc"), pid).map_err(|_| TargetError::Gone.into())
    }

    fn save_targets(&self) {
        let t: Vec<rundir::Controlled> = self
            .attached
            .iter()
            .map(|(&pid, &start_time)| rundir::Controlled { pid, start_time })
            .collect();
        if let Err(e) = rundir::write_targets(&self.dir, &t) {
            log::warn!("{e:#}");
        }
    }
}

/// Resumes whatever an earlier instance left suspended (normally the kernel already did when it
/// exited; this covers a controller that vanished in some other way).
async fn recover(control: &Control, dir: &Path) {
    for t in rundir::read_targets(dir) {
        if procinfo::start_time(Path::new("/proc"), t.pid).ok() != Some(t.start_time) {
            continue;
        }
        let id = ProcId {
            pid: t.pid,
            start_time: t.start_time,
        };
        match control.resume(id, None).await {
            Ok(r) => eprintln!(
                "pid {}: left by an earlier controller: resumed its queues (kernel count {})",
                t.pid,
                r.ret.map_or("?".into(), |n| n.to_string())
            ),
            Err(e) => eprintln!("pid {}: left by an earlier controller: {e}", t.pid),
        }
    }
    let _ = rundir::write_targets(dir, &[]);
}

impl Backend for KfdBackend {
    fn vendor(&self) -> Vendor {
        Vendor::Amd
    }

    fn classed<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        class: Class,
    ) -> BoxFut<'a, Result<(), ActError>> {
        Box::pin(async move {
            if class == Class::Offline {
                let id = self.identity(state, pid)?;
                if self.attached.get(&pid) != Some(&id.start_time) {
                    self.control.attach(id).await?;
                    self.attached.insert(pid, id.start_time);
                    self.save_targets();
                }
            } else if let Some(start_time) = self.attached.remove(&pid) {
                if let Err(e) = self.control.detach(ProcId { pid, start_time }).await {
                    log::debug!("pid {pid}: detach: {e}");
                }
                self.save_targets();
            }
            Ok(())
        })
    }

    fn suspend<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
    ) -> BoxFut<'a, Acted> {
        Box::pin(async move {
            let id = match self.identity(state, pid) {
                Ok(id) => id,
                Err(e) => return Acted::Now(Err(e)),
            };
            Acted::Now(
                self.control
                    .suspend(id, queues, grace)
                    .await
                    .map_err(ActError::from),
            )
        })
    }

    /// A process whose runtime never enabled the debug API has its cgroup frozen instead,
    /// when the policy asks for that fallback ([`freezer`]).
    fn policy_suspend<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
    ) -> BoxFut<'a, Acted> {
        Box::pin(async move {
            let frozen = self.fallback.as_ref().is_some_and(|f| f.is_frozen(pid));
            let r = if frozen {
                Err(ActError::Target(TargetError::NoDebugApi(String::new())))
            } else {
                self.suspend(state, pid, queues, grace).await.now()
            };
            match (r, self.fallback.as_mut()) {
                (Err(ActError::Target(TargetError::NoDebugApi(why))), Some(f)) => {
                    Acted::Now(f.freeze(&mut self.lease, state, pid).map_err(|e| {
                        ActError::Target(TargetError::NoDebugApi(format!(
                            "{why}; the freeze fallback refused: {e:#}"
                        )))
                    }))
                }
                (r, _) => Acted::Now(r),
            }
        })
    }

    fn resume<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
    ) -> BoxFut<'a, Acted> {
        Box::pin(async move {
            if let Some(r) = self
                .fallback
                .as_mut()
                .and_then(|f| f.thaw(&mut self.lease, state, pid))
            {
                return Acted::Now(Ok(r));
            }
            let id = match self.identity(state, pid) {
                Ok(id) => id,
                Err(e) => return Acted::Now(Err(e)),
            };
            Acted::Now(
                self.control
                    .resume(id, queues)
                    .await
                    .map_err(ActError::from),
            )
        })
    }

    fn forget(&mut self, pid: u32) {
        if self.attached.remove(&pid).is_some() {
            self.save_targets();
        }
        if let Some(f) = self.fallback.as_mut() {
            f.thaw(&mut self.lease, &State::default(), pid);
        }
    }

    fn set_policy(&mut self, policy: &Policy) {
        let want = policy.no_debug_api == crate::policy::NoDebugApi::Freeze;
        match (want, self.fallback.as_mut()) {
            (true, None) => match freezer::Freezer::host() {
                Ok(f) => self.fallback = Some(freezer::Fallback::new(f)),
                Err(e) => log::warn!("no_debug_api = \"freeze\": {e:#}: refusing instead"),
            },
            (false, Some(f)) => {
                f.thaw_all(&mut self.lease, &State::default());
                self.fallback = None;
            }
            _ => {}
        }
    }

    fn upkeep(&mut self, _state: &State, now_ns: u64) -> Vec<Notice> {
        // The control thread runs its own watchdog and reports through the notice channel; the
        // loop's heartbeat keeps the lease guardian from killing us.
        self.lease
            .upkeep(now_ns)
            .map(|text| Notice::Problem { pid: 0, text })
            .into_iter()
            .collect()
    }

    fn shutdown(mut self: Box<Self>) -> BoxFut<'static, Vec<OpReport>> {
        Box::pin(async move {
            if let Some(f) = self.fallback.as_mut() {
                f.thaw_all(&mut self.lease, &State::default());
            }
            let out = self.control.shutdown().await;
            let _ = rundir::write_targets(&self.dir, &[]);
            let Self { lease, dir, .. } = *self;
            lease.finish(&dir);
            out
        })
    }
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
