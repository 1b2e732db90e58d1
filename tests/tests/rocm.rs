//! Real ROCm userspace against the emulator, as root: Debian 12's ROCm 5.2.3 (rocminfo, libhsakmt,
//! ROCr, HIP and hipcc) runs unmodified inside `gpreempt-ebpf sim`, and the tool sees its calls
//! and queues. `cargo xtask test` installs the packages (`test_packages` in xtask); a missing one
//! fails. Debian 13's ROCm (libhsakmt 6.2.4, ROCr 6.1.2, HIP 5.7.1), whose runtime enables the
//! KFD debug API, runs chrooted into `.tools/rocm-trixie` (made by `cargo xtask deploy-setup`,
//! which `cargo xtask test` runs); a missing root fails.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tests::{assert_nothing_left, serial, sim, TempDir};

fn require_rocminfo() {
    assert!(
        Path::new("/usr/bin/rocminfo").exists(),
        "rocminfo is not installed: apt-get install rocminfo (cargo xtask test installs it)"
    );
}

/// The value printed after `key:` in rocminfo's section for the first GPU agent.
fn gpu_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let gpu = text
        .split("*******")
        .find(|s| s.contains("Device Type:             GPU"))?;
    gpu.lines()
        .find_map(|l| l.trim_start().strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

/// rocminfo (libhsakmt + ROCr 5.2.3) lists the emulated MI210 as an HSA agent with its real
/// properties, read from the emulated topology, the render node stand-in and the KFD ioctls; and
/// `trace`, watching from inside the same `sim`, reports rocminfo's KFD calls with their results.
#[test]
fn rocminfo_lists_the_emulated_mi210_and_trace_sees_its_calls() {
    let _one = serial();
    require_rocminfo();
    let tmp = TempDir::new("rocminfo");
    let (ev, out) = (tmp.path("trace.jsonl"), tmp.path("rocminfo.out"));
    let script = format!(
        "\"$GP\" trace --json --comm rocminfo --output {ev} --duration 60 2>{ev}.err & TP=$!; \
         for i in $(seq 200); do grep -q tracing {ev}.err 2>/dev/null && break; sleep 0.1; done; \
         rocminfo > {out} 2>&1; echo rc $? >> {out}; sleep 0.5; kill -INT $TP; wait",
        ev = ev.display(),
        out = out.display()
    );
    sim(&script, Duration::from_secs(120));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("ROCk module is loaded"), "{text}");
    assert!(text.ends_with("rc 0\n"), "rocminfo failed:\n{text}");
    for (key, want) in [
        ("Name", "gfx90a"),
        ("Marketing Name", "AMD Instinct MI210"),
        ("Vendor Name", "AMD"),
        ("Chip ID", "29711(0x740f)"),
        ("Compute Unit", "104"),
        ("SIMDs per CU", "4"),
        ("Shader Engines", "8"),
        ("Max Clock Freq. (MHz)", "1700"),
        ("Wavefront Size", "64(0x40)"),
        ("Max Waves Per CU", "32(0x20)"),
        ("Max Queue Number", "128(0x80)"),
        ("Node", "1"),
    ] {
        assert_eq!(gpu_field(&text, key), Some(want), "{key}\n{text}");
    }
    // Its memory: the VRAM bank (64 GiB, coarse grained) and the caches ROCr keeps.
    assert!(text.contains("67108864(0x4000000) KB"), "{text}");
    assert!(
        text.contains("L2:                      8192(0x2000) KB"),
        "{text}"
    );
    assert!(text.contains("amdgcn-amd-amdhsa--gfx90a"), "{text}");
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
    for name in [
        "get_version",
        "acquire_vm",
        "alloc_memory_of_gpu",
        "map_memory_to_gpu",
    ] {
        assert!(ok(name) >= 1, "{name} missing: {events:?}");
    }
    assert_nothing_left();
}

/// Builds tests/hip/two_streams.hip with Debian's hipcc for gfx90a (no GPU needed to compile).
fn build_hip(exe: &Path) {
    build_hip_src(exe, "two_streams.hip");
}

/// Builds `tests/hip/SRC` for gfx90a with Debian's hipcc.
fn build_hip_src(exe: &Path, src: &str) {
    assert!(
        Path::new("/usr/bin/hipcc").exists(),
        "hipcc is not installed: apt-get install hipcc (cargo xtask test installs it)"
    );
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("hip").join(src);
    let out = std::process::Command::new("hipcc")
        .args(["--offload-arch=gfx90a", "-O2", "-o"])
        .arg(exe)
        .arg(&src)
        .output()
        .expect("running hipcc");
    assert!(
        out.status.success(),
        "hipcc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn json_lines(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A HIP program (HIP 5.2.3, hipcc-built for gfx90a) launches kernels on two streams and
/// synchronizes inside `sim`: its AQL dispatches are completed by the emulator's timing model
/// (the GPU code is not executed) and its completion signals and events let every
/// synchronization return. `trace` shows the runtime's real queue creations, `queues --json` its
/// live queues with HQD slots and dispatch rates, `top` the same rows and, in the process's detail
/// pane, why it cannot be suspended, and `trace --dispatches` names its kernels from ROCr's own
/// code-object list.
#[test]
fn a_hip_program_runs_two_streams_and_the_tool_sees_its_queues() {
    let _one = serial();
    require_rocminfo();
    let tmp = TempDir::new("hip2");
    let exe = tmp.path("two_streams");
    build_hip(&exe);
    let (ev, out, q, d) = (
        tmp.path("trace.jsonl"),
        tmp.path("hip.out"),
        tmp.path("queues.json"),
        tmp.path("dispatches.jsonl"),
    );
    let s = tmp.path("suspend.out");
    let t = tmp.0.display();
    // `top` in a tmux pane (a socket of its own), started before the program so that it sees
    // every one of its ioctls.
    let script = format!(
        "export TERM=xterm-256color; S=\"tmux -S {t}/tmux.sock\"; \
         $S new-session -d -x 160 -y 50 \"$GP top --interval 100 --hqd-interval 200 2>{t}/top.err; sleep 60\"; \
         for i in $(seq 100); do $S capture-pane -p | grep -q 'GPU ' && break; sleep 0.1; done; \
         \"$GP\" trace --json --comm two_streams --output {ev} --duration 90 2>{ev}.err & TP=$!; \
         for i in $(seq 200); do grep -q tracing {ev}.err 2>/dev/null && break; sleep 0.1; done; \
         {exe} 6 > {out} 2>&1 & HP=$!; \
         for i in $(seq 300); do grep -q ready {out} && break; sleep 0.1; done; \
         \"$GP\" queues --json > {q}; \
         sleep 1; $S capture-pane -p > {t}/top.txt; \
         $S send-keys /; $S send-keys -l two_streams; $S send-keys Enter; sleep 0.3; \
         $S send-keys Enter; sleep 0.8; $S capture-pane -p > {t}/top_detail.txt; \
         $S send-keys Enter; $S send-keys /; $S send-keys C-u; $S send-keys Enter; \
         \"$GP\" trace --dispatches --json --duration 1 --output {d} 2>{d}.err; \
         \"$GP\" suspend --pid $HP > {s} 2>&1; echo rc $? >> {s}; \
         \"$GP\" queues --json > {q}.after; \
         wait $HP; echo rc $? >> {out}; sleep 0.5; kill -INT $TP; wait $TP; $S kill-server",
        ev = ev.display(),
        exe = exe.display(),
        out = out.display(),
        q = q.display(),
        d = d.display(),
        s = s.display(),
    );
    sim(&script, Duration::from_secs(150));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.starts_with("device AMD Instinct MI210 gfx90a"),
        "{text}"
    );
    assert!(
        text.contains("\nready\n") && text.contains("\ndone\nrc 0\n"),
        "{text}"
    );
    let launches: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("launches "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no launch count: {text}"));
    assert!(launches >= 40, "{text}");

    // The runtime's own queue creations, as the kernel would see them.
    let events = json_lines(&ev);
    let creates: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "create_queue" && e["ret"] == 0)
        .collect();
    assert!(
        creates.len() >= 3,
        "ROCr's own queue and one per stream: {creates:?}"
    );
    for c in &creates {
        assert_eq!(c["queue_type"], 2, "COMPUTE_AQL: {c}");
        assert_eq!(c["queue_priority"], 7, "HSA normal priority: {c}");
    }
    let pid = creates[0]["pid"].as_u64().unwrap();

    // queues --json while both streams run: the queues with HQD slots, the streams busy.
    let qj: Value = serde_json::from_str(&std::fs::read_to_string(&q).unwrap()).unwrap();
    let proc_ = qj["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("pid {pid} not in queues: {qj}"));
    let queues = proc_["queues"].as_array().unwrap();
    assert!(queues.len() >= 3, "{proc_}");
    for qu in queues {
        assert!(qu["hqd"].is_object(), "no HQD slot: {qu}");
        assert_eq!(qu["state"], "active", "{qu}");
        let c = creates
            .iter()
            .find(|c| c["queue_id"] == qu["queue_id"])
            .unwrap_or_else(|| panic!("queue not created in trace: {qu}"));
        for k in ["ring_base_address", "ring_size", "read_pointer_address"] {
            assert_eq!(qu[k], c[k], "{k}: queues {qu} vs trace {c}");
        }
    }
    let busy = queues
        .iter()
        .filter(|qu| qu["activity"]["dispatches_per_s"].as_f64().unwrap_or(0.0) > 0.0)
        .count();
    assert!(busy >= 2, "both streams dispatch: {proc_}");

    // top shows the program with its queues, their HQD slots and activity, and in the
    // process's detail pane that its queues cannot be suspended, and why.
    let screen = std::fs::read_to_string(tmp.path("top.txt")).unwrap();
    let lines: Vec<&str> = screen.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.starts_with(&format!("{pid} ")) && l.contains("two_streams"))
        .unwrap_or_else(|| panic!("pid {pid} not in top:\n{screen}"));
    for qu in queues {
        let hqd = &qu["hqd"];
        let slot = format!("{}.{}.{}", hqd["inst"], hqd["pipe"], hqd["queue"]);
        let row = lines[at + 1..]
            .iter()
            .find(|l| l.contains(&slot))
            .unwrap_or_else(|| panic!("queue with HQD {slot} not in top:\n{screen}"));
        assert!(row.contains("active"), "{row}\n{screen}");
    }
    let detail = std::fs::read_to_string(tmp.path("top_detail.txt")).unwrap();
    assert!(
        detail.contains("suspendable") && detail.contains("no: its thunk asked the DKMS-only"),
        "{detail}"
    );

    // The dispatch mix names the program's kernels (ROCr's _amdgpu_r_debug list).
    let names: std::collections::BTreeSet<String> = json_lines(&d)
        .iter()
        .filter(|e| e["type"] == "dispatch" && e["packet"] == "kernel_dispatch")
        .filter_map(|e| e["kernel"].as_str().map(str::to_owned))
        .collect();
    for k in ["scale(float*, float, int)", "offset(float*, float, int)"] {
        assert!(names.contains(k), "{k} not named: {names:?}");
    }

    // ROCm 5.2's runtime never enabled the debug API: `suspend` is refused, saying why, and
    // leaves the program running with its queues mapped (it still finished, rc 0, above).
    let st = std::fs::read_to_string(&s).unwrap();
    assert!(!st.ends_with("rc 0\n"), "suspend succeeded: {st}");
    assert!(
        st.contains("GPU runtime never enabled the KFD debug API") && st.contains("ROCm 5.7"),
        "{st}"
    );
    let after: Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path("queues.json.after")).unwrap())
            .unwrap();
    let p = after["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("pid {pid} gone after suspend: {after}"));
    for qu in p["queues"].as_array().unwrap() {
        assert_eq!(qu["state"], "active", "left suspended: {qu}");
        assert!(qu["hqd"].is_object(), "{qu}");
    }
    assert_nothing_left();
}

/// The dispatch rate of every live queue of `pid` in a `queues --json` document, and whether
/// each is still mapped (not suspended: a freeze leaves the queues on the GPU).
fn rates(path: &Path, pid: u64) -> Vec<(f64, bool)> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let p = v["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("pid {pid} not in {}: {v}", path.display()));
    p["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            (
                q["activity"]["dispatches_per_s"].as_f64().unwrap_or(0.0),
                q["state"] != "suspended" && q["hqd"].is_object(),
            )
        })
        .collect()
}

/// The fallback for a runtime without the debug API, with the real ROCm 5.2 client: under
/// `no_debug_api = "freeze"` the controller freezes the HIP program's cgroup while online work
/// runs (the program submits nothing new; its queues stay mapped), a `kill -9` of the controller
/// leaves it thawed (its guardian thaws on the controller's death), a restarted controller
/// freezes it again and SIGTERM thaws it. The program then finishes normally.
#[test]
fn the_freeze_fallback_stops_a_rocm_5_2_program_and_never_leaves_it_frozen() {
    let _one = serial();
    require_rocminfo();
    let root = tests::cgroup2_root().expect("cgroup v2 is mounted");
    let tmp = TempDir::new("freeze");
    let exe = tmp.path("two_streams");
    build_hip(&exe);
    let d = tmp.0.display().to_string();
    let cg = format!("{root}/gpreempt-test-freeze-{}", std::process::id());
    std::fs::write(
        tmp.path("freeze.toml"),
        r#"
[policy]
strategy = "priority"
window = "50ms"
resume_after = "20ms"
max_suspend = "60s"
min_run = "50ms"
default = "ignore"
no_debug_api = "freeze"

[[rule]]
class = "online"
cmdline = '--profile resnet18_b1\b'

[[rule]]
class = "offline"
comm = "two_streams"
"#,
    )
    .unwrap();
    let script = format!(
        r#"set -e
export GPREEMPT_RUN_DIR={d}/run
mkdir {cg}
sh -c 'echo $$ > {cg}/cgroup.procs; exec {exe} 40' > {d}/hip.out 2>&1 & H=$!
for i in $(seq 300); do grep -q ready {d}/hip.out && break; sleep 0.1; done
echo $H > {d}/hip.pid
$GP sim workload --profile resnet18_b1 --rate 400 --priority 15 --duration 60 2>/dev/null >/dev/null & A=$!
$GP run --policy {d}/freeze.toml 2>{d}/run1.err & R=$!
sleep 4
cat {cg}/cgroup.freeze > {d}/events1
$GP queues --json > {d}/q1.json
kill -KILL $R; wait $R || true
sleep 1.5
cat {cg}/cgroup.freeze > {d}/events2
$GP queues --json > {d}/q2.json
$GP run --policy {d}/freeze.toml 2>{d}/run2.err & R=$!
sleep 4
cat {cg}/cgroup.freeze > {d}/events3
$GP doctor --json > {d}/doctor.json || true
kill -TERM $R; wait $R; echo $? > {d}/run2.rc
cat {cg}/cgroup.freeze > {d}/events4
kill -INT $A; wait $A || true
wait $H; echo rc $? >> {d}/hip.out
rmdir {cg}
"#,
        exe = exe.display(),
    );
    let out = sim(&script, Duration::from_secs(150));
    let _ = std::fs::remove_dir(&cg);
    let read = |n: &str| std::fs::read_to_string(tmp.path(n)).unwrap_or_default();
    let ctx = || {
        format!(
            "sim: {}\nrun1: {}\nrun2: {}\nhip: {}",
            String::from_utf8_lossy(&out.stderr),
            read("run1.err"),
            read("run2.err"),
            read("hip.out")
        )
    };
    let hip: u64 = read("hip.pid")
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{}", ctx()));
    // Frozen while online work runs: no new dispatches, the queues still mapped.
    assert_eq!(read("events1").trim(), "1", "{}", ctx());
    let q1 = rates(&tmp.path("q1.json"), hip);
    assert!(
        !q1.is_empty() && q1.iter().all(|&(r, mapped)| r == 0.0 && mapped),
        "{q1:?}\n{}\n{}",
        read("q1.json"),
        ctx()
    );
    let run1 = read("run1.err");
    assert!(
        run1.contains("never enabled the KFD debug API") && run1.contains("froze its cgroup"),
        "{}",
        ctx()
    );
    // kill -9 of the controller: its guardian thawed the cgroup; the program runs again.
    assert_eq!(read("events2").trim(), "0", "{}", ctx());
    let q2 = rates(&tmp.path("q2.json"), hip);
    assert!(
        q2.iter().any(|&(r, _)| r > 0.0),
        "running again: {q2:?}\n{}",
        ctx()
    );
    // A restarted controller freezes it again; SIGTERM thaws it and exits 0.
    assert_eq!(read("events3").trim(), "1", "{}", ctx());
    let doctor: Value =
        serde_json::from_str(&read("doctor.json")).unwrap_or_else(|e| panic!("{e}"));
    let suspendable = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "suspendable")
        .unwrap_or_else(|| panic!("no suspendable check: {doctor}"));
    assert!(
        suspendable["finding"]
            .as_str()
            .unwrap()
            .contains(&format!("held by freezing their cgroup: pid {hip} (")),
        "{suspendable}"
    );
    assert_eq!(read("run2.rc").trim(), "0", "{}", ctx());
    assert_eq!(read("events4").trim(), "0", "{}", ctx());
    let hip_out = read("hip.out");
    assert!(hip_out.contains("\ndone\nrc 0\n"), "{}", ctx());
    assert_nothing_left();
}

/// Debian 13's root file system with its ROCm (xtask/src/deploy.rs).
fn trixie_root() -> std::path::PathBuf {
    let r = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/rocm-trixie");
    assert!(
        r.join("usr/bin/rocminfo").exists()
            && r.join("usr/lib/x86_64-linux-gnu/libamdhip64.so.5").exists(),
        "{} has no Debian 13 ROCm: sudo cargo xtask deploy-setup (cargo xtask test runs it)",
        r.display()
    );
    r
}

/// Debian 13's ROCm, whose thunk (libhsakmt 6.2.4) sends upstream's RUNTIME_ENABLE from
/// `hsa_init`, chrooted into its own root inside `sim` (the emulated /dev/kfd, /dev/dri, /sys and
/// /proc bound in): rocminfo 6.1.2 lists the emulated MI210, and the bookworm-built HIP program
/// runs on HIP 5.7.1 / ROCr 6.1.2. `trace` shows its runtime enabling the debug API before its
/// first queue, `suspend` then suspends every one of its queues (DBG_TRAP SUSPEND_QUEUES, no
/// EPERM: `queues --json` shows them suspended, off their HQDs, not dispatching), `resume` brings
/// them back, and the program finishes.
#[test]
fn a_runtime_that_enables_the_debug_api_can_be_suspended_and_resumed() {
    let _one = serial();
    let root = trixie_root();
    let tmp = TempDir::new("trixie");
    build_hip(&tmp.path("two_streams"));
    let t = tmp.0.display();
    let script = format!(
        "R={r}; T={t}; \
         mount --rbind /dev $R/dev && mount --rbind /sys $R/sys && mount --rbind /proc $R/proc \
           && mount --bind $T $R/mnt || {{ echo mounts failed > $T/ri; exit 1; }}; \
         \"$GP\" trace --json --output $T/ev --duration 120 2>$T/ev.err & TP=$!; \
         for i in $(seq 200); do grep -q tracing $T/ev.err 2>/dev/null && break; sleep 0.1; done; \
         chroot $R rocminfo > $T/ri 2>&1; echo rc $? >> $T/ri; \
         chroot $R /mnt/two_streams 8 > $T/out 2>&1 & HP=$!; \
         for i in $(seq 300); do grep -q ready $T/out && break; sleep 0.1; done; \
         cat /proc/$HP/maps > $T/maps; \
         \"$GP\" suspend --pid $HP > $T/s 2>&1 & SP=$!; \
         for i in $(seq 100); do grep -q holding $T/s && break; sleep 0.1; done; sleep 0.5; \
         \"$GP\" queues --json > $T/q.susp; \
         \"$GP\" resume --pid $HP > $T/r 2>&1; echo rc $? >> $T/r; \
         wait $SP; echo rc $? >> $T/s; \
         \"$GP\" queues --json > $T/q.after; \
         wait $HP; echo rc $? >> $T/out; sleep 0.5; kill -INT $TP; wait",
        r = root.display(),
    );
    sim(&script, Duration::from_secs(150));
    let read = |n: &str| std::fs::read_to_string(tmp.path(n)).unwrap_or_default();

    // rocminfo 6.1.2: the module check (sysfs initstate), then the GPU agent.
    let ri = read("ri");
    assert!(
        ri.contains("ROCk module is loaded") && ri.ends_with("rc 0\n"),
        "{ri}"
    );
    assert_eq!(gpu_field(&ri, "Name"), Some("gfx90a"), "{ri}");
    assert_eq!(
        gpu_field(&ri, "Marketing Name"),
        Some("AMD Instinct MI210"),
        "{ri}"
    );

    // The program ran on Debian 13's libraries, not the host's, and finished after the resume.
    let maps = read("maps");
    for lib in [
        "libamdhip64.so.5.7.",
        "libhsa-runtime64.so.1.13.",
        "libhsakmt.so.1.0.6",
    ] {
        assert!(maps.contains(lib), "{lib} not mapped: {maps}");
    }
    let out = read("out");
    assert!(
        out.starts_with("device AMD Instinct MI210 gfx90a")
            && out.contains("\nready\n")
            && out.ends_with("\ndone\nrc 0\n"),
        "{out}"
    );

    // Its runtime enabled the debug API (RUNTIME_ENABLE with the ENABLE bit, r_debug set, ret 0)
    // before its first queue; rocminfo's ROCr enabled and, at hsa_shut_down, disabled it.
    let events = json_lines(&tmp.path("ev"));
    let pid = |comm: &str| {
        events
            .iter()
            .find(|e| e["comm"] == comm && e["event"] == "acquire_vm")
            .and_then(|e| e["pid"].as_u64())
            .unwrap_or_else(|| panic!("no {comm} in trace: {events:?}"))
    };
    let hip = pid("two_streams");
    let of = |p: u64, ev: &str| -> Vec<&Value> {
        events
            .iter()
            .filter(|e| e["pid"].as_u64() == Some(p) && e["event"] == ev)
            .collect()
    };
    let enable = of(hip, "runtime_enable");
    assert_eq!(enable.len(), 1, "{enable:?}");
    assert_eq!(enable[0]["ret"], 0, "{enable:?}");
    assert_eq!(
        enable[0]["mode_mask"].as_u64().unwrap() & 1,
        1,
        "ENABLE: {enable:?}"
    );
    assert_ne!(
        enable[0]["r_debug"], 0,
        "ROCr's _amdgpu_r_debug: {enable:?}"
    );
    let creates = of(hip, "create_queue");
    assert!(creates.len() >= 3, "{creates:?}");
    assert!(
        creates
            .iter()
            .all(|c| c["ts_ns"].as_u64() > enable[0]["ts_ns"].as_u64()),
        "RUNTIME_ENABLE before any queue: {creates:?}"
    );
    assert!(of(hip, "dbg_trap_deprecated").is_empty(), "no DKMS probe");
    let modes: Vec<u64> = of(pid("rocminfo"), "runtime_enable")
        .iter()
        .map(|e| e["mode_mask"].as_u64().unwrap() & 1)
        .collect();
    assert_eq!(modes, [1, 0], "rocminfo: enable, then disable");

    // `suspend`: the kernel took SUSPEND_QUEUES for every queue.
    let st = read("s");
    assert!(
        st.contains("suspended queue(s) 0, 1, 2") && st.ends_with("rc 0\n"),
        "{st}"
    );
    let dbg = |op: &str| {
        events
            .iter()
            .filter(|e| e["event"] == "dbg_trap" && e["target_pid"].as_u64() == Some(hip))
            .filter(|e| e["op"] == op)
            .map(|e| e["ret"].as_i64().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(dbg("enable"), [0], "{events:?}");
    assert_eq!(dbg("suspend_queues"), [creates.len() as i64], "{events:?}");
    assert!(
        dbg("resume_queues").contains(&(creates.len() as i64)),
        "{events:?}"
    );
    let queues_of = |file: &str| -> (Value, Vec<Value>) {
        let j: Value = serde_json::from_str(&read(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let p = j["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"].as_u64() == Some(hip))
            .unwrap_or_else(|| panic!("pid {hip} not in {file}: {j}"))
            .clone();
        (
            j["gpus"][0].clone(),
            p["queues"].as_array().unwrap().clone(),
        )
    };
    let (gpu, qs) = queues_of("q.susp");
    assert_eq!(qs.len(), creates.len(), "{qs:?}");
    assert_eq!(gpu["hqds_used"], 0, "off their HQDs: {gpu}");
    for q in &qs {
        assert_eq!(q["state"], "suspended", "{q}");
        assert!(q["hqd"].is_null(), "{q}");
        assert_eq!(q["activity"]["dispatches_per_s"].as_f64(), Some(0.0), "{q}");
    }

    // `resume`: every queue back on an HQD, the streams dispatching again.
    assert!(read("r").ends_with("rc 0\n"), "{}", read("r"));
    let (gpu, qs) = queues_of("q.after");
    assert_eq!(gpu["hqds_used"].as_u64(), Some(qs.len() as u64), "{gpu}");
    for q in &qs {
        assert_eq!(q["state"], "active", "{q}");
        assert!(q["hqd"].is_object(), "{q}");
    }
    let busy = qs
        .iter()
        .filter(|q| q["activity"]["dispatches_per_s"].as_f64().unwrap_or(0.0) > 0.0)
        .count();
    assert!(busy >= 2, "both streams dispatch again: {qs:?}");
    assert_nothing_left();
}

/// A real HIP service (tests/hip/service.hip on Debian 13's HIP 5.7.1, chrooted) at 20
/// requests/s is the online service next to an emulated ResNet-50 training job, under the
/// adaptive strategy (all figures emulated). The controller measures the service's requests from
/// the runtime's own hipLaunchKernel and hipStreamSynchronize (uprobes; the service is not
/// changed): its p50 within 15% of what the service measured itself, and the lever tuner steers
/// by that service's requests.
#[test]
fn a_real_hip_service_is_measured_by_its_requests_and_steers_the_lever_tuner() {
    use gpreempt_user::controller::record::AuditRecord;
    let _one = serial();
    let root = trixie_root();
    let tmp = TempDir::new("hipsvc");
    build_hip_src(&tmp.path("service"), "service.hip");
    let policy = "[policy]\nstrategy = \"adaptive\"\nwindow = \"10ms\"\nresume_after = \"3ms\"\n\
                  max_suspend = \"1s\"\nmin_run = \"50ms\"\nmin_interval = \"1ms\"\n\
                  default = \"ignore\"\n[adaptive]\nonline_p99_budget = 1.1\n\
                  [[rule]]\nclass = \"online\"\ncomm = \"service\"\nuid = 0\n\
                  [[rule]]\nclass = \"offline\"\ncmdline = '--offline'\nuid = 0\n";
    std::fs::write(tmp.path("policy.toml"), policy).unwrap();
    let t = tmp.0.display();
    let script = format!(
        "R={r}; T={t}; export GPREEMPT_RUN_DIR=$T/run; \
         mount --rbind /dev $R/dev && mount --rbind /sys $R/sys && mount --rbind /proc $R/proc \
           && mount --bind $T $R/mnt || {{ echo mounts failed > $T/out; exit 1; }}; \
         \"$GP\" run --policy $T/policy.toml --audit $T/audit.jsonl 2>$T/run.err & RP=$!; \
         for i in $(seq 300); do grep -q 'gpreempt-ebpf run:' $T/run.err 2>/dev/null && break; sleep 0.1; done; \
         \"$GP\" sim workload --profile resnet50_b1024 --offline --priority 0 --duration 60 \
           --report $T/off.json 2>/dev/null & OP=$!; \
         chroot $R /mnt/service 20 40 /mnt/lat > $T/out 2>&1 & HP=$!; \
         for i in $(seq 600); do grep -q ready $T/out && break; sleep 0.1; done; \
         sleep 36; \"$GP\" queues --json > $T/q.json; \
         wait $HP; echo rc $? >> $T/out; \
         kill -INT $RP; wait $RP; kill $OP 2>/dev/null; wait",
        r = root.display(),
    );
    sim(&script, Duration::from_secs(180));
    let read = |n: &str| std::fs::read_to_string(tmp.path(n)).unwrap_or_default();
    let out = read("out");
    assert!(out.contains("\ndone\nrc 0\n"), "{out}\n{}", read("run.err"));
    // What the service measured itself.
    let mut own: Vec<u64> = read("lat").lines().filter_map(|l| l.parse().ok()).collect();
    own.sort_unstable();
    assert!(own.len() > 400, "{} requests", own.len());
    let own_p50 = own[own.len() / 2] as f64 / 1e6;
    // The controller's measure of the same process near the end of its run (the status
    // `queues --json` mirrors: the requests of the last 60 s).
    let q: Value = serde_json::from_str(&read("q.json")).unwrap_or_else(|e| panic!("{e}"));
    let procs = q["processes"].as_array().cloned().unwrap_or_default();
    let svc = procs
        .iter()
        .find(|p| p["comm"] == "service")
        .unwrap_or_else(|| panic!("no service in {q}"));
    let pid = svc["pid"].as_u64().unwrap();
    let req = &svc["requests"];
    let tool_p50 = req["p50_ms"].as_f64().unwrap_or_else(|| panic!("{svc}"));
    println!(
        "emulated: service p50 {own_p50:.2} ms ({} requests), tool p50 {tool_p50:.2} ms p99 {} \
         ({} requests)",
        own.len(),
        req["p99_ms"],
        req["count"]
    );
    assert!(req["count"].as_u64().unwrap() > 400, "{req}");
    assert!(
        (tool_p50 / own_p50 - 1.0).abs() <= 0.15,
        "tool p50 {tool_p50} ms vs the service's own {own_p50} ms"
    );
    // The lever tuner measured this service's requests.
    let notes: Vec<String> = tests::audit_records(&read("audit.jsonl"))
        .into_iter()
        .filter_map(|a| match a {
            AuditRecord::Adapt(n) => Some(n.reason),
            _ => None,
        })
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("lever: chose") && n.contains(&format!("pid {pid} p99"))),
        "{notes:#?}\n{}",
        read("run.err")
    );
    assert_nothing_left();
}
