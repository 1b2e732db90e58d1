//! The readable lines and the sink.

use super::*;
use crate::observe::events::KfdCall;
use gpreempt_common::kfd;
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

mod json;
