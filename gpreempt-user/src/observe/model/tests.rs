//! The host model's transitions, one update at a time, and against the emulator's own sysfs and
//! debugfs text (`gpreempt_sim`).

use std::collections::BTreeMap;

use gpreempt_common::kfd::{
    self, dbg_op, ec, ec_mask, gfx9_hqd as reg, nr, queue_type, CreateQueueArgs, DbgTrapArgs,
    DbgTrapEnableArgs, DbgTrapQueryDebugEventArgs, DestroyQueueArgs, RuntimeEnableArgs,
    UpdateQueueArgs, DOORBELL_PROCESS_SLICE_BYTES,
};
use gpreempt_sim::{model::tests::World, views};

use super::*;
use crate::{
    observe::events::{tests::create_queue, Event, IoctlEvent, KfdCall, Origin, ProcessExit},
    observe::kfd::{
        debugfs::{
            parse_hqds, parse_mqds, HqdId, HqdNode, HqdSlot, MqdKind, MqdProcess, MqdQueue, Regs,
        },
        sysfs::{parse_node, GpuNode, ProcSnapshot, SysProc, SysQueue},
    },
    observe::procinfo::ProcInfo,
};

const GPU: u32 = 0xbeef;
const OTHER_GPU: u32 = 0xcafe;
const SEC: u64 = 1_000_000_000;
const A: u32 = 100;
const B: u32 = 101;
const DEBUGGER: u32 = 200;

// ---------------------------------------------------------------------------------------------
// Builders

fn ioctl(pid: u32, ts: u64, cmd: u32, ret: i64, call: KfdCall) -> IoctlEvent {
    IoctlEvent {
        origin: Origin {
            ts_ns: ts,
            pid,
            tid: pid,
            comm: format!("p{pid}"),
        },
        fd: 3,
        cmd,
        ret,
        duration_ns: 0,
        call,
        verified: true,
    }
}

fn up(ev: IoctlEvent) -> Update {
    Update::Event(Event::Ioctl(ev))
}

/// CREATE_QUEUE's arguments as the kernel leaves them (outputs filled): an AQL queue of 64 KiB at
/// `ring`, ROCr-like pointers (rptr - wptr = 0x48) and the doorbell of id `qid`.
fn args(qid: u32, ring: u64) -> CreateQueueArgs {
    CreateQueueArgs {
        ring_base_address: ring,
        write_pointer_address: ring - 0x1_0000 + 0x38,
        read_pointer_address: ring - 0x1_0000 + 0x80,
        ring_size: 0x1_0000,
        gpu_id: GPU,
        queue_type: queue_type::COMPUTE_AQL,
        queue_percentage: 100,
        queue_priority: 7,
        queue_id: qid,
        doorbell_offset: kfd::doorbell_mmap_offset(GPU, u64::from(qid) * 8),
        ..Default::default()
    }
}

fn create_ev(pid: u32, ts: u64, a: CreateQueueArgs) -> IoctlEvent {
    ioctl(
        pid,
        ts,
        kfd::cmd::CREATE_QUEUE,
        0,
        KfdCall::CreateQueue {
            args: a,
            args_size: 96,
        },
    )
}

fn create_with(pid: u32, ts: u64, a: CreateQueueArgs) -> Update {
    up(create_ev(pid, ts, a))
}

fn create(pid: u32, qid: u32, ts: u64, ring: u64) -> Update {
    create_with(pid, ts, args(qid, ring))
}

fn destroy_ev(pid: u32, qid: u32, ts: u64) -> IoctlEvent {
    ioctl(
        pid,
        ts,
        kfd::cmd::DESTROY_QUEUE,
        0,
        KfdCall::DestroyQueue(DestroyQueueArgs {
            queue_id: qid,
            pad: 0,
        }),
    )
}

fn destroy(pid: u32, qid: u32, ts: u64) -> Update {
    up(destroy_ev(pid, qid, ts))
}

fn dbg(caller: u32, ts: u64, ret: i64, a: DbgTrapArgs) -> Update {
    up(ioctl(
        caller,
        ts,
        kfd::cmd::DBG_TRAP,
        ret,
        KfdCall::DbgTrap(a),
    ))
}

fn enable_args(target: u32) -> DbgTrapArgs {
    DbgTrapArgs::new(
        target,
        DbgTrapEnableArgs {
            exception_mask: ec_mask(ec::QUEUE_NEW),
            rinfo_ptr: 0x6000,
            rinfo_size: 16,
            dbg_fd: 5,
        },
    )
}

fn enable(debugger: u32, target: u32, ts: u64) -> Update {
    dbg(debugger, ts, 0, enable_args(target))
}

fn disable(caller: u32, target: u32, ts: u64) -> Update {
    dbg(caller, ts, 0, DbgTrapArgs::bare(target, dbg_op::DISABLE))
}

fn runtime(pid: u32, ts: u64, mode_mask: u32) -> Update {
    up(ioctl(
        pid,
        ts,
        kfd::cmd::RUNTIME_ENABLE,
        0,
        KfdCall::RuntimeEnable(RuntimeEnableArgs {
            r_debug: 0x1234,
            mode_mask,
            capabilities_mask: 0,
        }),
    ))
}

fn exit(pid: u32, ts: u64) -> Update {
    Update::Event(Event::ProcessExit(ProcessExit {
        origin: Origin {
            ts_ns: ts,
            pid,
            tid: pid,
            comm: format!("p{pid}"),
        },
        rate_limited: 0,
    }))
}

fn suspended(by: u32, target: u32, ts: u64, ids: Option<&[u32]>) -> Update {
    Update::Suspended {
        ts_ns: ts,
        by,
        target,
        queues: ids.map(<[u32]>::to_vec),
    }
}

fn resumed(by: u32, target: u32, ts: u64, ids: Option<&[u32]>) -> Update {
    Update::Resumed {
        ts_ns: ts,
        by,
        target,
        queues: ids.map(<[u32]>::to_vec),
    }
}

fn info(comm: &str, start_time: u64) -> ProcInfo {
    ProcInfo {
        comm: comm.into(),
        start_time,
        ..Default::default()
    }
}

fn sysq(queue_id: u32, kind: u32, size: u64) -> SysQueue {
    SysQueue {
        queue_id,
        gpu_id: GPU,
        kind,
        size,
    }
}

fn snapshot(taken_ns: u64, procs: Vec<(u32, Vec<SysQueue>)>) -> Update {
    Update::Procs(ProcSnapshot {
        taken_ns,
        procs: procs
            .into_iter()
            .map(|(pid, queues)| SysProc { pid, queues })
            .collect(),
    })
}

fn gpu_node(gpu_id: u32, hqd_slots: u32, num_xcc: u32) -> GpuNode {
    GpuNode {
        node: 1,
        gpu_id,
        name: "aldebaran".into(),
        gfx_target_version: 90010,
        device_id: 0x740f,
        cu_count: 104,
        hqd_slots,
        num_xcc,
        drm_render_minor: 128,
    }
}

/// A GFX9 HQD register image (56 values) of a mapped queue: ring, pointers, and the doorbell at
/// `doorbell_in_slice` bytes into doorbell slice `slice` of the BAR.
fn hqd_regs(ring: u64, rptr: u64, wptr: u64, doorbell_in_slice: u64, slice: u64) -> Regs {
    let dw = slice * (DOORBELL_PROCESS_SLICE_BYTES / 4) + doorbell_in_slice / 4;
    let mut r = Regs::mapped(ring, rptr, wptr, dw as u32, 0x1_0000);
    r.0[reg::VMID] = 8;
    r.0[reg::QUEUE_PRIORITY] = 9;
    r
}

/// The HQD image of the queue CREATE_QUEUE made with `a`, in doorbell slice `slice`.
fn regs_of(a: &CreateQueueArgs, slice: u64) -> Regs {
    hqd_regs(
        a.ring_base_address,
        a.read_pointer_address,
        a.write_pointer_address,
        a.doorbell_offset & (DOORBELL_PROCESS_SLICE_BYTES - 1),
        slice,
    )
}

fn inactive(mut r: Regs) -> Regs {
    r.0[reg::ACTIVE] = 0;
    r
}

fn slot(pipe: u32, queue: u32, regs: Regs) -> HqdSlot {
    HqdSlot {
        inst: 0,
        pipe,
        queue,
        regs,
    }
}

fn empty(pipe: u32, queue: u32) -> HqdSlot {
    slot(pipe, queue, Regs(vec![0; reg::HQD_N_REGS]))
}

fn hqd_id(pipe: u32, queue: u32) -> HqdId {
    HqdId {
        inst: 0,
        pipe,
        queue,
    }
}

fn hqds(taken_ns: u64, gpu_id: u32, slots: Vec<HqdSlot>) -> Update {
    Update::Hqds {
        taken_ns,
        nodes: vec![HqdNode {
            node: 1,
            gpu_id,
            stopped: false,
            slots,
        }],
    }
}

fn q(s: &State, pid: u32, qid: u32) -> &Queue {
    s.queue(pid, qid)
        .unwrap_or_else(|| panic!("no queue {pid}/{qid}"))
}

fn proc_(s: &State, pid: u32) -> &Process {
    s.procs
        .get(&pid)
        .unwrap_or_else(|| panic!("no process {pid}"))
}

/// The last `n` log entries as (kind, pid, queue, text).
fn log_tail(s: &State, n: usize) -> Vec<(LogKind, u32, Option<u32>, String)> {
    let skip = s.log.len().saturating_sub(n);
    s.log
        .iter()
        .skip(skip)
        .map(|e| (e.kind, e.pid, e.queue_id, e.text.clone()))
        .collect()
}

fn states(s: &State, pid: u32) -> Vec<(u32, QueueState)> {
    proc_(s, pid)
        .queues
        .values()
        .map(|q| (q.queue_id, q.state))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Queue lifecycle from events

#[test]
fn create_queue_event_makes_the_process_and_every_queue_field() {
    let mut s = State::new();
    // The decoder's own record: pid 100 at 5000 ns, 1234 ns long, queue 9 on gpu 0xbeef.
    s.apply(Update::Event(Event::Ioctl(create_queue(0))));
    let queue = Queue {
        queue_id: 9,
        gpu_id: 0xbeef,
        kind: QueueKind::ComputeAql,
        priority: Some(7),
        percentage: Some(0),
        ring_base_address: Some(0x1000),
        ring_size: 4096,
        read_pointer_address: Some(0),
        write_pointer_address: Some(0),
        doorbell_offset: Some(kfd::doorbell_mmap_offset(0xbeef, 0x48)),
        hqd: None,
        state: QueueState::Active,
        suspended_by: None,
        created_ns: Some(5_000),
        seen_ns: 5_000,
        destroyed_ns: None,
        source: Source::Event,
        pointers_from_mqds: false,
        activity: Activity::default(),
        nv: None,
        // The call's return: what reconciliation compares snapshots with.
        last_event_ns: 5_000 + 1_234,
    };
    let process = Process {
        queues: BTreeMap::from([(9, queue)]),
        last_event_ns: 5_000 + 1_234,
        ..Process::new(100, Source::Event, 5_000)
    };
    assert_eq!(s.procs, BTreeMap::from([(100, process)]));
    assert_eq!(
        s.log.iter().cloned().collect::<Vec<_>>(),
        vec![LogEntry {
            ts_ns: 5_000,
            kind: LogKind::Create,
            pid: 100,
            queue_id: Some(9),
            text: "aql queue 9 on gpu 48879 prio 7 ring 0x1000".into(),
        }]
    );
    assert_eq!(s.now_ns, 5_000);
    assert_eq!(s.corrections, Corrections::default());

    // The pointers and priority of a full ROCr-like create.
    s.apply(create(A, 0, 7 * SEC, 0x7f00_0011_0000));
    let q0 = q(&s, A, 0);
    assert_eq!(q0.ring_base_address, Some(0x7f00_0011_0000));
    assert_eq!(q0.read_pointer_address, Some(0x7f00_0010_0080));
    assert_eq!(q0.write_pointer_address, Some(0x7f00_0010_0038));
    assert_eq!(q0.ring_size, 0x1_0000);
    assert_eq!(q0.percentage, Some(100));
    assert_eq!(q0.doorbell_offset, Some(kfd::doorbell_mmap_offset(GPU, 0)));
    assert_eq!(q0.created_ns, Some(7 * SEC));
    assert_eq!(s.queues_on(GPU).count(), 2, "queue 9 and queue 0");
    assert_eq!(s.queues_on(OTHER_GPU).count(), 0);
}

#[test]
fn a_failed_create_changes_nothing_but_the_clock() {
    let mut s = State::new();
    s.apply(Update::Event(Event::Ioctl(create_queue(-22))));
    assert_eq!(
        s,
        State {
            now_ns: 5_000,
            ..State::new()
        }
    );
    // A failed destroy of a live queue does not destroy it either.
    s.apply(create(A, 0, SEC, 0x11_0000));
    let mut ev = destroy_ev(A, 0, 2 * SEC);
    ev.ret = -i64::from(libc::EINVAL);
    s.apply(up(ev));
    assert_eq!(q(&s, A, 0).state, QueueState::Active);
    assert_eq!(s.log.len(), 1);
}

#[test]
fn queue_kinds_from_create_and_from_sysfs() {
    let mut s = State::new();
    for (qid, t, kind) in [
        (0, queue_type::COMPUTE_AQL, QueueKind::ComputeAql),
        (1, queue_type::COMPUTE, QueueKind::Compute),
        (2, queue_type::SDMA, QueueKind::Sdma),
        (3, queue_type::SDMA_BY_ENG_ID, QueueKind::Sdma),
        (4, queue_type::SDMA_XGMI, QueueKind::SdmaXgmi),
        (5, 9, QueueKind::Other),
    ] {
        s.apply(create_with(
            A,
            SEC,
            CreateQueueArgs {
                queue_type: t,
                ..args(qid, 0x10_0000 * (u64::from(qid) + 1))
            },
        ));
        assert_eq!(q(&s, A, qid).kind, kind, "create type {t}");
    }
    assert_eq!(
        log_tail(&s, 1)[0].3,
        "? queue 5 on gpu 48879 prio 7 ring 0x600000"
    );
    // sysfs shows the kernel's internal type.
    for (t, kind) in [
        (0, QueueKind::Compute),
        (1, QueueKind::Sdma),
        (3, QueueKind::SdmaXgmi),
        (4, QueueKind::SdmaXgmi),
        (2, QueueKind::Other),
    ] {
        assert_eq!(QueueKind::from_sysfs(t), kind, "sysfs type {t}");
    }
    assert!(QueueKind::ComputeAql.is_compute() && QueueKind::Compute.is_compute());
    assert!(!QueueKind::Sdma.is_compute() && !QueueKind::SdmaXgmi.is_compute());
}

#[test]
fn destroy_lingers_then_tick_removes_it() {
    let mut s = State::new();
    s.apply(Update::Topology(vec![gpu_node(GPU, 32, 1)]));
    let a = args(0, 0x11_0000);
    s.apply(create_with(A, SEC, a));
    s.apply(hqds(SEC + 1, GPU, vec![slot(0, 0, regs_of(&a, 1))]));
    assert_eq!(q(&s, A, 0).hqd, Some(hqd_id(0, 0)));

    let d = 2 * SEC;
    s.apply(destroy(A, 0, d));
    let q0 = q(&s, A, 0);
    assert_eq!(q0.state, QueueState::Destroyed);
    assert!(!q0.alive());
    assert_eq!(q0.destroyed_ns, Some(d));
    assert_eq!(q0.hqd, None, "hqd cleared");
    assert_eq!(q0.suspended_by, None);
    assert_eq!(q0.created_ns, Some(SEC), "the rest stays for display");
    assert_eq!(
        log_tail(&s, 1),
        vec![(LogKind::Destroy, A, Some(0), "destroyed".into())]
    );
    assert_eq!(s.queues_on(GPU).count(), 0);
    assert_eq!(proc_(&s, A).live_queues().count(), 0);

    // A second destroy (the kernel would fail it) logs nothing more.
    s.apply(destroy(A, 0, d + 1));
    assert_eq!(s.log.len(), 2);
    assert_eq!(q(&s, A, 0).destroyed_ns, Some(d));

    s.apply(Update::Tick {
        now_ns: d + LINGER_NS - 1,
    });
    assert_eq!(q(&s, A, 0).state, QueueState::Destroyed, "still lingering");
    s.apply(Update::Tick {
        now_ns: d + LINGER_NS,
    });
    assert!(s.queue(A, 0).is_none(), "gone after LINGER_NS");
    assert!(proc_(&s, A).exited_ns.is_none(), "the process stays");
    assert_eq!(s.now_ns, d + LINGER_NS);
}

#[test]
fn a_reused_queue_id_replaces_the_lingering_queue() {
    let mut s = State::new();
    s.apply(create(A, 0, SEC, 0x11_0000));
    s.apply(Update::Samples {
        ts_ns: SEC + 1,
        samples: vec![(
            A,
            0,
            SampleRead::Ids {
                read: 3,
                write: 5,
                packets: vec![],
            },
        )],
    });
    s.apply(destroy(A, 0, 2 * SEC));
    s.apply(create(A, 0, 3 * SEC, 0x21_0000));
    let q0 = q(&s, A, 0);
    assert_eq!(q0.state, QueueState::Active);
    assert_eq!(q0.ring_base_address, Some(0x21_0000));
    assert_eq!(q0.created_ns, Some(3 * SEC));
    assert_eq!(q0.seen_ns, 3 * SEC);
    assert_eq!(q0.destroyed_ns, None);
    assert_eq!(
        q0.activity,
        Activity::default(),
        "a new queue, new activity"
    );
    assert_eq!(proc_(&s, A).queues.len(), 1);
    // A tick past the old queue's linger does not remove the new one.
    s.apply(Update::Tick {
        now_ns: 2 * SEC + LINGER_NS,
    });
    assert_eq!(q(&s, A, 0).state, QueueState::Active);
}

#[test]
fn update_queue_changes_priority_ring_and_size() {
    let mut s = State::new();
    s.apply(create(A, 0, SEC, 0x11_0000));
    let upd = |qid: u32, ts: u64| {
        up(ioctl(
            A,
            ts,
            kfd::cmd::UPDATE_QUEUE,
            0,
            KfdCall::UpdateQueue(UpdateQueueArgs {
                ring_base_address: 0x51_0000,
                queue_id: qid,
                ring_size: 0x2000,
                queue_percentage: 50,
                queue_priority: 15,
            }),
        ))
    };
    s.apply(upd(0, 2 * SEC));
    let q0 = q(&s, A, 0);
    assert_eq!(q0.priority, Some(15));
    assert_eq!(q0.percentage, Some(50));
    assert_eq!(q0.ring_base_address, Some(0x51_0000));
    assert_eq!(q0.ring_size, 0x2000);
    assert_eq!(q0.last_event_ns, 2 * SEC);
    assert_eq!(
        q0.read_pointer_address,
        Some(0x10_0080),
        "UPDATE_QUEUE does not move the pointers"
    );
    assert_eq!(q0.state, QueueState::Active);
    assert_eq!(q0.created_ns, Some(SEC));
    // An unknown queue: nothing.
    let before = s.clone();
    s.apply(upd(7, 3 * SEC));
    assert_eq!(
        s,
        State {
            now_ns: 3 * SEC,
            ..before
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Debug trap: suspend and resume

/// A with queues 0..n, its debug trap enabled by DEBUGGER.
fn debugged(n: u32) -> State {
    let mut s = State::new();
    for qid in 0..n {
        s.apply(create(A, qid, SEC, 0x10_0000 * (u64::from(qid) + 1)));
    }
    s.apply(enable(DEBUGGER, A, 2 * SEC));
    s
}

#[test]
fn dbg_enable_records_the_debugger() {
    let s = debugged(1);
    assert_eq!(proc_(&s, A).debugger, Some(DEBUGGER));
    assert_eq!(
        log_tail(&s, 1),
        vec![(
            LogKind::Debug,
            A,
            None,
            format!("debug trap enabled by pid {DEBUGGER}")
        )]
    );
    assert_eq!(states(&s, A), vec![(0, QueueState::Active)]);
    assert!(!s.procs.contains_key(&DEBUGGER), "the debugger gets no row");

    // A failed ENABLE (-EPERM: not the tracer) changes nothing.
    let mut s = State::new();
    s.apply(create(A, 0, SEC, 0x11_0000));
    s.apply(dbg(DEBUGGER, 2 * SEC, -1, enable_args(A)));
    assert_eq!(proc_(&s, A).debugger, None);
    assert_eq!(s.log.len(), 1);

    // A target that never opened /dev/kfd: the kernel makes its KFD process on ENABLE.
    let mut s = State::new();
    s.apply(enable(DEBUGGER, B, 3 * SEC));
    let b = proc_(&s, B);
    assert_eq!(b.debugger, Some(DEBUGGER));
    assert_eq!(b.source, Source::Event);
    assert_eq!(b.seen_ns, 3 * SEC);
    assert!(b.queues.is_empty() && b.exited_ns.is_none());
    // ...so its debugger's exit later resumes what it suspended.
    s.apply(create(B, 0, 4 * SEC, 0x11_0000));
    s.apply(suspended(DEBUGGER, B, 5 * SEC, Some(&[0])));
    assert_eq!(q(&s, B, 0).state, QueueState::Suspended);
    s.apply(exit(DEBUGGER, 6 * SEC));
    assert_eq!(q(&s, B, 0).state, QueueState::Active);
}

/// One act reaches the model from more than one source (the controller's status, a kernel
/// probe): the log gets one line per change, not one per report.
#[test]
fn the_same_suspend_or_resume_twice_is_logged_once() {
    let mut s = debugged(3);
    let n0 = s.log.len();
    s.apply(suspended(DEBUGGER, A, 3 * SEC, Some(&[0])));
    s.apply(suspended(DEBUGGER, A, 3 * SEC, Some(&[0])));
    assert_eq!(s.log.len(), n0 + 1);
    s.apply(resumed(DEBUGGER, A, 4 * SEC, Some(&[0])));
    s.apply(resumed(DEBUGGER, A, 4 * SEC, Some(&[0])));
    assert_eq!(s.log.len(), n0 + 2);
    assert_eq!(
        log_tail(&s, 2),
        vec![
            (LogKind::Suspend, A, Some(0), "suspended by pid 200".into()),
            (LogKind::Resume, A, Some(0), "resumed by pid 200".into()),
        ]
    );
    // Resuming a queue that was never suspended is no event either.
    s.apply(resumed(DEBUGGER, A, 5 * SEC, Some(&[1])));
    assert_eq!(s.log.len(), n0 + 2);
}

#[test]
fn suspend_and_resume_by_queue_ids() {
    let mut s = debugged(3);
    let n0 = s.log.len();
    // Ids 0 and 1, and one the target does not have.
    s.apply(suspended(DEBUGGER, A, 3 * SEC, Some(&[0, 1, 42])));
    for qid in [0, 1] {
        let qq = q(&s, A, qid);
        assert_eq!(qq.state, QueueState::Suspended);
        assert_eq!(qq.suspended_by, Some(DEBUGGER));
        assert_eq!(qq.last_event_ns, 3 * SEC);
        assert!(qq.alive());
    }
    assert_eq!(q(&s, A, 2).state, QueueState::Active);
    assert_eq!(q(&s, A, 2).suspended_by, None);
    assert_eq!(
        log_tail(&s, 2),
        vec![
            (LogKind::Suspend, A, Some(0), "suspended by pid 200".into()),
            (LogKind::Suspend, A, Some(1), "suspended by pid 200".into()),
        ]
    );
    assert_eq!(s.log.len(), n0 + 2);

    s.apply(resumed(DEBUGGER, A, 4 * SEC, Some(&[0])));
    assert_eq!(q(&s, A, 0).state, QueueState::Active);
    assert_eq!(q(&s, A, 0).suspended_by, None);
    assert_eq!(q(&s, A, 1).state, QueueState::Suspended);
    assert_eq!(
        log_tail(&s, 1),
        vec![(LogKind::Resume, A, Some(0), "resumed by pid 200".into())]
    );

    // Unreadable id arrays: no state change, one log entry without a queue.
    let before: Vec<_> = states(&s, A);
    s.apply(suspended(DEBUGGER, A, 5 * SEC, None));
    assert_eq!(states(&s, A), before);
    assert_eq!(
        log_tail(&s, 1),
        vec![(
            LogKind::Suspend,
            A,
            None,
            "suspended by pid 200 (queue ids unreadable)".into()
        )]
    );
    s.apply(resumed(DEBUGGER, A, 6 * SEC, None));
    assert_eq!(states(&s, A), before);
    assert_eq!(
        log_tail(&s, 1),
        vec![(
            LogKind::Resume,
            A,
            None,
            "resumed by pid 200 (queue ids unreadable)".into()
        )]
    );

    // A destroyed queue is not suspended; an unknown target is ignored.
    s.apply(destroy(A, 2, 7 * SEC));
    let n = s.log.len();
    s.apply(suspended(DEBUGGER, A, 8 * SEC, Some(&[2])));
    assert_eq!(q(&s, A, 2).state, QueueState::Destroyed);
    assert_eq!(q(&s, A, 2).suspended_by, None);
    s.apply(suspended(DEBUGGER, 999, 8 * SEC, Some(&[0])));
    s.apply(suspended(DEBUGGER, 999, 8 * SEC, None));
    assert_eq!(s.log.len(), n);
    assert!(!s.procs.contains_key(&999));
    assert_eq!(s.now_ns, 8 * SEC);
}

#[test]
fn destroying_a_suspended_queue_clears_suspended_by() {
    let mut s = debugged(1);
    s.apply(suspended(DEBUGGER, A, 3 * SEC, Some(&[0])));
    s.apply(destroy(A, 0, 4 * SEC));
    assert_eq!(q(&s, A, 0).state, QueueState::Destroyed);
    assert_eq!(q(&s, A, 0).suspended_by, None);
}

#[test]
fn dbg_disable_by_anyone_resumes_every_suspended_queue() {
    let mut s = debugged(3);
    s.apply(suspended(DEBUGGER, A, 3 * SEC, Some(&[0, 1])));
    s.apply(Update::Evicted {
        ts_ns: 3 * SEC,
        pid: A,
    });
    assert_eq!(
        states(&s, A),
        vec![
            (0, QueueState::Suspended),
            (1, QueueState::Suspended),
            (2, QueueState::Evicted)
        ]
    );
    // DISABLE is exempt from the ptrace rule: a third process may end the session.
    s.apply(disable(300, A, 4 * SEC));
    assert_eq!(
        states(&s, A),
        vec![
            (0, QueueState::Active),
            (1, QueueState::Active),
            (2, QueueState::Evicted)
        ]
    );
    assert_eq!(q(&s, A, 0).suspended_by, None);
    assert_eq!(q(&s, A, 1).last_event_ns, 4 * SEC);
    assert_eq!(proc_(&s, A).debugger, None);
    assert_eq!(
        log_tail(&s, 2),
        vec![
            (
                LogKind::Resume,
                A,
                Some(0),
                "resumed (debug trap disabled)".into()
            ),
            (
                LogKind::Resume,
                A,
                Some(1),
                "resumed (debug trap disabled)".into()
            ),
        ]
    );
    // A failed DISABLE (-EINVAL: not enabled) does nothing.
    s.apply(suspended(DEBUGGER, A, 5 * SEC, Some(&[0])));
    s.apply(dbg(
        300,
        6 * SEC,
        -22,
        DbgTrapArgs::bare(A, dbg_op::DISABLE),
    ));
    assert_eq!(q(&s, A, 0).state, QueueState::Suspended);
}

/// Whether a process can be suspended, from its ioctls: ROCm before 5.7 asks the DKMS-only debug
/// ioctl (0x82) and gets ENOTTY: never suspendable; RUNTIME_ENABLE turns it on and a disable off.
#[test]
fn the_debug_api_state_follows_the_runtime_ioctls() {
    let mut s = State::default();
    assert_eq!(s.procs.get(&A).and_then(|p| p.debug_api.clone()), None);
    let legacy = kfd::iowr(kfd::nr::DBG_TRAP_DEPRECATED, 40);
    s.apply(up(ioctl(A, SEC, legacy, -25, KfdCall::Other)));
    let d = proc_(&s, A).debug_api.clone().unwrap();
    assert!(!d.enabled && d.why.contains("ROCm before 5.7"), "{d:?}");
    // Another error of that number says nothing.
    s.apply(up(ioctl(B, SEC, legacy, -22, KfdCall::Other)));
    assert_eq!(s.procs.get(&B).and_then(|p| p.debug_api.clone()), None);
    s.apply(runtime(
        A,
        2 * SEC,
        kfd::KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK,
    ));
    assert!(proc_(&s, A).debug_api.as_ref().unwrap().enabled);
    // A later legacy probe does not undo an enabled runtime.
    s.apply(up(ioctl(A, 3 * SEC, legacy, -25, KfdCall::Other)));
    assert!(proc_(&s, A).debug_api.as_ref().unwrap().enabled);
    s.apply(runtime(A, 4 * SEC, 0));
    assert!(!proc_(&s, A).debug_api.as_ref().unwrap().enabled);
}

#[test]
fn runtime_disable_resumes_suspended_queues_and_keeps_the_debugger() {
    let mut s = debugged(2);
    s.apply(suspended(DEBUGGER, A, 3 * SEC, Some(&[0, 1])));
    // RUNTIME_ENABLE with ENABLE: nothing to resume.
    s.apply(runtime(
        A,
        4 * SEC,
        kfd::KFD_RUNTIME_ENABLE_MODE_ENABLE_MASK,
    ));
    assert_eq!(
        states(&s, A),
        vec![(0, QueueState::Suspended), (1, QueueState::Suspended)]
    );
    // runtime_disable deactivates the debugged runtime: resume_queues(p, 0, NULL).
    s.apply(runtime(A, 5 * SEC, 0));
    assert_eq!(
        states(&s, A),
        vec![(0, QueueState::Active), (1, QueueState::Active)]
    );
    assert_eq!(
        proc_(&s, A).debugger,
        Some(DEBUGGER),
        "the trap stays enabled"
    );
    assert_eq!(
        log_tail(&s, 1),
        vec![(
            LogKind::Resume,
            A,
            Some(1),
            "resumed (runtime disabled)".into()
        )]
    );
}

#[test]
fn debugger_exit_resumes_its_targets_only() {
    let mut s = debugged(2);
    // B has its own debugger, 201, which suspends B's queue.
    s.apply(create(B, 0, SEC, 0x11_0000));
    s.apply(enable(201, B, 2 * SEC));
    s.apply(suspended(201, B, 3 * SEC, Some(&[0])));
    s.apply(suspended(DEBUGGER, A, 3 * SEC, Some(&[0, 1])));
    // The debugger also has a KFD row of its own.
    s.apply(create(DEBUGGER, 0, SEC, 0x91_0000));

    s.apply(exit(DEBUGGER, 4 * SEC));
    assert_eq!(
        states(&s, A),
        vec![(0, QueueState::Active), (1, QueueState::Active)]
    );
    let a = proc_(&s, A);
    assert_eq!(a.debugger, None);
    assert_eq!(a.exited_ns, None, "the target lives on");
    assert_eq!(q(&s, A, 0).suspended_by, None);
    assert_eq!(states(&s, B), vec![(0, QueueState::Suspended)]);
    assert_eq!(proc_(&s, B).debugger, Some(201));
    let d = proc_(&s, DEBUGGER);
    assert_eq!(d.exited_ns, Some(4 * SEC));
    assert_eq!(states(&s, DEBUGGER), vec![(0, QueueState::Destroyed)]);
    assert_eq!(
        log_tail(&s, 4),
        vec![
            (
                LogKind::Resume,
                A,
                Some(0),
                "resumed (debugger exited)".into()
            ),
            (
                LogKind::Resume,
                A,
                Some(1),
                "resumed (debugger exited)".into()
            ),
            (
                LogKind::Destroy,
                DEBUGGER,
                Some(0),
                "destroyed (process exit)".into()
            ),
            (LogKind::Exit, DEBUGGER, None, "exited".into()),
        ]
    );

    // A debugger without any KFD row of its own: its targets still resume.
    let mut s = debugged(1);
    s.apply(suspended(DEBUGGER, A, 3 * SEC, Some(&[0])));
    s.apply(exit(DEBUGGER, 4 * SEC));
    assert_eq!(states(&s, A), vec![(0, QueueState::Active)]);
    assert!(!s.procs.contains_key(&DEBUGGER));
}

#[test]
fn target_exit_destroys_its_queues_and_the_row_lingers() {
    let mut s = debugged(2);
    s.apply(suspended(DEBUGGER, A, 3 * SEC, Some(&[1])));
    s.apply(destroy(A, 0, 3 * SEC));
    let t = 4 * SEC;
    s.apply(exit(A, t));
    let a = proc_(&s, A);
    assert_eq!(a.exited_ns, Some(t));
    assert_eq!(a.debugger, None);
    assert_eq!(a.last_event_ns, t);
    assert_eq!(q(&s, A, 0).destroyed_ns, Some(3 * SEC), "already destroyed");
    let q1 = q(&s, A, 1);
    assert_eq!(q1.state, QueueState::Destroyed);
    assert_eq!(q1.destroyed_ns, Some(t));
    assert_eq!(q1.suspended_by, None);
    assert_eq!(
        log_tail(&s, 2),
        vec![
            (
                LogKind::Destroy,
                A,
                Some(1),
                "destroyed (process exit)".into()
            ),
            (LogKind::Exit, A, None, "exited".into()),
        ]
    );
    s.apply(Update::Tick {
        now_ns: t + LINGER_NS - 1,
    });
    assert!(s.procs.contains_key(&A), "lingers");
    s.apply(Update::Tick {
        now_ns: t + LINGER_NS,
    });
    assert!(!s.procs.contains_key(&A), "gone after LINGER_NS");

    // The exit of an unknown process changes nothing.
    let mut s = State::new();
    s.apply(exit(555, SEC));
    assert_eq!(
        s,
        State {
            now_ns: SEC,
            ..State::new()
        }
    );
}

// ---------------------------------------------------------------------------------------------
// Eviction

#[test]
fn evicted_and_restored() {
    let mut s = debugged(4);
    s.apply(suspended(DEBUGGER, A, 3 * SEC, Some(&[1])));
    s.apply(destroy(A, 2, 3 * SEC));
    s.apply(Update::Evicted {
        ts_ns: 4 * SEC,
        pid: A,
    });
    assert_eq!(
        states(&s, A),
        vec![
            (0, QueueState::Evicted),
            (1, QueueState::Suspended),
            (2, QueueState::Destroyed),
            (3, QueueState::Evicted),
        ]
    );
    assert_eq!(q(&s, A, 0).last_event_ns, 4 * SEC);
    assert_eq!(
        log_tail(&s, 1),
        vec![(LogKind::Evict, A, None, "2 queue(s) evicted".into())]
    );
    s.apply(Update::Restored {
        ts_ns: 5 * SEC,
        pid: A,
    });
    assert_eq!(
        states(&s, A),
        vec![
            (0, QueueState::Active),
            (1, QueueState::Suspended),
            (2, QueueState::Destroyed),
            (3, QueueState::Active),
        ]
    );
    assert_eq!(
        log_tail(&s, 1),
        vec![(LogKind::Restore, A, None, "2 queue(s) restored".into())]
    );
    assert_eq!(s.now_ns, 5 * SEC);
    // An unknown process: nothing, not even a log entry.
    let n = s.log.len();
    s.apply(Update::Evicted {
        ts_ns: 6 * SEC,
        pid: 999,
    });
    assert_eq!(s.log.len(), n);
}

// ---------------------------------------------------------------------------------------------
// Reconciliation with sysfs

#[test]
fn queues_and_processes_found_only_in_sysfs() {
    let mut s = State::new();
    let t = 10 * SEC;
    s.apply(snapshot(
        t,
        vec![(
            A,
            vec![sysq(0, 0, 0x1_0000), sysq(1, 1, 4096), sysq(2, 4, 4096)],
        )],
    ));
    let a = proc_(&s, A);
    assert_eq!(a.source, Source::Sysfs);
    assert_eq!(a.seen_ns, t);
    assert_eq!(a.exited_ns, None);
    assert_eq!(a.info, None);
    let mut want = Queue::new(0, GPU, QueueKind::Compute, Source::Sysfs, t);
    want.ring_size = 0x1_0000;
    want.last_event_ns = 0;
    assert_eq!(q(&s, A, 0), &want);
    assert_eq!(q(&s, A, 0).created_ns, None);
    assert_eq!(q(&s, A, 0).ring_base_address, None);
    assert_eq!(q(&s, A, 1).kind, QueueKind::Sdma);
    assert_eq!(q(&s, A, 1).ring_size, 4096);
    assert_eq!(q(&s, A, 2).kind, QueueKind::SdmaXgmi);
    assert_eq!(s.corrections.queues_found, 3);
    assert_eq!(
        log_tail(&s, 10),
        vec![(
            LogKind::Found,
            A,
            None,
            "found in sysfs with 3 queue(s)".into()
        )]
    );
    assert_eq!(s.now_ns, t);

    // The same snapshot again: nothing new.
    let before = s.clone();
    s.apply(snapshot(
        t + 1,
        vec![(
            A,
            vec![sysq(0, 0, 0x1_0000), sysq(1, 1, 4096), sysq(2, 4, 4096)],
        )],
    ));
    assert_eq!(
        s,
        State {
            now_ns: t + 1,
            ..before
        }
    );

    // A queue appears in a known process (its create was not seen).
    s.apply(snapshot(
        t + 2,
        vec![(
            A,
            vec![
                sysq(0, 0, 0x1_0000),
                sysq(1, 1, 4096),
                sysq(2, 4, 4096),
                sysq(3, 0, 0x2000),
            ],
        )],
    ));
    assert_eq!(q(&s, A, 3).source, Source::Sysfs);
    assert_eq!(q(&s, A, 3).seen_ns, t + 2);
    assert_eq!(s.corrections.queues_found, 4);
    assert_eq!(
        log_tail(&s, 1),
        vec![(
            LogKind::Found,
            A,
            Some(3),
            "found in sysfs (create not seen)".into()
        )]
    );

    // A process with no queues at all is found too.
    s.apply(snapshot(
        t + 3,
        vec![
            (
                A,
                vec![
                    sysq(0, 0, 0x1_0000),
                    sysq(1, 1, 4096),
                    sysq(2, 4, 4096),
                    sysq(3, 0, 0x2000),
                ],
            ),
            (B, vec![]),
        ],
    ));
    assert_eq!(proc_(&s, B).source, Source::Sysfs);
    assert_eq!(
        log_tail(&s, 1),
        vec![(
            LogKind::Found,
            B,
            None,
            "found in sysfs with 0 queue(s)".into()
        )]
    );
    assert_eq!(s.corrections.queues_vanished, 0);
    assert_eq!(s.corrections.processes_gone, 0);
}

#[test]
fn a_queue_missing_from_sysfs_is_destroyed_unless_created_after_the_snapshot() {
    let mut s = State::new();
    s.apply(create(A, 0, SEC, 0x11_0000));
    // Created after the snapshot was taken (the snapshot is applied late).
    s.apply(create(A, 1, 3 * SEC, 0x21_0000));
    // Entered before the snapshot but returned after it: its directory may not be there yet.
    let mut slow = create_ev(A, SEC + 500, args(2, 0x31_0000));
    slow.duration_ns = 2 * SEC;
    s.apply(up(slow));
    // Returned just before the snapshot: the snapshot must show it.
    let mut quick = create_ev(A, SEC + 600, args(3, 0x41_0000));
    quick.duration_ns = SEC - 601;
    s.apply(up(quick));

    s.apply(snapshot(2 * SEC, vec![(A, vec![])]));
    assert_eq!(
        states(&s, A),
        vec![
            (0, QueueState::Destroyed),
            (1, QueueState::Active),
            (2, QueueState::Active),
            (3, QueueState::Destroyed),
        ]
    );
    assert_eq!(q(&s, A, 0).destroyed_ns, Some(2 * SEC));
    assert_eq!(s.corrections.queues_vanished, 2);
    assert_eq!(s.corrections.processes_gone, 0);
    assert_eq!(proc_(&s, A).exited_ns, None);
    assert_eq!(
        log_tail(&s, 2),
        vec![
            (
                LogKind::Destroy,
                A,
                Some(0),
                "gone from sysfs (destroy not seen)".into()
            ),
            (
                LogKind::Destroy,
                A,
                Some(3),
                "gone from sysfs (destroy not seen)".into()
            ),
        ]
    );
}

#[test]
fn a_queue_destroyed_after_the_snapshot_is_not_resurrected() {
    let mut s = State::new();
    s.apply(create(A, 0, SEC, 0x11_0000));
    s.apply(create(A, 1, SEC, 0x21_0000));
    s.apply(create(A, 2, SEC, 0x31_0000));
    s.apply(destroy(A, 0, 3 * SEC));
    // A DESTROY_QUEUE that entered before the snapshot and returned after it (it blocks while
    // the queue is suspended): the snapshot may still list the queue.
    let mut slow = destroy_ev(A, 1, SEC + 500);
    slow.duration_ns = 5 * SEC;
    s.apply(up(slow));
    // Destroyed well before the snapshot and listed again: a new queue under the same id whose
    // create was not seen.
    s.apply(destroy(A, 2, SEC + 600));
    s.apply(snapshot(
        2 * SEC,
        vec![(
            A,
            vec![
                sysq(0, 0, 0x1_0000),
                sysq(1, 0, 0x1_0000),
                sysq(2, 0, 0x2000),
            ],
        )],
    ));
    assert_eq!(q(&s, A, 0).state, QueueState::Destroyed);
    assert_eq!(q(&s, A, 0).source, Source::Event);
    assert_eq!(q(&s, A, 1).state, QueueState::Destroyed);
    assert_eq!(q(&s, A, 1).destroyed_ns, Some(SEC + 500));
    let q2 = q(&s, A, 2);
    assert_eq!(q2.state, QueueState::Active);
    assert_eq!(q2.source, Source::Sysfs);
    assert_eq!(q2.ring_size, 0x2000);
    assert_eq!(q2.ring_base_address, None);
    assert_eq!(s.corrections.queues_found, 1);
    assert_eq!(s.corrections.queues_vanished, 0);
}

#[test]
fn a_process_missing_from_sysfs_is_gone() {
    let mut s = State::new();
    s.apply(create(A, 0, SEC, 0x11_0000));
    s.apply(create(A, 1, SEC, 0x21_0000));
    // B's last event is newer than the snapshot.
    s.apply(create(B, 0, 3 * SEC, 0x11_0000));
    // C has no live queue: nothing to correct.
    s.apply(up(ioctl(
        102,
        SEC,
        kfd::cmd::ACQUIRE_VM,
        0,
        KfdCall::AcquireVm(kfd::AcquireVmArgs {
            drm_fd: 3,
            gpu_id: GPU,
        }),
    )));
    assert_eq!(proc_(&s, 102).source, Source::Event);

    s.apply(snapshot(2 * SEC, vec![]));
    let a = proc_(&s, A);
    assert_eq!(a.exited_ns, Some(2 * SEC));
    assert_eq!(
        states(&s, A),
        vec![(0, QueueState::Destroyed), (1, QueueState::Destroyed)]
    );
    assert_eq!(q(&s, A, 1).destroyed_ns, Some(2 * SEC));
    assert_eq!(s.corrections.processes_gone, 1);
    assert_eq!(
        s.corrections.queues_vanished, 0,
        "counted once, as a process"
    );
    assert_eq!(
        log_tail(&s, 3),
        vec![
            (
                LogKind::Destroy,
                A,
                Some(0),
                "destroyed (process exit)".into()
            ),
            (
                LogKind::Destroy,
                A,
                Some(1),
                "destroyed (process exit)".into()
            ),
            (
                LogKind::Gone,
                A,
                None,
                "gone from sysfs (exit not seen)".into()
            ),
        ]
    );
    assert_eq!(proc_(&s, B).exited_ns, None);
    assert_eq!(q(&s, B, 0).state, QueueState::Active);
    assert_eq!(proc_(&s, 102).exited_ns, None);

    // The row goes like an exited one.
    s.apply(Update::Tick {
        now_ns: 2 * SEC + LINGER_NS,
    });
    assert!(!s.procs.contains_key(&A));
    assert!(s.procs.contains_key(&B));
}

#[test]
fn an_exited_process_still_in_sysfs_is_not_resurrected() {
    let mut s = State::new();
    s.apply(create(A, 0, SEC, 0x11_0000));
    s.apply(exit(A, 3 * SEC));
    let listed = vec![(A, vec![sysq(0, 0, 0x1_0000), sysq(1, 0, 0x1_0000)])];
    // Taken before the exit, applied after it.
    s.apply(snapshot(2 * SEC, listed.clone()));
    // Taken after the exit: the kernel removes the directories later (kfd_process_wq_release).
    s.apply(snapshot(4 * SEC, listed.clone()));
    let a = proc_(&s, A);
    assert_eq!(a.exited_ns, Some(3 * SEC));
    assert_eq!(a.source, Source::Event);
    assert_eq!(states(&s, A), vec![(0, QueueState::Destroyed)]);
    assert_eq!(s.corrections, Corrections::default());

    // Once the row is gone, a process sysfs still (or again) lists is found as new.
    s.apply(Update::Tick {
        now_ns: 3 * SEC + LINGER_NS,
    });
    s.apply(snapshot(3 * SEC + LINGER_NS + 1, listed));
    let a = proc_(&s, A);
    assert_eq!(a.source, Source::Sysfs);
    assert_eq!(a.exited_ns, None);
    assert_eq!(
        states(&s, A),
        vec![(0, QueueState::Active), (1, QueueState::Active)]
    );
    assert_eq!(s.corrections.queues_found, 2);
}

#[test]
fn proc_gone_ends_a_process_whose_exit_was_not_seen() {
    let mut s = State::new();
    s.apply(create(A, 0, SEC, 0x11_0000));
    s.apply(Update::Tick { now_ns: 2 * SEC });
    s.apply(Update::ProcGone { pid: A });
    let a = proc_(&s, A);
    assert_eq!(a.exited_ns, Some(2 * SEC), "at the latest time seen");
    assert_eq!(states(&s, A), vec![(0, QueueState::Destroyed)]);
    assert_eq!(s.corrections.processes_gone, 1);
    assert_eq!(
        log_tail(&s, 1),
        vec![(
            LogKind::Gone,
            A,
            None,
            "gone (no process, exit not seen)".into()
        )]
    );
    // Again while the row lingers: no second correction, no new entry, same exit time.
    let n = s.log.len();
    s.apply(Update::Tick { now_ns: 3 * SEC });
    s.apply(Update::ProcGone { pid: A });
    assert_eq!(s.corrections.processes_gone, 1);
    assert_eq!(s.log.len(), n);
    assert_eq!(proc_(&s, A).exited_ns, Some(2 * SEC));
    // After a seen exit it is no correction either.
    s.apply(create(B, 0, 3 * SEC, 0x11_0000));
    s.apply(exit(B, 4 * SEC));
    s.apply(Update::ProcGone { pid: B });
    assert_eq!(s.corrections.processes_gone, 1);
    assert_eq!(proc_(&s, B).exited_ns, Some(4 * SEC));
    // An unknown pid: nothing.
    let before = s.clone();
    s.apply(Update::ProcGone { pid: 999 });
    assert_eq!(s, before);
}

// ---------------------------------------------------------------------------------------------
// Pid reuse

#[test]
fn proc_info_sets_info_and_a_new_start_time_means_pid_reuse() {
    let mut s = State::new();
    // Unknown pid: ignored.
    s.apply(Update::ProcInfo {
        pid: A,
        info: info("x", 1),
    });
    assert!(s.procs.is_empty());

    s.apply(create(A, 0, SEC, 0x11_0000));
    s.apply(Update::Class {
        pid: A,
        class: Some("online".into()),
    });
    assert_eq!(proc_(&s, A).class.as_deref(), Some("online"));
    s.apply(Update::ProcInfo {
        pid: A,
        info: info("python", 77),
    });
    assert_eq!(proc_(&s, A).info, Some(info("python", 77)));
    assert_eq!(proc_(&s, A).comm(), "python");
    // Same start time: the same process, its facts refreshed.
    s.apply(Update::ProcInfo {
        pid: A,
        info: info("python3", 77),
    });
    assert_eq!(proc_(&s, A).comm(), "python3");
    assert_eq!(states(&s, A), vec![(0, QueueState::Active)]);
    assert_eq!(s.corrections.pid_reuse, 0);

    // Another start time: a new process under the old pid.
    s.apply(Update::Tick { now_ns: 5 * SEC });
    s.apply(Update::ProcInfo {
        pid: A,
        info: info("bash", 99),
    });
    let a = proc_(&s, A);
    assert_eq!(a.info, Some(info("bash", 99)));
    assert!(a.queues.is_empty(), "the old queues are gone");
    assert_eq!(a.class, None);
    assert_eq!(a.source, Source::Sysfs);
    assert_eq!(a.seen_ns, 5 * SEC);
    assert_eq!(a.exited_ns, None);
    assert_eq!(s.corrections.pid_reuse, 1);
    assert_eq!(
        log_tail(&s, 1),
        vec![(
            LogKind::Gone,
            A,
            None,
            "pid reused: previous process gone".into()
        )]
    );
    assert_eq!(Process::new(1, Source::Event, 0).comm(), "?");
}

#[test]
fn pid_reuse_of_a_debugger_resumes_its_targets() {
    let mut s = debugged(1);
    s.apply(create(DEBUGGER, 0, SEC, 0x91_0000));
    s.apply(Update::ProcInfo {
        pid: DEBUGGER,
        info: info("rocgdb", 10),
    });
    s.apply(suspended(DEBUGGER, A, 3 * SEC, Some(&[0])));
    s.apply(Update::ProcInfo {
        pid: DEBUGGER,
        info: info("sleep", 11),
    });
    assert_eq!(states(&s, A), vec![(0, QueueState::Active)]);
    assert_eq!(proc_(&s, A).debugger, None);
    assert_eq!(s.corrections.pid_reuse, 1);
}

#[test]
fn a_create_for_an_exited_pid_replaces_the_exited_row() {
    let mut s = State::new();
    s.apply(create(A, 0, SEC, 0x11_0000));
    s.apply(create(A, 1, SEC, 0x21_0000));
    s.apply(Update::ProcInfo {
        pid: A,
        info: info("old", 1),
    });
    s.apply(exit(A, 2 * SEC));
    s.apply(create(A, 0, 3 * SEC, 0x51_0000));
    let a = proc_(&s, A);
    assert_eq!(a.exited_ns, None);
    assert_eq!(a.info, None, "facts of the old process do not carry over");
    assert_eq!(a.seen_ns, 3 * SEC);
    assert_eq!(a.source, Source::Event);
    assert_eq!(a.queues.len(), 1, "only the new queue");
    assert_eq!(q(&s, A, 0).ring_base_address, Some(0x51_0000));
    assert_eq!(q(&s, A, 0).state, QueueState::Active);
    // The old row's linger does not remove the new process.
    s.apply(Update::Tick {
        now_ns: 2 * SEC + LINGER_NS,
    });
    assert!(s.procs.contains_key(&A));
}

// ---------------------------------------------------------------------------------------------
// HQD slots

#[test]
fn topology_sets_gpus_and_keeps_what_hqds_said() {
    let mut s = State::new();
    s.apply(Update::Topology(vec![
        gpu_node(GPU, 32, 1),
        GpuNode {
            gfx_target_version: 90402,
            ..gpu_node(OTHER_GPU, 24, 8)
        },
    ]));
    let g = s.gpu(GPU).unwrap();
    assert_eq!(g.gfx_target, "gfx90a");
    assert_eq!(g.hqds_total, 32);
    assert_eq!(g.hqds_used, None);
    assert!(!g.stopped);
    let g2 = s.gpu(OTHER_GPU).unwrap();
    assert_eq!(g2.gfx_target, "gfx942");
    assert_eq!(g2.hqds_total, 24 * 8, "all XCCs");
    assert!(s.gpu(1).is_none());

    s.apply(Update::Hqds {
        taken_ns: SEC,
        nodes: vec![HqdNode {
            node: 1,
            gpu_id: GPU,
            stopped: true,
            slots: vec![],
        }],
    });
    assert!(s.gpu(GPU).unwrap().stopped);
    assert_eq!(s.gpu(GPU).unwrap().hqds_used, Some(0));
    // A new topology read keeps the last hqds facts of a GPU still there.
    s.apply(Update::Topology(vec![gpu_node(GPU, 32, 1)]));
    assert_eq!(s.gpus.len(), 1);
    let g = s.gpu(GPU).unwrap();
    assert!(g.stopped);
    assert_eq!(g.hqds_used, Some(0));
}

#[test]
fn hqds_match_queues_by_ring_pointers_and_doorbell() {
    let mut s = State::new();
    s.apply(Update::Topology(vec![gpu_node(GPU, 32, 1)]));
    let (a0, a1, a2) = (args(0, 0x11_0000), args(1, 0x21_0000), args(2, 0x31_0000));
    s.apply(create_with(A, SEC, a0));
    s.apply(create_with(A, SEC, a1));
    s.apply(create_with(A, SEC, a2));
    // A sysfs-only queue (ring unknown) never matches.
    s.apply(snapshot(
        SEC,
        vec![
            (A, vec![sysq(0, 0, 0), sysq(1, 0, 0), sysq(2, 0, 0)]),
            (B, vec![sysq(0, 0, 0x1_0000)]),
        ],
    ));
    let mut wrong_size = regs_of(&a0, 1);
    wrong_size.0.pop();
    s.apply(hqds(
        2 * SEC,
        GPU,
        vec![
            slot(0, 0, regs_of(&a0, 1)),
            slot(1, 0, regs_of(&a1, 1)),
            // Inactive slots are ignored, whatever their stale registers say.
            slot(2, 0, inactive(regs_of(&a2, 1))),
            // A register image of the wrong length gives no fields: not active.
            slot(3, 0, wrong_size),
            empty(0, 1),
            slot(1, 1, regs_of(&args(0, 0x11_0000), 2)),
        ],
    ));
    assert_eq!(q(&s, A, 0).hqd, Some(hqd_id(0, 0)));
    assert_eq!(q(&s, A, 1).hqd, Some(hqd_id(1, 0)));
    assert_eq!(q(&s, A, 2).hqd, None);
    assert_eq!(q(&s, B, 0).hqd, None);
    let g = s.gpu(GPU).unwrap();
    assert_eq!(g.hqds_used, Some(3), "active slots");
    assert_eq!(g.hqds_total, 6, "the slots hqds shows");
    assert!(!g.stopped);
    assert_eq!(s.hqds_ns, Some(2 * SEC));
    // The last slot holds A's queue 0 image (same ring, pointers, doorbell in the slice, but
    // another slice of the BAR): the same queue, so not ambiguous. A queue listed twice keeps
    // the first slot.
    assert_eq!(s.corrections.hqd_ambiguous, 0);

    // The next read: queue 0 left its slot, queue 2 got one.
    s.apply(hqds(
        3 * SEC,
        GPU,
        vec![
            slot(0, 0, regs_of(&a2, 1)),
            slot(1, 0, regs_of(&a1, 1)),
            empty(2, 0),
        ],
    ));
    assert_eq!(q(&s, A, 0).hqd, None);
    assert_eq!(q(&s, A, 1).hqd, Some(hqd_id(1, 0)));
    assert_eq!(q(&s, A, 2).hqd, Some(hqd_id(0, 0)));
    assert_eq!(s.gpu(GPU).unwrap().hqds_used, Some(2));
    assert_eq!(s.gpu(GPU).unwrap().hqds_total, 3);

    // A read of another GPU leaves these assignments alone; a queue on that GPU with the same
    // VAs matches only there.
    s.apply(create_with(
        B,
        4 * SEC,
        CreateQueueArgs {
            gpu_id: OTHER_GPU,
            ..args(1, 0x21_0000)
        },
    ));
    s.apply(hqds(4 * SEC, OTHER_GPU, vec![slot(3, 7, regs_of(&a1, 2))]));
    assert_eq!(q(&s, A, 1).hqd, Some(hqd_id(1, 0)));
    assert_eq!(q(&s, B, 1).hqd, Some(hqd_id(3, 7)));
    assert_eq!(s.corrections.hqd_ambiguous, 0);
    assert_eq!(s.gpu(OTHER_GPU), None, "not in the topology");
    assert_eq!(s.hqds_ns, Some(4 * SEC));
}

#[test]
fn the_same_ring_va_in_two_processes_is_told_apart() {
    let ring = 0x7f00_0011_0000;
    // B's queue: same ring VA, other pointers.
    let a = args(0, ring);
    let b = CreateQueueArgs {
        read_pointer_address: 0x7f00_0020_0080,
        write_pointer_address: 0x7f00_0020_0038,
        ..args(0, ring)
    };
    let mut s = State::new();
    s.apply(create_with(A, SEC, a));
    s.apply(create_with(B, SEC, b));
    s.apply(hqds(
        2 * SEC,
        GPU,
        vec![slot(0, 0, regs_of(&b, 2)), slot(1, 0, regs_of(&a, 1))],
    ));
    assert_eq!(q(&s, A, 0).hqd, Some(hqd_id(1, 0)));
    assert_eq!(q(&s, B, 0).hqd, Some(hqd_id(0, 0)));
    assert_eq!(s.corrections.hqd_ambiguous, 0);

    // Same ring and pointers, another doorbell (B's queue is its second one).
    let b = args(1, ring);
    let mut s = State::new();
    s.apply(create_with(A, SEC, a));
    s.apply(create_with(B, SEC, b));
    s.apply(hqds(
        2 * SEC,
        GPU,
        vec![slot(0, 0, regs_of(&a, 1)), slot(2, 3, regs_of(&b, 2))],
    ));
    assert_eq!(q(&s, A, 0).hqd, Some(hqd_id(0, 0)));
    assert_eq!(q(&s, B, 1).hqd, Some(hqd_id(2, 3)));
    assert_eq!(s.corrections.hqd_ambiguous, 0);
}

#[test]
fn identical_candidates_get_no_slot() {
    let a = args(0, 0x11_0000);
    let mut s = State::new();
    s.apply(create_with(A, SEC, a));
    s.apply(create_with(B, SEC, a));
    s.apply(hqds(2 * SEC, GPU, vec![slot(0, 0, regs_of(&a, 1))]));
    assert_eq!(q(&s, A, 0).hqd, None);
    assert_eq!(q(&s, B, 0).hqd, None);
    assert_eq!(s.corrections.hqd_ambiguous, 1);
    // Per slot and per read.
    s.apply(hqds(
        3 * SEC,
        GPU,
        vec![slot(0, 0, regs_of(&a, 1)), slot(0, 1, regs_of(&a, 2))],
    ));
    assert_eq!(s.corrections.hqd_ambiguous, 3);
    assert_eq!(q(&s, A, 0).hqd, None);
    // Once one of them is destroyed, the other is the only candidate.
    s.apply(destroy(B, 0, 4 * SEC));
    s.apply(hqds(5 * SEC, GPU, vec![slot(0, 0, regs_of(&a, 1))]));
    assert_eq!(q(&s, A, 0).hqd, Some(hqd_id(0, 0)));
    assert_eq!(q(&s, B, 0).hqd, None);
    assert_eq!(s.corrections.hqd_ambiguous, 3);
}

// ---------------------------------------------------------------------------------------------
// mqds

fn mqd(gpu_id: u32, a: &CreateQueueArgs, slice: u64) -> MqdQueue {
    let mut regs = regs_of(a, slice);
    regs.0[reg::QUEUE_PRIORITY] = a.queue_priority;
    MqdQueue {
        gpu_id,
        kind: MqdKind::Compute,
        regs,
    }
}

#[test]
fn mqds_fill_in_queues_known_only_from_sysfs() {
    let (a0, a1, a2) = (
        args(0, 0x11_0000),
        CreateQueueArgs {
            queue_priority: 3,
            // A PM4 queue: its pointers are not 0x48 apart.
            read_pointer_address: 0x55_0000,
            write_pointer_address: 0x56_0000,
            ..args(1, 0x21_0000)
        },
        args(2, 0x31_0000),
    );
    let mut s = State::new();
    // Queue 2's create was seen; 0 and 1 are from sysfs (0 with no size).
    s.apply(create_with(A, SEC, a2));
    s.apply(snapshot(
        SEC,
        vec![(
            A,
            vec![
                sysq(0, 0, 0),
                sysq(1, 0, 0x8000),
                sysq(2, 0, 0x1_0000),
                sysq(3, 1, 4096),
            ],
        )],
    ));
    // Newest first; an SDMA descriptor and the known queue's descriptor are set aside.
    s.apply(Update::Mqds(vec![MqdProcess {
        pid: A,
        queues: vec![
            MqdQueue {
                gpu_id: GPU,
                kind: MqdKind::Sdma,
                regs: Regs::default(),
            },
            mqd(GPU, &a2, 1),
            mqd(GPU, &a1, 1),
            mqd(GPU, &a0, 1),
        ],
    }]));
    let q0 = q(&s, A, 0);
    assert_eq!(q0.ring_base_address, Some(0x11_0000));
    assert_eq!(q0.read_pointer_address, Some(a0.read_pointer_address));
    assert_eq!(q0.write_pointer_address, Some(a0.write_pointer_address));
    assert_eq!(q0.doorbell_offset, Some(a0.doorbell_offset));
    assert_eq!(q0.priority, Some(7));
    assert_eq!(q0.ring_size, 0x1_0000, "from CP_HQD_PQ_CONTROL");
    assert_eq!(q0.kind, QueueKind::ComputeAql, "rptr - wptr = 0x48");
    assert!(q0.pointers_from_mqds);
    assert_eq!(q0.source, Source::Sysfs);
    let q1 = q(&s, A, 1);
    assert_eq!(q1.ring_base_address, Some(0x21_0000));
    assert_eq!(q1.read_pointer_address, Some(0x55_0000));
    assert_eq!(q1.doorbell_offset, Some(a1.doorbell_offset));
    assert_eq!(q1.priority, Some(3));
    assert_eq!(q1.ring_size, 0x8000, "sysfs size kept");
    assert_eq!(q1.kind, QueueKind::Compute);
    assert!(q1.pointers_from_mqds);
    let q2 = q(&s, A, 2);
    assert!(!q2.pointers_from_mqds);
    assert_eq!(q2.source, Source::Event);
    assert_eq!(q(&s, A, 3).ring_base_address, None, "SDMA");

    // Now the HQD slots of the filled-in queues are found.
    s.apply(hqds(
        2 * SEC,
        GPU,
        vec![slot(0, 0, regs_of(&a1, 1)), slot(1, 0, regs_of(&a0, 1))],
    ));
    assert_eq!(q(&s, A, 0).hqd, Some(hqd_id(1, 0)));
    assert_eq!(q(&s, A, 1).hqd, Some(hqd_id(0, 0)));
}

#[test]
fn mqds_are_not_matched_when_the_counts_disagree() {
    let mut s = State::new();
    s.apply(snapshot(
        SEC,
        vec![(A, vec![sysq(0, 0, 0x1_0000), sysq(1, 0, 0x1_0000)])],
    ));
    s.apply(Update::Mqds(vec![
        MqdProcess {
            pid: A,
            queues: vec![mqd(GPU, &args(0, 0x11_0000), 1)],
        },
        // An unknown process is skipped.
        MqdProcess {
            pid: 999,
            queues: vec![mqd(GPU, &args(0, 0x11_0000), 2)],
        },
    ]));
    for qid in [0, 1] {
        assert_eq!(q(&s, A, qid).ring_base_address, None);
        assert!(!q(&s, A, qid).pointers_from_mqds);
        assert_eq!(q(&s, A, qid).kind, QueueKind::Compute);
    }
    assert!(!s.procs.contains_key(&999));
    // Per GPU: a descriptor of another GPU does not count.
    s.apply(Update::Mqds(vec![MqdProcess {
        pid: A,
        queues: vec![
            mqd(OTHER_GPU, &args(1, 0x21_0000), 1),
            mqd(GPU, &args(0, 0x11_0000), 1),
        ],
    }]));
    assert_eq!(q(&s, A, 0).ring_base_address, None);
}

// ---------------------------------------------------------------------------------------------
// Samples

#[test]
fn samples_give_rate_backlog_and_busy() {
    let mut s = State::new();
    s.apply(create(A, 0, SEC, 0x11_0000));
    s.apply(create(A, 1, SEC, 0x21_0000));
    let sample = |s: &mut State, ts: u64, read: u64, write: u64| {
        s.apply(Update::Samples {
            ts_ns: ts,
            samples: vec![(
                A,
                0,
                SampleRead::Ids {
                    read,
                    write,
                    packets: vec![],
                },
            )],
        })
    };
    sample(&mut s, 2 * SEC, 10, 15);
    assert_eq!(
        q(&s, A, 0).activity,
        Activity {
            status: SampleStatus::Valid,
            read_dispatch_id: Some(10),
            write_dispatch_id: Some(15),
            dispatches_per_s: None,
            backlog: Some(5),
            busy: Some(true),
            sample_ns: 2 * SEC,
            ..Default::default()
        }
    );
    assert_eq!(s.now_ns, 2 * SEC);
    // 10 packets consumed in half a second.
    sample(&mut s, 2 * SEC + SEC / 2, 20, 20);
    let a = &q(&s, A, 0).activity;
    assert_eq!(a.dispatches_per_s, Some(20.0));
    assert_eq!(a.backlog, Some(0));
    assert_eq!(a.busy, Some(true), "it consumed work");
    assert_eq!(a.sample_ns, 2 * SEC + SEC / 2);
    // Nothing moved: idle.
    sample(&mut s, 3 * SEC, 20, 20);
    let a = &q(&s, A, 0).activity;
    assert_eq!(a.dispatches_per_s, Some(0.0));
    assert_eq!(a.busy, Some(false));
    // Only written: busy, backlog.
    sample(&mut s, 4 * SEC, 20, 23);
    let a = &q(&s, A, 0).activity;
    assert_eq!(a.dispatches_per_s, Some(0.0));
    assert_eq!((a.backlog, a.busy), (Some(3), Some(true)));
    // A stuck queue with a backlog is busy even when nothing moves.
    sample(&mut s, 5 * SEC, 20, 23);
    assert_eq!(q(&s, A, 0).activity.busy, Some(true));
    // 3 packets in 3 seconds: 1/s.
    sample(&mut s, 8 * SEC, 23, 23);
    assert_eq!(q(&s, A, 0).activity.dispatches_per_s, Some(1.0));
    // The read index went back (a new ring): no rate this time.
    sample(&mut s, 9 * SEC, 2, 4);
    let a = &q(&s, A, 0).activity;
    assert_eq!(a.dispatches_per_s, None);
    assert_eq!((a.backlog, a.busy), (Some(2), Some(true)));
    // No time passed: no rate.
    sample(&mut s, 9 * SEC, 3, 4);
    assert_eq!(q(&s, A, 0).activity.dispatches_per_s, None);
    assert_eq!(q(&s, A, 0).activity.read_dispatch_id, Some(3));

    // Unreadable: the status changes, the last ids stay for the next rate.
    s.apply(Update::Samples {
        ts_ns: 10 * SEC,
        samples: vec![(A, 0, SampleRead::Unreadable("EFAULT".into()))],
    });
    let a = &q(&s, A, 0).activity;
    assert_eq!(a.status, SampleStatus::Unreadable("EFAULT".into()));
    assert_eq!(a.read_dispatch_id, Some(3));
    assert_eq!(a.sample_ns, 9 * SEC);
    sample(&mut s, 11 * SEC, 7, 7);
    let a = &q(&s, A, 0).activity;
    assert_eq!(a.status, SampleStatus::Valid);
    assert_eq!(a.dispatches_per_s, Some(2.0), "4 packets over 2 s");

    // Invalid: everything else is cleared. Unknown queues are skipped.
    s.apply(Update::Samples {
        ts_ns: 12 * SEC,
        samples: vec![
            (A, 0, SampleRead::Invalid("not an amd_queue_t".into())),
            (
                A,
                9,
                SampleRead::Ids {
                    read: 1,
                    write: 1,
                    packets: vec![],
                },
            ),
            (
                999,
                0,
                SampleRead::Ids {
                    read: 1,
                    write: 1,
                    packets: vec![],
                },
            ),
        ],
    });
    assert_eq!(
        q(&s, A, 0).activity,
        Activity {
            status: SampleStatus::Invalid("not an amd_queue_t".into()),
            ..Default::default()
        }
    );
    assert_eq!(q(&s, A, 1).activity, Activity::default());
    assert!(s.queue(A, 9).is_none() && !s.procs.contains_key(&999));
    assert_eq!(s.now_ns, 12 * SEC);
}

// ---------------------------------------------------------------------------------------------
// Log

#[test]
fn the_log_is_capped() {
    let mut s = State::new();
    s.apply(create(A, 0, 0, 0x11_0000));
    for i in 1..=LOG_CAP as u64 + 10 {
        s.apply(Update::Evicted { ts_ns: i, pid: A });
    }
    assert_eq!(s.log.len(), LOG_CAP);
    // The create and the first 10 evictions were dropped, oldest first.
    assert_eq!(s.log.front().unwrap().ts_ns, 11);
    assert_eq!(s.log.front().unwrap().kind, LogKind::Evict);
    assert_eq!(s.log.back().unwrap().ts_ns, LOG_CAP as u64 + 10);
}

// ---------------------------------------------------------------------------------------------
// End to end with the emulator's own files

/// A's and B's queues: B's second queue has A's first queue's ring VA and pointers (another
/// doorbell); C has one queue of its own.
fn world() -> World {
    let mut w = World::new();
    assert_eq!(w.process(A, true, 2), vec![0, 1]);
    w.process(B, true, 0);
    assert_eq!(w.queue(B, 0x50_0000, 3), 0);
    assert_eq!(w.queue(B, 0x10_0000, 12), 1);
    w.process(102, false, 0);
    assert_eq!(w.queue(102, 0x90_0000, 15), 0);
    w
}

fn all_queues(w: &World) -> Vec<(u32, u32)> {
    w.kfd
        .procs
        .values()
        .flat_map(|p| p.queues.keys().map(move |&q| (p.pid, q)))
        .collect()
}

/// The topology node as sysfs shows it.
fn world_node(w: &World) -> GpuNode {
    parse_node(
        1,
        &views::node_gpu_id(&w.kfd, 1).unwrap(),
        &views::node_name(&w.kfd, 1).unwrap(),
        &views::node_properties(&w.kfd, 1).unwrap(),
    )
    .unwrap()
    .unwrap()
}

/// The CREATE_QUEUE event the kernel would have reported for the emulator's queue.
fn create_from_world(w: &World, pid: u32, qid: u32, ts: u64) -> Update {
    let q = w.kfd.queue((pid, qid)).unwrap();
    // kfd_ioctl_create_queue: the doorbell's byte offset in the process's slice.
    let in_slice = (u64::from(q.doorbell_off) * 4) & (DOORBELL_PROCESS_SLICE_BYTES - 1);
    assert_eq!(in_slice, u64::from(q.doorbell_id) * 8);
    create_with(
        pid,
        ts,
        CreateQueueArgs {
            ring_base_address: q.ring_base,
            write_pointer_address: q.wptr_addr,
            read_pointer_address: q.rptr_addr,
            ring_size: q.ring_size,
            gpu_id: q.gpu_id,
            queue_type: q.ioc_type,
            queue_percentage: q.percent,
            queue_priority: q.priority,
            queue_id: q.id,
            doorbell_offset: kfd::doorbell_mmap_offset(q.gpu_id, in_slice),
            ..Default::default()
        },
    )
}

/// Where the emulator mapped each queue.
fn emulator_slots(w: &World) -> BTreeMap<(u32, u32), HqdId> {
    let g = &w.kfd.gpus[0];
    g.slots
        .iter()
        .enumerate()
        .filter_map(|(i, k)| {
            let (pipe, queue) = g.pipe_queue(i);
            Some(((*k)?, hqd_id(pipe, queue)))
        })
        .collect()
}

fn model_slots(s: &State) -> BTreeMap<(u32, u32), HqdId> {
    s.procs
        .values()
        .flat_map(|p| p.live_queues().map(move |q| ((p.pid, q.queue_id), q.hqd)))
        .filter_map(|(k, h)| Some((k, h?)))
        .collect()
}

fn read_hqds(w: &World, taken_ns: u64) -> Update {
    Update::Hqds {
        taken_ns,
        nodes: parse_hqds(&views::hqds(&w.kfd)).unwrap(),
    }
}

#[test]
fn emulator_hqds_match_queues_known_from_events() {
    let w = world();
    let keys = all_queues(&w);
    assert_eq!(keys.len(), 5);
    let slots = emulator_slots(&w);
    assert_eq!(
        slots.keys().copied().collect::<Vec<_>>(),
        keys,
        "every queue is mapped"
    );
    assert_eq!(
        slots
            .values()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        5
    );

    let mut s = State::new();
    let node = world_node(&w);
    assert_eq!(node.gpu_id, w.gpu);
    s.apply(Update::Topology(vec![node]));
    assert_eq!(s.gpu(w.gpu).unwrap().hqds_total, 32);
    for (i, &(pid, qid)) in keys.iter().enumerate() {
        s.apply(create_from_world(&w, pid, qid, SEC + i as u64));
    }
    assert_eq!(q(&s, B, 1).ring_base_address, q(&s, A, 0).ring_base_address);
    assert_eq!(
        q(&s, B, 1).read_pointer_address,
        q(&s, A, 0).read_pointer_address
    );
    s.apply(read_hqds(&w, 2 * SEC));
    assert_eq!(model_slots(&s), slots);
    assert_eq!(s.corrections.hqd_ambiguous, 0);
    let g = s.gpu(w.gpu).unwrap();
    assert_eq!(g.hqds_used, Some(5));
    assert_eq!(g.hqds_total, 32, "hqds agrees with the topology");
    assert!(!g.stopped);
}

#[test]
fn emulator_sysfs_and_mqds_alone_give_the_same_slots() {
    let w = world();
    let slots = emulator_slots(&w);

    // (a) from events, for comparison.
    let mut from_events = State::new();
    for (i, &(pid, qid)) in all_queues(&w).iter().enumerate() {
        from_events.apply(create_from_world(&w, pid, qid, SEC + i as u64));
    }
    from_events.apply(read_hqds(&w, 3 * SEC));

    // (b) the tool started late: sysfs, then mqds.
    let mut s = State::new();
    s.apply(Update::Topology(vec![world_node(&w)]));
    let procs = w
        .kfd
        .procs
        .values()
        .map(|p| SysProc {
            pid: p.pid,
            queues: p
                .queues
                .values()
                .map(|q| SysQueue {
                    queue_id: q.id,
                    gpu_id: views::queue_gpuid(q).parse().unwrap(),
                    kind: views::queue_type(q).parse().unwrap(),
                    size: views::queue_size(q).parse().unwrap(),
                })
                .collect(),
        })
        .collect();
    s.apply(Update::Procs(ProcSnapshot {
        taken_ns: 2 * SEC,
        procs,
    }));
    assert_eq!(s.corrections.queues_found, 5);
    for &(pid, qid) in &all_queues(&w) {
        let sq = q(&s, pid, qid);
        assert_eq!(sq.kind, QueueKind::Compute, "sysfs type 0");
        assert_eq!(sq.ring_size, 0x1_0000);
        assert_eq!(sq.ring_base_address, None);
    }
    s.apply(Update::Mqds(parse_mqds(&views::mqds(&w.kfd)).unwrap()));
    for &(pid, qid) in &all_queues(&w) {
        let wq = w.kfd.queue((pid, qid)).unwrap();
        let (sq, eq) = (q(&s, pid, qid), q(&from_events, pid, qid));
        let at = format!("{pid}/{qid}");
        assert_eq!(sq.ring_base_address, Some(wq.ring_base), "{at}");
        assert_eq!(sq.read_pointer_address, Some(wq.rptr_addr), "{at}");
        assert_eq!(sq.write_pointer_address, Some(wq.wptr_addr), "{at}");
        assert_eq!(sq.ring_base_address, eq.ring_base_address, "{at}");
        assert_eq!(sq.read_pointer_address, eq.read_pointer_address, "{at}");
        assert_eq!(sq.write_pointer_address, eq.write_pointer_address, "{at}");
        assert_eq!(sq.doorbell_offset, eq.doorbell_offset, "{at}");
        assert_eq!(sq.priority, Some(wq.priority), "{at}");
        assert_eq!(sq.kind, QueueKind::ComputeAql, "{at}");
        assert!(sq.pointers_from_mqds, "{at}");
        assert_eq!(sq.source, Source::Sysfs, "{at}");
        assert_eq!(sq.created_ns, None, "{at}");
    }
    s.apply(read_hqds(&w, 3 * SEC));
    assert_eq!(model_slots(&s), slots);
    assert_eq!(model_slots(&from_events), slots);
    assert_eq!(s.corrections.hqd_ambiguous, 0);
    assert_eq!(s.gpu(w.gpu).unwrap().hqds_used, Some(5));
}

#[test]
fn emulator_truly_identical_queues_stay_unassigned() {
    // Two processes whose only queues have the same VAs and doorbell id.
    let mut w = World::new();
    w.process(A, true, 1);
    w.process(B, true, 1);
    let mut s = State::new();
    s.apply(create_from_world(&w, A, 0, SEC));
    s.apply(create_from_world(&w, B, 0, SEC));
    assert_eq!(emulator_slots(&w).len(), 2);
    s.apply(read_hqds(&w, 2 * SEC));
    assert_eq!(model_slots(&s), BTreeMap::new());
    assert_eq!(s.corrections.hqd_ambiguous, 2, "one per slot");
}

#[test]
fn emulator_suspend_unmaps_and_debugger_exit_remaps() {
    use gpreempt_sim::model::tests::{DEBUGGER as SIM_DEBUGGER, TARGET};
    let new = ec_mask(ec::QUEUE_NEW);
    let mut w = World::new();
    let ids = w.process(TARGET, true, 1);
    w.process(SIM_DEBUGGER, false, 0);
    w.process(B, true, 0);
    w.queue(B, 0x70_0000, 9);
    w.host.tracer.insert(TARGET, SIM_DEBUGGER);
    assert_eq!(w.enable(SIM_DEBUGGER, TARGET, new), 0);
    w.dbg(
        SIM_DEBUGGER,
        TARGET,
        DbgTrapQueryDebugEventArgs {
            exception_mask: new,
            ..Default::default()
        },
    );

    let mut s = State::new();
    s.apply(create_from_world(&w, TARGET, 0, SEC));
    s.apply(create_from_world(&w, B, 0, SEC));
    s.apply(enable(SIM_DEBUGGER, TARGET, 2 * SEC));
    s.apply(read_hqds(&w, 2 * SEC));
    assert_eq!(model_slots(&s), emulator_slots(&w));
    assert_eq!(model_slots(&s).len(), 2);

    let (r, out) = w.suspend(SIM_DEBUGGER, TARGET, &ids, 0);
    assert_eq!(r, 1);
    assert!(!w.mapped(TARGET, 0));
    // What watch/events.rs passes on: the ids without status bits.
    let done: Vec<u32> = out
        .into_iter()
        .filter(|id| id & (kfd::KFD_DBG_QUEUE_ERROR_MASK | kfd::KFD_DBG_QUEUE_INVALID_MASK) == 0)
        .collect();
    s.apply(suspended(SIM_DEBUGGER, TARGET, 3 * SEC, Some(&done)));
    s.apply(read_hqds(&w, 3 * SEC));
    assert_eq!(q(&s, TARGET, 0).state, QueueState::Suspended);
    assert_eq!(q(&s, TARGET, 0).hqd, None);
    assert_eq!(model_slots(&s), emulator_slots(&w));
    assert_eq!(s.gpu(w.gpu), None);

    w.kfd.process_exit(SIM_DEBUGGER, 4 * SEC);
    assert!(w.mapped(TARGET, 0));
    s.apply(exit(SIM_DEBUGGER, 4 * SEC));
    s.apply(read_hqds(&w, 4 * SEC));
    assert_eq!(q(&s, TARGET, 0).state, QueueState::Active);
    assert_eq!(model_slots(&s), emulator_slots(&w));
    assert_eq!(model_slots(&s).len(), 2);

    // A destroy: the emulator unmaps it, the model forgets its slot at once.
    let (r, _) = w.call(
        B,
        nr::DESTROY_QUEUE,
        &DestroyQueueArgs {
            queue_id: 0,
            pad: 0,
        },
    );
    assert_eq!(r, 0);
    s.apply(destroy(B, 0, 5 * SEC));
    assert_eq!(q(&s, B, 0).hqd, None);
    s.apply(read_hqds(&w, 5 * SEC));
    assert_eq!(model_slots(&s), emulator_slots(&w));
    assert_eq!(model_slots(&s).len(), 1);
}

/// A debugger whose ENABLE predates the tool is learnt from its suspend, so its exit still
/// resumes the queues (the kernel disables the trap when the debugger's mm goes away).
#[test]
fn a_suspend_names_an_unknown_debugger_and_its_exit_resumes() {
    let mut s = State::new();
    s.apply(create(A, 0, SEC, 0x10_0000));
    assert_eq!(proc_(&s, A).debugger, None);
    s.apply(suspended(DEBUGGER, A, 2 * SEC, Some(&[0])));
    assert_eq!(proc_(&s, A).debugger, Some(DEBUGGER));
    assert_eq!(states(&s, A), vec![(0, QueueState::Suspended)]);
    s.apply(exit(DEBUGGER, 3 * SEC));
    assert_eq!(states(&s, A), vec![(0, QueueState::Active)]);
    assert_eq!(proc_(&s, A).debugger, None);
}

pub(crate) mod nvidia {
    use super::*;
    use crate::observe::events::{NvCall, NvEvent, Origin};
    use gpreempt_common::nv::{self as abi, class};

    const PID: u32 = 440;
    const CLIENT: u32 = 0xc1d0_001c;

    /// A successful RM escape of `pid` on fd 8 (test builder shared with the NVIDIA controller's
    /// tests).
    pub(crate) fn rm_event(ts: u64, pid: u32, call: NvCall) -> Update {
        Update::Event(Event::Nv(NvEvent {
            origin: Origin {
                ts_ns: ts,
                pid,
                tid: pid,
                comm: "python3".into(),
            },
            fd: 8,
            cmd: abi::iowr(abi::nr::RM_ALLOC, 48),
            ret: 0,
            duration_ns: 1000,
            call,
            verified: true,
        }))
    }

    /// RM_ALLOC of `new` (`h_class`) under `parent` in `client`; `params_head` is a TSG's
    /// engineType, else the first word of the alloc params (a device's index).
    pub(crate) fn rm_alloc(
        ts: u64,
        pid: u32,
        client: u32,
        parent: u32,
        new: u32,
        h_class: u32,
        params_head: u32,
    ) -> Update {
        let mut p = [0u8; abi::ALLOC_HEAD_LEN];
        let at = if h_class == class::KEPLER_CHANNEL_GROUP_A {
            abi::TSG_ENGINE_TYPE_AT
        } else {
            0
        };
        p[at..at + 4].copy_from_slice(&params_head.to_le_bytes());
        rm_event(
            ts,
            pid,
            NvCall::Alloc {
                h_root: client,
                h_object_parent: parent,
                h_object_new: new,
                h_class,
                params_size: 0,
                status: 0,
                nvos64: true,
                alloc_params: Some(p),
                alloc_params_len: abi::PARAMS_HEAD_LEN,
            },
        )
    }

    /// RM_ALLOC of a Hopper channel `new` under TSG `tsg`, its whole alloc-params head read:
    /// the ring at `gpfifo_va` (`entries`) and the USERD at `userd_offset` of memory `h_mem`.
    pub(crate) fn rm_channel(
        ts: u64,
        pid: u32,
        client: u32,
        tsg: u32,
        new: u32,
        ring: (u64, u32, u32, u64),
    ) -> Update {
        use abi::channel as c;
        let (gpfifo_va, entries, h_mem, userd_offset) = ring;
        let mut p = [0u8; abi::ALLOC_HEAD_LEN];
        p[c::H_OBJECT_BUFFER..][..4].copy_from_slice(&h_mem.to_le_bytes());
        p[c::GPFIFO_OFFSET..][..8].copy_from_slice(&gpfifo_va.to_le_bytes());
        p[c::GPFIFO_ENTRIES..][..4].copy_from_slice(&entries.to_le_bytes());
        p[c::H_USERD_MEMORY..][..4].copy_from_slice(&h_mem.to_le_bytes());
        p[c::USERD_OFFSET..][..8].copy_from_slice(&userd_offset.to_le_bytes());
        rm_event(
            ts,
            pid,
            NvCall::Alloc {
                h_root: client,
                h_object_parent: tsg,
                h_object_new: new,
                h_class: class::HOPPER_CHANNEL_GPFIFO_A,
                params_size: 0,
                status: 0,
                nvos64: true,
                alloc_params: Some(p),
                alloc_params_len: abi::ALLOC_HEAD_LEN,
            },
        )
    }

    fn alloc(ts: u64, parent: u32, new: u32, h_class: u32, params_head: u32) -> Update {
        rm_alloc(ts, PID, CLIENT, parent, new, h_class, params_head)
    }

    fn nv(ts: u64, call: NvCall) -> Update {
        rm_event(ts, PID, call)
    }

    fn free(ts: u64, parent: u32, old: u32) -> Update {
        nv(
            ts,
            NvCall::Free {
                h_root: CLIENT,
                h_object_parent: parent,
                h_object_old: old,
                status: 0,
            },
        )
    }

    #[test]
    fn tsgs_and_channels_of_a_pytorch_like_process_become_queues() {
        let mut s = State::new();
        s.apply(alloc(1, CLIENT, CLIENT, class::NV01_ROOT_CLIENT, 0));
        s.apply(alloc(2, CLIENT, 0x5c00_0001, class::NV01_DEVICE_0, 0));
        s.apply(alloc(
            3,
            0x5c00_0001,
            0x5c00_0002,
            class::NV20_SUBDEVICE_0,
            0,
        ));
        s.apply(alloc(
            4,
            0x5c00_0001,
            0x5c00_0015,
            class::KEPLER_CHANNEL_GROUP_A,
            1,
        ));
        for (i, ch) in [0x5c00_001c, 0x5c00_0022].into_iter().enumerate() {
            s.apply(alloc(
                5 + i as u64,
                0x5c00_0015,
                ch,
                class::HOPPER_CHANNEL_GPFIFO_A,
                0,
            ));
        }
        s.apply(alloc(
            8,
            0x5c00_0001,
            0x5c00_003e,
            class::KEPLER_CHANNEL_GROUP_A,
            0xb,
        ));
        s.apply(alloc(
            9,
            0x5c00_003e,
            0x5c00_0040,
            class::HOPPER_CHANNEL_GPFIFO_A,
            0,
        ));
        let p = proc_(&s, PID);
        let gr = &p.queues[&0x5c00_0015];
        assert_eq!(gr.kind, QueueKind::NvCompute);
        assert!(gr.kind.is_compute());
        let t = gr.nv.as_ref().unwrap();
        assert_eq!(
            (t.h_client, t.fd, t.h_subdevice, t.engine_type),
            (CLIENT, 8, Some(0x5c00_0002), 1)
        );
        assert_eq!(t.channels, vec![0x5c00_001c, 0x5c00_0022]);
        let ce = &p.queues[&0x5c00_003e];
        assert_eq!(ce.kind, QueueKind::NvCopy);
        assert_eq!(ce.nv.as_ref().unwrap().channels, vec![0x5c00_0040]);

        // KFD's sysfs knows nothing of them: reconciliation leaves them alone.
        s.apply(Update::Procs(ProcSnapshot {
            taken_ns: 100,
            procs: vec![],
        }));
        assert_eq!(proc_(&s, PID).live_queues().count(), 2);

        // A channel freed, then the copy TSG, then the whole client.
        s.apply(free(101, 0x5c00_0015, 0x5c00_0022));
        assert_eq!(
            proc_(&s, PID).queues[&0x5c00_0015]
                .nv
                .as_ref()
                .unwrap()
                .channels,
            vec![0x5c00_001c]
        );
        s.apply(free(102, 0x5c00_0001, 0x5c00_003e));
        assert!(!proc_(&s, PID).queues[&0x5c00_003e].alive());
        s.apply(free(103, CLIENT, CLIENT));
        assert_eq!(proc_(&s, PID).live_queues().count(), 0);
    }

    /// libcuda makes a device and subdevice per GPU the RM shows it (4 on a 4-GPU host, with
    /// CUDA_VISIBLE_DEVICES=2 too): a TSG is paused through its own device's subdevice.
    #[test]
    fn a_tsg_gets_the_subdevice_of_its_own_device() {
        let mut s = State::new();
        s.apply(alloc(1, 0, CLIENT, class::NV01_ROOT_CLIENT, 0));
        for (i, (dev, sub)) in [(0x5c00_0001, 0x5c00_0003), (0x5c00_0010, 0x5c00_0012)]
            .into_iter()
            .enumerate()
        {
            s.apply(alloc(2, CLIENT, dev, class::NV01_DEVICE_0, i as u32));
            s.apply(alloc(3, dev, sub, class::NV20_SUBDEVICE_0, 0));
        }
        s.apply(alloc(
            4,
            0x5c00_0010,
            0x5c00_0015,
            class::KEPLER_CHANNEL_GROUP_A,
            1,
        ));
        let q = &proc_(&s, PID).queues[&0x5c00_0015];
        assert_eq!(q.nv.as_ref().unwrap().h_subdevice, Some(0x5c00_0012));
        assert_eq!(q.gpu_id, 1);
    }

    /// The pair on nvidia_unlocked_ioctl names the fd where the client is made (the file is
    /// what it sees): later events without one keep it, and a TSG carries it for the pause.
    #[test]
    fn a_client_keeps_its_fd_when_later_events_name_none() {
        let mut s = State::new();
        let no_fd = |mut u: Update| {
            if let Update::Event(Event::Nv(n)) = &mut u {
                n.fd = -1;
            }
            u
        };
        s.apply(alloc(1, 0, CLIENT, class::NV01_ROOT_CLIENT, 0)); // fd 8
        s.apply(no_fd(alloc(
            2,
            CLIENT,
            0x5c00_0001,
            class::NV01_DEVICE_0,
            0,
        )));
        s.apply(no_fd(alloc(
            3,
            0x5c00_0001,
            0x5c00_0002,
            class::NV20_SUBDEVICE_0,
            0,
        )));
        s.apply(no_fd(alloc(
            4,
            0x5c00_0001,
            0x5c00_0015,
            class::KEPLER_CHANNEL_GROUP_A,
            1,
        )));
        let t = proc_(&s, PID).queues[&0x5c00_0015].nv.clone().unwrap();
        assert_eq!(t.fd, 8);
        // A client first seen without its creation has no fd to act through.
        s.apply(no_fd(rm_alloc(
            5,
            PID,
            0xc1d0_0099,
            0xc1d0_0099,
            0x10,
            class::NV01_DEVICE_0,
            0,
        )));
        s.apply(no_fd(rm_alloc(
            6,
            PID,
            0xc1d0_0099,
            0x10,
            0x20,
            class::KEPLER_CHANNEL_GROUP_A,
            1,
        )));
        assert_eq!(proc_(&s, PID).queues[&0x20].nv.as_ref().unwrap().fd, -1);
    }
    #[test]
    fn failed_rm_calls_change_nothing() {
        let mut s = State::new();
        let Update::Event(Event::Nv(mut ev)) = alloc(
            1,
            0x5c00_0001,
            0x5c00_0015,
            class::KEPLER_CHANNEL_GROUP_A,
            1,
        ) else {
            unreachable!()
        };
        if let NvCall::Alloc { status, .. } = &mut ev.call {
            *status = abi::status::INVALID_CLIENT;
        }
        s.apply(Update::Event(Event::Nv(ev)));
        assert!(!s.procs.contains_key(&PID));
    }
}

/// Wait records time requests and never read as launches (the policy's trigger); a grown drop
/// count in a wait record discards the open request instead of guessing its end.
#[test]
fn waits_time_requests_and_a_drop_discards_the_open_one() {
    use gpreempt_common::kprobe::launch;
    let mut p = Process::new(100, Source::Event, 0);
    const MS: u64 = 1_000_000;
    p.launch_or_wait(10 * MS, 1, launch::HIP_LAUNCH_KERNEL, 0);
    p.launch_or_wait(11 * MS, 1, launch::WAIT_ENTER, 5);
    p.launch_or_wait(16 * MS, 1, launch::WAIT_RETURN, 5);
    assert_eq!(p.last_launch_ns, Some(10 * MS), "a wait is no launch");
    assert_eq!(p.launches, 1);
    // Another request whose records were partly dropped in the kernel (5 -> 7).
    p.launch_or_wait(100 * MS, 1, launch::HIP_LAUNCH_KERNEL, 0);
    p.launch_or_wait(101 * MS, 1, launch::WAIT_ENTER, 5);
    p.launch_or_wait(130 * MS, 1, launch::WAIT_RETURN, 7);
    // A third, whole.
    p.launch_or_wait(200 * MS, 1, launch::HIP_LAUNCH_KERNEL, 0);
    p.launch_or_wait(201 * MS, 1, launch::WAIT_ENTER, 7);
    p.launch_or_wait(209 * MS, 1, launch::WAIT_RETURN, 7);
    p.requests.tick(300 * MS);
    assert_eq!(p.requests.take_closed(), vec![6 * MS, 9 * MS]);
}

/// A held process that debug-traps itself (amdkfd allows it without ptrace) leaves a record of
/// each call that can undo the hold, for `run` to answer: its own RESUME_QUEUES, DISABLE and
/// ENABLE, and a DISABLE by a third process. The debugger's own calls, failed calls and calls
/// that hold nothing (a self SUSPEND) leave none.
#[test]
fn calls_that_undo_a_debuggers_hold_are_kept_for_the_controller() {
    let mut s = State::default();
    s.apply(enable(DEBUGGER, A, SEC));
    // A first ENABLE is a third process's to the model (the controller knows its own pid).
    let first = s.take_debug_calls();
    assert_eq!(
        first.iter().map(|c| (c.caller, c.op)).collect::<Vec<_>>(),
        vec![(DEBUGGER, DebugOp::Enable)]
    );
    s.apply(suspended(DEBUGGER, A, 2 * SEC, Some(&[0])));
    s.apply(dbg(
        DEBUGGER,
        2 * SEC,
        0,
        DbgTrapArgs::new(A, kfd::DbgTrapResumeQueuesArgs::default()),
    ));
    assert_eq!(s.take_debug_calls(), vec![], "the debugger's own calls");
    let resume = DbgTrapArgs::new(A, kfd::DbgTrapResumeQueuesArgs::default());
    s.apply(dbg(A, 3 * SEC, 0, resume));
    s.apply(dbg(A, 3 * SEC, -1, resume)); // failed: nothing happened
    s.apply(dbg(
        A,
        3 * SEC,
        0,
        DbgTrapArgs::new(A, kfd::DbgTrapSuspendQueuesArgs::default()),
    ));
    s.apply(disable(A, A, 4 * SEC));
    s.apply(enable(A, A, 5 * SEC));
    s.apply(disable(300, A, 6 * SEC));
    let calls = s.take_debug_calls();
    let seen: Vec<_> = calls
        .iter()
        .map(|c| (c.caller, c.target, c.op, c.debugger))
        .collect();
    assert_eq!(
        seen,
        vec![
            (A, A, DebugOp::Resume, Some(DEBUGGER)),
            (A, A, DebugOp::Disable, Some(DEBUGGER)),
            (A, A, DebugOp::Enable, None),
            (300, A, DebugOp::Disable, Some(A)),
        ]
    );
    assert_eq!(calls[0].ts_ns, 3 * SEC);
    assert!(s.take_debug_calls().is_empty(), "drained");
    // Bounded for an observer that never drains them.
    for i in 0..(DEBUG_CALLS_CAP as u64 + 10) {
        s.apply(dbg(A, 10 * SEC + i, 0, resume));
    }
    let calls = s.take_debug_calls();
    assert_eq!(calls.len(), DEBUG_CALLS_CAP);
    assert_eq!(
        calls.last().map(|c| c.ts_ns),
        Some(10 * SEC + DEBUG_CALLS_CAP as u64 + 9)
    );
}
