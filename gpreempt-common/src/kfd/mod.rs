//! The KFD (/dev/kfd) ioctl ABI as typed Rust: numbers, layouts, op codes, masks.
//!
//! Sources: `include/uapi/linux/kfd_ioctl.h` (upstream, up to KFD 1.18, plus the DKMS-only range) as
//! summarised in docs/kfd.md. `tests/kfd_header.rs` checks every struct, offset and command
//! that the installed header (linux-libc-dev, KFD 1.11) has against these definitions.
//!
//! Payload packing in [`DbgTrapArgs`] assumes a little-endian target (x86-64, arm64, bpfel).

// ---------------------------------------------------------------------------------------------
// ioctl encoding (asm-generic/ioctl.h)

pub const IOC_NONE: u32 = 0;
pub const IOC_WRITE: u32 = 1;
pub const IOC_READ: u32 = 2;
const IOC_NRBITS: u32 = 8;
const IOC_TYPEBITS: u32 = 8;
const IOC_SIZEBITS: u32 = 14;
const IOC_TYPESHIFT: u32 = IOC_NRBITS;
const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;

pub const fn ioc(dir: u32, ty: u32, nr: u32, size: u32) -> u32 {
    (dir << IOC_DIRSHIFT) | (size << IOC_SIZESHIFT) | (ty << IOC_TYPESHIFT) | nr
}
pub const fn ioc_nr(cmd: u32) -> u32 {
    cmd & ((1 << IOC_NRBITS) - 1)
}
pub const fn ioc_type(cmd: u32) -> u32 {
    (cmd >> IOC_TYPESHIFT) & ((1 << IOC_TYPEBITS) - 1)
}
pub const fn ioc_size(cmd: u32) -> u32 {
    (cmd >> IOC_SIZESHIFT) & ((1 << IOC_SIZEBITS) - 1)
}
pub const fn ioc_dir(cmd: u32) -> u32 {
    cmd >> IOC_DIRSHIFT
}

pub const AMDKFD_IOCTL_BASE: u32 = b'K' as u32;
pub const fn io(nr: u32) -> u32 {
    ioc(IOC_NONE, AMDKFD_IOCTL_BASE, nr, 0)
}
pub const fn ior(nr: u32, size: usize) -> u32 {
    ioc(IOC_READ, AMDKFD_IOCTL_BASE, nr, size as u32)
}
pub const fn iow(nr: u32, size: usize) -> u32 {
    ioc(IOC_WRITE, AMDKFD_IOCTL_BASE, nr, size as u32)
}
pub const fn iowr(nr: u32, size: usize) -> u32 {
    ioc(IOC_READ | IOC_WRITE, AMDKFD_IOCTL_BASE, nr, size as u32)
}

/// Upstream nr range `[START, END)`. END covers CREATE_PROCESS (0x27, KFD 1.19) and PROFILER (0x28).
pub const AMDKFD_COMMAND_START: u32 = 0x01;
pub const AMDKFD_COMMAND_END: u32 = 0x29;
/// END of an upstream KFD 1.18 kernel (through DBG_TRAP, 0x26).
pub const AMDKFD_COMMAND_END_V1_18: u32 = 0x27;
/// DKMS-only range `[START_2, END_2)`.
pub const AMDKFD_COMMAND_START_2: u32 = 0x80;
pub const AMDKFD_COMMAND_END_2: u32 = 0x87;

/// The kernel dispatches on `_IOC_NR` alone (docs/kfd.md): this is the whole KFD filter.
pub const fn is_kfd_nr(nr: u32) -> bool {
    (nr >= AMDKFD_COMMAND_START && nr < AMDKFD_COMMAND_END)
        || (nr >= AMDKFD_COMMAND_START_2 && nr < AMDKFD_COMMAND_END_2)
}

// ---------------------------------------------------------------------------------------------
// Argument structs

macro_rules! abi_struct {
    ($(#[$m:meta])* $name:ident = $cname:literal, $size:literal {
        $($(#[$fm:meta])* $f:ident : $t:ty),* $(,)?
    }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }
        const _: () = assert!(core::mem::size_of::<$name>() == $size);
        // No implicit padding: every byte belongs to a field, so the byte views below are sound.
        const _: () = assert!(0 $(+ core::mem::size_of::<$t>())* == $size);
        impl $name {
            /// Reads the struct from the front of `bytes`; a short buffer leaves the tail zero, as the
            /// kernel zero-fills an argument struct copied in with a smaller `_IOC_SIZE`.
            pub fn from_bytes(bytes: &[u8]) -> Self {
                let mut v = Self::default();
                let n = bytes.len().min($size);
                // SAFETY: `v` is $size bytes of integers (no padding, asserted above), any byte
                // pattern is a valid value, and n <= $size.
                unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut v as *mut Self).cast::<u8>(), n) };
                v
            }
            /// The struct's bytes, as the kernel copies them to user space.
            pub fn as_bytes(&self) -> &[u8] {
                // SAFETY: integers only, no padding (asserted above): all $size bytes are initialised.
                unsafe { core::slice::from_raw_parts((self as *const Self).cast::<u8>(), $size) }
            }
            /// The C struct's name in kfd_ioctl.h.
            pub const C_NAME: &'static str = $cname;
            /// (field, byte offset) in declaration order; `_`-prefixed fields are Rust-only padding.
            pub const FIELDS: &'static [(&'static str, usize)] =
                &[$((stringify!($f), core::mem::offset_of!($name, $f))),*];
        }
    };
}

abi_struct!(GetVersionArgs = "kfd_ioctl_get_version_args", 8 {
    major_version: u32, minor_version: u32,
});
abi_struct!(
    /// The 96-byte form (KFD 1.17+). Before 1.17 the struct ended after `ctl_stack_size` (88 bytes);
    /// the kernel accepts both and zero-fills the missing tail.
    CreateQueueArgs = "kfd_ioctl_create_queue_args", 96 {
    ring_base_address: u64,
    write_pointer_address: u64,
    read_pointer_address: u64,
    /// Output.
    doorbell_offset: u64,
    ring_size: u32,
    gpu_id: u32,
    queue_type: u32,
    /// Bits 0-7 percent, bits 8-15 pm4_target_xcc (newer kernels).
    queue_percentage: u32,
    queue_priority: u32,
    /// Output.
    queue_id: u32,
    eop_buffer_address: u64,
    eop_buffer_size: u64,
    ctx_save_restore_address: u64,
    ctx_save_restore_size: u32,
    ctl_stack_size: u32,
    /// KFD 1.17+.
    sdma_engine_id: u32,
    pad: u32,
});
/// Size of `kfd_ioctl_create_queue_args` before KFD 1.17.
pub const CREATE_QUEUE_ARGS_SIZE_V1: usize = 88;

abi_struct!(DestroyQueueArgs = "kfd_ioctl_destroy_queue_args", 8 { queue_id: u32, pad: u32 });
abi_struct!(UpdateQueueArgs = "kfd_ioctl_update_queue_args", 24 {
    ring_base_address: u64, queue_id: u32, ring_size: u32, queue_percentage: u32, queue_priority: u32,
});
abi_struct!(SetCuMaskArgs = "kfd_ioctl_set_cu_mask_args", 16 {
    queue_id: u32, num_cu_mask: u32, cu_mask_ptr: u64,
});
abi_struct!(GetQueueWaveStateArgs = "kfd_ioctl_get_queue_wave_state_args", 24 {
    ctl_stack_address: u64, ctl_stack_used_size: u32, save_area_used_size: u32, queue_id: u32, pad: u32,
});
abi_struct!(GetAvailableMemoryArgs = "kfd_ioctl_get_available_memory_args", 16 {
    available: u64, gpu_id: u32, pad: u32,
});
abi_struct!(
    /// `pad` became `misc_process_flag` in KFD 1.18.
    SetMemoryPolicyArgs = "kfd_ioctl_set_memory_policy_args", 32 {
    alternate_aperture_base: u64, alternate_aperture_size: u64, gpu_id: u32, default_policy: u32,
    alternate_policy: u32, pad: u32,
});
abi_struct!(GetClockCountersArgs = "kfd_ioctl_get_clock_counters_args", 40 {
    gpu_clock_counter: u64, cpu_clock_counter: u64, system_clock_counter: u64, system_clock_freq: u64,
    gpu_id: u32, pad: u32,
});
abi_struct!(ProcessDeviceApertures = "kfd_process_device_apertures", 56 {
    lds_base: u64, lds_limit: u64, scratch_base: u64, scratch_limit: u64, gpuvm_base: u64,
    gpuvm_limit: u64, gpu_id: u32, pad: u32,
});
pub const NUM_OF_SUPPORTED_GPUS: usize = 7;
abi_struct!(GetProcessAperturesArgs = "kfd_ioctl_get_process_apertures_args", 400 {
    process_apertures: [ProcessDeviceApertures; NUM_OF_SUPPORTED_GPUS], num_of_nodes: u32, pad: u32,
});
abi_struct!(GetProcessAperturesNewArgs = "kfd_ioctl_get_process_apertures_new_args", 16 {
    kfd_process_device_apertures_ptr: u64, num_of_nodes: u32, pad: u32,
});
abi_struct!(DbgRegisterArgs = "kfd_ioctl_dbg_register_args", 8 { gpu_id: u32, pad: u32 });
abi_struct!(DbgUnregisterArgs = "kfd_ioctl_dbg_unregister_args", 8 { gpu_id: u32, pad: u32 });
abi_struct!(DbgAddressWatchArgs = "kfd_ioctl_dbg_address_watch_args", 16 {
    content_ptr: u64, gpu_id: u32, buf_size_in_bytes: u32,
});
abi_struct!(DbgWaveControlArgs = "kfd_ioctl_dbg_wave_control_args", 16 {
    content_ptr: u64, gpu_id: u32, buf_size_in_bytes: u32,
});
abi_struct!(CreateEventArgs = "kfd_ioctl_create_event_args", 32 {
    event_page_offset: u64, event_trigger_data: u32, event_type: u32, auto_reset: u32, node_id: u32,
    event_id: u32, event_slot_index: u32,
});
abi_struct!(DestroyEventArgs = "kfd_ioctl_destroy_event_args", 8 { event_id: u32, pad: u32 });
abi_struct!(SetEventArgs = "kfd_ioctl_set_event_args", 8 { event_id: u32, pad: u32 });
abi_struct!(ResetEventArgs = "kfd_ioctl_reset_event_args", 8 { event_id: u32, pad: u32 });
abi_struct!(
    #[allow(non_snake_case)]
    MemoryExceptionFailure = "kfd_memory_exception_failure", 16 {
    NotPresent: u32, ReadOnly: u32, NoExecute: u32, imprecise: u32,
});
abi_struct!(
    #[allow(non_snake_case)]
    HsaMemoryExceptionData = "kfd_hsa_memory_exception_data", 32 {
    failure: MemoryExceptionFailure, va: u64, gpu_id: u32, ErrorType: u32,
});
abi_struct!(HsaHwExceptionData = "kfd_hsa_hw_exception_data", 16 {
    reset_type: u32, reset_cause: u32, memory_lost: u32, gpu_id: u32,
});
abi_struct!(
    /// The C union of memory/hw exception data is represented by its larger member.
    EventData = "kfd_event_data", 48 {
    memory_exception_data: HsaMemoryExceptionData, kfd_event_data_ext: u64, event_id: u32, pad: u32,
});
abi_struct!(WaitEventsArgs = "kfd_ioctl_wait_events_args", 24 {
    events_ptr: u64, num_events: u32, wait_for_all: u32, timeout: u32, wait_result: u32,
});
abi_struct!(SetScratchBackingVaArgs = "kfd_ioctl_set_scratch_backing_va_args", 16 {
    va_addr: u64, gpu_id: u32, pad: u32,
});
abi_struct!(GetTileConfigArgs = "kfd_ioctl_get_tile_config_args", 40 {
    tile_config_ptr: u64, macro_tile_config_ptr: u64, num_tile_configs: u32, num_macro_tile_configs: u32,
    gpu_id: u32, gb_addr_config: u32, num_banks: u32, num_ranks: u32,
});
abi_struct!(SetTrapHandlerArgs = "kfd_ioctl_set_trap_handler_args", 24 {
    tba_addr: u64, tma_addr: u64, gpu_id: u32, pad: u32,
});
abi_struct!(AcquireVmArgs = "kfd_ioctl_acquire_vm_args", 8 { drm_fd: u32, gpu_id: u32 });
abi_struct!(AllocMemoryOfGpuArgs = "kfd_ioctl_alloc_memory_of_gpu_args", 40 {
    va_addr: u64, size: u64, handle: u64, mmap_offset: u64, gpu_id: u32, flags: u32,
});
abi_struct!(FreeMemoryOfGpuArgs = "kfd_ioctl_free_memory_of_gpu_args", 8 { handle: u64 });
abi_struct!(MapMemoryToGpuArgs = "kfd_ioctl_map_memory_to_gpu_args", 24 {
    handle: u64, device_ids_array_ptr: u64, n_devices: u32, n_success: u32,
});
abi_struct!(UnmapMemoryFromGpuArgs = "kfd_ioctl_unmap_memory_from_gpu_args", 24 {
    handle: u64, device_ids_array_ptr: u64, n_devices: u32, n_success: u32,
});
abi_struct!(AllocQueueGwsArgs = "kfd_ioctl_alloc_queue_gws_args", 16 {
    queue_id: u32, num_gws: u32, first_gws: u32, pad: u32,
});
abi_struct!(GetDmabufInfoArgs = "kfd_ioctl_get_dmabuf_info_args", 32 {
    size: u64, metadata_ptr: u64, metadata_size: u32, gpu_id: u32, flags: u32, dmabuf_fd: u32,
});
abi_struct!(ImportDmabufArgs = "kfd_ioctl_import_dmabuf_args", 24 {
    va_addr: u64, handle: u64, gpu_id: u32, dmabuf_fd: u32,
});
abi_struct!(SmiEventsArgs = "kfd_ioctl_smi_events_args", 8 { gpuid: u32, anon_fd: u32 });
abi_struct!(CriuArgs = "kfd_ioctl_criu_args", 56 {
    devices: u64, bos: u64, priv_data: u64, priv_data_size: u64, num_devices: u32, num_bos: u32,
    num_objects: u32, pid: u32, op: u32, _pad: u32,
});
abi_struct!(CriuDeviceBucket = "kfd_criu_device_bucket", 16 {
    user_gpu_id: u32, actual_gpu_id: u32, drm_fd: u32, pad: u32,
});
abi_struct!(CriuBoBucket = "kfd_criu_bo_bucket", 48 {
    addr: u64, size: u64, offset: u64, restored_offset: u64, gpu_id: u32, alloc_flags: u32,
    dmabuf_fd: u32, pad: u32,
});
abi_struct!(SvmAttribute = "kfd_ioctl_svm_attribute", 8 { r#type: u32, value: u32 });
abi_struct!(
    /// Fixed part; `attrs[nattr]` (SvmAttribute) follows in memory.
    SvmArgs = "kfd_ioctl_svm_args", 24 {
    start_addr: u64, size: u64, op: u32, nattr: u32,
});
abi_struct!(SetXnackModeArgs = "kfd_ioctl_set_xnack_mode_args", 4 { xnack_enabled: i32 });
abi_struct!(
    /// KFD 1.12+.
    ExportDmabufArgs = "kfd_ioctl_export_dmabuf_args", 16 { handle: u64, gpu_id: u32, flags: u32 });
abi_struct!(
    /// KFD 1.13+.
    RuntimeEnableArgs = "kfd_ioctl_runtime_enable_args", 16 {
    r_debug: u64, mode_mask: u32, capabilities_mask: u32,
});
abi_struct!(
    /// `struct kfd_runtime_info`, returned by DBG_TRAP ENABLE through `rinfo_ptr`.
    RuntimeInfo = "kfd_runtime_info", 16 { r_debug: u64, runtime_state: u32, ttmp_setup: u32 });
abi_struct!(
    /// GET_QUEUE_SNAPSHOT entry.
    QueueSnapshotEntry = "kfd_queue_snapshot_entry", 64 {
    exception_status: u64, ring_base_address: u64, write_pointer_address: u64,
    read_pointer_address: u64, ctx_save_restore_address: u64, queue_id: u32, gpu_id: u32,
    ring_size: u32, queue_type: u32, ctx_save_restore_area_size: u32, reserved: u32,
});
abi_struct!(
    /// Written by the kernel at the start of a suspended queue's ctx-save area.
    ContextSaveAreaHeader = "kfd_context_save_area_header", 40 {
    control_stack_offset: u32, control_stack_size: u32, wave_state_offset: u32, wave_state_size: u32,
    debug_offset: u32, debug_size: u32, err_payload_addr: u64, err_event_id: u32, reserved1: u32,
});
abi_struct!(
    /// GET_DEVICE_SNAPSHOT entry.
    DbgDeviceInfoEntry = "kfd_dbg_device_info_entry", 120 {
    exception_status: u64, lds_base: u64, lds_limit: u64, scratch_base: u64, scratch_limit: u64,
    gpuvm_base: u64, gpuvm_limit: u64, gpu_id: u32, location_id: u32, vendor_id: u32, device_id: u32,
    revision_id: u32, subsystem_vendor_id: u32, subsystem_device_id: u32, fw_version: u32,
    gfx_target_version: u32, simd_count: u32, max_waves_per_simd: u32, array_count: u32,
    simd_arrays_per_engine: u32, num_xcc: u32, capability: u32, debug_prop: u32,
});

// ---------------------------------------------------------------------------------------------
// DBG_TRAP (KFD 1.13+)

abi_struct!(
    /// `kfd_ioctl_dbg_trap_args`: pid, op, and a 24-byte union of per-op payloads (8-aligned).
    DbgTrapArgs = "kfd_ioctl_dbg_trap_args", 32 { pid: u32, op: u32, data: [u64; 3] });

/// A DBG_TRAP op's payload: packs into / unpacks from the union, field by field.
pub trait DbgTrapPayload: Sized {
    const OP: u32;
    fn pack(&self) -> [u64; 3];
    fn unpack(d: &[u64; 3]) -> Self;
}

const fn lo(v: u64) -> u32 {
    v as u32
}
const fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}
const fn pair(lo: u32, hi: u32) -> u64 {
    (lo as u64) | ((hi as u64) << 32)
}

impl DbgTrapArgs {
    pub fn new<P: DbgTrapPayload>(pid: u32, payload: P) -> Self {
        Self {
            pid,
            op: P::OP,
            data: payload.pack(),
        }
    }
    /// Payload-less ops (DISABLE).
    pub fn bare(pid: u32, op: u32) -> Self {
        Self {
            pid,
            op,
            data: [0; 3],
        }
    }
    /// The union read as `P` (whatever `op` says).
    pub fn payload<P: DbgTrapPayload>(&self) -> P {
        P::unpack(&self.data)
    }
}

/// Declares a payload struct and its packing: each u64 word is either one u64 field or two u32s.
macro_rules! dbg_payload {
    ($(#[$m:meta])* $name:ident = $cname:literal, $op:expr, $size:literal {
        $($w:tt)*
    }) => {
        dbg_payload!(@struct $(#[$m])* $name = $cname, $size, [] $($w)*);
        impl DbgTrapPayload for $name {
            const OP: u32 = $op;
            fn pack(&self) -> [u64; 3] {
                let mut d = [0u64; 3];
                dbg_payload!(@pack self d 0usize, $($w)*);
                d
            }
            fn unpack(d: &[u64; 3]) -> Self {
                let mut s = Self::default();
                dbg_payload!(@unpack s d 0usize, $($w)*);
                s
            }
        }
    };
    (@struct $(#[$m:meta])* $name:ident = $cname:literal, $size:literal, [$($acc:tt)*] ($a:ident : u64) $($rest:tt)*) => {
        dbg_payload!(@struct $(#[$m])* $name = $cname, $size, [$($acc)* $a: u64,] $($rest)*);
    };
    (@struct $(#[$m:meta])* $name:ident = $cname:literal, $size:literal, [$($acc:tt)*] ($a:ident, $b:ident) $($rest:tt)*) => {
        dbg_payload!(@struct $(#[$m])* $name = $cname, $size, [$($acc)* $a: u32, $b: u32,] $($rest)*);
    };
    (@struct $(#[$m:meta])* $name:ident = $cname:literal, $size:literal, [$($acc:tt)*]) => {
        abi_struct!($(#[$m])* $name = $cname, $size { $($acc)* });
    };
    (@pack $s:ident $d:ident $i:expr, ($a:ident : u64) $($rest:tt)*) => {
        $d[$i] = $s.$a; dbg_payload!(@pack $s $d $i + 1, $($rest)*);
    };
    (@pack $s:ident $d:ident $i:expr, ($a:ident, $b:ident) $($rest:tt)*) => {
        $d[$i] = pair($s.$a, $s.$b); dbg_payload!(@pack $s $d $i + 1, $($rest)*);
    };
    (@pack $s:ident $d:ident $i:expr,) => {};
    (@unpack $s:ident $d:ident $i:expr, ($a:ident : u64) $($rest:tt)*) => {
        $s.$a = $d[$i]; dbg_payload!(@unpack $s $d $i + 1, $($rest)*);
    };
    (@unpack $s:ident $d:ident $i:expr, ($a:ident, $b:ident) $($rest:tt)*) => {
        $s.$a = lo($d[$i]); $s.$b = hi($d[$i]); dbg_payload!(@unpack $s $d $i + 1, $($rest)*);
    };
    (@unpack $s:ident $d:ident $i:expr,) => {};
}

dbg_payload!(DbgTrapEnableArgs = "kfd_ioctl_dbg_trap_enable_args", dbg_op::ENABLE, 24 {
    (exception_mask: u64) (rinfo_ptr: u64) (rinfo_size, dbg_fd)
});
dbg_payload!(DbgTrapSendRuntimeEventArgs = "kfd_ioctl_dbg_trap_send_runtime_event_args", dbg_op::SEND_RUNTIME_EVENT, 16 {
    (exception_mask: u64) (gpu_id, queue_id)
});
dbg_payload!(DbgTrapSetExceptionsEnabledArgs = "kfd_ioctl_dbg_trap_set_exceptions_enabled_args", dbg_op::SET_EXCEPTIONS_ENABLED, 8 {
    (exception_mask: u64)
});
dbg_payload!(DbgTrapSetWaveLaunchOverrideArgs = "kfd_ioctl_dbg_trap_set_wave_launch_override_args", dbg_op::SET_WAVE_LAUNCH_OVERRIDE, 16 {
    (override_mode, enable_mask) (support_request_mask, pad)
});
dbg_payload!(DbgTrapSetWaveLaunchModeArgs = "kfd_ioctl_dbg_trap_set_wave_launch_mode_args", dbg_op::SET_WAVE_LAUNCH_MODE, 8 {
    (launch_mode, pad)
});
dbg_payload!(DbgTrapSuspendQueuesArgs = "kfd_ioctl_dbg_trap_suspend_queues_args", dbg_op::SUSPEND_QUEUES, 24 {
    (exception_mask: u64) (queue_array_ptr: u64) (num_queues, grace_period)
});
dbg_payload!(DbgTrapResumeQueuesArgs = "kfd_ioctl_dbg_trap_resume_queues_args", dbg_op::RESUME_QUEUES, 16 {
    (queue_array_ptr: u64) (num_queues, pad)
});
dbg_payload!(DbgTrapSetNodeAddressWatchArgs = "kfd_ioctl_dbg_trap_set_node_address_watch_args", dbg_op::SET_NODE_ADDRESS_WATCH, 24 {
    (address: u64) (mode, mask) (gpu_id, id)
});
dbg_payload!(DbgTrapClearNodeAddressWatchArgs = "kfd_ioctl_dbg_trap_clear_node_address_watch_args", dbg_op::CLEAR_NODE_ADDRESS_WATCH, 8 {
    (gpu_id, id)
});
dbg_payload!(DbgTrapSetFlagsArgs = "kfd_ioctl_dbg_trap_set_flags_args", dbg_op::SET_FLAGS, 8 {
    (flags, pad)
});
dbg_payload!(DbgTrapQueryDebugEventArgs = "kfd_ioctl_dbg_trap_query_debug_event_args", dbg_op::QUERY_DEBUG_EVENT, 16 {
    (exception_mask: u64) (gpu_id, queue_id)
});
dbg_payload!(DbgTrapQueryExceptionInfoArgs = "kfd_ioctl_dbg_trap_query_exception_info_args", dbg_op::QUERY_EXCEPTION_INFO, 24 {
    (info_ptr: u64) (info_size, source_id) (exception_code, clear_exception)
});
dbg_payload!(DbgTrapQueueSnapshotArgs = "kfd_ioctl_dbg_trap_queue_snapshot_args", dbg_op::GET_QUEUE_SNAPSHOT, 24 {
    (exception_mask: u64) (snapshot_buf_ptr: u64) (num_queues, entry_size)
});
dbg_payload!(DbgTrapDeviceSnapshotArgs = "kfd_ioctl_dbg_trap_device_snapshot_args", dbg_op::GET_DEVICE_SNAPSHOT, 24 {
    (exception_mask: u64) (snapshot_buf_ptr: u64) (num_devices, entry_size)
});

/// `enum kfd_dbg_trap_operations`.
pub mod dbg_op {
    pub const ENABLE: u32 = 0;
    pub const DISABLE: u32 = 1;
    pub const SEND_RUNTIME_EVENT: u32 = 2;
    pub const SET_EXCEPTIONS_ENABLED: u32 = 3;
    pub const SET_WAVE_LAUNCH_OVERRIDE: u32 = 4;
    pub const SET_WAVE_LAUNCH_MODE: u32 = 5;
    pub const SUSPEND_QUEUES: u32 = 6;
    pub const RESUME_QUEUES: u32 = 7;
    pub const SET_NODE_ADDRESS_WATCH: u32 = 8;
    pub const CLEAR_NODE_ADDRESS_WATCH: u32 = 9;
    pub const SET_FLAGS: u32 = 10;
    pub const QUERY_DEBUG_EVENT: u32 = 11;
    pub const QUERY_EXCEPTION_INFO: u32 = 12;
    pub const GET_QUEUE_SNAPSHOT: u32 = 13;
    pub const GET_DEVICE_SNAPSHOT: u32 = 14;
}

const DBG_OP_NAMES: [&str; 15] = [
    "enable",
    "disable",
    "send_runtime_event",
    "set_exceptions_enabled",
    "set_wave_launch_override",
    "set_wave_launch_mode",
    "suspend_queues",
    "resume_queues",
    "set_node_address_watch",
    "clear_node_address_watch",
    "set_flags",
    "query_debug_event",
    "query_exception_info",
    "get_queue_snapshot",
    "get_device_snapshot",
];

/// snake_case name of a DBG_TRAP op.
pub const fn dbg_op_name(op: u32) -> Option<&'static str> {
    if (op as usize) < DBG_OP_NAMES.len() {
        Some(DBG_OP_NAMES[op as usize])
    } else {
        None
    }
}

/// Exception codes (`enum kfd_dbg_trap_exception_code`); masks are `ec_mask(code)`.
pub mod ec {
    pub const NONE: u32 = 0;
    pub const QUEUE_WAVE_ABORT: u32 = 1;
    pub const QUEUE_WAVE_TRAP: u32 = 2;
    pub const QUEUE_WAVE_MATH_ERROR: u32 = 3;
    pub const QUEUE_WAVE_ILLEGAL_INSTRUCTION: u32 = 4;
    pub const QUEUE_WAVE_MEMORY_VIOLATION: u32 = 5;
    pub const QUEUE_WAVE_APERTURE_VIOLATION: u32 = 6;
    pub const QUEUE_PACKET_DISPATCH_DIM_INVALID: u32 = 16;
    pub const QUEUE_PACKET_DISPATCH_GROUP_SEGMENT_SIZE_INVALID: u32 = 17;
    pub const QUEUE_PACKET_DISPATCH_CODE_INVALID: u32 = 18;
    pub const QUEUE_PACKET_RESERVED: u32 = 19;
    pub const QUEUE_PACKET_UNSUPPORTED: u32 = 20;
    pub const QUEUE_PACKET_DISPATCH_WORK_GROUP_SIZE_INVALID: u32 = 21;
    pub const QUEUE_PACKET_DISPATCH_REGISTER_INVALID: u32 = 22;
    pub const QUEUE_PACKET_VENDOR_UNSUPPORTED: u32 = 23;
    pub const QUEUE_PREEMPTION_ERROR: u32 = 30;
    pub const QUEUE_NEW: u32 = 31;
    pub const DEVICE_QUEUE_DELETE: u32 = 32;
    pub const DEVICE_MEMORY_VIOLATION: u32 = 33;
    pub const DEVICE_RAS_ERROR: u32 = 34;
    pub const DEVICE_FATAL_HALT: u32 = 35;
    pub const DEVICE_NEW: u32 = 36;
    pub const PROCESS_RUNTIME: u32 = 48;
    pub const PROCESS_DEVICE_REMOVE: u32 = 49;
    pub const MAX: u32 = 50;
}

/// `KFD_EC_MASK(ec)`.
pub const fn ec_mask(code: u32) -> u64 {
    1u64 << (code - 1)
}
const fn ec_range(first: u32, last: u32) -> u64 {
    let mut m = 0;
    let mut c = first;
    while c <= last {
        m |= ec_mask(c);
        c += 1;
    }
    m
}
pub const EC_MASK_QUEUE: u64 = ec_range(ec::QUEUE_WAVE_ABORT, ec::QUEUE_WAVE_APERTURE_VIOLATION)
    | ec_range(
        ec::QUEUE_PACKET_DISPATCH_DIM_INVALID,
        ec::QUEUE_PACKET_VENDOR_UNSUPPORTED,
    )
    | ec_mask(ec::QUEUE_PREEMPTION_ERROR)
    | ec_mask(ec::QUEUE_NEW);
pub const EC_MASK_DEVICE: u64 = ec_range(ec::DEVICE_QUEUE_DELETE, ec::DEVICE_NEW);
pub const EC_MASK_PROCESS: u64 = ec_range(ec::PROCESS_RUNTIME, ec::PROCESS_DEVICE_REMOVE);

/// Per-queue status bits ORed into each u32 of SUSPEND/RESUME_QUEUES' queue array.
pub const KFD_DBG_QUEUE_ERROR_BIT: u32 = 30;
pub const KFD_DBG_QUEUE_INVALID_BIT: u32 = 31;
pub const KFD_DBG_QUEUE_ERROR_MASK: u32 = 1 << KFD_DBG_QUEUE_ERROR_BIT;
pub const KFD_DBG_QUEUE_INVALID_MASK: u32 = 1 << KFD_DBG_QUEUE_INVALID_BIT;

/// `grace_period` meaning "the kernel's default" (units: 1K GPU clocks).
pub const USE_DEFAULT_GRACE_PERIOD: u32 = 0xFFFF_FFFF;

/// `enum kfd_dbg_runtime_state`.
pub mod runtime_state {
    pub const DISABLED: u32 = 0;
    pub const ENABLED: u32 = 1;
    pub const ENABLED_BUSY: u32 = 2;
    pub const ENABLED_ERROR: u32 = 3;
}
pub const KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK: u32 = 1;
pub const KFD_RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK: u32 = 2;

/// Wave launch modes, override modes, flags and address-watch modes of the debug API.
pub mod dbg {
    pub const WAVE_LAUNCH_MODE_NORMAL: u32 = 0;
    pub const WAVE_LAUNCH_MODE_HALT: u32 = 1;
    pub const WAVE_LAUNCH_MODE_DEBUG: u32 = 3;
    pub const LAUNCH_OVERRIDE_OR: u32 = 0;
    pub const LAUNCH_OVERRIDE_REPLACE: u32 = 1;
    pub const FLAG_SINGLE_MEM_OP: u32 = 1;
    pub const FLAG_SINGLE_ALU_OP: u32 = 2;
    pub const ADDRESS_WATCH_MODE_READ: u32 = 0;
    pub const ADDRESS_WATCH_MODE_NONREAD: u32 = 1;
    pub const ADDRESS_WATCH_MODE_ATOMIC: u32 = 2;
    pub const ADDRESS_WATCH_MODE_ALL: u32 = 3;
    pub const MAX_WATCH_ADDRESSES: u32 = 4;
}

// ---------------------------------------------------------------------------------------------
// Other constants

/// `KFD_IOC_QUEUE_TYPE_*` (the ioctl's values, not the kernel's internal enum).
pub mod queue_type {
    pub const COMPUTE: u32 = 0;
    pub const SDMA: u32 = 1;
    pub const COMPUTE_AQL: u32 = 2;
    pub const SDMA_XGMI: u32 = 3;
    /// KFD 1.17+.
    pub const SDMA_BY_ENG_ID: u32 = 4;
}

pub const fn queue_type_name(t: u32) -> Option<&'static str> {
    match t {
        queue_type::COMPUTE => Some("compute"),
        queue_type::SDMA => Some("sdma"),
        queue_type::COMPUTE_AQL => Some("compute_aql"),
        queue_type::SDMA_XGMI => Some("sdma_xgmi"),
        queue_type::SDMA_BY_ENG_ID => Some("sdma_by_eng_id"),
        _ => None,
    }
}

/// Debug bits of a topology node's `capability` (`HSA_CAP_*`, include/uapi/linux/kfd_sysfs.h,
/// Linux 6.4+).
pub mod hsa_cap {
    /// `HSA_CAP_DOORBELL_TYPE_2_0 << HSA_CAP_DOORBELL_TYPE_TOTALBITS_SHIFT` (12): the doorbell
    /// type every SOC15 GPU reports (`kfd_topology_set_capabilities`, kfd_topology.c).
    pub const DOORBELL_TYPE_2_0: u32 = 0x2 << 12;
    pub const TRAP_DEBUG_SUPPORT: u32 = 0x0000_8000;
    pub const TRAP_DEBUG_WAVE_LAUNCH_TRAP_OVERRIDE_SUPPORTED: u32 = 0x0001_0000;
    pub const TRAP_DEBUG_WAVE_LAUNCH_MODE_SUPPORTED: u32 = 0x0002_0000;
    pub const TRAP_DEBUG_PRECISE_MEMORY_OPERATIONS_SUPPORTED: u32 = 0x0004_0000;
    pub const TRAP_DEBUG_FIRMWARE_SUPPORTED: u32 = 0x2000_0000;
    /// What `kfd_topology_set_capabilities` sets on every GPU.
    pub const TRAP_DEBUG_ALL_GPUS: u32 = TRAP_DEBUG_SUPPORT
        | TRAP_DEBUG_WAVE_LAUNCH_TRAP_OVERRIDE_SUPPORTED
        | TRAP_DEBUG_WAVE_LAUNCH_MODE_SUPPORTED;
    /// ... and on GC 9.4.2 up to (not including) 10.0 (gfx90a, gfx94x, gfx950), which add precise
    /// memory operations.
    pub const TRAP_DEBUG_GFX9_4_2: u32 =
        TRAP_DEBUG_ALL_GPUS | TRAP_DEBUG_PRECISE_MEMORY_OPERATIONS_SUPPORTED;
}

pub const KFD_MAX_QUEUE_PERCENTAGE: u32 = 100;
pub const KFD_MAX_QUEUE_PRIORITY: u32 = 15;
pub const KFD_MIN_QUEUE_RING_SIZE: u32 = 1024;
pub const KFD_MAX_NUM_OF_QUEUES_PER_PROCESS: u32 = 1024;
pub const KFD_INVALID_FD: u32 = 0xffff_ffff;

/// Bytes of one process's doorbell slice on SOC15 (64-bit doorbells x
/// KFD_MAX_NUM_OF_QUEUES_PER_PROCESS, `kfd_doorbell_process_slice`). CREATE_QUEUE's `doorbell_offset`
/// carries the queue's byte offset inside it; the HQD's DOORBELL_OFFSET (dwords) is absolute.
pub const DOORBELL_PROCESS_SLICE_BYTES: u64 = 8 * KFD_MAX_NUM_OF_QUEUES_PER_PROCESS as u64;

/// mmap offsets returned by CREATE_QUEUE (`doorbell_offset`) and ALLOC_MEMORY_OF_GPU.
pub const KFD_MMAP_TYPE_SHIFT: u32 = 62;
pub const KFD_MMAP_TYPE_DOORBELL: u64 = 3 << KFD_MMAP_TYPE_SHIFT;
pub const KFD_MMAP_TYPE_EVENTS: u64 = 2 << KFD_MMAP_TYPE_SHIFT;
pub const KFD_MMAP_TYPE_RESERVED_MEM: u64 = 1 << KFD_MMAP_TYPE_SHIFT;
pub const KFD_MMAP_TYPE_MMIO: u64 = 0;
pub const KFD_MMAP_GPU_ID_SHIFT: u32 = 46;
pub const KFD_MMAP_GPU_ID_MASK: u64 = ((1u64 << 16) - 1) << KFD_MMAP_GPU_ID_SHIFT;

/// The `doorbell_offset` CREATE_QUEUE returns: type DOORBELL, the gpu_id, and (SOC15) the queue's
/// byte offset inside the process doorbell page.
pub const fn doorbell_mmap_offset(gpu_id: u32, byte_offset_in_page: u64) -> u64 {
    KFD_MMAP_TYPE_DOORBELL | ((gpu_id as u64) << KFD_MMAP_GPU_ID_SHIFT) | byte_offset_in_page
}
/// The gpu_id inside an mmap offset.
pub const fn mmap_offset_gpu_id(offset: u64) -> u32 {
    ((offset & KFD_MMAP_GPU_ID_MASK) >> KFD_MMAP_GPU_ID_SHIFT) as u32
}

/// `KFD_IOC_ALLOC_MEM_FLAGS_*`.
pub mod alloc_mem_flags {
    pub const VRAM: u32 = 1 << 0;
    pub const GTT: u32 = 1 << 1;
    pub const USERPTR: u32 = 1 << 2;
    pub const DOORBELL: u32 = 1 << 3;
    pub const MMIO_REMAP: u32 = 1 << 4;
    pub const WRITABLE: u32 = 1 << 31;
    pub const EXECUTABLE: u32 = 1 << 30;
    pub const PUBLIC: u32 = 1 << 29;
    pub const NO_SUBSTITUTE: u32 = 1 << 28;
    pub const AQL_QUEUE_MEM: u32 = 1 << 27;
    pub const COHERENT: u32 = 1 << 26;
    pub const UNCACHED: u32 = 1 << 25;
}

/// `enum kfd_smi_event`; the subscription mask bit is `1 << (id - 1)`.
pub mod smi_event {
    pub const NONE: u32 = 0;
    pub const VMFAULT: u32 = 1;
    pub const THERMAL_THROTTLE: u32 = 2;
    pub const GPU_PRE_RESET: u32 = 3;
    pub const GPU_POST_RESET: u32 = 4;
    pub const MIGRATE_START: u32 = 5;
    pub const MIGRATE_END: u32 = 6;
    pub const PAGE_FAULT_START: u32 = 7;
    pub const PAGE_FAULT_END: u32 = 8;
    pub const QUEUE_EVICTION: u32 = 9;
    pub const QUEUE_RESTORE: u32 = 10;
    pub const UNMAP_FROM_GPU: u32 = 11;
    pub const ALL_PROCESS: u32 = 64;
    pub const MSG_SIZE: usize = 96;
    pub const fn mask(id: u32) -> u64 {
        1u64 << (id - 1)
    }
}

/// `enum KFD_QUEUE_EVICTION_TRIGGERS`.
pub mod eviction_trigger {
    pub const SVM: u32 = 0;
    pub const USERPTR: u32 = 1;
    pub const TTM: u32 = 2;
    pub const SUSPEND: u32 = 3;
    pub const CRIU_CHECKPOINT: u32 = 4;
    pub const CRIU_RESTORE: u32 = 5;
}

/// `enum kfd_criu_op`.
pub mod criu_op {
    pub const PROCESS_INFO: u32 = 0;
    pub const CHECKPOINT: u32 = 1;
    pub const UNPAUSE: u32 = 2;
    pub const RESTORE: u32 = 3;
    pub const RESUME: u32 = 4;
}

mod table;
pub use table::*;

/// GFX9 HQD register image: what debugfs `hqds` prints per slot (`kgd_gfx_v9_hqd_dump`, 56
/// consecutive registers from mmCP_MQD_BASE_ADDR) and what `mqds` holds from v9_mqd dword 128 on.
/// GFX10+ dump other ranges; these indices are for GFX9 (gfx9xx, incl. MI100/MI200/MI300).
pub mod gfx9_hqd {
    /// `mmCP_MQD_BASE_ADDR`, GC segment 1 (dword register offset).
    pub const CP_MQD_BASE_ADDR: u32 = 0x245;
    /// `HQD_N_REGS`: CP_MQD_BASE_ADDR .. CP_HQD_PQ_WPTR_HI.
    pub const HQD_N_REGS: usize = 56;
    /// v9_mqd dword where the register image starts.
    pub const MQD_REG_DWORD: usize = 128;
    /// v9_mqd size in dwords (one per XCC in `mqds`).
    pub const MQD_DWORDS: usize = 512;
    pub const MQD_BASE_LO: usize = 0;
    pub const MQD_BASE_HI: usize = 1;
    /// Bit 0: the slot holds a mapped queue.
    pub const ACTIVE: usize = 2;
    pub const VMID: usize = 3;
    pub const PERSISTENT_STATE: usize = 4;
    pub const PIPE_PRIORITY: usize = 5;
    pub const QUEUE_PRIORITY: usize = 6;
    pub const QUANTUM: usize = 7;
    /// Ring VA >> 8.
    pub const PQ_BASE: usize = 8;
    pub const PQ_BASE_HI: usize = 9;
    pub const PQ_RPTR: usize = 10;
    /// User VA of the read pointer (= CREATE_QUEUE read_pointer_address).
    pub const PQ_RPTR_REPORT_ADDR: usize = 11;
    pub const PQ_RPTR_REPORT_ADDR_HI: usize = 12;
    /// User VA of the write pointer (= CREATE_QUEUE write_pointer_address).
    pub const PQ_WPTR_POLL_ADDR: usize = 13;
    pub const PQ_WPTR_POLL_ADDR_HI: usize = 14;
    /// Bits 27:2 DOORBELL_OFFSET (dword index in the doorbell BAR), bit 30 DOORBELL_EN.
    pub const PQ_DOORBELL_CONTROL: usize = 15;
    pub const DOORBELL_OFFSET_SHIFT: u32 = 2;
    pub const DOORBELL_OFFSET_MASK: u32 = 0x0fff_fffc;
    /// Low 6 bits: log2(ring size in dwords) - 1.
    pub const PQ_CONTROL: usize = 17;
    pub const EOP_BASE_ADDR: usize = 37;
    pub const EOP_BASE_ADDR_HI: usize = 38;
    pub const EOP_CONTROL: usize = 39;
    pub const CTX_SAVE_BASE_ADDR_LO: usize = 43;
    pub const CTX_SAVE_BASE_ADDR_HI: usize = 44;
    pub const CNTL_STACK_SIZE: usize = 47;
    pub const CTX_SAVE_SIZE: usize = 49;
    pub const AQL_CONTROL: usize = 53;
    /// 64-bit write pointer in dwords (AQL: packet index x 16).
    pub const PQ_WPTR_LO: usize = 54;
    pub const PQ_WPTR_HI: usize = 55;
}

#[cfg(test)]
mod tests;
