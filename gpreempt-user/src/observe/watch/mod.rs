//! The live map: eBPF events applied to the model as they arrive, reconciled with sysfs, debugfs
//! `hqds`/`mqds` and the queues' own dispatch ids on their intervals. `top` and `queues` read it.
//!
//! This file holds the [`Watcher`], how it starts and its loop ([`Watcher::pump`]); what each
//! wake-up does lives by source:
//! - [`events`]: a batch of eBPF events applied, with what only user space can add, and losses;
//! - [`reads`]: the periodic reads of sysfs, debugfs, /proc and the queues' dispatch ids;
//! - [`controller`]: what a running controller (another process) publishes, mirrored;
//! - [`nvidia`]: NVIDIA processes adopted from the journal and the driver at start.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result};

use crate::{
    clock::monotonic_ns,
    observe::events::{Event, EventSource, FdCheck},
    observe::kfd::{sysfs, Paths},
    observe::model::{State, Update},
    observe::probe::{ProbeOptions, Probes},
};

mod controller;
mod events;
mod nvidia;
mod reads;

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
    /// Records applied per process while a census runs ([`Self::census_start`]).
    census: Option<std::collections::HashMap<u32, u64>>,
    /// The NVIDIA driver's control node exists: the RM can say which GPU a device instance is.
    nv_rm: bool,
    /// Device instances of live TSGs that no GPU had when the RM was last asked.
    nv_unjoined: std::collections::BTreeSet<u32>,
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
            w.nv_gpus_now(false);
        }
        std::thread::sleep(gap);
        w.sample_now();
        w.name_kernels_now();
        Ok((w.state, w.warnings))
    }

    /// A watcher of nothing: no GPU, no events, no timers.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Self {
        let none = std::path::PathBuf::from("/nonexistent/gpreempt-ebpf-tests");
        Self::without_events_kfd(
            Paths {
                sysfs: none.clone(),
                debugfs: none.clone(),
                proc: none,
            },
            false,
        )
        .expect("an empty topology")
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
            census: None,
            nv_rm: Path::new(gpreempt_common::nv::NVIDIACTL).exists(),
            nv_unjoined: Default::default(),
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
            static GATE: crate::observe::target_file::WarnGate =
                crate::observe::target_file::WarnGate::new();
            log::log!(outcome.level(&GATE, std::time::Instant::now()), "{line}");
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

    /// Launch and wait uprobes on every live GPU process, for its request latency, while no
    /// controller runs (a controller measures its online processes and publishes that): what
    /// co-location costs each service shows without any policy. Each pid is tried once.
    pub fn watch_every_gpu_process(&mut self) {
        if self.events.is_none() || self.state.controller.is_some() {
            return;
        }
        let me = std::process::id();
        let pids: Vec<u32> = self
            .state
            .procs
            .values()
            .filter(|p| p.exited_ns.is_none() && p.pid != me && p.live_queues().next().is_some())
            .map(|p| p.pid)
            .collect();
        for pid in pids {
            if let Err(e) = self.watch_launches(pid) {
                log::debug!("pid {pid}: no request latency: {e:#}");
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
        let t = std::time::Instant::now();
        self.reconcile_now(mqds);
        self.nv_gpus_now(true);
        let reconciled = t.elapsed();
        self.controller_now();
        self.hqds_now();
        let hqds = t.elapsed();
        self.sample_now();
        log::debug!(
            "first read: sysfs, /proc{} {} ms; hqds {} ms; samples {} ms",
            if mqds { ", mqds" } else { "" },
            reconciled.as_millis(),
            (hqds - reconciled).as_millis(),
            (t.elapsed() - hqds).as_millis()
        );
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
                self.nv_gpus_now(false);
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
                self.state.tick_requests(monotonic_ns());
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
                m.insert("kernel_own_skipped".into(), k.own_skipped);
            }
            m.insert("dropped_other_file".into(), src.stats.not_device);
            m.insert("unverified_fd".into(), src.stats.unverified);
            m.insert("malformed".into(), src.stats.malformed);
        }
        m
    }

    /// Records the kernel could not deliver since the programs were attached (0 without events).
    pub fn kernel_lost(&self) -> u64 {
        self.events
            .as_ref()
            .and_then(|(p, _)| p.stats().ok())
            .map_or(0, |k| k.lost())
    }

    /// Starts counting the records applied per process (who fills the ring while it matters).
    pub fn census_start(&mut self) {
        self.census = Some(Default::default());
    }

    /// Ends the census: the `n` processes with the most records, most first.
    pub fn census_take(&mut self, n: usize) -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> = self.census.take().unwrap_or_default().into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
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

#[cfg(test)]
mod tests;
