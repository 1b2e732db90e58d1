//! The controller's loop (`gpreempt-ebpf run --policy FILE`; `cmd/run.rs` wires it). The
//! watcher keeps the host model current, the policy engine decides once per tick, the backends
//! act; every decision can be audited as JSON Lines. On SIGINT, SIGTERM, any error, a panic, or Drop, everything is resumed
//! and the debug trap disabled; SIGHUP reloads the policy (a bad file keeps the old one) and
//! reopens the audit file (logrotate).
//!
//! A backend that acts from a worker thread returns at once: its results arrive later
//! ([`Arrival`]) and are applied then (engine, model, audit, the socket's reply), so the loop
//! never waits on a driver. What comes back (results, notices, requests) is handled in `back`.

mod back;
mod classes;
mod escape;
mod policy_watch;

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context as _, Result};
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
    sync::{mpsc, oneshot},
};

use crate::{
    backend::TargetError,
    backend::{ActError, Acted, Arrival, Ticket},
    clock::monotonic_ns,
    controller::{
        audit::{Audit, LogFile},
        daemon::{self, Request, Response, Status},
        hold::Holder,
        notify::Message,
        record::{
            ActLever, AdaptNote, AuditRecord, By, DecisionAct, DirectAct, LeverSwitch, TimesliceSet,
        },
        requests::{answer, finish, Answer, Answered},
    },
    observe::model::{Uncontrollable, Update},
    observe::watch::Watcher,
    outcome::Notice,
    outcome::{Effect, OpReport, QueueOutcome},
    policy::{Action, Class, Decision, Engine, Policy},
};

/// Decisions kept for the status file.
const RECENT: usize = 32;

/// A held queue watched for progress ([`escape`]): since when it is seen held, and its
/// baseline read id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Watch {
    since_ns: u64,
    base: Option<u64>,
}

/// An act handed to a backend's worker, waiting for its result.
enum Pending {
    Decision(Decision),
    /// A socket request, answered when the result comes.
    Request {
        pid: u32,
        suspend: bool,
        reply: oneshot::Sender<Response>,
    },
}

struct Ctx {
    me: u32,
    dry_run: bool,
    /// How this host's GPUs are acted on (none in a dry run), under the run directory's lock:
    /// the loop calls the backends itself (the holder derefs to them) and restores through it.
    backends: Holder,
    engine: Engine,
    audit: Option<Audit<LogFile>>,
    recent: VecDeque<serde_json::Value>,
    /// Processes that cannot be controlled, and why (each reported once).
    refused: BTreeMap<u32, Uncontrollable>,
    /// Processes the freeze fallback holds frozen, with their cgroups: not suspended, so not
    /// in the status's `held`.
    frozen: BTreeMap<u32, String>,
    /// Processes that got out of a hold, while they live ([`escape`]).
    escaped: BTreeMap<u32, crate::observe::model::Escape>,
    /// (pid, kind) -> (when last said, escapes unsaid since): the rate limit of the warnings.
    escape_said: BTreeMap<(u32, crate::outcome::EscapeKind), (u64, u64)>,
    /// The same for the escapes' audit records.
    escape_audited: BTreeMap<(u32, crate::outcome::EscapeKind), (u64, u64)>,
    /// Held queues watched for progress ([`escape`]).
    progress: BTreeMap<(u32, u32), Watch>,
    /// Acts whose results have not arrived yet.
    pending: BTreeMap<Ticket, Pending>,
    status_dirty: bool,
    metrics_addr: Option<String>,
    unit: Option<String>,
    /// The metrics and the page the HTTP task serves (with --metrics).
    metrics: Option<(
        crate::controller::metrics::Metrics,
        crate::controller::metrics::Page,
    )>,
}

impl Ctx {
    /// The controller of `backends` under `policy`: its engine chooses among the levers they
    /// offer.
    fn new(
        policy: Policy,
        dry_run: bool,
        mut backends: Holder,
        audit: Option<Audit<LogFile>>,
    ) -> Self {
        for b in &mut backends.list {
            b.set_policy(&policy);
        }
        let engine = Engine::new(policy).with_offers(backends.offers());
        Self {
            me: std::process::id(),
            dry_run,
            backends,
            engine,
            audit,
            recent: VecDeque::new(),
            refused: BTreeMap::new(),
            frozen: BTreeMap::new(),
            escaped: BTreeMap::new(),
            escape_said: BTreeMap::new(),
            escape_audited: BTreeMap::new(),
            progress: BTreeMap::new(),
            pending: BTreeMap::new(),
            status_dirty: true,
            unit: daemon::own_unit(),
            metrics_addr: None,
            metrics: None,
        }
    }

    fn status(&self, w: &Watcher) -> Status {
        Status {
            controller_pid: self.me,
            mode: "run".into(),
            policy: Some(self.engine.policy().source.clone()),
            dry_run: self.dry_run,
            classes: w
                .state
                .procs
                .values()
                .filter_map(|p| Some((p.pid, p.class.clone()?)))
                .collect(),
            // A dry run holds nothing (its decisions are in `decisions`).
            held: if self.dry_run {
                Vec::new()
            } else {
                self.engine
                    .held()
                    .into_iter()
                    .filter(|(pid, ..)| !self.frozen.contains_key(pid))
                    .map(|(pid, q, g, _)| (pid, q, Some(g)))
                    .collect()
            },
            frozen: self
                .frozen
                .iter()
                .filter(|(pid, _)| {
                    w.state
                        .procs
                        .get(pid)
                        .is_some_and(|p| p.exited_ns.is_none())
                })
                .map(|(&pid, cg)| (pid, cg.clone()))
                .collect(),
            fenced: self.engine.fenced(),
            refused: self
                .refused
                .iter()
                .map(|(&pid, u)| (pid, u.reason.clone()))
                .collect(),
            uncontrollable: self.refused.clone(),
            escaped: self.escaped.clone(),
            decisions: self.recent.iter().cloned().collect(),
            events: w.event_counts(),
            events_degraded: w.events_degraded(),
            audit_failing: self.audit.as_ref().and_then(|a| {
                a.failing()
                    .map(|f| format!("{} ({} record(s) lost)", f.error, f.lost))
            }),
            timeslices: self
                .backends
                .list
                .iter()
                .flat_map(|b| b.timeslices())
                .collect(),
            adaptive: self.engine.adaptive_views(),
            gpu_levers: self
                .engine
                .lever_views()
                .into_iter()
                .map(Into::into)
                .collect(),
            metrics: self.metrics_addr.clone(),
            unit: self.unit.clone(),
            requests: w.state.own_request_stats(monotonic_ns()),
        }
    }

    fn record(&mut self, rec: AuditRecord) {
        if let Some((m, _)) = &mut self.metrics {
            m.record(&rec);
        }
        if let Some(a) = &mut self.audit {
            if let Some(said) = a.record(&rec) {
                log::warn!("{said}");
                self.status_dirty = true;
            }
        }
        // The status file's `decisions` are these same records, as JSON.
        match serde_json::to_value(&rec) {
            Ok(v) => {
                if self.recent.len() == RECENT {
                    self.recent.pop_front();
                }
                self.recent.push_back(v);
            }
            Err(e) => log::warn!("an audit record for the status file: {e}"),
        }
        self.status_dirty = true;
    }

    /// Applies a control result to the model (our own DBG_TRAP calls are not read back from
    /// the eBPF events: their arrays are gone by then).
    fn apply_report(&self, w: &mut Watcher, r: &OpReport, suspend: bool) {
        let queues = Some(r.done());
        let (ts_ns, by, target) = (r.returned_ns, self.me, r.pid);
        w.state
            .apply(Update::queue_op(suspend, ts_ns, by, target, queues));
    }

    fn refuse(&mut self, w: &mut Watcher, pid: u32, e: ActError) {
        match e {
            ActError::Target(TargetError::Reused { .. }) => {
                // Not a process that cannot be controlled: the one the model knew is gone. Its
                // pid's new owner is read afresh (a new process, classified anew).
                w.recheck(pid);
                self.status_dirty = true;
                return;
            }
            ActError::Target(TargetError::Gone) => {
                // The model may not know yet: its record goes now, not at the next reconcile,
                // and a process that is gone is not one that cannot be controlled.
                w.recheck(pid);
                if w.state
                    .procs
                    .get(&pid)
                    .is_none_or(|p| p.exited_ns.is_some())
                {
                    self.controllable(w, pid);
                    return;
                }
            }
            _ => {}
        }
        let text = e.to_string();
        if self.refused.get(&pid).map(|u| &u.reason) != Some(&text) {
            log::warn!("pid {pid}: cannot be controlled: {text}");
            w.state.apply(Update::Warning {
                ts_ns: monotonic_ns(),
                text: format!("pid {pid}: cannot be controlled: {text}"),
            });
            let why = Uncontrollable {
                kind: e.kind().into(),
                reason: text,
            };
            w.state.apply(Update::Uncontrollable {
                pid,
                why: Some(why.clone()),
            });
            self.refused.insert(pid, why);
            self.status_dirty = true;
        }
    }

    /// `pid` is no longer refused (controlled now, or gone).
    fn controllable(&mut self, w: &mut Watcher, pid: u32) {
        if self.refused.remove(&pid).is_some() {
            w.state.apply(Update::Uncontrollable { pid, why: None });
            self.status_dirty = true;
        }
    }

    /// Online processes get launch and wait uprobes: their request latency is measured always,
    /// and their launches trigger the policy when it wants hints (`launch_hints`). Others lose
    /// them.
    fn launch_hints(&mut self, w: &mut Watcher, pid: u32, class: Class) {
        if class == Class::Online {
            if let Err(e) = w.watch_launches(pid) {
                log::info!("pid {pid}: no launch hints: {e:#}");
            }
        } else {
            w.unwatch_launches(pid);
        }
    }

    async fn tick(&mut self, w: &mut Watcher) {
        self.classify(w).await;
        let now = monotonic_ns();
        let mut notices = Vec::new();
        for b in &mut self.backends.list {
            notices.extend(b.upkeep(&w.state, now));
        }
        for n in notices {
            self.notice(w, n);
        }
        self.escapes(w).await;
        self.progress_escapes(w).await;
        let decisions = self.engine.decide(&w.state, now);
        // The lever tuner's changes reach the backends before the decisions made under
        // them (the worker serves its commands in order).
        self.lever_changes(now);
        for d in decisions {
            self.act(w, d).await;
        }
        for (gpu_id, note) in self.engine.take_notes() {
            log::info!("GPU {gpu_id:#x}: adaptive: {note}");
            self.record(AuditRecord::Adapt(AdaptNote {
                emulated: std::env::var_os("GPREEMPT_LABEL").is_some(),
                gpu_id,
                reason: note,
                ts_ns: now,
            }));
        }
    }

    /// The lever tuner's changes (strategy `adaptive` where a backend offers a choice): logged, audited and
    /// handed to the backends, which undo what the old lever did as on a reload.
    fn lever_changes(&mut self, now: u64) {
        for (gpu_id, c) in self.engine.take_lever_changes() {
            log::info!(
                "GPU {gpu_id:#x}: lever {} -> {} ({})",
                c.from,
                c.to,
                c.reason
            );
            self.record(AuditRecord::Lever(LeverSwitch {
                dry_run: self.dry_run,
                from: c.from.label().into(),
                gpu: gpu_id,
                reason: c.reason,
                to: c.to.label().into(),
                ts_ns: now,
            }));
        }
        // Every tick, not only on a change: a reload drops the tuners without one (the
        // backends ignore an unchanged map).
        let levers = self.engine.gpu_levers();
        for b in &mut self.backends.list {
            b.set_gpu_levers(&levers);
        }
    }

    /// The audit record of `d` as decided (what came of it is added once acted on).
    fn audit_record(&self, d: &Decision) -> DecisionAct {
        DecisionAct {
            dry_run: self.dry_run,
            emulated: std::env::var_os("GPREEMPT_LABEL").is_some(),
            gpu_id: d.gpu_id,
            grace: d.grace,
            pid: d.pid,
            queues: d.queues.clone(),
            reason: d.reason.clone(),
            trigger_ns: d.trigger_ns,
            ts_ns: d.ts_ns,
            ..DecisionAct::default()
        }
    }

    async fn act(&mut self, w: &mut Watcher, d: Decision) {
        let suspend = d.action == Action::Suspend;
        // The audit record is built after the ioctl: nothing but the decision precedes it.
        if self.dry_run {
            let rec = self.audit_record(&d);
            self.engine.confirm(&d, &d.queues);
            log::info!(
                "dry run: would {} pid {} queues {:?} on GPU {:#x}: {}",
                if suspend { "suspend" } else { "resume" },
                d.pid,
                d.queues,
                d.gpu_id,
                d.reason
            );
            self.record(AuditRecord::act(suspend, rec));
            return;
        }
        // One decision per process with a worker at a time: the engine decides again what it
        // was not told is done, so acts would otherwise pile up behind a slow driver call.
        let busy = self
            .pending
            .values()
            .any(|p| matches!(p, Pending::Decision(o) if o.pid == d.pid));
        if busy {
            log::debug!("pid {}: an earlier act is still in flight", d.pid);
            return;
        }
        let acted = match self.backends.for_pid(&w.state, d.pid) {
            Ok(b) if suspend => {
                b.policy_suspend(&w.state, d.pid, Some(d.queues.clone()), d.grace)
                    .await
            }
            Ok(b) => b.resume(&w.state, d.pid, Some(d.queues.clone())).await,
            Err(e) => Acted::Now(Err(e)),
        };
        match acted {
            Acted::Now(r) => self.decided(w, d, r),
            Acted::Later(t) => {
                self.pending.insert(t, Pending::Decision(d));
            }
        }
    }
}

/// Whether a refusal of this kind comes from an act (a suspend the kernel refused), so that only
/// an act that succeeds retracts it.
fn refused_by_act(kind: &str) -> bool {
    kind == "no_debug_api"
}

/// Who may steer this controller: root, and the policy's `[control] group` if it names one
/// (it must exist: a typo would silently lock its members out).
fn control_access(p: &Policy) -> Result<daemon::Access> {
    let Some(name) = &p.control_group else {
        return Ok(daemon::Access::default());
    };
    let g = nix::unistd::Group::from_name(name)
        .with_context(|| format!("looking up group {name:?}"))?
        .with_context(|| {
            format!(
                "{}: [control] group {name:?} does not exist (getent group {name})",
                p.source
            )
        })?;
    log::info!(
        "control socket: root and group {name} (gid {}) may send requests",
        g.gid
    );
    Ok(daemon::Access {
        group: Some(g.gid.as_raw()),
    })
}

/// The signals the controller answers, made first: from then on nothing ends the process
/// without the cleanup at the loop's end.
pub struct Signals {
    pub int: Signal,
    pub term: Signal,
    hup: Signal,
}

impl Signals {
    pub fn new() -> Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// The metrics and the page the HTTP task serves, and the address it is bound to.
pub type Served = (
    crate::controller::metrics::Metrics,
    crate::controller::metrics::Page,
    SocketAddr,
);

/// Binds the metrics address (with --metrics); call it before any backend attaches, so a busy
/// address fails the start with nothing to undo.
pub async fn bind_metrics(addr: Option<SocketAddr>) -> Result<Option<Served>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let page = crate::controller::metrics::Page::default();
    let bound = crate::controller::metrics::serve(addr, page.clone()).await?;
    eprintln!("gpreempt-ebpf run: metrics at http://{bound}/metrics");
    Ok(Some((
        crate::controller::metrics::Metrics::new()?,
        page,
        bound,
    )))
}

/// What the loop starts from, made by `cmd/run.rs` in this order: signals, policy, lock,
/// metrics, alarm, backends, watcher (self-tested).
pub struct Setup {
    pub policy: Policy,
    /// Where SIGHUP reloads the policy from.
    pub policy_path: PathBuf,
    /// `--reload-on-change`: a change of that file reloads too (a ConfigMap's update).
    pub reload_on_change: bool,
    pub dry_run: bool,
    pub audit: Option<PathBuf>,
    /// `--audit-max-size`: rotate the audit file to FILE.1 before it grows past this.
    pub audit_max_size: Option<u64>,
    pub tick: Duration,
    /// The run directory (lock, status file, socket).
    pub dir: PathBuf,
    pub metrics: Option<Served>,
    /// A deferred suspend falls due between ticks: the loop also wakes at the engine's deadline.
    pub alarm: crate::controller::alarm::Alarm,
    /// The backends, with the run directory's lock (held until the loop has restored everything).
    pub backends: Holder,
    pub watcher: Watcher,
    pub signals: Signals,
    /// systemd's readiness and watchdog messages (inert outside a `Type=notify` unit).
    pub notify: crate::controller::notify::Notifier,
}

/// SIGHUP reloads, read and parsed off the loop (a slow or huge file must not stall
/// decisions); the old policy stays until the new one parsed.
struct Reload {
    tx: mpsc::UnboundedSender<Result<Policy>>,
    rx: mpsc::UnboundedReceiver<Result<Policy>>,
    busy: bool,
}

impl Reload {
    fn start(&mut self, path: &Path) {
        if self.busy {
            eprintln!("policy reload already in progress: this SIGHUP is folded into it");
            return;
        }
        self.busy = true;
        let (path, tx) = (path.to_path_buf(), self.tx.clone());
        tokio::task::spawn_blocking(move || {
            let _ = tx.send(Policy::load(&path));
        });
    }
}

impl Ctx {
    /// SIGHUP: the audit file is opened by its name again (logrotate moved it away).
    fn reopen_audit(&mut self) {
        if let Some(Err(e)) = self.audit.as_mut().map(Audit::reopen) {
            log::warn!("audit file NOT reopened, still writing to the one open before: {e:#}");
        }
    }

    /// A reload read off the loop came back: the new policy, or the old one kept.
    fn reloaded(&mut self, r: Result<Policy>) {
        if let Some((m, _)) = &self.metrics {
            m.reloaded(r.is_ok());
        }
        let p = match r {
            Ok(p) => p,
            Err(e) => {
                eprintln!("policy NOT reloaded, keeping the old one: {e:#}");
                return;
            }
        };
        eprintln!("policy reloaded: {}", p.summary());
        if p.control_group != self.engine.policy().control_group {
            eprintln!(
                "policy: [control] group changes take effect at the next start \
                 (the socket keeps its owner and mode)"
            );
        }
        for w in p.trust_warnings() {
            log::warn!("{w}");
        }
        for b in &mut self.backends.list {
            b.set_policy(&p);
        }
        self.engine.set_policy(p);
        self.status_dirty = true;
    }

    /// Every 250 ms: the NVIDIA objects journal, retries of refused processes, the status file
    /// and the metrics page. `n`: how many publishes came before.
    async fn publish(&mut self, w: &mut Watcher, dir: &Path, n: u32) {
        // Written when it changed: a controller killed now loses at most 250 ms of it.
        if let Err(e) = w.save_journals(dir) {
            log::warn!("NVIDIA objects journal: {e:#}");
        }
        if n.is_multiple_of(8) && !self.refused.is_empty() {
            self.retry_refused(w).await;
        }
        if n.is_multiple_of(4) {
            self.forget_escapes(w);
        }
        // Every second regardless: the event counters move without decisions.
        if std::mem::take(&mut self.status_dirty) || n.is_multiple_of(4) {
            let status = self.status(w);
            if let Err(e) = daemon::write_status(dir, &status) {
                log::warn!("{e:#}");
            }
            if let (Some((m, page)), true) = (&mut self.metrics, n.is_multiple_of(4)) {
                let closed = w.state.take_closed_requests();
                m.observe_requests(&w.state, &closed);
                let text = m.render(&w.state, &status, monotonic_ns());
                if let Ok(mut p) = page.write() {
                    *p = text.into();
                }
            }
        }
    }
}

/// Runs the controller until a signal or an error, then resumes everything it holds.
pub async fn run(s: Setup) -> Result<ExitCode> {
    let Setup {
        policy,
        policy_path,
        reload_on_change,
        dry_run,
        audit,
        audit_max_size,
        tick,
        dir,
        metrics,
        mut alarm,
        mut backends,
        mut watcher,
        mut signals,
        mut notify,
    } = s;
    let mut arrivals = backends.take_arrivals();
    let audit = match &audit {
        Some(p) => Some(Audit::new(LogFile::open(p)?).with_max_size(audit_max_size)),
        None => None,
    };
    eprintln!(
        "gpreempt-ebpf run: {}{}",
        policy.summary(),
        if dry_run {
            " (dry run: nothing is suspended)"
        } else {
            ""
        }
    );
    let mut ctx = Ctx::new(policy, dry_run, backends, audit);
    ctx.metrics_addr = metrics.as_ref().map(|(_, _, a)| a.to_string());
    ctx.metrics = metrics.map(|(m, page, _)| (m, page));
    let mut requests = daemon::serve(&dir, control_access(ctx.engine.policy())?)?;
    // Self-tested, socket up: only now does systemd count the unit as started.
    notify.send(&Message::Ready {
        status: &ctx.engine.policy().summary(),
    });
    let mut tick = tokio::time::interval(tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut publish = tokio::time::interval(Duration::from_millis(250));
    let mut publishes = 0u32;
    let (tx, rx) = mpsc::unbounded_channel();
    let mut reload = Reload {
        tx,
        rx,
        busy: false,
    };
    let mut policy_watch =
        reload_on_change.then(|| policy_watch::PolicyWatch::new(policy_path.clone()));
    let w = &mut watcher;
    let result: Result<String> = async {
        loop {
            alarm.set(ctx.engine.next_deadline_ns())?;
            tokio::select! {
                biased;
                _ = signals.int.recv() => return Ok("interrupted".into()),
                _ = signals.term.recv() => return Ok("terminated".into()),
                _ = signals.hup.recv() => {
                    ctx.reopen_audit();
                    if !reload.busy {
                        notify.send(&Message::Reloading { monotonic_us: monotonic_ns() / 1000 });
                    }
                    reload.start(&policy_path);
                }
                Some(r) = reload.rx.recv() => {
                    reload.busy = false;
                    ctx.reloaded(r);
                    // Reloaded or kept: either way the controller runs a policy again.
                    notify.send(&Message::Ready { status: &ctx.engine.policy().summary() });
                }
                // Every backend's results and notices (none in a dry run: `None` at once).
                Some(a) = arrivals.recv() => ctx.arrival(w, a),
                Some((req, reply)) = requests.recv() => ctx.request(w, req, reply).await,
                // Before the rest: cheap, and `top` / `status` must not go stale under load.
                _ = publish.tick() => {
                    // Only while the loop turns: a loop stuck in a branch stops the pings.
                    notify.alive(std::time::Instant::now());
                    publishes += 1;
                    ctx.publish(w, &dir, publishes).await;
                    // Every 2 s: a stat of the policy file.
                    if publishes.is_multiple_of(8) && policy_watch.as_mut().is_some_and(|p| p.changed()) {
                        eprintln!("the policy file changed: reloading {}", policy_path.display());
                        if !reload.busy {
                            notify.send(&Message::Reloading { monotonic_us: monotonic_ns() / 1000 });
                        }
                        reload.start(&policy_path);
                    }
                }
                // At a deadline the engine named: the decision it defers is due now.
                r = alarm.fired(), if alarm.armed() => {
                    r?;
                    ctx.tick(w).await;
                }
                // Decide right after new samples or events: the tick only drives time-based
                // transitions (resume_after, the guards, watchdogs), so detection-to-ioctl stays short.
                r = w.pump() => {
                    r?;
                    ctx.tick(w).await;
                }
                _ = tick.tick() => ctx.tick(w).await,
            }
        }
    }
    .await;
    notify.send(&Message::Stopping {
        status: "resuming and releasing everything held",
    });
    stop(ctx, w, arrivals, &dir, result).await
}

/// Every way out passes here (an unwinding panic: the KFD control thread's Drop and the panic
/// hook; any death: the kernel on AMD, the guardian on NVIDIA): everything held is resumed.
async fn stop(
    mut ctx: Ctx,
    w: &mut Watcher,
    mut arrivals: mpsc::UnboundedReceiver<Arrival>,
    dir: &Path,
    result: Result<String>,
) -> Result<ExitCode> {
    let reports = ctx.backends.shutdown().await;
    let resumed: BTreeSet<u32> = reports.iter().map(|r| r.pid).collect();
    // Results of acts that were in flight, so the audit and the socket hear how they ended.
    while let Ok(a) = arrivals.try_recv() {
        ctx.arrival(w, a);
    }
    if !resumed.is_empty() {
        eprintln!(
            "resumed and released {} process(es): {resumed:?}",
            resumed.len()
        );
    }
    let _ = daemon::write_status(dir, &Status::default());
    match result {
        Ok(why) => {
            eprintln!("{why}: nothing is left suspended");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(e.context("the controller stopped; every queue was resumed")),
    }
}

#[cfg(test)]
mod toy_tests;
