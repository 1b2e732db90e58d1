//! The host model: GPUs, the processes using them (KFD and NVIDIA), their queues (NVIDIA: TSGs)
//! and, on AMD, the HQD slot each sits in. Pure: every change comes through [`State::apply`],
//! from driver events (eBPF) or from reconciliation with what the kernel shows (sysfs, debugfs,
//! the queues' own `amd_queue_t`).
//!
//! Here: [`State`], the dispatch of [`Update`]s, the event log, and the destroy/exit/linger steps
//! every source shares. The data types are in `types`, KFD events in `kfd`, NVIDIA RM objects in
//! `nv`, and reconciliation with the kernel's views in `reconcile`.

pub mod dispatch;
mod kfd;
mod nv;
mod reconcile;
mod types;

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::Serialize;

use crate::observe::events::Event;
pub use dispatch::SeenPacket;
pub use types::*;

/// Destroyed queues stay visible this long (ns) so a short-lived queue can be seen.
pub const LINGER_NS: u64 = 3_000_000_000;
/// Debug-trap calls kept for `run` (an observer that never drains them keeps the newest).
pub const DEBUG_CALLS_CAP: usize = 256;
/// Event log entries kept.
pub const LOG_CAP: usize = 512;

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct State {
    /// KFD GPUs (AMD).
    pub gpus: Vec<Gpu>,
    /// NVIDIA GPUs, by index; their queues' `gpu_id` is a GPU's `device_instance`.
    pub nv_gpus: Vec<crate::observe::nv::gpus::NvGpu>,
    pub procs: BTreeMap<u32, Process>,
    #[serde(skip)]
    pub log: VecDeque<LogEntry>,
    /// Time of the last `hqds` read.
    pub hqds_ns: Option<u64>,
    pub corrections: Corrections,
    /// Latest time seen in any update (ns, CLOCK_MONOTONIC).
    #[serde(skip)]
    pub now_ns: u64,
    /// What the running controller (another process) publishes, for `top`'s title.
    #[serde(skip)]
    pub controller: Option<crate::observe::status::Status>,
    /// Which event sources are live (`probe::summarize`), for `top`.
    #[serde(skip)]
    pub sources: Option<String>,
    /// Set while event records are being lost in the kernel (the map leans on sampling).
    #[serde(skip)]
    pub events_degraded: Option<String>,
    /// Per GPU under the controller's adaptive strategy: its goal and measurements, for
    /// `top`'s GPU line.
    #[serde(skip)]
    pub adaptive: BTreeMap<u32, crate::observe::status::AdaptiveView>,
    /// NVIDIA RM objects per (pid, hClient): handle -> (class, parent), and the client's fd.
    #[serde(skip)]
    nv_objects: HashMap<(u32, u32), NvClient>,
    /// Packets decoded since the last [`State::take_dispatches`], kept only once that was
    /// called (`trace --dispatches` streams them).
    #[serde(skip)]
    fresh_dispatches: Option<Vec<FreshDispatch>>,
    /// DBG_TRAP calls that can take a process out of its debugger's hold, oldest first
    /// (bounded); `run` drains them ([`State::take_debug_calls`]).
    #[serde(skip)]
    debug_calls: VecDeque<DebugCall>,
}

/// A packet decoded for the first time, with where it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct FreshDispatch {
    pub ts_ns: u64,
    pub pid: u32,
    pub gpu_id: u32,
    pub queue_id: u32,
    pub packet: SeenPacket,
}

impl State {
    pub fn new() -> Self {
        Self::default()
    }

    /// The name of a kernel object of `pid`'s, when its code objects gave one.
    pub fn kernel_name(&self, pid: u32, object: u64) -> Option<&str> {
        self.procs.get(&pid)?.kernel_names.get(object)
    }

    /// The DBG_TRAP calls recorded since the last call ([`DebugCall`]).
    pub fn take_debug_calls(&mut self) -> Vec<DebugCall> {
        self.debug_calls.drain(..).collect()
    }

    /// The packets decoded since the last call; the first call starts keeping them.
    pub fn take_dispatches(&mut self) -> Vec<FreshDispatch> {
        std::mem::take(self.fresh_dispatches.get_or_insert_with(Vec::new))
    }

    /// The NVIDIA GPU an NVIDIA queue's `gpu_id` (its RM device instance) names.
    pub fn nv_gpu(&self, gpu_id: u32) -> Option<&crate::observe::nv::gpus::NvGpu> {
        crate::observe::nv::gpus::by_instance(&self.nv_gpus, gpu_id)
    }

    /// The host shows NVIDIA GPUs and no KFD GPU: nothing AMD (HQD slots, debugfs) applies.
    pub fn nvidia_only(&self) -> bool {
        self.gpus.is_empty() && !self.nv_gpus.is_empty()
    }

    pub fn gpu(&self, gpu_id: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.node.gpu_id == gpu_id)
    }

    pub fn queue(&self, pid: u32, qid: u32) -> Option<&Queue> {
        self.procs.get(&pid)?.queues.get(&qid)
    }

    /// Live queues on a GPU.
    pub fn queues_on(&self, gpu_id: u32) -> impl Iterator<Item = &Queue> {
        self.procs
            .values()
            .flat_map(|p| p.live_queues())
            .filter(move |q| q.gpu_id == gpu_id)
    }

    fn log(&mut self, ts_ns: u64, kind: LogKind, pid: u32, queue_id: Option<u32>, text: String) {
        if self.log.len() == LOG_CAP {
            self.log.pop_front();
        }
        self.log.push_back(LogEntry {
            ts_ns,
            kind,
            pid,
            queue_id,
            text,
        });
    }

    fn touch(&mut self, ts: u64) {
        self.now_ns = self.now_ns.max(ts);
    }

    /// The live process `pid`, created if needed (an exited one under the same pid is replaced).
    fn proc_mut(&mut self, pid: u32, source: Source, ts: u64) -> &mut Process {
        let p = self
            .procs
            .entry(pid)
            .or_insert_with(|| Process::new(pid, source, ts));
        if p.exited_ns.is_some() {
            *p = Process::new(pid, source, ts);
        }
        p
    }

    /// Request latency of the live processes whose launches and waits this observer watches.
    pub fn own_request_stats(
        &self,
        now: u64,
    ) -> std::collections::BTreeMap<u32, crate::observe::requests::RequestStats> {
        self.procs
            .values()
            .filter(|p| p.exited_ns.is_none())
            .map(|p| (p.pid, p.requests.stats(now)))
            .filter(|(_, s)| s.total + s.untimed > 0)
            .collect()
    }

    /// Durations (ns) of the requests each process closed since the last call.
    pub fn take_closed_requests(&mut self) -> Vec<(u32, Vec<u64>)> {
        self.procs
            .values_mut()
            .map(|p| (p.pid, p.requests.take_closed()))
            .filter(|(_, d)| !d.is_empty())
            .collect()
    }

    /// Request latency of `p`: this observer's own measure, else the running controller's.
    pub fn request_stats(
        &self,
        p: &Process,
        now: u64,
    ) -> Option<crate::observe::requests::RequestStats> {
        let own = p.requests.stats(now);
        if own.total + own.untimed > 0 {
            return Some(own);
        }
        self.controller.as_ref()?.requests.get(&p.pid).copied()
    }

    /// Ends the requests that went idle by `now` (a request's end is known only once the
    /// process has been idle a moment).
    pub fn tick_requests(&mut self, now: u64) {
        for p in self.procs.values_mut() {
            p.requests.tick(now);
        }
    }

    /// The one entry point: applies an update.
    pub fn apply(&mut self, u: Update) {
        match u {
            Update::Event(Event::Ioctl(ev)) => self.ioctl(&ev),
            Update::Event(Event::Kernel(k)) => self.kernel(&k),
            Update::Event(Event::Nv(n)) => self.nv(&n),
            Update::Event(Event::Launch(l)) => {
                self.touch(l.origin.ts_ns);
                if let Some(p) = self.procs.get_mut(&l.origin.pid) {
                    p.launch_or_wait(l.origin.ts_ns, l.origin.tid, l.point, l.suppressed);
                }
            }
            Update::Event(Event::ProcessExit(p)) => {
                self.touch(p.origin.ts_ns);
                self.process_exit(p.origin.pid, p.origin.ts_ns, "exited");
            }
            Update::Suspended {
                ts_ns,
                by,
                target,
                queues,
            } => self.suspend(ts_ns, by, target, queues, true),
            Update::Resumed {
                ts_ns,
                by,
                target,
                queues,
            } => self.suspend(ts_ns, by, target, queues, false),
            Update::Evicted { ts_ns, pid } => self.evict(ts_ns, pid, true),
            Update::Restored { ts_ns, pid } => self.evict(ts_ns, pid, false),
            Update::Topology(nodes) => self.topology(nodes),
            Update::NvGpus(g) => self.nv_gpus = g,
            Update::Procs(s) => self.reconcile(s),
            Update::ProcInfo { pid, info } => self.proc_info(pid, info),
            Update::ProcGone { pid } => {
                // A row lingering after its exit was seen is no correction.
                if self.procs.get(&pid).is_some_and(|p| p.exited_ns.is_none()) {
                    self.corrections.processes_gone += 1;
                    let now = self.now_ns;
                    self.process_exit(pid, now, "gone (no process, exit not seen)");
                }
            }
            Update::Hqds { taken_ns, nodes } => self.hqds(taken_ns, &nodes),
            Update::Mqds(procs) => self.mqds(&procs),
            Update::Samples { ts_ns, samples } => self.samples(ts_ns, samples),
            Update::KernelNames { pid, names } => self.kernel_names(pid, names),
            Update::Class { pid, class } => {
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.class = class;
                }
            }
            Update::Escaped { pid, escape } => {
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.escaped = escape;
                }
            }
            Update::Uncontrollable { pid, why } => {
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.uncontrollable = why;
                }
            }
            Update::Timeslices(list) => self.timeslices(&list),
            Update::Warning { ts_ns, text } => {
                self.touch(ts_ns);
                self.log(ts_ns, LogKind::Error, 0, None, text);
            }
            Update::Tick { now_ns } => self.tick(now_ns),
            Update::Unmanaged { pid, why } => {
                let now = self.now_ns;
                let p = self.proc_mut(pid, Source::Sysfs, now);
                if p.unmanaged.as_ref() != Some(&why) {
                    p.unmanaged = Some(why.clone());
                    self.log(now, LogKind::Error, pid, None, format!("unmanaged: {why}"));
                }
            }
        }
    }

    fn destroy(&mut self, pid: u32, qid: u32, ts: u64, why: &str) {
        let Some(q) = self
            .procs
            .get_mut(&pid)
            .and_then(|p| p.queues.get_mut(&qid))
        else {
            return;
        };
        if !q.alive() {
            return;
        }
        q.state = QueueState::Destroyed;
        q.destroyed_ns = Some(ts);
        q.hqd = None;
        q.suspended_by = None;
        q.last_event_ns = ts;
        self.log(ts, LogKind::Destroy, pid, Some(qid), why.to_string());
    }

    /// The process is gone: its queues are destroyed, and the queues it suspended as a debugger
    /// resume (the kernel disables the trap when the debugger's mm goes away).
    fn process_exit(&mut self, pid: u32, ts: u64, why: &str) {
        self.nv_objects.retain(|&(p, _), _| p != pid);
        let targets: Vec<u32> = self
            .procs
            .values()
            .filter(|p| p.debugger == Some(pid))
            .map(|p| p.pid)
            .collect();
        for t in targets {
            self.debugger_gone(ts, t, "debugger exited");
        }
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        let ids: Vec<u32> = p.live_queues().map(|q| q.queue_id).collect();
        let kind = if why == "exited" {
            LogKind::Exit
        } else {
            LogKind::Gone
        };
        for id in &ids {
            self.destroy(pid, *id, ts, "destroyed (process exit)");
        }
        self.log(ts, kind, pid, None, why.to_string());
        // The process row lingers with its destroyed queues; Tick removes it.
        if let Some(p) = self.procs.get_mut(&pid) {
            p.last_event_ns = ts;
            p.debugger = None;
            p.exited_ns = Some(ts);
        }
    }

    fn tick(&mut self, now: u64) {
        self.touch(now);
        self.tick_requests(now);
        for p in self.procs.values_mut() {
            p.queues.retain(|_, q| {
                q.destroyed_ns
                    .is_none_or(|d| now.saturating_sub(d) < LINGER_NS)
            });
        }
        self.procs.retain(|_, p| {
            p.exited_ns
                .is_none_or(|e| now.saturating_sub(e) < LINGER_NS)
        });
    }
}

#[cfg(test)]
pub(crate) mod tests;
