//! Launch hints: uprobes on HIP/HSA launch entry points of watched processes.
//!
//! User space attaches these per process (only the processes the policy cares about), so the cost is
//! paid only there. A record is emitted at most once per `Config::launch_gap_ns` per process: the
//! first launch after a quiet spell is what the policy needs, and a request launches tens of kernels.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use gpreempt_common::{
    kprobe::launch,
    record::{kind, stat, LaunchRecord, LaunchState, RecordHeader},
};

use crate::{bucket, config, count, now_ns, EVENTS, LAUNCHES, WAITS};

/// `BPF_RB_FORCE_WAKEUP`: a hint is worth a wakeup of the reader even when it has not caught up
/// (the policy acts on it; the ring's adaptive wakeup would batch it with later records).
const BPF_RB_FORCE_WAKEUP: u64 = 2;

#[inline(always)]
fn hit(ctx: &ProbeContext, point: u32) -> u32 {
    count(stat::LAUNCH_SEEN);
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let now = now_ns();
    let gap = config().map_or(0, |c| c.launch_gap_ns);
    let suppressed = match LAUNCHES.get_ptr_mut(tgid) {
        Some(s) => {
            // SAFETY: a pointer into the map value; concurrent threads of one process may race on
            // these two fields, which only makes the rate limit approximate.
            let s = unsafe { &mut *s };
            if now.wrapping_sub(s.last_emit_ns) < gap {
                s.suppressed = s.suppressed.wrapping_add(1);
                return 0;
            }
            let n = s.suppressed;
            s.last_emit_ns = now;
            s.suppressed = 0;
            n
        }
        None => {
            let s = LaunchState {
                last_emit_ns: now,
                suppressed: 0,
                _pad: 0,
            };
            let _ = LAUNCHES.insert(tgid, s, 0);
            0
        }
    };
    count(stat::LAUNCH_EMITTED);
    let arg0 = ctx.arg::<u64>(0).unwrap_or(0);
    emit(pid_tgid, now, point, suppressed, arg0, BPF_RB_FORCE_WAKEUP)
}

/// One [`LaunchRecord`] into the ring (`flags`: the ring's wakeup flags).
#[inline(always)]
fn emit(pid_tgid: u64, now: u64, point: u32, suppressed: u32, arg0: u64, flags: u64) -> u32 {
    let rec = LaunchRecord {
        hdr: RecordHeader {
            kind: kind::LAUNCH,
            pid: (pid_tgid >> 32) as u32,
            tid: pid_tgid as u32,
            file_kind: 0,
            ts_ns: now,
            comm: bpf_get_current_comm().unwrap_or([0; 16]),
        },
        point,
        suppressed,
        arg0,
    };
    if EVENTS.output::<LaunchRecord>(&rec, flags).is_err() {
        count(stat::RINGBUF_FULL);
    }
    0
}

/// `hipError_t hipLaunchKernel(const void *function_address, dim3 numBlocks, dim3 dimBlocks,
/// void **args, size_t sharedMemBytes, hipStream_t stream)`.
#[uprobe]
pub fn up_hip_launch(ctx: ProbeContext) -> u32 {
    hit(&ctx, launch::HIP_LAUNCH_KERNEL)
}

/// `hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned gridDimX, ..., void **extra)`.
#[uprobe]
pub fn up_hip_module_launch(ctx: ProbeContext) -> u32 {
    hit(&ctx, launch::HIP_MODULE_LAUNCH_KERNEL)
}

/// `hipError_t hipExtModuleLaunchKernel(hipFunction_t f, uint32_t globalWorkSizeX, ...)`.
#[uprobe]
pub fn up_hip_ext_module_launch(ctx: ProbeContext) -> u32 {
    hit(&ctx, launch::HIP_EXT_MODULE_LAUNCH_KERNEL)
}

/// `hipError_t hipGraphLaunch(hipGraphExec_t graphExec, hipStream_t stream)`.
#[uprobe]
pub fn up_hip_graph_launch(ctx: ProbeContext) -> u32 {
    hit(&ctx, launch::HIP_GRAPH_LAUNCH)
}

/// `void hsa_queue_store_write_index_{relaxed,screlease,release}(const hsa_queue_t *queue,
/// uint64_t value)`: the AQL packet is written, the doorbell comes next.
#[uprobe]
pub fn up_hsa_write_index(ctx: ProbeContext) -> u32 {
    hit(&ctx, launch::HSA_QUEUE_STORE_WRITE_INDEX)
}

/// `void hsa_signal_store_{relaxed,screlease,release}(hsa_signal_t signal, hsa_signal_value_t
/// value)`: doorbell signals among others, so it is the noisiest hint.
#[uprobe]
pub fn up_hsa_signal_store(ctx: ProbeContext) -> u32 {
    hit(&ctx, launch::HSA_SIGNAL_STORE)
}

/// `CUresult cuLaunchKernel(CUfunction f, unsigned gridDimX, ..., void **extra)` (and `_ptsz`).
#[uprobe]
pub fn up_cu_launch(ctx: ProbeContext) -> u32 {
    hit(&ctx, launch::CU_LAUNCH_KERNEL)
}

/// `CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
/// void **extra)` (and `_ptsz`).
#[uprobe]
pub fn up_cu_launch_ex(ctx: ProbeContext) -> u32 {
    hit(&ctx, launch::CU_LAUNCH_KERNEL_EX)
}

/// `CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)` (and `_ptsz`).
#[uprobe]
pub fn up_cu_graph_launch(ctx: ProbeContext) -> u32 {
    hit(&ctx, launch::CU_GRAPH_LAUNCH)
}

/// A wait's entry or return: every one is a record (a request ends at the last return before
/// idleness, so none may be merged away), within the process's wait limit.
#[inline(always)]
fn wait(point: u32, arg0: u64) -> u32 {
    count(stat::WAIT_SEEN);
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let now = now_ns();
    let Some(dropped) = bucket(
        &WAITS,
        tgid,
        launch::WAIT_RATE_PER_S,
        launch::WAIT_BURST,
        now,
    ) else {
        count(stat::WAIT_DROPPED);
        return 0;
    };
    // No forced wakeup: these feed statistics, not the policy's trigger.
    emit(pid_tgid, now, point, dropped, arg0, 0)
}

/// Entry of a blocking wait (`kprobe::launch::WAITS`: `hipStreamSynchronize(hipStream_t)`,
/// `cuStreamSynchronize(CUstream)`, ...).
#[uprobe]
pub fn up_wait(ctx: ProbeContext) -> u32 {
    wait(launch::WAIT_ENTER, ctx.arg::<u64>(0).unwrap_or(0))
}

/// Return of a blocking wait: the GPU work it waited for is done.
#[uretprobe]
pub fn ur_wait(ctx: RetProbeContext) -> u32 {
    wait(launch::WAIT_RETURN, ctx.ret::<u64>())
}
