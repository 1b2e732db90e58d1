//! The trace's JSON Lines, byte for byte, for every record kind: field names, their order, number
//! vs string, and absent vs null (docs/observability.md documents the schema). Pinned from the
//! hand-written writer before it was replaced by serde-derived structs.

use gpreempt_common::aql::{Packet, PacketKind};
use gpreempt_common::{kfd, kprobe, nv};

use crate::observe::events::tests::create_queue;
use crate::observe::events::{
    Event, KernelEvent, KfdCall, LaunchEvent, NvCall, NvEvent, Origin, ProcessExit,
};
use crate::observe::model::{FreshDispatch, NvTsg, Queue, QueueKind, SeenPacket, Source};
use crate::trace::dispatches::{write_dispatch, write_sample, write_summary};
use crate::trace::*;

fn origin() -> Origin {
    Origin {
        ts_ns: 5_000,
        pid: 100,
        tid: 101,
        // Quotes, a backslash and a control character: comm is the process's own choice.
        comm: "py\"th\\on\n".into(),
    }
}

fn nv_event(nr: u32, call: NvCall, verified: bool) -> Event {
    Event::Nv(NvEvent {
        origin: origin(),
        fd: 7,
        // _IOWR('F', nr, ...): only the number matters to the name.
        cmd: 0xc000_4600 | nr,
        ret: 0,
        duration_ns: 900,
        call,
        verified,
    })
}

/// One event of every kind (and the variants that add or leave out fields).
fn events() -> Vec<Event> {
    let mut ok = create_queue(0);
    ok.verified = true;
    let mut dbg = create_queue(0);
    dbg.cmd = kfd::cmd::DBG_TRAP;
    dbg.call = KfdCall::DbgTrap(kfd::DbgTrapArgs::bare(77, 99));
    let mut unknown = create_queue(-25);
    unknown.cmd = kfd::cmd::CREATE_QUEUE & !0xff | 0x7e;
    unknown.call = KfdCall::Other;
    let kernel = |probe, target, gpu_id, queue_id| {
        Event::Kernel(KernelEvent {
            origin: origin(),
            probe,
            target,
            gpu_id,
            queue_id,
            args: [1, 2, 3, 4, 5, (3 << 32) | 4],
        })
    };
    let mut tsg_params = [0u8; nv::ALLOC_HEAD_LEN];
    tsg_params[nv::TSG_ENGINE_TYPE_AT] = 1;
    let mut chan_params = [0u8; nv::ALLOC_HEAD_LEN];
    chan_params[nv::channel::GPFIFO_OFFSET] = 0x10;
    chan_params[nv::channel::GPFIFO_ENTRIES] = 0x20;
    chan_params[nv::channel::H_USERD_MEMORY] = 0x30;
    chan_params[nv::channel::USERD_OFFSET] = 0x40;
    let alloc = |h_class, params: Option<[u8; nv::ALLOC_HEAD_LEN]>| NvCall::Alloc {
        h_root: 0xc1,
        h_object_parent: 0xc2,
        h_object_new: 0xc3,
        h_class,
        params_size: 72,
        status: 0,
        nvos64: true,
        alloc_params: params,
        alloc_params_len: nv::ALLOC_HEAD_LEN,
    };
    let control = |cmd, params: Vec<u8>| NvCall::Control {
        h_client: 0xc1,
        h_object: 0xc4,
        cmd,
        flags: 0,
        params_size: params.len() as u32,
        params,
        status: 0x1f,
    };
    vec![
        Event::Ioctl(ok),
        Event::Ioctl(create_queue(-22)),
        Event::Ioctl(dbg),
        Event::Ioctl(unknown),
        Event::ProcessExit(ProcessExit {
            origin: origin(),
            rate_limited: 3,
        }),
        kernel(kprobe::id::QUEUE_ADD, Some(100), Some(0xbeef), Some(9)),
        kernel(kprobe::id::UNMAP, None, None, None),
        Event::Launch(LaunchEvent {
            origin: origin(),
            point: kprobe::launch::HIP_LAUNCH_KERNEL,
            suppressed: 12,
            arg0: 0xdead_beef,
        }),
        nv_event(
            nv::nr::RM_ALLOC,
            alloc(nv::class::KEPLER_CHANNEL_GROUP_A, Some(tsg_params)),
            true,
        ),
        nv_event(
            nv::nr::RM_ALLOC,
            alloc(nv::class::AMPERE_CHANNEL_GPFIFO_A, Some(chan_params)),
            false,
        ),
        nv_event(nv::nr::RM_ALLOC, alloc(0x1234, None), true),
        nv_event(
            nv::nr::RM_FREE,
            NvCall::Free {
                h_root: 0xc1,
                h_object_parent: 0xc2,
                h_object_old: 0xc3,
                status: 0,
            },
            true,
        ),
        nv_event(
            nv::nr::RM_CONTROL,
            control(nv::CTRL_TSG_SET_TIMESLICE, 2000u64.to_le_bytes().to_vec()),
            true,
        ),
        nv_event(
            nv::nr::RM_CONTROL,
            control(nv::CTRL_FIFO_DISABLE_CHANNELS, vec![1; 16]),
            true,
        ),
        nv_event(nv::nr::RM_CONTROL, control(0x2080_0101, vec![]), true),
        nv_event(nv::nr::RM_CONTROL, NvCall::Short, true),
    ]
}

const EVENTS: &str = r#"{"ts_ns":5000,"pid":100,"tid":101,"comm":"python","event":"create_queue","ret":0,"duration_ns":1234,"fd":7,"nr":2,"gpu_id":48879,"queue_type":2,"queue_priority":7,"queue_percentage":0,"ring_base_address":4096,"ring_size":4096,"write_pointer_address":0,"read_pointer_address":0,"eop_buffer_address":0,"eop_buffer_size":0,"ctx_save_restore_address":0,"ctx_save_restore_size":0,"ctl_stack_size":0,"sdma_engine_id":0,"args_size":96,"queue_id":9,"doorbell_offset":17274611901942202440}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"python","event":"create_queue","ret":-22,"duration_ns":1234,"fd":7,"nr":2,"verified":false,"gpu_id":48879,"queue_type":2,"queue_priority":7,"queue_percentage":0,"ring_base_address":4096,"ring_size":4096,"write_pointer_address":0,"read_pointer_address":0,"eop_buffer_address":0,"eop_buffer_size":0,"ctx_save_restore_address":0,"ctx_save_restore_size":0,"ctl_stack_size":0,"sdma_engine_id":0,"args_size":96}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"python","event":"dbg_trap","ret":0,"duration_ns":1234,"fd":7,"nr":38,"verified":false,"target_pid":77,"op":"op_99"}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"python","event":"kfd_ioctl_0x7e","ret":-25,"duration_ns":1234,"fd":7,"nr":126,"verified":false}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"py\"th\\on\n","event":"process_exit"}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"py\"th\\on\n","event":"kfd_procfs_add_queue","source":"kprobe","target_pid":100,"gpu_id":48879,"queue_id":9,"type":1,"priority":2,"doorbell_off":3,"queue_address":4,"queue_size":5,"pipe":3,"queue":4}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"py\"th\\on\n","event":"pm_send_unmap_queue","source":"kprobe","filter":1,"filter_param":2}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"py\"th\\on\n","event":"hipLaunchKernel","source":"uprobe","suppressed":12,"arg0":3735928559}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"py\"th\\on\n","event":"rm_alloc","vendor":"nvidia","ret":0,"duration_ns":900,"fd":7,"hRoot":193,"hObjectParent":194,"hObjectNew":195,"hClass":41068,"class":"KEPLER_CHANNEL_GROUP_A","paramsSize":72,"nvos":64,"engineType":1,"status":0}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"py\"th\\on\n","event":"rm_alloc","vendor":"nvidia","ret":0,"duration_ns":900,"fd":7,"verified":false,"hRoot":193,"hObjectParent":194,"hObjectNew":195,"hClass":50543,"class":"AMPERE_CHANNEL_GPFIFO_A","paramsSize":72,"nvos":64,"gpFifoOffset":16,"gpFifoEntries":32,"hUserdMemory":48,"userdOffset":64,"status":0}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"py\"th\\on\n","event":"rm_alloc","vendor":"nvidia","ret":0,"duration_ns":900,"fd":7,"hRoot":193,"hObjectParent":194,"hObjectNew":195,"hClass":4660,"paramsSize":72,"nvos":64,"status":0}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"py\"th\\on\n","event":"rm_free","vendor":"nvidia","ret":0,"duration_ns":900,"fd":7,"hRoot":193,"hObjectParent":194,"hObjectOld":195,"status":0}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"py\"th\\on\n","event":"rm_control","vendor":"nvidia","ret":0,"duration_ns":900,"fd":7,"hClient":193,"hObject":196,"cmd":2691432707,"flags":0,"paramsSize":8,"status":31,"control":"SET_TIMESLICE","timesliceUs":2000}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"py\"th\\on\n","event":"rm_control","vendor":"nvidia","ret":0,"duration_ns":900,"fd":7,"hClient":193,"hObject":196,"cmd":545263883,"flags":0,"paramsSize":16,"status":31,"control":"FIFO_DISABLE_CHANNELS","bDisable":1,"numChannels":16843009,"bOnlyDisableScheduling":1}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"py\"th\\on\n","event":"rm_control","vendor":"nvidia","ret":0,"duration_ns":900,"fd":7,"hClient":193,"hObject":196,"cmd":545259777,"flags":0,"paramsSize":0,"status":31}
{"ts_ns":5000,"pid":100,"tid":101,"comm":"py\"th\\on\n","event":"rm_control","vendor":"nvidia","ret":0,"duration_ns":900,"fd":7}"#;

#[test]
fn every_event_kind_has_its_pinned_json_line() {
    let mut out = Vec::new();
    for ev in events() {
        write_json(&ev, &mut out).unwrap();
    }
    let out = String::from_utf8(out).unwrap();
    for (got, want) in out.lines().zip(EVENTS.lines()) {
        assert_eq!(got, want);
    }
    assert_eq!(out.lines().count(), EVENTS.lines().count(), "{out}");
    for line in out.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }
}

fn dispatch(kind: PacketKind, barrier: bool) -> FreshDispatch {
    FreshDispatch {
        ts_ns: 7_000,
        pid: 100,
        gpu_id: 0xbeef,
        queue_id: 9,
        packet: SeenPacket {
            dispatch_id: 41,
            packet: Packet {
                kind,
                barrier,
                workgroup: [64, 2, 1],
                grid: [1024, 4, 1],
                private_segment_size: 16,
                group_segment_size: 512,
                kernel_object: 0x7f00_1000,
            },
        },
    }
}

/// The samples' and the summary's keys are in alphabetical order: the order they were first
/// written in (a `serde_json::json!` map), kept so no consumer sees a change.
const DISPATCHES: &str = r#"{"type":"dispatch","ts_ns":7000,"pid":100,"comm":"py\"th\\on\n","gpu_id":48879,"queue_id":9,"dispatch_id":41,"packet":"kernel_dispatch","barrier":false,"grid":[1024,4,1],"workgroup":[64,2,1],"work_items":4096,"workgroups":32,"kernel_object":2130710528,"kernel":"add<float>","private_segment_size":16,"group_segment_size":512}
{"type":"dispatch","ts_ns":7000,"pid":100,"comm":"x","gpu_id":48879,"queue_id":9,"dispatch_id":41,"packet":"barrier_and","barrier":true,"grid":[1024,4,1],"workgroup":[64,2,1],"work_items":0,"workgroups":0,"kernel_object":2130710528,"kernel":null,"private_segment_size":16,"group_segment_size":512}
{"gpu_id":48879,"pid":100,"queue_id":9,"read_dispatch_id":40,"ts_ns":8000,"type":"aql_sample","write_dispatch_id":44}
{"gp_get_total":40,"gp_put_total":44,"gpu_id":48879,"pid":100,"ts_ns":8000,"tsg":9,"type":"gpfifo_sample"}
{"barriers":2,"comm":"py\"th\\on\n","consumed":10,"decoded":8,"gpu_id":48879,"kernel_dispatches":6,"pid":100,"queue_id":9,"type":"dispatch_summary"}"#;

#[test]
fn every_dispatch_record_has_its_pinned_json_line() {
    let mut out = Vec::new();
    let kernel = dispatch(PacketKind::KernelDispatch, false);
    write_dispatch(&mut out, true, &kernel, "py\"th\\on\n", Some("add<float>")).unwrap();
    let barrier = dispatch(PacketKind::BarrierAnd, true);
    write_dispatch(&mut out, true, &barrier, "x", None).unwrap();

    let mut q = Queue::new(9, 0xbeef, QueueKind::ComputeAql, Source::Event, 1);
    write_sample(&mut out, 100, &q).unwrap();
    let before = out.len();
    q.activity.read_dispatch_id = Some(40);
    write_sample(&mut out, 100, &q).unwrap();
    assert_eq!(out.len(), before, "no sample without both ids");
    q.activity.write_dispatch_id = Some(44);
    q.activity.sample_ns = 8_000;
    write_sample(&mut out, 100, &q).unwrap();
    let mut tsg = q.clone();
    tsg.nv = Some(NvTsg {
        h_client: 0xc1,
        fd: 7,
        h_subdevice: None,
        engine_type: 1,
        channels: vec![],
        rings: vec![],
        timeslice_us: None,
    });
    write_sample(&mut out, 100, &tsg).unwrap();

    let m = &mut q.activity.dispatches;
    (m.consumed, m.decoded, m.kernel_dispatches, m.barriers) = (10, 8, 6, 2);
    write_summary(&mut out, true, 100, "py\"th\\on\n", &q).unwrap();

    let out = String::from_utf8(out).unwrap();
    for (got, want) in out.lines().zip(DISPATCHES.lines()) {
        assert_eq!(got, want);
    }
    assert_eq!(out.lines().count(), DISPATCHES.lines().count(), "{out}");
}
