//! Reads each AQL queue's dispatch ids from its process's memory (the `amd_queue_t` that
//! CREATE_QUEUE's read/write pointers point into), with one `process_vm_readv` per process per
//! tick. A queue's `amd_queue_t` is validated once (docs/kfd.md); one that does not look
//! like ROCr's is never read again.

use std::io::IoSliceMut;

use gpreempt_common::aql::{amd_queue, PACKET_BYTES};
use nix::{sys::uio::RemoteIoVec, unistd::Pid};

use crate::model::{Process, Queue, QueueKind, SampleRead, SampleStatus, State};

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
    })
}

/// Reads `remote` ranges of `pid`'s memory back to back into `buf` in one syscall; returns the
/// bytes read (the kernel stops at the first range that faults).
pub fn read_remote(pid: u32, remote: &[RemoteIoVec], buf: &mut [u8]) -> nix::Result<usize> {
    nix::sys::uio::process_vm_readv(
        Pid::from_raw(pid as i32),
        &mut [IoSliceMut::new(buf)],
        remote,
    )
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
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
    for chunk in plans.chunks(MAX_IOV) {
        let remote: Vec<RemoteIoVec> = chunk
            .iter()
            .map(|pl| {
                if pl.full {
                    RemoteIoVec {
                        base: pl.base as usize,
                        len: amd_queue::SIZE,
                    }
                } else {
                    RemoteIoVec {
                        base: pl.base as usize + IDS_START,
                        len: IDS_LEN,
                    }
                }
            })
            .collect();
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
        for (pl, r) in chunk.iter().zip(&remote) {
            if off + r.len > got {
                // The read stops at the first range that faults.
                out.push((
                    p.pid,
                    pl.qid,
                    SampleRead::Unreadable("address not mapped".into()),
                ));
                off += r.len;
                continue;
            }
            let b = &buf[off..off + r.len];
            off += r.len;
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
            out.push((
                p.pid,
                pl.qid,
                SampleRead::Ids {
                    read: u64_at(ids, amd_queue::READ_DISPATCH_ID - rel),
                    write: u64_at(ids, amd_queue::WRITE_DISPATCH_ID - rel),
                },
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{QueueState, Source, Update};

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
        let mut p = Process {
            pid: std::process::id(),
            info: None,
            class: None,
            debugger: None,
            source: Source::Event,
            seen_ns: 0,
            exited_ns: None,
            queues: Default::default(),
            last_event_ns: 0,
            last_launch_ns: None,
            launches: 0,
        };
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
                    write: 45
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
                    write: 50
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
