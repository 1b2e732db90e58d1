//! The emulated amdkfd: processes, queues, the debug-trap state machine and the HWS runlist.
//!
//! Pure state, driven by `open` / `ioctl` / `process_exit` and, for the GPU's execution, by
//! `gpu::advance`. What it needs from the host (another process's memory, ptrace relationships,
//! fds) goes through [`Host`], so unit tests run it without FUSE. Semantics follow upstream amdkfd
//! (kfd_chardev.c, kfd_debug.c, kfd_device_queue_manager.c); the function each piece mirrors is
//! named where it matters.
//!
//! Here: the types, `ioctl` dispatch and runtime enable / wait; GPU memory ioctls live in
//! `memory`, queue ioctls in `queues`, the debug trap in `debug`, the HWS runlist in `hws`.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use gpreempt_common::kfd::{
    self, ec, ec_mask, ioc_nr, nr, queue_type, runtime_state, AcquireVmArgs, AllocMemoryOfGpuArgs,
    CreateQueueArgs, DbgTrapArgs, FreeMemoryOfGpuArgs, GetVersionArgs, RuntimeEnableArgs,
    SetCuMaskArgs, UpdateQueueArgs,
};

use crate::spec::{Costs, Spec};

mod debug;
mod events;
mod hws;
mod memory;
mod queues;

pub use events::{SIGNAL_EVENT_LIMIT, UNSIGNALED_SLOT};

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
    /// WAIT_EVENTS until any (or all) of `ids` are signaled or the deadline (ns) passes.
    Events {
        pid: u32,
        ids: Vec<u32>,
        all: bool,
        deadline: u64,
        args: Vec<u8>,
    },
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
    pub exec: crate::exec::Exec,
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
    /// Where the CPU maps it: a render-node offset (VRAM, GTT) or a `/dev/kfd` one (doorbell,
    /// MMIO remap); the user address for userptr memory.
    pub mmap_offset: u64,
}

#[derive(Debug)]
pub struct Debug {
    /// The debugger's tgid (may be the target itself).
    pub debugger: u32,
    /// `dbg_ev_file`: gets one '.' per subscribed event.
    pub ev_fd: OwnedFd,
}

/// An event of `events`: CREATE_EVENT's type and its state.
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: u32,
    pub auto_reset: bool,
    pub signaled: bool,
}

impl Event {
    /// Whether it lives in the signal page (its id is its slot there).
    fn is_signal(&self) -> bool {
        matches!(self.kind, EVENT_SIGNAL | EVENT_DEBUG)
    }
}

/// `KFD_IOC_EVENT_SIGNAL` and `KFD_IOC_EVENT_DEBUG_EVENT`: the types that live in the signal page.
const EVENT_SIGNAL: u32 = 0;
const EVENT_DEBUG: u32 = 5;

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
    /// `debugger_process`: the last other process whose ENABLE passed the permission check
    /// (set even when the ENABLE then fails), cleared by DISABLE. It keeps its permission after
    /// PTRACE_DETACH.
    pub debugger_process: Option<u32>,
    /// Index of the process's doorbell slice in the doorbell BAR.
    pub doorbell_slice: u32,
    /// Creation order.
    pub serial: u64,
    /// Events by id (`kfd_events.c`).
    pub events: BTreeMap<u32, Event>,
    /// Where the runtime's signal page (event mailboxes) is mapped, once CREATE_EVENT set it.
    pub event_page: Option<u64>,
    /// `SET_XNACK_MODE`'s per-process setting.
    pub xnack: bool,
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
    pub exec: crate::exec::GpuExec,
    /// The next buffer-object offset of the render node (DRM's mmap offset manager).
    pub next_bo_offset: u64,
    /// The DRM render node minor (`/dev/dri/renderD<minor>`, topology `drm_render_minor`).
    pub render_minor: u32,
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
    /// What the CPU node of the topology reports.
    pub host_cpu: crate::cpu::HostCpu,
    pub procs: BTreeMap<u32, Process>,
    pub costs: Costs,
    serial: u64,
    next_doorbell_slice: u32,
    next_pasid: u32,
    /// Writes to a process's memory an ioctl made, done by the caller of `ioctl` once the model
    /// is unlocked and before the call returns (the emulator never holds its lock across another
    /// process's memory).
    pub pending_writes: Vec<(u32, u64, Vec<u8>)>,
    /// Render-node ranges (gpu_id, offset, size) freed: their backing pages can go.
    pub freed_bos: Vec<(u32, u64, u64)>,
    /// Packets completed with a completion signal, for `gpu::finish_completions`.
    pub completions: Vec<crate::exec::Completion>,
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
                // The first render minor is 128 (DRM_MINOR_RENDER's base); `sim` moves them past
                // the host's own render nodes.
                render_minor: 127 + node,
                next_bo_offset: crate::mmap::BO_BASE,
            })
            .collect();
        Kfd {
            gpus,
            host_cpu: Default::default(),
            procs: BTreeMap::new(),
            costs,
            serial: 0,
            next_doorbell_slice: 1,
            next_pasid: 0x8001,
            pending_writes: Vec::new(),
            freed_bos: Vec::new(),
            completions: Vec::new(),
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
        let Self {
            procs,
            gpus,
            serial,
            next_doorbell_slice,
            next_pasid,
            ..
        } = self;
        procs.entry(pid).or_insert_with(|| {
            *serial += 1;
            *next_doorbell_slice += 1;
            *next_pasid += 1;
            new_process(
                pid,
                gpus,
                *serial,
                *next_doorbell_slice - 1,
                *next_pasid - 1,
            )
        })
    }
}

/// A fresh KFD process: a device (pdd) on every GPU, all with the process's PASID.
fn new_process(pid: u32, gpus: &[Gpu], serial: u64, slice: u32, pasid: u32) -> Process {
    let mut pdds = BTreeMap::new();
    for g in gpus {
        pdds.insert(
            g.gpu_id,
            Pdd {
                pasid,
                ..Default::default()
            },
        );
    }
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
        debugger_process: None,
        doorbell_slice: slice,
        serial,
        events: BTreeMap::new(),
        event_page: None,
        xnack: false,
    }
}

impl Kfd {
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
        self.sync_engine(now);
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
            nr::GET_PROCESS_APERTURES_NEW => self.apertures(pid, input, host),
            nr::GET_CLOCK_COUNTERS => self.clock_counters(pid, input, now),
            nr::SET_MEMORY_POLICY => self.memory_policy(pid, input),
            nr::SET_SCRATCH_BACKING_VA | nr::SET_TRAP_HANDLER => {
                self.per_device_noop(pid, n, input)
            }
            nr::GET_TILE_CONFIG => self.tile_config(pid, input),
            nr::SET_XNACK_MODE => self.xnack_mode(pid, input),
            nr::AVAILABLE_MEMORY => self.available_memory(pid, input),
            nr::CREATE_EVENT => self.create_event(pid, kfd::CreateEventArgs::from_bytes(input)),
            nr::DESTROY_EVENT => self.destroy_event(pid, kfd::DestroyEventArgs::from_bytes(input)),
            nr::SET_EVENT => self.set_event_ioctl(pid, kfd::SetEventArgs::from_bytes(input)),
            nr::RESET_EVENT => self.reset_event(pid, kfd::ResetEventArgs::from_bytes(input)),
            nr::WAIT_EVENTS => self.wait_events(pid, input, host, now),
            // Known to the kernel but outside what the emulator models: the kernel's reply for a
            // caller that passes nothing valid.
            _ => err(libc::EINVAL, input),
        }
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
            Wait::Events {
                pid,
                ids,
                all,
                deadline,
                args,
            } => self.retry_events(*pid, ids, *all, *deadline, args, now),
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
            Wait::Destroy { args, .. } | Wait::Events { args, .. } => err(libc::EINTR, args),
        }
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
        if let Some(p) = self.procs.remove(&pid) {
            // mm teardown frees the process's buffer objects.
            for m in p.allocs.values() {
                if m.flags & kfd::alloc_mem_flags::MMIO_REMAP == 0 {
                    self.freed_bos
                        .push((m.gpu_id, m.mmap_offset, m.size.next_multiple_of(4096)));
                }
            }
        }
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

// The test kit (other crates' tests drive the model through it): a failed unwrap is a failed test.
#[cfg(any(test, feature = "testkit"))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub mod tests;
