//! The NVIDIA worker thread: the only place the NVIDIA backend calls the driver (RM controls,
//! fd duplicates) and the guardian (holds, releases). An RM call can block for a second or more
//! (one did while its target tore down its CUDA context); here that stalls only this thread, not
//! the controller's loop, which keeps pumping events, deciding, serving KFD processes and the
//! socket, and beating the guardian's lease.
//!
//! Commands come in over a channel and are served in order (so a process's resume never
//! overtakes its pause); results and what the thread did on its own (the `max_suspend`
//! watchdog, timeslice changes) go out as [`Arrival`]s. [`Shared`] lets the loop see, without
//! waiting, whether a call is in flight and since when (the liveness rule in `super`).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
        mpsc, Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result};
use tokio::sync::{mpsc::UnboundedSender, oneshot};

use super::super::{ActError, Arrival, Ticket};
use crate::{
    backend::nv::controller::{lock, NvControl, NvOps},
    clock::monotonic_ns,
    observe::model::State,
    outcome::{Notice, OpReport, QueueOutcome, QueueResult, TimesliceChange},
    policy::{Lever, LeverPolicy},
};

/// First and longest wait after a failed pause.
pub(super) const BACKOFF_MIN_NS: u64 = 100_000_000;
const BACKOFF_MAX_NS: u64 = 10_000_000_000;

/// The longest the thread sleeps when no watchdog deadline is near.
const IDLE_WAKE: Duration = Duration::from_millis(100);

pub(crate) type Job<O> = Box<dyn FnOnce(&mut Inner<O>) + Send>;

/// What the loop asks of the thread. A process's state travels as a one-process slice of the
/// model, taken when the loop asked.
pub(crate) enum Cmd<O: NvOps> {
    /// `pid` was classed: offline -> duplicate its fds, give the guardian its way back, apply
    /// the lever; otherwise put its timeslices back.
    Classed {
        pid: u32,
        proc: State,
        offline: bool,
    },
    /// Pause (`suspend`) or resume TSGs of `pid` (None on a resume: every one paused then).
    /// `by_policy`: the engine's decision, which the `dynamic` lever turns into the short
    /// timeslice (an operator's `suspend` always pauses).
    Act {
        ticket: Ticket,
        pid: u32,
        proc: State,
        tsgs: Option<Vec<u32>>,
        suspend: bool,
        by_policy: bool,
    },
    /// Offline processes again: GR TSGs created since get the offline timeslice.
    Lever(Vec<(u32, State)>),
    Policy(LeverPolicy),
    /// The adaptive tuner's lever per GPU (policy/levers.rs), in place of the policy's own
    /// lever there; GPUs not listed use the policy's.
    GpuLevers(BTreeMap<u32, Lever>),
    /// The process is gone: drop its fd duplicates and the guardian's hold.
    Forget(u32),
    /// Runs on the thread (the self-test, tests).
    Call(Job<O>),
    /// Undo everything (restore timeslices, resume, release), stop the guardian, end.
    Shutdown(oneshot::Sender<Vec<OpReport>>),
}

impl<O: NvOps> Cmd<O> {
    fn pid(&self) -> u32 {
        match self {
            Self::Classed { pid, .. } | Self::Act { pid, .. } | Self::Forget(pid) => *pid,
            Self::Lever(procs) => procs.first().map_or(0, |(p, _)| *p),
            Self::Policy(_) | Self::GpuLevers(_) | Self::Call(_) | Self::Shutdown(_) => 0,
        }
    }
}

/// What the loop may read of the thread at any time, without waiting on it.
#[derive(Default)]
pub(crate) struct Shared {
    /// When the thread's current piece of work began (CLOCK_MONOTONIC ns; 0: idle), and for
    /// which process (0: none in particular).
    busy_since: AtomicU64,
    busy_pid: AtomicU32,
    /// Commands sent and not finished.
    queued: AtomicUsize,
    /// The controller is stopping: commands still queued are answered without a driver call
    /// (everything is undone right after).
    stopping: AtomicBool,
    /// The TSG timeslices changed now (for the status file): (pid, TSG, original, current).
    timeslices: Mutex<Vec<(u32, u32, u64, u64)>>,
}

impl Shared {
    fn begin(&self, pid: u32) {
        self.busy_pid.store(pid, Ordering::Relaxed);
        // Never 0 while busy: 0 means idle.
        self.busy_since
            .store(monotonic_ns().max(1), Ordering::Release);
    }

    fn end(&self) {
        self.busy_since.store(0, Ordering::Release);
    }
}

/// The loop's handle on the thread. Dropping it (a panic unwinding the loop) makes the thread
/// undo everything and end; it is never waited for there.
pub(crate) struct Worker<O: NvOps + Send + 'static> {
    tx: mpsc::Sender<Cmd<O>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl<O: NvOps + Send + 'static> Worker<O> {
    pub(crate) fn start(
        nv: NvControl<O>,
        max_suspend: Duration,
        out: UnboundedSender<Arrival>,
    ) -> Result<Self> {
        let (tx, rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let mut inner = Inner {
            nv,
            max_suspend_ns: u64::try_from(max_suspend.as_nanos()).unwrap_or(u64::MAX),
            backoff: BTreeMap::new(),
            policy: LeverPolicy::default(),
            offline: BTreeSet::new(),
            lever_failed: BTreeSet::new(),
            gpu_levers: BTreeMap::new(),
            gpu_of: BTreeMap::new(),
            shortened: BTreeSet::new(),
            armed: false,
            out,
        };
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("gpreempt-nv".into())
            .spawn(move || inner.run(&rx, &s))
            .context("starting the NVIDIA worker thread")?;
        Ok(Self {
            tx,
            shared,
            thread: Some(thread),
        })
    }

    /// Hands `cmd` over; false when the thread has ended.
    pub(crate) fn submit(&self, cmd: Cmd<O>) -> bool {
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        if self.tx.send(cmd).is_ok() {
            return true;
        }
        self.shared.queued.fetch_sub(1, Ordering::AcqRel);
        false
    }

    /// The piece of work in progress: since when (CLOCK_MONOTONIC ns) and for which pid.
    pub(crate) fn busy(&self) -> Option<(u64, u32)> {
        match self.shared.busy_since.load(Ordering::Acquire) {
            0 => None,
            since => Some((since, self.shared.busy_pid.load(Ordering::Relaxed))),
        }
    }

    /// Nothing queued or in progress.
    pub(crate) fn idle(&self) -> bool {
        self.shared.queued.load(Ordering::Acquire) == 0 && self.busy().is_none()
    }

    pub(crate) fn timeslices(&self) -> Vec<(u32, u32, u64, u64)> {
        lock(&self.shared.timeslices).clone()
    }

    /// Runs `f` on the thread after what is queued, and waits (at most `timeout`) for its
    /// result. For the start-up self-test and tests, never for the loop.
    pub(crate) fn call<R: Send + 'static>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&mut Inner<O>) -> R + Send + 'static,
    ) -> Result<R> {
        let (tx, rx) = mpsc::channel();
        let job: Job<O> = Box::new(move |inner| {
            let _ = tx.send(f(inner));
        });
        anyhow::ensure!(
            self.submit(Cmd::Call(job)),
            "the NVIDIA worker thread has ended"
        );
        rx.recv_timeout(timeout).map_err(|e| match e {
            mpsc::RecvTimeoutError::Timeout => anyhow::anyhow!(
                "the NVIDIA worker thread did not answer within {timeout:?} (a driver call is \
                 stuck)"
            ),
            mpsc::RecvTimeoutError::Disconnected => {
                anyhow::anyhow!("the NVIDIA worker thread has ended")
            }
        })
    }

    /// Asks for the undo after the call in flight; the reply comes on the returned channel.
    /// Commands still queued are answered without a driver call.
    pub(crate) fn stop(&self) -> Option<oneshot::Receiver<Vec<OpReport>>> {
        self.shared.stopping.store(true, Ordering::Release);
        let (tx, rx) = oneshot::channel();
        self.submit(Cmd::Shutdown(tx)).then_some(rx)
    }

    /// Waits for the thread once it has answered the shutdown (it ends right after).
    pub(crate) fn join(&mut self) {
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::warn!("the NVIDIA worker thread panicked");
            }
        }
    }
}

/// The thread's side: the NVIDIA control and the backend's own rules (back-off after a failed
/// pause, the timeslice lever and its fallback, the watchdog).
pub(crate) struct Inner<O: NvOps> {
    pub(crate) nv: NvControl<O>,
    max_suspend_ns: u64,
    /// Per target after a failed pause: (retry not before, next delay). A driver that refuses
    /// is not asked again at the policy's pace.
    pub(crate) backoff: BTreeMap<u32, (u64, u64)>,
    /// The `[nvidia]` policy: the lever and the offline timeslice.
    policy: LeverPolicy,
    /// Processes classed offline (their GR TSGs carry the short timeslice).
    offline: BTreeSet<u32>,
    /// Offline processes whose timeslice could not be set: the policy pauses them instead.
    lever_failed: BTreeSet<u32>,
    /// The adaptive tuner's lever per GPU, over `policy.lever`.
    gpu_levers: BTreeMap<u32, Lever>,
    /// The GPU of each known process's compute TSGs (the one whose lever applies to it).
    gpu_of: BTreeMap<u32, u32>,
    /// Offline processes whose GR TSGs the `dynamic` lever has shortened now (an online
    /// episode on their GPU): the engine's resume puts the originals back.
    shortened: BTreeSet<u32>,
    /// The watchdog runs once the policy is set: after the start-up self-test, whose own pause
    /// must not be cut short by a short `max_suspend`.
    armed: bool,
    out: UnboundedSender<Arrival>,
}

impl<O: NvOps> Inner<O> {
    fn run(&mut self, rx: &mpsc::Receiver<Cmd<O>>, shared: &Shared) {
        loop {
            match rx.recv_timeout(self.next_wake(monotonic_ns())) {
                Ok(Cmd::Shutdown(reply)) => {
                    shared.begin(0);
                    let out = self.nv.shutdown();
                    self.publish(shared);
                    shared.end();
                    shared.queued.fetch_sub(1, Ordering::AcqRel);
                    let _ = reply.send(out);
                    return;
                }
                Ok(cmd) => {
                    if shared.stopping.load(Ordering::Acquire) {
                        self.skip(cmd);
                    } else {
                        shared.begin(cmd.pid());
                        self.handle(cmd);
                        self.publish(shared);
                        shared.end();
                    }
                    shared.queued.fetch_sub(1, Ordering::AcqRel);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // The loop is gone without a shutdown (a panic unwinding it): undo what
                    // we can; the guardian covers the rest when this process ends.
                    shared.begin(0);
                    self.nv.shutdown();
                    shared.end();
                    return;
                }
            }
            if self.armed && self.nv.oldest_pause().is_some() {
                shared.begin(0);
                self.watchdog_at(monotonic_ns());
                self.publish(shared);
                shared.end();
            }
        }
    }

    /// Until the next watchdog deadline, at most [`IDLE_WAKE`].
    fn next_wake(&self, now: u64) -> Duration {
        match self.nv.oldest_pause().filter(|_| self.armed) {
            Some(since) => Duration::from_nanos(
                since
                    .saturating_add(self.max_suspend_ns)
                    .saturating_sub(now),
            )
            .clamp(Duration::from_millis(1), IDLE_WAKE),
            None => IDLE_WAKE,
        }
    }

    fn send(&self, a: Arrival) {
        // The loop is gone when this fails: nothing is left to tell.
        let _ = self.out.send(a);
    }

    fn notice(&self, n: Notice) {
        self.send(Arrival::Notice(n));
    }

    fn publish(&self, shared: &Shared) {
        *lock(&shared.timeslices) = self.nv.timeslices();
    }

    /// A command that arrived after the shutdown was asked for: answered, not done.
    fn skip(&mut self, cmd: Cmd<O>) {
        if let Cmd::Act { ticket, .. } = cmd {
            self.send(Arrival::Done {
                ticket,
                result: Err(ActError::Driver(
                    "not done: the controller is stopping".into(),
                )),
            });
        }
    }

    fn handle(&mut self, cmd: Cmd<O>) {
        match cmd {
            Cmd::Classed { pid, proc, offline } => self.classed(&proc, pid, offline),
            Cmd::Act {
                ticket,
                pid,
                proc,
                tsgs,
                suspend,
                by_policy,
            } => {
                self.note_gpu(&proc, pid);
                let tsgs_asked = tsgs.clone().unwrap_or_default();
                let result = if suspend && by_policy && self.dynamic(pid) {
                    match self.shorten(&proc, pid, &tsgs_asked) {
                        Some(r) => Ok(r),
                        // The SET was refused: paused instead, as the static lever falls back.
                        None => self.suspend(&proc, pid, &tsgs_asked),
                    }
                } else if suspend {
                    self.suspend(&proc, pid, &tsgs_asked)
                } else {
                    self.resume(&proc, pid, tsgs)
                };
                self.send(Arrival::Done { ticket, result });
            }
            Cmd::Lever(procs) => {
                for (pid, proc) in procs {
                    self.note_gpu(&proc, pid);
                    if self.offline.contains(&pid) {
                        self.apply_lever(&proc, pid, "offline (new TSG or policy)");
                    }
                }
            }
            Cmd::Policy(p) => self.set_policy(p),
            Cmd::GpuLevers(l) => self.set_gpu_levers(l),
            Cmd::Forget(pid) => self.forget(pid),
            Cmd::Call(f) => f(self),
            // Served by `run`.
            Cmd::Shutdown(_) => {}
        }
    }

    fn classed(&mut self, proc: &State, pid: u32, offline: bool) {
        self.note_gpu(proc, pid);
        if offline {
            // Duplicate its fds and give the guardian its way back now: a pause is then one
            // RM call.
            if let Err(e) = self.nv.prepare(proc, pid) {
                self.send(Arrival::Refused {
                    pid,
                    error: e.into(),
                });
                return;
            }
            self.offline.insert(pid);
            self.apply_lever(proc, pid, "classed offline");
        } else if self.offline.remove(&pid) {
            self.shortened.remove(&pid);
            self.restore(pid, "no longer offline");
        }
    }

    /// Remembers the GPU of `pid`'s compute TSGs (the first live one's), whose lever applies.
    fn note_gpu(&mut self, proc: &State, pid: u32) {
        let gpu = proc.procs.get(&pid).and_then(|p| {
            p.live_queues()
                .find(|q| q.kind == crate::observe::model::QueueKind::NvCompute)
                .map(|q| q.gpu_id)
        });
        if let Some(g) = gpu {
            self.gpu_of.insert(pid, g);
        }
    }

    /// The lever that applies to `pid`: its GPU's tuned one, else the policy's.
    pub(crate) fn lever_of(&self, pid: u32) -> Lever {
        self.gpu_of
            .get(&pid)
            .and_then(|g| self.gpu_levers.get(g))
            .copied()
            .unwrap_or(self.policy.lever)
    }

    /// Whether the engine's decisions for `pid` are timeslice changes, not pauses.
    fn dynamic(&self, pid: u32) -> bool {
        self.lever_of(pid) == Lever::Dynamic && !self.lever_failed.contains(&pid)
    }

    /// The `dynamic` lever's "suspend": the offline timeslice on `pid`'s GR TSGs for the
    /// online episode. None when the driver refused it: the process is paused from now on
    /// (the notice tells the engine), as under the static lever.
    fn shorten(&mut self, proc: &State, pid: u32, tsgs: &[u32]) -> Option<OpReport> {
        let issued_ns = monotonic_ns();
        let us = self.policy.offline_timeslice_us;
        match self.nv.set_timeslices(proc, pid, us) {
            Ok(changes) => {
                self.shortened.insert(pid);
                self.timeslice_notices(changes, "online busy (lever dynamic)");
                Some(timeslice_report(proc, pid, tsgs, issued_ns, us))
            }
            Err(e) => {
                self.lever_failed.insert(pid);
                self.notice(Notice::LeverFailed {
                    pid,
                    text: format!("{e:#}"),
                });
                None
            }
        }
    }

    fn timeslice_notices(&self, changes: Vec<TimesliceChange>, why: &str) {
        for change in changes {
            self.notice(Notice::Timeslice {
                change,
                why: why.to_string(),
            });
        }
    }

    /// The originals back on what the `dynamic` lever shortened for `pid`, kept known for the
    /// next episode. Err: not put back (kept in `shortened`; the engine decides again).
    fn relax(&mut self, pid: u32, why: &str) -> Result<(), ActError> {
        if !self.shortened.contains(&pid) {
            return Ok(());
        }
        match self.nv.relax_timeslices(pid) {
            Ok(changes) => {
                self.shortened.remove(&pid);
                self.timeslice_notices(changes, why);
                Ok(())
            }
            Err(e) => Err(ActError::Driver(format!(
                "putting the timeslice back: {e:#} (the guardian restores it if we die)"
            ))),
        }
    }

    fn suspend(&mut self, proc: &State, pid: u32, tsgs: &[u32]) -> Result<OpReport, ActError> {
        let now = monotonic_ns();
        if let Some(&(until, _)) = self.backoff.get(&pid).filter(|(u, _)| now < *u) {
            return Err(ActError::BackingOff {
                retry_in_ms: (until - now) / 1_000_000,
            });
        }
        let r = self.nv.act(proc, pid, tsgs, true);
        match &r {
            Ok(rep) if !rep.done().is_empty() => {
                self.backoff.remove(&pid);
            }
            _ => {
                let delay = self.backoff.get(&pid).map_or(BACKOFF_MIN_NS, |&(_, d)| d);
                let now = monotonic_ns();
                self.backoff
                    .insert(pid, (now + delay, (delay * 2).min(BACKOFF_MAX_NS)));
            }
        }
        Ok(r?)
    }

    fn resume(
        &mut self,
        proc: &State,
        pid: u32,
        tsgs: Option<Vec<u32>>,
    ) -> Result<OpReport, ActError> {
        // The `dynamic` lever's episode end (whatever the lever is now: a reload or the tuner
        // may have changed it since the short timeslice was set).
        if self.shortened.contains(&pid) {
            let issued_ns = monotonic_ns();
            self.relax(pid, "online idle (lever dynamic)")?;
            let paused: BTreeSet<u32> = self
                .nv
                .paused()
                .into_iter()
                .filter(|&(p, _)| p == pid)
                .map(|(_, t)| t)
                .collect();
            let asked = tsgs.clone().unwrap_or_default();
            if !asked.iter().any(|t| paused.contains(t)) {
                // Nothing paused as well: no FIFO call.
                return Ok(timeslice_report(proc, pid, &asked, issued_ns, 0));
            }
        }
        // "Everything" is what is paused when the resume runs, after what was asked before it.
        let tsgs = tsgs.unwrap_or_else(|| {
            self.nv
                .paused()
                .into_iter()
                .filter(|&(p, _)| p == pid)
                .map(|(_, t)| t)
                .collect()
        });
        Ok(self.nv.act(proc, pid, &tsgs, false)?)
    }

    /// Gives `pid`'s GR TSGs (those not yet changed) the offline timeslice, when the lever says
    /// so. A failure makes the policy pause the process instead, once, with the reason.
    fn apply_lever(&mut self, proc: &State, pid: u32, why: &str) {
        if !self.lever_of(pid).timeslice() || self.lever_failed.contains(&pid) {
            return;
        }
        match self
            .nv
            .set_timeslices(proc, pid, self.policy.offline_timeslice_us)
        {
            Ok(changes) => {
                for change in changes {
                    self.notice(Notice::Timeslice {
                        change,
                        why: why.to_string(),
                    });
                }
            }
            Err(e) => {
                self.lever_failed.insert(pid);
                self.notice(Notice::LeverFailed {
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
                for change in changes {
                    self.notice(Notice::Timeslice {
                        change,
                        why: why.to_string(),
                    });
                }
            }
            Err(e) => self.notice(Notice::Problem {
                pid,
                text: format!(
                    "restoring its timeslices: {e:#} (the guardian restores them if we die)"
                ),
            }),
        }
    }

    fn set_policy(&mut self, policy: LeverPolicy) {
        self.armed = true;
        self.nv.set_schedule_only(policy.pause_schedule_only);
        let before = self.levers_now();
        let value_changed = policy.offline_timeslice_us != self.policy.offline_timeslice_us;
        self.policy = policy;
        let why = format!("policy reloaded: lever {}", self.policy.lever);
        self.switch_levers(before, &why);
        if value_changed {
            // A shortened TSG would keep the old value for the rest of its episode.
            for pid in self.shortened.clone() {
                if let Err(e) = self.relax(pid, "policy reloaded: offline_timeslice") {
                    self.notice(Notice::Problem {
                        pid,
                        text: e.to_string(),
                    });
                }
            }
        }
        self.lever_failed.clear();
    }

    fn set_gpu_levers(&mut self, levers: BTreeMap<u32, Lever>) {
        let before = self.levers_now();
        self.gpu_levers = levers;
        self.switch_levers(before, "lever tuner");
    }

    /// The lever of every offline process now.
    fn levers_now(&self) -> BTreeMap<u32, Lever> {
        self.offline
            .iter()
            .map(|&pid| (pid, self.lever_of(pid)))
            .collect()
    }

    /// Undoes what each offline process's old lever changed that its new one does not keep,
    /// as a reload does: the static short timeslice goes back unless the new lever is static
    /// too, a `dynamic` episode's short timeslice goes back unless the new lever keeps the
    /// short value anyway. A static lever's value reaches the process at the next re-check
    /// (upkeep, within [`super::LEVER_RECHECK_NS`]). Paused TSGs stay paused until the
    /// engine's resume (the episode's end, or `max_suspend`).
    fn switch_levers(&mut self, before: BTreeMap<u32, Lever>, why: &str) {
        for (pid, old) in before {
            let new = self.lever_of(pid);
            if old == new {
                continue;
            }
            let why = format!("{why}: {old} -> {new}");
            if new.timeslice() {
                // Whatever is short stays short: the static lever wants it so.
                self.shortened.remove(&pid);
                continue;
            }
            if old.timeslice() {
                self.restore(pid, &why);
            } else if let Err(e) = self.relax(pid, &why) {
                self.notice(Notice::Problem {
                    pid,
                    text: e.to_string(),
                });
            }
        }
    }

    pub(crate) fn forget(&mut self, pid: u32) {
        self.nv.forget(pid);
        self.shortened.remove(&pid);
        self.gpu_of.remove(&pid);
        self.backoff.remove(&pid);
        self.offline.remove(&pid);
        self.lever_failed.remove(&pid);
    }

    /// Resumes every TSG paused for `max_suspend` or longer at `now` (CLOCK_MONOTONIC ns).
    pub(crate) fn watchdog_at(&mut self, now: u64) {
        for (pid, tsgs) in self.nv.overdue(now, self.max_suspend_ns) {
            match self.nv.act(&State::new(), pid, &tsgs, false) {
                Ok(report) => self.notice(Notice::Acted {
                    report,
                    suspend: false,
                    why: format!(
                        "watchdog: paused longer than max_suspend ({} ms)",
                        self.max_suspend_ns / 1_000_000
                    ),
                }),
                Err(e) => self.notice(Notice::Problem {
                    pid,
                    text: format!("watchdog could not resume TSGs {tsgs:?}: {e:#}"),
                }),
            }
        }
    }
}

/// The report of a `dynamic` lever act: every TSG asked is done (the engine holds them until
/// the episode's resume), none was paused, `timeslice_us` says what was set (0: put back).
fn timeslice_report(proc: &State, pid: u32, tsgs: &[u32], issued_ns: u64, us: u64) -> OpReport {
    OpReport {
        pid,
        ret: None,
        queues: tsgs
            .iter()
            .map(|&t| QueueResult {
                queue_id: t,
                gpu_id: proc.queue(pid, t).map(|q| q.gpu_id),
                outcome: QueueOutcome::Done,
            })
            .collect(),
        issued_ns,
        returned_ns: monotonic_ns(),
        effect: crate::outcome::Effect::Timeslice(us),
    }
}
