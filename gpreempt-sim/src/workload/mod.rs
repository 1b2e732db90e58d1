//! Emulated GPU workloads: real processes that open /dev/kfd the way ROCr does (GET_VERSION,
//! ACQUIRE_VM, RUNTIME_ENABLE, GPU memory for the queue, CREATE_QUEUE of an AQL queue) and replay a
//! kernel timeline measured on an H100 with PyTorch by writing AQL dispatch packets into their own
//! ring. Online jobs issue requests at a rate and report latency; offline jobs run iterations back
//! to back and report throughput. Every kernel launch goes through an exported HIP-like entry
//! point (`hipLaunchKernel`, `hipModuleLaunchKernel`) and every wait for the GPU through
//! `hipStreamSynchronize`, so launch and sync uprobes have something to hook.

use std::cell::Cell;
use std::ffi::c_void;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpreempt_common::kfd::{self, alloc_mem_flags as mf, nr};

use crate::aql::{self, amd_queue, Dispatch, PACKET_BYTES};

use types::batch_of;
pub use types::*;

mod types;

// ---------------------------------------------------------------------------------------------
// A minimal KFD client (what libhsakmt does for one AQL queue).

fn kfd_ioctl<T>(fd: &File, nr: u32, args: &mut T) -> std::io::Result<i32> {
    let cmd = kfd::iowr(nr, std::mem::size_of::<T>());
    // SAFETY: `args` is a live #[repr(C)] KFD argument struct of exactly the size encoded in cmd.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), cmd as _, args as *mut T as *mut c_void) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Anonymous, page-aligned memory that outlives the queue.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Result<Self> {
        // SAFETY: anonymous private mapping; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!(
                "mmap of {len} bytes failed: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }
    fn addr(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One AQL queue on the emulated GPU, in this process's memory.
pub struct AqlQueue {
    fd: File,
    pub gpu_id: u32,
    pub queue_id: u32,
    pub doorbell_offset: u64,
    queue: Mapping,
    ring: Mapping,
    slots: u64,
    handles: Vec<u64>,
    _eop: Mapping,
    _ctx: Mapping,
}

const RING_PACKETS: u64 = 1024;

impl AqlQueue {
    fn field(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is an 8-aligned offset inside the 4 KiB queue page, which lives as long
        // as self; the emulated GPU writes it with process_vm_writev (plain stores).
        unsafe { &*(self.queue.ptr.add(off) as *const AtomicU64) }
    }

    pub fn read_index(&self) -> u64 {
        self.field(amd_queue::READ_DISPATCH_ID)
            .load(Ordering::Acquire)
    }

    pub fn write_index(&self) -> u64 {
        self.field(amd_queue::WRITE_DISPATCH_ID)
            .load(Ordering::Acquire)
    }

    /// Open the device and create the queue as ROCr would (`debug_api`: as ROCr 5.7 and later,
    /// which enable the KFD debug API in `hsa_init`; false: as earlier releases, which never do).
    pub fn open(device: &Path, gpu: usize, priority: u32, debug_api: bool) -> Result<Self> {
        let fd = OpenOptions::new()
            .read(true)
            .write(true)
            .open(device)
            .with_context(|| format!("opening {}", device.display()))?;
        let mut v = kfd::GetVersionArgs::default();
        kfd_ioctl(&fd, nr::GET_VERSION, &mut v).context("AMDKFD_IOC_GET_VERSION")?;
        if v.major_version != 1 || v.minor_version < 13 {
            bail!(
                "KFD {}.{} has no debugger API (needs 1.13+)",
                v.major_version,
                v.minor_version
            );
        }
        let gpu_id = gpu_ids()?
            .get(gpu)
            .copied()
            .with_context(|| format!("no GPU {gpu} in /sys/class/kfd/kfd/topology"))?;
        // The emulator has no render nodes: the device fd stands in for the DRM fd.
        let mut vm = kfd::AcquireVmArgs {
            drm_fd: fd.as_raw_fd() as u32,
            gpu_id,
        };
        kfd_ioctl(&fd, nr::ACQUIRE_VM, &mut vm).context("AMDKFD_IOC_ACQUIRE_VM")?;
        if !debug_api {
            return Self::create(fd, gpu_id, priority);
        }
        // As ROCr's hsa_init does: tells the KFD (and so debuggers) where the code object list is.
        let mut rt = kfd::RuntimeEnableArgs {
            r_debug: crate::codeobj::r_debug_address(),
            mode_mask: kfd::KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK,
            capabilities_mask: 0,
        };
        // hsa_init: blocks while a debugger has not acknowledged; EINTR is retried.
        loop {
            match kfd_ioctl(&fd, nr::RUNTIME_ENABLE, &mut rt) {
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                r => {
                    r.context("AMDKFD_IOC_RUNTIME_ENABLE")?;
                    break;
                }
            };
        }
        Self::create(fd, gpu_id, priority)
    }

    /// Another queue of the same process (the runtime is already up).
    pub fn another(&self, priority: u32) -> Result<Self> {
        Self::create(self.fd.try_clone()?, self.gpu_id, priority)
    }

    fn create(fd: File, gpu_id: u32, priority: u32) -> Result<Self> {
        let queue = Mapping::new(4096)?;
        let ring = Mapping::new((RING_PACKETS as usize) * PACKET_BYTES)?;
        // As ROCr's queue creation does: every slot starts INVALID, so a packet processor that
        // sees the write id move before the packet is written waits for it.
        for i in 0..RING_PACKETS as usize {
            // SAFETY: inside the ring mapping (i < RING_PACKETS slots of PACKET_BYTES), 2-aligned,
            // not yet shared with anyone.
            unsafe {
                (ring.ptr.add(i * PACKET_BYTES) as *mut u16).write(crate::aql::PACKET_TYPE_INVALID);
            }
        }
        let eop = Mapping::new(4096)?;
        let ctx = Mapping::new(1 << 20)?;
        let mut q = AqlQueue {
            fd,
            gpu_id,
            queue_id: 0,
            doorbell_offset: 0,
            queue,
            ring,
            slots: RING_PACKETS,
            handles: Vec::new(),
            _eop: eop,
            _ctx: ctx,
        };
        // GPU mappings for the queue page, ring, EOP and CWSR area, as ROCr allocates them.
        let bufs = [
            (q.queue.addr(), q.queue.len as u64),
            (q.ring.addr(), q.ring.len as u64),
            (q._eop.addr(), q._eop.len as u64),
            (q._ctx.addr(), q._ctx.len as u64),
        ];
        for (addr, len) in bufs {
            q.map_userptr(addr, len)?;
        }
        // amd_queue_t as ROCr initialises it.
        // SAFETY: writing plain integers inside the 4 KiB queue page.
        unsafe {
            let base = q.queue.ptr;
            (base.add(amd_queue::BASE_ADDRESS) as *mut u64).write(q.ring.addr());
            (base.add(amd_queue::SIZE_PACKETS) as *mut u32).write(RING_PACKETS as u32);
            (base.add(amd_queue::READ_DISPATCH_ID_FIELD_BASE_BYTE_OFFSET) as *mut u32)
                .write(amd_queue::READ_DISPATCH_ID as u32);
        }
        // Every ring slot starts INVALID.
        for i in 0..RING_PACKETS {
            q.header(i)
                .store(aql::PACKET_TYPE_INVALID, Ordering::Relaxed);
        }
        let mut c = kfd::CreateQueueArgs {
            ring_base_address: q.ring.addr(),
            write_pointer_address: q.queue.addr() + amd_queue::WRITE_DISPATCH_ID as u64,
            read_pointer_address: q.queue.addr() + amd_queue::READ_DISPATCH_ID as u64,
            ring_size: q.ring.len as u32,
            gpu_id,
            queue_type: kfd::queue_type::COMPUTE_AQL,
            queue_percentage: kfd::KFD_MAX_QUEUE_PERCENTAGE,
            queue_priority: priority,
            eop_buffer_address: q._eop.addr(),
            eop_buffer_size: q._eop.len as u64,
            ctx_save_restore_address: q._ctx.addr(),
            ctx_save_restore_size: q._ctx.len as u32,
            ctl_stack_size: 0x1000,
            ..Default::default()
        };
        kfd_ioctl(&q.fd, nr::CREATE_QUEUE, &mut c).context("AMDKFD_IOC_CREATE_QUEUE")?;
        q.queue_id = c.queue_id;
        q.doorbell_offset = c.doorbell_offset;
        Ok(q)
    }

    fn map_userptr(&mut self, addr: u64, len: u64) -> Result<()> {
        let mut a = kfd::AllocMemoryOfGpuArgs {
            va_addr: addr,
            size: len,
            mmap_offset: addr,
            gpu_id: self.gpu_id,
            flags: mf::USERPTR | mf::WRITABLE | mf::NO_SUBSTITUTE | mf::COHERENT,
            ..Default::default()
        };
        kfd_ioctl(&self.fd, nr::ALLOC_MEMORY_OF_GPU, &mut a)
            .context("AMDKFD_IOC_ALLOC_MEMORY_OF_GPU")?;
        self.handles.push(a.handle);
        let devices = [self.gpu_id];
        let mut m = kfd::MapMemoryToGpuArgs {
            handle: a.handle,
            device_ids_array_ptr: devices.as_ptr() as u64,
            n_devices: 1,
            n_success: 0,
        };
        kfd_ioctl(&self.fd, nr::MAP_MEMORY_TO_GPU, &mut m)
            .context("AMDKFD_IOC_MAP_MEMORY_TO_GPU")?;
        Ok(())
    }

    /// VRAM for the model (weights, activations): shows in `vram_<gpu_id>`.
    pub fn alloc_vram(&mut self, bytes: u64) -> Result<()> {
        let mut a = kfd::AllocMemoryOfGpuArgs {
            va_addr: 0x7000_0000_0000 + self.handles.len() as u64 * (1 << 36),
            size: bytes,
            gpu_id: self.gpu_id,
            flags: mf::VRAM | mf::WRITABLE,
            ..Default::default()
        };
        kfd_ioctl(&self.fd, nr::ALLOC_MEMORY_OF_GPU, &mut a)
            .context("AMDKFD_IOC_ALLOC_MEMORY_OF_GPU (VRAM)")?;
        self.handles.push(a.handle);
        Ok(())
    }

    fn header(&self, index: u64) -> &AtomicU16 {
        let off = ((index % self.slots) as usize) * PACKET_BYTES;
        // SAFETY: inside the ring mapping, 2-aligned, alive as long as self.
        unsafe { &*(self.ring.ptr.add(off) as *const AtomicU16) }
    }

    /// Reserve a slot, write the packet, then publish its header (as an AQL producer does).
    pub fn submit(&self, d: &Dispatch) {
        let index = self
            .field(amd_queue::WRITE_DISPATCH_ID)
            .fetch_add(1, Ordering::AcqRel);
        while index - self.read_index() >= self.slots {
            std::thread::sleep(Duration::from_micros(50));
        }
        let bytes = d.encode();
        let off = ((index % self.slots) as usize) * PACKET_BYTES;
        // SAFETY: the slot is ours (reserved above and free: behind the read index); the header
        // is published last, with release ordering.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr().add(2),
                self.ring.ptr.add(off + 2),
                PACKET_BYTES - 2,
            );
        }
        self.header(index).store(d.header, Ordering::Release);
    }

    /// Wait until every packet up to `index` (exclusive) has completed.
    pub fn wait(&self, index: u64, stop: &AtomicBool) -> bool {
        while self.read_index() < index {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            std::thread::sleep(Duration::from_micros(30));
        }
        true
    }
}

impl Drop for AqlQueue {
    fn drop(&mut self) {
        let mut d = kfd::DestroyQueueArgs {
            queue_id: self.queue_id,
            pad: 0,
        };
        let _ = kfd_ioctl(&self.fd, nr::DESTROY_QUEUE, &mut d);
        for h in self.handles.drain(..) {
            let mut f = kfd::FreeMemoryOfGpuArgs { handle: h };
            let _ = kfd_ioctl(&self.fd, nr::FREE_MEMORY_OF_GPU, &mut f);
        }
    }
}

/// gpu_ids of the GPU nodes, in topology order.
pub fn gpu_ids() -> Result<Vec<u32>> {
    let nodes = Path::new("/sys/class/kfd/kfd/topology/nodes");
    let mut ids = Vec::new();
    for n in 0.. {
        let p = nodes.join(n.to_string()).join("gpu_id");
        let Ok(s) = fs::read_to_string(&p) else { break };
        let id: u32 = s
            .trim()
            .parse()
            .with_context(|| format!("parsing {}", p.display()))?;
        if id != 0 {
            ids.push(id);
        }
    }
    Ok(ids)
}

// ---------------------------------------------------------------------------------------------
// HIP-like launch and sync entry points (what launch and sync uprobes hook on real hosts).

/// `dim3`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

fn dispatch(object: u64, grid: Dim3, block: Dim3, duration_ns: u64) -> Dispatch {
    let b = |v: u32| v.clamp(1, u32::from(u16::MAX)) as u16;
    Dispatch {
        header: aql::PACKET_TYPE_KERNEL_DISPATCH | aql::PACKET_BARRIER_BIT,
        workgroup: [b(block.x), b(block.y), b(block.z)],
        grid: [
            grid.x.saturating_mul(block.x.max(1)),
            grid.y.saturating_mul(block.y.max(1)),
            grid.z.saturating_mul(block.z.max(1)),
        ],
        kernel_object: object,
        duration_ns,
        completion_signal: 0,
    }
}

/// `hipLaunchKernel(function_address, numBlocks, dimBlocks, args, sharedMemBytes, stream)`.
/// Emulator convention: `args[0]` points to the kernel's duration (ns, u64); `stream` is an
/// [`AqlQueue`].
///
/// # Safety
/// `args` must point to at least one valid pointer to a u64, and `stream` to a live AqlQueue.
#[no_mangle]
#[inline(never)]
pub unsafe extern "C" fn hipLaunchKernel(
    function_address: *const c_void,
    num_blocks: Dim3,
    dim_blocks: Dim3,
    args: *mut *mut c_void,
    _shared_mem_bytes: usize,
    stream: *mut c_void,
) -> i32 {
    if args.is_null() || stream.is_null() {
        return 1; // hipErrorInvalidValue
    }
    // SAFETY: the caller's contract above.
    let (q, dur) = unsafe { (&*(stream as *const AqlQueue), *(*args as *const u64)) };
    q.submit(&dispatch(
        function_address as u64,
        num_blocks,
        dim_blocks,
        dur,
    ));
    0
}

/// `hipModuleLaunchKernel(f, gridDimX..Z, blockDimX..Z, sharedMemBytes, stream, kernelParams,
/// extra)`, with the same conventions as [`hipLaunchKernel`].
///
/// # Safety
/// As for [`hipLaunchKernel`].
#[no_mangle]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hipModuleLaunchKernel(
    f: *mut c_void,
    grid_x: u32,
    grid_y: u32,
    grid_z: u32,
    block_x: u32,
    block_y: u32,
    block_z: u32,
    _shared_mem_bytes: u32,
    stream: *mut c_void,
    kernel_params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> i32 {
    if kernel_params.is_null() || stream.is_null() {
        return 1;
    }
    // SAFETY: the caller's contract.
    let (q, dur) = unsafe {
        (
            &*(stream as *const AqlQueue),
            *(*kernel_params as *const u64),
        )
    };
    let grid = Dim3 {
        x: grid_x,
        y: grid_y,
        z: grid_z,
    };
    let block = Dim3 {
        x: block_x,
        y: block_y,
        z: block_z,
    };
    q.submit(&dispatch(f as u64, grid, block, dur));
    0
}

/// `hipErrorLaunchTimeOut`: what [`hipStreamSynchronize`] returns when it gives up because the
/// workload is being stopped (a real runtime returns an error when the wait cannot complete).
pub const HIP_ERROR_STOPPED: i32 = 702;

thread_local! {
    /// Emulator convention: the stop flag of the workload running on this thread, which
    /// [`hipStreamSynchronize`] checks (its C signature has no room for one). Per thread rather
    /// than process-wide so concurrent workloads in one process cannot see each other's flag;
    /// set only through [`with_stop`].
    static STOP: Cell<*const AtomicBool> = const { Cell::new(std::ptr::null()) };
}

/// The flag of a thread with no workload: such a sync waits for completion regardless.
static NO_STOP: AtomicBool = AtomicBool::new(false);

/// Runs `f` with `stop` as this thread's stop flag for [`hipStreamSynchronize`], restoring the
/// previous one afterwards (on unwinding too), so the pointer never outlives the borrow.
fn with_stop<R>(stop: &AtomicBool, f: impl FnOnce() -> R) -> R {
    struct Restore(*const AtomicBool);
    impl Drop for Restore {
        fn drop(&mut self) {
            // try_with: a Cell of a pointer has no destructor, so this cannot fail; no panic path.
            let _ = STOP.try_with(|s| s.set(self.0));
        }
    }
    let prev = STOP
        .try_with(|s| s.replace(stop))
        .unwrap_or(std::ptr::null());
    let _restore = Restore(prev);
    f()
}

/// `hipStreamSynchronize(stream)`: blocks until `stream` has completed everything submitted to
/// it so far (its write index at the call). Returns 0 (hipSuccess) then, or
/// [`HIP_ERROR_STOPPED`] if the calling thread's workload is being stopped first (emulator
/// convention: the flag [`with_stop`] installed). `stream` is an [`AqlQueue`], as for
/// [`hipLaunchKernel`]; the emulator has no default stream, so null is rejected.
///
/// # Safety
/// `stream` must be null or point to a live AqlQueue.
#[no_mangle]
#[inline(never)]
pub unsafe extern "C" fn hipStreamSynchronize(stream: *mut c_void) -> i32 {
    if stream.is_null() {
        return 1; // hipErrorInvalidValue
    }
    // SAFETY: the caller's contract above.
    let q = unsafe { &*(stream as *const AqlQueue) };
    let flag = STOP.try_with(Cell::get).unwrap_or(std::ptr::null());
    // SAFETY: non-null only inside `with_stop` on this thread, which borrows the flag for as long
    // as the pointer is installed.
    let stop = unsafe { flag.as_ref() }.unwrap_or(&NO_STOP);
    if q.wait(q.write_index(), stop) {
        0
    } else {
        HIP_ERROR_STOPPED
    }
}

/// Waits for everything submitted to `q` through [`hipStreamSynchronize`]; false when stopped.
fn synchronize(q: &AqlQueue) -> bool {
    // SAFETY: `q` is a live AqlQueue for the call.
    unsafe { hipStreamSynchronize(q as *const AqlQueue as *mut c_void) == 0 }
}

/// A profile's kernels as a loaded, published code object ([`crate::codeobj`]): one descriptor
/// per distinct kernel name, so dispatch packets carry real descriptor addresses that tools
/// resolve to the timeline's names.
pub struct KernelObjects {
    pub code_object: crate::codeobj::LoadedCodeObject,
    /// Per timeline entry (the profile's order): its descriptor's address.
    pub objects: Vec<u64>,
}

/// Loads `p`'s code object (see [`KernelObjects`]).
pub fn load_kernels(p: &Profile) -> Result<KernelObjects> {
    let names: Vec<&str> = p.kernels.iter().map(|k| k.name.as_str()).collect();
    let code_object = crate::codeobj::LoadedCodeObject::load(&names)
        .with_context(|| format!("loading the code object of {}", p.workload))?;
    let objects = names
        .iter()
        .map(|n| {
            code_object
                .kernel_object(n)
                .with_context(|| format!("kernel {n:?} missing from its code object"))
        })
        .collect::<Result<_>>()?;
    Ok(KernelObjects {
        code_object,
        objects,
    })
}

fn launch(q: &AqlQueue, object: u64, k: &Kernel, module: bool) {
    let mut dur = (k.dur_us * 1000.0) as u64;
    let mut params = [&mut dur as *mut u64 as *mut c_void];
    let stream = q as *const AqlQueue as *mut c_void;
    let g = Dim3 {
        x: k.grid[0],
        y: k.grid[1],
        z: k.grid[2],
    };
    let b = Dim3 {
        x: k.block[0],
        y: k.block[1],
        z: k.block[2],
    };
    // SAFETY: params[0] points to `dur`, alive for the call; stream is `q`.
    unsafe {
        if module {
            hipModuleLaunchKernel(
                object as *mut c_void,
                g.x,
                g.y,
                g.z,
                b.x,
                b.y,
                b.z,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            );
        } else {
            hipLaunchKernel(
                object as *const c_void,
                g,
                b,
                params.as_mut_ptr(),
                0,
                stream,
            );
        }
    }
}

/// Submit one iteration paced like the measured timeline (kernel i no earlier than its start
/// offset); false if stopped first.
fn run_iteration(
    q: &AqlQueue,
    p: &Profile,
    objects: &[u64],
    t0: Instant,
    module: bool,
    stop: &AtomicBool,
) -> bool {
    for (k, &object) in p.kernels.iter().zip(objects) {
        let due = t0 + Duration::from_secs_f64(k.start_us / 1e6);
        let now = Instant::now();
        if due > now + Duration::from_micros(100) {
            std::thread::sleep(due - now);
        }
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        launch(q, object, k, module);
    }
    true
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The working queue and the idle ones beside it (`opts.idle_queues`).
fn open_queues(opts: &WorkloadOptions, device: &Path) -> Result<(AqlQueue, Vec<AqlQueue>)> {
    let q = AqlQueue::open(device, opts.gpu, opts.priority, opts.debug_api)?;
    let idle = (0..opts.idle_queues)
        .map(|_| AqlQueue::create(q.fd.try_clone()?, q.gpu_id, opts.priority))
        .collect::<Result<Vec<_>>>()
        .context("creating the idle queues")?;
    Ok((q, idle))
}

/// The workload's loop from `start` until `end` (or `stop`): latencies (ms, online only) and
/// iterations, counted from `measured` on. Waits go through [`hipStreamSynchronize`], so it runs
/// inside [`with_stop`].
#[allow(clippy::too_many_arguments)]
fn drive(
    opts: &WorkloadOptions,
    q: &AqlQueue,
    p: &Profile,
    objects: &[u64],
    start: Instant,
    measured: Instant,
    end: Instant,
    stop: &AtomicBool,
) -> Result<(Vec<f64>, u64)> {
    let mut lat = Vec::new();
    let mut iterations = 0u64;
    match opts.mode {
        Mode::Online { rate } => {
            anyhow::ensure!(rate > 0.0 && rate.is_finite(), "--rate must be positive");
            let period = Duration::from_secs_f64(1.0 / rate);
            let mut arrival = start;
            while arrival < end && !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                if arrival > now {
                    std::thread::sleep(arrival - now);
                }
                // A request that arrives while the previous one runs waits: latency counts from
                // its arrival.
                let t0 = Instant::now();
                if !run_iteration(q, p, objects, t0, false, stop) || !synchronize(q) {
                    break;
                }
                if arrival >= measured {
                    lat.push(arrival.elapsed().as_secs_f64() * 1e3);
                    iterations += 1;
                }
                arrival += period;
            }
        }
        Mode::Offline => {
            while Instant::now() < end && !stop.load(Ordering::Relaxed) {
                // Training-style: the CPU queues the whole iteration ahead of the GPU.
                for (k, &object) in p.kernels.iter().zip(objects) {
                    launch(q, object, k, true);
                }
                if !synchronize(q) {
                    break;
                }
                if Instant::now() >= measured {
                    iterations += 1;
                }
            }
        }
    }
    Ok((lat, iterations))
}

/// Run a workload to completion (or until `stop`), returning its report.
pub fn run(opts: &WorkloadOptions, device: &Path, stop: &AtomicBool) -> Result<Report> {
    let p = profile(&opts.profile)?;
    anyhow::ensure!(
        opts.priority <= kfd::KFD_MAX_QUEUE_PRIORITY,
        "--priority must be 0..15"
    );
    // Loaded before hsa_init, as a HIP program's code objects register at start-up.
    let code = load_kernels(&p)?;
    let (mut q, idle) = open_queues(opts, device)?;
    // Resident model + activations, roughly proportional to the work per iteration.
    q.alloc_vram(((p.gpu_busy_us_per_iteration as u64).max(64) << 20).min(16 << 30))?;
    eprintln!(
        "workload {} ({}): pid {} gpu {} queue {} ready",
        p.workload,
        match opts.mode {
            Mode::Online { rate } => format!("online, {rate} req/s"),
            Mode::Offline => "offline".into(),
        },
        std::process::id(),
        q.gpu_id,
        q.queue_id
    );
    let start = Instant::now();
    let measured = start + opts.warmup;
    let end = measured + opts.duration;
    // The second queue lives on its own thread: the main loop may sit in a wait for a long
    // time (its queue suspended, say) and the new queue must come regardless.
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let second = opts.second_queue_after.map(|d| {
        let fd = q.fd.try_clone();
        let (gpu_id, priority) = (q.gpu_id, opts.priority);
        std::thread::spawn(move || -> Result<()> {
            if done_rx.recv_timeout(d).is_ok() {
                return Ok(());
            }
            let s = AqlQueue::create(fd?, gpu_id, priority)?;
            eprintln!("workload: second queue {} ready", s.queue_id);
            let _ = done_rx.recv();
            drop(s);
            Ok(())
        })
    });
    let (mut lat, iterations) = with_stop(stop, || {
        drive(opts, &q, &p, &code.objects, start, measured, end, stop)
    })?;
    let elapsed = measured.elapsed().as_secs_f64();
    let kernels = q.read_index();
    lat.sort_by(f64::total_cmp);
    let latency = (!lat.is_empty()).then(|| Latency {
        p50_ms: percentile(&lat, 50.0),
        p95_ms: percentile(&lat, 95.0),
        p99_ms: percentile(&lat, 99.0),
        max_ms: *lat.last().unwrap_or(&0.0),
        mean_ms: lat.iter().sum::<f64>() / lat.len() as f64,
    });
    let report = Report {
        emulated: true,
        profile: p.workload.clone(),
        mode: match opts.mode {
            Mode::Online { .. } => "online".into(),
            Mode::Offline => "offline".into(),
        },
        pid: std::process::id(),
        gpu_id: q.gpu_id,
        queue_id: q.queue_id,
        queue_priority: opts.priority,
        ring_base_address: q.ring.addr(),
        read_pointer_address: q.queue.addr() + amd_queue::READ_DISPATCH_ID as u64,
        write_pointer_address: q.queue.addr() + amd_queue::WRITE_DISPATCH_ID as u64,
        doorbell_offset: q.doorbell_offset,
        duration_s: elapsed,
        requests: if latency.is_some() { iterations } else { 0 },
        iterations,
        latency,
        iterations_per_s: iterations as f64 / elapsed.max(1e-9),
        items_per_s: (iterations * batch_of(&p.workload)) as f64 / elapsed.max(1e-9),
        kernels,
    };
    drop(done_tx);
    if let Some(t) = second {
        match t.join() {
            Ok(r) => r.context("the second queue")?,
            Err(_) => anyhow::bail!("the second queue's thread panicked"),
        }
    }
    drop(idle);
    drop(q);
    drop(code);
    Ok(report)
}

#[cfg(test)]
mod tests;
