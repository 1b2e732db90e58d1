//! One batch of eBPF events applied to the model, with what only user space can add (the queue
//! ids of a DBG_TRAP suspend/resume, read from the caller's array; /proc facts of new processes;
//! a pid's new owner), and the kernel's losses turned into warnings and faster reconciling.

use anyhow::Result;
use gpreempt_common::kfd::{self, dbg_op};
use nix::sys::uio::RemoteIoVec;

use super::Watcher;
use crate::{
    clock::monotonic_ns,
    observe::events::{Event, KfdCall},
    observe::kfd::remote,
    observe::model::Update,
};

impl Watcher {
    /// Applies a batch of events, with what only user space can add: the queue ids of a
    /// DBG_TRAP suspend/resume (read from the caller's array) and /proc facts of new processes.
    pub(super) fn apply_events(&mut self) {
        let mut batch = std::mem::take(&mut self.batch);
        // Processes this batch may introduce (a DBG_TRAP ENABLE brings in its target too).
        let mut pids = Vec::new();
        // Processes whose owner was checked in this batch (see `setting_up`).
        let mut checked = Vec::new();
        self.applied[0] += 1;
        for ev in batch.drain(..) {
            let kind = match &ev {
                Event::Ioctl(_) => 1,
                Event::Nv(_) => 2,
                Event::Kernel(_) => 3,
                Event::Launch(_) => 4,
                Event::ProcessExit(_) => 5,
            };
            self.applied[kind] += 1;
            if let Some(c) = self.census.as_mut() {
                *c.entry(ev.origin().pid).or_default() += 1;
            }
            if let Event::ProcessExit(x) = &ev {
                if x.rate_limited > 0 {
                    let n = u32::try_from(x.rate_limited).unwrap_or(u32::MAX);
                    if let Some(w) = self.losses.limited(x.origin.pid, n, || "exited".into()) {
                        log::warn!("{w}");
                    }
                }
                self.losses.forget(x.origin.pid);
            }
            if let Some(pid) = setting_up(&ev) {
                if !checked.contains(&pid) {
                    checked.push(pid);
                    self.same_owner(pid);
                }
            }
            if let Event::Nv(n) = &ev {
                pids.push(n.origin.pid);
                if let Some(log) = self.nv_log.as_mut() {
                    log.note(n);
                }
            }
            if let (Event::ProcessExit(x), Some(log)) = (&ev, self.nv_log.as_mut()) {
                log.exited(x.origin.pid);
            }
            if let Event::Ioctl(i) = &ev {
                pids.push(i.origin.pid);
                if let KfdCall::DbgTrap(a) = &i.call {
                    pids.push(a.pid);
                }
            }
            let extra = suspend_update(&ev);
            self.state.apply(Update::Event(ev));
            if let Some(u) = extra {
                self.state.apply(u);
            }
        }
        self.batch = batch;
        if log::log_enabled!(log::Level::Debug) {
            let mut rm: std::collections::BTreeMap<u32, usize> = Default::default();
            for &p in &pids {
                *rm.entry(p).or_default() += 1;
            }
            if !rm.is_empty() {
                log::debug!("applied ioctls/escapes per pid: {rm:?}");
            }
        }
        // /proc facts of new processes only (not a walk over every process per batch).
        pids.sort_unstable();
        pids.dedup();
        for pid in pids {
            let new = self
                .state
                .procs
                .get(&pid)
                .is_some_and(|p| p.info.is_none() && p.exited_ns.is_none());
            if new {
                self.proc_info(pid);
            }
        }
    }

    /// Kernel losses: warn with the count and sample faster while they go on; name the
    /// processes the rate limit throttles.
    pub(super) fn check_lost(&mut self) -> Result<()> {
        use crate::observe::losses::{Change, LOSSY_RECONCILE};
        let Some((probes, _)) = self.events.as_mut() else {
            return Ok(());
        };
        let now = monotonic_ns();
        let (warning, change) = self.losses.update(probes.stats()?.lost(), now);
        let limited = probes.rate_limited().unwrap_or_default();
        if let Some(t) = self.timers.as_mut() {
            let period = match change {
                Change::Degraded => Some(LOSSY_RECONCILE.min(t.normal)),
                Change::Recovered => Some(t.normal),
                Change::None => None,
            };
            if let Some(p) = period {
                t.reconcile = tokio::time::interval_at(tokio::time::Instant::now() + p, p);
                t.reconcile
                    .set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            }
        }
        if let Some(w) = warning {
            log::warn!("{w}");
            self.state.apply(Update::Warning {
                ts_ns: now,
                text: w,
            });
        }
        self.state.events_degraded = self.losses.degraded();
        for (pid, dropped) in limited {
            let who = || match crate::observe::procinfo::read(std::path::Path::new("/proc"), pid) {
                Ok(p) => format!(
                    "uid {}, comm {}",
                    p.uid.map_or("?".into(), |u| u.to_string()),
                    p.comm
                ),
                Err(_) => "exited".into(),
            };
            if let Some(w) = self.losses.limited(pid, dropped, who) {
                log::warn!("{w}");
                self.state.apply(Update::Warning {
                    ts_ns: now,
                    text: w,
                });
            }
        }
        Ok(())
    }
}

/// The caller of a GPU set-up call (a runtime opening KFD or its VM, an RM client): rare, and
/// what a new process under a reused pid does first.
fn setting_up(ev: &Event) -> Option<u32> {
    match ev {
        Event::Ioctl(i) => matches!(
            i.call,
            // Not CREATE_QUEUE: a process must ACQUIRE_VM before it can make a queue
            // (kfd_bind_process_to_device wants the VM), and a flood of queue creations would
            // otherwise read /proc once a batch.
            KfdCall::GetVersion(_) | KfdCall::AcquireVm(_) | KfdCall::RuntimeEnable(_)
        )
        .then_some(i.origin.pid),
        Event::Nv(n) => matches!(
            n.call,
            crate::observe::events::NvCall::Alloc { h_class, .. }
                if h_class == gpreempt_common::nv::class::NV01_ROOT_CLIENT
        )
        .then_some(n.origin.pid),
        _ => None,
    }
}

/// For a successful DBG_TRAP SUSPEND/RESUME_QUEUES: which queues it acted on. The kernel writes
/// status bits into the caller's queue array; entries without ERROR/INVALID were acted on.
fn suspend_update(ev: &Event) -> Option<Update> {
    let Event::Ioctl(i) = ev else { return None };
    let KfdCall::DbgTrap(a) = &i.call else {
        return None;
    };
    // Our own calls (the controller's) are applied from their results: the arrays are gone.
    if i.ret < 0 || i.origin.pid == std::process::id() {
        return None;
    }
    let (ptr, n) = match a.op {
        dbg_op::SUSPEND_QUEUES => {
            let p: kfd::DbgTrapSuspendQueuesArgs = a.payload();
            (p.queue_array_ptr, p.num_queues)
        }
        dbg_op::RESUME_QUEUES => {
            let p: kfd::DbgTrapResumeQueuesArgs = a.payload();
            (p.queue_array_ptr, p.num_queues)
        }
        _ => return None,
    };
    let queues = read_ids(i.origin.pid, ptr, n).map(|ids| {
        ids.into_iter()
            .filter(|id| {
                id & (kfd::KFD_DBG_QUEUE_ERROR_MASK | kfd::KFD_DBG_QUEUE_INVALID_MASK) == 0
            })
            .collect()
    });
    let (ts_ns, by, target) = (i.origin.ts_ns, i.origin.pid, a.pid);
    Some(Update::queue_op(
        a.op == dbg_op::SUSPEND_QUEUES,
        ts_ns,
        by,
        target,
        queues,
    ))
}

/// `n` u32 queue ids at `ptr` in `pid`'s memory.
fn read_ids(pid: u32, ptr: u64, n: u32) -> Option<Vec<u32>> {
    let n = n.min(kfd::KFD_MAX_NUM_OF_QUEUES_PER_PROCESS) as usize;
    let mut buf = vec![0u8; n * 4];
    let remote = [RemoteIoVec {
        base: ptr as usize,
        len: buf.len(),
    }];
    let got = remote::read_remote(pid, &remote, &mut buf).ok()?;
    (got == buf.len()).then(|| (0..n).map(|i| remote::u32_at(&buf, 4 * i)).collect())
}
