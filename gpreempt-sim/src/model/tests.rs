//! The debug-trap and queue rules, driven through `ioctl` with a fake host.
use super::*;
use crate::spec::{Model, Spec};
#[cfg(test)]
use gpreempt_common::kfd::{
    dbg_op, DbgTrapQueryDebugEventArgs, DbgTrapQueueSnapshotArgs, DbgTrapSendRuntimeEventArgs,
    DestroyQueueArgs, KFD_DBG_QUEUE_ERROR_MASK, KFD_DBG_QUEUE_INVALID_MASK,
};
use gpreempt_common::kfd::{
    iowr, DbgTrapEnableArgs, DbgTrapPayload, DbgTrapResumeQueuesArgs, DbgTrapSuspendQueuesArgs,
};
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
            std::slice::from_raw_parts((args as *const T).cast::<u8>(), std::mem::size_of::<T>())
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
    pub fn dbg<P: DbgTrapPayload>(&mut self, caller: u32, target: u32, p: P) -> (i32, DbgTrapArgs) {
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
    use crate::aql::{Dispatch, PACKET_BYTES, PACKET_TYPE_INVALID, PACKET_TYPE_KERNEL_DISPATCH};
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
fn disable_after_detach_and_debugger_death_resume_everything() {
    for how in ["disable after detach", "debugger exit"] {
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
        let disable = |w: &mut World, who| {
            w.call(
                who,
                nr::DBG_TRAP,
                &DbgTrapArgs::bare(TARGET, dbg_op::DISABLE),
            )
            .0
        };
        // Since the 2025 fix (Debian 6.12.117 has it) DISABLE is no exception to the rule.
        assert_eq!(disable(&mut w, OTHER), -libc::EPERM, "{how}");
        match how {
            "disable after detach" => {
                // The debugger keeps its session (debugger_process) after PTRACE_DETACH.
                w.host.tracer.remove(&TARGET);
                assert_eq!(disable(&mut w, DEBUGGER), 0);
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

/// What ROCr and the thunk ask of the emulated driver at start: buffer objects get render-node
/// offsets, the doorbell and MMIO pages the kernel's size rules, apertures as on GFX9.
#[test]
fn memory_offsets_and_apertures_as_the_thunk_uses_them() {
    use kfd::alloc_mem_flags as f;
    let mut w = World::new();
    w.process(TARGET, false, 0);
    let alloc = |w: &mut World, size: u64, flags: u32| {
        let a = AllocMemoryOfGpuArgs {
            va_addr: 0x7000_0000,
            size,
            gpu_id: w.gpu,
            flags,
            ..Default::default()
        };
        let (r, out) = w.call(TARGET, nr::ALLOC_MEMORY_OF_GPU, &a);
        (r, AllocMemoryOfGpuArgs::from_bytes(&out))
    };
    let (r, a) = alloc(&mut w, 0x8000, f::GTT);
    assert_eq!((r, a.mmap_offset), (0, crate::mmap::BO_BASE));
    let (_, b) = alloc(&mut w, 100, f::VRAM);
    assert_eq!(
        b.mmap_offset,
        crate::mmap::BO_BASE + 0x8000,
        "page-aligned, after the first"
    );
    assert_eq!(
        alloc(&mut w, 4096, f::DOORBELL).0,
        -libc::EINVAL,
        "a doorbell BO is 8 KiB"
    );
    assert_eq!(
        alloc(&mut w, 8192, f::MMIO_REMAP).0,
        -libc::EINVAL,
        "an MMIO BO is a page"
    );
    let (r, m) = alloc(&mut w, 4096, f::MMIO_REMAP);
    assert_eq!(r, 0);
    assert_eq!(m.mmap_offset >> 60, crate::mmap::TYPE_MMIO);
    assert_eq!((m.mmap_offset >> 44) & 0xffff, u64::from(w.gpu));
    // Freeing gives the render range back.
    let free = FreeMemoryOfGpuArgs { handle: a.handle };
    assert_eq!(w.call(TARGET, nr::FREE_MEMORY_OF_GPU, &free).0, 0);
    assert_eq!(w.kfd.freed_bos, vec![(w.gpu, crate::mmap::BO_BASE, 0x8000)]);
    // Apertures: a count with 0 nodes, then the GFX9 layout written to the caller's array.
    let q = kfd::GetProcessAperturesNewArgs::default();
    let (r, out) = w.call(TARGET, nr::GET_PROCESS_APERTURES_NEW, &q);
    assert_eq!(
        (
            r,
            kfd::GetProcessAperturesNewArgs::from_bytes(&out).num_of_nodes
        ),
        (0, 1)
    );
    let q = kfd::GetProcessAperturesNewArgs {
        kfd_process_device_apertures_ptr: 0x5000,
        num_of_nodes: 7,
        pad: 0,
    };
    let (_, out) = w.call(TARGET, nr::GET_PROCESS_APERTURES_NEW, &q);
    assert_eq!(
        kfd::GetProcessAperturesNewArgs::from_bytes(&out).num_of_nodes,
        1
    );
    let (pid, at, bytes) = w.kfd.pending_writes.pop().unwrap();
    assert_eq!((pid, at), (TARGET, 0x5000));
    let ap = kfd::ProcessDeviceApertures::from_bytes(&bytes);
    assert_eq!(
        (ap.lds_base, ap.scratch_base, ap.gpuvm_limit, ap.gpu_id),
        (1 << 48, 2 << 48, (1 << 47) - 1, w.gpu)
    );
    // XNACK: a query returns the mode; a change with queues is EBUSY.
    let (_, out) = w.call(
        TARGET,
        nr::SET_XNACK_MODE,
        &kfd::SetXnackModeArgs { xnack_enabled: -1 },
    );
    assert_eq!(kfd::SetXnackModeArgs::from_bytes(&out).xnack_enabled, 0);
    w.queue(TARGET, 0x10_0000, 7);
    let set = kfd::SetXnackModeArgs { xnack_enabled: 1 };
    assert_eq!(w.call(TARGET, nr::SET_XNACK_MODE, &set).0, -libc::EBUSY);
}

#[cfg(test)]
fn create_event(
    w: &mut World,
    kind: u32,
    page: u64,
    auto_reset: bool,
) -> (i32, kfd::CreateEventArgs) {
    let a = kfd::CreateEventArgs {
        event_page_offset: page,
        event_type: kind,
        auto_reset: u32::from(auto_reset),
        ..Default::default()
    };
    let (r, out) = w.call(TARGET, nr::CREATE_EVENT, &a);
    (r, kfd::CreateEventArgs::from_bytes(&out))
}

#[cfg(test)]
fn wait(w: &mut World, ids: &[u32], timeout: u32, now: u64) -> Outcome {
    let evs: Vec<u8> = ids
        .iter()
        .flat_map(|&id| {
            kfd::EventData {
                event_id: id,
                ..Default::default()
            }
            .as_bytes()
            .to_vec()
        })
        .collect();
    w.host.write_mem(TARGET, 0xa000, &evs).unwrap();
    let a = kfd::WaitEventsArgs {
        events_ptr: 0xa000,
        num_events: ids.len() as u32,
        wait_for_all: 0,
        timeout,
        wait_result: 0,
    };
    w.kfd.ioctl(
        me(TARGET),
        TARGET,
        iowr(nr::WAIT_EVENTS, 24),
        a.as_bytes(),
        &mut w.host,
        now,
    )
}

#[cfg(test)]
fn wait_result(o: &Outcome) -> (i32, u32) {
    match o {
        Outcome::Done { ret, out } => (*ret, kfd::WaitEventsArgs::from_bytes(out).wait_result),
        Outcome::Blocked(w) => panic!("blocked: {w:?}"),
    }
}

/// kfd_events.c: the signal page is set once from the first CREATE_EVENT and filled with
/// UNSIGNALED; signal events take slot ids from 0, others from 2^30; WAIT_EVENTS returns at once,
/// times out, or sleeps until SET_EVENT; auto-reset events reset when they end a wait.
#[test]
fn events_signal_page_ids_and_waits() {
    let mut w = World::new();
    w.process(TARGET, false, 0);
    let page = AllocMemoryOfGpuArgs {
        va_addr: 0x20_0000,
        size: 0x8000,
        gpu_id: w.gpu,
        flags: kfd::alloc_mem_flags::GTT,
        ..Default::default()
    };
    let (_, out) = w.call(TARGET, nr::ALLOC_MEMORY_OF_GPU, &page);
    let handle = AllocMemoryOfGpuArgs::from_bytes(&out).handle;
    let (r, e0) = create_event(&mut w, 0, handle, true);
    assert_eq!(
        (r, e0.event_id, e0.event_slot_index, e0.event_trigger_data),
        (0, 0, 0, 0)
    );
    let fill = w.kfd.pending_writes.remove(0);
    assert_eq!(
        (fill.0, fill.1, fill.2.len()),
        (TARGET, 0x20_0000, 4096 * 8)
    );
    assert!(
        fill.2.iter().all(|&b| b == 0xff),
        "UNSIGNALED_EVENT_SLOT everywhere"
    );
    assert_eq!(
        create_event(&mut w, 0, handle, false).0,
        -libc::EINVAL,
        "page set twice"
    );
    let (_, e1) = create_event(&mut w, 0, 0, false);
    assert_eq!(e1.event_id, 1);
    let (_, mem) = create_event(&mut w, 8, 0, false);
    assert_eq!(mem.event_id, 1 << 30, "KFD_FIRST_NONSIGNAL_EVENT_ID");
    // Nothing signaled: timeout 0 returns TIMEOUT at once; a finite wait sleeps.
    assert_eq!(wait_result(&wait(&mut w, &[0, 1], 0, 0)), (0, 1));
    let Outcome::Blocked(wt) = wait(&mut w, &[0, 1], 5, 0) else {
        panic!("should sleep")
    };
    assert!(w.kfd.retry(&wt, 1_000_000).is_none());
    assert_eq!(
        wait_result(&w.kfd.retry(&wt, 5_000_000).unwrap()),
        (0, 1),
        "timed out"
    );
    // SET_EVENT of the auto-reset event ends a wait once.
    let set = kfd::SetEventArgs {
        event_id: 0,
        pad: 0,
    };
    assert_eq!(w.call(TARGET, nr::SET_EVENT, &set).0, 0);
    assert_eq!(wait_result(&wait(&mut w, &[0], u32::MAX, 0)), (0, 0));
    assert!(
        matches!(wait(&mut w, &[0], u32::MAX, 0), Outcome::Blocked(_)),
        "auto-reset"
    );
    // SET of a non-signal event, or of an unknown id: EINVAL.
    let set = kfd::SetEventArgs {
        event_id: 1 << 30,
        pad: 0,
    };
    assert_eq!(w.call(TARGET, nr::SET_EVENT, &set).0, -libc::EINVAL);
    assert_eq!(wait_result(&wait(&mut w, &[77], 0, 0)).0, -libc::EINVAL);
    // A completion interrupt (signal_event) ends a sleeping wait on the manual-reset event, which
    // stays signaled.
    let Outcome::Blocked(wt) = wait(&mut w, &[1], u32::MAX, 0) else {
        panic!("should sleep")
    };
    w.kfd.signal_event(TARGET, 1);
    assert_eq!(wait_result(&w.kfd.retry(&wt, 1).unwrap()), (0, 0));
    assert_eq!(
        wait_result(&wait(&mut w, &[1], 0, 0)),
        (0, 0),
        "manual reset: still set"
    );
    let d = kfd::DestroyEventArgs {
        event_id: 1,
        pad: 0,
    };
    assert_eq!(w.call(TARGET, nr::DESTROY_EVENT, &d).0, 0);
    assert_eq!(w.call(TARGET, nr::DESTROY_EVENT, &d).0, -libc::EINVAL);
}

/// A dispatch with a completion signal: the engine plans its reads under the lock, reads ahead
/// without it, runs the model on what it read and writes afterwards; the CP's end of packet
/// decrements the signal, writes the event id to the mailbox (acknowledged back to UNSIGNALED)
/// and raises the event. A barrier-AND behind it waits for its dependency signal.
#[test]
fn completion_signals_and_barriers_through_the_engine_phases() {
    use crate::aql::{
        Dispatch, PACKET_TYPE_BARRIER_AND, PACKET_TYPE_KERNEL_DISPATCH, SIGNAL_EVENT_ID,
        SIGNAL_EVENT_MAILBOX, SIGNAL_VALUE,
    };
    let mut w = World::new();
    let base = 0x10_0000u64;
    w.process(TARGET, false, 0);
    w.queue(TARGET, base, 7);
    let (ring, wptr, rptr) = (base + 0x1_0000, base + 0x38, base + 0x80);
    let (sig, dep, mailbox) = (0x30_0000u64, 0x30_0040u64, 0x31_0000u64);
    w.host
        .write_mem(TARGET, sig + SIGNAL_VALUE, &1i64.to_le_bytes())
        .unwrap();
    w.host
        .write_mem(TARGET, sig + SIGNAL_EVENT_MAILBOX, &mailbox.to_le_bytes())
        .unwrap();
    w.host
        .write_mem(TARGET, sig + SIGNAL_EVENT_ID, &5u32.to_le_bytes())
        .unwrap();
    w.host
        .write_mem(TARGET, dep + SIGNAL_VALUE, &1i64.to_le_bytes())
        .unwrap();
    let d = Dispatch {
        header: PACKET_TYPE_KERNEL_DISPATCH,
        workgroup: [64, 1, 1],
        grid: [64, 1, 1],
        kernel_object: 1,
        duration_ns: 0,
        completion_signal: sig,
    };
    w.host.write_mem(TARGET, ring, &d.encode()).unwrap();
    let mut barrier = [0u8; 64];
    barrier[..2].copy_from_slice(&PACKET_TYPE_BARRIER_AND.to_le_bytes());
    barrier[8..16].copy_from_slice(&dep.to_le_bytes());
    w.host.write_mem(TARGET, ring + 64, &barrier).unwrap();
    w.host.write_mem(TARGET, wptr, &2u64.to_le_bytes()).unwrap();
    let read = |h: &mut FakeHost, at: u64| {
        let mut b = [0u8; 8];
        h.read_mem(TARGET, at, &mut b).unwrap();
        u64::from_le_bytes(b)
    };
    let mut raised = Vec::new();
    let tick = |w: &mut World, raised: &mut Vec<(u32, u32)>, now: u64| {
        let plan = crate::gpu::plan_reads(&w.kfd);
        let mut pre = crate::gpu::prefetch(&plan, &mut w.host);
        crate::gpu::advance(&mut w.kfd, &mut pre, now);
        for (pid, at, data) in std::mem::take(&mut pre.writes) {
            w.host.write_mem(pid, at, &data).unwrap();
        }
        let done = std::mem::take(&mut w.kfd.completions);
        raised.extend(crate::gpu::finish_completions(&done, &mut w.host));
    };
    let mut now = 0;
    while read(&mut w.host, rptr) < 1 && now < 1_000_000_000 {
        now += 100_000;
        tick(&mut w, &mut raised, now);
    }
    assert_eq!(read(&mut w.host, rptr), 1, "the dispatch completes");
    assert!(
        now >= crate::gpu::DEFAULT_KERNEL_NS,
        "a packet without a duration takes the default"
    );
    assert_eq!(
        read(&mut w.host, sig + SIGNAL_VALUE),
        0,
        "signal decremented"
    );
    assert_eq!(read(&mut w.host, mailbox), crate::model::UNSIGNALED_SLOT);
    for _ in 0..20 {
        now += 100_000;
        tick(&mut w, &mut raised, now);
    }
    assert_eq!(raised, vec![(TARGET, 5)]);
    assert_eq!(
        read(&mut w.host, rptr),
        1,
        "the barrier waits for its dependency"
    );
    w.host
        .write_mem(TARGET, dep + SIGNAL_VALUE, &0i64.to_le_bytes())
        .unwrap();
    for _ in 0..20 {
        now += 100_000;
        tick(&mut w, &mut raised, now);
    }
    assert_eq!(read(&mut w.host, rptr), 2, "then completes");
}

/// A held target undoes its hold by itself, as amdkfd lets it (the ptrace check exempts a
/// target that is the caller): it resumes its own queues, disables the debugger's session (every
/// queue resumes) and enables one of its own, none of it needing ptrace. The debugger, still its
/// ptrace parent, can end that session and enable its own again (what `run` does).
#[test]
fn a_held_target_may_undo_its_hold_itself_and_its_ptrace_parent_may_take_it_back() {
    let mut w = World::new();
    let q = w.process(TARGET, true, 1);
    w.process(DEBUGGER, false, 0);
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
    // Its own RESUME_QUEUES, no ptrace: it runs.
    assert_eq!(w.resume(TARGET, TARGET, &q).0, 1);
    assert!(!w.suspended(TARGET, 0) && w.mapped(TARGET, 0));
    // Its own DISABLE: the debugger's session is gone.
    assert_eq!(w.suspend(DEBUGGER, TARGET, &q, 0).0, 1);
    let disable = |w: &mut World, who| {
        w.call(
            who,
            nr::DBG_TRAP,
            &DbgTrapArgs::bare(TARGET, dbg_op::DISABLE),
        )
        .0
    };
    assert_eq!(disable(&mut w, TARGET), 0);
    assert!(!w.suspended(TARGET, 0) && w.kfd.procs[&TARGET].debug.is_none());
    // Its own ENABLE: a session of its own; the debugger's ENABLE is refused now.
    assert_eq!(w.enable(TARGET, TARGET, 0), 0);
    assert_eq!(w.enable(DEBUGGER, TARGET, NEW), -libc::EALREADY);
    // The ptrace parent ends it and enables its own: the target can be held again.
    assert_eq!(disable(&mut w, DEBUGGER), 0);
    assert_eq!(w.enable(DEBUGGER, TARGET, NEW), 0);
    assert_eq!(w.suspend(DEBUGGER, TARGET, &q, 0).0, 1);
    assert!(w.suspended(TARGET, 0) && !w.mapped(TARGET, 0));
}
