//! The emulator's view of real processes: their memory (process_vm_readv/writev), ptrace
//! relationships (/proc), and their fds (pidfd_getfd).

use std::fs;
use std::os::fd::{FromRawFd, OwnedFd};

use crate::model::{Errno, Host};

const FUSE_SUPER_MAGIC: libc::__fsword_t = 0x6573_5546;

/// Talks to the live system.
#[derive(Default)]
pub struct RealHost;

fn errno() -> Errno {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn vm_io(
    pid: u32,
    addr: u64,
    ptr: *mut libc::c_void,
    len: usize,
    write: bool,
) -> Result<(), Errno> {
    if len == 0 {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: ptr,
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` describes `len` bytes the caller owns (readable, and writable for reads);
    // the remote range is only touched by the kernel, which checks it.
    let n = unsafe {
        if write {
            libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0)
        } else {
            libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0)
        }
    };
    match n {
        n if n == len as isize => Ok(()),
        n if n >= 0 => Err(libc::EFAULT),
        _ => Err(errno()),
    }
}

impl Host for RealHost {
    fn read_mem(&mut self, pid: u32, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
        vm_io(pid, addr, buf.as_mut_ptr().cast(), buf.len(), false)
    }

    fn write_mem(&mut self, pid: u32, addr: u64, data: &[u8]) -> Result<(), Errno> {
        vm_io(pid, addr, data.as_ptr().cast_mut().cast(), data.len(), true)
    }

    fn tracer(&mut self, pid: u32) -> Option<u32> {
        status_field(pid, "TracerPid:").filter(|&t| t != 0)
    }

    fn take_fd(&mut self, pid: u32, fd: u32) -> Result<OwnedFd, Errno> {
        // SAFETY: plain syscalls with integer arguments; the returned descriptors are owned here.
        unsafe {
            let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0);
            if pidfd < 0 {
                return Err(errno());
            }
            let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
            let fd = libc::syscall(
                libc::SYS_pidfd_getfd,
                std::os::fd::AsRawFd::as_raw_fd(&pidfd),
                fd as i32,
                0,
            );
            if fd < 0 {
                return Err(errno());
            }
            let fd = OwnedFd::from_raw_fd(fd as i32);
            // The FUSE server must never hold (and later close or write) a file of a FUSE mount:
            // the request would come back to the thread waiting for it.
            let mut st: libc::statfs = std::mem::zeroed();
            if libc::fstatfs(std::os::fd::AsRawFd::as_raw_fd(&fd), &mut st) == 0
                && st.f_type == FUSE_SUPER_MAGIC
            {
                return Err(libc::EBADF);
            }
            Ok(fd)
        }
    }

    fn fd_exists(&mut self, pid: u32, fd: u32) -> bool {
        fs::symlink_metadata(format!("/proc/{pid}/fd/{fd}")).is_ok()
    }

    fn process_exists(&mut self, pid: u32) -> bool {
        process_alive(pid)
    }
}

/// A numeric field of /proc/PID/status.
pub fn status_field(pid: u32, key: &str) -> Option<u32> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
}

/// A process's start time (clock ticks after boot, field 22 of /proc/PID/stat).
pub fn start_time(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 3 (state) is the first after the comm's closing parenthesis.
    s[s.rfind(')')? + 1..]
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// The thread group of a thread id.
pub fn tgid_of(tid: u32) -> Option<u32> {
    status_field(tid, "Tgid:")
}

/// The process exists and still has its memory (not a zombie): what the kernel's mm teardown
/// notifier keys on.
pub fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => match s
            .rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
        {
            Some(state) => !matches!(state, "Z" | "X"),
            None => false,
        },
        Err(_) => false,
    }
}

/// A signal is pending for the thread (its own or its process's), so a blocked call must return.
pub fn signal_pending(tid: u32) -> bool {
    let Ok(s) = fs::read_to_string(format!("/proc/{tid}/status")) else {
        return true;
    };
    let mask = |key: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    let blocked = mask("SigBlk:");
    (mask("SigPnd:") | mask("ShdPnd:")) & !blocked != 0
}
