//! KFD control (the AMD backend's way to act): ptrace and DBG_TRAP.
//!
//! The kernel accepts DBG_TRAP calls (other than DISABLE) only from the target's ptrace-parent
//! *thread*, so one dedicated OS thread owns every ptrace and DBG_TRAP call. Async code talks to
//! it through [`Control`]: requests over a channel (an eventfd wakes the thread), replies over
//! oneshot channels, and notices ([`crate::backend::Arrival::Notice`], into the controller's one
//! channel) for what happens on its own (a target exits, a new queue, the watchdog, a fenced
//! GPU).
//!
//! Per target: PTRACE_SEIZE (the target never stops), DBG_TRAP ENABLE with a pipe as the event
//! fd, the target's signal-delivery-stops reaped and re-injected at once, QUEUE_NEW cleared so
//! new queues are suspendable, EC_PROCESS_RUNTIME acknowledged so the target's hsa_init never
//! hangs. Whatever happens, queues are resumed: on Shutdown, in Drop (also while unwinding from a
//! panic), by the watchdog; and if this process dies outright the kernel disables the trap on
//! every target when our mm goes away.
//!
//! This file is the async side (the handle and its calls); `types` holds what both sides share
//! (the requests, their errors, the limits), `thread` is the control thread's loop, `ops` the
//! per-target kernel operations, and `holds` the pure bookkeeping they share (holds, watchdog
//! deadlines, fences, the rate limit).

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
    sync::mpsc,
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result};
use gpreempt_common::kfd;
use nix::sys::{
    signal::{SigSet, Signal},
    signalfd::{SfdFlags, SignalFd},
};
use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::observe::procinfo::ProcId;
use crate::outcome::OpReport;

mod holds;
mod ops;
mod rearm;
#[cfg(test)]
mod tests;
mod thread;
mod types;

use ops::ioctl;
use thread::Thread;
use types::Req;
pub use types::{Limits, Pulse, SnapQueue, TargetError, Turns};

/// Blocks SIGCHLD in the calling thread (and every thread it spawns later), so the control
/// thread can take tracee stops from a signalfd. Call before any thread exists.
pub fn block_sigchld() -> Result<()> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGCHLD);
    set.thread_block().context("blocking SIGCHLD")
}

/// The handle async code holds. Dropping it shuts the thread down (resuming everything).
pub struct Control {
    tx: Option<mpsc::Sender<Req>>,
    wake: std::sync::Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
    turns: Turns,
}

/// A cheap clone of the request side, for a panic hook or signal handler task.
#[derive(Clone)]
pub struct ControlHandle {
    tx: mpsc::Sender<Req>,
    wake: std::sync::Arc<OwnedFd>,
}

fn wake(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writing 8 bytes from a live buffer to an eventfd we own.
    unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) };
}

impl ControlHandle {
    fn send(&self, r: Req) -> bool {
        let ok = self.tx.send(r).is_ok();
        wake(&self.wake);
        ok
    }

    /// Resume + disable everything and wait (at most `timeout`) for it to be done. Safe to call
    /// from a panic hook on any thread other than the control thread.
    pub fn shutdown_blocking(&self, timeout: Duration) -> Option<Vec<OpReport>> {
        let (tx, mut rx) = oneshot::channel();
        if !self.send(Req::Shutdown(tx)) {
            return None;
        }
        let end = std::time::Instant::now() + timeout;
        loop {
            match rx.try_recv() {
                Ok(v) => return Some(v),
                Err(oneshot::error::TryRecvError::Closed) => return None,
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            if std::time::Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn closed<T>() -> Result<T, TargetError> {
    Err(TargetError::Other("the control thread has ended".into()))
}

impl Control {
    /// Opens the KFD device and starts the control thread. SIGCHLD must be blocked in every
    /// thread ([`block_sigchld`], before any thread was spawned).
    /// Its notices go to `arrivals` (the controller's one channel from every backend).
    pub fn start(
        kfd_device: &Path,
        limits: Limits,
        arrivals: tmpsc::UnboundedSender<crate::backend::Arrival>,
    ) -> Result<Self> {
        let kfd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(kfd_device)
            .with_context(|| {
                format!(
                    "opening {} (is amdgpu loaded and are you root?)",
                    kfd_device.display()
                )
            })?;
        let mut v = kfd::GetVersionArgs::default();
        ioctl(&kfd, kfd::cmd::GET_VERSION, &mut v).context("AMDKFD_IOC_GET_VERSION")?;
        anyhow::ensure!(
            v.major_version == 1 && v.minor_version >= 13,
            "KFD {}.{} has no debugger API (DBG_TRAP needs KFD 1.13, Linux 6.4+): upgrade the kernel",
            v.major_version,
            v.minor_version
        );
        let mut mask = SigSet::empty();
        mask.add(Signal::SIGCHLD);
        anyhow::ensure!(
            SigSet::thread_get_mask()
                .map(|m| m.contains(Signal::SIGCHLD))
                .unwrap_or(false),
            "internal: SIGCHLD must be blocked before the control thread starts"
        );
        let sigfd = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .context("signalfd(SIGCHLD)")?;
        // SAFETY: eventfd returns a new fd or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(std::io::Error::last_os_error()).context("eventfd");
        }
        // SAFETY: efd is a fresh fd we own.
        let wake_fd = std::sync::Arc::new(unsafe { OwnedFd::from_raw_fd(efd) });
        let (tx, rx) = mpsc::channel();
        let thread_wake = wake_fd.clone();
        let turns: Turns = std::sync::Arc::new(types::Pulse::new(crate::clock::monotonic_ns()));
        let thread_turns = turns.clone();
        let thread = std::thread::Builder::new()
            .name("gpreempt-ctl".into())
            .spawn(move || {
                let mut t =
                    Thread::new(kfd, sigfd, thread_wake, rx, arrivals, limits, thread_turns);
                t.run();
                // Drop of `t` resumes and disables whatever is left (also when unwinding).
            })
            .context("starting the control thread")?;
        Ok(Self {
            tx: Some(tx),
            wake: wake_fd,
            thread: Some(thread),
            turns,
        })
    }

    /// The control thread's turns, for the lease's heartbeat.
    pub fn turns(&self) -> Turns {
        self.turns.clone()
    }

    pub fn handle(&self) -> Option<ControlHandle> {
        Some(ControlHandle {
            tx: self.tx.clone()?,
            wake: self.wake.clone(),
        })
    }

    fn send(&self, r: Req) -> bool {
        let Some(tx) = &self.tx else { return false };
        let ok = tx.send(r).is_ok();
        wake(&self.wake);
        ok
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, TargetError>>) -> Req,
    ) -> Result<T, TargetError> {
        let (tx, rx) = oneshot::channel();
        if !self.send(make(tx)) {
            return closed();
        }
        rx.await.unwrap_or_else(|_| closed())
    }

    /// Seize `id` and enable its debug trap; returns its queues.
    pub async fn attach(&self, id: ProcId) -> Result<Vec<SnapQueue>, TargetError> {
        self.ask(|r| Req::Attach(id, r)).await
    }

    /// Resume its queues, disable the trap and detach.
    pub async fn detach(&self, id: ProcId) -> Result<(), TargetError> {
        self.ask(|r| Req::Detach(id, r)).await
    }

    /// Suspend `queues` of `pid` (attaching first if needed); None: the whole process, including
    /// queues it creates while suspended.
    pub async fn suspend(
        &self,
        id: ProcId,
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
    ) -> Result<OpReport, TargetError> {
        self.ask(|reply| Req::Suspend {
            id,
            queues,
            grace,
            reply,
        })
        .await
    }

    pub async fn resume(
        &self,
        id: ProcId,
        queues: Option<Vec<u32>>,
    ) -> Result<OpReport, TargetError> {
        self.ask(|reply| Req::Resume { id, queues, reply }).await
    }

    /// Suspend again what is held of `id` (it escaped the hold), taking its debug session back
    /// first if it is no longer ours; `rearm`: take it back whatever.
    pub async fn rehold(&self, id: ProcId, rearm: bool) -> Result<OpReport, TargetError> {
        self.ask(|reply| Req::Rehold { id, rearm, reply }).await
    }

    pub async fn snapshot(&self, id: ProcId) -> Result<Vec<SnapQueue>, TargetError> {
        self.ask(|r| Req::Snapshot(id, r)).await
    }

    /// Resume + disable + detach everything; the thread ends.
    pub async fn shutdown(mut self) -> Vec<OpReport> {
        let (tx, rx) = oneshot::channel();
        let sent = self.send(Req::Shutdown(tx));
        let out = if sent {
            rx.await.unwrap_or_default()
        } else {
            Vec::new()
        };
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        out
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let (tx, _rx) = oneshot::channel();
            self.send(Req::Shutdown(tx));
            self.tx = None;
            let _ = t.join();
        }
    }
}
