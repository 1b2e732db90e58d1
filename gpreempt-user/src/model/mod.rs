//! The host model: GPUs, KFD processes, their queues and the HQD slot each sits in. Pure: every
//! change comes through [`State::apply`], from KFD events (eBPF) or from reconciliation with what
//! the kernel shows (sysfs, debugfs, the queues' own `amd_queue_t`).

use std::collections::{BTreeMap, HashMap, VecDeque};

use gpreempt_common::kfd::{self, dbg_op, queue_type, DOORBELL_PROCESS_SLICE_BYTES};
use serde::Serialize;

use crate::{
    kfd::{
        debugfs::{HqdId, HqdNode, MqdKind, MqdProcess, Regs},
        sysfs::{GpuNode, ProcSnapshot},
    },
    observe::events::{Event, IoctlEvent, KernelEvent, KfdCall, NvCall, NvEvent},
    observe::procinfo::ProcInfo,
};

/// Destroyed queues stay visible this long (ns) so a short-lived queue can be seen.
pub const LINGER_NS: u64 = 3_000_000_000;
/// Event log entries kept.
pub const LOG_CAP: usize = 512;

/// What kind of queue (the CREATE_QUEUE type; sysfs only tells compute from SDMA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueKind {
    ComputeAql,
    /// PM4 compute (or compute of unknown flavour, seen only in sysfs).
    Compute,
    Sdma,
    SdmaXgmi,
    /// NVIDIA TSG on the graphics/compute engine.
    NvCompute,
    /// NVIDIA TSG on a copy engine.
    NvCopy,
    Other,
}

/// The GPU driver family a process's queues belong to: the controller acts through its backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Vendor {
    /// amdkfd queues (DBG_TRAP suspend/resume).
    Amd,
    /// NVIDIA RM TSGs (FIFO_DISABLE_CHANNELS).
    Nvidia,
}

impl std::fmt::Display for Vendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Amd => "AMD (KFD)",
            Self::Nvidia => "NVIDIA (RM)",
        })
    }
}

impl QueueKind {
    fn from_create(t: u32) -> Self {
        match t {
            queue_type::COMPUTE_AQL => Self::ComputeAql,
            queue_type::COMPUTE => Self::Compute,
            queue_type::SDMA | queue_type::SDMA_BY_ENG_ID => Self::Sdma,
            queue_type::SDMA_XGMI => Self::SdmaXgmi,
            _ => Self::Other,
        }
    }
    /// sysfs `type`: the kernel's internal enum (compute 0, SDMA 1, SDMA XGMI 3 or 4).
    fn from_sysfs(t: u32) -> Self {
        match t {
            0 => Self::Compute,
            1 => Self::Sdma,
            3 | 4 => Self::SdmaXgmi,
            _ => Self::Other,
        }
    }
    /// The sysfs `type` value of this kind (inverse of `from_sysfs`, up to the XGMI numbering).
    pub fn sysfs_type(self) -> u32 {
        match self {
            Self::ComputeAql | Self::Compute => 0,
            Self::Sdma => 1,
            Self::SdmaXgmi => 3,
            Self::NvCompute | Self::NvCopy | Self::Other => u32::MAX,
        }
    }
    pub fn is_compute(self) -> bool {
        matches!(self, Self::ComputeAql | Self::Compute | Self::NvCompute)
    }
    /// Whose driver owns queues of this kind (which backend controls them).
    pub fn vendor(self) -> Vendor {
        match self {
            Self::NvCompute | Self::NvCopy => Vendor::Nvidia,
            _ => Vendor::Amd,
        }
    }
    pub fn label(self) -> &'static str {
        match self {
            Self::ComputeAql => "aql",
            Self::Compute => "compute",
            Self::Sdma => "sdma",
            Self::SdmaXgmi => "xgmi",
            Self::NvCompute => "tsg-gr",
            Self::NvCopy => "tsg-ce",
            Self::Other => "?",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueState {
    Active,
    Suspended,
    Evicted,
    Destroyed,
}

impl QueueState {
    pub fn label(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Suspended => "suspended",
            Self::Evicted => "evicted",
            Self::Destroyed => "destroyed",
        }
    }
}

/// How the model learnt about a queue or process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A KFD ioctl seen by the eBPF programs.
    Event,
    /// Found in sysfs (it existed before the tool started, or its event was lost).
    Sysfs,
}

/// What the sampler made of a queue's `amd_queue_t`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status", content = "reason")]
pub enum SampleStatus {
    /// Not sampled (no pointers known, not AQL, or not yet).
    #[default]
    None,
    Valid,
    /// The memory does not look like ROCr's `amd_queue_t`: not sampled again.
    Invalid(String),
    /// The read failed (process exiting, memory unmapped): retried.
    Unreadable(String),
}

/// Live activity of an AQL queue, from its dispatch ids.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Activity {
    #[serde(flatten)]
    pub status: SampleStatus,
    pub read_dispatch_id: Option<u64>,
    pub write_dispatch_id: Option<u64>,
    /// Packets consumed per second over the last sampling interval.
    pub dispatches_per_s: Option<f64>,
    /// Packets written and not yet consumed.
    pub backlog: Option<u64>,
    /// Work was queued or consumed during the last interval.
    pub busy: Option<bool>,
    #[serde(skip)]
    pub sample_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Queue {
    pub queue_id: u32,
    pub gpu_id: u32,
    #[serde(rename = "type")]
    pub kind: QueueKind,
    pub priority: Option<u32>,
    pub percentage: Option<u32>,
    pub ring_base_address: Option<u64>,
    pub ring_size: u64,
    pub read_pointer_address: Option<u64>,
    pub write_pointer_address: Option<u64>,
    pub doorbell_offset: Option<u64>,
    /// The HQD slot the firmware mapped it to at the last `hqds` read (None: not mapped, or
    /// not known).
    pub hqd: Option<HqdId>,
    pub state: QueueState,
    /// Who suspended it (the debugger's pid).
    pub suspended_by: Option<u32>,
    /// CREATE_QUEUE time (CLOCK_MONOTONIC ns); None for queues found in sysfs.
    pub created_ns: Option<u64>,
    /// When the model first saw it.
    pub seen_ns: u64,
    pub destroyed_ns: Option<u64>,
    pub source: Source,
    /// The ring and pointers came from debugfs `mqds`, matched by order (no queue id there).
    pub pointers_from_mqds: bool,
    pub activity: Activity,
    /// NVIDIA: the TSG's RM identity and its channels (None for KFD queues).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nv: Option<NvTsg>,
    /// Time of the last event about this queue: reconciliation does not undo newer events.
    #[serde(skip)]
    pub last_event_ns: u64,
}

/// An NVIDIA TSG (KEPLER_CHANNEL_GROUP_A) as the RM escapes showed it: what pausing needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NvTsg {
    /// The RM client (hRoot) that owns it, and the fd of the process it was created on.
    pub h_client: u32,
    pub fd: i32,
    /// The client's subdevice (NV20_SUBDEVICE_0), where FIFO_DISABLE_CHANNELS goes.
    pub h_subdevice: Option<u32>,
    /// NV2080_ENGINE_TYPE (1 graphics/compute, 0xb.. copy engines).
    pub engine_type: u32,
    /// Its GPFIFO channels (handles), in allocation order.
    pub channels: Vec<u32>,
}

impl Queue {
    pub fn new(queue_id: u32, gpu_id: u32, kind: QueueKind, source: Source, now: u64) -> Self {
        Self {
            queue_id,
            gpu_id,
            kind,
            priority: None,
            percentage: None,
            ring_base_address: None,
            ring_size: 0,
            read_pointer_address: None,
            write_pointer_address: None,
            doorbell_offset: None,
            hqd: None,
            state: QueueState::Active,
            suspended_by: None,
            created_ns: None,
            seen_ns: now,
            destroyed_ns: None,
            source,
            pointers_from_mqds: false,
            activity: Activity::default(),
            nv: None,
            last_event_ns: now,
        }
    }

    pub fn alive(&self) -> bool {
        self.state != QueueState::Destroyed
    }

    /// Whether an `hqds` slot holds this queue: same ring, and the pointers and doorbell agree
    /// where both sides know them (ring VAs alone can repeat across processes).
    fn matches_slot(&self, r: &Regs) -> bool {
        let same = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        self.ring_base_address.is_some()
            && self.ring_base_address == r.ring_base()
            && same(self.read_pointer_address, r.rptr_addr())
            && same(self.write_pointer_address, r.wptr_addr())
            && same(
                self.doorbell_offset
                    .map(|d| d & (DOORBELL_PROCESS_SLICE_BYTES - 1)),
                r.doorbell_in_slice(),
            )
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Process {
    pub pid: u32,
    pub info: Option<ProcInfo>,
    /// Policy class (`online`, `offline`, ...), set by the controller.
    pub class: Option<String>,
    /// The process that enabled the debug trap on this one (it may suspend its queues).
    pub debugger: Option<u32>,
    pub source: Source,
    pub seen_ns: u64,
    /// Exit (or disappearance) time: the row lingers a moment, then goes.
    pub exited_ns: Option<u64>,
    pub queues: BTreeMap<u32, Queue>,
    #[serde(skip)]
    pub last_event_ns: u64,
    /// The last launch hint (uprobe on a HIP/HSA launch entry point), when watched.
    pub last_launch_ns: Option<u64>,
    /// Launches seen by the launch uprobes (reported and rate-limited ones).
    pub launches: u64,
}

impl Process {
    fn new(pid: u32, source: Source, now: u64) -> Self {
        Self {
            pid,
            info: None,
            class: None,
            debugger: None,
            source,
            seen_ns: now,
            exited_ns: None,
            queues: BTreeMap::new(),
            last_event_ns: now,
            last_launch_ns: None,
            launches: 0,
        }
    }
    pub fn comm(&self) -> &str {
        self.info.as_ref().map_or("?", |i| i.comm.as_str())
    }
    pub fn live_queues(&self) -> impl Iterator<Item = &Queue> {
        self.queues.values().filter(|q| q.alive())
    }

    /// The driver of its live queues (None without any).
    pub fn vendor(&self) -> Option<Vendor> {
        self.live_queues().next().map(|q| q.kind.vendor())
    }
}

/// A GPU and how its HQD slots are used.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Gpu {
    #[serde(flatten)]
    pub node: GpuNode,
    pub gfx_target: String,
    /// Compute slots with a mapped queue at the last `hqds` read (all XCCs).
    pub hqds_used: Option<u32>,
    /// Compute slots KFD owns, all XCCs.
    pub hqds_total: u32,
    /// "Device is stopped" in `hqds`.
    pub stopped: bool,
    /// HWS runlist uploads and unmaps seen by the kernel-internal probes.
    pub runlists: u64,
    pub unmaps: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogKind {
    Create,
    Destroy,
    Suspend,
    Resume,
    Evict,
    Restore,
    Exit,
    Found,
    Gone,
    Debug,
    Error,
}

impl LogKind {
    pub fn label(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Destroy => "destroy",
            Self::Suspend => "suspend",
            Self::Resume => "resume",
            Self::Evict => "evict",
            Self::Restore => "restore",
            Self::Exit => "exit",
            Self::Found => "found",
            Self::Gone => "gone",
            Self::Debug => "debug",
            Self::Error => "error",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LogEntry {
    pub ts_ns: u64,
    pub kind: LogKind,
    pub pid: u32,
    pub queue_id: Option<u32>,
    pub text: String,
}

/// One sample of a queue's dispatch ids (what the sampler read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SampleRead {
    Ids { read: u64, write: u64 },
    Invalid(String),
    Unreadable(String),
}

/// Everything that changes the model.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// A KFD event from the eBPF programs.
    Event(Event),
    /// A DBG_TRAP SUSPEND/RESUME_QUEUES by `by` on `target`, with the queue ids it acted on
    /// (read from the caller's array; None when unreadable). Ids carry no status bits.
    Suspended {
        ts_ns: u64,
        by: u32,
        target: u32,
        queues: Option<Vec<u32>>,
    },
    Resumed {
        ts_ns: u64,
        by: u32,
        target: u32,
        queues: Option<Vec<u32>>,
    },
    /// The kernel evicted / restored a process's queues (memory pressure, migration; kprobes or
    /// SMI events).
    Evicted {
        ts_ns: u64,
        pid: u32,
    },
    Restored {
        ts_ns: u64,
        pid: u32,
    },
    Topology(Vec<GpuNode>),
    /// `/sys/class/kfd/kfd/proc`.
    Procs(ProcSnapshot),
    /// `/proc/PID` facts; a different start time than before means the pid was reused.
    ProcInfo {
        pid: u32,
        info: ProcInfo,
    },
    /// `/proc/PID` is gone.
    ProcGone {
        pid: u32,
    },
    Hqds {
        taken_ns: u64,
        nodes: Vec<HqdNode>,
    },
    Mqds(Vec<MqdProcess>),
    Samples {
        ts_ns: u64,
        samples: Vec<(u32, u32, SampleRead)>,
    },
    /// A problem of the tool itself (unreadable debugfs, lost records), shown in the log.
    Warning {
        ts_ns: u64,
        text: String,
    },
    /// The policy class of a process.
    Class {
        pid: u32,
        class: Option<String>,
    },
    /// Time passes: destroyed queues and exited processes are dropped after [`LINGER_NS`].
    Tick {
        now_ns: u64,
    },
}

impl Update {
    /// A SUSPEND (`suspend`) or RESUME of `queues` of `target` by `by`.
    pub fn queue_op(
        suspend: bool,
        ts_ns: u64,
        by: u32,
        target: u32,
        queues: Option<Vec<u32>>,
    ) -> Self {
        if suspend {
            Self::Suspended {
                ts_ns,
                by,
                target,
                queues,
            }
        } else {
            Self::Resumed {
                ts_ns,
                by,
                target,
                queues,
            }
        }
    }
}

/// Counters of what reconciliation had to correct.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Corrections {
    pub queues_found: u64,
    pub queues_vanished: u64,
    pub processes_gone: u64,
    pub pid_reuse: u64,
    pub hqd_ambiguous: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct State {
    pub gpus: Vec<Gpu>,
    pub procs: BTreeMap<u32, Process>,
    #[serde(skip)]
    pub log: VecDeque<LogEntry>,
    /// Time of the last `hqds` read.
    pub hqds_ns: Option<u64>,
    pub corrections: Corrections,
    /// Latest time seen in any update (ns, CLOCK_MONOTONIC).
    #[serde(skip)]
    pub now_ns: u64,
    /// A one-line summary of the running controller (another process), for `top`'s title.
    #[serde(skip)]
    pub controller: Option<String>,
    /// Which event sources are live (`probe::summarize`), for `top`.
    #[serde(skip)]
    pub sources: Option<String>,
    /// NVIDIA RM objects per (pid, hClient): handle -> (class, parent), and the client's fd.
    #[serde(skip)]
    nv_objects: HashMap<(u32, u32), NvClient>,
}

/// What the model remembers of one RM client.
#[derive(Clone, Debug, Default, PartialEq)]
struct NvClient {
    fd: i32,
    objects: HashMap<u32, (u32, u32)>,
    /// NV01_DEVICE_0 handle -> device index (its alloc params' deviceId).
    devices: HashMap<u32, u32>,
    subdevice: Option<u32>,
}

impl State {
    pub fn new() -> Self {
        Self::default()
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

    /// The one entry point: applies an update.
    pub fn apply(&mut self, u: Update) {
        match u {
            Update::Event(Event::Ioctl(ev)) => self.ioctl(&ev),
            Update::Event(Event::Kernel(k)) => self.kernel(&k),
            Update::Event(Event::Nv(n)) => self.nv(&n),
            Update::Event(Event::Launch(l)) => {
                self.touch(l.origin.ts_ns);
                if let Some(p) = self.procs.get_mut(&l.origin.pid) {
                    p.last_launch_ns = Some(l.origin.ts_ns);
                    p.launches += 1 + u64::from(l.suppressed);
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
            Update::Class { pid, class } => {
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.class = class;
                }
            }
            Update::Warning { ts_ns, text } => {
                self.touch(ts_ns);
                self.log(ts_ns, LogKind::Error, 0, None, text);
            }
            Update::Tick { now_ns } => self.tick(now_ns),
        }
    }

    fn ioctl(&mut self, ev: &IoctlEvent) {
        let ts = ev.origin.ts_ns;
        // `ts` is the call's entry; its effect (sysfs directories included) is complete only at
        // its return, which is what reconciliation must compare a snapshot's time with.
        let end = ts.saturating_add(ev.duration_ns);
        let pid = ev.origin.pid;
        self.touch(ts);
        if ev.ret < 0 {
            return;
        }
        match &ev.call {
            KfdCall::CreateQueue { args: a, .. } => {
                let p = self.proc_mut(pid, Source::Event, ts);
                p.last_event_ns = end;
                let mut q = Queue::new(
                    a.queue_id,
                    a.gpu_id,
                    QueueKind::from_create(a.queue_type),
                    Source::Event,
                    ts,
                );
                q.priority = Some(a.queue_priority);
                q.percentage = Some(a.queue_percentage);
                q.ring_base_address = Some(a.ring_base_address);
                q.ring_size = a.ring_size.into();
                q.read_pointer_address = Some(a.read_pointer_address);
                q.write_pointer_address = Some(a.write_pointer_address);
                q.doorbell_offset = Some(a.doorbell_offset);
                q.created_ns = Some(ts);
                q.last_event_ns = end;
                let text = format!(
                    "{} queue {} on gpu {} prio {} ring {:#x}",
                    q.kind.label(),
                    a.queue_id,
                    a.gpu_id,
                    a.queue_priority,
                    a.ring_base_address
                );
                // A queue id is reused only after its destroy; replace whatever lingers.
                p.queues.insert(a.queue_id, q);
                self.log(ts, LogKind::Create, pid, Some(a.queue_id), text);
            }
            KfdCall::DestroyQueue(a) => {
                self.destroy(pid, a.queue_id, ts, "destroyed");
                if let Some(q) = self
                    .procs
                    .get_mut(&pid)
                    .and_then(|p| p.queues.get_mut(&a.queue_id))
                {
                    q.last_event_ns = q.last_event_ns.max(end);
                }
            }
            KfdCall::UpdateQueue(a) => {
                if let Some(q) = self
                    .procs
                    .get_mut(&pid)
                    .and_then(|p| p.queues.get_mut(&a.queue_id))
                {
                    q.priority = Some(a.queue_priority);
                    q.percentage = Some(a.queue_percentage);
                    q.ring_base_address = Some(a.ring_base_address);
                    q.ring_size = a.ring_size.into();
                    q.last_event_ns = end;
                }
            }
            KfdCall::AcquireVm(_) | KfdCall::AllocMemoryOfGpu(_) => {
                self.proc_mut(pid, Source::Event, ts).last_event_ns = end;
            }
            KfdCall::RuntimeEnable(a) => {
                self.proc_mut(pid, Source::Event, ts).last_event_ns = end;
                if a.mode_mask & kfd::KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK == 0 {
                    // runtime_disable deactivates a debugged runtime: every queue resumes (the
                    // debug trap itself stays enabled).
                    self.resume_suspended(ts, pid, "runtime disabled");
                }
            }
            KfdCall::DbgTrap(a) => self.dbg_trap(ts, pid, a),
            _ => {}
        }
    }

    /// What the kernel-internal probes add to the ioctl view: queues created or destroyed behind
    /// the ioctls' back (CRIU restore, process teardown), evictions, the kernel's own resumes, and
    /// HWS map/unmap counts.
    fn kernel(&mut self, k: &KernelEvent) {
        use gpreempt_common::kprobe::id;
        let ts = k.origin.ts_ns;
        self.touch(ts);
        let target = k.target.unwrap_or(0);
        match k.probe {
            id::QUEUE_ADD => {
                let (Some(qid), Some(gpu)) = (k.queue_id, k.gpu_id) else {
                    return;
                };
                if target == 0 || self.queue(target, qid).is_some_and(Queue::alive) {
                    return; // already known from its CREATE_QUEUE
                }
                let p = self.proc_mut(target, Source::Event, ts);
                p.last_event_ns = ts;
                let mut q = Queue::new(
                    qid,
                    gpu,
                    QueueKind::from_sysfs(k.args[0] as u32),
                    Source::Event,
                    ts,
                );
                q.priority = Some(k.args[1] as u32);
                q.ring_base_address = Some(k.args[3]);
                q.ring_size = k.args[4];
                q.created_ns = Some(ts);
                p.queues.insert(qid, q);
                self.log(
                    ts,
                    LogKind::Create,
                    target,
                    Some(qid),
                    format!(
                        "queue {qid} on gpu {gpu} created in the kernel (not by an ioctl seen)"
                    ),
                );
            }
            id::QUEUE_DEL => {
                if let Some(qid) = k.queue_id {
                    self.destroy(target, qid, ts, "destroyed (kernel)");
                }
            }
            id::EVICT if target != 0 => self.evict(ts, target, true),
            id::RESTORE if target != 0 => self.evict(ts, target, false),
            // resume_queues(p, 0, NULL): the kernel's disable path (debugger gone or DISABLE).
            id::RESUME if target != 0 && k.args[1] == 0 => {
                self.resume_suspended(ts, target, "by the kernel: debug trap disabled")
            }
            id::RUNLIST | id::UNMAP => {
                if let Some(g) = self
                    .gpus
                    .iter_mut()
                    .find(|g| Some(g.node.gpu_id) == k.gpu_id)
                {
                    if k.probe == id::RUNLIST {
                        g.runlists += 1;
                    } else {
                        g.unmaps += 1;
                    }
                }
            }
            _ => {}
        }
    }

    /// NVIDIA RM escapes: clients, devices, subdevices, TSGs (as queues) and their channels.
    fn nv(&mut self, n: &NvEvent) {
        use gpreempt_common::nv::{self as abi, class};
        let ts = n.origin.ts_ns;
        self.touch(ts);
        if !n.ok() {
            return;
        }
        let pid = n.origin.pid;
        match n.call {
            NvCall::Alloc {
                h_root,
                h_object_parent,
                h_object_new,
                h_class,
                alloc_params,
                ..
            } => {
                // A client's hRoot is its own new handle (0 on input when the RM picks it).
                let client = if class::is_client(h_class) {
                    h_object_new
                } else {
                    h_root
                };
                let c = self.nv_objects.entry((pid, client)).or_default();
                // The RM ties a client to the file it was created on: every call on it uses
                // that fd.
                c.fd = n.fd;
                if class::is_client(h_class) {
                    return;
                }
                c.objects.insert(h_object_new, (h_class, h_object_parent));
                match h_class {
                    class::NV01_DEVICE_0 => {
                        let idx = alloc_params.map_or(0, |p| abi::u32_at(&p, 0));
                        c.devices.insert(h_object_new, idx);
                    }
                    class::NV20_SUBDEVICE_0 => {
                        c.subdevice.get_or_insert(h_object_new);
                    }
                    class::KEPLER_CHANNEL_GROUP_A => {
                        let engine = n.engine_type().unwrap_or(0);
                        let gpu = c.devices.get(&h_object_parent).copied().unwrap_or(0);
                        let tsg = NvTsg {
                            h_client: h_root,
                            fd: c.fd,
                            h_subdevice: c.subdevice,
                            engine_type: engine,
                            channels: Vec::new(),
                        };
                        let kind = if engine == abi::ENGINE_TYPE_GRAPHICS {
                            QueueKind::NvCompute
                        } else {
                            QueueKind::NvCopy
                        };
                        let p = self.proc_mut(pid, Source::Event, ts);
                        p.last_event_ns = ts;
                        let mut q = Queue::new(h_object_new, gpu, kind, Source::Event, ts);
                        q.created_ns = Some(ts);
                        q.nv = Some(tsg);
                        p.queues.insert(h_object_new, q);
                        self.log(
                            ts,
                            LogKind::Create,
                            pid,
                            Some(h_object_new),
                            format!(
                                "NVIDIA TSG {h_object_new:#x} (engine {engine:#x}) of client {h_root:#x}"
                            ),
                        );
                    }
                    c if class::is_channel(c) => {
                        let Some(q) = self
                            .procs
                            .get_mut(&pid)
                            .and_then(|p| p.queues.get_mut(&h_object_parent))
                        else {
                            return;
                        };
                        if let Some(t) = q.nv.as_mut().filter(|t| t.h_client == h_root) {
                            t.channels.push(h_object_new);
                            q.last_event_ns = ts;
                        }
                    }
                    _ => {}
                }
            }
            NvCall::Free {
                h_root,
                h_object_old,
                ..
            } => {
                if h_object_old == h_root {
                    // The client and everything under it.
                    if let Some(c) = self.nv_objects.remove(&(pid, h_root)) {
                        for (h, (cl, _)) in c.objects {
                            if cl == class::KEPLER_CHANNEL_GROUP_A {
                                self.destroy(pid, h, ts, "NVIDIA client freed");
                            }
                        }
                    }
                    return;
                }
                let Some(c) = self.nv_objects.get_mut(&(pid, h_root)) else {
                    return;
                };
                let Some((cl, parent)) = c.objects.remove(&h_object_old) else {
                    return;
                };
                if cl == class::KEPLER_CHANNEL_GROUP_A {
                    self.destroy(pid, h_object_old, ts, "NVIDIA TSG freed");
                } else if class::is_channel(cl) {
                    if let Some(t) = self
                        .procs
                        .get_mut(&pid)
                        .and_then(|p| p.queues.get_mut(&parent))
                        .and_then(|q| q.nv.as_mut())
                    {
                        t.channels.retain(|&h| h != h_object_old);
                    }
                }
            }
            NvCall::Control { .. } | NvCall::Short => {}
        }
    }

    fn dbg_trap(&mut self, ts: u64, caller: u32, a: &kfd::DbgTrapArgs) {
        match a.op {
            dbg_op::ENABLE => {
                // It succeeded, so the target is a KFD process: the kernel makes one
                // (kfd_create_process) for a ptraced target that never opened /dev/kfd.
                self.proc_mut(a.pid, Source::Event, ts).debugger = Some(caller);
                self.log(
                    ts,
                    LogKind::Debug,
                    a.pid,
                    None,
                    format!("debug trap enabled by pid {caller}"),
                );
            }
            dbg_op::DISABLE => {
                // The kernel resumes every queue the debugger suspended.
                self.debugger_gone(ts, a.pid, "debug trap disabled");
            }
            _ => {}
        }
    }

    /// The debug trap on `target` ended: its suspended queues run again.
    fn debugger_gone(&mut self, ts: u64, target: u32, why: &str) {
        if let Some(t) = self.procs.get_mut(&target) {
            t.debugger = None;
        }
        self.resume_suspended(ts, target, why);
    }

    /// `resume_queues(target, 0, NULL)`: every suspended queue of `target` runs again.
    fn resume_suspended(&mut self, ts: u64, target: u32, why: &str) {
        let Some(t) = self.procs.get_mut(&target) else {
            return;
        };
        let mut resumed = Vec::new();
        for q in t.queues.values_mut() {
            if q.state == QueueState::Suspended {
                q.state = QueueState::Active;
                q.suspended_by = None;
                q.last_event_ns = ts;
                resumed.push(q.queue_id);
            }
        }
        for id in resumed {
            self.log(
                ts,
                LogKind::Resume,
                target,
                Some(id),
                format!("resumed ({why})"),
            );
        }
    }

    fn suspend(&mut self, ts: u64, by: u32, target: u32, ids: Option<Vec<u32>>, suspend: bool) {
        self.touch(ts);
        let (kind, verb) = if suspend {
            (LogKind::Suspend, "suspended")
        } else {
            (LogKind::Resume, "resumed")
        };
        let Some(t) = self.procs.get_mut(&target) else {
            return;
        };
        // Only the debugger can suspend: this names it when its ENABLE came before the tool.
        if suspend && t.debugger.is_none() {
            t.debugger = Some(by);
        }
        let Some(ids) = ids else {
            self.log(
                ts,
                kind,
                target,
                None,
                format!("{verb} by pid {by} (queue ids unreadable)"),
            );
            return;
        };
        let mut done = Vec::new();
        for id in ids {
            let Some(q) = t.queues.get_mut(&id) else {
                continue;
            };
            if !q.alive() {
                continue;
            }
            // The same act can reach the model twice (the traced ioctl and the controller's
            // status): only a change of state is logged.
            let was = q.state;
            if suspend {
                q.state = QueueState::Suspended;
                q.suspended_by = Some(by);
            } else if q.state == QueueState::Suspended {
                q.state = QueueState::Active;
                q.suspended_by = None;
            }
            q.last_event_ns = ts;
            if q.state != was {
                done.push(id);
            }
        }
        for id in done {
            self.log(ts, kind, target, Some(id), format!("{verb} by pid {by}"));
        }
    }

    fn evict(&mut self, ts: u64, pid: u32, evict: bool) {
        self.touch(ts);
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        let mut n = 0;
        for q in p.queues.values_mut() {
            match (evict, q.state) {
                (true, QueueState::Active) => q.state = QueueState::Evicted,
                (false, QueueState::Evicted) => q.state = QueueState::Active,
                _ => continue,
            }
            q.last_event_ns = ts;
            n += 1;
        }
        let (kind, verb) = if evict {
            (LogKind::Evict, "evicted")
        } else {
            (LogKind::Restore, "restored")
        };
        self.log(ts, kind, pid, None, format!("{n} queue(s) {verb}"));
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

    fn topology(&mut self, nodes: Vec<GpuNode>) {
        let old = std::mem::take(&mut self.gpus);
        self.gpus = nodes
            .into_iter()
            .map(|node| {
                let prev = old.iter().find(|g| g.node.gpu_id == node.gpu_id);
                Gpu {
                    gfx_target: node.gfx_target(),
                    hqds_total: node.hqd_slots * node.num_xcc,
                    hqds_used: prev.and_then(|g| g.hqds_used),
                    stopped: prev.is_some_and(|g| g.stopped),
                    runlists: prev.map_or(0, |g| g.runlists),
                    unmaps: prev.map_or(0, |g| g.unmaps),
                    node,
                }
            })
            .collect();
    }

    /// Brings the model in line with sysfs: queues it lacks are added, queues and processes sysfs
    /// no longer has are removed, unless an event newer than the snapshot says otherwise.
    fn reconcile(&mut self, s: ProcSnapshot) {
        let taken = s.taken_ns;
        self.touch(taken);
        let mut present = std::collections::BTreeSet::new();
        for sp in &s.procs {
            present.insert(sp.pid);
            // An exit already seen wins: the kernel removes the process's sysfs directories
            // after the exit (kfd_process_wq_release), so a snapshot may still list it. A new
            // process under the pid shows up through its events, or once the row has gone.
            if self
                .procs
                .get(&sp.pid)
                .is_some_and(|p| p.exited_ns.is_some())
            {
                continue;
            }
            let is_new = !self.procs.contains_key(&sp.pid);
            let p = self.proc_mut(sp.pid, Source::Sysfs, taken);
            let mut found = Vec::new();
            for sq in &sp.queues {
                let have = p.queues.get(&sq.queue_id).is_some_and(|q| q.alive());
                if have {
                    continue;
                }
                // A queue destroyed after the snapshot was taken is not resurrected.
                if p.queues
                    .get(&sq.queue_id)
                    .is_some_and(|q| q.last_event_ns >= taken)
                {
                    continue;
                }
                let mut q = Queue::new(
                    sq.queue_id,
                    sq.gpu_id,
                    QueueKind::from_sysfs(sq.kind),
                    Source::Sysfs,
                    taken,
                );
                q.ring_size = sq.size;
                q.last_event_ns = 0;
                p.queues.insert(sq.queue_id, q);
                found.push(sq.queue_id);
            }
            let vanished: Vec<u32> = p
                .live_queues()
                .filter(|q| {
                    q.nv.is_none()
                        && q.last_event_ns < taken
                        && !sp.queues.iter().any(|s| s.queue_id == q.queue_id)
                })
                .map(|q| q.queue_id)
                .collect();
            if is_new {
                self.log(
                    taken,
                    LogKind::Found,
                    sp.pid,
                    None,
                    format!("found in sysfs with {} queue(s)", sp.queues.len()),
                );
            }
            for id in found {
                self.corrections.queues_found += 1;
                if !is_new {
                    self.log(
                        taken,
                        LogKind::Found,
                        sp.pid,
                        Some(id),
                        "found in sysfs (create not seen)".into(),
                    );
                }
            }
            for id in vanished {
                self.corrections.queues_vanished += 1;
                self.destroy(sp.pid, id, taken, "gone from sysfs (destroy not seen)");
            }
        }
        let gone: Vec<u32> = self
            .procs
            .values()
            .filter(|p| {
                // KFD's sysfs knows nothing of NVIDIA processes.
                !present.contains(&p.pid)
                    && p.last_event_ns < taken
                    && p.live_queues().any(|q| q.nv.is_none())
            })
            .map(|p| p.pid)
            .collect();
        for pid in gone {
            self.corrections.processes_gone += 1;
            self.process_exit(pid, taken, "gone from sysfs (exit not seen)");
        }
    }

    fn proc_info(&mut self, pid: u32, info: ProcInfo) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        let reused = p
            .info
            .as_ref()
            .is_some_and(|old| old.start_time != info.start_time);
        if reused {
            // A new process under an old pid: nothing of the old one applies.
            self.corrections.pid_reuse += 1;
            let now = self.now_ns;
            // The old process is gone: the sessions it debugged ended (its queues resumed).
            let targets: Vec<u32> = self
                .procs
                .values()
                .filter(|t| t.pid != pid && t.debugger == Some(pid))
                .map(|t| t.pid)
                .collect();
            for t in targets {
                self.debugger_gone(now, t, "debugger exited (pid reused)");
            }
            let mut fresh = Process::new(pid, Source::Sysfs, now);
            fresh.info = Some(info);
            self.procs.insert(pid, fresh);
            self.log(
                now,
                LogKind::Gone,
                pid,
                None,
                "pid reused: previous process gone".into(),
            );
        } else {
            p.info = Some(info);
        }
    }

    fn hqds(&mut self, taken: u64, nodes: &[HqdNode]) {
        self.touch(taken);
        self.hqds_ns = Some(taken);
        /// An active slot and the live queues that match it.
        struct Slot<'a> {
            node: usize,
            gpu_id: u32,
            id: HqdId,
            regs: &'a Regs,
            matches: u32,
            queue: (u32, u32),
        }
        let mut slots = Vec::new();
        // Active slots by (GPU, ring): each queue is checked against the slots holding its ring
        // only, in one pass over the queues (not slots x queues).
        let mut by_ring: HashMap<(u32, u64), Vec<usize>> = HashMap::new();
        for (n, node) in nodes.iter().enumerate() {
            for slot in node.slots.iter().filter(|s| s.regs.active()) {
                if let Some(ring) = slot.regs.ring_base() {
                    by_ring
                        .entry((node.gpu_id, ring))
                        .or_default()
                        .push(slots.len());
                }
                slots.push(Slot {
                    node: n,
                    gpu_id: node.gpu_id,
                    id: slot.id(),
                    regs: &slot.regs,
                    matches: 0,
                    queue: (0, 0),
                });
            }
        }
        if !by_ring.is_empty() {
            for p in self.procs.values() {
                for q in p.live_queues() {
                    let Some(ring) = q.ring_base_address else {
                        continue;
                    };
                    for &i in by_ring.get(&(q.gpu_id, ring)).into_iter().flatten() {
                        let s = &mut slots[i];
                        if q.matches_slot(s.regs) {
                            s.matches += 1;
                            s.queue = (p.pid, q.queue_id);
                        }
                    }
                }
            }
        }
        // A GPU listed twice keeps its last node's map: each node resets its GPU's queues.
        let mut last: HashMap<u32, usize> = HashMap::new();
        for (n, node) in nodes.iter().enumerate() {
            let used = slots.iter().filter(|s| s.node == n).count() as u32;
            if let Some(g) = self.gpus.iter_mut().find(|g| g.node.gpu_id == node.gpu_id) {
                g.hqds_used = Some(used);
                g.hqds_total = node.slots.len() as u32;
                g.stopped = node.stopped;
            }
            last.insert(node.gpu_id, n);
        }
        // (GPU, pid, queue id) -> its slot: the first when a queue matches two.
        let mut assign: HashMap<(u32, u32, u32), HqdId> = HashMap::new();
        for s in &slots {
            match s.matches {
                0 => {}
                1 if last.get(&s.gpu_id) == Some(&s.node) => {
                    let (pid, qid) = s.queue;
                    assign.entry((s.gpu_id, pid, qid)).or_insert(s.id);
                }
                1 => {}
                _ => self.corrections.hqd_ambiguous += 1,
            }
        }
        // Every queue of a listed GPU is in no slot, except those just assigned one.
        let mut listed: Vec<u32> = last.into_keys().collect();
        listed.sort_unstable();
        for q in self.procs.values_mut().flat_map(|p| p.queues.values_mut()) {
            if listed.binary_search(&q.gpu_id).is_ok() {
                q.hqd = None;
            }
        }
        for ((_, pid, qid), id) in assign {
            if let Some(q) = self
                .procs
                .get_mut(&pid)
                .and_then(|p| p.queues.get_mut(&qid))
            {
                q.hqd = Some(id);
            }
        }
    }

    /// Fills in ring, pointers, doorbell and priority of queues known only from sysfs. `mqds` has
    /// no queue ids: per (process, GPU), descriptors whose ring matches a known queue are set
    /// aside, and the rest are matched to the remaining queues oldest first (the kernel lists
    /// newest first, ids are handed out lowest free first) only when the counts agree.
    fn mqds(&mut self, procs: &[MqdProcess]) {
        for mp in procs {
            let Some(p) = self.procs.get_mut(&mp.pid) else {
                continue;
            };
            let mut gpus: Vec<u32> = mp.queues.iter().map(|q| q.gpu_id).collect();
            gpus.sort_unstable();
            gpus.dedup();
            for gpu in gpus {
                let known: Vec<u64> = p
                    .live_queues()
                    .filter(|q| q.gpu_id == gpu)
                    .filter_map(|q| q.ring_base_address)
                    .collect();
                let mut descs: Vec<&Regs> = mp
                    .queues
                    .iter()
                    .filter(|q| q.gpu_id == gpu && q.kind == MqdKind::Compute)
                    .map(|q| &q.regs)
                    .filter(|r| r.ring_base().is_some_and(|b| !known.contains(&b)))
                    .collect();
                descs.reverse();
                let mut unknown: Vec<&mut Queue> = p
                    .queues
                    .values_mut()
                    .filter(|q| {
                        q.alive()
                            && q.gpu_id == gpu
                            && q.kind.is_compute()
                            && q.ring_base_address.is_none()
                    })
                    .collect();
                if unknown.is_empty() || unknown.len() != descs.len() {
                    continue;
                }
                for (q, r) in unknown.iter_mut().zip(descs) {
                    q.ring_base_address = r.ring_base();
                    q.read_pointer_address = r.rptr_addr();
                    q.write_pointer_address = r.wptr_addr();
                    // The doorbell (what CREATE_QUEUE returned, on SOC15) tells apart queues
                    // whose VAs repeat across processes when their HQD slots are matched.
                    if q.doorbell_offset.is_none() {
                        q.doorbell_offset = r
                            .doorbell_in_slice()
                            .map(|o| kfd::doorbell_mmap_offset(q.gpu_id, o));
                    }
                    q.priority = q.priority.or(r.queue_priority());
                    if q.ring_size == 0 {
                        q.ring_size = r.ring_size().unwrap_or(0);
                    }
                    q.pointers_from_mqds = true;
                    // rptr - wptr = 0x48 only for ROCr's AQL queues.
                    if let (Some(rp), Some(wp)) = (q.read_pointer_address, q.write_pointer_address)
                    {
                        if rp.wrapping_sub(wp) == 0x48 && q.kind == QueueKind::Compute {
                            q.kind = QueueKind::ComputeAql;
                        }
                    }
                }
            }
        }
    }

    fn samples(&mut self, ts: u64, samples: Vec<(u32, u32, SampleRead)>) {
        self.touch(ts);
        // The sampler lists queues process by process: one process lookup per run of them.
        let mut proc: Option<&mut Process> = None;
        for (pid, qid, s) in samples {
            if proc.as_ref().is_none_or(|p| p.pid != pid) {
                proc = self.procs.get_mut(&pid);
            }
            let Some(q) = proc.as_mut().and_then(|p| p.queues.get_mut(&qid)) else {
                continue;
            };
            let a = &mut q.activity;
            match s {
                SampleRead::Ids { read, write } => {
                    let dt = ts.saturating_sub(a.sample_ns);
                    match (a.read_dispatch_id, a.write_dispatch_id) {
                        (Some(r0), Some(w0)) if dt > 0 && read >= r0 => {
                            a.dispatches_per_s = Some((read - r0) as f64 * 1e9 / dt as f64);
                            a.busy = Some(read != r0 || write != w0 || write > read);
                        }
                        _ => {
                            a.dispatches_per_s = None;
                            a.busy = Some(write > read);
                        }
                    }
                    a.backlog = Some(write.saturating_sub(read));
                    a.read_dispatch_id = Some(read);
                    a.write_dispatch_id = Some(write);
                    a.sample_ns = ts;
                    a.status = SampleStatus::Valid;
                }
                SampleRead::Invalid(why) => {
                    *a = Activity {
                        status: SampleStatus::Invalid(why),
                        ..Default::default()
                    }
                }
                SampleRead::Unreadable(why) => a.status = SampleStatus::Unreadable(why),
            }
        }
    }

    fn tick(&mut self, now: u64) {
        self.touch(now);
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
