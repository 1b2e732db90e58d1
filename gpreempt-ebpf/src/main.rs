//! gpreempt-ebpf's kernel programs.
//!
//! - `gpu_ioctl_enter` / `gpu_ioctl_exit` (tracepoints `syscalls/sys_enter_ioctl` and
//!   `syscalls/sys_exit_ioctl`): GPU driver ioctls (KFD, NVIDIA RM escapes), arguments at
//!   entry, outputs and return value at exit.
//! - `gpu_process_exit` (tracepoint `sched/sched_process_exit`): a process that used a GPU driver went away.
//! - `kp_*` / `fe_kfd_ioctl` (kprobes / fentry on amdkfd functions, optional): what the ioctl path
//!   cannot see (hardware map/unmap, evictions, teardown, suspensions by others). See `kernel`.
//! - `up_*` (uprobes on HIP/HSA launch entry points of chosen processes): launch hints.
//!
//! The programs only filter and copy; decoding happens in user space.
#![no_std]
#![no_main]

mod ioctl;
mod kernel;
mod launch;
mod process;

use aya_ebpf::{
    helpers::bpf_probe_read_kernel,
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray, RingBuf},
};
use gpreempt_common::{
    kprobe::KernelOffsets,
    record::{
        stat, Config, InFlight, LaunchState, RateState, MAX_GPU_PIDS, MAX_INFLIGHT, RING_BYTES,
    },
};

/// Every record, in order of completion.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(RING_BYTES, 0);

/// Index 0: the [`Config`] user space wrote before attaching.
#[map]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

/// Per-CPU counters, indexed by [`stat`].
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

/// KFD ioctls between entry and exit, by thread id. LRU so that a thread killed inside an ioctl
/// (no exit tracepoint) cannot leak an entry forever.
#[map]
static INFLIGHT: LruHashMap<u32, InFlight> = LruHashMap::with_max_entries(MAX_INFLIGHT, 0);

/// Per-CPU staging area for an in-flight entry.
#[map]
static SCRATCH: PerCpuArray<InFlight> = PerCpuArray::with_max_entries(1, 0);

/// Thread groups that issued a KFD ioctl (or that user space found in sysfs): their exit is reported.
#[map]
static GPU_PIDS: LruHashMap<u32, u8> = LruHashMap::with_max_entries(MAX_GPU_PIDS, 0);

/// Index 0: kernel struct offsets resolved from BTF by user space (see `gpreempt_common::kprobe`).
#[map]
static OFFSETS: Array<KernelOffsets> = Array::with_max_entries(1, 0);

/// GPU driver ioctl rate limit per thread group (`Config::rate_per_s`).
#[map]
static RATES: LruHashMap<u32, RateState> = LruHashMap::with_max_entries(MAX_GPU_PIDS, 0);

/// Launch-hint rate limit per thread group.
#[map]
static LAUNCHES: LruHashMap<u32, LaunchState> = LruHashMap::with_max_entries(MAX_GPU_PIDS, 0);

/// Wait-record limit per thread group (`kprobe::launch::WAIT_RATE_PER_S`).
#[map]
static WAITS: LruHashMap<u32, RateState> = LruHashMap::with_max_entries(MAX_GPU_PIDS, 0);

/// A per-process token bucket of `rate` records a second and `burst` at once, in `map`: the
/// records `tgid` dropped so far when it may emit one more now, None when it may not (the drop
/// is counted). A rate of 0 has no limit.
#[inline(always)]
fn bucket(
    map: &LruHashMap<u32, RateState>,
    tgid: u32,
    rate: u32,
    burst: u32,
    now: u64,
) -> Option<u32> {
    if rate == 0 {
        return Some(0);
    }
    let Some(s) = map.get_ptr_mut(tgid) else {
        let s = RateState {
            last_ns: now,
            tokens: burst.saturating_sub(1),
            dropped: 0,
        };
        let _ = map.insert(tgid, s, 0);
        return Some(0);
    };
    // SAFETY: a pointer into the map value; threads of one process on other CPUs may race on
    // it, which only makes the limit approximate.
    let s = unsafe { &mut *s };
    let elapsed = now.wrapping_sub(s.last_ns);
    if elapsed >= 1_000_000_000 {
        s.tokens = burst;
        s.last_ns = now;
    } else {
        // elapsed < 1e9 and rate < 2^32: no overflow.
        let add = elapsed * rate as u64 / 1_000_000_000;
        if add > 0 {
            let t = s.tokens as u64 + add;
            s.tokens = if t > burst as u64 { burst } else { t as u32 };
            s.last_ns = now;
        }
    }
    if s.tokens == 0 {
        s.dropped = s.dropped.wrapping_add(1);
        return None;
    }
    s.tokens -= 1;
    Some(s.dropped)
}

#[inline(always)]
fn count(index: u32) {
    if let Some(p) = STATS.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot: no other CPU writes it, and preemption is disabled while a
        // tracepoint program runs.
        unsafe { *p += 1 };
    }
}

/// CLOCK_MONOTONIC in ns.
#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: bpf_ktime_get_ns takes no arguments and has no preconditions.
    unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() }
}

/// Reads field `f` of the kernel object at `base`, zero-extended; None when unknown or unreadable.
///
/// One 8-byte read, masked to the field's size: a `match` on the size would give the verifier
/// four paths per read, and programs with a dozen reads then exceed the 1M-instruction budget of
/// older verifiers (Linux 6.1). Little-endian: the field is in the low bytes.
#[inline(always)]
fn read(base: u64, o: &KernelOffsets, f: usize) -> Option<u64> {
    if base == 0 || !o.is_known(f) {
        return None;
    }
    let addr = base.wrapping_add(o.off[f] as u64);
    let bits = (o.size[f] as u64 & 0xf) * 8;
    if bits == 0 || bits > 64 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel validates the address and returns an error instead of
    // faulting; the value is copied out, never dereferenced in place.
    let v = unsafe { bpf_probe_read_kernel(addr as *const u64) }.ok()?;
    Some(v & (u64::MAX >> ((64 - bits) & 63)))
}

/// The configuration user space wrote (always present: an array map's slot exists from creation).
#[inline(always)]
fn config() -> Option<&'static Config> {
    CONFIG.get(0)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// The kernel lets only GPL-compatible programs call GPL-only helpers (bpf_probe_read_*,
// bpf_get_current_task, ...): "Dual MIT/GPL" is one of the strings it accepts
// (license_is_gpl_compatible), and matches this crate's `MIT OR GPL-2.0-only` (docs/licenses.md).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
