//! GPU driver ioctls: KFD through an fentry + fexit pair on `kfd_ioctl` where the kernel has
//! BTF trampolines (its BTF is in the amdgpu module's; user space loads the pair against it),
//! else a kprobe + kretprobe pair where kprobes work (either way only KFD calls ever run these
//! programs), else, with NVIDIA RM escapes, through the syscall
//! tracepoints (present on every kernel, the floor of observation, but every ioctl on the host
//! runs the filter). All produce the same [`IoctlRecord`]s; the pairs on `kfd_ioctl` have no fd
//! (-1).
//!
//! The KFD dispatcher selects the handler by `_IOC_NR(cmd)` alone, whatever the type byte
//! (docs/kfd.md), so the programs select by the file behind the fd: fd -> `struct file` ->
//! inode, matched against [`Config::files`] (device numbers, or the emulator's inode), with
//! offsets from BTF. Every ioctl on /dev/kfd with a KFD nr is seen, whatever its type byte, and a
//! 'K' ioctl on /dev/null never reaches the ring buffer. Without the offsets the filter falls
//! back to the type byte ('K' / 'F'), and user space checks the fd in /proc.

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_probe_read_kernel, generated,
    },
    macros::{fentry, fexit, kprobe, kretprobe, tracepoint},
    programs::{FEntryContext, FExitContext, ProbeContext, RetProbeContext, TracePointContext},
    EbpfContext,
};
use aya_log_ebpf::{debug, warn};
use gpreempt_common::{
    kfd,
    kprobe::field as kf,
    nv,
    record::{
        config_flag, file_kind, file_match, kind, stat, Config, IoctlRecord, ARGS_MAX,
        MAX_GPU_FILES,
    },
    vfs,
};

use crate::{
    bucket, config, count, now_ns, read, EVENTS, GPU_PIDS, INFLIGHT, OFFSETS, RATES, SCRATCH,
};

// Offsets in the syscall tracepoints' records (events/syscalls/sys_{enter,exit}_ioctl/format):
// every syscall argument is 8 bytes from offset 16.
const ENTER_FD: usize = 16;
const ENTER_CMD: usize = 24;
const ENTER_ARG: usize = 32;
const EXIT_RET: usize = 16;

/// Reads a field of the tracepoint record. The record is program context, readable directly.
#[inline(always)]
fn field<T: Copy>(ctx: &TracePointContext, off: usize) -> T {
    // SAFETY: `off` is one of the constant offsets above, inside the syscall tracepoint record
    // (the verifier checks context accesses against the event's size at attach).
    unsafe { *(ctx.as_ptr().add(off) as *const T) }
}

/// Copies `len` (<= ARGS_MAX) bytes from user memory; returns the count read, 0 on fault.
///
/// `len` stays a u64 up to the helper call so that the bounds check and the call use one register
/// (a u32 copy would be a new, unbounded scalar to the verifier).
#[inline(always)]
fn read_user(dst: *mut u8, src: u64, len: u64) -> u32 {
    // Opaque to the optimiser: where it can prove the bound from the call site (the RM sizes
    // under nvidia_unlocked_ioctl) it drops the check, and the verifier, which cannot follow
    // that proof, then sees an unbounded length.
    let len = core::hint::black_box(len);
    if len == 0 || len > ARGS_MAX as u64 {
        return 0;
    }
    // SAFETY: `dst` points at an ARGS_MAX-byte buffer and len <= ARGS_MAX; the helper validates
    // the user address and returns an error instead of faulting.
    let r = unsafe { generated::bpf_probe_read_user(dst.cast(), len as u32, src as *const _) };
    if r == 0 {
        len as u32
    } else {
        0
    }
}

#[tracepoint(category = "syscalls", name = "sys_enter_ioctl")]
pub fn gpu_ioctl_enter(ctx: TracePointContext) -> u32 {
    enter(&ctx);
    0
}

/// What the calling process's `fd` refers to: one of [`file_kind`] (`NONE` when it is no GPU
/// device, or cannot be looked at), and whether it is no device node (a regular file: the
/// emulator's stand-in).
#[inline(always)]
fn file_kind_of(fd: i32, cfg: &Config) -> (u32, bool) {
    let Some(o) = OFFSETS.get(0) else {
        return (file_kind::NONE, false);
    };
    if fd < 0 {
        return (file_kind::NONE, false);
    }
    // SAFETY: no arguments; returns the current task's address (only ever read through
    // bpf_probe_read_kernel below).
    let task = unsafe { bpf_get_current_task() };
    let Some(fdt) = read(task, o, kf::TASK_FILES).and_then(|f| read(f, o, kf::FILES_FDT)) else {
        return (file_kind::NONE, false);
    };
    let max = read(fdt, o, kf::FDT_MAX_FDS).unwrap_or(0);
    if fd as u64 >= max {
        return (file_kind::NONE, false);
    }
    let Some(fds) = read(fdt, o, kf::FDT_FD) else {
        return (file_kind::NONE, false);
    };
    // SAFETY: a probe read of one slot of the fd array (fd < max_fds); faults return an error.
    let file = unsafe { bpf_probe_read_kernel((fds + 8 * fd as u64) as *const u64) }.unwrap_or(0);
    let Some(inode) = read(file, o, kf::FILE_INODE) else {
        return (file_kind::NONE, false);
    };
    let rdev = read(inode, o, kf::INODE_RDEV).unwrap_or(0) as u32;
    // Only files that are no device node are matched by identity (the emulator's stand-in).
    let (sdev, ino) = if rdev == 0 {
        (
            read(inode, o, kf::INODE_SB)
                .and_then(|sb| read(sb, o, kf::SB_DEV))
                .unwrap_or(0) as u32,
            read(inode, o, kf::INODE_INO).unwrap_or(0),
        )
    } else {
        (0, 0)
    };
    for i in 0..MAX_GPU_FILES {
        let r = &cfg.files[i];
        if r.kind == 0 {
            break;
        }
        let hit = if r.by == file_match::RDEV {
            rdev != 0 && rdev & r.mask == r.dev
        } else if r.by == file_match::INODE {
            rdev == 0 && ino != 0 && sdev == r.dev && ino == r.ino
        } else {
            false
        };
        if hit {
            return (r.kind, rdev == 0);
        }
    }
    (file_kind::NONE, false)
}

/// The per-process token bucket: whether `tgid` may emit one more record now.
#[inline(always)]
fn rate_allows(tgid: u32, cfg: &Config, now: u64) -> bool {
    let allowed = bucket(&RATES, tgid, cfg.rate_per_s, cfg.rate_burst, now).is_some();
    if !allowed {
        count(stat::RATE_LIMITED);
    }
    allowed
}

#[inline(always)]
fn enter(ctx: &TracePointContext) {
    let cmd = field::<u64>(ctx, ENTER_CMD) as u32;
    let (ty, nr) = (kfd::ioc_type(cmd), kfd::ioc_nr(cmd));
    // The drivers dispatch by nr: a call with neither a KFD nor an RM nr does nothing anywhere.
    let (mut kfd_nr, mut rm_nr) = (kfd::is_kfd_nr(nr), nv::is_rm_nr(nr));
    if !kfd_nr && !rm_nr {
        return;
    }
    let Some(cfg) = config() else { return };
    // Vendors with no file for the tracepoints here: their nrs are nobody's.
    if cfg.flags & config_flag::FILTER_FILES != 0 {
        kfd_nr &= cfg.flags & config_flag::NO_KFD_FILES == 0;
        rm_nr &= cfg.flags & config_flag::NO_NVIDIA_FILES == 0;
        if !kfd_nr && !rm_nr {
            return;
        }
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if cfg.flags & config_flag::FILTER_TGID != 0 && cfg.tgid != (pid_tgid >> 32) as u32 {
        return;
    }
    let typed = (ty == kfd::AMDKFD_IOCTL_BASE && kfd_nr) || (ty == nv::NV_IOCTL_MAGIC && rm_nr);
    let fd = field::<u64>(ctx, ENTER_FD) as i32;
    // Which decoder: KFD (true) or RM (false).
    let (file, is_kfd) = if cfg.flags & config_flag::FILTER_FILES != 0 {
        let (k, regular) = file_kind_of(fd, cfg);
        // Calls the VFS answers never reach the driver, whatever their nr; amdkfd's own node is
        // the kprobe pair's when it is live.
        if k == file_kind::KPROBED || vfs::answers(cmd, regular) {
            return;
        }
        if k == file_kind::KFD && kfd_nr {
            (k, true)
        } else if k == file_kind::NVIDIA && rm_nr {
            (k, false)
        } else {
            if typed {
                count(stat::OTHER_FILE);
            }
            return;
        }
    } else if typed {
        (file_kind::UNCHECKED, ty == kfd::AMDKFD_IOCTL_BASE)
    } else {
        return;
    };
    // Unchecked files: 'K' calls are the kprobe pair's when it is live.
    if file == file_kind::UNCHECKED && is_kfd && cfg.flags & config_flag::KFD_BY_KPROBE != 0 {
        return;
    }
    if !is_kfd && own_rm(cfg, pid_tgid) {
        return;
    }
    begin(
        ctx,
        cfg,
        pid_tgid,
        fd,
        cmd,
        field::<u64>(ctx, ENTER_ARG),
        file,
        is_kfd,
    );
}

/// `long kfd_ioctl(struct file *filep, unsigned int cmd, unsigned long arg)`: the file is KFD's
/// by construction, any type byte, and calls the VFS answers never get here.
#[kprobe]
pub fn kfd_ioctl_entry(ctx: ProbeContext) -> u32 {
    let cmd = ctx.arg::<u64>(1).unwrap_or(0) as u32;
    kfd_entry(&ctx, cmd, ctx.arg::<u64>(2).unwrap_or(0));
    0
}

#[kretprobe]
pub fn kfd_ioctl_return(ctx: RetProbeContext) -> u32 {
    finish(&ctx, ctx.ret::<i64>());
    0
}

/// [`kfd_ioctl_entry`] through a BTF trampoline: no breakpoint, and the arguments are the
/// context's. User space loads it against the BTF object that has `kfd_ioctl` (the amdgpu
/// module's, or vmlinux where amdgpu is built in); the `function` here only names it.
#[fentry(function = "kfd_ioctl")]
pub fn kfd_ioctl_fentry(ctx: FEntryContext) -> u32 {
    kfd_entry(&ctx, ctx.arg::<u64>(1) as u32, ctx.arg::<u64>(2));
    0
}

/// Entry to `kfd_ioctl`, from either pair: KFD nrs only, the pid filter, then [`begin`].
#[inline(always)]
fn kfd_entry<C: EbpfContext>(ctx: &C, cmd: u32, arg: u64) {
    if !kfd::is_kfd_nr(kfd::ioc_nr(cmd)) {
        return;
    }
    let Some(cfg) = config() else { return };
    let pid_tgid = bpf_get_current_pid_tgid();
    if cfg.flags & config_flag::FILTER_TGID != 0 && cfg.tgid != (pid_tgid >> 32) as u32 {
        return;
    }
    begin(ctx, cfg, pid_tgid, -1, cmd, arg, file_kind::KFD, true);
}

/// The return value follows the three arguments in an fexit context (read as an argument, not
/// with bpf_get_func_ret, which needs Linux 5.17).
#[fexit(function = "kfd_ioctl")]
pub fn kfd_ioctl_fexit(ctx: FExitContext) -> u32 {
    finish(&ctx, ctx.arg::<i64>(3));
    0
}

/// `long nvidia_unlocked_ioctl(struct file *file, unsigned int cmd, unsigned long i_arg)`
/// (kernel-open/nvidia/nv.c; the file operation of /dev/nvidiactl and /dev/nvidiaN, also their
/// compat_ioctl on x86-64; nvidia-uvm and nvidia-modeset have their own): the file is an RM node
/// by construction, so no other ioctl on the host runs a program. Loaded by user space against
/// the nvidia module's BTF (fentry) or as a kprobe pair.
#[fentry(function = "nvidia_unlocked_ioctl")]
pub fn nv_ioctl_fentry(ctx: FEntryContext) -> u32 {
    nv_entry(
        &ctx,
        ctx.arg::<u64>(0),
        ctx.arg::<u64>(1) as u32,
        ctx.arg::<u64>(2),
    );
    0
}

#[fexit(function = "nvidia_unlocked_ioctl")]
pub fn nv_ioctl_fexit(ctx: FExitContext) -> u32 {
    finish(&ctx, ctx.arg::<i64>(3));
    0
}

#[kprobe]
pub fn nv_ioctl_entry(ctx: ProbeContext) -> u32 {
    let file = ctx.arg::<u64>(0).unwrap_or(0);
    let cmd = ctx.arg::<u64>(1).unwrap_or(0) as u32;
    nv_entry(&ctx, file, cmd, ctx.arg::<u64>(2).unwrap_or(0));
    0
}

#[kretprobe]
pub fn nv_ioctl_return(ctx: RetProbeContext) -> u32 {
    finish(&ctx, ctx.ret::<i64>());
    0
}

/// Whether an RM escape is the observer's own ([`config_flag::SKIP_OWN_RM`]): counted and
/// dropped here, before it takes an in-flight slot or ring space.
#[inline(always)]
fn own_rm(cfg: &Config, pid_tgid: u64) -> bool {
    let own = cfg.flags & config_flag::SKIP_OWN_RM != 0 && cfg.own_tgid == (pid_tgid >> 32) as u32;
    if own {
        count(stat::OWN_SKIPPED);
    }
    own
}

/// Entry to `nvidia_unlocked_ioctl`, from either pair: RM escapes only, the pid filter, then
/// [`begin`]. The function has the file, not the fd the process used; the model needs the fd
/// only where a client is created (the RM ties a client to its file, and the controller
/// duplicates that fd), so only then is it looked up in the caller's fd table.
#[inline(always)]
fn nv_entry<C: EbpfContext>(ctx: &C, file: u64, cmd: u32, arg: u64) {
    let nr = kfd::ioc_nr(cmd);
    if !nv::is_rm_nr(nr) {
        return;
    }
    let Some(cfg) = config() else { return };
    let pid_tgid = bpf_get_current_pid_tgid();
    if cfg.flags & config_flag::FILTER_TGID != 0 && cfg.tgid != (pid_tgid >> 32) as u32 {
        return;
    }
    if own_rm(cfg, pid_tgid) {
        return;
    }
    let mut fd = -1;
    if nr == nv::nr::RM_ALLOC {
        let mut class = u32::MAX;
        // SAFETY: reads 4 bytes of the caller's struct into `class`; a fault returns an error.
        let r = unsafe {
            generated::bpf_probe_read_user(
                core::ptr::addr_of_mut!(class).cast(),
                4,
                (arg + nv::alloc::H_CLASS as u64) as *const _,
            )
        };
        if r == 0 && nv::class::is_client(class) {
            fd = fd_of(file);
        }
    }
    begin(ctx, cfg, pid_tgid, fd, cmd, arg, file_kind::NVIDIA, false);
}

/// The caller's fd that refers to `file`, or -1 (not among its first 64: libcuda opens its RM
/// fds early; fd 8 on the H100). Unrolled by hand: the 6.1 verifier took the loop LLVM made of a
/// `while` for an infinite one.
#[inline(always)]
fn fd_of(file: u64) -> i32 {
    let Some(o) = OFFSETS.get(0) else {
        return -1;
    };
    // SAFETY: no arguments; returns the current task's address (only ever read through
    // bpf_probe_read_kernel below).
    let task = unsafe { bpf_get_current_task() };
    let Some(fdt) = read(task, o, kf::TASK_FILES).and_then(|f| read(f, o, kf::FILES_FDT)) else {
        return -1;
    };
    let max = read(fdt, o, kf::FDT_MAX_FDS).unwrap_or(0);
    let Some(fds) = read(fdt, o, kf::FDT_FD) else {
        return -1;
    };
    macro_rules! scan {
        ($($i:literal)*) => {$(
            if $i >= max {
                return -1;
            }
            // SAFETY: a probe read of one slot of the fd array (i < max_fds); faults return an
            // error.
            if unsafe { bpf_probe_read_kernel((fds + 8 * $i) as *const u64) }.unwrap_or(0) == file {
                return $i;
            }
        )*};
    }
    scan!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
          32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60
          61 62 63);
    -1
}

/// Records the call's entry (rate limit, argument copy) for [`finish`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn begin<C: EbpfContext>(
    ctx: &C,
    cfg: &Config,
    pid_tgid: u64,
    fd: i32,
    cmd: u32,
    arg: u64,
    file: u32,
    is_kfd: bool,
) {
    let tgid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    let nr = kfd::ioc_nr(cmd);
    // The kernel's copy size of each struct: KFD by its table; NVIDIA RM escapes by theirs.
    let ksize = if is_kfd {
        kfd::arg_size(nr)
    } else {
        nv::arg_size(nr)
    };
    if !rate_allows(tgid, cfg, now_ns()) {
        return;
    }
    count(stat::SEEN);

    // Copy what the kernel will read: the caller's size, capped by the kernel struct's.
    let mut len = kfd::ioc_size(cmd) as u64;
    if (ksize as u64) < len {
        len = ksize as u64;
    }
    // Built in a per-CPU scratch slot: the entry is too big to zero on the stack per event.
    let Some(inflight) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a per-CPU slot, used only between here and the insert below, with preemption off.
    let inflight = unsafe { &mut *inflight };
    inflight.arg = arg;
    inflight.fd = fd;
    inflight.cmd = cmd;
    inflight.file_kind = file;
    inflight.args_len = read_user(inflight.args.as_mut_ptr(), arg, len);
    if len > 0 && inflight.args_len == 0 {
        count(stat::ARGS_FAULT);
        warn!(
            ctx,
            "tid {}: KFD ioctl nr {} argument at {:x} unreadable", tid, nr, arg
        );
    }
    debug!(
        ctx,
        "tid {} enters KFD ioctl nr {} ({} argument bytes)", tid, nr, len
    );
    if GPU_PIDS.get_ptr(tgid).is_none() {
        let _ = GPU_PIDS.insert(tgid, 1u8, 0);
    }
    // Taken last so the recorded duration covers the ioctl, not this program.
    inflight.ts_ns = now_ns();
    if INFLIGHT.insert(tid, &*inflight, 0).is_err() {
        count(stat::INFLIGHT_FULL);
        warn!(
            ctx,
            "tid {}: in-flight map refused KFD ioctl nr {}", tid, nr
        );
    }
}

#[tracepoint(category = "syscalls", name = "sys_exit_ioctl")]
pub fn gpu_ioctl_exit(ctx: TracePointContext) -> u32 {
    exit(&ctx);
    0
}

#[inline(always)]
fn exit(ctx: &TracePointContext) {
    finish(ctx, field::<i64>(ctx, EXIT_RET));
}

/// Emits the record of this thread's call in flight, if any, with the kernel's answer.
#[inline(always)]
fn finish<C: EbpfContext>(ctx: &C, ret: i64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let Some(inflight) = INFLIGHT.get_ptr(tid) else {
        return;
    };
    let now = now_ns();
    let Some(mut entry) = EVENTS.reserve::<IoctlRecord>(0) else {
        count(stat::RINGBUF_FULL);
        warn!(
            ctx,
            "ring buffer full: KFD ioctl record of tid {} dropped", tid
        );
        let _ = INFLIGHT.remove(tid);
        return;
    };
    let rec = entry.as_mut_ptr();
    // SAFETY: `rec` is a reserved, exclusively owned ring-buffer slot of IoctlRecord's size;
    // `inflight` is a live map value (this thread's own entry, removed only below).
    unsafe {
        let inf = &*inflight;
        (*rec).hdr.kind = kind::IOCTL;
        (*rec).hdr.pid = (pid_tgid >> 32) as u32;
        (*rec).hdr.tid = tid;
        (*rec).hdr.file_kind = inf.file_kind;
        (*rec).hdr.ts_ns = inf.ts_ns;
        (*rec).hdr.comm = bpf_get_current_comm().unwrap_or([0; 16]);
        (*rec).fd = inf.fd;
        (*rec).cmd = inf.cmd;
        (*rec).ret = ret;
        (*rec).duration_ns = now.wrapping_sub(inf.ts_ns);
        (*rec).arg = inf.arg;
        (*rec).args_len = inf.args_len;
        (*rec).args = inf.args;
        (*rec).out_len = 0;
        if kfd::ioc_dir(inf.cmd) & kfd::IOC_READ != 0 {
            (*rec).out_len = read_user((*rec).out.as_mut_ptr(), inf.arg, inf.args_len as u64);
        }
        // RM_ALLOC and RM_CONTROL: the parameters live behind a pointer at 16 (often on the
        // caller's stack, gone by the time user space could look): their head goes after the
        // struct, read at exit (a control's outputs, e.g. GET_TIMESLICE's value, are in by then).
        let nr = kfd::ioc_nr(inf.cmd);
        let rm = inf.file_kind == file_kind::NVIDIA
            || (inf.file_kind == file_kind::UNCHECKED
                && kfd::ioc_type(inf.cmd) == nv::NV_IOCTL_MAGIC);
        if rm && (nr == nv::nr::RM_ALLOC || nr == nv::nr::RM_CONTROL) && inf.args_len >= 28 {
            let a = &inf.args;
            let p = u64::from_le_bytes([a[16], a[17], a[18], a[19], a[20], a[21], a[22], a[23]]);
            // A control's buffer may be smaller than the head: never read past paramsSize.
            let size = u32::from_le_bytes([a[24], a[25], a[26], a[27]]);
            let len = if nr == nv::nr::RM_ALLOC {
                nv::ALLOC_HEAD_LEN
            } else if size >= nv::PARAMS_HEAD_LEN as u32 {
                nv::PARAMS_HEAD_LEN
            } else if size >= 8 {
                8
            } else if size >= 4 {
                4
            } else {
                0
            };
            let dst = (*rec).out.as_mut_ptr().add(nv::PARAMS_HEAD_AT);
            if len > 0 && read_user(dst, p, len as u64) > 0 {
                (*rec).out_len = (nv::PARAMS_HEAD_AT + len) as u32;
            } else if nr == nv::nr::RM_ALLOC && read_user(dst, p, nv::PARAMS_HEAD_LEN as u64) > 0 {
                // A small struct at the end of a mapping: the TSG head is enough.
                (*rec).out_len = (nv::PARAMS_HEAD_AT + nv::PARAMS_HEAD_LEN) as u32;
            }
        }
    }
    entry.submit(0);
    let _ = INFLIGHT.remove(tid);
}
