//! The lease's last resort on the KFD path: SIGKILL the controller.
//!
//! amdkfd resumes every queue a debugger suspended, and disables its debug traps, when the
//! debugger's process goes away (`kfd_process_notifier_release` -> the debug-trap teardown in
//! amdkfd/kfd_debug.c); a debugger that is merely stopped (SIGSTOP, Ctrl-Z, a hung loop) holds
//! them for good. So a guardian started with `--kill-on-expiry PID` kills the controller when its
//! heartbeat stops: the kernel's own fail-safe then resumes everything. The process is named by a
//! pidfd taken at start, so a reused pid can never be killed.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

use anyhow::{bail, Result};

/// A process to kill when the lease runs out.
#[derive(Debug)]
pub struct Stopper {
    pid: u32,
    pidfd: OwnedFd,
}

impl Stopper {
    /// Opens a pidfd on `pid` now (it must be alive: the controller that started us).
    pub fn new(pid: u32) -> Result<Self> {
        // SAFETY: pidfd_open takes a pid and flags by value and returns a new fd or -1.
        let r =
            unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) };
        if r < 0 {
            bail!("pidfd_open({pid}): {}", std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd the kernel just returned, owned by nothing else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(r as i32) };
        Ok(Self { pid, pidfd })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process is alive and not stopped: running, sleeping or in the kernel
    /// (`/proc/PID/stat` state R, S, D, I or W). A stopped (T, t), dead or unreadable one is not.
    pub fn running(&self) -> bool {
        self.state().is_some_and(is_running)
    }

    /// Its `/proc/PID/stat` state letter, None when unreadable.
    pub fn state(&self) -> Option<char> {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|s| stat_state(&s))
    }

    /// SIGKILL through the pidfd (works on a stopped process). Err when it already exited.
    pub fn kill(&self) -> std::io::Result<()> {
        // SAFETY: pidfd_send_signal on our own open pidfd, no siginfo, no flags.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0 as libc::c_uint,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Whether a `/proc/PID/stat` state letter is a live process that is not stopped.
pub fn is_running(state: char) -> bool {
    matches!(state, 'R' | 'S' | 'D' | 'I' | 'W')
}

/// A killed process not yet gone: its leader a zombie while its other threads finish leaving
/// the kernel (a call into a slow driver delays that for seconds), or dead.
pub fn is_exiting(state: char) -> bool {
    matches!(state, 'Z' | 'X' | 'x')
}

/// The state letter of a `/proc/PID/stat` line (after the last `)`: comm may hold any byte).
fn stat_state(stat: &str) -> Option<char> {
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_read_after_the_name() {
        assert_eq!(stat_state("42 (a) b) T 1 2"), Some('T'));
        assert_eq!(stat_state("42 (x) S 1"), Some('S'));
        assert_eq!(stat_state("garbage"), None);
    }
    use std::os::unix::process::ExitStatusExt as _;

    #[test]
    fn a_stopped_process_is_killed_through_its_pidfd() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let s = Stopper::new(pid).unwrap();
        assert!(s.running(), "sleeping is running");
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!s.running(), "stopped");
        s.kill().unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Gone (and reaped): the pidfd says so instead of reaching a reused pid.
        assert!(s.kill().is_err());
    }
}
