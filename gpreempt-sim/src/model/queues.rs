//! Queue ioctls of the emulated amdkfd: CREATE / DESTROY / UPDATE_QUEUE and SET_CU_MASK, with the
//! ring checks they share.

use gpreempt_common::kfd::{
    self, ec, ec_mask, queue_type, CreateQueueArgs, DestroyQueueArgs, SetCuMaskArgs,
    UpdateQueueArgs,
};

use super::{done, err, Errno, Host, Kfd, Outcome, Queue, Wait, ENOTSUPP};

/// `set_queue_properties_from_user`, in the kernel's order: the ring's size (clamped) or errno.
fn user_props(a: &CreateQueueArgs) -> Result<u32, i32> {
    let size = ring_props(
        a.queue_percentage,
        a.queue_priority,
        a.ring_base_address,
        a.ring_size,
    )?;
    if !user_range_ok(a.read_pointer_address, 4)
        || !user_range_ok(a.write_pointer_address, 4)
        || (a.eop_buffer_address != 0 && !user_range_ok(a.eop_buffer_address, 4))
        || (a.ctx_save_restore_address != 0 && !user_range_ok(a.ctx_save_restore_address, 4))
    {
        return Err(libc::EFAULT);
    }
    if !matches!(
        a.queue_type,
        queue_type::COMPUTE
            | queue_type::COMPUTE_AQL
            | queue_type::SDMA
            | queue_type::SDMA_XGMI
            | queue_type::SDMA_BY_ENG_ID
    ) {
        return Err(ENOTSUPP);
    }
    Ok(size)
}

/// `allocate_doorbell`: the lowest free doorbell of the process on `gpu_id` (None: EBUSY).
fn allocate_doorbell(p: &super::Process, gpu_id: u32, is_sdma: bool) -> Option<u32> {
    let used: Vec<u32> = p
        .queues
        .values()
        .filter(|q| q.gpu_id == gpu_id)
        .map(|q| q.doorbell_id)
        .collect();
    let reserved = |d: u32| (0x100..=0x18f).contains(&(d % 512));
    if is_sdma {
        Some((0x100..0x190).find(|d| !used.contains(d)).unwrap_or(0x100))
    } else {
        (0..kfd::KFD_MAX_NUM_OF_QUEUES_PER_PROCESS).find(|d| !reserved(*d) && !used.contains(d))
    }
}

impl Kfd {
    /// `set_queue_properties_from_user` + `kfd_ioctl_create_queue`.
    pub(super) fn create_queue(
        &mut self,
        pid: u32,
        mut a: CreateQueueArgs,
        host: &mut dyn Host,
        now: u64,
    ) -> Outcome {
        match user_props(&a) {
            Ok(size) => a.ring_size = size,
            Err(e) => return err(e, a.as_bytes()),
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
        let Some(doorbell_id) = allocate_doorbell(p, a.gpu_id, is_sdma) else {
            return err(libc::EBUSY, a.as_bytes());
        };
        // A process's doorbell slice is two pages of 64-bit doorbells; doorbell_off is a dword index.
        let slice_dw = p.doorbell_slice * (kfd::DOORBELL_PROCESS_SLICE_BYTES as u32 / 4);
        let doorbell_off = slice_dw + doorbell_id * 2;
        a.queue_id = qid;
        // The emulator's mmap offset (mmap.rs): upstream's type and gpu_id do not fit a FUSE file.
        a.doorbell_offset = crate::mmap::kfd_offset(
            crate::mmap::TYPE_DOORBELL,
            a.gpu_id,
            p.doorbell_slice,
            doorbell_id * 8,
        );
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

    pub(super) fn destroy_queue(&mut self, pid: u32, input: &[u8], now: u64) -> Outcome {
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

    pub(super) fn update_queue(&mut self, pid: u32, mut a: UpdateQueueArgs, now: u64) -> Outcome {
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

    pub(super) fn set_cu_mask(
        &mut self,
        pid: u32,
        a: SetCuMaskArgs,
        host: &mut dyn Host,
    ) -> Outcome {
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
