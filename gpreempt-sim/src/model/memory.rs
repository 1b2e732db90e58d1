//! GPU memory ioctls of the emulated amdkfd: ACQUIRE_VM, ALLOC / FREE / MAP / UNMAP_MEMORY_OF_GPU.

use gpreempt_common::kfd::{self, AcquireVmArgs, AllocMemoryOfGpuArgs, FreeMemoryOfGpuArgs};

use super::{done, err, Alloc, Host, Kfd, Outcome};

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

    pub(super) fn free_memory(&mut self, pid: u32, a: FreeMemoryOfGpuArgs) -> Outcome {
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
}
