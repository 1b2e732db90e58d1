//! The controller's own resource limits: it holds one descriptor per GPU process it controls
//! (a pidfd, a duplicate of its driver fd), so the default soft limit of 1024 would leave later
//! jobs "EMFILE: cannot be controlled". The soft limit is raised to the hard one at start, up
//! to [`FD_CEILING`] (the unit sets `LimitNOFILE` to that).

use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The most descriptors the controller asks for: a few per GPU process, for tens of
/// thousands of them.
pub const FD_CEILING: u64 = 1 << 20;

/// Raises the soft limit on open files to the hard one (at most [`FD_CEILING`]); returns
/// (before, after). A limit it cannot raise stays, and says so.
pub fn raise_fd_limit() -> (u64, u64) {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return (0, 0);
    };
    let want = hard.min(FD_CEILING).max(soft);
    if want == soft {
        return (soft, soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, want, hard) {
        Ok(()) => (soft, want),
        Err(e) => {
            log::warn!(
                "open files limited to {soft}: raising it to {want} failed ({e}); past that, \
                 GPU processes cannot be controlled (set LimitNOFILE or ulimit -n)"
            );
            (soft, soft)
        }
    }
}

#[cfg(test)]
mod tests {
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};

    use super::*;

    /// In a child (the limit is the process's): a soft limit of 256 is raised to the hard one.
    #[test]
    fn the_soft_fd_limit_is_raised_to_the_hard_one() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let want = hard.min(FD_CEILING);
        assert!(
            want > 256,
            "this host's hard limit {hard} leaves nothing to raise"
        );
        // SAFETY: the child only makes raw syscalls (getrlimit/setrlimit) and `_exit`s; it
        // touches no lock the parent's other threads may hold.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                let ok = setrlimit(Resource::RLIMIT_NOFILE, 256, hard).is_ok()
                    && raise_fd_limit() == (256, want)
                    && getrlimit(Resource::RLIMIT_NOFILE).is_ok_and(|(s, _)| s == want);
                // SAFETY: `_exit` ends the child at once, running nothing of the parent's.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            ForkResult::Parent { child } => {
                assert_eq!(waitpid(child, None).unwrap(), WaitStatus::Exited(child, 0));
            }
        }
    }
}
