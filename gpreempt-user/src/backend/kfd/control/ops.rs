//! The per-target kernel operations, all on the control thread: PTRACE_SEIZE and DBG_TRAP
//! ENABLE, GET_QUEUE_SNAPSHOT, SUSPEND_QUEUES / RESUME_QUEUES with their per-queue status bits,
//! DISABLE and the ptrace detach, and the check for a DESTROY_QUEUE waiting on a held queue.

use std::{fs::File, os::fd::AsRawFd, time::Duration};

use gpreempt_common::kfd::{
    self, dbg_op, ec, ec_mask, DbgTrapArgs, DbgTrapPayload, DbgTrapQueueSnapshotArgs,
    DbgTrapResumeQueuesArgs, DbgTrapSuspendQueuesArgs, QueueSnapshotEntry,
};
use nix::{
    errno::Errno,
    sys::{
        ptrace,
        signal::Signal,
        wait::{waitpid, WaitPidFlag, WaitStatus},
    },
    unistd::Pid,
};

use super::{
    holds::{self, Book},
    thread::{Target, Thread},
    types::{errno_of, SnapQueue, TargetError},
};
use crate::{
    clock::monotonic_ns,
    observe::procinfo::{NotThatProcess, ProcId},
    outcome::{Notice, OpReport, QueueOutcome, QueueResult},
};

/// Whether `id` still names the process that has its pid (read from /proc now).
fn still(id: ProcId) -> Result<(), TargetError> {
    id.check(std::path::Path::new("/proc"))
        .map_err(|e| match e {
            NotThatProcess::Gone => TargetError::Gone,
            NotThatProcess::Reused { start_time } => {
                log::warn!(
                "{id}: the pid now names a process started at tick {start_time}: not touching it"
            );
                TargetError::Reused { pid: id.pid }
            }
        })
}

pub(super) fn ioctl<T>(f: &File, cmd: u32, args: &mut T) -> std::io::Result<i32> {
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

/// Why PTRACE_SEIZE failed; `tracer` (read only on EPERM) names whoever traces the process,
/// `why` (read only on EPERM when nobody does) the cause this host shows.
pub(super) fn seize_error(
    e: Errno,
    tracer: impl FnOnce() -> Option<(u32, String)>,
    why: impl FnOnce() -> String,
) -> TargetError {
    match e {
        Errno::ESRCH => TargetError::Gone,
        Errno::EPERM => match tracer() {
            Some((tracer, comm)) => TargetError::Traced { tracer, comm },
            None => TargetError::NotPermitted(format!("PTRACE_SEIZE: {e}: {}", why())),
        },
        e => TargetError::Other(format!("PTRACE_SEIZE: {e}")),
    }
}

/// What this host says about an EPERM from PTRACE_SEIZE of `pid`, under `root` (/ or a fake
/// tree): a kernel thread, Yama's setting only where Yama exists, our capabilities; else that
/// nothing visible explains it.
pub(super) fn seize_eperm_cause(root: &std::path::Path, pid: u32) -> String {
    let status =
        std::fs::read_to_string(root.join(format!("proc/{pid}/status"))).unwrap_or_default();
    let field = |k: &str| crate::observe::procinfo::status_field(&status, k).map(str::trim);
    if field("Kthread") == Some("1") || field("PPid") == Some("2") || pid == 2 {
        return format!("pid {pid} is a kernel thread: the kernel never lets one be traced");
    }
    let me = std::fs::read_to_string(root.join("proc/self/status")).unwrap_or_default();
    let has_ptrace = crate::observe::procinfo::status_field(&me, "CapEff")
        .and_then(|c| u64::from_str_radix(c.trim(), 16).ok())
        .map(|c| c & (1 << crate::observe::host::CAP_SYS_PTRACE) != 0);
    let yama = std::fs::read_to_string(root.join("proc/sys/kernel/yama/ptrace_scope"))
        .ok()
        .map(|v| v.trim().to_string());
    match (yama.as_deref(), has_ptrace) {
        (Some("3"), _) => "kernel.yama.ptrace_scope is 3: no process may attach to another until \
             the next boot"
            .into(),
        (_, Some(false)) => "this process lacks CAP_SYS_PTRACE: run it as root".into(),
        (Some(v), _) if v != "0" => format!(
            "kernel.yama.ptrace_scope is {v} and yet it was refused: an LSM (SELinux, AppArmor) \
             policy or a user namespace boundary may forbid it"
        ),
        _ => "the kernel refused with nothing this host shows to explain it (no Yama \
              restriction, CAP_SYS_PTRACE held): an LSM (SELinux, AppArmor) policy, or a target \
              in another user namespace"
            .into(),
    }
}

pub(super) fn op_error(op: &str, e: &std::io::Error) -> TargetError {
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

/// A queue operation refused with EPERM on a target whose GPU runtime never enabled the debug API:
/// `kfd_ioctl_set_debug_trap` refuses every queue operation on such a process (docs/kfd.md). The
/// usual cause is a ROCm older than 5.7, whose thunk asks the DKMS-only debug ioctl instead.
pub(super) fn runtime_refusal(pid: u32, op: &str) -> TargetError {
    TargetError::NoDebugApi(format!(
        "DBG_TRAP {op}: pid {pid}'s GPU runtime never enabled the KFD debug API (no \
         RUNTIME_ENABLE), and the kernel refuses to suspend or resume the queues of such a \
         process. ROCm's runtime enables it at start from ROCm 5.7 on; earlier releases (Debian \
         12's ROCm 5.2.3 among them) never do: this process cannot be suspended (run it with \
         ROCm 5.7 or later)"
    ))
}

/// `op_error` for a queue operation, knowing whether the target's runtime was enabled.
pub(super) fn queue_op_error(
    pid: u32,
    op: &str,
    e: &std::io::Error,
    runtime_enabled: Option<bool>,
) -> TargetError {
    match (errno_of(e), runtime_enabled) {
        (Errno::EPERM, Some(false)) => runtime_refusal(pid, op),
        _ => op_error(op, e),
    }
}

impl Thread {
    pub(super) fn dbg<P: DbgTrapPayload>(&self, pid: u32, p: P) -> std::io::Result<(i32, P)> {
        let mut a = DbgTrapArgs::new(pid, p);
        let r = self.dbg_raw(&mut a)?;
        Ok((r, a.payload()))
    }

    /// One DBG_TRAP call, shown to the lease as a driver call in flight: a slow driver is not a
    /// stuck controller.
    pub(super) fn dbg_raw(&self, args: &mut DbgTrapArgs) -> std::io::Result<i32> {
        self.turns.call_begins(monotonic_ns());
        let r = ioctl(&self.kfd, kfd::cmd::DBG_TRAP, args);
        self.turns.call_ends(monotonic_ns());
        r
    }

    /// Whether `id` is the process this thread knows under its pid: a target's start time
    /// (seized, so its pid cannot pass to another process until we reap it), else /proc's.
    pub(super) fn verify(&self, id: ProcId) -> Result<(), TargetError> {
        match self.targets.get(&id.pid) {
            Some(t) if t.start_time == id.start_time => Ok(()),
            Some(t) => {
                log::warn!(
                    "{id}: under control is the process started at tick {}: not touching it",
                    t.start_time
                );
                Err(TargetError::Reused { pid: id.pid })
            }
            None => still(id),
        }
    }

    /// Seize + ENABLE, once per target; only the process `id` names.
    pub(super) fn attach(&mut self, id: ProcId) -> Result<(), TargetError> {
        let pid = id.pid;
        if self.targets.contains_key(&pid) {
            return self.verify(id);
        }
        if pid == std::process::id() {
            return Err(TargetError::NotPermitted(
                "gpreempt-ebpf does not control itself".into(),
            ));
        }
        let p = Pid::from_raw(pid as i32);
        // Right before the seize: a process that merely got the pid is not seized.
        still(id)?;
        if let Err(e) = ptrace::seize(p, ptrace::Options::empty()) {
            return Err(seize_error(
                e,
                || tracer_of(pid),
                || seize_eperm_cause(std::path::Path::new("/"), pid),
            ));
        }
        // Seized, the pid cannot pass to another process before we reap it: this check is
        // exact. A process that got the pid between the two checks is let go untouched.
        if let Err(e) = still(id) {
            self.detach_ptrace(pid);
            return Err(e);
        }
        let enabled = match self.enable(pid) {
            // Seized, it has no other tracer: a session already there is one it enabled on
            // itself (amdkfd allows that without ptrace) or a debugger's that let go of its
            // ptrace link. As its ptrace parent we may end it: the job is under control now.
            Err(TargetError::AlreadyDebugged) => {
                let mut d = DbgTrapArgs::bare(pid, dbg_op::DISABLE);
                match self.dbg_raw(&mut d) {
                    Ok(_) => {
                        log::info!(
                            "pid {pid}: ended the debug session it had (enabled on itself?)"
                        );
                        self.enable(pid)
                    }
                    Err(_) => Err(TargetError::AlreadyDebugged),
                }
            }
            r => r,
        };
        let (events, runtime_enabled) = match enabled {
            Ok(v) => v,
            Err(e) => {
                // The kernel records us as the target's debugger even when ENABLE fails; that
                // is harmless unless another debugger holds the trap (EALREADY; it cannot be a
                // tracer, the seize would have failed): our exit then disables its trap.
                // Nothing can undo it.
                self.detach_ptrace(pid);
                return Err(e);
            }
        };
        self.targets.insert(
            pid,
            Target {
                pid,
                start_time: id.start_time,
                events,
                book: Book::default(),
                runtime_enabled: Some(runtime_enabled),
            },
        );
        log::info!("pid {pid}: under control");
        Ok(())
    }

    /// GET_QUEUE_SNAPSHOT, clearing QUEUE_NEW; the target's queue map is rebuilt from it.
    pub(super) fn snapshot(&mut self, pid: u32) -> Result<Vec<SnapQueue>, TargetError> {
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
        let held = self.targets.get(&pid).and_then(|t| t.book.hold_all);
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
                    .is_some_and(|t| t.book.suspended.contains_key(&e.queue_id)),
            })
            .collect();
        if let Some(t) = self.targets.get_mut(&pid) {
            fresh = t
                .book
                .set_queues(queues.iter().map(|q| (q.queue_id, q.gpu_id)).collect());
        }
        if let Some(grace) = held {
            if !fresh.is_empty() {
                self.auto_suspend(pid, fresh, grace);
            }
        }
        Ok(queues)
    }

    /// New queues of a process held suspended as a whole are suspended at once.
    pub(super) fn auto_suspend(&mut self, pid: u32, ids: Vec<u32>, grace: Option<u32>) {
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

    pub(super) fn rate_ok(&mut self, pid: u32) -> bool {
        let limit = self.limits.max_suspends_per_s;
        let Some(t) = self.targets.get_mut(&pid) else {
            return true;
        };
        t.book.window.admit(monotonic_ns(), limit)
    }

    pub(super) fn suspend(
        &mut self,
        id: ProcId,
        queues: Option<Vec<u32>>,
        grace: Option<u32>,
    ) -> Result<OpReport, TargetError> {
        holds::no_status_bits(queues.as_deref().unwrap_or_default())?;
        let pid = id.pid;
        let fresh = !self.targets.contains_key(&pid);
        self.attach(id)?;
        let ids = match &queues {
            Some(q) => {
                // A target attached just now has its queues flagged NEW, and the kernel does
                // not suspend those (INVALID) until a snapshot clears the flag.
                if fresh {
                    self.snapshot(pid)?;
                }
                q.clone()
            }
            None => {
                self.snapshot(pid)?;
                if let Some(t) = self.targets.get_mut(&pid) {
                    t.book.hold_all = Some(grace);
                }
                self.targets
                    .get(&pid)
                    .map(|t| t.book.queues.keys().copied().collect())
                    .unwrap_or_default()
            }
        };
        if !self.rate_ok(pid) {
            return Err(TargetError::RateLimited);
        }
        self.suspend_ids(pid, &ids, grace)
    }

    fn gpu_of(&self, pid: u32, qid: u32) -> Option<u32> {
        self.targets.get(&pid)?.book.gpu_of(qid)
    }

    pub(super) fn suspend_ids(
        &mut self,
        pid: u32,
        ids: &[u32],
        grace: Option<u32>,
    ) -> Result<OpReport, TargetError> {
        // Queues on fenced GPUs are not touched.
        let (ids, fenced) = self.fenced.split(ids, |q| self.gpu_of(pid, q));
        let mut report = self.queue_op(pid, true, &ids, grace)?;
        for q in fenced {
            report.queues.push(QueueResult {
                queue_id: q,
                gpu_id: self.gpu_of(pid, q),
                outcome: QueueOutcome::Fenced,
            });
        }
        if let Some(t) = self.targets.get_mut(&pid) {
            t.book.record_suspended(&report);
        }
        for gpu in holds::error_gpus(&report) {
            self.fence(
                gpu,
                format!("a suspend of pid {pid}'s queues returned ERROR (failed preemption)"),
            );
        }
        Ok(report)
    }

    /// A caller's resume of `id`.
    pub(super) fn resume(
        &mut self,
        id: ProcId,
        queues: Option<Vec<u32>>,
    ) -> Result<OpReport, TargetError> {
        holds::no_status_bits(queues.as_deref().unwrap_or_default())?;
        let pid = id.pid;
        if !self.targets.contains_key(&pid) {
            // Nothing of ours; a resume of a process another instance left behind goes through
            // a fresh attach (ENABLE, RESUME all, DISABLE).
            self.attach(id)?;
            let r = self.queue_op(pid, false, &[], None);
            let all = self.resume_all_raw(pid);
            self.release(pid);
            return r.map(|mut r| {
                r.ret = all.ok();
                r
            });
        }
        self.verify(id)?;
        self.resume_target(pid, queues)
    }

    /// Resumes `queues` (None: all) of the target under control as `pid`.
    pub(super) fn resume_target(
        &mut self,
        pid: u32,
        queues: Option<Vec<u32>>,
    ) -> Result<OpReport, TargetError> {
        if !self.targets.contains_key(&pid) {
            return Err(TargetError::Gone);
        }
        let ids = match queues {
            Some(q) => q,
            None => {
                if let Some(t) = self.targets.get_mut(&pid) {
                    t.book.hold_all = None;
                }
                self.targets
                    .get(&pid)
                    .map(|t| t.book.queues.keys().copied().collect())
                    .unwrap_or_default()
            }
        };
        let report = self.queue_op(pid, false, &ids, None)?;
        if let Some(t) = self.targets.get_mut(&pid) {
            t.book.record_resumed(&report);
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
                t.book.suspended.clear();
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
                effect: crate::outcome::Effect::Paused,
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
        let runtime = self.targets.get(&pid).and_then(|t| t.runtime_enabled);
        let ret = r.map_err(|e| {
            queue_op_error(
                pid,
                if suspend {
                    "suspend_queues"
                } else {
                    "resume_queues"
                },
                &e,
                runtime,
            )
        })?;
        let queues = holds::decode_statuses(&arr, |q| self.gpu_of(pid, q));
        Ok(OpReport {
            pid,
            ret: Some(ret),
            queues,
            issued_ns,
            returned_ns,
            effect: crate::outcome::Effect::Paused,
        })
    }

    /// The kernel makes a DESTROY_QUEUE of a suspended queue wait until it is resumed, and tells
    /// the debugger nothing: a target ending normally would hang. So a held target's threads are
    /// looked at (`/proc/PID/task/TID/syscall`): one inside DESTROY_QUEUE for a held queue gets
    /// it resumed.
    pub(super) fn release_destroying(&mut self) {
        let now = monotonic_ns();
        if now.saturating_sub(self.destroy_scan_ns) < 5_000_000 {
            return;
        }
        self.destroy_scan_ns = now;
        let held: Vec<u32> = self
            .targets
            .values()
            .filter(|t| !t.book.suspended.is_empty())
            .map(|t| t.pid)
            .collect();
        for pid in held {
            let ids = destroying(pid);
            let ids: Vec<u32> = ids
                .into_iter()
                .filter(|q| {
                    self.targets
                        .get(&pid)
                        .is_some_and(|t| t.book.suspended.contains_key(q))
                })
                .collect();
            if ids.is_empty() {
                continue;
            }
            match self.resume_target(pid, Some(ids)) {
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

    /// Resume all, DISABLE (which resumes all again in the kernel), detach.
    pub(super) fn release(&mut self, pid: u32) -> Option<OpReport> {
        if !self.targets.contains_key(&pid) {
            return None;
        }
        let held: Vec<u32> = self.targets[&pid].book.suspended.keys().copied().collect();
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
        if let Err(e) = self.dbg_raw(&mut d) {
            if errno_of(&e) != Errno::ESRCH && errno_of(&e) != Errno::EINVAL {
                log::warn!("pid {pid}: DBG_TRAP disable: {e}");
            }
        }
        self.targets.remove(&pid);
        self.detach_ptrace(pid);
        report
    }

    pub(super) fn release_all(&mut self) -> Vec<OpReport> {
        let pids: Vec<u32> = self.targets.keys().copied().collect();
        pids.into_iter()
            .filter_map(|p| {
                self.turn();
                self.release(p)
            })
            .collect()
    }

    /// Ends the ptrace link: a seized tracee must be stopped to be detached, so interrupt it,
    /// wait (bounded) for the stop and detach, passing on a signal it was about to get.
    pub(super) fn detach_ptrace(&mut self, pid: u32) {
        let p = Pid::from_raw(pid as i32);
        if ptrace::interrupt(p).is_err() {
            return;
        }
        let end = monotonic_ns() + 1_000_000_000;
        while monotonic_ns() < end {
            self.turn();
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
        if crate::observe::kfd::remote::read_remote(pid, &remote, &mut buf) == Ok(4) {
            out.push(u32::from_le_bytes(buf));
        }
    }
    out
}
