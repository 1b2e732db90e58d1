//! The emulator end to end, as root: real processes drive the FUSE-served /dev/kfd inside
//! `gpreempt-ebpf sim`, and the real eBPF tracer watches them.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::{assert_nothing_left, bin, require_root, serial, sim, TempDir};

fn report(p: &Path) -> Value {
    let s = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).expect("report JSON")
}

/// Builds tests/c/kfd_client.c with extra gcc flags.
fn build_client(exe: &Path, flags: &[&str]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("c/kfd_client.c");
    let cc = Command::new("gcc")
        .args(["-O1", "-Wall", "-Werror", "-idirafter"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("c/fallback"))
        .args(flags)
        .arg("-o")
        .arg(exe)
        .arg(&src)
        .output()
        .expect("gcc (apt-get install gcc linux-libc-dev)");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
}

/// A client whose every KFD ioctl carries type byte 'X' runs its whole queue
/// lifecycle (the emulator, like amdkfd, dispatches on nr), and `trace` sees each call, decoded
/// with the kernel's results, because the programs select calls by the file, not the type byte.
#[test]
fn a_queue_lifecycle_with_another_type_byte_is_seen() {
    let _one = serial();
    let tmp = TempDir::new("cclient-x");
    let exe = tmp.path("kfdx");
    build_client(&exe, &["-DTYPE_BYTE='X'"]);
    let (ev, out) = (tmp.path("trace.jsonl"), tmp.path("client.out"));
    let script = format!(
        "\"$GP\" trace --json --comm kfdx --output {ev} --duration 20 2>{ev}.err & TP=$!; \
         for i in $(seq 100); do grep -q tracing {ev}.err 2>/dev/null && break; sleep 0.1; done; \
         {exe} > {out}; sleep 0.3; kill -INT $TP; wait",
        ev = ev.display(),
        exe = exe.display(),
        out = out.display()
    );
    sim(&script, Duration::from_secs(60));
    let text = std::fs::read_to_string(&out).unwrap();
    let kv: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once(' ')).collect();
    assert_eq!(kv["acquire_vm"], "0", "{text}");
    assert_eq!(kv["destroy0"], "0", "{text}");
    let events: Vec<Value> = std::fs::read_to_string(&ev)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ok = |name: &str| {
        events
            .iter()
            .filter(|e| e["event"] == name && e["ret"] == 0)
            .count()
    };
    assert!(ok("acquire_vm") >= 1, "{events:?}");
    assert!(
        ok("create_queue") >= 3,
        "two creates, then a re-create: {events:?}"
    );
    assert!(ok("destroy_queue") >= 1, "{events:?}");
    let create = events
        .iter()
        .find(|e| e["event"] == "create_queue" && e["ret"] == 0)
        .unwrap();
    assert_eq!(create["queue_id"], 0, "{create}");
    assert_eq!(
        kv["ioctl_type"], "X",
        "the client used 'X' for every call\n{text}"
    );
    assert_nothing_left();
}

#[test]
fn c_client_against_the_uapi_header_gets_kernel_results() {
    let _one = serial();
    let tmp = TempDir::new("cclient");
    let exe = tmp.path("kfd-client");
    build_client(&exe, &[]);
    let out = sim(&format!("{}", exe.display()), Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let kv: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once(' ')).collect();
    let gpu: u64 = kv["gpu_id"].parse().unwrap();
    assert_eq!(kv["version"], "1.18", "{text}");
    assert_eq!(kv["ioctl_type"], "K");
    assert_eq!(kv["create_before_vm"], "-3", "no VM yet: ESRCH\n{text}");
    assert_eq!(kv["acquire_vm"], "0");
    assert_eq!(kv["runtime_enable"], "0");
    // Queue ids from 0; doorbell offsets in the emulator's mmap convention (a FUSE file cannot be
    // mapped past 2^63, docs/sim.md): type DOORBELL (3) at bit 60, the gpu_id at bit 44, the
    // process's doorbell slice at bit 32, and, as upstream, doorbell_id * 8 in the low bits.
    let creates: Vec<(u64, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("create 0 queue_id "))
        .map(|l| {
            let (id, off) = l.split_once(" doorbell_offset 0x").unwrap();
            (id.parse().unwrap(), u64::from_str_radix(off, 16).unwrap())
        })
        .collect();
    assert_eq!(creates.len(), 2, "{text}");
    for (i, &(id, off)) in creates.iter().enumerate() {
        assert_eq!(id, i as u64, "{text}");
        assert_eq!(off >> 60, 3, "type DOORBELL: {off:#x}");
        assert_eq!((off >> 44) & 0xffff, gpu, "gpu_id: {off:#x}");
        assert_eq!(off & 0xffff_ffff, id * 8, "doorbell byte offset: {off:#x}");
        assert_eq!(
            off >> 32,
            creates[0].1 >> 32,
            "one doorbell page per process"
        );
    }
    assert_eq!(kv["create_bad_priority"], "-22");
    assert_eq!(kv["create_bad_type"], "-524", "ENOTSUPP, as the kernel");
    assert_eq!(kv["runtime_enable_again"], "-16", "EBUSY");
    assert_eq!(kv["destroy0"], "0");
    assert_eq!(kv["destroy0_again"], "-22");
    assert_eq!(
        kv["recreate"], "0 queue_id 0",
        "the lowest free id is reused"
    );
    assert_eq!(kv["unknown_nr"], "-25", "ENOTTY");
    assert_nothing_left();
}

#[test]
fn trace_inside_sim_sees_the_workload_queue_lifecycle() {
    let _one = serial();
    let tmp = TempDir::new("simtrace");
    let (events, rep) = (tmp.path("trace.json"), tmp.path("report.json"));
    let script = format!(
        "\"$GP\" trace --json --output {ev} --duration 12 2>{ev}.err & TP=$!; \
         for i in $(seq 100); do grep -q tracing {ev}.err 2>/dev/null && break; sleep 0.1; done; \
         \"$GP\" sim workload --profile resnet18_b1 --rate 20 --duration 1 --priority 11 --report {rep}; \
         sleep 0.3; kill -INT $TP; wait",
        ev = events.display(),
        rep = rep.display()
    );
    sim(&script, Duration::from_secs(60));
    let r = report(&rep);
    let pid = r["pid"].as_u64().unwrap();
    assert!(r["requests"].as_u64().unwrap() >= 15, "{r}");
    let evs: Vec<Value> = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &Value| e["pid"].as_u64() == Some(pid))
        .collect();
    let names: Vec<&str> = evs.iter().filter_map(|e| e["event"].as_str()).collect();
    for want in [
        "get_version",
        "acquire_vm",
        "runtime_enable",
        "alloc_memory_of_gpu",
        "create_queue",
        "destroy_queue",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let create = evs.iter().find(|e| e["event"] == "create_queue").unwrap();
    for k in [
        "queue_id",
        "ring_base_address",
        "read_pointer_address",
        "write_pointer_address",
        "doorbell_offset",
        "gpu_id",
    ] {
        assert_eq!(create[k], r[k], "{k}: trace {create} vs workload {r}");
    }
    assert_eq!(create["queue_priority"], 11);
    assert_eq!(create["queue_type"], 2, "COMPUTE_AQL");
    assert_eq!(create["ret"], 0);
    let destroy = evs.iter().find(|e| e["event"] == "destroy_queue").unwrap();
    assert_eq!(destroy["queue_id"], r["queue_id"]);
    assert_eq!(destroy["ret"], 0);
    assert_nothing_left();
}

#[test]
fn sysfs_and_debugfs_show_a_live_queue() {
    let _one = serial();
    let tmp = TempDir::new("simviews");
    let rep = tmp.path("report.json");
    let script = format!(
        "\"$GP\" sim workload --profile resnet50_b8 --rate 50 --duration 2 --report {rep} 2>{rep}.err & \
         for i in $(seq 100); do grep -q ready {rep}.err && break; sleep 0.05; done; \
         P=$(ls /sys/class/kfd/kfd/proc); echo pid $P; \
         G=$(cat /sys/class/kfd/kfd/topology/nodes/1/gpu_id); \
         printf 'size %s\\ntype %s\\ngpuid %s\\n' $(cat /sys/class/kfd/kfd/proc/$P/queues/0/size) \
           $(cat /sys/class/kfd/kfd/proc/$P/queues/0/type) $(cat /sys/class/kfd/kfd/proc/$P/queues/0/gpuid); \
         echo vram $(cat /sys/class/kfd/kfd/proc/$P/vram_$G); \
         grep -A1 'CP Pipe 0, Queue 0' /sys/kernel/debug/kfd/hqds | tail -1; \
         head -2 /sys/kernel/debug/kfd/mqds; wait",
        rep = rep.display()
    );
    let out = sim(&script, Duration::from_secs(30));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let r = report(&rep);
    let mut lines = text.lines();
    assert_eq!(lines.next().unwrap(), format!("pid {}", r["pid"]), "{text}");
    assert_eq!(lines.next().unwrap(), "size 65536");
    assert_eq!(lines.next().unwrap(), "type 0");
    assert_eq!(lines.next().unwrap(), format!("gpuid {}", r["gpu_id"]));
    assert_ne!(
        lines.next().unwrap(),
        "vram 0",
        "the model's VRAM is accounted"
    );
    // Mapped in HQD pipe 0 queue 0: CP_HQD_ACTIVE=1; CP_HQD_PQ_BASE = ring >> 8 on the next line.
    let hqd: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!((hqd[0], hqd[3]), ("00028914:", "00000001"), "{text}");
    assert_eq!(
        lines.next().unwrap(),
        format!(
            "Process {} PASID 0x{:x}:",
            r["pid"],
            r["pid"].as_u64().unwrap()
        )
    );
    assert_eq!(
        lines.next().unwrap(),
        format!(
            "  Compute queue on device {:x}",
            r["gpu_id"].as_u64().unwrap()
        )
    );
    assert_nothing_left();
}

#[test]
fn offline_work_raises_online_p99_emulated() {
    let _one = serial();
    let tmp = TempDir::new("siminterf");
    let (solo, shared, off) = (
        tmp.path("solo.json"),
        tmp.path("shared.json"),
        tmp.path("off.json"),
    );
    let script = format!(
        "\"$GP\" sim workload --profile resnet18_b1 --rate 20 --duration 4 --report {solo} && \
         {{ \"$GP\" sim workload --profile resnet50_b1024 --offline --duration 4.5 --report {off} & }} && sleep 0.5 && \
         \"$GP\" sim workload --profile resnet18_b1 --rate 20 --duration 4 --report {shared}; wait",
        solo = solo.display(),
        shared = shared.display(),
        off = off.display()
    );
    sim(&script, Duration::from_secs(60));
    let p99 = |p: &Path| report(p)["latency"]["p99_ms"].as_f64().unwrap();
    let (alone, with) = (p99(&solo), p99(&shared));
    eprintln!("online resnet18_b1 p99 (emulated): alone {alone:.2} ms, with offline resnet50_b1024 {with:.2} ms");
    assert!(
        with > alone * 1.5,
        "offline work should hurt online p99: {alone} -> {with}"
    );
    assert!(report(&off)["iterations"].as_u64().unwrap() >= 1);
}

#[test]
fn killing_sim_leaves_nothing_behind() {
    let _one = serial();
    require_root();
    let gp = bin("gpreempt-ebpf");
    let mut child = Command::new(&gp)
        .args(["sim", "--", "sh", "-c"])
        .arg(format!(
            "{} sim workload --profile resnet50_b1024 --offline --duration 60",
            gp.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    // Wait until the workload runs inside, then SIGKILL sim itself.
    loop {
        let running = std::fs::read_dir("/proc").unwrap().any(|e| {
            e.ok()
                .and_then(|e| std::fs::read_to_string(e.path().join("cmdline")).ok())
                .is_some_and(|c| c.contains("sim\0workload"))
        });
        if running {
            break;
        }
        assert!(Instant::now() < deadline, "workload never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_nothing_left();
}

/// A host where someone looked at /sys/kernel/debug/tracing has tracefs automounted there;
/// overlayfs cannot show an automount point, and sim once failed to start on such a host
/// (EREMOTE). Looking first makes the test independent of what ran before; inside, the emulated
/// debugfs is there.
#[test]
fn sim_starts_where_debugfs_tracing_is_automounted() {
    let _one = serial();
    require_root();
    // The automount happens on lookup (and stays, as on a real host after anyone's `ls`).
    let _ = std::fs::metadata("/sys/kernel/debug/tracing/events");
    let out = sim(
        "test -d /sys/kernel/debug/kfd && echo inside-ok",
        Duration::from_secs(60),
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("inside-ok"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_nothing_left();
}
