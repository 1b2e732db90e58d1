//! Process exit of GPU driver users (KFD or NVIDIA) (tracepoint `sched/sched_process_exit`).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::tracepoint,
    programs::TracePointContext,
};
use gpreempt_common::record::{kind, stat, ProcessExitRecord, RecordHeader};

use crate::{count, now_ns, EVENTS, GPU_PIDS, RATES, WAITS};

#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn gpu_process_exit(_ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // The group leader's exit stands for the process (KFD keys its process on the leader too).
    if tgid != pid_tgid as u32 || GPU_PIDS.get_ptr(tgid).is_none() {
        return 0;
    }
    let _ = GPU_PIDS.remove(tgid);
    // SAFETY: a copy out of the map value (racing writers only make the count approximate).
    let rate_limited = unsafe { RATES.get(&tgid) }.map_or(0, |r| r.dropped as u64);
    // A later process reusing the pid starts with a full bucket and nothing dropped.
    let _ = RATES.remove(&tgid);
    let _ = WAITS.remove(&tgid);
    let rec = ProcessExitRecord {
        hdr: RecordHeader {
            kind: kind::PROCESS_EXIT,
            pid: tgid,
            tid: tgid,
            file_kind: 0,
            ts_ns: now_ns(),
            comm: bpf_get_current_comm().unwrap_or([0; 16]),
        },
        rate_limited,
    };
    if EVENTS.output::<ProcessExitRecord>(&rec, 0).is_err() {
        count(stat::RINGBUF_FULL);
    }
    0
}
