//! The vendor seam. The model, the policy and the controller's loop are vendor-neutral; each
//! backend knows how to act on its driver's queues and how a controller death is undone:
//!
//! - AMD ([`KfdBackend`]): DBG_TRAP suspend/resume from a control thread of its own; the kernel
//!   resumes every queue of a debugger that exits, however it exits.
//! - NVIDIA ([`NvBackend`]): FIFO_DISABLE_CHANNELS through the target's own RM client; nothing in
//!   the driver undoes a pause, so a guardian process holds the way back (and a heartbeat lease
//!   covers a controller that hangs instead of dying).
//!
//! Which backend acts on a process follows from its queues in the model ([`Process::vendor`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    path::{Path, PathBuf},
    pin::Pin,
    time::Duration,
};

use anyhow::Result;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::{
    kfd::control::{Control, ControlHandle, Limits},
    model::{State, Vendor},
    nv::controller::{NvControl, NvOps, Rm},
    observe::procinfo,
    observe::watch::Watcher,
    outcome::Notice,
    outcome::OpReport,
    policy::{Class, NvPolicy, Policy},
    rundir,
};

mod error;
pub use error::ActError;

pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

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
    fn suspend<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
    ) -> BoxFut<'a, Result<OpReport, ActError>>;

    /// Resumes `queues` of `pid` (None: every queue this backend holds suspended).
    fn resume<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
    ) -> BoxFut<'a, Result<OpReport, ActError>>;

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

    /// Hardware timeslices this backend changed: (pid, TSG, original us, current us).
    fn timeslices(&self) -> Vec<(u32, u32, u64, u64)> {
        Vec::new()
    }

    /// Resumes everything and lets go (the controller is stopping).
    fn shutdown(self: Box<Self>) -> BoxFut<'static, Vec<OpReport>>;
}

/// The backends this host needs (none for a dry run), and the asynchronous notices of those that
/// act from threads of their own.
pub struct Backends {
    pub list: Vec<Box<dyn Backend>>,
    pub notices: Option<UnboundedReceiver<Notice>>,
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
        let mut notices = None;
        if kfd_device.exists() || !nvidia {
            let (b, n) = KfdBackend::start(kfd_device, dir, max_suspend).await?;
            list.push(Box::new(b));
            notices = Some(n);
        }
        if nvidia {
            list.push(Box::new(NvBackend::new(dir, max_suspend)?));
        }
        Ok(Self { list, notices })
    }

    /// Only the KFD backend: for a controller without a model of the host (`suspend`, or `top`
    /// acting on a key), which acts on a process by pid (KFD can seize any process).
    pub async fn kfd_only(kfd_device: &Path, dir: &Path, max_suspend: Duration) -> Result<Self> {
        let (b, n) = KfdBackend::start(kfd_device, dir, max_suspend).await?;
        Ok(Self {
            list: vec![Box::new(b)],
            notices: Some(n),
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
        Ok((
            Self {
                control,
                dir: dir.to_path_buf(),
                attached: BTreeMap::new(),
            },
            notices,
        ))
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
        match control.resume(t.pid, None).await {
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
            if class == Class::Offline && !self.attached.contains_key(&pid) {
                self.control.attach(pid).await?;
                // The model has it for classified processes; a controller without one reads it.
                let start = state
                    .procs
                    .get(&pid)
                    .and_then(|p| p.info.as_ref())
                    .map(|i| i.start_time)
                    .or_else(|| procinfo::start_time(Path::new("/proc"), pid).ok())
                    .unwrap_or(0);
                self.attached.insert(pid, start);
                self.save_targets();
            } else if class != Class::Offline && self.attached.remove(&pid).is_some() {
                if let Err(e) = self.control.detach(pid).await {
                    log::debug!("pid {pid}: detach: {e}");
                }
                self.save_targets();
            }
            Ok(())
        })
    }

    fn suspend<'a>(
        &'a mut self,
        _state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
    ) -> BoxFut<'a, Result<OpReport, ActError>> {
        Box::pin(async move { Ok(self.control.suspend(pid, queues, grace).await?) })
    }

    fn resume<'a>(
        &'a mut self,
        _state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
    ) -> BoxFut<'a, Result<OpReport, ActError>> {
        Box::pin(async move { Ok(self.control.resume(pid, queues).await?) })
    }

    fn forget(&mut self, pid: u32) {
        if self.attached.remove(&pid).is_some() {
            self.save_targets();
        }
    }

    fn upkeep(&mut self, _state: &State, _now_ns: u64) -> Vec<Notice> {
        // The control thread runs its own watchdog and reports through the notice channel.
        Vec::new()
    }

    fn shutdown(self: Box<Self>) -> BoxFut<'static, Vec<OpReport>> {
        Box::pin(async move {
            let out = self.control.shutdown().await;
            let _ = rundir::write_targets(&self.dir, &[]);
            out
        })
    }
}

/// NVIDIA: pauses through the targets' own RM clients, with the guardian and a watchdog.
pub struct NvBackend<O: NvOps = Rm> {
    nv: NvControl<O>,
    max_suspend_ns: u64,
    /// Per target after a failed pause: (retry not before, next delay). A driver that refuses
    /// is not asked again at the policy's pace.
    backoff: BTreeMap<u32, (u64, u64)>,
    /// The `[nvidia]` policy: the lever and the offline timeslice.
    policy: NvPolicy,
    /// Processes classed offline (their GR TSGs carry the short timeslice).
    offline: BTreeSet<u32>,
    /// Offline processes whose timeslice could not be set: the policy pauses them instead.
    lever_failed: BTreeSet<u32>,
    /// When the lever was last applied to TSGs created since (not at every tick).
    lever_checked_ns: u64,
    /// What was done outside a request, reported at the next upkeep.
    pending: Vec<Notice>,
}

/// How often offline processes are checked for GR TSGs created since their class was set.
const LEVER_RECHECK_NS: u64 = 100_000_000;

/// First and longest wait after a failed pause.
const BACKOFF_MIN_NS: u64 = 100_000_000;
const BACKOFF_MAX_NS: u64 = 10_000_000_000;

impl NvBackend {
    pub fn new(dir: &Path, max_suspend: Duration) -> Result<Self> {
        // A hung controller is covered once the lease runs out; a live one resumes at
        // max_suspend itself.
        let lease = max_suspend.max(Duration::from_millis(500));
        Ok(Self::with(
            NvControl::new(dir)?.with_lease(lease),
            max_suspend,
        ))
    }
}

impl<O: NvOps> NvBackend<O> {
    fn with(nv: NvControl<O>, max_suspend: Duration) -> Self {
        Self {
            nv,
            max_suspend_ns: max_suspend.as_nanos() as u64,
            backoff: BTreeMap::new(),
            policy: NvPolicy::default(),
            offline: BTreeSet::new(),
            lever_failed: BTreeSet::new(),
            lever_checked_ns: 0,
            pending: Vec::new(),
        }
    }

    /// Gives `pid`'s GR TSGs (those not yet changed) the offline timeslice, when the lever says
    /// so. A failure makes the policy pause the process instead, once, with the reason.
    fn apply_lever(&mut self, state: &State, pid: u32, why: &str) {
        if !self.policy.lever.timeslice() || self.lever_failed.contains(&pid) {
            return;
        }
        match self
            .nv
            .set_timeslices(state, pid, self.policy.offline_timeslice_us)
        {
            Ok(changes) => {
                self.pending
                    .extend(changes.into_iter().map(|change| Notice::Timeslice {
                        change,
                        why: why.to_string(),
                    }))
            }
            Err(e) => {
                self.lever_failed.insert(pid);
                self.pending.push(Notice::LeverFailed {
                    pid,
                    text: format!("{e:#}"),
                });
            }
        }
    }

    /// Puts `pid`'s original timeslices back.
    fn restore(&mut self, pid: u32, why: &str) {
        match self.nv.restore_timeslices(pid) {
            Ok(changes) => {
                self.pending
                    .extend(changes.into_iter().map(|change| Notice::Timeslice {
                        change,
                        why: why.to_string(),
                    }))
            }
            Err(e) => self.pending.push(Notice::Problem {
                pid,
                text: format!(
                    "restoring its timeslices: {e:#} (the guardian restores them if we die)"
                ),
            }),
        }
    }
}

impl<O: NvOps> Backend for NvBackend<O> {
    fn vendor(&self) -> Vendor {
        Vendor::Nvidia
    }

    fn classed<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        class: Class,
    ) -> BoxFut<'a, Result<(), ActError>> {
        Box::pin(async move {
            if class == Class::Offline {
                // Duplicate its fds and give the guardian its way back now: a pause is then
                // one RM call.
                self.nv.prepare(state, pid)?;
                self.offline.insert(pid);
                self.apply_lever(state, pid, "classed offline");
            } else if self.offline.remove(&pid) {
                self.restore(pid, "no longer offline");
            }
            Ok(())
        })
    }

    fn suspend<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
        _grace: Option<u32>,
    ) -> BoxFut<'a, Result<OpReport, ActError>> {
        Box::pin(async move {
            let now = crate::clock::monotonic_ns();
            if let Some(&(until, _)) = self.backoff.get(&pid).filter(|(u, _)| now < *u) {
                return Err(ActError::BackingOff {
                    retry_in_ms: (until - now) / 1_000_000,
                });
            }
            let tsgs = queues.unwrap_or_else(|| {
                state
                    .procs
                    .get(&pid)
                    .map(|p| p.live_queues().map(|q| q.queue_id).collect())
                    .unwrap_or_default()
            });
            let r = self.nv.act(state, pid, &tsgs, true);
            match &r {
                Ok(rep) if !rep.done().is_empty() => {
                    self.backoff.remove(&pid);
                }
                _ => {
                    let delay = self.backoff.get(&pid).map_or(BACKOFF_MIN_NS, |&(_, d)| d);
                    let now = crate::clock::monotonic_ns();
                    self.backoff
                        .insert(pid, (now + delay, (delay * 2).min(BACKOFF_MAX_NS)));
                }
            }
            Ok(r?)
        })
    }

    fn resume<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
    ) -> BoxFut<'a, Result<OpReport, ActError>> {
        Box::pin(async move {
            let tsgs = queues.unwrap_or_else(|| {
                self.nv
                    .paused()
                    .into_iter()
                    .filter(|&(p, _)| p == pid)
                    .map(|(_, t)| t)
                    .collect()
            });
            Ok(self.nv.act(state, pid, &tsgs, false)?)
        })
    }

    fn forget(&mut self, pid: u32) {
        self.nv.forget(pid);
        self.backoff.remove(&pid);
        self.offline.remove(&pid);
        self.lever_failed.remove(&pid);
    }

    fn set_policy(&mut self, policy: &Policy) {
        let old = std::mem::replace(&mut self.policy, policy.nvidia);
        self.nv.set_schedule_only(policy.nvidia.pause_schedule_only);
        if old.lever.timeslice() && !self.policy.lever.timeslice() {
            for pid in self.offline.clone() {
                self.restore(pid, "policy reloaded: lever pause");
            }
        }
        // A new value (or lever) reaches every offline process at the next upkeep.
        self.lever_checked_ns = 0;
        self.lever_failed.clear();
    }

    fn timeslices(&self) -> Vec<(u32, u32, u64, u64)> {
        self.nv.timeslices()
    }

    fn upkeep(&mut self, state: &State, now_ns: u64) -> Vec<Notice> {
        self.nv.prune(state);
        self.nv.beat(now_ns);
        if now_ns.saturating_sub(self.lever_checked_ns) >= LEVER_RECHECK_NS {
            self.lever_checked_ns = now_ns;
            for pid in self.offline.clone() {
                self.apply_lever(state, pid, "offline (new TSG or policy)");
            }
        }
        let mut out = std::mem::take(&mut self.pending);
        for (pid, tsgs) in self.nv.overdue(now_ns, self.max_suspend_ns) {
            match self.nv.act(state, pid, &tsgs, false) {
                Ok(report) => out.push(Notice::Acted {
                    report,
                    suspend: false,
                    why: format!(
                        "watchdog: paused longer than max_suspend ({} ms)",
                        self.max_suspend_ns / 1_000_000
                    ),
                }),
                Err(e) => out.push(Notice::Problem {
                    pid,
                    text: format!("watchdog could not resume TSGs {tsgs:?}: {e:#}"),
                }),
            }
        }
        out
    }

    fn self_test<'a>(&'a mut self, w: &'a mut Watcher) -> BoxFut<'a, Result<Option<String>>> {
        Box::pin(async move {
            crate::nv::startup::self_test(&mut self.nv, w)
                .await
                .map(Some)
        })
    }

    fn shutdown(mut self: Box<Self>) -> BoxFut<'static, Vec<OpReport>> {
        let out = self.nv.shutdown();
        Box::pin(async move { out })
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
