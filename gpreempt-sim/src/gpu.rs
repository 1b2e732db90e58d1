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

use std::collections::HashMap;

use crate::aql::{self, Dispatch, PACKET_BYTES};
use crate::exec::{Completion, Exec, Kernel};
use crate::model::{Errno, Gpu, Host, Kfd, QKey};

/// *Emulator convention:* a kernel dispatch whose `reserved2` carries no duration (every packet a
/// real runtime writes: the field is reserved and zero) runs this long alone on the GPU. GPU code
/// is never executed; only the packet's timing is modelled.
pub const DEFAULT_KERNEL_NS: u64 = 10_000;
/// Packets of one queue read ahead per engine tick (a tick starts one dispatch per queue, and a
/// few more where packets complete at once), in at most two reads (the ring wraps).
const READ_AHEAD: u64 = 8;

impl Exec {
    /// Start from whatever the queue's read index holds now.
    pub fn init(&mut self, pid: u32, q_rptr: u64, host: &mut dyn Host) {
        let mut b = [0u8; 8];
        if host.read_mem(pid, q_rptr, &mut b).is_ok() {
            self.read_id = u64::from_le_bytes(b);
            self.write_id = self.read_id;
            self.seen_write = self.read_id;
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

/// Run the GPUs up to `now` (ns, monotonic). Between two calls the model advances event by event
/// (dispatch completions, stalls ending), so the result does not depend on how often it is called;
/// only new packets are seen at call times (the emulated doorbell is a poll).
pub fn advance(kfd: &mut Kfd, host: &mut dyn Host, now: u64) {
    for gi in 0..kfd.gpus.len() {
        // Callers read the clock before taking the lock: never go back in time.
        let now = now.max(kfd.gpus[gi].exec.last);
        poll(kfd, gi, host, now);
        loop {
            let t = kfd.gpus[gi].exec.last;
            start_heads(kfd, gi, host, t, now);
            allocate(kfd, gi);
            let next = next_event(kfd, gi).map_or(now, |e| e.max(t).min(now));
            progress(kfd, gi, next);
            let completed = complete(kfd, gi, host);
            if next >= now && !completed {
                break;
            }
        }
        rotate(kfd, gi, host, now);
    }
}

/// Read the write index of every mapped AQL queue (what the doorbell would tell the CP).
fn poll(kfd: &mut Kfd, gi: usize, host: &mut dyn Host, now: u64) {
    let keys: Vec<QKey> = kfd.gpus[gi].slots.iter().flatten().copied().collect();
    for k in keys {
        let Some(q) = kfd.queue_mut(k) else { continue };
        if !q.is_aql() {
            continue;
        }
        if let Some(w) = read_u64(host, k.0, q.wptr_addr) {
            q.exec.seen_write = q.exec.write_id;
            q.exec.seen_at = q.exec.polled_at;
            q.exec.write_id = w;
            q.exec.polled_at = now;
        }
    }
}

/// Start the head packet of every idle mapped queue whose packet existed at time `t`.
fn start_heads(kfd: &mut Kfd, gi: usize, host: &mut dyn Host, t: u64, now: u64) {
    if t < kfd.gpus[gi].stall_until {
        return;
    }
    let (cus, waves) = {
        let s = &kfd.gpus[gi].spec;
        (s.cu_count, s.waves_per_cu())
    };
    let keys: Vec<QKey> = kfd.gpus[gi].slots.iter().flatten().copied().collect();
    for k in keys {
        let mut seq = kfd.gpus[gi].exec.seq;
        let Some(q) = kfd.queue_mut(k) else { continue };
        if q.exec.kernel.is_some() || !q.is_aql() || q.exec.read_id >= q.exec.write_id {
            continue;
        }
        // Packets seen by an earlier poll were there since then; newer ones since `now`.
        let avail = if q.exec.read_id < q.exec.seen_write {
            q.exec.seen_at
        } else {
            now
        };
        if avail > t {
            continue;
        }
        let slots = u64::from(q.ring_size) / PACKET_BYTES as u64;
        if slots == 0 {
            continue;
        }
        let at = q.ring_base + (q.exec.read_id % slots) * PACKET_BYTES as u64;
        let mut p = [0u8; PACKET_BYTES];
        if host.read_mem(k.0, at, &mut p).is_err() {
            continue;
        }
        let d = Dispatch::decode(&p);
        let (demand, work) = match d.packet_type() {
            aql::PACKET_TYPE_INVALID => continue, // reserved, not yet written
            aql::PACKET_TYPE_KERNEL_DISPATCH => {
                let ns = match d.duration_ns {
                    0 => DEFAULT_KERNEL_NS,
                    ns => ns,
                };
                (d.cu_demand(cus, waves), ns as f64)
            }
            t @ (aql::PACKET_TYPE_BARRIER_AND | aql::PACKET_TYPE_BARRIER_OR) => {
                if !barrier_satisfied(&p, t == aql::PACKET_TYPE_BARRIER_AND, k.0, host) {
                    continue;
                }
                (1, 0.0)
            }
            _ => (1, 0.0),
        };
        seq += 1;
        q.exec.kernel = Some(Kernel {
            seq,
            demand,
            alloc: 0,
            remaining: work,
            resume_at: t,
            saved: false,
            completion_signal: d.completion_signal,
        });
        kfd.gpus[gi].exec.seq = seq;
    }
}

/// Finish dispatches with no work left: the CP advances read_dispatch_id in the queue's memory.
fn complete(kfd: &mut Kfd, gi: usize, host: &mut dyn Host) -> bool {
    let g = &kfd.gpus[gi];
    if g.exec.last < g.stall_until {
        return false;
    }
    let keys: Vec<QKey> = g.slots.iter().flatten().copied().collect();
    let mut any = false;
    for k in keys {
        let Some(q) = kfd.queue_mut(k) else { continue };
        if !q
            .exec
            .kernel
            .as_ref()
            .is_some_and(|kern| kern.remaining <= 0.0)
        {
            continue;
        }
        let signal = q.exec.kernel.take().map_or(0, |k| k.completion_signal);
        // The packet processor hands the slot back as INVALID before moving the read id: a
        // producer reserves a slot (bumps the write id) before it writes the packet, so the
        // previous lap's header must not look like a new packet.
        let slots = u64::from(q.ring_size) / PACKET_BYTES as u64;
        if slots > 0 {
            let at = q.ring_base + (q.exec.read_id % slots) * PACKET_BYTES as u64;
            let _ = host.write_mem(k.0, at, &aql::PACKET_TYPE_INVALID.to_le_bytes());
        }
        q.exec.read_id += 1;
        let _ = host.write_mem(k.0, q.rptr_addr, &q.exec.read_id.to_le_bytes());
        if signal != 0 {
            kfd.completions.push(Completion { pid: k.0, signal });
        }
        any = true;
    }
    any
}

/// Dependency signal `i` (0..5) of a barrier-AND/OR packet (`hsa_barrier_and_packet_t`).
fn dep_signal(p: &[u8; PACKET_BYTES], i: usize) -> u64 {
    let at = 8 + 8 * i;
    u64::from_le_bytes(p[at..at + 8].try_into().unwrap_or([0; 8]))
}

/// A barrier-AND completes once every dependency signal is 0, a barrier-OR once any is (no
/// dependency: at once); a signal that cannot be read counts as not done.
fn barrier_satisfied(p: &[u8; PACKET_BYTES], and: bool, pid: u32, host: &mut dyn Host) -> bool {
    let deps: Vec<u64> = (0..5)
        .map(|i| dep_signal(p, i))
        .filter(|&s| s != 0)
        .collect();
    if deps.is_empty() {
        return true;
    }
    let mut done = deps
        .iter()
        .map(|&s| read_u64(host, pid, s + aql::SIGNAL_VALUE).is_some_and(|v| v as i64 == 0));
    if and {
        done.all(|d| d)
    } else {
        done.any(|d| d)
    }
}

/// The next time something changes on the device: a dispatch ends, a restore or stall ends.
fn next_event(kfd: &Kfd, gi: usize) -> Option<u64> {
    let g = &kfd.gpus[gi];
    let mut best: Option<u64> = None;
    let mut take = |t: u64| best = Some(best.map_or(t, |b| b.min(t)));
    if g.stall_until > g.exec.last {
        take(g.stall_until);
    }
    for k in g.slots.iter().flatten() {
        let Some(kern) = kfd.queue(*k).and_then(|q| q.exec.kernel.as_ref()) else {
            continue;
        };
        if kern.alloc == 0 {
            continue;
        }
        let start = g.exec.last.max(g.stall_until).max(kern.resume_at);
        take(
            start + (kern.remaining * f64::from(kern.demand) / f64::from(kern.alloc)).ceil() as u64,
        );
    }
    best
}

/// Dispatches progress from the device's last time to `to` (none during a stall or a restore).
fn progress(kfd: &mut Kfd, gi: usize, to: u64) {
    let g = &kfd.gpus[gi];
    let start = g.exec.last.max(g.stall_until);
    let keys: Vec<QKey> = g.slots.iter().flatten().copied().collect();
    kfd.gpus[gi].exec.last = to.max(kfd.gpus[gi].exec.last);
    if to <= start {
        return;
    }
    for k in keys {
        let Some(q) = kfd.queue_mut(k) else { continue };
        let Some(kern) = q.exec.kernel.as_mut() else {
            continue;
        };
        if kern.alloc == 0 || kern.demand == 0 {
            continue;
        }
        let from = start.max(kern.resume_at);
        if to > from {
            let rate = f64::from(kern.alloc) / f64::from(kern.demand);
            kern.remaining = (kern.remaining - (to - from) as f64 * rate).max(0.0);
        }
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

/// When something next changes on any GPU (ns), for the engine's sleep.
pub fn next_deadline(kfd: &Kfd) -> Option<u64> {
    (0..kfd.gpus.len())
        .filter_map(|gi| next_event(kfd, gi))
        .min()
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

/// Account progress up to `now` without touching process memory (before a state change).
pub fn sync(kfd: &mut Kfd, now: u64) {
    for gi in 0..kfd.gpus.len() {
        progress(kfd, gi, now);
    }
}

/// What one engine tick reads from a queue's memory: planned under the model's lock, read
/// without it (`prefetch`), so the lock is never held across another process's memory.
#[derive(Clone, Debug)]
pub struct QueueRead {
    pub pid: u32,
    pub wptr_addr: u64,
    pub ring_base: u64,
    pub slots: u64,
    pub read_id: u64,
}

/// The AQL queues on any runlist, with what the engine needs to read them.
pub fn plan_reads(kfd: &Kfd) -> Vec<QueueRead> {
    let mut v = Vec::new();
    for g in &kfd.gpus {
        for k in &g.runlist {
            let Some(q) = kfd.queue(*k) else { continue };
            if !q.is_aql() {
                continue;
            }
            v.push(QueueRead {
                pid: k.0,
                wptr_addr: q.wptr_addr,
                ring_base: q.ring_base,
                slots: u64::from(q.ring_size) / PACKET_BYTES as u64,
                read_id: q.exec.read_id,
            });
        }
    }
    v
}

/// Process memory read ahead of a tick, served to `advance` as its host; the writes it makes are
/// kept, in order, for after the lock is dropped.
#[derive(Default)]
pub struct Prefetch {
    reads: HashMap<(u32, u64), Vec<u8>>,
    pub writes: Vec<(u32, u64, Vec<u8>)>,
}

impl Prefetch {
    fn read(&mut self, host: &mut dyn Host, pid: u32, addr: u64, len: usize) -> Option<&[u8]> {
        if let std::collections::hash_map::Entry::Vacant(e) = self.reads.entry((pid, addr)) {
            let mut b = vec![0u8; len];
            host.read_mem(pid, addr, &mut b).ok()?;
            e.insert(b);
        }
        self.reads.get(&(pid, addr)).map(Vec::as_slice)
    }
}

/// Reads what `plan` names: each queue's write index, the packets from its read index up to
/// `READ_AHEAD` of them, and the dependency signals' values of barrier packets among them.
pub fn prefetch(plan: &[QueueRead], host: &mut dyn Host) -> Prefetch {
    let mut pre = Prefetch::default();
    for q in plan {
        let Some(w) = pre
            .read(host, q.pid, q.wptr_addr, 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
        else {
            continue;
        };
        if q.slots == 0 {
            continue;
        }
        let n = w.saturating_sub(q.read_id).min(READ_AHEAD).min(q.slots);
        let first = q.read_id % q.slots;
        let mut packets: Vec<(u64, [u8; PACKET_BYTES])> = Vec::new();
        // One read per contiguous run of slots: up to the ring's end, then from its start.
        for (slot, count) in [
            (first, n.min(q.slots - first)),
            (0, n - n.min(q.slots - first)),
        ] {
            if count == 0 {
                continue;
            }
            let at = q.ring_base + slot * PACKET_BYTES as u64;
            let mut b = vec![0u8; count as usize * PACKET_BYTES];
            if host.read_mem(q.pid, at, &mut b).is_err() {
                break;
            }
            for (i, c) in b.chunks_exact(PACKET_BYTES).enumerate() {
                let mut p = [0u8; PACKET_BYTES];
                p.copy_from_slice(c);
                packets.push((at + (i * PACKET_BYTES) as u64, p));
            }
        }
        for (at, p) in packets {
            pre.reads.insert((q.pid, at), p.to_vec());
            let t = Dispatch::decode(&p).packet_type();
            if matches!(
                t,
                aql::PACKET_TYPE_BARRIER_AND | aql::PACKET_TYPE_BARRIER_OR
            ) {
                for i in 0..5 {
                    let s = dep_signal(&p, i);
                    if s != 0 {
                        let _ = pre.read(host, q.pid, s + aql::SIGNAL_VALUE, 8);
                    }
                }
            }
        }
    }
    pre
}

impl Host for Prefetch {
    fn read_mem(&mut self, pid: u32, addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
        match self.reads.get(&(pid, addr)) {
            Some(b) if b.len() >= buf.len() => {
                buf.copy_from_slice(&b[..buf.len()]);
                Ok(())
            }
            // Not read ahead: the engine sees it on a later tick.
            _ => Err(libc::EAGAIN),
        }
    }
    fn write_mem(&mut self, pid: u32, addr: u64, data: &[u8]) -> Result<(), Errno> {
        self.writes.push((pid, addr, data.to_vec()));
        Ok(())
    }
    fn tracer(&mut self, _pid: u32) -> Option<u32> {
        None
    }
    fn take_fd(&mut self, _pid: u32, _fd: u32) -> Result<std::os::fd::OwnedFd, Errno> {
        Err(libc::EBADF)
    }
    fn fd_exists(&mut self, _pid: u32, _fd: u32) -> bool {
        false
    }
    fn process_exists(&mut self, _pid: u32) -> bool {
        false
    }
}

/// The end of a packet with a completion signal, as the CP does it: the signal's value drops by
/// one, and a signal with an event mailbox gets its event id written there, which raises the
/// interrupt whose handler signals that KFD event (returned: (pid, event id); the slot is
/// acknowledged back to UNSIGNALED as `kfd_signal_event_interrupt` does). *Emulated:* the CP
/// decrements atomically; here it is a read and a write of the process's memory, so a process
/// that stores to the same signal meanwhile can lose its store.
pub fn finish_completions(done: &[Completion], host: &mut dyn Host) -> Vec<(u32, u32)> {
    let mut events = Vec::new();
    for c in done {
        let mut sig = [0u8; 32];
        if host.read_mem(c.pid, c.signal, &mut sig).is_err() {
            continue;
        }
        let word = |at: usize| u64::from_le_bytes(sig[at..at + 8].try_into().unwrap_or([0; 8]));
        let value = word(aql::SIGNAL_VALUE as usize) as i64;
        let mailbox = word(aql::SIGNAL_EVENT_MAILBOX as usize);
        let event_id = u32::from_le_bytes(
            sig[aql::SIGNAL_EVENT_ID as usize..aql::SIGNAL_EVENT_ID as usize + 4]
                .try_into()
                .unwrap_or([0; 4]),
        );
        let _ = host.write_mem(
            c.pid,
            c.signal + aql::SIGNAL_VALUE,
            &(value - 1).to_le_bytes(),
        );
        if mailbox != 0 {
            let _ = host.write_mem(c.pid, mailbox, &u64::from(event_id).to_le_bytes());
            let _ = host.write_mem(c.pid, mailbox, &crate::model::UNSIGNALED_SLOT.to_le_bytes());
            events.push((c.pid, event_id));
        }
    }
    events
}
