//! Each event's fields, in kfd_ioctl.h's names and order: what both the readable lines and the
//! JSON Lines print.

use serde::Serialize;

use gpreempt_common::{kfd, nv};

use crate::observe::events::{Event, IoctlEvent, KernelEvent, KfdCall, NvCall, NvEvent};

/// A field value: numbers are plain JSON numbers; `Hex` only changes the readable rendering.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Val {
    U(u64),
    I(i64),
    Hex(u64),
    S(String),
}

impl Val {
    pub(super) fn text(&self) -> String {
        match self {
            Val::U(v) => v.to_string(),
            Val::I(v) => v.to_string(),
            Val::Hex(v) => format!("{v:#x}"),
            Val::S(s) => s.clone(),
        }
    }
}

type Fields = Vec<(&'static str, Val)>;

/// The event-specific fields of an ioctl, inputs and (when it succeeded) outputs.
pub fn call_fields(ev: &IoctlEvent) -> Fields {
    let ok = ev.ret >= 0;
    let mut f: Fields = Vec::new();
    match &ev.call {
        KfdCall::GetVersion(a) => {
            if ok {
                f.push(("major_version", Val::U(a.major_version.into())));
                f.push(("minor_version", Val::U(a.minor_version.into())));
            }
        }
        KfdCall::CreateQueue { args: a, args_size } => {
            f.push(("gpu_id", Val::U(a.gpu_id.into())));
            f.push(("queue_type", Val::U(a.queue_type.into())));
            f.push(("queue_priority", Val::U(a.queue_priority.into())));
            f.push(("queue_percentage", Val::U(a.queue_percentage.into())));
            f.push(("ring_base_address", Val::Hex(a.ring_base_address)));
            f.push(("ring_size", Val::U(a.ring_size.into())));
            f.push(("write_pointer_address", Val::Hex(a.write_pointer_address)));
            f.push(("read_pointer_address", Val::Hex(a.read_pointer_address)));
            f.push(("eop_buffer_address", Val::Hex(a.eop_buffer_address)));
            f.push(("eop_buffer_size", Val::U(a.eop_buffer_size)));
            f.push((
                "ctx_save_restore_address",
                Val::Hex(a.ctx_save_restore_address),
            ));
            f.push((
                "ctx_save_restore_size",
                Val::U(a.ctx_save_restore_size.into()),
            ));
            f.push(("ctl_stack_size", Val::U(a.ctl_stack_size.into())));
            if *args_size as usize >= std::mem::size_of::<kfd::CreateQueueArgs>() {
                f.push(("sdma_engine_id", Val::U(a.sdma_engine_id.into())));
            }
            f.push(("args_size", Val::U((*args_size).into())));
            if ok {
                f.push(("queue_id", Val::U(a.queue_id.into())));
                f.push(("doorbell_offset", Val::Hex(a.doorbell_offset)));
            }
        }
        KfdCall::DestroyQueue(a) => f.push(("queue_id", Val::U(a.queue_id.into()))),
        KfdCall::UpdateQueue(a) => {
            f.push(("queue_id", Val::U(a.queue_id.into())));
            f.push(("ring_base_address", Val::Hex(a.ring_base_address)));
            f.push(("ring_size", Val::U(a.ring_size.into())));
            f.push(("queue_percentage", Val::U(a.queue_percentage.into())));
            f.push(("queue_priority", Val::U(a.queue_priority.into())));
        }
        KfdCall::SetCuMask(a) => {
            f.push(("queue_id", Val::U(a.queue_id.into())));
            f.push(("num_cu_mask", Val::U(a.num_cu_mask.into())));
            f.push(("cu_mask_ptr", Val::Hex(a.cu_mask_ptr)));
        }
        KfdCall::GetQueueWaveState(a) => {
            f.push(("queue_id", Val::U(a.queue_id.into())));
            f.push(("ctl_stack_address", Val::Hex(a.ctl_stack_address)));
            if ok {
                f.push(("ctl_stack_used_size", Val::U(a.ctl_stack_used_size.into())));
                f.push(("save_area_used_size", Val::U(a.save_area_used_size.into())));
            }
        }
        KfdCall::AcquireVm(a) => {
            f.push(("drm_fd", Val::U(a.drm_fd.into())));
            f.push(("gpu_id", Val::U(a.gpu_id.into())));
        }
        KfdCall::AllocMemoryOfGpu(a) => {
            f.push(("gpu_id", Val::U(a.gpu_id.into())));
            f.push(("va_addr", Val::Hex(a.va_addr)));
            f.push(("size", Val::U(a.size)));
            f.push(("flags", Val::Hex(a.flags.into())));
            if ok {
                f.push(("handle", Val::Hex(a.handle)));
                f.push(("mmap_offset", Val::Hex(a.mmap_offset)));
            }
        }
        KfdCall::FreeMemoryOfGpu(a) => f.push(("handle", Val::Hex(a.handle))),
        KfdCall::SmiEvents(a) => {
            f.push(("gpuid", Val::U(a.gpuid.into())));
            if ok {
                f.push(("anon_fd", Val::U(a.anon_fd.into())));
            }
        }
        KfdCall::RuntimeEnable(a) => {
            f.push(("r_debug", Val::Hex(a.r_debug)));
            f.push(("mode_mask", Val::Hex(a.mode_mask.into())));
            if ok {
                f.push(("capabilities_mask", Val::Hex(a.capabilities_mask.into())));
            }
        }
        KfdCall::DbgTrap(a) => dbg_trap_fields(a, ok, &mut f),
        KfdCall::Other => {}
    }
    f
}

fn dbg_trap_fields(a: &kfd::DbgTrapArgs, ok: bool, f: &mut Fields) {
    use kfd::dbg_op as op;
    f.push(("target_pid", Val::U(a.pid.into())));
    f.push((
        "op",
        Val::S(match kfd::dbg_op_name(a.op) {
            Some(n) => n.to_string(),
            None => format!("op_{}", a.op),
        }),
    ));
    match a.op {
        op::ENABLE => {
            let p: kfd::DbgTrapEnableArgs = a.payload();
            f.push(("exception_mask", Val::Hex(p.exception_mask)));
            f.push(("rinfo_ptr", Val::Hex(p.rinfo_ptr)));
            f.push(("rinfo_size", Val::U(p.rinfo_size.into())));
            f.push(("dbg_fd", Val::U(p.dbg_fd.into())));
        }
        op::SEND_RUNTIME_EVENT => {
            let p: kfd::DbgTrapSendRuntimeEventArgs = a.payload();
            f.push(("exception_mask", Val::Hex(p.exception_mask)));
            f.push(("gpu_id", Val::U(p.gpu_id.into())));
            f.push(("queue_id", Val::U(p.queue_id.into())));
        }
        op::SET_EXCEPTIONS_ENABLED => {
            let p: kfd::DbgTrapSetExceptionsEnabledArgs = a.payload();
            f.push(("exception_mask", Val::Hex(p.exception_mask)));
        }
        op::SUSPEND_QUEUES => {
            let p: kfd::DbgTrapSuspendQueuesArgs = a.payload();
            f.push(("exception_mask", Val::Hex(p.exception_mask)));
            f.push(("queue_array_ptr", Val::Hex(p.queue_array_ptr)));
            f.push(("num_queues", Val::U(p.num_queues.into())));
            f.push(("grace_period", Val::U(p.grace_period.into())));
        }
        op::RESUME_QUEUES => {
            let p: kfd::DbgTrapResumeQueuesArgs = a.payload();
            f.push(("queue_array_ptr", Val::Hex(p.queue_array_ptr)));
            f.push(("num_queues", Val::U(p.num_queues.into())));
        }
        op::QUERY_DEBUG_EVENT => {
            let p: kfd::DbgTrapQueryDebugEventArgs = a.payload();
            f.push(("exception_mask", Val::Hex(p.exception_mask)));
            if ok {
                f.push(("gpu_id", Val::U(p.gpu_id.into())));
                f.push(("queue_id", Val::U(p.queue_id.into())));
            }
        }
        op::GET_QUEUE_SNAPSHOT => {
            let p: kfd::DbgTrapQueueSnapshotArgs = a.payload();
            f.push(("exception_mask", Val::Hex(p.exception_mask)));
            f.push(("snapshot_buf_ptr", Val::Hex(p.snapshot_buf_ptr)));
            f.push(("num_queues", Val::U(p.num_queues.into())));
            f.push(("entry_size", Val::U(p.entry_size.into())));
        }
        op::GET_DEVICE_SNAPSHOT => {
            let p: kfd::DbgTrapDeviceSnapshotArgs = a.payload();
            f.push(("exception_mask", Val::Hex(p.exception_mask)));
            f.push(("snapshot_buf_ptr", Val::Hex(p.snapshot_buf_ptr)));
            f.push(("num_devices", Val::U(p.num_devices.into())));
            f.push(("entry_size", Val::U(p.entry_size.into())));
        }
        op::SET_WAVE_LAUNCH_OVERRIDE => {
            let p: kfd::DbgTrapSetWaveLaunchOverrideArgs = a.payload();
            f.push(("override_mode", Val::U(p.override_mode.into())));
            f.push(("enable_mask", Val::Hex(p.enable_mask.into())));
            f.push((
                "support_request_mask",
                Val::Hex(p.support_request_mask.into()),
            ));
        }
        op::SET_WAVE_LAUNCH_MODE => {
            let p: kfd::DbgTrapSetWaveLaunchModeArgs = a.payload();
            f.push(("launch_mode", Val::U(p.launch_mode.into())));
        }
        op::SET_NODE_ADDRESS_WATCH => {
            let p: kfd::DbgTrapSetNodeAddressWatchArgs = a.payload();
            f.push(("address", Val::Hex(p.address)));
            f.push(("mode", Val::U(p.mode.into())));
            f.push(("mask", Val::Hex(p.mask.into())));
            f.push(("gpu_id", Val::U(p.gpu_id.into())));
            if ok {
                f.push(("id", Val::U(p.id.into())));
            }
        }
        op::CLEAR_NODE_ADDRESS_WATCH => {
            let p: kfd::DbgTrapClearNodeAddressWatchArgs = a.payload();
            f.push(("gpu_id", Val::U(p.gpu_id.into())));
            f.push(("id", Val::U(p.id.into())));
        }
        op::SET_FLAGS => {
            let p: kfd::DbgTrapSetFlagsArgs = a.payload();
            f.push(("flags", Val::Hex(p.flags.into())));
        }
        op::QUERY_EXCEPTION_INFO => {
            let p: kfd::DbgTrapQueryExceptionInfoArgs = a.payload();
            f.push(("info_ptr", Val::Hex(p.info_ptr)));
            f.push(("info_size", Val::U(p.info_size.into())));
            f.push(("source_id", Val::U(p.source_id.into())));
            f.push(("exception_code", Val::U(p.exception_code.into())));
            f.push(("clear_exception", Val::U(p.clear_exception.into())));
        }
        _ => {}
    }
}

/// The event name used in JSON (`event`) and readable output.
pub fn event_name(ev: &Event) -> String {
    match ev {
        Event::Ioctl(i) => i.name(),
        Event::ProcessExit(_) => "process_exit".into(),
        Event::Kernel(k) => k.name().into(),
        Event::Launch(l) => l.name().into(),
        Event::Nv(n) => n.name().into(),
    }
}

/// An RM escape's fields under the driver's own names (nvos.h).
pub fn nv_fields(n: &NvEvent) -> Vec<(&'static str, Val)> {
    use gpreempt_common::nv;
    let mut f = Vec::with_capacity(10);
    match &n.call {
        NvCall::Alloc {
            h_root,
            h_object_parent,
            h_object_new,
            h_class,
            params_size,
            status,
            nvos64,
            ..
        } => {
            f.push(("hRoot", Val::Hex((*h_root).into())));
            f.push(("hObjectParent", Val::Hex((*h_object_parent).into())));
            f.push(("hObjectNew", Val::Hex((*h_object_new).into())));
            f.push(("hClass", Val::Hex((*h_class).into())));
            if let Some(name) = nv::class::name(*h_class) {
                f.push(("class", Val::S(name.into())));
            }
            f.push(("paramsSize", Val::U((*params_size).into())));
            f.push(("nvos", Val::U(if *nvos64 { 64 } else { 21 })));
            if let Some(e) = n.engine_type() {
                f.push(("engineType", Val::Hex(e.into())));
            }
            if let Some(r) = n.channel_ring() {
                f.push(("gpFifoOffset", Val::Hex(r.gpfifo_va)));
                f.push(("gpFifoEntries", Val::U(r.entries.into())));
                f.push(("hUserdMemory", Val::Hex(r.h_userd.into())));
                f.push(("userdOffset", Val::Hex(r.userd_offset)));
            }
            f.push(("status", Val::Hex((*status).into())));
        }
        NvCall::Free {
            h_root,
            h_object_parent,
            h_object_old,
            status,
        } => {
            f.push(("hRoot", Val::Hex((*h_root).into())));
            f.push(("hObjectParent", Val::Hex((*h_object_parent).into())));
            f.push(("hObjectOld", Val::Hex((*h_object_old).into())));
            f.push(("status", Val::Hex((*status).into())));
        }
        NvCall::Control {
            h_client,
            h_object,
            cmd,
            flags,
            params_size,
            status,
            params,
        } => {
            f.push(("hClient", Val::Hex((*h_client).into())));
            f.push(("hObject", Val::Hex((*h_object).into())));
            f.push(("cmd", Val::Hex((*cmd).into())));
            f.push(("flags", Val::Hex((*flags).into())));
            f.push(("paramsSize", Val::U((*params_size).into())));
            f.push(("status", Val::Hex((*status).into())));
            f.extend(control_params(*cmd, params));
        }
        NvCall::Short => {}
    }
    f
}

/// The parameters of the controls that are the controller's levers, decoded by name, so every
/// timeslice change or restore and every pause, by anyone, shows its value.
fn control_params(cmd: u32, p: &[u8]) -> Vec<(&'static str, Val)> {
    use gpreempt_common::nv::disable_channels as dc;
    let u32_at = |at: usize| p.get(at..at + 4).map(|b| nv::u32_at(b, 0));
    let mut f = Vec::new();
    match cmd {
        nv::CTRL_TSG_SET_TIMESLICE | nv::CTRL_TSG_GET_TIMESLICE => {
            f.push((
                "control",
                Val::S(
                    if cmd == nv::CTRL_TSG_SET_TIMESLICE {
                        "SET_TIMESLICE"
                    } else {
                        "GET_TIMESLICE"
                    }
                    .into(),
                ),
            ));
            if let Some(b) = p.get(..nv::TIMESLICE_PARAMS_SIZE) {
                f.push(("timesliceUs", Val::U(nv::u64_at(b, 0))));
            }
        }
        nv::CTRL_TSG_SET_INTERLEAVE_LEVEL => {
            f.push(("control", Val::S("SET_INTERLEAVE_LEVEL".into())));
            if let Some(v) = u32_at(0) {
                f.push(("tsgInterleaveLevel", Val::U(v.into())));
            }
        }
        nv::CTRL_FIFO_DISABLE_CHANNELS => {
            f.push(("control", Val::S("FIFO_DISABLE_CHANNELS".into())));
            if let (Some(&d), Some(n), Some(&s)) = (
                p.get(dc::B_DISABLE),
                u32_at(dc::NUM_CHANNELS),
                p.get(dc::B_ONLY_DISABLE_SCHEDULING),
            ) {
                f.push(("bDisable", Val::U(d.into())));
                f.push(("numChannels", Val::U(n.into())));
                f.push(("bOnlyDisableScheduling", Val::U(s.into())));
            }
        }
        _ => {}
    }
    f
}

/// `target_pid`, `gpu_id`, `queue_id` and the probe's named values of a kernel event.
pub(super) fn kernel_fields(k: &KernelEvent) -> Vec<(&'static str, u64)> {
    let mut f = Vec::with_capacity(10);
    if let Some(t) = k.target {
        f.push(("target_pid", u64::from(t)));
    }
    if let Some(g) = k.gpu_id {
        f.push(("gpu_id", u64::from(g)));
    }
    if let Some(q) = k.queue_id {
        f.push(("queue_id", u64::from(q)));
    }
    f.extend(k.fields());
    f
}
