//! KFD events on the model: queue create/update/destroy from the ioctls and the kernel-internal
//! probes, debug-trap suspend/resume, and evict/restore.

use gpreempt_common::kfd::{self, dbg_op};

use super::{DebugCall, DebugOp, LogKind, Queue, QueueKind, QueueState, Source, State};
use crate::observe::events::{IoctlEvent, KernelEvent, KfdCall};

impl State {
    pub(super) fn ioctl(&mut self, ev: &IoctlEvent) {
        let ts = ev.origin.ts_ns;
        // `ts` is the call's entry; its effect (sysfs directories included) is complete only at
        // its return, which is what reconciliation must compare a snapshot's time with.
        let end = ts.saturating_add(ev.duration_ns);
        let pid = ev.origin.pid;
        self.touch(ts);
        // ROCm before 5.7 asks for the debug API through the DKMS driver's number; an upstream
        // kernel has none, and that runtime never enables it.
        if ev.nr() == kfd::nr::DBG_TRAP_DEPRECATED && ev.ret == -i64::from(libc::ENOTTY) {
            let p = self.proc_mut(pid, Source::Event, ts);
            if p.debug_api.as_ref().is_none_or(|d| !d.enabled) {
                p.debug_api = Some(super::DebugApi::legacy());
            }
            return;
        }
        if ev.ret < 0 {
            return;
        }
        match &ev.call {
            KfdCall::CreateQueue { args: a, .. } => {
                let p = self.proc_mut(pid, Source::Event, ts);
                p.last_event_ns = end;
                let mut q = Queue::new(
                    a.queue_id,
                    a.gpu_id,
                    QueueKind::from_create(a.queue_type),
                    Source::Event,
                    ts,
                );
                q.priority = Some(a.queue_priority);
                q.percentage = Some(a.queue_percentage);
                q.ring_base_address = Some(a.ring_base_address);
                q.ring_size = a.ring_size.into();
                q.read_pointer_address = Some(a.read_pointer_address);
                q.write_pointer_address = Some(a.write_pointer_address);
                q.doorbell_offset = Some(a.doorbell_offset);
                q.created_ns = Some(ts);
                q.last_event_ns = end;
                let text = format!(
                    "{} queue {} on gpu {} prio {} ring {:#x}",
                    q.kind.label(),
                    a.queue_id,
                    a.gpu_id,
                    a.queue_priority,
                    a.ring_base_address
                );
                // A queue id is reused only after its destroy; replace whatever lingers.
                p.queues.insert(a.queue_id, q);
                self.log(ts, LogKind::Create, pid, Some(a.queue_id), text);
            }
            KfdCall::DestroyQueue(a) => {
                self.destroy(pid, a.queue_id, ts, "destroyed");
                if let Some(q) = self
                    .procs
                    .get_mut(&pid)
                    .and_then(|p| p.queues.get_mut(&a.queue_id))
                {
                    q.last_event_ns = q.last_event_ns.max(end);
                }
            }
            KfdCall::UpdateQueue(a) => {
                if let Some(q) = self
                    .procs
                    .get_mut(&pid)
                    .and_then(|p| p.queues.get_mut(&a.queue_id))
                {
                    q.priority = Some(a.queue_priority);
                    q.percentage = Some(a.queue_percentage);
                    q.ring_base_address = Some(a.ring_base_address);
                    q.ring_size = a.ring_size.into();
                    q.last_event_ns = end;
                }
            }
            KfdCall::AcquireVm(_) | KfdCall::AllocMemoryOfGpu(_) => {
                self.proc_mut(pid, Source::Event, ts).last_event_ns = end;
            }
            KfdCall::RuntimeEnable(a) => {
                let p = self.proc_mut(pid, Source::Event, ts);
                p.last_event_ns = end;
                let enable = a.mode_mask & kfd::KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK != 0;
                p.debug_api = Some(if enable {
                    super::DebugApi::enabled()
                } else {
                    super::DebugApi::disabled()
                });
                if !enable {
                    // runtime_disable deactivates a debugged runtime: every queue resumes (the
                    // debug trap itself stays enabled).
                    self.resume_suspended(ts, pid, "runtime disabled");
                }
            }
            KfdCall::DbgTrap(a) => self.dbg_trap(ts, pid, a),
            _ => {}
        }
    }

    /// What the kernel-internal probes add to the ioctl view: queues created or destroyed behind
    /// the ioctls' back (CRIU restore, process teardown), evictions, the kernel's own resumes, and
    /// HWS map/unmap counts.
    pub(super) fn kernel(&mut self, k: &KernelEvent) {
        use gpreempt_common::kprobe::id;
        let ts = k.origin.ts_ns;
        self.touch(ts);
        let target = k.target.unwrap_or(0);
        match k.probe {
            id::QUEUE_ADD => {
                let (Some(qid), Some(gpu)) = (k.queue_id, k.gpu_id) else {
                    return;
                };
                if target == 0 || self.queue(target, qid).is_some_and(Queue::alive) {
                    return; // already known from its CREATE_QUEUE
                }
                let p = self.proc_mut(target, Source::Event, ts);
                p.last_event_ns = ts;
                let mut q = Queue::new(
                    qid,
                    gpu,
                    QueueKind::from_sysfs(k.args[0] as u32),
                    Source::Event,
                    ts,
                );
                q.priority = Some(k.args[1] as u32);
                q.ring_base_address = Some(k.args[3]);
                q.ring_size = k.args[4];
                q.created_ns = Some(ts);
                p.queues.insert(qid, q);
                self.log(
                    ts,
                    LogKind::Create,
                    target,
                    Some(qid),
                    format!(
                        "queue {qid} on gpu {gpu} created in the kernel (not by an ioctl seen)"
                    ),
                );
            }
            id::QUEUE_DEL => {
                if let Some(qid) = k.queue_id {
                    self.destroy(target, qid, ts, "destroyed (kernel)");
                }
            }
            id::EVICT if target != 0 => self.evict(ts, target, true),
            id::RESTORE if target != 0 => self.evict(ts, target, false),
            // resume_queues(p, 0, NULL): the kernel's disable path (debugger gone or DISABLE).
            id::RESUME if target != 0 && k.args[1] == 0 => {
                self.resume_suspended(ts, target, "by the kernel: debug trap disabled")
            }
            id::RUNLIST | id::UNMAP => {
                if let Some(g) = self
                    .gpus
                    .iter_mut()
                    .find(|g| Some(g.node.gpu_id) == k.gpu_id)
                {
                    if k.probe == id::RUNLIST {
                        g.runlists += 1;
                    } else {
                        g.unmaps += 1;
                    }
                }
            }
            _ => {}
        }
    }

    pub(super) fn dbg_trap(&mut self, ts: u64, caller: u32, a: &kfd::DbgTrapArgs) {
        self.note_debug_call(ts, caller, a);
        match a.op {
            dbg_op::ENABLE => {
                // It succeeded, so the target is a KFD process: the kernel makes one
                // (kfd_create_process) for a ptraced target that never opened /dev/kfd.
                self.proc_mut(a.pid, Source::Event, ts).debugger = Some(caller);
                self.log(
                    ts,
                    LogKind::Debug,
                    a.pid,
                    None,
                    format!("debug trap enabled by pid {caller}"),
                );
            }
            dbg_op::DISABLE => {
                // The kernel resumes every queue the debugger suspended.
                self.debugger_gone(ts, a.pid, "debug trap disabled");
            }
            _ => {}
        }
    }

    /// Keeps a call that can end or undo a debugger's hold when it was not made by the target's
    /// debugger: the target's own RESUME_QUEUES, DISABLE or ENABLE (amdkfd lets a process
    /// debug-trap itself without ptrace), or a DISABLE / ENABLE by a third process.
    fn note_debug_call(&mut self, ts: u64, caller: u32, a: &kfd::DbgTrapArgs) {
        let Some(op) = DebugOp::of(a.op) else {
            return;
        };
        let debugger = self.procs.get(&a.pid).and_then(|p| p.debugger);
        if caller != a.pid && debugger == Some(caller) {
            return;
        }
        if self.debug_calls.len() == super::DEBUG_CALLS_CAP {
            self.debug_calls.pop_front();
        }
        self.debug_calls.push_back(DebugCall {
            ts_ns: ts,
            caller,
            target: a.pid,
            op,
            debugger,
        });
    }

    /// The debug trap on `target` ended: its suspended queues run again.
    pub(super) fn debugger_gone(&mut self, ts: u64, target: u32, why: &str) {
        if let Some(t) = self.procs.get_mut(&target) {
            t.debugger = None;
        }
        self.resume_suspended(ts, target, why);
    }

    /// `resume_queues(target, 0, NULL)`: every suspended queue of `target` runs again.
    pub(super) fn resume_suspended(&mut self, ts: u64, target: u32, why: &str) {
        let Some(t) = self.procs.get_mut(&target) else {
            return;
        };
        let mut resumed = Vec::new();
        for q in t.queues.values_mut() {
            if q.state == QueueState::Suspended {
                q.state = QueueState::Active;
                q.suspended_by = None;
                q.last_event_ns = ts;
                resumed.push(q.queue_id);
            }
        }
        for id in resumed {
            self.log(
                ts,
                LogKind::Resume,
                target,
                Some(id),
                format!("resumed ({why})"),
            );
        }
    }

    pub(super) fn suspend(
        &mut self,
        ts: u64,
        by: u32,
        target: u32,
        ids: Option<Vec<u32>>,
        suspend: bool,
    ) {
        self.touch(ts);
        let (kind, verb) = if suspend {
            (LogKind::Suspend, "suspended")
        } else {
            (LogKind::Resume, "resumed")
        };
        let Some(t) = self.procs.get_mut(&target) else {
            return;
        };
        // Only the debugger can suspend: this names it when its ENABLE came before the tool.
        if suspend && t.debugger.is_none() {
            t.debugger = Some(by);
        }
        let Some(ids) = ids else {
            self.log(
                ts,
                kind,
                target,
                None,
                format!("{verb} by pid {by} (queue ids unreadable)"),
            );
            return;
        };
        let mut done = Vec::new();
        for id in ids {
            let Some(q) = t.queues.get_mut(&id) else {
                continue;
            };
            if !q.alive() {
                continue;
            }
            // The same act can reach the model twice (the traced ioctl and the controller's
            // status): only a change of state is logged.
            let was = q.state;
            if suspend {
                q.state = QueueState::Suspended;
                q.suspended_by = Some(by);
            } else if q.state == QueueState::Suspended {
                q.state = QueueState::Active;
                q.suspended_by = None;
            }
            q.last_event_ns = ts;
            if q.state != was {
                done.push(id);
            }
        }
        for id in done {
            self.log(ts, kind, target, Some(id), format!("{verb} by pid {by}"));
        }
    }

    pub(super) fn evict(&mut self, ts: u64, pid: u32, evict: bool) {
        self.touch(ts);
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        let mut n = 0;
        for q in p.queues.values_mut() {
            match (evict, q.state) {
                (true, QueueState::Active) => q.state = QueueState::Evicted,
                (false, QueueState::Evicted) => q.state = QueueState::Active,
                _ => continue,
            }
            q.last_event_ns = ts;
            n += 1;
        }
        let (kind, verb) = if evict {
            (LogKind::Evict, "evicted")
        } else {
            (LogKind::Restore, "restored")
        };
        self.log(ts, kind, pid, None, format!("{n} queue(s) {verb}"));
    }
}
