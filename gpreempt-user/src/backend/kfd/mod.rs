//! AMD: the KFD backend. DBG_TRAP suspend/resume from the [`control`] thread; the kernel
//! resumes every queue of a debugger that exits, however it exits, and the [`lease`] kills a
//! controller whose loop stops beating.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::Result;
use tokio::sync::mpsc::UnboundedSender;

use super::{freezer, ActError, Acted, Arrival, Backend, BoxFut};
use crate::{
    backend::kfd::control::TargetError,
    backend::kfd::control::{Control, ControlHandle, Limits},
    lever::{Lever, Offer, Offers, Undo},
    observe::model::{State, Vendor},
    observe::procinfo::{self, ProcId},
    outcome::{EscapeKind, Notice, OpReport},
    policy::{Class, Policy},
    rundir,
};

pub mod control;
pub mod lease;

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
    /// Kills this controller if its loop stops beating ([`lease`]).
    lease: lease::KfdLease,
    /// Cgroups frozen: instead of suspending queues (`[policy] no_debug_api = "freeze"`), or
    /// besides, for a process that keeps escaping its hold (`escape = "freeze"`).
    fallback: Option<freezer::Fallback>,
    /// `no_debug_api = "freeze"`.
    freeze_no_debug_api: bool,
    /// Processes frozen besides being suspended (they escaped): thawed when resumed.
    escalated: std::collections::BTreeSet<u32>,
}

impl KfdBackend {
    pub async fn start(
        kfd_device: &Path,
        dir: &Path,
        max_suspend: Duration,
        arrivals: UnboundedSender<Arrival>,
    ) -> Result<Self> {
        let control = Control::start(
            kfd_device,
            Limits {
                max_suspend,
                ..Limits::default()
            },
            arrivals,
        )?;
        if let Some(h) = control.handle() {
            install_panic_hook(h);
        }
        recover(&control, dir).await;
        let lease = lease::KfdLease::start(dir, max_suspend, control.turns())?;
        Ok(Self {
            control,
            dir: dir.to_path_buf(),
            attached: BTreeMap::new(),
            lease,
            fallback: None,
            freeze_no_debug_api: false,
            escalated: Default::default(),
        })
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

/// AMD: the queues are suspended through the debug API (at once, or once a burst outlasts the
/// tuned deferral), or the process's cgroup frozen where its runtime never enabled that API
/// (`[policy] no_debug_api = "freeze"`); or nothing is done (`none`: the baseline the adaptive
/// strategy measures the others against).
pub const OFFERS: Offers = Offers {
    list: &[
        Offer {
            lever: Lever::None,
            cost: "nothing: offline work is left alone",
            undo: Undo::Nothing,
        },
        Offer {
            lever: Lever::Defer,
            cost: "as pause, for the bursts that outlast the tuned deferral",
            undo: Undo::ResumeByKernel,
        },
        Offer {
            lever: Lever::Pause,
            cost: "one DBG_TRAP ioctl per act, and a runlist re-upload by the firmware (HWS)",
            undo: Undo::ResumeByKernel,
        },
        Offer {
            lever: Lever::Freeze,
            cost: "a cgroup.freeze write per act; work already queued still runs",
            undo: Undo::ThawByGuardian,
        },
    ],
    default: Lever::Pause,
};

impl Backend for KfdBackend {
    fn vendor(&self) -> Vendor {
        Vendor::Amd
    }

    fn offers(&self) -> Offers {
        OFFERS
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
            // Frozen already: the kernel would refuse again; the freeze is what holds it.
            let frozen = self.fallback.as_ref().is_some_and(|f| f.is_frozen(pid));
            let why = if frozen {
                String::new()
            } else {
                match self.suspend(state, pid, queues, grace).await.now() {
                    Err(ActError::Target(TargetError::NoDebugApi(why)))
                        if self.fallback.is_some() && self.freeze_no_debug_api =>
                    {
                        why
                    }
                    r => return Acted::Now(r),
                }
            };
            let Some(f) = self
                .fallback
                .as_mut()
                .filter(|_| frozen || self.freeze_no_debug_api)
            else {
                return Acted::Now(Err(TargetError::NoDebugApi(why).into()));
            };
            Acted::Now(f.freeze(&mut self.lease, state, pid, false).map_err(|e| {
                TargetError::NoDebugApi(format!("{why}; the freeze fallback refused: {e:#}")).into()
            }))
        })
    }

    fn resume<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        queues: Option<Vec<u32>>,
    ) -> BoxFut<'a, Acted> {
        Box::pin(async move {
            let thawed = self
                .fallback
                .as_mut()
                .and_then(|f| f.thaw(&mut self.lease, state, pid));
            // A process frozen only because it escaped is suspended too: resumed below.
            if let Some(r) = thawed.filter(|_| !self.escalated.remove(&pid)) {
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

    fn rehold<'a>(
        &'a mut self,
        state: &'a State,
        pid: u32,
        kind: EscapeKind,
        escalate: bool,
    ) -> BoxFut<'a, Result<Vec<OpReport>, ActError>> {
        Box::pin(async move {
            if !self.attached.contains_key(&pid) {
                return Ok(Vec::new());
            }
            let id = self.identity(state, pid)?;
            let frozen = self.fallback.as_ref().is_some_and(|f| f.is_frozen(pid));
            // The control thread takes the debug session back if it is no longer ours.
            let mut out = match self.control.rehold(id, false).await {
                Ok(r) => vec![r],
                // A process frozen as its fallback has no queues of ours to suspend.
                Err(_) if frozen => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            if escalate && !frozen {
                if let Some(f) = self.fallback.as_mut() {
                    match f.freeze(&mut self.lease, state, pid, true) {
                        Ok(r) => {
                            self.escalated.insert(pid);
                            out.push(r);
                        }
                        Err(e) => log::warn!(
                            "pid {pid}: {} again and again; escape = \"freeze\" refused: {e:#}",
                            kind.what()
                        ),
                    }
                }
            }
            Ok(out)
        })
    }

    fn forget(&mut self, pid: u32) {
        self.escalated.remove(&pid);
        if self.attached.remove(&pid).is_some() {
            self.save_targets();
        }
        if let Some(f) = self.fallback.as_mut() {
            f.thaw(&mut self.lease, &State::default(), pid);
        }
    }

    fn set_policy(&mut self, policy: &Policy) {
        self.freeze_no_debug_api = policy.no_debug_api == crate::policy::NoDebugApi::Freeze;
        let want = self.freeze_no_debug_api || policy.escape == crate::policy::OnEscape::Freeze;
        match (want, self.fallback.as_mut()) {
            (true, None) => match freezer::Freezer::host() {
                Ok(f) => self.fallback = Some(freezer::Fallback::new(f)),
                Err(e) => log::warn!("freezing cgroups: {e:#}: refusing instead"),
            },
            (false, Some(f)) => {
                f.thaw_all(&mut self.lease, &State::default());
                self.fallback = None;
                self.escalated.clear();
            }
            _ => {}
        }
    }

    fn upkeep(&mut self, state: &State, now_ns: u64) -> Vec<Notice> {
        // The control thread runs its own watchdog and reports through the notice channel; the
        // loop's heartbeat keeps the lease guardian from killing us.
        let mut out: Vec<Notice> = self
            .lease
            .upkeep(now_ns)
            .map(|text| Notice::Problem { pid: 0, text })
            .into_iter()
            .collect();
        // Frozen cgroups that were thawed or left: frozen again, said once each time.
        if let Some(f) = self.fallback.as_mut() {
            out.extend(f.escapes(&mut self.lease, state, now_ns));
        }
        out
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
