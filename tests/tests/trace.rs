//! Kernel tests of `gpreempt-ebpf trace` (root): the real programs on the real syscall
//! tracepoints, driven by kfd-poke issuing KFD-encoded ioctls on a stand-in file (they fail with
//! ENOTTY there, which is fine for the entry side and `ret`).

use serde_json::Value;
use tests::{require_root, Poke, TempDir, Tracer};

const ENOTTY: i64 = -25;

fn ioctls(events: &[Value], pid: u32) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["pid"] == pid && e["event"] != "process_exit")
        .collect()
}

#[test]
fn trace_decodes_the_exact_kfd_ioctls_of_a_process() {
    require_root();
    let dir = TempDir::new("trace-exact");
    let dev = dir.path("kfd");
    std::fs::write(&dev, b"").unwrap();
    let mut poke = Poke::spawn(&dev, &["script"]);
    let mut other = Poke::spawn(&dev, &["script"]);
    let pid = poke.pid();
    let tracer = Tracer::start(&dir.path("out.jsonl"), &dev, &["--pid", &pid.to_string()]);
    poke.go();
    other.go();
    tracer.wait_for("5 ioctls", |e| ioctls(e, pid).len() >= 5);
    poke.finish();
    other.finish();
    tracer.wait_for("process_exit", |e| {
        e.iter().any(|v| v["event"] == "process_exit")
    });
    let (events, summary) = tracer.stop();

    // Only the filtered process; FIONREAD and the out-of-range 'K' ioctl are not reported.
    assert!(
        events.iter().all(|e| e["pid"] == pid),
        "pid filter leaked: {events:#?}"
    );
    let io = ioctls(&events, pid);
    let names: Vec<&str> = io.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "create_queue",
            "create_queue",
            "destroy_queue",
            "dbg_trap",
            "runtime_enable"
        ]
    );
    for e in &io {
        assert_eq!(e["tid"], pid);
        assert_eq!(e["comm"], "kfd-poke");
        assert_eq!(e["ret"], ENOTTY);
        assert!(
            e.get("verified").is_none(),
            "fd not confirmed as the device: {e}"
        );
        assert!(e["duration_ns"].as_u64().unwrap() > 0);
        assert!(e["ts_ns"].as_u64().unwrap() > 0);
    }
    let cq = io[0];
    assert_eq!(cq["gpu_id"], 0x1234);
    assert_eq!(cq["queue_type"], 2);
    assert_eq!(cq["queue_priority"], 7);
    assert_eq!(cq["queue_percentage"], 100);
    assert_eq!(cq["ring_base_address"], 0x7f00_0000_1000u64);
    assert_eq!(cq["ring_size"], 65536);
    assert_eq!(cq["write_pointer_address"], 0x7f00_0000_2038u64);
    assert_eq!(cq["read_pointer_address"], 0x7f00_0000_2080u64);
    assert_eq!(cq["eop_buffer_address"], 0x7f00_0000_3000u64);
    assert_eq!(cq["eop_buffer_size"], 4096);
    assert_eq!(cq["ctx_save_restore_address"], 0x7f00_0000_4000u64);
    assert_eq!(cq["ctx_save_restore_size"], 0x20_0000);
    assert_eq!(cq["ctl_stack_size"], 0x1000);
    assert_eq!(cq["args_size"], 96);
    assert_eq!(cq["sdma_engine_id"], 0);
    // A failed create has no outputs.
    assert!(cq.get("queue_id").is_none() && cq.get("doorbell_offset").is_none());
    // The pre-1.17 88-byte encoding.
    let cq1 = io[1];
    assert_eq!(cq1["args_size"], 88);
    assert_eq!(cq1["queue_priority"], 15);
    assert!(cq1.get("sdma_engine_id").is_none());
    assert_eq!(io[2]["queue_id"], 3);
    let dbg = io[3];
    assert_eq!(dbg["op"], "suspend_queues");
    assert_eq!(dbg["target_pid"], 4242);
    assert_eq!(dbg["num_queues"], 3);
    assert_eq!(dbg["grace_period"], 100);
    assert_eq!(dbg["exception_mask"], 0x4000_0000u64);
    assert!(dbg["queue_array_ptr"].as_u64().unwrap() != 0);
    assert_eq!(io[4]["r_debug"], 0xdead_b000u64);
    assert_eq!(io[4]["mode_mask"], 1);
    // Timestamps are ordered, and the exit comes last.
    let ts: Vec<u64> = events
        .iter()
        .map(|e| e["ts_ns"].as_u64().unwrap())
        .collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
    let last = events.last().unwrap();
    assert_eq!(last["event"], "process_exit");
    assert_eq!(last["pid"], pid);
    assert_eq!(summary.get("not_kfd"), 0);
    assert_eq!(summary.get("lost_ringbuf_full"), 0);
}

#[test]
fn ioctls_on_files_other_than_the_device_are_dropped() {
    require_root();
    let dir = TempDir::new("trace-notkfd");
    let dev = dir.path("kfd");
    let not_dev = dir.path("not-kfd");
    std::fs::write(&dev, b"").unwrap();
    std::fs::write(&not_dev, b"").unwrap();
    let mut poke = Poke::spawn(&not_dev, &["script"]);
    let pid = poke.pid();
    let tracer = Tracer::start(&dir.path("out.jsonl"), &dev, &["--pid", &pid.to_string()]);
    poke.go();
    poke.finish();
    // Nothing to wait for: the process never used a GPU file, so not even its exit is reported.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (events, summary) = tracer.stop();
    assert!(ioctls(&events, pid).is_empty(), "{events:#?}");
    // Dropped in the kernel by the file behind the fd: nothing reaches the ring buffer (a flood
    // of 'K' ioctls on /dev/null cannot crowd out real events), and the drops are counted.
    assert_eq!(summary.get("seen"), 0);
    assert_eq!(summary.get("dropped_other_file"), 5);
    assert_eq!(summary.get("not_kfd"), 0);
}

#[test]
fn kfd_calls_with_another_type_byte_are_seen_as_the_kernel_dispatches_them() {
    require_root();
    let dir = TempDir::new("trace-typebyte");
    let dev = dir.path("kfd");
    std::fs::write(&dev, b"").unwrap();
    // amdkfd picks the handler by nr alone: 'X' CREATE_QUEUE is a CREATE_QUEUE.
    let mut poke = Poke::spawn(&dev, &["script-x"]);
    let pid = poke.pid();
    let tracer = Tracer::start(&dir.path("out.jsonl"), &dev, &["--pid", &pid.to_string()]);
    poke.go();
    tracer.wait_for("5 ioctls", |e| ioctls(e, pid).len() >= 5);
    poke.finish();
    let (events, _) = tracer.stop();
    let io = ioctls(&events, pid);
    let names: Vec<&str> = io.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "create_queue",
            "create_queue",
            "destroy_queue",
            "dbg_trap",
            "runtime_enable"
        ]
    );
    assert_eq!(io[0]["gpu_id"], 0x1234);
    assert_eq!(io[3]["op"], "suspend_queues");
}

#[test]
fn a_process_flooding_its_gpu_fd_is_rate_limited_and_named() {
    require_root();
    const N: u64 = 20_000;
    let dir = TempDir::new("trace-ratelimit");
    let dev = dir.path("kfd");
    std::fs::write(&dev, b"").unwrap();
    let mut poke = Poke::spawn(&dev, &["flood", &N.to_string()]);
    let pid = poke.pid();
    let tracer = Tracer::start(
        &dir.path("out.jsonl"),
        &dev,
        &["--pid", &pid.to_string(), "--rate-limit", "100:1000"],
    );
    poke.go();
    poke.finish();
    let _ = tracer.wait_for("process_exit", |e| {
        e.last().is_some_and(|v| v["event"] == "process_exit")
    });
    let (events, summary) = tracer.stop();
    let stderr = &summary.stderr;
    let delivered = ioctls(&events, pid).len() as u64;
    let limited = summary.get("rate_limited");
    let lost = summary.get("lost_ringbuf_full") + summary.get("lost_inflight_full");
    // The bucket holds 1000 and refills at 100/s: a flood of 20000 gets about 1000 through.
    assert!(
        (1000..5000).contains(&delivered),
        "delivered {delivered}, rate-limited {limited}"
    );
    assert_eq!(delivered + lost + limited, N);
    assert_eq!(summary.get("seen"), N - limited);
    assert!(
        stderr.contains(&format!(
            "pid {pid}: {limited} records dropped by the rate limit"
        )),
        "{stderr}"
    );
}

#[test]
fn an_ioctl_flood_is_delivered_or_counted_as_lost() {
    require_root();
    const N: u64 = 50_000;
    let dir = TempDir::new("trace-flood");
    let dev = dir.path("kfd");
    std::fs::write(&dev, b"").unwrap();
    let mut poke = Poke::spawn(&dev, &["flood", &N.to_string()]);
    let pid = poke.pid();
    let tracer = Tracer::start(&dir.path("out.jsonl"), &dev, &["--pid", &pid.to_string()]);
    poke.go();
    poke.finish();
    let _ = tracer.wait_for("process_exit", |e| {
        e.last().is_some_and(|v| v["event"] == "process_exit")
    });
    let (events, summary) = tracer.stop();
    let delivered = ioctls(&events, pid).len() as u64;
    let lost = summary.get("lost_ringbuf_full") + summary.get("lost_inflight_full");
    assert_eq!(summary.get("seen"), N, "every ioctl entered the program");
    assert_eq!(
        delivered + lost,
        N,
        "delivered {delivered} + lost {lost} != issued {N}"
    );
    // Priorities cycle 0..15 in issue order: delivered events keep their order and content.
    let prios: Vec<u64> = ioctls(&events, pid)
        .iter()
        .map(|e| e["queue_priority"].as_u64().unwrap())
        .collect();
    if lost == 0 {
        assert!(prios.iter().enumerate().all(|(i, p)| *p == i as u64 % 16));
    }
}

#[test]
fn without_privileges_trace_says_what_to_do() {
    require_root();
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(tests::bin("gpreempt-ebpf"))
        .args(["trace", "--duration", "1"])
        .output()
        .expect("setpriv (util-linux) is needed for this test");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs root"), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one clear sentence, got: {err}");
}

#[test]
fn ebpf_log_shows_the_programs_diagnostics() {
    require_root();
    let dir = TempDir::new("trace-ebpflog");
    let dev = dir.path("kfd");
    std::fs::write(&dev, b"").unwrap();
    let mut poke = Poke::spawn(&dev, &["script"]);
    let pid = poke.pid();
    let tracer = Tracer::start(
        &dir.path("out.jsonl"),
        &dev,
        &["--pid", &pid.to_string(), "--ebpf-log"],
    );
    poke.go();
    tracer.wait_for("5 ioctls", |e| ioctls(e, pid).len() >= 5);
    let t = std::time::Instant::now();
    let want = format!("tid {pid} enters KFD ioctl nr 2 (96 argument bytes)");
    while !tracer.stderr().contains(&want) {
        assert!(
            t.elapsed().as_secs() < 10,
            "no aya-log line; stderr:\n{}",
            tracer.stderr()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    poke.finish();
    let (_, _) = tracer.stop();
}

#[test]
fn trace_decodes_nvidia_rm_escapes_under_the_drivers_names() {
    require_root();
    let dir = TempDir::new("trace-nv");
    // The KFD device is irrelevant here. Real NVIDIA nodes are known by number; the stand-in
    // (a regular file bound at /dev/nvidiactl) by --nvidia-device.
    let dev = dir.path("kfd");
    std::fs::write(&dev, b"").unwrap();
    let stand_in = dir.path("nvidiactl");
    let mut poke = Poke::spawn_as_nvidiactl(&stand_in, &["nv"]);
    let pid = poke.pid();
    let tracer = Tracer::start(
        &dir.path("out.jsonl"),
        &dev,
        &[
            "--pid",
            &pid.to_string(),
            "--nvidia-device",
            stand_in.to_str().unwrap(),
        ],
    );
    poke.go();
    tracer.wait_for("5 RM escapes", |e| ioctls(e, pid).len() >= 5);
    poke.finish();
    let (events, _) = tracer.stop();
    let io = ioctls(&events, pid);
    let names: Vec<&str> = io.iter().map(|e| e["event"].as_str().unwrap()).collect();
    // NV_ESC_CARD_INFO ('F', 0xC8) is not an RM escape: not reported.
    assert_eq!(
        names,
        [
            "rm_alloc",
            "rm_alloc",
            "rm_control",
            "rm_control",
            "rm_free"
        ]
    );
    for e in &io {
        assert_eq!(e["vendor"], "nvidia");
        assert_eq!(e["ret"], ENOTTY);
        assert!(
            e.get("verified").is_none(),
            "/dev/nvidiactl not confirmed: {e}"
        );
    }
    let (tsg, chan, ctl, ts, free) = (io[0], io[1], io[2], io[3], io[4]);
    assert_eq!(tsg["nvos"], 64);
    assert_eq!(tsg["hRoot"], 0xc1d0_0001u32);
    assert_eq!(tsg["hObjectParent"], 0x5c00_0002u32);
    assert_eq!(tsg["hObjectNew"], 0x5c00_0010u32);
    assert_eq!(tsg["hClass"], 0xA06C);
    assert_eq!(tsg["class"], "KEPLER_CHANNEL_GROUP_A");
    assert_eq!(tsg["paramsSize"], 32);
    assert_eq!(
        tsg["engineType"], 1,
        "read from *pAllocParms at exit: {tsg}"
    );
    assert_eq!(chan["nvos"], 21);
    assert_eq!(chan["hObjectParent"], 0x5c00_0010u32);
    assert_eq!(chan["hObjectNew"], 0x5c00_0011u32);
    assert_eq!(chan["class"], "HOPPER_CHANNEL_GPFIFO_A");
    assert!(chan.get("engineType").is_none());
    assert_eq!(ctl["hClient"], 0xc1d0_0001u32);
    assert_eq!(ctl["hObject"], 0x5c00_0003u32);
    assert_eq!(ctl["cmd"], 0x2080_110bu32);
    assert_eq!(ctl["paramsSize"], 536);
    // The levers' parameters, read from *params at exit.
    assert_eq!(ctl["control"], "FIFO_DISABLE_CHANNELS", "{ctl}");
    assert_eq!(
        (
            &ctl["bDisable"],
            &ctl["numChannels"],
            &ctl["bOnlyDisableScheduling"]
        ),
        (&Value::from(1), &Value::from(2), &Value::from(1)),
        "{ctl}"
    );
    assert_eq!(ts["hObject"], 0x5c00_0010u32);
    assert_eq!(ts["control"], "SET_TIMESLICE", "{ts}");
    assert_eq!(ts["timesliceUs"], 200, "{ts}");
    assert_eq!(free["hObjectParent"], 0x5c00_0010u32);
    assert_eq!(free["hObjectOld"], 0x5c00_0011u32);
}
