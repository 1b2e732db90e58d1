//! The command table: every KFD ioctl by number, name, direction and argument size, and the
//! full command values.

use super::*;

/// One KFD ioctl.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ioctl {
    pub nr: u32,
    /// snake_case, as `trace` names the event.
    pub name: &'static str,
    /// `IOC_*` direction bits of the kernel's definition.
    pub dir: u32,
    /// The kernel's argument struct size (the newest form).
    pub size: u32,
}

/// ioctl numbers (`AMDKFD_IOC_*` without the prefix).
pub mod nr {
    pub const GET_VERSION: u32 = 0x01;
    pub const CREATE_QUEUE: u32 = 0x02;
    pub const DESTROY_QUEUE: u32 = 0x03;
    pub const SET_MEMORY_POLICY: u32 = 0x04;
    pub const GET_CLOCK_COUNTERS: u32 = 0x05;
    pub const GET_PROCESS_APERTURES: u32 = 0x06;
    pub const UPDATE_QUEUE: u32 = 0x07;
    pub const CREATE_EVENT: u32 = 0x08;
    pub const DESTROY_EVENT: u32 = 0x09;
    pub const SET_EVENT: u32 = 0x0A;
    pub const RESET_EVENT: u32 = 0x0B;
    pub const WAIT_EVENTS: u32 = 0x0C;
    pub const DBG_REGISTER_DEPRECATED: u32 = 0x0D;
    pub const DBG_UNREGISTER_DEPRECATED: u32 = 0x0E;
    pub const DBG_ADDRESS_WATCH_DEPRECATED: u32 = 0x0F;
    pub const DBG_WAVE_CONTROL_DEPRECATED: u32 = 0x10;
    pub const SET_SCRATCH_BACKING_VA: u32 = 0x11;
    pub const GET_TILE_CONFIG: u32 = 0x12;
    pub const SET_TRAP_HANDLER: u32 = 0x13;
    pub const GET_PROCESS_APERTURES_NEW: u32 = 0x14;
    pub const ACQUIRE_VM: u32 = 0x15;
    pub const ALLOC_MEMORY_OF_GPU: u32 = 0x16;
    pub const FREE_MEMORY_OF_GPU: u32 = 0x17;
    pub const MAP_MEMORY_TO_GPU: u32 = 0x18;
    pub const UNMAP_MEMORY_FROM_GPU: u32 = 0x19;
    pub const SET_CU_MASK: u32 = 0x1A;
    pub const GET_QUEUE_WAVE_STATE: u32 = 0x1B;
    pub const GET_DMABUF_INFO: u32 = 0x1C;
    pub const IMPORT_DMABUF: u32 = 0x1D;
    pub const ALLOC_QUEUE_GWS: u32 = 0x1E;
    pub const SMI_EVENTS: u32 = 0x1F;
    pub const SVM: u32 = 0x20;
    pub const SET_XNACK_MODE: u32 = 0x21;
    pub const CRIU_OP: u32 = 0x22;
    pub const AVAILABLE_MEMORY: u32 = 0x23;
    pub const EXPORT_DMABUF: u32 = 0x24;
    pub const RUNTIME_ENABLE: u32 = 0x25;
    pub const DBG_TRAP: u32 = 0x26;
    /// KFD 1.19 (secondary contexts).
    pub const CREATE_PROCESS: u32 = 0x27;
    /// Proposed upstream number of the profiler ioctl (DKMS used 0x86).
    pub const PROFILER: u32 = 0x28;
    pub const IPC_IMPORT_HANDLE: u32 = 0x80;
    pub const IPC_EXPORT_HANDLE: u32 = 0x81;
    pub const DBG_TRAP_DEPRECATED: u32 = 0x82;
    pub const CROSS_MEMORY_COPY_DEPRECATED: u32 = 0x83;
    pub const RLC_SPM: u32 = 0x84;
    pub const PC_SAMPLE: u32 = 0x85;
    pub const PROFILER_DKMS: u32 = 0x86;
}

const RW: u32 = IOC_READ | IOC_WRITE;
const R: u32 = IOC_READ;
const W: u32 = IOC_WRITE;
const N: u32 = IOC_NONE;

macro_rules! sz {
    ($t:ty) => {
        core::mem::size_of::<$t>() as u32
    };
}

/// Every KFD ioctl, by nr. Sizes of the DKMS-only structs come from docs/kfd.md;
/// PROFILER's struct is not settled upstream (size 0: arguments are not copied).
pub const IOCTLS: [Ioctl; 47] = [
    Ioctl {
        nr: nr::GET_VERSION,
        name: "get_version",
        dir: R,
        size: sz!(GetVersionArgs),
    },
    Ioctl {
        nr: nr::CREATE_QUEUE,
        name: "create_queue",
        dir: RW,
        size: sz!(CreateQueueArgs),
    },
    Ioctl {
        nr: nr::DESTROY_QUEUE,
        name: "destroy_queue",
        dir: RW,
        size: sz!(DestroyQueueArgs),
    },
    Ioctl {
        nr: nr::SET_MEMORY_POLICY,
        name: "set_memory_policy",
        dir: W,
        size: sz!(SetMemoryPolicyArgs),
    },
    Ioctl {
        nr: nr::GET_CLOCK_COUNTERS,
        name: "get_clock_counters",
        dir: RW,
        size: sz!(GetClockCountersArgs),
    },
    Ioctl {
        nr: nr::GET_PROCESS_APERTURES,
        name: "get_process_apertures",
        dir: R,
        size: sz!(GetProcessAperturesArgs),
    },
    Ioctl {
        nr: nr::UPDATE_QUEUE,
        name: "update_queue",
        dir: W,
        size: sz!(UpdateQueueArgs),
    },
    Ioctl {
        nr: nr::CREATE_EVENT,
        name: "create_event",
        dir: RW,
        size: sz!(CreateEventArgs),
    },
    Ioctl {
        nr: nr::DESTROY_EVENT,
        name: "destroy_event",
        dir: W,
        size: sz!(DestroyEventArgs),
    },
    Ioctl {
        nr: nr::SET_EVENT,
        name: "set_event",
        dir: W,
        size: sz!(SetEventArgs),
    },
    Ioctl {
        nr: nr::RESET_EVENT,
        name: "reset_event",
        dir: W,
        size: sz!(ResetEventArgs),
    },
    Ioctl {
        nr: nr::WAIT_EVENTS,
        name: "wait_events",
        dir: RW,
        size: sz!(WaitEventsArgs),
    },
    Ioctl {
        nr: nr::DBG_REGISTER_DEPRECATED,
        name: "dbg_register_deprecated",
        dir: W,
        size: sz!(DbgRegisterArgs),
    },
    Ioctl {
        nr: nr::DBG_UNREGISTER_DEPRECATED,
        name: "dbg_unregister_deprecated",
        dir: W,
        size: sz!(DbgUnregisterArgs),
    },
    Ioctl {
        nr: nr::DBG_ADDRESS_WATCH_DEPRECATED,
        name: "dbg_address_watch_deprecated",
        dir: W,
        size: sz!(DbgAddressWatchArgs),
    },
    Ioctl {
        nr: nr::DBG_WAVE_CONTROL_DEPRECATED,
        name: "dbg_wave_control_deprecated",
        dir: W,
        size: sz!(DbgWaveControlArgs),
    },
    Ioctl {
        nr: nr::SET_SCRATCH_BACKING_VA,
        name: "set_scratch_backing_va",
        dir: RW,
        size: sz!(SetScratchBackingVaArgs),
    },
    Ioctl {
        nr: nr::GET_TILE_CONFIG,
        name: "get_tile_config",
        dir: RW,
        size: sz!(GetTileConfigArgs),
    },
    Ioctl {
        nr: nr::SET_TRAP_HANDLER,
        name: "set_trap_handler",
        dir: W,
        size: sz!(SetTrapHandlerArgs),
    },
    Ioctl {
        nr: nr::GET_PROCESS_APERTURES_NEW,
        name: "get_process_apertures_new",
        dir: RW,
        size: sz!(GetProcessAperturesNewArgs),
    },
    Ioctl {
        nr: nr::ACQUIRE_VM,
        name: "acquire_vm",
        dir: W,
        size: sz!(AcquireVmArgs),
    },
    Ioctl {
        nr: nr::ALLOC_MEMORY_OF_GPU,
        name: "alloc_memory_of_gpu",
        dir: RW,
        size: sz!(AllocMemoryOfGpuArgs),
    },
    Ioctl {
        nr: nr::FREE_MEMORY_OF_GPU,
        name: "free_memory_of_gpu",
        dir: W,
        size: sz!(FreeMemoryOfGpuArgs),
    },
    Ioctl {
        nr: nr::MAP_MEMORY_TO_GPU,
        name: "map_memory_to_gpu",
        dir: RW,
        size: sz!(MapMemoryToGpuArgs),
    },
    Ioctl {
        nr: nr::UNMAP_MEMORY_FROM_GPU,
        name: "unmap_memory_from_gpu",
        dir: RW,
        size: sz!(UnmapMemoryFromGpuArgs),
    },
    Ioctl {
        nr: nr::SET_CU_MASK,
        name: "set_cu_mask",
        dir: W,
        size: sz!(SetCuMaskArgs),
    },
    Ioctl {
        nr: nr::GET_QUEUE_WAVE_STATE,
        name: "get_queue_wave_state",
        dir: RW,
        size: sz!(GetQueueWaveStateArgs),
    },
    Ioctl {
        nr: nr::GET_DMABUF_INFO,
        name: "get_dmabuf_info",
        dir: RW,
        size: sz!(GetDmabufInfoArgs),
    },
    Ioctl {
        nr: nr::IMPORT_DMABUF,
        name: "import_dmabuf",
        dir: RW,
        size: sz!(ImportDmabufArgs),
    },
    Ioctl {
        nr: nr::ALLOC_QUEUE_GWS,
        name: "alloc_queue_gws",
        dir: RW,
        size: sz!(AllocQueueGwsArgs),
    },
    Ioctl {
        nr: nr::SMI_EVENTS,
        name: "smi_events",
        dir: RW,
        size: sz!(SmiEventsArgs),
    },
    Ioctl {
        nr: nr::SVM,
        name: "svm",
        dir: RW,
        size: sz!(SvmArgs),
    },
    Ioctl {
        nr: nr::SET_XNACK_MODE,
        name: "set_xnack_mode",
        dir: RW,
        size: sz!(SetXnackModeArgs),
    },
    Ioctl {
        nr: nr::CRIU_OP,
        name: "criu_op",
        dir: RW,
        size: sz!(CriuArgs),
    },
    Ioctl {
        nr: nr::AVAILABLE_MEMORY,
        name: "available_memory",
        dir: RW,
        size: sz!(GetAvailableMemoryArgs),
    },
    Ioctl {
        nr: nr::EXPORT_DMABUF,
        name: "export_dmabuf",
        dir: RW,
        size: sz!(ExportDmabufArgs),
    },
    Ioctl {
        nr: nr::RUNTIME_ENABLE,
        name: "runtime_enable",
        dir: RW,
        size: sz!(RuntimeEnableArgs),
    },
    Ioctl {
        nr: nr::DBG_TRAP,
        name: "dbg_trap",
        dir: RW,
        size: sz!(DbgTrapArgs),
    },
    Ioctl {
        nr: nr::CREATE_PROCESS,
        name: "create_process",
        dir: N,
        size: 0,
    },
    Ioctl {
        nr: nr::PROFILER,
        name: "profiler",
        dir: RW,
        size: 0,
    },
    Ioctl {
        nr: nr::IPC_IMPORT_HANDLE,
        name: "ipc_import_handle",
        dir: RW,
        size: 48,
    },
    Ioctl {
        nr: nr::IPC_EXPORT_HANDLE,
        name: "ipc_export_handle",
        dir: RW,
        size: 32,
    },
    Ioctl {
        nr: nr::DBG_TRAP_DEPRECATED,
        name: "dbg_trap_deprecated",
        dir: RW,
        size: 40,
    },
    Ioctl {
        nr: nr::CROSS_MEMORY_COPY_DEPRECATED,
        name: "cross_memory_copy_deprecated",
        dir: RW,
        size: 48,
    },
    Ioctl {
        nr: nr::RLC_SPM,
        name: "rlc_spm",
        dir: RW,
        size: 32,
    },
    Ioctl {
        nr: nr::PC_SAMPLE,
        name: "pc_sample",
        dir: RW,
        size: 32,
    },
    Ioctl {
        nr: nr::PROFILER_DKMS,
        name: "profiler",
        dir: RW,
        size: 0,
    },
];

/// The table entry for `nr`.
pub const fn ioctl(nr: u32) -> Option<&'static Ioctl> {
    let mut i = 0;
    while i < IOCTLS.len() {
        if IOCTLS[i].nr == nr {
            return Some(&IOCTLS[i]);
        }
        i += 1;
    }
    None
}

/// snake_case name of ioctl `nr` (`create_queue`, ...).
pub const fn ioctl_name(nr: u32) -> Option<&'static str> {
    match ioctl(nr) {
        Some(d) => Some(d.name),
        None => None,
    }
}

/// Kernel argument size by nr, as an array: the eBPF side indexes it (no loops, no jump tables).
/// One slot per possible nr (a byte), so that the index needs no bounds check the compiler could
/// apply to another register than the one the verifier tracks.
pub const ARG_SIZE: [u16; 256] = {
    let mut t = [0u16; 256];
    let mut i = 0;
    while i < IOCTLS.len() {
        t[IOCTLS[i].nr as usize] = IOCTLS[i].size as u16;
        i += 1;
    }
    t
};

/// The kernel's argument struct size for `nr` (0 when unknown).
#[inline(always)]
pub const fn arg_size(nr: u32) -> u32 {
    if nr > 0xff {
        return 0;
    }
    ARG_SIZE[(nr & 0xff) as usize] as u32
}

/// The full `AMDKFD_IOC_*` command values, as the newest header defines them.
pub mod cmd {
    use super::*;
    pub const GET_VERSION: u32 = ior(nr::GET_VERSION, size_of::<GetVersionArgs>());
    pub const CREATE_QUEUE: u32 = iowr(nr::CREATE_QUEUE, size_of::<CreateQueueArgs>());
    /// The pre-1.17 encoding (88-byte struct), still accepted.
    pub const CREATE_QUEUE_V1: u32 = iowr(nr::CREATE_QUEUE, CREATE_QUEUE_ARGS_SIZE_V1);
    pub const DESTROY_QUEUE: u32 = iowr(nr::DESTROY_QUEUE, size_of::<DestroyQueueArgs>());
    pub const SET_MEMORY_POLICY: u32 = iow(nr::SET_MEMORY_POLICY, size_of::<SetMemoryPolicyArgs>());
    pub const GET_CLOCK_COUNTERS: u32 =
        iowr(nr::GET_CLOCK_COUNTERS, size_of::<GetClockCountersArgs>());
    pub const GET_PROCESS_APERTURES: u32 = ior(
        nr::GET_PROCESS_APERTURES,
        size_of::<GetProcessAperturesArgs>(),
    );
    pub const UPDATE_QUEUE: u32 = iow(nr::UPDATE_QUEUE, size_of::<UpdateQueueArgs>());
    pub const CREATE_EVENT: u32 = iowr(nr::CREATE_EVENT, size_of::<CreateEventArgs>());
    pub const DESTROY_EVENT: u32 = iow(nr::DESTROY_EVENT, size_of::<DestroyEventArgs>());
    pub const SET_EVENT: u32 = iow(nr::SET_EVENT, size_of::<SetEventArgs>());
    pub const RESET_EVENT: u32 = iow(nr::RESET_EVENT, size_of::<ResetEventArgs>());
    pub const WAIT_EVENTS: u32 = iowr(nr::WAIT_EVENTS, size_of::<WaitEventsArgs>());
    pub const DBG_REGISTER_DEPRECATED: u32 =
        iow(nr::DBG_REGISTER_DEPRECATED, size_of::<DbgRegisterArgs>());
    pub const DBG_UNREGISTER_DEPRECATED: u32 = iow(
        nr::DBG_UNREGISTER_DEPRECATED,
        size_of::<DbgUnregisterArgs>(),
    );
    pub const DBG_ADDRESS_WATCH_DEPRECATED: u32 = iow(
        nr::DBG_ADDRESS_WATCH_DEPRECATED,
        size_of::<DbgAddressWatchArgs>(),
    );
    pub const DBG_WAVE_CONTROL_DEPRECATED: u32 = iow(
        nr::DBG_WAVE_CONTROL_DEPRECATED,
        size_of::<DbgWaveControlArgs>(),
    );
    pub const SET_SCRATCH_BACKING_VA: u32 = iowr(
        nr::SET_SCRATCH_BACKING_VA,
        size_of::<SetScratchBackingVaArgs>(),
    );
    pub const GET_TILE_CONFIG: u32 = iowr(nr::GET_TILE_CONFIG, size_of::<GetTileConfigArgs>());
    pub const SET_TRAP_HANDLER: u32 = iow(nr::SET_TRAP_HANDLER, size_of::<SetTrapHandlerArgs>());
    pub const GET_PROCESS_APERTURES_NEW: u32 = iowr(
        nr::GET_PROCESS_APERTURES_NEW,
        size_of::<GetProcessAperturesNewArgs>(),
    );
    pub const ACQUIRE_VM: u32 = iow(nr::ACQUIRE_VM, size_of::<AcquireVmArgs>());
    pub const ALLOC_MEMORY_OF_GPU: u32 =
        iowr(nr::ALLOC_MEMORY_OF_GPU, size_of::<AllocMemoryOfGpuArgs>());
    pub const FREE_MEMORY_OF_GPU: u32 =
        iow(nr::FREE_MEMORY_OF_GPU, size_of::<FreeMemoryOfGpuArgs>());
    pub const MAP_MEMORY_TO_GPU: u32 = iowr(nr::MAP_MEMORY_TO_GPU, size_of::<MapMemoryToGpuArgs>());
    pub const UNMAP_MEMORY_FROM_GPU: u32 = iowr(
        nr::UNMAP_MEMORY_FROM_GPU,
        size_of::<UnmapMemoryFromGpuArgs>(),
    );
    pub const SET_CU_MASK: u32 = iow(nr::SET_CU_MASK, size_of::<SetCuMaskArgs>());
    pub const GET_QUEUE_WAVE_STATE: u32 =
        iowr(nr::GET_QUEUE_WAVE_STATE, size_of::<GetQueueWaveStateArgs>());
    pub const GET_DMABUF_INFO: u32 = iowr(nr::GET_DMABUF_INFO, size_of::<GetDmabufInfoArgs>());
    pub const IMPORT_DMABUF: u32 = iowr(nr::IMPORT_DMABUF, size_of::<ImportDmabufArgs>());
    pub const ALLOC_QUEUE_GWS: u32 = iowr(nr::ALLOC_QUEUE_GWS, size_of::<AllocQueueGwsArgs>());
    pub const SMI_EVENTS: u32 = iowr(nr::SMI_EVENTS, size_of::<SmiEventsArgs>());
    pub const SVM: u32 = iowr(nr::SVM, size_of::<SvmArgs>());
    pub const SET_XNACK_MODE: u32 = iowr(nr::SET_XNACK_MODE, size_of::<SetXnackModeArgs>());
    pub const CRIU_OP: u32 = iowr(nr::CRIU_OP, size_of::<CriuArgs>());
    pub const AVAILABLE_MEMORY: u32 =
        iowr(nr::AVAILABLE_MEMORY, size_of::<GetAvailableMemoryArgs>());
    pub const EXPORT_DMABUF: u32 = iowr(nr::EXPORT_DMABUF, size_of::<ExportDmabufArgs>());
    pub const RUNTIME_ENABLE: u32 = iowr(nr::RUNTIME_ENABLE, size_of::<RuntimeEnableArgs>());
    pub const DBG_TRAP: u32 = iowr(nr::DBG_TRAP, size_of::<DbgTrapArgs>());
    pub const CREATE_PROCESS: u32 = io(nr::CREATE_PROCESS);
}
