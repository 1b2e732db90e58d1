//! Reconciliation: the model brought in line with what the kernel shows (topology, the KFD sysfs
//! process list, `/proc` facts, debugfs `hqds` and `mqds`) and with the sampler's reads of AQL
//! queues.

use std::collections::HashMap;

use gpreempt_common::kfd;

use super::{
    Activity, Gpu, LogKind, Process, Queue, QueueKind, SampleRead, SampleStatus, Source, State,
};
use crate::{
    observe::kfd::{
        debugfs::{HqdId, HqdNode, MqdKind, MqdProcess, Regs},
        sysfs::{GpuNode, ProcSnapshot},
    },
    observe::procinfo::ProcInfo,
};

impl State {
    pub(super) fn topology(&mut self, nodes: Vec<GpuNode>) {
        let old = std::mem::take(&mut self.gpus);
        self.gpus = nodes
            .into_iter()
            .map(|node| {
                let prev = old.iter().find(|g| g.node.gpu_id == node.gpu_id);
                Gpu {
                    gfx_target: node.gfx_target(),
                    hqds_total: node.hqd_slots * node.num_xcc,
                    hqds_used: prev.and_then(|g| g.hqds_used),
                    stopped: prev.is_some_and(|g| g.stopped),
                    runlists: prev.map_or(0, |g| g.runlists),
                    unmaps: prev.map_or(0, |g| g.unmaps),
                    node,
                }
            })
            .collect();
    }

    /// Brings the model in line with sysfs: queues it lacks are added, queues and processes sysfs
    /// no longer has are removed, unless an event newer than the snapshot says otherwise.
    pub(super) fn reconcile(&mut self, s: ProcSnapshot) {
        let taken = s.taken_ns;
        self.touch(taken);
        let mut present = std::collections::BTreeSet::new();
        for sp in &s.procs {
            present.insert(sp.pid);
            // An exit already seen wins: the kernel removes the process's sysfs directories
            // after the exit (kfd_process_wq_release), so a snapshot may still list it. A new
            // process under the pid shows up through its events, or once the row has gone.
            if self
                .procs
                .get(&sp.pid)
                .is_some_and(|p| p.exited_ns.is_some())
            {
                continue;
            }
            let is_new = !self.procs.contains_key(&sp.pid);
            let p = self.proc_mut(sp.pid, Source::Sysfs, taken);
            let mut found = Vec::new();
            for sq in &sp.queues {
                let have = p.queues.get(&sq.queue_id).is_some_and(|q| q.alive());
                if have {
                    continue;
                }
                // A queue destroyed after the snapshot was taken is not resurrected.
                if p.queues
                    .get(&sq.queue_id)
                    .is_some_and(|q| q.last_event_ns >= taken)
                {
                    continue;
                }
                let mut q = Queue::new(
                    sq.queue_id,
                    sq.gpu_id,
                    QueueKind::from_sysfs(sq.kind),
                    Source::Sysfs,
                    taken,
                );
                q.ring_size = sq.size;
                q.last_event_ns = 0;
                p.queues.insert(sq.queue_id, q);
                found.push(sq.queue_id);
            }
            let vanished: Vec<u32> = p
                .live_queues()
                .filter(|q| {
                    q.nv.is_none()
                        && q.last_event_ns < taken
                        && !sp.queues.iter().any(|s| s.queue_id == q.queue_id)
                })
                .map(|q| q.queue_id)
                .collect();
            if is_new {
                self.log(
                    taken,
                    LogKind::Found,
                    sp.pid,
                    None,
                    format!("found in sysfs with {} queue(s)", sp.queues.len()),
                );
            }
            for id in found {
                self.corrections.queues_found += 1;
                if !is_new {
                    self.log(
                        taken,
                        LogKind::Found,
                        sp.pid,
                        Some(id),
                        "found in sysfs (create not seen)".into(),
                    );
                }
            }
            for id in vanished {
                self.corrections.queues_vanished += 1;
                self.destroy(sp.pid, id, taken, "gone from sysfs (destroy not seen)");
            }
        }
        let gone: Vec<u32> = self
            .procs
            .values()
            .filter(|p| {
                // KFD's sysfs knows nothing of NVIDIA processes.
                !present.contains(&p.pid)
                    && p.last_event_ns < taken
                    && p.live_queues().any(|q| q.nv.is_none())
            })
            .map(|p| p.pid)
            .collect();
        for pid in gone {
            self.corrections.processes_gone += 1;
            self.process_exit(pid, taken, "gone from sysfs (exit not seen)");
        }
    }

    pub(super) fn proc_info(&mut self, pid: u32, info: ProcInfo) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        let reused = p
            .info
            .as_ref()
            .is_some_and(|old| old.start_time != info.start_time);
        if reused {
            // A new process under an old pid: nothing of the old one applies.
            self.corrections.pid_reuse += 1;
            let now = self.now_ns;
            // The old process is gone: the sessions it debugged ended (its queues resumed).
            let targets: Vec<u32> = self
                .procs
                .values()
                .filter(|t| t.pid != pid && t.debugger == Some(pid))
                .map(|t| t.pid)
                .collect();
            for t in targets {
                self.debugger_gone(now, t, "debugger exited (pid reused)");
            }
            let mut fresh = Process::new(pid, Source::Sysfs, now);
            fresh.info = Some(info);
            self.procs.insert(pid, fresh);
            self.log(
                now,
                LogKind::Gone,
                pid,
                None,
                "pid reused: previous process gone".into(),
            );
        } else {
            p.info = Some(info);
        }
    }

    pub(super) fn hqds(&mut self, taken: u64, nodes: &[HqdNode]) {
        self.touch(taken);
        self.hqds_ns = Some(taken);
        /// An active slot and the live queues that match it.
        struct Slot<'a> {
            node: usize,
            gpu_id: u32,
            id: HqdId,
            regs: &'a Regs,
            matches: u32,
            queue: (u32, u32),
        }
        let mut slots = Vec::new();
        // Active slots by (GPU, ring): each queue is checked against the slots holding its ring
        // only, in one pass over the queues (not slots x queues).
        let mut by_ring: HashMap<(u32, u64), Vec<usize>> = HashMap::new();
        for (n, node) in nodes.iter().enumerate() {
            for slot in node.slots.iter().filter(|s| s.regs.active()) {
                if let Some(ring) = slot.regs.ring_base() {
                    by_ring
                        .entry((node.gpu_id, ring))
                        .or_default()
                        .push(slots.len());
                }
                slots.push(Slot {
                    node: n,
                    gpu_id: node.gpu_id,
                    id: slot.id(),
                    regs: &slot.regs,
                    matches: 0,
                    queue: (0, 0),
                });
            }
        }
        if !by_ring.is_empty() {
            for p in self.procs.values() {
                for q in p.live_queues() {
                    let Some(ring) = q.ring_base_address else {
                        continue;
                    };
                    for &i in by_ring.get(&(q.gpu_id, ring)).into_iter().flatten() {
                        let s = &mut slots[i];
                        if q.matches_slot(s.regs) {
                            s.matches += 1;
                            s.queue = (p.pid, q.queue_id);
                        }
                    }
                }
            }
        }
        // A GPU listed twice keeps its last node's map: each node resets its GPU's queues.
        let mut last: HashMap<u32, usize> = HashMap::new();
        for (n, node) in nodes.iter().enumerate() {
            let used = slots.iter().filter(|s| s.node == n).count() as u32;
            if let Some(g) = self.gpus.iter_mut().find(|g| g.node.gpu_id == node.gpu_id) {
                g.hqds_used = Some(used);
                g.hqds_total = node.slots.len() as u32;
                g.stopped = node.stopped;
            }
            last.insert(node.gpu_id, n);
        }
        // (GPU, pid, queue id) -> its slot: the first when a queue matches two.
        let mut assign: HashMap<(u32, u32, u32), HqdId> = HashMap::new();
        for s in &slots {
            match s.matches {
                0 => {}
                1 if last.get(&s.gpu_id) == Some(&s.node) => {
                    let (pid, qid) = s.queue;
                    assign.entry((s.gpu_id, pid, qid)).or_insert(s.id);
                }
                1 => {}
                _ => self.corrections.hqd_ambiguous += 1,
            }
        }
        // Every queue of a listed GPU is in no slot, except those just assigned one.
        let mut listed: Vec<u32> = last.into_keys().collect();
        listed.sort_unstable();
        for q in self.procs.values_mut().flat_map(|p| p.queues.values_mut()) {
            if listed.binary_search(&q.gpu_id).is_ok() {
                q.hqd = None;
            }
        }
        for ((_, pid, qid), id) in assign {
            if let Some(q) = self
                .procs
                .get_mut(&pid)
                .and_then(|p| p.queues.get_mut(&qid))
            {
                q.hqd = Some(id);
            }
        }
    }

    /// Fills in ring, pointers, doorbell and priority of queues known only from sysfs. `mqds` has
    /// no queue ids: per (process, GPU), descriptors whose ring matches a known queue are set
    /// aside, and the rest are matched to the remaining queues oldest first (the kernel lists
    /// newest first, ids are handed out lowest free first) only when the counts agree.
    pub(super) fn mqds(&mut self, procs: &[MqdProcess]) {
        for mp in procs {
            let Some(p) = self.procs.get_mut(&mp.pid) else {
                continue;
            };
            let mut gpus: Vec<u32> = mp.queues.iter().map(|q| q.gpu_id).collect();
            gpus.sort_unstable();
            gpus.dedup();
            for gpu in gpus {
                let known: Vec<u64> = p
                    .live_queues()
                    .filter(|q| q.gpu_id == gpu)
                    .filter_map(|q| q.ring_base_address)
                    .collect();
                let mut descs: Vec<&Regs> = mp
                    .queues
                    .iter()
                    .filter(|q| q.gpu_id == gpu && q.kind == MqdKind::Compute)
                    .map(|q| &q.regs)
                    .filter(|r| r.ring_base().is_some_and(|b| !known.contains(&b)))
                    .collect();
                descs.reverse();
                let mut unknown: Vec<&mut Queue> = p
                    .queues
                    .values_mut()
                    .filter(|q| {
                        q.alive()
                            && q.gpu_id == gpu
                            && q.kind.is_compute()
                            && q.ring_base_address.is_none()
                    })
                    .collect();
                if unknown.is_empty() || unknown.len() != descs.len() {
                    continue;
                }
                for (q, r) in unknown.iter_mut().zip(descs) {
                    q.ring_base_address = r.ring_base();
                    q.read_pointer_address = r.rptr_addr();
                    q.write_pointer_address = r.wptr_addr();
                    // The doorbell (what CREATE_QUEUE returned, on SOC15) tells apart queues
                    // whose VAs repeat across processes when their HQD slots are matched.
                    if q.doorbell_offset.is_none() {
                        q.doorbell_offset = r
                            .doorbell_in_slice()
                            .map(|o| kfd::doorbell_mmap_offset(q.gpu_id, o));
                    }
                    q.priority = q.priority.or(r.queue_priority());
                    if q.ring_size == 0 {
                        q.ring_size = r.ring_size().unwrap_or(0);
                    }
                    q.pointers_from_mqds = true;
                    // rptr - wptr = 0x48 only for ROCr's AQL queues.
                    if let (Some(rp), Some(wp)) = (q.read_pointer_address, q.write_pointer_address)
                    {
                        if rp.wrapping_sub(wp) == 0x48 && q.kind == QueueKind::Compute {
                            q.kind = QueueKind::ComputeAql;
                        }
                    }
                }
            }
        }
    }

    /// Kernel names read from a process's code objects: kept for objects dispatched later and
    /// given to those its queues already dispatched. Each read replaces the last (an unloaded
    /// code object's addresses may be reused by the next).
    pub(super) fn kernel_names(
        &mut self,
        pid: u32,
        names: crate::observe::kfd::codeobj::KernelNames,
    ) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        p.kernel_names = names;
        for q in p.queues.values_mut() {
            q.activity.dispatches.name_from(&p.kernel_names);
        }
    }

    pub(super) fn samples(&mut self, ts: u64, samples: Vec<(u32, u32, SampleRead)>) {
        self.touch(ts);
        // The sampler lists queues process by process: one process lookup per run of them.
        let mut proc: Option<&mut Process> = None;
        for (pid, qid, s) in samples {
            if proc.as_ref().is_none_or(|p| p.pid != pid) {
                proc = self.procs.get_mut(&pid);
            }
            let Some(p) = proc.as_mut() else { continue };
            let names = &p.kernel_names;
            let Some(q) = p.queues.get_mut(&qid) else {
                continue;
            };
            let a = &mut q.activity;
            match s {
                SampleRead::Ids {
                    read,
                    write,
                    packets,
                } => {
                    let dt = ts.saturating_sub(a.sample_ns);
                    match (a.read_dispatch_id, a.write_dispatch_id) {
                        (Some(r0), Some(w0)) if dt > 0 && read >= r0 => {
                            a.dispatches_per_s = Some((read - r0) as f64 * 1e9 / dt as f64);
                            a.busy = Some(read != r0 || write != w0 || write > read);
                            a.dispatches.consumed += read - r0;
                        }
                        _ => {
                            a.dispatches_per_s = None;
                            a.busy = Some(write > read);
                        }
                    }
                    a.backlog = Some(write.saturating_sub(read));
                    a.read_dispatch_id = Some(read);
                    a.write_dispatch_id = Some(write);
                    a.sample_ns = ts;
                    a.status = SampleStatus::Valid;
                    // Each packet once: the window may overlap the previous tick's.
                    for p in packets {
                        if a.dispatch_cursor.is_some_and(|c| p.dispatch_id < c) {
                            continue;
                        }
                        a.dispatch_cursor = Some(p.dispatch_id + 1);
                        a.dispatches.add(&p, names);
                        if let Some(f) = self.fresh_dispatches.as_mut() {
                            f.push(super::FreshDispatch {
                                ts_ns: ts,
                                pid,
                                gpu_id: q.gpu_id,
                                queue_id: qid,
                                packet: p,
                            });
                        }
                    }
                }
                SampleRead::Invalid(why) => {
                    *a = Activity {
                        status: SampleStatus::Invalid(why),
                        ..Default::default()
                    }
                }
                SampleRead::Unreadable(why) => a.status = SampleStatus::Unreadable(why),
            }
        }
    }
}
