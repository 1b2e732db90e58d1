//! The emulated GPU's execution: HWS runlists mapping queues to HQD slots, AQL packet processing
//! from the workloads' own memory, compute units shared by concurrent dispatches, and CWSR.
//!
//! Model (emulated): each mapped queue runs its packets in order, one dispatch at a time. A
//! dispatch wants `demand` CUs (from its geometry) and makes progress at `alloc / demand` of its
//! solo speed. Free CUs go to waiting dispatches by pipe priority, then arrival, and a running
//! dispatch keeps its CUs until it ends or its queue is preempted: no wave is preempted by another
//! queue's, which is what makes a busy offline job hurt an online one. Every runlist upload stalls
//! the whole device; a queue taken off the hardware saves its running dispatch (CWSR) and pays a
//! restore cost when it runs again.

use crate::aql::{self, amd_queue, Dispatch, PACKET_BYTES};
use crate::model::{Gpu, Host, Kfd, QKey, Queue};

/// Per-queue execution state.
#[derive(Debug, Default, Clone)]
pub struct Exec {
    /// Packets consumed: the read_dispatch_id written back to the queue.
    pub read_id: u64,
    /// The last write_dispatch_id read from the queue.
    pub write_id: u64,
    pub kernel: Option<Kernel>,
    /// Dispatches completed.
    pub completed: u64,
    pub mapped_since: u64,
    /// Busy time (a dispatch present), ns.
    pub busy_ns: u64,
}

/// A dispatch on the GPU.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub seq: u64,
    pub demand: u32,
    pub alloc: u32,
    /// Solo-speed ns of work left.
    pub remaining: f64,
    /// No progress before this time (CWSR restore).
    pub resume_at: u64,
    /// Saved by CWSR while its queue was off the hardware.
    pub saved: bool,
    pub object: u64,
}

/// Per-GPU execution state.
#[derive(Debug, Default, Clone)]
pub struct GpuExec {
    pub last: u64,
    pub seq: u64,
}

impl Exec {
    /// Start from whatever the queue's read index holds now.
    pub fn init(&mut self, pid: u32, q_rptr: u64, host: &mut dyn Host) {
        let mut b = [0u8; 8];
        if host.read_mem(pid, q_rptr, &mut b).is_ok() {
            self.read_id = u64::from_le_bytes(b);
            self.write_id = self.read_id;
        }
    }
}

fn used_cus(kfd: &Kfd, gi: usize) -> u32 {
    kfd.gpus[gi]
        .slots
        .iter()
        .flatten()
        .filter_map(|k| kfd.queue(*k)?.exec.kernel.as_ref().map(|k| k.alloc))
        .sum()
}

/// Take a queue off its HQD slot; a running dispatch is saved (CWSR). True if one was.
fn unmap_slot(kfd: &mut Kfd, gi: usize, slot: usize) -> bool {
    let Some(k) = kfd.gpus[gi].slots[slot].take() else {
        return false;
    };
    match kfd.queue_mut(k).and_then(|q| q.exec.kernel.as_mut()) {
        Some(kern) if !kern.saved => {
            kern.alloc = 0;
            kern.saved = true;
            true
        }
        _ => false,
    }
}

/// Put a queue on an HQD slot; a saved dispatch restores after the device stall.
fn map_slot(kfd: &mut Kfd, gi: usize, slot: usize, k: QKey, now: u64) {
    kfd.gpus[gi].slots[slot] = Some(k);
    let resume = now.max(kfd.gpus[gi].stall_until) + kfd.costs.cwsr_restore_ns;
    if let Some(q) = kfd.queue_mut(k) {
        q.exec.mapped_since = now;
        if let Some(kern) = q.exec.kernel.as_mut().filter(|k| k.saved) {
            kern.saved = false;
            kern.resume_at = resume;
        }
    }
}

/// A runlist upload: every queue of the device is preempted while it happens.
fn stall(kfd: &mut Kfd, gi: usize, now: u64, grace_ns: u64, saved: bool) {
    let c = &kfd.costs;
    let ns = grace_ns + c.runlist_update_ns + if saved { c.cwsr_save_ns } else { 0 };
    let quantum = c.oversubscription_quantum_ns;
    let g = &mut kfd.gpus[gi];
    g.runlist_uploads += 1;
    g.stall_until = g.stall_until.max(now + ns);
    if g.next_rotation == 0 {
        g.next_rotation = now + quantum;
    }
}

/// Upload a new runlist: queues that left it lose their HQD slot (CWSR saves their dispatch); new
/// ones take the lowest free slot in `allocate_hqd`'s pipe round-robin order; when there are more
/// queues than slots the rest wait for the HWS time slice.
pub fn upload_runlist(kfd: &mut Kfd, gi: usize, runlist: Vec<QKey>, now: u64, grace_ns: u64) {
    let mut saved = false;
    for slot in 0..kfd.gpus[gi].slots.len() {
        if kfd.gpus[gi].slots[slot].is_some_and(|k| !runlist.contains(&k)) {
            saved |= unmap_slot(kfd, gi, slot);
        }
    }
    stall(kfd, gi, now, grace_ns, saved);
    for &k in &runlist {
        if kfd.gpus[gi].slot_of(k).is_some() {
            continue;
        }
        let Some(free) = slot_order(&kfd.gpus[gi]).find(|&s| kfd.gpus[gi].slots[s].is_none())
        else {
            break;
        };
        map_slot(kfd, gi, free, k, now);
    }
    kfd.gpus[gi].runlist = runlist;
}

fn slot_order(gpu: &Gpu) -> impl Iterator<Item = usize> + '_ {
    let pipes = gpu.spec.pipes as usize;
    let qpp = gpu.spec.queues_per_pipe as usize;
    (0..pipes * qpp).map(move |i| (i % pipes) * qpp + i / pipes)
}

fn read_u64(host: &mut dyn Host, pid: u32, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    host.read_mem(pid, addr, &mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

/// Run the GPUs up to `now` (ns, monotonic).
pub fn advance(kfd: &mut Kfd, host: &mut dyn Host, now: u64) {
    for gi in 0..kfd.gpus.len() {
        progress(kfd, gi, now);
        complete_and_fetch(kfd, gi, host, now);
        allocate(kfd, gi);
        rotate(kfd, gi, host, now);
    }
}

fn progress(kfd: &mut Kfd, gi: usize, now: u64) {
    let g = &kfd.gpus[gi];
    let start = g.exec.last.max(g.stall_until);
    let keys: Vec<QKey> = g.slots.iter().flatten().copied().collect();
    kfd.gpus[gi].exec.last = now;
    if now <= start {
        return;
    }
    for k in keys {
        let Some(q) = kfd.queue_mut(k) else { continue };
        if q.exec.kernel.is_some() {
            q.exec.busy_ns += now - start;
        }
        let Some(kern) = q.exec.kernel.as_mut() else {
            continue;
        };
        if kern.alloc == 0 || kern.demand == 0 {
            continue;
        }
        let from = start.max(kern.resume_at);
        if now > from {
            let rate = f64::from(kern.alloc) / f64::from(kern.demand);
            kern.remaining = (kern.remaining - (now - from) as f64 * rate).max(0.0);
        }
    }
}

fn complete_and_fetch(kfd: &mut Kfd, gi: usize, host: &mut dyn Host, now: u64) {
    let (cus, waves) = {
        let s = &kfd.gpus[gi].spec;
        (s.cu_count, s.waves_per_cu())
    };
    let keys: Vec<QKey> = kfd.gpus[gi].slots.iter().flatten().copied().collect();
    let stalled = now < kfd.gpus[gi].stall_until;
    for k in keys {
        let mut seq = kfd.gpus[gi].exec.seq;
        let Some(q) = kfd.queue_mut(k) else { continue };
        if !q.is_aql() {
            continue;
        }
        let mut polled = false;
        for _ in 0..64 {
            if let Some(kern) = &q.exec.kernel {
                if kern.remaining > 0.0 || stalled {
                    break;
                }
                q.exec.kernel = None;
                q.exec.read_id += 1;
                q.exec.completed += 1;
                // The CP advances read_dispatch_id in the queue's own memory.
                let _ = host.write_mem(k.0, q.rptr_addr, &q.exec.read_id.to_le_bytes());
            }
            if stalled {
                break;
            }
            if q.exec.read_id >= q.exec.write_id {
                if polled {
                    break;
                }
                polled = true;
                match read_u64(host, k.0, q.wptr_addr) {
                    Some(w) => q.exec.write_id = w,
                    None => break,
                }
                if q.exec.read_id >= q.exec.write_id {
                    break;
                }
            }
            let slots = u64::from(q.ring_size) / PACKET_BYTES as u64;
            if slots == 0 {
                break;
            }
            let at = q.ring_base + (q.exec.read_id % slots) * PACKET_BYTES as u64;
            let mut p = [0u8; PACKET_BYTES];
            if host.read_mem(k.0, at, &mut p).is_err() {
                break;
            }
            let d = Dispatch::decode(&p);
            let (demand, work) = match d.packet_type() {
                aql::PACKET_TYPE_INVALID => break, // slot reserved, not yet written
                aql::PACKET_TYPE_KERNEL_DISPATCH => (d.cu_demand(cus, waves), d.duration_ns as f64),
                _ => (1, 0.0),
            };
            seq += 1;
            q.exec.kernel = Some(Kernel {
                seq,
                demand,
                alloc: 0,
                remaining: work,
                resume_at: now,
                saved: false,
                object: d.kernel_object,
            });
        }
        kfd.gpus[gi].exec.seq = seq;
    }
}

fn allocate(kfd: &mut Kfd, gi: usize) {
    let cus = kfd.gpus[gi].spec.cu_count;
    let mut free = cus.saturating_sub(used_cus(kfd, gi));
    if free == 0 {
        return;
    }
    let mut waiting: Vec<(u32, u64, QKey)> = kfd.gpus[gi]
        .slots
        .iter()
        .flatten()
        .filter_map(|&k| {
            let q = kfd.queue(k)?;
            let kern = q.exec.kernel.as_ref()?;
            (kern.alloc < kern.demand).then_some((q.pipe_priority(), kern.seq, k))
        })
        .collect();
    waiting.sort_by_key(|&(prio, seq, _)| (std::cmp::Reverse(prio), seq));
    for (_, _, k) in waiting {
        if free == 0 {
            break;
        }
        if let Some(kern) = kfd.queue_mut(k).and_then(|q| q.exec.kernel.as_mut()) {
            let give = (kern.demand - kern.alloc).min(free);
            kern.alloc += give;
            free -= give;
        }
    }
}

/// Oversubscription: when runnable queues wait for a slot, HWS swaps them in each quantum,
/// idle mapped queues first, then the longest mapped.
fn rotate(kfd: &mut Kfd, gi: usize, host: &mut dyn Host, now: u64) {
    let g = &kfd.gpus[gi];
    if g.runlist.len() <= g.slots.len() || now < g.next_rotation {
        return;
    }
    let unmapped: Vec<QKey> = g
        .runlist
        .iter()
        .filter(|k| g.slot_of(**k).is_none())
        .copied()
        .collect();
    let mut wants = Vec::new();
    for k in unmapped {
        let Some(q) = kfd.queue(k) else { continue };
        let (wptr, read) = (q.wptr_addr, q.exec.read_id);
        if q.exec.kernel.is_some() || read_u64(host, k.0, wptr).is_some_and(|w| w > read) {
            wants.push(k);
        }
    }
    kfd.gpus[gi].next_rotation = now + kfd.costs.oversubscription_quantum_ns;
    if wants.is_empty() {
        return;
    }
    let mut victims: Vec<(bool, u64, usize)> = kfd.gpus[gi]
        .slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let q = kfd.queue((*s)?)?;
            let busy = q.exec.kernel.is_some() || q.exec.write_id > q.exec.read_id;
            Some((busy, q.exec.mapped_since, i))
        })
        .collect();
    victims.sort_unstable();
    let mut saved = false;
    for (w, (_, _, slot)) in wants.into_iter().zip(victims) {
        if let Some(v) = kfd.gpus[gi].slots[slot] {
            saved |= unmap_slot(kfd, gi, slot);
            let rl = &mut kfd.gpus[gi].runlist;
            rl.retain(|x| *x != v);
            rl.push(v);
        }
        map_slot(kfd, gi, slot, w, now);
    }
    stall(kfd, gi, now, 0, saved);
}

/// When the next dispatch could finish (ns), for the engine's sleep.
pub fn next_deadline(kfd: &Kfd) -> Option<u64> {
    let mut best: Option<u64> = None;
    for g in &kfd.gpus {
        for k in g.slots.iter().flatten() {
            let Some(kern) = kfd.queue(*k).and_then(|q| q.exec.kernel.as_ref()) else {
                continue;
            };
            if kern.alloc == 0 {
                continue;
            }
            let start = g.exec.last.max(g.stall_until).max(kern.resume_at);
            let t =
                start + (kern.remaining * f64::from(kern.demand) / f64::from(kern.alloc)) as u64;
            best = Some(best.map_or(t, |b| b.min(t)));
        }
    }
    best
}

/// CUs a process's dispatches hold on a GPU (sysfs `cu_occupancy`).
pub fn cu_occupancy(kfd: &Kfd, gi: usize, pid: u32) -> u32 {
    kfd.gpus[gi]
        .slots
        .iter()
        .flatten()
        .filter(|k| k.0 == pid)
        .filter_map(|k| kfd.queue(*k)?.exec.kernel.as_ref().map(|k| k.alloc))
        .sum()
}

/// The `amd_queue_t` base of a queue (what the sampler validates).
pub fn amd_queue_base(q: &Queue) -> u64 {
    q.rptr_addr.wrapping_sub(amd_queue::READ_DISPATCH_ID as u64)
}

/// Account progress up to `now` without touching process memory (before a state change).
pub fn sync(kfd: &mut Kfd, now: u64) {
    for gi in 0..kfd.gpus.len() {
        progress(kfd, gi, now);
    }
}
