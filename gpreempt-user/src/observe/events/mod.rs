//! Records from the ring buffer turned into typed events, and the check that an fd is /dev/kfd.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

use gpreempt_common::{
    kfd, kprobe, nv,
    record::{
        file_kind, kind, IoctlRecord, KernelRecord, LaunchRecord, ProcessExitRecord, RecordHeader,
        ARGS_MAX,
    },
};

/// One observation.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Ioctl(IoctlEvent),
    ProcessExit(ProcessExit),
    /// An amdkfd function fired (kprobe / fentry).
    Kernel(KernelEvent),
    /// A watched process entered a launch entry point (uprobe).
    Launch(LaunchEvent),
    /// An NVIDIA resource-manager escape (RM_ALLOC / RM_FREE / RM_CONTROL) on an NVIDIA device.
    Nv(NvEvent),
}

impl Event {
    pub fn origin(&self) -> &Origin {
        match self {
            Event::Ioctl(i) => &i.origin,
            Event::ProcessExit(p) => &p.origin,
            Event::Kernel(k) => &k.origin,
            Event::Launch(l) => &l.origin,
            Event::Nv(n) => &n.origin,
        }
    }
}

/// An NVIDIA RM escape, with the struct as the driver left it (status filled) when the ioctl
/// returned 0. The RM's own result is `status` (NV_STATUS), not the ioctl's return value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvEvent {
    pub origin: Origin,
    pub fd: i32,
    pub cmd: u32,
    pub ret: i64,
    pub duration_ns: u64,
    pub call: NvCall,
    /// Whether the fd was confirmed to be an NVIDIA device (/dev/nvidiactl, /dev/nvidiaN).
    pub verified: bool,
}

/// The decoded RM escape, named as in the driver's nvos.h.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvCall {
    /// NVOS21 (32 bytes) or NVOS64 (48 bytes, `nvos64`). `alloc_params`: the head of
    /// `*pAllocParms`, read at exit (None if unreadable), zero-padded past `alloc_params_len`
    /// bytes ([`nv::ALLOC_HEAD_LEN`], or [`nv::PARAMS_HEAD_LEN`] where the struct ended sooner).
    Alloc {
        h_root: u32,
        h_object_parent: u32,
        h_object_new: u32,
        h_class: u32,
        params_size: u32,
        status: u32,
        nvos64: bool,
        alloc_params: Option<[u8; nv::ALLOC_HEAD_LEN]>,
        alloc_params_len: usize,
    },
    Free {
        h_root: u32,
        h_object_parent: u32,
        h_object_old: u32,
        status: u32,
    },
    /// `params`: the head of `*params` read at exit (up to paramsSize bytes; empty if
    /// unreadable): the values the trace decodes for the controls it knows.
    Control {
        h_client: u32,
        h_object: u32,
        cmd: u32,
        flags: u32,
        params_size: u32,
        params: Vec<u8>,
        status: u32,
    },
    /// A struct too short to decode.
    Short,
}

impl NvEvent {
    pub fn name(&self) -> &'static str {
        match kfd::ioc_nr(self.cmd) {
            nv::nr::RM_ALLOC => "rm_alloc",
            nv::nr::RM_FREE => "rm_free",
            nv::nr::RM_CONTROL => "rm_control",
            _ => "rm_unknown",
        }
    }

    /// The RM's status, when the ioctl itself succeeded.
    pub fn status(&self) -> Option<u32> {
        match self.call {
            NvCall::Alloc { status, .. }
            | NvCall::Free { status, .. }
            | NvCall::Control { status, .. } => (self.ret == 0).then_some(status),
            NvCall::Short => None,
        }
    }

    /// Succeeded in the RM too.
    pub fn ok(&self) -> bool {
        self.status() == Some(nv::status::OK)
    }

    /// A TSG allocation's engine type (`engineType` of its alloc params).
    pub fn engine_type(&self) -> Option<u32> {
        match &self.call {
            NvCall::Alloc {
                h_class: nv::class::KEPLER_CHANNEL_GROUP_A,
                alloc_params: Some(p),
                ..
            } => Some(nv::u32_at(p, nv::TSG_ENGINE_TYPE_AT)),
            _ => None,
        }
    }

    /// A channel allocation's ring and USERD placement (its alloc params' head), when the
    /// whole head was read.
    pub fn channel_ring(&self) -> Option<ChannelRing> {
        match &self.call {
            NvCall::Alloc {
                h_class,
                h_object_new,
                alloc_params: Some(p),
                alloc_params_len,
                ..
            } if nv::class::is_channel(*h_class) && *alloc_params_len >= nv::ALLOC_HEAD_LEN => {
                use nv::channel as c;
                Some(ChannelRing {
                    h_channel: *h_object_new,
                    gpfifo_va: nv::u64_at(p, c::GPFIFO_OFFSET),
                    entries: nv::u32_at(p, c::GPFIFO_ENTRIES),
                    h_buffer: nv::u32_at(p, c::H_OBJECT_BUFFER),
                    h_userd: nv::u32_at(p, c::H_USERD_MEMORY),
                    userd_offset: nv::u64_at(p, c::USERD_OFFSET),
                })
            }
            _ => None,
        }
    }
}

/// Where a GPFIFO channel's ring and USERD live, as its allocation said (`NV_CHANNEL_ALLOC_PARAMS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChannelRing {
    pub h_channel: u32,
    /// gpFifoOffset: the ring's GPU virtual address (libcuda maps it at the same CPU address).
    pub gpfifo_va: u64,
    /// gpFifoEntries.
    pub entries: u32,
    /// hObjectBuffer: the ring's memory object.
    pub h_buffer: u32,
    /// hUserdMemory[0] (0: the RM's own USERD pool, which the client maps through the channel).
    pub h_userd: u32,
    /// userdOffset[0]: the USERD's offset in `h_userd`.
    pub userd_offset: u64,
}

/// Decodes an RM escape record.
pub fn decode_nv(r: &IoctlRecord) -> NvEvent {
    let args_len = (r.args_len as usize).min(ARGS_MAX);
    let out_len = (r.out_len as usize).min(ARGS_MAX);
    let succeeded = r.ret == 0 && out_len >= args_len && args_len > 0;
    let view: &[u8] = if succeeded {
        &r.out[..args_len]
    } else {
        &r.args[..args_len]
    };
    let u = |at| nv::u32_at(view, at);
    let call = match (kfd::ioc_nr(r.cmd), args_len as u32) {
        (nv::nr::RM_ALLOC, n) if n >= nv::alloc::NVOS21_SIZE => {
            let nvos64 = n >= nv::alloc::NVOS64_SIZE;
            let (size_at, status_at) = if nvos64 {
                (nv::alloc::NVOS64_PARAMS_SIZE, nv::alloc::NVOS64_STATUS)
            } else {
                (nv::alloc::NVOS21_PARAMS_SIZE, nv::alloc::NVOS21_STATUS)
            };
            // Inputs: read at exit whatever the outcome.
            let alloc_params_len = out_len
                .saturating_sub(nv::PARAMS_HEAD_AT)
                .min(nv::ALLOC_HEAD_LEN);
            let alloc_params = (alloc_params_len >= nv::PARAMS_HEAD_LEN).then(|| {
                let mut p = [0u8; nv::ALLOC_HEAD_LEN];
                p[..alloc_params_len].copy_from_slice(
                    &r.out[nv::PARAMS_HEAD_AT..nv::PARAMS_HEAD_AT + alloc_params_len],
                );
                p
            });
            NvCall::Alloc {
                h_root: u(nv::alloc::H_ROOT),
                h_object_parent: u(nv::alloc::H_OBJECT_PARENT),
                h_object_new: u(nv::alloc::H_OBJECT_NEW),
                h_class: u(nv::alloc::H_CLASS),
                params_size: u(size_at),
                status: u(status_at),
                nvos64,
                alloc_params,
                alloc_params_len,
            }
        }
        (nv::nr::RM_FREE, n) if n >= nv::free::SIZE => NvCall::Free {
            h_root: u(nv::free::H_ROOT),
            h_object_parent: u(nv::free::H_OBJECT_PARENT),
            h_object_old: u(nv::free::H_OBJECT_OLD),
            status: u(nv::free::STATUS),
        },
        (nv::nr::RM_CONTROL, n) if n >= nv::control::SIZE => NvCall::Control {
            h_client: u(nv::control::H_CLIENT),
            h_object: u(nv::control::H_OBJECT),
            cmd: u(nv::control::CMD),
            flags: u(nv::control::FLAGS),
            params_size: u(nv::control::PARAMS_SIZE),
            status: u(nv::control::STATUS),
            params: r
                .out
                .get(nv::PARAMS_HEAD_AT..out_len.max(nv::PARAMS_HEAD_AT))
                .unwrap_or_default()
                .to_vec(),
        },
        _ => NvCall::Short,
    };
    NvEvent {
        origin: origin(&r.hdr),
        fd: r.fd,
        cmd: r.cmd,
        ret: r.ret,
        duration_ns: r.duration_ns,
        call,
        verified: false,
    }
}

/// An amdkfd function fired. `origin` is the current task (possibly a kernel worker).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelEvent {
    pub origin: Origin,
    /// One of `gpreempt_common::kprobe::id`.
    pub probe: u32,
    /// The KFD process concerned (None: the probe cannot tell).
    pub target: Option<u32>,
    pub gpu_id: Option<u32>,
    pub queue_id: Option<u32>,
    /// Probe-specific values (see the programs in gpreempt-ebpf/src/kernel.rs).
    pub args: [u64; 6],
}

impl KernelEvent {
    /// The kernel function's name (the first of the probe's functions).
    pub fn name(&self) -> &'static str {
        kprobe::PROBES
            .iter()
            .find(|p| p.id == self.probe)
            .map_or("kernel_unknown", |p| p.functions[0])
    }

    /// Named values, in the kernel's own names.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        let a = &self.args;
        let names: &[&str] = match self.probe {
            kprobe::id::KFD_IOCTL => &["cmd", "arg", "kfd_process"],
            kprobe::id::QUEUE_ADD | kprobe::id::QUEUE_DEL => &[
                "type",
                "priority",
                "doorbell_off",
                "queue_address",
                "queue_size",
            ],
            kprobe::id::UNMAP => &["filter", "filter_param"],
            kprobe::id::EVICT => &["trigger"],
            kprobe::id::SUSPEND => &[
                "num_queues",
                "grace_period",
                "exception_clear_mask",
                "usr_queue_id_array",
            ],
            kprobe::id::RESUME => &["num_queues", "usr_queue_id_array"],
            kprobe::id::HQD_LOAD => &["pipe_id", "queue_id", "wptr", "mqd"],
            kprobe::id::HQD_DESTROY => &["pipe_id", "queue_id", "reset_type", "mqd"],
            kprobe::id::MES_ADD => &["process_id", "doorbell_offset", "queue_type"],
            kprobe::id::MES_REMOVE => &["doorbell_offset"],
            kprobe::id::DBG_EV_RAISE => &["event_mask", "source_id"],
            _ => &[],
        };
        let mut f: Vec<(&'static str, u64)> =
            names.iter().copied().zip(a.iter().copied()).collect();
        if matches!(self.probe, kprobe::id::QUEUE_ADD | kprobe::id::QUEUE_DEL) && a[5] != u64::MAX {
            f.push(("pipe", a[5] >> 32));
            f.push(("queue", a[5] & 0xffff_ffff));
        }
        f
    }
}

/// A launch hint: the first launch of a burst (at most one per `launch_gap` per process).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEvent {
    pub origin: Origin,
    /// One of `gpreempt_common::kprobe::launch`.
    pub point: u32,
    /// Launches of the process not reported since the previous hint.
    pub suppressed: u32,
    pub arg0: u64,
}

impl LaunchEvent {
    pub fn name(&self) -> &'static str {
        kprobe::launch::name(self.point)
    }
}

/// Who did it, and when (CLOCK_MONOTONIC ns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProcessExit {
    pub origin: Origin,
    /// Its ioctl records the per-process rate limit dropped, in all.
    pub rate_limited: u64,
}

/// A KFD ioctl, with the argument struct as the kernel left it (outputs filled) when it succeeded.
#[derive(Clone, Debug, PartialEq)]
pub struct IoctlEvent {
    pub origin: Origin,
    pub fd: i32,
    pub cmd: u32,
    pub ret: i64,
    pub duration_ns: u64,
    pub call: KfdCall,
    /// Whether the fd was confirmed to be the KFD device (false: the process was gone before it
    /// could be checked).
    pub verified: bool,
}

impl IoctlEvent {
    pub fn nr(&self) -> u32 {
        kfd::ioc_nr(self.cmd)
    }
    /// snake_case name of the ioctl (`create_queue`, ...), `kfd_ioctl_0xNN` when unknown.
    pub fn name(&self) -> String {
        match kfd::ioctl_name(self.nr()) {
            Some(n) => n.to_string(),
            None => format!("kfd_ioctl_{:#04x}", self.nr()),
        }
    }
}

/// The decoded argument struct of the ioctls the tool understands.
#[derive(Clone, Debug, PartialEq)]
pub enum KfdCall {
    GetVersion(kfd::GetVersionArgs),
    /// `args_size` is the caller's struct size: 88 (KFD <= 1.16) or 96.
    CreateQueue {
        args: kfd::CreateQueueArgs,
        args_size: u32,
    },
    DestroyQueue(kfd::DestroyQueueArgs),
    UpdateQueue(kfd::UpdateQueueArgs),
    SetCuMask(kfd::SetCuMaskArgs),
    GetQueueWaveState(kfd::GetQueueWaveStateArgs),
    AcquireVm(kfd::AcquireVmArgs),
    AllocMemoryOfGpu(kfd::AllocMemoryOfGpuArgs),
    FreeMemoryOfGpu(kfd::FreeMemoryOfGpuArgs),
    SmiEvents(kfd::SmiEventsArgs),
    RuntimeEnable(kfd::RuntimeEnableArgs),
    DbgTrap(kfd::DbgTrapArgs),
    /// Any other KFD ioctl: only its number is reported.
    Other,
}

/// Marker for the ring-buffer records: `#[repr(C)]`, integers only, valid for every bit pattern.
/// (KFD argument structs have their own byte views in `gpreempt_common::kfd`.)
///
/// # Safety
/// Implement only for types made of integer fields and arrays of them, without implicit padding
/// that would be read as a value.
pub(crate) unsafe trait Plain: Copy + Default {}

macro_rules! plain {
    ($($t:ty),* $(,)?) => { $(
        // SAFETY: records shared with the eBPF programs: integer fields only, so any byte
        // pattern is a valid value.
        unsafe impl Plain for $t {}
    )* };
}
plain!(
    IoctlRecord,
    ProcessExitRecord,
    RecordHeader,
    KernelRecord,
    LaunchRecord,
);

/// Reads a `T` from the front of `bytes`; missing tail bytes read as zero.
fn read_plain<T: Plain>(bytes: &[u8]) -> T {
    let mut v = T::default();
    let n = bytes.len().min(std::mem::size_of::<T>());
    // SAFETY: `v` is a valid T with size_of::<T>() bytes; we overwrite its first n <= size bytes,
    // and T: Plain accepts any byte pattern.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut v as *mut T).cast::<u8>(), n) };
    v
}

/// Errors from malformed ring-buffer records (a version mismatch between programs and user space).
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    Short { kind: u32, len: usize },
    UnknownKind(u32),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Short { kind, len } => write!(f, "record of kind {kind} truncated ({len} bytes)"),
            Self::UnknownKind(k) => write!(f, "record of unknown kind {k}"),
        }
    }
}

fn comm_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

fn origin(h: &RecordHeader) -> Origin {
    Origin {
        ts_ns: h.ts_ns,
        pid: h.pid,
        tid: h.tid,
        comm: comm_string(&h.comm),
    }
}

/// Decodes one ring-buffer record. `verified` is filled in later by [`FdCheck`].
pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
    if bytes.len() < std::mem::size_of::<RecordHeader>() {
        return Err(DecodeError::Short {
            kind: 0,
            len: bytes.len(),
        });
    }
    let hdr: RecordHeader = read_plain(bytes);
    let need = match hdr.kind {
        kind::IOCTL => std::mem::size_of::<IoctlRecord>(),
        kind::PROCESS_EXIT => std::mem::size_of::<ProcessExitRecord>(),
        kind::KERNEL => std::mem::size_of::<KernelRecord>(),
        kind::LAUNCH => std::mem::size_of::<LaunchRecord>(),
        k => return Err(DecodeError::UnknownKind(k)),
    };
    if bytes.len() < need {
        return Err(DecodeError::Short {
            kind: hdr.kind,
            len: bytes.len(),
        });
    }
    Ok(match hdr.kind {
        kind::IOCTL => {
            let r = read_plain::<IoctlRecord>(bytes);
            // The kernel matched the file: decode by it, whatever the type byte (the drivers
            // dispatch by nr alone). Otherwise the record was selected by its type byte.
            let rm = match r.hdr.file_kind {
                file_kind::NVIDIA => true,
                file_kind::KFD => false,
                _ => kfd::ioc_type(r.cmd) == nv::NV_IOCTL_MAGIC,
            };
            let by_kernel = matches!(r.hdr.file_kind, file_kind::KFD | file_kind::NVIDIA);
            if rm {
                let mut e = decode_nv(&r);
                e.verified = by_kernel;
                Event::Nv(e)
            } else {
                let mut e = decode_ioctl(&r);
                e.verified = by_kernel;
                Event::Ioctl(e)
            }
        }
        kind::KERNEL => {
            let r: KernelRecord = read_plain(bytes);
            Event::Kernel(KernelEvent {
                origin: origin(&hdr),
                probe: r.probe,
                target: (r.target != 0).then_some(r.target),
                gpu_id: (r.gpu_id != 0).then_some(r.gpu_id),
                queue_id: (r.queue_id != u32::MAX).then_some(r.queue_id),
                args: r.args,
            })
        }
        kind::LAUNCH => {
            let r: LaunchRecord = read_plain(bytes);
            Event::Launch(LaunchEvent {
                origin: origin(&hdr),
                point: r.point,
                suppressed: r.suppressed,
                arg0: r.arg0,
            })
        }
        _ => {
            let r: ProcessExitRecord = read_plain(bytes);
            Event::ProcessExit(ProcessExit {
                origin: origin(&hdr),
                rate_limited: r.rate_limited,
            })
        }
    })
}

/// Decodes an ioctl record. The struct shown is the kernel's copy-out when the call succeeded
/// (inputs with outputs filled in), else what the caller passed.
pub fn decode_ioctl(r: &IoctlRecord) -> IoctlEvent {
    let args_len = (r.args_len as usize).min(ARGS_MAX);
    let out_len = (r.out_len as usize).min(ARGS_MAX);
    let view: &[u8] = if r.ret >= 0 && out_len > 0 {
        &r.out[..out_len]
    } else {
        &r.args[..args_len]
    };
    let call = if view.is_empty() {
        KfdCall::Other
    } else {
        decode_call(kfd::ioc_nr(r.cmd), kfd::ioc_size(r.cmd), view)
    };
    IoctlEvent {
        origin: origin(&r.hdr),
        fd: r.fd,
        cmd: r.cmd,
        ret: r.ret,
        duration_ns: r.duration_ns,
        call,
        verified: false,
    }
}

fn decode_call(nr: u32, size: u32, b: &[u8]) -> KfdCall {
    use kfd::nr;
    match nr {
        nr::GET_VERSION => KfdCall::GetVersion(kfd::GetVersionArgs::from_bytes(b)),
        nr::CREATE_QUEUE => KfdCall::CreateQueue {
            args: kfd::CreateQueueArgs::from_bytes(b),
            args_size: size,
        },
        nr::DESTROY_QUEUE => KfdCall::DestroyQueue(kfd::DestroyQueueArgs::from_bytes(b)),
        nr::UPDATE_QUEUE => KfdCall::UpdateQueue(kfd::UpdateQueueArgs::from_bytes(b)),
        nr::SET_CU_MASK => KfdCall::SetCuMask(kfd::SetCuMaskArgs::from_bytes(b)),
        nr::GET_QUEUE_WAVE_STATE => {
            KfdCall::GetQueueWaveState(kfd::GetQueueWaveStateArgs::from_bytes(b))
        }
        nr::ACQUIRE_VM => KfdCall::AcquireVm(kfd::AcquireVmArgs::from_bytes(b)),
        nr::ALLOC_MEMORY_OF_GPU => {
            KfdCall::AllocMemoryOfGpu(kfd::AllocMemoryOfGpuArgs::from_bytes(b))
        }
        nr::FREE_MEMORY_OF_GPU => KfdCall::FreeMemoryOfGpu(kfd::FreeMemoryOfGpuArgs::from_bytes(b)),
        nr::SMI_EVENTS => KfdCall::SmiEvents(kfd::SmiEventsArgs::from_bytes(b)),
        nr::RUNTIME_ENABLE => KfdCall::RuntimeEnable(kfd::RuntimeEnableArgs::from_bytes(b)),
        nr::DBG_TRAP => KfdCall::DbgTrap(kfd::DbgTrapArgs::from_bytes(b)),
        _ => KfdCall::Other,
    }
}

/// Whether (pid, fd) is the device its events' decoder expects (KFD, or an NVIDIA node), from
/// `/proc/PID/fd/N`, cached per (pid, fd).
pub struct FdCheck {
    /// The KFD device node; NVIDIA nodes are recognised by their device number (or, for files
    /// that are no device, by name: /dev/nvidiactl, /dev/nvidiaN).
    device: PathBuf,
    /// The KFD device's number, when it is a character device here.
    device_rdev: Option<u64>,
    proc_root: PathBuf,
    cache: HashMap<(u32, i32), Node>,
}

/// `/dev/nvidiactl` or `/dev/nvidia<digits>` (not nvidia-uvm, nvidia-modeset: other ABIs).
pub fn is_nvidia_node(p: &Path) -> bool {
    let Some(name) = p.to_str().and_then(|s| s.strip_prefix("/dev/nvidia")) else {
        return false;
    };
    name == "ctl" || (!name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()))
}

/// What an open file is, for the events on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Kfd,
    Nvidia,
    Other,
}

/// The verdict on one (pid, fd).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FdVerdict {
    Kfd,
    /// Another file: the event is not a KFD ioctl and is dropped.
    Other,
    /// The process or fd was gone before it could be checked.
    Unknown,
}

fn char_rdev(meta: &std::fs::Metadata) -> Option<u64> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    meta.file_type().is_char_device().then(|| meta.rdev())
}

impl FdCheck {
    pub fn new(device: impl Into<PathBuf>) -> Self {
        Self::with_proc(device, "/proc")
    }

    /// For tests: a different procfs root.
    pub fn with_proc(device: impl Into<PathBuf>, proc_root: impl Into<PathBuf>) -> Self {
        let device = device.into();
        let device_rdev = std::fs::metadata(&device).ok().as_ref().and_then(char_rdev);
        Self {
            device,
            device_rdev,
            proc_root: proc_root.into(),
            cache: HashMap::new(),
        }
    }

    pub fn device(&self) -> &Path {
        &self.device
    }

    /// Whether `pid`'s `fd` is an NVIDIA device node (RM escapes go to nvidiactl and nvidiaN).
    pub fn check_nv(&mut self, pid: u32, fd: i32) -> FdVerdict {
        self.check_for(pid, fd, Node::Nvidia)
    }

    pub fn check(&mut self, pid: u32, fd: i32) -> FdVerdict {
        self.check_for(pid, fd, Node::Kfd)
    }

    fn check_for(&mut self, pid: u32, fd: i32, want: Node) -> FdVerdict {
        // Only devices are cached: the check runs after the event, and a process may have closed
        // the fd and reused its number for another file by then (libcuda opens nvidiactl, closes
        // it, reads /proc/driver/nvidia/params on the same number, then opens nvidiactl again
        // for good): a cached "other file" would drop every later event on that number.
        let node = match self.cache.get(&(pid, fd)) {
            Some(&n) => n,
            None => match self.judge(pid, fd) {
                Some(Node::Other) => Node::Other,
                Some(n) => {
                    self.cache.insert((pid, fd), n);
                    n
                }
                None => return FdVerdict::Unknown,
            },
        };
        if node == want {
            FdVerdict::Kfd
        } else {
            FdVerdict::Other
        }
    }

    /// By device number for character devices (the node may be mounted anywhere: containers,
    /// /usr/local/nvidia/dev, ...), by path for anything else (the tests' stand-in files).
    fn judge(&self, pid: u32, fd: i32) -> Option<Node> {
        let link = self
            .proc_root
            .join(pid.to_string())
            .join("fd")
            .join(fd.to_string());
        let by_number = std::fs::metadata(&link).ok().as_ref().and_then(char_rdev);
        let node = match by_number {
            Some(rdev) if Some(rdev) == self.device_rdev => Node::Kfd,
            Some(rdev)
                if nix::sys::stat::major(rdev) == u64::from(nv::NV_MAJOR_DEVICE_NUMBER)
                    && nix::sys::stat::minor(rdev) != u64::from(nv::NV_MODESET_MINOR) =>
            {
                Node::Nvidia
            }
            // Not a device here (the tests' stand-ins), or not one of ours by number: by name.
            _ => {
                let target = std::fs::read_link(&link).ok()?;
                if target == self.device {
                    Node::Kfd
                } else if is_nvidia_node(&target) {
                    Node::Nvidia
                } else {
                    log::debug!(
                        "pid {pid} fd {fd} ({}, device {}) is neither KFD nor NVIDIA: its events \
                         are dropped",
                        target.display(),
                        by_number.map_or("none".into(), |r| format!(
                            "{}:{}",
                            nix::sys::stat::major(r),
                            nix::sys::stat::minor(r)
                        ))
                    );
                    Node::Other
                }
            }
        };
        Some(node)
    }

    /// Forget a process (its fds, and a later process reusing its pid).
    pub fn forget(&mut self, pid: u32) {
        self.cache.retain(|&(p, _), _| p != pid);
    }

    /// Number of cached (pid, fd) verdicts.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }
}

/// Counters of what user space dropped or could not decode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserStats {
    /// 'K' ioctls in the KFD nr range on some other file (not KFD): dropped.
    pub not_kfd: u64,
    /// Delivered although the fd could not be checked (process already gone).
    pub unverified: u64,
    /// Malformed records.
    pub malformed: u64,
}

/// Reads the ring buffer as it becomes readable (epoll through tokio), yielding checked events.
pub struct EventSource {
    ring: tokio::io::unix::AsyncFd<aya::maps::RingBuf<aya::maps::MapData>>,
    fds: FdCheck,
    pub stats: UserStats,
}

impl EventSource {
    pub fn new(
        ring: aya::maps::RingBuf<aya::maps::MapData>,
        fds: FdCheck,
    ) -> std::io::Result<Self> {
        // SAFETY: the RingBuf owns its map fd; it stays open and unchanged until the AsyncFd (which
        // owns the RingBuf) is dropped.
        let ring = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE)
        }?;
        Ok(Self {
            ring,
            fds,
            stats: UserStats::default(),
        })
    }

    /// Waits until records are available, then replaces `out` with every available event.
    pub async fn next_batch(&mut self, out: &mut Vec<Event>) -> std::io::Result<()> {
        out.clear();
        let mut guard = self.ring.readable_mut().await?;
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            match decode(&item) {
                Ok(ev) => out.push(ev),
                Err(e) => {
                    self.stats.malformed += 1;
                    log::warn!("dropping a malformed record: {e}");
                }
            }
        }
        guard.clear_ready();
        self.check_fds(out);
        Ok(())
    }

    /// Keeps only ioctls on the KFD device; forgets exited processes.
    fn check_fds(&mut self, out: &mut Vec<Event>) {
        check_fds_with(&mut self.fds, &mut self.stats, out);
    }
}

/// [`EventSource::check_fds`] on its parts (for tests).
fn check_fds_with(fds: &mut FdCheck, stats: &mut UserStats, out: &mut Vec<Event>) {
    // Keeps the event unless its fd is another file; marks it verified when confirmed.
    let mut keep = |verdict: FdVerdict, verified: &mut bool| match verdict {
        FdVerdict::Kfd => {
            *verified = true;
            true
        }
        FdVerdict::Unknown => {
            stats.unverified += 1;
            true
        }
        FdVerdict::Other => {
            stats.not_kfd += 1;
            false
        }
    };
    // Records the kernel matched by file need no look in /proc.
    out.retain_mut(|ev| match ev {
        Event::Ioctl(i) if i.verified => true,
        Event::Nv(n) if n.verified => true,
        Event::Ioctl(i) => keep(fds.check(i.origin.pid, i.fd), &mut i.verified),
        Event::Nv(n) => keep(fds.check_nv(n.origin.pid, n.fd), &mut n.verified),
        Event::ProcessExit(p) => {
            fds.forget(p.origin.pid);
            true
        }
        Event::Kernel(_) | Event::Launch(_) => true,
    });
}

#[cfg(test)]
pub(crate) mod tests;
