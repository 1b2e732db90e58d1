//! Loading and attaching the eBPF programs, with the host checks that make failures explainable.
//!
//! This file holds what callers configure and read back: the options, the event sources'
//! statuses, and [`Probes`] with its accessors. The work is split by stage:
//! - [`facts`]: what the host allows (kprobes, kallsyms, BTF offsets), planned without the kernel;
//! - [`load`]: privileges, tracefs, loading the object and the verifier's verdicts;
//! - [`pairs`]: the entry/return pairs on `kfd_ioctl` and `nvidia_unlocked_ioctl`;
//! - [`attach`]: [`Probes::attach`], step by step, with the programs' configuration;
//! - [`launch`]: the per-process launch uprobes and their off-thread detaching.

use std::{collections::HashMap, path::PathBuf};

use anyhow::{Context as _, Result};
use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::uprobe::UProbeLinkId,
    Ebpf,
};
use gpreempt_common::record::{stat, RateState};
use serde::Serialize;

mod attach;
mod detach;
mod facts;
mod launch;
mod load;
mod pairs;
mod source;

pub use facts::{kallsyms_present, kfd_ioctl_target, HostProbeFacts, Planned};
pub use load::{load_object, preflight, verify_programs, ProgramCheck, EBPF_OBJECT};
pub use pairs::{attach_fentry_pair, try_fentry_pair, try_nv_pair, FENTRY_PAIR, NV_FENTRY_PAIR};
pub use source::{IoctlSource, Pair, SourceKind, NV_IOCTL};

use detach::Detacher;

/// What to trace.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    /// Only this thread group (filtered in the kernel).
    pub pid: Option<u32>,
    /// Forward the programs' aya-log diagnostics to the `log` crate.
    pub ebpf_log: bool,
    /// Do not attach the kernel-internal probes (kprobes / fentry on amdkfd).
    pub no_kernel_probes: bool,
    /// Launch hints: at most one per process per this many ns (0: every launch).
    pub launch_gap_ns: u64,
    /// The KFD device node (its number, or for a stand-in its inode, selects KFD ioctls).
    pub kfd_device: PathBuf,
    /// NVIDIA nodes beyond those recognised by number (stand-ins).
    pub nvidia_devices: Vec<PathBuf>,
    /// Per-process limit of ioctl records: (per second, burst); None: unlimited.
    pub rate_limit: Option<(u32, u32)>,
    /// Where GPU ioctl records come from (`--ioctl-source`).
    pub ioctl_source: IoctlSource,
    /// The event ring buffer's size (`--ring-kib`).
    pub ring_bytes: u32,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            pid: None,
            ebpf_log: false,
            no_kernel_probes: false,
            launch_gap_ns: LAUNCH_GAP_NS,
            kfd_device: PathBuf::from("/dev/kfd"),
            nvidia_devices: Vec::new(),
            rate_limit: Some(RATE_LIMIT),
            ioctl_source: IoctlSource::Auto,
            ring_bytes: gpreempt_common::record::RING_BYTES,
        }
    }
}

/// Default [`ProbeOptions::rate_limit`]: a process gets 8192 ioctl records a second, bursts of
/// 32768 (a runtime's start-up allocates thousands of buffers at once). Beyond it, one process
/// flooding its GPU fd cannot fill the ring buffer that every other process's events share;
/// its dropped records are counted per process and reported.
pub const RATE_LIMIT: (u32, u32) = (8192, 32768);

/// How the ioctl programs select GPU driver calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoctlFilter {
    /// By the file behind the fd (the rules, described), any type byte.
    ByFile(String),
    /// By the type byte ('K', 'F'), because the file cannot be looked at (why). A caller can
    /// evade it with another type byte; user space checks the fd of what it sees.
    ByType(String),
}

/// Default [`ProbeOptions::launch_gap_ns`]: one hint per ms per process. A request launches tens
/// of kernels within microseconds; the first one is the hint, the rest would only cost.
pub const LAUNCH_GAP_NS: u64 = 1_000_000;

/// One event source and whether it is live, with the reason when it is not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SourceStatus {
    /// The kernel function, tracepoint, or "launch uprobes".
    pub name: String,
    pub kind: SourceKind,
    pub live: bool,
    pub detail: String,
}

/// One short line: which event sources are live (for `top`'s title and `trace`'s banner).
pub fn summarize(sources: &[SourceStatus]) -> String {
    let count = |k: SourceKind| {
        let all = sources.iter().filter(|s| s.kind == k).count();
        let live = sources.iter().filter(|s| s.kind == k && s.live).count();
        (live, all)
    };
    let (tp, tp_all) = count(SourceKind::Tracepoint);
    let (kp, kp_all) = count(SourceKind::Kprobe);
    let (fe, _) = count(SourceKind::Fentry);
    let launch = sources
        .iter()
        .find(|s| s.kind == SourceKind::Uprobe)
        .map_or("off".to_string(), |s| {
            if s.live {
                s.detail.clone()
            } else {
                "none watched".into()
            }
        });
    let mut out = format!(
        "events: tracepoints {tp}/{tp_all}, kprobes {}/{}",
        kp + fe,
        kp_all + fe
    );
    if fe > 0 {
        out.push_str(&format!(" ({fe} through fentry/fexit on kfd_ioctl)"));
    }
    out.push_str(&format!(", launch uprobes {launch}"));
    out
}

/// Why sources are not live, grouped: one line per distinct reason, naming the sources.
pub fn not_live_reasons(sources: &[SourceStatus]) -> Vec<String> {
    let mut by_reason: Vec<(String, Vec<&str>)> = Vec::new();
    for s in sources
        .iter()
        .filter(|s| !s.live && s.kind != SourceKind::Uprobe)
    {
        match by_reason.iter_mut().find(|(r, _)| *r == s.detail) {
            Some((_, names)) => names.push(&s.name),
            None => by_reason.push((s.detail.clone(), vec![&s.name])),
        }
    }
    by_reason
        .into_iter()
        .map(|(reason, names)| {
            if names.len() > 3 {
                format!("{} kernel probes not attached: {reason}", names.len())
            } else {
                format!("{} not attached: {reason}", names.join(", "))
            }
        })
        .collect()
}

/// Loaded and attached programs. Dropping it detaches everything.
pub struct Probes {
    ebpf: Ebpf,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    sources: Vec<SourceStatus>,
    /// Launch uprobes per watched pid.
    launch_links: HashMap<u32, Vec<(&'static str, UProbeLinkId)>>,
    /// Err: why launch uprobes cannot be used (a program failed to load).
    launch_ready: Result<(), String>,
    filter: IoctlFilter,
    /// Which pair on `kfd_ioctl` KFD ioctls come from (None: the syscall tracepoints).
    kfd_pair: Option<Pair>,
    /// Which pair on `nvidia_unlocked_ioctl` RM escapes come from (None: the tracepoints).
    nv_pair: Option<Pair>,
    /// Programs loaded against kernel BTF here rather than by aya; dropping detaches them.
    _tracing: Vec<crate::observe::tracing::Attached>,
    /// The syscall ioctl tracepoints are attached (the floor, or for GPU files beyond amdkfd).
    ioctl_tracepoints: bool,
    /// Launch uprobes taken off their programs, dropped (detached) on a thread of their own.
    detacher: Detacher,
}

/// Counters the programs keep, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    pub seen: u64,
    pub ringbuf_full: u64,
    pub inflight_full: u64,
    pub args_fault: u64,
    pub kernel_seen: u64,
    pub launch_seen: u64,
    pub launch_emitted: u64,
    /// GPU-typed ioctls on other files, dropped in the kernel.
    pub other_file: u64,
    /// Records dropped by the per-process rate limit.
    pub rate_limited: u64,
    /// Our own NVIDIA RM escapes, not recorded.
    pub own_skipped: u64,
    /// Wait entries and returns seen (uprobes).
    pub wait_seen: u64,
    /// Wait records dropped by the per-process wait limit.
    pub wait_dropped: u64,
}

impl KernelStats {
    /// Records lost in the kernel (never delivered).
    pub fn lost(&self) -> u64 {
        self.ringbuf_full + self.inflight_full
    }
}

impl Probes {
    /// How ioctls are selected in the kernel.
    pub fn filter(&self) -> &IoctlFilter {
        &self.filter
    }

    /// [`summarize`] plus how ioctls are selected, for logs and `top`.
    pub fn summary(&self) -> String {
        let how = match &self.filter {
            IoctlFilter::ByFile(_) => "by device",
            IoctlFilter::ByType(_) => "by TYPE BYTE (evadable)",
        };
        let ioctls = match (self.kfd_pair, self.ioctl_tracepoints) {
            (Some(p), false) => format!(
                "KFD ioctls from {} kfd_ioctl (no other ioctl runs a program)",
                p.name()
            ),
            (Some(p), true) => format!(
                "KFD ioctls from {} kfd_ioctl, other GPU ioctls from syscall tracepoints {how}",
                p.name()
            ),
            _ => format!("ioctls from syscall tracepoints {how}"),
        };
        let nv = match (self.nv_pair, self.ioctl_tracepoints) {
            (Some(p), false) => format!(
                ", NVIDIA RM escapes from {} {NV_IOCTL} (no other ioctl runs a program)",
                p.name()
            ),
            (Some(p), true) => format!(", NVIDIA RM escapes from {} {NV_IOCTL}", p.name()),
            (None, _) => String::new(),
        };
        format!("{}, {ioctls}{nv}", summarize(&self.sources))
    }

    /// Where NVIDIA RM escape records come from (Tracepoint: the syscall tracepoints).
    pub fn nv_source(&self) -> IoctlSource {
        match self.nv_pair {
            Some(Pair::Fentry) => IoctlSource::Fentry,
            Some(Pair::Kprobe) => IoctlSource::Kprobe,
            None => IoctlSource::Tracepoint,
        }
    }

    /// Where KFD ioctl records come from.
    pub fn kfd_source(&self) -> IoctlSource {
        match self.kfd_pair {
            Some(Pair::Fentry) => IoctlSource::Fentry,
            Some(Pair::Kprobe) => IoctlSource::Kprobe,
            None => IoctlSource::Tracepoint,
        }
    }

    /// Processes whose ioctl records the rate limit dropped, with the count so far.
    pub fn rate_limited(&self) -> Result<Vec<(u32, u32)>> {
        let map: BpfHashMap<_, u32, RateState> =
            BpfHashMap::try_from(self.ebpf.map("RATES").context("map RATES missing")?)?;
        Ok(map
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(_, s)| s.dropped > 0)
            .map(|(pid, s)| (pid, s.dropped))
            .collect())
    }

    /// Every event source and whether it is live.
    pub fn sources(&self) -> &[SourceStatus] {
        &self.sources
    }

    /// Attaches the launch uprobes to `pid` at `targets` (from [`crate::observe::launch`]). Returns how
    /// The ring buffer of records (taken once).
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map("EVENTS")
            .context("ring buffer EVENTS missing or taken")?;
        Ok(RingBuf::try_from(map)?)
    }

    /// The programs' counters, summed over CPUs.
    pub fn stats(&self) -> Result<KernelStats> {
        let map: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.ebpf.map("STATS").context("map STATS missing")?)?;
        let sum = |i: u32| -> Result<u64> { Ok(map.get(&i, 0)?.iter().sum()) };
        Ok(KernelStats {
            seen: sum(stat::SEEN)?,
            ringbuf_full: sum(stat::RINGBUF_FULL)?,
            inflight_full: sum(stat::INFLIGHT_FULL)?,
            args_fault: sum(stat::ARGS_FAULT)?,
            kernel_seen: sum(stat::KERNEL_SEEN)?,
            launch_seen: sum(stat::LAUNCH_SEEN)?,
            launch_emitted: sum(stat::LAUNCH_EMITTED)?,
            other_file: sum(stat::OTHER_FILE)?,
            rate_limited: sum(stat::RATE_LIMITED)?,
            own_skipped: sum(stat::OWN_SKIPPED)?,
            wait_seen: sum(stat::WAIT_SEEN)?,
            wait_dropped: sum(stat::WAIT_DROPPED)?,
        })
    }

    /// Drains pending aya-log records to the logger.
    pub fn flush_log(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }
}
