//! Reads each AQL queue's dispatch ids from its process's memory (the `amd_queue_t` that
//! CREATE_QUEUE's read/write pointers point into), and a bounded window of its ring where
//! packets not seen yet would be, with one `process_vm_readv` per process per tick (and one more
//! for a queue that consumed past its whole window since the last tick). A queue's
//! `amd_queue_t` is validated once (docs/kfd.md); one that does not look like ROCr's is never
//! read again.
//!
//! Packets are only readable while pending: the packet processor hands a consumed slot back as
//! INVALID. A packet written and consumed between two ticks is not seen; the model counts what
//! was decoded against what the read id says was consumed.

use gpreempt_common::aql::{amd_queue, Packet, PACKET_BYTES};
use nix::sys::uio::RemoteIoVec;

use super::remote::{read_remote, u32_at};
use crate::observe::model::{
    Process, Queue, QueueKind, SampleRead, SampleStatus, SeenPacket, State,
};

/// Ring slots read per queue per tick (4 KiB): bounds the cost on a deep backlog.
pub const WINDOW_PACKETS: u64 = 64;

/// `write_dispatch_id` .. end of `read_dispatch_id`: both ids in one remote range.
const IDS_START: usize = amd_queue::WRITE_DISPATCH_ID;
const IDS_LEN: usize = amd_queue::READ_DISPATCH_ID + 8 - IDS_START;
/// Remote ranges per syscall (the kernel's UIO_MAXIOV is 1024).
const MAX_IOV: usize = 1024;

/// What to read for one queue.
struct Plan {
    qid: u32,
    base: u64,
    /// Not validated yet: read the whole `amd_queue_t`.
    full: bool,
    /// The ring window, placed from the last tick's ids.
    ring: Option<Window>,
}

/// A window of a queue's ring: its first dispatch id and up to two remote ranges (it may wrap).
#[derive(Clone, Copy)]
struct Window {
    start: u64,
    ranges: [Option<RemoteIoVec>; 2],
    ring: u64,
    slots: u64,
}

impl Window {
    /// At most [`WINDOW_PACKETS`] slots from dispatch id `start`, never a whole lap.
    fn at(ring: u64, slots: u64, start: u64) -> Self {
        let n = WINDOW_PACKETS.min(slots);
        let slot = start & (slots - 1);
        let first = n.min(slots - slot);
        let range = |slot: u64, n: u64| RemoteIoVec {
            base: (ring + slot * PACKET_BYTES as u64) as usize,
            len: (n * PACKET_BYTES as u64) as usize,
        };
        Self {
            start,
            ranges: [
                Some(range(slot, first)),
                (n > first).then(|| range(0, n - first)),
            ],
            ring,
            slots,
        }
    }

    fn len(&self) -> usize {
        self.ranges.iter().flatten().map(|r| r.len).sum()
    }

    /// Dispatch ids past the window.
    fn end(&self) -> u64 {
        self.start + (self.len() / PACKET_BYTES) as u64
    }
}

/// The ring slots from the first dispatch id not yet decoded (or the last read id, if further
/// on).
fn ring_window(q: &Queue) -> Option<Window> {
    let a = &q.activity;
    let ring = q.ring_base_address?;
    let slots = q.ring_size / PACKET_BYTES as u64;
    if slots == 0 || !slots.is_power_of_two() || !matches!(a.status, SampleStatus::Valid) {
        return None;
    }
    let start = a.read_dispatch_id?.max(a.dispatch_cursor.unwrap_or(0));
    Some(Window::at(ring, slots, start))
}

/// The packets of a window that belong between the ids read with it: `[read, write)` (older
/// slots were consumed; newer ones may hold the previous lap) with a defined header.
fn pending_packets(window: &[u8], start: u64, read: u64, write: u64) -> Vec<SeenPacket> {
    window
        .chunks_exact(PACKET_BYTES)
        .enumerate()
        .filter_map(|(i, b)| {
            let dispatch_id = start + i as u64;
            if dispatch_id < read || dispatch_id >= write {
                return None;
            }
            let b: &[u8; PACKET_BYTES] = b.try_into().ok()?;
            Packet::decode(b).map(|packet| SeenPacket {
                dispatch_id,
                packet,
            })
        })
        .collect()
}

/// The `amd_queue_t` base of a queue the sampler may read, and whether it still needs validating.
fn plan_for(q: &Queue) -> Option<Plan> {
    // PM4 queues' pointers are the thunk's own words, not an amd_queue_t.
    if !q.alive() || q.kind != QueueKind::ComputeAql {
        return None;
    }
    let rptr = q.read_pointer_address?;
    if matches!(q.activity.status, SampleStatus::Invalid(_)) {
        return None;
    }
    Some(Plan {
        qid: q.queue_id,
        base: rptr.checked_sub(amd_queue::READ_DISPATCH_ID as u64)?,
        full: !matches!(q.activity.status, SampleStatus::Valid),
        ring: ring_window(q),
    })
}

/// The pending packets of a window read on its own (none if it faults).
fn reread(pid: u32, w: Window, read: u64, write: u64) -> Vec<SeenPacket> {
    let ranges: Vec<RemoteIoVec> = w.ranges.iter().flatten().copied().collect();
    let mut buf = vec![0u8; w.len()];
    match read_remote(pid, &ranges, &mut buf) {
        Ok(n) if n == buf.len() => pending_packets(&buf, w.start, read, write),
        _ => Vec::new(),
    }
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// Checks a whole `amd_queue_t` against what CREATE_QUEUE said: Err(reason) if it is not ROCr's.
pub fn validate(q: &Queue, b: &[u8]) -> Result<(), String> {
    let (Some(rptr), Some(wptr)) = (q.read_pointer_address, q.write_pointer_address) else {
        return Err("read/write pointer addresses unknown".into());
    };
    if rptr.wrapping_sub(wptr)
        != (amd_queue::READ_DISPATCH_ID - amd_queue::WRITE_DISPATCH_ID) as u64
    {
        return Err(format!(
            "read_pointer - write_pointer is {:#x}, not 0x48",
            rptr.wrapping_sub(wptr)
        ));
    }
    let field_off = u32_at(b, amd_queue::READ_DISPATCH_ID_FIELD_BASE_BYTE_OFFSET);
    if field_off as usize != amd_queue::READ_DISPATCH_ID {
        return Err(format!(
            "read_dispatch_id_field_base_byte_offset is {field_off:#x}"
        ));
    }
    let base = u64_at(b, amd_queue::BASE_ADDRESS);
    if q.ring_base_address.is_some_and(|r| r != base) {
        return Err(format!("base_address {base:#x} is not the ring"));
    }
    let packets = u64::from(u32_at(b, amd_queue::SIZE_PACKETS));
    if q.ring_size != 0 && packets * PACKET_BYTES as u64 != q.ring_size {
        return Err(format!(
            "size {packets} packets does not match ring_size {}",
            q.ring_size
        ));
    }
    Ok(())
}

/// Samples every readable AQL queue of the model. Returns (pid, queue id, result).
pub fn sample(state: &State) -> Vec<(u32, u32, SampleRead)> {
    let mut out = Vec::new();
    for p in state.procs.values().filter(|p| p.exited_ns.is_none()) {
        sample_process(p, &mut out);
    }
    out
}

fn sample_process(p: &Process, out: &mut Vec<(u32, u32, SampleRead)>) {
    let plans: Vec<Plan> = p.queues.values().filter_map(plan_for).collect();
    // Each plan takes its ids range and up to two ring ranges: chunks stay under UIO_MAXIOV.
    for chunk in plans.chunks(MAX_IOV / 3) {
        let mut remote: Vec<RemoteIoVec> = Vec::with_capacity(chunk.len() * 3);
        for pl in chunk {
            remote.push(if pl.full {
                RemoteIoVec {
                    base: pl.base as usize,
                    len: amd_queue::SIZE,
                }
            } else {
                RemoteIoVec {
                    base: pl.base as usize + IDS_START,
                    len: IDS_LEN,
                }
            });
            if let Some(w) = &pl.ring {
                remote.extend(w.ranges.iter().flatten().copied());
            }
        }
        let total: usize = remote.iter().map(|r| r.len).sum();
        let mut buf = vec![0u8; total];
        let got = match read_remote(p.pid, &remote, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                for pl in chunk {
                    out.push((p.pid, pl.qid, SampleRead::Unreadable(e.desc().to_string())));
                }
                continue;
            }
        };
        let mut off = 0;
        for pl in chunk {
            let ids_len = if pl.full { amd_queue::SIZE } else { IDS_LEN };
            let ring_len = pl.ring.as_ref().map_or(0, Window::len);
            let (ids_at, ring_at) = (off, off + ids_len);
            off += ids_len + ring_len;
            if ring_at > got {
                // The read stops at the first range that faults.
                out.push((
                    p.pid,
                    pl.qid,
                    SampleRead::Unreadable("address not mapped".into()),
                ));
                continue;
            }
            let b = &buf[ids_at..ring_at];
            let (ids, rel) = if pl.full {
                if let Some(q) = p.queues.get(&pl.qid) {
                    if let Err(why) = validate(q, b) {
                        out.push((p.pid, pl.qid, SampleRead::Invalid(why)));
                        continue;
                    }
                }
                (b, 0)
            } else {
                (b, IDS_START)
            };
            let read = u64_at(ids, amd_queue::READ_DISPATCH_ID - rel);
            let write = u64_at(ids, amd_queue::WRITE_DISPATCH_ID - rel);
            // A ring that faults (unmapped since) costs its packets, not the ids.
            let packets = match &pl.ring {
                // The queue consumed past the whole window since the last tick (a busy queue,
                // a slow tick): one more read, where its pending packets are now.
                Some(w) if w.end() <= read && write > read => {
                    reread(p.pid, Window::at(w.ring, w.slots, read), read, write)
                }
                Some(w) if ring_at + ring_len <= got => {
                    pending_packets(&buf[ring_at..ring_at + ring_len], w.start, read, write)
                }
                _ => Vec::new(),
            };
            out.push((
                p.pid,
                pl.qid,
                SampleRead::Ids {
                    read,
                    write,
                    packets,
                },
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::model::{QueueState, Source, Update};

    /// An `amd_queue_t` in this process's memory, as ROCr lays it out.
    #[repr(C, align(64))]
    struct AmdQueue([u8; amd_queue::SIZE]);

    fn queue_at(aq: &AmdQueue, ring: u64, ring_size: u64) -> Queue {
        let base = aq.0.as_ptr() as u64;
        let mut q = Queue {
            queue_id: 1,
            gpu_id: 7,
            kind: QueueKind::ComputeAql,
            priority: None,
            percentage: None,
            ring_base_address: Some(ring),
            ring_size,
            read_pointer_address: Some(base + amd_queue::READ_DISPATCH_ID as u64),
            write_pointer_address: Some(base + amd_queue::WRITE_DISPATCH_ID as u64),
            doorbell_offset: None,
            hqd: None,
            state: QueueState::Active,
            suspended_by: None,
            created_ns: None,
            seen_ns: 0,
            destroyed_ns: None,
            source: Source::Event,
            pointers_from_mqds: false,
            activity: Default::default(),
            nv: None,
            last_event_ns: 0,
        };
        q.activity.status = SampleStatus::None;
        q
    }

    fn fill(aq: &mut AmdQueue, ring: u64, packets: u32, read: u64, write: u64) {
        aq.0[amd_queue::BASE_ADDRESS..][..8].copy_from_slice(&ring.to_le_bytes());
        aq.0[amd_queue::SIZE_PACKETS..][..4].copy_from_slice(&packets.to_le_bytes());
        aq.0[amd_queue::READ_DISPATCH_ID_FIELD_BASE_BYTE_OFFSET..][..4]
            .copy_from_slice(&(amd_queue::READ_DISPATCH_ID as u32).to_le_bytes());
        aq.0[amd_queue::READ_DISPATCH_ID..][..8].copy_from_slice(&read.to_le_bytes());
        aq.0[amd_queue::WRITE_DISPATCH_ID..][..8].copy_from_slice(&write.to_le_bytes());
    }

    fn state_with(qs: Vec<Queue>) -> State {
        let mut s = State::new();
        let mut p = Process::new(std::process::id(), Source::Event, 0);
        for q in qs {
            p.queues.insert(q.queue_id, q);
        }
        s.procs.insert(p.pid, p);
        s
    }

    #[test]
    fn reads_ids_of_a_valid_queue_then_only_the_ids() {
        let mut aq = AmdQueue([0; amd_queue::SIZE]);
        fill(&mut aq, 0x7000_0000, 1024, 40, 45);
        let mut s = state_with(vec![queue_at(&aq, 0x7000_0000, 1024 * 64)]);
        let pid = std::process::id();
        let r = sample(&s);
        assert_eq!(
            r,
            vec![(
                pid,
                1,
                SampleRead::Ids {
                    read: 40,
                    write: 45,
                    packets: vec![],
                }
            )]
        );
        s.apply(Update::Samples {
            ts_ns: 1_000_000_000,
            samples: r,
        });
        let q = s.queue(pid, 1).unwrap();
        assert_eq!(q.activity.status, SampleStatus::Valid);
        assert_eq!(q.activity.backlog, Some(5));
        // Validated: later reads take only the ids (a broken signature is no longer looked at).
        fill(&mut aq, 0xdead, 3, 50, 50);
        assert_eq!(
            sample(&s),
            vec![(
                pid,
                1,
                SampleRead::Ids {
                    read: 50,
                    write: 50,
                    packets: vec![],
                }
            )]
        );
    }

    #[test]
    fn invalid_queues_say_why_and_are_not_read_again() {
        let mut aq = AmdQueue([0; amd_queue::SIZE]);
        fill(&mut aq, 0x1234_0000, 1024, 0, 0);
        let pid = std::process::id();
        let mut s = state_with(vec![queue_at(&aq, 0x7000_0000, 1024 * 64)]);
        let r = sample(&s);
        match &r[0].2 {
            SampleRead::Invalid(why) => assert!(why.contains("base_address"), "{why}"),
            other => panic!("{other:?}"),
        }
        s.apply(Update::Samples {
            ts_ns: 1,
            samples: r,
        });
        assert!(sample(&s).is_empty());

        fill(&mut aq, 0x7000_0000, 512, 0, 0);
        let s = state_with(vec![queue_at(&aq, 0x7000_0000, 1024 * 64)]);
        assert!(matches!(&sample(&s)[0].2, SampleRead::Invalid(w) if w.contains("512 packets")));
        let mut q = queue_at(&aq, 0x7000_0000, 512 * 64);
        q.write_pointer_address = Some(q.write_pointer_address.unwrap() + 8);
        assert!(validate(&q, &aq.0).unwrap_err().contains("not 0x48"));
        let _ = pid;
    }

    /// A 64-byte AQL slot: a kernel dispatch of `object` with `items` work-items, or INVALID.
    fn slot(ring: &mut [u8], i: usize, object: Option<u64>, items: u32) {
        let p = &mut ring[i * PACKET_BYTES..(i + 1) * PACKET_BYTES];
        p.fill(0);
        match object {
            Some(o) => {
                p[0..2].copy_from_slice(&(2u16 | 1 << 8).to_le_bytes());
                p[4..6].copy_from_slice(&64u16.to_le_bytes());
                p[12..16].copy_from_slice(&items.to_le_bytes());
                p[32..40].copy_from_slice(&o.to_le_bytes());
            }
            None => p[0..2].copy_from_slice(&1u16.to_le_bytes()),
        }
    }

    #[test]
    fn pending_packets_are_read_once_across_ring_wrap() {
        #[repr(C, align(64))]
        struct Ring([u8; 8 * PACKET_BYTES]);
        let mut ring = Ring([0; 8 * PACKET_BYTES]);
        let ring_va = ring.0.as_ptr() as u64;
        let mut aq = AmdQueue([0; amd_queue::SIZE]);
        // Ids 6..10 pending: slots 6, 7, then 0, 1. Slots 2..6 hold a valid-looking older lap
        // (ids 10..14 are not written yet) that must not be taken for packets.
        fill(&mut aq, ring_va, 8, 6, 10);
        for (i, obj) in [(6, 0xa6), (7, 0xa7), (0, 0xa8), (1, 0xa9)] {
            slot(&mut ring.0, i, Some(obj), 1 << 18);
        }
        for i in 2..6 {
            slot(&mut ring.0, i, Some(0xdead), 1);
        }
        let mut s = state_with(vec![queue_at(&aq, ring_va, 8 * 64)]);
        let pid = std::process::id();
        // First read validates the amd_queue_t only.
        let r = sample(&s);
        assert!(matches!(&r[0].2, SampleRead::Ids { packets, .. } if packets.is_empty()));
        s.apply(Update::Samples {
            ts_ns: 1,
            samples: r,
        });
        let r = sample(&s);
        let SampleRead::Ids { packets, .. } = &r[0].2 else {
            panic!("{r:?}")
        };
        let ids: Vec<(u64, u64)> = packets
            .iter()
            .map(|p| (p.dispatch_id, p.packet.kernel_object))
            .collect();
        assert_eq!(ids, vec![(6, 0xa6), (7, 0xa7), (8, 0xa8), (9, 0xa9)]);
        s.apply(Update::Samples {
            ts_ns: 2,
            samples: r,
        });
        // Two consumed (handed back INVALID), one more written: only id 10 is new.
        slot(&mut ring.0, 6, None, 0);
        slot(&mut ring.0, 7, None, 0);
        slot(&mut ring.0, 2, Some(0xaa), 512);
        fill(&mut aq, ring_va, 8, 8, 11);
        let r = sample(&s);
        let SampleRead::Ids { packets, .. } = &r[0].2 else {
            panic!("{r:?}")
        };
        assert_eq!(
            packets.iter().map(|p| p.dispatch_id).collect::<Vec<_>>(),
            vec![10],
            "the window starts at the first id not decoded"
        );
        s.apply(Update::Samples {
            ts_ns: 3,
            samples: r,
        });
        let m = &s.queue(pid, 1).unwrap().activity.dispatches;
        assert_eq!((m.decoded, m.consumed, m.kernel_dispatches), (5, 2, 5));
        assert_eq!(m.grid_log2[18], 4);
        assert_eq!(m.grid_log2[9], 1);
        assert!(!m.kernels.contains_key(&0xdead));
    }

    #[test]
    fn a_queue_that_consumed_past_the_window_is_read_where_its_packets_are() {
        #[repr(C, align(64))]
        struct Ring([u8; 256 * PACKET_BYTES]);
        let mut ring = Box::new(Ring([0; 256 * PACKET_BYTES]));
        let ring_va = ring.0.as_ptr() as u64;
        let mut aq = AmdQueue([0; amd_queue::SIZE]);
        fill(&mut aq, ring_va, 256, 0, 0);
        let mut s = state_with(vec![queue_at(&aq, ring_va, 256 * 64)]);
        let r = sample(&s);
        s.apply(Update::Samples {
            ts_ns: 1,
            samples: r,
        });
        // 200 consumed since the last tick (three windows' worth), ten pending.
        for i in 200..210 {
            slot(&mut ring.0, i, Some(0xc0 + i as u64), 64);
        }
        fill(&mut aq, ring_va, 256, 200, 210);
        let r = sample(&s);
        let SampleRead::Ids { packets, .. } = &r[0].2 else {
            panic!("{r:?}")
        };
        assert_eq!(
            packets.iter().map(|p| p.dispatch_id).collect::<Vec<_>>(),
            (200..210).collect::<Vec<_>>()
        );
    }

    #[test]
    fn unmapped_addresses_are_unreadable_not_fatal() {
        let aq = AmdQueue([0; amd_queue::SIZE]);
        let mut q = queue_at(&aq, 0, 0);
        q.read_pointer_address = Some(0x80 + amd_queue::READ_DISPATCH_ID as u64);
        q.write_pointer_address = Some(0x80 + amd_queue::WRITE_DISPATCH_ID as u64);
        let s = state_with(vec![q]);
        assert!(matches!(&sample(&s)[0].2, SampleRead::Unreadable(_)));
    }
}
