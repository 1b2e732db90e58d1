//! The debug trap of the emulated amdkfd (`kfd_debug.c`): raising events, DBG_TRAP enable /
//! disable, suspend / resume of queues, event queries and queue / device snapshots.

use std::os::fd::{AsRawFd, OwnedFd};

use gpreempt_common::kfd::{
    self, dbg_op, ec, ec_mask, runtime_state, DbgDeviceInfoEntry, DbgTrapArgs,
    DbgTrapDeviceSnapshotArgs, DbgTrapEnableArgs, DbgTrapQueryDebugEventArgs,
    DbgTrapQueueSnapshotArgs, DbgTrapResumeQueuesArgs, DbgTrapSendRuntimeEventArgs,
    DbgTrapSetExceptionsEnabledArgs, DbgTrapSuspendQueuesArgs, QueueSnapshotEntry, RuntimeInfo,
    KFD_DBG_QUEUE_ERROR_MASK, KFD_DBG_QUEUE_INVALID_MASK,
};

use super::{done, err, Caller, Debug, Errno, Host, Kfd, Outcome, Queue};

impl Kfd {
    /// `kfd_dbg_ev_raise`: record the event on its queue / device / process and, if the debugger
    /// subscribed to it, write '.' to the debugger's fd. Nothing is recorded without a debugger.
    pub(super) fn raise(&mut self, pid: u32, mask: u64, gpu_id: Option<u32>, qid: u32) {
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
    pub(super) fn dbg_trap(
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
        // The permission rule covers every op, DISABLE included (the 2025 fix; earlier kernels
        // exempted DISABLE): the ptrace parent, or the process whose ENABLE made the session.
        if tpid != caller.tgid
            && !traced_by_caller
            && self.procs[&tpid].debugger_process != Some(caller.tgid)
        {
            return err(libc::EPERM, out.as_bytes());
        }
        if a.op == dbg_op::ENABLE && tpid != caller.tgid {
            self.process_mut(tpid).debugger_process = Some(caller.tgid);
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
        t.debugger_process = None;
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
    pub(super) fn resume_all(&mut self, pid: u32, now: u64) {
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

/// One '.' per event, without blocking (a full pipe already says "look").
fn notify(fd: &OwnedFd) {
    // SAFETY: writing one byte from a valid buffer to a descriptor we own.
    let _ = unsafe { libc::write(fd.as_raw_fd(), b".".as_ptr().cast(), 1) };
}
