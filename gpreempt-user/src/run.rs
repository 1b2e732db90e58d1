//! `gpreempt-ebpf run --policy FILE`: the controller. The watcher keeps the host model current,
//! the policy engine decides once per tick, the control thread acts; every decision can be
//! audited as JSON Lines. On SIGINT, SIGTERM, any error, a panic, or Drop, everything is resumed
//! and the debug trap disabled; SIGHUP reloads the policy (a bad file keeps the old one).

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    io::Write as _,
    path::Path,
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context as _, Result};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    cli::{Cli, RunArgs},
    clock::monotonic_ns,
    control::{Control, ControlHandle, Limits, Notice, OpReport, QueueOutcome},
    daemon::{self, Controlled, Request, Response, Status},
    kfd::Paths,
    manual::describe,
    policy::{Action, Class, Decision, Engine, Policy},
    procinfo,
    state::Update,
    watch::{Intervals, Watcher},
};

/// Decisions kept for the status file.
const RECENT: usize = 32;

/// Resumes everything if anything panics (before the default hook prints the panic).
fn install_panic_hook(h: ControlHandle) {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() != Some("gpreempt-ctl") {
            h.shutdown_blocking(Duration::from_secs(2));
        }
        prev(info);
    }));
}

struct Ctx {
    me: u32,
    dry_run: bool,
    dir: std::path::PathBuf,
    control: Option<Control>,
    /// NVIDIA processes: paused through their own RM clients, a guardian holding the way back.
    nv: Option<crate::nv::ctl::NvControl>,
    engine: Engine,
    audit: Option<std::fs::File>,
    recent: VecDeque<serde_json::Value>,
    /// Processes under control (attached), with their start times.
    attached: BTreeMap<u32, u64>,
    /// Processes that cannot be controlled, and why (each reported once).
    refused: BTreeMap<u32, String>,
    status_dirty: bool,
}

impl Ctx {
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
                    .map(|(pid, q, g, _)| (pid, q, Some(g)))
                    .collect()
            },
            fenced: self.engine.fenced(),
            refused: self.refused.clone(),
            decisions: self.recent.iter().cloned().collect(),
        }
    }

    fn record(&mut self, v: serde_json::Value) {
        if let Some(f) = &mut self.audit {
            let mut line = v.to_string();
            line.push('\n');
            if let Err(e) = f.write_all(line.as_bytes()) {
                log::warn!("audit file: {e}; auditing stops");
                self.audit = None;
            }
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(v);
        self.status_dirty = true;
    }

    fn save_targets(&self) {
        let t: Vec<Controlled> = self
            .attached
            .iter()
            .map(|(&pid, &start_time)| Controlled { pid, start_time })
            .collect();
        if let Err(e) = daemon::write_targets(&self.dir, &t) {
            log::warn!("{e:#}");
        }
    }

    /// Applies a control result to the model (our own DBG_TRAP calls are not read back from
    /// the eBPF events: their arrays are gone by then).
    fn apply_report(&self, w: &mut Watcher, r: &OpReport, suspend: bool) {
        let queues = Some(r.done());
        let (ts_ns, by, target) = (r.returned_ns, self.me, r.pid);
        w.state
            .apply(Update::queue_op(suspend, ts_ns, by, target, queues));
    }

    async fn classify(&mut self, w: &mut Watcher) {
        for (pid, class) in self.engine.classify(&w.state) {
            log::info!(
                "pid {pid} ({}): {class}, {} live queue(s)",
                w.state.procs.get(&pid).map_or("?", |p| p.comm()),
                w.state
                    .procs
                    .get(&pid)
                    .map_or(0, |p| p.live_queues().count())
            );
            self.status_dirty = true;
            w.state.apply(Update::Class {
                pid,
                class: Some(class.label().to_string()),
            });
            self.launch_hints(w, pid, class);
            let Some(control) = &self.control else {
                continue;
            };
            // Offline processes are attached ahead of time, so a suspend is one ioctl.
            if class == Class::Offline && !self.attached.contains_key(&pid) {
                match control.attach(pid).await {
                    Ok(_) => {
                        // Classified processes have their /proc facts in the model already.
                        let start = w
                            .state
                            .procs
                            .get(&pid)
                            .and_then(|p| p.info.as_ref())
                            .map_or(0, |i| i.start_time);
                        self.attached.insert(pid, start);
                        self.refused.remove(&pid);
                        self.save_targets();
                    }
                    Err(e) => {
                        let text = e.to_string();
                        if self.refused.get(&pid) != Some(&text) {
                            log::warn!("pid {pid}: cannot be controlled: {text}");
                            w.state.apply(Update::Warning {
                                ts_ns: monotonic_ns(),
                                text: format!("pid {pid}: cannot be controlled: {text}"),
                            });
                            self.refused.insert(pid, text);
                            self.status_dirty = true;
                        }
                    }
                }
            } else if class != Class::Offline && self.attached.remove(&pid).is_some() {
                if let Err(e) = control.detach(pid).await {
                    log::debug!("pid {pid}: detach: {e}");
                }
                self.save_targets();
            }
        }
    }

    /// Online processes get launch uprobes (when the policy wants hints); others lose them.
    fn launch_hints(&mut self, w: &mut Watcher, pid: u32, class: Class) {
        if class == Class::Online && self.engine.policy().launch_hints {
            match w.watch_launches(pid) {
                Ok(0) => log::debug!("pid {pid}: no launch entry point mapped (yet)"),
                Ok(n) => log::info!("pid {pid}: launch hints from {n} entry point(s)"),
                Err(e) => {
                    log::info!("pid {pid}: no launch hints: {e:#}");
                }
            }
        } else {
            w.unwatch_launches(pid);
        }
    }

    async fn tick(&mut self, w: &mut Watcher) {
        self.classify(w).await;
        if let Some(nv) = self.nv.as_mut() {
            nv.prune(&w.state);
        }
        let now = monotonic_ns();
        let decisions = self.engine.decide(&w.state, now);
        for d in decisions {
            self.act(w, d).await;
        }
    }

    fn audit_record(&self, d: &Decision) -> serde_json::Value {
        serde_json::json!({
            "ts_ns": d.ts_ns,
            "gpu_id": d.gpu_id,
            "pid": d.pid,
            "action": d.action,
            "queues": d.queues,
            "grace": d.grace,
            "reason": d.reason,
            "trigger_ns": d.trigger_ns,
            "dry_run": self.dry_run,
            "emulated": std::env::var_os("GPREEMPT_LABEL").is_some(),
        })
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
            self.record(rec);
            return;
        }
        let r: Result<OpReport, String> =
            if crate::nv::ctl::NvControl::<crate::nv::ctl::Rm>::is_nvidia(&w.state, d.pid) {
                match self.nv.as_mut() {
                    Some(nv) => nv
                        .act(&w.state, d.pid, &d.queues, suspend)
                        .map_err(|e| format!("{e:#}")),
                    None => Err("NVIDIA control is not available".into()),
                }
            } else {
                match &self.control {
                    Some(control) if suspend => control
                        .suspend(d.pid, Some(d.queues.clone()), d.grace)
                        .await
                        .map_err(|e| e.to_string()),
                    Some(control) => control
                        .resume(d.pid, Some(d.queues.clone()))
                        .await
                        .map_err(|e| e.to_string()),
                    None => Err("no KFD on this host".into()),
                }
            };
        let mut rec = self.audit_record(&d);
        match r {
            Ok(report) => {
                let done = report.done();
                self.engine.confirm(&d, &done);
                self.apply_report(w, &report, suspend);
                let by = |o: QueueOutcome| -> Vec<u32> {
                    report
                        .queues
                        .iter()
                        .filter(|q| q.outcome == o)
                        .map(|q| q.queue_id)
                        .collect()
                };
                rec["done"] = serde_json::json!(done);
                rec["invalid"] = serde_json::json!(by(QueueOutcome::Invalid));
                rec["error"] = serde_json::json!(by(QueueOutcome::Error));
                rec["issued_ns"] = serde_json::json!(report.issued_ns);
                rec["returned_ns"] = serde_json::json!(report.returned_ns);
                if let Some(t) = d.trigger_ns {
                    rec["decision_latency_ns"] =
                        serde_json::json!(report.issued_ns.saturating_sub(t));
                }
                log::info!("{} ({})", describe(&report, suspend), d.reason);
            }
            Err(e) => {
                self.engine.confirm(&d, &[]);
                rec["failed"] = serde_json::json!(e);
                log::warn!("pid {}: {e}", d.pid);
            }
        }
        self.record(rec);
    }

    fn notice(&mut self, w: &mut Watcher, n: Notice) {
        match n {
            Notice::TargetGone { pid } => {
                self.engine.forget(pid, None);
                if self.attached.remove(&pid).is_some() {
                    self.save_targets();
                }
            }
            Notice::Acted {
                report,
                suspend,
                why,
            } => {
                self.apply_report(w, &report, suspend);
                if !suspend {
                    self.engine.forget(report.pid, Some(&report.done()));
                }
                self.record(serde_json::json!({
                    "ts_ns": report.returned_ns,
                    "pid": report.pid,
                    "action": if suspend { "suspend" } else { "resume" },
                    "done": report.done(),
                    "reason": why,
                    "by": "control",
                }));
            }
            Notice::Fenced { gpu_id, why } => {
                self.engine.fence_gpu(gpu_id, &why);
                let text = format!("GPU {gpu_id:#x}: {why}: no longer preempting it");
                log::warn!("{text}");
                w.state.apply(Update::Warning {
                    ts_ns: monotonic_ns(),
                    text,
                });
                self.status_dirty = true;
            }
            Notice::Problem { pid, text } => {
                log::warn!("pid {pid}: {text}");
                w.state.apply(Update::Warning {
                    ts_ns: monotonic_ns(),
                    text: format!("pid {pid}: {text}"),
                });
            }
        }
    }

    async fn request(&mut self, w: &mut Watcher, req: Request) -> Response {
        if let Request::Status = req {
            return Response {
                ok: true,
                status: Some(self.status(w)),
                ..Default::default()
            };
        }
        let Some(control) = &self.control else {
            return Response::err("the controller runs with --dry-run: it acts on nothing");
        };
        let suspend = matches!(req, Request::Suspend { .. });
        let resp = crate::manual::handle(control, req, Status::default).await;
        if let Some(r) = &resp.report {
            self.apply_report(w, r, suspend);
            self.record(serde_json::json!({
                "ts_ns": r.returned_ns,
                "pid": r.pid,
                "action": if suspend { "suspend" } else { "resume" },
                "done": r.done(),
                "reason": "manual request",
                "by": "operator",
            }));
        }
        resp
    }
}

/// Resumes whatever an earlier instance left suspended (normally the kernel already did when it
/// exited; this covers a controller that vanished in some other way).
async fn recover(control: &Control, dir: &Path) {
    for t in daemon::read_targets(dir) {
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
    let _ = daemon::write_targets(dir, &[]);
}

pub async fn main(cli: &Cli, args: &RunArgs) -> Result<ExitCode> {
    crate::probe::preflight()?;
    // Signals first: from here on nothing ends the process without the cleanup below.
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let policy = Policy::load(&args.policy)?;
    let dir = daemon::run_dir();
    let _lock = daemon::Lock::acquire(&dir)?;
    // An NVIDIA host has no KFD: its processes are controlled through their RM clients alone.
    let nvidia_only = !cli.kfd_device.exists() && Path::new("/dev/nvidiactl").exists();
    let nv = if args.dry_run {
        None
    } else {
        Some(crate::nv::ctl::NvControl::new(&dir)?)
    };
    let control = if args.dry_run || nvidia_only {
        None
    } else {
        let (c, n) = Control::start(
            &cli.kfd_device,
            Limits {
                max_suspend: Duration::from_nanos(policy.max_suspend_ns),
                ..Limits::default()
            },
        )?;
        if let Some(h) = c.handle() {
            install_panic_hook(h);
        }
        recover(&c, &dir).await;
        Some((c, n))
    };
    let (control, mut notices) = match control {
        Some((c, n)) => (Some(c), Some(n)),
        None => (None, None),
    };
    let ms = Duration::from_millis;
    let mut w = Watcher::start(
        Paths::default(),
        &cli.kfd_device,
        Intervals::from_ms(
            args.reconcile_interval,
            args.hqd_interval,
            args.sample_interval,
        ),
    )?;
    let audit = match &args.audit {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("opening the audit file {}", p.display()))?,
        ),
        None => None,
    };
    eprintln!(
        "gpreempt-ebpf run: {}{}",
        policy.summary(),
        if args.dry_run {
            " (dry run: nothing is suspended)"
        } else {
            ""
        }
    );
    let mut ctx = Ctx {
        me: std::process::id(),
        dry_run: args.dry_run,
        dir: dir.clone(),
        control,
        nv,
        engine: Engine::new(policy),
        audit,
        recent: VecDeque::new(),
        attached: BTreeMap::new(),
        refused: BTreeMap::new(),
        status_dirty: true,
    };
    let mut requests = daemon::serve(&dir)?;
    let mut tick = tokio::time::interval(ms(args.tick));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut publish = tokio::time::interval(ms(250));
    let result: Result<String> = async {
        loop {
            tokio::select! {
                biased;
                _ = int.recv() => return Ok("interrupted".into()),
                _ = term.recv() => return Ok("terminated".into()),
                _ = hup.recv() => match Policy::load(&args.policy) {
                    Ok(p) => {
                        eprintln!("policy reloaded: {}", p.summary());
                        ctx.engine.set_policy(p);
                        ctx.status_dirty = true;
                    }
                    Err(e) => eprintln!("policy NOT reloaded, keeping the old one: {e:#}"),
                },
                Some(n) = async { match &mut notices { Some(n) => n.recv().await, None => std::future::pending().await } } => {
                    ctx.notice(&mut w, n)
                }
                Some((req, reply)) = requests.recv() => {
                    let resp = ctx.request(&mut w, req).await;
                    let _ = reply.send(resp);
                }
                _ = tick.tick() => ctx.tick(&mut w).await,
                _ = publish.tick() => {
                    if std::mem::take(&mut ctx.status_dirty) {
                        if let Err(e) = daemon::write_status(&dir, &ctx.status(&w)) {
                            log::warn!("{e:#}");
                        }
                    }
                }
                // Decide right after new samples or events: the tick only drives time-based
                // transitions (resume_after, the guards), so detection-to-ioctl stays short.
                r = w.pump() => {
                    r?;
                    ctx.tick(&mut w).await;
                }
            }
        }
    }
    .await;
    // Every way out passes here (and Control's Drop covers an unwinding panic; for NVIDIA the
    // guardian covers any death).
    if let Some(nv) = ctx.nv.as_mut() {
        let reports = nv.shutdown();
        let resumed: BTreeSet<u32> = reports.iter().map(|r| r.pid).collect();
        if !resumed.is_empty() {
            eprintln!(
                "resumed {} NVIDIA process(es): {:?}",
                resumed.len(),
                resumed
            );
        }
    }
    if let Some(c) = ctx.control.take() {
        let reports = c.shutdown().await;
        let resumed: BTreeSet<u32> = reports.iter().map(|r| r.pid).collect();
        if !resumed.is_empty() {
            eprintln!(
                "resumed and released {} process(es): {:?}",
                resumed.len(),
                resumed
            );
        }
    }
    let _ = daemon::write_targets(&dir, &[]);
    let _ = daemon::write_status(&dir, &Status::default());
    match result {
        Ok(why) => {
            eprintln!("{why}: nothing is left suspended");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(e.context("the controller stopped; every queue was resumed")),
    }
}
