//! The host model's data: GPUs, processes, their queues and what is known of each, the event log's
//! entries, and [`Update`], everything that can change the model.

use std::collections::BTreeMap;

use gpreempt_common::kfd::{queue_type, DOORBELL_PROCESS_SLICE_BYTES};
use serde::Serialize;

use super::dispatch::{DispatchMix, SeenPacket};
use crate::{
    observe::events::Event,
    observe::kfd::{
        debugfs::{HqdId, HqdNode, MqdProcess, Regs},
        sysfs::{GpuNode, ProcSnapshot},
    },
    observe::procinfo::ProcInfo,
};

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
    pub(super) fn from_create(t: u32) -> Self {
        match t {
            queue_type::COMPUTE_AQL => Self::ComputeAql,
            queue_type::COMPUTE => Self::Compute,
            queue_type::SDMA | queue_type::SDMA_BY_ENG_ID => Self::Sdma,
            queue_type::SDMA_XGMI => Self::SdmaXgmi,
            _ => Self::Other,
        }
    }
    /// sysfs `type`: the kernel's internal enum (compute 0, SDMA 1, SDMA XGMI 3 or 4).
    pub(super) fn from_sysfs(t: u32) -> Self {
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
    /// The first dispatch id not decoded yet: where the sampler's ring window starts.
    #[serde(skip)]
    pub dispatch_cursor: Option<u64>,
    /// What the decoded packets asked for.
    pub dispatches: DispatchMix,
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
    /// Where each channel's ring and USERD live (from its allocation; channels whose alloc
    /// params were not read have none): what the activity sampler reads GP_GET / GP_PUT from.
    pub rings: Vec<crate::observe::events::ChannelRing>,
    /// Its hardware timeslice as a controller changed it: (original us, current us). None: not
    /// changed by a controller (the driver's own value).
    pub timeslice_us: Option<(u64, u64)>,
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
    pub(super) fn matches_slot(&self, r: &Regs) -> bool {
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
    /// Its requests (busy periods from a launch to the last blocking wait's return), when its
    /// launches and waits are watched.
    #[serde(skip)]
    pub requests: crate::observe::requests::Requests,
    /// Wait records the kernel had dropped for it at its last wait record.
    #[serde(skip)]
    pub waits_dropped: Option<u32>,
    /// Kernel descriptor address -> kernel name, from its code objects (docs/kfd.md).
    #[serde(skip)]
    pub kernel_names: crate::observe::kfd::codeobj::KernelNames,
    /// Why a GPU process is not managed (its RM objects are unknown: it opened the NVIDIA
    /// driver before the observer attached and no journal named them); None when managed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmanaged: Option<String>,
    /// The running controller cannot act on it, and why (a tracer of its own, another
    /// debugger, ...): set by the controller.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncontrollable: Option<Uncontrollable>,
    /// It got out of the running controller's hold (and was held again): how and how often.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escaped: Option<Escape>,
    /// Whether the process's GPU runtime enabled the KFD debug API, which suspending its queues
    /// needs (docs/kfd.md), as its ioctls showed; absent when none of them said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debug_api: Option<DebugApi>,
}

/// What a process's ioctls said about its debug API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DebugApi {
    /// Its queues can be suspended through DBG_TRAP.
    pub enabled: bool,
    pub why: String,
}

impl DebugApi {
    pub(super) fn enabled() -> Self {
        DebugApi {
            enabled: true,
            why: "its runtime enabled the KFD debug API (RUNTIME_ENABLE)".into(),
        }
    }
    pub(super) fn disabled() -> Self {
        DebugApi {
            enabled: false,
            why: "its runtime disabled the KFD debug API (RUNTIME_ENABLE without ENABLE): its \
                  queues cannot be suspended until it enables it again"
                .into(),
        }
    }
    /// The thunk asked the DKMS-only debug ioctl and the kernel does not have it.
    pub(super) fn legacy() -> Self {
        DebugApi {
            enabled: false,
            why: "its thunk asked the DKMS-only debug ioctl (0x82), which this kernel answers \
                  ENOTTY: ROCm before 5.7 never enables the KFD debug API, so its queues cannot \
                  be suspended"
                .into(),
        }
    }
}

/// Why the controller cannot act on a process: what the controller publishes, carried by the
/// model.
pub use crate::observe::status::{Escape, Uncontrollable};

impl Process {
    pub fn new(pid: u32, source: Source, now: u64) -> Self {
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
            requests: crate::observe::requests::Requests::new(crate::observe::requests::IDLE_NS),
            waits_dropped: None,
            kernel_names: Default::default(),
            unmanaged: None,
            uncontrollable: None,
            escaped: None,
            debug_api: None,
        }
    }
    pub fn comm(&self) -> &str {
        self.info.as_ref().map_or("?", |i| i.comm.as_str())
    }

    /// Test requests: for each (start, length) in ns, a `launch` at start, then one wait on
    /// thread 7 returning at start + length.
    #[cfg(test)]
    pub fn feed_requests(&mut self, launch: u32, spans: &[(u64, u64)]) {
        use gpreempt_common::kprobe::launch as l;
        for &(start, len) in spans {
            self.launch_or_wait(start, 7, launch, 0);
            self.launch_or_wait(start + 1_000, 7, l::WAIT_ENTER, 0);
            self.launch_or_wait(start + len, 7, l::WAIT_RETURN, 0);
        }
    }

    /// A launch or wait record of this process (`point`: `kprobe::launch`), at `ts` on thread
    /// `tid`; `suppressed` as the record carries it.
    pub fn launch_or_wait(&mut self, ts: u64, tid: u32, point: u32, suppressed: u32) {
        use crate::observe::requests::Activity;
        use gpreempt_common::kprobe::launch;
        if !launch::is_wait(point) {
            self.last_launch_ns = Some(ts);
            self.launches += 1 + u64::from(suppressed);
            self.requests.on(ts, Activity::Launch);
            return;
        }
        // A wait record carries the process's drop count: growth means some were lost, and
        // what is open cannot be trusted (the first record is the baseline: the count may be a
        // former process's under the same pid).
        if self.waits_dropped.is_some_and(|d| d != suppressed) {
            self.requests.on(ts, Activity::Lost);
        }
        self.waits_dropped = Some(suppressed);
        self.requests.on(
            ts,
            if point == launch::WAIT_ENTER {
                Activity::WaitEnter(tid)
            } else {
                Activity::WaitReturn(tid)
            },
        );
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

/// One sample of a queue's dispatch ids (what the sampler read), with the pending packets it
/// found in the ring window it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SampleRead {
    Ids {
        read: u64,
        write: u64,
        packets: Vec<SeenPacket>,
    },
    Invalid(String),
    Unreadable(String),
}

/// Everything that changes the model.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// A KFD event from the eBPF programs.
    Event(Event),
    /// A GPU process the tool cannot manage, and why (shown, never acted on).
    Unmanaged {
        pid: u32,
        why: String,
    },
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
    /// The NVIDIA GPUs (`/proc/driver/nvidia/gpus`), joined to the RM's device instances.
    NvGpus(Vec<crate::observe::nv::gpus::NvGpu>),
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
    /// Kernel descriptor address -> name, from a process's code objects.
    KernelNames {
        pid: u32,
        names: crate::observe::kfd::codeobj::KernelNames,
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
    /// The controller cannot act on the process (None: it can again).
    Uncontrollable {
        pid: u32,
        why: Option<Uncontrollable>,
    },
    /// The process escaped the controller's hold (None: forgotten).
    Escaped {
        pid: u32,
        escape: Option<Escape>,
    },
    /// The NVIDIA TSG timeslices the running controller changed, all of them: (pid, TSG,
    /// original us, current us). TSGs not listed carry the driver's own value again.
    Timeslices(Vec<(u32, u32, u64, u64)>),
    /// Time passes: destroyed queues and exited processes are dropped after [`LINGER_NS`](super::LINGER_NS).
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

/// What the model remembers of one RM client (`nv` keeps it up to date).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct NvClient {
    /// -1 until an event names it (the nvidia_unlocked_ioctl pair names it at the client's
    /// creation only, and not where the fd is past its scan).
    pub(super) fd: i32,
    pub(super) objects: std::collections::HashMap<u32, (u32, u32)>,
    /// NV01_DEVICE_0 handle -> device index (its alloc params' deviceId).
    pub(super) devices: std::collections::HashMap<u32, u32>,
    /// NV01_DEVICE_0 handle -> its (first) NV20_SUBDEVICE_0: where a TSG under that device is
    /// paused. libcuda makes a device per GPU the RM shows it, whatever CUDA_VISIBLE_DEVICES says,
    /// so the client's first subdevice is often another GPU's (NV_ERR_OBJECT_NOT_FOUND).
    pub(super) subdevices: std::collections::HashMap<u32, u32>,
}

impl Default for NvClient {
    fn default() -> Self {
        Self {
            fd: -1,
            objects: std::collections::HashMap::new(),
            devices: std::collections::HashMap::new(),
            subdevices: std::collections::HashMap::new(),
        }
    }
}

/// A successful DBG_TRAP call that can end or undo a debugger's hold on `target`, made by someone
/// other than its debugger (the target itself, most often): what the controller reads to tell
/// that a held process escaped ([`State::take_debug_calls`](super::State::take_debug_calls)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebugCall {
    /// When the call was made (CLOCK_MONOTONIC ns).
    pub ts_ns: u64,
    pub caller: u32,
    pub target: u32,
    pub op: DebugOp,
    /// The target's debugger as the model knew it before the call.
    pub debugger: Option<u32>,
}

/// The DBG_TRAP operations that can take a process out of a hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DebugOp {
    /// RESUME_QUEUES: suspended queues run again.
    Resume,
    /// DISABLE: the session ends and the kernel resumes every queue.
    Disable,
    /// ENABLE: a new session (after a DISABLE), owned by the caller.
    Enable,
}

impl DebugOp {
    pub fn of(op: u32) -> Option<Self> {
        use gpreempt_common::kfd::dbg_op;
        match op {
            dbg_op::RESUME_QUEUES => Some(Self::Resume),
            dbg_op::DISABLE => Some(Self::Disable),
            dbg_op::ENABLE => Some(Self::Enable),
            _ => None,
        }
    }
}
