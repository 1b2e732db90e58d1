//! Kernel-internal probes on amdkfd (docs/kfd.md): which functions, which programs, and which
//! kernel struct fields they read.
//!
//! Struct layouts are never baked in at build time. User space resolves every [`field`] from
//! `/sys/kernel/btf/vmlinux` and `/sys/kernel/btf/amdgpu` at run time into a [`KernelOffsets`] (map
//! `OFFSETS`); a probe whose fields are not all known is not attached. Version drift (kfd.md §7) is
//! handled by field presence: a moved or renamed member is simply found (or not) where it is now, and
//! function arguments whose position changed between versions are located by parameter name.

/// Fields (struct members, or function parameters located by name) the programs may read.
pub mod field {
    /// `struct queue` . `properties` (embedded `struct queue_properties`).
    pub const QUEUE_PROPERTIES: usize = 0;
    /// `struct queue` . `process` (`struct kfd_process *`).
    pub const QUEUE_PROCESS: usize = 1;
    /// `struct queue` . `device` (`struct kfd_node *`).
    pub const QUEUE_DEVICE: usize = 2;
    /// `struct queue` . `pipe` (HQD pipe, NO_HWS only).
    pub const QUEUE_PIPE: usize = 3;
    /// `struct queue` . `queue` (HQD slot, NO_HWS only).
    pub const QUEUE_QUEUE: usize = 4;
    /// `struct queue_properties` . `queue_id`.
    pub const PROPS_QUEUE_ID: usize = 5;
    /// `struct queue_properties` . `type` (`enum kfd_queue_type`, renumbered late 2025).
    pub const PROPS_TYPE: usize = 6;
    /// `struct queue_properties` . `priority`.
    pub const PROPS_PRIORITY: usize = 7;
    /// `struct queue_properties` . `doorbell_off`.
    pub const PROPS_DOORBELL_OFF: usize = 8;
    /// `struct queue_properties` . `queue_address` (ring VA).
    pub const PROPS_QUEUE_ADDRESS: usize = 9;
    /// `struct queue_properties` . `queue_size` (bytes).
    pub const PROPS_QUEUE_SIZE: usize = 10;
    /// `struct kfd_process` . `lead_thread` (`struct task_struct *`).
    pub const PROCESS_LEAD_THREAD: usize = 11;
    /// `struct kfd_process` . `pasid` (kernels before about 6.15 only).
    pub const PROCESS_PASID: usize = 12;
    /// `struct task_struct` . `tgid` (vmlinux).
    pub const TASK_TGID: usize = 13;
    /// `struct kfd_node` . `id` (the gpu_id); `struct kfd_dev` . `id` before Linux 6.5
    /// ([`super::OLDER_OWNERS`]).
    pub const NODE_ID: usize = 14;
    /// `struct packet_manager` . `dqm`.
    pub const PM_DQM: usize = 15;
    /// `struct device_queue_manager` . `dev` (`struct kfd_node *`).
    pub const DQM_DEV: usize = 16;
    /// `struct mes_add_queue_input` . `process_id` (the PASID).
    pub const MES_ADD_PROCESS_ID: usize = 17;
    /// `struct mes_add_queue_input` . `doorbell_offset`.
    pub const MES_ADD_DOORBELL: usize = 18;
    /// `struct mes_add_queue_input` . `queue_type`.
    pub const MES_ADD_QUEUE_TYPE: usize = 19;
    /// `struct mes_remove_queue_input` . `doorbell_offset`.
    pub const MES_REMOVE_DOORBELL: usize = 20;
    /// `struct file` . `private_data` (vmlinux; the `struct kfd_process *` of a KFD fd).
    pub const FILE_PRIVATE_DATA: usize = 21;
    /// Parameter index of `filter` in `pm_send_unmap_queue` (moved when `type` was dropped).
    pub const ARG_UNMAP_FILTER: usize = 22;
    /// Parameter index of `filter_param` in `pm_send_unmap_queue`.
    pub const ARG_UNMAP_PARAM: usize = 23;
    /// Parameter index of `trigger` in `kfd_process_evict_queues` (DKMS adds `force` before it).
    pub const ARG_EVICT_TRIGGER: usize = 24;
    /// `struct kfd_process_device` . `pasid` (kernels from about 6.15; reported, not read in BPF).
    pub const PDD_PASID: usize = 25;
    /// `struct task_struct` . `files` (vmlinux; the fd table of the ioctl's caller).
    pub const TASK_FILES: usize = 26;
    /// `struct files_struct` . `fdt`.
    pub const FILES_FDT: usize = 27;
    /// `struct fdtable` . `max_fds`.
    pub const FDT_MAX_FDS: usize = 28;
    /// `struct fdtable` . `fd` (`struct file **`).
    pub const FDT_FD: usize = 29;
    /// `struct file` . `f_inode`.
    pub const FILE_INODE: usize = 30;
    /// `struct inode` . `i_rdev` (a device node's number, kernel encoding).
    pub const INODE_RDEV: usize = 31;
    /// `struct inode` . `i_ino`.
    pub const INODE_INO: usize = 32;
    /// `struct inode` . `i_sb`.
    pub const INODE_SB: usize = 33;
    /// `struct super_block` . `s_dev`.
    pub const SB_DEV: usize = 34;
    /// Number of fields.
    pub const COUNT: usize = 35;
    /// The fields the ioctl programs read to find the file behind an fd (fd -> file -> inode).
    pub const FILE_CHAIN: u64 = 1 << TASK_FILES
        | 1 << FILES_FDT
        | 1 << FDT_MAX_FDS
        | 1 << FDT_FD
        | 1 << FILE_INODE
        | 1 << INODE_RDEV
        | 1 << INODE_INO
        | 1 << INODE_SB
        | 1 << SB_DEV;
}

/// Structs renamed by the kernel, newest name first: a member not found under the first is
/// looked up under the second. Linux 6.5 ("drm/amdkfd: Introduce kfd_node struct") split
/// `struct kfd_dev` into `kfd_dev` + `kfd_node`; before it `queue.device` and
/// `device_queue_manager.dev` point to a `kfd_dev`, which holds the gpu_id as `id` (Debian 12's
/// 6.1 is such a kernel).
pub const OLDER_OWNERS: &[(&str, &str)] = &[("kfd_node", "kfd_dev")];

/// Where a [`FieldSpec`] is found in BTF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldSource {
    /// A member of a struct (BTF `STRUCT` named `owner`); offset in bytes, size of its type.
    Member,
    /// A parameter of a function (BTF `FUNC` named `owner`); "offset" is its 0-based index, size
    /// the size of its type.
    Param,
}

/// One resolvable field: `owner` . `member`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldSpec {
    pub id: usize,
    pub source: FieldSource,
    pub owner: &'static str,
    pub member: &'static str,
}

const fn m(id: usize, owner: &'static str, member: &'static str) -> FieldSpec {
    FieldSpec {
        id,
        source: FieldSource::Member,
        owner,
        member,
    }
}

const fn p(id: usize, owner: &'static str, member: &'static str) -> FieldSpec {
    FieldSpec {
        id,
        source: FieldSource::Param,
        owner,
        member,
    }
}

/// Every field, indexed by its id.
pub const FIELDS: [FieldSpec; field::COUNT] = {
    use field::*;
    [
        m(QUEUE_PROPERTIES, "queue", "properties"),
        m(QUEUE_PROCESS, "queue", "process"),
        m(QUEUE_DEVICE, "queue", "device"),
        m(QUEUE_PIPE, "queue", "pipe"),
        m(QUEUE_QUEUE, "queue", "queue"),
        m(PROPS_QUEUE_ID, "queue_properties", "queue_id"),
        m(PROPS_TYPE, "queue_properties", "type"),
        m(PROPS_PRIORITY, "queue_properties", "priority"),
        m(PROPS_DOORBELL_OFF, "queue_properties", "doorbell_off"),
        m(PROPS_QUEUE_ADDRESS, "queue_properties", "queue_address"),
        m(PROPS_QUEUE_SIZE, "queue_properties", "queue_size"),
        m(PROCESS_LEAD_THREAD, "kfd_process", "lead_thread"),
        m(PROCESS_PASID, "kfd_process", "pasid"),
        m(TASK_TGID, "task_struct", "tgid"),
        m(NODE_ID, "kfd_node", "id"),
        m(PM_DQM, "packet_manager", "dqm"),
        m(DQM_DEV, "device_queue_manager", "dev"),
        m(MES_ADD_PROCESS_ID, "mes_add_queue_input", "process_id"),
        m(MES_ADD_DOORBELL, "mes_add_queue_input", "doorbell_offset"),
        m(MES_ADD_QUEUE_TYPE, "mes_add_queue_input", "queue_type"),
        m(
            MES_REMOVE_DOORBELL,
            "mes_remove_queue_input",
            "doorbell_offset",
        ),
        m(FILE_PRIVATE_DATA, "file", "private_data"),
        p(ARG_UNMAP_FILTER, "pm_send_unmap_queue", "filter"),
        p(ARG_UNMAP_PARAM, "pm_send_unmap_queue", "filter_param"),
        p(ARG_EVICT_TRIGGER, "kfd_process_evict_queues", "trigger"),
        m(PDD_PASID, "kfd_process_device", "pasid"),
        m(TASK_FILES, "task_struct", "files"),
        m(FILES_FDT, "files_struct", "fdt"),
        m(FDT_MAX_FDS, "fdtable", "max_fds"),
        m(FDT_FD, "fdtable", "fd"),
        m(FILE_INODE, "file", "f_inode"),
        m(INODE_RDEV, "inode", "i_rdev"),
        m(INODE_INO, "inode", "i_ino"),
        m(INODE_SB, "inode", "i_sb"),
        m(SB_DEV, "super_block", "s_dev"),
    ]
};

/// Resolved layout, index 0 of the `OFFSETS` array map. Bit `i` of `known` says field `i` was found.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOffsets {
    pub known: u64,
    /// Byte offset of a member within its struct, or a parameter's index.
    pub off: [u32; field::COUNT],
    /// Byte size of the member's or parameter's type (1, 2, 4 or 8 for the scalars read).
    pub size: [u8; field::COUNT],
    pub _pad: [u8; 1],
}

impl Default for KernelOffsets {
    fn default() -> Self {
        Self {
            known: 0,
            off: [0; field::COUNT],
            size: [0; field::COUNT],
            _pad: [0; 1],
        }
    }
}

impl KernelOffsets {
    pub fn set(&mut self, id: usize, off: u32, size: u8) {
        if id < field::COUNT {
            self.known |= 1 << id;
            self.off[id] = off;
            self.size[id] = size;
        }
    }
    pub fn is_known(&self, id: usize) -> bool {
        id < field::COUNT && self.known & (1 << id) != 0
    }
    /// `(offset, size)` of a known field.
    pub fn get(&self, id: usize) -> Option<(u32, u8)> {
        if self.is_known(id) {
            Some((self.off[id], self.size[id]))
        } else {
            None
        }
    }
    /// Whether every field in the bit mask `needs` is known.
    pub fn has_all(&self, needs: u64) -> bool {
        self.known & needs == needs
    }
}

const _: () =
    assert!(core::mem::size_of::<KernelOffsets>() == 8 + 4 * field::COUNT + field::COUNT + 1);
const _: () = assert!(core::mem::size_of::<KernelOffsets>().is_multiple_of(8));
const _: () = assert!(field::COUNT <= 64);

/// Values of `KernelRecord::probe`: which function fired.
pub mod id {
    pub const KFD_IOCTL: u32 = 1;
    pub const QUEUE_ADD: u32 = 2;
    pub const QUEUE_DEL: u32 = 3;
    pub const RUNLIST: u32 = 4;
    pub const UNMAP: u32 = 5;
    pub const EVICT: u32 = 6;
    pub const RESTORE: u32 = 7;
    pub const SUSPEND: u32 = 8;
    pub const RESUME: u32 = 9;
    pub const HQD_LOAD: u32 = 10;
    pub const HQD_DESTROY: u32 = 11;
    pub const MES_ADD: u32 = 12;
    pub const MES_REMOVE: u32 = 13;
    pub const DBG_EV_RAISE: u32 = 14;
}

const fn bits(ids: &[usize]) -> u64 {
    let mut b = 0u64;
    let mut i = 0;
    while i < ids.len() {
        b |= 1 << ids[i];
        i += 1;
    }
    b
}

/// One kernel-internal probe: its program in the eBPF object, the functions it attaches to (the
/// first one present in kallsyms wins for each name listed; all present names are attached), and
/// the fields it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSpec {
    pub id: u32,
    /// Program name in the eBPF object.
    pub program: &'static str,
    /// Kernel functions (all present ones are probed; they share one prototype).
    pub functions: &'static [&'static str],
    /// Bit mask of [`field`]s that must all be known.
    pub needs: u64,
    /// What the probe adds over the ioctl tracepoints.
    pub gives: &'static str,
}

const QUEUE_FIELDS: u64 = {
    use field::*;
    bits(&[
        QUEUE_PROPERTIES,
        QUEUE_PROCESS,
        QUEUE_DEVICE,
        PROPS_QUEUE_ID,
        PROPS_TYPE,
        PROPS_PRIORITY,
        PROPS_DOORBELL_OFF,
        PROPS_QUEUE_ADDRESS,
        PROPS_QUEUE_SIZE,
        PROCESS_LEAD_THREAD,
        TASK_TGID,
        NODE_ID,
    ])
};
const PROCESS_FIELDS: u64 = bits(&[field::PROCESS_LEAD_THREAD, field::TASK_TGID]);
const PM_FIELDS: u64 = bits(&[field::PM_DQM, field::DQM_DEV, field::NODE_ID]);

/// Every kernel-internal probe.
pub const PROBES: [ProbeSpec; 14] = {
    use field::*;
    [
        ProbeSpec {
            id: id::KFD_IOCTL,
            program: "kp_kfd_ioctl",
            functions: &["kfd_ioctl"],
            needs: 0,
            gives: "KFD ioctls at dispatch (no fd check needed)",
        },
        ProbeSpec {
            id: id::QUEUE_ADD,
            program: "kp_queue_add",
            functions: &["kfd_procfs_add_queue"],
            needs: QUEUE_FIELDS,
            gives: "queues as created, including CRIU restores",
        },
        ProbeSpec {
            id: id::QUEUE_DEL,
            program: "kp_queue_del",
            functions: &["kfd_procfs_del_queue"],
            needs: QUEUE_FIELDS,
            gives: "queues destroyed, including process teardown",
        },
        ProbeSpec {
            id: id::RUNLIST,
            program: "kp_runlist",
            functions: &["pm_send_runlist"],
            needs: PM_FIELDS,
            gives: "HWS runlist uploads (queues mapped)",
        },
        ProbeSpec {
            id: id::UNMAP,
            program: "kp_unmap",
            functions: &["pm_send_unmap_queue"],
            needs: PM_FIELDS | bits(&[ARG_UNMAP_FILTER, ARG_UNMAP_PARAM]),
            gives: "HWS unmaps (queues preempted off the GPU)",
        },
        ProbeSpec {
            id: id::EVICT,
            program: "kp_evict",
            functions: &["kfd_process_evict_queues"],
            needs: PROCESS_FIELDS | bits(&[ARG_EVICT_TRIGGER]),
            gives: "evictions (memory pressure, migration, CRIU)",
        },
        ProbeSpec {
            id: id::RESTORE,
            program: "kp_restore",
            functions: &["kfd_process_restore_queues"],
            needs: PROCESS_FIELDS,
            gives: "restores after eviction",
        },
        ProbeSpec {
            id: id::SUSPEND,
            program: "kp_suspend",
            functions: &["suspend_queues"],
            needs: PROCESS_FIELDS,
            gives: "queue suspensions by any debugger",
        },
        ProbeSpec {
            id: id::RESUME,
            program: "kp_resume",
            functions: &["resume_queues"],
            needs: PROCESS_FIELDS,
            gives: "queue resumptions by any debugger",
        },
        ProbeSpec {
            id: id::HQD_LOAD,
            program: "kp_hqd_load",
            functions: &["kgd_gfx_v9_hqd_load", "kgd_gfx_v9_4_3_hqd_load"],
            needs: 0,
            gives: "HQD slot loads (NO_HWS)",
        },
        ProbeSpec {
            id: id::HQD_DESTROY,
            program: "kp_hqd_destroy",
            functions: &["kgd_gfx_v9_hqd_destroy", "kgd_gfx_v9_4_3_hqd_destroy"],
            needs: 0,
            gives: "HQD slot unloads (NO_HWS)",
        },
        ProbeSpec {
            id: id::MES_ADD,
            program: "kp_mes_add",
            functions: &["mes_v11_0_add_hw_queue", "mes_v12_0_add_hw_queue"],
            needs: bits(&[MES_ADD_PROCESS_ID, MES_ADD_DOORBELL, MES_ADD_QUEUE_TYPE]),
            gives: "MES hardware queue adds (GFX11+)",
        },
        ProbeSpec {
            id: id::MES_REMOVE,
            program: "kp_mes_remove",
            functions: &["mes_v11_0_remove_hw_queue", "mes_v12_0_remove_hw_queue"],
            needs: bits(&[MES_REMOVE_DOORBELL]),
            gives: "MES hardware queue removals (GFX11+)",
        },
        ProbeSpec {
            id: id::DBG_EV_RAISE,
            program: "kp_dbg_ev_raise",
            functions: &["kfd_dbg_ev_raise"],
            needs: PROCESS_FIELDS | bits(&[NODE_ID]),
            gives: "debug events raised (queue new/delete, runtime)",
        },
    ]
};

/// Launch entry points in HIP / HSA runtimes and libcuda (uprobes), values of
/// `LaunchRecord::point`.
pub mod launch {
    pub const HIP_LAUNCH_KERNEL: u32 = 1;
    pub const HIP_MODULE_LAUNCH_KERNEL: u32 = 2;
    pub const HIP_EXT_MODULE_LAUNCH_KERNEL: u32 = 3;
    pub const HIP_GRAPH_LAUNCH: u32 = 4;
    pub const HSA_QUEUE_STORE_WRITE_INDEX: u32 = 5;
    pub const HSA_SIGNAL_STORE: u32 = 6;
    pub const CU_LAUNCH_KERNEL: u32 = 7;
    pub const CU_LAUNCH_KERNEL_EX: u32 = 8;
    pub const CU_GRAPH_LAUNCH: u32 = 9;
    /// A thread entered one of [`WAITS`]: the host blocks on the GPU.
    pub const WAIT_ENTER: u32 = 10;
    /// A thread returned from one of [`WAITS`] (uretprobe): the GPU work it waited for is done.
    pub const WAIT_RETURN: u32 = 11;

    /// The runtimes' blocking waits: where a request's host side waits for its GPU work (a
    /// request ends at the last return before idleness). HIP's and the CUDA driver API's
    /// synchronize calls and their blocking copies to the host; the CUDA runtime (libcudart)
    /// reaches the driver API, so both are seen where the process maps libcuda.
    pub const WAITS: &[&str] = &[
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
        "hipMemcpy",
        "hipMemcpyDtoH",
        "cuStreamSynchronize",
        "cuStreamSynchronize_ptsz",
        // libcudart finds driver functions through cuGetProcAddress, which answers
        // `cuCtxSynchronize` with `cuCtxSynchronize_v2` (driver 580: docs/nvidia.md).
        "cuCtxSynchronize",
        "cuCtxSynchronize_v2",
        "cuEventSynchronize",
        "cuMemcpyDtoH_v2",
        "cuMemcpyDtoH_v2_ptds",
        "cuMemcpy",
        "cuMemcpy_ptds",
        // "Async" copies to pageable host memory block the host until the GPU got there:
        // PyTorch's `.item()` waits inside one of these, and its stream sync returns at once.
        "cuMemcpyAsync",
        "cuMemcpyAsync_ptsz",
        "cuMemcpyDtoHAsync_v2",
        "cuMemcpyDtoHAsync_v2_ptsz",
    ];

    /// `(point, program, symbols)`: every symbol is probed with the point's program wherever a
    /// mapped file of the process defines it.
    pub const POINTS: [(u32, &str, &[&str]); 11] = [
        (HIP_LAUNCH_KERNEL, "up_hip_launch", &["hipLaunchKernel"]),
        (
            HIP_MODULE_LAUNCH_KERNEL,
            "up_hip_module_launch",
            &["hipModuleLaunchKernel"],
        ),
        (
            HIP_EXT_MODULE_LAUNCH_KERNEL,
            "up_hip_ext_module_launch",
            &["hipExtModuleLaunchKernel"],
        ),
        (HIP_GRAPH_LAUNCH, "up_hip_graph_launch", &["hipGraphLaunch"]),
        (
            HSA_QUEUE_STORE_WRITE_INDEX,
            "up_hsa_write_index",
            &[
                "hsa_queue_store_write_index_relaxed",
                "hsa_queue_store_write_index_screlease",
                "hsa_queue_store_write_index_release",
            ],
        ),
        (
            HSA_SIGNAL_STORE,
            "up_hsa_signal_store",
            &[
                "hsa_signal_store_relaxed",
                "hsa_signal_store_screlease",
                "hsa_signal_store_release",
            ],
        ),
        // libcuda (NVIDIA), with the per-thread default stream forms.
        (
            CU_LAUNCH_KERNEL,
            "up_cu_launch",
            &["cuLaunchKernel", "cuLaunchKernel_ptsz"],
        ),
        (
            CU_LAUNCH_KERNEL_EX,
            "up_cu_launch_ex",
            &["cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"],
        ),
        (
            CU_GRAPH_LAUNCH,
            "up_cu_graph_launch",
            &["cuGraphLaunch", "cuGraphLaunch_ptsz"],
        ),
        (WAIT_ENTER, "up_wait", WAITS),
        (WAIT_RETURN, "ur_wait", WAITS),
    ];

    /// Whether `point` is a wait's entry or return (not a launch).
    pub const fn is_wait(point: u32) -> bool {
        point == WAIT_ENTER || point == WAIT_RETURN
    }

    /// Wait records a process may emit per second, and in a burst: a service that syncs per
    /// token makes hundreds a second; a process spinning on an idle stream is dropped in the
    /// kernel (counted in `stat::WAIT_DROPPED`, and its records say how many went).
    pub const WAIT_RATE_PER_S: u32 = 20_000;
    pub const WAIT_BURST: u32 = 2_000;

    /// Name of a point, as `trace` prints it.
    pub fn name(point: u32) -> &'static str {
        match point {
            HIP_LAUNCH_KERNEL => "hipLaunchKernel",
            HIP_MODULE_LAUNCH_KERNEL => "hipModuleLaunchKernel",
            HIP_EXT_MODULE_LAUNCH_KERNEL => "hipExtModuleLaunchKernel",
            HIP_GRAPH_LAUNCH => "hipGraphLaunch",
            HSA_QUEUE_STORE_WRITE_INDEX => "hsa_queue_store_write_index",
            HSA_SIGNAL_STORE => "hsa_signal_store",
            CU_LAUNCH_KERNEL => "cuLaunchKernel",
            CU_LAUNCH_KERNEL_EX => "cuLaunchKernelEx",
            CU_GRAPH_LAUNCH => "cuGraphLaunch",
            WAIT_ENTER => "wait",
            WAIT_RETURN => "wait-return",
            _ => "unknown",
        }
    }
}

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: integers and byte arrays with explicit padding: every bit pattern is valid.
    unsafe impl aya::Pod for KernelOffsets {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_indexed_by_id() {
        for (i, f) in FIELDS.iter().enumerate() {
            assert_eq!(f.id, i, "{f:?}");
        }
    }

    #[test]
    fn probes_have_unique_ids_and_programs() {
        for (i, a) in PROBES.iter().enumerate() {
            assert!(!a.functions.is_empty());
            for b in &PROBES[i + 1..] {
                assert_ne!(a.id, b.id);
                assert_ne!(a.program, b.program);
            }
        }
    }

    #[test]
    fn offsets_know_what_was_set() {
        let mut o = KernelOffsets::default();
        assert!(o.has_all(0));
        assert!(!o.has_all(1 << field::NODE_ID));
        o.set(field::NODE_ID, 12, 4);
        assert_eq!(o.get(field::NODE_ID), Some((12, 4)));
        assert!(o.has_all(1 << field::NODE_ID));
        assert_eq!(o.get(field::TASK_TGID), None);
        o.set(field::COUNT, 1, 1); // out of range: ignored
        assert_eq!(o.known, 1 << field::NODE_ID);
    }
}
