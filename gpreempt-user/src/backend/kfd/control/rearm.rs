//! A debug session of our own, and taking it back from a target that escaped it.
//!
//! amdkfd lets a process debug-trap itself without ptrace (the ptrace check exempts a target
//! that is the caller): a held process can RESUME_QUEUES its own queues, DISABLE the session
//! (the kernel then resumes every queue and closes our event pipe) and ENABLE a session of its
//! own. None of that can be prevented; all of it can be undone by the ptrace parent, which may
//! DISABLE any session of its tracee and ENABLE its own again. [`Thread::rearm`] does that;
//! [`Thread::rehold`] then suspends again what we held.

use std::{fs::File, os::fd::AsRawFd};

use gpreempt_common::kfd::{
    self, dbg_op, ec, ec_mask, DbgTrapArgs, DbgTrapEnableArgs, DbgTrapSendRuntimeEventArgs,
    RuntimeInfo,
};
use nix::errno::Errno;

use super::{
    ops::op_error,
    thread::Thread,
    types::{errno_of, TargetError, SUBSCRIBED},
};
use crate::{observe::procinfo::ProcId, outcome::OpReport};

/// Rounds of DISABLE + ENABLE + snapshot against a target that keeps ending our session.
const REARM_TRIES: usize = 8;

impl Thread {
    /// DBG_TRAP ENABLE of `pid` with a fresh event pipe (the kernel keeps the write end); the
    /// read end, and whether the target's runtime had enabled the debug API.
    pub(super) fn enable(&mut self, pid: u32) -> Result<(File, bool), TargetError> {
        let (rd, wr) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| TargetError::Other(format!("pipe: {e}")))?;
        let mut rinfo = RuntimeInfo::default();
        let en = DbgTrapEnableArgs {
            exception_mask: SUBSCRIBED,
            rinfo_ptr: &mut rinfo as *mut RuntimeInfo as u64,
            rinfo_size: std::mem::size_of::<RuntimeInfo>() as u32,
            dbg_fd: wr.as_raw_fd() as u32,
        };
        self.dbg(pid, en).map_err(|e| op_error("enable", &e))?;
        // The kernel holds its own reference to the write end.
        drop(wr);
        let enabled = rinfo.runtime_state == kfd::runtime_state::ENABLED;
        if enabled {
            // A runtime left waiting for an acknowledgment by a debugger that died (the kernel
            // does not wake it) goes on; otherwise the extra count only means a later wait of
            // the target returns at once.
            let ack = DbgTrapSendRuntimeEventArgs {
                exception_mask: ec_mask(ec::PROCESS_RUNTIME),
                gpu_id: 0,
                queue_id: 0,
            };
            if let Err(e) = self.dbg(pid, ack) {
                log::debug!("pid {pid}: runtime acknowledgment: {e}");
            }
        }
        Ok((File::from(rd), enabled))
    }

    /// DISABLE of whatever session `pid` has (ours, or one it made itself); EINVAL: none.
    fn disable_any(&mut self, pid: u32) -> Result<(), TargetError> {
        let mut d = DbgTrapArgs::bare(pid, dbg_op::DISABLE);
        match self.dbg_raw(&mut d) {
            Ok(_) => Ok(()),
            Err(e) if errno_of(&e) == Errno::EINVAL => Ok(()),
            Err(e) => Err(op_error("disable", &e)),
        }
    }

    /// Takes the debug session of a target under control back: ends any session it has (one it
    /// enabled itself after disabling ours), enables ours again and re-reads its queues. A target
    /// that disables or enables again in between (a loop racing us) is met up to
    /// [`REARM_TRIES`] times.
    pub(super) fn rearm(&mut self, pid: u32) -> Result<(), TargetError> {
        if !self.targets.contains_key(&pid) {
            return Err(TargetError::Gone);
        }
        let mut last = TargetError::Gone;
        for _ in 0..REARM_TRIES {
            self.turn();
            self.disable_any(pid)?;
            let (events, enabled) = match self.enable(pid) {
                Ok(v) => v,
                Err(e @ TargetError::AlreadyDebugged) => {
                    last = e;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(t) = self.targets.get_mut(&pid) {
                t.events = events;
                t.runtime_enabled = Some(enabled);
            }
            match self.snapshot(pid) {
                Ok(_) => return Ok(()),
                // Disabled again under us already.
                Err(e @ TargetError::Unsupported(_)) => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Suspends again every queue we hold of `pid` (a whole-process hold: every queue it has),
    /// taking the session back first when `rearm` (the target disabled or took it over).
    /// Queues already suspended stay so: the kernel counts them as done.
    pub(super) fn rehold(&mut self, pid: u32, rearm: bool) -> Result<OpReport, TargetError> {
        if rearm {
            self.rearm(pid)?;
        }
        let Some(t) = self.targets.get(&pid) else {
            return Err(TargetError::Gone);
        };
        let (ids, grace): (Vec<u32>, Option<u32>) = match t.book.hold_all {
            Some(grace) => (t.book.queues.keys().copied().collect(), grace),
            None => (t.book.suspended.keys().copied().collect(), None),
        };
        if !self.rate_ok(pid) {
            return Err(TargetError::RateLimited);
        }
        self.suspend_ids(pid, &ids, grace)
    }

    /// A caller's [`Thread::rehold`] of `id` (the controller saw it escape).
    pub(super) fn rehold_request(
        &mut self,
        id: ProcId,
        rearm: bool,
    ) -> Result<OpReport, TargetError> {
        let Some(t) = self.targets.get(&id.pid) else {
            return Err(TargetError::Gone);
        };
        let lost = hung_up(&t.events);
        self.verify(id)?;
        self.rehold(id.pid, rearm || lost)
    }
}

/// Whether the kernel let go of the write end of our event pipe: our session ended.
fn hung_up(events: &File) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(events.as_fd(), PollFlags::POLLIN)];
    nix::poll::poll(&mut fds, PollTimeout::ZERO).is_ok()
        && fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLHUP))
}
