//! The control thread's loop: it sleeps in poll on the request eventfd, the SIGCHLD signalfd and
//! every target's event pipe, then serves requests first (a suspend is latency-critical), reaps
//! the targets' stops, drains their debug events, and runs the watchdog and the destroy check.

use std::{
    fs::File,
    io::Read as _,
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    sync::{mpsc, Arc},
};

use gpreempt_common::kfd::{ec, ec_mask, DbgTrapQueryDebugEventArgs, DbgTrapSendRuntimeEventArgs};
use nix::{
    errno::Errno,
    poll::{PollFd, PollFlags, PollTimeout},
    sys::{
        ptrace,
        signal::Signal,
        signalfd::SignalFd,
        wait::{waitpid, WaitPidFlag, WaitStatus},
    },
    unistd::Pid,
};
use tokio::sync::mpsc as tmpsc;

use crate::backend::Arrival;

use super::{
    holds::{self, Book, Fences},
    types::{errno_of, Limits, Req, TargetError, Turns, SUBSCRIBED},
};
use crate::clock::monotonic_ns;
use crate::outcome::Notice;

pub(super) struct Target {
    pub(super) pid: u32,
    /// Its start time when it was seized: requests naming the pid with another start time are
    /// about a process that is gone.
    pub(super) start_time: u64,
    /// Read end of the event pipe (the kernel holds the write end).
    pub(super) events: File,
    pub(super) book: Book,
    /// Whether the target's GPU runtime had enabled the debug API (RUNTIME_ENABLE) when ENABLE
    /// returned; None once a runtime event says it changed since.
    pub(super) runtime_enabled: Option<bool>,
}

pub(super) struct Thread {
    pub(super) kfd: File,
    pub(super) sigfd: SignalFd,
    pub(super) wake: Arc<OwnedFd>,
    pub(super) rx: mpsc::Receiver<Req>,
    /// The controller's one channel from every backend: notices go in as [`Arrival::Notice`].
    pub(super) notices: tmpsc::UnboundedSender<Arrival>,
    pub(super) targets: std::collections::BTreeMap<u32, Target>,
    /// GPUs no longer preempted, and why.
    pub(super) fenced: Fences,
    pub(super) limits: Limits,
    /// Last look for destroys of held queues (not on every wake-up: it reads procfs).
    pub(super) destroy_scan_ns: u64,
    /// Stamped on every turn ([`Turns`]).
    pub(super) turns: Turns,
}

impl Thread {
    pub(super) fn new(
        kfd: File,
        sigfd: SignalFd,
        wake: Arc<OwnedFd>,
        rx: mpsc::Receiver<Req>,
        notices: tmpsc::UnboundedSender<Arrival>,
        limits: Limits,
        turns: Turns,
    ) -> Self {
        Self {
            kfd,
            sigfd,
            wake,
            rx,
            notices,
            targets: Default::default(),
            fenced: Fences::default(),
            limits,
            destroy_scan_ns: 0,
            turns,
        }
    }

    /// This thread is alive and going round (the lease's heartbeat watches it).
    pub(super) fn turn(&self) {
        self.turns.turn(monotonic_ns());
    }

    pub(super) fn notice(&self, n: Notice) {
        let _ = self.notices.send(Arrival::Notice(n));
    }

    fn books(&self) -> impl Iterator<Item = (u32, &Book)> + Clone {
        self.targets.iter().map(|(pid, t)| (*pid, &t.book))
    }

    pub(super) fn run(&mut self) {
        loop {
            let timeout = self.next_deadline_ms();
            let readable = {
                let mut fds = Vec::with_capacity(2 + self.targets.len());
                // SAFETY: the eventfd is owned by self.wake for the whole call.
                let wake = unsafe { BorrowedFd::borrow_raw(self.wake.as_raw_fd()) };
                fds.push(PollFd::new(wake, PollFlags::POLLIN));
                fds.push(PollFd::new(self.sigfd.as_fd(), PollFlags::POLLIN));
                for t in self.targets.values() {
                    fds.push(PollFd::new(t.events.as_fd(), PollFlags::POLLIN));
                }
                match nix::poll::poll(&mut fds, PollTimeout::from(timeout)) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(e) => log::warn!("control: poll: {e}"),
                }
                let ready: Vec<bool> = fds
                    .iter()
                    .skip(2)
                    .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                    .collect();
                // Which targets, now: requests below may add or remove targets.
                self.targets
                    .keys()
                    .zip(ready)
                    .filter(|(_, r)| *r)
                    .map(|(p, _)| *p)
                    .collect::<Vec<u32>>()
            };
            self.turn();
            let mut buf = [0u8; 8];
            // SAFETY: reading 8 bytes into a live buffer from our eventfd.
            unsafe { libc::read(self.wake.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
            // Requests first: a suspend is latency-critical, the housekeeping below is not.
            loop {
                self.turn();
                match self.rx.try_recv() {
                    Ok(Req::Shutdown(reply)) => {
                        let out = self.release_all();
                        let _ = reply.send(out);
                        return;
                    }
                    Ok(r) => self.request(r),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            }
            while let Ok(Some(_)) = self.sigfd.read_signal() {}
            self.reap();
            for pid in readable {
                self.handle_events(pid);
            }
            self.watchdog();
            self.release_destroying();
        }
    }

    fn next_deadline_ms(&self) -> u16 {
        holds::next_wake_ms(
            self.targets.values().map(|t| &t.book),
            self.limits.max_suspend.as_nanos() as u64,
            monotonic_ns(),
        )
    }

    pub(super) fn request(&mut self, r: Req) {
        match r {
            Req::Attach(id, reply) => {
                let r = self.attach(id).and_then(|_| self.snapshot(id.pid));
                let _ = reply.send(r);
            }
            Req::Detach(id, reply) => {
                // A target under another start time is another process: not ours to let go.
                if self
                    .targets
                    .get(&id.pid)
                    .is_some_and(|t| t.start_time == id.start_time)
                {
                    self.release(id.pid);
                }
                let _ = reply.send(Ok(()));
            }
            Req::Suspend {
                id,
                queues,
                grace,
                reply,
            } => {
                let r = self.suspend(id, queues, grace);
                let _ = reply.send(r);
            }
            Req::Resume { id, queues, reply } => {
                let r = self.resume(id, queues);
                let _ = reply.send(r);
            }
            Req::Rehold { id, rearm, reply } => {
                let r = self.rehold_request(id, rearm);
                let _ = reply.send(r);
            }
            Req::Snapshot(id, reply) => {
                let r = self.attach(id).and_then(|_| self.snapshot(id.pid));
                let _ = reply.send(r);
            }
            Req::Shutdown(_) => {}
        }
    }

    /// Drains the event pipe and every pending debug event.
    fn handle_events(&mut self, pid: u32) {
        let Some(t) = self.targets.get_mut(&pid) else {
            return;
        };
        let mut buf = [0u8; 256];
        let closed = loop {
            match t.events.read(&mut buf) {
                // The kernel let go of our pipe: the session ended (a DISABLE, or exit).
                Ok(0) => break true,
                Ok(_) => continue,
                Err(_) => break false,
            }
        };
        if closed
            && crate::observe::procinfo::start_time(std::path::Path::new("/proc"), pid)
                .is_ok_and(|s| s == t.start_time)
        {
            // Alive: someone (the target itself, most often) disabled our session, and may
            // have enabled one of its own since; the kernel resumed its queues.
            self.retake(pid, &std::io::Error::from_raw_os_error(libc::EINVAL));
            return;
        }
        let mut new_queues = Vec::new();
        let mut deleted = false;
        for _ in 0..4096 {
            let q = DbgTrapQueryDebugEventArgs {
                exception_mask: SUBSCRIBED,
                gpu_id: 0,
                queue_id: 0,
            };
            let ev = match self.dbg(pid, q) {
                Ok((_, ev)) => ev,
                Err(e) if errno_of(&e) == Errno::EAGAIN => break,
                Err(e) if errno_of(&e) == Errno::EINVAL => {
                    // The trap was disabled under us (the target's own DISABLE, or a third
                    // process's): the kernel resumed its queues. Take the session back and
                    // hold again what we held.
                    self.retake(pid, &e);
                    return;
                }
                Err(e) => {
                    if errno_of(&e) == Errno::ESRCH {
                        // The target is gone: nothing of ours is suspended any more.
                        self.lost(pid, &format!("debug events: {e}"));
                    }
                    return;
                }
            };
            let s = ev.exception_mask;
            if s & ec_mask(ec::QUEUE_NEW) != 0 && ev.gpu_id != 0 {
                if let Some(t) = self.targets.get_mut(&pid) {
                    t.book.queues.insert(ev.queue_id, ev.gpu_id);
                }
                new_queues.push(ev.queue_id);
            }
            if s & ec_mask(ec::DEVICE_QUEUE_DELETE) != 0 {
                deleted = true;
            }
            if s & ec_mask(ec::PROCESS_RUNTIME) != 0 {
                if let Some(t) = self.targets.get_mut(&pid) {
                    t.runtime_enabled = None;
                }
                // The target's runtime enable/disable waits for this.
                let ack = DbgTrapSendRuntimeEventArgs {
                    exception_mask: ec_mask(ec::PROCESS_RUNTIME),
                    gpu_id: 0,
                    queue_id: 0,
                };
                if let Err(e) = self.dbg(pid, ack) {
                    self.notice(Notice::Problem {
                        pid,
                        text: format!("acknowledging its GPU runtime: {e}"),
                    });
                }
            }
        }
        if deleted {
            let _ = self.snapshot(pid);
        }
        let held = self.targets.get(&pid).and_then(|t| t.book.hold_all);
        if let Some(grace) = held {
            if !new_queues.is_empty() {
                self.auto_suspend(pid, new_queues, grace);
            }
        }
    }

    /// Our session on `pid` ended under us (`e`): enabled again and what we held suspended
    /// again, said as an act; a target that cannot be taken back is let go as before.
    fn retake(&mut self, pid: u32, e: &std::io::Error) {
        let held = self
            .targets
            .get(&pid)
            .is_some_and(|t| t.book.hold_all.is_some() || !t.book.suspended.is_empty());
        let r = if held {
            self.rehold(pid, true).map(Some)
        } else {
            self.rearm(pid).map(|_| None)
        };
        match r {
            Ok(Some(report)) => self.notice(Notice::Acted {
                report,
                suspend: true,
                why: "held again: its debug trap was disabled under the controller".into(),
            }),
            Ok(None) => log::info!("pid {pid}: its debug trap was disabled: enabled again"),
            Err(TargetError::Gone) => self.lost(pid, &format!("debug events: {e}")),
            Err(te) => self.lost(pid, &format!("debug events: {e}; taking it back: {te}")),
        }
    }

    /// The trap went away without us (someone's DISABLE): forget what we held.
    fn lost(&mut self, pid: u32, why: &str) {
        if let Some(t) = self.targets.remove(&pid) {
            if !t.book.suspended.is_empty() {
                self.notice(Notice::Problem {
                    pid,
                    text: format!("control lost ({why}); its queues run again"),
                });
            }
            self.detach_ptrace(pid);
            self.notice(Notice::TargetGone {
                pid,
                start_time: t.start_time,
            });
        }
    }

    /// Reaps the targets' stops: a signal-delivery-stop is continued with the same signal at
    /// once; a group-stop (SIGSTOP & co.) is kept with PTRACE_LISTEN, as it would be untraced.
    fn reap(&mut self) {
        let pids: Vec<u32> = self.targets.keys().copied().collect();
        for pid in pids {
            let p = Pid::from_raw(pid as i32);
            self.turn();
            for _ in 0..64 {
                match waitpid(p, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                    Ok(WaitStatus::StillAlive) => break,
                    Ok(WaitStatus::Stopped(_, sig)) => {
                        if let Err(e) = ptrace::cont(p, sig) {
                            log::debug!("pid {pid}: re-injecting {sig:?}: {e}");
                        }
                    }
                    Ok(WaitStatus::PtraceEvent(_, sig, ev)) if ev == libc::PTRACE_EVENT_STOP => {
                        let group_stop = matches!(
                            sig,
                            Signal::SIGSTOP | Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU
                        );
                        if group_stop {
                            // SAFETY: PTRACE_LISTEN on our tracee; no pointers involved.
                            unsafe {
                                libc::ptrace(libc::PTRACE_LISTEN, pid as libc::pid_t, 0, 0);
                            }
                        } else if let Err(e) = ptrace::cont(p, None) {
                            log::debug!("pid {pid}: continuing: {e}");
                        }
                    }
                    Ok(WaitStatus::PtraceEvent(..)) | Ok(WaitStatus::PtraceSyscall(_)) => {
                        let _ = ptrace::cont(p, None);
                    }
                    Ok(WaitStatus::Exited(..))
                    | Ok(WaitStatus::Signaled(..))
                    | Err(Errno::ECHILD) => {
                        // Its KFD process (and with it the trap and our suspensions) is gone.
                        if let Some(t) = self.targets.remove(&pid) {
                            self.notice(Notice::TargetGone {
                                pid,
                                start_time: t.start_time,
                            });
                        }
                        break;
                    }
                    Ok(_) => break,
                    Err(Errno::EINTR) => continue,
                    Err(e) => {
                        log::debug!("pid {pid}: waitpid: {e}");
                        break;
                    }
                }
            }
        }
    }

    /// After a per-queue ERROR: no more preemption on that GPU, and what we hold there runs again.
    pub(super) fn fence(&mut self, gpu: u32, why: String) {
        if !self.fenced.fence(gpu, &why) {
            return;
        }
        log::warn!("GPU {gpu:#x}: {why}: no longer preempting it");
        let held = holds::held_on(self.books(), gpu);
        for (pid, ids) in held {
            match self.resume_target(pid, Some(ids)) {
                Ok(report) => self.notice(Notice::Acted {
                    report,
                    suspend: false,
                    why: format!("GPU {gpu:#x} fenced"),
                }),
                Err(e) => self.notice(Notice::Problem {
                    pid,
                    text: format!("resuming after the fence: {e}"),
                }),
            }
        }
        self.notice(Notice::Fenced { gpu_id: gpu, why });
    }

    /// Resumes queues suspended for longer than the hard limit.
    fn watchdog(&mut self) {
        self.watchdog_at(monotonic_ns());
    }

    /// The watchdog as of `now` (CLOCK_MONOTONIC ns).
    pub(super) fn watchdog_at(&mut self, now: u64) {
        let due = holds::overdue(self.books(), self.limits.max_suspend.as_nanos() as u64, now);
        for (pid, ids) in due {
            if let Some(t) = self.targets.get_mut(&pid) {
                t.book.hold_all = None;
            }
            match self.resume_target(pid, Some(ids.clone())) {
                Ok(report) => self.notice(Notice::Acted {
                    report,
                    suspend: false,
                    why: format!(
                        "watchdog: suspended longer than {:?}",
                        self.limits.max_suspend
                    ),
                }),
                Err(e) => {
                    // Never retry forever: the kernel resumes them when we exit.
                    if let Some(t) = self.targets.get_mut(&pid) {
                        for q in &ids {
                            t.book.suspended.remove(q);
                        }
                    }
                    self.notice(Notice::Problem {
                        pid,
                        text: format!("watchdog resume failed: {e}"),
                    })
                }
            }
        }
    }
}

impl Drop for Thread {
    fn drop(&mut self) {
        // Also runs while unwinding from a panic on this thread.
        let _ = self.release_all();
    }
}
