//! GPU memory ioctls of the emulated amdkfd: ACQUIRE_VM, ALLOC / FREE / MAP / UNMAP_MEMORY_OF_GPU,
//! and the per-device queries a runtime makes at start (apertures, clock counters, memory policy,
//! tile config, XNACK mode, available memory, scratch and trap-handler addresses).

use gpreempt_common::kfd::{
    self, AcquireVmArgs, AllocMemoryOfGpuArgs, FreeMemoryOfGpuArgs, GetAvailableMemoryArgs,
    GetClockCountersArgs, GetProcessAperturesNewArgs, GetTileConfigArgs, ProcessDeviceApertures,
    SetMemoryPolicyArgs, SetXnackModeArgs,
};

use super::{done, err, Alloc, Host, Kfd, Outcome};
use crate::mmap;

/// `kfd_doorbell_process_slice`: 1024 doorbells of 8 bytes on SOC15.
const DOORBELL_SLICE: u64 = 8192;
const PAGE: u64 = 4096;
/// `kfd_init_apertures_v9`: LDS and scratch apertures at 1 << 48 and 2 << 48 (4 GiB each),
/// GPUVM from `AMDGPU_VA_RESERVED_BOTTOM` (64 KiB) to the 47-bit `gpuvm_size`.
const LDS_BASE_V9: u64 = 1 << 48;
const SCRATCH_BASE_V9: u64 = 2 << 48;
const GPUVM_BASE: u64 = 1 << 16;
const GPUVM_LIMIT: u64 = (1 << 47) - 1;

impl Kfd {
    pub(super) fn acquire_vm(
        &mut self,
        pid: u32,
        a: AcquireVmArgs,
        host: &mut dyn Host,
    ) -> Outcome {
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
    pub(super) fn map_memory(
        &mut self,
        pid: u32,
        map: bool,
        input: &[u8],
        host: &mut dyn Host,
    ) -> Outcome {
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

    pub(super) fn alloc_memory(&mut self, pid: u32, mut a: AllocMemoryOfGpuArgs) -> Outcome {
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
        if a.flags & f::DOORBELL != 0 && a.size != DOORBELL_SLICE {
            return err(libc::EINVAL, a.as_bytes());
        }
        if a.flags & f::MMIO_REMAP != 0 && a.size != PAGE {
            return err(libc::EINVAL, a.as_bytes());
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
        let slice = p.doorbell_slice;
        // Every BO gets an offset in its device's render-node mmap space (amdgpu_bo_mmap_offset);
        // the MMIO remap page is mapped through /dev/kfd instead.
        let mmap_offset = if a.flags & f::MMIO_REMAP != 0 {
            mmap::kfd_offset(mmap::TYPE_MMIO, a.gpu_id, slice, 0)
        } else {
            let Some(g) = self.gpus.iter_mut().find(|g| g.gpu_id == a.gpu_id) else {
                return err(libc::EINVAL, a.as_bytes());
            };
            let off = g.next_bo_offset;
            g.next_bo_offset += a.size.next_multiple_of(PAGE);
            off
        };
        a.mmap_offset = mmap_offset;
        let Some(p) = self.procs.get_mut(&pid) else {
            return err(libc::EINVAL, a.as_bytes());
        };
        p.allocs.insert(
            a.handle,
            Alloc {
                gpu_id: a.gpu_id,
                va,
                size: a.size,
                flags: a.flags,
                mapped: false,
                mmap_offset,
            },
        );
        done(0, a.as_bytes())
    }

    pub(super) fn free_memory(&mut self, pid: u32, a: FreeMemoryOfGpuArgs) -> Outcome {
        let p = self.process_mut(pid);
        let Some(m) = p.allocs.remove(&a.handle) else {
            return err(libc::EINVAL, a.as_bytes());
        };
        if m.flags & kfd::alloc_mem_flags::MMIO_REMAP == 0 {
            self.freed_bos
                .push((m.gpu_id, m.mmap_offset, m.size.next_multiple_of(PAGE)));
        }
        let p = self.process_mut(pid);
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
}

impl Kfd {
    /// `kfd_process_device_data_by_id` then `kfd_bind_process_to_device`: EINVAL for a device the
    /// process does not have, `bind_err` when its VM was never acquired.
    fn bound(&mut self, pid: u32, gpu_id: u32, bind_err: i32) -> Result<(), i32> {
        match self.process_mut(pid).pdds.get(&gpu_id) {
            None => Err(libc::EINVAL),
            Some(d) if !d.vm_acquired => Err(bind_err),
            Some(_) => Ok(()),
        }
    }

    /// `kfd_ioctl_get_process_apertures_new`: with `num_of_nodes` 0 it returns how many devices the
    /// process has; otherwise it fills that many entries and returns how many it filled.
    pub(super) fn apertures(&mut self, pid: u32, input: &[u8], _host: &mut dyn Host) -> Outcome {
        let mut a = GetProcessAperturesNewArgs::from_bytes(input);
        let ids: Vec<u32> = self.process_mut(pid).pdds.keys().copied().collect();
        if a.num_of_nodes == 0 {
            a.num_of_nodes = ids.len() as u32;
            return done(0, a.as_bytes());
        }
        let n = (a.num_of_nodes as usize).min(ids.len());
        let mut bytes = Vec::new();
        for gpu_id in &ids[..n] {
            let e = ProcessDeviceApertures {
                lds_base: LDS_BASE_V9,
                lds_limit: LDS_BASE_V9 | 0xffff_ffff,
                scratch_base: SCRATCH_BASE_V9,
                scratch_limit: SCRATCH_BASE_V9 | 0xffff_ffff,
                gpuvm_base: GPUVM_BASE,
                gpuvm_limit: GPUVM_LIMIT,
                gpu_id: *gpu_id,
                pad: 0,
            };
            bytes.extend_from_slice(e.as_bytes());
        }
        self.pending_writes
            .push((pid, a.kfd_process_device_apertures_ptr, bytes));
        a.num_of_nodes = n as u32;
        done(0, a.as_bytes())
    }

    /// `kfd_ioctl_get_clock_counters`: the GPU's 100 MHz timestamp counter (0 for a device the
    /// process does not have), the raw monotonic and boot-time clocks in ns, frequency 1 GHz.
    pub(super) fn clock_counters(&mut self, pid: u32, input: &[u8], now: u64) -> Outcome {
        let mut a = GetClockCountersArgs::from_bytes(input);
        let has = self.process_mut(pid).pdds.contains_key(&a.gpu_id);
        a.gpu_clock_counter = if has { now / 10 } else { 0 };
        a.cpu_clock_counter = clock_ns(libc::CLOCK_MONOTONIC_RAW);
        a.system_clock_counter = clock_ns(libc::CLOCK_BOOTTIME);
        a.system_clock_freq = 1_000_000_000;
        done(0, a.as_bytes())
    }

    /// `kfd_ioctl_set_memory_policy`: coherent (0) or non-coherent (1) policies only.
    pub(super) fn memory_policy(&mut self, pid: u32, input: &[u8]) -> Outcome {
        let a = SetMemoryPolicyArgs::from_bytes(input);
        if a.default_policy > 1 || a.alternate_policy > 1 {
            return err(libc::EINVAL, input);
        }
        match self.bound(pid, a.gpu_id, libc::ESRCH) {
            Ok(()) => done(0, input),
            Err(e) => err(e, input),
        }
    }

    /// SET_SCRATCH_BACKING_VA and SET_TRAP_HANDLER: recorded by the kernel for the hardware;
    /// nothing the emulator runs uses them.
    pub(super) fn per_device_noop(&mut self, pid: u32, n: u32, input: &[u8]) -> Outcome {
        let gpu_id = if n == kfd::nr::SET_SCRATCH_BACKING_VA {
            kfd::SetScratchBackingVaArgs::from_bytes(input).gpu_id
        } else {
            kfd::SetTrapHandlerArgs::from_bytes(input).gpu_id
        };
        match self.bound(pid, gpu_id, libc::ESRCH) {
            Ok(()) => done(0, input),
            Err(e) => err(e, input),
        }
    }

    /// `kfd_ioctl_get_tile_config`: GFX9 has 32 tile modes and 16 macro tile modes, all zero
    /// (tiling is described by `gb_addr_config` there); at most as many as the caller has room for.
    pub(super) fn tile_config(&mut self, pid: u32, input: &[u8]) -> Outcome {
        let mut a = GetTileConfigArgs::from_bytes(input);
        if !self.process_mut(pid).pdds.contains_key(&a.gpu_id) {
            return err(libc::EINVAL, input);
        }
        a.num_tile_configs = a.num_tile_configs.min(32);
        a.num_macro_tile_configs = a.num_macro_tile_configs.min(16);
        for (ptr, n) in [
            (a.tile_config_ptr, a.num_tile_configs),
            (a.macro_tile_config_ptr, a.num_macro_tile_configs),
        ] {
            if n > 0 {
                self.pending_writes
                    .push((pid, ptr, vec![0; n as usize * 4]));
            }
        }
        a.gb_addr_config = 0;
        a.num_banks = 0;
        a.num_ranks = 0;
        done(0, a.as_bytes())
    }

    /// `kfd_ioctl_set_xnack_mode`: a negative value queries; a change is refused while the
    /// process has queues.
    pub(super) fn xnack_mode(&mut self, pid: u32, input: &[u8]) -> Outcome {
        let mut a = SetXnackModeArgs::from_bytes(input);
        let p = self.process_mut(pid);
        if a.xnack_enabled < 0 {
            a.xnack_enabled = i32::from(p.xnack);
            return done(0, a.as_bytes());
        }
        if !p.queues.is_empty() {
            return err(libc::EBUSY, input);
        }
        p.xnack = a.xnack_enabled != 0;
        done(0, a.as_bytes())
    }

    /// `kfd_ioctl_get_available_memory`: VRAM not used by this process.
    pub(super) fn available_memory(&mut self, pid: u32, input: &[u8]) -> Outcome {
        let mut a = GetAvailableMemoryArgs::from_bytes(input);
        let Some(total) = self.gpu(a.gpu_id).map(|g| g.spec.vram_bytes) else {
            return err(libc::EINVAL, input);
        };
        let Some(used) = self
            .process_mut(pid)
            .pdds
            .get(&a.gpu_id)
            .map(|d| d.vram_usage)
        else {
            return err(libc::EINVAL, input);
        };
        a.available = total.saturating_sub(used);
        done(0, a.as_bytes())
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
