//! The emulated amdkfd: processes, queues, the debug-trap state machine and the HWS runlist.
//!
//! Pure state, driven by `open` / `ioctl` / `process_exit` and, for the GPU's execution, by
//! `gpu::advance`. What it needs from the host (another process's memory, ptrace relationships,
//! fds) goes through [`Host`], so unit tests run it without FUSE. Semantics follow upstream amdkfd
//! (kfd_chardev.c, kfd_debug.c, kfd_device_queue_manager.c); the function each piece mirrors is
//! named where it matters.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};

use gpreempt_common::kfd::{
    self, dbg_op, ec, ec_mask, ioc_nr, nr, queue_type, runtime_state, AcquireVmArgs,
    AllocMemoryOfGpuArgs, CreateQueueArgs, DbgDeviceInfoEntry, DbgTrapArgs,
    DbgTrapDeviceSnapshotArgs, DbgTrapEnableArgs, DbgTrapQueryDebugEventArgs,
    DbgTrapQueueSnapshotArgs, DbgTrapResumeQueuesArgs, DbgTrapSendRuntimeEventArgs,
    DbgTrapSetExceptionsEnabledArgs, DbgTrapSuspendQueuesArgs, DestroyQueueArgs,
    FreeMemoryOfGpuArgs, GetVersionArgs, QueueSnapshotEntry, RuntimeEnableArgs, RuntimeInfo,
    SetCuMaskArgs, UpdateQueueArgs, KFD_DBG_QUEUE_ERROR_MASK, KFD_DBG_QUEUE_INVALID_MASK,
};

use crate::spec::{Costs, Spec};

/// A positive errno value.
pub type Errno = i32;

/// The emulated driver's version (GET_VERSION).
pub const KFD_MAJOR: u32 = 1;
pub const KFD_MINOR: u32 = 18;

/// `-ENOTSUPP` (524): kernel-internal, but it is what an unknown queue type returns to user space.
pub const ENOTSUPP: Errno = 524;

/// What the emulator needs from the host.
pub trait Host {
    fn read_mem(&mut self, pid: u32, addr: u64, buf: &mut [u8]) -> Result<(), Errno>;
    fn write_mem(&mut self, pid: u32, addr: u64, data: &[u8]) -> Result<(), Errno>;
    /// The thread id of the tracer of `pid`'s thread-group leader (`ptrace_parent`), if any.
    fn tracer(&mut self, pid: u32) -> Option<u32>;
    /// A duplicate of `fd` in `pid`'s fd table (what the kernel's `fget` in the caller's table gives).
    fn take_fd(&mut self, pid: u32, fd: u32) -> Result<OwnedFd, Errno>;
    /// Whether `fd` is open in `pid`'s fd table.
    fn fd_exists(&mut self, pid: u32, fd: u32) -> bool;
    /// Whether the process `pid` exists (for DBG_TRAP's pid lookup).
    fn process_exists(&mut self, pid: u32) -> bool;
}

/// The calling thread, in the emulator's pid namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub tgid: u32,
    pub tid: u32,
}

/// Result of one ioctl.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The return value (>= 0, or -errno) and the argument struct to copy back.
    Done { ret: i32, out: Vec<u8> },
    /// The call sleeps in the kernel until `retry` completes it (or a signal interrupts it).
    Blocked(Wait),
}

/// Why a call sleeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// RUNTIME_ENABLE waiting for the debugger's EC_PROCESS_RUNTIME (`runtime_enable_sema`).
    Runtime { pid: u32, args: Vec<u8> },
    /// DESTROY_QUEUE waiting for a debugger to resume the queue (`wait_on_destroy_queue`).
    Destroy { pid: u32, qid: u32, args: Vec<u8> },
}

pub type QKey = (u32, u32);

#[derive(Debug)]
pub struct Queue {
    pub id: u32,
    pub gpu_id: u32,
    /// KFD_IOC_QUEUE_TYPE_* as created.
    pub ioc_type: u32,
    pub ring_base: u64,
    pub ring_size: u32,
    pub wptr_addr: u64,
    pub rptr_addr: u64,
    pub priority: u32,
    pub percent: u32,
    pub eop_addr: u64,
    pub eop_size: u64,
    pub ctx_save_addr: u64,
    pub ctx_save_size: u32,
    pub ctl_stack_size: u32,
    pub doorbell_id: u32,
    /// Dword index of the queue's doorbell in the BAR (matches CP_HQD_PQ_DOORBELL_CONTROL).
    pub doorbell_off: u32,
    pub exception_status: u64,
    pub is_suspended: bool,
    pub is_evicted: bool,
    pub is_being_destroyed: bool,
    pub cu_mask: Vec<u32>,
    /// Order of creation on the host (the runlist's order within a process).
    pub serial: u64,
    pub exec: crate::gpu::Exec,
}

impl Queue {
    pub fn is_aql(&self) -> bool {
        self.ioc_type == queue_type::COMPUTE_AQL
    }
    pub fn is_compute(&self) -> bool {
        matches!(self.ioc_type, queue_type::COMPUTE | queue_type::COMPUTE_AQL)
    }
    /// `QUEUE_IS_ACTIVE`.
    pub fn is_active(&self) -> bool {
        self.ring_size > 0
            && self.ring_base != 0
            && self.percent & 0xff > 0
            && !self.is_evicted
            && !self.is_suspended
    }
    /// The internal `enum kfd_queue_type` shown in sysfs (before the DIQ removal: SDMA_XGMI = 4).
    pub fn internal_type(&self) -> u32 {
        match self.ioc_type {
            queue_type::COMPUTE | queue_type::COMPUTE_AQL => 0,
            queue_type::SDMA => 1,
            _ => 4,
        }
    }
    /// `pipe_priority_map[]`: CS_LOW / CS_MEDIUM / CS_HIGH.
    pub fn pipe_priority(&self) -> u32 {
        match self.priority {
            0..=6 => 0,
            7..=10 => 1,
            _ => 2,
        }
    }
}

#[derive(Debug, Default)]
pub struct Pdd {
    pub vm_acquired: bool,
    pub vram_usage: u64,
    /// Cumulative eviction time, ms (`stats_<gpu>/evicted_ms`).
    pub evicted_ms: u64,
    /// Per-device raised exceptions (`pdd->exception_status`).
    pub exception_status: u64,
    /// PASID of this process on this device (`pdd->pasid`).
    pub pasid: u32,
}

#[derive(Debug)]
pub struct Alloc {
    pub gpu_id: u32,
    pub va: u64,
    pub size: u64,
    pub flags: u32,
    /// MAP_MEMORY_TO_GPU done: a GPUVM mapping exists.
    pub mapped: bool,
}

#[derive(Debug)]
pub struct Debug {
    /// The debugger's tgid (may be the target itself).
    pub debugger: u32,
    /// `dbg_ev_file`: gets one '.' per subscribed event.
    pub ev_fd: OwnedFd,
}

#[derive(Debug)]
pub struct Process {
    pub pid: u32,
    pub runtime_state: u32,
    pub r_debug: u64,
    pub ttmp_setup: bool,
    /// `runtime_enable_sema`'s count.
    pub runtime_sema: u32,
    /// `is_runtime_retry`: an interrupted RUNTIME_ENABLE goes straight back to waiting.
    pub runtime_retry: bool,
    pub queues: BTreeMap<u32, Queue>,
    pub pdds: BTreeMap<u32, Pdd>,
    pub allocs: BTreeMap<u64, Alloc>,
    pub next_alloc: u32,
    pub debug: Option<Debug>,
    pub exception_enable_mask: u64,
    /// Process-level raised exceptions.
    pub exception_status: u64,
    /// How many processes this one debugs.
    pub debugged_count: u32,
    /// Index of the process's doorbell slice in the doorbell BAR.
    pub doorbell_slice: u32,
    /// Creation order.
    pub serial: u64,
}

impl Process {
    fn queue_count(&self, gpu_id: u32) -> u32 {
        self.queues.values().filter(|q| q.gpu_id == gpu_id).count() as u32
    }
}

#[derive(Debug)]
pub struct Gpu {
    pub node_id: u32,
    pub gpu_id: u32,
    pub spec: Spec,
    /// HQD slots (pipe-major: slot = pipe * queues_per_pipe + queue) -> the queue mapped there.
    pub slots: Vec<Option<QKey>>,
    /// The last uploaded runlist (active queues, in the order HWS sees them).
    pub runlist: Vec<QKey>,
    pub runlist_uploads: u64,
    /// No dispatch progresses on the device before this time (ns): a runlist re-upload or CWSR.
    pub stall_until: u64,
    /// Fault injection (debugfs `hang_hws`): the next preemption on this device fails.
    pub hws_hung: bool,
    pub next_rotation: u64,
    pub exec: crate::gpu::GpuExec,
}

impl Gpu {
    pub fn slot_of(&self, key: QKey) -> Option<usize> {
        self.slots.iter().position(|s| *s == Some(key))
    }
    /// (pipe, queue) of a slot.
    pub fn pipe_queue(&self, slot: usize) -> (u32, u32) {
        let q = self.spec.queues_per_pipe as usize;
        ((slot / q) as u32, (slot % q) as u32)
    }
}

/// The whole emulated driver.
#[derive(Debug)]
pub struct Kfd {
    pub gpus: Vec<Gpu>,
    pub procs: BTreeMap<u32, Process>,
    pub costs: Costs,
    serial: u64,
    next_doorbell_slice: u32,
    next_pasid: u32,
}

fn done(ret: i32, out: &[u8]) -> Outcome {
    Outcome::Done {
        ret,
        out: out.to_vec(),
    }
}

fn err(e: Errno, out: &[u8]) -> Outcome {
    done(-e, out)
}

/// A gpu_id as `kfd_generate_gpu_id` makes them: a hash of the device's properties, never 0.
fn gpu_id_for(seed: u64, node: u32, spec: &Spec) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed;
    for v in [
        u64::from(node),
        u64::from(spec.device_id),
        u64::from(spec.gfx_target_version),
    ] {
        h ^= v;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    ((h >> 16) as u32 & 0xffff).max(1)
}

impl Kfd {
    /// `gpus` devices of `spec`; node 0 is the CPU, GPUs are nodes 1..=gpus.
    pub fn new(spec: &Spec, gpus: u32, seed: u64, costs: Costs) -> Self {
        let gpus = (1..=gpus)
            .map(|node| Gpu {
                node_id: node,
                gpu_id: gpu_id_for(seed, node, spec),
                spec: spec.clone(),
                slots: vec![None; spec.hqd_slots() as usize],
                runlist: Vec::new(),
                runlist_uploads: 0,
                stall_until: 0,
                hws_hung: false,
                next_rotation: 0,
                exec: Default::default(),
            })
            .collect();
        Kfd {
            gpus,
            procs: BTreeMap::new(),
            costs,
            serial: 0,
            next_doorbell_slice: 1,
            next_pasid: 0x8001,
        }
    }

    pub fn gpu(&self, gpu_id: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.gpu_id == gpu_id)
    }
    fn gpu_index(&self, gpu_id: u32) -> Option<usize> {
        self.gpus.iter().position(|g| g.gpu_id == gpu_id)
    }

    fn next_serial(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    /// `kfd_create_process`: the KFD process of `pid`, made on first use.
    fn process_mut(&mut self, pid: u32) -> &mut Process {
        if !self.procs.contains_key(&pid) {
            let serial = self.next_serial();
            let slice = self.next_doorbell_slice;
            self.next_doorbell_slice += 1;
            let mut pdds = BTreeMap::new();
            for g in &self.gpus {
                pdds.insert(
                    g.gpu_id,
                    Pdd {
                        pasid: self.next_pasid,
                        ..Default::default()
                    },
                );
            }
            self.next_pasid += 1;
            self.procs.insert(
                pid,
                Process {
                    pid,
                    runtime_state: runtime_state::DISABLED,
                    r_debug: 0,
                    ttmp_setup: false,
                    runtime_sema: 0,
                    runtime_retry: false,
                    queues: BTreeMap::new(),
                    pdds,
                    allocs: BTreeMap::new(),
                    next_alloc: 1,
                    debug: None,
                    exception_enable_mask: 0,
                    exception_status: 0,
                    debugged_count: 0,
                    doorbell_slice: slice,
                    serial,
                },
            );
        }
        self.procs.get_mut(&pid).expect("inserted above")
    }

    /// `kfd_open`.
    pub fn open(&mut self, caller: Caller) {
        self.process_mut(caller.tgid);
    }

    /// One ioctl from `caller` on a /dev/kfd file opened by `owner` (the process that opened it).
    pub fn ioctl(
        &mut self,
        caller: Caller,
        owner: u32,
        cmd: u32,
        input: &[u8],
        host: &mut dyn Host,
        now: u64,
    ) -> Outcome {
        let n = ioc_nr(cmd);
        // An upstream 1.18 kernel: anything outside its table, DKMS numbers included, is ENOTTY.
        if !(kfd::AMDKFD_COMMAND_START..kfd::AMDKFD_COMMAND_END_V1_18).contains(&n) {
            return err(libc::ENOTTY, input);
        }
        // kfd_ioctl: the file's process must be the caller's.
        if caller.tgid != owner || !self.procs.contains_key(&owner) {
            return err(libc::EBADF, input);
        }
        let pid = caller.tgid;
        crate::gpu::sync(self, now);
        match n {
            nr::GET_VERSION => {
                let a = GetVersionArgs {
                    major_version: KFD_MAJOR,
                    minor_version: KFD_MINOR,
                };
                done(0, a.as_bytes())
            }
            nr::ACQUIRE_VM => self.acquire_vm(pid, AcquireVmArgs::from_bytes(input), host),
            nr::MAP_MEMORY_TO_GPU | nr::UNMAP_MEMORY_FROM_GPU => {
                self.map_memory(pid, n == nr::MAP_MEMORY_TO_GPU, input, host)
            }
            nr::ALLOC_MEMORY_OF_GPU => {
                self.alloc_memory(pid, AllocMemoryOfGpuArgs::from_bytes(input))
            }
            nr::FREE_MEMORY_OF_GPU => self.free_memory(pid, FreeMemoryOfGpuArgs::from_bytes(input)),
            nr::CREATE_QUEUE => {
                let out = self.create_queue(pid, CreateQueueArgs::from_bytes(input), host, now);
                match out {
                    Outcome::Done { ret, mut out } => {
                        out.truncate(input.len());
                        Outcome::Done { ret, out }
                    }
                    b => b,
                }
            }
            nr::DESTROY_QUEUE => self.destroy_queue(pid, input, now),
            nr::UPDATE_QUEUE => self.update_queue(pid, UpdateQueueArgs::from_bytes(input), now),
            nr::SET_CU_MASK => self.set_cu_mask(pid, SetCuMaskArgs::from_bytes(input), host),
            nr::RUNTIME_ENABLE => self.runtime_enable(pid, input, now),
            nr::DBG_TRAP => self.dbg_trap(caller, DbgTrapArgs::from_bytes(input), host, now),
            nr::GET_PROCESS_APERTURES_NEW | nr::GET_CLOCK_COUNTERS => done(0, input),
            // Known to the kernel but outside what the emulator models: the kernel's reply for a
            // caller that passes nothing valid.
            _ => err(libc::EINVAL, input),
        }
    }

    fn acquire_vm(&mut self, pid: u32, a: AcquireVmArgs, host: &mut dyn Host) -> Outcome {
        // fget(drm_fd): the fd must exist in the caller's table (a render node on real hardware).
        if !host.fd_exists(pid, a.drm_fd) {
            return err(libc::EINVAL, a.as_bytes());
        }
        let p = self.process_mut(pid);
        match p.pdds.get_mut(&a.gpu_id) {
            None => err(libc::EINVAL, a.as_bytes()),
            Some(pdd) => {
                pdd.vm_acquired = true;
                done(0, a.as_bytes())
            }
        }
    }

    /// MAP / UNMAP_MEMORY_TO_GPU: the GPUVM mapping `kfd_queue_acquire_buffers` looks for.
    fn map_memory(&mut self, pid: u32, map: bool, input: &[u8], host: &mut dyn Host) -> Outcome {
        let mut a = kfd::MapMemoryToGpuArgs::from_bytes(input);
        let mut devs = vec![0u8; a.n_devices as usize * 4];
        if a.n_devices == 0
            || host
                .read_mem(pid, a.device_ids_array_ptr, &mut devs)
                .is_err()
        {
            return err(libc::EINVAL, a.as_bytes());
        }
        let p = self.process_mut(pid);
        let Some(m) = p.allocs.get_mut(&a.handle) else {
            return err(libc::EINVAL, a.as_bytes());
        };
        m.mapped = map;
        a.n_success = a.n_devices;
        done(0, a.as_bytes())
    }

    fn alloc_memory(&mut self, pid: u32, mut a: AllocMemoryOfGpuArgs) -> Outcome {
        use kfd::alloc_mem_flags as f;
        if a.size == 0 {
            return err(libc::EINVAL, a.as_bytes());
        }
        let p = self.process_mut(pid);
        let Some(pdd) = p.pdds.get_mut(&a.gpu_id) else {
            return err(libc::EINVAL, a.as_bytes());
        };
        if !pdd.vm_acquired {
            // kfd_bind_process_to_device without a VM.
            return err(libc::ENODEV, a.as_bytes());
        }
        if a.flags & f::VRAM != 0 {
            let size = if a.flags & f::AQL_QUEUE_MEM != 0 {
                a.size / 2
            } else {
                a.size
            };
            pdd.vram_usage += size.next_multiple_of(4096);
        }
        // idr_alloc: the lowest free id of this device; MAKE_HANDLE(gpu_id, id).
        let gpu = u64::from(a.gpu_id) << 32;
        let id = (0u64..)
            .find(|i| !p.allocs.contains_key(&(gpu | i)))
            .unwrap_or(0);
        a.handle = gpu | id;
        let va = if a.flags & f::USERPTR != 0 {
            a.mmap_offset
        } else {
            a.va_addr
        };
        p.allocs.insert(
            a.handle,
            Alloc {
                gpu_id: a.gpu_id,
                va,
                size: a.size,
                flags: a.flags,
                mapped: false,
            },
        );
        done(0, a.as_bytes())
    }

    fn free_memory(&mut self, pid: u32, a: FreeMemoryOfGpuArgs) -> Outcome {
        let p = self.process_mut(pid);
        let Some(m) = p.allocs.remove(&a.handle) else {
            return err(libc::EINVAL, a.as_bytes());
        };
        if m.flags & kfd::alloc_mem_flags::VRAM != 0 {
            if let Some(pdd) = p.pdds.get_mut(&m.gpu_id) {
                let size = if m.flags & kfd::alloc_mem_flags::AQL_QUEUE_MEM != 0 {
                    m.size / 2
                } else {
                    m.size
                };
                pdd.vram_usage = pdd.vram_usage.saturating_sub(size.next_multiple_of(4096));
            }
        }
        done(0, a.as_bytes())
    }

    /// `set_queue_properties_from_user` + `kfd_ioctl_create_queue`.
    fn create_queue(
        &mut self,
        pid: u32,
        mut a: CreateQueueArgs,
        host: &mut dyn Host,
        now: u64,
    ) -> Outcome {
        // set_queue_properties_from_user, in the kernel's order.
        match ring_props(
            a.queue_percentage,
            a.queue_priority,
            a.ring_base_address,
            a.ring_size,
        ) {
            Ok(size) => a.ring_size = size,
            Err(e) => return err(e, a.as_bytes()),
        }
        if !user_range_ok(a.read_pointer_address, 4)
            || !user_range_ok(a.write_pointer_address, 4)
            || (a.eop_buffer_address != 0 && !user_range_ok(a.eop_buffer_address, 4))
            || (a.ctx_save_restore_address != 0 && !user_range_ok(a.ctx_save_restore_address, 4))
        {
            return err(libc::EFAULT, a.as_bytes());
        }
        if !matches!(
            a.queue_type,
            queue_type::COMPUTE
                | queue_type::COMPUTE_AQL
                | queue_type::SDMA
                | queue_type::SDMA_XGMI
                | queue_type::SDMA_BY_ENG_ID
        ) {
            return err(ENOTSUPP, a.as_bytes());
        }
        // kfd_ioctl_create_queue.
        let Some(gi) = self.gpu_index(a.gpu_id) else {
            return err(libc::EINVAL, a.as_bytes());
        };
        let max_q = self.gpus[gi].spec.max_queues_per_device;
        let serial = self.next_serial();
        let p = self.process_mut(pid);
        if !p.pdds.get(&a.gpu_id).is_some_and(|d| d.vm_acquired) {
            return err(libc::ESRCH, a.as_bytes()); // any bind failure
        }
        // kfd_queue_acquire_buffers: wptr, rptr (one page each) and the ring must be existing
        // GPUVM mappings that start at their page and span exactly their size.
        let mapped = |addr: u64, size: u64| {
            let (page, pages) = (addr >> 12, size.div_ceil(4096));
            p.allocs.values().any(|m| {
                m.mapped
                    && m.gpu_id == a.gpu_id
                    && m.va >> 12 == page
                    && (pages == 0 || m.size.div_ceil(4096) == pages)
            })
        };
        if !mapped(a.write_pointer_address, 4096)
            || !mapped(a.read_pointer_address, 4096)
            || !mapped(a.ring_base_address, u64::from(a.ring_size))
        {
            return err(libc::EINVAL, a.as_bytes());
        }
        if p.queue_count(a.gpu_id) >= max_q {
            return err(libc::ENOSPC, a.as_bytes());
        }
        // find_available_queue_slot: the lowest free id, process-wide.
        let Some(qid) =
            (0..kfd::KFD_MAX_NUM_OF_QUEUES_PER_PROCESS).find(|i| !p.queues.contains_key(i))
        else {
            return err(libc::ENOMEM, a.as_bytes());
        };
        let is_sdma = !matches!(a.queue_type, queue_type::COMPUTE | queue_type::COMPUTE_AQL);
        // allocate_doorbell: a compute queue takes the lowest free bit of the process's doorbell
        // bitmap on that device, outside the SOC15 range reserved for SDMA/IH/VCN (0x100..=0x18F
        // and the same +512); SDMA queues use the reserved engine doorbells.
        let used: Vec<u32> = p
            .queues
            .values()
            .filter(|q| q.gpu_id == a.gpu_id)
            .map(|q| q.doorbell_id)
            .collect();
        let reserved = |d: u32| (0x100..=0x18f).contains(&(d % 512));
        let doorbell_id = if is_sdma {
            (0x100..0x190).find(|d| !used.contains(d)).unwrap_or(0x100)
        } else {
            match (0..kfd::KFD_MAX_NUM_OF_QUEUES_PER_PROCESS)
                .find(|d| !reserved(*d) && !used.contains(d))
            {
                Some(d) => d,
                None => return err(libc::EBUSY, a.as_bytes()),
            }
        };
        // A process's doorbell slice is two pages of 64-bit doorbells; doorbell_off is a dword index.
        let slice_dw = p.doorbell_slice * (kfd::DOORBELL_PROCESS_SLICE_BYTES as u32 / 4);
        let doorbell_off = slice_dw + doorbell_id * 2;
        a.queue_id = qid;
        a.doorbell_offset = kfd::doorbell_mmap_offset(a.gpu_id, u64::from(doorbell_id) * 8);
        let q = Queue {
            id: qid,
            gpu_id: a.gpu_id,
            ioc_type: a.queue_type,
            ring_base: a.ring_base_address,
            ring_size: a.ring_size,
            wptr_addr: a.write_pointer_address,
            rptr_addr: a.read_pointer_address,
            priority: a.queue_priority,
            percent: a.queue_percentage,
            eop_addr: a.eop_buffer_address,
            eop_size: a.eop_buffer_size,
            ctx_save_addr: a.ctx_save_restore_address,
            ctx_save_size: a.ctx_save_restore_size,
            ctl_stack_size: a.ctl_stack_size,
            doorbell_id,
            doorbell_off,
            // init_user_queue: every queue is born with EC_QUEUE_NEW.
            exception_status: ec_mask(ec::QUEUE_NEW),
            is_suspended: false,
            is_evicted: false,
            is_being_destroyed: false,
            cu_mask: Vec::new(),
            serial,
            exec: Default::default(),
        };
        p.queues.insert(qid, q);
        // The read index starts where the ring's consumer is.
        if let Some(q) = self
            .procs
            .get_mut(&pid)
            .and_then(|p| p.queues.get_mut(&qid))
        {
            let rptr = q.rptr_addr;
            q.exec.init(pid, rptr, host);
        }
        self.execute_queues(gi, now);
        self.raise(pid, ec_mask(ec::QUEUE_NEW), Some(a.gpu_id), qid);
        done(0, a.as_bytes())
    }

    fn destroy_queue(&mut self, pid: u32, input: &[u8], now: u64) -> Outcome {
        let a = DestroyQueueArgs::from_bytes(input);
        let debugged = self.procs.get(&pid).is_some_and(|p| p.debug.is_some());
        let Some(q) = self
            .procs
            .get_mut(&pid)
            .and_then(|p| p.queues.get_mut(&a.queue_id))
        else {
            return err(libc::EINVAL, a.as_bytes());
        };
        // wait_on_destroy_queue: marked first, so a suspend meanwhile reports it INVALID.
        q.is_being_destroyed = true;
        if debugged && q.is_suspended {
            return Outcome::Blocked(Wait::Destroy {
                pid,
                qid: a.queue_id,
                args: input.to_vec(),
            });
        }
        self.remove_queue(pid, a.queue_id, now);
        done(0, a.as_bytes())
    }

    /// `pqm_destroy_queue`: unmap, drop, and tell a debugger (EC_DEVICE_QUEUE_DELETE).
    fn remove_queue(&mut self, pid: u32, qid: u32, now: u64) {
        let Some(q) = self.procs.get_mut(&pid).and_then(|p| p.queues.remove(&qid)) else {
            return;
        };
        if let Some(gi) = self.gpu_index(q.gpu_id) {
            self.execute_queues(gi, now);
        }
        self.raise(
            pid,
            ec_mask(ec::DEVICE_QUEUE_DELETE),
            Some(q.gpu_id),
            u32::MAX,
        );
    }

    fn update_queue(&mut self, pid: u32, mut a: UpdateQueueArgs, now: u64) -> Outcome {
        match ring_props(
            a.queue_percentage,
            a.queue_priority,
            a.ring_base_address,
            a.ring_size,
        ) {
            Ok(size) => a.ring_size = size,
            Err(e) => return err(e, a.as_bytes()),
        }
        let Some(q) = self
            .procs
            .get_mut(&pid)
            .and_then(|p| p.queues.get_mut(&a.queue_id))
        else {
            return err(libc::EFAULT, a.as_bytes());
        };
        q.ring_base = a.ring_base_address;
        q.ring_size = a.ring_size;
        q.percent = a.queue_percentage;
        q.priority = a.queue_priority;
        let gpu_id = q.gpu_id;
        if let Some(gi) = self.gpu_index(gpu_id) {
            self.execute_queues(gi, now);
        }
        done(0, a.as_bytes())
    }

    fn set_cu_mask(&mut self, pid: u32, a: SetCuMaskArgs, host: &mut dyn Host) -> Outcome {
        if a.num_cu_mask == 0 || !a.num_cu_mask.is_multiple_of(32) {
            return err(libc::EINVAL, a.as_bytes());
        }
        let bits = a.num_cu_mask.min(1024);
        let mut raw = vec![0u8; (bits / 8) as usize];
        if host.read_mem(pid, a.cu_mask_ptr, &mut raw).is_err() {
            return err(libc::EFAULT, a.as_bytes());
        }
        let Some(q) = self
            .procs
            .get_mut(&pid)
            .and_then(|p| p.queues.get_mut(&a.queue_id))
        else {
            return err(libc::EFAULT, a.as_bytes());
        };
        q.cu_mask = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        done(0, a.as_bytes())
    }

    /// `runtime_enable` / `runtime_disable`.
    fn runtime_enable(&mut self, pid: u32, input: &[u8], now: u64) -> Outcome {
        let a = RuntimeEnableArgs::from_bytes(input);
        let p = self.process_mut(pid);
        let debugged = p.debug.is_some();
        if a.mode_mask & kfd::KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK == 0 {
            // runtime_disable: no checks; a debugged runtime deactivates (resume all) and waits for
            // the debugger to acknowledge EC_PROCESS_RUNTIME.
            let was_enabled = p.runtime_state == runtime_state::ENABLED;
            let retry = p.runtime_retry;
            p.runtime_state = runtime_state::DISABLED;
            p.r_debug = 0;
            p.ttmp_setup = false;
            if !debugged {
                return done(0, input);
            }
            if was_enabled {
                self.resume_all(pid, now);
            }
            if !retry {
                self.raise(pid, ec_mask(ec::PROCESS_RUNTIME), None, 0);
            }
            return self.runtime_wait(pid, input);
        }
        if !p.runtime_retry {
            if p.runtime_state != runtime_state::DISABLED {
                return err(libc::EBUSY, input);
            }
            if !p.queues.is_empty() {
                return err(libc::EEXIST, input);
            }
            p.runtime_state = runtime_state::ENABLED;
            p.r_debug = a.r_debug;
            p.ttmp_setup = a.mode_mask & kfd::KFD_RUNTIME_ENABLE_MODE_TTMP_SAVE_MASK != 0;
            if debugged {
                self.raise(pid, ec_mask(ec::PROCESS_RUNTIME), None, 0);
            }
        }
        // retry: only a debugged runtime waits (is_runtime_retry is left as it was otherwise).
        if debugged {
            return self.runtime_wait(pid, input);
        }
        done(0, input)
    }

    /// `down_interruptible(&p->runtime_enable_sema)`.
    fn runtime_wait(&mut self, pid: u32, input: &[u8]) -> Outcome {
        let p = self.process_mut(pid);
        if p.runtime_sema > 0 {
            p.runtime_sema -= 1;
            p.runtime_retry = false;
            return done(0, &input[..input.len().min(16)]);
        }
        Outcome::Blocked(Wait::Runtime {
            pid,
            args: input.to_vec(),
        })
    }

    /// Completes a blocked call if it can proceed now.
    pub fn retry(&mut self, wait: &Wait, now: u64) -> Option<Outcome> {
        match wait {
            Wait::Runtime { pid, args } => {
                let p = self.procs.get_mut(pid)?;
                if p.runtime_sema == 0 {
                    return None;
                }
                p.runtime_sema -= 1;
                p.runtime_retry = false;
                Some(done(0, args))
            }
            Wait::Destroy { pid, qid, args } => {
                let Some(p) = self.procs.get(pid) else {
                    return Some(err(libc::EINVAL, args));
                };
                match p.queues.get(qid) {
                    None => Some(err(libc::EINVAL, args)),
                    Some(q) if q.is_suspended && p.debug.is_some() => None,
                    Some(_) => Some(self.destroy_queue(*pid, args, now)),
                }
            }
        }
    }

    /// A signal interrupted a blocked call: what it returns (-ERESTARTSYS reaches user space as
    /// EINTR through FUSE); a RUNTIME_ENABLE retried later goes straight back to waiting.
    pub fn interrupt(&mut self, wait: &Wait) -> Outcome {
        match wait {
            Wait::Runtime { pid, args } => {
                if let Some(p) = self.procs.get_mut(pid) {
                    p.runtime_retry = true;
                }
                err(libc::EINTR, args)
            }
            Wait::Destroy { args, .. } => err(libc::EINTR, args),
        }
    }

    /// `kfd_dbg_ev_raise`: record the event on its queue / device / process and, if the debugger
    /// subscribed to it, write '.' to the debugger's fd. Nothing is recorded without a debugger.
    fn raise(&mut self, pid: u32, mask: u64, gpu_id: Option<u32>, qid: u32) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        let Some(d) = &p.debug else {
            return;
        };
        if mask & kfd::EC_MASK_DEVICE != 0 {
            if let Some(pdd) = gpu_id.and_then(|g| p.pdds.get_mut(&g)) {
                pdd.exception_status |= mask & kfd::EC_MASK_DEVICE;
            }
        } else if mask & kfd::EC_MASK_PROCESS != 0 {
            p.exception_status |= mask & kfd::EC_MASK_PROCESS;
        } else {
            // QUEUE_NEW names the queue id; other queue exceptions its doorbell id.
            let by_id = mask & ec_mask(ec::QUEUE_NEW) != 0;
            if let Some(q) = p.queues.values_mut().find(|q| {
                Some(q.gpu_id) == gpu_id
                    && if by_id {
                        q.id == qid
                    } else {
                        q.doorbell_id == qid
                    }
            }) {
                q.exception_status |= mask;
            }
        }
        if p.exception_enable_mask & mask != 0 {
            notify(&d.ev_fd);
        }
    }

    /// `kfd_ioctl_set_debug_trap`.
    fn dbg_trap(
        &mut self,
        caller: Caller,
        a: DbgTrapArgs,
        host: &mut dyn Host,
        now: u64,
    ) -> Outcome {
        let out = a;
        let tpid = a.pid;
        if !host.process_exists(tpid) {
            return err(libc::ESRCH, out.as_bytes());
        }
        let traced_by_caller = host.tracer(tpid) == Some(caller.tid);
        if a.op == dbg_op::ENABLE && tpid != caller.tgid && traced_by_caller {
            // kfd_create_process(thread) for a ptraced target that never opened /dev/kfd.
            self.process_mut(tpid);
        }
        if !self.procs.contains_key(&tpid) {
            return err(libc::ESRCH, out.as_bytes());
        }
        if tpid != caller.tgid && a.op != dbg_op::DISABLE && !traced_by_caller {
            return err(libc::EPERM, out.as_bytes());
        }
        let target = &self.procs[&tpid];
        if a.op != dbg_op::ENABLE && target.debug.is_none() {
            return err(libc::EINVAL, out.as_bytes());
        }
        let needs_runtime = matches!(
            a.op,
            dbg_op::SET_WAVE_LAUNCH_OVERRIDE
                | dbg_op::SET_WAVE_LAUNCH_MODE
                | dbg_op::SUSPEND_QUEUES
                | dbg_op::RESUME_QUEUES
                | dbg_op::SET_NODE_ADDRESS_WATCH
                | dbg_op::CLEAR_NODE_ADDRESS_WATCH
                | dbg_op::SET_FLAGS
        );
        if needs_runtime && target.runtime_state != runtime_state::ENABLED {
            return err(libc::EPERM, out.as_bytes());
        }
        match a.op {
            dbg_op::ENABLE => self.dbg_enable(caller, a, host),
            dbg_op::DISABLE => {
                self.dbg_disable(tpid, now);
                done(0, out.as_bytes())
            }
            dbg_op::SEND_RUNTIME_EVENT => {
                // kfd_dbg_send_exception_to_runtime.
                let e: DbgTrapSendRuntimeEventArgs = a.payload();
                let p = self.process_mut(tpid);
                if e.exception_mask & ec_mask(ec::DEVICE_MEMORY_VIOLATION) != 0
                    && !p.pdds.contains_key(&e.gpu_id)
                {
                    return err(libc::ENODEV, out.as_bytes());
                }
                if e.exception_mask & ec_mask(ec::PROCESS_RUNTIME) != 0 {
                    p.runtime_sema += 1;
                }
                done(0, out.as_bytes())
            }
            dbg_op::SET_EXCEPTIONS_ENABLED => {
                let e: DbgTrapSetExceptionsEnabledArgs = a.payload();
                let p = self.process_mut(tpid);
                let found = p.exception_status
                    | p.pdds.values().fold(0, |m, d| m | d.exception_status)
                    | p.queues.values().fold(0, |m, q| m | q.exception_status);
                if e.exception_mask & found != 0 {
                    if let Some(d) = &p.debug {
                        notify(&d.ev_fd);
                    }
                }
                p.exception_enable_mask = e.exception_mask;
                done(0, out.as_bytes())
            }
            dbg_op::SUSPEND_QUEUES => self.suspend_queues(caller.tgid, a, host, now),
            dbg_op::RESUME_QUEUES => self.resume_queues(caller.tgid, a, host, now),
            dbg_op::QUERY_DEBUG_EVENT => self.query_debug_event(tpid, a),
            dbg_op::GET_QUEUE_SNAPSHOT => self.queue_snapshot(caller.tgid, a, host),
            dbg_op::GET_DEVICE_SNAPSHOT => self.device_snapshot(caller.tgid, a, host),
            dbg_op::SET_FLAGS | dbg_op::SET_WAVE_LAUNCH_MODE | dbg_op::SET_WAVE_LAUNCH_OVERRIDE => {
                done(0, out.as_bytes())
            }
            _ => err(libc::EINVAL, out.as_bytes()),
        }
    }

    /// `kfd_dbg_trap_enable`.
    fn dbg_enable(&mut self, caller: Caller, a: DbgTrapArgs, host: &mut dyn Host) -> Outcome {
        let mut e: DbgTrapEnableArgs = a.payload();
        let tpid = a.pid;
        if self.procs[&tpid].debug.is_some() {
            return err(libc::EALREADY, a.as_bytes());
        }
        let ev_fd = match host.take_fd(caller.tgid, e.dbg_fd) {
            Ok(fd) => fd,
            Err(_) => return err(libc::EBADF, a.as_bytes()),
        };
        let t = &self.procs[&tpid];
        let rinfo = RuntimeInfo {
            r_debug: t.r_debug,
            runtime_state: t.runtime_state,
            ttmp_setup: u32::from(t.ttmp_setup),
        };
        let n = (e.rinfo_size as usize).min(std::mem::size_of::<RuntimeInfo>());
        if n > 0
            && host
                .write_mem(caller.tgid, e.rinfo_ptr, &rinfo.as_bytes()[..n])
                .is_err()
        {
            return err(libc::EFAULT, a.as_bytes());
        }
        e.rinfo_size = std::mem::size_of::<RuntimeInfo>() as u32;
        let t = self.process_mut(tpid);
        t.debug = Some(Debug {
            debugger: caller.tgid,
            ev_fd,
        });
        t.exception_enable_mask = e.exception_mask;
        if tpid != caller.tgid {
            self.process_mut(caller.tgid).debugged_count += 1;
        }
        let out = DbgTrapArgs::new(tpid, e);
        done(0, out.as_bytes())
    }

    /// `kfd_dbg_trap_disable`: resume everything, drop the session and all raised exceptions.
    pub fn dbg_disable(&mut self, tpid: u32, now: u64) {
        let Some(t) = self.procs.get(&tpid) else {
            return;
        };
        if t.debug.is_none() {
            return;
        }
        if t.runtime_state == runtime_state::ENABLED {
            self.resume_all(tpid, now);
        }
        let t = self.process_mut(tpid);
        let debugger = t.debug.take().map(|d| d.debugger);
        t.exception_status = 0;
        for d in t.pdds.values_mut() {
            d.exception_status = 0;
        }
        for q in t.queues.values_mut() {
            q.exception_status = 0;
        }
        if let Some(d) = debugger.filter(|&d| d != tpid) {
            if let Some(dp) = self.procs.get_mut(&d) {
                dp.debugged_count = dp.debugged_count.saturating_sub(1);
            }
        }
    }

    /// `resume_queues(p, 0, NULL)`.
    fn resume_all(&mut self, pid: u32, now: u64) {
        let mut touched = Vec::new();
        if let Some(p) = self.procs.get_mut(&pid) {
            for q in p.queues.values_mut() {
                q.is_suspended = false;
                touched.push(q.gpu_id);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for g in touched {
            if let Some(gi) = self.gpu_index(g) {
                self.preempt(gi, now, kfd::USE_DEFAULT_GRACE_PERIOD);
            }
        }
    }

    fn read_ids(host: &mut dyn Host, pid: u32, ptr: u64, n: u32) -> Result<Vec<u32>, Errno> {
        let mut raw = vec![0u8; n as usize * 4];
        host.read_mem(pid, ptr, &mut raw)?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    fn write_ids(host: &mut dyn Host, pid: u32, ptr: u64, ids: &[u32]) -> Result<(), Errno> {
        let raw: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        host.write_mem(pid, ptr, &raw)
    }

    /// `suspend_queues` (HWS path): the caller's array comes back with INVALID / ERROR bits; the
    /// return value is the number of queues suspended (already suspended ones included).
    fn suspend_queues(
        &mut self,
        caller: u32,
        a: DbgTrapArgs,
        host: &mut dyn Host,
        now: u64,
    ) -> Outcome {
        let s: DbgTrapSuspendQueuesArgs = a.payload();
        let tpid = a.pid;
        if s.num_queues == 0 {
            return done(0, a.as_bytes());
        }
        let mut ids = match Self::read_ids(host, caller, s.queue_array_ptr, s.num_queues) {
            Ok(v) => v,
            Err(_) => return err(libc::EFAULT, a.as_bytes()),
        };
        q_array_invalidate(&mut ids);
        let mut total = 0;
        for gi in 0..self.gpus.len() {
            let gpu_id = self.gpus[gi].gpu_id;
            let mut per_device = 0;
            let p = self.process_mut(tpid);
            for id in ids.iter_mut() {
                let Some(q) = p
                    .queues
                    .get_mut(&queue_of(*id))
                    .filter(|q| q.gpu_id == gpu_id)
                else {
                    continue;
                };
                // suspend_single_queue.
                if !q.is_suspended {
                    if q.exception_status & ec_mask(ec::QUEUE_NEW) != 0 || q.is_being_destroyed {
                        continue; // -EBUSY: stays INVALID
                    }
                    q.is_suspended = true;
                }
                *id &= !KFD_DBG_QUEUE_INVALID_MASK;
                per_device += 1;
            }
            if per_device == 0 {
                continue;
            }
            let ok = self.preempt(gi, now, s.grace_period);
            let p = self.process_mut(tpid);
            for id in ids.iter_mut() {
                let Some(q) = p
                    .queues
                    .get_mut(&queue_of(*id))
                    .filter(|q| q.gpu_id == gpu_id)
                else {
                    continue;
                };
                if !ok {
                    *id |= KFD_DBG_QUEUE_ERROR_MASK;
                } else {
                    q.exception_status &= !s.exception_mask;
                }
            }
            if ok {
                total += per_device;
            }
        }
        // The status array is written back whatever happened (a failure there is only logged).
        let _ = Self::write_ids(host, caller, s.queue_array_ptr, &ids);
        done(total, a.as_bytes())
    }

    /// `resume_queues`: every listed queue that exists counts, suspended or not; a NULL array
    /// resumes all of the target's queues.
    fn resume_queues(
        &mut self,
        caller: u32,
        a: DbgTrapArgs,
        host: &mut dyn Host,
        now: u64,
    ) -> Outcome {
        let r: DbgTrapResumeQueuesArgs = a.payload();
        let tpid = a.pid;
        let mut ids = if r.queue_array_ptr == 0 {
            None
        } else {
            match Self::read_ids(host, caller, r.queue_array_ptr, r.num_queues) {
                Ok(mut v) => {
                    q_array_invalidate(&mut v);
                    Some(v)
                }
                Err(_) => return err(libc::EFAULT, a.as_bytes()),
            }
        };
        let mut total = 0;
        for gi in 0..self.gpus.len() {
            let gpu_id = self.gpus[gi].gpu_id;
            let p = self.process_mut(tpid);
            let mut per_device = 0;
            for q in p.queues.values_mut().filter(|q| q.gpu_id == gpu_id) {
                if let Some(ids) = ids.as_mut() {
                    let Some(id) = ids.iter_mut().find(|id| queue_of(**id) == q.id) else {
                        continue;
                    };
                    *id &= !KFD_DBG_QUEUE_INVALID_MASK;
                }
                q.is_suspended = false;
                per_device += 1;
            }
            if per_device == 0 {
                continue;
            }
            if self.preempt(gi, now, kfd::USE_DEFAULT_GRACE_PERIOD) {
                total += per_device;
            } else if let Some(ids) = ids.as_mut() {
                let p = &self.procs[&tpid];
                for id in ids.iter_mut() {
                    if p.queues
                        .get(&queue_of(*id))
                        .is_some_and(|q| q.gpu_id == gpu_id)
                    {
                        *id |= KFD_DBG_QUEUE_ERROR_MASK;
                    }
                }
            }
        }
        if let Some(ids) = ids {
            let _ = Self::write_ids(host, caller, r.queue_array_ptr, &ids);
        }
        done(total, a.as_bytes())
    }

    /// `kfd_dbg_ev_query_debug_event`: queue events first (newest queue first, as pqm's list),
    /// then device events, then the process's.
    fn query_debug_event(&mut self, tpid: u32, a: DbgTrapArgs) -> Outcome {
        let mut q: DbgTrapQueryDebugEventArgs = a.payload();
        let clear = q.exception_mask;
        let p = self.process_mut(tpid);
        let enabled = p.exception_enable_mask;
        let mut status = 0;
        let (mut gpu_id, mut queue_id) = (0, 0);
        let mut order: Vec<&mut Queue> = p.queues.values_mut().collect();
        order.sort_by_key(|q| std::cmp::Reverse(q.serial));
        if let Some(qu) = order
            .into_iter()
            .find(|qu| qu.exception_status & enabled != 0)
        {
            status = qu.exception_status;
            queue_id = qu.id;
            gpu_id = qu.gpu_id;
            qu.exception_status &= !clear;
        } else if let Some((g, d)) = p
            .pdds
            .iter_mut()
            .find(|(_, d)| d.exception_status & enabled != 0)
        {
            status = d.exception_status;
            gpu_id = *g;
            d.exception_status &= !clear;
        } else if p.exception_status & enabled != 0 {
            status = p.exception_status;
            p.exception_status &= !clear;
        }
        q.exception_mask = status;
        q.gpu_id = gpu_id;
        q.queue_id = queue_id;
        let out = DbgTrapArgs::new(tpid, q);
        done(if status == 0 { -libc::EAGAIN } else { 0 }, out.as_bytes())
    }

    /// `pqm_get_queue_snapshot`: newest queue first; every queue is counted, only copied ones
    /// are cleared.
    fn queue_snapshot(&mut self, caller: u32, a: DbgTrapArgs, host: &mut dyn Host) -> Outcome {
        let mut s: DbgTrapQueueSnapshotArgs = a.payload();
        let tpid = a.pid;
        let (in_num, in_es) = (s.num_queues, s.entry_size);
        s.num_queues = 0;
        if in_es == 0 {
            return err(libc::EINVAL, DbgTrapArgs::new(tpid, s).as_bytes());
        }
        let n = (in_es as usize).min(std::mem::size_of::<QueueSnapshotEntry>());
        let p = self.process_mut(tpid);
        let mut order: Vec<&mut Queue> = p.queues.values_mut().collect();
        order.sort_by_key(|q| std::cmp::Reverse(q.serial));
        let mut count = 0u32;
        let mut ret = 0;
        for q in order {
            if count < in_num && ret == 0 {
                let e = QueueSnapshotEntry {
                    exception_status: q.exception_status,
                    ring_base_address: q.ring_base,
                    write_pointer_address: q.wptr_addr,
                    read_pointer_address: q.rptr_addr,
                    ctx_save_restore_address: q.ctx_save_addr,
                    queue_id: q.id,
                    gpu_id: q.gpu_id,
                    ring_size: q.ring_size,
                    queue_type: q.ioc_type,
                    ctx_save_restore_area_size: q.ctx_save_size,
                    reserved: 0,
                };
                q.exception_status &= !s.exception_mask;
                let at = s.snapshot_buf_ptr + u64::from(count) * u64::from(in_es);
                if host.write_mem(caller, at, &e.as_bytes()[..n]).is_err() {
                    ret = -libc::EFAULT;
                }
            }
            count += 1;
        }
        s.num_queues = count;
        s.entry_size = n as u32;
        done(ret, DbgTrapArgs::new(tpid, s).as_bytes())
    }

    /// `kfd_dbg_trap_device_snapshot`.
    fn device_snapshot(&mut self, caller_pid: u32, a: DbgTrapArgs, host: &mut dyn Host) -> Outcome {
        let mut s: DbgTrapDeviceSnapshotArgs = a.payload();
        let tpid = a.pid;
        if s.snapshot_buf_ptr == 0 {
            return err(libc::EINVAL, a.as_bytes());
        }
        let n = (s.entry_size as usize).min(std::mem::size_of::<DbgDeviceInfoEntry>());
        let entries: Vec<DbgDeviceInfoEntry> = self
            .gpus
            .iter()
            .map(|g| {
                let sp = &g.spec;
                DbgDeviceInfoEntry {
                    exception_status: self.procs[&tpid]
                        .pdds
                        .get(&g.gpu_id)
                        .map_or(0, |d| d.exception_status),
                    gpuvm_base: 0x1_0000,
                    gpuvm_limit: (1 << 47) - 1,
                    gpu_id: g.gpu_id,
                    location_id: g.node_id << 8,
                    vendor_id: 0x1002,
                    device_id: sp.device_id,
                    fw_version: sp.mec_fw_version,
                    gfx_target_version: sp.gfx_target_version,
                    simd_count: sp.simd_count(),
                    max_waves_per_simd: sp.max_waves_per_simd,
                    array_count: sp.array_count,
                    simd_arrays_per_engine: sp.simd_arrays_per_engine,
                    num_xcc: sp.num_xcc,
                    // kfd_dbg_trap_device_snapshot copies the topology node's capability.
                    capability: crate::views::CAPABILITY,
                    ..Default::default()
                }
            })
            .collect();
        for (i, e) in entries.iter().take(s.num_devices as usize).enumerate() {
            let at = s.snapshot_buf_ptr + i as u64 * u64::from(s.entry_size);
            if host.write_mem(caller_pid, at, &e.as_bytes()[..n]).is_err() {
                return err(libc::EFAULT, a.as_bytes());
            }
        }
        let p = self.process_mut(tpid);
        for d in p.pdds.values_mut() {
            d.exception_status &= !s.exception_mask;
        }
        s.num_devices = entries.len() as u32;
        s.entry_size = n as u32;
        let out = DbgTrapArgs::new(tpid, s);
        done(0, out.as_bytes())
    }

    /// `execute_queues_cpsch`: unmap every dynamic queue of the device and upload a new runlist.
    pub fn execute_queues(&mut self, gi: usize, now: u64) {
        self.preempt(gi, now, kfd::USE_DEFAULT_GRACE_PERIOD);
    }

    /// `execute_queues_cpsch` with a grace period; false when the CP did not acknowledge the
    /// preemption (debugfs `hang_hws`): the emulated device then recovers, as after a reset.
    fn preempt(&mut self, gi: usize, now: u64, grace: u32) -> bool {
        if std::mem::take(&mut self.gpus[gi].hws_hung) {
            return false;
        }
        let gpu_id = self.gpus[gi].gpu_id;
        let mut active: Vec<(u64, u64, QKey)> = self
            .procs
            .values()
            .flat_map(|p| {
                p.queues
                    .values()
                    .filter(|q| q.gpu_id == gpu_id && q.is_active() && q.is_compute())
                    .map(move |q| (p.serial, q.serial, (p.pid, q.id)))
            })
            .collect();
        active.sort_unstable();
        let runlist: Vec<QKey> = active.into_iter().map(|(_, _, k)| k).collect();
        // The grace period lets running waves finish before CWSR (1K clocks per unit).
        let grace_ns = if grace == kfd::USE_DEFAULT_GRACE_PERIOD {
            0
        } else {
            u64::from(grace) * 1000 * 1000 / u64::from(self.gpus[gi].spec.clock_mhz.max(1))
        };
        crate::gpu::upload_runlist(self, gi, runlist, now, grace_ns);
        true
    }

    /// The process is gone (its mm torn down): end the sessions it debugged, then its own queues.
    pub fn process_exit(&mut self, pid: u32, now: u64) {
        let debugged: Vec<u32> = self
            .procs
            .values()
            .filter(|p| p.debug.as_ref().is_some_and(|d| d.debugger == pid) && p.pid != pid)
            .map(|p| p.pid)
            .collect();
        for t in debugged {
            self.dbg_disable(t, now);
        }
        self.procs.remove(&pid);
        for gi in 0..self.gpus.len() {
            if self.gpus[gi].runlist.iter().any(|k| k.0 == pid) {
                self.execute_queues(gi, now);
            }
        }
    }

    /// A queue by key.
    pub fn queue(&self, key: QKey) -> Option<&Queue> {
        self.procs.get(&key.0)?.queues.get(&key.1)
    }
    pub fn queue_mut(&mut self, key: QKey) -> Option<&mut Queue> {
        self.procs.get_mut(&key.0)?.queues.get_mut(&key.1)
    }
}

/// `q_array_invalidate`: every entry starts INVALID.
fn q_array_invalidate(ids: &mut [u32]) {
    for id in ids {
        *id |= KFD_DBG_QUEUE_INVALID_MASK;
    }
}

/// The queue id of an array entry (status bits ignored).
fn queue_of(entry: u32) -> u32 {
    entry & !(KFD_DBG_QUEUE_INVALID_MASK | KFD_DBG_QUEUE_ERROR_MASK)
}

/// The checks CREATE_QUEUE and UPDATE_QUEUE share (kernel order): percentage and priority, ring
/// address, ring size (a power of two; below 1024 raised to 1024). Returns the ring size to use.
fn ring_props(percent: u32, priority: u32, ring: u64, size: u32) -> Result<u32, Errno> {
    if percent & 0xff > kfd::KFD_MAX_QUEUE_PERCENTAGE || priority > kfd::KFD_MAX_QUEUE_PRIORITY {
        return Err(libc::EINVAL);
    }
    if ring != 0 && !user_range_ok(ring, 8) {
        return Err(libc::EFAULT);
    }
    if size != 0 && !size.is_power_of_two() {
        return Err(libc::EINVAL);
    }
    Ok(size.max(kfd::KFD_MIN_QUEUE_RING_SIZE))
}

/// `access_ok`: only kernel or non-canonical user ranges fail (NULL passes).
fn user_range_ok(addr: u64, len: u64) -> bool {
    addr.checked_add(len).is_some_and(|end| end <= 1 << 47)
}

/// One '.' per event, without blocking (a full pipe already says "look").
fn notify(fd: &OwnedFd) {
    // SAFETY: writing one byte from a valid buffer to a descriptor we own.
    let _ = unsafe { libc::write(fd.as_raw_fd(), b".".as_ptr().cast(), 1) };
}

#[cfg(any(test, feature = "testkit"))]
pub mod tests {
    //! The debug-trap and queue rules, driven through `ioctl` with a fake host.
    use super::*;
    use crate::spec::{Model, Spec};
    use gpreempt_common::kfd::{iowr, DbgTrapPayload};
    use std::collections::{HashMap, HashSet};
    use std::os::fd::{AsRawFd, FromRawFd};

    #[derive(Default)]
    pub struct FakeHost {
        mem: HashMap<(u32, u64), u8>,
        pub tracer: HashMap<u32, u32>,
        pub alive: HashSet<u32>,
        pub dots: Vec<OwnedFd>,
    }

    impl Host for FakeHost {
        fn read_mem(&mut self, pid: u32, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
            if addr == 0 {
                return Err(libc::EFAULT);
            }
            for (i, b) in buf.iter_mut().enumerate() {
                *b = *self.mem.get(&(pid, addr + i as u64)).unwrap_or(&0);
            }
            Ok(())
        }
        fn write_mem(&mut self, pid: u32, addr: u64, data: &[u8]) -> Result<(), Errno> {
            for (i, b) in data.iter().enumerate() {
                self.mem.insert((pid, addr + i as u64), *b);
            }
            Ok(())
        }
        fn tracer(&mut self, pid: u32) -> Option<u32> {
            self.tracer.get(&pid).copied()
        }
        fn take_fd(&mut self, _pid: u32, fd: u32) -> Result<OwnedFd, Errno> {
            if fd == u32::MAX {
                return Err(libc::EBADF);
            }
            let mut p = [0i32; 2];
            // SAFETY: pipe2 fills two fds we then own.
            unsafe {
                assert_eq!(libc::pipe2(p.as_mut_ptr(), libc::O_NONBLOCK), 0);
                self.dots.push(OwnedFd::from_raw_fd(p[0]));
                Ok(OwnedFd::from_raw_fd(p[1]))
            }
        }
        fn fd_exists(&mut self, _pid: u32, _fd: u32) -> bool {
            true
        }
        fn process_exists(&mut self, pid: u32) -> bool {
            self.alive.contains(&pid)
        }
    }

    impl FakeHost {
        /// '.' bytes written to the last debugger fd so far.
        pub fn drain_dots(&mut self) -> usize {
            let Some(fd) = self.dots.last() else { return 0 };
            let mut buf = [0u8; 64];
            // SAFETY: reading into a local buffer from a non-blocking pipe we own.
            let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            n.max(0) as usize
        }
        pub fn ids(&mut self, pid: u32, addr: u64, n: usize) -> Vec<u32> {
            let mut b = vec![0u8; n * 4];
            self.read_mem(pid, addr, &mut b).unwrap();
            b.chunks(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        }
    }

    pub const TARGET: u32 = 100;
    pub const DEBUGGER: u32 = 200;
    const OTHER: u32 = 300;
    const ARRAY: u64 = 0x5000;
    const RINFO: u64 = 0x6000;

    pub struct World {
        pub kfd: Kfd,
        pub host: FakeHost,
        pub gpu: u32,
    }

    fn me(pid: u32) -> Caller {
        Caller {
            tgid: pid,
            tid: pid,
        }
    }

    #[allow(clippy::new_without_default)]
    impl World {
        pub fn new() -> Self {
            let kfd = Kfd::new(&Spec::new(Model::Mi210), 1, 7, Costs::default());
            let gpu = kfd.gpus[0].gpu_id;
            let mut host = FakeHost::default();
            host.alive.extend([TARGET, DEBUGGER, OTHER]);
            World { kfd, host, gpu }
        }
        pub fn call<T: Copy>(&mut self, caller: u32, nr: u32, args: &T) -> (i32, Vec<u8>) {
            // SAFETY: T is one of the plain KFD arg structs.
            let bytes = unsafe {
                std::slice::from_raw_parts(
                    (args as *const T).cast::<u8>(),
                    std::mem::size_of::<T>(),
                )
            };
            let cmd = iowr(nr, bytes.len());
            match self
                .kfd
                .ioctl(me(caller), caller, cmd, bytes, &mut self.host, 0)
            {
                Outcome::Done { ret, out } => (ret, out),
                Outcome::Blocked(w) => panic!("blocked: {w:?}"),
            }
        }
        pub fn raw(&mut self, caller: u32, nr: u32, bytes: &[u8]) -> Outcome {
            self.kfd.ioctl(
                me(caller),
                caller,
                iowr(nr, bytes.len()),
                bytes,
                &mut self.host,
                0,
            )
        }
        /// A process with an acquired VM, runtime enabled (or not), and `n` AQL queues.
        pub fn process(&mut self, pid: u32, runtime: bool, n: u32) -> Vec<u32> {
            self.kfd.open(me(pid));
            let vm = kfd::AcquireVmArgs {
                drm_fd: 3,
                gpu_id: self.gpu,
            };
            assert_eq!(self.call(pid, nr::ACQUIRE_VM, &vm).0, 0);
            if runtime {
                let rt = RuntimeEnableArgs {
                    mode_mask: 1,
                    ..Default::default()
                };
                assert_eq!(self.call(pid, nr::RUNTIME_ENABLE, &rt).0, 0);
            }
            (0..n)
                .map(|i| self.queue(pid, 0x10_0000 * (u64::from(i) + 1), 7))
                .collect()
        }
        pub fn queue(&mut self, pid: u32, base: u64, priority: u32) -> u32 {
            for (va, size) in [(base, 4096u64), (base + 0x1_0000, 0x1_0000)] {
                let a = AllocMemoryOfGpuArgs {
                    va_addr: va,
                    size,
                    mmap_offset: va,
                    gpu_id: self.gpu,
                    flags: kfd::alloc_mem_flags::USERPTR,
                    ..Default::default()
                };
                let (r, out) = self.call(pid, nr::ALLOC_MEMORY_OF_GPU, &a);
                assert_eq!(r, 0);
                let h = AllocMemoryOfGpuArgs::from_bytes(&out).handle;
                let devs = self.gpu.to_le_bytes();
                self.host.write_mem(pid, 0x9000, &devs).unwrap();
                let m = kfd::MapMemoryToGpuArgs {
                    handle: h,
                    device_ids_array_ptr: 0x9000,
                    n_devices: 1,
                    n_success: 0,
                };
                assert_eq!(self.call(pid, nr::MAP_MEMORY_TO_GPU, &m).0, 0);
            }
            let c = CreateQueueArgs {
                ring_base_address: base + 0x1_0000,
                write_pointer_address: base + 0x38,
                read_pointer_address: base + 0x80,
                ring_size: 0x1_0000,
                gpu_id: self.gpu,
                queue_type: queue_type::COMPUTE_AQL,
                queue_percentage: 100,
                queue_priority: priority,
                ..Default::default()
            };
            let (r, out) = self.call(pid, nr::CREATE_QUEUE, &c);
            assert_eq!(r, 0, "create_queue");
            CreateQueueArgs::from_bytes(&out).queue_id
        }
        pub fn dbg<P: DbgTrapPayload>(
            &mut self,
            caller: u32,
            target: u32,
            p: P,
        ) -> (i32, DbgTrapArgs) {
            let a = DbgTrapArgs::new(target, p);
            let (r, out) = self.call(caller, nr::DBG_TRAP, &a);
            (r, DbgTrapArgs::from_bytes(&out))
        }
        pub fn enable(&mut self, debugger: u32, target: u32, mask: u64) -> i32 {
            self.dbg(
                debugger,
                target,
                DbgTrapEnableArgs {
                    exception_mask: mask,
                    rinfo_ptr: RINFO,
                    rinfo_size: 16,
                    dbg_fd: 5,
                },
            )
            .0
        }
        pub fn suspend(
            &mut self,
            caller: u32,
            target: u32,
            ids: &[u32],
            clear: u64,
        ) -> (i32, Vec<u32>) {
            let raw: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.host.write_mem(caller, ARRAY, &raw).unwrap();
            let s = DbgTrapSuspendQueuesArgs {
                exception_mask: clear,
                queue_array_ptr: ARRAY,
                num_queues: ids.len() as u32,
                grace_period: 0,
            };
            let r = self.dbg(caller, target, s).0;
            (r, self.host.ids(caller, ARRAY, ids.len()))
        }
        pub fn resume(&mut self, caller: u32, target: u32, ids: &[u32]) -> (i32, Vec<u32>) {
            let raw: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.host.write_mem(caller, ARRAY, &raw).unwrap();
            let s = DbgTrapResumeQueuesArgs {
                queue_array_ptr: ARRAY,
                num_queues: ids.len() as u32,
                pad: 0,
            };
            let r = self.dbg(caller, target, s).0;
            (r, self.host.ids(caller, ARRAY, ids.len()))
        }
        pub fn suspended(&self, pid: u32, qid: u32) -> bool {
            self.kfd.queue((pid, qid)).unwrap().is_suspended
        }
        pub fn mapped(&self, pid: u32, qid: u32) -> bool {
            self.kfd.gpus[0].slot_of((pid, qid)).is_some()
        }
    }

    #[cfg(test)]
    const NEW: u64 = ec_mask(ec::QUEUE_NEW);
    #[cfg(test)]
    const RUNTIME: u64 = ec_mask(ec::PROCESS_RUNTIME);
    #[cfg(test)]
    const INVALID: u32 = KFD_DBG_QUEUE_INVALID_MASK;

    /// A consumed slot is handed back INVALID before the read id moves: a producer bumps the
    /// write id before it writes the packet, and the ring's previous lap must not be run again
    /// (it was: the read id overtook the write id and the workload's arithmetic overflowed).
    #[test]
    fn a_completed_packet_leaves_its_slot_invalid() {
        use crate::aql::{
            Dispatch, PACKET_BYTES, PACKET_TYPE_INVALID, PACKET_TYPE_KERNEL_DISPATCH,
        };
        let mut w = World::new();
        let base = 0x10_0000u64;
        w.kfd.open(me(TARGET));
        w.process(TARGET, true, 0);
        w.queue(TARGET, base, 7);
        let (ring, wptr, rptr) = (base + 0x1_0000, base + 0x38, base + 0x80);
        let d = Dispatch {
            header: PACKET_TYPE_KERNEL_DISPATCH,
            workgroup: [64, 1, 1],
            grid: [64, 1, 1],
            kernel_object: 1,
            duration_ns: 1_000,
            completion_signal: 0,
        };
        w.host.write_mem(TARGET, ring, &d.encode()).unwrap();
        w.host.write_mem(TARGET, wptr, &1u64.to_le_bytes()).unwrap();
        let header = |h: &mut FakeHost| {
            let mut b = [0u8; 2];
            h.read_mem(TARGET, ring, &mut b).unwrap();
            u16::from_le_bytes(b)
        };
        let read_id = |h: &mut FakeHost| {
            let mut b = [0u8; 8];
            h.read_mem(TARGET, rptr, &mut b).unwrap();
            u64::from_le_bytes(b)
        };
        let mut now = 0;
        while read_id(&mut w.host) < 1 && now < 1_000_000_000 {
            now += 1_000_000;
            crate::gpu::advance(&mut w.kfd, &mut w.host, now);
        }
        assert_eq!(read_id(&mut w.host), 1, "the packet completes");
        assert_eq!(header(&mut w.host) & 0xff, PACKET_TYPE_INVALID);
        // The rest of the lap (zeroed memory reads as vendor-specific packets, which complete at
        // once), then a producer that reserved the next lap's slot 0 but has not written it
        // yet: the packet processor waits there.
        let slots = 0x1_0000 / PACKET_BYTES as u64;
        w.host
            .write_mem(TARGET, wptr, &(slots + 1).to_le_bytes())
            .unwrap();
        for _ in 0..10 {
            now += 1_000_000;
            crate::gpu::advance(&mut w.kfd, &mut w.host, now);
        }
        assert_eq!(read_id(&mut w.host), slots, "the unwritten slot was run");
    }

    #[test]
    fn create_queue_results_and_errors() {
        let mut w = World::new();
        let q = w.process(TARGET, true, 2);
        assert_eq!(q, vec![0, 1], "lowest free ids");
        let q0 = w.kfd.queue((TARGET, 0)).unwrap();
        assert_eq!(q0.doorbell_id, 0);
        assert!(w.mapped(TARGET, 0) && w.mapped(TARGET, 1));
        let c = CreateQueueArgs {
            gpu_id: w.gpu,
            ring_size: 1000,
            ..Default::default()
        };
        assert_eq!(
            w.call(TARGET, nr::CREATE_QUEUE, &c).0,
            -libc::EINVAL,
            "ring size not a power of two"
        );
        let c = CreateQueueArgs {
            gpu_id: w.gpu,
            queue_priority: 16,
            ..Default::default()
        };
        assert_eq!(w.call(TARGET, nr::CREATE_QUEUE, &c).0, -libc::EINVAL);
        let c = CreateQueueArgs {
            gpu_id: w.gpu,
            queue_type: 9,
            ..Default::default()
        };
        assert_eq!(w.call(TARGET, nr::CREATE_QUEUE, &c).0, -ENOTSUPP);
        let c = CreateQueueArgs {
            gpu_id: 12345,
            queue_type: queue_type::COMPUTE_AQL,
            ..Default::default()
        };
        assert_eq!(
            w.call(TARGET, nr::CREATE_QUEUE, &c).0,
            -libc::EINVAL,
            "unknown gpu"
        );
        let c = CreateQueueArgs {
            gpu_id: w.gpu,
            queue_type: queue_type::COMPUTE_AQL,
            ring_base_address: 0x77_0000,
            ring_size: 4096,
            ..Default::default()
        };
        assert_eq!(
            w.call(TARGET, nr::CREATE_QUEUE, &c).0,
            -libc::EINVAL,
            "buffers not GPU-mapped"
        );
        // Unknown nr and DKMS numbers: ENOTTY; another process's fd: EBADF.
        assert!(
            matches!(w.raw(TARGET, 0x80, &[0; 8]), Outcome::Done { ret, .. } if ret == -libc::ENOTTY)
        );
        let v = w.kfd.ioctl(
            me(OTHER),
            TARGET,
            iowr(nr::GET_VERSION, 8),
            &[0; 8],
            &mut w.host,
            0,
        );
        assert!(matches!(v, Outcome::Done { ret, .. } if ret == -libc::EBADF));
        // RUNTIME_ENABLE once queues exist: EBUSY (already enabled) / EEXIST (fresh process).
        w.process(OTHER, false, 1);
        let rt = RuntimeEnableArgs {
            mode_mask: 1,
            ..Default::default()
        };
        assert_eq!(w.call(OTHER, nr::RUNTIME_ENABLE, &rt).0, -libc::EEXIST);
        assert_eq!(w.call(TARGET, nr::RUNTIME_ENABLE, &rt).0, -libc::EBUSY);
    }

    #[test]
    fn ptrace_rule_and_runtime_rule() {
        let mut w = World::new();
        let q = w.process(TARGET, false, 1);
        w.process(DEBUGGER, false, 0);
        assert_eq!(
            w.enable(DEBUGGER, TARGET, NEW),
            -libc::EPERM,
            "not the ptrace parent"
        );
        w.host.tracer.insert(TARGET, DEBUGGER + 1); // another thread of the debugger
        assert_eq!(
            w.enable(DEBUGGER, TARGET, NEW),
            -libc::EPERM,
            "the tracer must be the calling thread"
        );
        w.host.tracer.insert(TARGET, DEBUGGER);
        assert_eq!(w.enable(DEBUGGER, TARGET, NEW), 0);
        assert_eq!(w.enable(DEBUGGER, TARGET, NEW), -libc::EALREADY);
        assert_eq!(
            w.suspend(DEBUGGER, TARGET, &q, 0).0,
            -libc::EPERM,
            "runtime not enabled"
        );
        // A target may debug itself without ptrace.
        let mut w2 = World::new();
        w2.process(OTHER, true, 0);
        assert_eq!(w2.enable(OTHER, OTHER, 0), 0);
    }

    #[test]
    fn queue_new_blocks_suspend_until_cleared() {
        let mut w = World::new();
        let q = w.process(TARGET, true, 2);
        w.process(DEBUGGER, false, 0);
        w.host.tracer.insert(TARGET, DEBUGGER);
        assert_eq!(w.enable(DEBUGGER, TARGET, NEW | RUNTIME), 0);
        // Queues made before ENABLE carry QUEUE_NEW too: nothing suspends, entries stay INVALID.
        let (r, ids) = w.suspend(DEBUGGER, TARGET, &q, 0);
        assert_eq!(r, 0);
        assert_eq!(ids, vec![INVALID, 1 | INVALID]);
        // QUERY_DEBUG_EVENT reports the newest queue first and clears what it is asked to.
        let (r, a) = w.dbg(
            DEBUGGER,
            TARGET,
            DbgTrapQueryDebugEventArgs {
                exception_mask: NEW,
                ..Default::default()
            },
        );
        let e: DbgTrapQueryDebugEventArgs = a.payload();
        assert_eq!(
            (r, e.queue_id, e.gpu_id, e.exception_mask & NEW),
            (0, 1, w.gpu, NEW)
        );
        let (r, ids) = w.suspend(DEBUGGER, TARGET, &q, 0);
        assert_eq!(
            (r, ids),
            (1, vec![INVALID, 1]),
            "queue 1 cleared, queue 0 still new"
        );
        assert!(w.suspended(TARGET, 1) && !w.mapped(TARGET, 1) && w.mapped(TARGET, 0));
        // The snapshot's clear mask works too; an unknown id stays INVALID.
        let s = DbgTrapQueueSnapshotArgs {
            exception_mask: NEW,
            snapshot_buf_ptr: 0x8000,
            num_queues: 8,
            entry_size: 64,
        };
        let (r, a) = w.dbg(DEBUGGER, TARGET, s);
        assert_eq!(
            (r, a.payload::<DbgTrapQueueSnapshotArgs>().num_queues),
            (0, 2)
        );
        let (r, ids) = w.suspend(DEBUGGER, TARGET, &[0, 1, 7], 0);
        assert_eq!(
            (r, ids),
            (2, vec![0, 1, 7 | INVALID]),
            "already-suspended queues count"
        );
        // Resume counts every listed queue that exists.
        let (r, ids) = w.resume(DEBUGGER, TARGET, &[0, 9]);
        assert_eq!((r, ids), (1, vec![0, 9 | INVALID]));
        assert!(!w.suspended(TARGET, 0) && w.mapped(TARGET, 0));
        // Nothing pending: EAGAIN.
        w.dbg(
            DEBUGGER,
            TARGET,
            DbgTrapQueryDebugEventArgs {
                exception_mask: u64::MAX,
                ..Default::default()
            },
        );
        let (r, _) = w.dbg(
            DEBUGGER,
            TARGET,
            DbgTrapQueryDebugEventArgs {
                exception_mask: u64::MAX,
                ..Default::default()
            },
        );
        let (r2, _) = w.dbg(DEBUGGER, TARGET, DbgTrapQueryDebugEventArgs::default());
        assert!(r == 0 || r == -libc::EAGAIN);
        assert_eq!(r2, -libc::EAGAIN);
    }

    #[test]
    fn events_write_dots_and_runtime_enable_waits_for_the_debugger() {
        let mut w = World::new();
        w.process(TARGET, false, 0);
        w.process(DEBUGGER, false, 0);
        w.host.tracer.insert(TARGET, DEBUGGER);
        assert_eq!(w.enable(DEBUGGER, TARGET, NEW | RUNTIME), 0);
        assert_eq!(w.host.drain_dots(), 0);
        let rt = RuntimeEnableArgs {
            mode_mask: 1,
            ..Default::default()
        };
        let o = w.raw(TARGET, nr::RUNTIME_ENABLE, rt.as_bytes());
        let Outcome::Blocked(wait) = o else {
            panic!("RUNTIME_ENABLE must block: {o:?}")
        };
        assert_eq!(w.host.drain_dots(), 1, "EC_PROCESS_RUNTIME raised");
        assert!(w.kfd.retry(&wait, 0).is_none());
        // A signal interrupts it; the retry goes straight back to waiting.
        assert!(matches!(w.kfd.interrupt(&wait), Outcome::Done { ret, .. } if ret == -libc::EINTR));
        let Outcome::Blocked(wait) = w.raw(TARGET, nr::RUNTIME_ENABLE, rt.as_bytes()) else {
            panic!()
        };
        let ack = DbgTrapSendRuntimeEventArgs {
            exception_mask: RUNTIME,
            gpu_id: 0,
            queue_id: 0,
        };
        assert_eq!(w.dbg(DEBUGGER, TARGET, ack).0, 0);
        assert!(matches!(
            w.kfd.retry(&wait, 0),
            Some(Outcome::Done { ret: 0, .. })
        ));
        w.queue(TARGET, 0x10_0000, 7);
        assert_eq!(w.host.drain_dots(), 1, "EC_QUEUE_NEW raised");
    }

    #[test]
    fn disable_by_anyone_and_debugger_death_resume_everything() {
        for how in ["third-party disable", "debugger exit"] {
            let mut w = World::new();
            let q = w.process(TARGET, true, 1);
            w.process(DEBUGGER, false, 0);
            w.process(OTHER, false, 0);
            w.host.tracer.insert(TARGET, DEBUGGER);
            assert_eq!(w.enable(DEBUGGER, TARGET, NEW), 0);
            w.dbg(
                DEBUGGER,
                TARGET,
                DbgTrapQueryDebugEventArgs {
                    exception_mask: NEW,
                    ..Default::default()
                },
            );
            assert_eq!(w.suspend(DEBUGGER, TARGET, &q, 0).0, 1);
            assert!(w.suspended(TARGET, 0));
            assert_eq!(w.suspend(OTHER, TARGET, &q, 0).0, -libc::EPERM, "{how}");
            match how {
                "third-party disable" => {
                    assert_eq!(
                        w.call(
                            OTHER,
                            nr::DBG_TRAP,
                            &DbgTrapArgs::bare(TARGET, dbg_op::DISABLE)
                        )
                        .0,
                        0
                    )
                }
                _ => w.kfd.process_exit(DEBUGGER, 0),
            }
            assert!(!w.suspended(TARGET, 0) && w.mapped(TARGET, 0), "{how}");
            assert!(w.kfd.procs[&TARGET].debug.is_none(), "{how}");
        }
    }

    #[test]
    fn destroy_blocks_while_suspended_and_target_death_frees_its_queues() {
        let mut w = World::new();
        let q = w.process(TARGET, true, 1);
        w.process(DEBUGGER, false, 0);
        w.host.tracer.insert(TARGET, DEBUGGER);
        w.enable(DEBUGGER, TARGET, NEW);
        w.dbg(
            DEBUGGER,
            TARGET,
            DbgTrapQueryDebugEventArgs {
                exception_mask: NEW,
                ..Default::default()
            },
        );
        w.suspend(DEBUGGER, TARGET, &q, 0);
        let d = DestroyQueueArgs {
            queue_id: 0,
            pad: 0,
        };
        let Outcome::Blocked(wait) = w.raw(TARGET, nr::DESTROY_QUEUE, d.as_bytes()) else {
            panic!("destroy of a suspended queue must block")
        };
        // Being destroyed: a second suspend reports it INVALID.
        assert!(w.kfd.retry(&wait, 0).is_none());
        w.resume(DEBUGGER, TARGET, &q);
        assert!(matches!(
            w.kfd.retry(&wait, 0),
            Some(Outcome::Done { ret: 0, .. })
        ));
        assert!(w.kfd.queue((TARGET, 0)).is_none());
        w.queue(TARGET, 0x20_0000, 7);
        assert!(w.mapped(TARGET, 0));
        w.kfd.process_exit(TARGET, 0);
        assert!(!w.kfd.procs.contains_key(&TARGET));
        assert!(w.kfd.gpus[0].slots.iter().all(Option::is_none));
        assert!(w.kfd.gpus[0].runlist.is_empty());
    }

    #[test]
    fn failed_preemption_sets_error_bits() {
        let mut w = World::new();
        let q = w.process(TARGET, true, 2);
        w.host.tracer.insert(TARGET, DEBUGGER);
        w.process(DEBUGGER, false, 0);
        w.enable(DEBUGGER, TARGET, 0);
        w.kfd.gpus[0].hws_hung = true;
        // Still QUEUE_NEW: refused (INVALID) before the device is even asked.
        let (r, ids) = w.suspend(DEBUGGER, TARGET, &q, 0);
        assert_eq!(r, 0);
        assert!(ids.iter().all(|i| i & INVALID != 0), "{ids:x?}");
        // DISABLE clears every exception status, QUEUE_NEW included: a new session can suspend.
        w.kfd.dbg_disable(TARGET, 0);
        w.enable(DEBUGGER, TARGET, NEW);
        w.kfd.gpus[0].hws_hung = true;
        let (r, ids) = w.suspend(DEBUGGER, TARGET, &q, 0);
        assert_eq!(r, 0, "nothing counts as suspended");
        assert_eq!(
            ids,
            vec![KFD_DBG_QUEUE_ERROR_MASK, 1 | KFD_DBG_QUEUE_ERROR_MASK]
        );
    }
}
