//! The only module that acts on the kernel: ptrace and KFD DBG_TRAP.
//!
//! The kernel accepts DBG_TRAP calls (other than DISABLE) only from the target's ptrace-parent
//! *thread*, so one dedicated OS thread owns every ptrace and DBG_TRAP call. Async code talks to
//! it through [`Control`]: requests over a channel (an eventfd wakes the thread), replies over
//! oneshot channels, and [`Notice`]s for what happens on its own (a target exits, a new queue,
//! the watchdog, a fenced GPU).
//!
//! Per target: PTRACE_SEIZE (the target never stops), DBG_TRAP ENABLE with a pipe as the event
//! fd, the target's signal-delivery-stops reaped and re-injected at once, QUEUE_NEW cleared so
//! new queues are suspendable, EC_PROCESS_RUNTIME acknowledged so the target's hsa_init never
//! hangs. Whatever happens, queues are resumed: on Shutdown, in Drop (also while unwinding from a
//! panic), by the watchdog; and if this process dies outright the kernel disables the trap on
//! every target when our mm goes away.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    fs::File,
    io::Read as _,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::Path,
    sync::mpsc,
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result};
use gpreempt_common::kfd::{
    self, dbg_op, ec, ec_mask, DbgTrapArgs, DbgTrapEnableArgs, DbgTrapPayload,
    DbgTrapQueryDebugEventArgs, DbgTrapQueueSnapshotArgs, DbgTrapResumeQueuesArgs,
    DbgTrapSendRuntimeEventArgs, DbgTrapSuspendQueuesArgs, QueueSnapshotEntry, RuntimeInfo,
};
use nix::{
    errno::Errno,
    poll::{PollFd, PollFlags, PollTimeout},
    sys::{
        ptrace,
        signal::{SigSet, Signal},
        signalfd::{SfdFlags, SignalFd},
        wait::{waitpid, WaitPidFlag, WaitStatus},
    },
    unistd::Pid,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::clock::monotonic_ns;

/// The events a target reports to us: new queues (to clear QUEUE_NEW), deleted queues, and the
/// runtime's enable/disable (which blocks until we acknowledge it).
const SUBSCRIBED: u64 =
    ec_mask(ec::QUEUE_NEW) | ec_mask(ec::DEVICE_QUEUE_DELETE) | ec_mask(ec::PROCESS_RUNTIME);

/// Blocks SIGCHLD in the calling thread (and every thread it spawns later), so the control
/// thread can take tracee stops from a signalfd. Call before any thread exists.
pub fn block_sigchld() -> Result<()> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGCHLD);
    set.thread_block().context("blocking SIGCHLD")
}

/// Hard limits the control thread enforces by itself, whatever its callers do.
#[derive(Clone, Debug)]
pub struct Limits {
    /// No queue stays suspended longer than this (the watchdog resumes it).
    pub max_suspend: Duration,
    /// At most this many SUSPEND calls per target per second (a runaway caller cannot make the
    /// firmware re-upload runlists without end).
    pub max_suspends_per_s: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_suspend: Duration::from_secs(300),
            max_suspends_per_s: 200,
        }
    }
}

/// What happened to one queue of a SUSPEND / RESUME (the kernel's per-entry status bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueOutcome {
    /// Suspended / resumed (or already so).
    Done,
    /// Not acted on: no such queue, a new queue whose QUEUE_NEW is not cleared yet, or a queue
    /// being destroyed.
    Invalid,
    /// The preemption failed: the GPU may be in trouble.
    Error,
    /// Not attempted: its GPU is fenced after an earlier error.
    Fenced,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueResult {
    pub queue_id: u32,
    pub gpu_id: Option<u32>,
    pub outcome: QueueOutcome,
}

/// The result of one SUSPEND / RESUME call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpReport {
    pub pid: u32,
    /// The ioctl's return value (queues counted by the kernel), or None when no call was needed.
    pub ret: Option<i32>,
    pub queues: Vec<QueueResult>,
    /// CLOCK_MONOTONIC when the ioctl was issued and when it returned.
    pub issued_ns: u64,
    pub returned_ns: u64,
}

impl OpReport {
    /// The queue ids that changed state.
    pub fn done(&self) -> Vec<u32> {
        self.queues
            .iter()
            .filter(|q| q.outcome == QueueOutcome::Done)
            .map(|q| q.queue_id)
            .collect()
    }
}

/// A queue as GET_QUEUE_SNAPSHOT shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapQueue {
    pub queue_id: u32,
    pub gpu_id: u32,
    pub queue_type: u32,
    pub ring_base_address: u64,
    pub ring_size: u32,
    pub suspended: bool,
}

/// Why a process cannot be controlled. Each is a per-target state, never a crash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "detail")]
pub enum TargetError {
    /// The process is gone (ESRCH).
    Gone,
    /// Someone else already traces it (rocgdb, strace, gdb): it cannot be seized.
    Traced {
        tracer: u32,
        comm: String,
    },
    /// Its GPU debug trap is already enabled by another debugger (EALREADY).
    AlreadyDebugged,
    /// The kernel refused (EPERM: no permission, Yama ptrace_scope, or its runtime is not
    /// enabled yet for a suspend).
    NotPermitted(String),
    /// The GPU or kernel cannot do it (EBUSY, ENODEV, EINVAL: e.g. GWS in use, a pre-GFX9 GPU,
    /// no HWS).
    Unsupported(String),
    /// Its GPU is fenced after a preemption error.
    Fenced(String),
    /// Refused by the rate limit.
    RateLimited,
    Other(String),
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gone => write!(f, "the process is gone"),
            Self::Traced { tracer, comm } => write!(
                f,
                "already traced by pid {tracer} ({comm}); a process under rocgdb, gdb or strace \
                 cannot be controlled: detach that tool first"
            ),
            Self::AlreadyDebugged => write!(
                f,
                "its GPU debug trap is already enabled by another debugger (EALREADY); \
                 end that debugger first"
            ),
            Self::NotPermitted(s) => write!(f, "not permitted: {s}"),
            Self::Unsupported(s) => write!(f, "not supported here: {s}"),
            Self::Fenced(s) => write!(f, "GPU fenced: {s}"),
            Self::RateLimited => write!(f, "rate limited: too many suspends of this process"),
            Self::Other(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for TargetError {}

/// What the control thread reports on its own.
#[derive(Clone, Debug, PartialEq)]
pub enum Notice {
    /// A controlled process exited (its queues went with it).
    TargetGone { pid: u32 },
    /// Queues the thread suspended or resumed without a request: new queues of a process held
    /// suspended as a whole, the watchdog, a fence.
    Acted {
        report: OpReport,
        suspend: bool,
        why: String,
    },
    /// After a per-queue ERROR the GPU is no longer preempted.
    Fenced { gpu_id: u32, why: String },
    /// A problem worth telling the operator about.
    Problem { pid: u32, text: String },
}

enum Req {
    Attach(u32, oneshot::Sender<Result<Vec<SnapQueue>, TargetError>>),
    Detach(u32, oneshot::Sender<Result<(), TargetError>>),
    Suspend {
        pid: u32,
        /// None: every queue of the process, now and created later, until a Resume of all.
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
        reply: oneshot::Sender<Result<OpReport, TargetError>>,
    },
    Resume {
        pid: u32,
        queues: Option<Vec<u32>>,
        reply: oneshot::Sender<Result<OpReport, TargetError>>,
    },
    Snapshot(u32, oneshot::Sender<Result<Vec<SnapQueue>, TargetError>>),
    /// Resume + disable + detach everything, then the thread ends.
    Shutdown(oneshot::Sender<Vec<OpReport>>),
}

/// The handle async code holds. Dropping it shuts the thread down (resuming everything).
pub struct Control {
    tx: Option<mpsc::Sender<Req>>,
    wake: std::sync::Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
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
    pub fn start(
        kfd_device: &Path,
        limits: Limits,
    ) -> Result<(Self, tmpsc::UnboundedReceiver<Notice>)> {
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
        let (ntx, nrx) = tmpsc::unbounded_channel();
        let thread_wake = wake_fd.clone();
        let thread = std::thread::Builder::new()
            .name("gpreempt-ctl".into())
            .spawn(move || {
                let mut t = Thread {
                    kfd,
                    sigfd,
                    wake: thread_wake,
                    rx,
                    notices: ntx,
                    targets: BTreeMap::new(),
                    fenced: BTreeMap::new(),
                    limits,
                    destroy_scan_ns: 0,
                };
                t.run();
                // Drop of `t` resumes and disables whatever is left (also when unwinding).
            })
            .context("starting the control thread")?;
        Ok((
            Self {
                tx: Some(tx),
                wake: wake_fd,
                thread: Some(thread),
            },
            nrx,
        ))
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

    /// Seize `pid` and enable its debug trap; returns its queues.
    pub async fn attach(&self, pid: u32) -> Result<Vec<SnapQueue>, TargetError> {
        self.ask(|r| Req::Attach(pid, r)).await
    }

    /// Resume its queues, disable the trap and detach.
    pub async fn detach(&self, pid: u32) -> Result<(), TargetError> {
        self.ask(|r| Req::Detach(pid, r)).await
    }

    /// Suspend `queues` of `pid` (attaching first if needed); None: the whole process, including
    /// queues it creates while suspended.
    pub async fn suspend(
        &self,
        pid: u32,
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
    ) -> Result<OpReport, TargetError> {
        self.ask(|reply| Req::Suspend {
            pid,
            queues,
            grace,
            reply,
        })
        .await
    }

    pub async fn resume(
        &self,
        pid: u32,
        queues: Option<Vec<u32>>,
    ) -> Result<OpReport, TargetError> {
        self.ask(|reply| Req::Resume { pid, queues, reply }).await
    }

    pub async fn snapshot(&self, pid: u32) -> Result<Vec<SnapQueue>, TargetError> {
        self.ask(|r| Req::Snapshot(pid, r)).await
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

// ---------------------------------------------------------------------------------------------
// The thread

struct Target {
    pid: u32,
    /// Read end of the event pipe (the kernel holds the write end).
    events: File,
    /// queue id -> GPU, from snapshots and QUEUE_NEW events.
    queues: BTreeMap<u32, u32>,
    /// Queues we suspended, since when (CLOCK_MONOTONIC ns).
    suspended: BTreeMap<u32, u64>,
    /// Suspended as a whole: new queues are suspended too.
    hold_all: Option<Option<u32>>,
    /// Suspend calls in the current one-second window.
    window: (u64, u32),
}

struct Thread {
    kfd: File,
    sigfd: SignalFd,
    wake: std::sync::Arc<OwnedFd>,
    rx: mpsc::Receiver<Req>,
    notices: tmpsc::UnboundedSender<Notice>,
    targets: BTreeMap<u32, Target>,
    /// GPUs no longer preempted, and why.
    fenced: BTreeMap<u32, String>,
    limits: Limits,
    /// Last look for destroys of held queues (not on every wake-up: it reads procfs).
    destroy_scan_ns: u64,
}

fn ioctl<T>(f: &File, cmd: u32, args: &mut T) -> std::io::Result<i32> {
    // SAFETY: `cmd` encodes `size_of::<T>()` bytes in/out and `args` is a live, exclusive T.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), cmd as libc::c_ulong, args as *mut T) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn tracer_of(pid: u32) -> Option<(u32, String)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let t: u32 = crate::observe::procinfo::status_field(&s, "TracerPid")?
        .parse()
        .ok()?;
    (t != 0).then(|| {
        let comm = std::fs::read_to_string(format!("/proc/{t}/comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        (t, comm)
    })
}

fn errno_of(e: &std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(0))
}

fn op_error(op: &str, e: &std::io::Error) -> TargetError {
    match errno_of(e) {
        Errno::ESRCH => TargetError::Gone,
        Errno::EALREADY => TargetError::AlreadyDebugged,
        Errno::EPERM | Errno::EACCES => TargetError::NotPermitted(format!(
            "DBG_TRAP {op}: {e} (the process may not have started its GPU runtime yet)"
        )),
        Errno::EBUSY | Errno::ENODEV | Errno::EINVAL => {
            TargetError::Unsupported(format!("DBG_TRAP {op}: {e}"))
        }
        _ => TargetError::Other(format!("DBG_TRAP {op}: {e}")),
    }
}

impl Thread {
    fn notice(&self, n: Notice) {
        let _ = self.notices.send(n);
    }

    fn dbg<P: DbgTrapPayload>(&self, pid: u32, p: P) -> std::io::Result<(i32, P)> {
        let mut a = DbgTrapArgs::new(pid, p);
        let r = ioctl(&self.kfd, kfd::cmd::DBG_TRAP, &mut a)?;
        Ok((r, a.payload()))
    }

    fn run(&mut self) {
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
            let mut buf = [0u8; 8];
            // SAFETY: reading 8 bytes into a live buffer from our eventfd.
            unsafe { libc::read(self.wake.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
            // Requests first: a suspend is latency-critical, the housekeeping below is not.
            loop {
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
        let now = monotonic_ns();
        let max = self.limits.max_suspend.as_nanos() as u64;
        let next = self
            .targets
            .values()
            .flat_map(|t| t.suspended.values())
            .map(|since| since.saturating_add(max).saturating_sub(now))
            .min()
            .unwrap_or(u64::MAX);
        // A ceiling of 100 ms also bounds a stop whose SIGCHLD was coalesced away; 10 ms while
        // anything is held, to notice a destroy of a held queue soon (release_destroying).
        let holding = self.targets.values().any(|t| !t.suspended.is_empty());
        (next / 1_000_000 + 1).min(if holding { 10 } else { 100 }) as u16
    }

    fn request(&mut self, r: Req) {
        match r {
            Req::Attach(pid, reply) => {
                let r = self
                    .attach(pid)
                    .map(|_| ())
                    .and_then(|_| self.snapshot(pid));
                let _ = reply.send(r);
            }
            Req::Detach(pid, reply) => {
                let r = if self.targets.contains_key(&pid) {
                    self.release(pid);
                    Ok(())
                } else {
                    Ok(())
                };
                let _ = reply.send(r);
            }
            Req::Suspend {
                pid,
                queues,
                grace,
                reply,
            } => {
                let r = self.suspend(pid, queues, grace);
                let _ = reply.send(r);
            }
            Req::Resume { pid, queues, reply } => {
                let r = self.resume(pid, queues);
                let _ = reply.send(r);
            }
            Req::Snapshot(pid, reply) => {
                let r = self.attach(pid).and_then(|_| self.snapshot(pid));
                let _ = reply.send(r);
            }
            Req::Shutdown(_) => {}
        }
    }

    /// Seize + ENABLE, once per target.
    fn attach(&mut self, pid: u32) -> Result<(), TargetError> {
        if self.targets.contains_key(&pid) {
            return Ok(());
        }
        if pid == std::process::id() {
            return Err(TargetError::NotPermitted(
                "gpreempt-ebpf does not control itself".into(),
            ));
        }
        let p = Pid::from_raw(pid as i32);
        if let Err(e) = ptrace::seize(p, ptrace::Options::empty()) {
            return Err(match e {
                Errno::ESRCH => TargetError::Gone,
                Errno::EPERM => match tracer_of(pid) {
                    Some((tracer, comm)) => TargetError::Traced { tracer, comm },
                    None => TargetError::NotPermitted(format!(
                        "PTRACE_SEIZE: {e} (run as root; check kernel.yama.ptrace_scope)"
                    )),
                },
                e => TargetError::Other(format!("PTRACE_SEIZE: {e}")),
            });
        }
        let (rd, wr) = match nix::unistd::pipe2(
            nix::fcntl::OFlag::O_NONBLOCK | nix::fcntl::OFlag::O_CLOEXEC,
        ) {
            Ok(p) => p,
            Err(e) => {
                self.detach_ptrace(pid);
                return Err(TargetError::Other(format!("pipe: {e}")));
            }
        };
        let mut rinfo = RuntimeInfo::default();
        let en = DbgTrapEnableArgs {
            exception_mask: SUBSCRIBED,
            rinfo_ptr: &mut rinfo as *mut RuntimeInfo as u64,
            rinfo_size: std::mem::size_of::<RuntimeInfo>() as u32,
            dbg_fd: wr.as_raw_fd() as u32,
        };
        if let Err(e) = self.dbg(pid, en) {
            // The kernel records us as the target's debugger even when ENABLE fails; that is
            // harmless unless another debugger holds the trap (EALREADY; it cannot be a tracer,
            // the seize would have failed): our exit then disables its trap. Nothing can undo it.
            self.detach_ptrace(pid);
            return Err(op_error("enable", &e));
        }
        // The kernel holds its own reference to the write end.
        drop(wr);
        self.targets.insert(
            pid,
            Target {
                pid,
                events: File::from(rd),
                queues: BTreeMap::new(),
                suspended: BTreeMap::new(),
                hold_all: None,
                window: (0, 0),
            },
        );
        if rinfo.runtime_state == kfd::runtime_state::ENABLED {
            // A runtime left waiting for an acknowledgment by a debugger that died (the kernel
            // does not wake it) goes on; otherwise the extra count only means a later wait of the
            // target returns at once.
            let ack = DbgTrapSendRuntimeEventArgs {
                exception_mask: ec_mask(ec::PROCESS_RUNTIME),
                gpu_id: 0,
                queue_id: 0,
            };
            if let Err(e) = self.dbg(pid, ack) {
                log::debug!("pid {pid}: runtime acknowledgment: {e}");
            }
        }
        log::info!("pid {pid}: under control");
        Ok(())
    }

    /// GET_QUEUE_SNAPSHOT, clearing QUEUE_NEW; the target's queue map is rebuilt from it.
    fn snapshot(&mut self, pid: u32) -> Result<Vec<SnapQueue>, TargetError> {
        let mut cap = 64usize;
        let entries = loop {
            let mut buf = vec![QueueSnapshotEntry::default(); cap];
            let a = DbgTrapQueueSnapshotArgs {
                exception_mask: ec_mask(ec::QUEUE_NEW),
                snapshot_buf_ptr: buf.as_mut_ptr() as u64,
                num_queues: cap as u32,
                entry_size: std::mem::size_of::<QueueSnapshotEntry>() as u32,
            };
            let (_, out) = self
                .dbg(pid, a)
                .map_err(|e| op_error("get_queue_snapshot", &e))?;
            let n = out.num_queues as usize;
            if n <= cap {
                buf.truncate(n);
                break buf;
            }
            cap = n.next_power_of_two();
        };
        let mut fresh = Vec::new();
        let held = self.targets.get(&pid).and_then(|t| t.hold_all);
        let queues: Vec<SnapQueue> = entries
            .iter()
            .map(|e| SnapQueue {
                queue_id: e.queue_id,
                gpu_id: e.gpu_id,
                queue_type: e.queue_type,
                ring_base_address: e.ring_base_address,
                ring_size: e.ring_size,
                suspended: self
                    .targets
                    .get(&pid)
                    .is_some_and(|t| t.suspended.contains_key(&e.queue_id)),
            })
            .collect();
        if let Some(t) = self.targets.get_mut(&pid) {
            let now: BTreeMap<u32, u32> = queues.iter().map(|q| (q.queue_id, q.gpu_id)).collect();
            for q in now.keys() {
                if !t.queues.contains_key(q) {
                    fresh.push(*q);
                }
            }
            t.suspended.retain(|q, _| now.contains_key(q));
            t.queues = now;
        }
        if let Some(grace) = held {
            if !fresh.is_empty() {
                self.auto_suspend(pid, fresh, grace);
            }
        }
        Ok(queues)
    }

    /// New queues of a process held suspended as a whole are suspended at once.
    fn auto_suspend(&mut self, pid: u32, ids: Vec<u32>, grace: Option<u32>) {
        match self.suspend_ids(pid, &ids, grace) {
            Ok(report) => self.notice(Notice::Acted {
                report,
                suspend: true,
                why: "new queue of a suspended process".into(),
            }),
            Err(e) => self.notice(Notice::Problem {
                pid,
                text: format!("suspending its new queues: {e}"),
            }),
        }
    }

    /// Drains the event pipe and every pending debug event.
    fn handle_events(&mut self, pid: u32) {
        let Some(t) = self.targets.get_mut(&pid) else {
            return;
        };
        let mut buf = [0u8; 256];
        loop {
            match t.events.read(&mut buf) {
                Ok(0) => break, // the kernel dropped the trap (DISABLE by someone, or exit)
                Ok(_) => continue,
                Err(_) => break,
            }
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
                Err(e) => {
                    if errno_of(&e) == Errno::EINVAL || errno_of(&e) == Errno::ESRCH {
                        // The trap was disabled under us (DISABLE by someone else) or the
                        // target is gone: nothing of ours is suspended any more.
                        self.lost(pid, &format!("debug events: {e}"));
                    }
                    return;
                }
            };
            let s = ev.exception_mask;
            if s & ec_mask(ec::QUEUE_NEW) != 0 && ev.gpu_id != 0 {
                if let Some(t) = self.targets.get_mut(&pid) {
                    t.queues.insert(ev.queue_id, ev.gpu_id);
                }
                new_queues.push(ev.queue_id);
            }
            if s & ec_mask(ec::DEVICE_QUEUE_DELETE) != 0 {
                deleted = true;
            }
            if s & ec_mask(ec::PROCESS_RUNTIME) != 0 {
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
        let held = self.targets.get(&pid).and_then(|t| t.hold_all);
        if let Some(grace) = held {
            if !new_queues.is_empty() {
                self.auto_suspend(pid, new_queues, grace);
            }
        }
    }

    /// The trap went away without us (someone's DISABLE): forget what we held.
    fn lost(&mut self, pid: u32, why: &str) {
        if let Some(t) = self.targets.remove(&pid) {
            if !t.suspended.is_empty() {
                self.notice(Notice::Problem {
                    pid,
                    text: format!("control lost ({why}); its queues run again"),
                });
            }
            self.detach_ptrace(pid);
            self.notice(Notice::TargetGone { pid });
        }
    }

    /// Reaps the targets' stops: a signal-delivery-stop is continued with the same signal at
    /// once; a group-stop (SIGSTOP & co.) is kept with PTRACE_LISTEN, as it would be untraced.
    fn reap(&mut self) {
        let pids: Vec<u32> = self.targets.keys().copied().collect();
        for pid in pids {
            let p = Pid::from_raw(pid as i32);
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
                        self.targets.remove(&pid);
                        self.notice(Notice::TargetGone { pid });
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

    fn rate_ok(&mut self, pid: u32) -> bool {
        let limit = self.limits.max_suspends_per_s;
        let Some(t) = self.targets.get_mut(&pid) else {
            return true;
        };
        let now = monotonic_ns();
        if now.saturating_sub(t.window.0) >= 1_000_000_000 {
            t.window = (now, 0);
        }
        t.window.1 += 1;
        t.window.1 <= limit
    }

    fn suspend(
        &mut self,
        pid: u32,
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
    ) -> Result<OpReport, TargetError> {
        self.attach(pid)?;
        let ids = match &queues {
            Some(q) => q.clone(),
            None => {
                self.snapshot(pid)?;
                if let Some(t) = self.targets.get_mut(&pid) {
                    t.hold_all = Some(grace);
                }
                self.targets
                    .get(&pid)
                    .map(|t| t.queues.keys().copied().collect())
                    .unwrap_or_default()
            }
        };
        if !self.rate_ok(pid) {
            return Err(TargetError::RateLimited);
        }
        self.suspend_ids(pid, &ids, grace)
    }

    fn gpu_of(&self, pid: u32, qid: u32) -> Option<u32> {
        self.targets.get(&pid)?.queues.get(&qid).copied()
    }

    fn suspend_ids(
        &mut self,
        pid: u32,
        ids: &[u32],
        grace: Option<u32>,
    ) -> Result<OpReport, TargetError> {
        // Queues on fenced GPUs are not touched.
        let (ids, fenced): (Vec<u32>, Vec<u32>) = ids.iter().partition(|q| {
            self.gpu_of(pid, **q)
                .is_none_or(|g| !self.fenced.contains_key(&g))
        });
        let mut report = self.queue_op(pid, true, &ids, grace)?;
        for q in fenced {
            report.queues.push(QueueResult {
                queue_id: q,
                gpu_id: self.gpu_of(pid, q),
                outcome: QueueOutcome::Fenced,
            });
        }
        if let Some(t) = self.targets.get_mut(&pid) {
            for q in &report.queues {
                if q.outcome == QueueOutcome::Done {
                    t.suspended.entry(q.queue_id).or_insert(report.returned_ns);
                }
            }
        }
        let errors: BTreeSet<u32> = report
            .queues
            .iter()
            .filter(|q| q.outcome == QueueOutcome::Error)
            .filter_map(|q| q.gpu_id)
            .collect();
        for gpu in errors {
            self.fence(
                gpu,
                format!("a suspend of pid {pid}'s queues returned ERROR (failed preemption)"),
            );
        }
        Ok(report)
    }

    fn resume(&mut self, pid: u32, queues: Option<Vec<u32>>) -> Result<OpReport, TargetError> {
        if !self.targets.contains_key(&pid) {
            // Nothing of ours; a resume of a process another instance left behind goes through
            // a fresh attach (ENABLE, RESUME all, DISABLE).
            self.attach(pid)?;
            let r = self.queue_op(pid, false, &[], None);
            let all = self.resume_all_raw(pid);
            self.release(pid);
            return r.map(|mut r| {
                r.ret = all.ok();
                r
            });
        }
        let ids = match queues {
            Some(q) => q,
            None => {
                if let Some(t) = self.targets.get_mut(&pid) {
                    t.hold_all = None;
                }
                self.targets
                    .get(&pid)
                    .map(|t| t.queues.keys().copied().collect())
                    .unwrap_or_default()
            }
        };
        let report = self.queue_op(pid, false, &ids, None)?;
        if let Some(t) = self.targets.get_mut(&pid) {
            for q in &report.queues {
                if q.outcome == QueueOutcome::Done {
                    t.suspended.remove(&q.queue_id);
                }
            }
        }
        Ok(report)
    }

    /// RESUME_QUEUES with no array: the kernel resumes every queue of the target.
    fn resume_all_raw(&mut self, pid: u32) -> Result<i32, TargetError> {
        let a = DbgTrapResumeQueuesArgs {
            queue_array_ptr: 0,
            num_queues: 0,
            pad: 0,
        };
        let r = self
            .dbg(pid, a)
            .map(|(r, _)| r)
            .map_err(|e| op_error("resume_queues", &e));
        if let Some(t) = self.targets.get_mut(&pid) {
            if r.is_ok() {
                t.suspended.clear();
            }
        }
        r
    }

    /// One SUSPEND_QUEUES / RESUME_QUEUES call with per-queue results.
    fn queue_op(
        &mut self,
        pid: u32,
        suspend: bool,
        ids: &[u32],
        grace: Option<u32>,
    ) -> Result<OpReport, TargetError> {
        let mut arr: Vec<u32> = ids.to_vec();
        let issued_ns = monotonic_ns();
        if arr.is_empty() {
            return Ok(OpReport {
                pid,
                ret: None,
                queues: Vec::new(),
                issued_ns,
                returned_ns: issued_ns,
            });
        }
        let r = if suspend {
            self.dbg(
                pid,
                DbgTrapSuspendQueuesArgs {
                    exception_mask: 0,
                    queue_array_ptr: arr.as_mut_ptr() as u64,
                    num_queues: arr.len() as u32,
                    grace_period: grace.unwrap_or(kfd::USE_DEFAULT_GRACE_PERIOD),
                },
            )
            .map(|(r, _)| r)
        } else {
            self.dbg(
                pid,
                DbgTrapResumeQueuesArgs {
                    queue_array_ptr: arr.as_mut_ptr() as u64,
                    num_queues: arr.len() as u32,
                    pad: 0,
                },
            )
            .map(|(r, _)| r)
        };
        let returned_ns = monotonic_ns();
        let ret = r.map_err(|e| {
            op_error(
                if suspend {
                    "suspend_queues"
                } else {
                    "resume_queues"
                },
                &e,
            )
        })?;
        let queues = arr
            .iter()
            .map(|&v| {
                let queue_id =
                    v & !(kfd::KFD_DBG_QUEUE_ERROR_MASK | kfd::KFD_DBG_QUEUE_INVALID_MASK);
                QueueResult {
                    queue_id,
                    gpu_id: self.gpu_of(pid, queue_id),
                    outcome: if v & kfd::KFD_DBG_QUEUE_ERROR_MASK != 0 {
                        QueueOutcome::Error
                    } else if v & kfd::KFD_DBG_QUEUE_INVALID_MASK != 0 {
                        QueueOutcome::Invalid
                    } else {
                        QueueOutcome::Done
                    },
                }
            })
            .collect();
        Ok(OpReport {
            pid,
            ret: Some(ret),
            queues,
            issued_ns,
            returned_ns,
        })
    }

    /// After a per-queue ERROR: no more preemption on that GPU, and what we hold there runs again.
    fn fence(&mut self, gpu: u32, why: String) {
        if self.fenced.contains_key(&gpu) {
            return;
        }
        log::warn!("GPU {gpu:#x}: {why}: no longer preempting it");
        self.fenced.insert(gpu, why.clone());
        let held: Vec<(u32, Vec<u32>)> = self
            .targets
            .values()
            .map(|t| {
                (
                    t.pid,
                    t.suspended
                        .keys()
                        .filter(|q| t.queues.get(q) == Some(&gpu))
                        .copied()
                        .collect::<Vec<_>>(),
                )
            })
            .filter(|(_, q)| !q.is_empty())
            .collect();
        for (pid, ids) in held {
            match self.resume(pid, Some(ids)) {
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

    /// The kernel makes a DESTROY_QUEUE of a suspended queue wait until it is resumed, and tells
    /// the debugger nothing: a target ending normally would hang. So a held target's threads are
    /// looked at (`/proc/PID/task/TID/syscall`): one inside DESTROY_QUEUE for a held queue gets
    /// it resumed.
    fn release_destroying(&mut self) {
        let now = monotonic_ns();
        if now.saturating_sub(self.destroy_scan_ns) < 5_000_000 {
            return;
        }
        self.destroy_scan_ns = now;
        let held: Vec<u32> = self
            .targets
            .values()
            .filter(|t| !t.suspended.is_empty())
            .map(|t| t.pid)
            .collect();
        for pid in held {
            let ids = destroying(pid);
            let ids: Vec<u32> = ids
                .into_iter()
                .filter(|q| {
                    self.targets
                        .get(&pid)
                        .is_some_and(|t| t.suspended.contains_key(q))
                })
                .collect();
            if ids.is_empty() {
                continue;
            }
            match self.resume(pid, Some(ids)) {
                Ok(report) => self.notice(Notice::Acted {
                    report,
                    suspend: false,
                    why: "the process is destroying it".into(),
                }),
                Err(e) => self.notice(Notice::Problem {
                    pid,
                    text: format!("resuming a queue it destroys: {e}"),
                }),
            }
        }
    }

    /// Resumes queues suspended for longer than the hard limit.
    fn watchdog(&mut self) {
        let now = monotonic_ns();
        let max = self.limits.max_suspend.as_nanos() as u64;
        let due: Vec<(u32, Vec<u32>)> = self
            .targets
            .values()
            .map(|t| {
                (
                    t.pid,
                    t.suspended
                        .iter()
                        .filter(|(_, since)| now.saturating_sub(**since) >= max)
                        .map(|(q, _)| *q)
                        .collect::<Vec<_>>(),
                )
            })
            .filter(|(_, q)| !q.is_empty())
            .collect();
        for (pid, ids) in due {
            if let Some(t) = self.targets.get_mut(&pid) {
                t.hold_all = None;
            }
            match self.resume(pid, Some(ids.clone())) {
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
                            t.suspended.remove(q);
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

    /// Resume all, DISABLE (which resumes all again in the kernel), detach.
    fn release(&mut self, pid: u32) -> Option<OpReport> {
        if !self.targets.contains_key(&pid) {
            return None;
        }
        let held: Vec<u32> = self.targets[&pid].suspended.keys().copied().collect();
        let report = self.queue_op(pid, false, &held, None).ok();
        if let Err(e) = self.resume_all_raw(pid) {
            log::debug!("pid {pid}: resume all: {e}");
        }
        let d = DbgTrapArgs {
            pid,
            op: dbg_op::DISABLE,
            data: [0; 3],
        };
        let mut d = d;
        if let Err(e) = ioctl(&self.kfd, kfd::cmd::DBG_TRAP, &mut d) {
            if errno_of(&e) != Errno::ESRCH && errno_of(&e) != Errno::EINVAL {
                log::warn!("pid {pid}: DBG_TRAP disable: {e}");
            }
        }
        self.targets.remove(&pid);
        self.detach_ptrace(pid);
        report
    }

    fn release_all(&mut self) -> Vec<OpReport> {
        let pids: Vec<u32> = self.targets.keys().copied().collect();
        pids.into_iter().filter_map(|p| self.release(p)).collect()
    }

    /// Ends the ptrace link: a seized tracee must be stopped to be detached, so interrupt it,
    /// wait (bounded) for the stop and detach, passing on a signal it was about to get.
    fn detach_ptrace(&mut self, pid: u32) {
        let p = Pid::from_raw(pid as i32);
        if ptrace::interrupt(p).is_err() {
            return;
        }
        let end = monotonic_ns() + 1_000_000_000;
        while monotonic_ns() < end {
            match waitpid(p, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                Ok(WaitStatus::StillAlive) => std::thread::sleep(Duration::from_micros(200)),
                Ok(WaitStatus::Stopped(_, sig)) => {
                    let _ = ptrace::detach(p, sig);
                    return;
                }
                Ok(WaitStatus::PtraceEvent(_, sig, _)) => {
                    let pass = matches!(
                        sig,
                        Signal::SIGSTOP | Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU
                    )
                    .then_some(sig);
                    let _ = ptrace::detach(p, pass);
                    return;
                }
                Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) => return,
                Ok(_) => {
                    let _ = ptrace::detach(p, None);
                    return;
                }
                Err(Errno::EINTR) => {}
                Err(_) => return,
            }
        }
        log::warn!(
            "pid {pid}: did not stop to be detached; the link ends when gpreempt-ebpf exits"
        );
    }
}

impl Drop for Thread {
    fn drop(&mut self) {
        // Also runs while unwinding from a panic on this thread.
        let _ = self.release_all();
    }
}

/// Queue ids that `pid`'s threads are destroying right now (blocked in DESTROY_QUEUE).
fn destroying(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let Ok(line) = std::fs::read_to_string(t.path().join("syscall")) else {
            continue;
        };
        // "NR arg0 arg1 arg2 ..." (hex args) while in a syscall; "running" or "-1 ..." otherwise.
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 || f[0] != libc::SYS_ioctl.to_string() {
            continue;
        }
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
        if hex(f[2]) != Some(u64::from(kfd::cmd::DESTROY_QUEUE)) {
            continue;
        }
        let Some(ptr) = hex(f[3]) else { continue };
        let mut buf = [0u8; 4];
        let remote = [nix::sys::uio::RemoteIoVec {
            base: ptr as usize,
            len: 4,
        }];
        if crate::kfd::sampler::read_remote(pid, &remote, &mut buf) == Ok(4) {
            out.push(u32::from_le_bytes(buf));
        }
    }
    out
}
