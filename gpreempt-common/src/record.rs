//! Records the eBPF programs push into the ring buffer, and the types of their maps.
//!
//! Every record starts with a [`RecordHeader`]; `kind` says which record follows. All records are
//! `#[repr(C)]`, 8-byte aligned and padded explicitly so the layout is the same on both sides.

/// Bytes of an ioctl argument struct that the programs copy. The largest KFD argument we decode is
/// `kfd_ioctl_create_queue_args` (96 bytes, KFD 1.17+); larger structs are copied truncated. The
/// output side also carries an RM_ALLOC's parameter head after its 48-byte NVOS64 (up to a
/// channel's first `userdOffset`, [`crate::nv::ALLOC_HEAD_LEN`]), hence 128.
pub const ARGS_MAX: usize = 128;
/// `TASK_COMM_LEN`.
pub const COMM_LEN: usize = 16;

/// Ring buffer size in bytes (a power of two multiple of the page size).
pub const RING_BYTES: u32 = 8 << 20;
/// In-flight (entered, not yet exited) GPU driver ioctls tracked at once, one per thread.
pub const MAX_INFLIGHT: u32 = 16_384;
/// Processes remembered as GPU driver users, KFD or NVIDIA (their exit is reported).
pub const MAX_GPU_PIDS: u32 = 16_384;

/// Values of [`RecordHeader::kind`].
pub mod kind {
    /// An [`IoctlRecord`](super::IoctlRecord): one GPU driver ioctl (KFD or NVIDIA RM), from syscall
    /// entry to exit.
    pub const IOCTL: u32 = 1;
    /// A [`ProcessExitRecord`](super::ProcessExitRecord): a GPU process's group leader exited.
    pub const PROCESS_EXIT: u32 = 2;
    /// A [`KernelRecord`](super::KernelRecord): an amdkfd function fired (kprobe).
    pub const KERNEL: u32 = 3;
    /// A [`LaunchRecord`](super::LaunchRecord): a watched process entered a launch entry point (uprobe).
    pub const LAUNCH: u32 = 4;
}

/// Indices of the per-CPU statistics array `STATS`.
pub mod stat {
    /// A record could not be reserved in the ring buffer (user space too slow): dropped.
    pub const RINGBUF_FULL: u32 = 0;
    /// The in-flight map refused an entry: the ioctl was not recorded.
    pub const INFLIGHT_FULL: u32 = 1;
    /// The argument struct could not be read from user memory at entry (recorded with `args_len` 0).
    pub const ARGS_FAULT: u32 = 2;
    /// KFD ioctls seen at entry (after the filters).
    pub const SEEN: u32 = 3;
    /// Kernel-internal probe hits (kprobes).
    pub const KERNEL_SEEN: u32 = 4;
    /// Launch entry-point hits (uprobes), emitted or not.
    pub const LAUNCH_SEEN: u32 = 5;
    /// Launch hits emitted as records (the first of a burst, see `Config::launch_gap_ns`).
    pub const LAUNCH_EMITTED: u32 = 6;
    /// Ioctls typed as GPU driver calls ('K' or 'F', a driver nr) on a file that is no GPU
    /// device (e.g. /dev/null): dropped in the kernel. A flood shows up here, not in the ring.
    pub const OTHER_FILE: u32 = 7;
    /// GPU driver ioctls dropped by the per-process rate limit (see [`RateState`]).
    pub const RATE_LIMITED: u32 = 8;
    /// NVIDIA RM escapes made by the observer's own thread group ([`super::Config::own_tgid`]):
    /// dropped in the kernel, so its own driver calls (a scan of running processes, levers,
    /// the self-test's checks) never crowd other processes' records out of the ring.
    pub const OWN_SKIPPED: u32 = 9;
    /// Wait entries and returns seen (uprobes), emitted or not.
    pub const WAIT_SEEN: u32 = 10;
    /// Wait records dropped by the per-process limit (`kprobe::launch::WAIT_RATE_PER_S`).
    pub const WAIT_DROPPED: u32 = 11;
    /// Number of statistics.
    pub const COUNT: u32 = 12;
}

/// What the ioctl programs found behind an fd ([`RecordHeader::file_kind`], [`GpuFile::kind`]).
pub mod file_kind {
    /// Not looked at: the kernel layout is unknown ([`super::config_flag::FILTER_FILES`] off);
    /// the record was selected by its type byte and user space checks the fd in /proc.
    pub const UNCHECKED: u32 = 0;
    /// The KFD device (or the emulator's stand-in).
    pub const KFD: u32 = 1;
    /// An NVIDIA device node taking RM escapes (nvidiactl, nvidiaN).
    pub const NVIDIA: u32 = 2;
    /// A [`super::GpuFile`] rule that excludes (a node sharing a GPU major, e.g. nvidia-modeset).
    pub const NONE: u32 = 3;
    /// amdkfd's own nodes while the kprobe pair on `kfd_ioctl` reports their calls: the syscall
    /// tracepoints leave them alone.
    pub const KPROBED: u32 = 4;
}

/// How a [`GpuFile`] rule matches the inode behind an fd.
pub mod file_match {
    /// `inode.i_rdev & mask == dev` (a character device; `mask` picks major or major:minor).
    pub const RDEV: u32 = 1;
    /// `inode.i_sb.s_dev == dev && inode.i_ino == ino` (one file, e.g. the emulator's).
    pub const INODE: u32 = 2;
}

/// Rules in [`Config::files`].
pub const MAX_GPU_FILES: usize = 6;

/// One rule saying which files are GPU devices. The first rule that matches decides; `kind` 0
/// ends the list. Device numbers use the kernel's internal encoding (`major << 20 | minor`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuFile {
    /// One of [`file_kind`] (0: unused slot, end of the list).
    pub kind: u32,
    /// One of [`file_match`].
    pub by: u32,
    pub dev: u32,
    pub mask: u32,
    pub ino: u64,
}

/// Kernel `dev_t` bits of the minor number (`MINORBITS`).
pub const MINOR_BITS: u32 = 20;
/// Mask of a kernel `dev_t`'s major number.
pub const MAJOR_MASK: u32 = !((1 << MINOR_BITS) - 1);

/// Kernel `MKDEV`.
pub const fn mkdev(major: u32, minor: u32) -> u32 {
    major << MINOR_BITS | minor
}

/// Value of the `RATES` map, keyed by thread group id: a token bucket of GPU driver ioctl records.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateState {
    /// When `tokens` was last topped up.
    pub last_ns: u64,
    pub tokens: u32,
    /// Records dropped since the process's first; user space reports the growth.
    pub dropped: u32,
}

/// Bits of [`Config::flags`].
pub mod config_flag {
    /// Only trace the thread group `Config::tgid`.
    pub const FILTER_TGID: u32 = 1;
    /// Select ioctls by the file behind the fd ([`super::Config::files`]), any type byte, as the
    /// drivers dispatch them; without it, by the type byte ('K', 'F'), which a caller chooses.
    pub const FILTER_FILES: u32 = 2;
    /// KFD ioctls come from the kprobe + kretprobe pair on `kfd_ioctl`. With [`FILTER_FILES`]
    /// the rules say which files are amdkfd's ([`super::file_kind::KPROBED`]); without it the
    /// syscall tracepoints leave every 'K' call to the pair.
    pub const KFD_BY_KPROBE: u32 = 4;
    /// With [`FILTER_FILES`]: no file here is KFD's for the tracepoints (no KFD node, or the pair
    /// on `kfd_ioctl` serves them all), so a KFD nr ends the program at once instead of walking
    /// the caller's fd table (many tty ioctls share KFD's nrs).
    pub const NO_KFD_FILES: u32 = 8;
    /// With [`FILTER_FILES`]: likewise, no file is NVIDIA's for the tracepoints.
    pub const NO_NVIDIA_FILES: u32 = 16;
    /// NVIDIA RM escapes by thread group [`super::Config::own_tgid`] (the controller itself)
    /// are not recorded ([`super::stat::OWN_SKIPPED`]). Its KFD calls still are: the model learns
    /// which queues it suspended from them.
    pub const SKIP_OWN_RM: u32 = 32;
}

/// The programs' configuration, index 0 of the `CONFIG` array map, written by user space before attach.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub flags: u32,
    pub tgid: u32,
    /// A launch is reported only when the process's previous launch was at least this long ago
    /// (0: every launch). Launches come in bursts of tens per request; the first one is the hint.
    pub launch_gap_ns: u64,
    /// Per-process rate limit of ioctl records: tokens per second (0: no limit) ...
    pub rate_per_s: u32,
    /// ... and bucket size.
    pub rate_burst: u32,
    /// The observer's own thread group (used with [`config_flag::SKIP_OWN_RM`]).
    pub own_tgid: u32,
    pub _pad: u32,
    /// Which files are GPU devices (used with [`config_flag::FILTER_FILES`]).
    pub files: [GpuFile; MAX_GPU_FILES],
}

/// Common prefix of every record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordHeader {
    /// One of [`kind`].
    pub kind: u32,
    /// Thread group id (the process id user space sees), in the initial pid namespace.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Ioctl records: what the kernel found behind the fd ([`file_kind`]); 0 for the others.
    pub file_kind: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when the event began.
    pub ts_ns: u64,
    pub comm: [u8; COMM_LEN],
}

/// One GPU driver ioctl (a KFD ioctl or an NVIDIA RM escape): arguments copied at syscall
/// entry, outputs re-read at exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoctlRecord {
    pub hdr: RecordHeader,
    pub fd: i32,
    pub cmd: u32,
    /// The syscall's return value (negative errno on failure).
    pub ret: i64,
    pub duration_ns: u64,
    /// The user pointer passed as the ioctl argument.
    pub arg: u64,
    /// Bytes of `args` that were read at entry (0 if the read faulted).
    pub args_len: u32,
    /// Bytes of `out` that were read at exit (0 when the ioctl has no output direction or the read
    /// faulted).
    pub out_len: u32,
    pub args: [u8; ARGS_MAX],
    pub out: [u8; ARGS_MAX],
}

/// The group leader of a process that used KFD exited.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessExitRecord {
    pub hdr: RecordHeader,
    /// The process's ioctl records the per-process rate limit dropped, in all (its `RATES`
    /// entry goes with it). `task->exit_code` is not available to the tracepoint.
    pub rate_limited: u64,
}

/// An amdkfd function fired. `hdr.pid`/`hdr.tid` are the current task (which may be a kernel
/// worker); `target` is the KFD process the call is about, when the probe can tell.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelRecord {
    pub hdr: RecordHeader,
    /// One of [`crate::kprobe::id`].
    pub probe: u32,
    /// Thread group id of the KFD process concerned (0: unknown).
    pub target: u32,
    /// gpu_id (0: unknown).
    pub gpu_id: u32,
    /// Queue id within the process (`u32::MAX`: not a queue event).
    pub queue_id: u32,
    /// Probe-specific values; their meaning is documented at each program.
    pub args: [u64; 6],
}

/// A watched process entered a HIP/HSA/CUDA launch entry point, or entered or returned from
/// one of the runtime's blocking waits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchRecord {
    pub hdr: RecordHeader,
    /// One of [`crate::kprobe::launch`].
    pub point: u32,
    /// A launch: launches of this process suppressed since the previous record (same burst).
    /// A wait: wait records of this process dropped so far (its growth says some were lost).
    pub suppressed: u32,
    /// A launch or a wait's entry: the first argument (kernel function / graph / queue / signal
    /// handle / stream). A wait's return: the return value.
    pub arg0: u64,
}

/// Value of the `LAUNCHES` map, keyed by thread group id: the launch rate limit's memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchState {
    pub last_emit_ns: u64,
    pub suppressed: u32,
    pub _pad: u32,
}

/// Value of the in-flight map, keyed by thread id: what `sys_enter_ioctl` saw.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    pub ts_ns: u64,
    pub arg: u64,
    pub fd: i32,
    pub cmd: u32,
    pub args_len: u32,
    /// [`file_kind`] of the fd.
    pub file_kind: u32,
    pub args: [u8; ARGS_MAX],
}

impl Default for IoctlRecord {
    fn default() -> Self {
        Self {
            hdr: RecordHeader::default(),
            fd: 0,
            cmd: 0,
            ret: 0,
            duration_ns: 0,
            arg: 0,
            args_len: 0,
            out_len: 0,
            args: [0; ARGS_MAX],
            out: [0; ARGS_MAX],
        }
    }
}

const _: () = assert!(core::mem::size_of::<RecordHeader>() == 40);
const _: () = assert!(core::mem::size_of::<IoctlRecord>() == 40 + 40 + 2 * ARGS_MAX);
const _: () = assert!(core::mem::align_of::<IoctlRecord>() == 8);
const _: () = assert!(core::mem::size_of::<InFlight>() == 32 + ARGS_MAX);
const _: () = assert!(core::mem::size_of::<KernelRecord>() == 40 + 16 + 48);
const _: () = assert!(core::mem::size_of::<LaunchRecord>() == 40 + 16);
const _: () = assert!(core::mem::size_of::<Config>() == 32 + 24 * MAX_GPU_FILES);
const _: () = assert!(core::mem::size_of::<GpuFile>() == 24);
const _: () = assert!(core::mem::size_of::<RateState>() == 16);

#[cfg(feature = "user")]
mod user {
    use super::*;
    // SAFETY: plain #[repr(C)] integers and byte arrays with explicit padding fields: every bit
    // pattern is valid and there are no implicit padding bytes.
    unsafe impl aya::Pod for Config {}
    // SAFETY: as above.
    unsafe impl aya::Pod for InFlight {}
    // SAFETY: as above.
    unsafe impl aya::Pod for LaunchState {}
    // SAFETY: as above.
    unsafe impl aya::Pod for RateState {}
}
