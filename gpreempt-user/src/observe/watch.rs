//! The live map: eBPF events applied to the model as they arrive, reconciled with sysfs, debugfs
//! `hqds`/`mqds` and the queues' own dispatch ids on their intervals. `top` and `queues` read it.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};
use gpreempt_common::kfd::{self, dbg_op};
use nix::sys::uio::RemoteIoVec;

use crate::{
    clock::monotonic_ns,
    observe::events::{Event, EventSource, FdCheck, KfdCall},
    observe::kfd::sampler,
    observe::kfd::{debugfs, sysfs, Paths},
    observe::model::{State, Update},
    observe::probe::{ProbeOptions, Probes},
    observe::procinfo,
};

/// How often each source is read (defaults: `top`'s options).
#[derive(Clone, Debug)]
pub struct Intervals {
    /// sysfs processes/queues and /proc facts.
    pub reconcile: Duration,
    /// debugfs `hqds`: not free on real hardware (it selects every HQD through GRBM).
    pub hqds: Duration,
    /// The queues' dispatch ids (one process_vm_readv per process).
    pub sample: Duration,
}

impl Intervals {
    /// From the command line's milliseconds.
    pub fn from_ms(reconcile: u64, hqds: u64, sample: u64) -> Self {
        Self {
            reconcile: Duration::from_millis(reconcile),
            hqds: Duration::from_millis(hqds),
            sample: Duration::from_millis(sample),
        }
    }
}

struct Timers {
    /// The reconcile period asked for (it shortens while records are lost).
    normal: Duration,
    reconcile: tokio::time::Interval,
    hqds: tokio::time::Interval,
    sample: tokio::time::Interval,
}

impl Timers {
    fn new(iv: &Intervals) -> Self {
        let interval = |d: Duration| {
            let mut i = tokio::time::interval_at(tokio::time::Instant::now() + d, d);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        };
        Self {
            normal: iv.reconcile,
            reconcile: interval(iv.reconcile),
            hqds: interval(iv.hqds),
            sample: interval(iv.sample),
        }
    }
}

/// The model plus the readers that keep it current.
pub struct Watcher {
    pub state: State,
    paths: Paths,
    /// Problems worth showing (missing debugfs, lost records); each once.
    pub warnings: Vec<String>,
    events: Option<(Probes, EventSource)>,
    batch: Vec<Event>,
    /// The periodic reads (only with events: they need the runtime).
    timers: Option<Timers>,
    losses: crate::observe::losses::Losses,
    /// What the running controller (another process) publishes: classes, held queues, decisions.
    pub controller: Option<crate::observe::status::Status>,
    /// Launch hints: which processes get them, resolved off the loop.
    hints: crate::observe::hints::LaunchHints,
    /// Kernel names for the dispatch mix, read off the loop.
    names: crate::observe::kernel_names::KernelNames,
    /// Events applied to the model, by kind ([`APPLIED`]), and batches read.
    applied: [u64; APPLIED.len()],
    /// NVIDIA channels' GP_GET / GP_PUT, read from their USERD.
    pub channels: crate::observe::nv::activity::ChannelSampler,
    /// The NVIDIA objects journal (`run` only): what a restarted controller adopts.
    nv_log: Option<crate::observe::nv::adopt::ObjectLog>,
}

impl Watcher {
    /// Reads everything once; no eBPF, no timers (for `queues`). Two samples `gap` apart give
    /// activity rates.
    /// On an NVIDIA host the GPU processes come from the controller's journal and the driver
    /// ([`Self::adopt_nv`]): no events are watched here.
    pub fn snapshot(paths: &Paths, gap: Duration) -> Result<(State, Vec<String>)> {
        let nvidia = Path::new(gpreempt_common::nv::NVIDIACTL).exists();
        let mut w = Self::without_events_kfd(paths.clone(), !nvidia)?;
        w.read_all(true);
        if nvidia {
            for line in w.adopt_nv(&crate::rundir::run_dir(), false) {
                log::info!("{line}");
            }
        }
        std::thread::sleep(gap);
        w.sample_now();
        w.name_kernels_now();
        Ok((w.state, w.warnings))
    }

    /// `require_kfd`: a missing KFD topology is an error (AMD hosts) or an empty one (NVIDIA).
    fn without_events_kfd(paths: Paths, require_kfd: bool) -> Result<Self> {
        let mut state = State::new();
        let gpus = match sysfs::read_topology(&paths.sysfs) {
            Ok(g) => g,
            Err(_) if !require_kfd && !paths.sysfs.exists() => Vec::new(),
            Err(e) => return Err(e),
        };
        state.apply(Update::Topology(gpus));
        Ok(Self {
            state,
            paths,
            warnings: Vec::new(),
            events: None,
            batch: Vec::with_capacity(256),
            timers: None,
            losses: Default::default(),
            controller: None,
            hints: Default::default(),
            names: Default::default(),
            applied: [0; APPLIED.len()],
            channels: Default::default(),
            nv_log: None,
        })
    }

    /// Attaches the eBPF programs, then reads the current state (queues that existed before).
    /// Must run inside a tokio runtime.
    pub fn start(paths: Paths, probes: ProbeOptions, iv: Intervals) -> Result<Self> {
        // An NVIDIA host has no KFD: its processes come from the RM escapes alone.
        let nvidia = std::path::Path::new(gpreempt_common::nv::NVIDIACTL).exists();
        Self::start_kfd(paths, probes, iv, !nvidia)
    }

    /// As [`Watcher::start`]; without `require_kfd` a host with no KFD is watched too (NVIDIA).
    pub fn start_kfd(
        paths: Paths,
        opts: ProbeOptions,
        iv: Intervals,
        require_kfd: bool,
    ) -> Result<Self> {
        // Events first, so nothing created between the sysfs read and the attach is missed.
        let mut probes = Probes::attach(&opts)?;
        let source = EventSource::new(probes.take_events()?, FdCheck::new(&opts.kfd_device))
            .context("watching the ring buffer")?;
        let mut w = Self::without_events_kfd(paths, require_kfd)?;
        for why in crate::observe::probe::not_live_reasons(probes.sources()) {
            w.warn_once(why);
        }
        w.state.sources = Some(probes.summary());
        w.events = Some((probes, source));
        w.timers = Some(Timers::new(&iv));
        w.read_all(true);
        Ok(w)
    }

    /// Every event source and whether it is live (empty without events).
    pub fn sources(&self) -> Vec<crate::observe::probe::SourceStatus> {
        self.events
            .as_ref()
            .map(|(p, _)| p.sources().to_vec())
            .unwrap_or_default()
    }

    /// Launch hints for `pid`: uprobes on its launch entry points (HIP/HSA, libcuda), attached
    /// once the resolver thread has found them. The outcome is logged.
    pub fn watch_launches(&mut self, pid: u32) -> Result<()> {
        let Some((probes, _)) = self.events.as_ref() else {
            anyhow::bail!("no eBPF programs loaded");
        };
        self.hints.watch(probes, pid)
    }

    /// A resolution came back: attach if the process still wants hints.
    fn resolved(&mut self, r: crate::observe::hints::Resolution) {
        let (pid, r, took) = r;
        let alive = self
            .state
            .procs
            .get(&pid)
            .is_some_and(|p| p.exited_ns.is_none());
        let Some((probes, _)) = self.events.as_mut() else {
            return;
        };
        let outcome = self.hints.resolved(probes, pid, r, alive);
        if let crate::observe::hints::Outcome::Attached(_) = outcome {
            self.state.sources = Some(probes.summary());
        }
        if let Some(line) = outcome.describe(pid, took) {
            log::info!("{line}");
        }
    }

    /// Stops the launch hints of `pid`.
    pub fn unwatch_launches(&mut self, pid: u32) {
        if let Some((probes, _)) = self.events.as_mut() {
            if self.hints.unwatch(probes, pid) {
                self.state.sources = Some(probes.summary());
            }
        }
    }

    /// Drops the launch uprobes of processes that are gone.
    fn prune_launches(&mut self) {
        let Some((probes, _)) = self.events.as_ref() else {
            return;
        };
        let gone: Vec<u32> = probes
            .watched_launches()
            .filter(|pid| {
                self.state
                    .procs
                    .get(pid)
                    .is_none_or(|p| p.exited_ns.is_some())
            })
            .collect();
        for pid in gone {
            self.unwatch_launches(pid);
        }
    }

    /// sysfs, /proc, mqds, hqds and a sample, now.
    fn read_all(&mut self, mqds: bool) {
        self.reconcile_now(mqds);
        self.controller_now();
        self.hqds_now();
        self.sample_now();
    }

    fn warn_once(&mut self, w: String) {
        if !self.warnings.contains(&w) {
            log::info!("{w}");
            self.state.apply(Update::Warning {
                ts_ns: monotonic_ns(),
                text: w.clone(),
            });
            self.warnings.push(w);
        }
    }

    /// The running controller's classes and held queues (its suspend arrays cannot be read
    /// back reliably from its events: they are gone by the time we look).
    pub fn controller_now(&mut self) {
        let status = crate::observe::status::read_status(&crate::rundir::run_dir())
            .filter(|s| s.controller_pid != 0 && s.controller_pid != std::process::id());
        let Some(s) = status else {
            self.state.controller = None;
            self.state.adaptive.clear();
            // The controller is gone: the kernel resumed whatever it held, and nothing it changed
            // is in force (its guardian put the timeslices back).
            if let Some(old) = self.controller.take() {
                // What it could not act on is nobody's business now.
                for &pid in old.uncontrollable.keys().chain(old.refused.keys()) {
                    self.state.apply(Update::Uncontrollable { pid, why: None });
                }
                if !old.timeslices.is_empty() {
                    self.state.apply(Update::Timeslices(Vec::new()));
                }
                let ts_ns = monotonic_ns();
                for &(pid, q, _) in &old.held {
                    self.state.apply(Update::Resumed {
                        ts_ns,
                        by: old.controller_pid,
                        target: pid,
                        queues: Some(vec![q]),
                    });
                }
            }
            return;
        };
        let ts_ns = monotonic_ns();
        for (&pid, class) in &s.classes {
            if self
                .state
                .procs
                .get(&pid)
                .is_some_and(|p| p.class.as_ref() != Some(class))
            {
                self.state.apply(Update::Class {
                    pid,
                    class: Some(class.clone()),
                });
            }
        }
        // What the controller cannot act on (an older controller publishes the sentence only).
        let mut changed = Vec::new();
        for p in self.state.procs.values() {
            let want = s.uncontrollable.get(&p.pid).cloned().or_else(|| {
                s.refused
                    .get(&p.pid)
                    .map(|reason| crate::observe::model::Uncontrollable {
                        kind: "other".into(),
                        reason: reason.clone(),
                    })
            });
            if p.uncontrollable != want {
                changed.push(Update::Uncontrollable {
                    pid: p.pid,
                    why: want,
                });
            }
        }
        for u in changed {
            self.state.apply(u);
        }
        let by = s.controller_pid;
        let mut held: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
        for &(pid, q, _) in &s.held {
            held.entry(pid).or_default().push(q);
        }
        let mut updates = Vec::new();
        for p in self.state.procs.values() {
            let want = held.get(&p.pid);
            let (mut sus, mut res) = (Vec::new(), Vec::new());
            for q in p.live_queues() {
                let is = q.state == crate::observe::model::QueueState::Suspended;
                let should = want.is_some_and(|w| w.contains(&q.queue_id));
                if should && !is {
                    sus.push(q.queue_id);
                } else if !should && is && q.suspended_by == Some(by) {
                    res.push(q.queue_id);
                }
            }
            if !sus.is_empty() {
                updates.push(Update::Suspended {
                    ts_ns,
                    by,
                    target: p.pid,
                    queues: Some(sus),
                });
            }
            if !res.is_empty() {
                updates.push(Update::Resumed {
                    ts_ns,
                    by,
                    target: p.pid,
                    queues: Some(res),
                });
            }
        }
        for u in updates {
            self.state.apply(u);
        }
        // Only on a change: applying walks every queue.
        let before = self.controller.as_ref().map(|c| &c.timeslices);
        if before.unwrap_or(&Vec::new()) != &s.timeslices {
            self.state.apply(Update::Timeslices(s.timeslices.clone()));
        }
        self.state.adaptive = s.adaptive.iter().map(|v| (v.gpu_id, v.clone())).collect();
        self.state.controller = Some(s.clone());
        self.controller = Some(s);
    }

    fn reconcile_now(&mut self, force_mqds: bool) {
        let state = &self.state;
        let known = |pid: u32, qid: u32| {
            let q = state.queue(pid, qid).filter(|q| q.alive())?;
            Some(sysfs::SysQueue {
                queue_id: qid,
                gpu_id: q.gpu_id,
                kind: q.kind.sysfs_type(),
                size: q.ring_size,
            })
        };
        match sysfs::read_procs(&self.paths.sysfs, known) {
            Ok(s) => self.state.apply(Update::Procs(s)),
            Err(e) => self.warn_once(format!("{e:#}")),
        }
        // Pid reuse and processes gone without an exit event.
        let pids: Vec<(u32, Option<u64>)> = self
            .state
            .procs
            .values()
            .filter(|p| p.exited_ns.is_none())
            .map(|p| (p.pid, p.info.as_ref().map(|i| i.start_time)))
            .collect();
        for (pid, known) in pids {
            match procinfo::start_time(&self.paths.proc, pid) {
                Ok(t) if known == Some(t) => {}
                Ok(_) => self.proc_info(pid),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    self.state.apply(Update::ProcGone { pid })
                }
                Err(_) => {}
            }
        }
        let need_mqds = self.state.procs.values().any(|p| {
            p.live_queues()
                .any(|q| q.kind.is_compute() && q.ring_base_address.is_none())
        });
        if force_mqds || need_mqds {
            let path = self.paths.debugfs.join("mqds");
            match std::fs::read_to_string(&path) {
                Ok(t) => match debugfs::parse_mqds(&t) {
                    Ok(m) => self.state.apply(Update::Mqds(m)),
                    Err(e) => self.warn_once(format!("{}: {e:#}", path.display())),
                },
                Err(e) if need_mqds => self.warn_once(format!(
                    "cannot read {} ({e}): rings of queues created before the tool started stay unknown",
                    path.display()
                )),
                Err(_) => {}
            }
        }
    }

    /// Kernel names of every process that dispatched unnamed kernels, read here and now (for
    /// the one-shot `queues`; the live map reads them off the loop).
    fn name_kernels_now(&mut self) {
        let pids: Vec<u32> = self
            .state
            .procs
            .values()
            .filter(|p| {
                p.queues
                    .values()
                    .any(|q| q.activity.dispatches.unnamed() > 0)
            })
            .map(|p| p.pid)
            .collect();
        for pid in pids {
            match crate::observe::kfd::codeobj::read_kernel_names(&self.paths.proc, pid) {
                Ok(names) => self.state.apply(Update::KernelNames { pid, names }),
                Err(e) => log::debug!("pid {pid}: no kernel names: {e:#}"),
            }
        }
    }

    /// Before a GPU set-up call of `pid` lands in its record: is the record's process the one
    /// that has the pid now? A process that was never seen to exit (it made no GPU call while
    /// we watched, so no exit record came) may have handed its pid to a new one, whose calls
    /// would otherwise count as the old one's (and get its class). The new one gets a record of
    /// its own and is classified afresh.
    fn same_owner(&mut self, pid: u32) {
        let Some(known) = self
            .state
            .procs
            .get(&pid)
            .filter(|p| p.exited_ns.is_none())
            .and_then(|p| p.info.as_ref())
            .map(|i| i.start_time)
        else {
            return;
        };
        match procinfo::start_time(&self.paths.proc, pid) {
            Ok(t) if t != known => {
                log::warn!(
                    "pid {pid}: a new process (started at tick {t}) has the pid of one started at \
                     tick {known} whose exit was not seen: a new process, classified afresh"
                );
                self.proc_info(pid);
            }
            _ => {}
        }
    }

    /// Reads `pid`'s /proc facts again now: an act found the pid owned by another process than
    /// the model's (a different start time), and the model replaces it with the new one.
    pub fn recheck(&mut self, pid: u32) {
        self.proc_info(pid);
    }

    fn proc_info(&mut self, pid: u32) {
        match procinfo::read(&self.paths.proc, pid) {
            Ok(info) => self.state.apply(Update::ProcInfo { pid, info }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.state.apply(Update::ProcGone { pid })
            }
            Err(e) => log::debug!("pid {pid}: {e}"),
        }
    }

    fn hqds_now(&mut self) {
        let path = self.paths.debugfs.join("hqds");
        let taken_ns = monotonic_ns();
        match std::fs::read_to_string(&path) {
            Ok(t) => match debugfs::parse_hqds(&t) {
                Ok(nodes) => self.state.apply(Update::Hqds { taken_ns, nodes }),
                Err(e) => self.warn_once(format!("{}: {e:#}", path.display())),
            },
            Err(e) => {
                self.warn_once(format!(
                    "cannot read {} ({e}): HQD slots unknown; as root, mount debugfs \
                     (mount -t debugfs none /sys/kernel/debug)",
                    path.display()
                ));
            }
        }
    }

    fn sample_now(&mut self) {
        let mut samples = sampler::sample(&self.state);
        let now = monotonic_ns();
        samples.extend(self.channels.sample(&self.state, now));
        if !samples.is_empty() {
            self.state.apply(Update::Samples {
                ts_ns: now,
                samples,
            });
        }
    }

    /// Applies a batch of events, with what only user space can add: the queue ids of a
    /// DBG_TRAP suspend/resume (read from the caller's array) and /proc facts of new processes.
    fn apply_events(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        // Processes this batch may introduce (a DBG_TRAP ENABLE brings in its target too).
        let mut pids = Vec::new();
        // Processes whose owner was checked in this batch (see `setting_up`).
        let mut checked = Vec::new();
        self.applied[0] += 1;
        for ev in batch.drain(..) {
            let kind = match &ev {
                Event::Ioctl(_) => 1,
                Event::Nv(_) => 2,
                Event::Kernel(_) => 3,
                Event::Launch(_) => 4,
                Event::ProcessExit(_) => 5,
            };
            self.applied[kind] += 1;
            if let Event::ProcessExit(x) = &ev {
                if x.rate_limited > 0 {
                    let n = u32::try_from(x.rate_limited).unwrap_or(u32::MAX);
                    if let Some(w) = self.losses.limited(x.origin.pid, n, || "exited".into()) {
                        log::warn!("{w}");
                    }
                }
                self.losses.forget(x.origin.pid);
            }
            if let Some(pid) = setting_up(&ev) {
                if !checked.contains(&pid) {
                    checked.push(pid);
                    self.same_owner(pid);
                }
            }
            if let Event::Nv(n) = &ev {
                pids.push(n.origin.pid);
                if let Some(log) = self.nv_log.as_mut() {
                    log.note(n);
                }
            }
            if let (Event::ProcessExit(x), Some(log)) = (&ev, self.nv_log.as_mut()) {
                log.exited(x.origin.pid);
            }
            if let Event::Ioctl(i) = &ev {
                pids.push(i.origin.pid);
                if let KfdCall::DbgTrap(a) = &i.call {
                    pids.push(a.pid);
                }
            }
            let extra = suspend_update(&ev);
            self.state.apply(Update::Event(ev));
            if let Some(u) = extra {
                self.state.apply(u);
            }
        }
        self.batch = batch;
        if log::log_enabled!(log::Level::Debug) {
            let mut rm: std::collections::BTreeMap<u32, usize> = Default::default();
            for &p in &pids {
                *rm.entry(p).or_default() += 1;
            }
            if !rm.is_empty() {
                log::debug!("applied ioctls/escapes per pid: {rm:?}");
            }
        }
        // /proc facts of new processes only (not a walk over every process per batch).
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            let new = self
                .state
                .procs
                .get(&pid)
                .is_some_and(|p| p.info.is_none() && p.exited_ns.is_none());
            if new {
                self.proc_info(pid);
            }
        }
    }

    /// Adopts the NVIDIA processes a previous controller journaled in `dir`, each proven through
    /// the driver ([`crate::observe::nv::adopt`]), marks the processes holding the driver that nothing
    /// explains as unmanaged, and (`journal`: `run`) journals from now on. Lines for the log.
    pub fn adopt_nv(&mut self, dir: &Path, journal: bool) -> Vec<String> {
        use crate::observe::nv::adopt;
        let mut lines = Vec::new();
        let mut log = adopt::ObjectLog::default();
        match adopt::load(dir) {
            Ok(j) if !j.is_empty() => {
                let journaled = j.len();
                let mut host = adopt::RealHost {
                    proc_root: &self.paths.proc,
                };
                let a = adopt::adopt(j, &mut host, monotonic_ns());
                lines.push(format!(
                    "NVIDIA: adopted {} running process(es) with {} TSG(s) from {} \
                     ({journaled} journaled; each proven through the driver)",
                    a.kept.len(),
                    a.tsgs(),
                    dir.join(adopt::FILE).display()
                ));
                for (pid, why) in &a.refused {
                    lines.push(format!("pid {pid}: not adopted: {why}"));
                }
                log.adopted(&a.kept);
                self.batch.extend(a.events.into_iter().map(Event::Nv));
                self.apply_events();
            }
            Ok(_) => {}
            Err(e) => lines.push(format!("NVIDIA objects journal not used: {e:#}")),
        }
        let known = self.state.nv_client_pids();
        let rest = adopt::unexplained(&self.paths.proc, &known, std::process::id());
        // What no journal names is looked for in the driver itself.
        let scan = if rest.is_empty() {
            None
        } else {
            match crate::observe::nv::rm::next_client_index() {
                Ok(top) => Some(adopt::Scan {
                    client_top: top,
                    bases: adopt::DEFAULT_BASES.to_vec(),
                    max_calls: adopt::MAX_CALLS,
                }),
                Err(e) => {
                    lines.push(format!(
                        "NVIDIA: no driver scan of running processes: {e:#}"
                    ));
                    None
                }
            }
        };
        for (pid, why) in rest {
            let id = procinfo::ProcId::now(&self.paths.proc, pid).ok();
            let found = scan.as_ref().zip(id).map(|(scan, id)| {
                let fds = adopt::nvidiactl_fds(&self.paths.proc, pid);
                let mut host = adopt::RealHost {
                    proc_root: &self.paths.proc,
                };
                let t0 = std::time::Instant::now();
                (adopt::discover(id, &fds, &mut host, scan), t0.elapsed())
            });
            match found {
                Some((f, took)) if f.tsgs() > 0 => {
                    lines.push(format!(
                        "pid {pid}: {} TSG(s) found through the driver ({} calls, {} ms; it \
                         opened the driver before the observer attached: no channel activity){}",
                        f.tsgs(),
                        f.calls,
                        took.as_millis(),
                        f.why_not.map(|w| format!("; {w}")).unwrap_or_default()
                    ));
                    let now = monotonic_ns();
                    self.batch
                        .extend(f.recs.iter().map(|r| Event::Nv(adopt::event(pid, r, now))));
                    self.apply_events();
                    log.adopted(&std::collections::BTreeMap::from([(pid, f.recs)]));
                }
                other => {
                    let why = match other.and_then(|(f, _)| f.why_not) {
                        Some(w) => format!("{why}; the driver scan found no TSG ({w})"),
                        None if scan.is_some() => {
                            format!("{why}; the driver scan found no TSG")
                        }
                        None => why,
                    };
                    let why = format!(
                        "{why}: not managed (restart it, or start the controller before GPU work)"
                    );
                    lines.push(format!("pid {pid}: unmanaged: {why}"));
                    self.state.apply(Update::Unmanaged { pid, why });
                    self.proc_info(pid);
                }
            }
        }
        self.nv_log = journal.then_some(log);
        lines
    }

    /// Writes the NVIDIA objects journal if it changed (after [`Self::adopt_nv`]).
    pub fn save_nv_log(&mut self, dir: &Path) -> Result<()> {
        let proc_root = self.paths.proc.clone();
        match self.nv_log.as_mut() {
            Some(log) => log.save(dir, |pid| procinfo::start_time(&proc_root, pid).ok()),
            None => Ok(()),
        }
    }

    /// Waits for the next events or timer and applies it. Cancel-safe: everything after an await
    /// point runs without awaiting again.
    pub async fn pump(&mut self) -> Result<()> {
        enum Due {
            Events(std::io::Result<()>),
            Resolved(crate::observe::hints::Resolution),
            Named(crate::observe::kernel_names::Answer),
            Reconcile,
            Hqds,
            Sample,
        }
        let Self {
            events,
            batch,
            timers,
            hints,
            names,
            ..
        } = self;
        let Some(Timers {
            reconcile,
            hqds,
            sample,
            ..
        }) = timers
        else {
            return std::future::pending().await;
        };
        let next_events = async {
            match events.as_mut() {
                Some((_, src)) => src.next_batch(batch).await,
                None => std::future::pending().await,
            }
        };
        let resolved = hints.next();
        let named = names.next();
        let due = tokio::select! {
            r = next_events => Due::Events(r),
            Some(r) = resolved => Due::Resolved(r),
            Some(a) = named => Due::Named(a),
            _ = reconcile.tick() => Due::Reconcile,
            _ = hqds.tick() => Due::Hqds,
            _ = sample.tick() => Due::Sample,
        };
        match due {
            Due::Events(r) => {
                r.context("reading the ring buffer")?;
                self.apply_events();
            }
            Due::Reconcile => {
                self.reconcile_now(false);
                self.prune_launches();
                self.controller_now();
                self.state.apply(Update::Tick {
                    now_ns: monotonic_ns(),
                });
                self.check_lost()?;
            }
            Due::Resolved(r) => self.resolved(r),
            Due::Named(a) => {
                let pid = a.0;
                if let Some(names) = self.names.answered(a) {
                    self.state.apply(Update::KernelNames { pid, names });
                }
            }
            Due::Hqds => self.hqds_now(),
            Due::Sample => {
                self.sample_now();
                self.names.want(&self.state);
            }
        }
        Ok(())
    }

    /// The pipeline's counters: what the kernel saw and lost, what user space dropped, what was
    /// applied to the model.
    pub fn event_counts(&self) -> std::collections::BTreeMap<String, u64> {
        let mut m: std::collections::BTreeMap<String, u64> = APPLIED
            .iter()
            .zip(self.applied)
            .filter(|&(_, v)| v > 0)
            .map(|(k, v)| (format!("applied_{k}"), v))
            .collect();
        if self.channels.reads > 0 {
            m.insert("nv_userd_reads".into(), self.channels.reads);
            m.insert("nv_userd_read_ns".into(), self.channels.read_ns);
        }
        if let Some((probes, src)) = self.events.as_ref() {
            if let Ok(k) = probes.stats() {
                m.insert("kernel_seen".into(), k.seen);
                m.insert("kernel_lost".into(), k.lost());
                m.insert("kernel_other_file".into(), k.other_file);
                m.insert("kernel_rate_limited".into(), k.rate_limited);
            }
            m.insert("dropped_other_file".into(), src.stats.not_kfd);
            m.insert("unverified_fd".into(), src.stats.unverified);
            m.insert("malformed".into(), src.stats.malformed);
        }
        m
    }

    /// Kernel losses: warn with the count and sample faster while they go on; name the
    /// processes the rate limit throttles.
    fn check_lost(&mut self) -> Result<()> {
        use crate::observe::losses::{Change, LOSSY_RECONCILE};
        let Some((probes, _)) = self.events.as_mut() else {
            return Ok(());
        };
        let now = monotonic_ns();
        let (warning, change) = self.losses.update(probes.stats()?.lost(), now);
        let limited = probes.rate_limited().unwrap_or_default();
        if let Some(t) = self.timers.as_mut() {
            let period = match change {
                Change::Degraded => Some(LOSSY_RECONCILE.min(t.normal)),
                Change::Recovered => Some(t.normal),
                Change::None => None,
            };
            if let Some(p) = period {
                t.reconcile = tokio::time::interval_at(tokio::time::Instant::now() + p, p);
                t.reconcile
                    .set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            }
        }
        if let Some(w) = warning {
            log::warn!("{w}");
            self.state.apply(Update::Warning {
                ts_ns: now,
                text: w,
            });
        }
        self.state.events_degraded = self.losses.degraded();
        for (pid, dropped) in limited {
            let who = || match crate::observe::procinfo::read(std::path::Path::new("/proc"), pid) {
                Ok(p) => format!(
                    "uid {}, comm {}",
                    p.uid.map_or("?".into(), |u| u.to_string()),
                    p.comm
                ),
                Err(_) => "exited".into(),
            };
            if let Some(w) = self.losses.limited(pid, dropped, who) {
                log::warn!("{w}");
                self.state.apply(Update::Warning {
                    ts_ns: now,
                    text: w,
                });
            }
        }
        Ok(())
    }

    /// Records lost lately, for status.json and `top` (None: events are trusted).
    pub fn events_degraded(&self) -> Option<String> {
        self.losses.degraded()
    }
}

/// The names of [`Watcher`]'s `applied` counters.
const APPLIED: [&str; 6] = [
    "batches",
    "kfd_ioctls",
    "rm_escapes",
    "kernel_probes",
    "launches",
    "exits",
];

/// The caller of a GPU set-up call (a runtime opening KFD or its VM, an RM client): rare, and
/// what a new process under a reused pid does first.
fn setting_up(ev: &Event) -> Option<u32> {
    match ev {
        Event::Ioctl(i) => matches!(
            i.call,
            // Not CREATE_QUEUE: a process must ACQUIRE_VM before it can make a queue
            // (kfd_bind_process_to_device wants the VM), and a flood of queue creations would
            // otherwise read /proc once a batch.
            KfdCall::GetVersion(_) | KfdCall::AcquireVm(_) | KfdCall::RuntimeEnable(_)
        )
        .then_some(i.origin.pid),
        Event::Nv(n) => matches!(
            n.call,
            crate::observe::events::NvCall::Alloc { h_class, .. }
                if h_class == gpreempt_common::nv::class::NV01_ROOT_CLIENT
        )
        .then_some(n.origin.pid),
        _ => None,
    }
}

/// For a successful DBG_TRAP SUSPEND/RESUME_QUEUES: which queues it acted on. The kernel writes
/// status bits into the caller's queue array; entries without ERROR/INVALID were acted on.
fn suspend_update(ev: &Event) -> Option<Update> {
    let Event::Ioctl(i) = ev else { return None };
    let KfdCall::DbgTrap(a) = &i.call else {
        return None;
    };
    // Our own calls (the controller's) are applied from their results: the arrays are gone.
    if i.ret < 0 || i.origin.pid == std::process::id() {
        return None;
    }
    let (ptr, n) = match a.op {
        dbg_op::SUSPEND_QUEUES => {
            let p: kfd::DbgTrapSuspendQueuesArgs = a.payload();
            (p.queue_array_ptr, p.num_queues)
        }
        dbg_op::RESUME_QUEUES => {
            let p: kfd::DbgTrapResumeQueuesArgs = a.payload();
            (p.queue_array_ptr, p.num_queues)
        }
        _ => return None,
    };
    let queues = read_ids(i.origin.pid, ptr, n).map(|ids| {
        ids.into_iter()
            .filter(|id| {
                id & (kfd::KFD_DBG_QUEUE_ERROR_MASK | kfd::KFD_DBG_QUEUE_INVALID_MASK) == 0
            })
            .collect()
    });
    let (ts_ns, by, target) = (i.origin.ts_ns, i.origin.pid, a.pid);
    Some(Update::queue_op(
        a.op == dbg_op::SUSPEND_QUEUES,
        ts_ns,
        by,
        target,
        queues,
    ))
}

/// `n` u32 queue ids at `ptr` in `pid`'s memory.
fn read_ids(pid: u32, ptr: u64, n: u32) -> Option<Vec<u32>> {
    let n = n.min(kfd::KFD_MAX_NUM_OF_QUEUES_PER_PROCESS) as usize;
    let mut buf = vec![0u8; n * 4];
    let remote = [RemoteIoVec {
        base: ptr as usize,
        len: buf.len(),
    }];
    let got = sampler::read_remote(pid, &remote, &mut buf).ok()?;
    (got == buf.len()).then(|| (0..n).map(|i| sampler::u32_at(&buf, 4 * i)).collect())
}
