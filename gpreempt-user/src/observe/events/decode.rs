//! Ring-buffer records read into events: the plain-bytes view of the records shared with the
//! eBPF programs, and the KFD argument structs by ioctl number.

use gpreempt_common::{
    kfd, nv,
    record::{
        file_kind, kind, IoctlRecord, KernelRecord, LaunchRecord, ProcessExitRecord, RecordHeader,
        ARGS_MAX,
    },
};

use super::{
    decode_nv, origin::origin, Event, IoctlEvent, KernelEvent, KfdCall, LaunchEvent, ProcessExit,
};

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
