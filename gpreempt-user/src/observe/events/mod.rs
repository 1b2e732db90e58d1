//! Records from the ring buffer turned into typed events, and the check that an fd is /dev/kfd.
//!
//! This file holds the events themselves (KFD ioctls, kernel probes, launch hints, exits); the
//! rest is split by stage:
//! - [`nv`]: NVIDIA RM escapes, their decoding and what a channel allocation says;
//! - [`decode`]: ring-buffer records read into events;
//! - [`fdcheck`]: whether the fd of an event is the device its decoder expects;
//! - [`source`]: the ring buffer read as it becomes readable, its events checked.

use gpreempt_common::{kfd, kprobe};

mod decode;
mod fdcheck;
mod nv;
mod origin;
mod source;
#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
use decode::Plain;
pub use decode::{decode, decode_ioctl, DecodeError};
pub use fdcheck::{is_nvidia_node, FdCheck, FdVerdict};
pub use nv::{decode_nv, ChannelRing, NvCall, NvEvent};
pub use origin::Origin;
pub use source::{EventSource, UserStats};

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
