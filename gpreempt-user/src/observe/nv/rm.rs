//! RM calls on a process's own RM client on a stock GSP-RM driver (docs/nvidia-rm.md): the file
//! duplicate they go through, the control call and the reads; the acts on it (pause, timeslice)
//! are the NVIDIA backend's (`backend/nv/acts.rs`).
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
};

use anyhow::{anyhow, Context as _, Result};
use gpreempt_common::nv;
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

/// One RM control that must return NV_OK; a refusal is an [`NvStatusError`].
pub fn rm_control_ok(
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

/// A client of our own on a fresh /dev/nvidiactl, freed on drop (closing the file would free it
/// too; the explicit free keeps it short-lived).
struct OwnClient {
    ctl: std::fs::File,
    handle: u32,
}

impl OwnClient {
    fn new() -> Result<Self> {
        use nv::alloc as a;
        let ctl = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(nv::NVIDIACTL)
            .with_context(|| format!("opening {}", nv::NVIDIACTL))?;
        let mut args = [0u8; a::NVOS21_SIZE as usize];
        args[a::H_CLASS..a::H_CLASS + 4]
            .copy_from_slice(&nv::class::NV01_ROOT_CLIENT.to_le_bytes());
        let req = nv::iowr(nv::nr::RM_ALLOC, a::NVOS21_SIZE);
        // SAFETY: `args` is the 32-byte NVOS21 the request's size names, with no params pointer.
        let r = unsafe { libc::ioctl(ctl.as_raw_fd(), req as _, args.as_mut_ptr()) };
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
        let handle = nv::u32_at(&args, a::H_OBJECT_NEW);
        Ok(Self { ctl, handle })
    }
}

impl Drop for OwnClient {
    fn drop(&mut self) {
        use nv::free as fr;
        let mut f = [0u8; fr::SIZE as usize];
        for at in [fr::H_ROOT, fr::H_OBJECT_PARENT, fr::H_OBJECT_OLD] {
            f[at..at + 4].copy_from_slice(&self.handle.to_le_bytes());
        }
        let req = nv::iowr(nv::nr::RM_FREE, fr::SIZE);
        // SAFETY: `f` is the 16-byte NVOS00 the request's size names.
        let _ = unsafe { libc::ioctl(self.ctl.as_raw_fd(), req as _, f.as_mut_ptr()) };
    }
}

/// The index the RM gives the next client it makes (`RS_CLIENT_HANDLE_BASE` + index): a client
/// is made on a fresh /dev/nvidiactl and freed at once. Clients of processes that ran before are
/// below it (indices increase; a wrap past `CLIENT_HANDLE_MAX` is not followed).
pub fn next_client_index() -> Result<u32> {
    let h = OwnClient::new()?.handle;
    anyhow::ensure!(
        h & !(nv::CLIENT_HANDLE_MAX - 1) == nv::CLIENT_HANDLE_BASE,
        "the RM made client {h:#x}, outside {:#x}..{:#x}",
        nv::CLIENT_HANDLE_BASE,
        nv::CLIENT_HANDLE_BASE + nv::CLIENT_HANDLE_MAX
    );
    Ok((h - nv::CLIENT_HANDLE_BASE) + 1)
}

/// The GPUs attached to the RM now, as (GPU id, device instance): on a client of our own,
/// `NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS`, then `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2` per id. A
/// GPU no process has open (and no persistence daemon holds) may not be attached: it has no
/// device instance, and no queues either.
pub fn attached_gpus() -> Result<Vec<(u32, u32)>> {
    use std::os::fd::AsFd as _;
    let c = OwnClient::new()?;
    let fd = c.ctl.as_fd();
    let mut ids = [0u8; nv::ATTACHED_IDS_SIZE];
    rm_control_ok(
        fd,
        c.handle,
        c.handle,
        nv::CTRL_GPU_GET_ATTACHED_IDS,
        &mut ids,
    )
    .context("listing the GPUs attached to the RM")?;
    let mut out = Vec::new();
    for id in ids.chunks_exact(4).map(|b| nv::u32_at(b, 0)) {
        if id == nv::GPU_INVALID_ID {
            break;
        }
        let mut info = [0u8; nv::ID_INFO_V2_SIZE];
        info[..4].copy_from_slice(&id.to_le_bytes());
        rm_control_ok(
            fd,
            c.handle,
            c.handle,
            nv::CTRL_GPU_GET_ID_INFO_V2,
            &mut info,
        )
        .with_context(|| format!("the device instance of GPU id {id:#x}"))?;
        out.push((id, nv::u32_at(&info, nv::ID_INFO_V2_DEVICE_INSTANCE)));
    }
    Ok(out)
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
    };

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
}
