//! `gpreempt-ebpf trace`: the event stream as readable lines or JSON Lines.
//!
//! Field names follow kfd_ioctl.h; the schema is in docs/observability.md.

use std::io::Write;

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
    fn text(&self) -> String {
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
fn kernel_fields(k: &KernelEvent) -> Vec<(&'static str, u64)> {
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

/// Event-specific fields in their order, serialized as JSON object entries.
struct Pairs<'a, V>(&'a [(&'static str, V)]);

impl<V: Serialize> Serialize for Pairs<'_, V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

fn is_true(b: &bool) -> bool {
    *b
}

/// One `--json` line (docs/observability.md): the common fields, then the kind's own, in this
/// order.
#[derive(Serialize)]
struct EventLine<'a> {
    ts_ns: u64,
    pid: u32,
    tid: u32,
    comm: &'a str,
    event: &'a str,
    #[serde(flatten)]
    body: Body<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Body<'a> {
    ProcessExit {},
    Kernel {
        source: &'static str,
        #[serde(flatten)]
        fields: Pairs<'a, u64>,
    },
    Launch {
        source: &'static str,
        suppressed: u32,
        arg0: u64,
    },
    Nv {
        vendor: &'static str,
        ret: i64,
        duration_ns: u64,
        fd: i32,
        /// Present only when false.
        #[serde(skip_serializing_if = "is_true")]
        verified: bool,
        #[serde(flatten)]
        fields: Pairs<'a, Val>,
    },
    Ioctl {
        ret: i64,
        duration_ns: u64,
        fd: i32,
        nr: u32,
        /// Present only when false.
        #[serde(skip_serializing_if = "is_true")]
        verified: bool,
        #[serde(flatten)]
        fields: Pairs<'a, Val>,
    },
}

/// Writes one JSON object per event (docs/observability.md documents the schema). Serialized
/// straight to `w`: building a `serde_json::Value` per event was the bottleneck of the consumer.
pub fn write_json<W: Write>(ev: &Event, w: &mut W) -> std::io::Result<()> {
    let o = ev.origin();
    let event = event_name(ev);
    let fields;
    let kernel;
    let body = match ev {
        Event::ProcessExit(_) => Body::ProcessExit {},
        Event::Kernel(k) => {
            kernel = kernel_fields(k);
            Body::Kernel {
                source: "kprobe",
                fields: Pairs(&kernel),
            }
        }
        Event::Launch(l) => Body::Launch {
            source: "uprobe",
            suppressed: l.suppressed,
            arg0: l.arg0,
        },
        Event::Nv(n) => {
            fields = nv_fields(n);
            Body::Nv {
                vendor: "nvidia",
                ret: n.ret,
                duration_ns: n.duration_ns,
                fd: n.fd,
                verified: n.verified,
                fields: Pairs(&fields),
            }
        }
        Event::Ioctl(i) => {
            fields = call_fields(i);
            Body::Ioctl {
                ret: i.ret,
                duration_ns: i.duration_ns,
                fd: i.fd,
                nr: i.nr(),
                verified: i.verified,
                fields: Pairs(&fields),
            }
        }
    };
    let line = EventLine {
        ts_ns: o.ts_ns,
        pid: o.pid,
        tid: o.tid,
        comm: &o.comm,
        event: &event,
        body,
    };
    serde_json::to_writer(&mut *w, &line)?;
    w.write_all(b"\n")
}

/// One readable line: `TIME PID/TID COMM EVENT fields... = RET (DURATION)`.
pub fn to_line(ev: &Event, t0_ns: u64) -> String {
    use std::fmt::Write as _;
    let o = ev.origin();
    let rel = o.ts_ns.saturating_sub(t0_ns);
    let mut s = format!(
        "{:>5}.{:06} {:>7}/{:<7} {:<15} {}",
        rel / 1_000_000_000,
        (rel % 1_000_000_000) / 1000,
        o.pid,
        o.tid,
        o.comm,
        event_name(ev)
    );
    if let Event::Kernel(k) = ev {
        for (name, v) in kernel_fields(k) {
            if v > 0xffff {
                let _ = write!(s, " {name}={v:#x}");
            } else {
                let _ = write!(s, " {name}={v}");
            }
        }
    }
    if let Event::Nv(n) = ev {
        for (k, v) in nv_fields(n) {
            let _ = write!(s, " {k}={}", v.text());
        }
        let _ = write!(s, " = {} <{:.1}us>", n.ret, n.duration_ns as f64 / 1000.0);
        if !n.verified {
            s.push_str(" [fd unverified]");
        }
    }
    if let Event::Launch(l) = ev {
        let _ = write!(s, " arg0={:#x}", l.arg0);
        if l.suppressed > 0 {
            let _ = write!(s, " (+{} launches since the last hint)", l.suppressed);
        }
    }
    if let Event::Ioctl(i) = ev {
        for (k, v) in call_fields(i) {
            let _ = write!(s, " {k}={}", v.text());
        }
        if i.ret < 0 {
            let errno = nix::errno::Errno::from_raw((-i.ret) as i32);
            let _ = write!(s, " = {} ({errno})", i.ret);
        } else {
            let _ = write!(s, " = {}", i.ret);
        }
        let _ = write!(s, " <{:.1}us>", i.duration_ns as f64 / 1000.0);
        if !i.verified {
            s.push_str(" [fd unverified]");
        }
    }
    s
}

/// Output format of `trace`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// Writes events; flushes per batch so `trace` is live on a terminal and in a pipe.
pub struct Sink<W: Write> {
    out: W,
    format: Format,
    t0_ns: Option<u64>,
}

impl<W: Write> Sink<W> {
    pub fn new(out: W, format: Format) -> Self {
        Self {
            out,
            format,
            t0_ns: None,
        }
    }

    pub fn write(&mut self, ev: &Event) -> std::io::Result<()> {
        match self.format {
            Format::Json => write_json(ev, &mut self.out),
            Format::Text => {
                let ts = ev.origin().ts_ns;
                let t0 = *self.t0_ns.get_or_insert(ts);
                writeln!(self.out, "{}", to_line(ev, t0))
            }
        }
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn to_json(ev: &Event) -> Value {
        let mut out = Vec::new();
        write_json(ev, &mut out).unwrap();
        assert!(out.ends_with(b"}\n"));
        serde_json::from_slice(&out).unwrap()
    }
    use crate::observe::events::Origin;
    use crate::observe::events::{tests::create_queue, ProcessExit};

    #[test]
    fn json_uses_the_header_field_names() {
        let mut ev = create_queue(0);
        ev.verified = true;
        let v = to_json(&Event::Ioctl(ev));
        assert_eq!(v["event"], "create_queue");
        assert_eq!(v["pid"], 100);
        assert_eq!(v["tid"], 101);
        assert_eq!(v["comm"], "python");
        assert_eq!(v["ret"], 0);
        assert_eq!(v["duration_ns"], 1234);
        assert_eq!(v["ts_ns"], 5000);
        assert_eq!(v["queue_id"], 9);
        assert_eq!(v["gpu_id"], 0xbeef);
        assert_eq!(v["queue_type"], 2);
        assert_eq!(v["queue_priority"], 7);
        assert_eq!(v["ring_base_address"], 0x1000);
        assert_eq!(v["ring_size"], 4096);
        assert_eq!(
            v["doorbell_offset"],
            kfd::doorbell_mmap_offset(0xbeef, 0x48)
        );
        assert!(v.get("verified").is_none());
    }

    #[test]
    fn failed_calls_have_no_outputs_and_unverified_fds_are_marked() {
        let v = to_json(&Event::Ioctl(create_queue(-22)));
        assert_eq!(v["ret"], -22);
        assert!(v.get("queue_id").is_none());
        assert_eq!(v["verified"], false);
        let line = to_line(&Event::Ioctl(create_queue(-22)), 0);
        assert!(line.contains("create_queue"), "{line}");
        assert!(line.contains("ring_base_address=0x1000"), "{line}");
        assert!(line.contains("= -22 (EINVAL"), "{line}");
        assert!(line.contains("[fd unverified]"), "{line}");
    }

    #[test]
    fn dbg_trap_ops_are_named_with_their_payloads() {
        let mut ev = create_queue(0);
        ev.cmd = kfd::cmd::DBG_TRAP;
        ev.call = KfdCall::DbgTrap(kfd::DbgTrapArgs::new(
            77,
            kfd::DbgTrapQueryDebugEventArgs {
                exception_mask: kfd::ec_mask(kfd::ec::QUEUE_NEW),
                gpu_id: 5,
                queue_id: 6,
            },
        ));
        let v = to_json(&Event::Ioctl(ev.clone()));
        assert_eq!(v["event"], "dbg_trap");
        assert_eq!(v["op"], "query_debug_event");
        assert_eq!(v["target_pid"], 77);
        assert_eq!(v["queue_id"], 6);
        assert_eq!(v["gpu_id"], 5);
        ev.call = KfdCall::DbgTrap(kfd::DbgTrapArgs::bare(77, 99));
        assert_eq!(to_json(&Event::Ioctl(ev))["op"], "op_99");
    }

    #[test]
    fn process_exit_json_and_text() {
        let ev = Event::ProcessExit(ProcessExit {
            origin: Origin {
                ts_ns: 2_500_000_000,
                pid: 3,
                tid: 3,
                comm: "x".into(),
            },
            rate_limited: 0,
        });
        let v = to_json(&ev);
        assert_eq!(v["event"], "process_exit");
        assert!(v.get("ret").is_none());
        assert!(to_line(&ev, 1_000_000_000).starts_with("    1.500000"));
        let mut sink = Sink::new(Vec::new(), Format::Json);
        sink.write(&ev).unwrap();
        sink.write(&ev).unwrap();
        sink.flush().unwrap();
        assert_eq!(String::from_utf8(sink.out).unwrap().lines().count(), 2);
    }
}

#[cfg(test)]
mod json_tests;

/// `trace --dispatches` lines (JSON Lines schema in docs/observability.md).
pub mod dispatches {
    use std::io::Write;

    use serde::Serialize;

    use crate::observe::model::{FreshDispatch, Queue};

    #[derive(Serialize)]
    struct DispatchLine<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        ts_ns: u64,
        pid: u32,
        comm: &'a str,
        gpu_id: u32,
        queue_id: u32,
        dispatch_id: u64,
        packet: &'static str,
        barrier: bool,
        grid: [u32; 3],
        workgroup: [u16; 3],
        work_items: u64,
        workgroups: u64,
        kernel_object: u64,
        kernel: Option<&'a str>,
        private_segment_size: u32,
        group_segment_size: u32,
    }

    // The samples' and the summary's keys are in alphabetical order: the order they were first
    // written in (a `serde_json::json!` map), kept so no consumer sees a change.

    #[derive(Serialize)]
    struct AqlSample {
        gpu_id: u32,
        pid: u32,
        queue_id: u32,
        read_dispatch_id: u64,
        ts_ns: u64,
        #[serde(rename = "type")]
        kind: &'static str,
        write_dispatch_id: u64,
    }

    /// An NVIDIA TSG's GPFIFO entries fetched (GP_GET) and submitted (GP_PUT) over its channels.
    #[derive(Serialize)]
    struct GpfifoSample {
        gp_get_total: u64,
        gp_put_total: u64,
        gpu_id: u32,
        pid: u32,
        ts_ns: u64,
        tsg: u32,
        #[serde(rename = "type")]
        kind: &'static str,
    }

    #[derive(Serialize)]
    struct DispatchSummary<'a> {
        barriers: u64,
        comm: &'a str,
        consumed: u64,
        decoded: u64,
        gpu_id: u32,
        kernel_dispatches: u64,
        pid: u32,
        queue_id: u32,
        #[serde(rename = "type")]
        kind: &'static str,
    }

    /// One decoded packet.
    pub fn write_dispatch<W: Write>(
        w: &mut W,
        json: bool,
        d: &FreshDispatch,
        comm: &str,
        kernel: Option<&str>,
    ) -> std::io::Result<()> {
        let p = &d.packet.packet;
        let dispatch = p.kind == gpreempt_common::aql::PacketKind::KernelDispatch;
        if !json {
            let what = if dispatch {
                format!(
                    "grid {}x{}x{} wg {}x{}x{} object {:#x}{}",
                    p.grid[0],
                    p.grid[1],
                    p.grid[2],
                    p.workgroup[0],
                    p.workgroup[1],
                    p.workgroup[2],
                    p.kernel_object,
                    kernel.map(|k| format!(" {k}")).unwrap_or_default()
                )
            } else {
                String::new()
            };
            return writeln!(
                w,
                "{:>6}.{:06} {comm}[{}] gpu {} q{} #{} {}{} {what}",
                d.ts_ns / 1_000_000_000,
                d.ts_ns % 1_000_000_000 / 1000,
                d.pid,
                d.gpu_id,
                d.queue_id,
                d.packet.dispatch_id,
                p.kind.name(),
                if p.barrier { " barrier" } else { "" },
            );
        }
        let line = DispatchLine {
            kind: "dispatch",
            ts_ns: d.ts_ns,
            pid: d.pid,
            comm,
            gpu_id: d.gpu_id,
            queue_id: d.queue_id,
            dispatch_id: d.packet.dispatch_id,
            packet: p.kind.name(),
            barrier: p.barrier,
            grid: p.grid,
            workgroup: p.workgroup,
            work_items: if dispatch { p.work_items() } else { 0 },
            workgroups: if dispatch { p.workgroups() } else { 0 },
            kernel_object: p.kernel_object,
            kernel,
            private_segment_size: p.private_segment_size,
            group_segment_size: p.group_segment_size,
        };
        serde_json::to_writer(&mut *w, &line)?;
        w.write_all(b"\n")
    }

    /// A queue's dispatch ids at one sampling tick (JSON only: RPTR/WPTR behaviour over time).
    pub fn write_sample<W: Write>(w: &mut W, pid: u32, q: &Queue) -> std::io::Result<()> {
        let a = &q.activity;
        let (Some(read), Some(write)) = (a.read_dispatch_id, a.write_dispatch_id) else {
            return Ok(());
        };
        // An NVIDIA TSG's ids count GPFIFO entries over its channels, not AQL packets.
        if q.nv.is_some() {
            serde_json::to_writer(
                &mut *w,
                &GpfifoSample {
                    gp_get_total: read,
                    gp_put_total: write,
                    gpu_id: q.gpu_id,
                    pid,
                    ts_ns: a.sample_ns,
                    tsg: q.queue_id,
                    kind: "gpfifo_sample",
                },
            )?;
        } else {
            serde_json::to_writer(
                &mut *w,
                &AqlSample {
                    gpu_id: q.gpu_id,
                    pid,
                    queue_id: q.queue_id,
                    read_dispatch_id: read,
                    ts_ns: a.sample_ns,
                    kind: "aql_sample",
                    write_dispatch_id: write,
                },
            )?;
        }
        w.write_all(b"\n")
    }

    /// What a queue's packets amounted to, at the end of a trace.
    pub fn write_summary<W: Write>(
        w: &mut W,
        json: bool,
        pid: u32,
        comm: &str,
        q: &Queue,
    ) -> std::io::Result<()> {
        let m = &q.activity.dispatches;
        if !json {
            let cov = m
                .coverage()
                .map(|c| format!(" ({:.0}%)", c * 100.0))
                .unwrap_or_default();
            return writeln!(
                w,
                "{comm}[{pid}] q{}: {} packets decoded of {} consumed{cov}; {} kernel dispatches, {} barriers",
                q.queue_id, m.decoded, m.consumed, m.kernel_dispatches, m.barriers
            );
        }
        serde_json::to_writer(
            &mut *w,
            &DispatchSummary {
                barriers: m.barriers,
                comm,
                consumed: m.consumed,
                decoded: m.decoded,
                gpu_id: q.gpu_id,
                kernel_dispatches: m.kernel_dispatches,
                pid,
                queue_id: q.queue_id,
                kind: "dispatch_summary",
            },
        )?;
        w.write_all(b"\n")
    }
}
