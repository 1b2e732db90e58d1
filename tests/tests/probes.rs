//! The optional probes as root on this kernel: every program through the verifier, kprobe attach
//! failing the documented way (no CONFIG_KPROBES here), and launch uprobes firing on the
//! emulator's workloads.

use std::{path::Path, time::Duration};

use aya::programs::KProbe;
use gpreempt_common::kprobe::{field, PROBES};
use gpreempt_user::observe::probe::{self, HostProbeFacts};
use serde_json::Value;
use tests::{require_root, serial, sim, TempDir};

#[test]
fn every_program_passes_the_verifier() {
    require_root();
    let checks = probe::verify_programs().expect("loading the eBPF object");
    let names: Vec<&str> = checks.iter().map(|c| c.program.as_str()).collect();
    for p in PROBES {
        assert!(
            names.contains(&p.program),
            "{} missing: {names:?}",
            p.program
        );
    }
    for (_, program, _) in gpreempt_common::kprobe::launch::POINTS {
        assert!(names.contains(&program), "{program} missing: {names:?}");
    }
    for want in [
        "gpu_ioctl_enter",
        "gpu_ioctl_exit",
        "gpu_process_exit",
        "fe_kfd_ioctl",
        "kfd_ioctl_entry",
        "kfd_ioctl_return",
        "kfd_ioctl_fentry",
        "kfd_ioctl_fexit",
    ] {
        assert!(names.contains(&want), "{want} missing: {names:?}");
    }
    for c in &checks {
        match (&c.result, c.program.as_str()) {
            (Ok(_), _) => {}
            // This VM's kernel (lockdown=integrity) refuses every fentry/fexit load with EPERM
            // before the verifier runs, whatever the target. Anywhere else they must load.
            (
                Err(e),
                "fe_kfd_ioctl" | "kfd_ioctl_fentry" | "kfd_ioctl_fexit" | "nv_ioctl_fentry"
                | "nv_ioctl_fexit",
            ) if locked_down() => {
                assert!(
                    e.contains("Operation not permitted"),
                    "undocumented fentry failure: {e}"
                )
            }
            (Err(e), p) => panic!("the verifier rejected {p}: {e}"),
        }
    }
    println!("{} programs pass the verifier", checks.len());
}

/// Kernel lockdown is active (`/sys/kernel/security/lockdown` shows integrity or
/// confidentiality selected); securityfs is mounted first if needed.
fn locked_down() -> bool {
    let f = "/sys/kernel/security/lockdown";
    if !Path::new(f).exists() {
        let _ = std::process::Command::new("mount")
            .args(["-t", "securityfs", "securityfs", "/sys/kernel/security"])
            .status();
    }
    std::fs::read_to_string(f).is_ok_and(|t| !t.contains("[none]"))
}

#[test]
fn kprobes_fail_to_attach_the_documented_way_and_the_plan_says_why() {
    require_root();
    let mut ebpf = probe::load_object(false).unwrap();
    let kp: &mut KProbe = ebpf
        .program_mut("kp_queue_add")
        .unwrap()
        .try_into()
        .unwrap();
    kp.load().expect("verifier");
    // A function that exists here: the failure is the missing kprobe PMU, not the symbol.
    let err = kp
        .attach("do_vfs_ioctl", 0)
        .expect_err("no CONFIG_KPROBES here");
    let text = format!("{err:?}");
    assert!(
        text.contains("/sys/bus/event_source/devices/kprobe/type"),
        "undocumented failure: {text}"
    );

    let facts = HostProbeFacts::read(Path::new("/"));
    assert!(facts.kprobes.is_err());
    for p in facts.plan() {
        let why = p.verdict.expect_err("nothing attaches here");
        assert!(why.contains("CONFIG_KPROBES"), "{}: {why}", p.spec.program);
    }
    // vmlinux BTF resolves the vmlinux fields; the amdgpu ones are missing with the reason.
    assert!(facts.offsets.is_known(field::TASK_TGID));
    assert!(facts.offsets.is_known(field::FILE_PRIVATE_DATA));
    let (_, why) = facts
        .missing
        .iter()
        .find(|(f, _)| *f == field::QUEUE_PROPERTIES)
        .expect("struct queue is amdgpu's");
    assert!(why.contains("amdgpu"), "{why}");
}

#[test]
fn launch_uprobes_fire_on_the_workloads_launch_symbols() {
    let _one = serial();
    let tmp = TempDir::new("launch");
    let (events, rep, err) = (tmp.path("ev.json"), tmp.path("rep.json"), tmp.path("err"));
    let script = format!(
        "\"$GP\" trace --launches --json --output {ev} --duration 20 2>{err} & TP=$!; \
         for i in $(seq 100); do grep -q tracing {err} 2>/dev/null && break; sleep 0.1; done; \
         \"$GP\" sim workload --profile resnet18_b1 --rate 20 --duration 4 --report {rep}; \
         sleep 0.3; kill -INT $TP; wait",
        ev = events.display(),
        rep = rep.display(),
        err = err.display()
    );
    sim(&script, Duration::from_secs(60));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&rep).unwrap()).unwrap();
    let pid = r["pid"].as_u64().unwrap();
    let (requests, kernels) = (
        r["requests"].as_u64().unwrap(),
        r["kernels"].as_u64().unwrap(),
    );
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert!(stderr.contains("kprobes 0/14"), "{stderr}");
    assert!(stderr.contains("CONFIG_KPROBES off"), "{stderr}");
    // hipLaunchKernel, hipModuleLaunchKernel, and hipStreamSynchronize's entry and return.
    assert!(
        stderr.contains(&format!("pid {pid}: launch hints from 4 entry point(s)")),
        "{stderr}"
    );
    let (waits, hints): (Vec<Value>, Vec<Value>) = std::fs::read_to_string(&events)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|e: &Value| e["source"] == "uprobe")
        .partition(|e| e["event"] == "wait" || e["event"] == "wait-return");
    assert!(!hints.is_empty(), "no launch hints: {stderr}");
    // Every request waits once for its kernels: an entry, then its return, on one thread.
    assert!(
        waits.len() as u64 >= 2 * requests * 9 / 10,
        "{} wait records for {requests} requests",
        waits.len()
    );
    for pair in waits.chunks(2) {
        assert_eq!(pair[0]["event"], "wait", "{pair:?}");
        assert_eq!(
            pair.get(1).map(|r| &r["event"]),
            Some(&"wait-return".into()),
            "{pair:?}"
        );
        assert_eq!(pair[0]["tid"], pair[1]["tid"], "{pair:?}");
        assert!(
            pair[1]["ts_ns"].as_u64() >= pair[0]["ts_ns"].as_u64(),
            "{pair:?}"
        );
        assert_eq!(pair[0]["pid"], pid, "only the watched process: {pair:?}");
    }
    for h in &hints {
        assert_eq!(h["pid"], pid, "only the watched process: {h}");
        assert_eq!(h["event"], "hipLaunchKernel", "{h}");
    }
    // The kernel-side rate limit: at most one hint per ms per process.
    for w in hints.windows(2) {
        let gap = w[1]["ts_ns"].as_u64().unwrap() - w[0]["ts_ns"].as_u64().unwrap();
        assert!(gap >= 1_000_000, "hints {gap} ns apart");
    }
    // Every request starts after a quiet spell, so each yields a hint; every launch is counted.
    let counted: u64 = hints
        .iter()
        .map(|h| 1 + h["suppressed"].as_u64().unwrap())
        .sum();
    let seen: u64 = stderr
        .split("launches_seen=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no summary: {stderr}"));
    println!(
        "{requests} requests, {kernels} kernels; {} hints, {counted} launches in hints, {seen} seen",
        hints.len()
    );
    assert!(
        hints.len() as u64 >= requests * 9 / 10,
        "{} hints for {requests} requests",
        hints.len()
    );
    assert!(
        seen >= kernels * 9 / 10 && seen <= kernels + 1,
        "{seen} launches seen, {kernels} kernels"
    );
    assert!(counted <= seen, "{counted} > {seen}");
    tests::assert_nothing_left();
}
