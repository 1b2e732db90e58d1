//! Kernel-internal probes on amdkfd functions (docs/kfd.md).
//!
//! Struct offsets and moved parameters come from the `OFFSETS` map, filled by user space from BTF;
//! user space attaches a program only when every field it needs is known. The programs still treat
//! every read as fallible: an unknown or faulting read yields 0, never a wrong pointer chase.
//! Each program names the prototype it assumes (upstream, Linux 6.8 - 6.18).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{fentry, kprobe},
    programs::{FEntryContext, ProbeContext},
};
use gpreempt_common::{
    kprobe::{field, id, KernelOffsets},
    record::{config_flag, kind, stat, KernelRecord, RecordHeader},
};

use crate::{config, count, now_ns, read, EVENTS, OFFSETS};

const NO_QUEUE: u32 = u32::MAX;

/// Thread group id of a `struct kfd_process *` (`p->lead_thread->tgid`), 0 when unknown.
#[inline(always)]
fn process_tgid(p: u64, o: &KernelOffsets) -> u32 {
    read(p, o, field::PROCESS_LEAD_THREAD)
        .and_then(|t| read(t, o, field::TASK_TGID))
        .unwrap_or(0) as u32
}

/// gpu_id of a `struct kfd_node *`, 0 when unknown.
#[inline(always)]
fn node_id(dev: u64, o: &KernelOffsets) -> u32 {
    read(dev, o, field::NODE_ID).unwrap_or(0) as u32
}

/// Register argument `n` (0-based) when `n` is only known at run time (a parameter located by BTF).
/// All six registers are read at constant context offsets first: a `match` on `n` around the reads
/// gets merged by the compiler into one read at a computed context offset, which the verifier
/// rejects ("dereference of modified ctx ptr").
#[inline(always)]
fn arg_at(ctx: &ProbeContext, n: u32) -> u64 {
    let a = [
        arg(ctx, 0),
        arg(ctx, 1),
        arg(ctx, 2),
        arg(ctx, 3),
        arg(ctx, 4),
        arg(ctx, 5),
    ];
    if n == 0 {
        a[0]
    } else if n == 1 {
        a[1]
    } else if n == 2 {
        a[2]
    } else if n == 3 {
        a[3]
    } else if n == 4 {
        a[4]
    } else if n == 5 {
        a[5]
    } else {
        0
    }
}

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// Emits one record, honouring the pid filter (on the process concerned or the current one).
#[inline(always)]
fn emit(probe: u32, target: u32, gpu_id: u32, queue_id: u32, args: [u64; 6]) {
    count(stat::KERNEL_SEEN);
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let Some(cfg) = config() else { return };
    if cfg.flags & config_flag::FILTER_TGID != 0 && cfg.tgid != tgid && cfg.tgid != target {
        return;
    }
    let rec = KernelRecord {
        hdr: RecordHeader {
            kind: kind::KERNEL,
            pid: tgid,
            tid: pid_tgid as u32,
            file_kind: 0,
            ts_ns: now_ns(),
            comm: bpf_get_current_comm().unwrap_or([0; 16]),
        },
        probe,
        target,
        gpu_id,
        queue_id,
        args,
    };
    if EVENTS.output::<KernelRecord>(&rec, 0).is_err() {
        count(stat::RINGBUF_FULL);
    }
}

macro_rules! offsets_or_return {
    () => {
        match OFFSETS.get(0) {
            Some(o) => o,
            None => return 0,
        }
    };
}

/// `long kfd_ioctl(struct file *filep, unsigned int cmd, unsigned long arg)` (static, kfd_fops).
/// args: [cmd, arg, filep->private_data (the `struct kfd_process *`, 0 if unknown)].
#[kprobe]
pub fn kp_kfd_ioctl(ctx: ProbeContext) -> u32 {
    let o = offsets_or_return!();
    let private = read(arg(&ctx, 0), o, field::FILE_PRIVATE_DATA).unwrap_or(0);
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    emit(
        id::KFD_IOCTL,
        tgid,
        0,
        NO_QUEUE,
        [arg(&ctx, 1), arg(&ctx, 2), private, 0, 0, 0],
    );
    0
}

/// The same as [`kp_kfd_ioctl`] through fentry, where `kfd_ioctl` is in vmlinux BTF (amdgpu built
/// in): a trampoline instead of an int3. aya 0.14 cannot pass a module BTF object to fentry, so
/// with amdgpu as a module the kprobe is used.
#[fentry(function = "kfd_ioctl")]
pub fn fe_kfd_ioctl(ctx: FEntryContext) -> u32 {
    let o = offsets_or_return!();
    let filep: u64 = ctx.arg(0);
    let cmd: u64 = ctx.arg(1);
    let user_arg: u64 = ctx.arg(2);
    let private = read(filep, o, field::FILE_PRIVATE_DATA).unwrap_or(0);
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    emit(
        id::KFD_IOCTL,
        tgid,
        0,
        NO_QUEUE,
        [cmd & 0xffff_ffff, user_arg, private, 0, 0, 0],
    );
    0
}

/// Identity of a `struct queue *`. args: [type, priority, doorbell_off, queue_address,
/// queue_size, (pipe << 32 | queue) or u64::MAX when the slot fields are unknown].
#[inline(always)]
fn queue_event(probe: u32, q: u64, o: &KernelOffsets) {
    let props = match o.get(field::QUEUE_PROPERTIES) {
        Some((off, _)) if q != 0 => q.wrapping_add(off as u64),
        _ => 0,
    };
    let queue_id = read(props, o, field::PROPS_QUEUE_ID).unwrap_or(NO_QUEUE as u64) as u32;
    let target = process_tgid(read(q, o, field::QUEUE_PROCESS).unwrap_or(0), o);
    let gpu = node_id(read(q, o, field::QUEUE_DEVICE).unwrap_or(0), o);
    let slot = match (
        read(q, o, field::QUEUE_PIPE),
        read(q, o, field::QUEUE_QUEUE),
    ) {
        (Some(p), Some(s)) => (p << 32) | (s & 0xffff_ffff),
        _ => u64::MAX,
    };
    let args = [
        read(props, o, field::PROPS_TYPE).unwrap_or(u64::MAX),
        read(props, o, field::PROPS_PRIORITY).unwrap_or(0),
        read(props, o, field::PROPS_DOORBELL_OFF).unwrap_or(0),
        read(props, o, field::PROPS_QUEUE_ADDRESS).unwrap_or(0),
        read(props, o, field::PROPS_QUEUE_SIZE).unwrap_or(0),
        slot,
    ];
    emit(probe, target, gpu, queue_id, args);
}

/// `int kfd_procfs_add_queue(struct queue *q)` (global, kfd_process.c): the queue is fully set up.
#[kprobe]
pub fn kp_queue_add(ctx: ProbeContext) -> u32 {
    let o = offsets_or_return!();
    queue_event(id::QUEUE_ADD, arg(&ctx, 0), o);
    0
}

/// `void kfd_procfs_del_queue(struct queue *q)` (global): from pqm_destroy_queue and pqm_uninit.
#[kprobe]
pub fn kp_queue_del(ctx: ProbeContext) -> u32 {
    let o = offsets_or_return!();
    queue_event(id::QUEUE_DEL, arg(&ctx, 0), o);
    0
}

/// gpu_id of a `struct packet_manager *` (`pm->dqm->dev->id`).
#[inline(always)]
fn pm_gpu(pm: u64, o: &KernelOffsets) -> u32 {
    let dqm = read(pm, o, field::PM_DQM).unwrap_or(0);
    node_id(read(dqm, o, field::DQM_DEV).unwrap_or(0), o)
}

/// `int pm_send_runlist(struct packet_manager *pm, struct list_head *dqm_queues)` (global): one
/// HWS runlist upload (MAP_PROCESS + MAP_QUEUES). args: [].
#[kprobe]
pub fn kp_runlist(ctx: ProbeContext) -> u32 {
    let o = offsets_or_return!();
    emit(id::RUNLIST, 0, pm_gpu(arg(&ctx, 0), o), NO_QUEUE, [0; 6]);
    0
}

/// `int pm_send_unmap_queue(struct packet_manager *pm, enum kfd_unmap_queues_filter filter,
/// uint32_t filter_param, bool reset)` (6.x; older kernels have a `type` before `filter`: the
/// positions come from BTF parameter names). args: [filter, filter_param].
#[kprobe]
pub fn kp_unmap(ctx: ProbeContext) -> u32 {
    let o = offsets_or_return!();
    let filter = arg_at(&ctx, o.off[field::ARG_UNMAP_FILTER]);
    let param = arg_at(&ctx, o.off[field::ARG_UNMAP_PARAM]) & 0xffff_ffff;
    emit(
        id::UNMAP,
        0,
        pm_gpu(arg(&ctx, 0), o),
        NO_QUEUE,
        [filter & 0xffff_ffff, param, 0, 0, 0, 0],
    );
    0
}

/// `int kfd_process_evict_queues(struct kfd_process *p, uint32_t trigger)` (global; DKMS:
/// `(p, bool force, uint32_t trigger)`, located by name). args: [trigger].
#[kprobe]
pub fn kp_evict(ctx: ProbeContext) -> u32 {
    let o = offsets_or_return!();
    let trigger = arg_at(&ctx, o.off[field::ARG_EVICT_TRIGGER]) & 0xffff_ffff;
    emit(
        id::EVICT,
        process_tgid(arg(&ctx, 0), o),
        0,
        NO_QUEUE,
        [trigger, 0, 0, 0, 0, 0],
    );
    0
}

/// `int kfd_process_restore_queues(struct kfd_process *p)` (global). args: [].
#[kprobe]
pub fn kp_restore(ctx: ProbeContext) -> u32 {
    let o = offsets_or_return!();
    emit(
        id::RESTORE,
        process_tgid(arg(&ctx, 0), o),
        0,
        NO_QUEUE,
        [0; 6],
    );
    0
}

/// `int suspend_queues(struct kfd_process *p, uint32_t num_queues, uint32_t grace_period,
/// uint64_t exception_clear_mask, uint32_t *usr_queue_id_array)` (global). The caller is the
/// debugger (`hdr.pid`). args: [num_queues, grace_period, exception_clear_mask, usr_queue_id_array].
#[kprobe]
pub fn kp_suspend(ctx: ProbeContext) -> u32 {
    let o = offsets_or_return!();
    let args = [
        arg(&ctx, 1) & 0xffff_ffff,
        arg(&ctx, 2) & 0xffff_ffff,
        arg(&ctx, 3),
        arg(&ctx, 4),
        0,
        0,
    ];
    emit(
        id::SUSPEND,
        process_tgid(arg(&ctx, 0), o),
        0,
        NO_QUEUE,
        args,
    );
    0
}

/// `int resume_queues(struct kfd_process *p, uint32_t num_queues, uint32_t *usr_queue_id_array)`
/// (global; a NULL array resumes all, as the kernel's own disable path does).
/// args: [num_queues, usr_queue_id_array].
#[kprobe]
pub fn kp_resume(ctx: ProbeContext) -> u32 {
    let o = offsets_or_return!();
    let args = [arg(&ctx, 1) & 0xffff_ffff, arg(&ctx, 2), 0, 0, 0, 0];
    emit(id::RESUME, process_tgid(arg(&ctx, 0), o), 0, NO_QUEUE, args);
    0
}

/// `int kgd_gfx_v9_hqd_load(struct amdgpu_device *adev, void *mqd, uint32_t pipe_id, uint32_t
/// queue_id, uint32_t __user *wptr, uint32_t wptr_shift, uint32_t wptr_mask, struct mm_struct *mm,
/// uint32_t inst)` (global; also kgd_gfx_v9_4_3_hqd_load). NO_HWS only. The current task is the
/// process creating or restoring the queue, or a kernel worker.
/// args: [pipe_id, queue_id, wptr (user VA), mqd].
#[kprobe]
pub fn kp_hqd_load(ctx: ProbeContext) -> u32 {
    let args = [
        arg(&ctx, 2) & 0xffff_ffff,
        arg(&ctx, 3) & 0xffff_ffff,
        arg(&ctx, 4),
        arg(&ctx, 1),
        0,
        0,
    ];
    emit(id::HQD_LOAD, 0, 0, NO_QUEUE, args);
    0
}

/// `int kgd_gfx_v9_hqd_destroy(struct amdgpu_device *adev, void *mqd, enum kfd_preempt_type
/// reset_type, unsigned int utimeout, uint32_t pipe_id, uint32_t queue_id, uint32_t inst)`
/// (global; also the v9_4_3 variant). args: [pipe_id, queue_id, reset_type, mqd].
#[kprobe]
pub fn kp_hqd_destroy(ctx: ProbeContext) -> u32 {
    let args = [
        arg(&ctx, 4) & 0xffff_ffff,
        arg(&ctx, 5) & 0xffff_ffff,
        arg(&ctx, 2) & 0xffff_ffff,
        arg(&ctx, 1),
        0,
        0,
    ];
    emit(id::HQD_DESTROY, 0, 0, NO_QUEUE, args);
    0
}

/// `static int mes_v11_0_add_hw_queue(struct amdgpu_mes *mes, struct mes_add_queue_input *input)`
/// (static(ops) via mes->funcs; also mes_v12_0). args: [process_id (PASID), doorbell_offset,
/// queue_type].
#[kprobe]
pub fn kp_mes_add(ctx: ProbeContext) -> u32 {
    let o = offsets_or_return!();
    let input = arg(&ctx, 1);
    let args = [
        read(input, o, field::MES_ADD_PROCESS_ID).unwrap_or(0),
        read(input, o, field::MES_ADD_DOORBELL).unwrap_or(0),
        read(input, o, field::MES_ADD_QUEUE_TYPE).unwrap_or(0),
        0,
        0,
        0,
    ];
    emit(id::MES_ADD, 0, 0, NO_QUEUE, args);
    0
}

/// `static int mes_v11_0_remove_hw_queue(struct amdgpu_mes *mes, struct mes_remove_queue_input
/// *input)` (also mes_v12_0). args: [doorbell_offset].
#[kprobe]
pub fn kp_mes_remove(ctx: ProbeContext) -> u32 {
    let o = offsets_or_return!();
    let doorbell = read(arg(&ctx, 1), o, field::MES_REMOVE_DOORBELL).unwrap_or(0);
    emit(id::MES_REMOVE, 0, 0, NO_QUEUE, [doorbell, 0, 0, 0, 0, 0]);
    0
}

/// `void kfd_dbg_ev_raise(uint64_t event_mask, struct kfd_process *process, struct kfd_node *dev,
/// unsigned int source_id, bool use_worker, void *exception_data, size_t exception_data_size)`
/// (global). `queue_id` is source_id (a queue id for queue events). args: [event_mask, source_id].
#[kprobe]
pub fn kp_dbg_ev_raise(ctx: ProbeContext) -> u32 {
    let o = offsets_or_return!();
    let source = arg(&ctx, 3) & 0xffff_ffff;
    emit(
        id::DBG_EV_RAISE,
        process_tgid(arg(&ctx, 1), o),
        node_id(arg(&ctx, 2), o),
        source as u32,
        [arg(&ctx, 0), source, 0, 0, 0, 0],
    );
    0
}
