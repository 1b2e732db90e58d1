//! Runs a command as the process with a chosen pid, for the pid-reuse tests: clone3 with
//! `set_tid` (root: CAP_SYS_ADMIN over the pid namespace, Linux 5.5+), then exec in the child.
//!
//! Usage: with-pid PID CMD [ARGS]...   waits for CMD and exits with its status; prints nothing.
//! Fails (exit 2, one line on stderr) when the pid is taken or set_tid is refused: a test must
//! know its process did get the pid.

use std::{ffi::CString, process::ExitCode};

/// `struct clone_args` of linux/sched.h (the version with set_tid, 88 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(pid), true) = (
        args.first().and_then(|p| p.parse::<libc::pid_t>().ok()),
        args.len() >= 2,
    ) else {
        eprintln!("usage: with-pid PID CMD [ARGS]...");
        return ExitCode::from(2);
    };
    let Ok(argv) = args[1..]
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<Vec<_>, _>>()
    else {
        eprintln!("with-pid: an argument contains a NUL byte");
        return ExitCode::from(2);
    };
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let tid = [pid];
    let ca = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: tid.as_ptr() as u64,
        set_tid_size: 1,
        ..Default::default()
    };
    // SAFETY: clone3 reads `ca` (a live, correctly sized struct) and the one-pid array it points
    // to; without CLONE_VM the child gets a copy of this single-threaded process.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &ca as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if r < 0 {
        eprintln!(
            "with-pid: clone3 with pid {pid}: {}",
            std::io::Error::last_os_error()
        );
        return ExitCode::from(2);
    }
    if r == 0 {
        // SAFETY: argv is a NUL-terminated array of NUL-terminated strings that outlive the call.
        unsafe { libc::execvp(ptrs[0], ptrs.as_ptr()) };
        eprintln!(
            "with-pid: exec {}: {}",
            args[1],
            std::io::Error::last_os_error()
        );
        // SAFETY: leaving the child without running the parent's exit handlers.
        unsafe { libc::_exit(127) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child into a live int.
    if unsafe { libc::waitpid(r as libc::pid_t, &mut status, 0) } < 0 {
        eprintln!("with-pid: waitpid: {}", std::io::Error::last_os_error());
        return ExitCode::from(2);
    }
    if libc::WIFEXITED(status) {
        ExitCode::from(libc::WEXITSTATUS(status) as u8)
    } else {
        ExitCode::from(128 + libc::WTERMSIG(status) as u8)
    }
}
