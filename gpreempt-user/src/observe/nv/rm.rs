//! Pausing a process's NVIDIA GPU channels on a stock GSP-RM driver (docs/nvidia-rm.md).
//!
//! RM ties a client to the open file it was created on, so controls on the target's client must
//! go through the target's own nvidiactl file: [`dup_fd`] takes a duplicate of the target's fd
//! with `pidfd_getfd` (ptrace-attach rights, no ptrace stop, nothing runs in the target). Then
//! `NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS` on the target's subdevice, listing the target's
//! (client, channel) pairs, stops the channels (a running kernel is preempted and later resumes
//! intact) and, with `bDisable = 0`, lets them run again ([`set_disabled`]).
//!
//! Deliberately absent: the per-channel `NVA06F_CTRL_CMD_GPFIFO_SCHEDULE` (`bEnable = 0`). The
//! driver accepts it, but it wedges the channels for good (only killing the process clears
//! them), so nothing here may issue it. `NVA06C_CTRL_CMD_GPFIFO_SCHEDULE` does nothing and
//! `NVA06C_CTRL_CMD_PREEMPT` only preempts once: neither pauses.

use std::{
    fmt,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    os::unix::fs::OpenOptionsExt as _,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context as _, Result};
use gpreempt_common::nv::{self, disable_channels as dc};
use nix::errno::Errno;

use crate::observe::procinfo::{NotThatProcess, ProcId};

/// A pidfd for `pid` (`pidfd_open`): a handle that cannot come to name another process.
pub fn pidfd_open(pid: u32) -> Result<OwnedFd> {
    let pid_t = libc::pid_t::try_from(pid).map_err(|_| dup_error(Errno::ESRCH, pid, None))?;
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new fd or -1.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid_t, 0 as libc::c_uint) };
    if r < 0 {
        return Err(dup_error(Errno::last(), pid, None));
    }
    // SAFETY: `r` is a fresh fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// A duplicate of `fd` of the process behind `pidfd` (`pidfd_getfd`): it shares the target's open
/// file. `pid` only names the process in errors.
pub fn getfd(pidfd: BorrowedFd, pid: u32, fd: i32) -> Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes two fds and flags by value and returns a new fd or -1.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_getfd,
            pidfd.as_raw_fd(),
            fd,
            0 as libc::c_uint,
        )
    };
    if r < 0 {
        return Err(dup_error(Errno::last(), pid, Some(fd)));
    }
    // SAFETY: `r` is a fresh fd (close-on-exec) that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as i32) })
}

/// A pidfd of the process `id` names, never of another process that got its pid: the pidfd
/// names whoever had the pid when it was opened; the pid's start time is read after that, and
/// the pidfd's process must still be alive after the read (a live process keeps its pid), so the
/// start time read was its own. Errors: [`DupError`] (gone) or [`PidReused`].
pub fn pidfd_of(id: ProcId) -> Result<OwnedFd> {
    use std::os::fd::AsFd as _;
    let pidfd = pidfd_open(id.pid)?;
    match id.check(std::path::Path::new("/proc")) {
        Ok(()) => {}
        Err(NotThatProcess::Gone) => return Err(dup_error(Errno::ESRCH, id.pid, None)),
        Err(NotThatProcess::Reused { .. }) => return Err(PidReused { pid: id.pid }.into()),
    }
    let mut fds = [nix::poll::PollFd::new(
        pidfd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    // Readable: the process exited after the open (the start time read may be a new owner's).
    if nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).map_or(true, |n| n > 0) {
        return Err(dup_error(Errno::ESRCH, id.pid, None));
    }
    Ok(pidfd)
}

/// A duplicate of fd `fd` of the process `id` names ([`pidfd_of`] + `pidfd_getfd`).
pub fn dup_fd(id: ProcId, fd: i32) -> Result<OwnedFd> {
    use std::os::fd::AsFd as _;
    let pidfd = pidfd_of(id)?;
    getfd(pidfd.as_fd(), id.pid, fd)
}

/// The pid names another process than the one asked for (a different start time): that one
/// is gone, and the pid's new owner is not touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidReused {
    pub pid: u32,
}

impl fmt::Display for PidReused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} was reused: the process it named exited (the new one was not touched)",
            self.pid
        )
    }
}

impl std::error::Error for PidReused {}

/// A failed `pidfd_open` / `pidfd_getfd`, displayed as one sentence (`fd`: None for
/// `pidfd_open`). Typed so that callers can tell a target that is gone from one they may not touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DupError {
    pub errno: Errno,
    pub pid: u32,
    pub fd: Option<i32>,
}

impl DupError {
    /// The process has exited (ESRCH) or no longer has the fd (EBADF): its file, and so its
    /// RM client, is out of reach, and there is nothing left to act on through it.
    pub fn is_gone(&self) -> bool {
        matches!(self.errno, Errno::ESRCH | Errno::EBADF)
    }
}

impl fmt::Display for DupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pid = self.pid;
        match (self.errno, self.fd) {
            (Errno::ESRCH, _) => write!(f, "process {pid} exited"),
            (Errno::EPERM, _) => write!(
                f,
                "no ptrace rights over pid {pid} (run as root; yama ptrace_scope)"
            ),
            (Errno::EBADF, Some(fd)) => write!(f, "pid {pid} has no fd {fd}"),
            (Errno::ENOSYS, _) => write!(f, "kernel lacks pidfd_getfd (Linux 5.6+)"),
            (e, Some(fd)) => write!(f, "pidfd_getfd(pid {pid}, fd {fd}): {}", e.desc()),
            (e, None) => write!(f, "pidfd_open(pid {pid}): {}", e.desc()),
        }
    }
}

impl std::error::Error for DupError {}

fn dup_error(errno: Errno, pid: u32, fd: Option<i32>) -> anyhow::Error {
    DupError { errno, pid, fd }.into()
}

/// Whether `e` is a [`DupError`] saying the target (or its fd) is gone, or a [`PidReused`].
pub fn is_gone(e: &anyhow::Error) -> bool {
    e.downcast_ref::<DupError>().is_some_and(DupError::is_gone)
        || e.downcast_ref::<PidReused>().is_some()
}

/// The NV_STATUS of a refused RM control anywhere in `e`'s chain.
pub fn nv_status(e: &anyhow::Error) -> Option<u32> {
    e.downcast_ref::<NvStatusError>().map(|s| s.status)
}

/// An RM control that the driver ran and refused: its NV_STATUS, with advice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvStatusError {
    pub cmd: u32,
    pub status: u32,
}

impl fmt::Display for NvStatusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.cmd == nv::CTRL_FIFO_DISABLE_CHANNELS {
            "FIFO_DISABLE_CHANNELS".to_string()
        } else if self.cmd == nv::CTRL_TSG_SET_TIMESLICE {
            "SET_TIMESLICE".to_string()
        } else if self.cmd == nv::CTRL_TSG_GET_TIMESLICE {
            "GET_TIMESLICE".to_string()
        } else {
            format!("RM control {:#x}", self.cmd)
        };
        write!(
            f,
            "{what} failed: {} ({:#x})",
            nv::status::name(self.status),
            self.status
        )?;
        match self.status {
            nv::status::NOT_SUPPORTED => {
                write!(f, ": this driver does not support it (GSP-RM drivers only)")
            }
            nv::status::INVALID_CLIENT => write!(f, ": the fd does not hold that client"),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for NvStatusError {}

/// NVOS54 for `_IOWR('F', RM_CONTROL, 32)`; `params` stays borrowed while the bytes are in use.
fn nvos54(h_client: u32, h_object: u32, cmd: u32, params: &mut [u8]) -> [u8; 32] {
    use nv::control as c;
    let mut b = [0u8; nv::control::SIZE as usize];
    b[c::H_CLIENT..c::H_CLIENT + 4].copy_from_slice(&h_client.to_le_bytes());
    b[c::H_OBJECT..c::H_OBJECT + 4].copy_from_slice(&h_object.to_le_bytes());
    b[c::CMD..c::CMD + 4].copy_from_slice(&cmd.to_le_bytes());
    // flags 0
    b[c::PARAMS..c::PARAMS + 8].copy_from_slice(&(params.as_mut_ptr() as u64).to_le_bytes());
    b[c::PARAMS_SIZE..c::PARAMS_SIZE + 4].copy_from_slice(&(params.len() as u32).to_le_bytes());
    b
}

/// One RM control on `fd` (a /dev/nvidiactl file holding `h_client`). The ioctl's own failure
/// (e.g. ENOTTY: not an NVIDIA file) is an error; the driver's verdict is the returned NV_STATUS
/// (0 = NV_OK). `params` must be exactly the command's parameter struct.
pub fn rm_control(
    fd: BorrowedFd,
    h_client: u32,
    h_object: u32,
    cmd: u32,
    params: &mut [u8],
) -> Result<u32> {
    let mut args = nvos54(h_client, h_object, cmd, params);
    let req = nv::iowr(nv::nr::RM_CONTROL, nv::control::SIZE);
    // SAFETY: `args` is the 32-byte NVOS54 the request's size names; its params pointer and size
    // describe `params`, which is mutably borrowed (alive, unaliased) for the whole call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, args.as_mut_ptr()) };
    if r < 0 {
        let e = Errno::last();
        // nix calls ENOTTY "Not a typewriter": say what it means here.
        let why = if e == Errno::ENOTTY {
            "ENOTTY (not an NVIDIA RM file: /dev/nvidiactl)".to_string()
        } else {
            e.to_string()
        };
        return Err(anyhow!("RM_CONTROL ioctl ({cmd:#x}): {why}"));
    }
    Ok(nv::u32_at(&args, nv::control::STATUS))
}

/// Channels (or TSG handles) of ONE RM client, all owned by the target process, and the
/// subdevice they run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channels {
    pub h_client: u32,
    pub h_subdevice: u32,
    pub channels: Vec<u32>,
}

/// FIFO_DISABLE_CHANNELS parameters for `channels`, one 536-byte block per call (64 pairs
/// each). Only the documented fields are set: bOnlyDisableScheduling = `schedule_only` (0: a
/// running kernel is preempted too; 1: it finishes, only what follows waits), bRewindGpPut = 0,
/// pRunlistPreemptEvent = 0 (required: only kernel callers may pass an event).
pub fn disable_params(
    h_client: u32,
    channels: &[u32],
    disable: bool,
    schedule_only: bool,
) -> Vec<[u8; dc::SIZE]> {
    channels
        .chunks(dc::MAX_CHANNELS)
        .map(|chunk| {
            let mut p = [0u8; dc::SIZE];
            p[dc::B_DISABLE] = disable as u8;
            p[dc::B_ONLY_DISABLE_SCHEDULING] = (disable && schedule_only) as u8;
            p[dc::NUM_CHANNELS..dc::NUM_CHANNELS + 4]
                .copy_from_slice(&(chunk.len() as u32).to_le_bytes());
            for (i, &h) in chunk.iter().enumerate() {
                let c = dc::H_CLIENT_LIST + 4 * i;
                p[c..c + 4].copy_from_slice(&h_client.to_le_bytes());
                let c = dc::H_CHANNEL_LIST + 4 * i;
                p[c..c + 4].copy_from_slice(&h.to_le_bytes());
            }
            p
        })
        .collect()
}

/// Disables (pauses) or enables (resumes) `ch` through `fd`, a duplicate of the target's
/// nvidiactl fd holding `ch.h_client`; returns the time the calls took. A refusal is an
/// [`NvStatusError`] (in the anyhow chain). When a later batch of a disable fails, the batches
/// already disabled are enabled again (best effort), so a failed pause leaves nothing paused.
pub fn set_disabled(fd: BorrowedFd, ch: &Channels, disable: bool) -> Result<Duration> {
    set_disabled_mode(fd, ch, disable, false)
}

/// [`set_disabled`], with `schedule_only` (bOnlyDisableScheduling) for a disable.
pub fn set_disabled_mode(
    fd: BorrowedFd,
    ch: &Channels,
    disable: bool,
    schedule_only: bool,
) -> Result<Duration> {
    if ch.channels.is_empty() {
        return Ok(Duration::ZERO);
    }
    let t0 = Instant::now();
    let blocks = disable_params(ch.h_client, &ch.channels, disable, schedule_only);
    for (i, mut p) in blocks.into_iter().enumerate() {
        let r = rm_control(
            fd,
            ch.h_client,
            ch.h_subdevice,
            nv::CTRL_FIFO_DISABLE_CHANNELS,
            &mut p,
        )
        .and_then(|status| match status {
            nv::status::OK => Ok(()),
            status => Err(NvStatusError {
                cmd: nv::CTRL_FIFO_DISABLE_CHANNELS,
                status,
            }
            .into()),
        });
        if let Err(e) = r {
            if disable && i > 0 {
                let done = &ch.channels[..i * dc::MAX_CHANNELS];
                for mut p in disable_params(ch.h_client, done, false, false) {
                    let _ = rm_control(
                        fd,
                        ch.h_client,
                        ch.h_subdevice,
                        nv::CTRL_FIFO_DISABLE_CHANNELS,
                        &mut p,
                    );
                }
            }
            return Err(e).with_context(|| {
                format!(
                    "{} {} channel(s) of client {:#x} (subdevice {:#x})",
                    if disable { "pausing" } else { "resuming" },
                    ch.channels.len(),
                    ch.h_client,
                    ch.h_subdevice
                )
            });
        }
    }
    Ok(t0.elapsed())
}

/// One RM control that must return NV_OK; a refusal is an [`NvStatusError`].
fn rm_control_ok(
    fd: BorrowedFd,
    h_client: u32,
    h_object: u32,
    cmd: u32,
    params: &mut [u8],
) -> Result<()> {
    match rm_control(fd, h_client, h_object, cmd, params)? {
        nv::status::OK => Ok(()),
        status => Err(NvStatusError { cmd, status }.into()),
    }
}

/// The TSG's timeslice in microseconds (`NVA06C_CTRL_CMD_GET_TIMESLICE` on the target's own
/// client, through `fd`, a duplicate of the target's nvidiactl fd).
pub fn get_timeslice(fd: BorrowedFd, h_client: u32, h_tsg: u32) -> Result<u64> {
    let mut p = [0u8; nv::TIMESLICE_PARAMS_SIZE];
    rm_control_ok(fd, h_client, h_tsg, nv::CTRL_TSG_GET_TIMESLICE, &mut p).with_context(|| {
        format!("reading the timeslice of TSG {h_tsg:#x} (client {h_client:#x})")
    })?;
    Ok(nv::u64_at(&p, 0))
}

/// Sets the TSG's timeslice (`NVA06C_CTRL_CMD_SET_TIMESLICE`): the scheduler switches it out
/// after `us` only when another TSG of its runlist is runnable, so a short one costs an offline
/// TSG little while online work is idle. Returns the time the call took.
pub fn set_timeslice(fd: BorrowedFd, h_client: u32, h_tsg: u32, us: u64) -> Result<Duration> {
    let t0 = Instant::now();
    let mut p = us.to_le_bytes();
    rm_control_ok(fd, h_client, h_tsg, nv::CTRL_TSG_SET_TIMESLICE, &mut p).with_context(|| {
        format!("setting the timeslice of TSG {h_tsg:#x} (client {h_client:#x}) to {us} us")
    })?;
    Ok(t0.elapsed())
}

/// `NV0000_CTRL_CMD_CLIENT_GET_HANDLE_INFO`: the parent handle (`INDEX_PARENT`) or the
/// external class (`INDEX_CLASSID`) of `h_object` in client `h_client`, asked through `fd`,
/// which must be the file the client was made on (a duplicate of the owner's fd is).
pub fn handle_info(fd: BorrowedFd, h_client: u32, h_object: u32, index: u32) -> Result<u64> {
    use nv::handle_info as hi;
    let mut p = [0u8; hi::SIZE];
    p[hi::H_OBJECT..hi::H_OBJECT + 4].copy_from_slice(&h_object.to_le_bytes());
    p[hi::INDEX..hi::INDEX + 4].copy_from_slice(&index.to_le_bytes());
    rm_control_ok(
        fd,
        h_client,
        h_client,
        nv::CTRL_CLIENT_GET_HANDLE_INFO,
        &mut p,
    )
    .with_context(|| format!("asking about handle {h_object:#x} of client {h_client:#x}"))?;
    Ok(nv::u64_at(&p, hi::DATA))
}

/// The index the RM gives the next client it makes (`RS_CLIENT_HANDLE_BASE` + index): a client
/// is made on a fresh /dev/nvidiactl and freed at once. Clients of processes that ran before are
/// below it (indices increase; a wrap past `CLIENT_HANDLE_MAX` is not followed).
pub fn next_client_index() -> Result<u32> {
    use nv::{alloc as a, free as fr};
    use std::os::fd::AsFd as _;
    let ctl = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(nv::NVIDIACTL)
        .with_context(|| format!("opening {}", nv::NVIDIACTL))?;
    let mut args = [0u8; a::NVOS21_SIZE as usize];
    args[a::H_CLASS..a::H_CLASS + 4].copy_from_slice(&nv::class::NV01_ROOT_CLIENT.to_le_bytes());
    let req = nv::iowr(nv::nr::RM_ALLOC, a::NVOS21_SIZE);
    // SAFETY: `args` is the 32-byte NVOS21 the request's size names, with no params pointer.
    let r = unsafe { libc::ioctl(ctl.as_fd().as_raw_fd(), req as _, args.as_mut_ptr()) };
    if r < 0 {
        return Err(anyhow!("RM_ALLOC of a client: {}", Errno::last()));
    }
    let status = nv::u32_at(&args, a::NVOS21_STATUS);
    if status != nv::status::OK {
        return Err(anyhow!(
            "RM_ALLOC of a client: {}",
            nv::status::name(status)
        ));
    }
    let h = nv::u32_at(&args, a::H_OBJECT_NEW);
    let mut f = [0u8; fr::SIZE as usize];
    for at in [fr::H_ROOT, fr::H_OBJECT_PARENT, fr::H_OBJECT_OLD] {
        f[at..at + 4].copy_from_slice(&h.to_le_bytes());
    }
    let req = nv::iowr(nv::nr::RM_FREE, fr::SIZE);
    // SAFETY: `f` is the 16-byte NVOS00 the request's size names. Closing the file frees the
    // client anyway; the explicit free only keeps it short-lived.
    let _ = unsafe { libc::ioctl(ctl.as_fd().as_raw_fd(), req as _, f.as_mut_ptr()) };
    anyhow::ensure!(
        h & !(nv::CLIENT_HANDLE_MAX - 1) == nv::CLIENT_HANDLE_BASE,
        "the RM made client {h:#x}, outside {:#x}..{:#x}",
        nv::CLIENT_HANDLE_BASE,
        nv::CLIENT_HANDLE_BASE + nv::CLIENT_HANDLE_MAX
    );
    Ok((h - nv::CLIENT_HANDLE_BASE) + 1)
}

/// The device instance (a device's alloc `deviceId`) of the GPU behind subdevice `h_subdevice`:
/// `NV2080_CTRL_CMD_GPU_GET_ID`, then `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2` on the client.
pub fn device_instance(fd: BorrowedFd, h_client: u32, h_subdevice: u32) -> Result<u32> {
    let mut id = [0u8; 4];
    rm_control_ok(fd, h_client, h_subdevice, nv::CTRL_GPU_GET_ID, &mut id)
        .with_context(|| format!("the GPU id of subdevice {h_subdevice:#x}"))?;
    let mut info = [0u8; nv::ID_INFO_V2_SIZE];
    info[..4].copy_from_slice(&id);
    rm_control_ok(
        fd,
        h_client,
        h_client,
        nv::CTRL_GPU_GET_ID_INFO_V2,
        &mut info,
    )
    .with_context(|| format!("the device instance of GPU id {:#x}", nv::u32_at(&id, 0)))?;
    Ok(nv::u32_at(&info, nv::ID_INFO_V2_DEVICE_INSTANCE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        fs::File,
        io::{Read as _, Write as _},
        os::fd::AsFd as _,
    };

    fn u32s(p: &[u8], at: usize, n: usize) -> Vec<u32> {
        (0..n).map(|i| nv::u32_at(p, at + 4 * i)).collect()
    }

    #[test]
    fn params_for_two_channels_are_byte_exact() {
        let blocks = disable_params(0xc1d0_0001, &[0x5c00_0010, 0x5c00_0020], true, false);
        assert_eq!(blocks.len(), 1);
        let mut want = [0u8; 536];
        want[0] = 1;
        want[4] = 2;
        want[24..28].copy_from_slice(&0xc1d0_0001u32.to_le_bytes());
        want[28..32].copy_from_slice(&0xc1d0_0001u32.to_le_bytes());
        want[280..284].copy_from_slice(&0x5c00_0010u32.to_le_bytes());
        want[284..288].copy_from_slice(&0x5c00_0020u32.to_le_bytes());
        assert_eq!(blocks[0], want);
        let enable = disable_params(0xc1d0_0001, &[0x5c00_0010, 0x5c00_0020], false, false);
        want[0] = 0;
        assert_eq!(enable[0], want);
        // Schedule-only pauses set bOnlyDisableScheduling; an enable never does.
        let sched = disable_params(0xc1d0_0001, &[0x5c00_0010, 0x5c00_0020], true, true);
        want[0] = 1;
        want[8] = 1;
        assert_eq!(sched[0], want);
        let enable = disable_params(0xc1d0_0001, &[0x5c00_0010, 0x5c00_0020], false, true);
        assert_eq!((enable[0][0], enable[0][8]), (0, 0));
    }

    #[test]
    fn params_for_65_channels_split_64_and_1() {
        let chans: Vec<u32> = (0..65).map(|i| 0x1000 + i).collect();
        let blocks = disable_params(7, &chans, true, false);
        assert_eq!(blocks.len(), 2);
        let first = &blocks[0];
        assert_eq!((first[0], nv::u32_at(first, 4)), (1, 64));
        assert_eq!((first[8], first[9]), (0, 0));
        assert_eq!(nv::u64_at(first, 16), 0);
        assert_eq!(u32s(first, 24, 64), vec![7; 64]);
        assert_eq!(u32s(first, 280, 64), chans[..64].to_vec());
        let mut want = [0u8; 536];
        want[0] = 1;
        want[4] = 1;
        want[24..28].copy_from_slice(&7u32.to_le_bytes());
        want[280..284].copy_from_slice(&(0x1000u32 + 64).to_le_bytes());
        assert_eq!(blocks[1], want);
        assert!(disable_params(7, &[], true, false).is_empty());
    }

    #[test]
    fn nvos54_layout() {
        let mut params = [0u8; 536];
        let ptr = params.as_mut_ptr() as u64;
        let b = nvos54(1, 2, nv::CTRL_FIFO_DISABLE_CHANNELS, &mut params);
        assert_eq!(nv::u32_at(&b, 0), 1);
        assert_eq!(nv::u32_at(&b, 4), 2);
        assert_eq!(nv::u32_at(&b, 8), 0x2080_110b);
        assert_eq!(nv::u32_at(&b, 12), 0);
        assert_eq!(nv::u64_at(&b, 16), ptr);
        assert_eq!(nv::u32_at(&b, 24), 536);
        assert_eq!(nv::u32_at(&b, 28), 0);
    }

    #[test]
    fn errors_are_one_sentence_each() {
        let s = |e, fd| dup_error(e, 42, fd).to_string();
        assert_eq!(s(Errno::ESRCH, Some(3)), "process 42 exited");
        assert_eq!(s(Errno::ESRCH, None), "process 42 exited");
        assert_eq!(
            s(Errno::EPERM, Some(3)),
            "no ptrace rights over pid 42 (run as root; yama ptrace_scope)"
        );
        assert_eq!(s(Errno::EBADF, Some(9)), "pid 42 has no fd 9");
        assert_eq!(
            s(Errno::ENOSYS, None),
            "kernel lacks pidfd_getfd (Linux 5.6+)"
        );
        assert!(s(Errno::EMFILE, Some(3)).starts_with("pidfd_getfd(pid 42, fd 3): "));

        let st = |status| {
            NvStatusError {
                cmd: nv::CTRL_FIFO_DISABLE_CHANNELS,
                status,
            }
            .to_string()
        };
        assert_eq!(
            st(0x56),
            "FIFO_DISABLE_CHANNELS failed: NV_ERR_NOT_SUPPORTED (0x56): this driver does not \
             support it (GSP-RM drivers only)"
        );
        assert_eq!(
            st(0x23),
            "FIFO_DISABLE_CHANNELS failed: NV_ERR_INVALID_CLIENT (0x23): the fd does not hold \
             that client"
        );
        let e: anyhow::Error = NvStatusError {
            cmd: nv::CTRL_FIFO_DISABLE_CHANNELS,
            status: 0x21,
        }
        .into();
        assert_eq!(nv_status(&e.context("resuming")), Some(0x21));
        assert!(is_gone(&dup_error(Errno::ESRCH, 1, None)));
        assert!(is_gone(&dup_error(Errno::EBADF, 1, Some(3))));
        assert!(!is_gone(&dup_error(Errno::EPERM, 1, Some(3))));
        assert_eq!(
            st(0x21),
            "FIFO_DISABLE_CHANNELS failed: NV_ERR_INVALID_CHANNEL (0x21)"
        );
    }

    fn me() -> ProcId {
        ProcId::now(std::path::Path::new("/proc"), std::process::id()).unwrap()
    }

    #[test]
    fn dup_fd_of_our_own_pipe_works() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let dup = dup_fd(me(), w.as_raw_fd()).unwrap();
        assert_ne!(dup.as_raw_fd(), w.as_raw_fd());
        drop(w);
        File::from(dup).write_all(b"hi").unwrap();
        let mut got = String::new();
        File::from(r).read_to_string(&mut got).unwrap();
        assert_eq!(got, "hi");
    }

    /// A pidfd (and so a duplicate of an fd) is only had of the process an identity names: the
    /// pid under another start time is a reuse, and nothing of the new owner is taken.
    #[test]
    fn a_reused_pid_yields_no_pidfd_and_no_fd() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let now = ProcId::now(std::path::Path::new("/proc"), child.id()).unwrap();
        assert!(pidfd_of(now).is_ok());
        let before = ProcId {
            start_time: now.start_time - 1,
            ..now
        };
        for e in [
            pidfd_of(before).unwrap_err(),
            dup_fd(before, 0).unwrap_err(),
        ] {
            assert!(is_gone(&e), "{e:#}");
            assert_eq!(
                e.to_string(),
                format!(
                    "pid {} was reused: the process it named exited (the new one was not touched)",
                    now.pid
                )
            );
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(is_gone(&pidfd_of(now).unwrap_err()));
    }

    #[test]
    fn dup_fd_errors() {
        let e = dup_fd(me(), 1_000_000).unwrap_err().to_string();
        assert_eq!(e, format!("pid {} has no fd 1000000", std::process::id()));
        // Beyond pid_max (4M at most): no such process.
        let nobody = ProcId {
            pid: 0x7fff_fff0,
            start_time: 1,
        };
        assert_eq!(
            dup_fd(nobody, 0).unwrap_err().to_string(),
            format!("process {} exited", 0x7fff_fff0u32)
        );
    }

    #[test]
    fn rm_control_on_a_non_nvidia_file_is_a_clean_error() {
        let f = File::open("/dev/null").unwrap();
        let mut params = [0u8; 536];
        let e =
            rm_control(f.as_fd(), 1, 2, nv::CTRL_FIFO_DISABLE_CHANNELS, &mut params).unwrap_err();
        let msg = format!("{e:#}");
        assert_eq!(
            msg,
            "RM_CONTROL ioctl (0x2080110b): ENOTTY (not an NVIDIA RM file: /dev/nvidiactl)"
        );
        let ch = Channels {
            h_client: 1,
            h_subdevice: 2,
            channels: (0..70).collect(),
        };
        let e = set_disabled(f.as_fd(), &ch, true).unwrap_err();
        assert!(format!("{e:#}").starts_with("pausing 70 channel(s) of client 0x1"));
        assert_eq!(nv_status(&e), None);
        assert_eq!(
            set_disabled(
                f.as_fd(),
                &Channels {
                    channels: vec![],
                    ..ch
                },
                true
            )
            .unwrap(),
            Duration::ZERO
        );
    }
}
